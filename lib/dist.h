/* The communication interface (DESIGN.md seam 4): the processes of a run and the
 * collectives between them. Implementations: single process (every collective is the
 * identity) and MPI (CPU buffers; Open MPI's mpirun or Slurm's srun start the ranks).
 * NCCL for GPU buffers joins when the CUDA backend does. Only what the tools use so far
 * is here; DDP, ZeRO and FSDP extend it. */
#ifndef FT_DIST_H
#define FT_DIST_H

#include <stddef.h>

#include "ft_error.h"

typedef struct ft_comm ft_comm;

/* Joins the run: MPI when this build has it and the process was started by a launcher
 * (mpirun / srun set the rank in the environment), else a single process. */
int ft_comm_init(ft_comm **out, ft_err *err);
/* Leaves the run (MPI_Finalize); NULL is a no-op. */
void ft_comm_finalize(ft_comm *c);

int ft_comm_rank(const ft_comm *c);
int ft_comm_size(const ft_comm *c);
/* "single" or "mpi". */
const char *ft_comm_backend(const ft_comm *c);

/* buf[i] = sum over ranks of buf[i], on every rank. */
int ft_comm_allreduce_sum(ft_comm *c, double *buf, size_t n, ft_err *err);
int ft_comm_barrier(ft_comm *c, ft_err *err);

#endif
