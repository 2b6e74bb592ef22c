/* The tied pair of LoRA on a tied model's embedding and head under ensure_weight_tying
 * (lib/model/tied_lora.c) on a strategy that splits the optimizer's range or stages:
 * zero1-3, fsdp, model_parallel, and an offloaded optimizer.
 *
 * One process steps the one storage twice: x1 = AdamW_embedding(x0), then
 * x2 = x1 (1 - lr wd) - u_head, the head's AdamW update with its own moment state. Here
 * each rank's optimizer updates the elements it owns, with their moment states: the
 * embedding pair's owner makes x1, the head pair's owner (its fp32 masters zeroed before
 * the step, as on one process) -u_head. Then one sum over the ranks of a buffer holding
 * each owner's part of x1 and of -u_head (zeros elsewhere: the sum is exact) gives every
 * rank both whole, each rank folds x2 = x1 (1 - lr wd) + (-u_head)^T in the embedding's
 * layout (the same fp32 operations as one process), and writes x2 back to the elements of
 * both pairs it owns (the head's transposed). The pair is small (r x (vocab + hidden)).
 *
 * At setup the embedding's pair is the head's transposed (PEFT's init and its loading,
 * where the head's keys come last: ft_model_tied_lora_sync on one replica). */
#include "dist/dist_engine_internal.h"

int tied_setup(ft_engine *e, ft_err *err)
{
    (void)err;
    ft_tied_pair p[2];
    bool whole_step = (e->o.strategy == FT_STRATEGY_NONE || e->o.strategy == FT_STRATEGY_DDP) &&
                      !e->o.offload_optimizer;
    if (whole_step || !ft_model_tied_lora_layout(e->m, p))
        return 0; /* (ddp, one process: the model brackets its own step) */
    e->tied[0] = p[0];
    e->tied[1] = p[1];
    e->tied_pairs = true;
    return 0;
}

void tied_zero_heads(ft_engine *e, float *params, ft_device dev)
{
    if (!e->tied_pairs)
        return;
    for (int i = 0; i < 2; i++) {
        size_t a = e->tied[i].head, n = (size_t)(e->tied[i].rows * e->tied[i].cols);
        size_t len = overlap_len(a, a + n, e->opt_begin, e->opt_end);
        size_t b = a > e->opt_begin ? a : e->opt_begin;
        if (len)
            ft_zero(ft_view(params + (b - e->opt_begin), len, FT_F32, dev), len);
    }
}

/* fold: after the step (owned fp32 masters at params, flat [opt_begin, opt_end)); else
 * the setup's sync of the embedding's pair from the head's, written to the elements this
 * rank holds: flat [lo, hi) at buf. */
static int exchange(ft_engine *e, bool fold, float *params, float *buf, size_t lo, size_t hi,
                    float keep, ft_err *err)
{
    size_t nmax = 0;
    for (int i = 0; i < 2; i++) {
        size_t n = (size_t)(e->tied[i].rows * e->tied[i].cols);
        nmax = n > nmax ? n : nmax;
    }
    ft_mem scratch = {0}; /* a moment's buffer, beside the tracked ones */
    float *x = ft_alloc_on(&scratch, e->dev, FT_MEM_WORKSPACE, 3 * nmax * sizeof *x);
    if (!x)
        return ft_mem_fail(err, &scratch, e->dev, "the tied LoRA pair's exchange");
    bool split = !(e->opt_begin == 0 && e->opt_end == e->n_train);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        const ft_tied_pair *p = &e->tied[i];
        size_t n = (size_t)(p->rows * p->cols);
        float *xe = x, *xh = x + n, *t = x + 2 * n; /* [rows, cols], [cols, rows], [rows, cols] */
        engine_zero(e, x, 2 * n);
        size_t es = sizeof(float);
        rc = engine_copy_overlap(e, xe, e->dev, p->embed, p->embed + n, params, e->opt_begin,
                                 e->opt_end, es, err);
        if (rc == 0)
            rc = engine_copy_overlap(e, xh, e->dev, p->head, p->head + n, params, e->opt_begin,
                                     e->opt_end, es, err);
        if (rc == 0 && split)
            rc = ft_comm_allreduce(e->comm, x, 2 * n, FT_COMM_F32, FT_COMM_SUM, err);
        if (rc)
            break;
        if (fold) {
            ft_model_transpose_f32(e->m, t, xh, p->rows, p->cols);
            if (keep != 1.0f)
                ft_scale(ft_view(xe, n, FT_F32, e->dev), keep, n);
            engine_add(e, xe, t, n);
            ft_model_transpose_f32(e->m, xh, xe, p->cols, p->rows);
        } else {
            ft_model_transpose_f32(e->m, xe, xh, p->rows, p->cols);
        }
        rc = engine_copy_overlap(e, buf, e->dev, lo, hi, xe, p->embed, p->embed + n, es, err);
        if (rc == 0)
            rc = engine_copy_overlap(e, buf, e->dev, lo, hi, xh, p->head, p->head + n, es, err);
    }
    ft_free_on(&scratch, e->dev, x);
    return rc;
}

int tied_after_step(ft_engine *e, float *params, float lr, ft_err *err)
{
    if (!e->tied_pairs)
        return 0;
    float keep = 1.0f - lr * e->opt.hp.weight_decay; /* (the AdamW kernels' factor) */
    return exchange(e, true, params, params, e->opt_begin, e->opt_end, keep, err);
}

int tied_setup_sync(ft_engine *e, float *params, float *held, size_t lo, size_t hi,
                    ft_err *err)
{
    if (!e->tied_pairs)
        return 0;
    return exchange(e, false, params, held, lo, hi, 1.0f, err);
}
