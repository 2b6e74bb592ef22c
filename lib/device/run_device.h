/* device/: where tensors live.
 *
 * Owns: where a run computes and in what dtype (run_device.h), the tracked allocator of
 * host and GPU memory with its categories (alloc.h), what the GPUs are (gpu_probe.h:
 * count, memory, peer access, NCCL) and how busy they are (gpu_monitor.h: NVML), and
 * the clock of a timed span of device work (device_clock.h).
 * May call: core, config, kernels.
 * (This is the folder's main header.) */

/* Where a run computes and in what dtype: train.device and train.bf16 / train.fp16
 * resolved against this build and this machine.
 *
 *   train.device auto   the GPU when this build has the CUDA backend and the CUDA runtime
 *                       sees one; else the CPU
 *   train.device cuda   the GPU, or an error saying why there is none
 *   train.device cpu    the CPU (fp32, the reference backend)
 *
 * On the GPU the compute dtype is bf16 with train.bf16 (the default: bf16 weights and
 * activations, fp32 master weights, gradients and reductions) and fp32 without it;
 * train.fp16 is refused there (the CUDA backend has no fp16 loss scaling). The CPU
 * computes in fp32 whatever these say. Each process takes the GPU ft_gpu_for_rank names. */
#ifndef FT_RUN_DEVICE_H
#define FT_RUN_DEVICE_H

#include <stdbool.h>

#include "config/run_config.h"
#include "core/ft_error.h"
#include "ops.h"

typedef struct ft_run_device_choice {
    ft_device device;
    ft_dtype dtype;
    char why[160]; /* "train.device auto: 1 CUDA GPU", ... (for the log) */
} ft_run_device_choice;

/* Resolves the keys above (train.device, bf16, fp16). Errors name the key. */
int ft_run_device_resolve(const ft_train_section *t, ft_run_device_choice *out, ft_err *err);

/* Whether name is one of auto, cpu and cuda. */
bool ft_run_device_known(const char *name);

/* The same from values: want "auto", "cpu" or "cuda", bf16 the GPU's dtype choice; key
 * names the setting in errors ("--device"). */
int ft_run_device_choose(const char *want, bool bf16, const char *key,
                         ft_run_device_choice *out, ft_err *err);

/* The GPU ordinal (among the visible ones) of the rank with node-local rank local_rank
 * when it sees `visible` GPUs: local_rank % visible, so that ranks that all see the
 * node's GPUs take one each, and a rank that sees one GPU of its own (Slurm's
 * --gpus-per-task=1, a CUDA_VISIBLE_DEVICES per rank) takes device 0. -1 when visible
 * is 0. The one rule for every place that picks a rank's GPU: the trainer
 * (ft_run_device_select), the NCCL backend and the memory probe of batch_size auto. */
int ft_gpu_for_rank(int local_rank, int visible);

/* This process's GPU by that rule (ft_gpu_for_rank of the GPUs the CUDA runtime sees);
 * -1 when it sees none or the build has no CUDA. Opens no context. */
int ft_rank_gpu(int local_rank);

/* Makes GPU ft_rank_gpu(local_rank) this process's current device and opens the CUDA
 * backend's context there (cuBLAS, its workspace, the scratch: an error with err->oom
 * when they do not fit); a no-op on the CPU. out gets the ordinal taken (-1 on the CPU). */
int ft_run_device_select(const ft_run_device_choice *c, int local_rank, int *out, ft_err *err);

/* "cpu" / "cuda" and "fp32" / "bf16": the names of the checkpoint stamp. */
const char *ft_device_name(ft_device d);
const char *ft_dtype_name(ft_dtype d);

#endif
