/* The training loop of ft-train: config -> model, data, optimizer, schedule; epochs or
 * max_steps of gradient-accumulated AdamW steps; logging to stderr and TensorBoard;
 * evaluation; atomic checkpoints with resume; SIGINT/SIGTERM save a checkpoint and stop.
 *
 * Run dir (train.output_dir): config.yaml (the resolved config), events.out.tfevents.*,
 * checkpoint-N/ (see checkpoint.h), final/ (the trained adapter in PEFT format, or the
 * full model's weights, config and tokenizer files). */
#ifndef FT_TRAINER_H
#define FT_TRAINER_H

#include <stdbool.h>
#include <stdio.h>

#include "config.h"
#include "ft_error.h"

typedef struct ft_trainer_options {
    const char *resume; /* NULL: fresh run; "auto": newest checkpoint if any; else a dir */
    FILE *log;          /* progress and logs (stderr) */
} ft_trainer_options;

typedef enum ft_train_outcome {
    FT_TRAIN_DONE = 0,
    FT_TRAIN_INTERRUPTED /* a signal stopped the run after saving a checkpoint */
} ft_train_outcome;

/* Trains as cfg says. out gets the final output dir (or the checkpoint written on
 * interruption). */
int ft_train_run(const ft_config *cfg, const ft_trainer_options *o, ft_train_outcome *outcome,
                 char *out, size_t out_len, ft_err *err);

#endif
