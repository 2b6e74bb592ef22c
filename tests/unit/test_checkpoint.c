/* Checkpoints: a save/load round trip restores weights, AdamW moments and the step so
 * that the resumed run continues bitwise as if never stopped (full and LoRA);
 * save_total_limit rotates only the saving run's checkpoints and removes leftovers; the
 * newest checkpoint is found and temp dirs are ignored; a mismatching stamp, seed or base
 * model, an inconsistent or broken state file and non-finite state are refused with a
 * clear message; a version 1 state still loads. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>

#include "check.h"
#include "train/checkpoint.h"
#include "train/schedule.h"
#include "tiny_model.h"
#include "train/train_step.h"

static char root[256], model_dir[300];

static int32_t ids[2 * 6] = {1, 5, 9, 3, 30, 2, 7, 7, 0, 31, 12, 4};

typedef struct run {
    ft_model *m;
    ft_optimizer o;
} run;

static void start(run *r, ft_train_mode mode)
{
    ft_model_options opt = {.mode = mode, .seed = 5};
    opt.lora = (ft_lora_config){.r = 2, .alpha = 4, .targets = FT_LORA_ALL_LINEAR};
    ft_err err;
    CHECK(ft_model_load(&r->m, model_dir, &opt, &err) == 0);
    size_t n;
    ft_model_trainable(r->m, &n);
    ft_adamw_hparams hp = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                           .weight_decay = 0.01f};
    CHECK(ft_optimizer_init(&r->o, ft_model_mem(r->m), n, hp, &err) == 0);
}

static void stop(run *r)
{
    ft_optimizer_free(&r->o);
    ft_model_free(r->m);
}

static void steps(run *r, int k)
{
    ft_batch b = {2, 6, ids, NULL, NULL, NULL};
    ft_lr_schedule s = {.kind = FT_LR_COSINE, .base_lr = 1e-2, .warmup_steps = 1,
                        .total_steps = 10};
    ft_step_stats st;
    ft_err err;
    for (int i = 0; i < k; i++)
        CHECK(ft_train_step(r->m, &r->o, &s, &b, 1, 1.0, &st, &err) == 0);
}

static ft_train_state state_at(long step, const char *mode)
{
    ft_train_state st = {.global_step = step, .epoch = 1, .batch_in_epoch = 3, .seed = 77};
    snprintf(st.run_id, sizeof st.run_id, "run-a");
    snprintf(st.base.path, sizeof st.base.path, "%s", model_dir);
    snprintf(st.base.fingerprint, sizeof st.base.fingerprint, "0123456789abcdef");
    snprintf(st.stamp.device, sizeof st.stamp.device, "cpu");
    snprintf(st.stamp.dtype, sizeof st.stamp.dtype, "fp32");
    snprintf(st.stamp.mode, sizeof st.stamp.mode, "%s", mode);
    snprintf(st.stamp.quant, sizeof st.stamp.quant, "none");
    snprintf(st.stamp.strategy, sizeof st.stamp.strategy, "none");
    st.stamp.world_size = 1;
    return st;
}

static void check_resume(ft_train_mode mode, const char *name)
{
    char run_dir[400];
    snprintf(run_dir, sizeof run_dir, "%s/run-%s", root, name);
    ft_err err;
    run a, b;
    start(&a, mode);
    steps(&a, 2);
    ft_train_state st = state_at(2, name), back;
    char path[512];
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &st, model_dir, 0, path, sizeof path, &err) ==
          0);
    start(&b, mode);
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &back, &st, &err) == 0);
    CHECK(back.global_step == 2 && back.epoch == 1 && back.batch_in_epoch == 3 &&
          back.seed == 77 && back.skipped_steps == 0);
    CHECK(strcmp(back.run_id, "run-a") == 0 && strcmp(back.base.path, model_dir) == 0 &&
          strcmp(back.base.fingerprint, "0123456789abcdef") == 0);
    CHECK(b.o.step == a.o.step);
    steps(&a, 2);
    steps(&b, 2);
    size_t n;
    float *wa = ft_model_trainable(a.m, &n), *wb = ft_model_trainable(b.m, &n);
    CHECK(memcmp(wa, wb, n * sizeof(float)) == 0);
    CHECK(memcmp(a.o.m, b.o.m, n * sizeof(float)) == 0);
    stop(&a);
    stop(&b);
}

static void test_resume_full(void) { check_resume(FT_TRAIN_FULL, "full"); }
static void test_resume_lora(void) { check_resume(FT_TRAIN_LORA, "lora"); }

static void test_limit_latest_and_stamp(void)
{
    char run_dir[400], path[512];
    snprintf(run_dir, sizeof run_dir, "%s/run-limit", root);
    ft_err err = {0};
    run a;
    start(&a, FT_TRAIN_LORA);
    CHECK(ft_checkpoint_latest(run_dir, path, sizeof path, &err) == 0);
    for (long s = 1; s <= 3; s++) {
        ft_train_state st = state_at(s * 10, "lora");
        a.o.step = (int)(s * 10); /* as many updates as steps: a consistent checkpoint */
        CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &st, model_dir, 2, NULL, 0, &err) == 0);
    }
    struct stat sb;
    char p[600];
    snprintf(p, sizeof p, "%s/checkpoint-10", run_dir);
    CHECK(stat(p, &sb) != 0);
    snprintf(p, sizeof p, "%s/checkpoint-20", run_dir);
    CHECK(stat(p, &sb) == 0);
    /* a temp dir left by a killed run is not a checkpoint */
    snprintf(p, sizeof p, "%s/checkpoint-40.tmp", run_dir);
    CHECK(mkdir(p, 0755) == 0);
    CHECK(ft_checkpoint_latest(run_dir, path, sizeof path, &err) == 1);
    CHECK(strstr(path, "checkpoint-30") != NULL);
    ft_train_state st, want = state_at(30, "lora");
    snprintf(want.stamp.mode, sizeof want.stamp.mode, "qlora");
    CHECK(ft_checkpoint_load(path, a.m, &a.o, &st, &want, &err) != 0);
    CHECK(strstr(err.msg, "mode 'lora'") != NULL && strstr(err.msg, "'qlora'") != NULL);
    snprintf(p, sizeof p, "%s/trainer_state.json", path);
    FILE *f = fopen(p, "w");
    fputs("{\"format\": \"something else\"", f);
    fclose(f);
    CHECK(ft_checkpoint_load(path, a.m, &a.o, &st, NULL, &err) != 0);
    CHECK(strstr(err.msg, "trainer_state.json") != NULL);
    /* a seed that is no number is an error, not a seed of 0 */
    snprintf(path, sizeof path, "%s/checkpoint-20", run_dir);
    CHECK(ft_checkpoint_load(path, a.m, &a.o, &st, NULL, &err) == 0);
    snprintf(p, sizeof p, "%s/trainer_state.json", path);
    json_t *state = json_load_file(p, 0, NULL);
    /* a key given twice is an error, not its last value (what Python's json keeps) */
    char *text = state ? json_dumps(state, JSON_COMPACT) : NULL;
    f = fopen(p, "w");
    fprintf(f, "{\"global_step\":7,%s", text ? text + 1 : "}");
    fclose(f);
    free(text);
    CHECK(ft_checkpoint_load(path, a.m, &a.o, &st, NULL, &err) != 0);
    CHECK(strstr(err.msg, "trainer_state.json") && strstr(err.msg, "duplicate"));
    CHECK(state && json_object_set_new(state, "seed", json_string("42x")) == 0);
    CHECK(json_dump_file(state, p, 0) == 0);
    json_decref(state);
    CHECK(ft_checkpoint_load(path, a.m, &a.o, &st, NULL, &err) != 0);
    CHECK(strstr(err.msg, "seed '42x'") != NULL);
    stop(&a);
}

static int exists(const char *dir, const char *name)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void make_leftover(const char *dir, const char *name)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    CHECK(mkdir(p, 0755) == 0);
    snprintf(p, sizeof p, "%s/%s/adapter_model.safetensors", dir, name);
    FILE *f = fopen(p, "w");
    fputs("partial", f);
    fclose(f);
}

/* save_total_limit counts and removes only the saving run's checkpoints (not another
 * run's, nor one without a run id), and the leftovers of killed saves and removals go. */
static void test_rotation_is_per_run(void)
{
    char run_dir[400];
    snprintf(run_dir, sizeof run_dir, "%s/run-rotate", root);
    ft_err err = {0};
    run a;
    start(&a, FT_TRAIN_LORA);
    ft_train_state other = state_at(5, "lora"), legacy = state_at(7, "lora");
    snprintf(other.run_id, sizeof other.run_id, "run-b");
    legacy.run_id[0] = '\0';
    a.o.step = 5;
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &other, model_dir, 1, NULL, 0, &err) == 0);
    a.o.step = 7;
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &legacy, model_dir, 1, NULL, 0, &err) == 0);
    make_leftover(run_dir, "checkpoint-3.tmp");
    make_leftover(run_dir, "checkpoint-4.deleting");
    for (long s = 1; s <= 3; s++) {
        ft_train_state st = state_at(s * 10, "lora");
        a.o.step = (int)(s * 10);
        CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &st, model_dir, 1, NULL, 0, &err) == 0);
    }
    CHECK(exists(run_dir, "checkpoint-5") && exists(run_dir, "checkpoint-7"));
    CHECK(!exists(run_dir, "checkpoint-10") && !exists(run_dir, "checkpoint-20"));
    CHECK(exists(run_dir, "checkpoint-30"));
    CHECK(!exists(run_dir, "checkpoint-3.tmp") && !exists(run_dir, "checkpoint-4.deleting"));
    CHECK(!exists(run_dir, "checkpoint-10.deleting") && !exists(run_dir, "checkpoint-20.deleting"));
    /* a checkpoint of the same step is replaced only when it is this run's */
    ft_train_state again = state_at(5, "lora");
    a.o.step = 5;
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &again, model_dir, 0, NULL, 0, &err) != 0);
    CHECK(strstr(err.msg, "checkpoint-5 exists and is not this run's") != NULL);
    CHECK(exists(run_dir, "checkpoint-5") && !exists(run_dir, "checkpoint-5.tmp"));
    again = state_at(30, "lora");
    a.o.step = 30;
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &again, model_dir, 0, NULL, 0, &err) == 0);
    CHECK(exists(run_dir, "checkpoint-30") && !exists(run_dir, "checkpoint-30.deleting"));
    /* the cleanup on its own: what a killed run leaves, and nothing else */
    make_leftover(run_dir, "checkpoint-8.tmp");
    make_leftover(run_dir, "checkpoint-9.deleting");
    make_leftover(run_dir, "checkpoint-x.tmp");
    int removed = -1;
    CHECK(ft_checkpoint_cleanup(run_dir, &removed, &err) == 0 && removed == 2);
    CHECK(exists(run_dir, "checkpoint-x.tmp") && exists(run_dir, "checkpoint-30"));
    char missing[500];
    snprintf(missing, sizeof missing, "%s/none", root);
    CHECK(ft_checkpoint_cleanup(missing, &removed, &err) == 0 && removed == 0);
    CHECK(ft_checkpoint_name("checkpoint-12") && ft_checkpoint_name("checkpoint-12.tmp") &&
          ft_checkpoint_name("checkpoint-12.deleting"));
    CHECK(!ft_checkpoint_name("checkpoint-") && !ft_checkpoint_name("checkpoint-x") &&
          !ft_checkpoint_name("checkpoint-1.old") && !ft_checkpoint_name("checkpoint--1"));
    stop(&a);
}

/* Rewrites one key of path/trainer_state.json (value NULL: removes it). */
static void edit_state(const char *path, const char *key, json_t *value)
{
    char p[700];
    snprintf(p, sizeof p, "%s/trainer_state.json", path);
    json_t *state = json_load_file(p, 0, NULL);
    CHECK(state != NULL);
    if (value)
        json_object_set_new(state, key, value);
    else
        json_object_del(state, key);
    CHECK(json_dump_file(state, p, 0) == 0);
    json_decref(state);
}

/* A resumed run must be the saved one: its seed and base model; the state must be
 * consistent (the optimizer's updates plus the skipped steps are the steps done) and in
 * range; version 1 states (before run ids) load, unknown versions do not. */
static void test_resume_checks(void)
{
    char run_dir[400], path[512], copy[600];
    snprintf(run_dir, sizeof run_dir, "%s/run-checks", root);
    ft_err err = {0};
    run a, b;
    start(&a, FT_TRAIN_LORA);
    start(&b, FT_TRAIN_LORA);
    steps(&a, 2);
    ft_train_state st = state_at(2, "lora"), got, want;
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &st, model_dir, 0, path, sizeof path, &err) ==
          0);
    snprintf(copy, sizeof copy, "%s-copy", path);

    want = st;
    want.seed = 78;
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &want, &err) != 0);
    CHECK(strstr(err.msg, "train.seed 77") && strstr(err.msg, "this run's is 78") &&
          strstr(err.msg, "refusing to resume"));

    want = st;
    snprintf(want.base.path, sizeof want.base.path, "/models/another");
    snprintf(want.base.fingerprint, sizeof want.base.fingerprint, "fedcba9876543210");
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &want, &err) != 0);
    CHECK(strstr(err.msg, model_dir) && strstr(err.msg, "0123456789abcdef") &&
          strstr(err.msg, "/models/another") && strstr(err.msg, "fedcba9876543210"));
    want.base.fingerprint[0] = '\0'; /* unknown: not checked */
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &want, &err) == 0);

    /* 2 updates done: global_step 3 needs one skipped step */
    edit_state(path, "global_step", json_integer(3));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) != 0);
    CHECK(strstr(err.msg, "optimizer has done 2 updates") && strstr(err.msg, "global_step 3"));
    edit_state(path, "skipped_steps", json_integer(1));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) == 0);
    CHECK(got.global_step == 3 && got.skipped_steps == 1 && b.o.step == 2);
    edit_state(path, "skipped_steps", json_integer(4));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) != 0);
    CHECK(strstr(err.msg, "out of range") != NULL);
    edit_state(path, "skipped_steps", json_integer(1));
    edit_state(path, "epoch", json_integer(-1));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) != 0);
    CHECK(strstr(err.msg, "epoch -1") && strstr(err.msg, "out of range"));
    edit_state(path, "epoch", json_integer(1));
    /* the seed is a decimal string, not a JSON number */
    edit_state(path, "seed", json_integer(77));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) != 0);
    CHECK(strstr(err.msg, "seed must be a decimal number in a string") != NULL);
    edit_state(path, "seed", json_string("77"));

    /* version 1: no skipped_steps, run_id or base_model; loads, with those checks left out */
    edit_state(path, "global_step", json_integer(2));
    edit_state(path, "skipped_steps", NULL);
    edit_state(path, "run_id", NULL);
    edit_state(path, "base_model", NULL);
    edit_state(path, "version", json_integer(1));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) == 0);
    CHECK(got.run_id[0] == '\0' && got.base.fingerprint[0] == '\0' && got.skipped_steps == 0);
    /* version 2 without them is broken */
    edit_state(path, "version", json_integer(2));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) != 0);
    CHECK(strstr(err.msg, "trainer_state.json") != NULL);
    edit_state(path, "version", json_integer(3));
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &got, &st, &err) != 0);
    CHECK(strstr(err.msg, "version 1 to 2") != NULL);
    stop(&a);
    stop(&b);
}

/* Diverged state is never written: a checkpoint or the final weights with a non-finite
 * weight or moment is an error, and leaves nothing behind. */
static void test_nonfinite_is_refused(void)
{
    char run_dir[400], final[500];
    snprintf(run_dir, sizeof run_dir, "%s/run-nan", root);
    snprintf(final, sizeof final, "%s/final", run_dir);
    ft_err err = {0};
    run a;
    start(&a, FT_TRAIN_LORA);
    steps(&a, 1);
    ft_train_state st = state_at(1, "lora");
    a.o.v[3] = INFINITY;
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &st, model_dir, 0, NULL, 0, &err) != 0);
    CHECK(strstr(err.msg, "optimizer state holds non-finite values") != NULL);
    a.o.v[3] = 0;
    size_t n;
    float *w = ft_model_trainable(a.m, &n);
    w[n - 1] = NAN;
    CHECK(ft_checkpoint_save(run_dir, a.m, &a.o, &st, model_dir, 0, NULL, 0, &err) != 0);
    CHECK(strstr(err.msg, "non-finite") && strstr(err.msg, "lora_"));
    CHECK(ft_checkpoint_save_weights(final, a.m, model_dir, &err) != 0);
    CHECK(strstr(err.msg, "non-finite") != NULL);
    CHECK(!exists(run_dir, "checkpoint-1") && !exists(run_dir, "checkpoint-1.tmp") &&
          !exists(run_dir, "final"));
    stop(&a);
}

/* The base model's fingerprint: the same model gives the same one; another config.json
 * or another tensor shape gives another. */
static void test_base_fingerprint(void)
{
    ft_err err;
    ft_ckpt_base a, b;
    CHECK(ft_checkpoint_base_of(model_dir, &a, &err) == 0);
    CHECK(ft_checkpoint_base_of(model_dir, &b, &err) == 0);
    CHECK(strlen(a.fingerprint) == 16 && strcmp(a.fingerprint, b.fingerprint) == 0);
    CHECK(strcmp(a.path, model_dir) == 0);
    char other[400];
    snprintf(other, sizeof other, "%s/model-cfg", root);
    tiny_model_opts o = {.extra_cfg = ", \"attention_dropout\": 0.0"};
    write_tiny_model(other, &o);
    CHECK(ft_checkpoint_base_of(other, &b, &err) == 0 && strcmp(a.fingerprint, b.fingerprint));
    snprintf(other, sizeof other, "%s/model-shape", root);
    o = (tiny_model_opts){.extra = "model.extra.weight"};
    write_tiny_model(other, &o);
    CHECK(ft_checkpoint_base_of(other, &b, &err) == 0 && strcmp(a.fingerprint, b.fingerprint));
    /* the weights' values do not count: it is not a hash of the bytes */
    snprintf(other, sizeof other, "%s/model-seed", root);
    o = (tiny_model_opts){.seed = 99};
    write_tiny_model(other, &o);
    CHECK(ft_checkpoint_base_of(other, &b, &err) == 0 && !strcmp(a.fingerprint, b.fingerprint));
    snprintf(other, sizeof other, "%s/none", root);
    CHECK(ft_checkpoint_base_of(other, &b, &err) != 0 && strstr(err.msg, "config.json"));
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft-test-ckpt-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    snprintf(model_dir, sizeof model_dir, "%s/model", root);
    write_model(model_dir, 0, NULL, NULL, NULL);
    RUN(test_resume_full);
    RUN(test_resume_lora);
    RUN(test_limit_latest_and_stamp);
    RUN(test_rotation_is_per_run);
    RUN(test_resume_checks);
    RUN(test_nonfinite_is_refused);
    RUN(test_base_fingerprint);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("checkpoint");
}
