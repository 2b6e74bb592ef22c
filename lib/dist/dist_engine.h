/* The training engine across ranks: one model replica, shard or stage per process, and
 * the optimizer step under a distributed strategy. Written against lib/dist/dist.h only, so
 * every strategy runs on CPU ranks under mpirun as it would on GPUs with NCCL.
 *
 * Strategies (the trainable buffer is flat and laid out by unit, model.h):
 *
 *   none     one process (world size 1).
 *   ddp      a whole replica per rank; gradients summed over ranks in buckets of
 *            consecutive units (bucket_bytes), each launched (async) as soon as backward
 *            has finished its units, on the last micro-batch of the accumulation only.
 *   zero1    whole parameters and gradients; AdamW state (and the update) only for this
 *            rank's shard of the flat buffer: buckets are reduce-scattered into the shard
 *            gradient, the shard is updated, the updated parameters all-gathered.
 *   zero2    as zero1, but no whole gradient: each unit's gradient goes to a small window
 *            and is reduce-scattered into the shard gradient as soon as the unit's backward
 *            is done, on every micro-batch.
 *   zero3    as zero2, and parameters (trainable and frozen) are sharded too: each unit is
 *   fsdp     all-gathered into a window just before its forward / backward and dropped
 *            after (the next unit is prefetched while this one computes); the update is
 *            on the shard itself. fsdp is the same engine under FSDP's name.
 *   model_parallel  the units split into contiguous stages, one per rank, balanced by
 *            parameter count; the residual stream goes forward rank to rank, its gradient
 *            back; every rank sees the same batches. With pipeline_chunks k > 1 each
 *            micro-batch is split into k chunks of rows (GPipe): stage s computes chunk j
 *            while stage s+1 computes chunk j-1, all forwards before all backwards, so the
 *            bubble shrinks from (S-1)/S of the time to (S-1)/(k+S-1), for k slots of
 *            activations.
 *
 *   offload_optimizer (data-parallel strategies): the AdamW state and the fp32 master of
 *   the shard live in host memory (a separate allocator context, ft_engine_host_mem) and
 *   the update runs on the CPU; on CPU ranks that is the same memory, on GPUs it frees
 *   the device of the optimizer.
 *
 *   A quantized base (QLoRA) under zero3 / fsdp is sharded by whole quantization blocks
 *   with their absmax (and nested state): each rank keeps 1/N of every packed weight's
 *   blocks (quant/quant_shard.h), and a layer's weights are gathered into a window just
 *   before its forward and its backward (with the dense part of the unit, the next unit
 *   prefetched), dequantized into the model's compute window and dropped after. The
 *   bytes are the checkpoint's (ft-quantize or bitsandbytes): nothing is re-quantized.
 *
 *   offload_params (zero3 / fsdp; DeepSpeed's offload_param, FSDP's cpu_offload): the
 *   rank's shard of the frozen base (quantized blocks and dense frozen weights) lives in
 *   host memory (ft_engine_host_mem, weights category) and is copied into the window
 *   per unit, then gathered in place; the trainable shard stays on the device.
 *
 * Every strategy computes the same update as one process with the whole batch: the loss
 * of each rank's micro-batches is normalised by the counted tokens of the global batch
 * (summed over ranks first) and gradients are summed, so DDP with N ranks of micro-batch
 * b equals one process of batch N*b up to fp32 summation order.
 *
 * Checkpoints are gathered to rank 0 and written in the public format (PEFT adapter or HF
 * weights + AdamW moments of the whole buffer), so a run resumes under another strategy
 * or world size. Rank 0 holds the whole trainable buffer (and its moments) while saving,
 * every rank while loading (as DeepSpeed's stage3_gather_16bit_weights_on_model_save).
 *
 * Profile: with FT_DIST_PROFILE=dir in the environment every rank appends one JSON line
 * per step to dir/rank-R.jsonl (dir is created), ft_engine_step_profile's figures:
 *   {"step": optimizer step, "rank": R, "world": N, "strategy": name, "micro_batches": n,
 *    "tokens": this rank's input tokens, "step_s": wall time of the step, "comm_wait_s":
 *    time blocked in communication, "comm_bytes": bytes sent, "calls": {kind: count},
 *    "bytes": {kind: bytes sent}}
 * (make bench-dist reads them; on a cluster they show where a step's time goes). */
#ifndef FT_DIST_ENGINE_H
#define FT_DIST_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

#include "device/alloc.h"
#include "train/checkpoint.h"
#include "dist/dist.h"
#include "core/ft_error.h"
#include "model/model.h"
#include "ops.h"
#include "train/schedule.h"
#include "train/train_step.h"

typedef enum ft_strategy {
    FT_STRATEGY_NONE = 0,
    FT_STRATEGY_DDP,
    FT_STRATEGY_ZERO1,
    FT_STRATEGY_ZERO2,
    FT_STRATEGY_ZERO3,
    FT_STRATEGY_FSDP,
    FT_STRATEGY_PIPELINE
} ft_strategy;

/* "none", "ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel". */
const char *ft_strategy_name(ft_strategy s);

typedef struct ft_dist_options {
    ft_strategy strategy;
    bool offload_optimizer;
    bool offload_params;   /* zero3 / fsdp: the frozen base's shard lives in host memory
                            * and is copied in per unit before its gather */
    size_t bucket_bytes;   /* ddp / zero1 gradient buckets */
    bool overlap_comm;     /* false: wait for every collective right away */
    bool prefetch;         /* zero3 / fsdp: gather the next unit ahead */
    int pipeline_chunks;   /* model_parallel: micro-batch split into this many chunks whose
                            * forwards all run before their backwards (GPipe); 1 = naive */
} ft_dist_options;

typedef struct ft_engine ft_engine;

/* Loads this rank's part of the model from model_dir (mo->unbound is set by the engine)
 * and creates the optimizer for the part it updates. adapter_dir (NULL: none) is a PEFT
 * adapter to start LoRA from. The strategy must fit the world size (none: 1 rank;
 * model_parallel: at most one rank per unit). */
int ft_engine_new(ft_engine **out, ft_comm *comm, const char *model_dir,
                  const ft_model_options *mo, const char *adapter_dir, ft_adamw_hparams hp,
                  const ft_dist_options *o, ft_err *err);
void ft_engine_free(ft_engine *e);

ft_model *ft_engine_model(ft_engine *e);
ft_strategy ft_engine_strategy(const ft_engine *e);
/* Device memory of this rank (the model's allocator) and the host memory that holds an
 * offloaded optimizer (all zero without offload). */
ft_mem *ft_engine_mem(ft_engine *e);
const ft_mem *ft_engine_host_mem(const ft_engine *e);
/* Data-parallel ranks (each reads its own shard of the data): the world size, or 1 for
 * model_parallel, whose ranks all read the same batches. */
int ft_engine_data_world(const ft_engine *e);
/* The rank that holds the loss and logits (the last pipeline stage; else 0). */
int ft_engine_loss_rank(const ft_engine *e);
/* AdamW updates done (the optimizer's step counter). */
int ft_engine_opt_step(const ft_engine *e);

/* One optimizer step over this rank's n_micro micro-batches (collective: every rank
 * calls it with the same n_micro). st gets the global loss, tokens and norm. A step whose
 * global loss or gradient norm is not finite is not applied on any rank
 * (st->nonfinite, the same on every rank). */
int ft_engine_step(ft_engine *e, const ft_lr_schedule *sched, const ft_batch *micro,
                   int n_micro, double max_grad_norm, ft_step_stats *st, ft_err *err);

/* DPO from a starting adapter (train/pref.h): keep_reference keeps the trainables' values
 * as they are now (the compute copies this rank's forward reads: the whole replica, the
 * zero2 copy, the zero3 / fsdp shard, the pipeline stage's; adapter-sized, or its shard,
 * in the weights category, and as much workspace for the policy's while swapped);
 * use_reference(true) puts them in place of the policy's for a forward, (false) puts the
 * policy's back. Collective under zero3 / fsdp only through the forward between them.
 * outer: only the trainables of the first and the last unit (the embedding's and the
 * head's: a fresh adapter's modules trained in full, whose starting values are the
 * original modules, for a reference with the LoRA pairs off). */
int ft_engine_keep_reference(ft_engine *e, bool outer, ft_err *err);
int ft_engine_use_reference(ft_engine *e, bool on, ft_err *err);

/* The same step with another objective (train_step.h; NULL: the token loss): its loss is
 * averaged over the global batch's count (pairs). Under model_parallel every stage runs
 * the objective in step (its forwards and backward pass the residual stream along, the
 * stage with the head computes the loss; others report 0) and the objective splits a
 * micro-batch into GPipe chunks itself (train/pref.h chunks): the engine's gpipe is for
 * the token loss. */
int ft_engine_step_objective(ft_engine *e, const ft_objective *obj, const ft_lr_schedule *sched,
                             const ft_batch *micro, int n_micro, double max_grad_norm,
                             ft_step_stats *st, ft_err *err);

/* Collective. Rank 0 writes run_dir/checkpoint-N (ft_checkpoint_save) with the gathered
 * weights and moments; out gets its path on rank 0. An error on rank 0 is reported on
 * every rank. */
int ft_engine_save_checkpoint(ft_engine *e, const char *run_dir, const ft_train_state *st,
                              const char *base_model, int save_total_limit, char *out,
                              size_t out_len, ft_err *err);
/* Collective. Rank 0 writes the gathered trainable weights into dir
 * (ft_checkpoint_save_weights). */
int ft_engine_save_weights(ft_engine *e, const char *dir, const char *base_model, ft_err *err);
/* Collective. Every rank reads the checkpoint at path and keeps its part, after the
 * checks of ft_checkpoint_load against expect (this run's state at its start; NULL:
 * none). */
int ft_engine_load_checkpoint(ft_engine *e, const char *path, ft_train_state *st,
                              const ft_train_state *expect, ft_err *err);

/* This rank's mean token loss over its own micro-batches of the last step (data-parallel
 * ranks; NAN on pipeline stages, whose loss is the last stage's). */
double ft_engine_rank_loss(const ft_engine *e);

/* Bytes of the quantized base (QLoRA) this rank keeps between layers: its blocks of every
 * weight and the maps under zero3 / fsdp, the whole quantized weights of its replica or
 * stage otherwise (0: a dense base). */
size_t ft_engine_quant_bytes(ft_engine *e);

/* Bytes this rank sent into collectives during the last ft_engine_step. */
double ft_engine_step_comm_bytes(const ft_engine *e);

/* The last ft_engine_step on this rank: returns its wall time in seconds; *comm (NULL:
 * not wanted) gets the growth of the communication counters during it (dist.h
 * ft_comm_stats: bytes sent, seconds blocked in waits, calls by kind). The step time less
 * comm->wait_s is this rank's compute (with the update and the copies around the
 * collectives) that was not spent waiting for communication. */
double ft_engine_step_profile(const ft_engine *e, ft_comm_stats *comm);

#endif
