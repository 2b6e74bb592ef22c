/* DPO's reference adapter under every dist.strategy (dist_engine.h
 * ft_engine_keep_reference): the compute copies of the trainables this rank stores (or
 * only those of the embedding's and the head's units), kept as they are at the start, put
 * in place of the policy's for the reference forward and back. What the forward reads:
 * the model's own replica (none, ddp, zero1), train_c (zero2: whole on every rank;
 * model_parallel: the stage's, and a tied embedding's copy on the last stage),
 * shard_train_c (zero3, fsdp: this rank's shard, gathered unit by
 * unit into the parameter windows, which are emptied on each swap so the next forward
 * gathers the swapped values). */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_engine_internal.h"

/* (at most three buffers a rank's forward reads, each cut by at most two kept ranges) */
enum { MAX_BUFS = 3, MAX_SPANS = 2 * MAX_BUFS };

struct engine_ref {
    bool outer; /* only the embedding's and the head's units (ft_engine_keep_reference) */
    void *keep[MAX_SPANS], *own[MAX_SPANS];
    size_t bytes[MAX_SPANS];
    int n;
};

/* The compute-dtype buffers the forward reads of this rank's trainables, each with the
 * range of the flat trainable buffer it holds, [lo[i], hi[i]). */
static int buffers(ft_engine *e, void **p, size_t *lo, size_t *hi)
{
    int k = 0;
    if (e->whole) {
        float *c = ft_model_trainable_compute(e->m);
        p[k] = c ? (void *)c : (void *)e->train;
        lo[k] = 0, hi[k++] = e->n_train;
    } else if (e->shard_train_c) {
        p[k] = e->shard_train_c;
        lo[k] = e->opt_begin, hi[k++] = e->opt_end;
    } else if (e->train_c) {
        bool stage = e->o.strategy == FT_STRATEGY_PIPELINE;
        p[k] = e->train_c;
        lo[k] = stage ? e->opt_begin : 0, hi[k++] = stage ? e->opt_end : e->n_train;
    }
    if (e->tied_train_c) { /* (a copy of the embedding's unit) */
        p[k] = e->tied_train_c;
        lo[k] = e->ub[0], hi[k++] = e->ub[1];
    }
    return k;
}

/* The kept spans: each buffer's part of the kept ranges (every trainable, or with outer
 * the first unit's and the last one's), as pointers into it and byte counts. */
static int spans(ft_engine *e, bool outer, void **p, size_t *bytes)
{
    void *buf[MAX_BUFS];
    size_t lo[MAX_BUFS], hi[MAX_BUFS];
    int nb = buffers(e, buf, lo, hi), k = 0;
    size_t want[2][2] = {{0, e->n_train}, {0, 0}};
    if (outer) {
        want[0][1] = e->ub[1];
        want[1][0] = e->ub[e->n_units - 1], want[1][1] = e->ub[e->n_units];
    }
    for (int b = 0; b < nb; b++)
        for (int w = 0; w < 2; w++) {
            size_t n = overlap_len(lo[b], hi[b], want[w][0], want[w][1]);
            if (!n)
                continue;
            size_t first = lo[b] > want[w][0] ? lo[b] : want[w][0];
            p[k] = engine_at(e, buf[b], first - lo[b]);
            bytes[k++] = n * e->cesize;
        }
    return k;
}

int ft_engine_keep_reference(ft_engine *e, bool outer, ft_err *err)
{
    if (e->ref)
        return ft_fail(err, "the reference adapter is kept already");
    struct engine_ref *r = calloc(1, sizeof *r);
    if (!r)
        return ft_fail(err, "out of memory");
    e->ref = r;
    r->outer = outer;
    void *p[MAX_SPANS];
    r->n = spans(e, outer, p, r->bytes);
    for (int i = 0; i < r->n; i++) {
        r->keep[i] = ft_alloc_on(e->mem, e->dev, FT_MEM_WEIGHTS, r->bytes[i]);
        r->own[i] = ft_alloc_on(e->mem, e->dev, FT_MEM_WORKSPACE, r->bytes[i]);
        if (!r->keep[i] || !r->own[i])
            return ft_mem_fail(err, e->mem, e->dev, "the DPO reference %s",
                               outer ? "embedding / head" : "adapter");
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
    spans(e, r->outer, p, bytes);
    if (e->shard_train_c)
        dp_invalidate(e); /* windows gathered from the other values */
    for (int i = 0; i < r->n; i++) {
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
