/* train/: training a model one step at a time.
 *
 * Owns: one optimizer step (train_step.h: accumulation, clipping, schedule, AdamW), the
 * optimizer state (optim.h), learning-rate schedules (schedule.h) and checkpoints of
 * model and optimizer state (checkpoint.h). The loop around them is run/.
 * May call: core, device, formats, kernels, model.
 * (This is the folder's main header.) */

/* One optimizer step of training: gradient accumulation over micro-batches, global-norm
 * clipping, learning-rate schedule, AdamW. The building block of ft-train. */
#ifndef FT_TRAIN_STEP_H
#define FT_TRAIN_STEP_H

#include <stdbool.h>

#include "model/model.h"
#include "train/optim.h"
#include "train/schedule.h"

typedef struct ft_step_stats {
    double loss;      /* mean token loss over the accumulated batch */
    long tokens;      /* counted (label != -100) tokens */
    double grad_norm; /* global L2 norm before clipping */
    float clip_coef;  /* factor applied to the gradients (1 = not clipped) */
    float lr;         /* learning rate of this update */
    bool nonfinite;   /* loss or grad_norm is not finite (inf, nan): the update was not
                       * applied (weights and optimizer state, its step count included,
                       * are as they were before the step) */
} ft_step_stats;

/* A training objective other than the token loss (train/pref.h): count gives the units a
 * micro-batch adds to the step's denominator (pairs), run does one micro-batch's forward
 * and backward, accumulating the gradient of (its summed loss) / total, where total is
 * the count of the whole (global) batch, and sets *loss_sum to its summed loss. */
typedef struct ft_objective {
    void *ctx;
    double (*count)(void *ctx, const ft_batch *b);
    int (*run)(void *ctx, ft_model *m, const ft_batch *b, double total, double *loss_sum,
               ft_err *err);
} ft_objective;

/* Zeroes the gradients; runs forward and backward on each of the n_micro micro-batches
 * with the loss normalised by the counted tokens of all of them (so the gradient equals
 * that of one pass over the whole batch, as transformers does with
 * num_items_in_batch); clips to max_grad_norm (<= 0: no clipping) and applies AdamW with
 * the schedule's learning rate for step o->step. A non-finite loss or gradient norm is
 * not applied (st->nonfinite; the caller decides whether that stops the run). A batch
 * with no counted token is an error. */
int ft_train_step(ft_model *m, ft_optimizer *o, const ft_lr_schedule *sched,
                  const ft_batch *micro, int n_micro, double max_grad_norm, ft_step_stats *st,
                  ft_err *err);
/* The same with another objective (NULL: the token loss); st->loss is the mean over its
 * count, st->tokens that count. */
int ft_train_step_objective(ft_model *m, ft_optimizer *o, const ft_lr_schedule *sched,
                            const ft_objective *obj, const ft_batch *micro, int n_micro,
                            double max_grad_norm, ft_step_stats *st, ft_err *err);

#endif
