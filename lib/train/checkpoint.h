/* Training checkpoints: checkpoint-<step>/ in the run dir, written atomically.
 *
 * Layout (the trainer-state part is ours, documented and versioned here; the weights are
 * in the public formats, so a checkpoint's adapter loads in PEFT as it is):
 *   adapter_config.json + adapter_model.safetensors   LoRA: the adapter (PEFT format)
 *   model.safetensors                                 full: every trainable tensor, HF names
 *   optimizer.safetensors                             AdamW moments "exp_avg", "exp_avg_sq"
 *                                                     (flat fp32, the trainable buffer's
 *                                                     layout) + metadata step
 *   trainer_state.json   {"format": "ftkit-trainer-state", "version": 1, "global_step",
 *                         "epoch", "batch_in_epoch", "seed", "rng_counter" (decimal
 *                         strings), "stamp": {device, dtype, mode,
 *                         quant, strategy, world_size}}
 * Everything is written into checkpoint-<step>.tmp, each file fsync'ed, then the directory
 * is renamed into place and the run dir fsync'ed: a run killed at any moment leaves the
 * previous checkpoints intact and never a partial checkpoint-<step>. */
#ifndef FT_CHECKPOINT_H
#define FT_CHECKPOINT_H

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

typedef struct ft_train_state {
    long global_step;   /* optimizer steps done */
    int epoch;          /* epoch in progress */
    int batch_in_epoch; /* batches of that epoch consumed */
    uint64_t seed;
    uint64_t rng_counter; /* ft_model_rng_counter at the save */
    ft_ckpt_stamp stamp;
} ft_train_state;

/* Writes run_dir/checkpoint-<global_step>; then removes the oldest checkpoints beyond
 * save_total_limit (0 keeps all). The path written goes to out (may be NULL). */
int ft_checkpoint_save(const char *run_dir, ft_model *m, const ft_optimizer *o,
                       const ft_train_state *st, const char *base_model, int save_total_limit,
                       char *out, size_t out_len, ft_err *err);

/* Writes the trainable weights into dir (created): a PEFT adapter in LoRA mode, else
 * model.safetensors with HF names. */
int ft_checkpoint_save_weights(const char *dir, ft_model *m, const char *base_model,
                               ft_err *err);

/* The newest checkpoint-N of run_dir into path: 1 if found, 0 if none, -1 on error. */
int ft_checkpoint_latest(const char *run_dir, char *path, size_t path_len, ft_err *err);

/* Restores weights, optimizer moments and step, and the train state from a checkpoint
 * dir. expect (may be NULL) must equal the checkpoint's stamp, else an error saying which
 * field differs. The model and optimizer must have been created with the same layout. */
int ft_checkpoint_load(const char *path, ft_model *m, ft_optimizer *o, ft_train_state *st,
                       const ft_ckpt_stamp *expect, ft_err *err);

#endif
