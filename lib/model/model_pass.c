/* Forward and backward of ft_model (see model.h for the block math).
 *
 * Buffers are [N, features] row-major with N = B x T token rows. Every step is an op
 * from kernels/ops.h; this file only decides the order and which buffers flow where.
 * Backward follows llm.c's convention: gradient buffers are zeroed, then ops accumulate
 * into them; d_h carries the gradient of the residual stream from the top layer down. */
#include <math.h>
#include <string.h>

#include "model/model_internal.h"
#include "core/rng.h"
#include "formats/safetensors.h"

/* Views on the model's device (model_internal.h has the dtype rules): A_ weights and
 * activations of the compute dtype, F_ fp32 (gradients of parameters, rstd, lse,
 * inv_freq), I_ int32; OPTA_ / OPTF_ are ft_none() for a NULL pointer. */
#define A_(p, n) model_view(m, (p), (size_t)(n), m->cdt)
#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)
#define I_(p, n) model_view(m, (p), (size_t)(n), FT_I32)
#define OPTA_(p, n) ((p) ? A_(p, n) : ft_none())
#define OPTF_(p, n) ((p) ? F_(p, n) : ft_none())

/* The embedding scale as the model applies it: granite's embedding_multiplier in fp32;
 * gemma's sqrt(hidden_size) rounded to the activation dtype first, as transformers'
 * torch.tensor(hidden_size ** 0.5, dtype=hidden_states.dtype) does. */
static float embed_scale(const ft_model *m)
{
    float s = (float)m->cfg.embed_scale;
    if (m->cfg.embed_scale_round && m->cdt == FT_BF16)
        s = ft_bf16_to_f32(ft_f32_to_bf16(s));
    return s;
}

/* y = branch * residual_scale (granite's residual_multiplier; 1: nothing to do). */
static void scale_branch(ft_model *m, float *y, size_t n)
{
    if (m->cfg.residual_scale != 1.0f)
        ft_scale(A_(y, n), m->cfg.residual_scale, n);
}

/* The gradient reaching a branch's output projection: d_h itself, or with a residual
 * scale r, r * d_h in the scratch d_ln (free at both places this is called). */
static const float *branch_grad(ft_model *m, size_t n)
{
    if (m->cfg.residual_scale == 1.0f)
        return m->d_h;
    ft_copy(A_(m->d_ln, n), A_(m->d_h, n), n);
    ft_scale(A_(m->d_ln, n), m->cfg.residual_scale, n);
    return m->d_ln;
}

/* Validates the token ids and fills ids, targets (labels shifted left by one),
 * positions and packed-sequence ids. */
/* The batch's attention_mask (model.h): 0 or 1, right padding only. */
static int check_mask(const ft_batch *b, ft_err *err)
{
    const int32_t *mask = b->attention_mask;
    for (int r = 0; mask && r < b->B; r++) {
        for (int t = 0; t < b->T; t++) {
            int32_t v = mask[(size_t)r * b->T + t];
            if (v != 0 && v != 1)
                return ft_fail(err, "attention_mask[%d][%d] = %d is neither 0 nor 1", r, t, v);
            if (v == 1 && t > 0 && mask[(size_t)r * b->T + t - 1] == 0)
                return ft_fail(err, "attention_mask[%d][%d] = 1 follows a 0: only right "
                                    "padding is supported (attention is causal, with no "
                                    "mask)", r, t);
        }
    }
    return 0;
}

static int prepare_batch(ft_model *m, const ft_batch *b, long *n_tokens, ft_err *err)
{
    if (check_mask(b, err) || moe_aux_mask(m, b, err))
        return -1;
    int V = m->cfg.vocab_size, B = b->B, T = b->T;
    long counted = 0, max_pos = 0;
    int32_t *ids, *targets, *positions, *seg;
    model_batch_arrays(m, &ids, &targets, &positions, &seg);
    m->has_seg = false;
    for (int r = 0; r < B; r++) {
        for (int t = 0; t < T; t++) {
            size_t i = (size_t)r * T + t;
            int32_t id = b->input_ids[i];
            if (id < 0 || id >= V)
                return ft_fail(err, "input_ids[%d][%d] = %d is outside the vocabulary [0, %d)",
                               r, t, id, V);
            int32_t lab = b->labels ? b->labels[i] : id;
            if (lab != -100 && (lab < 0 || lab >= V))
                return ft_fail(err, "labels[%d][%d] = %d is neither -100 nor in [0, %d)", r, t,
                               lab, V);
            int32_t pos = b->position_ids ? b->position_ids[i] : t;
            if (pos < 0)
                return ft_fail(err, "position_ids[%d][%d] = %d is negative", r, t, pos);
            ids[i] = id;
            positions[i] = pos;
            max_pos = pos > max_pos ? pos : max_pos;
            seg[i] = t == 0 ? 0 : seg[i - 1] + (pos == 0);
            if (seg[i])
                m->has_seg = true;
            if (t > 0) {
                targets[i - 1] = lab;
                counted += lab != -100;
            }
        }
        targets[(size_t)r * T + T - 1] = -100;
    }
    if (n_tokens)
        *n_tokens = counted;
    m->rope_long = ft_rope_uses_long(&m->cfg, max_pos);
    return model_upload_batch(m, err);
}

/* Projection p of layer l as the ops see it. A fused checkpoint weight (phi3's qkv_proj,
 * gate_up_proj: ft_proj_module) holds q, k, v (gate, up) as row blocks, so each
 * projection is its block of rows: of W, of the bias, of LoRA's B (and of their
 * gradients); the LoRA pair's A, its h = dropout(x) A^T and its dropout mask belong to
 * the module and are shared by its blocks. Since y_block = x W_block^T + s h B_block^T,
 * the per-block forward and backward below are exactly the fused module's, with A's
 * gradient and dx accumulated over the blocks. */
static float *f32_at(float *p, size_t i)
{
    return p ? p + i : NULL;
}

static proj_view proj_view_of(ft_model *m, int l, ft_proj p)
{
    const layer_weights *w = &m->layers[l];
    proj_view v;
    int row0;
    v.mod = ft_proj_module(&m->cfg, p, &row0);
    ft_lora_pair pair = ft_lora_proj_pair(&m->lora_rk, l, v.mod);
    int r = pair.r;
    v.r = r;
    v.s = pair.s;
    v.first_block = row0 == 0;
    ft_layer_proj_dims(&m->cfg, l, p, &v.in, &v.out);
    size_t wo = (size_t)row0 * v.in, bo = (size_t)row0, lo = (size_t)row0 * r;
    v.w = model_at(m, w->w[v.mod], wo);
    v.gw = f32_at(w->gw[v.mod], wo);
    v.b = model_at(m, w->b[v.mod], bo);
    v.gb = f32_at(w->gb[v.mod], bo);
    v.lora_a = w->lora_a[v.mod];
    v.g_lora_a = w->g_lora_a[v.mod];
    v.lora_b = model_at(m, w->lora_b[v.mod], lo);
    v.g_lora_b = f32_at(w->g_lora_b[v.mod], lo);
    v.lora_m = model_at(m, w->lora_m[v.mod], bo);
    v.g_lora_m = f32_at(w->g_lora_m[v.mod], bo);
    v.lora_h = m->acts[l].lora_h[v.mod];
    return v;
}

/* dropout(x) for LoRA pair p (a module) of layer l: the mask is a pure function of the
 * forward's seed, the layer and the module, so backward regenerates it. The seven
 * Llama-family modules keep the numbering l * 7 + p + 1 of the versions before the fused
 * ones (a resumed run draws the masks it would have drawn); qkv_proj and gate_up_proj
 * number from 2^40, qwen2_moe's shared_expert_gate from 2^42. */
static uint64_t lora_dropout_seed(const ft_model *m, int l, ft_proj p)
{
    uint64_t k = p < FT_PROJ_QKV      ? (uint64_t)l * FT_PROJ_QKV + (uint64_t)p + 1
                 : p == FT_PROJ_SHGATE ? (1ull << 42) + (uint64_t)l
                                       : (1ull << 40) + (uint64_t)l * 2 + (uint64_t)(p - FT_PROJ_QKV);
    return ft_mix64(m->dropout_seed ^ k);
}

static const float *lora_input(ft_model *m, int l, ft_proj p, const float *x, size_t n)
{
    float pd = m->opt.lora.dropout;
    if (pd <= 0 || m->eval_mode)
        return x;
    ft_dropout_forward(A_(m->x_drop, n), A_(x, n), n, pd, lora_dropout_seed(m, l, p), 0);
    return m->x_drop;
}

/* h = dropout(x) A^T of the LoRA pair of v's module: the part of the LoRA path backward
 * needs. */
static void lora_h_forward(ft_model *m, int l, const proj_view *v, const float *x)
{
    int N = m->B * m->T, in = v->in, r = v->r;
    const float *xd = lora_input(m, l, v->mod, x, (size_t)N * in);
    ft_linear_forward(A_(v->lora_h, (size_t)N * r), A_(xd, (size_t)N * in),
                      A_(v->lora_a, (size_t)r * in), ft_none(), N, in, r, 1.0f, 0);
}

/* y = x W^T + b, plus the LoRA path scaling * (dropout(x) A^T) B^T. */
static void proj_forward(ft_model *m, int l, ft_proj p, const float *x, float *y)
{
    const proj_view v = proj_view_of(m, l, p);
    int N = m->B * m->T, in = v.in, out = v.out, r = v.r;
    size_t nx = (size_t)N * in, ny = (size_t)N * out;
    bool lora = v.lora_a && !m->adapter_off;
    if (lora && !v.lora_m) {
        /* a fused module's later blocks reuse the h of its first */
        const float *xd = v.first_block ? lora_input(m, l, v.mod, x, nx) : x;
        ft_lora_linear_forward(A_(y, ny), A_(v.lora_h, (size_t)N * r), A_(x, nx), A_(xd, nx),
                               A_(v.w, (size_t)out * in), OPTA_(v.b, out),
                               A_(v.lora_a, (size_t)r * in), A_(v.lora_b, (size_t)out * r), N,
                               in, out, r, v.s, v.first_block);
        return;
    }
    ft_linear_forward(A_(y, ny), A_(x, nx), A_(v.w, (size_t)out * in), OPTA_(v.b, out), N, in,
                      out, 1.0f, 0);
    if (!lora)
        return;
    if (v.first_block) /* a fused module's later blocks reuse its h */
        lora_h_forward(m, l, &v, x);
    dora_forward(m, &v, x, lora_input(m, l, v.mod, x, nx), y);
}

/* dx += dy W (+ the LoRA path), unless dx is NULL (an input without a gradient); dW, db,
 * dA, dB accumulate where trainable. */
static void proj_backward(ft_model *m, int l, ft_proj p, const float *x, const float *dy,
                          float *dx)
{
    const proj_view v = proj_view_of(m, l, p);
    int N = m->B * m->T, in = v.in, out = v.out;
    size_t nx = (size_t)N * in, ny = (size_t)N * out;
    if (!v.lora_a || v.lora_m) {
        ft_linear_backward(dx ? A_(dx, nx) : ft_none(), OPTF_(v.gw, (size_t)out * in),
                           OPTF_(v.gb, out), A_(dy, ny), A_(x, nx), A_(v.w, (size_t)out * in),
                           N, in, out, 1.0f);
        if (v.lora_m) {
            float pd = m->eval_mode ? 0.0f : m->opt.lora.dropout;
            dora_backward(m, &v, x, lora_input(m, l, v.mod, x, nx), dy, dx, pd,
                          lora_dropout_seed(m, l, v.mod));
        }
        return;
    }
    if (v.gw || v.gb) /* a trainable base bias (lora bias "all"), or weight */
        ft_linear_backward(ft_none(), OPTF_(v.gw, (size_t)out * in), OPTF_(v.gb, out),
                           A_(dy, ny), A_(x, nx), ft_none(), N, in, out, 1.0f);
    int r = v.r;
    size_t nh = (size_t)N * r;
    /* y_lora = s * h B^T with h = xd A^T: dB += s dy^T h; dh = s dy B; dA += dh^T xd;
     * dxd = dh A, and dx += dropout'(dxd). Without dropout dxd adds straight onto dx. */
    float pd = m->eval_mode ? 0.0f : m->opt.lora.dropout;
    const float *xd = lora_input(m, l, v.mod, x, nx);
    ft_tensor dxt = dx ? A_(dx, nx) : ft_none();
    ft_lora_linear_backward(dxt, pd <= 0 ? dxt : ft_none(),
                            F_(v.g_lora_a, (size_t)r * in), F_(v.g_lora_b, (size_t)out * r),
                            A_(m->d_lora_h, nh), A_(dy, ny), A_(xd, nx), A_(v.lora_h, nh),
                            A_(v.w, (size_t)out * in), A_(v.lora_a, (size_t)r * in),
                            A_(v.lora_b, (size_t)out * r), N, in, out, r, v.s);
    if (pd <= 0 || !dx)
        return;
    ft_zero(A_(m->x_drop, nx), nx);
    ft_linear_backward(A_(m->x_drop, nx), ft_none(), ft_none(), A_(m->d_lora_h, nh),
                       A_(x, nx), A_(v.lora_a, (size_t)r * in), N, in, r, 1.0f);
    ft_dropout_backward(A_(dx, nx), A_(m->x_drop, nx), nx, pd,
                        lora_dropout_seed(m, l, v.mod), 0);
}

/* The RoPE frequencies of layer l in the current forward: [rotary_dim/2], the short or
 * (longrope beyond the original context) the long set; gemma3's local set on a sliding
 * layer. */
static ft_tensor rope_freqs(ft_model *m, int l)
{
    size_t h = (size_t)m->cfg.rotary_dim / 2;
    bool second = m->rope_long || ft_layer_rope_local(&m->cfg, l);
    return F_(m->inv_freq_dev + (second ? h : 0), h);
}

/* q or k (proj Q or K) of layer l: its projection of x into y, or with a q/k norm into
 * the pre-norm buffer raw, then normalized into y (rows of the whole projection, or of
 * each head: see qk_norm_rows). */
static void qk_forward(ft_model *m, int l, ft_proj p, const float *x, float *raw, float *rstd,
                       float *y)
{
    const ft_model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    if (c->qk_norm == FT_QK_NORM_NONE) {
        proj_forward(m, l, p, x, y);
        return;
    }
    int heads = p == FT_PROJ_Q ? c->num_heads : c->num_kv_heads, width;
    size_t rows, N = (size_t)m->B * m->T, n = N * heads * c->head_dim;
    qk_norm_rows(c, heads, N, &rows, &width);
    proj_forward(m, l, p, x, raw);
    ft_rmsnorm_forward(A_(y, n), F_(rstd, rows), A_(raw, n),
                       A_(p == FT_PROJ_Q ? w->q_norm : w->k_norm, width), (int)rows, width,
                       c->rms_norm_eps, c->norm_w_offset);
}

/* dx += the gradient of q or k's norm (dy: the gradient of its output), and the norm
 * weight's gradient where it trains. */
static void qk_norm_backward(ft_model *m, int l, ft_proj p, const float *dy, float *dx)
{
    const ft_model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    const layer_acts *a = &m->acts[l];
    bool q = p == FT_PROJ_Q;
    int heads = q ? c->num_heads : c->num_kv_heads, width;
    size_t rows, N = (size_t)m->B * m->T, n = N * heads * c->head_dim;
    qk_norm_rows(c, heads, N, &rows, &width);
    ft_rmsnorm_backward(A_(dx, n), OPTF_(q ? w->g_q_norm : w->g_k_norm, width), A_(dy, n),
                        A_(q ? a->qr : a->kr, n), A_(q ? w->q_norm : w->k_norm, width),
                        F_(q ? a->rstd_q : a->rstd_k, rows), (int)rows, width,
                        c->norm_w_offset);
}

/* qwen2_moe's shared expert gate: s = sigmoid(x G^T) ([N], G [1, C], with its LoRA pair),
 * and y += s * sh (sh: the shared expert's output, a->sh) as a k = 1 combine with slot[n]
 * = n (y NULL: a recompute, s alone). */
static void shared_gate_forward(ft_model *m, int l, const float *x, float *y)
{
    layer_acts *a = &m->acts[l];
    int N = m->B * m->T, C = m->cfg.hidden_size;
    proj_forward(m, l, FT_PROJ_SHGATE, x, a->sz);
    ft_sigmoid_forward(F_(a->ss, N), A_(a->sz, N), (size_t)N);
    if (y)
        ft_moe_combine_forward(A_(y, (size_t)N * C), A_(a->sh, (size_t)N * C), F_(a->ss, N),
                               I_(m->iota, N), N, 1, C, 1);
}

/* Its backward from dy (the block output's gradient): d_sh = s dy (the shared expert's
 * output gradient, [N, C]); ds = dy . sh, dz = ds s (1 - s) (in the router's scratch,
 * free until moe_backward), dG += dz^T x, d_ln += dz G (and the pair's). */
static void shared_gate_backward(ft_model *m, int l, const float *x, const float *dy,
                                 float *d_sh)
{
    const layer_acts *a = &m->acts[l];
    int N = m->B * m->T, C = m->cfg.hidden_size;
    size_t nC = (size_t)N * C;
    ft_zero(A_(d_sh, nC), nC);
    ft_zero(F_(m->d_rw, N), (size_t)N);
    ft_moe_combine_backward(A_(d_sh, nC), F_(m->d_rw, N), A_(dy, nC), A_(a->sh, nC),
                            F_(a->ss, N), I_(m->iota, N), N, 1, C);
    ft_zero(A_(m->d_rlogits, N), (size_t)N);
    ft_sigmoid_backward(A_(m->d_rlogits, N), F_(m->d_rw, N), F_(a->ss, N), (size_t)N);
    proj_backward(m, l, FT_PROJ_SHGATE, x, m->d_rlogits, m->d_ln);
}

/* One decoder layer: in -> out. out NULL recomputes only what backward needs (a
 * gradient-checkpoint recompute): everything but the down projection's base GEMM, which
 * only a post-norm after the MLP needs (its input).
 *   attention: xa = pre1(in) (or in);  mid = in + r * post1(o(attn(...)(xa)))
 *   MLP:       xm = pre2(mid) (or mid); out = mid + r * post2(down(act(gate(xm)) up(xm)))
 * pre/post are the block's branch norms (identities where it has none). */
static void layer_forward(ft_model *m, int l, const float *in, float *out)
{
    const ft_model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    layer_acts *a = &m->acts[l];
    int B = m->B, T = m->T, N = B * T, C = c->hidden_size, I = ft_layer_mlp_width(c, l);
    int Hq = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim;
    size_t nC = (size_t)N * C, nQ = (size_t)N * Hq * D, nK = (size_t)N * Hkv * D,
           nI = (size_t)N * I;
    ft_tensor pos = I_(m->pos, N), inv = rope_freqs(m, l);
    int rd = c->rotary_dim;
    float rs = c->rope_attention_factor;
    float eps = c->rms_norm_eps, off = c->norm_w_offset;

    const float *xa = in;
    if (w->norm[FT_NORM_ATTN_PRE]) {
        ft_rmsnorm_forward(A_(a->ln1, nC), F_(a->rstd1, N), A_(in, nC),
                           A_(w->norm[FT_NORM_ATTN_PRE], C), N, C, eps, off);
        xa = a->ln1;
    }
    qk_forward(m, l, FT_PROJ_Q, xa, a->qr, a->rstd_q, a->q);
    qk_forward(m, l, FT_PROJ_K, xa, a->kr, a->rstd_k, a->k);
    proj_forward(m, l, FT_PROJ_V, xa, a->v);
    if (ft_layer_uses_rope(c, l)) { /* (smollm3's NoPE layers: q, k unrotated) */
        ft_rope_forward(A_(a->q, nQ), pos, inv, N, Hq, D, rd, rs);
        ft_rope_forward(A_(a->k, nK), pos, inv, N, Hkv, D, rd, rs);
    }
    ft_attention_forward(A_(a->att, nQ), F_(a->lse, (size_t)N * Hq), A_(a->q, nQ),
                         A_(a->k, nK), A_(a->v, nK), m->has_seg ? I_(m->seg, N) : ft_none(),
                         B, T, Hq, Hkv, D, c->attention_scale, ft_layer_window(c, l),
                         c->attn_softcap);
    if (w->norm[FT_NORM_ATTN_POST]) {
        proj_forward(m, l, FT_PROJ_O, a->att, a->ao);
        ft_rmsnorm_forward(A_(a->mid, nC), F_(a->rstd_ao, N), A_(a->ao, nC),
                           A_(w->norm[FT_NORM_ATTN_POST], C), N, C, eps, off);
    } else {
        proj_forward(m, l, FT_PROJ_O, a->att, a->mid);
    }
    scale_branch(m, a->mid, nC);
    const float *xm = a->mid;
    if (w->norm[FT_NORM_MLP_PRE]) {
        /* mid += in (the residual), then ln2 = norm(mid), in one pass */
        ft_add_rmsnorm_forward(A_(a->mid, nC), A_(a->ln2, nC), F_(a->rstd2, N),
                               A_(a->mid, nC), A_(in, nC), A_(w->norm[FT_NORM_MLP_PRE], C), N,
                               C, eps, off);
        xm = a->ln2;
    } else {
        ft_add(A_(a->mid, nC), A_(in, nC), nC);
    }
    const float *post = w->norm[FT_NORM_MLP_POST];
    if (ft_layer_sparse(c, l)) { /* the sparse MoE block (moe.c) instead of the MLP */
        float *y = post ? a->mo : out;
        moe_forward(m, l, xm, y, out != NULL);
        if (I > 0) { /* qwen2_moe: y += sigmoid(xm G^T) * shared_expert(xm) */
            proj_forward(m, l, FT_PROJ_GATE, xm, a->gate);
            proj_forward(m, l, FT_PROJ_UP, xm, a->up);
            ft_swiglu_forward(A_(a->act, nI), A_(a->gate, nI), A_(a->up, nI), nI);
            proj_forward(m, l, FT_PROJ_DOWN, a->act, a->sh);
            shared_gate_forward(m, l, xm, y);
        }
    } else {
        proj_forward(m, l, FT_PROJ_GATE, xm, a->gate);
        proj_forward(m, l, FT_PROJ_UP, xm, a->up);
        if (c->mlp_act == FT_ACT_GELU_TANH)
            ft_geglu_forward(A_(a->act, nI), A_(a->gate, nI), A_(a->up, nI), nI);
        else
            ft_swiglu_forward(A_(a->act, nI), A_(a->gate, nI), A_(a->up, nI), nI);
        if (!out && !post) {
            if (w->lora_a[FT_PROJ_DOWN]) {
                const proj_view v = proj_view_of(m, l, FT_PROJ_DOWN);
                lora_h_forward(m, l, &v, a->act);
            }
            return;
        }
        proj_forward(m, l, FT_PROJ_DOWN, a->act, post ? a->mo : out);
    }
    if (post) /* a recompute keeps only rstd: the output goes to the free scratch d_ln */
        ft_rmsnorm_forward(A_(out ? out : m->d_ln, nC), F_(a->rstd_mo, N), A_(a->mo, nC),
                           A_(post, C), N, C, eps, off);
    if (!out)
        return;
    scale_branch(m, out, nC);
    ft_add(A_(out, nC), A_(a->mid, nC), nC);
}

/* The gradient reaching a branch's output projection, from dy (the gradient of the
 * branch's output, scale included: branch_grad): dy itself, or through the branch's
 * post-norm `post` (x its input, rstd its saved rstd) into the scratch d_br, the norm's
 * weight gradient g accumulating. */
static const float *post_norm_backward(ft_model *m, const float *dy, const float *post,
                                       float *g, const float *x, const float *rstd)
{
    if (!post)
        return dy;
    const ft_model_config *c = &m->cfg;
    int N = m->B * m->T, C = c->hidden_size;
    size_t nC = (size_t)N * C;
    ft_zero(A_(m->d_br, nC), nC);
    ft_rmsnorm_backward(A_(m->d_br, nC), OPTF_(g, C), A_(dy, nC), A_(x, nC), A_(post, C),
                        F_(rstd, N), N, C, c->norm_w_offset);
    return m->d_br;
}

/* d_h += the gradient of the residual stream through a branch's pre-norm, from d_ln (the
 * gradient of the norm's output): or d_ln itself without one (x is then the branch
 * input). */
static void pre_norm_backward(ft_model *m, const float *pre, float *g, const float *x,
                              const float *rstd)
{
    const ft_model_config *c = &m->cfg;
    int N = m->B * m->T, C = c->hidden_size;
    size_t nC = (size_t)N * C;
    if (!pre) {
        ft_add(A_(m->d_h, nC), A_(m->d_ln, nC), nC);
        return;
    }
    ft_rmsnorm_backward(A_(m->d_h, nC), OPTF_(g, C), A_(m->d_ln, nC), A_(x, nC), A_(pre, C),
                        F_(rstd, N), N, C, c->norm_w_offset);
}

/* Whether anything reads the gradient of layer l's input: the layers below, an earlier
 * pipeline stage, a trained embedding (or its LoRA pair), or the attention's pre-norm
 * weight where it trains. Layer 0 of a LoRA run on a frozen embedding has no reader, so
 * its q, k and v skip their dx products (as autograd skips them for an input that needs
 * no gradient): a step's dx GEMMs less one layer's q/k/v. */
static bool input_grad_needed(const ft_model *m, int l)
{
    return l > 0 || m->stage_first > 0 || model_embed_trains(m) || model_embed_lora(m) ||
           m->layers[l].g_norm[FT_NORM_ATTN_PRE];
}

/* On entry m->d_h is the gradient of the layer's output; on exit that of its input. */
static void layer_backward(ft_model *m, int l)
{
    const ft_model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    const layer_acts *a = &m->acts[l];
    int B = m->B, T = m->T, N = B * T, C = c->hidden_size, I = ft_layer_mlp_width(c, l);
    int Hq = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim;
    size_t nC = (size_t)N * C, nQ = (size_t)N * Hq * D, nK = (size_t)N * Hkv * D,
           nI = (size_t)N * I;
    ft_tensor pos = I_(m->pos, N), inv = rope_freqs(m, l);
    int rd = c->rotary_dim;
    float rs = c->rope_attention_factor;
    const float *const *nw = (const float *const *)w->norm;

    /* MLP: out = mid + r * post2(down(act(gate(xm)) * up(xm))), xm = pre2(mid) or mid,
     * r the residual scale */
    const float *dy = post_norm_backward(m, branch_grad(m, nC), nw[FT_NORM_MLP_POST],
                                         w->g_norm[FT_NORM_MLP_POST], a->mo, a->rstd_mo);
    const float *xm = nw[FT_NORM_MLP_PRE] ? a->ln2 : a->mid;
    if (ft_layer_sparse(c, l)) {
        ft_zero(A_(m->d_ln, nC), nC);
        if (I > 0) { /* the shared expert and its gate (d_moe: free until moe_backward) */
            shared_gate_backward(m, l, xm, dy, m->d_moe);
            ft_zero(A_(m->d_act, nI), nI);
            proj_backward(m, l, FT_PROJ_DOWN, a->act, m->d_moe, m->d_act);
            ft_swiglu_backward(A_(m->d_gate, nI), A_(m->d_up, nI), A_(m->d_act, nI),
                               A_(a->gate, nI), A_(a->up, nI), nI);
            proj_backward(m, l, FT_PROJ_GATE, xm, m->d_gate, m->d_ln);
            proj_backward(m, l, FT_PROJ_UP, xm, m->d_up, m->d_ln);
        }
        moe_backward(m, l, xm, dy, m->d_ln);
        goto mlp_done;
    }
    ft_zero(A_(m->d_act, nI), nI);
    proj_backward(m, l, FT_PROJ_DOWN, a->act, dy, m->d_act);
    if (c->mlp_act == FT_ACT_GELU_TANH) /* (overwriting d_gate and d_up) */
        ft_geglu_backward(A_(m->d_gate, nI), A_(m->d_up, nI), A_(m->d_act, nI),
                          A_(a->gate, nI), A_(a->up, nI), nI);
    else
        ft_swiglu_backward(A_(m->d_gate, nI), A_(m->d_up, nI), A_(m->d_act, nI),
                           A_(a->gate, nI), A_(a->up, nI), nI);
    ft_zero(A_(m->d_ln, nC), nC);
    proj_backward(m, l, FT_PROJ_GATE, xm, m->d_gate, m->d_ln);
    proj_backward(m, l, FT_PROJ_UP, xm, m->d_up, m->d_ln);
mlp_done:
    /* the residual passes d_h through; the branch adds its part */
    pre_norm_backward(m, nw[FT_NORM_MLP_PRE], w->g_norm[FT_NORM_MLP_PRE], a->mid, a->rstd2);

    /* attention: mid = in + r * post1(o(attn(rope(q(xa)), rope(k(xa)), v(xa)))), xa =
     * pre1(in) or in; q and k normed before RoPE where the block says so */
    dy = post_norm_backward(m, branch_grad(m, nC), nw[FT_NORM_ATTN_POST],
                            w->g_norm[FT_NORM_ATTN_POST], a->ao, a->rstd_ao);
    ft_zero(A_(m->d_att, nQ), nQ);
    proj_backward(m, l, FT_PROJ_O, a->att, dy, m->d_att);
    ft_zero(A_(m->d_q, nQ), nQ);
    ft_zero(A_(m->d_k, nK), nK);
    ft_zero(A_(m->d_v, nK), nK);
    ft_attention_backward(A_(m->d_q, nQ), A_(m->d_k, nK), A_(m->d_v, nK), A_(m->d_att, nQ),
                          A_(a->q, nQ), A_(a->k, nK), A_(a->v, nK), A_(a->att, nQ),
                          F_(a->lse, (size_t)N * Hq),
                          m->has_seg ? I_(m->seg, N) : ft_none(), B, T, Hq, Hkv, D,
                          c->attention_scale, ft_layer_window(c, l), c->attn_softcap);
    if (ft_layer_uses_rope(c, l)) {
        ft_rope_backward(A_(m->d_q, nQ), pos, inv, N, Hq, D, rd, rs);
        ft_rope_backward(A_(m->d_k, nK), pos, inv, N, Hkv, D, rd, rs);
    }
    const float *xa = nw[FT_NORM_ATTN_PRE] ? a->ln1 : a->in;
    bool d_in = input_grad_needed(m, l);
    float *dxa = d_in ? m->d_ln : NULL;
    if (d_in)
        ft_zero(A_(m->d_ln, nC), nC);
    if (c->qk_norm == FT_QK_NORM_NONE) {
        proj_backward(m, l, FT_PROJ_Q, xa, m->d_q, dxa);
        proj_backward(m, l, FT_PROJ_K, xa, m->d_k, dxa);
        proj_backward(m, l, FT_PROJ_V, xa, m->d_v, dxa);
    } else {
        /* through the q/k norms: d_att (free after the attention's backward) takes q's
         * pre-norm gradient, d_v (free after v's backward) k's */
        ft_zero(A_(m->d_att, nQ), nQ);
        qk_norm_backward(m, l, FT_PROJ_Q, m->d_q, m->d_att);
        proj_backward(m, l, FT_PROJ_Q, xa, m->d_att, dxa);
        proj_backward(m, l, FT_PROJ_V, xa, m->d_v, dxa);
        ft_zero(A_(m->d_v, nK), nK);
        qk_norm_backward(m, l, FT_PROJ_K, m->d_k, m->d_v);
        proj_backward(m, l, FT_PROJ_K, xa, m->d_v, dxa);
    }
    if (d_in)
        pre_norm_backward(m, nw[FT_NORM_ATTN_PRE], w->g_norm[FT_NORM_ATTN_PRE], a->in,
                          a->rstd1);
}

static int acquire(ft_model *m, int unit, ft_unit_phase ph, ft_err *err)
{
    /* the hook first: a sharded quantized base is gathered there */
    if (m->hooks.acquire && m->hooks.acquire(m->hooks.ctx, unit, ph, err))
        return -1;
    return ft_model_materialize(m, unit, err); /* a quantized base: this layer, dequantized */
}

static int release(ft_model *m, int unit, ft_unit_phase ph, bool grads_final, ft_err *err)
{
    return m->hooks.release ? m->hooks.release(m->hooks.ctx, unit, ph, grads_final, err) : 0;
}

/* The head (final norm, lm_head) reads unit L+1 and, when tied, the embedding of unit 0. */
static int acquire_head(ft_model *m, ft_unit_phase ph, ft_err *err)
{
    int L = m->cfg.num_layers;
    if (acquire(m, L + 1, ph, err))
        return -1;
    return m->cfg.tie_word_embeddings ? acquire(m, 0, ph, err) : 0;
}

static int release_head(ft_model *m, ft_unit_phase ph, ft_err *err)
{
    int L = m->cfg.num_layers;
    bool bwd = ph == FT_UNIT_BACKWARD;
    /* a tied embedding's gradient is final only after the embedding's own backward (so
     * are its LoRA pair's and DoRA magnitude's, in the same unit) */
    bool embed_trains = model_embed_trains(m) || model_embed_lora(m);
    if (m->cfg.tie_word_embeddings && release(m, 0, ph, bwd && !embed_trains, err))
        return -1;
    return release(m, L + 1, ph, bwd, err);
}

/* The head's GEMM factor: logits = lm_head(h) / logits_scale (granite's logits_scaling;
 * 1 elsewhere), as alpha = 1 / logits_scale (within an ulp of the division). */
static float head_alpha(const ft_model *m)
{
    return m->cfg.logits_scale == 1.0f ? 1.0f : 1.0f / m->cfg.logits_scale;
}

/* LoRA on lm_head: dropout(lnf) with the head's own mask (a key no layer's module uses). */
static uint64_t head_dropout_seed(const ft_model *m)
{
    return ft_mix64(m->dropout_seed ^ (1ull << 41));
}

static const float *head_lora_input(ft_model *m, size_t n)
{
    float pd = m->opt.lora.dropout;
    if (pd <= 0 || m->eval_mode)
        return m->lnf;
    ft_dropout_forward(A_(m->x_drop, n), A_(m->lnf, n), n, pd, head_dropout_seed(m), 0);
    return m->x_drop;
}

/* lora_xh = dropout(lnf) A^T for the head's pair (forward, and again in backward). */
static void head_lora_h(ft_model *m, int N)
{
    int C = m->cfg.hidden_size, r = m->lora_rk.head.r;
    size_t nC = (size_t)N * C;
    ft_linear_forward(A_(m->lora_xh, (size_t)N * r), A_(head_lora_input(m, nC), nC),
                      A_(m->hlora_a, (size_t)r * C), ft_none(), N, C, r, 1.0f, 0);
}

/* After the head's chunks added s * alpha * dlogits B into d_lora_h: dA += d_lora_h^T xd and
 * d_ln += dropout'(d_lora_h A). */
static void head_lora_backward(ft_model *m, int N)
{
    int C = m->cfg.hidden_size, r = m->lora_rk.head.r;
    size_t nC = (size_t)N * C, nh = (size_t)N * r, na = (size_t)r * C;
    float pd = m->eval_mode ? 0.0f : m->opt.lora.dropout;
    const float *xd = head_lora_input(m, nC);
    ft_linear_backward(ft_none(), OPTF_(m->g_hlora_a, na), ft_none(), A_(m->d_lora_h, nh),
                       A_(xd, nC), A_(m->hlora_a, na), N, C, r, 1.0f);
    if (pd <= 0) {
        ft_linear_backward(A_(m->d_ln, nC), ft_none(), ft_none(), A_(m->d_lora_h, nh),
                           A_(m->lnf, nC), A_(m->hlora_a, na), N, C, r, 1.0f);
        return;
    }
    ft_zero(A_(m->x_drop, nC), nC);
    ft_linear_backward(A_(m->x_drop, nC), ft_none(), ft_none(), A_(m->d_lora_h, nh),
                       A_(m->lnf, nC), A_(m->hlora_a, na), N, C, r, 1.0f);
    ft_dropout_backward(A_(m->d_ln, nC), A_(m->x_drop, nC), nC, pd, head_dropout_seed(m), 0);
}

/* LoRA on the embedding (PEFT's Embedding layer, no dropout): h0 += s A^T[ids] B^T. */
static void embed_lora_forward(ft_model *m, int N)
{
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size, r = m->lora_rk.embed.r;
    size_t nh = (size_t)N * r;
    ft_embedding_t_forward(A_(m->lora_xh, nh), I_(m->ids, N), A_(m->elora_a, (size_t)r * V), N,
                           V, r);
    ft_linear_forward(A_(m->acts[0].in, (size_t)N * C), A_(m->lora_xh, nh),
                      A_(m->elora_b, (size_t)C * r), ft_none(), N, r, C, m->lora_rk.embed.s, 1);
}

/* d_h holds d h0 (the embedding scale applied): dB += s dh0^T H, dH = s dh0 B,
 * dA[:, ids[n]] += dH[n]. */
static void embed_lora_backward(ft_model *m, int N)
{
    int C = m->cfg.hidden_size, V = m->cfg.vocab_size, r = m->lora_rk.embed.r;
    size_t nh = (size_t)N * r, nC = (size_t)N * C, nb = (size_t)C * r;
    ft_embedding_t_forward(A_(m->lora_xh, nh), I_(m->ids, N), A_(m->elora_a, (size_t)r * V), N,
                           V, r);
    ft_linear_backward(ft_none(), OPTF_(m->g_elora_b, nb), ft_none(), A_(m->d_h, nC),
                       A_(m->lora_xh, nh), A_(m->elora_b, nb), N, r, C, m->lora_rk.embed.s);
    if (!m->g_elora_a)
        return;
    ft_zero(A_(m->d_lora_h, nh), nh);
    ft_linear_backward(A_(m->d_lora_h, nh), ft_none(), ft_none(), A_(m->d_h, nC),
                       A_(m->lora_xh, nh), A_(m->elora_b, nb), N, r, C, m->lora_rk.embed.s);
    ft_embedding_t_backward(F_(m->g_elora_a, (size_t)r * V), A_(m->d_lora_h, nh),
                            I_(m->ids, N), N, V, r, m->cfg.embed_padding_idx);
}

/* LoRA on the embedding / the head in this forward: targeted, and the adapter not
 * switched off (ft_model_set_adapter: the base's own embedding and head, as PEFT's
 * disable_adapter computes them) */
static bool embed_lora_on(const ft_model *m) { return model_embed_lora(m) && !m->adapter_off; }
static bool head_lora_on(const ft_model *m) { return model_head_lora(m) && !m->adapter_off; }

/* logits[0, rows) = lm_head(lnf rows [r0, r0 + rows)): one chunk of the head, soft-capped
 * where the family caps its logits (gemma2: c tanh(logits / c); the cross-entropy's
 * softcap argument then takes the gradient through the tanh). */
static void head_logits(ft_model *m, size_t r0, size_t rows)
{
    size_t C = (size_t)m->cfg.hidden_size, V = (size_t)m->cfg.vocab_size;
    ft_tensor x = ft_slice(A_(m->lnf, (r0 + rows) * C), r0 * C, rows * C);
    if (head_lora_on(m) && m->opt.lora.dora)
        dora_head_logits(m, r0, rows, head_alpha(m));
    else
        ft_linear_forward(A_(m->logits, rows * V), x, A_(m->lm_head, V * C), ft_none(),
                          (int)rows, (int)C, (int)V, head_alpha(m), 0);
    if (head_lora_on(m) && !m->opt.lora.dora) { /* + s (xd A^T) B^T, xd A^T in lora_xh */
        size_t r = (size_t)m->lora_rk.head.r;
        ft_linear_forward(A_(m->logits, rows * V),
                          ft_slice(A_(m->lora_xh, (r0 + rows) * r), r0 * r, rows * r),
                          A_(m->hlora_b, V * r), ft_none(), (int)rows, (int)r, (int)V,
                          m->lora_rk.head.s * head_alpha(m), 1);
    }
    if (m->cfg.final_softcap > 0.0f)
        ft_softcap(A_(m->logits, rows * V), m->cfg.final_softcap, rows * V);
}

/* The cross-entropy of the head rows [r0, r0 + rows) whose logits the buffer holds (in
 * backward turned into dlogits in place): ft_cross_entropy over the chunk, or, for a preference
 * objective (m->row_nll / m->row_scale set), over each batch row's part of it, so that
 * each row's sum is kept (forward) or its gradient takes the row's own scale (backward). */
static double head_ce(ft_model *m, bool backward, size_t r0, size_t rows, float grad_scale)
{
    int V = m->cfg.vocab_size;
    size_t N = (size_t)m->B * m->T;
    ft_tensor lg = A_(m->logits, rows * (size_t)V);
    ft_tensor tg = I_(m->targets, N);
    bool per_row = backward ? m->row_scale != NULL : m->row_nll != NULL;
    if (!per_row)
        return ft_cross_entropy(backward ? lg : ft_none(), lg, ft_slice(tg, r0, rows),
                                (int)rows, V, grad_scale, m->cfg.final_softcap);
    double total = 0;
    for (size_t i = r0; i < r0 + rows;) {
        size_t row = i / (size_t)m->T, end = (row + 1) * (size_t)m->T;
        /* a row split in two (row_split): the part before the split apart */
        size_t split = m->row_split ? row * (size_t)m->T + (size_t)m->row_split[row] : 0;
        bool pre = i < split;
        if (pre && split < end)
            end = split;
        size_t n = (end < r0 + rows ? end : r0 + rows) - i;
        ft_tensor part = ft_slice(lg, (i - r0) * (size_t)V, n * (size_t)V);
        float scale = !backward ? 0.0f : pre ? m->row_scale_pre[row] : m->row_scale[row];
        double s = ft_cross_entropy(backward ? part : ft_none(), part, ft_slice(tg, i, n),
                                    (int)n, V, scale, m->cfg.final_softcap);
        if (!backward)
            (pre ? m->row_nll_pre : m->row_nll)[row] += s;
        total += s;
        i += n;
    }
    return total;
}

/* Layers this model computes: [*l0, *l1) (units l0+1 .. l1). */
static void stage_layers(const ft_model *m, int *l0, int *l1)
{
    int L = m->cfg.num_layers;
    *l0 = m->stage_first > 0 ? m->stage_first - 1 : 0;
    *l1 = m->stage_last < L + 1 ? m->stage_last : L;
}

int ft_model_forward(ft_model *m, const ft_batch *b, double *loss_sum, long *n_tokens,
                     ft_err *err)
{
    const ft_model_config *c = &m->cfg;
    if (b->B <= 0 || b->T <= 0)
        return ft_fail(err, "empty batch (%d rows of %d tokens)", b->B, b->T);
    m->logits_valid = m->can_backward = m->logits_h_valid = false;
    if (model_reserve_activations(m, b->B, b->T, err))
        return -1;
    long counted = 0;
    if (prepare_batch(m, b, &counted, err))
        return -1;
    int L = c->num_layers, N = b->B * b->T, C = c->hidden_size, V = c->vocab_size;
    size_t nC = (size_t)N * C;
    m->dropout_seed = ft_mix64(m->opt.seed ^ ft_mix64(++m->n_forward));
    int l0, l1;
    stage_layers(m, &l0, &l1);

    if (m->stage_first == 0) {
        if (acquire(m, 0, FT_UNIT_FORWARD, err))
            return -1;
        ft_embedding_forward(A_(m->acts[0].in, nC), I_(m->ids, N),
                             A_(m->embed, (size_t)V * C), N, V, C);
        if (embed_lora_on(m))
            embed_lora_forward(m, N);
        if (embed_lora_on(m) && m->opt.lora.dora)
            dora_embed_forward(m, N);
        if (embed_scale(m) != 1.0f) /* granite, gemma: h0 = embed * scale */
            ft_scale(A_(m->acts[0].in, nC), embed_scale(m), nC);
        if (release(m, 0, FT_UNIT_FORWARD, false, err))
            return -1;
    } else if (m->hooks.recv_hidden(m->hooks.ctx, l0 < L ? m->acts[l0].in : m->final_in, nC,
                                    err)) {
        return -1; /* (a stage of only the head receives the last layer's output) */
    }
    moe_aux_begin(m);
    for (int l = l0; l < l1; l++) {
        if (acquire(m, l + 1, FT_UNIT_FORWARD, err))
            return -1;
        layer_forward(m, l, m->acts[l].in, l + 1 < L ? m->acts[l + 1].in : m->final_in);
        if (release(m, l + 1, FT_UNIT_FORWARD, false, err))
            return -1;
    }
    double loss = 0;
    if (m->stage_last <= L) {
        if (m->hooks.send_hidden(m->hooks.ctx, l1 < L ? m->acts[l1].in : m->final_in, nC, err))
            return -1;
    } else {
        if (acquire_head(m, FT_UNIT_FORWARD, err))
            return -1;
        ft_rmsnorm_forward(A_(m->lnf, nC), F_(m->rstdf, N), A_(m->final_in, nC),
                           A_(m->norm_f, C), N, C, c->rms_norm_eps, c->norm_w_offset);
        if (head_lora_on(m))
            head_lora_h(m, N);
        size_t R = ft_loss_chunk_rows(m->opt.loss_chunk_rows, (size_t)V, (size_t)N);
        for (size_t r0 = 0; r0 < (size_t)N; r0 += R) {
            size_t rows = (size_t)N - r0 < R ? (size_t)N - r0 : R;
            head_logits(m, r0, rows);
            loss += head_ce(m, false, r0, rows, 0.0f);
            m->logits_first = r0; /* the buffer ends with the last chunk */
        }
        if (release_head(m, FT_UNIT_FORWARD, err))
            return -1;
        m->logits_valid = true;
    }
    /* (after a stage's send: the statistics may be summed over the stages) */
    if (moe_aux_end(m, err))
        return -1;
    if (loss_sum)
        *loss_sum = loss;
    if (n_tokens)
        *n_tokens = counted;
    /* (with the adapter off the LoRA path's activations were not computed) */
    m->can_backward = m->opt.mode != FT_TRAIN_NONE && !m->adapter_off;
    return 0;
}

int ft_model_backward(ft_model *m, float grad_scale, ft_err *err)
{
    if (!m->can_backward)
        return ft_fail(err, m->opt.mode == FT_TRAIN_NONE
                                ? "backward on a model loaded without trainable parameters"
                                : "backward without a preceding forward");
    const ft_model_config *c = &m->cfg;
    int L = c->num_layers, N = m->B * m->T, C = c->hidden_size, V = c->vocab_size;
    size_t nC = (size_t)N * C;
    int l0, l1;
    stage_layers(m, &l0, &l1);
    m->logits_valid = m->can_backward = false;

    if (m->stage_last <= L) {
        if (m->hooks.recv_grad(m->hooks.ctx, m->d_h, nC, err))
            return -1;
    } else {
        if (acquire_head(m, FT_UNIT_BACKWARD, err))
            return -1;
        ft_zero(A_(m->d_ln, nC), nC);
        size_t r = (size_t)m->lora_rk.head.r;
        if (model_head_lora(m)) {
            head_lora_h(m, N);
            ft_zero(A_(m->d_lora_h, (size_t)N * r), (size_t)N * r);
        }
        /* chunk by chunk: first the forward's last chunk, whose logits the buffer still
         * holds (all of them when one chunk covers the batch), then the others from the
         * first on, each recomputed */
        size_t R = ft_loss_chunk_rows(m->opt.loss_chunk_rows, (size_t)V, (size_t)N);
        size_t nch = ((size_t)N + R - 1) / R;
        for (size_t k = 0; k < nch; k++) {
            size_t r0 = (k ? k - 1 : nch - 1) * R;
            size_t rows = (size_t)N - r0 < R ? (size_t)N - r0 : R;
            if (k)
                head_logits(m, r0, rows);
            /* dlogits overwrite the logits in place (w.r.t. the uncapped logits) */
            ft_tensor dlogits = A_(m->logits, rows * V);
            head_ce(m, true, r0, rows, grad_scale);
            if (model_head_lora(m) && m->opt.lora.dora) {
                bool drop = m->opt.lora.dropout > 0 && !m->eval_mode;
                dora_head_backward(m, r0, rows, head_alpha(m), drop ? m->x_drop : m->lnf,
                                   head_dropout_seed(m));
                continue;
            }
            ft_linear_backward(ft_slice(A_(m->d_ln, nC), r0 * C, rows * C),
                               OPTF_(m->g_lm_head, (size_t)V * C), ft_none(), dlogits,
                               ft_slice(A_(m->lnf, nC), r0 * C, rows * C),
                               A_(m->lm_head, (size_t)V * C), (int)rows, C, V, head_alpha(m));
            if (model_head_lora(m)) { /* dB += s a dlogits^T h; d_lora_h += s a dlogits B */
                ft_tensor h = ft_slice(A_(m->lora_xh, (size_t)N * r), r0 * r, rows * r);
                float sa = m->lora_rk.head.s * head_alpha(m);
                ft_linear_backward(ft_slice(A_(m->d_lora_h, (size_t)N * r), r0 * r, rows * r),
                                   OPTF_(m->g_hlora_b, (size_t)V * r), ft_none(), dlogits, h,
                                   A_(m->hlora_b, (size_t)V * r), (int)rows, (int)r, V, sa);
            }
        }
        if (model_head_lora(m))
            head_lora_backward(m, N);
        ft_zero(A_(m->d_h, nC), nC);
        ft_rmsnorm_backward(A_(m->d_h, nC), OPTF_(m->g_norm_f, C), A_(m->d_ln, nC),
                            A_(m->final_in, nC), A_(m->norm_f, C), F_(m->rstdf, N), N, C,
                            c->norm_w_offset);
        if (release_head(m, FT_UNIT_BACKWARD, err))
            return -1;
    }
    for (int l = l1 - 1; l >= l0; l--) {
        if (acquire(m, l + 1, FT_UNIT_BACKWARD, err))
            return -1;
        /* The shared scratch still holds the stage's last layer's activations. */
        if (m->opt.grad_ckpt && l < l1 - 1)
            layer_forward(m, l, m->acts[l].in, NULL);
        layer_backward(m, l);
        if (release(m, l + 1, FT_UNIT_BACKWARD, true, err))
            return -1;
    }
    if (m->stage_first > 0)
        return m->hooks.send_grad(m->hooks.ctx, m->d_h, nC, err);
    /* (the embedding's gradient pointer is bound by the acquire under ZeRO-2/3) */
    if (model_embed_trains(m) || model_embed_lora(m)) {
        if (acquire(m, 0, FT_UNIT_BACKWARD, err))
            return -1;
        if (embed_scale(m) != 1.0f) /* d embed = scale * d h0 (d_h is not needed after) */
            ft_scale(A_(m->d_h, nC), embed_scale(m), nC);
        if (model_embed_trains(m))
            ft_embedding_backward(F_(m->g_embed, (size_t)V * C), A_(m->d_h, nC), I_(m->ids, N),
                                  N, V, C, m->cfg.embed_padding_idx);
        if (model_embed_lora(m) && m->opt.lora.dora)
            dora_embed_backward(m, N);
        else if (model_embed_lora(m))
            embed_lora_backward(m, N);
        if (release(m, 0, FT_UNIT_BACKWARD, true, err))
            return -1;
    }
    return 0;
}

double ft_model_aux_loss(const ft_model *m)
{
    return m->aux_loss;
}

double ft_model_aux_balance(const ft_model *m)
{
    return m->aux_balance;
}

void ft_model_set_aux_reduce(ft_model *m, ft_model_aux_reduce_fn fn, void *ctx)
{
    m->aux_reduce = fn;
    m->aux_reduce_ctx = ctx;
}

long ft_batch_counted_tokens(const ft_batch *b)
{
    long n = 0;
    const int32_t *labels = b->labels ? b->labels : b->input_ids;
    for (int r = 0; r < b->B; r++)
        for (int t = 1; t < b->T; t++)
            n += labels[(size_t)r * b->T + t] != -100;
    return n;
}
