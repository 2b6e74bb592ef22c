#include "memory/oom_advice.h"

#include <ctype.h>
#include <string.h>

#include "memory/memplan.h"

/* The make variable of a config key: train.batch_size -> TRAIN_BATCH_SIZE. */
static void var_of(const char *key, char *out, size_t len)
{
    size_t i = 0;
    for (; key[i] && i + 1 < len; i++)
        out[i] = key[i] == '.' ? '_' : (char)toupper((unsigned char)key[i]);
    out[i] = '\0';
}

typedef struct advisor {
    const ft_config *cfg;
    const ft_oom_context *ctx;
    size_t budget;
    FILE *out;
    int offered;
} advisor;

/* The run's config with up to two keys changed (value NULL: unchanged); its peak per
 * rank at world ranks, or 0 when it cannot be planned (an invalid combination). */
static size_t peak_with(const advisor *a, int world, const char *k1, const char *v1,
                        const char *k2, const char *v2)
{
    ft_config *c = ft_config_clone(a->cfg);
    if (!c)
        return 0;
    ft_err err;
    size_t peak = 0;
    if ((!k1 || ft_config_set_key(c, k1, v1, "oom advice", NULL, &err) == 0) &&
        (!k2 || ft_config_set_key(c, k2, v2, "oom advice", NULL, &err) == 0) &&
        ft_plan_peak(c, world, a->ctx->dev, &peak, NULL, &err) != 0)
        peak = 0;
    ft_config_free(c);
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

/* One key set to value (not its value now), offered when it fits. */
static void try_key(advisor *a, const char *key, const char *value)
{
    size_t peak = peak_with(a, a->ctx->world_size, key, value, NULL, NULL);
    if (!fits(a, peak))
        return;
    char var[64], how[160];
    var_of(key, var, sizeof var);
    snprintf(how, sizeof how, "%s=%s", var, value);
    offer(a, how, peak);
}

/* The largest micro-batch below the run's that fits; the accumulation grows with it
 * when that keeps the global batch. */
static void try_batch(advisor *a)
{
    long b = ft_config_int(a->cfg, "train.batch_size");
    long accum = ft_config_int(a->cfg, "train.grad_accum");
    for (long nb = b - 1; nb >= 1; nb--) {
        char v[32], va[32];
        snprintf(v, sizeof v, "%ld", nb);
        bool keep = (b * accum) % nb == 0;
        snprintf(va, sizeof va, "%ld", keep ? b * accum / nb : accum);
        size_t peak = peak_with(a, a->ctx->world_size, "train.batch_size", v,
                                keep ? "train.grad_accum" : NULL, va);
        if (!fits(a, peak))
            continue;
        char how[160];
        snprintf(how, sizeof how, "TRAIN_BATCH_SIZE=%ld%s%s%s", nb,
                 keep ? " TRAIN_GRAD_ACCUM=" : "", keep ? va : "",
                 keep ? " (same global batch)" : "");
        offer(a, how, peak);
        return;
    }
}

/* The longest power-of-two sequence length below the run's (>= 128) that fits. */
static void try_seq_len(advisor *a)
{
    long t = ft_config_int(a->cfg, "model.max_seq_len");
    long p = 128;
    while (p * 2 < t)
        p *= 2;
    for (; p >= 128 && p < t; p /= 2) {
        char v[32];
        snprintf(v, sizeof v, "%ld", p);
        size_t peak = peak_with(a, a->ctx->world_size, "model.max_seq_len", v, NULL, NULL);
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
    static const char *const stages[] = {"zero1", "zero2", "zero3"};
    int n = (int)(sizeof stages / sizeof *stages);
    const char *now = ft_config_str(a->cfg, "dist.strategy");
    for (int w = a->ctx->world_size > 1 ? a->ctx->world_size : 2; w <= 16; w *= 2) {
        for (int i = 0; i < n; i++) {
            if (w == a->ctx->world_size && !strcmp(now, stages[i]))
                continue;
            size_t peak = peak_with(a, w, "dist.strategy", stages[i], NULL, NULL);
            if (!fits(a, peak))
                continue;
            char how[160], ranks[32] = "";
            if (w != a->ctx->world_size)
                snprintf(ranks, sizeof ranks, " NUM_GPUS=%d", w);
            snprintf(how, sizeof how, "make train-zero ZERO_STAGE=%c%s (%s on %d ranks)",
                     stages[i][4], ranks, stages[i], w);
            offer(a, how, peak);
            return;
        }
        if (a->ctx->world_size > 1)
            return; /* more ranks than the run has: the user knows that lever */
    }
}

void ft_oom_advice(const ft_config *cfg, const ft_oom_context *ctx, FILE *out)
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
    } else if (ft_rank_memory_budget(cfg, ctx->dev, ctx->device_index, ctx->local_ranks,
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
    advisor a = {cfg, ctx, budget.bytes, out, 0};
    try_batch(&a);
    if (!ft_config_bool(cfg, "train.gradient_checkpointing"))
        try_key(&a, "train.gradient_checkpointing", "true");
    if (!ft_config_is_auto(cfg, "train.loss_chunk_tokens"))
        try_key(&a, "train.loss_chunk_tokens", "auto");
    try_seq_len(&a);
    const char *strategy = ft_config_str(cfg, "dist.strategy");
    if (strcmp(strategy, "model_parallel") != 0 &&
        strcmp(ft_config_str(cfg, "dist.offload_optimizer"), "cpu") != 0)
        try_key(&a, "dist.offload_optimizer", "cpu");
    try_strategies(&a);
    if (!strcmp(ft_config_str(cfg, "tuning.mode"), "lora"))
        try_key(&a, "tuning.mode", "qlora");
    if (!a.offered)
        fprintf(out, "no single override fits by the plan: combine them (a smaller batch with "
                     "gradient checkpointing and shorter sequences), or use more ranks\n");
}
