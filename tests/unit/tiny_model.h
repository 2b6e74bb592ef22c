/* A tiny random Llama written by a test itself (config.json + model.safetensors), for
 * the unit tests that need a model on disk. Include after check.h. */
#ifndef FT_TINY_MODEL_H
#define FT_TINY_MODEL_H

#include <stdio.h>
#include <string.h>

#include "core/fsutil.h"
#include "core/rng.h"
#include "formats/safetensors.h"

enum { V = 32, C = 16, I = 24, L = 2, HQ = 4, HKV = 2, D = 4, MOE_E = 4 };

typedef struct tiny_model_opts {
    int qkv_bias;          /* qwen2: q, k, v biases */
    int tied;              /* tie_word_embeddings: no lm_head.weight */
    const char *skip;      /* a tensor left out */
    const char *extra;     /* a tensor [C] added */
    const char *bad_shape; /* a tensor written one row short */
    const char *extra_cfg; /* spliced into config.json: ", \"key\": value" */
    const char *model_type; /* NULL: llama, or qwen2 with qkv_bias; "phi3": fused
                             * qkv_proj and gate_up_proj tensors; "qwen3" and "olmo2"
                             * get their q/k norms (and head_dim D for qwen3), olmo2 its
                             * post-norms in place of llama's norms, gemma2 its four norms
                             * (pre and post on each branch), gemma3_text those four and
                             * per-head q/k norms (head_dim D), mixtral MOE_E experts
                             * (top 2, output_router_logits) in place of the MLP, qwen3_moe
                             * likewise (not renormalised, experts of moe_intermediate_size
                             * I / 2) with qwen3's per-head q/k norms, qwen2_moe likewise
                             * with q/k/v biases and no q/k norms, plus a shared expert of
                             * width I / 3 and its gate */
    int dense_layer1;      /* qwen3_moe, qwen2_moe: layer 1 a dense MLP of width I
                            * (mlp_only_layers [1]) */
    const char *hidden_act; /* NULL: silu */
    uint64_t seed;         /* weight stream (0: 7) */
    float scale;           /* weights uniform in [-scale/2, scale/2) (0: 0.6) */
} tiny_model_opts;

/* Writes config.json and model.safetensors of a tiny llama into dir, with seeded random
 * weights (norms near 1). */
static void write_tiny_model(const char *dir, const tiny_model_opts *o)
{
    int qkv_bias = o->qkv_bias;
    const char *skip = o->skip, *extra = o->extra, *bad_shape = o->bad_shape;
    const char *type = o->model_type ? o->model_type : qkv_bias ? "qwen2" : "llama";
    int olmo2 = strcmp(type, "olmo2") == 0, qwen3 = strcmp(type, "qwen3") == 0;
    int gemma3 = strcmp(type, "gemma3_text") == 0, mixtral = strcmp(type, "mixtral") == 0;
    int gemma2 = strcmp(type, "gemma2") == 0 || gemma3;
    int qwen2_moe = strcmp(type, "qwen2_moe") == 0;
    int qwen3_moe = strcmp(type, "qwen3_moe") == 0 || qwen2_moe;
    if (qwen2_moe)
        qkv_bias = 1;
    char head_dim[400] = ""; /* qwen3's default (128) is not D */
    if (qwen3 || gemma3)
        snprintf(head_dim, sizeof head_dim, ", \"head_dim\": %d", D);
    if (mixtral)
        snprintf(head_dim, sizeof head_dim,
                 ", \"num_local_experts\": %d, \"num_experts_per_tok\": 2, "
                 "\"output_router_logits\": true, \"router_aux_loss_coef\": 0.1",
                 MOE_E);
    if (qwen3_moe)
        snprintf(head_dim, sizeof head_dim,
                 ", \"head_dim\": %d, \"num_experts\": %d, \"num_experts_per_tok\": 2, "
                 "\"moe_intermediate_size\": %d, \"norm_topk_prob\": false, "
                 "\"output_router_logits\": true, \"router_aux_loss_coef\": 0.1%s%s",
                 D, MOE_E, I / 2, qwen2_moe ? ", \"shared_expert_intermediate_size\": 8" : "",
                 o->dense_layer1 ? ", \"mlp_only_layers\": [1]" : "");
    uint64_t seed = o->seed ? o->seed : 7;
    float scale = o->scale > 0 ? o->scale : 0.6f;
    ft_err err;
    CHECK(ft_mkdir_p(dir, &err) == 0);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "{\"model_type\": \"%s\", \"vocab_size\": %d, \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
            "\"num_key_value_heads\": %d, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, "
            "\"hidden_act\": \"%s\", \"max_position_embeddings\": 64, "
            "\"tie_word_embeddings\": %s%s%s}",
            type, V, C, I, L, HQ, HKV, o->hidden_act ? o->hidden_act : "silu",
            o->tied ? "true" : "false", head_dim, o->extra_cfg ? o->extra_cfg : "");
    fclose(f);

    static float store[64][V * C > 2 * I * C ? V * C : 2 * I * C];
    int fused = strcmp(type, "phi3") == 0;
    int n = 0;
    ft_st_writer *w = ft_st_writer_new();
    char names[64][96];
    int64_t shapes[64][2];
    int ndims[64];
#define ADD(nd, d0, d1, ...)                                                            \
    do {                                                                                \
        snprintf(names[n], sizeof names[n], __VA_ARGS__);                               \
        ndims[n] = nd;                                                                  \
        shapes[n][0] = d0;                                                              \
        shapes[n][1] = d1;                                                              \
        n++;                                                                            \
    } while (0)
    ADD(2, V, C, "model.embed_tokens.weight");
    for (int l = 0; l < L; l++) {
        if (!olmo2)
            ADD(1, C, 0, "model.layers.%d.input_layernorm.weight", l);
        if (fused) {
            ADD(2, (HQ + 2 * HKV) * D, C, "model.layers.%d.self_attn.qkv_proj.weight", l);
            ADD(2, C, HQ * D, "model.layers.%d.self_attn.o_proj.weight", l);
            ADD(1, C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
            ADD(2, 2 * I, C, "model.layers.%d.mlp.gate_up_proj.weight", l);
            ADD(2, C, I, "model.layers.%d.mlp.down_proj.weight", l);
            continue;
        }
        ADD(2, HQ * D, C, "model.layers.%d.self_attn.q_proj.weight", l);
        ADD(2, HKV * D, C, "model.layers.%d.self_attn.k_proj.weight", l);
        ADD(2, HKV * D, C, "model.layers.%d.self_attn.v_proj.weight", l);
        if (qkv_bias) {
            ADD(1, HQ * D, 0, "model.layers.%d.self_attn.q_proj.bias", l);
            ADD(1, HKV * D, 0, "model.layers.%d.self_attn.k_proj.bias", l);
            ADD(1, HKV * D, 0, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        ADD(2, C, HQ * D, "model.layers.%d.self_attn.o_proj.weight", l);
        if (olmo2 || qwen3 || gemma3 || (qwen3_moe && !qwen2_moe)) { /* olmo2: over the whole projection; qwen3,
                                          * gemma3: per head */
            ADD(1, olmo2 ? HQ * D : D, 0, "model.layers.%d.self_attn.q_norm.weight", l);
            ADD(1, olmo2 ? HKV * D : D, 0, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        ADD(1, C, 0, "model.layers.%d.post_attention_layernorm.weight", l);
        if (gemma2)
            ADD(1, C, 0, "model.layers.%d.pre_feedforward_layernorm.weight", l);
        if (mixtral) {
            ADD(2, MOE_E, C, "model.layers.%d.block_sparse_moe.gate.weight", l);
            for (int e = 0; e < MOE_E; e++) {
                ADD(2, I, C, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
                ADD(2, C, I, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
                ADD(2, I, C, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
            }
            continue;
        }
        if (qwen3_moe && !(o->dense_layer1 && l == 1)) {
            if (qwen2_moe) {
                ADD(2, 8, C, "model.layers.%d.mlp.shared_expert.gate_proj.weight", l);
                ADD(2, 8, C, "model.layers.%d.mlp.shared_expert.up_proj.weight", l);
                ADD(2, C, 8, "model.layers.%d.mlp.shared_expert.down_proj.weight", l);
                ADD(2, 1, C, "model.layers.%d.mlp.shared_expert_gate.weight", l);
            }
            ADD(2, MOE_E, C, "model.layers.%d.mlp.gate.weight", l);
            for (int e = 0; e < MOE_E; e++) {
                ADD(2, I / 2, C, "model.layers.%d.mlp.experts.%d.gate_proj.weight", l, e);
                ADD(2, I / 2, C, "model.layers.%d.mlp.experts.%d.up_proj.weight", l, e);
                ADD(2, C, I / 2, "model.layers.%d.mlp.experts.%d.down_proj.weight", l, e);
            }
            continue;
        }
        ADD(2, I, C, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(2, I, C, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(2, C, I, "model.layers.%d.mlp.down_proj.weight", l);
        if (olmo2 || gemma2)
            ADD(1, C, 0, "model.layers.%d.post_feedforward_layernorm.weight", l);
    }
    ADD(1, C, 0, "model.norm.weight");
    if (!o->tied)
        ADD(2, V, C, "lm_head.weight");
    if (extra)
        ADD(1, C, 0, "%s", extra);
#undef ADD
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)shapes[i][0] * (ndims[i] > 1 ? shapes[i][1] : 1);
        int is_norm = ndims[i] == 1 && !strstr(names[i], "bias");
        for (size_t j = 0; j < numel; j++)
            store[i][j] = is_norm ? 1.0f + 0.2f * (ft_uniform(seed + i, j) - 0.5f)
                                  : scale * (ft_uniform(seed + i, j) - 0.5f);
        if (skip && strcmp(names[i], skip) == 0)
            continue;
        int64_t shape[2] = {shapes[i][0], shapes[i][1]};
        if (bad_shape && strcmp(names[i], bad_shape) == 0)
            shape[0] -= 1;
        CHECK(ft_st_writer_add(w, names[i], FT_ST_F32, ndims[i], shape, store[i], &err) == 0);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(ft_st_writer_save(w, path, &err) == 0);
    ft_st_writer_free(w);
}

/* The common case: `skip` omits a tensor, `extra` adds one, `bad_shape` gives a tensor
 * the wrong shape (all may be NULL). */
__attribute__((unused)) static void write_model(const char *dir, int qkv_bias,
                                                const char *skip, const char *extra,
                                                const char *bad_shape)
{
    tiny_model_opts o = {.qkv_bias = qkv_bias, .skip = skip, .extra = extra,
                         .bad_shape = bad_shape};
    write_tiny_model(dir, &o);
}

#endif
