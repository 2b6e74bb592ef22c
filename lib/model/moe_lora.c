/* LoRA on a MoE layer's router, as PEFT's ParamWrapper puts it on the router's weight
 * (target_parameters "gate.weight"; transformers 5's MixtralTopKRouter.weight R [E, C]):
 *
 *   logits = x (R + s B A)^T = x R^T + s (x A^T) B^T,   A [r, C], B [E, r], s = alpha / r
 *
 * (r and alpha the layer's router's: lib/model/lora_ranks.h)
 *
 * with no dropout (PEFT refuses it on a parameter). h = x A^T [N, r] is kept for the
 * backward:  dB += s dlogits^T h;  dh = s dlogits B;  dA += dh^T x;  dx += dh A.
 *
 * LoRA on the fused experts (gate_up_proj [E, 2I, C], down_proj [E, C, I]) likewise adds
 * to expert e's weight W_e + s B_e A_e, with PEFT's ParamWrapper layout (lora.h's
 * target_params): A [E R, in] whose rows [e R, (e+1) R) are A_e, B [out, R E] whose
 * column j E + e is B_e's column j (R the pair's rank: 2r for gate_up from PEFT's w1 + w3,
 * whose alpha is 2 alpha too; r for down; or as rank_pattern / alpha_pattern give them,
 * per layer). Per expert, on its contiguous block of grouped rows X_e [n, in]:
 *   Y_e += s (X_e A_e^T) B_e^T,  h_e = X_e A_e^T kept per row ([M, R]);
 *   dB_e += s dY_e^T h_e;  dh = s dY_e B_e;  dA_e += dh^T X_e;  dX_e += dh A_e.
 * B is split expert-major first (ft_moe_lora_b_split) so each B_e is one contiguous
 * [out, R] operand, and dB is gathered back (ft_moe_lora_b_merge_add). For gate_up, out =
 * 2I: B_e's first I rows feed gate, the next I up (the fused [w1; w3]). */
#include "model/model_internal.h"

#define A_(p, n) model_view(m, (p), (size_t)(n), m->cdt)
#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)

/* element i of an fp32 buffer (the gradients) */
static float *f32_rows(float *p, size_t i)
{
    return p + i;
}

void moe_router_lora_forward(ft_model *m, int l, const float *x, float *rlogits)
{
    const layer_weights *w = &m->layers[l];
    const layer_acts *a = &m->acts[l];
    if (!w->rlora_a || m->adapter_off)
        return;
    int N = m->B * m->T, C = m->cfg.hidden_size, E = m->cfg.num_experts;
    int r = m->lora_rk.router[l].r;
    size_t nh = (size_t)N * r;
    ft_linear_forward(A_(a->rlora_h, nh), A_(x, (size_t)N * C), A_(w->rlora_a, (size_t)r * C),
                      ft_none(), N, C, r, 1.0f, 0);
    ft_linear_forward(A_(rlogits, (size_t)N * E), A_(a->rlora_h, nh),
                      A_(w->rlora_b, (size_t)E * r), ft_none(), N, r, E,
                      m->lora_rk.router[l].s, 1);
}

void moe_router_lora_backward(ft_model *m, int l, const float *x, const float *d_rlogits,
                              float *dx)
{
    const layer_weights *w = &m->layers[l];
    const layer_acts *a = &m->acts[l];
    if (!w->rlora_a)
        return;
    int N = m->B * m->T, C = m->cfg.hidden_size, E = m->cfg.num_experts;
    int r = m->lora_rk.router[l].r;
    size_t nh = (size_t)N * r, nx = (size_t)N * C, nd = (size_t)N * E;
    float s = m->lora_rk.router[l].s;
    ft_linear_backward(ft_none(), F_(w->g_rlora_b, (size_t)E * r), ft_none(), A_(d_rlogits, nd),
                       A_(a->rlora_h, nh), A_(w->rlora_b, (size_t)E * r), N, r, E, s);
    ft_zero(A_(m->d_lora_h, nh), nh);
    ft_linear_backward(A_(m->d_lora_h, nh), ft_none(), ft_none(), A_(d_rlogits, nd),
                       A_(a->rlora_h, nh), A_(w->rlora_b, (size_t)E * r), N, r, E, s);
    ft_linear_backward(A_(dx, nx), F_(w->g_rlora_a, (size_t)r * C), ft_none(),
                       A_(m->d_lora_h, nh), A_(x, nx), A_(w->rlora_a, (size_t)r * C), N, C, r,
                       1.0f);
}

void moe_experts_lora_dims(const ft_model *m, size_t *bs, size_t *dh_per_row)
{
    const ft_model_config *c = &m->cfg;
    *bs = *dh_per_row = 0;
    if (m->opt.mode != FT_TRAIN_LORA || c->num_experts == 0)
        return;
    size_t E = (size_t)c->num_experts, C = c->hidden_size, I = c->intermediate_size;
    /* the largest ranks over the layers (rank_pattern may give each its own) */
    size_t Rg = (size_t)ft_lora_ranks_max(&m->lora_rk, FT_LORA_RANK_GATE_UP, 0, c->num_layers);
    size_t Rd = (size_t)ft_lora_ranks_max(&m->lora_rk, FT_LORA_RANK_DOWN, 0, c->num_layers);
    *bs = E * 2 * I * Rg > E * C * Rd ? E * 2 * I * Rg : E * C * Rd;
    *dh_per_row = Rg > Rd ? Rg : Rd;
}

/* One expert pair's shapes: h 0 gate_up (in C, out 2I), 1 down (in I, out C). */
typedef struct xpair {
    int h, in, out, R, E;
    float s;
    float *a, *b, *ga, *gb, *hbuf;
} xpair;

static bool xpair_of(ft_model *m, int l, unsigned bit, xpair *p)
{
    const ft_model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    p->h = bit == FT_LORA_PARAM_GATE_UP ? 0 : 1;
    if (!w->xlora_a[p->h])
        return false;
    p->in = p->h == 0 ? c->hidden_size : c->intermediate_size;
    p->out = p->h == 0 ? 2 * c->intermediate_size : c->hidden_size;
    p->R = m->lora_rk.experts[2 * l + p->h].r;
    p->E = c->num_experts;
    p->s = m->lora_rk.experts[2 * l + p->h].s;
    p->a = w->xlora_a[p->h];
    p->b = w->xlora_b[p->h];
    p->ga = w->g_xlora_a[p->h];
    p->gb = w->g_xlora_b[p->h];
    p->hbuf = m->acts[l].xlora_h[p->h];
    return true;
}

/* rows [r0, r0 + n) of a [*, width] buffer of the compute dtype */
static float *rows_at(const ft_model *m, float *p, size_t r0, size_t width)
{
    return model_at(m, p, r0 * width);
}

void moe_experts_lora_forward(ft_model *m, int l, unsigned bit)
{
    xpair p;
    if (m->adapter_off || !xpair_of(m, l, bit, &p))
        return;
    layer_acts *a = &m->acts[l];
    int I = m->cfg.intermediate_size, R = p.R;
    size_t nb = (size_t)p.out * R * p.E;
    ft_moe_lora_b_split(A_(m->xlora_bs, nb), A_(p.b, nb), p.out, R, p.E);
    for (int e = 0; e < p.E; e++) {
        int r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (n == 0)
            continue;
        const float *x = rows_at(m, p.h == 0 ? a->xe : a->acte, r0, p.in);
        float *hb = rows_at(m, p.hbuf, r0, R);
        const float *ae = model_at(m, p.a, (size_t)e * R * p.in);
        const float *be = model_at(m, m->xlora_bs, (size_t)e * p.out * R);
        ft_linear_forward(A_(hb, (size_t)n * R), A_(x, (size_t)n * p.in),
                          A_(ae, (size_t)R * p.in), ft_none(), n, p.in, R, 1.0f, 0);
        if (p.h == 1) {
            ft_linear_forward(A_(rows_at(m, a->ye, r0, p.out), (size_t)n * p.out),
                              A_(hb, (size_t)n * R), A_(be, (size_t)p.out * R), ft_none(), n,
                              R, p.out, p.s, 1);
            continue;
        }
        for (int g = 0; g < 2; g++) /* B_e's rows [g I, (g+1) I): gate, then up */
            ft_linear_forward(A_(rows_at(m, g == 0 ? a->ge : a->ue, r0, I), (size_t)n * I),
                              A_(hb, (size_t)n * R),
                              A_(model_at(m, (float *)be, (size_t)g * I * R), (size_t)I * R),
                              ft_none(), n, R, I, p.s, 1);
    }
}

void moe_experts_lora_backward(ft_model *m, int l, unsigned bit)
{
    xpair p;
    if (!xpair_of(m, l, bit, &p))
        return;
    const layer_acts *a = &m->acts[l];
    int I = m->cfg.intermediate_size, R = p.R;
    size_t nb = (size_t)p.out * R * p.E;
    ft_moe_lora_b_split(A_(m->xlora_bs, nb), A_(p.b, nb), p.out, R, p.E);
    ft_zero(F_(m->xlora_gbs, nb), nb);
    for (int e = 0; e < p.E; e++) {
        int r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (n == 0)
            continue;
        size_t nh = (size_t)n * R, nx = (size_t)n * p.in;
        const float *x = rows_at(m, p.h == 0 ? a->xe : a->acte, r0, p.in);
        float *dx = rows_at(m, p.h == 0 ? m->d_moe : m->d_act, r0, p.in);
        const float *hb = rows_at(m, p.hbuf, r0, R);
        const float *ae = model_at(m, p.a, (size_t)e * R * p.in);
        float *gae = f32_rows(p.ga, (size_t)e * R * p.in);
        const float *be = model_at(m, m->xlora_bs, (size_t)e * p.out * R);
        float *gbe = f32_rows(m->xlora_gbs, (size_t)e * p.out * R);
        ft_zero(A_(m->xlora_dh, nh), nh);
        /* the output blocks: down's d ye; gate_up's d ge and d ue (B_e's two row blocks) */
        int blocks = p.h == 0 ? 2 : 1, bo = p.h == 0 ? I : p.out;
        for (int g = 0; g < blocks; g++) {
            const float *dy = p.h == 1 ? rows_at(m, m->d_moe, r0, p.out)
                                       : rows_at(m, g == 0 ? m->d_gate : m->d_up, r0, I);
            size_t ny = (size_t)n * bo, nbe = (size_t)bo * R;
            const float *bg = model_at(m, (float *)be, (size_t)g * bo * R);
            ft_linear_backward(ft_none(), F_(f32_rows(gbe, (size_t)g * bo * R), nbe), ft_none(),
                               A_(dy, ny), A_(hb, nh), A_(bg, nbe), n, R, bo, p.s);
            ft_linear_backward(A_(m->xlora_dh, nh), ft_none(), ft_none(), A_(dy, ny),
                               A_(hb, nh), A_(bg, nbe), n, R, bo, p.s);
        }
        ft_linear_backward(A_(dx, nx), F_(gae, (size_t)R * p.in), ft_none(),
                           A_(m->xlora_dh, nh), A_(x, nx), A_(ae, (size_t)R * p.in), n, p.in, R,
                           1.0f);
    }
    ft_moe_lora_b_merge_add(F_(p.gb, nb), F_(m->xlora_gbs, nb), p.out, R, p.E);
}
