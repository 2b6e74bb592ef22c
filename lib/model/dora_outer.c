/* DoRA on the token embedding and on lm_head, as PEFT computes them (peft/tuners/lora/
 * dora.py's DoraEmbeddingLayer and variants.py's DoraEmbeddingVariant; lm_head is a
 * linear layer: dora.c's DoRA, on each chunk of the logits' rows).
 *
 * Embedding E [V, C], A [r, V], B [C, r], magnitude m [C] (PEFT's embedding DoRA is
 * fan_in_fan_out: it normalises E's columns):
 *
 *     g = m / ||E^T + s B A||_row      ([C]; the norm detached, a constant in the gradient)
 *     h0 = g (E[ids] + s A^T[ids] B^T)  (each column scaled; PEFT applies a scaled
 *                                       embedding's factor to both terms: ours follows)
 *
 * backward, dh = d h0: dm += (1 / ||.||) sum_n dh (E[ids] + s A^T[ids] B^T); the pair's
 * gradients are LoRA's with dh := g dh (E is frozen: DoRA beside modules_to_save there
 * is refused).
 *
 * Head W [V, C] (tied: E), A [r, C], B [V, r], m [V], xd = dropout(x) with the head's mask,
 * h = xd A^T; before granite's logits scaling (alpha) and gemma2's cap:
 *
 *     y = x W^T + (g - 1) (xd W^T) + g s h B^T        g = m / ||W + s B A||_row
 *       = g (x W^T + s h B^T)                           without dropout (xd = x)
 *
 * computed in the logits buffer without a second [rows, V] one as
 * g (xd W^T + s h B^T) + x W^T - xd W^T. Backward, dy = alpha dlogits,
 * t = xd W^T + s h B^T, d = g dy:
 *
 *     dm += (1 / ||.||) sum_n dy t,   dB += s d^T h,   dh = s d B (d_lora_h: the caller
 *     adds dA = dh^T xd and dropout'(dh A), head_lora_backward)
 *     dx += d W                                    without dropout
 *     dx += dy W + dropout'(((g - 1) dy) W)        with it
 *
 * The factors g and 1 / ||.|| are recomputed from the same weights by the same ops in the
 * backward, as dora.c does. */
#include "model/model_internal.h"

#define A_(p, n) model_view(m, (p), (size_t)(n), m->cdt)
#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)
#define I_(p, n) model_view(m, (p), (size_t)(n), FT_I32)

void ft_dora_scratch_outer(const ft_model_config *c, unsigned outer, size_t N, size_t R,
                           size_t *out, size_t *w, size_t *t)
{
    size_t V = (size_t)c->vocab_size, C = (size_t)c->hidden_size;
    *out = *w = *t = 0;
    if (outer & FT_LORA_EMBED) { /* g [C]; E^T + s B A [C, V]; t, d [N, C] */
        *out = C;
        *w = V * C;
        *t = N * C;
    }
    if (outer & FT_LORA_HEAD) { /* g [V]; W + s B A [V, C]; t, d [R, V] (and [R, C]) */
        *out = V > *out ? V : *out;
        *w = V * C;
        size_t th = R * (V > C ? V : C);
        *t = th > *t ? th : *t;
    }
}

/* dora_g = m / ||E^T + s B A||_row, dora_inv = 1 / ||.|| ([C]). E^T comes from the
 * transposing copy of PEFT's expert layout (ft_moe_lora_b_split with r = 1). */
static void embed_factors(ft_model *m)
{
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size, r = m->lora_rk.embed.r;
    size_t nw = (size_t)V * C;
    ft_moe_lora_b_split(A_(m->dora_w, nw), A_(m->embed, nw), V, 1, C);
    /* dx[C, V] += s dy[C, r] @ w[r, V]  ==  E^T + s B A */
    ft_linear_backward(A_(m->dora_w, nw), ft_none(), ft_none(), A_(m->elora_b, (size_t)C * r),
                       ft_none(), A_(m->elora_a, (size_t)r * V), C, V, r, m->lora_rk.embed.s);
    ft_dora_norm(F_(m->dora_g, C), F_(m->dora_inv, C), A_(m->elora_m, C), A_(m->dora_w, nw), C,
                 V);
}

void dora_embed_forward(ft_model *m, int N)
{
    int C = m->cfg.hidden_size;
    size_t nC = (size_t)N * C;
    embed_factors(m);
    ft_col_scale(A_(m->acts[0].in, nC), A_(m->acts[0].in, nC), F_(m->dora_g, C), 1.0f, 0.0f, N,
                 C, 0);
}

void dora_embed_backward(ft_model *m, int N)
{
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size, r = m->lora_rk.embed.r;
    size_t nh = (size_t)N * r, nC = (size_t)N * C, nb = (size_t)C * r;
    float s = m->lora_rk.embed.s;
    embed_factors(m);
    ft_tensor t = A_(m->dora_t, nC), d = A_(m->dora_d, nC), h = A_(m->lora_xh, nh);
    /* t = E[ids] + s A^T[ids] B^T: what g multiplies */
    ft_embedding_forward(t, I_(m->ids, N), A_(m->embed, (size_t)V * C), N, V, C);
    ft_embedding_t_forward(h, I_(m->ids, N), A_(m->elora_a, (size_t)r * V), N, V, r);
    ft_linear_forward(t, h, A_(m->elora_b, nb), ft_none(), N, r, C, s, 1);
    if (m->g_elora_m)
        ft_col_dot(F_(m->g_elora_m, C), A_(m->d_h, nC), t, F_(m->dora_inv, C), N, C);
    /* the pair with dh := g dh: dB += s d^T H, dH = s d B, dA[:, ids[n]] += dH[n] */
    ft_col_scale(d, A_(m->d_h, nC), F_(m->dora_g, C), 1.0f, 0.0f, N, C, 0);
    if (m->g_elora_b)
        ft_linear_backward(ft_none(), F_(m->g_elora_b, nb), ft_none(), d, h,
                           A_(m->elora_b, nb), N, r, C, s);
    if (!m->g_elora_a)
        return;
    ft_zero(A_(m->d_lora_h, nh), nh);
    ft_linear_backward(A_(m->d_lora_h, nh), ft_none(), ft_none(), d, h, A_(m->elora_b, nb), N, r,
                       C, s);
    ft_embedding_t_backward(F_(m->g_elora_a, (size_t)r * V), A_(m->d_lora_h, nh), I_(m->ids, N),
                            N, V, r, m->cfg.embed_padding_idx);
}

/* dora_g = m / ||W + s B A||_row, dora_inv = 1 / ||.|| ([V]). */
static void head_factors(ft_model *m)
{
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size, r = m->lora_rk.head.r;
    size_t nw = (size_t)V * C;
    ft_copy(A_(m->dora_w, nw), A_(m->lm_head, nw), nw);
    ft_linear_backward(A_(m->dora_w, nw), ft_none(), ft_none(), A_(m->hlora_b, (size_t)V * r),
                       ft_none(), A_(m->hlora_a, (size_t)r * C), V, C, r, m->lora_rk.head.s);
    ft_dora_norm(F_(m->dora_g, V), F_(m->dora_inv, V), A_(m->hlora_m, V), A_(m->dora_w, nw), V,
                 C);
}

/* logits[0, rows) = alpha y of lnf rows [r0, r0 + rows): the head's factors first (the
 * chunk at r0 = 0 computes them; they hold for the pass's other chunks). */
void dora_head_logits(ft_model *m, size_t r0, size_t rows, float alpha)
{
    size_t C = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    size_t r = (size_t)m->lora_rk.head.r, nl = rows * V;
    const float *xd = m->opt.lora.dropout > 0 && !m->eval_mode ? m->x_drop : m->lnf;
    if (r0 == 0)
        head_factors(m);
    ft_tensor lg = A_(m->logits, nl), w = A_(m->lm_head, V * C);
    ft_tensor x = ft_slice(A_(m->lnf, (r0 + rows) * C), r0 * C, rows * C);
    ft_tensor xds = ft_slice(A_(xd, (r0 + rows) * C), r0 * C, rows * C);
    ft_tensor h = ft_slice(A_(m->lora_xh, (r0 + rows) * r), r0 * r, rows * r);
    ft_linear_forward(lg, xds, w, ft_none(), (int)rows, (int)C, (int)V, alpha, 0);
    ft_linear_forward(lg, h, A_(m->hlora_b, V * r), ft_none(), (int)rows, (int)r, (int)V,
                      alpha * m->lora_rk.head.s, 1);
    ft_col_scale(lg, lg, F_(m->dora_g, V), 1.0f, 0.0f, (int)rows, (int)V, 0);
    if (xd == m->lnf)
        return;
    ft_linear_forward(lg, x, w, ft_none(), (int)rows, (int)C, (int)V, alpha, 1);
    ft_linear_forward(lg, xds, w, ft_none(), (int)rows, (int)C, (int)V, -alpha, 1);
}

/* The chunk's backward from dlogits (in the logits buffer): dm, dB, the chunk's rows of
 * d_lora_h and of d_ln (see the top). xd: the head's dropout(lnf) (lnf without), made
 * with the mask of seed. */
void dora_head_backward(ft_model *m, size_t r0, size_t rows, float alpha, const float *xd,
                        uint64_t seed)
{
    size_t C = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    size_t r = (size_t)m->lora_rk.head.r, N = (size_t)m->B * m->T, nl = rows * V;
    float s = m->lora_rk.head.s;
    if (r0 == 0)
        head_factors(m);
    ft_tensor dl = A_(m->logits, nl), w = A_(m->lm_head, V * C), g = F_(m->dora_g, V);
    ft_tensor t = A_(m->dora_t, nl), d = A_(m->dora_d, nl);
    ft_tensor x = ft_slice(A_(m->lnf, (r0 + rows) * C), r0 * C, rows * C);
    ft_tensor xds = ft_slice(A_(xd, (r0 + rows) * C), r0 * C, rows * C);
    ft_tensor h = ft_slice(A_(m->lora_xh, (r0 + rows) * r), r0 * r, rows * r);
    ft_tensor dln = ft_slice(A_(m->d_ln, N * C), r0 * C, rows * C);
    /* t = alpha (xd W^T + s h B^T) */
    ft_linear_forward(t, xds, w, ft_none(), (int)rows, (int)C, (int)V, alpha, 0);
    ft_linear_forward(t, h, A_(m->hlora_b, V * r), ft_none(), (int)rows, (int)r, (int)V,
                      alpha * s, 1);
    if (m->g_hlora_m)
        ft_col_dot(F_(m->g_hlora_m, V), dl, t, F_(m->dora_inv, V), (int)rows, (int)V);
    /* d = alpha g dlogits: dB += s d^T h; d_lora_h += s d B */
    ft_col_scale(d, dl, g, alpha, 0.0f, (int)rows, (int)V, 0);
    ft_linear_backward(ft_slice(A_(m->d_lora_h, N * r), r0 * r, rows * r),
                       m->g_hlora_b ? F_(m->g_hlora_b, V * r) : ft_none(), ft_none(), d, h,
                       A_(m->hlora_b, V * r), (int)rows, (int)r, (int)V, s);
    if (xd == m->lnf) { /* dx += d W */
        ft_linear_backward(dln, ft_none(), ft_none(), d, x, w, (int)rows, (int)C, (int)V, 1.0f);
        return;
    }
    /* dx += alpha dlogits W + dropout'((alpha (g - 1) dlogits) W), the chunk's mask rows */
    ft_linear_backward(dln, ft_none(), ft_none(), dl, x, w, (int)rows, (int)C, (int)V, alpha);
    ft_col_scale(d, dl, g, alpha, -alpha, (int)rows, (int)V, 0);
    ft_tensor dxd = A_(m->dora_t, rows * C);
    ft_zero(dxd, rows * C);
    ft_linear_backward(dxd, ft_none(), ft_none(), d, xds, w, (int)rows, (int)C, (int)V, 1.0f);
    ft_dropout_backward(dln, dxd, rows * C, m->opt.lora.dropout, seed, r0 * C);
}
