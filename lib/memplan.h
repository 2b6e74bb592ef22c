/* The memory planner: bytes per allocator category (weights, gradients, optimizer,
 * activations, workspace; see alloc.h) that the run a config describes needs, computed
 * from the run config and the model's config.json alone (no weights are read).
 *
 * Two kinds of rows:
 *
 *   cpu-fp32   The engine as it exists today (one process, fp32, lib/model.c). EXACT:
 *              it equals ft_model_mem(m)->peak[c] after ft_model_load, a forward and
 *              backward of batch_size x max_seq_len tokens and ft_optimizer_init
 *              (tests/unit/test_memplan.c checks it). Bytes are the requested sizes the
 *              tracked allocator counts (its 64-byte headers and alignment are not).
 *
 *   gpu-*      PREDICTIONS for backends that do not exist yet (CUDA, NCCL, ZeRO, FSDP),
 *              per rank at world size N, by the formulas below. Nothing measures them yet;
 *              they leave out the CUDA context, cuBLAS / NCCL workspaces and allocator
 *              fragmentation (typically 0.5-2 GiB per GPU).
 *
 * Notation: Pt = trainable parameters (LoRA A and B, or every weight with tuning.mode
 * full), Pf = frozen parameters (the base under LoRA / QLoRA), N = world size,
 * h = bytes of a compute parameter / gradient (2 with bf16 or fp16, 4 otherwise),
 * k = bytes of optimizer state per trainable parameter (AdamW m and v in fp32 = 8, plus
 * an fp32 master copy = 4 when h = 2: the ZeRO paper's K = 12), f(Pf) = bytes of the
 * frozen base (h per parameter; with qlora the linear-layer weights are bitsandbytes NF4
 * with double quantization: 0.5 B/param + 1 B per 64-block absmax + 4 B per 256 blocks,
 * embeddings, norms, biases and lm_head stay at h). ceil(x/N) is per tensor.
 *
 * Per rank (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
 * Parameter Models", 2020, section 5; the frozen base is never updated, so ZeRO-1/2 keep
 * it whole and ZeRO-3 / FSDP shard it like any parameter):
 *
 *                weights                  gradients      optimizer
 *   gpu-1        h*Pt + f(Pf)             h*Pt           k*Pt            one GPU
 *   gpu-ddp      h*Pt + f(Pf)             h*Pt           k*Pt            DDP, N ranks
 *   gpu-zero1    h*Pt + f(Pf)             h*Pt           k*Pt/N          P_os
 *   gpu-zero2    h*Pt + f(Pf)             h*Pt/N         k*Pt/N          P_os+g
 *   gpu-zero3    (h*Pt + f(Pf))/N         h*Pt/N         k*Pt/N          P_os+g+p
 *   gpu-fsdp     (4*Pt + f(Pf))/N         4*Pt/N         8*Pt/N          FULL_SHARD
 *
 * FSDP keeps the sharded flat parameter itself in fp32 (it is the master copy, so the
 * optimizer holds only m and v) and reduce-scatters into fp32 gradient shards; each FSDP
 * unit (embeddings, each layer, final norm + lm_head) is padded to a multiple of N.
 * Its total per parameter equals ZeRO-3's (16 Pt / N with mixed precision); the split
 * between categories differs.
 *
 * Activations per rank are those of the CPU engine for batch_size x max_seq_len tokens
 * (same buffers, per layer or one shared set under gradient checkpointing) with tensors
 * at h bytes and the statistics (RMSNorm rstd, attention log-sum-exp), the logits [N, V]
 * and the int32 token buffers at 4 bytes. Workspace is the backward scratch at h bytes;
 * sharded strategies add transient full-size buffers of the largest unit U:
 *   zero2:        + h*Pt(U)            its gradients before the reduce-scatter
 *   zero3, fsdp:  + 2*(h*P(U))         the gathered unit and the prefetched next one
 *                 + h*Pt(U)            its gradients before the reduce-scatter
 * Gradient buckets of DDP are ranges of the flat gradient buffer (DESIGN.md seam 3), so
 * they cost nothing extra. */
#ifndef FT_MEMPLAN_H
#define FT_MEMPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "alloc.h"
#include "config.h"
#include "ft_error.h"
#include "hf_config.h"
#include "quant_io.h"

typedef enum ft_plan_row_id {
    FT_PLAN_CPU = 0, /* exact: the CPU fp32 engine of today */
    FT_PLAN_GPU_1,   /* predictions from here on */
    FT_PLAN_GPU_DDP,
    FT_PLAN_GPU_ZERO1,
    FT_PLAN_GPU_ZERO2,
    FT_PLAN_GPU_ZERO3,
    FT_PLAN_GPU_FSDP,
    FT_PLAN_NROWS
} ft_plan_row_id;

typedef struct ft_memplan_row {
    const char *name;      /* "cpu-fp32", "gpu-zero3", ... */
    bool predicted;        /* true: a formula for a backend that does not exist yet */
    int world_size;        /* ranks this row is for (1 for cpu-fp32 and gpu-1) */
    size_t bytes[FT_MEM_NCAT];
    size_t total;
} ft_memplan_row;

typedef struct ft_memplan_result {
    /* what was planned */
    char model_type[32];   /* from config.json */
    int num_layers;
    char mode[8];          /* tuning.mode: lora, qlora, full */
    int batch_size;        /* per rank; 1 when train.batch_size is auto (batch_auto) */
    bool batch_auto;
    int seq_len;           /* model.max_seq_len */
    bool grad_ckpt;
    bool half;             /* train.bf16 or train.fp16: GPU rows at 2 bytes */
    int world_size;
    size_t n_trainable, n_frozen; /* parameters, as the CPU engine lays them out */
    size_t n_quantized;    /* of n_frozen: linear weights a quantized base keeps in 4/8 bits */
    size_t quant_bytes;    /* what those weights take quantized (codes and state) */
    char quant[16];        /* that base's format ("nf4+dq", "fp4", "int8"), "" when dense */

    ft_memplan_row rows[FT_PLAN_NROWS];
    ft_plan_row_id selected; /* the row dist.strategy / dist.zero_stage pick on a GPU */
    char note[256];          /* caveat for the cpu row ("" when none) */
} ft_memplan_result;

/* Plans the run cfg describes for the model mc (config.json) at world_size ranks
 * (>= 1). Errors name the config key (bad LoRA targets, rank, dropout). */
int ft_memplan(const ft_config *cfg, const ft_model_config *mc, int world_size,
               ft_memplan_result *out, ft_err *err);

/* The same, reading config.json of model.name (a local dir or a Hub id in the local
 * Hugging Face cache); the weights are not needed. */
int ft_memplan_config(const ft_config *cfg, int world_size, ft_memplan_result *out,
                      ft_err *err);

/* A table: one row per strategy, MiB per category and in total; predicted rows are
 * marked, the row the config selects is starred. */
void ft_memplan_print(const ft_memplan_result *r, FILE *out);

/* Prints the plan of cfg's model for each tuning mode (full, lora, qlora) side by side:
 * trainable and base parameters, the cpu-fp32 and selected rows' totals per rank, and
 * the quantized base's bytes per parameter. cfg's tuning.mode is restored. */
int ft_memplan_compare_modes(ft_config *cfg, int world_size, FILE *out, ft_err *err);

#endif
