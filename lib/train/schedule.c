/* Learning-rate schedules (transformers' get_{constant,linear,cosine}_schedule_with_warmup)
 * and the gradient-clipping factor of torch.nn.utils.clip_grad_norm_.
 *
 * LambdaLR sets lr = base_lr * lambda(step), lambda evaluated in Python floats (double);
 * the code below keeps the reference's operation order, so the values are the same doubles.
 * Note: transformers' plain "constant" schedule ignores warmup; here "constant" and
 * "constant_with_warmup" both warm up (identical when warmup_steps is 0). */
#include "train/schedule.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    ft_lr_kind kind;
} LR_KINDS[] = {
    {"constant", FT_LR_CONSTANT},
    {"constant_with_warmup", FT_LR_CONSTANT},
    {"linear", FT_LR_LINEAR},
    {"cosine", FT_LR_COSINE},
};

int ft_lr_kind_parse(const char *name, ft_lr_kind *kind, ft_err *err)
{
    for (size_t i = 0; name && i < sizeof LR_KINDS / sizeof LR_KINDS[0]; i++) {
        if (strcmp(name, LR_KINDS[i].name) == 0) {
            *kind = LR_KINDS[i].kind;
            return 0;
        }
    }
    return ft_fail(err, "unknown lr schedule '%.64s' (known: constant, constant_with_warmup, "
                   "linear, cosine)", name ? name : "(null)");
}

static int max1(int x) { return x > 1 ? x : 1; }

/* The multiplier lambda(step). Past total_steps the formulas are evaluated as they stand,
 * like the reference: linear stays at 0, cosine rises again. */
static double lr_lambda(const ft_lr_schedule *s, int step)
{
    const int w = s->warmup_steps, total = s->total_steps;
    if (step < w)
        return (double)step / (double)max1(w);
    switch (s->kind) {
    case FT_LR_CONSTANT:
        return 1.0;
    case FT_LR_LINEAR:
        return fmax(0.0, (double)(total - step) / (double)max1(total - w));
    case FT_LR_COSINE: {
        /* num_cycles = 0.5: math.pi * 0.5 * 2.0 * progress == M_PI * progress exactly. */
        double progress = (double)(step - w) / (double)max1(total - w);
        return fmax(0.0, 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress)));
    }
    }
    return 1.0;
}

double ft_lr_at(const ft_lr_schedule *s, int step)
{
    return s->base_lr * lr_lambda(s, step);
}

/* torch: clip_coef = max_norm / (total_norm + 1e-6); clamp(clip_coef, max=1.0), on a float32
 * total_norm tensor. The sum is float32 and `scalar / tensor` is reciprocal() * scalar, so the
 * steps are written out in float. A NaN norm gives NaN, as in torch, so the caller's
 * non-finite check still sees it. */
float ft_clip_coef(double global_norm, double max_norm)
{
    if (max_norm <= 0)
        return 1.0f;
    float denom = (float)global_norm + 1e-6f;
    float coef = (1.0f / denom) * (float)max_norm;
    return coef > 1.0f ? 1.0f : coef;
}
