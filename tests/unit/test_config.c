/* The run config: YAML loading, --set overrides, validation errors naming file:line and
 * key with a nearest-key suggestion, moot keys, Make variable mapping, and the resolved
 * YAML reading back to the same values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config/config.h"
#include "config/run_config.h"

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
    /* a key given twice in one mapping, at any depth, is an error (YAML keeps the last) */
    expect_error("train:\n  batch_size: 2\n  epochs: 1\n  batch_size: 4\n",
                 "bad.yaml:4: key 'train.batch_size' is given twice", "line 2");
    expect_error("model:\n  name: a\ntrain:\n  epochs: 1\nmodel:\n  max_seq_len: 8\n",
                 "bad.yaml:5: key 'model' is given twice", "line 1");
    expect_error("tuning:\n  lora:\n    r: 8\n    alpha: 16\n    r: 4\n",
                 "bad.yaml:5: key 'tuning.lora.r' is given twice", NULL);
    expect_error("train: {epochs: 1, epochs: 2}\n", "bad.yaml:1", "'train.epochs'");
    /* ... also through a second document */
    expect_error("train:\n  epochs: 1\n---\ntrain:\n  epochs: 2\n", "bad.yaml:3",
                 "second YAML document");
    /* the same name in two mappings is two keys */
    ft_config *ok = ft_config_new();
    ft_err e2 = {0};
    CHECK(ft_config_load_yaml(ok, write_yaml("two.yaml", "tuning:\n  mode: lora\n  lora:\n"
                                                         "    r: 4\n  quant:\n    blocksize: 64\n"
                                                         "model:\n  name: x\n"),
                              NULL, &e2) == 0);
    ft_config_free(ok);
    /* an empty file (or only comments, or null): an error naming it, not a config that
     * fails later without saying which file lacks model.name */
    expect_error("", "bad.yaml: the file is empty", "model.name");
    expect_error("# nothing yet\n\n", "bad.yaml: the file is empty", NULL);
    expect_error("~\n", "bad.yaml: the file is empty", NULL);
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
    CHECK(ft_run_config_write_yaml(ft_config_values(a), f, &err) == 0);
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

/* Every key lands in a field of its type, and the schema's own rules hold: only int keys
 * with a minimum >= 0 (FT_CFG_AUTO is -1) and string keys allow auto, only string keys lack
 * a default, enum fields are ints. */
static void test_schema_fields(void)
{
    size_t n = 0;
    for (const ft_cfg_key *k = ft_config_schema(); k->name; k++, n++) {
        size_t want = k->type == FT_CFG_INT     ? sizeof(long)
                      : k->type == FT_CFG_FLOAT ? sizeof(double)
                      : k->type == FT_CFG_BOOL  ? sizeof(bool)
                      : k->type == FT_CFG_ENUM  ? sizeof(int)
                                                : k->size;
        bool ok = k->size == want && k->offset + k->size <= sizeof(ft_run_config) &&
                  (k->type != FT_CFG_STRING || k->size >= 2) &&
                  (k->type == FT_CFG_STRING || k->dflt) &&
                  (!k->allow_auto || k->type == FT_CFG_STRING ||
                   (k->type == FT_CFG_INT && k->min >= 0)) &&
                  (k->type != FT_CFG_ENUM || (k->choices && k->choices[0]));
        if (!ok)
            fprintf(stderr, "  schema key %s: field or rules wrong\n", k->name);
        CHECK(ok);
        /* no two keys share a field */
        for (const ft_cfg_key *j = ft_config_schema(); j < k; j++)
            CHECK(j->offset + j->size <= k->offset || k->offset + k->size <= j->offset);
    }
    CHECK(n > 60);
}

/* Each enum value lands as its constant: the enums of run_config.h follow the schema's
 * choices. */
static void test_enum_fields(void)
{
    ft_config *c = ft_config_new();
    ft_err err;
    const ft_run_config *v = ft_config_values(c);
    static const struct {
        const char *set;
        int field_is;
    } cases[] = {{"tuning.mode=lora", FT_TUNING_LORA},
                 {"tuning.mode=qlora", FT_TUNING_QLORA},
                 {"tuning.mode=full", FT_TUNING_FULL},
                 {"tuning.quant.type=nf4", FT_CFG_QUANT_NF4},
                 {"tuning.quant.type=fp4", FT_CFG_QUANT_FP4},
                 {"tuning.quant.type=int8", FT_CFG_QUANT_INT8},
                 {"train.lr_scheduler=constant", FT_CFG_LR_CONSTANT},
                 {"train.lr_scheduler=linear", FT_CFG_LR_LINEAR},
                 {"train.lr_scheduler=cosine", FT_CFG_LR_COSINE},
                 {"train.device=cpu", FT_CFG_DEVICE_CPU},
                 {"train.device=cuda", FT_CFG_DEVICE_CUDA},
                 {"train.device=auto", FT_CFG_DEVICE_AUTO},
                 {"train.eval_strategy=steps", FT_EVAL_STEPS},
                 {"train.eval_strategy=epoch", FT_EVAL_EPOCH},
                 {"data.format=tokens", FT_CFG_FORMAT_TOKENS},
                 {"data.format=prompt_completion", FT_CFG_FORMAT_PROMPT_COMPLETION},
                 {"data.chat_template=alpaca", FT_CFG_TMPL_ALPACA},
                 {"data.chat_template=plain", FT_CFG_TMPL_PLAIN},
                 {"data.format=sharegpt", FT_CFG_FORMAT_SHAREGPT},
                 {"dist.strategy=zero", FT_CFG_STRATEGY_ZERO},
                 {"dist.strategy=zero2", FT_CFG_STRATEGY_ZERO2},
                 {"dist.strategy=model_parallel", FT_CFG_STRATEGY_MODEL_PARALLEL},
                 {"dist.offload_optimizer=cpu", FT_CFG_OFFLOAD_CPU}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(ft_config_set(c, cases[i].set, NULL, &err) == 0);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(strchr(cases[i].set, '=') - cases[i].set),
                 cases[i].set);
        const ft_cfg_key *k = ft_config_find_key(key);
        int got = *(const int *)((const char *)v + k->offset);
        if (got != cases[i].field_is)
            fprintf(stderr, "  %s: field %d, want %d\n", cases[i].set, got, cases[i].field_is);
        CHECK(got == cases[i].field_is);
        CHECK(strcmp(ft_config_str(c, key), strchr(cases[i].set, '=') + 1) == 0);
    }
    CHECK(v->tuning.mode == FT_TUNING_FULL && v->dist.strategy == FT_CFG_STRATEGY_MODEL_PARALLEL);
    CHECK(strcmp(ft_tuning_mode_name(FT_TUNING_QLORA), "qlora") == 0);
    CHECK(strcmp(ft_cfg_strategy_name(FT_CFG_STRATEGY_FSDP), "fsdp") == 0);
    ft_config_free(c);
}

/* The typed values: defaults, numbers, auto, strings and their size limit; a bad value
 * leaves the field as it was. */
static void test_typed_values(void)
{
    ft_run_config d;
    ft_run_config_defaults(&d);
    CHECK(d.train.batch_size == 1 && d.train.global_batch_size == FT_CFG_AUTO);
    CHECK(d.train.loss_chunk_tokens == FT_CFG_AUTO && d.train.max_steps == -1);
    CHECK(d.train.learning_rate == 2e-4 && d.tuning.lora.alpha == 32 && d.train.bf16);
    CHECK(strcmp(d.train.memory_budget, "auto") == 0 && !d.model.name[0]);
    CHECK(strcmp(d.tuning.lora.target_modules, "all-linear") == 0);
    CHECK(d.dist.strategy == FT_CFG_STRATEGY_AUTO && d.tuning.mode == FT_TUNING_LORA);

    ft_config *c = ft_config_new();
    ft_err err;
    const ft_run_config *v = ft_config_values(c);
    CHECK(ft_config_set(c, "train.batch_size=auto", NULL, &err) == 0);
    CHECK(v->train.batch_size == FT_CFG_AUTO && ft_config_is_auto(c, "train.batch_size"));
    CHECK(ft_config_set(c, "train.batch_size=7", NULL, &err) == 0 && v->train.batch_size == 7);
    CHECK(ft_config_set(c, "train.batch_size=0", NULL, &err) != 0 && v->train.batch_size == 7);
    CHECK(ft_config_set(c, "train.batch_size=7x", NULL, &err) != 0 && v->train.batch_size == 7);
    CHECK(ft_config_set(c, "train.batch_size=99999999999999999999", NULL, &err) != 0);
    CHECK(ft_config_set(c, "train.max_steps=auto", NULL, &err) != 0); /* no auto there */
    CHECK(ft_config_set(c, "train.epochs=nan", NULL, &err) != 0);
    CHECK(ft_config_set(c, "train.epochs=inf", NULL, &err) != 0);
    CHECK(ft_config_set(c, "train.epochs=2.5", NULL, &err) == 0 && v->train.epochs == 2.5);
    CHECK(ft_config_set(c, "train.bf16=off", NULL, &err) == 0 && !v->train.bf16);
    CHECK(ft_config_set(c, "tuning.lora.rslora=yes", NULL, &err) == 0 && v->tuning.lora.rslora);
    CHECK(ft_config_set(c, "data.train_path=/d/x.jsonl", NULL, &err) == 0);
    CHECK(strcmp(v->data.train_path, "/d/x.jsonl") == 0);
    char *huge = malloc(FT_CFG_PATH_MAX + 32);
    memcpy(huge, "data.train_path=", 16);
    memset(huge + 16, 'a', FT_CFG_PATH_MAX - 1);
    huge[16 + FT_CFG_PATH_MAX - 1] = '\0'; /* a value that just fits */
    CHECK(ft_config_set(c, huge, NULL, &err) == 0 && strlen(v->data.train_path) == FT_CFG_PATH_MAX - 1);
    huge[16 + FT_CFG_PATH_MAX - 1] = 'a';
    huge[16 + FT_CFG_PATH_MAX] = '\0'; /* one byte more */
    CHECK(ft_config_set(c, huge, NULL, &err) != 0);
    CHECK(strstr(err.msg, "data.train_path") && strstr(err.msg, "longer than 4095 bytes"));
    CHECK(strlen(v->data.train_path) == FT_CFG_PATH_MAX - 1);
    free(huge);
    /* a YAML null resets to the default, and to "not given" */
    CHECK(ft_config_is_explicit(c, "train.batch_size"));
    ft_config_reset_key(c, "train.batch_size");
    CHECK(v->train.batch_size == 1 && !ft_config_is_explicit(c, "train.batch_size"));
    ft_config_free(c);
}

/* The sources in their order: the file, then --set-var, then --set, then the DeepSpeed
 * JSON the result names; an error in any names its source. */
static void test_load_order(void)
{
    char json[128];
    snprintf(json, sizeof json, "%s/ds.json", dir);
    FILE *f = fopen(json, "w");
    fputs("{\"zero_optimization\": {\"stage\": 3}, \"gradient_accumulation_steps\": 4}\n", f);
    fclose(f);
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "model:\n  name: /m\ntrain:\n  batch_size: 2\n  seed: 1\n  epochs: 3\n"
             "dist:\n  deepspeed_config: %s\n",
             json);
    const char *path = write_yaml("order.yaml", yaml);
    const char *vars[] = {"TRAIN_SEED=2", "TRAIN_EPOCHS=4"};
    const char *sets[] = {"train.seed=3"};
    ft_config_sources src = {.yaml_path = path, .vars = vars, .n_vars = 2, .sets = sets,
                             .n_sets = 1};
    ft_run_config *rc = malloc(sizeof *rc);
    ft_err err;
    CHECK(ft_run_config_load(rc, &src, &err) == 0);
    CHECK(strcmp(rc->model.name, "/m") == 0 && rc->train.batch_size == 2);
    CHECK(rc->train.seed == 3 && rc->train.epochs == 4);
    CHECK(rc->dist.strategy == FT_CFG_STRATEGY_ZERO3 && rc->train.grad_accum == 4);
    /* --set over the JSON is a mismatch the JSON reports */
    const char *clash[] = {"train.grad_accum=2"};
    src.sets = clash;
    CHECK(ft_run_config_load(rc, &src, &err) != 0);
    CHECK(strstr(err.msg, "mismatch") && strstr(err.msg, "gradient_accumulation_steps"));
    const char *badvar[] = {"TRAIN_SED=2"};
    src.vars = badvar;
    src.n_vars = 1;
    CHECK(ft_run_config_load(rc, &src, &err) != 0 && strstr(err.msg, "TRAIN_SEED"));
    free(rc);
}

/* --get's text of a value. */
static void test_key_text(void)
{
    ft_config *c = ft_config_new();
    ft_err err;
    char t[64];
    const ft_run_config *v = ft_config_values(c);
    CHECK(ft_run_config_key_text(v, "model.name", t, sizeof t, &err) != 0);
    CHECK(strstr(err.msg, "required and not set") != NULL);
    CHECK(ft_run_config_key_text(v, "model.nam", t, sizeof t, &err) != 0);
    CHECK(strstr(err.msg, "unknown key") != NULL);
    CHECK(ft_run_config_key_text(v, "model.tokenizer", t, sizeof t, &err) == 0 && !t[0]);
    CHECK(ft_run_config_key_text(v, "train.global_batch_size", t, sizeof t, &err) == 0 &&
          strcmp(t, "auto") == 0);
    CHECK(ft_run_config_key_text(v, "train.learning_rate", t, sizeof t, &err) == 0 &&
          strcmp(t, "0.0002") == 0);
    CHECK(ft_run_config_key_text(v, "dist.strategy", t, sizeof t, &err) == 0 &&
          strcmp(t, "auto") == 0);
    CHECK(ft_run_config_key_text(v, "train.bf16", t, sizeof t, &err) == 0 &&
          strcmp(t, "true") == 0);
    CHECK(ft_config_set(c, "model.max_seq_len=77", NULL, &err) == 0);
    CHECK(ft_run_config_key_text(v, "model.max_seq_len", t, sizeof t, &err) == 0 &&
          strcmp(t, "77") == 0);
    ft_config_free(c);
}

/* model.add_special_tokens: a list of non-empty strings, from YAML (block or flow list),
 * --set (JSON text) or --set-var; anything else is an error naming the key. */
static void test_list_key(void)
{
    const char *K = "model.add_special_tokens";
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(strcmp(ft_config_str(c, K), "[]") == 0 && !ft_config_has(c, K));
    CHECK(ft_config_set(c, "model.add_special_tokens=[\"<a>\", \"b c\"]", NULL, &err) == 0);
    CHECK(ft_config_has(c, K));
    CHECK(ft_config_set_var(c, "MODEL_ADD_SPECIAL_TOKENS=[\"<|im_end|>\"]", NULL, &err) == 0);
    CHECK(strcmp(ft_config_str(c, K), "[\"<|im_end|>\"]") == 0);
    static const char *const bad[] = {"[\"<a>\", 3]", "[\"\"]", "[null]", "\"<a>\"", "<a>",
                                      "{\"a\": \"b\"}", "[[\"a\"]]"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char set[128];
        snprintf(set, sizeof set, "%s=%s", K, bad[i]);
        err.msg[0] = '\0';
        CHECK(ft_config_set(c, set, NULL, &err) != 0);
        CHECK(strstr(err.msg, K) != NULL);
        CHECK(strcmp(ft_config_str(c, K), "[\"<|im_end|>\"]") == 0);
    }
    ft_config_free(c);
    c = ft_config_new();
    const char *path = write_yaml("tok.yaml", "model:\n  add_special_tokens:\n"
                                              "    - \"<|im_start|>\"\n    - <x>\n");
    CHECK(ft_config_load_yaml(c, path, NULL, &err) == 0);
    CHECK(strcmp(ft_config_str(c, K), "[\"<|im_start|>\", \"<x>\"]") == 0);
    ft_config_free(c);
    c = ft_config_new();
    path = write_yaml("tok2.yaml", "model:\n  add_special_tokens: [\"<a>\", 7]\n");
    err.msg[0] = '\0';
    CHECK(ft_config_load_yaml(c, path, NULL, &err) != 0);
    CHECK(strstr(err.msg, "tok2.yaml:2") && strstr(err.msg, K) &&
          strstr(err.msg, "non-empty string"));
    ft_config_free(c);
}

/* data.chat_template_kwargs: a JSON object from --set (its text) or from YAML (a
 * mapping, turned into JSON by YAML 1.2's core schema, or the JSON text as a string);
 * anything else, and the names transformers sets itself, are errors naming the key. */
static void test_json_key(void)
{
    const char *K = "data.chat_template_kwargs";
    ft_config *c = ft_config_new();
    ft_err err = {0};
    CHECK(strcmp(ft_config_str(c, K), "{}") == 0 && !ft_config_has(c, K));
    CHECK(ft_config_set(c, "data.chat_template_kwargs={\"enable_thinking\": false}", NULL,
                        &err) == 0);
    CHECK(strcmp(ft_config_str(c, K), "{\"enable_thinking\": false}") == 0);
    CHECK(ft_config_has(c, K));
    static const struct {
        const char *value, *needle;
    } bad[] = {
        {"[1, 2]", "must be a JSON object"},
        {"true", "must be a JSON object"},
        {"{\"a\": 1,}", "must be a JSON object:"},
        {"{\"a\": 1, \"a\": 2}", "duplicate"},
        {"{\"messages\": []}", "may not set 'messages'"},
        {"{\"x\": 1, \"add_generation_prompt\": true}", "may not set 'add_generation_prompt'"},
        {"{\"bos_token\": \"<s>\"}", "may not set 'bos_token'"},
        {"{\"mask_token\": \"<m>\"}", "may not set 'mask_token'"},
        {"{\"tools\": null}", "reserved: messages, tools"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char set[256];
        snprintf(set, sizeof set, "%s=%s", K, bad[i].value);
        err.msg[0] = '\0';
        CHECK(ft_config_set(c, set, NULL, &err) != 0);
        if (!strstr(err.msg, bad[i].needle) || !strstr(err.msg, K)) {
            fprintf(stderr, "  %s: message '%s' lacks '%s'\n", bad[i].value, err.msg,
                    bad[i].needle);
            CHECK(0);
        }
        /* a refused value leaves the key as it was */
        CHECK(strcmp(ft_config_str(c, K), "{\"enable_thinking\": false}") == 0);
    }
    CHECK(ft_config_set(c, "data.chat_template_kwargs={\"reasoning_mode\": \"/think\"}", NULL,
                        &err) == 0);
    ft_config_free(c);

    /* YAML: a mapping (block or flow) of every JSON type */
    c = ft_config_new();
    const char *path = write_yaml("kw.yaml",
        "data:\n"
        "  chat_template_kwargs:\n"
        "    enable_thinking: false\n"
        "    t: True\n"
        "    n: ~\n"
        "    e:\n"
        "    i: -12\n"
        "    h: 0x1F\n"
        "    o: 0o17\n"
        "    f: 2.50\n"
        "    g: 1e3\n"
        "    s: plain words\n"
        "    q: 'true'\n"
        "    u: \"Ünï \\\"q\\\" \\t\"\n"
        "    l: [1, two, {k: 3.5}]\n"
        "    d: {a: [], b: {}}\n"
        "    \"quoted key\": \"07\"\n");
    CHECK(ft_config_load_yaml(c, path, NULL, &err) == 0);
    const char *want = "{\"enable_thinking\": false, \"t\": true, \"n\": null, \"e\": null, "
                       "\"i\": -12, \"h\": 31, \"o\": 15, \"f\": 2.5, \"g\": 1000.0, "
                       "\"s\": \"plain words\", \"q\": \"true\", "
                       "\"u\": \"Ünï \\\"q\\\" \\t\", \"l\": [1, \"two\", {\"k\": 3.5}], "
                       "\"d\": {\"a\": [], \"b\": {}}, \"quoted key\": \"07\"}";
    if (strcmp(ft_config_str(c, K), want) != 0) {
        fprintf(stderr, "  got  %s\n  want %s\n", ft_config_str(c, K), want);
        CHECK(0);
    }
    /* the resolved config reads back to the same text */
    char out[128];
    snprintf(out, sizeof out, "%s/kw_resolved.yaml", dir);
    FILE *f = fopen(out, "w");
    CHECK(ft_run_config_write_yaml(ft_config_values(c), f, &err) == 0);
    fclose(f);
    ft_config *b = ft_config_new();
    CHECK(ft_config_set(b, "model.name=x", NULL, &err) == 0);
    CHECK(ft_config_load_yaml(b, out, NULL, &err) == 0);
    CHECK(strcmp(ft_config_str(b, K), want) == 0);
    char t[FT_CFG_JSON_MAX];
    CHECK(ft_run_config_key_text(ft_config_values(b), K, t, sizeof t, &err) == 0 &&
          strcmp(t, want) == 0);
    ft_config_free(b);
    ft_config_free(c);
    /* the JSON text as a YAML string; a flow mapping */
    c = ft_config_new();
    path = write_yaml("kw2.yaml", "data:\n  chat_template_kwargs: '{\"a\": [1]}'\n");
    CHECK(ft_config_load_yaml(c, path, NULL, &err) == 0 &&
          strcmp(ft_config_str(c, K), "{\"a\": [1]}") == 0);
    path = write_yaml("kw3.yaml", "data: {chat_template_kwargs: {x: 1}}\n");
    CHECK(ft_config_load_yaml(c, path, NULL, &err) == 0 &&
          strcmp(ft_config_str(c, K), "{\"x\": 1}") == 0);
    ft_config_free(c);

    expect_error("data:\n  chat_template_kwargs:\n    messages: []\n", "bad.yaml:2",
                 "may not set 'messages'");
    expect_error("data:\n  chat_template_kwargs: [a, b]\n", "bad.yaml:2",
                 "must be a JSON object");
    expect_error("data:\n  chat_template_kwargs: plain\n", "chat_template_kwargs",
                 "must be a JSON object");
    expect_error("data:\n  chat_template_kwargs:\n    a: 1\n    a: 2\n", "bad.yaml",
                 "duplicate");
    expect_error("data:\n  chat_template_kwargs:\n    think: yes\n", "bad.yaml:3",
                 "YAML 1.1");
    expect_error("data:\n  chat_template_kwargs:\n    x: .inf\n", "bad.yaml:3", "no JSON form");
    expect_error("data:\n  chat_template_kwargs:\n    x: 1e999\n", "bad.yaml:3", "out of range");
    expect_error("data:\n  chat_template_kwargs:\n    x: 99999999999999999999\n", "bad.yaml:3",
                 "out of range");
    expect_error("data:\n  chat_template_kwargs:\n    x: &a 1\n    y: *a\n", "bad.yaml",
                 "aliases");
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
    RUN(test_schema_fields);
    RUN(test_enum_fields);
    RUN(test_typed_values);
    RUN(test_load_order);
    RUN(test_key_text);
    RUN(test_json_key);
    RUN(test_list_key);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("config");
}
