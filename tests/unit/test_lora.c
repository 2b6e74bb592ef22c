/* Unit tests of lib/formats/lora.c's adapter_config.json reader on hostile files: every
 * error names the file (and the key), a key given twice is refused, a FIFO is refused
 * without blocking, values that would wrap around in an int are refused; and the checks
 * made once the model is known (ft_model_load: a layer the model lacks, targets that
 * select nothing) name the adapter_config.json the settings came from. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fifo_guard.h"
#include "formats/lora.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "tiny_model.h"

static char root[64];

#define GOOD "\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4, \"target_modules\": [\"q_proj\"]"

/* Writes <root>/<sub>/adapter_config.json; returns the dir. */
static const char *write_config(const char *sub, const char *text)
{
    static char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", root, sub);
    ft_err err;
    CHECK(ft_mkdir_p(dir, &err) == 0);
    char path[400];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return dir;
}

/* Loading dir's config fails with a message naming the file and holding needle. */
static void expect_error(const char *dir, const char *needle)
{
    ft_lora_config c;
    ft_err err = {0};
    char path[400];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    fifo_guard(true);
    int rc = ft_lora_config_load(&c, dir, &err);
    fifo_guard(false);
    CHECK(rc == -1);
    if (rc == 0 || !strstr(err.msg, path) || !strstr(err.msg, needle)) {
        fprintf(stderr, "  %s: got '%s', want the path and '%s'\n", dir, err.msg, needle);
        CHECK(0);
    }
}

static void test_config_errors(void)
{
    ft_lora_config c;
    ft_err err = {0};
    const char *dir = write_config("good", "{" GOOD ", \"layers_to_transform\": [0, 1]}");
    CHECK(ft_lora_config_load(&c, dir, &err) == 0);
    CHECK(c.r == 2 && c.alpha == 4 && c.n_layers == 2 && c.layers[1] == 1);
    CHECK(strstr(c.source, dir) && strstr(c.source, "adapter_config.json"));

    /* a key given twice, the last of which Python would keep */
    expect_error(write_config("dup", "{" GOOD ", \"r\": 16}"), "duplicate");
    expect_error(write_config("dup2", "{\"r\": 2, " GOOD "}"), "\"r\"");
    /* integers that an int cannot hold would wrap around to another value */
    expect_error(write_config("r_huge", "{\"peft_type\": \"LORA\", \"r\": 4294967298, \"lora_alpha\": 4,"
                                        " \"target_modules\": [\"q_proj\"]}"),
                 "'r'");
    expect_error(write_config("alpha_huge", "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 1e300,"
                                            " \"target_modules\": [\"q_proj\"]}"),
                 "'lora_alpha'");
    expect_error(write_config("layer_wrap", "{" GOOD ", \"layers_to_transform\": [4294967296]}"),
                 "layers_to_transform");
    expect_error(write_config("layer_wrap1", "{" GOOD ", \"layers_to_transform\": 4294967297}"),
                 "4294967297");
    expect_error(write_config("layer_neg", "{" GOOD ", \"layers_to_transform\": [1, -1]}"),
                 "-1");
    expect_error(write_config("layer_str", "{" GOOD ", \"layers_to_transform\": [\"1\"]}"),
                 "layers_to_transform");
    expect_error(write_config("targets_empty",
                              "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4,"
                              " \"target_modules\": []}"),
                 "target_modules");
    expect_error(write_config("targets_bad",
                              "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4,"
                              " \"target_modules\": [\"q_proj\", 7]}"),
                 "target_modules");
    expect_error(write_config("bad_json", "{" GOOD ","), "invalid JSON");

    /* modules_to_save: the embedding and the head, by PEFT's names; other modules refused */
    dir = write_config("mts", "{" GOOD ", \"modules_to_save\": [\"model.embed_tokens\", "
                              "\"lm_head\"]}");
    CHECK(ft_lora_config_load(&c, dir, &err) == 0);
    CHECK(c.modules_to_save == (FT_SAVE_EMBED | FT_SAVE_HEAD));
    dir = write_config("mts_null", "{" GOOD ", \"modules_to_save\": null}");
    CHECK(ft_lora_config_load(&c, dir, &err) == 0 && c.modules_to_save == 0);
    expect_error(write_config("mts_norm", "{" GOOD ", \"modules_to_save\": [\"lm_head\", "
                                          "\"norm\"]}"),
                 "norm");
    expect_error(write_config("mts_str", "{" GOOD ", \"modules_to_save\": \"lm_head\"}"),
                 "modules_to_save");
    expect_error(write_config("mts_int", "{" GOOD ", \"modules_to_save\": [3]}"),
                 "modules_to_save");
    expect_error(write_config("tt", "{" GOOD ", \"trainable_token_indices\": [3, 4]}"),
                 "trainable_token_indices");
    unsigned mods;
    CHECK(ft_lora_modules_to_save_parse("embed_tokens, lm_head", &mods, &err) == 0 &&
          mods == (FT_SAVE_EMBED | FT_SAVE_HEAD));
    CHECK(ft_lora_modules_to_save_parse("", &mods, &err) == 0 && mods == 0);
    CHECK(ft_lora_modules_to_save_parse("lm_head,o_proj", &mods, &err) == -1 &&
          strstr(err.msg, "'o_proj'"));

    /* not a regular file: a FIFO would block the reader, a directory is no config */
    char path[400];
    dir = write_config("fifo", "{}");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    CHECK(make_fifo(path));
    expect_error(dir, "not a regular file");
    dir = write_config("isdir", "{}");
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    unlink(path);
    CHECK(ft_mkdir_p(path, &err) == 0);
    expect_error(dir, "not a regular file");
}

/* ft_model_load with the settings of dir's adapter_config.json fails naming the file and
 * holding needle. */
static void expect_model_error(const char *model, const char *dir, const char *needle)
{
    ft_model_options opt = {.mode = FT_TRAIN_LORA};
    ft_err err = {0};
    CHECK(ft_lora_config_load(&opt.lora, dir, &err) == 0);
    ft_model *m = NULL;
    CHECK(ft_model_load(&m, model, &opt, &err) == -1 && m == NULL);
    char path[400];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (!strstr(err.msg, path) || !strstr(err.msg, needle)) {
        fprintf(stderr, "  %s: got '%s', want the path and '%s'\n", dir, err.msg, needle);
        CHECK(0);
    }
    ft_model_free(m);
}

static void test_model_checks_name_file(void)
{
    char model[300];
    snprintf(model, sizeof model, "%s/model", root);
    write_tiny_model(model, &(tiny_model_opts){0});
    /* the tiny model has L = 2 layers */
    expect_model_error(model, write_config("layer_5", "{" GOOD ", \"layers_to_transform\": [5]}"),
                       "layer 5");
    expect_model_error(model,
                       write_config("regex_none",
                                    "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4,"
                                    " \"target_modules\": \"model\\\\.layers\\\\.7\\\\..*\"}"),
                       "select no linear layer");
    expect_model_error(model,
                       write_config("path_none",
                                    "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4,"
                                    " \"target_modules\": [\"model.layers.9.mlp.up_proj\"]}"),
                       "select no linear layer");
    /* settings from elsewhere (a run config) keep their message without a file */
    ft_model_options opt = {.mode = FT_TRAIN_LORA,
                            .lora = {.r = 2, .alpha = 4, .targets = 1, .n_layers = 1,
                                     .layers = {5}}};
    ft_model *m = NULL;
    ft_err err = {0};
    CHECK(ft_model_load(&m, model, &opt, &err) == -1 && strstr(err.msg, "layer 5") &&
          !strstr(err.msg, "adapter_config.json"));
}

/* modules_to_save: refused on a tied model (naming the adapter's file); an adapter saved
 * with the head loads only into a model that trains the head, and the other way round. */
static void test_modules_to_save_checks(void)
{
    char tied[300], untied[300];
    snprintf(tied, sizeof tied, "%s/tied", root);
    write_tiny_model(tied, &(tiny_model_opts){.tied = 1});
    snprintf(untied, sizeof untied, "%s/untied", root);
    write_tiny_model(untied, &(tiny_model_opts){0});
    const char *dir = write_config("mts_head", "{" GOOD ", \"modules_to_save\": [\"lm_head\"]}");
    /* without ensure_weight_tying (PEFT's default): the listed module's own copy, which
     * unties the model: a head of its own (the embedding's values) trains, the embedding
     * stays the base's */
    {
        ft_model_options uopt = {.mode = FT_TRAIN_LORA};
        ft_err uerr = {0};
        CHECK(ft_lora_config_load(&uopt.lora, dir, &uerr) == 0);
        ft_model *um = NULL;
        CHECK(ft_model_load(&um, tied, &uopt, &uerr) == 0);
        ft_param *h = um ? ft_model_find_param(um, "lm_head.weight") : NULL;
        ft_param *e = um ? ft_model_find_param(um, "model.embed_tokens.weight") : NULL;
        CHECK(um && ft_model_head_untied(um) && !ft_model_cfg(um)->tie_word_embeddings);
        CHECK(h && h->trainable && e && !e->trainable &&
              memcmp(h->data, e->data, h->numel * sizeof(float)) == 0);
        ft_model_free(um);
    }
    /* with ensure_weight_tying: the one embedding trains, saved under both keys */
    {
        const char *tdir = write_config("mts_tied", "{" GOOD ", \"modules_to_save\": "
                                                    "[\"lm_head\"], \"ensure_weight_tying\": true}");
        ft_model_options topt = {.mode = FT_TRAIN_LORA};
        ft_err terr = {0};
        CHECK(ft_lora_config_load(&topt.lora, tdir, &terr) == 0 && topt.lora.ensure_weight_tying);
        ft_model *tm = NULL;
        CHECK(ft_model_load(&tm, tied, &topt, &terr) == 0);
        ft_param *e = tm ? ft_model_find_param(tm, "model.embed_tokens.weight") : NULL;
        CHECK(e && e->trainable && !ft_model_find_param(tm, "lm_head.weight"));
        char tsaved[300];
        snprintf(tsaved, sizeof tsaved, "%s/tied_saved", root);
        CHECK(tm && ft_model_save_adapter(tm, tsaved, tied, &terr) == 0);
        CHECK(tm && ft_model_load_adapter(tm, tsaved, &terr) == 0);
        ft_model_free(tm);
    }

    ft_model_options opt = {.mode = FT_TRAIN_LORA};
    ft_err err = {0};
    CHECK(ft_lora_config_load(&opt.lora, dir, &err) == 0);
    ft_model *m = NULL;
    CHECK(ft_model_load(&m, untied, &opt, &err) == 0);
    ft_param *head = ft_model_find_param(m, "lm_head.weight");
    CHECK(head && head->trainable && !head->is_lora && head->grad);
    CHECK(!ft_model_find_param(m, "model.embed_tokens.weight")->trainable);
    char saved[300];
    snprintf(saved, sizeof saved, "%s/saved", root);
    CHECK(ft_model_save_adapter(m, saved, untied, &err) == 0);
    CHECK(ft_model_load_adapter(m, saved, &err) == 0);
    ft_model_free(m);
    /* the same adapter into a model without modules_to_save: refused, naming the key */
    opt.lora.modules_to_save = 0;
    CHECK(ft_model_load(&m, untied, &opt, &err) == 0);
    CHECK(ft_model_load_adapter(m, saved, &err) == -1 && strstr(err.msg, "modules_to_save"));
    ft_model_free(m);
}

/* The nine module names: short forms ("gate_up" is not "gate"), all-linear's bits, and
 * a model refusing a module its block lacks (phi3 has no q_proj; llama no qkv_proj),
 * naming it, while all-linear keeps each block's own. */
/* A decoder nested in a larger model (module_prefix "model.language_model.", a
 * multimodal gemma3): the targets and layers are saved as one regex over its module
 * paths, which selects the same projections of the same layers when read back, and a
 * regex read back matches only paths under the prefix. */
static void test_nested_decoder_regex(void)
{
    ft_lora_config c = {.r = 2, .alpha = 4, .targets = (1u << FT_PROJ_Q) | (1u << FT_PROJ_DOWN),
                        .n_layers = 2, .layers = {0, 2}};
    snprintf(c.module_prefix, sizeof c.module_prefix, "model.language_model.");
    char dir[256];
    snprintf(dir, sizeof dir, "%s/nested", root);
    ft_err err = {0};
    CHECK(ft_mkdir_p(dir, &err) == 0);
    CHECK(ft_lora_config_save(&c, dir, "base", &err) == 0);
    ft_lora_config back;
    CHECK(ft_lora_config_load(&back, dir, &err) == 0);
    CHECK(strcmp(back.target_regex, "model\\.language_model\\.layers\\.(?:0|2)\\.(?:"
                 "self_attn\\.q_proj|mlp\\.down_proj)") == 0);
    CHECK(back.n_layers == 0); /* (in the regex: PEFT ignores layers_to_transform there) */
    snprintf(back.module_prefix, sizeof back.module_prefix, "model.language_model.");
    for (int l = 0; l < 4; l++) {
        unsigned mask = 0;
        CHECK(ft_lora_layer_mask(&back, l, &mask, &err) == 0);
        CHECK(mask == (l == 0 || l == 2 ? c.targets : 0u));
    }
    /* the same regex selects nothing in a causal LM's paths (model.layers.N...) */
    back.module_prefix[0] = '\0';
    unsigned mask = 1;
    CHECK(ft_lora_layer_mask(&back, 0, &mask, &err) == 0 && mask == 0);
    /* the embedding and the head as targets: their paths in the regex too, found again
     * by ft_lora_regex_outer under the prefix (not as a causal LM's model.embed_tokens) */
    c.targets |= FT_LORA_OUTER;
    CHECK(ft_lora_config_save(&c, dir, "base", &err) == 0);
    CHECK(ft_lora_config_load(&back, dir, &err) == 0);
    CHECK(strcmp(back.target_regex, "model\\.language_model\\.layers\\.(?:0|2)\\.(?:"
                 "self_attn\\.q_proj|mlp\\.down_proj)|model\\.language_model\\.embed_tokens|"
                 "lm_head") == 0);
    CHECK((back.targets & FT_LORA_OUTER) == FT_LORA_HEAD);
    snprintf(back.module_prefix, sizeof back.module_prefix, "model.language_model.");
    CHECK(ft_lora_regex_outer(&back, &err) == 0 && (back.targets & FT_LORA_OUTER) == FT_LORA_OUTER);
    /* ... alone: the regex names them only */
    c.targets = FT_LORA_EMBED;
    CHECK(ft_lora_config_save(&c, dir, "base", &err) == 0);
    CHECK(ft_lora_config_load(&back, dir, &err) == 0);
    CHECK(strcmp(back.target_regex, "model\\.language_model\\.embed_tokens") == 0);
    /* PEFT's ensure_weight_tying lists the embedding by its path */
    unsigned t = 0, mods = 0;
    CHECK(ft_lora_targets_parse("q_proj,model.language_model.embed_tokens", &t, &err) == 0);
    CHECK(t == ((1u << FT_PROJ_Q) | FT_LORA_EMBED));
    CHECK(ft_lora_modules_to_save_parse("model.language_model.embed_tokens", &mods, &err) == 0);
    CHECK(mods == FT_SAVE_EMBED);
    /* a causal LM's settings keep the list form */
    c.targets = (1u << FT_PROJ_Q) | (1u << FT_PROJ_DOWN);
    c.module_prefix[0] = '\0';
    c.n_layers = 0;
    CHECK(ft_lora_config_save(&c, dir, "base", &err) == 0);
    CHECK(ft_lora_config_load(&back, dir, &err) == 0);
    CHECK(back.target_regex[0] == '\0' && back.targets == c.targets);
}

/* PEFT's conversion of a config for transformers 5's fused experts: gate, w1 + w3, w2 and
 * all-linear become target_params on a MoE model; nothing on a dense one. */
static void test_resolve_moe(void)
{
    ft_err err = {0};
    ft_lora_config c = {.r = 4, .alpha = 8};
    CHECK(ft_lora_targets_parse("q_proj,gate,w1,w3", &c.targets, &err) == 0);
    ft_lora_config d = c;
    CHECK(ft_lora_resolve_moe(&c, true, &err) == 0);
    CHECK(c.targets == (1u << FT_PROJ_Q));
    CHECK(c.target_params == (FT_LORA_PARAM_ROUTER | FT_LORA_PARAM_GATE_UP));
    /* PEFT's patterns for the fused pair: rank 2 r, alpha 2 alpha */
    const char *gu = "model.layers.1.mlp.experts.gate_up_proj";
    CHECK(c.rank_pattern.n == 1 && strcmp(c.rank_pattern.p[0].key, ".*\\.gate_up_proj") == 0);
    CHECK(ft_lora_module_rank(&c, gu) == 8);
    CHECK(ft_lora_module_rank(&c, "model.layers.1.mlp.experts.down_proj") == 4);
    CHECK(ft_lora_module_scaling(&c, gu) == 2.0f);
    c.rslora = true; /* 2 alpha / sqrt(2 r) */
    CHECK(fabsf(ft_lora_module_scaling(&c, gu) - 16.0f / sqrtf(8.0f)) < 1e-6f);
    /* a key given for gate_up_proj already keeps its place, first, with PEFT's value */
    ft_lora_config g = {.r = 4, .alpha = 8};
    CHECK(ft_lora_targets_parse("w1,w3", &g.targets, &err) == 0);
    CHECK(ft_lora_patterns_parse("{\"q_proj\": 2, \".*\\\\.gate_up_proj\": 3}", true, "rp",
                                 &g.rank_pattern, &err) == 0);
    CHECK(ft_lora_resolve_moe(&g, true, &err) == 0);
    CHECK(g.rank_pattern.n == 2 && g.rank_pattern.p[1].value == 8);
    CHECK(g.alpha_pattern.n == 1 && g.alpha_pattern.p[0].value == 16);
    CHECK(ft_lora_resolve_moe(&d, false, &err) == 0); /* dense: gate is gate_proj */
    CHECK(d.targets == ((1u << FT_PROJ_Q) | (1u << FT_PROJ_GATE)) && d.target_params == 0);
    ft_lora_config e = {.r = 4};
    CHECK(ft_lora_targets_parse("all-linear", &e.targets, &err) == 0);
    CHECK(ft_lora_resolve_moe(&e, true, &err) == 0);
    CHECK(e.targets == FT_LORA_ALL_LINEAR);
    CHECK(e.target_params == (FT_LORA_PARAM_ROUTER | FT_LORA_PARAM_EXPERTS));
    ft_lora_config f = {.r = 4};
    CHECK(ft_lora_targets_parse("w1,w2", &f.targets, &err) == 0);
    CHECK(ft_lora_resolve_moe(&f, true, &err) == -1 && strstr(err.msg, "w1 without w3"));
}

/* PEFT's explicit target_parameters (a run config's tuning.lora.target_parameters): the
 * gate_up pair keeps rank r and alpha; beside w1 / w3 (rank 2 r) it is refused. */
static void test_target_parameters_parse(void)
{
    ft_err err = {0};
    ft_lora_config c = {.r = 4, .alpha = 8, .rslora = true};
    CHECK(ft_lora_target_parameters_parse(" mlp.gate.weight, mlp.experts.gate_up_proj", &c,
                                          &err) == 0);
    CHECK(c.target_params == (FT_LORA_PARAM_ROUTER | FT_LORA_PARAM_GATE_UP));
    const char *gu = "model.layers.0.mlp.experts.gate_up_proj";
    CHECK(c.rank_pattern.n == 0 && ft_lora_module_rank(&c, gu) == 4);
    CHECK(fabsf(ft_lora_module_scaling(&c, gu) - 8.0f / 2.0f) < 1e-6f);
    ft_lora_config d = {.r = 4};
    CHECK(ft_lora_target_parameters_parse("down_proj", &d, &err) == 0);
    CHECK(d.target_params == FT_LORA_PARAM_DOWN);
    CHECK(ft_lora_target_parameters_parse("", &d, &err) == 0 &&
          d.target_params == FT_LORA_PARAM_DOWN);
    CHECK(ft_lora_target_parameters_parse("gate.bias", &d, &err) == -1 &&
          strstr(err.msg, "gate.bias"));
    CHECK(ft_lora_target_parameters_parse("xgate_up_proj", &d, &err) == -1);
    ft_lora_config e = {.r = 4};
    CHECK(ft_lora_targets_parse("w1,w3", &e.targets, &err) == 0);
    CHECK(ft_lora_target_parameters_parse("gate_up_proj", &e, &err) == 0);
    CHECK(ft_lora_resolve_moe(&e, true, &err) == -1 && strstr(err.msg, "target_parameters"));
}

/* rank_pattern / alpha_pattern as PEFT's get_pattern_key matches them: a key is a regex
 * over the whole module name or a dotted suffix of it, from the name's start (re.match of
 * (.*\.)?(key)$), the first key in order wins; each key and value checked. */
static void test_patterns(void)
{
    ft_err err = {0};
    ft_lora_config c = {.r = 4, .alpha = 8};
    CHECK(ft_lora_patterns_parse("{\"model.layers.0.self_attn.q_proj\": 2, \"q_proj\": 6, "
                                 "\"layers\\\\.[12]\\\\..*down_proj\": 3, \"lm_head\": 5}",
                                 true, "rp", &c.rank_pattern, &err) == 0);
    CHECK(ft_lora_patterns_parse("{\"v_proj\": 3, \"embed_tokens\": 2.5}", false, "ap",
                                 &c.alpha_pattern, &err) == 0);
    CHECK(c.rank_pattern.n == 4 && strcmp(c.rank_pattern.origin, "rp") == 0);
    static const struct {
        const char *name;
        int r;
        float alpha;
    } want[] = {{"model.layers.0.self_attn.q_proj", 2, 8}, /* the first key */
                {"model.layers.1.self_attn.q_proj", 6, 8},
                {"model.layers.10.self_attn.q_proj", 6, 8},
                {"model.layers.1.mlp.down_proj", 3, 8},
                {"model.layers.0.mlp.down_proj", 4, 8},
                {"model.layers.1.self_attn.v_proj", 4, 3},
                {"model.layers.1.self_attn.xv_proj", 4, 8}, /* not a dotted suffix */
                {"model.layers.1.self_attn.q_proj.x", 4, 8}, /* matched to the end */
                {"lm_head", 5, 8},
                {"model.embed_tokens", 4, 2.5f}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (ft_lora_module_rank(&c, want[i].name) != want[i].r ||
            ft_lora_module_alpha(&c, want[i].name) != want[i].alpha) {
            fprintf(stderr, "  %s: rank %d alpha %g\n", want[i].name,
                    ft_lora_module_rank(&c, want[i].name), ft_lora_module_alpha(&c, want[i].name));
            CHECK(0);
        }
    }
    CHECK(ft_lora_module_scaling(&c, "model.layers.1.self_attn.v_proj") == 0.75f);
    c.rslora = true;
    CHECK(fabsf(ft_lora_module_scaling(&c, "lm_head") - 8.0f / sqrtf(5.0f)) < 1e-6f);
    CHECK(ft_lora_patterns_parse("", true, "rp", &c.rank_pattern, &err) == 0 &&
          c.rank_pattern.n == 0);
    CHECK(ft_lora_patterns_parse("{}", true, "rp", &c.rank_pattern, &err) == 0 &&
          c.rank_pattern.n == 0);
    /* bad maps: each error names the origin and the key */
    static const struct {
        const char *json, *needle;
        bool rank;
    } bad[] = {{"{\"q_proj\": 2.5}", "q_proj", true},
               {"{\"q_proj\": 0}", "positive integer", true},
               {"{\"q_proj\": -3}", "positive integer", true},
               {"{\"q_proj\": \"8\"}", "q_proj", true},
               {"{\"q_proj\": 0}", "positive number", false},
               {"{\"q_proj\": 1e300}", "positive number", false},
               {"{\"q_(proj\": 2}", "not a regular expression", true},
               {"{\"\": 2}", "module pattern", true},
               {"[\"q_proj\"]", "mapping", true},
               {"{\"q_proj\": 2, \"q_proj\": 3}", "duplicate", true},
               {"{\"q_proj\": 2", "not JSON", true}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ft_lora_patterns_parse(bad[i].json, bad[i].rank, "tuning.lora.x_pattern",
                                        &c.rank_pattern, &err);
        if (rc != -1 || !strstr(err.msg, "tuning.lora.x_pattern") ||
            !strstr(err.msg, bad[i].needle)) {
            fprintf(stderr, "  %s: rc %d '%s'\n", bad[i].json, rc, err.msg);
            CHECK(0);
        }
    }
    char many[8192] = "{";
    for (int i = 0; i <= FT_LORA_MAX_PATTERNS; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s\"k%d\": 1",
                 i ? ", " : "", i);
    strcat(many, "}");
    CHECK(ft_lora_patterns_parse(many, true, "rp", &c.rank_pattern, &err) == -1 &&
          strstr(err.msg, "more than"));

    /* adapter_config.json: read in the file's order; refused with the file and key named;
     * saved in the order given (PEFT reads the first match) */
    const char *dir = write_config("patterns", "{" GOOD ", \"rank_pattern\": {\"q_proj\": 3, "
                                               "\"model.layers.0.self_attn.q_proj\": 1}, "
                                               "\"alpha_pattern\": {\"q_proj\": 5}}");
    ft_lora_config a;
    CHECK(ft_lora_config_load(&a, dir, &err) == 0);
    CHECK(a.rank_pattern.n == 2 && strcmp(a.rank_pattern.p[0].key, "q_proj") == 0);
    CHECK(strstr(a.rank_pattern.origin, "rank_pattern") != NULL);
    CHECK(ft_lora_module_rank(&a, "model.layers.0.self_attn.q_proj") == 3);
    CHECK(ft_lora_module_alpha(&a, "model.layers.0.self_attn.q_proj") == 5);
    CHECK(ft_lora_config_save(&a, dir, "base", &err) == 0);
    ft_lora_config back;
    CHECK(ft_lora_config_load(&back, dir, &err) == 0);
    CHECK(back.rank_pattern.n == 2 && strcmp(back.rank_pattern.p[0].key, "q_proj") == 0 &&
          back.rank_pattern.p[1].value == 1 && back.alpha_pattern.p[0].value == 5);
    expect_error(write_config("rp_float", "{" GOOD ", \"rank_pattern\": {\"q_proj\": 2.0}}"),
                 "'rank_pattern'");
    expect_error(write_config("rp_zero", "{" GOOD ", \"rank_pattern\": {\"q_proj\": 0}}"),
                 "'rank_pattern'");
    expect_error(write_config("ap_neg", "{" GOOD ", \"alpha_pattern\": {\"q_proj\": -1}}"),
                 "'alpha_pattern'");
    expect_error(write_config("ap_list", "{" GOOD ", \"alpha_pattern\": [1]}"),
                 "'alpha_pattern'");
    expect_error(write_config("rp_regex", "{" GOOD ", \"rank_pattern\": {\"[q\": 2}}"), "[q");
    /* PEFT's bias on lora_B: refused by name */
    expect_error(write_config("lora_bias", "{" GOOD ", \"lora_bias\": true}"), "'lora_bias'");
    CHECK(ft_lora_config_load(&a, write_config("no_bias", "{" GOOD ", \"lora_bias\": false}"),
                              &err) == 0);
}

/* A pattern key that matches no module LoRA targets on the model (PEFT warns and ignores
 * it) is refused by the model naming its origin; a model's pairs take their ranks (the
 * trainable count), and an adapter whose patterns give another rank or scaling is
 * refused naming the module. */
static void test_pattern_model_checks(void)
{
    char llama[300];
    snprintf(llama, sizeof llama, "%s/llama_pat", root);
    write_tiny_model(llama, &(tiny_model_opts){0});
    ft_err err = {0};
    ft_model_options opt = {.mode = FT_TRAIN_LORA, .lora = {.r = 2, .alpha = 4}};
    CHECK(ft_lora_targets_parse("q_proj,o_proj", &opt.lora.targets, &err) == 0);
    CHECK(ft_lora_patterns_parse("{\"layers.1.self_attn.q_proj\": 3, \"o_proj\": 1}", true,
                                 "tuning.lora.rank_pattern", &opt.lora.rank_pattern, &err) == 0);
    ft_model *m = NULL;
    CHECK(ft_model_load(&m, llama, &opt, &err) == 0);
    size_t n = 0;
    ft_model_trainable(m, &n);
    /* q: ranks 2, 3 (A [r, C], B [HQ D, r]); o: rank 1 on both layers */
    CHECK(n == (size_t)(2 + 3) * (C + HQ * D) + 2 * (size_t)1 * (HQ * D + C));
    char saved[300];
    snprintf(saved, sizeof saved, "%s/pat_saved", root);
    CHECK(ft_model_save_adapter(m, saved, llama, &err) == 0);
    CHECK(ft_model_load_adapter(m, saved, &err) == 0);
    ft_model_free(m);
    /* the adapter into a model whose settings give q_proj another alpha */
    ft_model_options other = opt;
    CHECK(ft_lora_patterns_parse("{\"q_proj\": 6}", false, "tuning.lora.alpha_pattern",
                                 &other.lora.alpha_pattern, &err) == 0);
    CHECK(ft_model_load(&m, llama, &other, &err) == 0);
    CHECK(ft_model_load_adapter(m, saved, &err) == -1);
    if (!strstr(err.msg, "layers.0.self_attn.q_proj") || !strstr(err.msg, "adapter_config.json")) {
        fprintf(stderr, "  got '%s'\n", err.msg);
        CHECK(0);
    }
    ft_model_free(m);
    /* a key matching no targeted module (v_proj is not a target) */
    CHECK(ft_lora_patterns_parse("{\"v_proj\": 3}", true, "tuning.lora.rank_pattern",
                                 &opt.lora.rank_pattern, &err) == 0);
    CHECK(ft_model_load(&m, llama, &opt, &err) == -1);
    CHECK(strstr(err.msg, "tuning.lora.rank_pattern") && strstr(err.msg, "'v_proj'") &&
          strstr(err.msg, "matches none"));
    /* the same from an adapter's config: named by its file and key */
    expect_model_error(llama, write_config("pat_none", "{" GOOD ", \"alpha_pattern\": "
                                                       "{\"layers.7.self_attn.q_proj\": 3}}"),
                       "'alpha_pattern'");
}

static void test_fused_module_names(void)
{
    unsigned t;
    ft_err err = {0};
    CHECK(ft_lora_targets_parse("qkv,gate_up", &t, &err) == 0);
    CHECK(t == ((1u << FT_PROJ_QKV) | (1u << FT_PROJ_GATE_UP)));
    /* "gate": gate_proj's short form, and on a MoE the router (ft_lora_resolve_moe) */
    CHECK(ft_lora_targets_parse("gate,up", &t, &err) == 0);
    CHECK(t == ((1u << FT_PROJ_GATE) | (1u << FT_PROJ_UP) | FT_LORA_MOE_ROUTER));
    CHECK(ft_lora_targets_parse("self_attn.qkv_proj,gate_up_proj", &t, &err) == 0);
    CHECK(t == ((1u << FT_PROJ_QKV) | (1u << FT_PROJ_GATE_UP)));
    CHECK(ft_lora_targets_parse("all-linear", &t, &err) == 0 && t == 0x3ffu);
    /* qwen2_moe's shared expert gate: by its name (no "_proj" short form) */
    CHECK(ft_lora_targets_parse("shared_expert_gate", &t, &err) == 0);
    CHECK(t == 1u << FT_PROJ_SHGATE);
    CHECK(ft_lora_targets_parse("mlp.shared_expert_gate", &t, &err) == 0);
    CHECK(t == 1u << FT_PROJ_SHGATE);
    CHECK(ft_lora_targets_parse("shared_expe", &t, &err) == -1);
    CHECK(strcmp(ft_proj_name(FT_PROJ_SHGATE), "shared_expert_gate") == 0);
    CHECK(ft_lora_targets_parse("qk_proj", &t, &err) == -1 && strstr(err.msg, "qkv_proj"));
    CHECK(strcmp(ft_proj_path(FT_PROJ_GATE_UP), "mlp.gate_up_proj") == 0);

    char phi3[300], llama[300];
    snprintf(phi3, sizeof phi3, "%s/phi3", root);
    write_tiny_model(phi3, &(tiny_model_opts){.model_type = "phi3"});
    snprintf(llama, sizeof llama, "%s/llama", root);
    write_tiny_model(llama, &(tiny_model_opts){0});
    static const struct {
        const char *model, *targets, *refused; /* refused NULL: loads */
    } cases[] = {{"phi3", "q_proj,o_proj", "'q_proj'"}, {"phi3", "all-linear", NULL},
                 {"phi3", "qkv_proj,gate_up_proj", NULL}, {"llama", "gate_up", "'gate_up_proj'"},
                 {"llama", "all-linear", NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ft_model_options opt = {.mode = FT_TRAIN_LORA, .lora = {.r = 2, .alpha = 4}};
        CHECK(ft_lora_targets_parse(cases[i].targets, &opt.lora.targets, &err) == 0);
        ft_model *m = NULL;
        int rc = ft_model_load(&m, strcmp(cases[i].model, "phi3") ? llama : phi3, &opt, &err);
        if (cases[i].refused) {
            CHECK(rc == -1 && strstr(err.msg, cases[i].refused) &&
                  strstr(err.msg, "not a linear layer"));
        } else {
            CHECK(rc == 0);
            size_t n = 0;
            ft_model_trainable(m, &n);
            CHECK(n > 0);
        }
        ft_model_free(m);
    }
    /* an adapter's config may name modules of several families, as PEFT allows, as long
     * as something is selected */
    const char *multi = write_config("multi", "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 4,"
                                              " \"target_modules\": [\"q_proj\", \"k_proj\","
                                              " \"qkv_proj\", \"o_proj\"]}");
    ft_model_options opt = {.mode = FT_TRAIN_LORA};
    CHECK(ft_lora_config_load(&opt.lora, multi, &err) == 0);
    ft_model *m = NULL;
    CHECK(ft_model_load(&m, phi3, &opt, &err) == 0);
    size_t n = 0;
    ft_model_trainable(m, &n);
    CHECK(n == (size_t)L * 2 * (C + (HQ + 2 * HKV) * D + HQ * D + C)); /* r 2: qkv, o */
    ft_model_free(m);
    expect_model_error(phi3, write_config("phi_none", "{" GOOD "}"), "select no linear layer");
}

/* dir/adapter_model.safetensors with n tensors of the given names and [rows, cols]. */
static void write_tensors(const char *dir, int n, const char *const *names,
                          const int64_t (*shapes)[2])
{
    static float zeros[4096];
    ft_err err = {0};
    ft_st_writer *w = ft_st_writer_new();
    for (int i = 0; i < n; i++)
        CHECK(ft_st_writer_add(w, names[i], FT_ST_F32, 2, shapes[i], zeros, &err) == 0);
    char path[400];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    ft_st_writer_free(w);
}

/* ft_lora_config.vocab_size: the rows of the adapter's embedding / head tensors (a grown
 * vocabulary), 0 without adapter_model.safetensors or without such tensors; tensors of
 * two sizes are refused naming the file and both. */
static void test_adapter_vocab(void)
{
    ft_lora_config c;
    ft_err err = {0};
    const char *dir = write_config("vocab", "{" GOOD "}");
    CHECK(ft_lora_config_load(&c, dir, &err) == 0 && c.vocab_size == 0);
    const char *pairs[] = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
                           "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"};
    const int64_t pair_shapes[][2] = {{2, 8}, {8, 2}};
    write_tensors(dir, 2, pairs, pair_shapes);
    CHECK(ft_lora_config_load(&c, dir, &err) == 0 && c.vocab_size == 0);
    const char *names[] = {"base_model.model.model.embed_tokens.lora_embedding_A",
                           "base_model.model.model.embed_tokens.base_layer.weight",
                           "base_model.model.lm_head.lora_B.weight",
                           "base_model.model.lm_head.weight"};
    const int64_t shapes[][2] = {{2, 70}, {70, 8}, {70, 2}, {70, 8}};
    for (int i = 0; i < 4; i++) {
        write_tensors(dir, 1, names + i, shapes + i);
        CHECK(ft_lora_config_load(&c, dir, &err) == 0 && c.vocab_size == 70);
    }
    const int64_t other[][2] = {{2, 70}, {71, 8}};
    write_tensors(dir, 2, names, other);
    CHECK(ft_lora_config_load(&c, dir, &err) == -1);
    if (!strstr(err.msg, "adapter_model.safetensors") || !strstr(err.msg, "71") ||
        !strstr(err.msg, "70") || !strstr(err.msg, "lora_embedding_A")) {
        fprintf(stderr, "  got '%s'\n", err.msg);
        CHECK(0);
    }
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft_lora_test_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_config_errors);
    RUN(test_model_checks_name_file);
    RUN(test_fused_module_names);
    RUN(test_resolve_moe);
    RUN(test_patterns);
    RUN(test_pattern_model_checks);
    RUN(test_target_parameters_parse);
    RUN(test_nested_decoder_regex);
    RUN(test_modules_to_save_checks);
    RUN(test_adapter_vocab);
    ft_remove_tree(root);
    return check_summary("lora");
}
