/* A rank that stops taking part must not leave the others waiting forever.
 *
 *   test_comm_hang ACTION [COLLECTIVE]     (under mpirun, 2 ranks or more)
 *
 * Every rank does one allreduce that completes; then rank 1 stops (ACTION: sleep = sleeps
 * 60 s, stop = SIGSTOP, kill = SIGKILL) while the others start COLLECTIVE (allreduce,
 * broadcast or recv, the last from rank 1). With FT_DIST_TIMEOUT=S the waiting ranks must
 * report "<collective> #<seq> ... did not complete within S s" and take the whole run
 * down; rank 1's death alone (kill) is for the launcher to notice. tests/run-dist.sh
 * checks the exit status, the time and stderr; reaching the end of main is a failure. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dist/dist.h"

int main(int argc, char **argv)
{
    const char *action = argc > 1 ? argv[1] : "sleep", *coll = argc > 2 ? argv[2] : "allreduce";
    ft_comm *comm;
    ft_err err;
    if (ft_comm_init(&comm, &err)) {
        fprintf(stderr, "ft_comm_init: %s\n", err.msg);
        return 1;
    }
    int rank = ft_comm_rank(comm);
    if (ft_comm_size(comm) < 2) {
        fprintf(stderr, "test_comm_hang needs 2 ranks or more\n");
        return 1;
    }
    float x[1000] = {0};
    if (ft_comm_allreduce(comm, x, 1000, FT_COMM_F32, FT_COMM_SUM, &err)) {
        fprintf(stderr, "rank %d: warm-up allreduce: %s\n", rank, err.msg);
        return 1;
    }
    fprintf(stderr, "rank %d: warm-up done\n", rank);
    if (rank == 1) {
        if (strcmp(action, "kill") == 0)
            raise(SIGKILL);
        else if (strcmp(action, "stop") == 0)
            raise(SIGSTOP);
        /* the launcher sends SIGCONT before it kills: stay out of the run all the same */
        sleep(60);
        return 3;
    } else {
        int rc;
        if (strcmp(coll, "recv") == 0)
            rc = ft_comm_recv(comm, x, 1000, FT_COMM_F32, 1, 5, &err);
        else if (strcmp(coll, "broadcast") == 0)
            rc = ft_comm_broadcast(comm, x, 1000, FT_COMM_F32, 1, &err);
        else
            rc = ft_comm_allreduce(comm, x, 1000, FT_COMM_F32, FT_COMM_SUM, &err);
        fprintf(stderr, "rank %d: %s returned %d (%s) while rank 1 was gone\n", rank, coll, rc,
                rc ? err.msg : "no error");
    }
    fprintf(stderr, "rank %d: reached the end: the run was not taken down\n", rank);
    ft_comm_finalize(comm);
    return 3;
}
