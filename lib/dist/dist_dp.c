/* Data-parallel strategies of ft_engine: DDP buckets, ZeRO-1/2/3 (and FSDP) shards,
 * windows and hooks (see dist_engine.h for what each keeps and sends). */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_engine_internal.h"

static bool is_z3(const ft_engine *e)
{
    return e->o.strategy == FT_STRATEGY_ZERO3 || e->o.strategy == FT_STRATEGY_FSDP;
}

static bool is_zero(const ft_engine *e)
{
    return e->o.strategy == FT_STRATEGY_ZERO1 || e->o.strategy == FT_STRATEGY_ZERO2 || is_z3(e);
}

/* ddp and zero1 keep a whole gradient and reduce it in buckets. */
static bool uses_buckets(const ft_engine *e)
{
    return e->o.strategy == FT_STRATEGY_DDP || e->o.strategy == FT_STRATEGY_ZERO1 ||
           e->o.strategy == FT_STRATEGY_NONE;
}

static size_t unit_train(const ft_engine *e, int u) { return e->ub[u + 1] - e->ub[u]; }
static size_t unit_frozen(const ft_engine *e, int u) { return e->fb[u + 1] - e->fb[u]; }

/* counts[r] = elements of [b, e) in rank r's range of bounds. */
static void range_counts(const ft_engine *e, const size_t *bounds, size_t b, size_t end,
                         size_t *counts)
{
    for (int r = 0; r < e->world; r++)
        counts[r] = overlap_len(b, end, bounds[r], bounds[r + 1]);
}

/* ---- zero2 / zero3 gradient windows ---- */

static int gw_wait(ft_engine *e, grad_window *g, ft_err *err)
{
    if (!g->req)
        return 0;
    int rc = ft_comm_wait(e->comm, g->req, err);
    g->req = NULL;
    if (rc)
        return -1;
    engine_add(e, g->dst, g->land, g->n);
    return 0;
}

static int gw_take(ft_engine *e, int unit, ft_err *err)
{
    int idx = e->next_gw;
    e->next_gw ^= 1;
    grad_window *g = &e->gw[idx];
    if (gw_wait(e, g, err))
        return -1;
    engine_zero(e, g->grad, unit_train(e, unit));
    e->unit_gw[unit] = idx;
    return idx;
}

/* Reduce-scatters unit's gradient window into the shard gradient (added on completion). */
static int gw_launch(ft_engine *e, int unit, ft_err *err)
{
    grad_window *g = &e->gw[e->unit_gw[unit]];
    e->unit_gw[unit] = -1;
    size_t b = e->ub[unit], end = e->ub[unit + 1], mine = e->own[e->rank];
    range_counts(e, e->own, b, end, g->counts);
    g->n = g->counts[e->rank];
    g->dst = e->shard_grad + ((b > mine ? b : mine) - mine);
    if (ft_comm_ireduce_scatter_v(e->comm, g->grad, g->land, g->counts, FT_COMM_F32, FT_COMM_SUM,
                                  &g->req, err))
        return -1;
    return e->o.overlap_comm ? 0 : gw_wait(e, g, err);
}

/* ---- zero3 parameter windows ---- */

static int pw_wait(ft_engine *e, param_window *w, ft_err *err)
{
    int rc = qs_wait(e, w, err);
    if (w->req_t)
        rc |= ft_comm_wait(e->comm, w->req_t, err);
    if (w->req_f)
        rc |= ft_comm_wait(e->comm, w->req_f, err);
    w->req_t = w->req_f = NULL;
    return rc ? -1 : 0;
}

static param_window *pw_find(ft_engine *e, int unit)
{
    for (int i = 0; i < e->n_pw; i++)
        if (e->pw[i].unit == unit)
            return &e->pw[i];
    return NULL;
}

/* Starts gathering unit into the least recently used free window. */
static param_window *pw_gather(ft_engine *e, int unit, ft_err *err)
{
    param_window *w = NULL;
    for (int i = 0; i < e->n_pw; i++) {
        param_window *c = &e->pw[i];
        if (c->refs == 0 && (!w || c->unit < 0 || (w->unit >= 0 && c->last_use < w->last_use)))
            w = c;
    }
    if (!w) {
        ft_fail(err, "zero3: every parameter window is in use (unit %d)", unit);
        return NULL;
    }
    if (pw_wait(e, w, err))
        return NULL;
    qs_forget(e, w->unit); /* its quantized arrays are about to be overwritten */
    w->unit = unit;
    w->last_use = ++e->use_clock;
    int me = e->rank;
    if (unit_train(e, unit)) {
        size_t b = e->ub[unit], mine = e->own[me];
        range_counts(e, e->own, b, e->ub[unit + 1], w->counts_t);
        /* the compute copies travel: what the window's ops read */
        const float *send = engine_at(e, e->shard_train_c, (b > mine ? b : mine) - mine);
        if (ft_comm_iallgather_v(e->comm, send, w->train, w->counts_t, e->ccomm, &w->req_t,
                                 err))
            return NULL;
    }
    if (unit_frozen(e, unit)) {
        size_t b = e->fb[unit], mine = e->fshard[me];
        range_counts(e, e->fshard, b, e->fb[unit + 1], w->counts_f);
        const float *send = engine_at(e, e->shard_frozen, (b > mine ? b : mine) - mine);
        if (e->o.offload_params) {
            /* from the host into this rank's place in the window, gathered in place */
            size_t disp = 0;
            for (int r = 0; r < me; r++)
                disp += w->counts_f[r];
            float *at = engine_at(e, w->frozen, disp);
            if (w->counts_f[me] && ft_copy_bytes(at, e->dev, send, FT_DEV_CPU,
                                                 w->counts_f[me] * e->cesize, err))
                return NULL;
            send = at;
        }
        if (ft_comm_iallgather_v(e->comm, send, w->frozen, w->counts_f, e->ccomm, &w->req_f,
                                 err))
            return NULL;
    }
    if (qs_gather(e, w, unit, err))
        return NULL;
    return w;
}

static int prefetch(ft_engine *e, int unit, ft_err *err)
{
    if (!e->o.prefetch || unit < 0 || unit >= e->n_units || pw_find(e, unit))
        return 0;
    return pw_gather(e, unit, err) ? 0 : -1;
}

/* ---- hooks ---- */

static int dp_acquire(void *ctx, int unit, ft_unit_phase ph, ft_err *err)
{
    ft_engine *e = ctx;
    bool bwd = ph == FT_UNIT_BACKWARD && unit_train(e, unit) > 0;
    if (e->o.strategy == FT_STRATEGY_ZERO2 && bwd) {
        int g = gw_take(e, unit, err);
        if (g < 0)
            return -1;
        ft_unit_bufs b = {e->train + e->ub[unit], engine_at(e, e->train_c, e->ub[unit]),
                          e->gw[g].grad, engine_at(e, e->frozen, e->fb[unit])};
        ft_model_bind_unit(e->m, unit, b);
        return 0;
    }
    if (!is_z3(e))
        return 0;
    param_window *w = pw_find(e, unit);
    if (!w && !(w = pw_gather(e, unit, err)))
        return -1;
    w->refs++;
    w->last_use = ++e->use_clock;
    if (pw_wait(e, w, err))
        return -1;
    qs_lend(e, w); /* the model dequantizes the unit's gathered blocks */
    float *grad = NULL;
    if (bwd) {
        int g = gw_take(e, unit, err);
        if (g < 0)
            return -1;
        grad = e->gw[g].grad;
    }
    /* the window holds compute copies only: no fp32 master is bound */
    ft_model_bind_unit(e->m, unit, (ft_unit_bufs){NULL, w->train, grad, w->frozen});
    /* the next unit in this pass: forward goes up, backward down (unit 0 only when it
     * has a gradient: the embedding backward of full fine-tuning) */
    int next = ph == FT_UNIT_FORWARD ? unit + 1 : unit - 1;
    if (ph == FT_UNIT_BACKWARD && next == 0 && unit_train(e, 0) == 0)
        next = -1;
    return prefetch(e, next, err);
}

static int launch_bucket(ft_engine *e, bucket *b, ft_err *err)
{
    size_t n = b->end - b->begin;
    if (e->o.strategy == FT_STRATEGY_ZERO1) {
        size_t mine = e->own[e->rank];
        range_counts(e, e->own, b->begin, b->end, b->counts);
        float *dst = e->shard_grad + ((b->begin > mine ? b->begin : mine) - mine);
        if (ft_comm_ireduce_scatter_v(e->comm, e->grad + b->begin, dst, b->counts, FT_COMM_F32,
                                      FT_COMM_SUM, &b->req, err))
            return -1;
    } else if (ft_comm_iallreduce(e->comm, e->grad + b->begin, n, FT_COMM_F32, FT_COMM_SUM,
                                  &b->req, err)) {
        return -1;
    }
    if (e->o.overlap_comm)
        return 0;
    int rc = ft_comm_wait(e->comm, b->req, err);
    b->req = NULL;
    return rc;
}

static int dp_release(void *ctx, int unit, ft_unit_phase ph, bool grads_final, ft_err *err)
{
    ft_engine *e = ctx;
    bool bwd = ph == FT_UNIT_BACKWARD;
    if (is_z3(e)) {
        param_window *w = pw_find(e, unit);
        if (w && w->refs > 0)
            w->refs--;
    }
    if (bwd && e->unit_gw && e->unit_gw[unit] >= 0)
        return gw_launch(e, unit, err);
    /* one ddp rank holds the whole sum already; zero1's shard gradient is filled by the
     * reduce-scatter even on one rank (a copy there) */
    if (bwd && grads_final && e->sync && e->buckets && unit_train(e, unit) > 0 &&
        (e->world > 1 || e->o.strategy == FT_STRATEGY_ZERO1)) {
        bucket *b = &e->buckets[e->unit_bucket[unit]];
        if (--b->units_left == 0)
            return launch_bucket(e, b, err);
    }
    return 0;
}

/* ---- setup ---- */

/* Buckets of consecutive units, filled from the last unit down (backward's order), each
 * up to bucket_bytes (a unit larger than that is a bucket of its own). */
static int make_buckets(ft_engine *e)
{
    e->unit_bucket = calloc((size_t)e->n_units, sizeof *e->unit_bucket);
    e->buckets = calloc((size_t)e->n_units, sizeof *e->buckets);
    if (!e->unit_bucket || !e->buckets)
        return -1;
    size_t cap = e->o.bucket_bytes / sizeof(float);
    int nb = 0;
    for (int u = e->n_units - 1; u >= 0; u--) {
        size_t n = unit_train(e, u);
        bucket *b = nb ? &e->buckets[nb - 1] : NULL;
        if (!b || (b->end - b->begin > 0 && b->end - b->begin + n > cap)) {
            b = &e->buckets[nb++];
            b->begin = b->end = e->ub[u + 1];
            if (!(b->counts = calloc((size_t)e->world, sizeof *b->counts)))
                return -1;
        }
        b->begin = e->ub[u];
        e->unit_bucket[u] = nb - 1;
        if (n)
            b->units++;
    }
    e->n_buckets = nb;
    return 0;
}

void dp_bind(ft_engine *e)
{
    if (e->whole)
        return; /* the model's own buffers */
    if (is_z3(e))
        ft_model_bind_all(e->m, (ft_unit_bufs){0});
    else
        ft_model_bind_all(e->m, (ft_unit_bufs){e->train, e->train_c, e->grad, e->frozen});
}

void dp_invalidate(ft_engine *e)
{
    ft_err ignored;
    for (int i = 0; i < e->n_pw; i++) {
        pw_wait(e, &e->pw[i], &ignored);
        qs_forget(e, e->pw[i].unit);
        e->pw[i].unit = -1;
        e->pw[i].refs = 0;
    }
}

static void balanced(size_t *bounds, int world, size_t n)
{
    for (int r = 0; r <= world; r++)
        bounds[r] = (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)world);
}

/* Reads every unit's weights into the engine's buffers (ft_model_init_unit): in place
 * (zero2), or for zero3 one unit at a time into window 0, whose owned slices go to the
 * shards. Window 0 holds compute copies, so with split_compute the fp32 masters are read
 * into a stage of their own. The compute copies follow (engine_refresh_compute). */
static int init_units(ft_engine *e, const char *adapter_dir, ft_err *err)
{
    if (!is_z3(e)) {
        for (int u = 0; u < e->n_units; u++) {
            ft_unit_bufs b = {e->train ? e->train + e->ub[u] : NULL, NULL, NULL,
                              engine_at(e, e->frozen, e->fb[u])};
            ft_model_bind_unit(e->m, u, b);
            if (ft_model_init_unit(e->m, u, adapter_dir, err))
                return -1;
        }
        return 0;
    }
    int me = e->rank;
    param_window *w = &e->pw[0];
    bool oom = false;
    float *stage = e->split_compute
                       ? engine_alloc(e, FT_MEM_WORKSPACE, e->max_unit_train, false, &oom)
                       : w->train;
    if (oom)
        return ft_mem_fail(err, e->mem, e->dev, "the fp32 staging unit of rank %d", me);
    int rc = 0;
    for (int u = 0; u < e->n_units && rc == 0; u++) {
        ft_model_bind_unit(e->m, u, (ft_unit_bufs){stage, NULL, NULL, w->frozen});
        rc = ft_model_init_unit(e->m, u, adapter_dir, err);
        if (rc == 0)
            rc = engine_copy_overlap(e, e->shard_train, e->dev, e->own[me], e->own[me + 1], stage,
                              e->ub[u], e->ub[u + 1], sizeof(float), err);
        if (rc == 0)
            rc = engine_copy_overlap(e, e->shard_frozen, engine_param_dev(e), e->fshard[me],
                              e->fshard[me + 1], w->frozen, e->fb[u], e->fb[u + 1], e->cesize,
                              err);
        if (rc == 0) /* a quantized base: this rank's blocks kept, the rest freed */
            rc = qs_take_unit(e, u, err);
    }
    if (stage != w->train)
        ft_free_on(e->mem, e->dev, stage);
    return rc;
}

int dp_setup(ft_engine *e, const char *adapter_dir, ft_err *err)
{
    int W = e->world, me = e->rank;
    bool oom = false;
    e->own = calloc((size_t)W + 1, sizeof *e->own);
    e->fshard = calloc((size_t)W + 1, sizeof *e->fshard);
    e->unit_gw = malloc((size_t)e->n_units * sizeof *e->unit_gw);
    if (!e->own || !e->fshard || !e->unit_gw)
        return ft_fail(err, "out of memory");
    for (int u = 0; u < e->n_units; u++) {
        e->unit_gw[u] = -1;
        if (unit_train(e, u) > e->max_unit_train)
            e->max_unit_train = unit_train(e, u);
        if (unit_frozen(e, u) > e->max_unit_frozen)
            e->max_unit_frozen = unit_frozen(e, u);
    }
    if (is_zero(e)) {
        balanced(e->own, W, e->n_train);
        balanced(e->fshard, W, e->n_frozen);
        e->opt_begin = e->own[me];
        e->opt_end = e->own[me + 1];
    } else {
        /* every rank updates the whole buffer; rank 0's copy is the one saved */
        for (int r = 1; r <= W; r++)
            e->own[r] = e->n_train;
        e->opt_begin = 0;
        e->opt_end = e->n_train;
    }
    size_t n_own = e->opt_end - e->opt_begin;
    if (is_z3(e)) {
        e->shard_train = engine_alloc(e, FT_MEM_WEIGHTS, n_own, false, &oom);
        e->shard_train_c = engine_compute_copy(e, e->shard_train, n_own, &oom);
        size_t nf = e->fshard[me + 1] - e->fshard[me];
        if (e->o.offload_params && nf) {
            e->shard_frozen = ft_alloc(&e->host, FT_MEM_WEIGHTS, nf * e->cesize);
            oom |= !e->shard_frozen;
            if (e->shard_frozen && engine_pin_params(e, e->shard_frozen, nf * e->cesize, err)) {
                ft_free(&e->host, e->shard_frozen);
                e->shard_frozen = NULL;
                return -1;
            }
        } else {
            e->shard_frozen = engine_alloc(e, FT_MEM_WEIGHTS, nf, true, &oom);
        }
        if (qs_setup(e, err))
            return -1;
        /* the unit computing, the next one prefetched, and a tied embedding */
        e->n_pw = 2 + (ft_model_cfg(e->m)->tie_word_embeddings ? 1 : 0);
        e->pw = calloc((size_t)e->n_pw, sizeof *e->pw);
        if (!e->pw)
            return ft_fail(err, "out of memory");
        for (int i = 0; i < e->n_pw; i++) {
            param_window *w = &e->pw[i];
            w->unit = -1;
            w->train = engine_alloc(e, FT_MEM_WORKSPACE, e->max_unit_train, true, &oom);
            w->frozen = engine_alloc(e, FT_MEM_WORKSPACE, e->max_unit_frozen, true, &oom);
            w->counts_t = calloc((size_t)W, sizeof(size_t));
            w->counts_f = calloc((size_t)W, sizeof(size_t));
            oom |= !w->counts_t || !w->counts_f;
            if (e->max_qwin) {
                w->quant = ft_alloc_on(e->mem, e->dev, FT_MEM_WORKSPACE, e->max_qwin);
                w->req_q = calloc((size_t)e->max_q_arrays, sizeof *w->req_q);
                oom |= !w->quant || !w->req_q;
            }
        }
    } else if (e->whole) {
        /* the model's whole replica, loaded (and its weights read) already */
        size_t n;
        e->train = ft_model_trainable(e->m, &n);
        e->grad = ft_model_grads(e->m, &n);
        e->frozen = ft_model_frozen(e->m, &n);
    } else {
        e->train = engine_alloc(e, FT_MEM_WEIGHTS, e->n_train, false, &oom);
        e->train_c = engine_compute_copy(e, e->train, e->n_train, &oom);
        e->frozen = engine_alloc(e, FT_MEM_WEIGHTS, e->n_frozen, true, &oom);
        if (uses_buckets(e))
            e->grad = engine_alloc(e, FT_MEM_GRADS, e->n_train, false, &oom);
    }
    if (is_zero(e))
        e->shard_grad = engine_alloc(e, FT_MEM_GRADS, n_own, false, &oom);
    if (!uses_buckets(e)) {
        for (int i = 0; i < 2; i++) {
            e->gw[i].grad = engine_alloc(e, FT_MEM_WORKSPACE, e->max_unit_train, false, &oom);
            e->gw[i].land = engine_alloc(e, FT_MEM_WORKSPACE, e->max_unit_train, false, &oom);
            e->gw[i].counts = calloc((size_t)W, sizeof(size_t));
            oom |= !e->gw[i].counts;
        }
    } else if (make_buckets(e)) {
        oom = true;
    }
    if (oom)
        return ft_mem_fail(err, e->mem, e->dev, "the %s buffers of rank %d",
                           ft_strategy_name(e->o.strategy), me);

    if (!e->whole && init_units(e, adapter_dir, err))
        return -1;
    dp_bind(e);
    static const ft_model_hooks hooks = {.acquire = dp_acquire, .release = dp_release};
    ft_model_hooks h = hooks;
    h.ctx = e;
    ft_model_set_hooks(e->m, &h);
    return 0;
}

void dp_begin_step(ft_engine *e)
{
    engine_zero(e, e->grad, e->n_train);
    engine_zero(e, e->shard_grad, e->opt_end - e->opt_begin);
}

void dp_begin_micro(ft_engine *e, bool last)
{
    e->sync = last;
    for (int i = 0; i < e->n_buckets; i++)
        e->buckets[i].units_left = e->buckets[i].units;
}

int dp_finish_grads(ft_engine *e, ft_err *err)
{
    int rc = 0;
    for (int i = 0; i < e->n_buckets; i++) {
        if (e->buckets[i].req && ft_comm_wait(e->comm, e->buckets[i].req, err))
            rc = -1;
        e->buckets[i].req = NULL;
    }
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = gw_wait(e, &e->gw[i], err);
    return rc;
}

float *dp_owned_grad(ft_engine *e) { return is_zero(e) ? e->shard_grad : e->grad; }

float *dp_owned_params(ft_engine *e)
{
    if (is_z3(e))
        return e->shard_train;
    return e->train + e->opt_begin;
}

void dp_free(ft_engine *e)
{
    ft_err ignored;
    for (int i = 0; i < e->n_pw; i++) {
        pw_wait(e, &e->pw[i], &ignored);
        ft_free_on(e->mem, e->dev, e->pw[i].train);
        ft_free_on(e->mem, e->dev, e->pw[i].frozen);
        ft_free_on(e->mem, e->dev, e->pw[i].quant);
        free(e->pw[i].req_q);
        free(e->pw[i].counts_t);
        free(e->pw[i].counts_f);
    }
    free(e->pw);
    for (int i = 0; i < 2; i++) {
        ft_free_on(e->mem, e->dev, e->gw[i].grad);
        ft_free_on(e->mem, e->dev, e->gw[i].land);
        free(e->gw[i].counts);
    }
    for (int i = 0; i < e->n_buckets; i++)
        free(e->buckets[i].counts);
    free(e->buckets);
    free(e->unit_bucket);
    free(e->unit_gw);
    engine_free_compute_copy(e, e->shard_train, e->shard_train_c);
    ft_free_on(e->mem, e->dev, e->shard_train);
    engine_unpin_params(e, e->shard_frozen);
    ft_free_on(engine_param_mem(e), engine_param_dev(e), e->shard_frozen);
    ft_free_on(e->mem, e->dev, e->shard_grad);
    qs_free(e);
}
