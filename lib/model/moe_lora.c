/* LoRA on a MoE layer's router, as PEFT's ParamWrapper puts it on the router's weight
 * (target_parameters "gate.weight"; transformers 5's MixtralTopKRouter.weight R [E, C]):
 *
 *   logits = x (R + s B A)^T = x R^T + s (x A^T) B^T,   A [r, C], B [E, r], s = alpha / r
 *
 * with no dropout (PEFT refuses it on a parameter). h = x A^T [N, r] is kept for the
 * backward:  dB += s dlogits^T h;  dh = s dlogits B;  dA += dh^T x;  dx += dh A.
 * (LoRA on the experts' fused parameters, gate_up_proj / down_proj, is refused in
 * lora.c.) */
#include "model/model_internal.h"

#define A_(p, n) model_view(m, (p), (size_t)(n), m->cdt)
#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)

void moe_router_lora_forward(ft_model *m, int l, const float *x, float *rlogits)
{
    const layer_weights *w = &m->layers[l];
    const layer_acts *a = &m->acts[l];
    if (!w->rlora_a || m->adapter_off)
        return;
    int N = m->B * m->T, C = m->cfg.hidden_size, E = m->cfg.num_experts, r = m->opt.lora.r;
    size_t nh = (size_t)N * r;
    ft_linear_forward(A_(a->rlora_h, nh), A_(x, (size_t)N * C), A_(w->rlora_a, (size_t)r * C),
                      ft_none(), N, C, r, 1.0f, 0);
    ft_linear_forward(A_(rlogits, (size_t)N * E), A_(a->rlora_h, nh),
                      A_(w->rlora_b, (size_t)E * r), ft_none(), N, r, E, m->lora_scaling, 1);
}

void moe_router_lora_backward(ft_model *m, int l, const float *x, const float *d_rlogits,
                              float *dx)
{
    const layer_weights *w = &m->layers[l];
    const layer_acts *a = &m->acts[l];
    if (!w->rlora_a)
        return;
    int N = m->B * m->T, C = m->cfg.hidden_size, E = m->cfg.num_experts, r = m->opt.lora.r;
    size_t nh = (size_t)N * r, nx = (size_t)N * C, nd = (size_t)N * E;
    float s = m->lora_scaling;
    ft_linear_backward(ft_none(), F_(w->g_rlora_b, (size_t)E * r), ft_none(), A_(d_rlogits, nd),
                       A_(a->rlora_h, nh), A_(w->rlora_b, (size_t)E * r), N, r, E, s);
    ft_zero(A_(m->d_lora_h, nh), nh);
    ft_linear_backward(A_(m->d_lora_h, nh), ft_none(), ft_none(), A_(d_rlogits, nd),
                       A_(a->rlora_h, nh), A_(w->rlora_b, (size_t)E * r), N, r, E, s);
    ft_linear_backward(A_(dx, nx), F_(w->g_rlora_a, (size_t)r * C), ft_none(),
                       A_(m->d_lora_h, nh), A_(x, nx), A_(w->rlora_a, (size_t)r * C), N, C, r,
                       1.0f);
}
