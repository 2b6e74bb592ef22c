/* Single-process and MPI implementations of dist.h. */
#include "dist.h"

#include <stdlib.h>
#include <string.h>

#ifdef FT_HAVE_MPI
#include <mpi.h>
#endif

struct ft_comm {
    int rank, size;
    int mpi; /* 1: MPI initialised by us */
};

/* Whether a launcher started this process as one rank of several. */
static int launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                        "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i]))
            return 1;
    return 0;
}

int ft_comm_init(ft_comm **out, ft_err *err)
{
    ft_comm *c = calloc(1, sizeof *c);
    if (!c)
        return ft_fail(err, "out of memory");
    c->size = 1;
#ifdef FT_HAVE_MPI
    if (launched()) {
        int rc = MPI_Init(NULL, NULL);
        if (rc != MPI_SUCCESS) {
            free(c);
            return ft_fail(err, "MPI_Init failed (error %d)", rc);
        }
        c->mpi = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    }
#else
    if (launched() && getenv("OMPI_COMM_WORLD_SIZE") && atoi(getenv("OMPI_COMM_WORLD_SIZE")) > 1) {
        free(c);
        return ft_fail(err, "started as one of %s ranks, but this build has no MPI (install "
                            "libopenmpi-dev and rebuild)",
                       getenv("OMPI_COMM_WORLD_SIZE"));
    }
#endif
    *out = c;
    return 0;
}

void ft_comm_finalize(ft_comm *c)
{
    if (!c)
        return;
#ifdef FT_HAVE_MPI
    if (c->mpi)
        MPI_Finalize();
#endif
    free(c);
}

int ft_comm_rank(const ft_comm *c) { return c->rank; }
int ft_comm_size(const ft_comm *c) { return c->size; }
const char *ft_comm_backend(const ft_comm *c) { return c->mpi ? "mpi" : "single"; }

int ft_comm_allreduce_sum(ft_comm *c, double *buf, size_t n, ft_err *err)
{
#ifdef FT_HAVE_MPI
    if (c->mpi) {
        int rc = MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS)
            return ft_fail(err, "MPI_Allreduce failed (error %d)", rc);
    }
#else
    (void)buf;
    (void)n;
    (void)err;
#endif
    (void)c;
    return 0;
}

int ft_comm_barrier(ft_comm *c, ft_err *err)
{
#ifdef FT_HAVE_MPI
    if (c->mpi && MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS)
        return ft_fail(err, "MPI_Barrier failed");
#else
    (void)err;
#endif
    (void)c;
    return 0;
}
