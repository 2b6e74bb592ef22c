/* memory/: how much memory a run needs, and what to do when it has not enough.
 *
 * Owns: the memory plan per strategy and category (memplan.h), the auto batch size and
 * the memory budget of a rank (auto_batch.h), the plan beside one measured step
 * (memcheck.h) and the advice after an out-of-memory (oom_advice.h).
 * May call: config, core, device, dist, formats, model, quant.
 * (This is the folder's main header.) */

/* The memory planner: bytes per allocator category (weights, gradients, optimizer,
 * activations, workspace; see alloc.h) that the run a config describes needs, computed
 * from the run config and the model's config.json alone (no weights are read).
 *
 * Two kinds of rows:
 *
 *   cpu-*      The engine as it exists today (fp32 on CPU ranks, lib/model/model.c and
 *              lib/dist/dist_engine.c). EXACT: they equal the tracked allocator's peak per
 *              category after the engine is set up and has run one optimizer step of
 *              batch_size x max_seq_len tokens per micro-batch. cpu-fp32 is one process
 *              (dist.strategy none; tests/unit/test_memplan.c checks it against
 *              ft_model_load + forward + backward + ft_optimizer_init); cpu-ddp,
 *              cpu-zero1..3 and cpu-fsdp are the strategies of lib/dist/dist_dp.c and cpu-mp
 *              the stages of lib/dist/dist_pipeline.c at world size N, per rank
 *              (ft_memplan_cpu_rank; the row shows the rank with the largest total, as
 *              shards of a buffer of n elements are n*(r+1)/N - n*r/N long);
 *              `ft-train --measure` and tests/conformance/test_memcheck.py check them on
 *              real ranks. Bytes are the requested sizes the tracked
 *              allocator counts (its 64-byte headers and alignment are not).
 *
 *   gpu-*      PREDICTIONS for the GPU engine (CUDA, NCCL, ZeRO, FSDP: written, not yet run
 *              on a GPU), per rank at world size N, by the formulas below. Nothing measures
 *              them yet;
 *              they leave out the CUDA context, cuBLAS / NCCL workspaces and allocator
 *              fragmentation (typically 0.5-2 GiB per GPU).
 *
 * The CPU engine per rank (Pt, Pf as below; s(n) = this rank's shard of n elements;
 * U = the largest unit's trainable elements, F = its frozen elements; all at 4 bytes):
 *
 *                weights            gradients      optimizer   workspace (beyond cpu-fp32)
 *   cpu-fp32     Pt + Pf            Pt             2 Pt        -
 *   cpu-ddp      Pt + Pf            Pt             2 Pt        -       (buckets are ranges)
 *   cpu-zero1    Pt + Pf            Pt + s(Pt)     2 s(Pt)     -
 *   cpu-zero2    Pt + Pf            s(Pt)          2 s(Pt)     4 U     (2 gradient windows,
 *                                                                       each + its landing)
 *   cpu-zero3    s(Pt) + s(Pf)      s(Pt)          2 s(Pt)     4 U + w (U + F)
 *   cpu-fsdp     as cpu-zero3 (the same engine under FSDP's name)
 *
 * with w = 2 parameter windows (the unit computing and the one prefetched), 3 with tied
 * embeddings. With dist.offload_optimizer cpu the optimizer column moves to host memory
 * (a separate allocator): AdamW m and v, an fp32 master and a gradient copy of the
 * shard, 4 s(Pt) in all (row.host).
 *
 * A quantized base (Q = its bytes, Pf counting only the dense frozen weights) is whole
 * on every rank but under zero3 / fsdp, which keep this rank's whole blocks of every
 * quantized weight, sq(Q) (quant/quant_shard.h), plus the nested state of each
 * double-quantized weight (its map and one fp32 per 256 blocks) and, at load, the largest unit's quantized weights whole, Q(U); every
 * parameter window holds a unit's quantized arrays (each at a 64-byte boundary) too.
 * With dist.offload_params cpu, s(Pf) and sq(Q) move to the host (row.host).
 *
 *   cpu-mp       model_parallel: rank r holds stage r of the units split by parameter
 *                count as lib/dist/dist_pipeline.c splits them: its trainable and frozen
 *                parameters (+ a copy of a tied embedding, and its gradient, on the last
 *                stage), their gradients, AdamW over its trainables, and the activations
 *                of its own layers only (the head's logits on the last stage); with
 *                dist.pipeline_micro_batches k > 1 one activation set per GPipe chunk of
 *                ceil(batch_size / k) rows, the backward scratch once.
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
 * at h bytes, the statistics (RMSNorm rstd, attention log-sum-exp) and the int32 token
 * buffers at 4 bytes, and the logits of one head chunk [R, V] at h bytes (R =
 * ft_loss_chunk_rows of train.loss_chunk_tokens: all N rows with 0). Workspace is the backward scratch at h bytes;
 * sharded strategies add transient full-size buffers of the largest unit U:
 *   zero2:        + h*Pt(U)            its gradients before the reduce-scatter
 *   zero3, fsdp:  + 2*(h*P(U))         the gathered unit and the prefetched next one
 *                 + h*Pt(U)            its gradients before the reduce-scatter
 * Gradient buckets of DDP are ranges of the flat gradient buffer (DESIGN.md seam 3), so
 * they cost nothing extra.
 *
 * train.batch_size auto is resolved before planning (lib/memory/auto_batch.h); a config that
 * still says auto is planned for a micro-batch of 1.
 *
 * train.objective dpo or orpo: batch_size counts pairs, so a micro-batch has 2 batch_size
 * rows (the chosen and the rejected sequences) and the activations are planned for those.
 * ORPO has no reference model. DPO's reference forward runs on the policy's own buffers (LoRA with its adapter off) and
 * keeps no activation of its own; what the reference adds (pref_ref, on every rank of
 * every row) is, in full fine-tuning, the frozen base copy (4 (Pt + Pf) weights) and the
 * activations of its inference forward (one layer set shared by the layers, every
 * layer's input, the head; no backward scratch), and, with LoRA from
 * tuning.lora.init_adapter, the starting adapter and a scratch for the policy's (4 Pt
 * weights + 4 Pt workspace; h Pt each on the GPU rows; under zero3 / fsdp the rank's
 * shard of Pt, on a model_parallel stage its own trainables and a tied embedding's copy:
 * what each rank's forward reads); with a fresh adapter that trains the embedding or the
 * head in full (modules_to_save, tokens added) the same for the trainables of the
 * embedding's and the head's units only, Po (the modules' starting values, the originals:
 * 4 Po weights + 4 Po workspace; under zero3 / fsdp the part of Po in the rank's shard);
 * under model_parallel full fine-tuning's reference is, the same way, each stage's own
 * trainables kept (4 + 4 bytes each), not a frozen copy. */
#ifndef FT_MEMPLAN_H
#define FT_MEMPLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "device/alloc.h"
#include "config/run_config.h"
#include "core/ft_error.h"
#include "formats/hf_config.h"
#include "formats/quant_io.h"

/* model_parallel stages the planner lays out (one per rank) */
#define FT_PLAN_MAX_STAGES 128
/* distinct shapes of quantized weights the planner shards (a model with more is refused) */
#define FT_PLAN_MAX_QSHAPES 64

typedef enum ft_plan_row_id {
    FT_PLAN_CPU = 0, /* exact: the CPU fp32 engine of today, one process */
    FT_PLAN_CPU_DDP, /* exact: the CPU engine's strategies at world size N */
    FT_PLAN_CPU_ZERO1,
    FT_PLAN_CPU_ZERO2,
    FT_PLAN_CPU_ZERO3,
    FT_PLAN_CPU_FSDP,
    FT_PLAN_CPU_MP,  /* exact: model_parallel stages (lib/dist/dist_pipeline.c) */
    FT_PLAN_GPU_1,   /* predictions from here on */
    FT_PLAN_GPU_DDP,
    FT_PLAN_GPU_ZERO1,
    FT_PLAN_GPU_ZERO2,
    FT_PLAN_GPU_ZERO3,
    FT_PLAN_GPU_FSDP,
    FT_PLAN_NROWS
} ft_plan_row_id;

typedef struct ft_memplan_row {
    const char *name;      /* "cpu-fp32", "cpu-zero3", "gpu-zero3", ... */
    bool predicted;        /* true: a formula, not yet measured (the gpu-* rows) */
    int world_size;        /* ranks this row is for (1 for cpu-fp32 and gpu-1) */
    int rank;              /* cpu-* rows: the rank shown (the largest total); else 0 */
    size_t bytes[FT_MEM_NCAT];
    size_t total;
    size_t host;           /* with dist.offload_optimizer / dist.offload_params cpu: the
                            * bytes the row moves to host memory (not in total) */
} ft_memplan_row;

typedef struct ft_memplan_result {
    /* what was planned */
    char model_type[32];   /* from config.json */
    int num_layers;
    char mode[8];          /* tuning.mode: lora, qlora, full */
    int batch_size;        /* per rank; 1 when train.batch_size is still auto (batch_auto) */
    bool batch_auto;
    int seq_len;           /* model.max_seq_len */
    bool grad_ckpt;
    bool half;             /* train.bf16 or train.fp16: GPU rows at 2 bytes */
    int world_size;
    size_t n_trainable, n_frozen; /* parameters, as the CPU engine lays them out */
    size_t n_quantized;    /* of n_frozen: linear weights a quantized base keeps in 4/8 bits */
    size_t quant_bytes;    /* what those weights take quantized (codes and state) */
    char quant[16];        /* that base's format ("nf4+dq", "fp4", "int8"), "" when dense */
    size_t max_unit_quantized; /* elements of the largest unit's quantized weights */
    size_t max_quant_absmax;   /* fp32 elements of the largest absmax temporary of one
                                * double-quantized weight (the window's, model.c) */
    /* zero3 / fsdp shard the quantized base by blocks (lib/dist/dist_qshard.c): the
     * format, each distinct weight shape and how many weights have it, the weights
     * whose 256-value map every rank keeps, the largest unit's quantized bytes (read
     * whole while the engine loads it) and its gather window's bytes */
    ft_quant_options quant_opt;
    int n_qshapes;
    struct ft_plan_qshape {
        int64_t rows, cols;
        size_t count;
    } qshapes[FT_PLAN_MAX_QSHAPES];
    size_t q_replicated;     /* bytes of nested state every rank keeps whole */
    size_t max_unit_quant_bytes, max_unit_qwin;
    bool offload_params;     /* dist.offload_params cpu */

    /* what the cpu-* rows of each rank are computed from (ft_memplan_cpu_rank) */
    size_t max_unit_trainable, max_unit_frozen; /* elements of the largest unit */
    bool tied;               /* tie_word_embeddings: a third zero3 parameter window */
    bool offload;            /* dist.offload_optimizer cpu */
    size_t cpu_activations, cpu_workspace; /* bytes, the same on every data-parallel rank */
    bool pref;               /* train.objective dpo: 2 batch_size rows a micro-batch */
    size_t pref_ref[FT_MEM_NCAT]; /* cpu rows: what DPO's reference adds on each rank */
    bool pref_ref_adapter;   /* it is the starting adapter: per rank what its forward
                              * reads (zero3 / fsdp its shard, a pipeline stage its part) */
    bool pref_ref_stage;     /* cpu-mp: each stage keeps its trainables' starting values
                              * (the starting adapter's part; in full fine-tuning its part
                              * of the base, in place of the frozen whole copy) */
    bool pref_ref_outer;     /* a fresh adapter's modules trained in full: only the first
                              * unit's and the last unit's trainables are kept (pref_outer
                              * elements each), per rank what its forward reads of them */
    size_t pref_outer[2];
    int pipe_stages;         /* cpu-mp: world_size when the engine can split the model into
                              * that many stages (at most FT_PLAN_MAX_STAGES), else 0 */
    size_t pipe_bytes[FT_PLAN_MAX_STAGES][FT_MEM_NCAT]; /* each stage's bytes */

    ft_memplan_row rows[FT_PLAN_NROWS];
    ft_plan_row_id selected; /* the row dist.strategy / dist.zero_stage pick on a GPU
                              * (gpu-1 for model_parallel, which has no gpu row) */
    int selected_cpu;        /* the cpu-* row they pick on CPU ranks; -1: none
                              * (model_parallel on more ranks than units) */
    char note[256];          /* caveat for the cpu rows ("" when none) */
} ft_memplan_result;

/* What a GPU holds beyond the gpu-* rows (the reserve --plan adds before it compares a row
 * with a 24 GB GPU):
 *   FT_PLAN_CUDA_CONTEXT      the CUDA context with the kernels loaded (CUDA 12 loads
 *                             modules lazily; a context with cuBLAS and NCCL takes
 *                             300-600 MiB on Ampere, Ada and Hopper): 768 MiB;
 *   FT_PLAN_CUBLAS_WORKSPACE  cuBLAS's workspace (CUBLAS_WORKSPACE_CONFIG's default on
 *                             Hopper: 8 x 4 MiB) and a cuBLASLt one of the same size, per
 *                             stream, two streams: 128 MiB (the CUDA backend itself holds
 *                             one of 32 MiB, its split-K scratch of 16 MiB and a 1 MiB
 *                             scratch: kernels/cuda/cuda_context.cu);
 *   FT_PLAN_NCCL_BUFFERS      NCCL's channel buffers (NCCL_BUFFSIZE 4 MiB per channel
 *                             and peer, both directions, up to 32 channels): 256 MiB,
 *                             with more than one rank;
 * and 5% of the planned bytes for the caching allocator's fragmentation. */
#define FT_PLAN_CUDA_CONTEXT ((size_t)768 << 20)
#define FT_PLAN_CUBLAS_WORKSPACE ((size_t)128 << 20)
#define FT_PLAN_NCCL_BUFFERS ((size_t)256 << 20)
/* a 24 GB GPU (RTX 3090 / 4090): 24564 MiB as nvidia-smi shows its total */
#define FT_PLAN_GPU_24GB ((size_t)24564 << 20)
size_t ft_memplan_gpu_reserve(size_t planned, int world_size);

/* ft_model_options.loss_chunk_rows from train.loss_chunk_tokens (auto: -1). */
int ft_memplan_loss_chunk(const ft_train_section *t);

/* Plans the run cfg describes for the model mc (config.json) at world_size ranks
 * (>= 1). Errors name the config key (bad LoRA targets, rank, dropout). */
int ft_memplan(const ft_run_config *cfg, const ft_model_config *mc, int world_size,
               ft_memplan_result *out, ft_err *err);

/* The same for a micro-batch of batch_size rows (>= 1) instead of train.batch_size: what
 * the auto batch size tries. */
int ft_memplan_batch(const ft_run_config *cfg, const ft_model_config *mc, int world_size,
                     int batch_size, ft_memplan_result *out, ft_err *err);

/* Exact bytes per category of rank `rank` (0..world_size-1) of the CPU engine under the
 * strategy of the cpu row `row` (FT_PLAN_CPU .. FT_PLAN_CPU_MP; cpu-fp32 has rank 0
 * only), and into *host (may be NULL) the host bytes of an offloaded optimizer. Returns
 * the device total, or 0 (bytes untouched) for a row or rank that does not exist. */
size_t ft_memplan_cpu_rank(const ft_memplan_result *r, ft_plan_row_id row, int rank,
                           size_t bytes[FT_MEM_NCAT], size_t *host);

/* The cpu row of an engine strategy name (ft_strategy_name: "none", "ddp", "zero1", ...,
 * "model_parallel"); -1 for an unknown name. */
int ft_memplan_cpu_row_of(const char *strategy);

/* The same, reading config.json of model.name (a local dir or a Hub id in the local
 * Hugging Face cache); the weights are not needed. */
int ft_memplan_config(const ft_run_config *cfg, int world_size, ft_memplan_result *out,
                      ft_err *err);

/* A table: one row per strategy, MiB per category and in total; exact and predicted rows
 * are marked, the rows the config selects (on CPU ranks, on GPUs) are starred. cpu-fp32
 * is always shown, the other cpu rows when world_size > 1 or selected. */
void ft_memplan_print(const ft_memplan_result *r, FILE *out);

/* Prints the plan of cfg's model for each tuning mode (full, lora, qlora) side by side:
 * trainable and base parameters, the selected cpu and gpu rows' totals per rank, and
 * the quantized base's bytes per parameter. */
int ft_memplan_compare_modes(const ft_run_config *cfg, int world_size, FILE *out, ft_err *err);

/* The same table with one more row, `extra` (e.g. what was measured), right under the
 * selected cpu row (NULL: none). */
void ft_memplan_print_with(const ft_memplan_result *r, const ft_memplan_row *extra,
                           FILE *out);

#endif
