/* GPU side of dist.h (internal to lib/dist/dist.c and lib/dist/dist_nccl.c).
 *
 * With CUDA: telling device buffers from host ones, and copying between them (the single
 * backend's reduce-scatter and allgather on device buffers).
 *
 * With CUDA, NCCL and MPI (FT_DIST_NCCL): the NCCL backend. Each collective is enqueued on
 * a dedicated comm stream, after the work already on the legacy default stream, and ends
 * with a CUDA event that ft_nccl_test polls; dist.c owns the request, the timeout and the
 * logging. All ranks must pass the same kind of memory to a collective (device on every
 * rank, or host on every rank), or the ranks end up in different backends and hang. */
#ifndef FT_DIST_NCCL_H
#define FT_DIST_NCCL_H

#include <stddef.h>

#include "dist/dist.h"

#ifdef FT_HAVE_CUDA
/* 1 when p is device memory (cudaMemoryTypeDevice), 0 for host, managed or NULL. */
int ft_dist_on_device(const void *p);
/* Synchronous copy of bytes between any two of host and device memory. */
int ft_dist_device_copy(void *dst, const void *src, size_t bytes, ft_err *err);
#endif

#if defined(FT_HAVE_CUDA) && defined(FT_HAVE_NCCL) && defined(FT_HAVE_MPI)
#define FT_DIST_NCCL 1

typedef struct ft_nccl ft_nccl;
typedef struct ft_nccl_event ft_nccl_event;

/* Collective over MPI_COMM_WORLD (MPI is up): every rank calls it with its place in the
 * run. Each rank takes GPU ft_gpu_for_rank(local_rank, GPUs it sees) (device/run_device.h,
 * the trainer's rule), and NCCL starts only when every rank sees a GPU and no two ranks of
 * a node took the same one (their PCI bus ids differ: one GPU per rank, whether each rank
 * sees all of the node's GPUs or only its own); then *out is set. Otherwise *out = NULL
 * and 0 is returned, or -1 when required (FT_DIST_BACKEND=nccl). With size 1 no MPI call
 * is made (a single process, launched or not, gets a one-rank NCCL communicator). */
int ft_nccl_init(ft_nccl **out, int rank, int size, int local_rank, int local_size,
                 bool required, ft_err *err);
/* Destroys the communicator, stream and events; NULL is a no-op. */
void ft_nccl_finalize(ft_nccl *g);
/* The CUDA device this rank took. */
int ft_nccl_device(const ft_nccl *g);

/* Enqueue one collective on device buffers; *ev is the event its completion records.
 * Arguments are checked by dist.c (dtype, op, root, peer, counts). */
int ft_nccl_allreduce(ft_nccl *g, void *buf, size_t n, ft_comm_dtype dt, ft_comm_op op,
                      ft_nccl_event **ev, ft_err *err);
int ft_nccl_reduce_scatter_v(ft_nccl *g, const void *send, void *recv, const size_t *counts,
                             ft_comm_dtype dt, ft_comm_op op, ft_nccl_event **ev, ft_err *err);
int ft_nccl_allgather_v(ft_nccl *g, const void *send, void *recv, const size_t *counts,
                        ft_comm_dtype dt, ft_nccl_event **ev, ft_err *err);
int ft_nccl_broadcast(ft_nccl *g, void *buf, size_t n, ft_comm_dtype dt, int root,
                      ft_nccl_event **ev, ft_err *err);
/* NCCL has no tags: messages between two ranks match in the order they are posted, and a
 * rank's sends and receives run one after another on the comm stream (two ranks that both
 * send first wait for each other forever: pair a send with the peer's receive). */
int ft_nccl_send(ft_nccl *g, const void *buf, size_t n, ft_comm_dtype dt, int peer,
                 ft_nccl_event **ev, ft_err *err);
int ft_nccl_recv(ft_nccl *g, void *buf, size_t n, ft_comm_dtype dt, int peer,
                 ft_nccl_event **ev, ft_err *err);

/* 1 when the event has completed, 0 while pending, -1 on a CUDA or NCCL error. */
int ft_nccl_test(ft_nccl *g, ft_nccl_event *ev, ft_err *err);
void ft_nccl_event_free(ft_nccl_event *ev);
/* ncclCommAbort: frees this rank from a collective that will never finish. */
void ft_nccl_abort(ft_nccl *g);
#endif

#endif
