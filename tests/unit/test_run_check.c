/* The checks before launch (lib/run/run_check.h) on a model dir of config.json alone and
 * a data file, at the boundaries of each rule; and whether dist.timeout_s was given
 * (ft_run_config_load's timeout_given, which lets NCCL_TIMEOUT apply). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config/run_config.h"
#include "core/fsutil.h"
#include "run/run_check.h"

static char dir[256], model[300], data[300];

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A 2-layer llama config.json (4 pipeline units) and one training record. */
static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/ft_run_check_%d", (int)getpid());
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    ft_err err;
    CHECK(ft_mkdir_p(model, &err) == 0);
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", model);
    write_text(path, "{\"model_type\": \"llama\", \"vocab_size\": 32, \"hidden_size\": 16, "
                     "\"intermediate_size\": 24, \"num_hidden_layers\": 2, "
                     "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                     "\"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 64}");
    write_text(data, "{\"input_ids\": [1, 2, 3]}\n");
}

static ft_run_config base(void)
{
    ft_run_config c;
    ft_run_config_defaults(&c);
    snprintf(c.model.name, sizeof c.model.name, "%s", model);
    snprintf(c.data.train_path, sizeof c.data.train_path, "%s", data);
    c.train.batch_size = 4;
    c.train.grad_accum = 1;
    return c;
}

/* ft_run_check fails, and its message holds each of the needles. */
static void refuses(const ft_run_config *c, int world, const char *n1, const char *n2)
{
    ft_err err = {0};
    int rc = ft_run_check(c, world, &err);
    CHECK(rc == -1);
    if (rc == -1 && (!strstr(err.msg, n1) || (n2 && !strstr(err.msg, n2)))) {
        fprintf(stderr, "  message: %s\n  wanted: '%s'%s%s%s\n", err.msg, n1, n2 ? ", '" : "",
                n2 ? n2 : "", n2 ? "'" : "");
        CHECK(!"the message names the cause");
    }
}

static void accepts(const ft_run_config *c, int world)
{
    ft_err err = {0};
    int rc = ft_run_check(c, world, &err);
    if (rc)
        fprintf(stderr, "  unexpected: %s\n", err.msg);
    CHECK(rc == 0);
}

static void test_good_config(void)
{
    ft_run_config c = base();
    accepts(&c, 1);
    accepts(&c, 8);
    snprintf(c.data.train_path, sizeof c.data.train_path, "-"); /* stdin */
    accepts(&c, 1);
    ft_err err;
    CHECK(ft_run_check(&c, 0, &err) == -1);
}

static void test_model_and_data(void)
{
    ft_run_config c = base();
    c.model.name[0] = '\0';
    refuses(&c, 1, "model.name", "required");
    c = base();
    snprintf(c.model.name, sizeof c.model.name, "%s/none", dir);
    refuses(&c, 1, "model.name", "/none");
    c = base();
    snprintf(c.model.name, sizeof c.model.name, "%s", dir); /* a dir without config.json */
    refuses(&c, 1, "config.json", NULL);
    c = base();
    snprintf(c.model.tokenizer, sizeof c.model.tokenizer, "%s/no_tokenizer", dir);
    refuses(&c, 1, "model.tokenizer", "no_tokenizer");
    c = base();
    c.data.train_path[0] = '\0';
    refuses(&c, 1, "data.train_path", "required");
    snprintf(c.data.train_path, sizeof c.data.train_path, "%s/missing.jsonl", dir);
    refuses(&c, 1, "data.train_path", "missing.jsonl");
    snprintf(c.data.train_path, sizeof c.data.train_path, "%s", dir);
    refuses(&c, 1, "data.train_path", "directory");
    c = base();
    snprintf(c.data.eval_path, sizeof c.data.eval_path, "%s/missing_eval.jsonl", dir);
    refuses(&c, 1, "data.eval_path", "missing_eval.jsonl");
    c = base();
    snprintf(c.tuning.lora.init_adapter, sizeof c.tuning.lora.init_adapter, "%s/none", dir);
    refuses(&c, 1, "tuning.lora.init_adapter", NULL);
    c.tuning.mode = FT_TUNING_FULL; /* no adapter in full fine-tuning */
    accepts(&c, 1);
}

static void test_batch_at_the_world_size(void)
{
    ft_run_config c = base();
    c.train.global_batch_size = 8; /* 4 x 1 x 2 */
    accepts(&c, 2);
    refuses(&c, 3, "world_size 3", "3 ranks");
    refuses(&c, 1, "world_size 1", NULL);
    c.train.grad_accum = FT_CFG_AUTO; /* derived: 8 / (4 x 1) = 2 */
    accepts(&c, 1);
    refuses(&c, 3, "not divisible", NULL);
    c.train.global_batch_size = 4 * 128;
    accepts(&c, 1); /* grad_accum 128: no cap on the accumulation */
    c = base();
    c.train.batch_size = FT_CFG_AUTO;
    c.train.grad_accum = FT_CFG_AUTO; /* both auto: planned at start, nothing to check */
    c.train.global_batch_size = 7;
    accepts(&c, 2);
    c = base();
    snprintf(c.train.memory_budget, sizeof c.train.memory_budget, "lots");
    refuses(&c, 1, "train.memory_budget", NULL);
}

static void test_generation_and_strategy(void)
{
    ft_run_config c = base();
    c.train.generation_num_beams = 2;
    refuses(&c, 1, "generation_num_beams", "greedy");
    c = base();
    c.dist.strategy = FT_CFG_STRATEGY_NONE;
    accepts(&c, 1);
    refuses(&c, 2, "dist.strategy none", "2 ranks");
    c = base();
    c.dist.strategy = FT_CFG_STRATEGY_MODEL_PARALLEL;
    accepts(&c, 4); /* embeddings, 2 layers, head */
    refuses(&c, 5, "5 ranks for 4 units", NULL);
    c.train.predict_with_generate = true;
    refuses(&c, 2, "predict_with_generate", "model_parallel");
    c.train.predict_with_generate = false;
    c.dist.offload_optimizer = FT_CFG_OFFLOAD_CPU;
    refuses(&c, 2, "offload_optimizer", "model_parallel");
    c.dist.strategy = FT_CFG_STRATEGY_ZERO2; /* offload with zero: fine */
    accepts(&c, 2);
    /* parameter offload: only where the parameters are sharded */
    c.dist.offload_params = FT_CFG_OFFLOAD_CPU;
    refuses(&c, 2, "dist.offload_params cpu", "zero3");
    c.dist.strategy = FT_CFG_STRATEGY_ZERO3;
    accepts(&c, 2);
    c.dist.strategy = FT_CFG_STRATEGY_FSDP;
    accepts(&c, 2);
    c.dist.strategy = FT_CFG_STRATEGY_ZERO;
    c.dist.zero_stage = 3;
    accepts(&c, 2);
    c.dist.zero_stage = 2;
    refuses(&c, 2, "dist.offload_params cpu", "fsdp");
    c = base();
    c.train.device = FT_CFG_DEVICE_CUDA;
#ifdef FT_HAVE_CUDA
    accepts(&c, 1); /* whether a GPU is visible is the ranks' to say */
    c.train.fp16 = true;
    refuses(&c, 1, "train.fp16", NULL);
#else
    refuses(&c, 1, "train.device", "no CUDA backend");
#endif
}

/* dist.timeout_s given (even as its default) or not: the environment applies only then */
static void test_timeout_given(void)
{
    char path[400];
    snprintf(path, sizeof path, "%s/run.yaml", dir);
    const char *sets[] = {"dist.timeout_s=600"};
    ft_config_sources src = {.yaml_path = path};
    ft_run_config c;
    ft_err err;
    write_text(path, "model:\n  name: x\n");
    CHECK(ft_run_config_load(&c, &src, &err) == 0);
    CHECK(!c.dist.timeout_given && c.dist.timeout_s == 600);
    src.sets = sets;
    src.n_sets = 1;
    CHECK(ft_run_config_load(&c, &src, &err) == 0);
    CHECK(c.dist.timeout_given);
    write_text(path, "dist:\n  timeout_s: 30\n");
    src.n_sets = 0;
    CHECK(ft_run_config_load(&c, &src, &err) == 0);
    CHECK(c.dist.timeout_given && c.dist.timeout_s == 30);
    write_text(path, "dist:\n  timeout_s: null\n"); /* a YAML null: the default again */
    CHECK(ft_run_config_load(&c, &src, &err) == 0);
    CHECK(!c.dist.timeout_given);
}

int main(void)
{
    setup();
    RUN(test_good_config);
    RUN(test_model_and_data);
    RUN(test_batch_at_the_world_size);
    RUN(test_generation_and_strategy);
    RUN(test_timeout_given);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("run_check");
}
