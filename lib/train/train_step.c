/* One optimizer step (train_step.h). */
#include "train/train_step.h"

#include <math.h>

int ft_train_step(ft_model *m, ft_optimizer *o, const ft_lr_schedule *sched,
                  const ft_batch *micro, int n_micro, double max_grad_norm, ft_step_stats *st,
                  ft_err *err)
{
    return ft_train_step_objective(m, o, sched, NULL, micro, n_micro, max_grad_norm, st, err);
}

int ft_train_step_objective(ft_model *m, ft_optimizer *o, const ft_lr_schedule *sched,
                            const ft_objective *obj, const ft_batch *micro, int n_micro,
                            double max_grad_norm, ft_step_stats *st, ft_err *err)
{
    long total = 0;
    for (int i = 0; i < n_micro; i++)
        total += obj ? (long)obj->count(obj->ctx, &micro[i]) : ft_batch_counted_tokens(&micro[i]);
    if (total == 0)
        return ft_fail(err, "the batch has no token with a label (all labels are -100)");
    ft_model_zero_grad(m);
    double loss = 0;
    for (int i = 0; i < n_micro; i++) {
        double sum;
        if (obj ? obj->run(obj->ctx, m, &micro[i], (double)total, &sum, err)
                : ft_model_forward(m, &micro[i], &sum, NULL, err) ||
                      ft_model_backward(m, (float)(1.0 / (double)total), err))
            return ft_fail_prefix(err, "micro-batch %d", i);
        /* a MoE router's load-balancing term counts whole for each micro-batch (model.h) */
        loss += sum + ft_model_aux_loss(m) * (double)total;
    }
    size_t n;
    float *grads = ft_model_grads(m, &n);
    float *params = ft_model_trainable(m, &n);
    double norm = sqrt(ft_sumsq(ft_view(grads, n, FT_F32, ft_model_device(m)), n));
    float coef = ft_clip_coef(norm, max_grad_norm);
    float lr = (float)ft_lr_at(sched, o->step);
    st->nonfinite = !isfinite(loss) || !isfinite(norm);
    if (!st->nonfinite) {
        ft_model_tied_lora_before_step(m, params);
        ft_optimizer_step(o, params, grads, lr, coef);
        ft_model_tied_lora_after_step(m, params, lr, o->hp.weight_decay);
        ft_model_sync_compute(m); /* the bf16 copy the next forward reads */
    }
    st->loss = loss / (double)total;
    st->tokens = total;
    st->grad_norm = norm;
    st->clip_coef = coef;
    st->lr = lr;
    return 0;
}
