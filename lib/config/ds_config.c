/* DeepSpeed JSON onto a run config under construction (see ds_config.h). One table names every DeepSpeed
 * key we know by its JSON path. The walk looks each key of the file up, checks its JSON
 * type, and then maps it onto one of our keys, hands it to a handler (keys whose mapping is
 * more than a copy), or prints why it has no effect here. Our keys set from the file are
 * remembered with the JSON path they came from, so that two sources that disagree (the
 * user's config and the file, or two keys of the file) are reported by name. */
#include "config/ds_config.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum ds_type {
    DS_OBJECT = 0, /* a section: its keys are walked */
    DS_INT,        /* an integer (5e8 is accepted when integral) */
    DS_NUMBER,
    DS_BOOL,
    DS_STRING,
    DS_BETAS, /* a list of two numbers */
    DS_ANY    /* any value (opaque sections we do not read) */
} ds_type;

typedef struct ds_ctx ds_ctx;
typedef struct ds_key ds_key;

/* A key whose mapping is more than a copy; v is neither "auto" nor null. */
typedef int (*ds_fn)(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err);

struct ds_key {
    const char *path; /* "zero_optimization.stage" */
    ds_type type;
    const char *ours; /* our key the value is copied to, or NULL */
    ds_fn apply;      /* special mapping, or NULL */
    const char *moot; /* without apply: accepted without effect, and why (printed as a
                         notice); with apply: the handler's own message */
};

#define DS_MAX_SET 48

struct ds_ctx {
    ft_config *c;
    const char *path; /* the JSON file, for messages */
    FILE *notes;
    struct {
        const char *ours;
        char from[96];  /* JSON path */
        char shown[80]; /* the JSON value as written */
    } set[DS_MAX_SET];
    int n_set;
    int stage;    /* zero_optimization.stage; -1 when absent or auto */
    bool adam;    /* optimizer.type Adam (not AdamW) */
};

/* ---- helpers ------------------------------------------------------------------ */

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown JSON value";
}

static bool is_auto(const json_t *v)
{
    return json_is_null(v) || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0);
}

static void note(const ds_ctx *x, const char *key, const char *why)
{
    if (x->notes)
        fprintf(x->notes, "note: %s: '%s' has no effect here: %s\n", x->path, key, why);
}

static int type_error(const ds_ctx *x, const char *key, const char *want, const json_t *v,
                      ft_err *err)
{
    return ft_fail(err, "%s: '%s' must be %s (or \"auto\"), got %s", x->path, key, want,
                   json_kind(v));
}

/* The shortest text that reads back as d (messages show 0.0002, not 0.00020000000000000001). */
static void shortest(double d, char *out, size_t n)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, d);
        if (strtod(out, NULL) == d)
            return;
    }
}

/* The canonical text of a leaf value of type t, checked. */
static int leaf_text(const ds_ctx *x, const char *key, ds_type t, const json_t *v, char *out,
                     size_t n, ft_err *err)
{
    switch (t) {
    case DS_INT:
        if (json_is_integer(v)) {
            snprintf(out, n, "%lld", (long long)json_integer_value(v));
            return 0;
        }
        if (json_is_real(v)) {
            double d = json_real_value(v);
            if (d == floor(d) && fabs(d) <= 9007199254740992.0) {
                snprintf(out, n, "%.0f", d);
                return 0;
            }
        }
        return type_error(x, key, "an integer", v, err);
    case DS_NUMBER:
        if (json_is_integer(v)) {
            snprintf(out, n, "%lld", (long long)json_integer_value(v));
            return 0;
        }
        if (json_is_real(v)) {
            shortest(json_real_value(v), out, n);
            return 0;
        }
        return type_error(x, key, "a number", v, err);
    case DS_BOOL:
        if (!json_is_boolean(v))
            return type_error(x, key, "true or false", v, err);
        snprintf(out, n, "%s", json_is_true(v) ? "true" : "false");
        return 0;
    case DS_STRING:
        if (!json_is_string(v))
            return type_error(x, key, "a string", v, err);
        snprintf(out, n, "%s", json_string_value(v));
        return 0;
    case DS_OBJECT:
    case DS_BETAS:
    case DS_ANY:
        break;
    }
    out[0] = '\0';
    return 0;
}

static ft_cfg_type key_type(const char *ours)
{
    for (const ft_cfg_key *k = ft_config_schema(); k->name; k++)
        if (strcmp(k->name, ours) == 0)
            return k->type;
    fprintf(stderr, "internal error: DeepSpeed mapping names unknown key '%s'\n", ours);
    abort();
}

/* Our current value of key as text, for messages. */
static void our_text(const ft_config *c, const char *key, char *out, size_t n)
{
    switch (key_type(key)) {
    case FT_CFG_INT: snprintf(out, n, "%ld", ft_config_int(c, key)); break;
    case FT_CFG_FLOAT: snprintf(out, n, "%g", ft_config_float(c, key)); break;
    case FT_CFG_BOOL: snprintf(out, n, "%s", ft_config_bool(c, key) ? "true" : "false"); break;
    default: snprintf(out, n, "%s", ft_config_str(c, key) ? ft_config_str(c, key) : ""); break;
    }
}

/* Whether our key already holds the value text means. */
static bool same_value(const ft_config *c, const char *key, const char *text)
{
    switch (key_type(key)) {
    case FT_CFG_INT: return strtol(text, NULL, 10) == ft_config_int(c, key);
    case FT_CFG_FLOAT: {
        double a = strtod(text, NULL), b = ft_config_float(c, key);
        return fabs(a - b) <= 1e-12 * fmax(fabs(a), fabs(b));
    }
    case FT_CFG_BOOL: return (strcmp(text, "true") == 0) == ft_config_bool(c, key);
    default: return ft_config_str(c, key) && strcmp(text, ft_config_str(c, key)) == 0;
    }
}

static int set_index(const ds_ctx *x, const char *ours)
{
    for (int i = 0; i < x->n_set; i++)
        if (strcmp(x->set[i].ours, ours) == 0)
            return i;
    return -1;
}

static bool from_file(const ds_ctx *x, const char *ours) { return set_index(x, ours) >= 0; }

static int remember(ds_ctx *x, const char *ours, const char *from, const char *shown)
{
    if (from_file(x, ours))
        return 0;
    FT_CHECK(x->n_set < DS_MAX_SET);
    x->set[x->n_set].ours = ours;
    snprintf(x->set[x->n_set].from, sizeof x->set[0].from, "%s", from);
    snprintf(x->set[x->n_set].shown, sizeof x->set[0].shown, "%s", shown);
    x->n_set++;
    return 0;
}

/* Sets our key from the JSON key `from` (value text; shown: as the file wrote it) unless
 * the user gave it a different concrete value, or another key of the file did. */
static int put(ds_ctx *x, const char *ours, const char *text, const char *from,
               const char *shown, ft_err *err)
{
    int i = set_index(x, ours);
    if (i >= 0) {
        if (same_value(x->c, ours, text))
            return 0;
        return ft_fail(err, "%s: %s = %s contradicts %s = %s (both set %s)", x->path, from,
                       shown, x->set[i].from, x->set[i].shown, ours);
    }
    if (ft_config_is_explicit(x->c, ours) && !ft_config_is_auto(x->c, ours) &&
        !same_value(x->c, ours, text)) {
        char have[64];
        our_text(x->c, ours, have, sizeof have);
        return ft_fail(err, "mismatch: %s = %s in the config but %s = %s in %s", ours, have,
                       from, shown, x->path);
    }
    char where[256];
    snprintf(where, sizeof where, "%s: %s", x->path, from);
    if (ft_config_set_key(x->c, ours, text, where, NULL, err))
        return -1;
    return remember(x, ours, from, shown);
}

/* ---- handlers -------------------------------------------------------------------- */

/* zero_optimization.stage: 0 is plain data parallelism, 1-3 the ZeRO stages. */
static int h_stage(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[32];
    if (leaf_text(x, k->path, DS_INT, v, text, sizeof text, err))
        return -1;
    long stage = strtol(text, NULL, 10);
    if (stage < 0 || stage > 3)
        return ft_fail(err, "%s: '%s' must be 0, 1, 2 or 3, got %ld", x->path, k->path, stage);
    static const char *const strategy[] = {"ddp", "zero1", "zero2", "zero3"};
    const char *have = ft_config_str(x->c, "dist.strategy");
    if (ft_config_is_explicit(x->c, "dist.strategy") && !from_file(x, "dist.strategy") &&
        strcmp(have, "auto") != 0) {
        long means = !strcmp(have, "ddp")          ? 0
                     : !strncmp(have, "zero", 4) ? ft_run_config_zero_stage(&ft_config_values(x->c)->dist)
                                                 : -1;
        if (means != stage)
            return ft_fail(err, "mismatch: dist.strategy = %s in the config but %s = %ld in %s",
                           have, k->path, stage, x->path);
    }
    if (put(x, "dist.zero_stage", text, k->path, text, err))
        return -1;
    char where[256];
    snprintf(where, sizeof where, "%s: %s", x->path, k->path);
    if (ft_config_set_key(x->c, "dist.strategy", strategy[stage], where, NULL, err))
        return -1;
    x->stage = (int)stage;
    return remember(x, "dist.strategy", k->path, text);
}

/* zero_optimization.offload_optimizer.device: none or cpu. */
static int h_offload_device(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[32];
    if (leaf_text(x, k->path, DS_STRING, v, text, sizeof text, err))
        return -1;
    if (!strcmp(text, "nvme"))
        return ft_fail(err, "%s: '%s' = \"nvme\": NVMe offload (ZeRO-Infinity) is not supported; "
                            "use \"cpu\" or \"none\"",
                       x->path, k->path);
    if (strcmp(text, "cpu") && strcmp(text, "none"))
        return ft_fail(err, "%s: '%s' must be \"none\", \"cpu\" or \"nvme\", got \"%s\"",
                       x->path, k->path, text);
    return put(x, "dist.offload_optimizer", text, k->path, text, err);
}

/* zero_optimization.cpu_offload: DeepSpeed's older spelling of optimizer offload. */
static int h_cpu_offload(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[8];
    if (leaf_text(x, k->path, DS_BOOL, v, text, sizeof text, err))
        return -1;
    return put(x, "dist.offload_optimizer", json_is_true(v) ? "cpu" : "none", k->path, text,
               err);
}

/* zero_optimization.offload_param.device: none or cpu (dist.offload_params; stage 3). */
static int h_param_device(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[32];
    if (leaf_text(x, k->path, DS_STRING, v, text, sizeof text, err))
        return -1;
    if (!strcmp(text, "nvme"))
        return ft_fail(err, "%s: '%s' = \"nvme\": NVMe parameter offload (ZeRO-Infinity) is not "
                            "supported; use \"cpu\" or \"none\"",
                       x->path, k->path);
    if (strcmp(text, "cpu") && strcmp(text, "none"))
        return ft_fail(err, "%s: '%s' must be \"none\", \"cpu\" or \"nvme\", got \"%s\"",
                       x->path, k->path, text);
    return put(x, "dist.offload_params", text, k->path, text, err);
}

/* zero_optimization.reduce_bucket_size: bytes (often written 5e8) -> whole MiB, rounded up. */
static int h_bucket(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[32];
    if (leaf_text(x, k->path, DS_NUMBER, v, text, sizeof text, err))
        return -1;
    double bytes = strtod(text, NULL);
    if (!(bytes >= 1) || bytes > 1e15)
        return ft_fail(err, "%s: '%s' must be a size in bytes >= 1, got %s", x->path, k->path,
                       text);
    char mib[24], shown[80];
    snprintf(mib, sizeof mib, "%.0f", ceil(bytes / 1048576.0));
    snprintf(shown, sizeof shown, "%s (%s MiB)", text, mib);
    return put(x, "train.ddp_bucket_cap_mb", mib, k->path, shown, err);
}

/* optimizer.type: Adam or AdamW (both run as AdamW). */
static int h_opt_type(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[64];
    if (leaf_text(x, k->path, DS_STRING, v, text, sizeof text, err))
        return -1;
    if (!strcasecmp(text, "AdamW"))
        return 0;
    if (!strcasecmp(text, "Adam")) {
        x->adam = true;
        return 0;
    }
    return ft_fail(err, "%s: optimizer type '%s' is not supported: ftkit trains with AdamW (use "
                        "\"AdamW\", or \"Adam\", which runs as AdamW)",
                   x->path, text);
}

/* optimizer.params.betas: [beta1, beta2], either may be "auto". */
static int h_betas(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    if (!json_is_array(v) || json_array_size(v) != 2)
        return type_error(x, k->path, "a list of two numbers", v, err);
    static const char *const ours[] = {"train.adam_beta1", "train.adam_beta2"};
    for (size_t i = 0; i < 2; i++) {
        json_t *b = json_array_get(v, i);
        if (is_auto(b))
            continue;
        char from[96], text[32];
        snprintf(from, sizeof from, "%s[%zu]", k->path, i);
        if (leaf_text(x, from, DS_NUMBER, b, text, sizeof text, err))
            return -1;
        if (put(x, ours[i], text, from, text, err))
            return -1;
    }
    return 0;
}

/* optimizer.params.adam_w_mode / bias_correction: only the AdamW we implement. */
static int h_only_true(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[8];
    if (leaf_text(x, k->path, DS_BOOL, v, text, sizeof text, err))
        return -1;
    if (json_is_false(v))
        return ft_fail(err, "%s: '%s' = false is not supported: %s", x->path, k->path, k->moot);
    return 0;
}

/* scheduler.type -> train.lr_scheduler (the schedule after warmup). */
static int h_sched_type(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[64];
    if (leaf_text(x, k->path, DS_STRING, v, text, sizeof text, err))
        return -1;
    static const char *const map[][2] = {
        {"WarmupLR", "constant"}, {"WarmupDecayLR", "linear"}, {"WarmupCosineLR", "cosine"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(text, map[i][0]))
            return put(x, "train.lr_scheduler", map[i][1], k->path, text, err);
    return ft_fail(err, "%s: scheduler type '%s' is not supported (WarmupLR, WarmupDecayLR or "
                        "WarmupCosineLR)",
                   x->path, text);
}

/* A number we do not use but that means what we do at 0: a notice otherwise. */
static int h_notice_unless_zero(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[32];
    if (leaf_text(x, k->path, DS_NUMBER, v, text, sizeof text, err))
        return -1;
    if (strtod(text, NULL) != 0)
        note(x, k->path, k->moot);
    return 0;
}

/* scheduler.params.warmup_type: log or linear; we warm up linearly. */
static int h_warmup_type(ds_ctx *x, const ds_key *k, json_t *v, ft_err *err)
{
    char text[32];
    if (leaf_text(x, k->path, DS_STRING, v, text, sizeof text, err))
        return -1;
    if (strcmp(text, "linear") && strcmp(text, "log"))
        return ft_fail(err, "%s: '%s' must be \"linear\" or \"log\", got \"%s\"", x->path,
                       k->path, text);
    if (strcmp(text, "linear"))
        note(x, k->path, k->moot);
    return 0;
}

/* ---- the keys ---------------------------------------------------------------------- */

#define ZO "zero_optimization."
#define OO "zero_optimization.offload_optimizer."
#define OP "zero_optimization.offload_param."
#define AC "activation_checkpointing."
#define LOSS_SCALE "fp16 loss scaling is the trainer's own and not configured"

static const ds_key keys[] = {
    /* batch and step */
    {"train_micro_batch_size_per_gpu", DS_INT, "train.batch_size", NULL, NULL},
    {"gradient_accumulation_steps", DS_INT, "train.grad_accum", NULL, NULL},
    {"train_batch_size", DS_INT, "train.global_batch_size", NULL, NULL},
    {"gradient_clipping", DS_NUMBER, "train.max_grad_norm", NULL, NULL},
    {"steps_per_print", DS_INT, "train.logging_steps", NULL, NULL},

    /* ZeRO */
    {"zero_optimization", DS_OBJECT, NULL, NULL, NULL},
    {ZO "stage", DS_INT, NULL, h_stage, NULL},
    {ZO "offload_optimizer", DS_OBJECT, NULL, NULL, NULL},
    {OO "device", DS_STRING, NULL, h_offload_device, NULL},
    {OO "pin_memory", DS_BOOL, NULL, NULL,
     "offloaded optimizer state is always in pinned memory"},
    {OO "buffer_count", DS_INT, NULL, NULL, "used by NVMe offload only"},
    {OO "fast_init", DS_BOOL, NULL, NULL, "used by NVMe offload only"},
    {OO "nvme_path", DS_STRING, NULL, NULL, "used by NVMe offload only"},
    {ZO "cpu_offload", DS_BOOL, NULL, h_cpu_offload, NULL},
    {ZO "offload_param", DS_OBJECT, NULL, NULL, NULL},
    {OP "device", DS_STRING, NULL, h_param_device, NULL},
    {OP "pin_memory", DS_BOOL, NULL, NULL,
     "the offloaded parameter shard is copied in per layer from ordinary host memory"},
    {OP "buffer_count", DS_INT, NULL, NULL, "used by NVMe offload only"},
    {OP "buffer_size", DS_INT, NULL, NULL, "used by NVMe offload only"},
    {OP "max_in_cpu", DS_INT, NULL, NULL, "used by NVMe offload only"},
    {OP "nvme_path", DS_STRING, NULL, NULL, "used by NVMe offload only"},
    {ZO "reduce_bucket_size", DS_NUMBER, NULL, h_bucket, NULL},
    {ZO "overlap_comm", DS_BOOL, "dist.overlap_comm", NULL, NULL},
    {ZO "contiguous_gradients", DS_BOOL, NULL, NULL,
     "gradients always live in one flat buffer per rank"},
    {ZO "reduce_scatter", DS_BOOL, NULL, NULL,
     "ZeRO always reduce-scatters gradients to the rank that owns them"},
    {ZO "allgather_partitions", DS_BOOL, NULL, NULL,
     "updated parameters are always all-gathered from their owners"},
    {ZO "allgather_bucket_size", DS_NUMBER, NULL, NULL,
     "parameters are all-gathered a layer at a time, not in byte buckets"},
    {ZO "round_robin_gradients", DS_BOOL, NULL, NULL,
     "each rank's gradient partition is one contiguous range"},
    {ZO "sub_group_size", DS_NUMBER, NULL, NULL,
     "the optimizer steps over each rank's shard in one pass"},
    {ZO "stage3_prefetch_bucket_size", DS_NUMBER, NULL, NULL,
     "zero3 prefetches one layer ahead (dist.prefetch), not a byte budget"},
    {ZO "stage3_param_persistence_threshold", DS_NUMBER, NULL, NULL,
     "every layer is sharded; small tensors (norms) are gathered with their layer"},
    {ZO "stage3_max_live_parameters", DS_NUMBER, NULL, NULL,
     "at most the current and the prefetched layer are gathered at a time"},
    {ZO "stage3_max_reuse_distance", DS_NUMBER, NULL, NULL,
     "a gathered layer is released after use and gathered again in backward"},
    {ZO "stage3_gather_16bit_weights_on_model_save", DS_BOOL, NULL, NULL,
     "we always gather on save: checkpoints hold whole tensors"},
    {ZO "stage3_gather_fp16_weights_on_model_save", DS_BOOL, NULL, NULL,
     "we always gather on save: checkpoints hold whole tensors"},
    {ZO "elastic_checkpoint", DS_BOOL, NULL, NULL,
     "checkpoints hold whole tensors, so any number of ranks can resume them"},
    {ZO "load_from_fp32_weights", DS_BOOL, NULL, NULL,
     "resume restores the weights and optimizer state exactly as saved"},
    {ZO "ignore_unused_parameters", DS_BOOL, NULL, NULL,
     "the explicit backward always knows which parameters are used"},

    /* precision */
    {"bf16", DS_OBJECT, NULL, NULL, NULL},
    {"bf16.enabled", DS_BOOL, "train.bf16", NULL, NULL},
    {"bfloat16", DS_OBJECT, NULL, NULL, NULL},
    {"bfloat16.enabled", DS_BOOL, "train.bf16", NULL, NULL},
    {"fp16", DS_OBJECT, NULL, NULL, NULL},
    {"fp16.enabled", DS_BOOL, "train.fp16", NULL, NULL},
    {"fp16.loss_scale", DS_NUMBER, NULL, NULL, LOSS_SCALE},
    {"fp16.initial_scale_power", DS_INT, NULL, NULL, LOSS_SCALE},
    {"fp16.loss_scale_window", DS_INT, NULL, NULL, LOSS_SCALE},
    {"fp16.hysteresis", DS_INT, NULL, NULL, LOSS_SCALE},
    {"fp16.consecutive_hysteresis", DS_BOOL, NULL, NULL, LOSS_SCALE},
    {"fp16.min_loss_scale", DS_NUMBER, NULL, NULL, LOSS_SCALE},
    {"fp16.auto_cast", DS_BOOL, NULL, NULL, "inputs are token ids; there is nothing to cast"},

    /* optimizer and schedule */
    {"optimizer", DS_OBJECT, NULL, NULL, NULL},
    {"optimizer.type", DS_STRING, NULL, h_opt_type, NULL},
    {"optimizer.params", DS_OBJECT, NULL, NULL, NULL},
    {"optimizer.params.lr", DS_NUMBER, "train.learning_rate", NULL, NULL},
    {"optimizer.params.betas", DS_BETAS, NULL, h_betas, NULL},
    {"optimizer.params.eps", DS_NUMBER, "train.adam_epsilon", NULL, NULL},
    {"optimizer.params.weight_decay", DS_NUMBER, "train.weight_decay", NULL, NULL},
    {"optimizer.params.adam_w_mode", DS_BOOL, NULL, h_only_true,
     "weight decay is always decoupled (AdamW)"},
    {"optimizer.params.bias_correction", DS_BOOL, NULL, h_only_true,
     "AdamW always corrects the moment bias"},
    {"optimizer.params.torch_adam", DS_BOOL, NULL, NULL,
     "there is one AdamW kernel per backend"},
    {"scheduler", DS_OBJECT, NULL, NULL, NULL},
    {"scheduler.type", DS_STRING, NULL, h_sched_type, NULL},
    {"scheduler.params", DS_OBJECT, NULL, NULL, NULL},
    {"scheduler.params.warmup_num_steps", DS_INT, "train.warmup_steps", NULL, NULL},
    {"scheduler.params.warmup_max_lr", DS_NUMBER, "train.learning_rate", NULL, NULL},
    {"scheduler.params.total_num_steps", DS_INT, "train.max_steps", NULL, NULL},
    {"scheduler.params.warmup_min_lr", DS_NUMBER, NULL, h_notice_unless_zero,
     "the warmup always starts from a learning rate of 0"},
    {"scheduler.params.warmup_min_ratio", DS_NUMBER, NULL, h_notice_unless_zero,
     "the warmup always starts from a learning rate of 0"},
    {"scheduler.params.cos_min_ratio", DS_NUMBER, NULL, h_notice_unless_zero,
     "the cosine schedule always decays to 0"},
    {"scheduler.params.warmup_type", DS_STRING, NULL, h_warmup_type,
     "the warmup is always linear"},
    {"scheduler.params.last_batch_iteration", DS_INT, NULL, NULL,
     "resuming restores the schedule's position from the checkpoint"},

    /* accepted, without effect */
    {"wall_clock_breakdown", DS_BOOL, NULL, NULL,
     "the log reports throughput (tok/s) every train.logging_steps"},
    {"zero_allow_untested_optimizer", DS_BOOL, NULL, NULL,
     "the optimizer is always ftkit's own AdamW"},
    {"zero_force_ds_cpu_optimizer", DS_BOOL, NULL, NULL,
     "with dist.offload_optimizer cpu the update always runs in ftkit's CPU AdamW"},
    {"communication_data_type", DS_ANY, NULL, NULL,
     "collectives run in the dtype the trainer keeps the gradients in"},
    {"prescale_gradients", DS_BOOL, NULL, NULL,
     "gradients are averaged over ranks in the reduction itself"},
    {"gradient_predivide_factor", DS_NUMBER, NULL, NULL,
     "gradients are averaged over ranks in the reduction itself"},
    {"flops_profiler", DS_ANY, NULL, NULL,
     "there is no per-module profiler; the log reports throughput (tok/s)"},
    {"tensorboard", DS_ANY, NULL, NULL,
     "TensorBoard events are always written to the run dir (train.output_dir)"},
    {"amp", DS_ANY, NULL, NULL, "mixed precision is bf16 / fp16 (train.bf16, train.fp16)"},
    {"activation_checkpointing", DS_OBJECT, NULL, NULL,
     "activation checkpointing is train.gradient_checkpointing (every layer recomputed in "
     "backward)"},
    {AC "partition_activations", DS_BOOL, NULL, NULL,
     "checkpointed activations are not split across ranks"},
    {AC "cpu_checkpointing", DS_BOOL, NULL, NULL, "checkpointed activations stay on the GPU"},
    {AC "contiguous_memory_optimization", DS_BOOL, NULL, NULL,
     "checkpointed activations already live in one workspace"},
    {AC "number_checkpoints", DS_ANY, NULL, NULL,
     "train.gradient_checkpointing keeps one input per layer"},
    {AC "synchronize_checkpoint_boundary", DS_BOOL, NULL, NULL,
     "the GPU stream is ordered; there is nothing to synchronize"},
    {AC "profile", DS_BOOL, NULL, NULL,
     "there is no per-module profiler; the log reports throughput (tok/s)"},

    {NULL, 0, NULL, NULL, NULL},
};

static const ds_key *find_key(const char *path)
{
    for (const ds_key *k = keys; k->path; k++)
        if (strcmp(k->path, path) == 0)
            return k;
    return NULL;
}

static int unknown_key(const ds_ctx *x, const char *path, ft_err *err)
{
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (const ds_key *k = keys; k->path; k++) {
        size_t d = ft_edit_distance(path, k->path);
        if (d < best_d) {
            best_d = d;
            best = k->path;
        }
    }
    size_t limit = strlen(path) / 3 > 2 ? strlen(path) / 3 : 2;
    if (best && best_d <= limit)
        return ft_fail(err, "%s: unknown key '%s' (did you mean '%s'?)", x->path, path, best);
    return ft_fail(err, "%s: unknown key '%s' (deepspeed_like/README.md lists the keys read)",
                   x->path, path);
}

/* ---- the walk ---------------------------------------------------------------------- */

static int walk(ds_ctx *x, json_t *obj, const char *prefix, ft_err *err)
{
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        char path[160];
        if (prefix)
            snprintf(path, sizeof path, "%s.%s", prefix, name);
        else
            snprintf(path, sizeof path, "%s", name);
        const ds_key *k = find_key(path);
        if (!k)
            return unknown_key(x, path, err);
        if (k->moot && !k->apply)
            note(x, path, k->moot);
        if (k->type == DS_OBJECT) {
            if (json_is_null(v))
                continue;
            if (!json_is_object(v))
                return ft_fail(err, "%s: '%s' must be an object, got %s", x->path, path,
                               json_kind(v));
            if (walk(x, v, path, err))
                return -1;
            continue;
        }
        if (is_auto(v))
            continue;
        char text[64];
        if (k->apply) {
            if (k->apply(x, k, v, err))
                return -1;
        } else if (leaf_text(x, path, k->type, v, text, sizeof text, err)) {
            return -1;
        } else if (k->ours && put(x, k->ours, text, path, text, err)) {
            return -1;
        }
    }
    return 0;
}

/* Checks that need the whole file: one half precision, offload under ZeRO, the Adam
 * notice, and which batch size train_batch_size leaves to be derived. */
static int finish(ds_ctx *x, ft_err *err)
{
    ft_config *c = x->c;
    if (ft_config_bool(c, "train.fp16") && ft_config_bool(c, "train.bf16")) {
        bool f = from_file(x, "train.fp16"), b = from_file(x, "train.bf16");
        if (f && b)
            return ft_fail(err, "%s: fp16 and bf16 are both enabled; choose one", x->path);
        if (f || b) {
            const char *other = f ? "train.bf16" : "train.fp16";
            const char *from = x->set[set_index(x, f ? "train.fp16" : "train.bf16")].from;
            if (ft_config_is_explicit(c, other))
                return ft_fail(err, "mismatch: %s = true in the config but %s = true in %s "
                                    "(one half precision at a time)",
                               other, from, x->path);
            if (put(x, other, "false", from, "true", err))
                return -1;
        }
    }
    if (x->stage >= 0 && x->stage < 3 && from_file(x, "dist.offload_params") &&
        strcmp(ft_config_str(c, "dist.offload_params"), "cpu") == 0)
        return ft_fail(err, "%s: parameter offload (zero_optimization.offload_param) needs "
                            "zero_optimization.stage 3, which shards the parameters",
                       x->path);
    if (x->stage == 0 && strcmp(ft_config_str(c, "dist.offload_optimizer"), "cpu") == 0)
        return ft_fail(err, "%s: optimizer offload needs ZeRO, but zero_optimization.stage is 0 "
                            "(use stage 1, 2 or 3)",
                       x->path);
    if (x->adam && ft_config_float(c, "train.weight_decay") > 0 && x->notes)
        fprintf(x->notes, "note: %s: optimizer 'Adam' with weight_decay runs as AdamW here: the "
                          "decay is decoupled from the gradient (as DeepSpeed's Adam with its "
                          "default adam_w_mode)\n",
                x->path);
    if (from_file(x, "train.global_batch_size")) {
        bool free_micro = !from_file(x, "train.batch_size") &&
                          !ft_config_is_explicit(c, "train.batch_size");
        bool free_accum = !from_file(x, "train.grad_accum") &&
                          !ft_config_is_explicit(c, "train.grad_accum");
        const char *derive = free_micro ? "train.batch_size" : free_accum ? "train.grad_accum"
                                                                           : NULL;
        if (derive) {
            char where[256];
            snprintf(where, sizeof where, "%s: train_batch_size", x->path);
            if (ft_config_set_key(c, derive, "auto", where, NULL, err))
                return -1;
            if (x->notes)
                fprintf(x->notes, "note: %s: %s is derived from train_batch_size = "
                                  "train.batch_size x train.grad_accum x world size\n",
                        x->path, derive);
        }
    }
    return 0;
}

int ft_config_apply_deepspeed(ft_config *c, const char *json_path, FILE *notes, ft_err *err)
{
    json_error_t je;
    json_t *root = json_load_file(json_path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        /* DeepSpeed reads the file with Python's json: no comments, as here. */
        bool comment = strstr(je.text, "'/'") != NULL;
        return ft_fail(err, "%s:%d:%d: invalid JSON: %s%s", json_path, je.line, je.column,
                       je.text, comment ? " (JSON has no comments: remove the // parts)" : "");
    }
    ds_ctx *x = calloc(1, sizeof *x);
    if (!x) {
        json_decref(root);
        return ft_fail(err, "out of memory");
    }
    x->c = c;
    x->path = json_path;
    x->notes = notes;
    x->stage = -1;
    int rc;
    if (!json_is_object(root))
        rc = ft_fail(err, "%s: expected a JSON object at the top level, got %s", json_path,
                     json_kind(root));
    else
        rc = walk(x, root, NULL, err) ? -1 : finish(x, err);
    free(x);
    json_decref(root);
    return rc;
}
