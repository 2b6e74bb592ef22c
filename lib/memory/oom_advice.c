#include "memory/oom_advice.h"

#include <stdlib.h>
#include <string.h>

#include "memory/memplan.h"

typedef struct advisor {
    const ft_run_config *cfg;
    const ft_oom_context *ctx;
    size_t budget;
    FILE *out;
    int offered;
    ft_run_config *variant; /* scratch: the run's config with one change */
} advisor;

/* A copy of the run's config in a->variant, to change one thing in. */
static ft_run_config *variant(advisor *a)
{
    *a->variant = *a->cfg;
    return a->variant;
}

/* a->variant's peak per rank at world ranks, or 0 when it cannot be planned (an invalid
 * combination). */
static size_t variant_peak(const advisor *a, int world)
{
    ft_err err;
    size_t peak = 0;
    if (ft_plan_peak(a->variant, world, a->ctx->dev, &peak, NULL, &err) != 0)
        peak = 0;
    return peak;
}

static bool fits(const advisor *a, size_t peak) { return peak && peak <= a->budget; }

static void offer(advisor *a, const char *how, size_t peak)
{
    if (!a->offered++)
        fprintf(a->out, "overrides that fit by the plan (make train VAR=value, or ft-train "
                        "--set key=value):\n");
    fprintf(a->out, "  %-52s plans %.1f MiB\n", how, ft_mib(peak));
}

/* a->variant, described by how (the make variable and value), offered when it fits. */
static void try_variant(advisor *a, const char *how)
{
    size_t peak = variant_peak(a, a->ctx->world_size);
    if (fits(a, peak))
        offer(a, how, peak);
}

/* The largest micro-batch below the run's that fits; the accumulation grows with it
 * when that keeps the global batch. */
static void try_batch(advisor *a)
{
    long b = a->cfg->train.batch_size, accum = a->cfg->train.grad_accum;
    for (long nb = b - 1; nb >= 1; nb--) {
        bool keep = (b * accum) % nb == 0;
        ft_run_config *v = variant(a);
        v->train.batch_size = nb;
        if (keep)
            v->train.grad_accum = b * accum / nb;
        size_t peak = variant_peak(a, a->ctx->world_size);
        if (!fits(a, peak))
            continue;
        char how[160];
        if (keep)
            snprintf(how, sizeof how, "TRAIN_BATCH_SIZE=%ld TRAIN_GRAD_ACCUM=%ld (same global "
                                      "batch)",
                     nb, v->train.grad_accum);
        else
            snprintf(how, sizeof how, "TRAIN_BATCH_SIZE=%ld", nb);
        offer(a, how, peak);
        return;
    }
}

/* The longest power-of-two sequence length below the run's (>= 128) that fits. */
static void try_seq_len(advisor *a)
{
    long t = a->cfg->model.max_seq_len;
    long p = 128;
    while (p * 2 < t)
        p *= 2;
    for (; p >= 128 && p < t; p /= 2) {
        variant(a)->model.max_seq_len = p;
        size_t peak = variant_peak(a, a->ctx->world_size);
        if (fits(a, peak)) {
            char how[160];
            snprintf(how, sizeof how, "MODEL_MAX_SEQ_LEN=%ld", p);
            offer(a, how, peak);
            return;
        }
    }
}

/* Sharded strategies: at the run's world size, or with more ranks from one. */
static void try_strategies(advisor *a)
{
    static const ft_cfg_strategy stages[] = {FT_CFG_STRATEGY_ZERO1, FT_CFG_STRATEGY_ZERO2,
                                             FT_CFG_STRATEGY_ZERO3};
    int n = (int)(sizeof stages / sizeof *stages);
    ft_cfg_strategy now = a->cfg->dist.strategy;
    for (int w = a->ctx->world_size > 1 ? a->ctx->world_size : 2; w <= 16; w *= 2) {
        for (int i = 0; i < n; i++) {
            if (w == a->ctx->world_size && now == stages[i])
                continue;
            variant(a)->dist.strategy = stages[i];
            size_t peak = variant_peak(a, w);
            if (!fits(a, peak))
                continue;
            char how[160], ranks[32] = "";
            if (w != a->ctx->world_size)
                snprintf(ranks, sizeof ranks, " NUM_GPUS=%d", w);
            snprintf(how, sizeof how, "make train-zero ZERO_STAGE=%d%s (zero%d on %d ranks)",
                     i + 1, ranks, i + 1, w);
            offer(a, how, peak);
            return;
        }
        if (a->ctx->world_size > 1)
            return; /* more ranks than the run has: the user knows that lever */
    }
}

void ft_oom_advice(const ft_run_config *cfg, const ft_oom_context *ctx, FILE *out)
{
    bool gpu = ctx->dev == FT_MEM_DEVICE_CUDA;
    char where[32] = "";
    if (gpu)
        snprintf(where, sizeof where, " (GPU %d)", ctx->device_index);
    fprintf(out, "ft-train: out of memory on rank %d%s. The plan of this run, per rank:\n",
            ctx->rank, where);
    ft_err err;
    ft_memplan_result *r = malloc(sizeof *r);
    if (!r || ft_memplan_config(cfg, ctx->world_size, r, &err)) {
        fprintf(out, "  (no plan: %s)\n", r ? err.msg : "out of memory");
        free(r);
        return;
    }
    ft_memplan_print(r, out);
    free(r);

    ft_mem_budget budget = {0};
    if (ctx->limit) {
        budget.bytes = ctx->limit;
        snprintf(budget.source, sizeof budget.source, "FT_MEM_LIMIT");
    } else if (ft_rank_memory_budget(&cfg->train, ctx->dev, ctx->device_index, ctx->local_ranks,
                                     &budget, &err)) {
        fprintf(out, "  (no budget to compare with: %s)\n", err.msg);
        return;
    }
    size_t peak = 0;
    const char *row = "?";
    if (ft_plan_peak(cfg, ctx->world_size, ctx->dev, &peak, &row, &err)) {
        fprintf(out, "  (%s)\n", err.msg);
        return;
    }
    fprintf(out, "budget per rank: %.1f MiB (%s); this run plans %.1f MiB (%s)%s\n",
            ft_mib(budget.bytes), budget.source, ft_mib(peak), row,
            gpu ? ", without the CUDA context and library workspaces" : "");
    advisor a = {cfg, ctx, budget.bytes, out, 0, malloc(sizeof *a.variant)};
    if (!a.variant) {
        fprintf(out, "  (no overrides: out of memory)\n");
        return;
    }
    try_batch(&a);
    if (!cfg->train.gradient_checkpointing) {
        variant(&a)->train.gradient_checkpointing = true;
        try_variant(&a, "TRAIN_GRADIENT_CHECKPOINTING=true");
    }
    if (cfg->train.loss_chunk_tokens != FT_CFG_AUTO) {
        variant(&a)->train.loss_chunk_tokens = FT_CFG_AUTO;
        try_variant(&a, "TRAIN_LOSS_CHUNK_TOKENS=auto");
    }
    try_seq_len(&a);
    if (cfg->dist.strategy != FT_CFG_STRATEGY_MODEL_PARALLEL &&
        cfg->dist.offload_optimizer != FT_CFG_OFFLOAD_CPU) {
        variant(&a)->dist.offload_optimizer = FT_CFG_OFFLOAD_CPU;
        try_variant(&a, "DIST_OFFLOAD_OPTIMIZER=cpu");
    }
    try_strategies(&a);
    if (cfg->tuning.mode == FT_TUNING_LORA) {
        variant(&a)->tuning.mode = FT_TUNING_QLORA;
        try_variant(&a, "TUNING_MODE=qlora");
    }
    free(a.variant);
    if (!a.offered)
        fprintf(out, "no single override fits by the plan: combine them (a smaller batch with "
                     "gradient checkpointing and shorter sequences), or use more ranks\n");
}
