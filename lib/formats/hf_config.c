/* Reads a Hugging Face config.json of the decoder families (model_type "llama",
 * "mistral", "qwen2", "qwen3", "granite", "gemma", "gemma2", "gemma3_text", "olmo2", "phi3",
 * "smollm3", "gemma3": the text_config of a multimodal Gemma 3, read as gemma3_text by
 * parse_gemma3_multimodal, and the mixture-of-experts "mixtral", "qwen3_moe" and
 * "qwen2_moe") into
 * ft_model_config, and computes the RoPE inverse frequencies the way transformers does.
 *
 * Defaults are those of transformers' LlamaConfig, MistralConfig, Qwen2Config,
 * Qwen3Config, GraniteConfig, GemmaConfig, Gemma2Config, Olmo2Config, Phi3Config and
 * SmolLM3Config, so a config.json means here what it means to AutoModelForCausalLM (gemma2:
 * as gemma where not said otherwise):
 *
 *   key                      llama  mistral  qwen2   qwen3   granite  gemma   gemma2  olmo2
 *   num_key_value_heads      =heads 8 (*)    32 (*)  32 (*)  =heads   16 (*)  4 (*)   =heads
 *                            phi3 =heads, smollm3 4 (*) (null: = heads everywhere)
 *   head_dim                 hidden / heads (must divide exactly when absent); gemma and
 *                            gemma2 256 and qwen3 128 when absent; granite always
 *                            hidden / heads (head_dim, when present, must equal it:
 *                            GraniteAttention ignores the key)
 *   max_position_embeddings  2048   131072   32768   32768   2048     8192    8192    2048
 *                            phi3 4096, smollm3 32768
 *   sliding_window           mistral 4096 (null: none); phi3 none when absent; gemma2 4096
 *                            on its even layers (null refused); qwen2, qwen3 only with
 *                            use_sliding_window; smollm3's use_sliding_window refused; the
 *                            others do not read it
 *   rms_norm_eps             1e-6, but olmo2 and phi3 1e-5
 *   tie_word_embeddings false everywhere but gemma, gemma2 and smollm3 (true); rope_theta
 *                            10000
 *   gemma2: query_pre_attn_scalar 256, attn_logit_softcapping 50,
 *           final_logit_softcapping 30
 *   gemma3_text (Gemma3TextConfig): gemma2's norms, head_dim 256, num_key_value_heads 4,
 *           query_pre_attn_scalar 256 and tied head, plus per-head q/k norms;
 *           max_position_embeddings 131072; sliding_window 4096 on the layers layer_types
 *           says (absent: all but every sliding_window_pattern-th, default 6); rope_theta
 *           1e6 (full-attention layers, with rope_scaling: default or linear),
 *           rope_local_base_freq 1e4 (sliding layers), or the same per layer type in
 *           rope_parameters; final_logit_softcapping null (applied when set);
 *           attn_logit_softcapping must be null (Gemma3Attention never applies it);
 *           vocab_size 262208, hidden_size 2304, intermediate_size 9216,
 *           num_hidden_layers 26, num_attention_heads 8 when absent
 *   (*) absent only; an explicit null means "= num_attention_heads", as in transformers.
 *
 * The block: llama's RMSNorms before the attention (input_layernorm) and the MLP
 * (post_attention_layernorm) everywhere but olmo2 and gemma2. olmo2's norms are after each
 * branch (post_attention_layernorm, post_feedforward_layernorm; no pre-norms); gemma2 has
 * both on each branch (input_layernorm, post_attention_layernorm,
 * pre_feedforward_layernorm, post_feedforward_layernorm); q and k RMSNorm before RoPE in
 * qwen3 (self_attn.q_norm / k_norm, each head's head_dim) and olmo2 (the whole
 * projection). These are fixed by model_type, no key switches them.
 *
 * Keys that change the math, and what happens to them:
 *   honoured: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
 *     num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta,
 *     rope_scaling / rope_parameters (default, linear, llama3, yarn), tie_word_embeddings,
 *     attention_bias and mlp_bias (llama, granite; attention_bias for gemma, gemma2,
 *     qwen3, olmo2), sliding_window (mistral, gemma2), the fixed q/k/v bias of qwen2;
 *     granite's embedding_multiplier, residual_multiplier, attention_multiplier (the
 *     softmax scale, replacing 1/sqrt(head_dim)) and logits_scaling (logits divided by it), each a
 *     positive number, 1 when absent; gemma's fixed rules: norm weights applied as 1 + w,
 *     embeddings times sqrt(hidden_size) (rounded to the activation dtype), GeGLU;
 *     gemma2's, the same plus its keys: query_pre_attn_scalar (attention scale
 *     query_pre_attn_scalar^-0.5), attn_logit_softcapping and final_logit_softcapping
 *     (null: no cap), sliding_window with layer_types (which must be the alternation 4.46
 *     applies: sliding on even layers), hidden_activation (gelu_pytorch_tanh only;
 *     hidden_act is not read);
 *     phi3: fused qkv_proj / gate_up_proj weights (fixed), partial_rotary_factor (rope
 *     dict, else top level), rope type longrope (su, yarn: its old names; read_longrope
 *     says how), sliding_window; smollm3: no_rope_layers / no_rope_layer_interval
 *     (read_nope_layers), attention_bias and mlp_bias; mixtral: sliding_window (none
 *     when absent), rope_theta 1e6 when absent, the MoE keys num_local_experts (alias
 *     num_experts), num_experts_per_tok, output_router_logits, router_aux_loss_coef
 *     (read_moe; router_jitter_noise must be 0); qwen3_moe and qwen2_moe: the MoE keys
     with moe_intermediate_size, norm_topk_prob, mlp_only_layers and decoder_sparse_step
     (dense layers), qwen2_moe's shared_expert_intermediate_size and qkv_bias
     (read_qwen_moe, read_sparse_layers).
 *   the activation: hidden_act silu/swish (all but gemma and gemma2); for gemma,
 *     transformers 4.46 applies hidden_activation (null: gelu_pytorch_tanh, hidden_act
 *     ignored) and transformers 5 hidden_act (default gelu_pytorch_tanh, legacy "gelu"
 *     read as it): it must be gelu_pytorch_tanh under both readings (4.46's:
 *     hidden_activation when set, else hidden_act, default gelu_pytorch_tanh).
 *   rejected unless neutral: other activations; attention_dropout != 0
 *     (training would drop attention weights), phi3's resid_pdrop and embd_pdrop != 0;
 *     other rope types (dynamic, ntk, longrope outside phi3, ...), for gemma(2) any
 *     but the default (4.46's Gemma reads rope_theta only), for phi3 any but default and
 *     longrope (Phi3Config's rule); partial_rotary_factor != 1 outside phi3; qwen2, qwen3
 *     and smollm3 use_sliding_window = true;
 *     layer_types with an entry the model cannot run (sliding layers outside mistral, phi3
 *     and gemma2, mixed layers in mistral and phi3, another pattern in gemma2);
 *     per-layer-type rope_parameters; gemma2 sliding_window null,
 *     use_bidirectional_attention true; attention_bias/mlp_bias = true where the family's
 *     modeling code has no such switch (mistral, qwen2, phi3; mlp_bias for gemma, gemma2,
 *     qwen3, olmo2): the checkpoint would not match the model; quantization_config other
 *     than bitsandbytes' (lib/formats/quant_io.c reads that one: the weights stay
 *     quantized in the checkpoint).
 *   rejected when present (keys of other families, which the model would silently
 *     drop although the checkpoint was trained with them): attn_logit_softcapping,
 *     final_logit_softcapping, query_pre_attn_scalar (outside gemma2 and gemma3),
 *     attention_multiplier (outside granite), scale_depth (MiniCPM), num_experts,
 *     num_local_experts (MoE);
 *     embedding_multiplier, residual_multiplier, logits_scaling (outside granite),
 *     scale_emb unless 1; use_qk_norm, qk_layernorm, use_parallel_residual,
 *     scale_embeddings unless false.
 *   no effect on the math, read or ignored: architectures (must name a *ForCausalLM when
 *     present), torch_dtype / dtype, bos/eos/pad token ids, pretraining_tp (the split
 *     matmul of old LlamaAttention is the same product), max_window_layers (only with
 *     use_sliding_window), initializer_range, use_cache, transformers_version, ...
 *
 * A mistral sliding_window W means, in transformers' masks (masking_utils'
 * sliding_window_overlay, eager and SDPA), that query q sees key k when q - W < k <= q:
 * W keys including itself. (Older flash-attention paths saw one more.)
 *
 * Every error names the file and the key. Token ids: -1 when absent or null (the header's
 * contract; transformers would fill bos 1 / eos 2 for llama and mistral). */
#include "formats/hf_config.h"

#include "core/fsutil.h"
#include "formats/json_file.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Upper bound on every structural size, far above any released model; it keeps products
 * like num_heads * head_dim and vocab_size * hidden_size well inside 64 bits. */
#define CFG_MAX_DIM (1 << 24)

typedef enum family_kind {
    FAM_LLAMA = 0,
    FAM_MISTRAL,
    FAM_QWEN2,
    FAM_QWEN3,
    FAM_GRANITE,
    FAM_GEMMA,
    FAM_GEMMA2,
    FAM_OLMO2,
    FAM_PHI3,
    FAM_SMOLLM3,
    FAM_GEMMA3,
    FAM_MIXTRAL,
    FAM_QWEN3_MOE,
    FAM_QWEN2_MOE
} family_kind;

typedef struct model_defaults {
    const char *model_type;
    family_kind family;
    int max_position_embeddings;
    int kv_heads_if_absent;       /* 0: num_attention_heads */
    int sliding_window_if_absent; /* mistral, gemma2: the others do not read the key */
    int head_dim_if_absent;       /* 0: hidden_size / num_attention_heads */
    bool tie_if_absent;           /* tie_word_embeddings' default */
    double rms_norm_eps_if_absent;
    /* the block: its branch norms' module names (ft_model_config.norm_name) and q/k norm */
    const char *const *norms;
    ft_qk_norm qk_norm;
} model_defaults;

/* Branch norms (ft_branch_norm order: attention pre, attention post, MLP pre, MLP post).
 * Llama's block norms each branch's input; OLMo2's each branch's output, under the names
 * llama gives its pre-norms (post_attention_layernorm is the attention's post-norm there,
 * the MLP's pre-norm in llama). */
static const char *const PRE_NORMS[FT_NBRANCH_NORMS] = {"input_layernorm", "",
                                                        "post_attention_layernorm", ""};
static const char *const OLMO2_NORMS[FT_NBRANCH_NORMS] = {"", "post_attention_layernorm", "",
                                                          "post_feedforward_layernorm"};
/* Gemma 2: both on each branch (post_attention_layernorm is the attention's post-norm, as
 * in OLMo2, and pre_feedforward_layernorm the MLP's pre-norm). */
static const char *const GEMMA2_NORMS[FT_NBRANCH_NORMS] = {
    "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
    "post_feedforward_layernorm"};

static const model_defaults MODEL_DEFAULTS[] = {
    {"llama", FAM_LLAMA, 2048, 0, 0, 0, false, 1e-6, PRE_NORMS, FT_QK_NORM_NONE},
    {"mistral", FAM_MISTRAL, 4096 * 32, 8, 4096, 0, false, 1e-6, PRE_NORMS, FT_QK_NORM_NONE},
    {"qwen2", FAM_QWEN2, 32768, 32, 0, 0, false, 1e-6, PRE_NORMS, FT_QK_NORM_NONE},
    {"qwen3", FAM_QWEN3, 32768, 32, 0, 128, false, 1e-6, PRE_NORMS, FT_QK_NORM_HEAD},
    {"granite", FAM_GRANITE, 2048, 0, 0, 0, false, 1e-6, PRE_NORMS, FT_QK_NORM_NONE},
    {"gemma", FAM_GEMMA, 8192, 16, 0, 256, true, 1e-6, PRE_NORMS, FT_QK_NORM_NONE},
    {"gemma2", FAM_GEMMA2, 8192, 4, 4096, 256, true, 1e-6, GEMMA2_NORMS, FT_QK_NORM_NONE},
    {"olmo2", FAM_OLMO2, 2048, 0, 0, 0, false, 1e-5, OLMO2_NORMS, FT_QK_NORM_PROJ},
    {"phi3", FAM_PHI3, 4096, 0, 0, 0, false, 1e-5, PRE_NORMS, FT_QK_NORM_NONE},
    {"smollm3", FAM_SMOLLM3, 32768, 4, 0, 0, true, 1e-6, PRE_NORMS, FT_QK_NORM_NONE},
    {"gemma3_text", FAM_GEMMA3, 131072, 4, 4096, 256, true, 1e-6, GEMMA2_NORMS,
     FT_QK_NORM_HEAD},
    {"mixtral", FAM_MIXTRAL, 4096 * 32, 8, 0, 0, false, 1e-5, PRE_NORMS, FT_QK_NORM_NONE},
    {"qwen3_moe", FAM_QWEN3_MOE, 32768, 4, 0, 0, false, 1e-6, PRE_NORMS, FT_QK_NORM_HEAD},
    {"qwen2_moe", FAM_QWEN2_MOE, 32768, 16, 0, 0, false, 1e-6, PRE_NORMS, FT_QK_NORM_NONE},
};

#define SUPPORTED_TYPES                                                                        \
    "llama, mistral, qwen2, qwen3, granite, gemma, gemma2, gemma3_text, gemma3 (its text "    \
    "model), olmo2, phi3, smollm3, mixtral, qwen3_moe, qwen2_moe"

/* Keys of other families that must be absent, neutral, or null (quantization_config:
 * or bitsandbytes'). */
typedef enum foreign_rule { MUST_BE_NULL, MUST_BE_ONE, MUST_BE_FALSE, MUST_BE_BNB } foreign_rule;

static const struct {
    const char *key;
    foreign_rule rule;
} FOREIGN_KEYS[] = {
    {"attn_logit_softcapping", MUST_BE_NULL},
    {"final_logit_softcapping", MUST_BE_NULL},
    {"query_pre_attn_scalar", MUST_BE_NULL},
    {"attention_multiplier", MUST_BE_NULL},
    {"scale_depth", MUST_BE_NULL},
    {"num_experts", MUST_BE_NULL},
    {"num_local_experts", MUST_BE_NULL},
    {"quantization_config", MUST_BE_BNB},
    {"partial_rotary_factor", MUST_BE_ONE},
    {"embedding_multiplier", MUST_BE_ONE},
    {"residual_multiplier", MUST_BE_ONE},
    {"logits_scaling", MUST_BE_ONE},
    {"scale_emb", MUST_BE_ONE},
    {"use_qk_norm", MUST_BE_FALSE},
    {"qk_layernorm", MUST_BE_FALSE},
    {"use_parallel_residual", MUST_BE_FALSE},
    {"scale_embeddings", MUST_BE_FALSE},
};

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown JSON value";
}

/* The value of key, or NULL when the key is absent or null (transformers' None). */
static json_t *get_opt(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int read_int(const char *path, const char *key, const json_t *v, int lo, int hi, int *out,
                    ft_err *err)
{
    if (!json_is_integer(v))
        return ft_fail(err, "%s: '%s': expected an integer, got %s", path, key, json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ft_fail(err, "%s: '%s': %lld is out of range [%d, %d]", path, key, (long long)x,
                       lo, hi);
    *out = (int)x;
    return 0;
}

static int read_dim(const char *path, const char *key, const json_t *v, int *out, ft_err *err)
{
    return read_int(path, key, v, 1, CFG_MAX_DIM, out, err);
}

static int read_number(const char *path, const char *key, const json_t *v, double *out,
                       ft_err *err)
{
    if (!json_is_number(v))
        return ft_fail(err, "%s: '%s': expected a number, got %s", path, key, json_kind(v));
    *out = json_number_value(v);
    if (!isfinite(*out))
        return ft_fail(err, "%s: '%s': not a finite number", path, key);
    return 0;
}

static int read_positive(const char *path, const char *key, const json_t *v, double *out,
                         ft_err *err)
{
    if (read_number(path, key, v, out, err))
        return -1;
    if (!(*out > 0))
        return ft_fail(err, "%s: '%s': must be positive, got %g", path, key, *out);
    return 0;
}

static int read_bool(const char *path, const char *key, const json_t *v, bool *out, ft_err *err)
{
    if (!json_is_boolean(v))
        return ft_fail(err, "%s: '%s': expected true or false, got %s", path, key, json_kind(v));
    *out = json_is_true(v);
    return 0;
}

static int read_string(const char *path, const char *key, const json_t *v, const char **out,
                       ft_err *err)
{
    if (!json_is_string(v))
        return ft_fail(err, "%s: '%s': expected a string, got %s", path, key, json_kind(v));
    *out = json_string_value(v);
    return 0;
}

static int require(const char *path, const json_t *obj, const char *key, json_t **out,
                   ft_err *err)
{
    *out = json_object_get(obj, key);
    if (!*out)
        return ft_fail(err, "%s: missing required key '%s'", path, key);
    return 0;
}

static int read_required_dim(const char *path, const json_t *root, const char *key, int *out,
                             ft_err *err)
{
    json_t *v;
    if (require(path, root, key, &v, err))
        return -1;
    return read_dim(path, key, v, out, err);
}

/* A token id: int in [0, vocab_size), or null/absent/-1 for none. */
/* The pad_token_id of the family's config class when config.json has none (the
 * embedding's padding_idx, ft_model_config.embed_padding_idx); -1: None. */
static int pad_token_default(family_kind family)
{
    switch (family) {
    case FAM_GEMMA:
    case FAM_GEMMA2:
    case FAM_GEMMA3: return 0;
    case FAM_OLMO2: return 1;
    case FAM_PHI3: return 32000;
    case FAM_SMOLLM3: return 128004;
    default: return -1;
    }
}

static int read_token_id(const char *path, const char *key, const json_t *v, int vocab, int *out,
                         ft_err *err)
{
    *out = -1;
    if (!v || json_is_null(v))
        return 0;
    return read_int(path, key, v, -1, vocab - 1, out, err);
}

static int read_eos(const char *path, const json_t *root, ft_model_config *cfg, ft_err *err)
{
    json_t *v = get_opt(root, "eos_token_id");
    cfg->n_eos = 0;
    if (!v)
        return 0;
    if (!json_is_array(v)) {
        int id;
        if (read_token_id(path, "eos_token_id", v, cfg->vocab_size, &id, err))
            return -1;
        if (id >= 0)
            cfg->eos_token_ids[cfg->n_eos++] = id;
        return 0;
    }
    if (json_array_size(v) > FT_MAX_EOS)
        return ft_fail(err, "%s: 'eos_token_id': %zu ids, at most %d supported", path,
                       json_array_size(v), FT_MAX_EOS);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        int id;
        if (read_int(path, "eos_token_id", e, 0, cfg->vocab_size - 1, &id, err))
            return -1;
        cfg->eos_token_ids[cfg->n_eos++] = id;
    }
    return 0;
}

/* A family's own keys, not foreign to it: granite's multipliers and gemma2's (and
 * gemma3's) soft-caps and query_pre_attn_scalar (read by read_family_scales), phi3's partial_rotary_factor (read by
 * read_rope). */
static bool family_owns(const model_defaults *md, const char *key)
{
    static const char *const granite[] = {"attention_multiplier", "embedding_multiplier",
                                          "residual_multiplier", "logits_scaling", NULL};
    static const char *const gemma2[] = {"attn_logit_softcapping", "final_logit_softcapping",
                                         "query_pre_attn_scalar", NULL};
    static const char *const phi3[] = {"partial_rotary_factor", NULL};
    static const char *const mixtral[] = {"num_local_experts", "num_experts", NULL};
    /* Qwen2MoeConfig has no attribute_map: num_local_experts is not its key */
    static const char *const qwen2_moe[] = {"num_experts", NULL};
    const char *const *own = md->family == FAM_GRANITE   ? granite
                             : md->family == FAM_GEMMA2  ? gemma2
                             : md->family == FAM_GEMMA3  ? gemma2
                             : md->family == FAM_PHI3    ? phi3
                             : md->family == FAM_MIXTRAL ? mixtral
                             : md->family == FAM_QWEN3_MOE ? mixtral
                             : md->family == FAM_QWEN2_MOE ? qwen2_moe
                                                         : NULL;
    for (size_t i = 0; own && own[i]; i++)
        if (strcmp(key, own[i]) == 0)
            return true;
    return false;
}

static int check_foreign_keys(const char *path, const json_t *root, const model_defaults *md,
                              ft_err *err)
{
    for (size_t i = 0; i < sizeof FOREIGN_KEYS / sizeof FOREIGN_KEYS[0]; i++) {
        const char *key = FOREIGN_KEYS[i].key;
        json_t *v = get_opt(root, key);
        if (!v || family_owns(md, key))
            continue;
        switch (FOREIGN_KEYS[i].rule) {
        case MUST_BE_NULL:
            return ft_fail(err, "%s: '%s' is set: not supported for model_type '%s'", path,
                           key, md->model_type);
        case MUST_BE_ONE:
            if (!json_is_number(v) || json_number_value(v) != 1.0)
                return ft_fail(err, "%s: '%s' must be 1 (or absent): other values are not "
                               "supported", path, key);
            break;
        case MUST_BE_FALSE:
            if (!json_is_false(v))
                return ft_fail(err, "%s: '%s' must be false (or absent): not supported", path,
                               key);
            break;
        case MUST_BE_BNB: {
            const char *method = json_string_value(json_object_get(v, "quant_method"));
            if (!method || strcmp(method, "bitsandbytes") != 0)
                return ft_fail(err, "%s: '%s': quant_method '%s' is not supported (only "
                               "bitsandbytes 4-bit and 8-bit checkpoints are)",
                               path, key, method ? method : "(missing)");
            break;
        }
        }
    }
    return 0;
}

static int check_architectures(const char *path, const json_t *root, ft_err *err)
{
    json_t *v = get_opt(root, "architectures");
    if (!v)
        return 0;
    if (!json_is_array(v))
        return ft_fail(err, "%s: 'architectures': expected an array, got %s", path, json_kind(v));
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *name = json_string_value(e);
        size_t n = name ? strlen(name) : 0, suffix = strlen("ForCausalLM");
        if (n >= suffix && strcmp(name + n - suffix, "ForCausalLM") == 0)
            return 0;
    }
    return ft_fail(err, "%s: 'architectures': no *ForCausalLM entry (only causal LMs are "
                   "supported)", path);
}

static const model_defaults *find_model_type(const char *path, const json_t *root, ft_err *err)
{
    json_t *v;
    const char *type = "";
    if (require(path, root, "model_type", &v, err) ||
        read_string(path, "model_type", v, &type, err))
        return NULL;
    for (size_t i = 0; i < sizeof MODEL_DEFAULTS / sizeof MODEL_DEFAULTS[0]; i++)
        if (strcmp(type, MODEL_DEFAULTS[i].model_type) == 0)
            return &MODEL_DEFAULTS[i];
    ft_fail(err, "%s: 'model_type': '%.64s' is not supported (supported: " SUPPORTED_TYPES ")",
            path, type);
    return NULL;
}

/* Heads, kv heads and head_dim, with the divisibility rules attention needs. */
static int read_heads(const char *path, const json_t *root, const model_defaults *md,
                      ft_model_config *cfg, ft_err *err)
{
    if (read_required_dim(path, root, "num_attention_heads", &cfg->num_heads, err))
        return -1;
    json_t *kv = json_object_get(root, "num_key_value_heads");
    if (!kv)
        cfg->num_kv_heads = md->kv_heads_if_absent ? md->kv_heads_if_absent : cfg->num_heads;
    else if (json_is_null(kv))
        cfg->num_kv_heads = cfg->num_heads;
    else if (read_dim(path, "num_key_value_heads", kv, &cfg->num_kv_heads, err))
        return -1;
    if (cfg->num_heads % cfg->num_kv_heads != 0)
        return ft_fail(err, "%s: 'num_key_value_heads' (%d%s) must divide num_attention_heads "
                       "(%d)", path, cfg->num_kv_heads,
                       kv ? "" : ", the model type's default when absent", cfg->num_heads);

    json_t *hd = get_opt(root, "head_dim");
    if (md->family == FAM_GRANITE) {
        /* GraniteAttention takes hidden_size / num_attention_heads and ignores head_dim:
         * a different head_dim in the file would describe another model. */
        if (cfg->hidden_size % cfg->num_heads != 0)
            return ft_fail(err, "%s: 'num_attention_heads' (%d) must divide hidden_size (%d) "
                           "for granite", path, cfg->num_heads, cfg->hidden_size);
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
        int h;
        if (hd && (read_dim(path, "head_dim", hd, &h, err) ||
                   (h != cfg->head_dim &&
                    ft_fail(err, "%s: 'head_dim' (%d) must be hidden_size / "
                            "num_attention_heads (%d) for granite", path, h, cfg->head_dim))))
            return -1;
    } else if (hd) {
        if (read_dim(path, "head_dim", hd, &cfg->head_dim, err))
            return -1;
    } else if (md->head_dim_if_absent) {
        cfg->head_dim = md->head_dim_if_absent;
    } else {
        if (cfg->hidden_size % cfg->num_heads != 0)
            return ft_fail(err, "%s: 'head_dim' is absent and hidden_size (%d) is not a "
                           "multiple of num_attention_heads (%d)", path, cfg->hidden_size,
                           cfg->num_heads);
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    if (cfg->head_dim % 2 != 0)
        return ft_fail(err, "%s: 'head_dim' (%d) must be even for rotary embeddings", path,
                       cfg->head_dim);
    if ((long long)cfg->num_heads * cfg->head_dim > CFG_MAX_DIM)
        return ft_fail(err, "%s: 'head_dim': num_attention_heads * head_dim = %lld is too large",
                       path, (long long)cfg->num_heads * cfg->head_dim);
    return 0;
}

/* A required positive number inside the rope dict `name`, for rope type `type`. */
static int rope_param(const char *path, const char *name, const json_t *rope, const char *type,
                      const char *key, double *out, ft_err *err)
{
    json_t *v = get_opt(rope, key);
    char full[128];
    snprintf(full, sizeof full, "%s.%s", name, key);
    if (!v)
        return ft_fail(err, "%s: '%s' is required for rope type '%s'", path, full, type);
    return read_positive(path, full, v, out, err);
}

/* partial_rotary_factor: phi3 reads it from the rope dict, else from the top level (1
 * when absent); rotary_dim = int(head_dim * factor), as transformers truncates it. Other
 * families: it must be 1 (the top-level key is checked with the foreign keys). */
static int read_partial_rotary(const char *path, const json_t *root, const model_defaults *md,
                               const json_t *rope, const char *name, ft_model_config *cfg,
                               ft_err *err)
{
    char key[128];
    json_t *prf = rope ? get_opt(rope, "partial_rotary_factor") : NULL;
    snprintf(key, sizeof key, "%s.partial_rotary_factor", name);
    if (!prf && md->family == FAM_PHI3) {
        prf = get_opt(root, "partial_rotary_factor");
        snprintf(key, sizeof key, "partial_rotary_factor");
    }
    if (!prf)
        return 0;
    double f;
    if (read_positive(path, key, prf, &f, err))
        return -1;
    if (md->family != FAM_PHI3) {
        if (f != 1.0)
            return ft_fail(err, "%s: '%s' must be 1: partial rotary embeddings are not "
                           "supported for model_type '%s'", path, key, md->model_type);
        return 0;
    }
    double rd = floor((double)cfg->head_dim * f);
    if (f > 1.0 || rd < 2 || (long)rd % 2 != 0)
        return ft_fail(err, "%s: '%s' is %g: head_dim (%d) times it must give an even "
                       "rotary dimension in [2, head_dim]", path, key, f, cfg->head_dim);
    cfg->rotary_dim = (int)rd;
    return 0;
}

/* A list of rotary_dim / 2 finite numbers (longrope's short_factor / long_factor). */
static int read_factor_list(const char *path, const json_t *rope, const char *name,
                            const char *k, int n, float *out, ft_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", name, k);
    json_t *v = get_opt(rope, k);
    if (!v)
        return ft_fail(err, "%s: '%s' is required for rope type 'longrope'", path, key);
    if (!json_is_array(v) || json_array_size(v) != (size_t)n)
        return ft_fail(err, "%s: '%s': expected a list of %d numbers (rotary_dim / 2)", path,
                       key, n);
    for (int i = 0; i < n; i++) {
        double x;
        if (read_positive(path, key, json_array_get(v, (size_t)i), &x, err))
            return -1;
        out[i] = (float)x; /* torch.tensor(list, dtype=float32) */
    }
    return 0;
}

/* The dict's factor (positive), or where it is absent or null max_position_embeddings /
 * orig, as longrope and yarn default it. */
static int rope_factor(const char *path, const char *name, const json_t *rope,
                       const ft_model_config *cfg, double orig, double *factor, ft_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.factor", name);
    json_t *v = get_opt(rope, "factor");
    if (v)
        return read_positive(path, key, v, factor, err);
    *factor = (double)cfg->max_position_embeddings / orig;
    return 0;
}

/* longrope (phi3), as transformers' _compute_longrope_parameters reads it: the factor
 * lists; original_max_position_embeddings from the top level (Phi3Config has it, 4096 by
 * default, and standardize_rope_params gives it priority over the dict's); factor from
 * the dict or max_position_embeddings / original; attention_factor from the dict or
 * sqrt(1 + ln(factor) / ln(original)) when factor > 1, else 1. */
static int read_longrope(const char *path, const json_t *root, const json_t *rope,
                         const char *name, ft_model_config *cfg, ft_err *err)
{
    int n = cfg->rotary_dim / 2;
    if (n > FT_MAX_ROPE_FREQS)
        return ft_fail(err, "%s: '%s': longrope with %d frequencies (at most %d supported)",
                       path, name, n, FT_MAX_ROPE_FREQS);
    if (read_factor_list(path, rope, name, "short_factor", n, cfg->rope_short_factor, err) ||
        read_factor_list(path, rope, name, "long_factor", n, cfg->rope_long_factor, err))
        return -1;
    cfg->rope_original_max_position = 4096;
    json_t *v = get_opt(root, "original_max_position_embeddings");
    if (v && read_int(path, "original_max_position_embeddings", v, 2, INT_MAX,
                      &cfg->rope_original_max_position, err))
        return -1;
    char key[128];
    double orig = cfg->rope_original_max_position, factor, att;
    if (rope_factor(path, name, rope, cfg, orig, &factor, err))
        return -1;
    snprintf(key, sizeof key, "%s.attention_factor", name);
    if ((v = get_opt(rope, "attention_factor"))) {
        if (read_positive(path, key, v, &att, err))
            return -1;
    } else {
        att = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(orig));
    }
    cfg->rope_kind = FT_ROPE_LONGROPE;
    cfg->rope_factor = (float)factor;
    cfg->rope_attention_factor = (float)att; /* cos * python float: an fp32 product */
    return 0;
}

/* transformers' find_correction_dim: the dimension (of rotary_dim, as a real number) whose
 * wavelength makes `rotations` turns over `orig` positions; python floats throughout. */
static double yarn_correction_dim(double rotations, int dim, double base, double orig)
{
    return (dim * log(orig / (rotations * 2 * M_PI))) / (2 * log(base));
}

/* A YaRN number of the dict: absent, null or 0 give the default (transformers reads them
 * as `value or default`); otherwise it must be positive. */
static int yarn_number(const char *path, const char *name, const json_t *rope, const char *k,
                       double dflt, double *out, ft_err *err)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", name, k);
    json_t *v = get_opt(rope, k);
    *out = dflt;
    if (!v || (json_is_number(v) && json_number_value(v) == 0))
        return 0;
    return read_positive(path, key, v, out, err);
}

/* get_mscale of _compute_yarn_parameters: 0.1 mscale ln(factor) + 1, or 1 for factor <= 1 */
static double yarn_mscale(double factor, double mscale)
{
    return factor <= 1 ? 1.0 : 0.1 * mscale * log(factor) + 1.0;
}

/* yarn, as transformers' _compute_yarn_parameters reads it: factor (required; null:
 * max_position_embeddings / original), original_max_position_embeddings from the top
 * level where config.json has it (standardize_rope_params gives it priority), else the
 * dict's, else max_position_embeddings; attention_factor from the dict, else
 * get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) where both are set and
 * non-zero, else get_mscale(factor); beta_fast (32) and beta_slow (1) place the ramp,
 * truncate (true) floors its start and ceils its end. */
static int read_yarn(const char *path, const json_t *root, const json_t *rope,
                     const char *name, ft_model_config *cfg, ft_err *err)
{
    char key[128];
    json_t *v;
    snprintf(key, sizeof key, "%s.factor", name);
    if (!json_object_get(rope, "factor"))
        return ft_fail(err, "%s: '%s' is required for rope type 'yarn'", path, key);
    int orig = cfg->max_position_embeddings;
    if ((v = get_opt(root, "original_max_position_embeddings"))) {
        if (read_int(path, "original_max_position_embeddings", v, 1, INT_MAX, &orig, err))
            return -1;
    } else if ((v = get_opt(rope, "original_max_position_embeddings"))) {
        snprintf(key, sizeof key, "%s.original_max_position_embeddings", name);
        if (read_int(path, key, v, 1, INT_MAX, &orig, err))
            return -1;
    }
    double factor;
    if (rope_factor(path, name, rope, cfg, orig, &factor, err))
        return -1;
    double att, mscale, mscale_all_dim, beta_fast, beta_slow;
    if (yarn_number(path, name, rope, "mscale", 0, &mscale, err) ||
        yarn_number(path, name, rope, "mscale_all_dim", 0, &mscale_all_dim, err) ||
        yarn_number(path, name, rope, "beta_fast", 32, &beta_fast, err) ||
        yarn_number(path, name, rope, "beta_slow", 1, &beta_slow, err))
        return -1;
    snprintf(key, sizeof key, "%s.attention_factor", name);
    if ((v = get_opt(rope, "attention_factor"))) {
        if (read_positive(path, key, v, &att, err))
            return -1;
    } else if (mscale > 0 && mscale_all_dim > 0) {
        att = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
    } else {
        att = yarn_mscale(factor, 1.0);
    }
    bool truncate = true;
    snprintf(key, sizeof key, "%s.truncate", name);
    if ((v = get_opt(rope, "truncate")) && read_bool(path, key, v, &truncate, err))
        return -1;
    const int dim = cfg->rotary_dim;
    const double base = cfg->rope_theta;
    if (!(base > 1.0)) /* the ramp's bounds divide by ln(base) */
        return ft_fail(err, "%s: rope type 'yarn' needs rope_theta > 1, got %g", path, base);
    double low = yarn_correction_dim(beta_fast, dim, base, orig);
    double high = yarn_correction_dim(beta_slow, dim, base, orig);
    if (truncate) {
        low = floor(low);
        high = ceil(high);
    }
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high)
        high += 0.001; /* linear_ramp_factor: "prevent singularity" */
    cfg->rope_kind = FT_ROPE_YARN;
    cfg->rope_factor = (float)factor;
    cfg->rope_original_max_position = orig;
    cfg->rope_attention_factor = (float)att; /* cos * python float: an fp32 product */
    cfg->rope_yarn_low = low;
    cfg->rope_yarn_high = high;
    return 0;
}

/* One layer type's RoPE of gemma3 (Gemma3RotaryEmbedding): the dict `name` (NULL: none)
 * over the defaults in *theta / *kind / *factor; rope_type default, or linear where
 * linear_ok (the full-attention layers: transformers' rope scaling of the 4B..27B
 * models). */
static int gemma3_rope_dict(const char *path, const json_t *rope, const char *name,
                            bool linear_ok, double *theta, ft_rope_kind *kind, float *factor,
                            ft_err *err)
{
    char key[128];
    if (!rope)
        return 0;
    if (!json_is_object(rope))
        return ft_fail(err, "%s: '%s': expected an object, got %s", path, name, json_kind(rope));
    json_t *v;
    snprintf(key, sizeof key, "%s.rope_theta", name);
    if ((v = get_opt(rope, "rope_theta")) && read_positive(path, key, v, theta, err))
        return -1;
    double f = 1.0;
    snprintf(key, sizeof key, "%s.partial_rotary_factor", name);
    if ((v = get_opt(rope, "partial_rotary_factor")) &&
        (read_positive(path, key, v, &f, err) ||
         (f != 1.0 && ft_fail(err, "%s: '%s' must be 1: partial rotary embeddings are not "
                              "supported for gemma3", path, key))))
        return -1;
    const char *type = "default";
    snprintf(key, sizeof key, "%s.rope_type", name);
    if (!(v = get_opt(rope, "rope_type"))) {
        v = get_opt(rope, "type");
        snprintf(key, sizeof key, "%s.type", name);
    }
    if (v && read_string(path, key, v, &type, err))
        return -1;
    if (strcmp(type, "default") == 0) {
        *kind = FT_ROPE_DEFAULT;
        *factor = 1.0f;
        return 0;
    }
    if (strcmp(type, "linear") != 0 || !linear_ok)
        return ft_fail(err, "%s: '%s': rope type '%.64s' is not supported for gemma3's %s "
                       "layers (supported: %s)", path, key, type,
                       linear_ok ? "full-attention" : "sliding",
                       linear_ok ? "default, linear" : "default");
    if (rope_param(path, name, rope, type, "factor", &f, err))
        return -1;
    *kind = FT_ROPE_LINEAR;
    *factor = (float)f;
    return 0;
}

/* gemma3's two RoPEs, as Gemma3TextConfig.convert_rope_params_to_dict builds them: the
 * full-attention layers' from rope_parameters.full_attention, updated by a legacy
 * rope_scaling, with rope_theta (default 1e6) where neither says it; the sliding layers'
 * from rope_parameters.sliding_attention, with rope_local_base_freq (default 1e4) where
 * it does not say it. rope_kind / rope_factor / rope_theta describe the full-attention
 * layers, rope_local_theta the sliding ones (default RoPE). */
static int read_gemma3_rope(const char *path, const json_t *root, ft_model_config *cfg,
                            ft_err *err)
{
    cfg->rope_kind = FT_ROPE_DEFAULT;
    cfg->rope_factor = 1.0f;
    cfg->rope_low_freq_factor = cfg->rope_high_freq_factor = 0.0f;
    cfg->rope_original_max_position = 0;
    cfg->rope_attention_factor = 1.0f;
    cfg->rotary_dim = cfg->head_dim;
    cfg->rope_theta = 1e6;
    cfg->rope_local_theta = 1e4;
    json_t *v;
    if ((v = get_opt(root, "rope_theta")) && read_positive(path, "rope_theta", v,
                                                           &cfg->rope_theta, err))
        return -1;
    if ((v = get_opt(root, "rope_local_base_freq")) &&
        read_positive(path, "rope_local_base_freq", v, &cfg->rope_local_theta, err))
        return -1;
    json_t *params = get_opt(root, "rope_parameters");
    if (params) {
        if (!json_is_object(params))
            return ft_fail(err, "%s: 'rope_parameters': expected an object, got %s", path,
                           json_kind(params));
        const char *k;
        json_t *e;
        json_object_foreach(params, k, e) {
            if (strcmp(k, "full_attention") != 0 && strcmp(k, "sliding_attention") != 0)
                return ft_fail(err, "%s: 'rope_parameters': key '%.64s': gemma3 takes one dict "
                               "per layer type (full_attention, sliding_attention)", path, k);
        }
    }
    ft_rope_kind local_kind;
    float local_factor;
    if (gemma3_rope_dict(path, params ? get_opt(params, "full_attention") : NULL,
                         "rope_parameters.full_attention", true, &cfg->rope_theta,
                         &cfg->rope_kind, &cfg->rope_factor, err) ||
        gemma3_rope_dict(path, get_opt(root, "rope_scaling"), "rope_scaling", true,
                         &cfg->rope_theta, &cfg->rope_kind, &cfg->rope_factor, err) ||
        gemma3_rope_dict(path, params ? get_opt(params, "sliding_attention") : NULL,
                         "rope_parameters.sliding_attention", false, &cfg->rope_local_theta,
                         &local_kind, &local_factor, err))
        return -1;
    return 0;
}

/* rope_scaling (transformers 4) or rope_parameters (transformers 5; it also carries
 * rope_theta and may carry partial_rotary_factor). rope_scaling wins when both are set, as
 * in transformers' convert_rope_params_to_dict; rope_theta inside the dict wins over the
 * top-level key. */
static int read_rope(const char *path, const json_t *root, const model_defaults *md,
                     ft_model_config *cfg, ft_err *err)
{
    cfg->rope_local_theta = 0.0;
    if (md->family == FAM_GEMMA3)
        return read_gemma3_rope(path, root, cfg, err);
    const char *name = "rope_scaling";
    json_t *rope = get_opt(root, name);
    if (!rope) {
        name = "rope_parameters";
        rope = get_opt(root, name);
    }
    if (rope && !json_is_object(rope))
        return ft_fail(err, "%s: '%s': expected an object, got %s", path, name, json_kind(rope));
    if (rope && json_object_get(rope, "full_attention")) {
        /* Per-layer-type parameters: acceptable only when every layer is full attention. */
        if (json_object_size(rope) != 1 || !json_is_object(json_object_get(rope,
                                                                            "full_attention")))
            return ft_fail(err, "%s: '%s': per-layer-type rope parameters are not supported",
                           path, name);
        name = "rope_parameters.full_attention";
        rope = json_object_get(rope, "full_attention");
    }

    cfg->rope_theta = md->family == FAM_MIXTRAL ? 1e6 : 10000.0; /* MixtralConfig.default_theta */
    cfg->rope_kind = FT_ROPE_DEFAULT;
    cfg->rope_factor = 1.0f;
    cfg->rope_low_freq_factor = cfg->rope_high_freq_factor = 0.0f;
    cfg->rope_original_max_position = 0;
    cfg->rope_attention_factor = 1.0f;
    cfg->rotary_dim = cfg->head_dim;

    json_t *theta = json_object_get(root, "rope_theta");
    char key[128];
    snprintf(key, sizeof key, "%s.rope_theta", name);
    if (rope && get_opt(rope, "rope_theta")) {
        if (read_positive(path, key, get_opt(rope, "rope_theta"), &cfg->rope_theta, err))
            return -1;
    } else if (theta && read_positive(path, "rope_theta", theta, &cfg->rope_theta, err)) {
        return -1;
    }
    if (read_partial_rotary(path, root, md, rope, name, cfg, err))
        return -1;
    if (!rope)
        return 0;

    json_t *tv = get_opt(rope, "rope_type");
    snprintf(key, sizeof key, "%s.rope_type", name);
    if (!tv) {
        tv = get_opt(rope, "type");
        snprintf(key, sizeof key, "%s.type", name);
    }
    const char *type = "default";
    if (tv && read_string(path, key, tv, &type, err))
        return -1;

    double f, lo, hi;
    if (strcmp(type, "default") == 0)
        return 0;
    if (md->family == FAM_PHI3) {
        /* Phi3Config: "su" and "yarn" are old names of longrope; no other type */
        if (strcmp(type, "longrope") == 0 || strcmp(type, "su") == 0 ||
            strcmp(type, "yarn") == 0)
            return read_longrope(path, root, rope, name, cfg, err);
        return ft_fail(err, "%s: '%s': %s type '%.64s' is not supported for phi3 (supported: "
                       "default, longrope)", path, key, name, type);
    }
    if (strcmp(type, "linear") == 0) {
        if (rope_param(path, name, rope, type, "factor", &f, err))
            return -1;
        cfg->rope_kind = FT_ROPE_LINEAR;
        cfg->rope_factor = (float)f;
        return 0;
    }
    if (strcmp(type, "llama3") == 0) {
        json_t *orig;
        snprintf(key, sizeof key, "%s.original_max_position_embeddings", name);
        if (rope_param(path, name, rope, type, "factor", &f, err) ||
            rope_param(path, name, rope, type, "low_freq_factor", &lo, err) ||
            rope_param(path, name, rope, type, "high_freq_factor", &hi, err))
            return -1;
        if (!(orig = get_opt(rope, "original_max_position_embeddings")))
            return ft_fail(err, "%s: '%s' is required for rope type 'llama3'", path, key);
        if (read_int(path, key, orig, 1, INT_MAX, &cfg->rope_original_max_position, err))
            return -1;
        if (!(hi > lo))
            return ft_fail(err, "%s: '%s.high_freq_factor' (%g) must be greater than "
                           "low_freq_factor (%g)", path, name, hi, lo);
        cfg->rope_kind = FT_ROPE_LLAMA3;
        cfg->rope_factor = (float)f;
        cfg->rope_low_freq_factor = (float)lo;
        cfg->rope_high_freq_factor = (float)hi;
        return 0;
    }
    if (strcmp(type, "yarn") == 0)
        return read_yarn(path, root, rope, name, cfg, err);
    return ft_fail(err, "%s: '%s': %s type '%.64s' is not supported (supported: default, "
                   "linear, llama3, yarn)", path, key, name, type);
}

/* layer_types (written by newer transformers): every layer must be one the model runs. */
static int check_layer_types(const char *path, const json_t *root, const ft_model_config *cfg,
                             ft_err *err)
{
    json_t *v = get_opt(root, "layer_types");
    if (!v || strcmp(cfg->model_type, "gemma2") == 0 || strcmp(cfg->model_type, "gemma3_text") == 0)
        return 0; /* gemma2, gemma3: read_gemma2_layers, read_gemma3_layers */
    if (!json_is_array(v))
        return ft_fail(err, "%s: 'layer_types': expected an array, got %s", path, json_kind(v));
    const char *want = cfg->sliding_window > 0 ? "sliding_attention" : "full_attention";
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *t = json_string_value(e);
        if (!t || strcmp(t, want) != 0)
            return ft_fail(err, "%s: 'layer_types'[%zu]: only '%s' layers are supported here "
                           "(got %s)", path, i, want, t ? t : json_kind(e));
    }
    return 0;
}

/* What gemma2 and gemma3 read alike: sliding_window (default 4096; null refused) into
 * cfg, the bound on per-layer attention types, and layer_types: *types is NULL when the
 * key is absent, else an array of one entry a layer. */
static int read_window_and_types(const char *path, const json_t *root, const char *family,
                                 ft_model_config *cfg, json_t **types, ft_err *err)
{
    json_t *v = json_object_get(root, "sliding_window");
    cfg->sliding_window = 4096;
    if (v && json_is_null(v))
        return ft_fail(err, "%s: 'sliding_window' is null: %s without a window on its "
                       "sliding layers is not supported", path, family);
    if (v && read_int(path, "sliding_window", v, 1, INT_MAX, &cfg->sliding_window, err))
        return -1;
    if (cfg->num_layers > FT_MAX_LAYER_TYPES)
        return ft_fail(err, "%s: 'num_hidden_layers': %d layers with per-layer attention types "
                       "are more than the %d supported", path, cfg->num_layers,
                       FT_MAX_LAYER_TYPES);
    *types = v = get_opt(root, "layer_types");
    if (v && !json_is_array(v))
        return ft_fail(err, "%s: 'layer_types': expected an array, got %s", path, json_kind(v));
    if (v && json_array_size(v) != (size_t)cfg->num_layers)
        return ft_fail(err, "%s: 'layer_types': %zu entries for %d layers", path,
                       json_array_size(v), cfg->num_layers);
    return 0;
}

/* gemma2's windows: sliding_window (default 4096) on the layers layer_types calls
 * "sliding_attention". transformers 4.46 ignores layer_types and slides on the even
 * layers (0, 2, ...), which is also the list later versions write when it is absent:
 * a list that differs from it would be read two ways, and is refused. */
static int read_gemma2_layers(const char *path, const json_t *root, ft_model_config *cfg,
                              ft_err *err)
{
    json_t *v;
    if (read_window_and_types(path, root, "gemma2", cfg, &v, err))
        return -1;
    for (int l = 0; l < cfg->num_layers; l++)
        cfg->layer_full_attention[l] = l % 2 != 0;
    if (!v)
        return 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *t = json_string_value(e);
        const char *want = i % 2 ? "full_attention" : "sliding_attention";
        if (!t || strcmp(t, want) != 0)
            return ft_fail(err, "%s: 'layer_types'[%zu]: %s, but only gemma2's alternation "
                           "(sliding_attention on even layers, full_attention on odd ones, "
                           "which transformers 4.46 applies whatever the list says) is "
                           "supported", path, i, t ? t : json_kind(e));
    }
    return 0;
}

/* gemma3's windows (Gemma3TextConfig): sliding_window (default 4096; null refused) on the
 * layers layer_types calls "sliding_attention", any mix of those and "full_attention";
 * without layer_types, older configs' sliding_window_pattern P (default 6) makes layer l
 * sliding unless (l + 1) % P == 0 (every P-th layer global), as the config class derives
 * the list. */
static int read_gemma3_layers(const char *path, const json_t *root, ft_model_config *cfg,
                              ft_err *err)
{
    json_t *v;
    if (read_window_and_types(path, root, "gemma3", cfg, &v, err))
        return -1;
    if (!v) {
        int pattern = 6;
        json_t *pv = get_opt(root, "sliding_window_pattern");
        if (pv && read_int(path, "sliding_window_pattern", pv, 1, INT_MAX, &pattern, err))
            return -1;
        for (int l = 0; l < cfg->num_layers; l++)
            cfg->layer_full_attention[l] = (l + 1) % pattern == 0;
        return 0;
    }
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *t = json_string_value(e);
        if (t && strcmp(t, "full_attention") == 0)
            cfg->layer_full_attention[i] = true;
        else if (!t || strcmp(t, "sliding_attention") != 0)
            return ft_fail(err, "%s: 'layer_types'[%zu]: %s is not one of sliding_attention, "
                           "full_attention", path, i, t ? t : json_kind(e));
    }
    return 0;
}

/* Qwen2, Qwen3 and SmolLM3: sliding_window is read only with use_sliding_window, which is
 * refused (their sliding layers are not implemented); a window size beside
 * use_sliding_window false, as their checkpoints carry it, means nothing. */
static int check_use_sliding_window(const char *path, const json_t *root, const char *type,
                                    ft_err *err)
{
    bool use_sw = false;
    json_t *v;
    if ((v = get_opt(root, "use_sliding_window")) &&
        read_bool(path, "use_sliding_window", v, &use_sw, err))
        return -1;
    if (use_sw)
        return ft_fail(err, "%s: 'use_sliding_window' is true: sliding-window attention is "
                       "not supported for model_type '%s'", path, type);
    return 0;
}

static int read_attention_options(const char *path, const json_t *root,
                                  const model_defaults *md, ft_model_config *cfg, ft_err *err)
{
    const char *type = cfg->model_type;
    bool attention_bias = false, mlp_bias = false;
    json_t *v;
    if ((v = json_object_get(root, "attention_bias")) &&
        read_bool(path, "attention_bias", v, &attention_bias, err))
        return -1;
    if ((v = json_object_get(root, "mlp_bias")) && read_bool(path, "mlp_bias", v, &mlp_bias, err))
        return -1;

    double dropout = 0;
    if ((v = get_opt(root, "attention_dropout")) &&
        read_number(path, "attention_dropout", v, &dropout, err))
        return -1;
    if (dropout != 0)
        return ft_fail(err, "%s: 'attention_dropout' is %g: attention dropout is not supported "
                       "(must be 0)", path, dropout);

    cfg->sliding_window = 0;
    bool has_mlp_bias = md->family == FAM_LLAMA || md->family == FAM_GRANITE ||
                        md->family == FAM_SMOLLM3;
    if (has_mlp_bias || md->family == FAM_GEMMA || md->family == FAM_GEMMA2 ||
        md->family == FAM_GEMMA3 || md->family == FAM_QWEN3 || md->family == FAM_OLMO2 ||
        md->family == FAM_QWEN3_MOE) {
        /* attention_bias on q, k, v and o; mlp_bias on gate, up, down (llama, granite,
         * smollm3) */
        if (mlp_bias && !has_mlp_bias)
            return ft_fail(err, "%s: 'mlp_bias' is true, but model_type '%s' has no such "
                           "option", path, type);
        cfg->qkv_bias = cfg->o_bias = attention_bias;
        cfg->mlp_bias = mlp_bias;
        if (md->family == FAM_GEMMA2)
            return read_gemma2_layers(path, root, cfg, err);
        if (md->family == FAM_GEMMA3)
            return read_gemma3_layers(path, root, cfg, err);
        return md->family == FAM_QWEN3 || md->family == FAM_QWEN3_MOE
                   ? check_use_sliding_window(path, root, type, err)
                   : 0;
    }
    if (attention_bias)
        return ft_fail(err, "%s: 'attention_bias' is true, but model_type '%s' has no such "
                       "option", path, type);
    if (mlp_bias)
        return ft_fail(err, "%s: 'mlp_bias' is true, but model_type '%s' has no such option",
                       path, type);
    if (md->family == FAM_MISTRAL || md->family == FAM_PHI3 || md->family == FAM_MIXTRAL) {
        /* (phi3: a sliding-window mask when the key is set, as for mistral) */
        v = json_object_get(root, "sliding_window");
        if (!v)
            cfg->sliding_window = md->sliding_window_if_absent;
        else if (!json_is_null(v) &&
                 read_int(path, "sliding_window", v, 1, INT_MAX, &cfg->sliding_window, err))
            return -1;
        return 0;
    }
    /* qwen2: bias on q, k, v (not o); sliding window only with use_sliding_window.
     * qwen2_moe: the same, the q, k, v bias switched by qkv_bias (default true). */
    cfg->qkv_bias = true;
    if (md->family == FAM_QWEN2_MOE && (v = get_opt(root, "qkv_bias")) &&
        read_bool(path, "qkv_bias", v, &cfg->qkv_bias, err))
        return -1;
    return check_use_sliding_window(path, root, type, err);
}

static int read_dtype(const char *path, const json_t *root, ft_model_config *cfg, ft_err *err)
{
    const char *key = "torch_dtype";
    json_t *v = get_opt(root, key);
    if (!v) {
        key = "dtype"; /* transformers 5 */
        v = get_opt(root, key);
    }
    cfg->torch_dtype[0] = '\0';
    if (!v)
        return 0;
    const char *s = "";
    if (read_string(path, key, v, &s, err))
        return -1;
    if (strcmp(s, "float32") != 0 && strcmp(s, "bfloat16") != 0 && strcmp(s, "float16") != 0)
        return ft_fail(err, "%s: '%s': '%.32s' is not one of float32, bfloat16, float16", path,
                       key, s);
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", s);
    return 0;
}

/* The MLP activation. Every family but gemma and gemma2: hidden_act silu (swish), the
 * default. gemma2: hidden_activation (see below). gemma: transformers 4.46's GemmaMLP
 * applies hidden_activation, and gelu_pytorch_tanh when that is null (ignoring hidden_act,
 * with a warning); transformers 5 applies hidden_act (default gelu_pytorch_tanh; its
 * GemmaConfig turns the legacy "gelu" into gelu_pytorch_tanh) and ignores
 * hidden_activation. A file on which the two readings differ is refused rather than
 * guessed. */
static int read_activation(const char *path, const json_t *root, const model_defaults *md,
                           ft_model_config *cfg, ft_err *err)
{
    json_t *v;
    if (md->family == FAM_GEMMA2 || md->family == FAM_GEMMA3) {
        /* Gemma2MLP (4.46 and later) and Gemma3MLP apply hidden_activation; hidden_act is
         * not read */
        const char *act = "gelu_pytorch_tanh";
        if ((v = get_opt(root, "hidden_activation")) &&
            read_string(path, "hidden_activation", v, &act, err))
            return -1;
        if (strcmp(act, "gelu_pytorch_tanh") != 0)
            return ft_fail(err, "%s: 'hidden_activation': '%.32s' is not supported for %s "
                           "(only gelu_pytorch_tanh)", path, act, md->model_type);
        cfg->mlp_act = FT_ACT_GELU_TANH;
        return 0;
    }
    if (md->family != FAM_GEMMA) {
        const char *act = "silu";
        if ((v = json_object_get(root, "hidden_act")) &&
            read_string(path, "hidden_act", v, &act, err))
            return -1;
        if (strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0)
            return ft_fail(err, "%s: 'hidden_act': '%.32s' is not supported for model_type "
                           "'%s' (only silu)", path, act, md->model_type);
        cfg->mlp_act = FT_ACT_SILU;
        return 0;
    }
    const char *key = "hidden_activation", *act = NULL;
    if ((v = get_opt(root, key)) && read_string(path, key, v, &act, err))
        return -1;
    if (!act) {
        key = "hidden_act";
        act = "gelu_pytorch_tanh";
        if ((v = get_opt(root, key)) && read_string(path, key, v, &act, err))
            return -1;
    }
    if (strcmp(act, "gelu_pytorch_tanh") != 0)
        return ft_fail(err, "%s: '%s': '%.32s' is not supported for gemma (only "
                       "gelu_pytorch_tanh)", path, key, act);
    /* transformers 5's reading of the same file */
    const char *act5 = "gelu_pytorch_tanh";
    if ((v = get_opt(root, "hidden_act")) && read_string(path, "hidden_act", v, &act5, err))
        return -1;
    if (strcmp(act5, "gelu_pytorch_tanh") != 0 && strcmp(act5, "gelu") != 0)
        return ft_fail(err, "%s: 'hidden_act': '%.32s' is what transformers 5 applies to gemma "
                       "(4.46 applied '%s': gelu_pytorch_tanh); only gelu_pytorch_tanh is "
                       "supported", path, act5, key);
    cfg->mlp_act = FT_ACT_GELU_TANH;
    return 0;
}

/* smollm3: no_rope_layers[l] (1: layer l applies RoPE, 0: it does not), or when absent
 * or null SmolLM3Config's rule, layer l has RoPE unless (l + 1) % no_rope_layer_interval
 * == 0 (default interval 4: every fourth layer is NoPE). use_sliding_window (sliding
 * attention on the NoPE layers only) is refused: one window for every layer is all this
 * model runs. */
static int read_nope_layers(const char *path, const json_t *root, const model_defaults *md,
                            ft_model_config *cfg, ft_err *err)
{
    memset(cfg->nope_layers, 0, sizeof cfg->nope_layers);
    if (md->family != FAM_SMOLLM3)
        return 0;
    if (check_use_sliding_window(path, root, cfg->model_type, err))
        return -1;
    json_t *v;
    int L = cfg->num_layers, interval = 4;
    if (L > FT_MAX_NOPE_LAYERS)
        return ft_fail(err, "%s: 'num_hidden_layers': %d layers, at most %d supported for "
                       "smollm3", path, L, FT_MAX_NOPE_LAYERS);
    json_t *list = get_opt(root, "no_rope_layers");
    if (!list) {
        if ((v = get_opt(root, "no_rope_layer_interval")) &&
            read_int(path, "no_rope_layer_interval", v, 1, INT_MAX, &interval, err))
            return -1;
        for (int l = 0; l < L; l++)
            if ((l + 1) % interval == 0)
                cfg->nope_layers[l / 64] |= 1ull << (l % 64);
        return 0;
    }
    if (!json_is_array(list) || json_array_size(list) != (size_t)L)
        return ft_fail(err, "%s: 'no_rope_layers': expected a list of num_hidden_layers (%d) "
                       "entries, 0 or 1", path, L);
    for (int l = 0; l < L; l++) {
        int use;
        char key[64];
        snprintf(key, sizeof key, "no_rope_layers[%d]", l);
        if (read_int(path, key, json_array_get(list, (size_t)l), 0, 1, &use, err))
            return -1;
        if (!use)
            cfg->nope_layers[l / 64] |= 1ull << (l % 64);
    }
    return 0;
}

bool ft_layer_uses_rope(const ft_model_config *cfg, int layer)
{
    if (layer < 0 || layer >= FT_MAX_NOPE_LAYERS)
        return true;
    return !(cfg->nope_layers[layer / 64] >> (layer % 64) & 1);
}

/* phi3's residual and embedding dropouts: training would drop activations, so they must
 * be 0 (the released models' value). */
static int read_phi3_dropouts(const char *path, const json_t *root, const model_defaults *md,
                              ft_err *err)
{
    static const char *const keys[] = {"resid_pdrop", "embd_pdrop"};
    for (size_t i = 0; md->family == FAM_PHI3 && i < 2; i++) {
        json_t *v = get_opt(root, keys[i]);
        double p = 0;
        if (v && read_number(path, keys[i], v, &p, err))
            return -1;
        if (p != 0)
            return ft_fail(err, "%s: '%s' is %g: dropout on the residual stream is not "
                           "supported (must be 0)", path, keys[i], p);
    }
    return 0;
}

/* A positive finite multiplier of the config (granite), 1 when absent or null. */
static int read_multiplier(const char *path, const json_t *root, const char *key, double *out,
                           ft_err *err)
{
    json_t *v = get_opt(root, key);
    *out = 1.0;
    return v ? read_positive(path, key, v, out, err) : 0;
}

/* A soft-cap of gemma2: default when absent, 0 (none) when null, else positive. */
static int read_softcap(const char *path, const json_t *root, const char *key, double dflt,
                        float *out, ft_err *err)
{
    json_t *v = json_object_get(root, key);
    double c = dflt;
    if (v && json_is_null(v))
        c = 0.0;
    else if (v && read_positive(path, key, v, &c, err))
        return -1;
    *out = (float)c; /* the python float meets fp32 tensors */
    return 0;
}

/* gemma2: attention scale query_pre_attn_scalar^-0.5 (default 256), the two soft-caps
 * (defaults 50 and 30), and causal attention only. */
static int read_gemma2_scales(const char *path, const json_t *root, ft_model_config *cfg,
                              ft_err *err)
{
    double qpas = 256;
    json_t *v;
    if ((v = json_object_get(root, "query_pre_attn_scalar")) &&
        read_positive(path, "query_pre_attn_scalar", v, &qpas, err))
        return -1;
    cfg->attention_scale = (float)pow(qpas, -0.5);
    bool bidir = false;
    if ((v = get_opt(root, "use_bidirectional_attention")) &&
        read_bool(path, "use_bidirectional_attention", v, &bidir, err))
        return -1;
    if (bidir)
        return ft_fail(err, "%s: 'use_bidirectional_attention' is true: only causal attention "
                       "is supported", path);
    return read_softcap(path, root, "attn_logit_softcapping", 50.0, &cfg->attn_softcap, err) ||
                   read_softcap(path, root, "final_logit_softcapping", 30.0,
                                &cfg->final_softcap, err)
               ? -1
               : 0;
}

/* gemma3: gemma2's attention scale and causal-only rule; Gemma3ForCausalLM caps the
 * logits with final_logit_softcapping (default null: none), but Gemma3Attention never
 * passes attn_logit_softcapping to its attention, so a cap there would be read two ways:
 * refused. */
static int read_gemma3_scales(const char *path, const json_t *root, ft_model_config *cfg,
                              ft_err *err)
{
    if (get_opt(root, "attn_logit_softcapping"))
        return ft_fail(err, "%s: 'attn_logit_softcapping' is set: transformers' Gemma 3 "
                       "attention does not apply it; only null is supported", path);
    if (read_gemma2_scales(path, root, cfg, err))
        return -1;
    cfg->attn_softcap = 0.0f;
    return read_softcap(path, root, "final_logit_softcapping", 0.0, &cfg->final_softcap, err);
}

/* The family's scalars and norm convention (see ft_model_config). */
static int read_family_scales(const char *path, const json_t *root, const model_defaults *md,
                              ft_model_config *cfg, ft_err *err)
{
    cfg->embed_scale = 1.0;
    cfg->embed_scale_round = false;
    cfg->residual_scale = 1.0f;
    cfg->attention_scale = 1.0f / sqrtf((float)cfg->head_dim);
    cfg->logits_scale = 1.0f;
    cfg->norm_w_offset = 0.0f;
    cfg->attn_softcap = cfg->final_softcap = 0.0f;
    if (md->family == FAM_GRANITE) {
        double emb, res, att, logit;
        if (read_multiplier(path, root, "embedding_multiplier", &emb, err) ||
            read_multiplier(path, root, "residual_multiplier", &res, err) ||
            read_multiplier(path, root, "attention_multiplier", &att, err) ||
            read_multiplier(path, root, "logits_scaling", &logit, err))
            return -1;
        /* the python floats meet fp32 tensors: torch rounds them to fp32 */
        cfg->embed_scale = (float)emb;
        cfg->residual_scale = (float)res;
        cfg->attention_scale = (float)att;
        cfg->logits_scale = (float)logit;
    } else if (md->family == FAM_GEMMA3) {
        if (read_gemma3_scales(path, root, cfg, err))
            return -1;
        cfg->embed_scale = sqrt((double)cfg->hidden_size);
        cfg->embed_scale_round = true;
        cfg->norm_w_offset = 1.0f;
    } else if (md->family == FAM_GEMMA || md->family == FAM_GEMMA2) {
        /* GemmaRotaryEmbedding (4.46) reads rope_theta only: a scaled RoPE in the file
         * would run unscaled there and scaled in later versions (Gemma 2 likewise). */
        if (cfg->rope_kind != FT_ROPE_DEFAULT)
            return ft_fail(err, "%s: 'rope_scaling': only the default rope type is supported "
                           "for %s", path, md->model_type);
        if (md->family == FAM_GEMMA2 && read_gemma2_scales(path, root, cfg, err))
            return -1;
        /* normalizer = torch.tensor(hidden_size ** 0.5, dtype=activation dtype) */
        cfg->embed_scale = sqrt((double)cfg->hidden_size);
        cfg->embed_scale_round = true;
        cfg->norm_w_offset = 1.0f;
    }
    return 0;
}

/* The expert count of a MoE config: num_local_experts, or its alias num_experts (both
 * mixtral's and qwen3_moe's config classes map one to the other; transformers 5 writes
 * num_local_experts); *experts keeps the family's default when both are absent. */
static int read_num_experts(const char *path, const json_t *root, int *experts, ft_err *err)
{
    json_t *v;
    int alias = 0;
    if ((v = get_opt(root, "num_local_experts")) &&
        read_int(path, "num_local_experts", v, 1, 1 << 16, experts, err))
        return -1;
    if ((v = get_opt(root, "num_experts"))) {
        if (read_int(path, "num_experts", v, 1, 1 << 16, &alias, err))
            return -1;
        if (get_opt(root, "num_local_experts") && alias != *experts)
            return ft_fail(err, "%s: 'num_experts' (%d) and 'num_local_experts' (%d) differ",
                           path, alias, *experts);
        *experts = alias;
    }
    return 0;
}

/* Which layers of a qwen2_moe / qwen3_moe model are sparse (their decoder layer's rule):
 * layer l is a sparse MoE block when l is not in mlp_only_layers ([]) and (l + 1) %
 * decoder_sparse_step (1) == 0, else a dense MLP of the config's intermediate_size
 * (cfg->dense_intermediate_size; bit l of cfg->dense_layers). Entries past the last
 * layer change nothing, as in transformers. */
static int read_sparse_layers(const char *path, const json_t *root, ft_model_config *cfg,
                              ft_err *err)
{
    json_t *v;
    int step = 1, L = cfg->num_layers;
    if ((v = get_opt(root, "decoder_sparse_step")) &&
        read_int(path, "decoder_sparse_step", v, 1, INT_MAX, &step, err))
        return -1;
    json_t *only = get_opt(root, "mlp_only_layers");
    if (only && !json_is_array(only))
        return ft_fail(err, "%s: 'mlp_only_layers' must be a list of layer indices, not %s",
                       path, json_kind(only));
    memset(cfg->dense_layers, 0, sizeof cfg->dense_layers);
    bool any = false;
    for (size_t i = 0; only && i < json_array_size(only); i++) {
        int l;
        if (read_int(path, "mlp_only_layers", json_array_get(only, i), 0, INT_MAX, &l, err))
            return -1;
        if (l >= L)
            continue;
        if (l >= FT_MAX_LAYER_TYPES)
            return ft_fail(err, "%s: 'mlp_only_layers' lists layer %d: dense layers are "
                           "supported in the first %d layers only", path, l, FT_MAX_LAYER_TYPES);
        cfg->dense_layers[l / 64] |= 1ull << (l % 64);
        any = true;
    }
    for (int l = 0; step > 1 && l < L; l++) {
        if ((l + 1) % step == 0)
            continue;
        if (l >= FT_MAX_LAYER_TYPES)
            return ft_fail(err, "%s: 'decoder_sparse_step' is %d: dense layers are supported "
                           "in the first %d layers only (the model has %d)", path, step,
                           FT_MAX_LAYER_TYPES, L);
        cfg->dense_layers[l / 64] |= 1ull << (l % 64);
        any = true;
    }
    cfg->dense_intermediate_size = any ? cfg->intermediate_size : 0;
    return 0;
}

/* The sparse MoE blocks of qwen3_moe (Qwen3MoeConfig) and qwen2_moe (Qwen2MoeConfig).
 *   qwen3_moe: num_experts (alias num_local_experts) 128, num_experts_per_tok 8,
 *     moe_intermediate_size 768;
 *   qwen2_moe: num_experts 60 (no alias), num_experts_per_tok 4, moe_intermediate_size
 *     1408, and the shared expert: a SwiGLU MLP of shared_expert_intermediate_size (5632),
 *     mlp.shared_expert.{gate,up,down}_proj, whose output is multiplied by
 *     sigmoid(mlp.shared_expert_gate(x)) (a [1, hidden] linear layer) and added to the
 *     routed experts' (cfg->shared_expert_size);
 * both: norm_topk_prob false (the top-k softmax weights as they are), output_router_logits
 * false, router_aux_loss_coef 0.001, dense layers as read_sparse_layers says.
 * cfg->intermediate_size holds the experts' width (what moe.c and the memory plan read).
 * Module names: mlp.gate (router), mlp.experts.E.gate_proj, up_proj, down_proj. */
static int read_qwen_moe(const char *path, const json_t *root, const model_defaults *md,
                         ft_model_config *cfg, ft_err *err)
{
    json_t *v;
    bool qwen2 = md->family == FAM_QWEN2_MOE;
    int experts = qwen2 ? 60 : 128, k = qwen2 ? 4 : 8, width = qwen2 ? 1408 : 768;
    int shared = qwen2 ? 5632 : 0;
    if (qwen2) {
        if ((v = get_opt(root, "num_experts")) &&
            read_int(path, "num_experts", v, 1, 1 << 16, &experts, err))
            return -1;
    } else if (read_num_experts(path, root, &experts, err)) {
        return -1;
    }
    int kmax = experts < FT_MAX_EXPERTS_PER_TOK ? experts : FT_MAX_EXPERTS_PER_TOK;
    if ((v = get_opt(root, "num_experts_per_tok")) &&
        read_int(path, "num_experts_per_tok", v, 1, kmax, &k, err))
        return -1;
    if ((v = get_opt(root, "moe_intermediate_size")) &&
        read_dim(path, "moe_intermediate_size", v, &width, err))
        return -1;
    if (qwen2 && (v = get_opt(root, "shared_expert_intermediate_size")) &&
        read_dim(path, "shared_expert_intermediate_size", v, &shared, err))
        return -1;
    bool norm_topk = false, out_logits = false;
    if ((v = get_opt(root, "norm_topk_prob")) &&
        read_bool(path, "norm_topk_prob", v, &norm_topk, err))
        return -1;
    if ((v = get_opt(root, "output_router_logits")) &&
        read_bool(path, "output_router_logits", v, &out_logits, err))
        return -1;
    double coef = 0.001;
    if ((v = get_opt(root, "router_aux_loss_coef")) &&
        read_number(path, "router_aux_loss_coef", v, &coef, err))
        return -1;
    if (read_sparse_layers(path, root, cfg, err))
        return -1;
    cfg->num_experts = experts;
    cfg->experts_per_tok = k;
    cfg->norm_topk_prob = norm_topk;
    cfg->output_router_logits = out_logits;
    cfg->router_aux_loss_coef = (float)coef;
    cfg->intermediate_size = width;
    cfg->shared_expert_size = shared;
    cfg->moe_lora_plain = qwen2;
    snprintf(cfg->moe_name, sizeof cfg->moe_name, "mlp");
    snprintf(cfg->expert_proj[0], sizeof cfg->expert_proj[0], "gate_proj");
    snprintf(cfg->expert_proj[1], sizeof cfg->expert_proj[1], "up_proj");
    snprintf(cfg->expert_proj[2], sizeof cfg->expert_proj[2], "down_proj");
    return 0;
}

/* The sparse MoE block of mixtral (MixtralConfig): num_local_experts (alias
 * num_experts) 8, num_experts_per_tok 2 (1 .. min(experts, FT_MAX_EXPERTS_PER_TOK)), the top-k
 * weights always renormalised, output_router_logits false, router_aux_loss_coef 0.001;
 * router_jitter_noise (multiplicative noise on the router input in training) must be 0.
 * Module names: block_sparse_moe.gate (router), block_sparse_moe.experts.E.w1 (gate),
 * w3 (up), w2 (down). Dense families keep num_experts 0. */
static int read_moe(const char *path, const json_t *root, const model_defaults *md,
                    ft_model_config *cfg, ft_err *err)
{
    json_t *v;
    if (md->family == FAM_QWEN3_MOE || md->family == FAM_QWEN2_MOE)
        return read_qwen_moe(path, root, md, cfg, err);
    if (md->family != FAM_MIXTRAL)
        return 0;
    int experts = 8;
    if (read_num_experts(path, root, &experts, err))
        return -1;
    int k = 2, kmax = experts < FT_MAX_EXPERTS_PER_TOK ? experts : FT_MAX_EXPERTS_PER_TOK;
    if ((v = get_opt(root, "num_experts_per_tok")) &&
        read_int(path, "num_experts_per_tok", v, 1, kmax, &k, err))
        return -1;
    bool out_logits = false;
    if ((v = get_opt(root, "output_router_logits")) &&
        read_bool(path, "output_router_logits", v, &out_logits, err))
        return -1;
    double coef = 0.001, jitter = 0.0;
    if ((v = get_opt(root, "router_aux_loss_coef")) &&
        read_number(path, "router_aux_loss_coef", v, &coef, err))
        return -1;
    if ((v = get_opt(root, "router_jitter_noise")) &&
        read_number(path, "router_jitter_noise", v, &jitter, err))
        return -1;
    if (jitter != 0.0)
        return ft_fail(err, "%s: 'router_jitter_noise' is %g: router jitter is not supported "
                       "(must be 0)", path, jitter);
    cfg->num_experts = experts;
    cfg->experts_per_tok = k;
    cfg->norm_topk_prob = true;
    cfg->output_router_logits = out_logits;
    cfg->router_aux_loss_coef = (float)coef;
    snprintf(cfg->moe_name, sizeof cfg->moe_name, "block_sparse_moe");
    snprintf(cfg->expert_proj[0], sizeof cfg->expert_proj[0], "w1");
    snprintf(cfg->expert_proj[1], sizeof cfg->expert_proj[1], "w3");
    snprintf(cfg->expert_proj[2], sizeof cfg->expert_proj[2], "w2");
    return 0;
}

static int parse_config(const char *path, const json_t *root, ft_model_config *cfg, ft_err *err)
{
    json_t *v;
    const model_defaults *md = find_model_type(path, root, err);
    if (!md)
        return -1;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", md->model_type);
    for (int i = 0; i < FT_NBRANCH_NORMS; i++)
        snprintf(cfg->norm_name[i], sizeof cfg->norm_name[i], "%s", md->norms[i]);
    cfg->qk_norm = md->qk_norm;

    if (check_architectures(path, root, err) || check_foreign_keys(path, root, md, err))
        return -1;

    if (read_required_dim(path, root, "vocab_size", &cfg->vocab_size, err) ||
        read_required_dim(path, root, "hidden_size", &cfg->hidden_size, err) ||
        read_required_dim(path, root, "intermediate_size", &cfg->intermediate_size, err) ||
        read_required_dim(path, root, "num_hidden_layers", &cfg->num_layers, err) ||
        read_heads(path, root, md, cfg, err))
        return -1;

    if (read_activation(path, root, md, cfg, err) || read_phi3_dropouts(path, root, md, err))
        return -1;
    cfg->fused_proj = md->family == FAM_PHI3;

    cfg->max_position_embeddings = md->max_position_embeddings;
    if ((v = json_object_get(root, "max_position_embeddings")) &&
        read_int(path, "max_position_embeddings", v, 1, INT_MAX, &cfg->max_position_embeddings,
                 err))
        return -1;

    double eps = md->rms_norm_eps_if_absent;
    if ((v = json_object_get(root, "rms_norm_eps")) &&
        read_positive(path, "rms_norm_eps", v, &eps, err))
        return -1;
    cfg->rms_norm_eps = (float)eps;

    cfg->tie_word_embeddings = md->tie_if_absent;
    if ((v = json_object_get(root, "tie_word_embeddings")) &&
        read_bool(path, "tie_word_embeddings", v, &cfg->tie_word_embeddings, err))
        return -1;

    if (read_rope(path, root, md, cfg, err) || read_nope_layers(path, root, md, cfg, err) ||
        read_attention_options(path, root, md, cfg, err) ||
        check_layer_types(path, root, cfg, err) || read_family_scales(path, root, md, cfg, err) ||
        read_moe(path, root, md, cfg, err))
        return -1;

    if (read_token_id(path, "bos_token_id", json_object_get(root, "bos_token_id"),
                      cfg->vocab_size, &cfg->bos_token_id, err) ||
        read_token_id(path, "pad_token_id", json_object_get(root, "pad_token_id"),
                      cfg->vocab_size, &cfg->pad_token_id, err) ||
        read_eos(path, root, cfg, err))
        return -1;
    cfg->embed_padding_idx = cfg->pad_token_id;
    if (!json_object_get(root, "pad_token_id")) {
        int pad = pad_token_default(md->family);
        cfg->embed_padding_idx = pad < cfg->vocab_size ? pad : -1;
    }

    return read_dtype(path, root, cfg, err);
}

int ft_layer_window(const ft_model_config *cfg, int l)
{
    if (l >= 0 && l < FT_MAX_LAYER_TYPES && cfg->layer_full_attention[l])
        return 0;
    return cfg->sliding_window;
}

/* Sets key in obj to a copy of src's value when src has it (and drops it from obj
 * otherwise, with drop). */
static int copy_key(json_t *obj, const json_t *src, const char *key, bool drop)
{
    json_t *v = json_object_get(src, key);
    if (v)
        return json_object_set(obj, key, v);
    if (drop)
        json_object_del(obj, key);
    return 0;
}

/* Gemma3TextConfig's defaults for the sizes its configs may leave out (the text_config of
 * google/gemma-3-27b-it has no vocab_size), set in obj where absent. */
static int gemma3_size_defaults(json_t *obj)
{
    static const struct {
        const char *key;
        int value;
    } sizes[] = {{"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216},
                 {"num_hidden_layers", 26}, {"num_attention_heads", 8}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!json_object_get(obj, sizes[i].key) &&
            json_object_set_new(obj, sizes[i].key, json_integer(sizes[i].value)))
            return -1;
    return 0;
}

/* A multimodal gemma3 config (Gemma3Config): the text model is its text_config (a
 * Gemma3TextConfig; absent: every default), read as gemma3_text, with what
 * Gemma3ForConditionalGeneration takes from the top level instead: tie_word_embeddings
 * (default true), the dtype and quantization_config, and the bos and eos ids the
 * text_config does not give. Gemma3ForConditionalGeneration does not cap its logits, so a
 * final_logit_softcapping in text_config is refused rather than read two ways. The
 * checkpoint keeps the text model under language_model. (see ckpt_prefix). */
static int parse_gemma3_multimodal(const char *path, const json_t *root, ft_model_config *cfg,
                                   ft_err *err)
{
    json_t *v = get_opt(root, "architectures");
    if (v) {
        bool ok = false;
        size_t i;
        json_t *e;
        if (!json_is_array(v))
            return ft_fail(err, "%s: 'architectures': expected an array, got %s", path,
                           json_kind(v));
        json_array_foreach(v, i, e) {
            const char *a = json_string_value(e);
            ok |= a && strcmp(a, "Gemma3ForConditionalGeneration") == 0;
        }
        if (!ok)
            return ft_fail(err, "%s: 'architectures': a gemma3 config must name "
                           "Gemma3ForConditionalGeneration", path);
    }
    json_t *tc = get_opt(root, "text_config");
    if (tc && !json_is_object(tc))
        return ft_fail(err, "%s: 'text_config': expected an object, got %s", path,
                       json_kind(tc));
    const char *type = "gemma3_text";
    if (tc && (v = get_opt(tc, "model_type")) &&
        (read_string(path, "text_config.model_type", v, &type, err) ||
         (strcmp(type, "gemma3_text") != 0 &&
          ft_fail(err, "%s: 'text_config.model_type': '%.64s' (only gemma3_text is "
                  "supported inside a gemma3 config)", path, type))))
        return -1;
    json_t *text = tc ? json_deep_copy(tc) : json_object();
    int rc = text ? 0 : ft_fail(err, "%s: out of memory", path);
    if (rc == 0 && (json_object_set_new(text, "model_type", json_string("gemma3_text")) ||
                    gemma3_size_defaults(text) || copy_key(text, root, "dtype", true) ||
                    copy_key(text, root, "torch_dtype", true) ||
                    copy_key(text, root, "quantization_config", true)))
        rc = ft_fail(err, "%s: out of memory", path);
    json_object_del(text, "architectures");
    json_object_del(text, "tie_word_embeddings");
    if (rc == 0 && (v = json_object_get(root, "tie_word_embeddings")) &&
        json_object_set(text, "tie_word_embeddings", v))
        rc = ft_fail(err, "%s: out of memory", path);
    /* not pad_token_id: the text model's embedding takes text_config's own (default 0)
     * as its padding_idx, whatever the top level says */
    static const char *const ids[] = {"bos_token_id", "eos_token_id"};
    for (size_t i = 0; i < 2 && rc == 0; i++)
        if (!json_object_get(text, ids[i]) && copy_key(text, root, ids[i], false))
            rc = ft_fail(err, "%s: out of memory", path);
    char tpath[4200];
    snprintf(tpath, sizeof tpath, "%s (text_config)", path);
    if (rc == 0)
        rc = parse_config(tpath, text, cfg, err);
    json_decref(text);
    if (rc)
        return -1;
    if (cfg->final_softcap != 0)
        return ft_fail(err, "%s: 'text_config.final_logit_softcapping' is set: "
                       "Gemma3ForConditionalGeneration does not apply it; only null is "
                       "supported", path);
    snprintf(cfg->model_type, sizeof cfg->model_type, "gemma3");
    snprintf(cfg->ckpt_prefix, sizeof cfg->ckpt_prefix, "language_model.");
    snprintf(cfg->module_prefix, sizeof cfg->module_prefix, "model.language_model.");
    cfg->multimodal = true;
    return 0;
}

/* The top-level object: a gemma3 config's text model, a gemma3_text config with its
 * sizes' defaults filled in, or any other family's config as it is. */
static int parse_top(const char *path, const json_t *root, ft_model_config *cfg, ft_err *err)
{
    const char *type = json_string_value(json_object_get(root, "model_type"));
    if (type && strcmp(type, "gemma3") == 0)
        return parse_gemma3_multimodal(path, root, cfg, err);
    if (!type || strcmp(type, "gemma3_text") != 0)
        return parse_config(path, root, cfg, err);
    json_t *copy = json_deep_copy(root);
    int rc = copy && gemma3_size_defaults(copy) == 0 ? parse_config(path, copy, cfg, err)
                                                     : ft_fail(err, "%s: out of memory", path);
    json_decref(copy);
    return rc;
}

int ft_model_config_load(ft_model_config *cfg, const char *path, ft_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    json_t *root = ft_json_read_file(path, 0, err);
    if (!root)
        return -1;
    int rc;
    snprintf(cfg->module_prefix, sizeof cfg->module_prefix, "model.");
    if (!json_is_object(root))
        rc = ft_fail(err, "%s: expected a JSON object at the top level, got %s", path,
                     json_kind(root));
    else
        rc = parse_top(path, root, cfg, err);
    json_decref(root);
    if (rc == 0)
        rc = ft_quant_config_read(path, &cfg->quant, err);
    return rc;
}

/* transformers computes, in float32 tensors:
 *   inv_freq = 1.0 / (base ** (arange(0, d, 2).float() / d))
 * The python float base meets a float32 tensor, so the power is taken in float32 with base
 * rounded to float32, and the exponent is the float32 quotient 2i / d. `scalar / tensor` is
 * tensor.reciprocal() * scalar in torch, which the llama3 branch mirrors step by step.
 * glibc's powf is correctly rounded here; torch's vectorized CPU pow (SLEEF, 1 ulp) is not
 * always, so about 1 value in 200 differs from torch by 1 ulp (checked against torch 1.13
 * over thetas 1e4..1e7, head_dim 32..256, default/linear/llama3: all others bit-equal). */
static float default_inv_freq(float base, int i, int d)
{
    return 1.0f / powf(base, (float)(2 * i) / (float)d);
}

/* _compute_llama3_parameters: keep high frequencies, divide low ones by factor, blend in
 * between. Each line is one float32 tensor op of the reference. */
static float llama3_inv_freq(const ft_model_config *cfg, float inv)
{
    const float factor = cfg->rope_factor;
    const float low = cfg->rope_low_freq_factor, high = cfg->rope_high_freq_factor;
    const double old_len = (double)cfg->rope_original_max_position;
    /* The thresholds are python floats (double), compared against a float32 tensor. */
    const float low_freq_wavelen = (float)(old_len / low);
    const float high_freq_wavelen = (float)(old_len / high);

    float wavelen = (1.0f / inv) * (float)(2.0 * M_PI);
    float scaled = wavelen > low_freq_wavelen ? inv / factor : inv;
    if (wavelen < high_freq_wavelen || wavelen > low_freq_wavelen)
        return scaled;
    float smooth = ((1.0f / wavelen) * (float)old_len - low) / (float)((double)high - low);
    return (1.0f - smooth) * scaled / factor + smooth * scaled;
}

/* _compute_yarn_parameters: each line one float32 tensor op of the reference (the ramp's
 * python bounds meet a float32 arange). */
static float yarn_inv_freq(const ft_model_config *cfg, int i)
{
    const int d = cfg->rotary_dim;
    const float pos = powf((float)cfg->rope_theta, (float)(2 * i) / (float)d);
    const float extrapolation = 1.0f / pos;
    const float interpolation = 1.0f / (cfg->rope_factor * pos);
    float ramp = ((float)i - (float)cfg->rope_yarn_low) /
                 (float)(cfg->rope_yarn_high - cfg->rope_yarn_low);
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    const float extrapolation_factor = 1.0f - ramp;
    return interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
}

/* _compute_longrope_parameters: 1.0 / (ext_factors * base ** (arange(0, d, 2).float() / d)),
 * each an fp32 tensor op. */
static void longrope_inv_freq(const ft_model_config *cfg, const float *ext, float *inv_freq)
{
    const int d = cfg->rotary_dim;
    const float base = (float)cfg->rope_theta;
    for (int i = 0; i < d / 2; i++)
        inv_freq[i] = 1.0f / (ext[i] * powf(base, (float)(2 * i) / (float)d));
}

void ft_rope_inv_freq(const ft_model_config *cfg, float *inv_freq)
{
    const int d = cfg->rotary_dim;
    const float base = (float)cfg->rope_theta;
    if (cfg->rope_kind == FT_ROPE_LONGROPE) {
        longrope_inv_freq(cfg, cfg->rope_short_factor, inv_freq);
        return;
    }
    for (int i = 0; i < d / 2; i++) {
        float inv = default_inv_freq(base, i, d);
        switch (cfg->rope_kind) {
        case FT_ROPE_DEFAULT:
        case FT_ROPE_LONGROPE: break;
        case FT_ROPE_LINEAR: inv /= cfg->rope_factor; break;
        case FT_ROPE_LLAMA3: inv = llama3_inv_freq(cfg, inv); break;
        case FT_ROPE_YARN: inv = yarn_inv_freq(cfg, i); break;
        }
        inv_freq[i] = inv;
    }
}

void ft_rope_inv_freq_long(const ft_model_config *cfg, float *inv_freq)
{
    if (cfg->rope_kind == FT_ROPE_LONGROPE)
        longrope_inv_freq(cfg, cfg->rope_long_factor, inv_freq);
    else
        ft_rope_inv_freq(cfg, inv_freq);
}

void ft_rope_inv_freq_local(const ft_model_config *cfg, float *inv_freq)
{
    for (int i = 0; i < cfg->rotary_dim / 2; i++)
        inv_freq[i] = default_inv_freq((float)cfg->rope_local_theta, i, cfg->rotary_dim);
}

bool ft_layer_rope_local(const ft_model_config *cfg, int layer)
{
    return cfg->rope_local_theta > 0 && ft_layer_window(cfg, layer) > 0;
}

bool ft_rope_uses_long(const ft_model_config *cfg, long max_pos)
{
    return cfg->rope_kind == FT_ROPE_LONGROPE && max_pos + 1 > cfg->rope_original_max_position;
}

bool ft_layer_sparse(const ft_model_config *cfg, int l)
{
    if (cfg->num_experts == 0)
        return false;
    return l >= FT_MAX_LAYER_TYPES || !(cfg->dense_layers[l / 64] & (1ull << (l % 64)));
}

int ft_layer_mlp_width(const ft_model_config *cfg, int l)
{
    if (cfg->num_experts == 0)
        return cfg->intermediate_size;
    return ft_layer_sparse(cfg, l) ? cfg->shared_expert_size : cfg->dense_intermediate_size;
}

unsigned ft_layer_projections(const ft_model_config *cfg, int l)
{
    unsigned mlp = (1u << FT_PROJ_GATE) | (1u << FT_PROJ_UP) | (1u << FT_PROJ_DOWN);
    unsigned projs = ft_block_projections(cfg);
    if (cfg->num_experts > 0 && ft_layer_mlp_width(cfg, l) > 0)
        projs |= mlp;
    if (cfg->shared_expert_size > 0 && ft_layer_sparse(cfg, l))
        projs |= 1u << FT_PROJ_SHGATE;
    return projs;
}

unsigned ft_layer_lora_projections(const ft_model_config *cfg, int l)
{
    if (cfg->num_experts > 0 && !cfg->moe_lora_plain)
        return ft_block_projections(cfg);
    return ft_layer_projections(cfg, l);
}

unsigned ft_lora_projections(const ft_model_config *cfg)
{
    unsigned u = 0;
    for (int l = 0; l < cfg->num_layers; l++)
        u |= ft_layer_lora_projections(cfg, l);
    return u;
}

const char *ft_layer_proj_path(const ft_model_config *cfg, int l, ft_proj p)
{
    static const char *const shared[] = {"mlp.shared_expert.gate_proj",
                                         "mlp.shared_expert.up_proj",
                                         "mlp.shared_expert.down_proj"};
    if (ft_layer_sparse(cfg, l) && p >= FT_PROJ_GATE && p <= FT_PROJ_DOWN)
        return shared[p - FT_PROJ_GATE];
    return ft_proj_path(p);
}

void ft_layer_proj_dims(const ft_model_config *cfg, int l, ft_proj p, int *in, int *out)
{
    ft_proj_dims(cfg, p, in, out);
    int w = ft_layer_mlp_width(cfg, l);
    if (p == FT_PROJ_GATE || p == FT_PROJ_UP)
        *out = w;
    else if (p == FT_PROJ_DOWN)
        *in = w;
}

int ft_max_mlp_width(const ft_model_config *cfg, int l0, int l1)
{
    int w = 0;
    for (int l = l0; l < l1; l++)
        if (ft_layer_mlp_width(cfg, l) > w)
            w = ft_layer_mlp_width(cfg, l);
    return w;
}

unsigned ft_block_projections(const ft_model_config *cfg)
{
    unsigned o = 1u << FT_PROJ_O, down = 1u << FT_PROJ_DOWN;
    if (cfg->num_experts > 0) /* the MLP is the MoE block: experts, not these modules */
        return (1u << FT_PROJ_Q) | (1u << FT_PROJ_K) | (1u << FT_PROJ_V) | o;
    if (cfg->fused_proj)
        return (1u << FT_PROJ_QKV) | o | (1u << FT_PROJ_GATE_UP) | down;
    return (1u << FT_PROJ_Q) | (1u << FT_PROJ_K) | (1u << FT_PROJ_V) | o |
           (1u << FT_PROJ_GATE) | (1u << FT_PROJ_UP) | down;
}

void ft_proj_dims(const ft_model_config *c, ft_proj p, int *in, int *out)
{
    int q = c->num_heads * c->head_dim, kv = c->num_kv_heads * c->head_dim;
    switch (p) {
    case FT_PROJ_Q: *in = c->hidden_size; *out = q; break;
    case FT_PROJ_K:
    case FT_PROJ_V: *in = c->hidden_size; *out = kv; break;
    case FT_PROJ_O: *in = q; *out = c->hidden_size; break;
    case FT_PROJ_GATE:
    case FT_PROJ_UP: *in = c->hidden_size; *out = c->intermediate_size; break;
    case FT_PROJ_QKV: *in = c->hidden_size; *out = q + 2 * kv; break;
    case FT_PROJ_GATE_UP: *in = c->hidden_size; *out = 2 * c->intermediate_size; break;
    case FT_PROJ_SHGATE: *in = c->hidden_size; *out = 1; break;
    default: *in = c->intermediate_size; *out = c->hidden_size; break;
    }
}

ft_proj ft_proj_module(const ft_model_config *c, ft_proj p, int *row0)
{
    int q = c->num_heads * c->head_dim, kv = c->num_kv_heads * c->head_dim;
    *row0 = 0;
    if (!c->fused_proj)
        return p;
    switch (p) {
    case FT_PROJ_Q: return FT_PROJ_QKV;
    case FT_PROJ_K: *row0 = q; return FT_PROJ_QKV;
    case FT_PROJ_V: *row0 = q + kv; return FT_PROJ_QKV;
    case FT_PROJ_GATE: return FT_PROJ_GATE_UP;
    case FT_PROJ_UP: *row0 = c->intermediate_size; return FT_PROJ_GATE_UP;
    default: return p;
    }
}

int ft_read_model_config_json(const char *dir, json_t **out, ft_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *root = ft_json_read_file(path, 0, err);
    if (!root && errno == ENOENT)
        return ft_fail(err, "%s: cannot read: %s (is %s a Hugging Face model dir?)", path,
                       strerror(ENOENT), dir);
    if (!root)
        return -1;
    if (!json_is_object(root)) {
        json_decref(root);
        return ft_fail(err, "%s: not a JSON object", path);
    }
    *out = root;
    return 0;
}

int ft_write_model_config(json_t *cfg, const char *dir, const char *torch_dtype, ft_err *err)
{
    /* both names: transformers 4 reads only torch_dtype, 5 reads dtype first */
    if (torch_dtype && (json_object_set_new(cfg, "torch_dtype", json_string(torch_dtype)) ||
                        json_object_set_new(cfg, "dtype", json_string(torch_dtype))))
        return ft_fail(err, "%s: out of memory writing config.json", dir);
    char *text = json_dumps(cfg, JSON_INDENT(2));
    if (!text)
        return ft_fail(err, "%s: out of memory writing config.json", dir);
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = ft_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}
