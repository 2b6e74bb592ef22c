/* zero3 / fsdp of a quantized base (QLoRA): every rank keeps its whole blocks of each
 * quantized weight (quant/quant_shard.h) and gathers a unit's weights into a parameter
 * window just before the unit runs, as the dense frozen weights are (dist_dp.c).
 *
 * Layout: the weights in parameter order (so by unit); this rank's range of each array
 * back to back in one buffer, qshard (the weights category of the device, or of the
 * host with offload_params); a unit's quant window holds its weights' arrays whole,
 * each at a 64-byte boundary. The nested state of double quantization (the 256-value
 * map, then the nested absmax) is the same on every rank (qmaps, on the device); so is
 * the code table a GPU needs (qcode).
 *
 * The format is the one the model's quantization is in force with (ft_model_quant);
 * ft_model_init_unit reads a unit's weights whole, qs_take_unit checks that each was
 * quantized in that format (a checkpoint may hold a weight of its own blocksize: it is
 * refused by name), keeps this rank's bytes and frees the rest. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_engine_internal.h"
#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"
#endif

enum { QWIN_ALIGN = 64 };

static size_t align_up(size_t n) { return (n + QWIN_ALIGN - 1) / QWIN_ALIGN * QWIN_ALIGN; }

ft_mem *engine_param_mem(ft_engine *e) { return e->o.offload_params ? &e->host : e->mem; }

ft_device engine_param_dev(const ft_engine *e)
{
    return e->o.offload_params ? FT_DEV_CPU : e->dev;
}

/* An offloaded shard of a GPU engine is page-locked, so the per-layer copies in run at
 * the link's bandwidth (on CPU ranks there is nothing to pin). */
static bool pins(const ft_engine *e) { return e->o.offload_params && e->dev != FT_DEV_CPU; }

int engine_pin_params(ft_engine *e, void *p, size_t bytes, ft_err *err)
{
    if (!pins(e) || !p)
        return 0;
#ifdef FT_HAVE_CUDA
    if (ft_cuda_host_pin(p, bytes, err))
        return ft_fail_prefix(err, "pinning rank %d's offloaded parameter shard (%zu bytes)",
                              e->rank, bytes);
    return 0;
#else
    (void)bytes;
    return ft_fail(err, "this build has no CUDA backend to pin host memory with");
#endif
}

void engine_unpin_params(ft_engine *e, void *p)
{
#ifdef FT_HAVE_CUDA
    if (pins(e) && p)
        ft_cuda_host_unpin(p);
#else
    (void)e;
    (void)p;
#endif
}

/* The bytes of each array of p, and the number of arrays. */
static int arrays_of(const qshard_param *p, size_t bytes[FT_QSHARD_MAX_ARRAYS])
{
    return ft_qshard_arrays(&p->meta, bytes);
}

int qs_setup(ft_engine *e, ft_err *err)
{
    ft_quant_options qo = ft_model_quant(e->m);
    size_t np = ft_model_param_count(e->m);
    int W = e->world, n = 0;
    size_t replicated = 0;
    for (size_t i = 0; i < np; i++)
        n += ft_model_param(e->m, i)->quantized;
    if (!n)
        return 0;
    e->qp = calloc((size_t)n, sizeof *e->qp);
    e->qunit = calloc((size_t)e->n_units + 1, sizeof *e->qunit);
    if (!e->qp || !e->qunit)
        return ft_fail(err, "out of memory");
    size_t shard = 0;
    for (size_t i = 0; i < np; i++) {
        const ft_param *p = ft_model_param(e->m, i);
        if (!p->quantized)
            continue;
        qshard_param *q = &e->qp[e->n_qp++];
        q->param = i;
        q->unit = p->unit;
        q->meta = ft_qshard_meta(&qo, p->shape[0], p->shape[1]);
        size_t bytes[FT_QSHARD_MAX_ARRAYS];
        q->n_arrays = arrays_of(q, bytes);
        if (!(q->counts = calloc((size_t)q->n_arrays * (size_t)W, sizeof *q->counts)))
            return ft_fail(err, "out of memory");
        q->shard_off = shard;
        for (int a = 0; a < q->n_arrays; a++)
            for (int r = 0; r < W; r++) {
                size_t lo, hi;
                ft_qshard_range(&q->meta, a, r, W, &lo, &hi);
                q->counts[a * W + r] = hi - lo;
                if (r == e->rank)
                    shard += hi - lo;
            }
        replicated += ft_qshard_replicated(&q->meta);
    }
    /* units and their windows (parameters are listed by unit) */
    for (int u = 0, k = 0; u <= e->n_units; u++) {
        while (k < e->n_qp && e->qp[k].unit < u)
            k++;
        e->qunit[u] = k;
    }
    for (int u = 0; u < e->n_units; u++) {
        size_t off = 0;
        int arrays = 0;
        for (int k = e->qunit[u]; k < e->qunit[u + 1]; k++) {
            qshard_param *q = &e->qp[k];
            size_t bytes[FT_QSHARD_MAX_ARRAYS];
            arrays_of(q, bytes);
            for (int a = 0; a < q->n_arrays; a++) {
                q->win_off[a] = off;
                off += align_up(bytes[a]);
            }
            arrays += q->n_arrays;
        }
        if (off > e->max_qwin)
            e->max_qwin = off;
        if (arrays > e->max_q_arrays)
            e->max_q_arrays = arrays;
    }
    e->qshard_bytes = shard;
    ft_mem *pm = engine_param_mem(e);
    ft_device pd = engine_param_dev(e);
    if (shard && !(e->qshard = ft_alloc_on(pm, pd, FT_MEM_WEIGHTS, shard)))
        return ft_mem_fail(err, pm, pd, "rank %d's shard of the quantized base", e->rank);
    if (engine_pin_params(e, e->qshard, shard, err)) {
        ft_free_on(pm, pd, e->qshard);
        e->qshard = NULL;
        return -1;
    }
    if (replicated) {
        e->qmaps = ft_alloc_on(e->mem, e->dev, FT_MEM_WEIGHTS, replicated);
        if (!e->qmaps)
            return ft_mem_fail(err, e->mem, e->dev, "the nested state of the quantized base");
        float *at = e->qmaps;
        for (int k = 0; k < e->n_qp; k++)
            if (e->qp[k].meta.nested) {
                e->qp[k].map = at;
                at += ft_qshard_replicated(&e->qp[k].meta) / sizeof(float);
            }
    }
    e->q_replicated = replicated;
    const float *code = ft_quant_code(qo.type);
    if (code && e->dev != FT_DEV_CPU) { /* the host reads the static table */
        e->qcode = ft_alloc_on(e->mem, e->dev, FT_MEM_WEIGHTS, 16 * sizeof(float));
        if (!e->qcode)
            return ft_mem_fail(err, e->mem, e->dev, "the code table of the quantized base");
        if (ft_copy_bytes(e->qcode, e->dev, code, FT_DEV_CPU, 16 * sizeof(float), err))
            return -1;
    }
    return 0;
}

/* Whether the model's read weight q is in the format the layout was made for. */
static bool same_format(const ft_qtensor *q, const ft_qtensor *meta)
{
    if (q->type != meta->type || q->rows != meta->rows || q->cols != meta->cols)
        return false;
    if (q->type == FT_QUANT_INT8)
        return true;
    return q->blocksize == meta->blocksize && q->n_blocks == meta->n_blocks &&
           q->nested == meta->nested &&
           (!q->nested || q->nested_blocksize == meta->nested_blocksize);
}

int qs_take_unit(ft_engine *e, int unit, ft_err *err)
{
    if (!e->qp)
        return 0;
    ft_device pd = engine_param_dev(e);
    for (int k = e->qunit[unit]; k < e->qunit[unit + 1]; k++) {
        qshard_param *p = &e->qp[k];
        ft_qtensor *q = ft_model_qtensor(e->m, p->param);
        const char *name = ft_model_param(e->m, p->param)->name;
        if (!q || !same_format(q, &p->meta))
            return ft_fail(err, "'%s': quantized as %s blocksize %d%s, not as the model's "
                                "quantization_config says (%s blocksize %d%s): a base sharded "
                                "by blocks (dist.strategy %s) needs every weight in that format",
                           name, q ? ft_quant_name(q->type) : "?", q ? q->blocksize : 0,
                           q && q->nested ? " double-quantized" : "",
                           ft_quant_name(p->meta.type), p->meta.blocksize,
                           p->meta.nested ? " double-quantized" : "",
                           ft_strategy_name(e->o.strategy));
        size_t off = p->shard_off;
        for (int a = 0; a < p->n_arrays; a++) {
            size_t lo, hi;
            ft_qshard_range(&p->meta, a, e->rank, e->world, &lo, &hi);
            const unsigned char *src = *ft_qshard_array(q, a);
            if (hi > lo && ft_copy_bytes(e->qshard + off, pd, src + lo, e->dev, hi - lo, err))
                return ft_fail_prefix(err, "'%s'", name);
            off += hi - lo;
        }
        if (p->meta.nested) { /* the map, then the nested absmax, whole */
            p->meta.nested_offset = q->nested_offset;
            size_t n2 = ft_qshard_nested_n(&p->meta) * sizeof(float);
            if (ft_copy_bytes(p->map, e->dev, q->nested_map, e->dev, 256 * sizeof(float), err) ||
                ft_copy_bytes(p->map + 256, e->dev, q->nested_absmax, e->dev, n2, err))
                return ft_fail_prefix(err, "'%s'", name);
        }
        ft_model_drop_qtensor(e->m, p->param);
    }
    return 0;
}

int qs_gather(ft_engine *e, param_window *w, int unit, ft_err *err)
{
    int W = e->world, me = e->rank;
    w->n_req_q = 0;
    for (int k = e->qp ? e->qunit[unit] : 0; e->qp && k < e->qunit[unit + 1]; k++) {
        qshard_param *p = &e->qp[k];
        size_t off = p->shard_off;
        for (int a = 0; a < p->n_arrays; a++) {
            const size_t *counts = p->counts + (size_t)a * W;
            size_t disp = 0;
            for (int r = 0; r < me; r++)
                disp += counts[r];
            unsigned char *dst = w->quant + p->win_off[a];
            const unsigned char *send = e->qshard + off;
            if (e->o.offload_params) {
                /* from the host into this rank's place in the window, gathered in place */
                if (counts[me] && ft_copy_bytes(dst + disp, e->dev, send, FT_DEV_CPU,
                                                counts[me], err))
                    return -1;
                send = dst + disp;
            }
            if (ft_comm_iallgather_v(e->comm, send, dst, counts, FT_COMM_BYTE,
                                     &w->req_q[w->n_req_q++], err))
                return -1;
            off += counts[me];
        }
    }
    return 0;
}

int qs_wait(ft_engine *e, param_window *w, ft_err *err)
{
    int rc = 0;
    for (int i = 0; i < w->n_req_q; i++)
        rc |= ft_comm_wait(e->comm, w->req_q[i], err);
    w->n_req_q = 0;
    return rc ? -1 : 0;
}

void qs_lend(ft_engine *e, param_window *w)
{
    for (int k = e->qp ? e->qunit[w->unit] : 0; e->qp && k < e->qunit[w->unit + 1]; k++) {
        qshard_param *p = &e->qp[k];
        ft_qtensor v = p->meta;
        v.device = e->dev;
        for (int a = 0; a < p->n_arrays; a++)
            *ft_qshard_array(&v, a) = w->quant + p->win_off[a];
        if (p->meta.nested) {
            v.nested_map = p->map;
            v.nested_absmax = p->map + 256;
        }
        v.code = e->qcode;
        ft_model_lend_qtensor(e->m, p->param, &v);
    }
}

void qs_forget(ft_engine *e, int unit)
{
    for (int k = e->qp && unit >= 0 ? e->qunit[unit] : 0;
         e->qp && unit >= 0 && k < e->qunit[unit + 1]; k++)
        ft_model_drop_qtensor(e->m, e->qp[k].param);
}

void qs_free(ft_engine *e)
{
    for (int k = 0; k < e->n_qp; k++)
        free(e->qp[k].counts);
    free(e->qp);
    free(e->qunit);
    engine_unpin_params(e, e->qshard);
    ft_free_on(engine_param_mem(e), engine_param_dev(e), e->qshard);
    ft_free_on(e->mem, e->dev, e->qmaps);
    ft_free_on(e->mem, e->dev, e->qcode);
    e->qp = NULL;
    e->qunit = NULL;
    e->qshard = NULL;
    e->qmaps = e->qcode = NULL;
    e->n_qp = 0;
}

size_t ft_engine_quant_bytes(ft_engine *e)
{
    size_t total = 0;
    if (e->qp)
        return e->qshard_bytes + e->q_replicated;
    for (size_t i = 0; i < ft_model_param_count(e->m); i++) {
        const ft_qtensor *q = ft_model_qtensor(e->m, i);
        total += q ? ft_qtensor_bytes(q) : 0;
    }
    return total;
}
