/* model_parallel: the units split into contiguous stages, one per rank (a naive
 * pipeline: the residual stream [B*T, hidden] is sent forward rank to rank, its gradient
 * back). Each rank holds, trains and updates only its stage's parameters. With tied
 * embeddings the last stage keeps a copy of the embedding for its lm_head; in full
 * fine-tuning its gradient is summed into the first stage's, which updates it and sends
 * the new values back. The residual stream and its gradient travel in the model's
 * compute dtype; parameters and their gradients in fp32. */
#include <stdlib.h>
#include <string.h>

#include "dist/dist_engine_internal.h"

enum { TAG_HIDDEN = 1, TAG_GRAD = 2, TAG_TIED = 3 };

static int recv_hidden(void *ctx, float *h, size_t n, ft_err *err)
{
    ft_engine *e = ctx;
    return ft_comm_recv(e->comm, h, n, e->ccomm, e->rank - 1, TAG_HIDDEN, err);
}

static int send_hidden(void *ctx, const float *h, size_t n, ft_err *err)
{
    ft_engine *e = ctx;
    return ft_comm_send(e->comm, h, n, e->ccomm, e->rank + 1, TAG_HIDDEN, err);
}

static int recv_grad(void *ctx, float *dh, size_t n, ft_err *err)
{
    ft_engine *e = ctx;
    return ft_comm_recv(e->comm, dh, n, e->ccomm, e->rank + 1, TAG_GRAD, err);
}

static int send_grad(void *ctx, const float *dh, size_t n, ft_err *err)
{
    ft_engine *e = ctx;
    return ft_comm_send(e->comm, dh, n, e->ccomm, e->rank - 1, TAG_GRAD, err);
}

/* Contiguous stages balanced by parameter count: stage s ends at the first unit where
 * the running total reaches (s + 1) / W of all parameters, keeping one unit for each
 * later stage. first[s] is stage s's first unit; first[W] = n_units. */
static void split_stages(const ft_engine *e, int *first)
{
    int W = e->world, U = e->n_units;
    double total = 0;
    for (int u = 0; u < U; u++)
        total += (double)(e->ub[u + 1] - e->ub[u] + e->fb[u + 1] - e->fb[u]);
    first[0] = 0;
    double run = 0;
    int s = 1;
    for (int u = 0; u < U && s < W; u++) {
        run += (double)(e->ub[u + 1] - e->ub[u] + e->fb[u + 1] - e->fb[u]);
        bool full = run >= total * s / W;
        bool must = U - (u + 1) == W - s; /* the remaining units are one per stage */
        if (u + 1 > first[s - 1] && (full || must))
            first[s++] = u + 1;
    }
    first[W] = U;
}

static bool tied_copy(const ft_engine *e)
{
    return ft_model_cfg(e->m)->tie_word_embeddings && e->world > 1 &&
           e->rank == e->world - 1 && e->stage_first > 0;
}

void pipe_bind(ft_engine *e)
{
    ft_model_bind_all(e->m, (ft_unit_bufs){0});
    for (int u = e->stage_first; u <= e->stage_last; u++) {
        size_t t = e->ub[u] - e->ub[e->stage_first], f = e->fb[u] - e->fb[e->stage_first];
        ft_unit_bufs b = {e->train ? e->train + t : NULL, engine_at(e, e->train_c, t),
                          e->grad ? e->grad + t : NULL, engine_at(e, e->frozen, f)};
        ft_model_bind_unit(e->m, u, b);
    }
    if (tied_copy(e))
        ft_model_bind_unit(e->m, 0, (ft_unit_bufs){e->tied_train, e->tied_train_c,
                                                   e->tied_grad, e->tied_frozen});
}

int pipe_setup(ft_engine *e, const char *adapter_dir, ft_err *err)
{
    int W = e->world, me = e->rank;
    if (W > e->n_units)
        return ft_fail(err, "dist.strategy model_parallel: %d ranks for %d units (embeddings, "
                            "%d layers, head): at most one rank per unit",
                       W, e->n_units, e->n_units - 2);
    int *first = calloc((size_t)W + 1, sizeof *first);
    e->own = calloc((size_t)W + 1, sizeof *e->own);
    e->fshard = calloc((size_t)W + 1, sizeof *e->fshard);
    if (!first || !e->own || !e->fshard) {
        free(first);
        return ft_fail(err, "out of memory");
    }
    split_stages(e, first);
    for (int r = 0; r <= W; r++) {
        e->own[r] = e->ub[first[r]];
        e->fshard[r] = e->fb[first[r]];
    }
    e->stage_first = first[me];
    e->stage_last = first[me + 1] - 1;
    free(first);
    e->opt_begin = e->own[me];
    e->opt_end = e->own[me + 1];
    e->loss_rank = W - 1;
    size_t nt = e->opt_end - e->opt_begin, nf = e->fshard[me + 1] - e->fshard[me];
    bool oom = false;
    e->train = engine_alloc(e, FT_MEM_WEIGHTS, nt, false, &oom);
    e->train_c = engine_compute_copy(e, e->train, nt, &oom);
    e->grad = engine_alloc(e, FT_MEM_GRADS, nt, false, &oom);
    e->frozen = engine_alloc(e, FT_MEM_WEIGHTS, nf, true, &oom);
    if (tied_copy(e)) {
        size_t t0 = e->ub[1] - e->ub[0], f0 = e->fb[1] - e->fb[0];
        e->tied_train = engine_alloc(e, FT_MEM_WEIGHTS, t0, false, &oom);
        e->tied_train_c = engine_compute_copy(e, e->tied_train, t0, &oom);
        e->tied_grad = engine_alloc(e, FT_MEM_GRADS, t0, false, &oom);
        e->tied_frozen = engine_alloc(e, FT_MEM_WEIGHTS, f0, true, &oom);
    }
    if (oom)
        return ft_mem_fail(err, e->mem, e->dev, "pipeline stage %d (units %d-%d)", me,
                           e->stage_first, e->stage_last);
    pipe_bind(e);
    for (int u = e->stage_first; u <= e->stage_last; u++)
        if (ft_model_init_unit(e->m, u, adapter_dir, err))
            return -1;
    if (tied_copy(e) && ft_model_init_unit(e->m, 0, adapter_dir, err))
        return -1;
    ft_model_set_stage(e->m, e->stage_first, e->stage_last);
    ft_model_hooks h = {.ctx = e,
                        .recv_hidden = recv_hidden,
                        .send_hidden = send_hidden,
                        .recv_grad = recv_grad,
                        .send_grad = send_grad};
    ft_model_set_hooks(e->m, &h);
    return 0;
}

/* A trainable tied embedding: the last stage's gradient of its copy joins the first
 * stage's (which owns and updates the embedding). */
int pipe_finish_grads(ft_engine *e, ft_err *err)
{
    size_t n0 = e->ub[1] - e->ub[0];
    if (!ft_model_cfg(e->m)->tie_word_embeddings || e->world < 2 || n0 == 0)
        return 0;
    if (tied_copy(e))
        return ft_comm_send(e->comm, e->tied_grad, n0, FT_COMM_F32, 0, TAG_TIED, err);
    if (e->rank != 0)
        return 0;
    ft_mem scratch = {0}; /* a moment's buffer, beside the tracked ones */
    float *tmp = ft_alloc_on(&scratch, e->dev, FT_MEM_WORKSPACE, n0 * sizeof *tmp);
    if (!tmp)
        return ft_mem_fail(err, &scratch, e->dev, "the tied embedding's gradient");
    int rc = ft_comm_recv(e->comm, tmp, n0, FT_COMM_F32, e->world - 1, TAG_TIED, err);
    if (rc == 0)
        engine_add(e, e->grad, tmp, n0);
    ft_free_on(&scratch, e->dev, tmp);
    return rc;
}

/* After the update: the first stage sends the new tied embedding to the last. */
int pipe_after_update(ft_engine *e, ft_err *err)
{
    size_t n0 = e->ub[1] - e->ub[0];
    if (!ft_model_cfg(e->m)->tie_word_embeddings || e->world < 2 || n0 == 0)
        return 0;
    if (tied_copy(e))
        return ft_comm_recv(e->comm, e->tied_train, n0, FT_COMM_F32, 0, TAG_TIED, err);
    if (e->rank == 0)
        return ft_comm_send(e->comm, e->train, n0, FT_COMM_F32, e->world - 1, TAG_TIED, err);
    return 0;
}

void pipe_free(ft_engine *e)
{
    engine_free_compute_copy(e, e->tied_train, e->tied_train_c);
    ft_free_on(e->mem, e->dev, e->tied_train);
    ft_free_on(e->mem, e->dev, e->tied_grad);
    ft_free_on(e->mem, e->dev, e->tied_frozen);
}
