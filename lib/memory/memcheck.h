/* Planned beside measured (`ft-train --plan --measure`, `make memory-check`): the peaks
 * per allocator category that every rank's tracked allocator (alloc.h) reached in one
 * real training step (lib/run/trainer.c, ft_trainer_options.measure), put next to the
 * memory plan (memplan.h) of the same config and world size.
 *
 * The planned column of a rank is the exact cpu row of the strategy the engine ran
 * (ft_memplan_cpu_rank), so for the CPU engine the difference is 0 in every category
 * on every rank; a difference means the planner and the engine disagree (a bug in one
 * of them). */
#ifndef FT_MEMCHECK_H
#define FT_MEMCHECK_H

#include <stddef.h>
#include <stdio.h>

#include "device/alloc.h"
#include "core/ft_error.h"
#include "memory/memplan.h"

typedef struct ft_mem_measured {
    int world;            /* ranks measured */
    char strategy[32];    /* the engine's strategy (ft_strategy_name) */
    int batch_size;       /* rows per micro-batch, each padded to seq_len tokens */
    int seq_len;
    int grad_accum;       /* micro-batches in the step */
    size_t *peak;         /* [world * FT_MEM_NCAT]: rank r's peak of category c at
                           * peak[r * FT_MEM_NCAT + c] */
    size_t *host;         /* [world]: peak of the host memory of an offloaded optimizer */
} ft_mem_measured;

/* Allocates the arrays for world ranks (zeroed); free with ft_mem_measured_free. */
int ft_mem_measured_init(ft_mem_measured *m, int world, ft_err *err);
void ft_mem_measured_free(ft_mem_measured *m);

/* Prints the plan table with a "measured" row (the rank with the largest measured
 * total, MiB) under the selected cpu row, then bytes per rank: planned (exact cpu row),
 * measured and their difference per category, in total and in host memory (every rank
 * up to 8 ranks; beyond that the largest and the smallest). Returns the largest absolute
 * difference in bytes over ranks and categories (0: measured == planned), or
 * (size_t)-1 when the strategy has no exact row. */
size_t ft_memcheck_print(const ft_memplan_result *plan, const ft_mem_measured *m, FILE *out);

#endif
