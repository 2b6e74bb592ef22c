/* Training checkpoints: checkpoint-<step>/ in the run dir, written atomically.
 *
 * Layout (the trainer-state part is ours, documented and versioned here; the weights are
 * in the public formats, so a checkpoint's adapter loads in PEFT as it is):
 *   adapter_config.json + adapter_model.safetensors   LoRA: the adapter (PEFT format)
 *   model.safetensors                                 full: every trainable tensor, HF names
 *   optimizer.safetensors                             AdamW moments "exp_avg", "exp_avg_sq"
 *                                                     (flat fp32, the trainable buffer's
 *                                                     layout) + metadata step
 *   trainer_state.json   {"format": "ftkit-trainer-state", "version": 2, "global_step",
 *                         "epoch", "batch_in_epoch", "seed", "rng_counter" (decimal
 *                         strings), "skipped_steps", "run_id", "base_model": {"path",
 *                         "fingerprint"}, "stamp": {device, dtype, mode, quant, strategy,
 *                         world_size}}
 * Versions: 1 had no skipped_steps, run_id or base_model; it still loads (skipped_steps
 * reads as 0, and the checks that need the missing fields are left out). A version this
 * code does not know is refused.
 *
 * Everything is written into checkpoint-<step>.tmp, each file fsync'ed, then the directory
 * is renamed into place and the run dir fsync'ed: a run killed at any moment leaves the
 * previous checkpoints intact and never a partial checkpoint-<step>. Removing one (the
 * rotation of save_total_limit, or a checkpoint of the same step replaced) renames it to
 * checkpoint-<step>.deleting first, so a kill during the removal leaves no half-removed
 * checkpoint-<step> either; ft_checkpoint_cleanup removes such leftovers and the .tmp
 * dirs of a killed save.
 *
 * The run id (random, made by ft_checkpoint_new_run_id) ties checkpoints to the run that
 * wrote them: rotation only removes checkpoints of the saving run's own id, never another
 * run's (nor one without an id, written before version 2). */
#ifndef FT_CHECKPOINT_H
#define FT_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ft_error.h"
#include "model/model.h"
#include "train/optim.h"

/* What a checkpoint was made with; resuming under a different device, dtype, mode or
 * quantization is refused (strategy and world size may change). */
typedef struct ft_ckpt_stamp {
    char device[16];   /* "cpu", "cuda" */
    char dtype[16];    /* compute dtype: "fp32", "bf16" */
    char mode[16];     /* "lora", "qlora", "full" */
    char quant[16];    /* "none", "nf4", "fp4", "int8" */
    char strategy[16]; /* "none", "ddp", "zero1", ... */
    int world_size;
} ft_ckpt_stamp;

/* The base model a run trains on: its dir as the config names it, and a fingerprint of
 * its config.json (the bytes) and of its tensors' names, dtypes and shapes (not their
 * values, which would take a read of the whole model). */
typedef struct ft_ckpt_base {
    char path[4096];
    char fingerprint[24]; /* 16 hex digits; "" when unknown (a version 1 checkpoint) */
} ft_ckpt_base;

typedef struct ft_train_state {
    long global_step;   /* optimizer steps done, skipped ones included */
    int epoch;          /* epoch in progress */
    int batch_in_epoch; /* batches of that epoch consumed */
    uint64_t seed;
    uint64_t rng_counter; /* ft_model_rng_counter at the save */
    long skipped_steps; /* steps not applied (non-finite loss or gradient norm): the
                         * optimizer's step count is global_step - skipped_steps */
    char run_id[40];    /* "" when unknown (a version 1 checkpoint) */
    ft_ckpt_stamp stamp;
    ft_ckpt_base base;
} ft_train_state;

/* A new random run id (32 hex digits) into id (at least 33 bytes). */
int ft_checkpoint_new_run_id(char *id, size_t n, ft_err *err);

/* The fingerprint of the model in model_dir (see ft_ckpt_base) into base, with path. */
int ft_checkpoint_base_of(const char *model_dir, ft_ckpt_base *base, ft_err *err);

/* Writes run_dir/checkpoint-<global_step>; then removes the oldest checkpoints of this
 * run (st->run_id) beyond save_total_limit (0 keeps all), and leftovers of killed saves
 * and removals. A checkpoint of the same step is replaced only when it is this run's
 * (else an error). Non-finite weights or optimizer moments are refused (an error naming
 * them): a checkpoint is never written from a diverged state. The path written goes to
 * out (may be NULL). */
int ft_checkpoint_save(const char *run_dir, ft_model *m, const ft_optimizer *o,
                       const ft_train_state *st, const char *base_model, int save_total_limit,
                       char *out, size_t out_len, ft_err *err);

/* Writes the trainable weights into dir (created): a PEFT adapter in LoRA mode, else
 * model.safetensors with HF names. Non-finite weights are refused, as above. */
int ft_checkpoint_save_weights(const char *dir, ft_model *m, const char *base_model,
                               ft_err *err);

/* The newest checkpoint-N of run_dir into path: 1 if found, 0 if none, -1 on error. */
int ft_checkpoint_latest(const char *run_dir, char *path, size_t path_len, ft_err *err);

/* Whether a file name in a run dir is a checkpoint or the leftover of one:
 * checkpoint-N, checkpoint-N.tmp or checkpoint-N.deleting. */
bool ft_checkpoint_name(const char *name);

/* Removes the checkpoint-N.tmp and checkpoint-N.deleting dirs of run_dir (a killed save
 * or removal); *removed (may be NULL) gets how many. A missing run_dir is fine. */
int ft_checkpoint_cleanup(const char *run_dir, int *removed, ft_err *err);

/* Restores weights, optimizer moments and step, and the train state from a checkpoint
 * dir, after checking the state: global_step, epoch and batch_in_epoch not negative, the
 * optimizer's step equal to global_step - skipped_steps. expect (may be NULL: no more
 * checks) is this run's own state at its start: the checkpoint's stamp must equal its
 * stamp (device, dtype, mode, quant), its seed expect->seed, and its base model
 * fingerprint expect's (where both are known); else an error saying which differs and
 * both values. The model and optimizer must have been created with the same layout. */
int ft_checkpoint_load(const char *path, ft_model *m, ft_optimizer *o, ft_train_state *st,
                       const ft_train_state *expect, ft_err *err);

#endif
