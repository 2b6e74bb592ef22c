/* The sparse mixture-of-experts block (mixtral; hf_config.h's num_experts) as
 * transformers' MixtralSparseMoeBlock computes it, and its backward:
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
 * the experts' part and the router's, and the router trains in full mode.
 *
 * The load-balancing loss (cfg.output_router_logits) is transformers'
 * load_balancing_loss_func without a mask over the forward's MoE layers:
 *   aux = E sum_e (counts_e / R) (psum_e / R),  R = N x (MoE layers),
 * counts_e the pairs routed to e and psum_e the summed probabilities of e. The loss gains
 * coef * aux (m->aux_loss, ft_model_aux_loss); its gradient w.r.t. each layer's
 * probs[n, e] is coef E counts_e / R^2 (aux_dp), added in each layer's router backward
 * with weight 1 per forward: a micro-batch's term counts whole, as transformers' Trainer
 * adds each micro-batch's aux_loss to its (token-normalised) loss. */
#include <string.h>

#include "model/model_internal.h"

#define A_(p, n) model_view(m, (p), (size_t)(n), m->cdt)
#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)
#define I_(p, n) model_view(m, (p), (size_t)(n), FT_I32)
#define OPTF_(p, n) ((p) ? F_(p, n) : ft_none())

int moe_layers(const ft_model *m)
{
    return m->cfg.num_experts > 0 ? m->cfg.num_layers : 0;
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
    ft_moe_router_forward(F_(a->probs, NE), I_(a->idx, NK), F_(a->rw, NK), A_(a->rlogits, NE),
                          N, E, k, c->norm_topk_prob);
    if (record && m->aux_counts)
        ft_moe_aux_stats(F_(m->aux_counts, E), F_(m->aux_psum, E), F_(a->probs, NE),
                         I_(a->idx, NK), N, E, k);
    /* the grouping is host bookkeeping (the GEMM sizes are host arguments): on the CPU the
     * arrays are host memory (the model refuses MoE on the GPU for now) */
    ft_moe_plan(a->offsets, a->rows, a->slot, a->idx, N, E, k);
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
    ft_swiglu_forward(A_(a->acte, NK * I), A_(a->ge, NK * I), A_(a->ue, NK * I), NK * I);
    for (int e = 0; e < E; e++) {
        int r0 = a->offsets[e], n = a->offsets[e + 1] - r0;
        if (n == 0)
            continue;
        ft_linear_forward(A_(rows_at(m, a->ye, r0, C), (size_t)n * C),
                          A_(rows_at(m, a->acte, r0, I), (size_t)n * I),
                          A_(w->expert[3 * e + 2], (size_t)C * I), ft_none(), n, I, C, 1.0f, 0);
    }
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
    ft_zero(A_(m->d_gate, NK * I), NK * I);
    ft_zero(A_(m->d_up, NK * I), NK * I);
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
    ft_moe_gather_backward(A_(dx, nC), A_(m->d_moe, NK * C), I_(a->slot, NK), N, k, C);
    /* router: through the top-k weights (and the load-balancing term) to the logits,
     * then to x and R */
    ft_zero(A_(m->d_rlogits, NE), NE);
    ft_moe_router_backward(A_(m->d_rlogits, NE), F_(m->d_rw, NK),
                           m->aux_counts ? F_(m->aux_dp, E) : ft_none(), F_(a->probs, NE),
                           I_(a->idx, NK), F_(a->rw, NK), N, E, k, c->norm_topk_prob);
    ft_linear_backward(A_(dx, nC), OPTF_(w->g_router, (size_t)E * C), ft_none(),
                       A_(m->d_rlogits, NE), A_(x, nC), A_(w->router, (size_t)E * C), N, C, E,
                       1.0f);
}

void moe_aux_begin(ft_model *m)
{
    m->aux_loss = 0.0;
    if (!m->aux_counts)
        return;
    int E = m->cfg.num_experts;
    ft_zero(F_(m->aux_counts, E), E);
    ft_zero(F_(m->aux_psum, E), E);
}

void moe_aux_end(ft_model *m)
{
    if (!m->aux_counts)
        return;
    const ft_model_config *c = &m->cfg;
    int E = c->num_experts;
    double R = (double)m->B * m->T * moe_layers(m), sum = 0.0;
    for (int e = 0; e < E; e++) {
        sum += ((double)m->aux_counts[e] / R) * ((double)m->aux_psum[e] / R);
        m->aux_dp[e] = (float)((double)c->router_aux_loss_coef * E * m->aux_counts[e] / (R * R));
    }
    m->aux_loss = (double)c->router_aux_loss_coef * E * sum;
}
