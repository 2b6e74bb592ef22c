/* What ft-train says when a run runs out of memory (an error with err->oom): the memory
 * plan of the run as configured (memplan.h), the budget of one rank, and the overrides
 * that the plan says fit that budget, each as the make variable and the config key:
 *
 *   ft-train: out of memory on rank 0 (GPU 0). The plan of this run, per rank:
 *   <the plan table of ft_memplan_print>
 *   budget per rank: 7168.0 MiB (free memory of GPU 0, ...); this run plans 9461.3 MiB (gpu-1)
 *   overrides that fit by the plan (make train VAR=value, or ft-train --set key=value):
 *     TRAIN_BATCH_SIZE=2 TRAIN_GRAD_ACCUM=8      plans 6120.4 MiB
 *     TRAIN_GRADIENT_CHECKPOINTING=true          plans 4021.0 MiB
 *     ...
 *
 * Candidates, each applied alone to the run's config: the largest smaller
 * train.batch_size (with train.grad_accum raised to keep the global batch when it
 * divides), train.gradient_checkpointing true, the longest shorter model.max_seq_len (a
 * power of two, at least 128), dist.offload_optimizer cpu (data-parallel strategies),
 * a sharded dist.strategy at the run's world size, and on one rank the fewest ranks
 * (2, 4, 8, 16) whose sharded strategy fits, and tuning.mode qlora for a LoRA run. The
 * GPU rows are predictions that leave out the CUDA context and library workspaces (memplan.h).
 *
 * The budget is the allocator's limit when one is set (FT_MEM_LIMIT), else
 * ft_rank_memory_budget's (train.memory_budget, or what the device has free now). */
#ifndef FT_OOM_ADVICE_H
#define FT_OOM_ADVICE_H

#include <stddef.h>
#include <stdio.h>

#include "memory/auto_batch.h"
#include "config/run_config.h"

typedef struct ft_oom_context {
    int rank, world_size;
    int local_ranks;   /* ranks sharing this node's host memory (CPU budget) */
    ft_mem_device dev;
    int device_index;  /* the GPU ordinal (GPU runs) */
    size_t limit;      /* the allocator's limit (FT_MEM_LIMIT), 0 when none */
} ft_oom_context;

/* Prints the advice above to out. Problems in computing it (a config.json that cannot
 * be read again, an unknown budget) are printed in its place: the out-of-memory error
 * itself is what the caller reports. */
void ft_oom_advice(const ft_run_config *cfg, const ft_oom_context *ctx, FILE *out);

#endif
