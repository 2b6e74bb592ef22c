/* ft_engine: setup, the optimizer step and gathered checkpoints for every strategy
 * (dist_engine.h). The strategy-specific parts are dist_dp.c and dist_pipeline.c. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/dist_engine_internal.h"
#include "core/fsutil.h"

const char *ft_strategy_name(ft_strategy s)
{
    static const char *const names[] = {"none", "ddp",  "zero1",         "zero2",
                                        "zero3", "fsdp", "model_parallel"};
    return (unsigned)s < sizeof names / sizeof *names ? names[s] : "?";
}

static bool is_pipeline(const ft_engine *e) { return e->o.strategy == FT_STRATEGY_PIPELINE; }

ft_model *ft_engine_model(ft_engine *e) { return e->m; }
ft_strategy ft_engine_strategy(const ft_engine *e) { return e->o.strategy; }
ft_mem *ft_engine_mem(ft_engine *e) { return e->mem; }
const ft_mem *ft_engine_host_mem(const ft_engine *e) { return &e->host; }
int ft_engine_data_world(const ft_engine *e) { return is_pipeline(e) ? 1 : e->world; }
int ft_engine_loss_rank(const ft_engine *e) { return e->loss_rank; }
int ft_engine_opt_step(const ft_engine *e) { return e->opt.step; }
double ft_engine_step_comm_bytes(const ft_engine *e) { return e->step_comm.bytes_sent; }
double ft_engine_rank_loss(const ft_engine *e) { return e->rank_loss; }

double ft_engine_step_profile(const ft_engine *e, ft_comm_stats *comm)
{
    if (comm)
        *comm = e->step_comm;
    return e->step_s;
}

/* ---- the per-step profile ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* FT_DIST_PROFILE=dir: dir/rank-R.jsonl, appended to (dist_engine.h). */
static int open_profile(ft_engine *e, ft_err *err)
{
    const char *dir = getenv("FT_DIST_PROFILE");
    if (!dir || !*dir)
        return 0;
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/rank-%d.jsonl", dir, e->rank) >= sizeof path)
        return ft_fail(err, "FT_DIST_PROFILE=%s: path too long", dir);
    if (ft_mkdir_p(dir, err))
        return ft_fail_prefix(err, "FT_DIST_PROFILE");
    e->profile = fopen(path, "a");
    if (!e->profile)
        return ft_fail(err, "FT_DIST_PROFILE: cannot open %s: %s", path, strerror(errno));
    return 0;
}

static void write_profile(ft_engine *e, int n_micro, long tokens)
{
    const ft_comm_stats *c = &e->step_comm;
    fprintf(e->profile,
            "{\"step\": %d, \"rank\": %d, \"world\": %d, \"strategy\": \"%s\", "
            "\"micro_batches\": %d, \"tokens\": %ld, \"step_s\": %.9f, \"comm_wait_s\": %.9f, "
            "\"comm_bytes\": %.17g, \"calls\": {",
            e->opt.step, e->rank, e->world, ft_strategy_name(e->o.strategy), n_micro, tokens,
            e->step_s, c->wait_s, c->bytes_sent);
    for (int k = 0; k < FT_COMM_NKINDS; k++)
        fprintf(e->profile, "%s\"%s\": %ld", k ? ", " : "", ft_comm_kind_name((ft_comm_kind)k),
                c->calls[k]);
    fprintf(e->profile, "}, \"bytes\": {");
    for (int k = 0; k < FT_COMM_NKINDS; k++)
        fprintf(e->profile, "%s\"%s\": %.17g", k ? ", " : "", ft_comm_kind_name((ft_comm_kind)k),
                c->bytes[k]);
    fprintf(e->profile, "}}\n");
    fflush(e->profile);
}

/* The parameters this rank's optimizer updates (and where an offloaded master comes from). */
static float *owned_params(ft_engine *e)
{
    return is_pipeline(e) ? e->train : dp_owned_params(e);
}

static float *owned_grad(ft_engine *e) { return is_pipeline(e) ? e->grad : dp_owned_grad(e); }

void engine_zero(const ft_engine *e, float *p, size_t n)
{
    if (p && n)
        ft_zero(ft_view(p, n, FT_F32, e->dev), n);
}

void engine_add(const ft_engine *e, float *dst, const float *src, size_t n)
{
    if (n)
        ft_add(ft_view(dst, n, FT_F32, e->dev), ft_view((float *)src, n, FT_F32, e->dev), n);
}

float *engine_at(const ft_engine *e, float *p, size_t i)
{
    return p ? (float *)((char *)p + i * e->cesize) : NULL;
}

int engine_copy_overlap(const ft_engine *e, void *dst, ft_device dst_dev, size_t lo, size_t hi,
                        const void *src, size_t b, size_t end, size_t esize, ft_err *err)
{
    size_t n = overlap_len(b, end, lo, hi);
    if (!n)
        return 0;
    size_t first = b > lo ? b : lo;
    return ft_copy_bytes((char *)dst + (first - lo) * esize, dst_dev,
                         (const char *)src + (first - b) * esize, e->dev, n * esize, err);
}

float *engine_alloc(ft_engine *e, ft_mem_cat cat, size_t n, bool cdt, bool *oom)
{
    if (n == 0)
        return NULL;
    float *p = ft_alloc_on(e->mem, e->dev, cat, n * (cdt ? e->cesize : sizeof(float)));
    if (!p)
        *oom = true;
    return p;
}

float *engine_compute_copy(ft_engine *e, float *master, size_t n, bool *oom)
{
    return e->split_compute ? engine_alloc(e, FT_MEM_WEIGHTS, n, true, oom) : master;
}

void engine_free_compute_copy(ft_engine *e, float *master, float *copy)
{
    if (copy != master)
        ft_free_on(e->mem, e->dev, copy);
}

static void refresh(const ft_engine *e, float *copy, float *master, size_t n)
{
    if (copy && copy != master && n)
        ft_copy(ft_view(copy, n, e->cdt, e->dev), ft_view(master, n, FT_F32, e->dev), n);
}

void engine_refresh_compute(ft_engine *e)
{
    if (e->whole) {
        ft_model_sync_compute(e->m); /* the model keeps a whole replica's copy */
        return;
    }
    size_t own = e->opt_end - e->opt_begin;
    refresh(e, e->shard_train_c, e->shard_train, own);
    refresh(e, e->train_c, e->train, is_pipeline(e) ? own : e->n_train);
    refresh(e, e->tied_train_c, e->tied_train, e->ub[1] - e->ub[0]);
}

static void bind(ft_engine *e)
{
    if (e->whole)
        return; /* the model's own buffers, bound since it was loaded */
    if (is_pipeline(e))
        pipe_bind(e);
    else
        dp_bind(e);
}

/* ft_model_set_aux_reduce: a MoE router's statistics summed over every rank. */
static int aux_reduce(void *ctx, double *v, size_t n, ft_err *err)
{
    ft_engine *e = ctx;
    return ft_comm_allreduce_sum(e->comm, v, n, err);
}

int ft_engine_new(ft_engine **out, ft_comm *comm, const char *model_dir,
                  const ft_model_options *mo, const char *adapter_dir, ft_adamw_hparams hp,
                  const ft_dist_options *o, ft_err *err)
{
    *out = NULL;
    int world = ft_comm_size(comm);
    if (o->strategy == FT_STRATEGY_NONE && world > 1)
        return ft_fail(err, "dist.strategy none with %d ranks: each would train alone (use ddp, "
                            "zero1-3, fsdp or model_parallel)",
                       world);
    if (o->offload_optimizer && (o->strategy == FT_STRATEGY_PIPELINE))
        return ft_fail(err, "dist.offload_optimizer cpu works with ddp, zero1-3 and fsdp, not "
                            "with model_parallel");
    if (o->offload_params && o->strategy != FT_STRATEGY_ZERO3 &&
        o->strategy != FT_STRATEGY_FSDP)
        return ft_fail(err, "dist.offload_params cpu works with zero3 and fsdp (the strategies "
                            "that shard the frozen base), not with %s",
                       ft_strategy_name(o->strategy));
    if (mo->mode == FT_TRAIN_NONE)
        return ft_fail(err, "the engine trains: a model without trainable parameters");
    bool whole = o->strategy == FT_STRATEGY_NONE || o->strategy == FT_STRATEGY_DDP ||
                 o->strategy == FT_STRATEGY_ZERO1;
    ft_engine *e = calloc(1, sizeof *e);
    if (!e)
        return ft_fail(err, "out of memory");
    e->comm = comm;
    e->rank = ft_comm_rank(comm);
    e->world = world;
    e->o = *o;
    e->whole = whole;
    ft_model_options lo = *mo;
    lo.unbound = !whole;
    if (ft_model_load(&e->m, model_dir, &lo, err)) {
        free(e);
        return -1;
    }
    const ft_model_config *mc = ft_model_cfg(e->m);
    if (mc->num_experts > 0 && mc->output_router_logits) {
        /* the load-balancing loss of the step's whole micro-batch and of every layer (the
         * model keeps one forward's statistics and real rows: one activation slot) */
        if (o->strategy == FT_STRATEGY_PIPELINE && o->pipeline_chunks > 1) {
            ft_fail(err, "model_type '%s' with output_router_logits: "
                         "dist.pipeline_micro_batches > 1 is not supported (the router's "
                         "load-balancing loss of a micro-batch needs every chunk's routing "
                         "before any backward)", mc->model_type);
            ft_model_free(e->m);
            free(e);
            return -1;
        }
        if (world > 1)
            ft_model_set_aux_reduce(e->m, aux_reduce, e);
    }
    if (whole && adapter_dir && ft_model_load_adapter(e->m, adapter_dir, err)) {
        ft_model_free(e->m);
        free(e);
        return -1;
    }
    e->dev = ft_model_device(e->m);
    e->mem = ft_model_mem(e->m);
    e->cdt = ft_model_dtype(e->m);
    e->cesize = e->cdt == FT_F32 ? sizeof(float) : 2;
    e->ccomm = e->cdt == FT_F32 ? FT_COMM_F32 : FT_COMM_BF16;
    const char *split = getenv("FT_DIST_SPLIT_COMPUTE");
    e->split_compute = e->cdt != FT_F32 || (split && !strcmp(split, "1"));
    e->gather_compute = e->cdt != FT_F32 && (o->strategy == FT_STRATEGY_ZERO1 ||
                                             o->strategy == FT_STRATEGY_ZERO2);
    e->n_units = ft_model_n_units(e->m);
    ft_model_trainable(e->m, &e->n_train);
    e->n_frozen = ft_model_frozen_count(e->m);
    e->ub = calloc((size_t)e->n_units + 1, sizeof *e->ub);
    e->fb = calloc((size_t)e->n_units + 1, sizeof *e->fb);
    if (!e->ub || !e->fb) {
        ft_engine_free(e);
        return ft_fail(err, "out of memory");
    }
    for (int u = 0; u < e->n_units; u++) {
        ft_model_unit_range(e->m, u, &e->ub[u], &e->ub[u + 1]);
        ft_model_unit_frozen_range(e->m, u, &e->fb[u], &e->fb[u + 1]);
    }
    int rc = tied_setup(e, err);
    if (rc == 0)
        rc = is_pipeline(e) ? pipe_setup(e, adapter_dir, err) : dp_setup(e, adapter_dir, err);
    /* the tied pair read unit by unit: the embedding's from the head's (zero2 holds the
     * whole buffer; a whole replica's model did it as it read) */
    if (rc == 0 && !e->whole)
        rc = e->o.strategy == FT_STRATEGY_ZERO2
                 ? tied_setup_sync(e, owned_params(e), e->train, 0, e->n_train, err)
                 : tied_setup_sync(e, owned_params(e), owned_params(e), e->opt_begin,
                                   e->opt_end, err);
    if (rc == 0 && !e->whole) /* (a whole replica's model keeps its copy as it reads) */
        engine_refresh_compute(e); /* the masters were just read */
    if (rc == 0 && is_pipeline(e) && o->pipeline_chunks > 1)
        rc = ft_model_set_activation_slots(e->m, o->pipeline_chunks, err);
    size_t n = e->opt_end - e->opt_begin;
    ft_mem *opt_mem = o->offload_optimizer ? &e->host : e->mem;
    /* a pipeline stage may hold only frozen weights (the head under LoRA) */
    if (rc == 0 && n == 0 && !is_pipeline(e))
        rc = ft_fail(err, "rank %d (%s) has no trainable parameter to update: use fewer ranks",
                     e->rank, ft_strategy_name(o->strategy));
    if (rc == 0 && n > 0)
        rc = ft_optimizer_init_on(&e->opt, opt_mem, o->offload_optimizer ? FT_DEV_CPU : e->dev,
                                  n, hp, err);
    e->opt.hp = hp;
    if (rc == 0 && n > 0 && o->offload_optimizer) {
        e->host_master = ft_alloc(&e->host, FT_MEM_OPTIM, n * sizeof(float));
        e->host_grad = ft_alloc(&e->host, FT_MEM_GRADS, n * sizeof(float));
        if (!e->host_master || !e->host_grad)
            rc = ft_mem_fail(err, &e->host, FT_DEV_CPU, "the offloaded optimizer");
        else
            rc = ft_copy_bytes(e->host_master, FT_DEV_CPU, owned_params(e), e->dev,
                               n * sizeof(float), err);
    }
    if (rc == 0)
        rc = open_profile(e, err);
    if (rc) {
        ft_engine_free(e);
        return -1;
    }
    *out = e;
    return 0;
}

void ft_engine_free(ft_engine *e)
{
    if (!e)
        return;
    ft_optimizer_free(&e->opt);
    ft_free(&e->host, e->host_master);
    ft_free(&e->host, e->host_grad);
    if (e->m) {
        engine_ref_free(e);
        dp_free(e);
        pipe_free(e);
        if (!e->whole) {
            engine_free_compute_copy(e, e->train, e->train_c);
            ft_free_on(e->mem, e->dev, e->train);
            ft_free_on(e->mem, e->dev, e->grad);
            ft_free_on(e->mem, e->dev, e->frozen);
        }
        ft_model_free(e->m);
    }
    free(e->ub);
    free(e->fb);
    free(e->own);
    free(e->fshard);
    if (e->profile)
        fclose(e->profile);
    free(e);
}

/* ---- the step ---- */

static void begin_step(ft_engine *e)
{
    if (is_pipeline(e)) {
        engine_zero(e, e->grad, e->opt_end - e->opt_begin);
        engine_zero(e, e->tied_grad, e->ub[1] - e->ub[0]);
    } else {
        dp_begin_step(e);
    }
}

/* zero1 / zero2: buf (n_train elements of dt, whole on every rank) gets every rank's
 * owned range from its owner. */
static int gather_shards(ft_engine *e, float *buf, ft_comm_dtype dt, ft_err *err)
{
    size_t *counts = malloc((size_t)e->world * sizeof *counts);
    if (!counts)
        return ft_fail(err, "out of memory");
    for (int r = 0; r < e->world; r++)
        counts[r] = e->own[r + 1] - e->own[r];
    size_t es = dt == FT_COMM_F32 ? sizeof(float) : e->cesize;
    int rc = ft_comm_allgather_v(e->comm, (char *)buf + e->own[e->rank] * es, buf, counts, dt, err);
    free(counts);
    return rc;
}

/* zero1 / zero2 in bf16: the owner rounds its updated fp32 shard to its bf16 copy, and the
 * copies travel (the bf16 the others get is the one the owner's master rounds to, as a
 * gathered master rounded there would be: the same bits). The other ranks' masters are
 * left stale here: nothing reads them but a save, which gathers them first. */
static int gather_shards_compute(ft_engine *e, ft_err *err)
{
    float *copy = e->whole ? ft_model_trainable_compute(e->m) : e->train_c;
    size_t b = e->own[e->rank], n = e->own[e->rank + 1] - b;
    refresh(e, engine_at(e, copy, b), e->train + b, n);
    e->masters_stale = e->world > 1;
    return gather_shards(e, copy, e->ccomm, err);
}

/* Before a save of zero1 / zero2 in bf16: every rank's fp32 masters whole again. */
static int gather_stale_masters(ft_engine *e, ft_err *err)
{
    if (!e->masters_stale)
        return 0;
    if (gather_shards(e, e->train, FT_COMM_F32, err))
        return -1;
    e->masters_stale = false;
    return 0;
}

static int update(ft_engine *e, float lr, float coef, ft_err *err)
{
    size_t n = e->opt_end - e->opt_begin;
    float *params = owned_params(e), *grad = owned_grad(e);
    if (n == 0) {
        e->opt.step++; /* a stage without trainables keeps the step count with the others */
    } else if (e->o.offload_optimizer) {
        /* ZeRO-Offload: gradient to the host, AdamW there on the fp32 master, back */
        size_t bytes = n * sizeof(float);
        if (ft_copy_bytes(e->host_grad, FT_DEV_CPU, grad, e->dev, bytes, err))
            return -1;
        tied_zero_heads(e, e->host_master, FT_DEV_CPU);
        ft_optimizer_step(&e->opt, e->host_master, e->host_grad, lr, coef);
        if (ft_copy_bytes(params, e->dev, e->host_master, FT_DEV_CPU, bytes, err))
            return -1;
    } else if (e->tied_pairs) {
        tied_zero_heads(e, params, e->dev);
        ft_optimizer_step(&e->opt, params, grad, lr, coef);
    } else {
        /* (a tied pair on a whole replica's step: the model brackets it) */
        ft_model_tied_lora_before_step(e->m, params);
        ft_optimizer_step(&e->opt, params, grad, lr, coef);
        ft_model_tied_lora_after_step(e->m, params, lr, e->opt.hp.weight_decay);
    }
    /* the tied pair's second update, across the owners (dist_tied.c): every rank */
    if (e->tied_pairs) {
        if (tied_after_step(e, params, lr, err))
            return -1;
        if (n > 0 && e->o.offload_optimizer &&
            ft_copy_bytes(e->host_master, FT_DEV_CPU, params, e->dev, n * sizeof(float), err))
            return -1;
    }
    int rc = 0;
    switch (e->o.strategy) {
    case FT_STRATEGY_ZERO1:
    case FT_STRATEGY_ZERO2:
        /* every rank gets the updated shards of the others */
        if (e->gather_compute)
            return gather_shards_compute(e, err);
        rc = gather_shards(e, e->train, FT_COMM_F32, err);
        break;
    case FT_STRATEGY_ZERO3:
    case FT_STRATEGY_FSDP:
        dp_invalidate(e); /* gathered windows hold the old values */
        break;
    case FT_STRATEGY_PIPELINE:
        rc = pipe_after_update(e, err);
        break;
    default:
        break;
    }
    /* the fp32 masters changed: the bf16 copies the ops read (and zero3 gathers) follow */
    if (rc == 0)
        engine_refresh_compute(e);
    return rc;
}

/* GPipe on one micro-batch: its rows in up to pipeline_chunks chunks, every chunk's
 * forward (each in its own activation slot), then their backwards in reverse order. */
static int gpipe(ft_engine *e, const ft_batch *b, double tokens, double *loss, ft_err *err)
{
    int k = e->o.pipeline_chunks < b->B ? e->o.pipeline_chunks : b->B;
    int rows = (b->B + k - 1) / k;
    k = (b->B + rows - 1) / rows;
    *loss = 0;
    for (int c = 0; c < k; c++) {
        size_t off = (size_t)c * rows * b->T;
        ft_batch chunk = {c + 1 < k ? rows : b->B - c * rows, b->T, b->input_ids + off,
                          b->labels ? b->labels + off : NULL,
                          b->position_ids ? b->position_ids + off : NULL,
                          b->attention_mask ? b->attention_mask + off : NULL};
        double sum;
        ft_model_use_activation_slot(e->m, c);
        if (ft_model_forward(e->m, &chunk, &sum, NULL, err))
            return ft_fail_prefix(err, "chunk %d forward", c);
        *loss += sum;
    }
    for (int c = k - 1; c >= 0; c--) {
        ft_model_use_activation_slot(e->m, c);
        if (ft_model_backward(e->m, (float)(1.0 / tokens), err))
            return ft_fail_prefix(err, "chunk %d backward", c);
    }
    ft_model_use_activation_slot(e->m, 0);
    return 0;
}

int ft_engine_step(ft_engine *e, const ft_lr_schedule *sched, const ft_batch *micro,
                   int n_micro, double max_grad_norm, ft_step_stats *st, ft_err *err)
{
    return ft_engine_step_objective(e, NULL, sched, micro, n_micro, max_grad_norm, st, err);
}

int ft_engine_step_objective(ft_engine *e, const ft_objective *obj, const ft_lr_schedule *sched,
                             const ft_batch *micro, int n_micro, double max_grad_norm,
                             ft_step_stats *st, ft_err *err)
{
    double t0 = now_s();
    ft_comm_stats comm0;
    ft_comm_stats_get(e->comm, &comm0);
    /* the loss is normalised by the counted tokens (an objective's count: pairs) of the
     * whole global batch */
    double tokens = 0;
    for (int i = 0; i < n_micro; i++)
        tokens += obj ? obj->count(obj->ctx, &micro[i])
                      : (double)ft_batch_counted_tokens(&micro[i]);
    double rank_tokens = tokens;
    if (ft_engine_data_world(e) > 1 &&
        ft_comm_allreduce(e->comm, &tokens, 1, FT_COMM_F64, FT_COMM_SUM, err))
        return -1;
    if (tokens == 0)
        return ft_fail(err, "the batch has no token with a label (all labels are -100)");
    begin_step(e);
    double loss = 0;
    for (int i = 0; i < n_micro; i++) {
        double sum;
        /* (an objective runs its own GPipe chunks: its loss needs every row's forward
         * before the first backward; train/pref.h) */
        if (!obj && is_pipeline(e) && e->o.pipeline_chunks > 1) {
            if (gpipe(e, &micro[i], tokens, &sum, err))
                return ft_fail_prefix(err, "micro-batch %d", i);
            loss += sum;
            continue;
        }
        if (!is_pipeline(e))
            dp_begin_micro(e, i == n_micro - 1);
        if (obj ? obj->run(obj->ctx, e->m, &micro[i], tokens, &sum, err)
                : ft_model_forward(e->m, &micro[i], &sum, NULL, err) ||
                      ft_model_backward(e->m, (float)(1.0 / tokens), err))
            return ft_fail_prefix(err, "micro-batch %d", i);
        /* a MoE router's load-balancing term, whole per micro-batch: the same on every
         * rank (ft_model_set_aux_reduce), so each data rank adds its share of the tokens'
         * weight, and of pipeline stages the one that computes the loss */
        if (!is_pipeline(e) || e->stage_last == ft_model_cfg(e->m)->num_layers + 1)
            loss += ft_model_aux_loss(e->m) * (is_pipeline(e) ? tokens : rank_tokens);
        loss += sum;
    }
    if (is_pipeline(e) ? pipe_finish_grads(e, err) : dp_finish_grads(e, err))
        return -1;
    e->rank_loss = is_pipeline(e) ? NAN : rank_tokens > 0 ? loss / rank_tokens : 0.0;
    size_t n = e->opt_end - e->opt_begin;
    /* the global norm: ddp ranks each hold the whole reduced gradient; shards and stages
     * sum their parts */
    double sq[3] = {n ? ft_sumsq(ft_view(owned_grad(e), n, FT_F32, e->dev), n) : 0.0, loss, 0};
    /* ranks that saw a non-finite value: summed exactly, so every rank takes the same
     * decision on the step below */
    sq[2] = isfinite(sq[0]) && isfinite(sq[1]) ? 0.0 : 1.0;
    bool partial = e->o.strategy != FT_STRATEGY_DDP && e->o.strategy != FT_STRATEGY_NONE;
    if (e->world > 1) {
        if (!partial)
            sq[0] /= e->world; /* the same value on every rank: the sum gives it back */
        if (ft_comm_allreduce(e->comm, sq, 3, FT_COMM_F64, FT_COMM_SUM, err))
            return -1;
    }
    double norm = sqrt(sq[0]);
    float coef = ft_clip_coef(norm, max_grad_norm);
    float lr = (float)ft_lr_at(sched, e->opt.step);
    /* a diverged step is not applied: weights, moments and the step count stay */
    st->nonfinite = sq[2] != 0 || !isfinite(norm) || !isfinite(sq[1]);
    if (!st->nonfinite && update(e, lr, coef, err))
        return -1;
    st->loss = sq[1] / tokens;
    st->tokens = (long)tokens;
    st->grad_norm = norm;
    st->clip_coef = coef;
    st->lr = lr;
    ft_comm_stats comm1;
    ft_comm_stats_get(e->comm, &comm1);
    ft_comm_stats_diff(&comm1, &comm0, &e->step_comm);
    e->step_s = now_s() - t0;
    if (e->profile) {
        long in_tokens = 0;
        for (int i = 0; i < n_micro; i++)
            in_tokens += (long)micro[i].B * micro[i].T;
        write_profile(e, n_micro, in_tokens);
    }
    return 0;
}

/* ---- gathered checkpoints ---- */

/* Rank 0 gets every rank's owned slice of a trainable-sized array into full, on the host
 * (rank r sends [own[r], own[r + 1]) from mine, which is on device dev; a GPU slice
 * travels through a host copy, so the collective is on host memory on every rank). */
static int gather_owned(ft_engine *e, const float *mine, ft_device dev, float *full,
                        ft_err *err)
{
    enum { TAG = 77 };
    if (e->rank != 0) {
        size_t n = e->own[e->rank + 1] - e->own[e->rank];
        if (!n)
            return 0;
        float *staged = NULL;
        if (dev != FT_DEV_CPU) {
            if (!(staged = malloc(n * sizeof *staged)))
                return ft_fail(err, "out of host memory staging %zu values", n);
            if (ft_copy_bytes(staged, FT_DEV_CPU, mine, dev, n * sizeof *staged, err)) {
                free(staged);
                return -1;
            }
        }
        int rc = ft_comm_send(e->comm, staged ? staged : mine, n, FT_COMM_F32, 0, TAG, err);
        free(staged);
        return rc;
    }
    if (ft_copy_bytes(full, FT_DEV_CPU, mine, dev, (e->own[1] - e->own[0]) * sizeof(float), err))
        return -1;
    for (int r = 1; r < e->world; r++) {
        size_t n = e->own[r + 1] - e->own[r];
        if (n && ft_comm_recv(e->comm, full + e->own[r], n, FT_COMM_F32, r, TAG, err))
            return -1;
    }
    return 0;
}

/* Whole-buffer views of the trainable weights and moments on rank 0 (borrowed when this
 * rank already holds them whole, else allocated in scratch on the host). */
typedef struct gathered {
    ft_mem scratch;
    float *params, *m, *v;
    bool own_params, own_moments;
    ft_device moments_dev; /* where m and v are */
    /* the frozen weights of the embedding's and the head's units (the first and the last;
     * compute dtype, on the host) where no rank holds them whole: gather_vocab_frozen */
    void *vocab_frozen[2];
} gathered;

static void gathered_free(gathered *g)
{
    for (int i = 0; i < 2; i++)
        ft_free(&g->scratch, g->vocab_frozen[i]);
    if (g->own_params)
        ft_free(&g->scratch, g->params);
    if (g->own_moments) {
        ft_free(&g->scratch, g->m);
        ft_free(&g->scratch, g->v);
    }
}

static int alloc_whole(gathered *g, size_t n, bool params, bool moments, ft_err *err)
{
    size_t b = n * sizeof(float);
    if (params && !(g->params = ft_alloc(&g->scratch, FT_MEM_WEIGHTS, b)))
        return ft_fail(err, "out of memory gathering %zu parameters", n);
    g->own_params = params;
    if (moments && (!(g->m = ft_alloc(&g->scratch, FT_MEM_OPTIM, b)) ||
                    !(g->v = ft_alloc(&g->scratch, FT_MEM_OPTIM, b))))
        return ft_fail(err, "out of memory gathering the optimizer state");
    g->own_moments = moments;
    g->moments_dev = FT_DEV_CPU;
    return 0;
}

/* The whole trainable buffer, and with moments the AdamW state, on rank 0. */
static int gather_all(ft_engine *e, gathered *g, bool moments, ft_err *err)
{
    memset(g, 0, sizeof *g);
    if (gather_stale_masters(e, err))
        return -1;
    /* ddp (and zero1/2 for the weights) hold whole replicas */
    bool whole_params = e->train && !is_pipeline(e);
    bool whole_moments = e->opt_begin == 0 && e->opt_end == e->n_train;
    if (e->rank == 0 && alloc_whole(g, e->n_train, !whole_params, moments && !whole_moments, err))
        return -1;
    if (whole_params)
        g->params = e->train;
    else if (gather_owned(e, owned_params(e), e->dev, g->params, err))
        return -1;
    if (!moments)
        return 0;
    if (whole_moments) {
        g->m = e->opt.m;
        g->v = e->opt.v;
        g->moments_dev = e->opt.device;
        return 0;
    }
    return gather_owned(e, e->opt.m, e->opt.device, g->m, err) ||
                   gather_owned(e, e->opt.v, e->opt.device, g->v, err)
               ? -1
               : 0;
}

/* Frozen elements [b, end) of the base (compute dtype) onto rank 0's host buffer dst,
 * each from the rank whose frozen shard (fshard: zero3 / fsdp's balanced ranges in
 * shard_frozen, model parallelism's stages in frozen) holds it. */
static int gather_frozen_range(ft_engine *e, size_t b, size_t end, char *dst, ft_err *err)
{
    enum { TAG = 79 };
    bool z3 = e->o.strategy == FT_STRATEGY_ZERO3 || e->o.strategy == FT_STRATEGY_FSDP;
    const char *mine = z3 ? (const char *)e->shard_frozen : (const char *)e->frozen;
    ft_device dev = z3 ? engine_param_dev(e) : e->dev;
    size_t es = e->cesize;
    for (int r = 0; r < e->world; r++) {
        size_t lo = b > e->fshard[r] ? b : e->fshard[r];
        size_t hi = end < e->fshard[r + 1] ? end : e->fshard[r + 1];
        if (lo >= hi || (r != e->rank && e->rank != 0))
            continue;
        size_t bytes = (hi - lo) * es;
        if (r != e->rank) { /* rank 0 receives */
            if (ft_comm_recv(e->comm, dst + (lo - b) * es, bytes, FT_COMM_BYTE, r, TAG, err))
                return -1;
            continue;
        }
        const char *src = mine + (lo - e->fshard[r]) * es;
        if (r == 0) {
            if (ft_copy_bytes(dst + (lo - b) * es, FT_DEV_CPU, src, dev, bytes, err))
                return -1;
            continue;
        }
        char *staged = dev == FT_DEV_CPU ? NULL : malloc(bytes);
        if (dev != FT_DEV_CPU && !staged)
            return ft_fail(err, "out of host memory staging %zu bytes", bytes);
        int rc = staged ? ft_copy_bytes(staged, FT_DEV_CPU, src, dev, bytes, err) : 0;
        if (rc == 0)
            rc = ft_comm_send(e->comm, staged ? staged : src, bytes, FT_COMM_BYTE, 0, TAG, err);
        free(staged);
        if (rc)
            return -1;
    }
    return 0;
}

/* The frozen weights of the first and the last unit (the embedding, the head: what an
 * adapter saves of the base, the base_layer weights of LoRA on them, a resized
 * vocabulary's tensors) on rank 0, for a save: bound there by bind_gathered. zero2 holds
 * them whole; zero3, fsdp and model parallelism are gathered (a collective). */
static int gather_vocab_frozen(ft_engine *e, gathered *g, ft_err *err)
{
    bool sharded = e->o.strategy == FT_STRATEGY_ZERO3 || e->o.strategy == FT_STRATEGY_FSDP ||
                   is_pipeline(e);
    if (e->whole || !sharded)
        return 0;
    for (int i = 0; i < 2; i++) {
        int u = i == 0 ? 0 : e->n_units - 1;
        size_t b = e->fb[u], end = e->fb[u + 1];
        if (end == b)
            continue;
        if (e->rank == 0 &&
            !(g->vocab_frozen[i] = ft_alloc(&g->scratch, FT_MEM_WEIGHTS, (end - b) * e->cesize)))
            return ft_fail(err, "out of memory gathering unit %d's frozen weights", u);
        if (gather_frozen_range(e, b, end, g->vocab_frozen[i], err))
            return -1;
    }
    return 0;
}

/* rank 0's rc to every rank */
static int agree(ft_engine *e, int rc, const char *what, ft_err *err)
{
    if (e->world == 1)
        return rc;
    int64_t v = rc;
    ft_err berr;
    if (ft_comm_broadcast(e->comm, &v, 1, FT_COMM_I64, 0, &berr))
        return ft_fail(err, "%s", berr.msg);
    if (v != 0 && e->rank != 0)
        return ft_fail(err, "rank 0 failed to %s (its error is in rank 0's log)", what);
    return rc;
}

/* Points the model at the gathered weights for a save (a whole replica is there already). */
static void bind_gathered(ft_engine *e, gathered *g)
{
    if (e->whole)
        return;
    ft_model_bind_all(e->m, (ft_unit_bufs){.master = g->params});
    /* the embedding's and the head's frozen weights: gathered, or zero2's whole buffer */
    for (int i = 0; i < 2; i++) {
        int u = i == 0 ? 0 : e->n_units - 1;
        void *frozen = g->vocab_frozen[i];
        if (!frozen && e->frozen && !is_pipeline(e) && e->o.strategy == FT_STRATEGY_ZERO2)
            frozen = engine_at(e, e->frozen, e->fb[u]);
        if (frozen)
            ft_model_bind_unit(e->m, u, (ft_unit_bufs){.master = g->params + e->ub[u],
                                                       .frozen = (float *)frozen});
    }
}

int ft_engine_save_checkpoint(ft_engine *e, const char *run_dir, const ft_train_state *st,
                              const char *base_model, int save_total_limit, char *out,
                              size_t out_len, ft_err *err)
{
    gathered g;
    int rc = gather_all(e, &g, true, err);
    if (rc == 0)
        rc = gather_vocab_frozen(e, &g, err);
    if (rc == 0 && e->rank == 0) {
        ft_optimizer whole = e->opt;
        whole.n = e->n_train;
        whole.m = g.m;
        whole.v = g.v;
        whole.device = g.moments_dev;
        bind_gathered(e, &g);
        rc = ft_checkpoint_save(run_dir, e->m, &whole, st, base_model, save_total_limit, out,
                                out_len, err);
        bind(e);
    }
    gathered_free(&g);
    return agree(e, rc, "save the checkpoint", err);
}

int ft_engine_save_weights(ft_engine *e, const char *dir, const char *base_model, ft_err *err)
{
    gathered g;
    int rc = gather_all(e, &g, false, err);
    if (rc == 0)
        rc = gather_vocab_frozen(e, &g, err);
    if (rc == 0 && e->rank == 0) {
        bind_gathered(e, &g);
        rc = ft_checkpoint_save_weights(dir, e->m, base_model, err);
        bind(e);
    }
    gathered_free(&g);
    return agree(e, rc, "save the weights", err);
}

int ft_engine_load_checkpoint(ft_engine *e, const char *path, ft_train_state *st,
                              const ft_train_state *expect, ft_err *err)
{
    /* the weights go straight into a whole replica, else into a host copy of the whole
     * buffer; the moments into a host copy, whose owned range is kept */
    gathered g = {0};
    int rc = alloc_whole(&g, e->n_train, !e->whole, true, err);
    if (rc == 0) {
        ft_optimizer whole = e->opt;
        whole.n = e->n_train;
        whole.m = g.m;
        whole.v = g.v;
        whole.device = FT_DEV_CPU;
        bind_gathered(e, &g);
        rc = ft_checkpoint_load(path, e->m, &whole, st, expect, err);
        e->opt.step = whole.step;
    }
    if (rc == 0 && e->opt_end > e->opt_begin) {
        size_t b = e->opt_begin, n = e->opt_end - b, bytes = n * sizeof(float);
        rc = ft_copy_bytes(e->opt.m, e->opt.device, g.m + b, FT_DEV_CPU, bytes, err) ||
                     ft_copy_bytes(e->opt.v, e->opt.device, g.v + b, FT_DEV_CPU, bytes, err)
                 ? -1
                 : 0;
        /* (a whole replica read its weights itself) */
        if (rc == 0 && !e->whole && e->train && !is_pipeline(e))
            rc = ft_copy_bytes(e->train, e->dev, g.params, FT_DEV_CPU,
                               e->n_train * sizeof(float), err);
        else if (rc == 0 && !e->whole)
            rc = ft_copy_bytes(owned_params(e), e->dev, g.params + b, FT_DEV_CPU, bytes, err);
        if (rc == 0 && e->tied_train)
            rc = ft_copy_bytes(e->tied_train, e->dev, g.params, FT_DEV_CPU,
                               (e->ub[1] - e->ub[0]) * sizeof(float), err);
        if (rc == 0 && e->host_master)
            rc = ft_copy_bytes(e->host_master, FT_DEV_CPU, owned_params(e), e->dev, bytes, err);
    }
    bind(e);
    engine_refresh_compute(e);
    if (rc == 0)
        e->masters_stale = false; /* every rank read the whole buffer */
    if (!is_pipeline(e))
        dp_invalidate(e);
    gathered_free(&g);
    return rc;
}
