/* train.batch_size auto and train.grad_accum auto (DESIGN.md seam 6: the resolution of
 * "auto" values), and the memory one rank may plan for.
 *
 * The budget of a rank (ft_rank_memory_budget): train.memory_budget when it is set (a
 * size: 512MiB, 6GiB, 8GB); else, on a GPU, the device's free memory less 10%; else
 * (CPU ranks) the host's available memory (MemAvailable of /proc/meminfo, or
 * sysconf(_SC_AVPHYS_PAGES) where there is none) x 0.8, shared by the ranks on the node.
 * The 20% margin is for what the tracked allocator does not count: the dataset, the
 * tokenizer, MPI's buffers, the C library. Under several ranks the smallest budget of
 * any rank counts, so that every rank chooses the same batch.
 *
 * The rule (ft_auto_batch_choose), with W = world size and G = train.global_batch_size:
 *
 *   batch_size auto   the largest micro-batch b in 1..cap whose planned per-rank peak
 *                     fits the budget. The peak is the plan's total (memplan.h) for the
 *                     row the run uses: on CPU ranks the exact cpu row of dist.strategy at
 *                     W ranks (its largest rank) plus its offloaded host bytes (the same
 *                     memory there), on GPUs the predicted gpu row. cap = 1024, and no more than the records of the
 *                     training file one data-parallel rank reads (ceil(records / W)).
 *                     With G set, b must divide G / W (G / (W x grad_accum) when the
 *                     accumulation is fixed, which leaves one candidate): the global batch
 *                     is exact, as DeepSpeed's rule (ds_config.h).
 *   grad_accum auto   G / (b x W) when G is set: the smallest accumulation that reaches
 *                     the global batch; 1 when it is not.
 *   nothing fits      b = 1 (or the one candidate) needs more than the budget: an error
 *                     giving both and suggesting gradient checkpointing, a sharded
 *                     strategy or more ranks, and a shorter model.max_seq_len.
 *
 * Fixed values are left as they are; the global batch rule checks them. */
#ifndef FT_AUTO_BATCH_H
#define FT_AUTO_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config/run_config.h"
#include "dist/dist.h"
#include "core/ft_error.h"
#include "formats/hf_config.h"

/* Where a run's tensors live: train.device resolved (run_device.h); CPU when it cannot
 * be honoured (the run itself then fails with the reason). */
typedef enum ft_mem_device { FT_MEM_DEVICE_CPU = 0, FT_MEM_DEVICE_CUDA } ft_mem_device;

ft_mem_device ft_run_device(const ft_train_section *t);

typedef struct ft_mem_budget {
    size_t bytes;
    char source[192]; /* how it was found: "train.memory_budget = 2GiB", ... */
} ft_mem_budget;

/* Parses a size: digits with an optional fraction and a unit, B, KB/MB/GB/TB (powers of
 * 1000) or KiB/MiB/GiB/TiB (powers of 1024), case-insensitive, a space allowed before
 * it; a bare number is bytes (as accelerate's max_memory). Returns 0, or -1 for text
 * that is none of these or a size of 0 bytes. */
int ft_parse_size(const char *text, size_t *bytes);

/* The memory the hardware leaves one rank: the seam between the auto batch size (and
 * the memory check) and the devices. dev and device_index (the GPU ordinal the rank
 * takes, ft_rank_gpu; ignored on the CPU) say where the rank's tensors live; local_ranks
 * (>= 1) ranks share this node's host memory. FT_MEM_DEVICE_CUDA: the device's free
 * memory (gpu_probe.h; a context on that GPU only) x 0.9; CPU:
 * MemAvailable x 0.8 / local_ranks. An error when the figure cannot be read. */
int ft_memory_available(ft_mem_device dev, int device_index, int local_ranks,
                        ft_mem_budget *out, ft_err *err);

/* An error naming train.memory_budget when it is neither auto nor a size. */
int ft_memory_budget_check(const ft_train_section *t, ft_err *err);

/* The budget of one rank: train.memory_budget when set, else ft_memory_available.
 * Errors name train.memory_budget when its value is not a size. */
int ft_rank_memory_budget(const ft_train_section *t, ft_mem_device dev, int device_index,
                          int local_ranks, ft_mem_budget *out, ft_err *err);

/* The planned per-rank peak of the run cfg describes at world_size ranks on dev (the
 * row the rule above compares with the budget), reading model.name's config.json; *row
 * (may be NULL) gets the row's name (a static string). */
int ft_plan_peak(const ft_run_config *cfg, int world_size, ft_mem_device dev, size_t *peak,
                 const char **row, ft_err *err);

typedef struct ft_auto_batch {
    bool batch_auto, accum_auto; /* what was auto (nothing else is set when neither) */
    int batch_size, grad_accum;  /* the resolved values */
    int world;
    long global;                 /* train.global_batch_size; 0 when auto */
    int cap;                     /* the largest micro-batch considered */
    char row[16];                /* the plan row compared with the budget */
    size_t planned;              /* its per-rank peak at batch_size (batch_auto) */
    size_t next;                 /* at the next larger candidate; 0 when there is none
                                  * below the cap */
    int next_batch;              /* that candidate */
    ft_mem_budget budget;
} ft_auto_batch;

/* The rule above for the model mc at world_size ranks with the given budget and cap
 * (>= 1), on the device dev; reads cfg only. Fills out; errors as above, naming the
 * keys. */
int ft_auto_batch_choose(const ft_run_config *cfg, const ft_model_config *mc, int world_size,
                         ft_mem_device dev, const ft_mem_budget *budget, int cap,
                         ft_auto_batch *out, ft_err *err);

/* ft-train's entry: resolves the auto values of cfg for the ranks of comm (NULL: for
 * world_size processes on this node, as `--plan N` plans them), writing the chosen
 * numbers into cfg (so that --print-config, config.yaml and TensorBoard show them), then
 * applies the global batch rule (ft_run_config_global_batch). Collective when comm has
 * several ranks. out (may be NULL) gets what was chosen; the one line of
 * ft_auto_batch_print goes to log (NULL: none) when anything was auto. Also validates
 * train.memory_budget. */
int ft_resolve_batch(ft_run_config *cfg, ft_comm *comm, int world_size, FILE *log,
                     ft_auto_batch *out, ft_err *err);

/* One line: "ft-train: batch_size auto = 12 (...), grad_accum auto = 2 (...)". */
void ft_auto_batch_print(const ft_auto_batch *a, FILE *out);

#endif
