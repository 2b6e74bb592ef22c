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
 * Run dir (train.output_dir): config.yaml (the resolved config), events.out.tfevents.*,
 * checkpoint-N/ (see checkpoint.h), final/ (the trained adapter in PEFT format, or the
 * full model's weights, config and tokenizer files), metrics.jsonl (one JSON object per
 * logged step: step, epoch, loss, learning_rate, grad_norm, tokens_per_second,
 * elapsed_s; and per evaluation: step, eval_loss, elapsed_s) and run_summary.json
 * (strategy, world_size, mode, device, batch_size, grad_accum, global_batch_size (samples
 * per optimizer step: batch_size x grad_accum x data-parallel ranks), steps, wall_time_s,
 * steps_per_second,
 * tokens_per_second, final_train_loss, final_eval_loss, comm_bytes_per_step,
 * peak_memory_bytes per rank, peak_memory_by_category per rank, host_offload_bytes per
 * rank): what `make compare`
 * reads. */
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
