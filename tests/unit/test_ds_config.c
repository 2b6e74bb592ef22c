/* DeepSpeed-style JSON configs: the shipped deepspeed_like/ JSON files, "auto", the
 * precedence rules (mismatch errors), unknown keys with hints, wrong types, unsupported
 * offload, the train_batch_size rule, and the DeepSpeed JSON of the guide we were
 * specified from. Run from the repository root (make test-unit does). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "config/ds_config.h"

static char dir[64];
static char notes_text[8192];

static const char *write_json(const char *text)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/ds.json", dir);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

/* Applies the JSON text onto c (after the --set assignments in sets, NULL-terminated);
 * returns the rc, the error in err and the notices in notes_text. */
static int apply(ft_config *c, const char *const *sets, const char *json, ft_err *err)
{
    for (int i = 0; sets && sets[i]; i++)
        if (ft_config_set(c, sets[i], NULL, err))
            return -2;
    FILE *notes = tmpfile();
    int rc = ft_config_apply_deepspeed(c, write_json(json), notes, err);
    rewind(notes);
    size_t n = fread(notes_text, 1, sizeof notes_text - 1, notes);
    notes_text[n] = '\0';
    fclose(notes);
    return rc;
}

static bool has(const char *hay, const char *needle)
{
    if (strstr(hay, needle))
        return true;
    fprintf(stderr, "  '%s'\n  lacks '%s'\n", hay, needle);
    return false;
}

/* The JSON must fail with a message holding both needles. */
static void expect_error(const char *const *sets, const char *json, const char *n1,
                         const char *n2)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(apply(c, sets, json, &err) == -1);
    CHECK(has(err.msg, n1));
    if (n2)
        CHECK(has(err.msg, n2));
    ft_config_free(c);
}

static bool str_is(const ft_config *c, const char *key, const char *want)
{
    const char *v = ft_config_str(c, key);
    if (v && strcmp(v, want) == 0)
        return true;
    fprintf(stderr, "  %s = '%s', want '%s'\n", key, v ? v : "(null)", want);
    return false;
}

static void test_shipped_files(void)
{
    static const struct {
        const char *file, *strategy, *offload;
        long stage;
    } want[] = {
        {"deepspeed_like/zero1.json", "zero1", "none", 1},
        {"deepspeed_like/zero2.json", "zero2", "none", 2},
        {"deepspeed_like/zero3.json", "zero3", "none", 3},
        {"deepspeed_like/zero3_offload.json", "zero3", "cpu", 3},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ft_config *c = ft_config_new();
        ft_err err = {0};
        /* the user's own values survive the files' "auto" */
        CHECK(ft_config_set(c, "train.batch_size=4", NULL, &err) == 0);
        CHECK(ft_config_set(c, "train.learning_rate=1e-4", NULL, &err) == 0);
        FILE *notes = tmpfile();
        int rc = ft_config_apply_deepspeed(c, want[i].file, notes, &err);
        if (rc)
            fprintf(stderr, "  %s: %s\n", want[i].file, err.msg);
        CHECK(rc == 0);
        CHECK(ftell(notes) == 0); /* the shipped files load without notices */
        fclose(notes);
        CHECK(str_is(c, "dist.strategy", want[i].strategy));
        CHECK(ft_config_int(c, "dist.zero_stage") == want[i].stage);
        CHECK(ft_run_config_zero_stage(&ft_config_values(c)->dist) == want[i].stage);
        CHECK(str_is(c, "dist.offload_optimizer", want[i].offload));
        CHECK(ft_config_int(c, "train.ddp_bucket_cap_mb") == 200);
        CHECK(ft_config_bool(c, "dist.overlap_comm"));
        CHECK(ft_config_int(c, "train.batch_size") == 4);
        CHECK(ft_config_int(c, "train.grad_accum") == 1);
        CHECK(ft_config_is_auto(c, "train.global_batch_size"));
        CHECK_CLOSE(ft_config_float(c, "train.learning_rate"), 1e-4, 1e-12);
        CHECK_CLOSE(ft_config_float(c, "train.max_grad_norm"), 1.0, 1e-12);
        CHECK_CLOSE(ft_config_float(c, "train.adam_beta2"), 0.999, 1e-12);
        CHECK(ft_config_bool(c, "train.bf16"));
        ft_config_free(c);
    }
}

static void test_concrete_values(void)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    int rc = apply(c, NULL,
                   "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 8,"
                   " \"gradient_clipping\": 0.5, \"steps_per_print\": 5,"
                   " \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 16},"
                   " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4,"
                   "   \"betas\": [0.8, 0.95], \"eps\": 1e-6, \"weight_decay\": 0.1}},"
                   " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {"
                   "   \"warmup_num_steps\": 100, \"total_num_steps\": 1000,"
                   "   \"warmup_max_lr\": 1e-4, \"warmup_min_lr\": 0}},"
                   " \"zero_optimization\": {\"stage\": 0, \"overlap_comm\": false}}",
                   &err);
    if (rc)
        fprintf(stderr, "  %s\n", err.msg);
    CHECK(rc == 0);
    CHECK(ft_config_int(c, "train.batch_size") == 2);
    CHECK(ft_config_int(c, "train.grad_accum") == 8);
    CHECK_CLOSE(ft_config_float(c, "train.max_grad_norm"), 0.5, 1e-12);
    CHECK(ft_config_int(c, "train.logging_steps") == 5);
    CHECK(ft_config_bool(c, "train.fp16"));
    CHECK(!ft_config_bool(c, "train.bf16")); /* one half precision: bf16 was only a default */
    CHECK_CLOSE(ft_config_float(c, "train.learning_rate"), 1e-4, 1e-12);
    CHECK_CLOSE(ft_config_float(c, "train.adam_beta1"), 0.8, 1e-12);
    CHECK_CLOSE(ft_config_float(c, "train.adam_beta2"), 0.95, 1e-12);
    CHECK_CLOSE(ft_config_float(c, "train.adam_epsilon"), 1e-6, 1e-12);
    CHECK_CLOSE(ft_config_float(c, "train.weight_decay"), 0.1, 1e-12);
    CHECK(str_is(c, "train.lr_scheduler", "linear"));
    CHECK(ft_config_int(c, "train.warmup_steps") == 100);
    CHECK(ft_config_int(c, "train.max_steps") == 1000);
    CHECK(str_is(c, "dist.strategy", "ddp"));
    CHECK(ft_config_int(c, "dist.zero_stage") == 0);
    CHECK(!ft_config_bool(c, "dist.overlap_comm"));
    CHECK(has(notes_text, "'fp16.loss_scale' has no effect here"));
    CHECK(has(notes_text, "'fp16.initial_scale_power' has no effect here"));
    CHECK(strstr(notes_text, "warmup_min_lr") == NULL); /* 0 is what we do */
    ft_config_free(c);

    /* the other two schedules, and a JSON value equal to the user's is no conflict */
    c = ft_config_new();
    static const char *const sets[] = {"train.learning_rate=3e-4", "train.lr_scheduler=cosine",
                                       NULL};
    rc = apply(c, sets,
               "{\"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.0003}},"
               " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {"
               "   \"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\","
               "   \"cos_min_ratio\": 0.0001, \"warmup_type\": \"log\"}}}",
               &err);
    if (rc)
        fprintf(stderr, "  %s\n", err.msg);
    CHECK(rc == 0);
    CHECK(str_is(c, "train.lr_scheduler", "cosine"));
    CHECK(ft_config_int(c, "train.warmup_steps") == 0);
    CHECK(ft_config_int(c, "train.max_steps") == -1);
    CHECK(has(notes_text, "'scheduler.params.cos_min_ratio' has no effect here"));
    CHECK(has(notes_text, "'scheduler.params.warmup_type' has no effect here: the warmup is "
                          "always linear"));
    ft_config_free(c);

    c = ft_config_new();
    CHECK(apply(c, NULL, "{\"scheduler\": {\"type\": \"WarmupLR\"}}", &err) == 0);
    CHECK(str_is(c, "train.lr_scheduler", "constant"));
    ft_config_free(c);
}

static void test_auto_keeps_ours(void)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    static const char *const sets[] = {"train.batch_size=3", "train.grad_accum=auto",
                                       "train.bf16=false", "train.fp16=true", NULL};
    CHECK(apply(c, sets,
                "{\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": "
                "4, \"bf16\": {\"enabled\": \"auto\"}, \"fp16\": {\"enabled\": \"auto\"}, "
                "\"optimizer\": {\"params\": {\"betas\": [\"auto\", 0.98]}}}",
                &err) == 0);
    CHECK(ft_config_int(c, "train.batch_size") == 3);
    CHECK(ft_config_int(c, "train.grad_accum") == 4); /* our auto yields to a concrete 4 */
    CHECK(!ft_config_bool(c, "train.bf16"));
    CHECK(ft_config_bool(c, "train.fp16"));
    CHECK_CLOSE(ft_config_float(c, "train.adam_beta1"), 0.9, 1e-12);
    CHECK_CLOSE(ft_config_float(c, "train.adam_beta2"), 0.98, 1e-12);
    ft_config_free(c);
}

static void test_mismatch(void)
{
    static const char *const batch4[] = {"train.batch_size=4", NULL};
    expect_error(batch4, "{\"train_micro_batch_size_per_gpu\": 2}",
                 "mismatch: train.batch_size = 4 in the config but "
                 "train_micro_batch_size_per_gpu = 2 in ",
                 "ds.json");
    /* the same value is no conflict */
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(apply(c, batch4, "{\"train_micro_batch_size_per_gpu\": 4}", &err) == 0);
    CHECK(ft_config_int(c, "train.batch_size") == 4);
    ft_config_free(c);

    static const char *const fsdp[] = {"dist.strategy=fsdp", NULL};
    expect_error(fsdp, "{\"zero_optimization\": {\"stage\": 3}}",
                 "mismatch: dist.strategy = fsdp in the config but zero_optimization.stage = 3",
                 NULL);
    static const char *const zero1[] = {"dist.strategy=zero1", NULL};
    expect_error(zero1, "{\"zero_optimization\": {\"stage\": 2}}",
                 "dist.strategy = zero1 in the config", NULL);
    static const char *const lr[] = {"train.learning_rate=1e-3", NULL};
    expect_error(lr, "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-4}}}",
                 "mismatch: train.learning_rate = 0.001 in the config but "
                 "optimizer.params.lr = 0.0002",
                 NULL);
    static const char *const bucket[] = {"train.ddp_bucket_cap_mb=200", NULL};
    expect_error(bucket, "{\"zero_optimization\": {\"reduce_bucket_size\": 5e8}}",
                 "train.ddp_bucket_cap_mb = 200 in the config",
                 "zero_optimization.reduce_bucket_size = 5e+08 (477 MiB)");
    static const char *const bf16[] = {"train.bf16=true", NULL};
    expect_error(bf16, "{\"fp16\": {\"enabled\": true}}",
                 "train.bf16 = true in the config but fp16.enabled = true", NULL);

    /* the old spelling: strategy zero + dist.zero_stage agrees with stage 2 */
    c = ft_config_new();
    static const char *const old[] = {"dist.strategy=zero", "dist.zero_stage=2", NULL};
    CHECK(apply(c, old, "{\"zero_optimization\": {\"stage\": 2}}", &err) == 0);
    CHECK(str_is(c, "dist.strategy", "zero2"));
    ft_config_free(c);
    static const char *const old3[] = {"dist.strategy=zero", "dist.zero_stage=3", NULL};
    expect_error(old3, "{\"zero_optimization\": {\"stage\": 2}}",
                 "dist.strategy = zero in the config but zero_optimization.stage = 2", NULL);

    /* two keys of one file that disagree */
    expect_error(NULL,
                 "{\"optimizer\": {\"params\": {\"lr\": 1e-4}}, \"scheduler\": {\"type\": "
                 "\"WarmupLR\", \"params\": {\"warmup_max_lr\": 2e-4}}}",
                 "scheduler.params.warmup_max_lr = 0.0002 contradicts optimizer.params.lr = "
                 "0.0001",
                 NULL);
    expect_error(NULL, "{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
                 "fp16 and bf16 are both enabled", NULL);
}

static void test_unknown_keys(void)
{
    expect_error(NULL, "{\"zero_optimization\": {\"stagee\": 2}}",
                 "ds.json: unknown key 'zero_optimization.stagee' (did you mean "
                 "'zero_optimization.stage'?)",
                 NULL);
    expect_error(NULL, "{\"train_micro_batch_size_per_gpus\": 2}",
                 "unknown key 'train_micro_batch_size_per_gpus' (did you mean "
                 "'train_micro_batch_size_per_gpu'?)",
                 NULL);
    expect_error(NULL, "{\"zero_optimization\": {\"offload_optimizer\": {\"devise\": \"cpu\"}}}",
                 "unknown key 'zero_optimization.offload_optimizer.devise' (did you mean "
                 "'zero_optimization.offload_optimizer.device'?)",
                 NULL);
    expect_error(NULL, "{\"optimizer\": {\"params\": {\"lr\": 1e-4, \"momentum\": 0.9}}}",
                 "unknown key 'optimizer.params.momentum'", NULL);
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(apply(c, NULL, "{\"quantum_flux\": 1}", &err) == -1);
    CHECK(has(err.msg, "unknown key 'quantum_flux'"));
    CHECK(strstr(err.msg, "did you mean") == NULL);
    ft_config_free(c);
}

static void test_wrong_types(void)
{
    expect_error(NULL, "{\"zero_optimization\": {\"stage\": \"two\"}}",
                 "'zero_optimization.stage' must be an integer", "got a string");
    expect_error(NULL, "{\"zero_optimization\": {\"stage\": 2.5}}",
                 "'zero_optimization.stage' must be an integer", NULL);
    expect_error(NULL, "{\"zero_optimization\": {\"stage\": 4}}",
                 "'zero_optimization.stage' must be 0, 1, 2 or 3, got 4", NULL);
    expect_error(NULL, "{\"bf16\": {\"enabled\": 1}}", "'bf16.enabled' must be true or false",
                 NULL);
    expect_error(NULL, "{\"zero_optimization\": 3}",
                 "'zero_optimization' must be an object, got an integer", NULL);
    expect_error(NULL, "{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}",
                 "'optimizer.params.betas' must be a list of two numbers", NULL);
    expect_error(NULL, "{\"gradient_clipping\": \"1.0\"}", "'gradient_clipping' must be a number",
                 NULL);
    expect_error(NULL, "{\"train_micro_batch_size_per_gpu\": 0}", "train.batch_size", ">= 1");
    expect_error(NULL, "{\"zero_optimization\": {\"contiguous_gradients\": \"yes\"}}",
                 "'zero_optimization.contiguous_gradients' must be true or false", NULL);
    expect_error(NULL, "[1, 2]", "expected a JSON object at the top level", NULL);
    expect_error(NULL, "{\"train_batch_size\": 8,\n \"train_batch_size\": 16}", "ds.json:",
                 "invalid JSON");
    expect_error(NULL, "{\n  \"bf16\": {\"enabled\": true}, // half\n}", "ds.json:2:",
                 "no comments");
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(ft_config_apply_deepspeed(c, "/nonexistent/ds.json", NULL, &err) == -1);
    CHECK(has(err.msg, "/nonexistent/ds.json"));
    ft_config_free(c);
}

static void test_offload(void)
{
    expect_error(NULL,
                 "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
                 "\"nvme\", \"nvme_path\": \"/local_nvme\"}}}",
                 "'zero_optimization.offload_optimizer.device' = \"nvme\"", "not supported");
    expect_error(NULL,
                 "{\"zero_optimization\": {\"stage\": 2, \"offload_param\": {\"device\": "
                 "\"cpu\"}}}",
                 "parameter offload", "needs zero_optimization.stage 3");
    expect_error(NULL,
                 "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
                 "\"nvme\"}}}",
                 "'zero_optimization.offload_param.device' = \"nvme\"",
                 "NVMe parameter offload");
    expect_error(NULL,
                 "{\"zero_optimization\": {\"offload_optimizer\": {\"device\": \"disk\"}}}",
                 "must be \"none\", \"cpu\" or \"nvme\", got \"disk\"", NULL);
    expect_error(NULL,
                 "{\"zero_optimization\": {\"stage\": 0, \"offload_optimizer\": {\"device\": "
                 "\"cpu\"}}}",
                 "optimizer offload needs ZeRO", NULL);

    /* accepted details of optimizer offload, with notices */
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(apply(c, NULL,
                "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
                "\"cpu\", \"pin_memory\": true, \"buffer_count\": 4, \"fast_init\": false}}}",
                &err) == 0);
    CHECK(str_is(c, "dist.offload_optimizer", "cpu"));
    CHECK(has(notes_text, "'zero_optimization.offload_optimizer.pin_memory' has no effect"));
    CHECK(has(notes_text, "'zero_optimization.offload_optimizer.buffer_count' has no effect"));
    CHECK(has(notes_text, "'zero_optimization.offload_optimizer.fast_init' has no effect"));
    ft_config_free(c);

    /* parameter offload under stage 3: dist.offload_params */
    c = ft_config_new();
    CHECK(apply(c, NULL,
                "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": "
                "\"cpu\", \"pin_memory\": true}}}",
                &err) == 0);
    CHECK(str_is(c, "dist.offload_params", "cpu"));
    CHECK(str_is(c, "dist.strategy", "zero3"));
    CHECK(has(notes_text, "'zero_optimization.offload_param.pin_memory' has no effect"));
    ft_config_free(c);

    /* the legacy spelling */
    c = ft_config_new();
    CHECK(apply(c, NULL, "{\"zero_optimization\": {\"stage\": 3, \"cpu_offload\": true}}",
                &err) == 0);
    CHECK(str_is(c, "dist.offload_optimizer", "cpu"));
    CHECK(str_is(c, "dist.strategy", "zero3"));
    ft_config_free(c);
    expect_error(NULL,
                 "{\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true, "
                 "\"offload_optimizer\": {\"device\": \"none\"}}}",
                 "zero_optimization.offload_optimizer.device = none contradicts "
                 "zero_optimization.cpu_offload = true",
                 NULL);
}

static void test_bucket_size(void)
{
    static const struct {
        const char *json;
        long mib;
    } cases[] = {
        {"{\"zero_optimization\": {\"reduce_bucket_size\": 5e8}}", 477},
        {"{\"zero_optimization\": {\"reduce_bucket_size\": 500000000}}", 477},
        {"{\"zero_optimization\": {\"reduce_bucket_size\": 1048576}}", 1},
        {"{\"zero_optimization\": {\"reduce_bucket_size\": 1048577}}", 2},
        {"{\"zero_optimization\": {\"reduce_bucket_size\": \"auto\"}}", 25},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ft_config *c = ft_config_new();
        ft_err err = {0};
        CHECK(apply(c, NULL, cases[i].json, &err) == 0);
        CHECK(ft_config_int(c, "train.ddp_bucket_cap_mb") == cases[i].mib);
        ft_config_free(c);
    }
    expect_error(NULL, "{\"zero_optimization\": {\"reduce_bucket_size\": 0}}",
                 "'zero_optimization.reduce_bucket_size' must be a size in bytes", NULL);
}

static void test_optimizer_and_moot(void)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(apply(c, NULL,
                "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": \"auto\", "
                "\"weight_decay\": 0.01, \"torch_adam\": true}},"
                " \"zero_optimization\": {\"stage\": 3, \"contiguous_gradients\": true,"
                "   \"stage3_gather_16bit_weights_on_model_save\": true,"
                "   \"stage3_prefetch_bucket_size\": \"auto\", \"sub_group_size\": 1e9},"
                " \"activation_checkpointing\": {\"partition_activations\": true},"
                " \"flops_profiler\": {\"enabled\": true, \"profile_step\": 1},"
                " \"wall_clock_breakdown\": false, \"communication_data_type\": null}",
                &err) == 0);
    CHECK_CLOSE(ft_config_float(c, "train.weight_decay"), 0.01, 1e-12);
    CHECK(has(notes_text, "optimizer 'Adam' with weight_decay runs as AdamW"));
    CHECK(has(notes_text, "'zero_optimization.contiguous_gradients' has no effect here"));
    CHECK(has(notes_text, "'zero_optimization.stage3_gather_16bit_weights_on_model_save' has "
                          "no effect here: we always gather on save"));
    CHECK(has(notes_text, "'zero_optimization.stage3_prefetch_bucket_size' has no effect"));
    CHECK(has(notes_text, "'activation_checkpointing' has no effect here: activation "
                          "checkpointing is train.gradient_checkpointing"));
    CHECK(has(notes_text, "'activation_checkpointing.partition_activations' has no effect"));
    CHECK(has(notes_text, "'flops_profiler' has no effect"));
    CHECK(has(notes_text, "'wall_clock_breakdown' has no effect"));
    CHECK(has(notes_text, "'optimizer.params.torch_adam' has no effect"));
    ft_config_free(c);

    expect_error(NULL, "{\"optimizer\": {\"type\": \"Lamb\", \"params\": {\"lr\": 1e-3}}}",
                 "optimizer type 'Lamb' is not supported", "AdamW");
    expect_error(NULL, "{\"optimizer\": {\"type\": \"Adam\", \"params\": {\"adam_w_mode\": "
                       "false}}}",
                 "'optimizer.params.adam_w_mode' = false is not supported", NULL);
    expect_error(NULL, "{\"scheduler\": {\"type\": \"OneCycle\"}}",
                 "scheduler type 'OneCycle' is not supported", NULL);
}

/* The global batch rule (ft_run_config_global_batch) on c's values; the batch keys it
 * derives are written back into c, so that the checks read them from there. */
static int resolve_batch(ft_config *c, int world_size, ft_err *err)
{
    ft_run_config *v = malloc(sizeof *v);
    *v = *ft_config_values(c);
    int rc = ft_run_config_global_batch(&v->train, world_size, err);
    static const char *const keys[] = {"train.batch_size", "train.grad_accum"};
    const long values[] = {v->train.batch_size, v->train.grad_accum};
    for (int i = 0; i < 2 && rc == 0; i++) {
        char text[32];
        snprintf(text, sizeof text, "%ld", values[i]);
        rc = ft_config_set_key(c, keys[i], values[i] == FT_CFG_AUTO ? "auto" : text, "test",
                               NULL, err);
    }
    free(v);
    return rc;
}

static void test_batch_rule(void)
{
    ft_err err = {0};
    /* consistent: nothing changes */
    ft_config *c = ft_config_new();
    static const char *const ok[] = {"train.global_batch_size=16", "train.batch_size=4",
                                     "train.grad_accum=2", NULL};
    for (int i = 0; ok[i]; i++)
        CHECK(ft_config_set(c, ok[i], NULL, &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == 0);
    CHECK(ft_config_int(c, "train.batch_size") == 4 && ft_config_int(c, "train.grad_accum") == 2);
    /* inconsistent: DeepSpeed's message, and ours */
    CHECK(resolve_batch(c, 4, &err) == -1);
    CHECK(has(err.msg, "train_batch_size 16 != train_micro_batch_size_per_gpu 4 * "
                       "gradient_accumulation_steps 2 * world_size 4"));
    CHECK(has(err.msg, "train.global_batch_size = train.batch_size x train.grad_accum x world "
                       "size"));
    CHECK(ft_config_set(c, "train.global_batch_size=32", NULL, &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == -1);
    CHECK(has(err.msg, "train_batch_size 32 != train_micro_batch_size_per_gpu 4 * "
                       "gradient_accumulation_steps 2 * world_size 2"));

    /* derive the accumulation */
    CHECK(ft_config_set(c, "train.grad_accum=auto", NULL, &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == 0);
    CHECK(!ft_config_is_auto(c, "train.grad_accum"));
    CHECK(ft_config_int(c, "train.grad_accum") == 4);
    /* derive the micro-batch */
    CHECK(ft_config_set(c, "train.batch_size=auto", NULL, &err) == 0);
    CHECK(ft_config_set(c, "train.grad_accum=2", NULL, &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == 0);
    CHECK(ft_config_int(c, "train.batch_size") == 8);
    /* not divisible */
    CHECK(ft_config_set(c, "train.global_batch_size=30", NULL, &err) == 0);
    CHECK(ft_config_set(c, "train.batch_size=4", NULL, &err) == 0);
    CHECK(ft_config_set(c, "train.grad_accum=auto", NULL, &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == -1);
    CHECK(has(err.msg, "train_batch_size 30 is not divisible by train_micro_batch_size_per_gpu "
                       "4 * world_size 2"));
    CHECK(ft_config_is_auto(c, "train.grad_accum"));
    CHECK(ft_config_set(c, "train.batch_size=auto", NULL, &err) == 0);
    CHECK(ft_config_set(c, "train.grad_accum=4", NULL, &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == -1);
    CHECK(has(err.msg, "train_batch_size 30 is not divisible by gradient_accumulation_steps 4 "
                       "* world_size 2"));
    /* both auto: left for the memory plan */
    CHECK(ft_config_set(c, "train.grad_accum=auto", NULL, &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == 0);
    CHECK(ft_config_is_auto(c, "train.batch_size") && ft_config_is_auto(c, "train.grad_accum"));
    ft_config_free(c);

    /* global auto (the default): nothing changes, auto stays auto */
    c = ft_config_new();
    CHECK(ft_config_set(c, "train.grad_accum=auto", NULL, &err) == 0);
    CHECK(resolve_batch(c, 8, &err) == 0);
    CHECK(ft_config_is_auto(c, "train.grad_accum"));
    CHECK(ft_config_int(c, "train.batch_size") == 1);
    CHECK(resolve_batch(c, 0, &err) == -1);
    ft_config_free(c);

    /* through a JSON: train_batch_size with the accumulation given, micro-batch derived */
    c = ft_config_new();
    CHECK(apply(c, NULL, "{\"train_batch_size\": 64, \"gradient_accumulation_steps\": 4}",
                &err) == 0);
    CHECK(ft_config_is_auto(c, "train.batch_size"));
    CHECK(has(notes_text, "train.batch_size is derived from train_batch_size"));
    CHECK(resolve_batch(c, 4, &err) == 0);
    CHECK(ft_config_int(c, "train.batch_size") == 4);
    ft_config_free(c);
    /* the user's micro-batch: the accumulation is derived */
    c = ft_config_new();
    static const char *const b2[] = {"train.batch_size=2", NULL};
    CHECK(apply(c, b2, "{\"train_batch_size\": 64}", &err) == 0);
    CHECK(ft_config_is_auto(c, "train.grad_accum"));
    CHECK(resolve_batch(c, 4, &err) == 0);
    CHECK(ft_config_int(c, "train.grad_accum") == 8);
    ft_config_free(c);
    /* all three concrete and inconsistent */
    c = ft_config_new();
    CHECK(apply(c, NULL,
                "{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 4, "
                "\"gradient_accumulation_steps\": 2}",
                &err) == 0);
    CHECK(resolve_batch(c, 2, &err) == -1);
    CHECK(has(err.msg, "train_batch_size 32 != train_micro_batch_size_per_gpu 4 * "
                       "gradient_accumulation_steps 2 * world_size 2"));
    ft_config_free(c);
}

/* The DeepSpeed configs of the multi-GPU guide (seeds 000 and 001). */
static void test_seed_json(void)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    int rc = apply(c, NULL,
                   "{\n  \"train_batch_size\": 16,\n  \"gradient_accumulation_steps\": 1,\n"
                   "  \"fp16\": {\n    \"enabled\": false\n  },\n"
                   "  \"bf16\": {\n    \"enabled\": true\n  },\n"
                   "  \"zero_optimization\": {\n    \"stage\": 2,\n"
                   "    \"offload_optimizer\": {\n      \"device\": \"cpu\"\n    }\n  }\n}\n",
                   &err);
    if (rc)
        fprintf(stderr, "  %s\n", err.msg);
    CHECK(rc == 0);
    CHECK(str_is(c, "dist.strategy", "zero2"));
    CHECK(str_is(c, "dist.offload_optimizer", "cpu"));
    CHECK(ft_config_int(c, "train.global_batch_size") == 16);
    CHECK(ft_config_int(c, "train.grad_accum") == 1);
    CHECK(ft_config_bool(c, "train.bf16") && !ft_config_bool(c, "train.fp16"));
    /* deepspeed --num_gpus=4: 16 = 4 x 1 x 4 */
    CHECK(resolve_batch(c, 4, &err) == 0);
    CHECK(ft_config_int(c, "train.batch_size") == 4);
    ft_config_free(c);

    /* seed 001 as printed has // comments, which JSON (and DeepSpeed) refuse */
    static const char *const commented =
        "{\n  \"zero_optimization\": {\n"
        "    \"stage\": 3,                    // More aggressive memory saving\n"
        "    \"cpu_offload\": true           // Offload to CPU memory\n  },\n"
        "  \"bf16\": {\"enabled\": true},\n  \"gradient_accumulation_steps\": \"auto\",\n"
        "  \"train_batch_size\": \"auto\"\n}\n";
    expect_error(NULL, commented, "ds.json:3:", "JSON has no comments");
    c = ft_config_new();
    static const char *const sets[] = {"train.grad_accum=8", NULL};
    rc = apply(c, sets,
               "{\n  \"zero_optimization\": {\n    \"stage\": 3,\n    \"cpu_offload\": true\n"
               "  },\n  \"bf16\": {\"enabled\": true},\n"
               "  \"gradient_accumulation_steps\": \"auto\",\n  \"train_batch_size\": \"auto\"\n}\n",
               &err);
    if (rc)
        fprintf(stderr, "  %s\n", err.msg);
    CHECK(rc == 0);
    CHECK(str_is(c, "dist.strategy", "zero3"));
    CHECK(ft_config_int(c, "dist.zero_stage") == 3);
    CHECK(str_is(c, "dist.offload_optimizer", "cpu"));
    CHECK(ft_config_int(c, "train.grad_accum") == 8);
    CHECK(ft_config_is_auto(c, "train.global_batch_size"));
    ft_config_free(c);
}

static void test_config_support(void)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    /* the upper bound of dist.zero_stage */
    CHECK(ft_config_set(c, "dist.zero_stage=4", NULL, &err) == -1);
    CHECK(has(err.msg, "'dist.zero_stage' must be <= 3, got 4"));
    CHECK(ft_config_set(c, "dist.zero_stage=3", NULL, &err) == 0);
    CHECK(ft_config_set(c, "dist.timeout_s=0", NULL, &err) == -1);
    CHECK(ft_config_set(c, "dist.pipeline_micro_batches=0", NULL, &err) == -1);
    CHECK(ft_config_set(c, "dist.offload_optimizer=nvme", NULL, &err) == -1);
    CHECK(ft_config_set(c, "dist.strategy=model_parallel", NULL, &err) == 0);
    CHECK(ft_run_config_zero_stage(&ft_config_values(c)->dist) == 0);
    CHECK(ft_config_set(c, "dist.strategy=zero", NULL, &err) == 0);
    CHECK(ft_run_config_zero_stage(&ft_config_values(c)->dist) == 3);
    /* defaults of the dist keys */
    ft_config *d = ft_config_new();
    CHECK(str_is(d, "dist.strategy", "auto"));
    CHECK(str_is(d, "dist.offload_optimizer", "none"));
    CHECK(ft_config_bool(d, "dist.overlap_comm") && ft_config_bool(d, "dist.prefetch"));
    CHECK(ft_config_int(d, "dist.pipeline_micro_batches") == 1);
    CHECK_CLOSE(ft_config_float(d, "dist.timeout_s"), 600, 0);
    CHECK(ft_config_is_auto(d, "train.global_batch_size"));
    /* explicit vs default; a YAML null puts the default back */
    CHECK(!ft_config_is_explicit(d, "train.batch_size"));
    CHECK(ft_config_set(d, "train.batch_size=1", NULL, &err) == 0);
    CHECK(ft_config_is_explicit(d, "train.batch_size"));
    char path[128];
    snprintf(path, sizeof path, "%s/null.yaml", dir);
    FILE *f = fopen(path, "w");
    fputs("train:\n  batch_size: ~\n  grad_accum: 2\n", f);
    fclose(f);
    CHECK(ft_config_load_yaml(d, path, NULL, &err) == 0);
    CHECK(!ft_config_is_explicit(d, "train.batch_size"));
    CHECK(ft_config_is_explicit(d, "train.grad_accum"));
    ft_config_free(d);
    ft_config_free(c);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ft-test-ds-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    RUN(test_shipped_files);
    RUN(test_concrete_values);
    RUN(test_auto_keeps_ours);
    RUN(test_mismatch);
    RUN(test_unknown_keys);
    RUN(test_wrong_types);
    RUN(test_offload);
    RUN(test_bucket_size);
    RUN(test_optimizer_and_moot);
    RUN(test_batch_rule);
    RUN(test_seed_json);
    RUN(test_config_support);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("ds_config");
}
