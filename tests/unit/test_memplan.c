/* The memory planner (lib/memory/memplan.h). The point: its cpu-fp32 row EQUALS what the
 * tracked allocator measures (peak per category after ft_model_load, one forward and
 * backward of batch_size x max_seq_len tokens and ft_optimizer_init) for LoRA and full
 * fine-tuning, with and without gradient checkpointing, over several batch sizes,
 * sequence lengths, LoRA targets and dropout, with and without biases and tied
 * embeddings. Then the
 * predicted GPU rows against the ZeRO paper's formulas, parameter counts of real
 * models (Llama-3.1-70B, Qwen2.5-14B) against their published sizes, and the errors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "config/config.h"
#include "memory/memplan.h"
#include "model/model.h"
#include "train/optim.h"
#include "train/pref.h"

static char root[256], llama_dir[300], qwen_dir[300], tied_dir[300], granite_dir[300],
    gemma_dir[300], phi3_dir[300], smollm3_dir[300], olmo2_dir[300], qwen3_dir[300],
    gemma2_dir[300], gemma3_dir[300], mixtral_dir[300], qwen3_moe_dir[300],
    qwen3_moe_dense_dir[300], qwen2_moe_dir[300], qwen2_moe_dense_dir[300];

/* The run config with sets applied (free() it). */
static ft_run_config *make_config(const char *const *sets)
{
    ft_config *c = ft_config_new();
    ft_err err;
    for (int i = 0; sets[i]; i++)
        if (ft_config_set(c, sets[i], NULL, &err)) {
            fprintf(stderr, "  --set %s: %s\n", sets[i], err.msg);
            CHECK(0);
        }
    ft_run_config *rc = malloc(sizeof *rc);
    *rc = *ft_config_values(c);
    ft_config_free(c);
    return rc;
}

/* What lib/run/trainer.c does with the config, then one forward/backward of B x T tokens. */
static int measure(const ft_run_config *cfg, const char *dir, ft_mem *out, size_t *n_train)
{
    ft_err err;
    const ft_tuning_section *tu = &cfg->tuning;
    ft_model_options mo = {.grad_ckpt = cfg->train.gradient_checkpointing,
                           .seed = 5,
                           .loss_chunk_rows = ft_memplan_loss_chunk(&cfg->train)};
    if (tu->mode == FT_TUNING_FULL) {
        mo.mode = FT_TRAIN_FULL;
    } else {
        mo.mode = FT_TRAIN_LORA;
        mo.lora = (ft_lora_config){.r = (int)tu->lora.r,
                                   .alpha = (float)tu->lora.alpha,
                                   .dropout = (float)tu->lora.dropout,
                                   .dora = tu->lora.use_dora,
                                   .weight_tying_set =
                                       tu->lora.ensure_weight_tying != FT_CFG_TYING_AUTO,
                                   .ensure_weight_tying =
                                       tu->lora.ensure_weight_tying == FT_CFG_TYING_TRUE};
        if (ft_lora_targets_parse(tu->lora.target_modules, &mo.lora.targets, &err) ||
            ft_lora_target_parameters_parse(tu->lora.target_parameters, &mo.lora, &err) ||
            ft_lora_modules_to_save_parse(tu->lora.modules_to_save, &mo.lora.modules_to_save,
                                          &err) ||
            ft_lora_patterns_parse(tu->lora.rank_pattern, true, "rank_pattern",
                                   &mo.lora.rank_pattern, &err) ||
            ft_lora_patterns_parse(tu->lora.alpha_pattern, false, "alpha_pattern",
                                   &mo.lora.alpha_pattern, &err))
            return -1;
    }
    if (tu->mode == FT_TUNING_QLORA) {
        mo.quant = ft_quant_options_of(tu);
        mo.quant_skip = tu->quant.skip_modules;
    }
    /* model.add_special_tokens, as lib/run/run_tokens.c sets the model up for it */
    char cpath[400];
    snprintf(cpath, sizeof cpath, "%s/config.json", dir);
    ft_model_config mc;
    int64_t grown;
    if (ft_model_config_load(&mc, cpath, &err) ||
        ft_run_model_vocab(dir, cfg->model.add_special_tokens, cfg->model.resize_to_multiple_of,
                           NULL, mc.vocab_size, &grown, &err))
        return -1;
    mo.grow_vocab = grown > mc.vocab_size ? grown : 0;
    if (strcmp(cfg->model.add_special_tokens, "[]") != 0 && mo.mode == FT_TRAIN_LORA)
        mo.lora.modules_to_save = ft_added_tokens_saved_modules(&mo.lora,
                                                                mc.tie_word_embeddings);
    ft_model *m;
    if (ft_model_load(&m, dir, &mo, &err)) {
        fprintf(stderr, "  load: %s\n", err.msg);
        return -1;
    }
    /* DPO: batch_size pairs, 2 batch_size rows (prompt tokens -100), and the reference as
     * the trainer sets it up: a frozen copy (full), the starting adapter (init_adapter) */
    bool pref = cfg->train.objective != FT_CFG_OBJECTIVE_SFT;
    int bsz = (int)cfg->train.batch_size * (pref ? 2 : 1);
    int len = (int)cfg->model.max_seq_len;
    int32_t *ids = malloc((size_t)bsz * (size_t)len * sizeof *ids);
    int32_t *labels = malloc((size_t)bsz * (size_t)len * sizeof *labels);
    for (int i = 0; i < bsz * len; i++) {
        ids[i] = (int32_t)((i * 7 + 3) % V);
        labels[i] = i % len < 2 ? -100 : ids[i];
    }
    ft_batch b = {.B = bsz, .T = len, .input_ids = ids, .labels = pref ? labels : NULL};
    double loss;
    long n;
    int rc = -1;
    ft_optimizer opt = {0};
    ft_model *ref = NULL;
    ft_pref_objective po = {0};
    ft_model_zero_grad(m);
    if (pref) {
        bool orpo = cfg->train.objective == FT_CFG_OBJECTIVE_ORPO; /* no reference */
        ft_pref_options o = {.beta = 0.1, .loss = orpo ? FT_PREF_ORPO : FT_PREF_SIGMOID};
        ft_model_options ro = {.mode = FT_TRAIN_NONE, .loss_chunk_rows = mo.loss_chunk_rows};
        if (!orpo && tu->mode == FT_TUNING_FULL && ft_model_load(&ref, dir, &ro, &err)) {
            fprintf(stderr, "  reference: %s\n", err.msg);
            goto done;
        }
        ft_pref_objective_init(&po, &o, ref);
        if (!orpo && tu->mode != FT_TUNING_FULL && tu->lora.init_adapter[0] &&
            ft_pref_objective_keep_adapter(&po, m, &err)) {
            fprintf(stderr, "  reference adapter: %s\n", err.msg);
            goto done;
        }
        ft_objective obj = ft_pref_objective_of(&po);
        if (obj.run(obj.ctx, m, &b, obj.count(obj.ctx, &b), &loss, &err)) {
            fprintf(stderr, "  dpo pass: %s\n", err.msg);
            goto done;
        }
    } else if (ft_model_forward(m, &b, &loss, &n, &err) ||
               ft_model_backward(m, 1.0f / (float)n, &err)) {
        fprintf(stderr, "  pass: %s\n", err.msg);
        goto done;
    }
    ft_model_trainable(m, n_train);
    ft_adamw_hparams hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    if (ft_optimizer_init(&opt, ft_model_mem(m), *n_train, hp, &err)) {
        fprintf(stderr, "  optimizer: %s\n", err.msg);
        goto done;
    }
    *out = *ft_model_mem(m);
    for (int c = 0; ref && c < FT_MEM_NCAT; c++) { /* held throughout: peaks add */
        out->peak[c] += ft_model_mem(ref)->peak[c];
        out->peak_total += ft_model_mem(ref)->peak[c];
    }
    rc = 0;
done:
    ft_pref_objective_free(&po);
    ft_model_free(ref);
    ft_optimizer_free(&opt);
    free(labels);
    free(ids);
    ft_model_free(m);
    return rc;
}

static int n_compared;

/* Planned cpu-fp32 == measured, every category and the total. */
static void compare(const char *dir, const char *const *sets)
{
    ft_run_config *cfg = make_config(sets);
    ft_memplan_result r;
    ft_err err;
    snprintf(cfg->model.name, sizeof cfg->model.name, "%s", dir);
    int rc = ft_memplan_config(cfg, 1, &r, &err);
    if (rc)
        fprintf(stderr, "  plan: %s\n", err.msg);
    CHECK(rc == 0);
    ft_mem mem = {0};
    size_t n_train = 0;
    int mrc = measure(cfg, dir, &mem, &n_train);
    CHECK(mrc == 0);
    if (rc == 0 && mrc == 0) {
        bool same = true;
        for (int c = 0; c < FT_MEM_NCAT; c++)
            same &= r.rows[FT_PLAN_CPU].bytes[c] == mem.peak[c];
        same &= r.rows[FT_PLAN_CPU].total == mem.peak_total;
        same &= r.n_trainable == n_train;
        if (!same) {
            fprintf(stderr, "  config:");
            for (int i = 0; sets[i]; i++)
                fprintf(stderr, " %s", sets[i]);
            fprintf(stderr, "\n");
            for (int c = 0; c < FT_MEM_NCAT; c++)
                fprintf(stderr, "    %-11s planned %zu measured %zu\n",
                        ft_mem_cat_name((ft_mem_cat)c), r.rows[FT_PLAN_CPU].bytes[c],
                        mem.peak[c]);
            fprintf(stderr, "    total       planned %zu measured %zu\n",
                    r.rows[FT_PLAN_CPU].total, mem.peak_total);
        }
        CHECK(same);
        CHECK(!r.rows[FT_PLAN_CPU].predicted);
        n_compared++;
    }
    free(cfg);
}

/* sweep with one more setting (NULL: none) */
static void sweep_with(const char *dir, const char *mode, const char *targets,
                       const char *dropout, const char *extra)
{
    static const char *batches[] = {"train.batch_size=1", "train.batch_size=2",
                                    "train.batch_size=3", "train.batch_size=5"};
    static const char *lens[] = {"model.max_seq_len=7", "model.max_seq_len=16"};
    static const char *ckpts[] = {"train.gradient_checkpointing=false",
                                  "train.gradient_checkpointing=true"};
    char m[64], t[128], d[64];
    snprintf(m, sizeof m, "tuning.mode=%s", mode);
    snprintf(t, sizeof t, "tuning.lora.target_modules=%s", targets);
    snprintf(d, sizeof d, "tuning.lora.dropout=%s", dropout);
    for (int ci = 0; ci < 2; ci++)
        for (int bi = 0; bi < 4; bi++)
            for (int li = 0; li < 2; li++) {
                const char *sets[] = {m, t, d, "tuning.lora.r=3", batches[bi], lens[li],
                                      ckpts[ci], extra, NULL};
                compare(dir, sets);
            }
}

static void sweep(const char *dir, const char *mode, const char *targets, const char *dropout)
{
    sweep_with(dir, mode, targets, dropout, NULL);
}

/* modules_to_save: the embedding and/or the head trainable beside the pairs (with a
 * quantized base too; a tied model's one embedding) */
static void test_cpu_modules_to_save_equal_measured(void)
{
    sweep_with(llama_dir, "lora", "q_proj,v_proj", "0.05", "tuning.lora.modules_to_save=lm_head");
    sweep_with(llama_dir, "lora", "all-linear", "0", "tuning.lora.modules_to_save=embed_tokens");
    sweep_with(olmo2_dir, "lora", "all-linear", "0.05",
               "tuning.lora.modules_to_save=embed_tokens,lm_head");
    sweep_with(olmo2_dir, "qlora", "all-linear", "0",
               "tuning.lora.modules_to_save=embed_tokens,lm_head");
    /* tied: the one embedding, shared by the head, trains (ensure_weight_tying) */
    sweep_with(tied_dir, "lora", "all-linear", "0.05", "tuning.lora.modules_to_save=lm_head");
    /* ... or without it the listed modules' copies, the model untied (a head of its own) */
    static const char *untie[][2] = {{"tuning.lora.modules_to_save=lm_head", "lora"},
                                     {"tuning.lora.modules_to_save=embed_tokens", "lora"},
                                     {"tuning.lora.modules_to_save=embed_tokens,lm_head",
                                      "qlora"}};
    for (int i = 0; i < 3; i++) {
        char mode[32];
        snprintf(mode, sizeof mode, "tuning.mode=%s", untie[i][1]);
        const char *sets[] = {mode, "tuning.lora.target_modules=q_proj,v_proj",
                              untie[i][0], "tuning.lora.ensure_weight_tying=false",
                              "train.batch_size=3", "model.max_seq_len=7", NULL};
        compare(tied_dir, sets);
    }
}

/* DoRA: a magnitude per output row of each pair's layer, W + s B A and two [N, out]
 * temporaries in the workspace (a fused module's row blocks: phi3) */
static void test_cpu_dora_equal_measured(void)
{
    sweep_with(llama_dir, "lora", "all-linear", "0.05", "tuning.lora.use_dora=true");
    sweep_with(llama_dir, "lora", "q_proj,v_proj", "0", "tuning.lora.use_dora=true");
    sweep_with(phi3_dir, "lora", "all-linear", "0.05", "tuning.lora.use_dora=true");
    sweep_with(qwen3_dir, "qlora", "all-linear", "0", "tuning.lora.use_dora=true");
    /* on the embedding (factors [C], rows [N, C]) and lm_head ([V]; the loss chunk's
     * [R, V] rows), the weight's copy [V, C] */
    sweep_with(llama_dir, "lora", "q_proj,embed_tokens,lm_head", "0.05",
               "tuning.lora.use_dora=true");
    sweep_with(llama_dir, "lora", "lm_head", "0", "tuning.lora.use_dora=true");
    sweep_with(llama_dir, "lora", "embed_tokens", "0", "tuning.lora.use_dora=true");
    /* the head's rows in chunks of the loss */
    static const char *chunks[] = {"train.loss_chunk_tokens=1", "train.loss_chunk_tokens=5"};
    for (int k = 0; k < 2; k++) {
        const char *sets[] = {"tuning.mode=lora", "tuning.lora.target_modules=o_proj,lm_head",
                              "tuning.lora.use_dora=true", "train.batch_size=3",
                              "model.max_seq_len=7", chunks[k], NULL};
        compare(llama_dir, sets);
    }
}

/* rank_pattern: each pair its own rank (per layer, per module; the embedding's and the
 * head's; a MoE's router and experts per layer), the shared activation set (gradient
 * checkpointing) sized by the largest rank of the layers it serves */
static void test_cpu_rank_patterns_equal_measured(void)
{
    int before = n_compared;
    sweep_with(llama_dir, "lora", "q_proj,v_proj,o_proj,down_proj,embed_tokens,lm_head", "0.05",
               "tuning.lora.rank_pattern={\"model.layers.0.self_attn.q_proj\": 5, "
               "\"layers.1.self_attn.v_proj\": 1, \"o_proj\": 2, \"lm_head\": 6, "
               "\"embed_tokens\": 1}");
    sweep_with(phi3_dir, "lora", "all-linear", "0",
               "tuning.lora.rank_pattern={\"layers.1.self_attn.qkv_proj\": 7, "
               "\"model\\\\.layers\\\\.0\\\\.mlp\\\\..*\": 1}");
    sweep_with(mixtral_dir, "lora", "q_proj,gate,w1,w3,w2", "0",
               "tuning.lora.rank_pattern={\"layers.1.mlp.experts.gate_up_proj\": 3, "
               "\"layers.0.mlp.experts.down_proj\": 5, \"layers.1.mlp.gate.weight\": 6}");
    sweep_with(qwen2_moe_dense_dir, "lora", "all-linear", "0",
               "tuning.lora.rank_pattern={\"layers.1.mlp.down_proj\": 5, "
               "\"shared_expert.up_proj\": 1}");
    /* with DoRA */
    const char *sets[] = {"tuning.mode=lora", "tuning.lora.target_modules=q_proj,o_proj,lm_head",
                          "tuning.lora.use_dora=true",
                          "tuning.lora.rank_pattern={\"layers.1.self_attn.q_proj\": 6, "
                          "\"lm_head\": 2}",
                          "train.batch_size=3", "model.max_seq_len=7", NULL};
    compare(llama_dir, sets);
    CHECK(n_compared > before);
}

/* A tokenizer.json of V single-character tokens in dir. */
static void write_tokenizer(const char *dir)
{
    char path[400];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("{\"added_tokens\": [], \"model\": {\"type\": \"BPE\", \"merges\": [], "
          "\"vocab\": {", f);
    for (int i = 0; i < V; i++)
        fprintf(f, "%s\"%c\": %d", i ? ", " : "", '0' + i, i);
    fputs("}}}\n", f);
    fclose(f);
}

/* Tokens added (model.add_special_tokens): the embedding and the head grown to the
 * tokenizer's size (V + 3) and, in LoRA modes, trained in full unless chosen otherwise
 * (or LoRA on them, with their grown base) */
static void test_cpu_added_tokens_equal_measured(void)
{
    static const char *add = "model.add_special_tokens=[\"<a>\", \"<b>\", \"<c>\"]";
    write_tokenizer(llama_dir);
    write_tokenizer(tied_dir);
    int before = n_compared;
    sweep_with(llama_dir, "lora", "q_proj,v_proj", "0.05", add);
    sweep_with(tied_dir, "lora", "all-linear", "0", add);
    sweep_with(llama_dir, "lora", "q_proj,embed_tokens,lm_head", "0", add);
    sweep_with(llama_dir, "full", "all-linear", "0", add);
    const char *padded[] = {"tuning.lora.target_modules=q_proj", "train.batch_size=3",
                            "model.max_seq_len=7", add, "model.resize_to_multiple_of=8", NULL};
    compare(llama_dir, padded);
    padded[0] = "tuning.mode=full";
    compare(llama_dir, padded);
    CHECK(n_compared == before + 66);
    /* the plan has the grown vocabulary and the trained embedding and head */
    const char *sets[] = {"tuning.lora.target_modules=q_proj", "tuning.lora.r=2", add, NULL};
    ft_run_config *cfg = make_config(sets), *plain;
    sets[2] = NULL;
    plain = make_config(sets);
    snprintf(cfg->model.name, sizeof cfg->model.name, "%s", llama_dir);
    snprintf(plain->model.name, sizeof plain->model.name, "%s", llama_dir);
    ft_memplan_result r, p;
    ft_err err;
    CHECK(ft_memplan_config(cfg, 1, &r, &err) == 0);
    CHECK(ft_memplan_config(plain, 1, &p, &err) == 0);
    CHECK(r.n_trainable == p.n_trainable + 2 * (size_t)(V + 3) * C);
    snprintf(cfg->model.add_special_tokens, sizeof cfg->model.add_special_tokens, "[]");
    CHECK(ft_memplan_config(cfg, 1, &r, &err) == 0 && r.n_trainable == p.n_trainable);
    snprintf(cfg->model.add_special_tokens, sizeof cfg->model.add_special_tokens, "[\"<a>\"]");
    cfg->model.resize_to_multiple_of = 16; /* V + 1 -> 48 */
    CHECK(ft_memplan_config(cfg, 1, &r, &err) == 0);
    CHECK(r.n_trainable == p.n_trainable + 2 * (size_t)48 * C);
    free(cfg);
    free(plain);
    char path[400];
    snprintf(path, sizeof path, "%s/tokenizer.json", llama_dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer.json", tied_dir);
    unlink(path);
}

/* LoRA on the embedding and lm_head: their pairs, the [N, r] scratch */
static void test_cpu_outer_lora_equal_measured(void)
{
    sweep(llama_dir, "lora", "q_proj,embed_tokens,lm_head", "0.05");
    sweep(llama_dir, "lora", "lm_head", "0");
    sweep(olmo2_dir, "qlora", "all-linear,embed_tokens", "0.1");
}

static void test_cpu_lora_equals_measured(void)
{
    sweep(llama_dir, "lora", "all-linear", "0.05");
    sweep(llama_dir, "lora", "all-linear", "0");
    sweep(llama_dir, "lora", "q_proj,v_proj", "0.1");
    sweep(llama_dir, "lora", "down_proj", "0");
}

/* QLoRA: the quantized weights (packed codes, absmax or its codes and nested state) in
 * the weights category, one layer's dequantization window in the workspace. */
static void test_cpu_qlora_equals_measured(void)
{
    const char *quants[][4] = {
        {"tuning.quant.type=nf4", "tuning.quant.blocksize=64", "tuning.quant.double_quant=true",
         "tuning.quant.skip_modules=lm_head"},
        {"tuning.quant.type=fp4", "tuning.quant.blocksize=32", "tuning.quant.double_quant=false",
         "tuning.quant.skip_modules=lm_head"},
        {"tuning.quant.type=int8", "tuning.quant.blocksize=64", "tuning.quant.double_quant=true",
         "tuning.quant.skip_modules=down_proj,layers.1.self_attn"},
    };
    static const char *batches[] = {"train.batch_size=1", "train.batch_size=3"};
    static const char *ckpts[] = {"train.gradient_checkpointing=false",
                                  "train.gradient_checkpointing=true"};
    for (int q = 0; q < 3; q++)
        for (int bi = 0; bi < 2; bi++)
            for (int ci = 0; ci < 2; ci++) {
                const char *sets[] = {"tuning.mode=qlora", "tuning.lora.r=3",
                                      "tuning.lora.target_modules=all-linear",
                                      "tuning.lora.dropout=0.05", batches[bi],
                                      "model.max_seq_len=9", ckpts[ci], quants[q][0],
                                      quants[q][1], quants[q][2], quants[q][3], NULL};
                compare(llama_dir, sets);
                compare(qwen_dir, sets);
                compare(phi3_dir, sets); /* fused weights quantized whole */
            }
}

/* The by-mode table: all three modes, the quantized base at about half a byte per weight,
 * and the config's own mode left as it was. */
static void test_compare_modes(void)
{
    char name[400];
    snprintf(name, sizeof name, "model.name=%s", llama_dir);
    const char *sets[] = {name, "tuning.mode=lora", NULL};
    ft_run_config *cfg = make_config(sets);
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    ft_err err;
    CHECK(ft_memplan_compare_modes(cfg, 2, f, &err) == 0);
    fclose(f);
    CHECK(strstr(buf, "\nfull ") && strstr(buf, "\nlora ") && strstr(buf, "\nqlora "));
    const char *q = strstr(buf, "nf4+dq, ");
    CHECK(q != NULL);
    if (q)
        CHECK(atof(q + strlen("nf4+dq, ")) > 0.5); /* tiny tensors: the 1 KiB map weighs in */
    CHECK(cfg->tuning.mode == FT_TUNING_LORA);
    free(buf);
    free(cfg);
}

static void test_cpu_full_equals_measured(void) { sweep(llama_dir, "full", "all-linear", "0"); }

/* The head in chunks: the logits buffer holds one chunk of rows (a ragged last one, one
 * row, or all of them with 0 and with more rows than tokens). */
static void test_cpu_chunked_logits_equal_measured(void)
{
    static const char *chunks[] = {"train.loss_chunk_tokens=0", "train.loss_chunk_tokens=1",
                                   "train.loss_chunk_tokens=5", "train.loss_chunk_tokens=1000"};
    static const char *modes[] = {"tuning.mode=full", "tuning.mode=lora"};
    for (int k = 0; k < 4; k++)
        for (int mi = 0; mi < 2; mi++) {
            const char *sets[] = {modes[mi], "train.batch_size=3", "model.max_seq_len=7",
                                  chunks[k], NULL};
            compare(llama_dir, sets);
        }
}

/* train.objective dpo: 2 batch_size rows, and the reference (a frozen copy in full mode,
 * the starting adapter with init_adapter; nothing with a fresh adapter), with and without
 * gradient checkpointing and chunked logits; orpo likewise, without a reference. */
static void test_cpu_dpo_equals_measured(void)
{
    static const char *modes[] = {"tuning.mode=full", "tuning.mode=lora", "tuning.mode=qlora"};
    static const char *adapters[] = {"tuning.lora.init_adapter=", "tuning.lora.init_adapter=x"};
    static const char *ckpts[] = {"train.gradient_checkpointing=false",
                                  "train.gradient_checkpointing=true"};
    static const char *chunks[] = {"train.loss_chunk_tokens=0", "train.loss_chunk_tokens=5"};
    static const char *objectives[] = {"train.objective=dpo", "train.objective=orpo"};
    for (int oi = 0; oi < 2; oi++)
    for (int mi = 0; mi < 3; mi++)
        for (int ai = 0; ai < (mi ? 2 : 1); ai++)
            for (int ci = 0; ci < 2; ci++)
                for (int k = 0; k < 2; k++) {
                    const char *sets[] = {objectives[oi], modes[mi], adapters[ai],
                                          ckpts[ci], chunks[k], "train.batch_size=3",
                                          "model.max_seq_len=7", "tuning.quant.blocksize=32",
                                          NULL};
                    compare(llama_dir, sets);
                }
}

/* tie_word_embeddings: lm_head is the embedding (the file's lm_head.weight is ignored) */
static void make_tied(void)
{
    write_model(tied_dir, 0, NULL, NULL, NULL);
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", tied_dir);
    FILE *f = fopen(path, "r+");
    char buf[2048] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    char *t = strstr(buf, "\"tie_word_embeddings\": false");
    CHECK(t != NULL);
    if (t) {
        memcpy(t, "\"tie_word_embeddings\": true ", 28);
        rewind(f);
        fwrite(buf, 1, n, f);
    }
    fclose(f);
    ft_model_config mc;
    ft_err err;
    CHECK(ft_model_config_load(&mc, path, &err) == 0 && mc.tie_word_embeddings);
}

static void test_cpu_bias_and_tied_equal_measured(void)
{
    sweep(tied_dir, "lora", "all-linear", "0.05");
    sweep(tied_dir, "full", "all-linear", "0");
    /* LoRA on the tied embedding and head: each module's own pair (no head weight) */
    sweep(tied_dir, "lora", "q_proj,embed_tokens,lm_head", "0.05");
    sweep(tied_dir, "lora", "lm_head", "0");
    sweep_with(tied_dir, "lora", "v_proj,embed_tokens,lm_head", "0.1",
               "tuning.lora.use_dora=true");
    /* ensure_weight_tying: the head's pair the embedding's, whichever is named */
    sweep_with(tied_dir, "lora", "v_proj,lm_head", "0", "tuning.lora.ensure_weight_tying=true");
    /* ... and DoRA with it: the one pair, each module its magnitude and DoRA scratch (the
     * head named alone) */
    for (int ci = 0; ci < 2; ci++)
        for (int bi = 0; bi < 3; bi++) {
            const char *ckpt[] = {"train.gradient_checkpointing=false",
                                  "train.gradient_checkpointing=true"};
            const char *batch[] = {"train.batch_size=1", "train.batch_size=2",
                                   "train.batch_size=5"};
            const char *sets[] = {"tuning.mode=lora", "tuning.lora.target_modules=v_proj,lm_head",
                                  "tuning.lora.dropout=0.1", "tuning.lora.r=3", batch[bi],
                                  "model.max_seq_len=7", ckpt[ci],
                                  "tuning.lora.ensure_weight_tying=true",
                                  "tuning.lora.use_dora=true", NULL};
            compare(tied_dir, sets);
        }
    sweep(qwen_dir, "lora", "k_proj,o_proj,up_proj", "0.05");
    sweep(qwen_dir, "full", "all-linear", "0.05");
}

/* The families with their own block rules (scaled branches, GeGLU, (1 + w) norms) use
 * the same buffers: the plan stays exact. */
static void test_cpu_granite_gemma_equal_measured(void)
{
    sweep(granite_dir, "lora", "all-linear", "0.05");
    sweep(granite_dir, "full", "all-linear", "0");
    sweep(gemma_dir, "lora", "all-linear", "0.05");
    sweep(gemma_dir, "full", "all-linear", "0");
}

/* Phi-3: fused qkv_proj / gate_up_proj weights and LoRA pairs (one A per fused module),
 * partial rotary with longrope, tied: the plan stays exact. */
static void test_cpu_phi3_equal_measured(void)
{
    sweep(phi3_dir, "lora", "all-linear", "0.05");
    sweep(phi3_dir, "lora", "qkv_proj,down_proj", "0");
    sweep(phi3_dir, "full", "all-linear", "0");
}

/* SmolLM3: a layer without RoPE computes the same buffers. */
static void test_cpu_smollm3_equal_measured(void)
{
    sweep(smollm3_dir, "lora", "all-linear", "0.05");
    sweep(smollm3_dir, "full", "all-linear", "0");
}

/* Blocks with other norms: olmo2 (post-norms instead of pre-norms: other activations and
 * a scratch for the post-norms' backward; q/k norms over the whole projection) and qwen3
 * (q/k norms per head: their inputs and per-head rstd). */
static void test_cpu_olmo2_qwen3_equal_measured(void)
{
    sweep(olmo2_dir, "lora", "all-linear", "0.05");
    sweep(olmo2_dir, "full", "all-linear", "0");
    sweep(olmo2_dir, "qlora", "all-linear", "0");
    sweep(qwen3_dir, "lora", "all-linear", "0.05");
    sweep(qwen3_dir, "full", "all-linear", "0");
    sweep(qwen3_dir, "qlora", "q_proj,v_proj", "0.1");
}

/* gemma2: pre- and post-norms on both branches (every norm activation at once), soft-capped
 * logits (no buffer of their own: the head's chunks and the in-place cross-entropy), and
 * windows on alternate layers. */
static void test_cpu_gemma2_equal_measured(void)
{
    sweep(gemma2_dir, "lora", "all-linear", "0.05");
    sweep(gemma2_dir, "full", "all-linear", "0");
    sweep(gemma2_dir, "qlora", "all-linear", "0");
}

/* gemma3: gemma2's four norms with per-head q/k norms (their saved inputs and rstd), two
 * RoPE frequency sets (sliding and global layers), a final cap and no attention cap. */
static void test_cpu_gemma3_equal_measured(void)
{
    sweep(gemma3_dir, "lora", "all-linear", "0.05");
    sweep(gemma3_dir, "full", "all-linear", "0");
    sweep(gemma3_dir, "qlora", "all-linear", "0");
}

/* The GPU rows follow the table in memplan.h. */
/* A mixture-of-experts block (mixtral): the router and every expert's weights, the
 * grouped activations of the k experts per token, the router's and the grouping's
 * buffers, the load-balancing statistics; QLoRA's quantized experts and their window.
 * LoRA on the attention modules, on the router and on the experts. */
static void test_cpu_mixtral_equal_measured(void)
{
    sweep(mixtral_dir, "lora", "q_proj,k_proj,v_proj,o_proj", "0.05");
    sweep(mixtral_dir, "full", "q_proj", "0");
    sweep(mixtral_dir, "qlora", "q_proj,v_proj", "0.1"); /* the experts quantized too */
    /* LoRA on the router and the experts (PEFT's target_parameters; no dropout there) */
    sweep(mixtral_dir, "lora", "all-linear", "0");
    sweep(mixtral_dir, "lora", "q_proj,gate,w2", "0");
    sweep(mixtral_dir, "lora", "w1,w3", "0");
    sweep(mixtral_dir, "qlora", "all-linear", "0");
}

/* qwen3_moe: the same block (top-k not renormalised) beside per-head q/k norms. */
static void test_cpu_qwen3_moe_equal_measured(void)
{
    sweep(qwen3_moe_dir, "lora", "q_proj,k_proj,v_proj,o_proj", "0.05");
    sweep(qwen3_moe_dir, "full", "q_proj", "0");
    sweep(qwen3_moe_dir, "qlora", "q_proj,v_proj", "0.1");
    /* LoRA on the router and the experts (gate, w1 / w3 / w2 as for mixtral: PEFT's
     * target_parameters gate.weight, gate_up_proj, down_proj; no dropout there) */
    sweep(qwen3_moe_dir, "lora", "all-linear", "0");
    sweep(qwen3_moe_dir, "lora", "q_proj,gate,w2", "0");
    sweep(qwen3_moe_dir, "lora", "w1,w3", "0");
    sweep(qwen3_moe_dir, "qlora", "all-linear", "0");
}

/* A dense layer among the sparse ones (mlp_only_layers): its plain MLP, wider than the
 * experts, sizes the MLP's scratch; its activation set has no MoE buffers (one set
 * serving both kinds under gradient checkpointing: sweep's grad_ckpt rows). */
static void test_cpu_qwen3_moe_dense_equal_measured(void)
{
    sweep(qwen3_moe_dense_dir, "lora", "q_proj,k_proj,v_proj,o_proj", "0.05");
    sweep(qwen3_moe_dense_dir, "full", "q_proj", "0");
    sweep(qwen3_moe_dense_dir, "qlora", "all-linear", "0");
}

/* qwen2_moe: the shared expert (a plain MLP beside the experts, quantized by QLoRA) and
 * its gate, their activations (output, gate logit and sigmoid) and the identity slot
 * array of the gated sum; all sparse, and with a dense layer. */
static void test_cpu_qwen2_moe_equal_measured(void)
{
    sweep(qwen2_moe_dir, "lora", "q_proj,k_proj,v_proj,o_proj", "0.05");
    sweep(qwen2_moe_dir, "full", "q_proj", "0");
    sweep(qwen2_moe_dir, "qlora", "q_proj,v_proj", "0.1");
    sweep(qwen2_moe_dir, "lora", "all-linear", "0");
    sweep(qwen2_moe_dense_dir, "full", "q_proj", "0");
    sweep(qwen2_moe_dense_dir, "lora", "all-linear", "0");
    sweep(qwen2_moe_dense_dir, "qlora", "q_proj,v_proj", "0.1");
    /* the router and the experts by tuning.lora.target_parameters (PEFT's explicit list:
     * the gate_up pair of rank r, not 2 r) */
    sweep_with(qwen2_moe_dir, "lora", "q_proj,shared_expert_gate", "0",
               "tuning.lora.target_parameters=gate.weight,gate_up_proj,down_proj");
    sweep_with(qwen2_moe_dense_dir, "lora", "all-linear", "0",
               "tuning.lora.target_parameters=mlp.experts.gate_up_proj");
    sweep_with(qwen2_moe_dense_dir, "qlora", "v_proj", "0",
               "tuning.lora.target_parameters=mlp.gate.weight,mlp.experts.down_proj");
}

static void test_gpu_formulas(void)
{
    const char *sets[] = {"tuning.mode=full", "train.batch_size=2", "model.max_seq_len=8",
                          "train.bf16=true", "dist.strategy=zero", "dist.zero_stage=2", NULL};
    ft_run_config *cfg = make_config(sets);
    ft_model_config mc;
    ft_err err;
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", llama_dir);
    CHECK(ft_model_config_load(&mc, path, &err) == 0);
    ft_memplan_result one, four;
    CHECK(ft_memplan(cfg, &mc, 1, &one, &err) == 0);
    CHECK(ft_memplan(cfg, &mc, 4, &four, &err) == 0);
    size_t P = one.n_trainable;
    CHECK(one.n_frozen == 0 && P > 0);
    const ft_memplan_row *g1 = &one.rows[FT_PLAN_GPU_1];
    /* mixed precision, one GPU: 2 + 2 + 12 bytes per parameter */
    CHECK(g1->bytes[FT_MEM_WEIGHTS] == 2 * P);
    CHECK(g1->bytes[FT_MEM_GRADS] == 2 * P);
    CHECK(g1->bytes[FT_MEM_OPTIM] == 12 * P);
    CHECK(g1->predicted && g1->world_size == 1);
    /* at N = 1 every strategy holds the same states */
    for (int i = FT_PLAN_GPU_DDP; i <= FT_PLAN_GPU_ZERO3; i++) {
        CHECK(one.rows[i].bytes[FT_MEM_WEIGHTS] + one.rows[i].bytes[FT_MEM_GRADS] +
                  one.rows[i].bytes[FT_MEM_OPTIM] ==
              16 * P);
        CHECK(one.rows[i].bytes[FT_MEM_ACTIVATIONS] == g1->bytes[FT_MEM_ACTIVATIONS]);
    }
    CHECK(one.rows[FT_PLAN_GPU_FSDP].bytes[FT_MEM_WEIGHTS] == 4 * P);
    /* N = 4: each tensor's shard is ceil(n / 4) */
    const ft_memplan_row *d = &four.rows[FT_PLAN_GPU_DDP], *z1 = &four.rows[FT_PLAN_GPU_ZERO1],
                         *z2 = &four.rows[FT_PLAN_GPU_ZERO2], *z3 = &four.rows[FT_PLAN_GPU_ZERO3],
                         *fs = &four.rows[FT_PLAN_GPU_FSDP];
    CHECK(d->bytes[FT_MEM_OPTIM] == 12 * P && d->world_size == 4);
    CHECK(z1->bytes[FT_MEM_WEIGHTS] == 2 * P && z1->bytes[FT_MEM_GRADS] == 2 * P);
    CHECK(z1->bytes[FT_MEM_OPTIM] >= 12 * P / 4 && z1->bytes[FT_MEM_OPTIM] < 12 * P / 4 + 12 * 64);
    CHECK(z2->bytes[FT_MEM_WEIGHTS] == 2 * P);
    CHECK(z2->bytes[FT_MEM_GRADS] == z1->bytes[FT_MEM_OPTIM] / 6);
    CHECK(z3->bytes[FT_MEM_WEIGHTS] == z2->bytes[FT_MEM_GRADS]);
    CHECK(z3->bytes[FT_MEM_OPTIM] == z1->bytes[FT_MEM_OPTIM]);
    CHECK(fs->bytes[FT_MEM_WEIGHTS] >= 4 * P / 4 && fs->bytes[FT_MEM_WEIGHTS] < 4 * P / 4 + 4 * 4);
    CHECK(fs->bytes[FT_MEM_OPTIM] == 2 * fs->bytes[FT_MEM_GRADS]);
    CHECK(z2->bytes[FT_MEM_WORKSPACE] > d->bytes[FT_MEM_WORKSPACE]);
    CHECK(z3->bytes[FT_MEM_WORKSPACE] > z2->bytes[FT_MEM_WORKSPACE]);
    /* the persistent states shrink stage by stage (on a model this tiny the transient
     * gathered units of ZeRO-3 can outweigh the saving, so totals are not compared) */
#define STATES(row) ((row)->bytes[FT_MEM_WEIGHTS] + (row)->bytes[FT_MEM_GRADS] + \
                     (row)->bytes[FT_MEM_OPTIM])
    CHECK(STATES(z3) < STATES(z2) && STATES(z2) < STATES(z1) && STATES(z1) < STATES(d));
    CHECK(STATES(fs) == STATES(z3));
#undef STATES
    /* bf16 activations are about half the fp32 ones */
    CHECK(g1->bytes[FT_MEM_ACTIVATIONS] < one.rows[FT_PLAN_CPU].bytes[FT_MEM_ACTIVATIONS]);
    CHECK(four.selected == FT_PLAN_GPU_ZERO2);
    free(cfg);

    /* fp32 on the GPU: no master copy, 4 + 4 + 8 */
    const char *sets32[] = {"tuning.mode=full", "train.bf16=false", "train.fp16=false", NULL};
    cfg = make_config(sets32);
    CHECK(ft_memplan(cfg, &mc, 1, &one, &err) == 0);
    CHECK(one.rows[FT_PLAN_GPU_1].bytes[FT_MEM_OPTIM] == 8 * one.n_trainable);
    CHECK(one.rows[FT_PLAN_GPU_1].bytes[FT_MEM_WEIGHTS] == 4 * one.n_trainable);
    CHECK(one.selected == FT_PLAN_GPU_1);
    free(cfg);
}

/* A config.json of a real model, without its weights. */
static void write_config(const char *dir, const char *json)
{
    ft_err err;
    CHECK(ft_mkdir_p(dir, &err) == 0);
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
}

static void test_real_model_sizes(void)
{
    char d70[300], d14[300];
    snprintf(d70, sizeof d70, "%s/llama70b", root);
    snprintf(d14, sizeof d14, "%s/qwen14b", root);
    write_config(d70, "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 8192,"
                      " \"intermediate_size\": 28672, \"num_hidden_layers\": 80,"
                      " \"num_attention_heads\": 64, \"num_key_value_heads\": 8,"
                      " \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0,"
                      " \"hidden_act\": \"silu\", \"max_position_embeddings\": 131072,"
                      " \"tie_word_embeddings\": false}");
    write_config(d14, "{\"model_type\": \"qwen2\", \"vocab_size\": 152064, \"hidden_size\": 5120,"
                      " \"intermediate_size\": 13824, \"num_hidden_layers\": 48,"
                      " \"num_attention_heads\": 40, \"num_key_value_heads\": 8,"
                      " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
                      " \"hidden_act\": \"silu\", \"max_position_embeddings\": 32768,"
                      " \"tie_word_embeddings\": false}");
    ft_err err;
    ft_memplan_result r;
    char name[400];
    /* full: every parameter trainable; the published sizes */
    snprintf(name, sizeof name, "model.name=%s", d70);
    const char *full70[] = {"tuning.mode=full", name, NULL};
    ft_run_config *cfg = make_config(full70);
    CHECK(ft_memplan_config(cfg, 1, &r, &err) == 0);
    CHECK(r.n_trainable == 70553706496ull && r.n_frozen == 0);
    free(cfg);
    snprintf(name, sizeof name, "model.name=%s", d14);
    const char *full14[] = {"tuning.mode=full", name, NULL};
    cfg = make_config(full14);
    CHECK(ft_memplan_config(cfg, 1, &r, &err) == 0);
    CHECK(r.n_trainable == 14770033664ull);
    free(cfg);

    /* QLoRA r=32 all-linear on 70B, 4 ranks, ZeRO-3: LoRA = r * (in + out) per
     * projection; the NF4 base ~0.516 bytes per linear weight */
    snprintf(name, sizeof name, "model.name=%s", d70);
    const char *q70[] = {"tuning.mode=qlora", "tuning.lora.r=32", "tuning.lora.alpha=64",
                         "train.batch_size=16", "model.max_seq_len=4096",
                         "train.gradient_checkpointing=true", "dist.strategy=zero",
                         "dist.zero_stage=3", name, NULL};
    cfg = make_config(q70);
    CHECK(ft_memplan_config(cfg, 4, &r, &err) == 0);
    size_t per_layer = 32ull * ((8192 + 8192) + 2 * (8192 + 1024) + (8192 + 8192) +
                                2 * (8192 + 28672) + (28672 + 8192));
    CHECK(r.n_trainable == 80 * per_layer);
    CHECK(r.n_trainable + r.n_frozen == 70553706496ull + r.n_trainable);
    size_t linear = 70553706496ull - 2ull * 128256 * 8192 - 8192ull * (2 * 80 + 1);
    CHECK(r.n_quantized == linear);
    const ft_memplan_row *g1 = &r.rows[FT_PLAN_GPU_1];
    double nf4 = (double)(g1->bytes[FT_MEM_WEIGHTS] - 2 * r.n_trainable -
                          2 * (r.n_frozen - r.n_quantized)) /
                 (double)linear;
    CHECK(nf4 > 0.515 && nf4 < 0.517);
    CHECK(r.selected == FT_PLAN_GPU_ZERO3);
    CHECK(strcmp(r.quant, "nf4+dq") == 0);
    CHECK(r.rows[FT_PLAN_GPU_ZERO3].bytes[FT_MEM_WEIGHTS] < g1->bytes[FT_MEM_WEIGHTS] / 4 + 4096);
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    ft_memplan_print(&r, f);
    fclose(f);
    CHECK(strstr(buf, "cpu-fp32") && strstr(buf, "gpu-zero3*") && strstr(buf, "predicted"));
    CHECK(strstr(buf, "in nf4+dq)"));
    if (getenv("MEMPLAN_SHOW"))
        fputs(buf, stderr);
    free(buf);
    free(cfg);
}

/* The gpu-fsdp row of QLoRA on a 70B model (config.json only) at 2 ranks, with
 * dist.offload_params as given: its planned bytes, host bytes and the 24 GB verdict. */
static void plan_70b(const char *dir, const char *offload, ft_memplan_result *r, char **text)
{
    char name[400], off[64];
    snprintf(name, sizeof name, "model.name=%s", dir);
    snprintf(off, sizeof off, "dist.offload_params=%s", offload);
    const char *sets[] = {"tuning.mode=qlora", "tuning.quant.type=nf4",
                          "tuning.quant.double_quant=true", "tuning.lora.r=64",
                          "tuning.lora.alpha=16", "tuning.lora.target_modules=all-linear",
                          "train.batch_size=1", "model.max_seq_len=2048",
                          "train.gradient_checkpointing=true", "train.bf16=true",
                          "dist.strategy=fsdp", off, name, NULL};
    ft_run_config *cfg = make_config(sets);
    ft_err err;
    CHECK(ft_memplan_config(cfg, 2, r, &err) == 0);
    size_t len;
    FILE *f = open_memstream(text, &len);
    ft_memplan_print(r, f);
    fclose(f);
    if (getenv("MEMPLAN_SHOW"))
        fputs(*text, stderr);
    free(cfg);
}

/* Issue 27: Llama-2-70B and Llama-3.1-70B QLoRA (NF4 + double quantization, r = 64
 * all-linear, 1 x 2048, checkpointing) under FSDP on two 24 GB GPUs. With the whole
 * quantized base sharded (half of it per rank) it is still over 24 GB; with its shard in
 * host memory (dist.offload_params cpu) the plan and the reserve for the CUDA context,
 * cuBLAS and NCCL fit, with room to spare. */
static void test_70b_qlora_fits_two_24gb_gpus(void)
{
    char d2[300], d3[300];
    snprintf(d2, sizeof d2, "%s/llama2-70b", root);
    snprintf(d3, sizeof d3, "%s/llama31-70b", root);
    write_config(d2, "{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 8192,"
                     " \"intermediate_size\": 28672, \"num_hidden_layers\": 80,"
                     " \"num_attention_heads\": 64, \"num_key_value_heads\": 8,"
                     " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
                     " \"hidden_act\": \"silu\", \"max_position_embeddings\": 4096,"
                     " \"tie_word_embeddings\": false}");
    write_config(d3, "{\"model_type\": \"llama\", \"vocab_size\": 128256, \"hidden_size\": 8192,"
                     " \"intermediate_size\": 28672, \"num_hidden_layers\": 80,"
                     " \"num_attention_heads\": 64, \"num_key_value_heads\": 8,"
                     " \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0,"
                     " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                     " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                     " \"original_max_position_embeddings\": 8192},"
                     " \"hidden_act\": \"silu\", \"max_position_embeddings\": 131072,"
                     " \"tie_word_embeddings\": false}");
    const char *dirs[] = {d2, d3};
    for (int i = 0; i < 2; i++) {
        ft_memplan_result *on = malloc(sizeof *on), *off = malloc(sizeof *off);
        char *t_on, *t_off;
        plan_70b(dirs[i], "none", off, &t_off);
        plan_70b(dirs[i], "cpu", on, &t_on);
        const ft_memplan_row *g0 = &off->rows[FT_PLAN_GPU_FSDP], *g1 = &on->rows[FT_PLAN_GPU_FSDP];
        CHECK(on->selected == FT_PLAN_GPU_FSDP && strcmp(on->quant, "nf4+dq") == 0);
        /* the base's shard (half the quantized base and of the dense frozen weights) moves
         * to the host; nothing else changes */
        CHECK(g0->host == 0 && g1->host > on->quant_bytes / 2);
        CHECK(g1->host < on->quant_bytes / 2 + 4 * (on->n_frozen - on->n_quantized));
        CHECK(g0->total == g1->total + g1->host);
        size_t need_off = g0->total + ft_memplan_gpu_reserve(g0->total, 2);
        size_t need_on = g1->total + ft_memplan_gpu_reserve(g1->total, 2);
        CHECK(need_off > FT_PLAN_GPU_24GB);
        CHECK(need_on + ((size_t)4 << 30) < FT_PLAN_GPU_24GB); /* >= 4 GiB to spare */
        CHECK(strstr(t_off, "does not fit") && strstr(t_on, "fits, margin"));
        CHECK(strstr(t_on, "dist.offload_params cpu:") && strstr(t_on, "CUDA context 768"));
        /* the CPU engine: every rank keeps half the quantized blocks (exact rows) */
        const ft_memplan_row *c = &on->rows[FT_PLAN_CPU_FSDP];
        CHECK(c->host > on->quant_bytes / 2 - ((size_t)64 << 20));
        CHECK(c->bytes[FT_MEM_WEIGHTS] < on->quant_bytes / 8);
        free(t_on);
        free(t_off);
        free(on);
        free(off);
    }
}

static void test_batch_auto(void)
{
    const char *a[] = {"train.batch_size=auto", NULL}, *one[] = {"train.batch_size=1", NULL};
    ft_run_config *ca = make_config(a), *c1 = make_config(one);
    ft_model_config mc;
    ft_err err;
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", llama_dir);
    CHECK(ft_model_config_load(&mc, path, &err) == 0);
    ft_memplan_result ra, r1;
    CHECK(ft_memplan(ca, &mc, 2, &ra, &err) == 0);
    CHECK(ft_memplan(c1, &mc, 2, &r1, &err) == 0);
    CHECK(ra.batch_auto && !r1.batch_auto && ra.batch_size == 1);
    CHECK(ra.rows[FT_PLAN_CPU].total == r1.rows[FT_PLAN_CPU].total);
    CHECK(ra.selected == FT_PLAN_GPU_DDP); /* strategy auto at 2 ranks */
    free(ca);
    free(c1);
}

static void test_errors(void)
{
    ft_model_config mc;
    ft_err err;
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", llama_dir);
    CHECK(ft_model_config_load(&mc, path, &err) == 0);
    ft_memplan_result r;
    const char *bad[] = {"tuning.lora.target_modules=q_proj,qq_proj", NULL};
    ft_run_config *c = make_config(bad);
    CHECK(ft_memplan(c, &mc, 1, &r, &err) != 0);
    CHECK(strstr(err.msg, "tuning.lora.target_modules") != NULL);
    free(c);
    const char *bad_saved[] = {"tuning.lora.modules_to_save=lm_head,norm", NULL};
    c = make_config(bad_saved);
    CHECK(ft_memplan(c, &mc, 1, &r, &err) != 0);
    CHECK(strstr(err.msg, "tuning.lora.modules_to_save") && strstr(err.msg, "'norm'"));
    free(c);
    const char *ok[] = {NULL};
    c = make_config(ok);
    CHECK(ft_memplan(c, &mc, 0, &r, &err) != 0);
    CHECK(strstr(err.msg, "world size") != NULL);
    /* no model.name */
    CHECK(ft_memplan_config(c, 1, &r, &err) != 0);
    CHECK(strstr(err.msg, "model.name") != NULL);
    free(c);
    char name[400];
    snprintf(name, sizeof name, "model.name=%s/absent", root);
    const char *absent[] = {name, NULL};
    c = make_config(absent);
    CHECK(ft_memplan_config(c, 1, &r, &err) != 0);
    free(c);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft_memplan_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(llama_dir, sizeof llama_dir, "%s/llama", root);
    snprintf(qwen_dir, sizeof qwen_dir, "%s/qwen", root);
    write_model(llama_dir, 0, NULL, NULL, NULL);
    write_model(qwen_dir, 1, NULL, NULL, NULL);
    snprintf(tied_dir, sizeof tied_dir, "%s/tied", root);
    make_tied();
    snprintf(granite_dir, sizeof granite_dir, "%s/granite", root);
    write_tiny_model(granite_dir,
                     &(tiny_model_opts){.model_type = "granite",
                                        .extra_cfg = ", \"embedding_multiplier\": 4.0, "
                                                     "\"residual_multiplier\": 0.5, "
                                                     "\"attention_multiplier\": 0.3, "
                                                     "\"logits_scaling\": 2.0"});
    snprintf(gemma_dir, sizeof gemma_dir, "%s/gemma", root);
    write_tiny_model(gemma_dir,
                     &(tiny_model_opts){.model_type = "gemma", .tied = 1,
                                        .hidden_act = "gelu_pytorch_tanh",
                                        .extra_cfg = ", \"head_dim\": 4"});
    snprintf(smollm3_dir, sizeof smollm3_dir, "%s/smollm3", root);
    write_tiny_model(smollm3_dir, &(tiny_model_opts){.model_type = "smollm3", .tied = 1,
                                                     .extra_cfg = ", \"no_rope_layers\": [1, 0]"});
    snprintf(phi3_dir, sizeof phi3_dir, "%s/phi3", root);
    write_tiny_model(phi3_dir,
                     &(tiny_model_opts){.model_type = "phi3", .tied = 1,
                                        .extra_cfg = ", \"partial_rotary_factor\": 0.5, "
                                                     "\"original_max_position_embeddings\": 8, "
                                                     "\"rope_scaling\": {\"type\": \"longrope\", "
                                                     "\"short_factor\": [1.5], "
                                                     "\"long_factor\": [3]}"});
    snprintf(olmo2_dir, sizeof olmo2_dir, "%s/olmo2", root);
    write_tiny_model(olmo2_dir, &(tiny_model_opts){.model_type = "olmo2"});
    snprintf(qwen3_dir, sizeof qwen3_dir, "%s/qwen3", root);
    write_tiny_model(qwen3_dir, &(tiny_model_opts){.model_type = "qwen3", .tied = 1});
    snprintf(gemma2_dir, sizeof gemma2_dir, "%s/gemma2", root);
    write_tiny_model(gemma2_dir,
                     &(tiny_model_opts){.model_type = "gemma2", .tied = 1,
                                        .extra_cfg = ", \"head_dim\": 4, \"sliding_window\": 3,"
                                                     " \"query_pre_attn_scalar\": 6"});
    snprintf(mixtral_dir, sizeof mixtral_dir, "%s/mixtral", root);
    write_tiny_model(mixtral_dir, &(tiny_model_opts){.model_type = "mixtral"});
    snprintf(qwen3_moe_dir, sizeof qwen3_moe_dir, "%s/qwen3_moe", root);
    write_tiny_model(qwen3_moe_dir, &(tiny_model_opts){.model_type = "qwen3_moe"});
    snprintf(qwen3_moe_dense_dir, sizeof qwen3_moe_dense_dir, "%s/qwen3_moe_dense", root);
    write_tiny_model(qwen3_moe_dense_dir,
                     &(tiny_model_opts){.model_type = "qwen3_moe", .dense_layer1 = 1});
    snprintf(qwen2_moe_dir, sizeof qwen2_moe_dir, "%s/qwen2_moe", root);
    write_tiny_model(qwen2_moe_dir, &(tiny_model_opts){.model_type = "qwen2_moe"});
    snprintf(qwen2_moe_dense_dir, sizeof qwen2_moe_dense_dir, "%s/qwen2_moe_dense", root);
    write_tiny_model(qwen2_moe_dense_dir,
                     &(tiny_model_opts){.model_type = "qwen2_moe", .dense_layer1 = 1});

    snprintf(gemma3_dir, sizeof gemma3_dir, "%s/gemma3", root);
    write_tiny_model(gemma3_dir,
                     &(tiny_model_opts){.model_type = "gemma3_text", .tied = 1,
                                        .extra_cfg = ", \"sliding_window\": 3,"
                                                     " \"query_pre_attn_scalar\": 6,"
                                                     " \"final_logit_softcapping\": 2.0,"
                                                     " \"sliding_window_pattern\": 2,"
                                                     " \"rope_scaling\": {\"rope_type\":"
                                                     " \"linear\", \"factor\": 8.0}"});

    RUN(test_cpu_lora_equals_measured);
    RUN(test_cpu_modules_to_save_equal_measured);
    RUN(test_cpu_added_tokens_equal_measured);
    RUN(test_cpu_dora_equal_measured);
    RUN(test_cpu_rank_patterns_equal_measured);
    RUN(test_cpu_outer_lora_equal_measured);
    RUN(test_cpu_full_equals_measured);
    RUN(test_cpu_chunked_logits_equal_measured);
    RUN(test_cpu_dpo_equals_measured);
    RUN(test_cpu_qlora_equals_measured);
    RUN(test_compare_modes);
    RUN(test_cpu_bias_and_tied_equal_measured);
    RUN(test_cpu_granite_gemma_equal_measured);
    RUN(test_cpu_phi3_equal_measured);
    RUN(test_cpu_smollm3_equal_measured);
    RUN(test_cpu_olmo2_qwen3_equal_measured);
    RUN(test_cpu_mixtral_equal_measured);
    RUN(test_cpu_qwen3_moe_dense_equal_measured);
    RUN(test_cpu_qwen2_moe_equal_measured);
    RUN(test_cpu_qwen3_moe_equal_measured);
    RUN(test_cpu_gemma2_equal_measured);
    RUN(test_cpu_gemma3_equal_measured);
    RUN(test_gpu_formulas);
    RUN(test_real_model_sizes);
    RUN(test_70b_qlora_fits_two_24gb_gpus);
    RUN(test_batch_auto);
    RUN(test_errors);
    printf("memplan: cpu-fp32 plan == allocator peak in %d configurations\n", n_compared);

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("memplan");
}
