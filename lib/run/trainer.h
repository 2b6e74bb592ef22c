/* run/: one ft-train run, from its typed config to the run dir.
 *
 * Owns: the training loop and what it writes (trainer.h), the checks a run config
 * passes before launch (run_check.h).
 * May call: config, core, data, device, dist, eval, formats, memory, model, train.
 * (This is the folder's main header.) */

/* The training loop of ft-train: config -> model, data, optimizer, schedule; epochs or
 * max_steps of gradient-accumulated AdamW steps; logging to stderr and TensorBoard;
 * evaluation; atomic checkpoints with resume; SIGINT/SIGTERM save a checkpoint and stop.
 *
 * Under mpirun / srun every rank runs it; dist.strategy picks how they share the work
 * (lib/dist/dist_engine.h) and rank 0 writes the outputs.
 *
 * Divergence: a step whose loss or gradient norm is not finite is never applied; it ends
 * the run with an error naming the step (before anything of it is written: the last
 * checkpoint stays), or with train.skip_nonfinite_steps it is skipped and counted. Every
 * rank takes the same decision. Non-finite weights or optimizer state are never written.
 *
 * The run dir is the run's own: a new run refuses one that holds an earlier run's outputs
 * (unless train.overwrite_output_dir, which removes only those); resuming a checkpoint of
 * the dir continues there. Each run has a random run id (trainer_state.json,
 * run_summary.json), and checkpoint rotation removes only its own run's checkpoints.
 * Leftovers of a killed save (checkpoint-N.tmp) or removal (checkpoint-N.deleting) are
 * removed at the start. A resumed checkpoint must be of the same base model, seed, device,
 * dtype, mode and data position (checkpoint.h). A write error (a full disk, or a file
 * larger than `ulimit -f` allows: SIGXFSZ is ignored) fails the run naming the file.
 *
 * Run dir (train.output_dir): config.yaml (the resolved config), events.out.tfevents.*,
 * checkpoint-N/ (see checkpoint.h), final/ (the trained adapter in PEFT format, or the
 * full model's weights, config and tokenizer files), metrics.jsonl (one JSON object per
 * logged step: step, epoch (fractional), loss (the mean over the steps since the last
 * logged one, as the HF Trainer logs it), learning_rate, grad_norm (the last step's),
 * tokens_per_second, skipped_steps, elapsed_s; and per evaluation: step, eval_loss
 * (the eval set's mean token cross-entropy; a MoE model with output_router_logits adds
 * router_aux_loss_coef x eval_aux_loss, the load-balancing loss of each eval batch
 * averaged weighted by its rows: the HF Trainer's eval_loss), eval_aux_loss (MoE),
 * elapsed_s) and run_summary.json (strategy, world_size, mode, device, batch_size,
 * grad_accum, global_batch_size (samples per optimizer step: batch_size x grad_accum x
 * data-parallel ranks), run_id, steps, skipped_steps, wall_time_s, steps_per_second,
 * tokens_per_second, final_train_loss (the last step's), final_eval_loss,
 * comm_bytes_per_step, peak_memory_bytes per rank, peak_memory_by_category per rank,
 * host_offload_bytes per rank): what `make compare` reads. Both are strict JSON: a number
 * that is not finite is null.
 *
 * TensorBoard: train/loss (as metrics.jsonl), train/epoch, train/learning_rate,
 * train/grad_norm, train/skipped_steps, memory and per-rank figures, the eval scalars
 * (eval/loss as eval_loss, eval/perplexity of the cross-entropy, eval/aux_loss), the resolved
 * config as text, and the HParams plugin's records: every config key as a hyperparameter
 * with the metrics train/loss, eval/loss, final/train_loss, final/eval_loss and
 * final/skipped_steps (written at the end). train.eval_strategy no evaluates nothing;
 * steps and epoch evaluate once more at the end. */
#ifndef FT_TRAINER_H
#define FT_TRAINER_H

#include <stdbool.h>
#include <stdio.h>

#include "config/run_config.h"
#include "dist/dist.h"
#include "core/ft_error.h"
#include "memory/memcheck.h"

typedef struct ft_trainer_options {
    const char *resume; /* NULL: fresh run; "auto": newest checkpoint if any; else a dir */
    FILE *log;          /* progress and logs (stderr); only rank 0 logs */
    ft_comm *comm;      /* the run's ranks (NULL: one process) */
    /* Memory check (ft-train --plan --measure): set up as for training, run exactly one
     * optimizer step whose micro-batches are padded to train.batch_size x
     * model.max_seq_len tokens (the memory plan's worst case), without evaluation, and
     * write nothing (no run dir, config.yaml, event file, metrics, checkpoint or
     * summary). Every rank takes part; rank 0's *measure (ft_mem_measured_init for the
     * world size) gets every rank's allocator peaks. NULL: train. */
    ft_mem_measured *measure;
} ft_trainer_options;

typedef enum ft_train_outcome {
    FT_TRAIN_DONE = 0,
    FT_TRAIN_INTERRUPTED /* a signal stopped the run after saving a checkpoint */
} ft_train_outcome;

/* Trains as cfg says (train.batch_size and train.grad_accum resolved: auto reads as 1;
 * see auto_batch.h). out gets the final output dir (or the checkpoint written on
 * interruption; "" after a memory check). */
int ft_train_run(const ft_run_config *cfg, const ft_trainer_options *o, ft_train_outcome *outcome,
                 char *out, size_t out_len, ft_err *err);

#endif
