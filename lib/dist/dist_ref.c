/* DPO's reference adapter under every dist.strategy (dist_engine.h
 * ft_engine_keep_reference): the compute copies of the trainables this rank stores, kept
 * as they are at the start, put in place of the policy's for the reference forward and
 * back. What the forward reads: the model's own replica (none, ddp, zero1), train_c
 * (zero2: whole on every rank; model_parallel: the stage's, and a tied embedding's copy
 * on the last stage), shard_train_c (zero3, fsdp: this rank's shard, gathered unit by
 * unit into the parameter windows, which are emptied on each swap so the next forward
 * gathers the swapped values). */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_engine_internal.h"

enum { MAX_SPANS = 3 };

struct engine_ref {
    void *keep[MAX_SPANS], *own[MAX_SPANS];
    size_t bytes[MAX_SPANS];
    int n;
};

/* The compute-dtype buffers the forward reads of this rank's trainables. */
static int spans(ft_engine *e, void **p, size_t *bytes)
{
    int k = 0;
    size_t own = e->opt_end - e->opt_begin;
    if (e->whole) {
        float *c = ft_model_trainable_compute(e->m);
        p[k] = c ? (void *)c : (void *)e->train;
        bytes[k++] = e->n_train * e->cesize;
    } else if (e->shard_train_c) {
        p[k] = e->shard_train_c;
        bytes[k++] = own * e->cesize;
    } else if (e->train_c) {
        p[k] = e->train_c;
        bytes[k++] = (e->o.strategy == FT_STRATEGY_PIPELINE ? own : e->n_train) * e->cesize;
    }
    if (e->tied_train_c) {
        p[k] = e->tied_train_c;
        bytes[k++] = (e->ub[1] - e->ub[0]) * e->cesize;
    }
    return k;
}

int ft_engine_keep_reference(ft_engine *e, ft_err *err)
{
    if (e->ref)
        return ft_fail(err, "the reference adapter is kept already");
    struct engine_ref *r = calloc(1, sizeof *r);
    if (!r)
        return ft_fail(err, "out of memory");
    e->ref = r;
    void *p[MAX_SPANS];
    r->n = spans(e, p, r->bytes);
    for (int i = 0; i < r->n; i++) {
        if (!r->bytes[i])
            continue;
        r->keep[i] = ft_alloc_on(e->mem, e->dev, FT_MEM_WEIGHTS, r->bytes[i]);
        r->own[i] = ft_alloc_on(e->mem, e->dev, FT_MEM_WORKSPACE, r->bytes[i]);
        if (!r->keep[i] || !r->own[i])
            return ft_mem_fail(err, e->mem, e->dev, "the DPO reference adapter");
        if (ft_copy_bytes(r->keep[i], e->dev, p[i], e->dev, r->bytes[i], err))
            return -1;
    }
    return 0;
}

int ft_engine_use_reference(ft_engine *e, bool on, ft_err *err)
{
    struct engine_ref *r = e->ref;
    if (!r)
        return ft_fail(err, "no reference adapter kept");
    void *p[MAX_SPANS];
    size_t bytes[MAX_SPANS];
    spans(e, p, bytes);
    if (e->shard_train_c)
        dp_invalidate(e); /* windows gathered from the other values */
    for (int i = 0; i < r->n; i++) {
        if (!r->bytes[i])
            continue;
        if (on ? ft_copy_bytes(r->own[i], e->dev, p[i], e->dev, r->bytes[i], err) ||
                     ft_copy_bytes(p[i], e->dev, r->keep[i], e->dev, r->bytes[i], err)
               : ft_copy_bytes(p[i], e->dev, r->own[i], e->dev, r->bytes[i], err))
            return -1;
    }
    return 0;
}

void engine_ref_free(ft_engine *e)
{
    struct engine_ref *r = e->ref;
    if (!r)
        return;
    for (int i = 0; i < r->n; i++) {
        ft_free_on(e->mem, e->dev, r->keep[i]);
        ft_free_on(e->mem, e->dev, r->own[i]);
    }
    free(r);
    e->ref = NULL;
}
