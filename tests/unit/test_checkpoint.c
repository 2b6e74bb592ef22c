/* Checkpoints: a save/load round trip restores weights, AdamW moments and the step so
 * that the resumed run continues bitwise as if never stopped (full and LoRA);
 * save_total_limit; the newest checkpoint is found and temp dirs are ignored; a
 * mismatching stamp or a broken state file is refused with a clear message. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    ft_batch b = {2, 6, ids, NULL, NULL};
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
    CHECK(ft_checkpoint_load(path, b.m, &b.o, &back, &st.stamp, &err) == 0);
    CHECK(back.global_step == 2 && back.epoch == 1 && back.batch_in_epoch == 3 &&
          back.seed == 77);
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
    CHECK(ft_checkpoint_load(path, a.m, &a.o, &st, &want.stamp, &err) != 0);
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
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("checkpoint");
}
