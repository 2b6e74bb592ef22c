#include "train/optim.h"

#include <string.h>

int ft_optimizer_init(ft_optimizer *o, ft_mem *mem, size_t n, ft_adamw_hparams hp,
                      ft_err *err)
{
    return ft_optimizer_init_on(o, mem, FT_DEV_CPU, n, hp, err);
}

int ft_optimizer_init_on(ft_optimizer *o, ft_mem *mem, ft_device device, size_t n,
                         ft_adamw_hparams hp, ft_err *err)
{
    memset(o, 0, sizeof *o);
    o->n = n;
    o->hp = hp;
    o->mem = mem;
    o->device = device;
    if (n == 0)
        return ft_fail(err, "the optimizer has no trainable parameters");
    o->m = ft_alloc_on(mem, device, FT_MEM_OPTIM, n * sizeof(float));
    o->v = ft_alloc_on(mem, device, FT_MEM_OPTIM, n * sizeof(float));
    if (!o->m || !o->v) {
        ft_optimizer_free(o);
        return ft_mem_fail(err, mem, device, "AdamW state for %zu parameters", n);
    }
    return 0;
}

void ft_optimizer_free(ft_optimizer *o)
{
    ft_free_on(o->mem, o->device, o->m);
    ft_free_on(o->mem, o->device, o->v);
    o->m = o->v = NULL;
}

void ft_optimizer_step(ft_optimizer *o, float *params, const float *grads, float lr,
                       float grad_scale)
{
    ft_adamw_hparams hp = o->hp;
    hp.lr = lr;
    o->step++;
    ft_adamw_step(ft_view(params, o->n, FT_F32, o->device),
                  ft_view((float *)grads, o->n, FT_F32, o->device),
                  ft_view(o->m, o->n, FT_F32, o->device), ft_view(o->v, o->n, FT_F32, o->device),
                  o->n, hp, o->step, grad_scale);
}
