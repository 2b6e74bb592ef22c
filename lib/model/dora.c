/* DoRA, PEFT's weight-decomposed LoRA (peft/tuners/lora/dora.py, variants.py), on one
 * projection (or one row block of a fused one):
 *
 *     g = m / ||W + s B A||_row        (the norm detached: a constant in the gradient)
 *     y = x W^T + b + (g - 1) (xd W^T) + g s (xd A^T B^T)
 *
 * with xd = dropout(x) (x itself in evaluation or without dropout, where PEFT reuses the
 * base result: the same value). So without dropout y = b + g (x W^T + s x A^T B^T), the
 * rows of (W + s B A) rescaled to the magnitude m. The backward, with t = xd W^T and
 * u = h B^T (h = xd A^T, kept from the forward):
 *
 *     dm  += (1 / ||.||) sum_n dy (t + s u)            (dg/dm = 1 / ||.||)
 *     dxd += ((g - 1) dy) W + (s (g dy) B) A,   dB += s (g dy)^T h,   dA += dh^T xd
 *     dx  += dy W + dropout'(dxd)
 *
 * The factors g and 1 / ||.|| are recomputed in the backward from the same weights (the
 * same ops: the same values), as t and u are, so nothing of DoRA is kept between them. */
#include "model/model_internal.h"

#define A_(p, n) model_view(m, (p), (size_t)(n), m->cdt)
#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)

void ft_dora_scratch_dims(const ft_model_config *c, unsigned lora_union, size_t *max_out,
                          size_t *max_w)
{
    *max_out = *max_w = 0;
    for (int l = 0; l < c->num_layers; l++) /* (a MoE's MLP widths differ by layer) */
        for (int p = 0; p < FT_NPROJ; p++) {
            int row0, in, out;
            if (p == FT_PROJ_QKV || p == FT_PROJ_GATE_UP) /* (their blocks are the views) */
                continue;
            ft_proj mod = ft_proj_module(c, (ft_proj)p, &row0);
            if (!(lora_union & (1u << mod)) || !(ft_layer_lora_projections(c, l) & (1u << mod)))
                continue;
            ft_layer_proj_dims(c, l, (ft_proj)p, &in, &out);
            if ((size_t)out > *max_out)
                *max_out = (size_t)out;
            if ((size_t)out * (size_t)in > *max_w)
                *max_w = (size_t)out * (size_t)in;
        }
}

/* dora_g = m / ||W + s B A||_row, dora_inv = 1 / ||.|| of v's rows. */
static void dora_factors(ft_model *m, const proj_view *v)
{
    int in = v->in, out = v->out, r = v->r;
    size_t nw = (size_t)out * in;
    ft_copy(A_(m->dora_w, nw), A_(v->w, nw), nw);
    /* dx[out, in] += s dy[out, r] @ w[r, in]  ==  W + s B A */
    ft_linear_backward(A_(m->dora_w, nw), ft_none(), ft_none(), A_(v->lora_b, (size_t)out * r),
                       ft_none(), A_(v->lora_a, (size_t)r * in), out, in, r, v->s);
    ft_dora_norm(F_(m->dora_g, out), F_(m->dora_inv, out), A_(v->lora_m, out),
                 A_(m->dora_w, nw), out, in);
}

void dora_forward(ft_model *m, const proj_view *v, const float *x, const float *xd, float *y)
{
    (void)x;
    int N = m->B * m->T, in = v->in, out = v->out, r = v->r;
    size_t nx = (size_t)N * in, ny = (size_t)N * out;
    dora_factors(m, v);
    ft_tensor t = A_(m->dora_t, ny), g = F_(m->dora_g, out);
    ft_linear_forward(t, A_(xd, nx), A_(v->w, (size_t)out * in), ft_none(), N, in, out, 1.0f, 0);
    ft_col_scale(A_(y, ny), t, g, 1.0f, -1.0f, N, out, 1);
    ft_linear_forward(t, A_(v->lora_h, (size_t)N * r), A_(v->lora_b, (size_t)out * r), ft_none(),
                      N, r, out, 1.0f, 0);
    ft_col_scale(A_(y, ny), t, g, v->s, 0.0f, N, out, 1);
}

void dora_backward(ft_model *m, const proj_view *v, const float *x, const float *xd,
                   const float *dy, float *dx, float pd, uint64_t seed)
{
    int N = m->B * m->T, in = v->in, out = v->out, r = v->r;
    float s = v->s;
    size_t nx = (size_t)N * in, ny = (size_t)N * out, nh = (size_t)N * r;
    size_t nw = (size_t)out * in, nb = (size_t)out * r, na = (size_t)r * in;
    dora_factors(m, v);
    ft_tensor t = A_(m->dora_t, ny), d = A_(m->dora_d, ny), g = F_(m->dora_g, out);
    ft_tensor h = A_(v->lora_h, nh), dh = A_(m->d_lora_h, nh);
    /* t = xd W^T + s h B^T: what g multiplies */
    ft_linear_forward(t, A_(xd, nx), A_(v->w, nw), ft_none(), N, in, out, 1.0f, 0);
    ft_linear_forward(t, h, A_(v->lora_b, nb), ft_none(), N, r, out, s, 1);
    if (v->g_lora_m)
        ft_col_dot(F_(v->g_lora_m, out), A_(dy, ny), t, F_(m->dora_inv, out), N, out);
    /* the LoRA path with dy := g dy: dB += s d^T h; dh = s d B; dA += dh^T xd */
    ft_col_scale(d, A_(dy, ny), g, 1.0f, 0.0f, N, out, 0);
    ft_linear_backward(ft_none(), F_(v->g_lora_b, nb), ft_none(), d, h, A_(v->lora_b, nb), N, r,
                       out, s);
    ft_zero(dh, nh);
    ft_linear_backward(dh, ft_none(), ft_none(), d, h, A_(v->lora_b, nb), N, r, out, s);
    ft_linear_backward(ft_none(), F_(v->g_lora_a, na), ft_none(), dh, A_(xd, nx),
                       A_(v->lora_a, na), N, in, r, 1.0f);
    if (!dx) /* an input without a gradient */
        return;
    /* dxd = ((g - 1) dy) W + dh A, into dx directly without dropout */
    ft_col_scale(d, A_(dy, ny), g, 1.0f, -1.0f, N, out, 0);
    float *acc = pd > 0 ? m->x_drop : dx; /* x_drop held xd, used for the last time above */
    if (pd > 0)
        ft_zero(A_(acc, nx), nx);
    ft_linear_backward(A_(acc, nx), ft_none(), ft_none(), d, A_(x, nx), A_(v->w, nw), N, in, out,
                       1.0f);
    ft_linear_backward(A_(acc, nx), ft_none(), ft_none(), dh, A_(x, nx), A_(v->lora_a, na), N, in,
                       r, 1.0f);
    if (pd > 0)
        ft_dropout_backward(A_(dx, nx), A_(acc, nx), nx, pd, seed, 0);
}
