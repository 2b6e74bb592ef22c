/* dist/: many processes.
 *
 * Owns: the communication interface (dist.h) and its backends (single, MPI, NCCL:
 * dist_nccl.h), and the strategies written against it (dist_engine.h: DDP, ZeRO-1/2/3,
 * FSDP, optimizer offload, the layer-split pipeline).
 * May call: core, device, kernels, model, quant, train.
 * (This is the folder's main header.) */

/* The communication interface (DESIGN.md seam 4): the processes of a run and the
 * collectives between them. DDP, ZeRO, FSDP and the layer-split pipeline are written
 * against this interface only.
 *
 * Backends:
 *   single  one process: every collective is the identity (or a copy).
 *   mpi     Open MPI on CPU buffers; mpirun (one node or a hostfile) or Slurm's srun
 *           start the ranks. Chosen when the build has MPI and a launcher's environment
 *           variables are present.
 *   nccl    NCCL on GPU buffers (builds with CUDA and NCCL), bootstrapped over MPI: rank 0
 *           makes the ncclUniqueId and broadcasts it; each process takes the GPU of its
 *           node-local rank. Collectives on device buffers go to NCCL, host ones to MPI.
 *
 * Buffers are counted in elements of a dtype. The "v" collectives take per-rank counts
 * (counts[r] elements for rank r, laid out rank after rank; displacements are the prefix
 * sums), so shards need not be equal.
 *
 * Every blocking call is an async call followed by ft_comm_wait. A wait that does not
 * complete within the timeout (ft_comm_set_timeout; default 600 s, or FT_DIST_TIMEOUT
 * seconds from the environment, else NCCL_TIMEOUT seconds) prints, on stderr,
 *   "ft: rank R: <collective> #<seq> (<n> elements) did not complete within S s: a rank
 *    died or hangs. Rerun with FT_DIST_DEBUG=1 (and NCCL_DEBUG=INFO on GPUs) to see
 *    which rank stopped where."
 * and aborts every rank (MPI_Abort / ncclCommAbort), so no rank waits forever.
 * With FT_DIST_DEBUG=1 every collective is logged on stderr as it starts and ends.
 * FT_DIST_BACKEND=mpi keeps NCCL off (device buffers are then refused under MPI);
 * FT_DIST_BACKEND=nccl makes ft_comm_init fail when NCCL cannot start.
 *
 * All ranks pass the same kind of memory to a collective (GPU on every rank, or host on
 * every rank). A byte SUM wraps modulo 256. */
#ifndef FT_DIST_H
#define FT_DIST_H

#include <stdbool.h>
#include <stddef.h>

#include "core/ft_error.h"

typedef struct ft_comm ft_comm;
typedef struct ft_comm_req ft_comm_req;

typedef enum ft_comm_dtype {
    FT_COMM_F32 = 0,
    FT_COMM_F64,
    FT_COMM_I64,
    FT_COMM_BYTE,
    FT_COMM_BF16 /* moved, never reduced: gathers, broadcasts, send/recv of bf16 values */
} ft_comm_dtype;

typedef enum ft_comm_op {
    FT_COMM_SUM = 0,
    FT_COMM_AVG, /* sum / world size (floating dtypes only) */
    FT_COMM_MAX
} ft_comm_op;

/* Joins the run: MPI when this build has it and the process was started by a launcher
 * (mpirun / srun set the rank in the environment), else a single process. */
int ft_comm_init(ft_comm **out, ft_err *err);
/* Leaves the run (MPI_Finalize); NULL is a no-op. */
void ft_comm_finalize(ft_comm *c);

int ft_comm_rank(const ft_comm *c);
int ft_comm_size(const ft_comm *c);
/* Rank within this node (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID; else the rank):
 * the GPU a process takes. */
int ft_comm_local_rank(const ft_comm *c);
/* "single", "mpi" or "nccl". */
const char *ft_comm_backend(const ft_comm *c);

/* Seconds a wait may take before every rank is aborted (> 0). */
void ft_comm_set_timeout(ft_comm *c, double seconds);
double ft_comm_timeout(const ft_comm *c);

/* Bytes this process has sent into collectives and point-to-point calls so far
 * (the algorithm's volume as a ring implementation moves it: allreduce 2(N-1)/N n,
 * reduce-scatter and allgather (N-1)/N n, broadcast n, send n; n is the element count
 * times the element size, and N = 1 sends nothing). */
double ft_comm_bytes_sent(const ft_comm *c);

/* What this process's communication has cost so far, for profiles (a step's figures are
 * the difference of two snapshots, ft_comm_stats_diff):
 *   bytes_sent  as ft_comm_bytes_sent;
 *   wait_s      seconds spent in ft_comm_wait (and so in the blocking forms): the
 *               communication that compute did not hide, plus time waiting for a slower
 *               rank to reach the collective (MPI's nonblocking collectives progress
 *               inside the wait, so on CPU ranks nearly all of their time shows here);
 *   bytes       bytes_sent by kind (what each kind of collective moved);
 *   calls       requests started, by kind. A ring's latency is paid per hop: 2(N-1) hops
 *               per allreduce, N-1 per reduce-scatter, allgather or broadcast, one per
 *               send. A single process counts its calls too. */
typedef enum ft_comm_kind {
    FT_COMM_KIND_ALLREDUCE = 0,
    FT_COMM_KIND_REDUCE_SCATTER,
    FT_COMM_KIND_ALLGATHER,
    FT_COMM_KIND_BROADCAST,
    FT_COMM_KIND_SEND,
    FT_COMM_KIND_RECV,
    FT_COMM_KIND_BARRIER,
    FT_COMM_NKINDS
} ft_comm_kind;

typedef struct ft_comm_stats {
    double bytes_sent;
    double wait_s;
    double bytes[FT_COMM_NKINDS];
    long calls[FT_COMM_NKINDS];
} ft_comm_stats;

/* The counters since ft_comm_init. */
void ft_comm_stats_get(const ft_comm *c, ft_comm_stats *out);
/* out = now - before, field by field (out may be either argument). */
void ft_comm_stats_diff(const ft_comm_stats *now, const ft_comm_stats *before,
                        ft_comm_stats *out);
/* "allreduce", "reduce_scatter", "allgather", "broadcast", "send", "recv", "barrier". */
const char *ft_comm_kind_name(ft_comm_kind k);

/* ---- asynchronous collectives: start, then ft_comm_wait before touching the buffers.
 * *req is set (never NULL on success); every request must be waited exactly once.
 * All ranks start the same collectives in the same order. */

/* buf[i] = op over ranks of buf[i] (in place). */
int ft_comm_iallreduce(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, ft_comm_op op,
                       ft_comm_req **req, ft_err *err);
/* send holds sum(counts) elements (rank r's block at offset counts[0]+..+counts[r-1]);
 * recv (counts[rank] elements) gets the op over ranks of this rank's block. send and
 * recv must not overlap. */
int ft_comm_ireduce_scatter_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                              ft_comm_dtype dt, ft_comm_op op, ft_comm_req **req, ft_err *err);
/* recv (sum(counts) elements) gets every rank's send (counts[r] elements) in rank order.
 * send may point at this rank's block inside recv (in place). */
int ft_comm_iallgather_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                         ft_comm_dtype dt, ft_comm_req **req, ft_err *err);
/* buf (n elements) of rank root is copied to every rank. */
int ft_comm_ibroadcast(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int root,
                       ft_comm_req **req, ft_err *err);
/* Point to point (the pipeline's activations and gradients); tag (>= 0) tells messages
 * apart. Both sides give the same n; zero elements send no message. A single process has
 * no peer: both fail. On NCCL the tag is not used: messages between two ranks match in
 * the order they are posted, and each rank's sends and receives run in order, so pair a
 * send with the peer's receive (two ranks that both send first wait forever). */
int ft_comm_isend(ft_comm *c, const void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                  ft_comm_req **req, ft_err *err);
int ft_comm_irecv(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                  ft_comm_req **req, ft_err *err);

/* Waits for req (NULL is a no-op) and frees it; the timeout applies. */
int ft_comm_wait(ft_comm *c, ft_comm_req *req, ft_err *err);

/* ---- blocking forms: the async call and its wait. */
int ft_comm_allreduce(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, ft_comm_op op,
                      ft_err *err);
int ft_comm_reduce_scatter_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                             ft_comm_dtype dt, ft_comm_op op, ft_err *err);
int ft_comm_allgather_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                        ft_comm_dtype dt, ft_err *err);
int ft_comm_broadcast(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int root, ft_err *err);
int ft_comm_send(ft_comm *c, const void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                 ft_err *err);
int ft_comm_recv(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                 ft_err *err);
int ft_comm_barrier(ft_comm *c, ft_err *err);

/* buf[i] = sum over ranks of buf[i] for doubles (kept for the metric reductions). */
int ft_comm_allreduce_sum(ft_comm *c, double *buf, size_t n, ft_err *err);

/* Aborts every rank of the run with exit code rc after printing msg on stderr (one rank
 * failing alone must not leave the others in a collective). Single process: exit(rc). */
void ft_comm_abort(ft_comm *c, int rc, const char *msg) __attribute__((noreturn));

#endif
