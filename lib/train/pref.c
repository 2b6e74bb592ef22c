/* DPO's loss, its gradient w.r.t. the sequences' log-probabilities, and the objective
 * that runs it on the model (pref.h). */
#include "train/pref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const ft_pref_metric_names[FT_PREF_NSUM] = {
    "loss",          "rewards/chosen", "rewards/rejected", "rewards/accuracies",
    "rewards/margins", "logps/chosen", "logps/rejected",  "pairs",
    "nll_loss",      "log_odds_ratio", "log_odds_chosen"};

int ft_pref_check(const ft_pref_options *o, ft_err *err)
{
    if (!(o->beta > 0))
        return ft_fail(err, "config: key 'train.pref.beta' = %g: must be > 0", o->beta);
    double e = o->label_smoothing;
    if (o->loss == FT_PREF_ORPO && e != 0)
        return ft_fail(err, "config: key 'train.pref.label_smoothing' = %g: ORPO has no label "
                            "smoothing", e);
    if (o->loss == FT_PREF_ROBUST && !(e >= 0 && e < 0.5))
        return ft_fail(err, "config: key 'train.pref.label_smoothing' = %g: the robust loss "
                            "needs it in [0, 0.5)", e);
    if (o->loss != FT_PREF_ROBUST && e != 0)
        return ft_fail(err, "config: key 'train.pref.label_smoothing' = %g: TRL applies label "
                            "smoothing in the robust loss only; set train.pref.loss_type=robust "
                            "(or label_smoothing 0)", e);
    return 0;
}

/* log sigmoid(x) and sigmoid(x), stable for either sign of x (as torch's logsigmoid). */
static double log_sigmoid(double x) { return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x)); }
static double sigmoid(double x)
{
    return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
}

double ft_dpo_loss(const ft_pref_options *o, int P, const double *pc, const double *pr,
                   const double *rc, const double *rr, const long *nc, const long *nr,
                   double *gc, double *gr, double *sums)
{
    double beta = o->beta, total = 0;
    for (int i = 0; i < P; i++) {
        double lc = pc[i] - rc[i], lr = pr[i] - rr[i], d = lc - lr, loss, g_c, g_r;
        switch (o->loss) {
        case FT_PREF_IPO: {
            double a = nc[i] > 0 ? (double)nc[i] : 1.0, b = nr[i] > 0 ? (double)nr[i] : 1.0;
            double u = lc / a - lr / b - 1.0 / (2.0 * beta);
            loss = u * u;
            g_c = 2.0 * u / a;
            g_r = -2.0 * u / b;
            break;
        }
        case FT_PREF_ROBUST: {
            double e = o->label_smoothing, k = 1.0 / (1.0 - 2.0 * e), x = beta * d;
            loss = (-(1.0 - e) * log_sigmoid(x) + e * log_sigmoid(-x)) * k;
            /* d/dx log sigmoid(x) = sigmoid(-x) */
            double dd = -beta * ((1.0 - e) * sigmoid(-x) + e * sigmoid(x)) * k;
            g_c = dd;
            g_r = -dd;
            break;
        }
        case FT_PREF_SIGMOID:
        default: {
            double x = beta * d;
            loss = -log_sigmoid(x);
            g_c = -beta * sigmoid(-x);
            g_r = -g_c;
            break;
        }
        }
        total += loss;
        if (gc)
            gc[i] = g_c;
        if (gr)
            gr[i] = g_r;
        if (sums) {
            double wc = beta * lc, wr = beta * lr;
            sums[FT_PREF_LOSS] += loss;
            sums[FT_PREF_REWARD_CHOSEN] += wc;
            sums[FT_PREF_REWARD_REJECTED] += wr;
            sums[FT_PREF_ACCURACY] += wc > wr ? 1.0 : 0.0;
            sums[FT_PREF_MARGIN] += wc - wr;
            sums[FT_PREF_LOGP_CHOSEN] += pc[i];
            sums[FT_PREF_LOGP_REJECTED] += pr[i];
            sums[FT_PREF_PAIRS] += 1.0;
        }
    }
    return total;
}

void ft_pref_objective_init(ft_pref_objective *p, const ft_pref_options *o, ft_model *ref)
{
    memset(p, 0, sizeof *p);
    p->o = *o;
    p->ref = ref;
}

/* The whole trainable buffer the forward reads (n elements): the compute copy, or on an
 * fp32 model bound without one the master itself; NULL when it is not whole here. */
static void *lora_compute(ft_model *m, size_t *n)
{
    float *master = ft_model_trainable(m, n), *c = ft_model_trainable_compute(m);
    return c ? c : ft_model_dtype(m) == FT_F32 ? master : NULL;
}

int ft_pref_objective_keep_adapter(ft_pref_objective *p, ft_model *m, ft_err *err)
{
    size_t n;
    const void *c = lora_compute(m, &n);
    if (!c || !n)
        return ft_fail(err, "a DPO reference adapter kept from the model needs its LoRA "
                            "weights whole and bound (the trainer keeps one through its "
                            "engine, ft_engine_keep_reference)");
    int dev = (int)ft_model_device(m);
    p->lora_bytes = n * (ft_model_dtype(m) == FT_BF16 ? 2 : 4);
    p->lora_model = m;
    p->ref_lora = ft_alloc_on(ft_model_mem(m), dev, FT_MEM_WEIGHTS, p->lora_bytes);
    p->own_lora = ft_alloc_on(ft_model_mem(m), dev, FT_MEM_WORKSPACE, p->lora_bytes);
    if (!p->ref_lora || !p->own_lora)
        return ft_mem_fail(err, ft_model_mem(m), dev, "the DPO reference adapter");
    return ft_copy_bytes(p->ref_lora, dev, c, dev, p->lora_bytes, err);
}

/* Puts the reference adapter in place of the policy's LoRA weights (in), or back. */
static int swap_adapter(ft_pref_objective *p, ft_model *m, bool in, ft_err *err)
{
    size_t n;
    void *c = lora_compute(m, &n);
    int dev = (int)ft_model_device(m);
    if (in)
        return ft_copy_bytes(p->own_lora, dev, c, dev, p->lora_bytes, err) ||
               ft_copy_bytes(c, dev, p->ref_lora, dev, p->lora_bytes, err);
    return ft_copy_bytes(c, dev, p->own_lora, dev, p->lora_bytes, err);
}

void ft_pref_objective_free(ft_pref_objective *p)
{
    if (p->lora_model) {
        int dev = (int)ft_model_device(p->lora_model);
        ft_free_on(ft_model_mem(p->lora_model), dev, p->ref_lora);
        ft_free_on(ft_model_mem(p->lora_model), dev, p->own_lora);
    }
    free(p->buf);
    free(p->scale);
    free(p->ntok);
    free(p->labels);
    free(p->split);
    memset(p, 0, sizeof *p);
}

static int reserve(ft_pref_objective *p, size_t rows, ft_err *err)
{
    if (rows <= p->cap)
        return 0;
    free(p->buf);
    free(p->scale);
    free(p->ntok);
    p->buf = malloc(6 * rows * sizeof *p->buf);
    p->scale = malloc(2 * rows * sizeof *p->scale);
    p->ntok = malloc(2 * rows * sizeof *p->ntok);
    p->cap = p->buf && p->scale && p->ntok ? rows : 0;
    return p->cap ? 0 : ft_fail(err, "out of memory");
}

static double count_pairs(void *ctx, const ft_batch *b)
{
    (void)ctx;
    return (double)(b->B / 2);
}

/* The GPipe chunks of R rows (dist_engine.c gpipe's split): *rows each, the last
 * smaller; returns their count (1: no split). */
static int chunk_rows(const ft_pref_objective *p, int R, int *rows)
{
    int k = p->chunks < R ? p->chunks : R;
    if (k <= 1) {
        *rows = R;
        return 1;
    }
    *rows = (R + k - 1) / k;
    return (R + *rows - 1) / *rows;
}

/* ft_model_forward_split over b's rows, chunk by chunk (pref.h chunks). */
static int pass_forward(ft_pref_objective *p, ft_model *m, const ft_batch *b,
                        const int32_t *split, double *pre, double *nll, ft_err *err)
{
    int rows, k = chunk_rows(p, b->B, &rows);
    if (k == 1)
        return ft_model_forward_split(m, b, split, pre, nll, err);
    for (int c = 0; c < k; c++) {
        size_t r0 = (size_t)c * (size_t)rows, off = r0 * (size_t)b->T;
        ft_batch ch = {c + 1 < k ? rows : b->B - c * rows, b->T, b->input_ids + off,
                       b->labels + off, NULL, NULL};
        ft_model_use_activation_slot(m, c);
        int rc = ft_model_forward_split(m, &ch, split ? split + r0 : NULL, pre ? pre + r0 : NULL,
                                        nll + r0, err);
        if (rc) {
            ft_model_use_activation_slot(m, 0);
            return ft_fail_prefix(err, "chunk %d forward", c);
        }
    }
    return 0;
}

/* ft_model_backward_split of the last pass_forward, its chunks in reverse order. */
static int pass_backward(ft_pref_objective *p, ft_model *m, int R, const int32_t *split,
                         const float *scale_pre, const float *scale, ft_err *err)
{
    int rows, k = chunk_rows(p, R, &rows);
    if (k == 1)
        return ft_model_backward_split(m, split, scale_pre, scale, err);
    int rc = 0;
    for (int c = k - 1; c >= 0 && rc == 0; c--) {
        size_t r0 = (size_t)c * (size_t)rows;
        ft_model_use_activation_slot(m, c);
        rc = ft_model_backward_split(m, split ? split + r0 : NULL,
                                     scale_pre ? scale_pre + r0 : NULL, scale + r0, err);
        if (rc)
            rc = ft_fail_prefix(err, "chunk %d backward", c);
    }
    ft_model_use_activation_slot(m, 0);
    return rc;
}

/* The sequences' log-probabilities under the policy (logp) and the reference (ref), and
 * each row's completion tokens (TRL's completion_mask sum, for ipo). */
static int forwards(ft_pref_objective *p, ft_model *m, const ft_batch *b, double *logp,
                    double *ref, ft_err *err)
{
    if (b->B % 2)
        return ft_fail(err, "a preference batch has an even number of rows (got %d)", b->B);
    size_t R = (size_t)b->B;
    for (size_t r = 0; r < R; r++) {
        long n = 0;
        for (int t = 0; t < b->T; t++)
            n += b->labels[r * (size_t)b->T + (size_t)t] != -100;
        p->ntok[r] = n;
    }
    int rc = 0;
    if (p->ref_free) {
        memset(ref, 0, R * sizeof *ref);
    } else if (p->ref) {
        rc = ft_model_forward_rows(p->ref, b, ref, err);
    } else if (p->use_ref || p->ref_lora) {
        /* the kept values in place (and with ref_lora_off the pairs off), then back */
        rc = p->use_ref ? p->use_ref(p->use_ref_ctx, true, err) : swap_adapter(p, m, true, err);
        if (rc == 0) {
            if (p->ref_lora_off)
                ft_model_set_lora(m, false);
            rc = pass_forward(p, m, b, NULL, NULL, ref, err);
            if (p->ref_lora_off)
                ft_model_set_lora(m, true);
            if (p->use_ref ? p->use_ref(p->use_ref_ctx, false, rc ? NULL : err)
                           : swap_adapter(p, m, false, rc ? NULL : err))
                rc = -1;
        }
    } else {
        rc = ft_model_set_adapter(m, false, err);
        if (rc == 0)
            rc = pass_forward(p, m, b, NULL, NULL, ref, err);
        ft_model_set_adapter(m, true, NULL);
    }
    if (rc)
        return ft_fail_prefix(err, "reference forward");
    if (pass_forward(p, m, b, NULL, NULL, logp, err))
        return -1;
    for (size_t r = 0; r < R; r++) { /* the sums were of -log p */
        logp[r] = -logp[r];
        ref[r] = -ref[r];
    }
    return 0;
}

static int run_pairs(void *ctx, ft_model *m, const ft_batch *b, double total, double *loss_sum,
                     ft_err *err)
{
    ft_pref_objective *p = ctx;
    size_t R = (size_t)b->B, P = R / 2;
    if (reserve(p, R, err))
        return -1;
    double *logp = p->buf, *ref = p->buf + R, *g = p->buf + 2 * R;
    if (forwards(p, m, b, logp, ref, err))
        return -1;
    *loss_sum = 0;
    memset(g, 0, R * sizeof *g);
    if (!p->no_loss)
        *loss_sum = ft_dpo_loss(&p->o, (int)P, logp, logp + P, ref, ref + P, p->ntok,
                                p->ntok + P, g, g + P, p->sums);
    /* row r's nll = -logp_r: the gradient of sum_r g_r logp_r / total is the
     * cross-entropy's with scale -g_r / total */
    for (size_t r = 0; r < R; r++)
        p->scale[r] = (float)(-g[r] / total);
    return pass_backward(p, m, b->B, NULL, NULL, p->scale, err);
}

/* ---- ORPO ---- */

/* log(1 - e^x) for x < 0, as TRL's log1mexp (branch at -log 2 against cancellation) */
static double log1mexp(double x) { return x < -M_LN2 ? log1p(-exp(x)) : log(-expm1(x)); }

static double count_micro(void *ctx, const ft_batch *b)
{
    (void)ctx, (void)b;
    return 1.0; /* ORPO's loss is a mean per micro-batch */
}

/* ORPO's forward of b: the labels with the prompts' tokens (up to each row's last
 * label), each row split where its completion starts; *nll the chosen rows' mean token
 * loss and lp[r] each row's mean completion log p. ntok[r] / ntok[R + r] get the
 * completion's / the prompt's counted tokens. */
static int orpo_forward(ft_pref_objective *p, ft_model *m, const ft_batch *b, double *lp,
                        double *nll, ft_err *err)
{
    if (b->B % 2)
        return ft_fail(err, "a preference batch has an even number of rows (got %d)", b->B);
    size_t R = (size_t)b->B, T = (size_t)b->T, n = R * T;
    if (n > p->label_cap) {
        free(p->labels);
        free(p->split);
        p->labels = malloc(n * sizeof *p->labels);
        p->split = malloc(R * T * sizeof *p->split); /* (R <= n) */
        p->label_cap = p->labels && p->split ? n : 0;
        if (!p->label_cap)
            return ft_fail(err, "out of memory");
    }
    for (size_t r = 0; r < R; r++) {
        const int32_t *lab = b->labels + r * T, *ids = b->input_ids + r * T;
        size_t f = T, last = 0;
        for (size_t t = 0; t < T; t++)
            if (lab[t] != -100) {
                f = f < t ? f : t;
                last = t;
            }
        if (f == T || f == 0)
            return ft_fail(err, "row %zu: ORPO needs a prompt and a completion", r);
        for (size_t t = 0; t < T; t++)
            p->labels[r * T + t] = t <= last ? ids[t] : -100;
        p->split[r] = (int32_t)(f - 1); /* target f - 1 predicts the first completion token */
        p->ntok[r] = (long)(last - f + 1);
        p->ntok[R + r] = (long)(f - 1);
    }
    ft_batch full = {b->B, b->T, b->input_ids, p->labels, NULL, NULL};
    double *pre = p->buf + 3 * R, *comp = p->buf + 4 * R;
    if (pass_forward(p, m, &full, p->split, pre, comp, err))
        return -1;
    double sum = 0, tok = 0;
    for (size_t r = 0; r < R; r++) {
        lp[r] = -comp[r] / (double)p->ntok[r];
        if (r < R / 2) {
            sum += pre[r] + comp[r];
            tok += (double)(p->ntok[r] + p->ntok[R + r]);
        }
    }
    *nll = sum / tok;
    p->orpo_tok = tok;
    return 0;
}

/* The loss of P pairs from lp (and nll); g (NULL: not wanted) gets d loss / d lp. */
static double orpo_loss(const ft_pref_objective *p, size_t P, const double *lp, double nll,
                        double *g, double *sums)
{
    double beta = p->o.beta, ratio_sum = 0;
    for (size_t i = 0; i < P; i++) {
        double lc = lp[i], lr = lp[P + i];
        double o = (lc - lr) - (log1mexp(lc) - log1mexp(lr));
        double ratio = log_sigmoid(o);
        ratio_sum += ratio;
        if (g) { /* d(-beta mean ratio)/do = -beta sigmoid(-o) / P; do/dlc = 1 / (1 - e^lc) */
            double go = -beta * sigmoid(-o) / (double)P;
            g[i] = go / -expm1(lc);
            g[P + i] = -go / -expm1(lr);
        }
        if (sums) {
            sums[FT_PREF_REWARD_CHOSEN] += beta * lc;
            sums[FT_PREF_REWARD_REJECTED] += beta * lr;
            sums[FT_PREF_ACCURACY] += beta * lc > beta * lr ? 1.0 : 0.0;
            sums[FT_PREF_MARGIN] += beta * lc - beta * lr;
            sums[FT_PREF_LOGP_CHOSEN] += lc;
            sums[FT_PREF_LOGP_REJECTED] += lr;
            sums[FT_PREF_LOG_ODDS_RATIO] += ratio;
            sums[FT_PREF_LOG_ODDS_CHOSEN] += o;
            sums[FT_PREF_PAIRS] += 1.0;
        }
    }
    double loss = nll - beta * ratio_sum / (double)P;
    if (sums) { /* the micro-batch's means, weighted by its pairs */
        sums[FT_PREF_LOSS] += loss * (double)P;
        sums[FT_PREF_NLL] += nll * (double)P;
    }
    return loss;
}

static int run_orpo(void *ctx, ft_model *m, const ft_batch *b, double total, double *loss_sum,
                    ft_err *err)
{
    ft_pref_objective *p = ctx;
    size_t R = (size_t)b->B, P = R / 2;
    if (reserve(p, R, err))
        return -1;
    double *lp = p->buf, *g = p->buf + R, nll;
    if (orpo_forward(p, m, b, lp, &nll, err))
        return -1;
    /* (a stage without the head: no log-probability, nothing to add; its scales are
     * unread) */
    *loss_sum = p->no_loss ? 0 : orpo_loss(p, P, lp, nll, g, p->sums);
    /* row r's completion nll = -ntok lp: d/d nll = -g / ntok; the chosen rows' prompt and
     * completion tokens also carry the NLL term's 1 / tokens */
    float *sc = p->scale, *sp = p->scale + R;
    for (size_t r = 0; r < R; r++) {
        double t = r < P ? 1.0 / p->orpo_tok : 0.0;
        sc[r] = p->no_loss ? 0.0f : (float)((t - g[r] / (double)p->ntok[r]) / total);
        sp[r] = p->no_loss ? 0.0f : (float)(t / total);
    }
    return pass_backward(p, m, b->B, p->split, sp, sc, err);
}

ft_objective ft_pref_objective_of(ft_pref_objective *p)
{
    if (p->o.loss == FT_PREF_ORPO)
        return (ft_objective){.ctx = p, .count = count_micro, .run = run_orpo};
    return (ft_objective){.ctx = p, .count = count_pairs, .run = run_pairs};
}

int ft_pref_eval_batch(ft_pref_objective *p, ft_model *m, const ft_batch *b, double *sums,
                       ft_err *err)
{
    size_t R = (size_t)b->B, P = R / 2;
    if (reserve(p, R, err))
        return -1;
    /* evaluation keeps no activation for a backward: whole micro-batches, no chunks */
    int chunks = p->chunks;
    p->chunks = 1;
    int rc;
    if (p->o.loss == FT_PREF_ORPO) {
        double nll;
        rc = orpo_forward(p, m, b, p->buf, &nll, err);
        p->chunks = chunks;
        if (rc == 0 && !p->no_loss)
            orpo_loss(p, P, p->buf, nll, NULL, sums);
        return rc;
    }
    double *logp = p->buf, *ref = p->buf + R;
    rc = forwards(p, m, b, logp, ref, err);
    p->chunks = chunks;
    if (rc || p->no_loss)
        return rc;
    ft_dpo_loss(&p->o, (int)P, logp, logp + P, ref, ref + P, p->ntok, p->ntok + P, NULL, NULL,
                sums);
    return 0;
}
