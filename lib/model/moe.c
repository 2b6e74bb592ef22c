/* The sparse mixture-of-experts block (mixtral, qwen3_moe, qwen2_moe; hf_config.h's
 * num_experts) as transformers' MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock and
 * Qwen2MoeSparseMoeBlock compute it (qwen2_moe's shared expert: model_pass.c), and its
 * backward:
 *
 *   logits = x R^T                       router, [N, E]
 *   p = softmax(logits); idx, w = the top k of p (w renormalised when norm_topk_prob)
 *   y[n] = sum_j w[n,j] * expert_{idx[n,j]}(x[n]),  expert_e(x) = (silu(x G_e^T) * x U_e^T) D_e^T
 *
 * Tokens are grouped per expert (ft_moe_plan: expert by expert, rows ascending): their
 * rows are gathered into one [N k, C] block, each expert's contiguous rows go through
 * its three GEMMs, and the outputs are combined back with the weights. The backward
 * treats the selection as a constant, as autograd does: the gradient reaches the router
 * through the selected, renormalised probabilities (ft_moe_router_backward), so dx has
 * the experts' part and the router's, and the router trains in full mode (or carries a
 * LoRA pair: moe_lora.c).
 *
 * The load-balancing loss (cfg.output_router_logits) is transformers'
 * load_balancing_loss_func, given the batch's attention_mask, over the forward's sparse MoE
 * layers (those whose router transformers records):
 *   aux = E sum_e (counts_e / R) (psum_e / R),  R = (real tokens) x (sparse layers),
 * counts_e the pairs of real tokens routed to e and psum_e the summed probabilities of e
 * over the real tokens (the mask weighs every row by 0 or 1; without a mask every row is
 * real). The real tokens are row ranges (moe_aux_mask: right padding makes one range a
 * batch row, the full rows merged), so the statistics run over each range and the masked
 * rows are left out, with no mask on the device. The loss gains coef * aux (m->aux_loss,
 * ft_model_aux_loss); its gradient w.r.t. each layer's probs[n, e] of a real token is
 * coef E counts_e / R^2 (aux_dp), of padding 0, added in each layer's router backward
 * with weight 1 per forward: a micro-batch's term counts whole, as transformers' Trainer
 * adds each micro-batch's aux_loss to its (token-normalised) loss. Over several ranks
 * (ft_model_set_aux_reduce) counts, psum and R are sums over the ranks, so the term is
 * the one of the step's whole micro-batch (data parallel) and of all layers (pipeline),
 * and each rank's gradient is its part of that term's: the ranks' gradients add up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

#define A_(p, n) model_view(m, (p), (size_t)(n), m->cdt)
#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)
#define I_(p, n) model_view(m, (p), (size_t)(n), FT_I32)
#define OPTF_(p, n) ((p) ? F_(p, n) : ft_none())

/* A copy between the host and the model's device that failed: a CUDA fault, a bug as in
 * the ops (kernels/ops.c aborts likewise). */
static void copy_or_die(const ft_model *m, void *dst, int dst_dev, const void *src,
                        int src_dev, size_t bytes, const char *what)
{
    ft_err err = {0};
    (void)m;
    if (ft_copy_bytes(dst, dst_dev, src, src_dev, bytes, &err)) {
        fprintf(stderr, "moe: copying %s: %s\n", what, err.msg);
        abort();
    }
}

/* The grouping of layer l's routing: on the host, from idx (downloaded from a GPU model
 * into the host staging), into the host offsets and the rows and slot the ops read
 * (uploaded to a GPU model). The GEMM sizes are host arguments, so the routing makes
 * one round trip per layer, as transformers' own loop over the experts does. */
static void plan(ft_model *m, layer_acts *a, int N, int E, int k)
{
    size_t M = (size_t)N * k;
    if (m->dev == FT_DEV_CPU) {
        ft_moe_plan(a->offsets, a->rows, a->slot, a->idx, N, E, k);
        return;
    }
    int32_t *idx = m->moe_host, *rows = idx + M, *slot = rows + M;
    copy_or_die(m, idx, FT_DEV_CPU, a->idx, m->dev, M * sizeof *idx, "the routing");
    ft_moe_plan(a->offsets, rows, slot, idx, N, E, k);
    copy_or_die(m, a->rows, m->dev, rows, FT_DEV_CPU, M * sizeof *rows, "the grouping");
    copy_or_die(m, a->slot, m->dev, slot, FT_DEV_CPU, M * sizeof *slot, "the grouping");
}

/* rows [r0, r0 + n) of a [*, width] buffer of the compute dtype */
static float *rows_at(const ft_model *m, float *p, size_t r0, size_t width)
{
    return model_at(m, p, r0 * width);
}

void moe_forward(ft_model *m, int l, const float *x, float *y, bool record)
{
    const ft_model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    layer_acts *a = &m->acts[l];
    int N = m->B * m->T, C = c->hidden_size, I = c->intermediate_size;
    int E = c->num_experts, k = c->experts_per_tok, M = N * k;
    size_t NE = (size_t)N * E, NK = (size_t)M;

    ft_linear_forward(A_(a->rlogits, NE), A_(x, (size_t)N * C), A_(w->router, (size_t)E * C),
                      ft_none(), N, C, E, 1.0f, 0);
    moe_router_lora_forward(m, l, x, a->rlogits);
    ft_moe_router_forward(F_(a->probs, NE), I_(a->idx, NK), F_(a->rw, NK), A_(a->rlogits, NE),
                          N, E, k, c->norm_topk_prob);
    for (size_t i = 0; record && m->aux_counts && i < m->aux_n_runs; i++) {
        size_t r0 = (size_t)m->aux_runs[2 * i], n = (size_t)m->aux_runs[2 * i + 1] - r0;
        ft_moe_aux_stats(F_(m->aux_counts, E), F_(m->aux_psum, E),
                         ft_slice(F_(a->probs, NE), r0 * E, n * E),
                         ft_slice(I_(a->idx, NK), r0 * k, n * k), (int)n, E, k);
    }
    plan(m, a, N, E, k);
    ft_moe_gather_forward(A_(a->xe, NK * C), A_(x, (size_t)N * C), I_(a->rows, NK), N, k, C);
    for (int e = 0; e < E; e++) {
        int r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (n == 0)
            continue;
        const float *xe = rows_at(m, a->xe, r0, C);
        ft_linear_forward(A_(rows_at(m, a->ge, r0, I), (size_t)n * I), A_(xe, (size_t)n * C),
                          A_(w->expert[3 * e], (size_t)I * C), ft_none(), n, C, I, 1.0f, 0);
        ft_linear_forward(A_(rows_at(m, a->ue, r0, I), (size_t)n * I), A_(xe, (size_t)n * C),
                          A_(w->expert[3 * e + 1], (size_t)I * C), ft_none(), n, C, I, 1.0f, 0);
    }
    moe_experts_lora_forward(m, l, FT_LORA_PARAM_GATE_UP);
    ft_swiglu_forward(A_(a->acte, NK * I), A_(a->ge, NK * I), A_(a->ue, NK * I), NK * I);
    for (int e = 0; e < E; e++) {
        int r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (n == 0)
            continue;
        ft_linear_forward(A_(rows_at(m, a->ye, r0, C), (size_t)n * C),
                          A_(rows_at(m, a->acte, r0, I), (size_t)n * I),
                          A_(w->expert[3 * e + 2], (size_t)C * I), ft_none(), n, I, C, 1.0f, 0);
    }
    moe_experts_lora_forward(m, l, FT_LORA_PARAM_DOWN);
    if (y)
        ft_moe_combine_forward(A_(y, (size_t)N * C), A_(a->ye, NK * C), F_(a->rw, NK),
                               I_(a->slot, NK), N, k, C, 0);
}

void moe_backward(ft_model *m, int l, const float *x, const float *dy, float *dx)
{
    const ft_model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    const layer_acts *a = &m->acts[l];
    int N = m->B * m->T, C = c->hidden_size, I = c->intermediate_size;
    int E = c->num_experts, k = c->experts_per_tok, M = N * k;
    size_t NE = (size_t)N * E, NK = (size_t)M, nC = (size_t)N * C;

    /* combine: d ye (into d_moe) and d w */
    ft_zero(A_(m->d_moe, NK * C), NK * C);
    ft_zero(F_(m->d_rw, NK), NK);
    ft_moe_combine_backward(A_(m->d_moe, NK * C), F_(m->d_rw, NK), A_(dy, nC),
                            A_(a->ye, NK * C), F_(a->rw, NK), I_(a->slot, NK), N, k, C);
    /* down: d acte, d D_e */
    ft_zero(A_(m->d_act, NK * I), NK * I);
    for (int e = 0; e < E; e++) {
        int r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (n == 0)
            continue;
        float *g = w->g_expert ? w->g_expert[3 * e + 2] : NULL;
        ft_linear_backward(A_(rows_at(m, m->d_act, r0, I), (size_t)n * I),
                           OPTF_(g, (size_t)C * I), ft_none(),
                           A_(rows_at(m, m->d_moe, r0, C), (size_t)n * C),
                           A_(rows_at(m, a->acte, r0, I), (size_t)n * I),
                           A_(w->expert[3 * e + 2], (size_t)C * I), n, I, C, 1.0f);
    }
    moe_experts_lora_backward(m, l, FT_LORA_PARAM_DOWN);
    ft_swiglu_backward(A_(m->d_gate, NK * I), A_(m->d_up, NK * I), A_(m->d_act, NK * I),
                       A_(a->ge, NK * I), A_(a->ue, NK * I), NK * I);
    /* gate and up: d xe (into d_moe, free again), d G_e, d U_e */
    ft_zero(A_(m->d_moe, NK * C), NK * C);
    for (int e = 0; e < E; e++) {
        int r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (n == 0)
            continue;
        const float *xe = rows_at(m, a->xe, r0, C);
        float *dxe = rows_at(m, m->d_moe, r0, C);
        for (int h = 0; h < 2; h++) {
            float *g = w->g_expert ? w->g_expert[3 * e + h] : NULL;
            float *d = h == 0 ? m->d_gate : m->d_up;
            ft_linear_backward(A_(dxe, (size_t)n * C), OPTF_(g, (size_t)I * C), ft_none(),
                               A_(rows_at(m, d, r0, I), (size_t)n * I), A_(xe, (size_t)n * C),
                               A_(w->expert[3 * e + h], (size_t)I * C), n, C, I, 1.0f);
        }
    }
    moe_experts_lora_backward(m, l, FT_LORA_PARAM_GATE_UP);
    ft_moe_gather_backward(A_(dx, nC), A_(m->d_moe, NK * C), I_(a->slot, NK), N, k, C);
    /* router: through the top-k weights (and the load-balancing term) to the logits,
     * then to x and R */
    ft_zero(A_(m->d_rlogits, NE), NE);
    if (!m->aux_counts)
        ft_moe_router_backward(A_(m->d_rlogits, NE), F_(m->d_rw, NK), ft_none(),
                               F_(a->probs, NE), I_(a->idx, NK), F_(a->rw, NK), N, E, k,
                               c->norm_topk_prob);
    /* with the load-balancing term: each range of real rows with aux_dp, each range of
     * padding before, between and after them without */
    for (size_t i = 0, r0 = 0; m->aux_counts && r0 < (size_t)N; i++) {
        bool real = i % 2 == 1;
        size_t run = i / 2, r1 = (size_t)N;
        if (run < m->aux_n_runs)
            r1 = (size_t)m->aux_runs[2 * run + real];
        if (r1 == r0)
            continue;
        size_t n = r1 - r0;
        ft_moe_router_backward(ft_slice(A_(m->d_rlogits, NE), r0 * E, n * E),
                               ft_slice(F_(m->d_rw, NK), r0 * k, n * k),
                               real ? F_(m->aux_dp, E) : ft_none(),
                               ft_slice(F_(a->probs, NE), r0 * E, n * E),
                               ft_slice(I_(a->idx, NK), r0 * k, n * k),
                               ft_slice(F_(a->rw, NK), r0 * k, n * k), (int)n, E, k,
                               c->norm_topk_prob);
        r0 = r1;
    }
    ft_linear_backward(A_(dx, nC), OPTF_(w->g_router, (size_t)E * C), ft_none(),
                       A_(m->d_rlogits, NE), A_(x, nC), A_(w->router, (size_t)E * C), N, C, E,
                       1.0f);
    moe_router_lora_backward(m, l, x, m->d_rlogits, dx);
}

int moe_aux_mask(ft_model *m, const ft_batch *b, ft_err *err)
{
    if (!m->aux_counts)
        return 0;
    /* at most one range a batch row (right padding); ranges that touch are merged */
    if ((size_t)b->B > m->aux_runs_cap) {
        int32_t *p = realloc(m->aux_runs, 2 * (size_t)b->B * sizeof *p);
        if (!p)
            return ft_fail(err, "out of memory");
        m->aux_runs = p;
        m->aux_runs_cap = (size_t)b->B;
    }
    size_t n = 0;
    m->aux_real = 0;
    for (int r = 0; r < b->B; r++) {
        int len = b->T;
        if (b->attention_mask) /* checked: ones, then zeros */
            for (len = 0; len < b->T && b->attention_mask[(size_t)r * b->T + len];)
                len++;
        int32_t r0 = r * b->T, r1 = r0 + len;
        m->aux_real += len;
        if (len == 0)
            continue;
        if (n > 0 && m->aux_runs[2 * n - 1] == r0)
            m->aux_runs[2 * n - 1] = r1;
        else {
            m->aux_runs[2 * n] = r0;
            m->aux_runs[2 * n + 1] = r1;
            n++;
        }
    }
    m->aux_n_runs = n;
    return 0;
}

void moe_aux_begin(ft_model *m)
{
    m->aux_loss = m->aux_balance = 0.0;
    if (!m->aux_counts)
        return;
    int E = m->cfg.num_experts;
    ft_zero(F_(m->aux_counts, E), E);
    ft_zero(F_(m->aux_psum, E), E);
}

/* Sparse MoE layers among the layers this model computes (a pipeline stage: its own). */
static int stage_moe_layers(const ft_model *m)
{
    int L = m->cfg.num_layers, n = 0;
    int l0 = m->stage_first > 0 ? m->stage_first - 1 : 0;
    int l1 = m->stage_last < L + 1 ? m->stage_last : L;
    for (int l = l0; l < l1; l++)
        n += ft_layer_sparse(&m->cfg, l);
    return n;
}

int moe_aux_end(ft_model *m, ft_err *err)
{
    if (!m->aux_counts)
        return 0;
    const ft_model_config *c = &m->cfg;
    int E = c->num_experts;
    /* counts, psum, dp: contiguous (model.c), on the model's device */
    float *h = m->dev == FT_DEV_CPU ? m->aux_counts : (float *)m->moe_host;
    if (h != m->aux_counts)
        copy_or_die(m, h, FT_DEV_CPU, m->aux_counts, m->dev, 2 * (size_t)E * sizeof *h,
                    "the load-balancing statistics");
    /* [counts E, psum E, rows x layers]: summed over the ranks when they share the loss */
    if (!m->aux_sums && !(m->aux_sums = malloc((2 * (size_t)E + 1) * sizeof *m->aux_sums)))
        return ft_fail(err, "out of memory");
    double *v = m->aux_sums;
    for (int i = 0; i < 2 * E; i++)
        v[i] = h[i];
    v[2 * E] = (double)m->aux_real * stage_moe_layers(m);
    if (m->aux_reduce && m->aux_reduce(m->aux_reduce_ctx, v, 2 * (size_t)E + 1, err)) {
        return ft_fail_prefix(err, "the MoE load-balancing statistics");
    }
    float *dp = h + 2 * E;
    double R = v[2 * E], sum = 0.0;
    for (int e = 0; e < E; e++) { /* (no real token anywhere: no term, no gradient) */
        sum += R > 0 ? (v[e] / R) * (v[E + e] / R) : 0.0;
        dp[e] = R > 0 ? (float)((double)c->router_aux_loss_coef * E * v[e] / (R * R)) : 0.0f;
    }
    if (h != m->aux_counts)
        copy_or_die(m, m->aux_dp, m->dev, dp, FT_DEV_CPU, (size_t)E * sizeof *dp,
                    "the load-balancing gradient");
    m->aux_balance = E * sum;
    m->aux_loss = (double)c->router_aux_loss_coef * m->aux_balance;
    return 0;
}
