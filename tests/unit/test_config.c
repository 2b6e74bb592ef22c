/* The run config: YAML loading, --set overrides, validation errors naming file:line and
 * key with a nearest-key suggestion, moot keys, Make variable mapping, and the resolved
 * YAML reading back to the same values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"

static char dir[64];

static const char *write_yaml(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static void expect_error(const char *yaml, const char *needle1, const char *needle2)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    const char *path = write_yaml("bad.yaml", yaml);
    CHECK(ft_config_load_yaml(c, path, NULL, &err) != 0);
    if (!strstr(err.msg, needle1) || (needle2 && !strstr(err.msg, needle2))) {
        fprintf(stderr, "  message '%s' lacks '%s' / '%s'\n", err.msg, needle1,
                needle2 ? needle2 : "");
        CHECK(0);
    }
    ft_config_free(c);
}

static void test_defaults_and_load(void)
{
    ft_config *c = ft_config_new();
    ft_err err;
    CHECK(ft_config_int(c, "train.batch_size") == 1);
    CHECK(!ft_config_has(c, "model.name"));
    const char *path = write_yaml("ok.yaml", "model:\n  name: \"/models/tiny\"\n  max_seq_len: 1024\n"
                                             "tuning:\n  mode: full\n  lora:\n    r: 8\n"
                                             "    target_modules: [q_proj, v_proj]\n"
                                             "train:\n  batch_size: auto\n  learning_rate: 1e-4\n"
                                             "  bf16: yes\n  warmup_steps: ~\n");
    CHECK(ft_config_load_yaml(c, path, NULL, &err) == 0);
    CHECK(strcmp(ft_config_str(c, "model.name"), "/models/tiny") == 0);
    CHECK(ft_config_int(c, "model.max_seq_len") == 1024);
    CHECK(strcmp(ft_config_str(c, "tuning.mode"), "full") == 0);
    CHECK(ft_config_int(c, "tuning.lora.r") == 8);
    CHECK(strcmp(ft_config_str(c, "tuning.lora.target_modules"), "q_proj,v_proj") == 0);
    CHECK(ft_config_is_auto(c, "train.batch_size"));
    CHECK_CLOSE(ft_config_float(c, "train.learning_rate"), 1e-4, 1e-12);
    CHECK(ft_config_bool(c, "train.bf16"));
    CHECK(ft_config_int(c, "train.warmup_steps") == 0);
    ft_config_free(c);
}

static void test_errors(void)
{
    expect_error("train:\n  learnig_rate: 1\n", "bad.yaml:2", "did you mean 'train.learning_rate'");
    expect_error("train:\n  batch_size: many\n", "bad.yaml:2", "train.batch_size");
    expect_error("train:\n  epochs: -1\n", "train.epochs", ">= 0");
    expect_error("tuning:\n  mode: qlora4\n", "tuning.mode", "lora|qlora|full");
    expect_error("train:\n  bf16: maybe\n", "train.bf16", "true or false");
    expect_error("model: [1, 2]\n", "bad.yaml", "model");
    expect_error("train:\n  batch_size: [1\n", "bad.yaml", "YAML");
    expect_error("zzz:\n  q: 1\n", "unknown key 'zzz.q'", NULL);
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(ft_config_load_yaml(c, "/nonexistent/x.yaml", NULL, &err) != 0);
    CHECK(strstr(err.msg, "/nonexistent/x.yaml") != NULL);
    ft_config_free(c);
}

static void test_set_and_vars(void)
{
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(ft_config_set(c, "train.grad_accum=32", NULL, &err) == 0);
    CHECK(ft_config_int(c, "train.grad_accum") == 32);
    CHECK(ft_config_set(c, "train.grad_acum=32", NULL, &err) != 0);
    CHECK(strstr(err.msg, "did you mean 'train.grad_accum'") != NULL);
    CHECK(ft_config_set(c, "nonsense", NULL, &err) != 0);
    CHECK(ft_config_key_for_var("TRAIN_BATCH_SIZE") &&
          strcmp(ft_config_key_for_var("TRAIN_BATCH_SIZE"), "train.batch_size") == 0);
    CHECK(ft_config_key_for_var("MODEL_MAX_SEQ_LEN") &&
          strcmp(ft_config_key_for_var("MODEL_MAX_SEQ_LEN"), "model.max_seq_len") == 0);
    CHECK(ft_config_key_for_var("TUNING_LORA_R") &&
          strcmp(ft_config_key_for_var("TUNING_LORA_R"), "tuning.lora.r") == 0);
    CHECK(ft_config_key_for_var("TRAIN_NOPE") == NULL);
    ft_config_free(c);
}

static void test_moot_note(void)
{
    ft_config *c = ft_config_new();
    ft_err err;
    char buf[512] = {0};
    FILE *notes = fmemopen(buf, sizeof buf, "w");
    const char *path = write_yaml("moot.yaml", "train:\n  dataloader_pin_memory: true\n");
    CHECK(ft_config_load_yaml(c, path, notes, &err) == 0);
    fclose(notes);
    CHECK(strstr(buf, "dataloader_pin_memory") != NULL && strstr(buf, "no effect") != NULL);
    ft_config_free(c);
}

static void test_write_round_trip(void)
{
    ft_config *a = ft_config_new(), *b = ft_config_new();
    ft_err err;
    CHECK(ft_config_set(a, "model.name=/m/with \"quotes\"", NULL, &err) == 0);
    CHECK(ft_config_set(a, "train.learning_rate=3e-5", NULL, &err) == 0);
    CHECK(ft_config_set(a, "tuning.lora.r=4", NULL, &err) == 0);
    char path[128];
    snprintf(path, sizeof path, "%s/resolved.yaml", dir);
    FILE *f = fopen(path, "w");
    CHECK(ft_config_write_yaml(a, f, &err) == 0);
    fclose(f);
    CHECK(ft_config_load_yaml(b, path, NULL, &err) == 0);
    CHECK(strcmp(ft_config_str(b, "model.name"), "/m/with \"quotes\"") == 0);
    CHECK_CLOSE(ft_config_float(b, "train.learning_rate"), 3e-5, 1e-15);
    CHECK(ft_config_int(b, "tuning.lora.r") == 4);
    for (const ft_cfg_key *k = ft_config_schema(); k->name; k++)
        if (k->type == FT_CFG_STRING || k->type == FT_CFG_ENUM) {
            const char *x = ft_config_str(a, k->name), *y = ft_config_str(b, k->name);
            CHECK((!x && !y) || (x && y && strcmp(x, y) == 0));
        }
    ft_config_free(a);
    ft_config_free(b);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ft-test-config-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    RUN(test_defaults_and_load);
    RUN(test_errors);
    RUN(test_set_and_vars);
    RUN(test_moot_note);
    RUN(test_write_round_trip);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("config");
}
