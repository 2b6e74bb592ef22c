/* Learning-rate schedules and gradient clipping, with transformers' semantics.
 *
 * The multiplier at optimizer step s (0-based: the lr used by the s-th update) is that of
 * transformers.get_{constant,linear,cosine}_schedule_with_warmup:
 *   warmup:   s < W:  s / max(1, W)
 *   constant: 1
 *   linear:   max(0, (S - s) / max(1, S - W))
 *   cosine:   progress = (s - W) / max(1, S - W);
 *             max(0, 0.5 * (1 + cos(pi * cycles * 2 * progress))), cycles = 0.5
 * with S the total number of optimizer steps and W the warmup steps. */
#ifndef FT_SCHEDULE_H
#define FT_SCHEDULE_H

#include <stddef.h>

#include "core/ft_error.h"

typedef enum ft_lr_kind { FT_LR_CONSTANT = 0, FT_LR_LINEAR, FT_LR_COSINE } ft_lr_kind;

typedef struct ft_lr_schedule {
    ft_lr_kind kind;
    double base_lr;
    int warmup_steps;
    int total_steps;
} ft_lr_schedule;

/* "constant", "linear", "cosine" (also "constant_with_warmup"); -1 on an unknown name
 * with err naming it and the known ones. */
int ft_lr_kind_parse(const char *name, ft_lr_kind *kind, ft_err *err);

/* The learning rate for 0-based optimizer step `step`. */
double ft_lr_at(const ft_lr_schedule *s, int step);

/* torch.nn.utils.clip_grad_norm_: given the global L2 norm of all gradients, the factor
 * to multiply them by: min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0. */
float ft_clip_coef(double global_norm, double max_norm);

#endif
