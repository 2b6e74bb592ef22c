/* AdamW over one flat range of fp32 parameters (the model's trainable buffer, or a
 * ZeRO shard of it), with torch.optim.AdamW semantics (see kernels/ops.h). */
#ifndef FT_OPTIM_H
#define FT_OPTIM_H

#include <stddef.h>

#include "device/alloc.h"
#include "core/ft_error.h"
#include "ops.h"

typedef struct ft_optimizer {
    size_t n;
    float *m, *v; /* first and second moments, fp32 */
    int step;     /* updates done so far */
    ft_adamw_hparams hp;
    ft_mem *mem;
    ft_device device; /* where m, v and the parameters it updates live */
} ft_optimizer;

/* Allocates zeroed moments for n parameters in mem's optimizer category. */
int ft_optimizer_init(ft_optimizer *o, ft_mem *mem, size_t n, ft_adamw_hparams hp,
                      ft_err *err);
/* The same with the moments on a device (the GPU model's optimizer). */
int ft_optimizer_init_on(ft_optimizer *o, ft_mem *mem, ft_device device, size_t n,
                         ft_adamw_hparams hp, ft_err *err);
void ft_optimizer_free(ft_optimizer *o);

/* One update with learning rate lr; the gradients are multiplied by grad_scale first
 * (gradient clipping). */
void ft_optimizer_step(ft_optimizer *o, float *params, const float *grads, float lr,
                       float grad_scale);

#endif
