/* Hugging Face config.json for the decoder families: llama (incl. TinyLlama, SmolLM
 * and Llama 3 "llama3" rope scaling), mistral, qwen2, qwen3, granite, gemma, gemma2,
 * gemma3_text (and the text model of a multimodal gemma3 checkpoint), olmo2, phi3 (Phi-3,
 * Phi-4; "longrope" scaling, partial rotary), smollm3 (layers without RoPE), and the
 * mixture-of-experts mixtral and qwen3_moe.
 * Every field that changes the math is honoured or rejected with an error naming the file
 * and key; nothing is silently ignored. */
#ifndef FT_HF_CONFIG_H
#define FT_HF_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/ft_error.h"
#include "formats/lora.h"
#include "formats/quant_io.h"

typedef enum ft_rope_kind {
    FT_ROPE_DEFAULT = 0,
    FT_ROPE_LINEAR, /* positions / factor (inv_freq / factor) */
    FT_ROPE_LLAMA3,
    FT_ROPE_LONGROPE, /* phi3: per-frequency short/long factors, cos/sin scaled */
    FT_ROPE_YARN      /* YaRN: interpolated and extrapolated frequencies blended by a
                       * ramp over [rope_yarn_low, rope_yarn_high], cos/sin scaled */
} ft_rope_kind;

#define FT_MAX_EOS 8
/* The most RoPE frequencies (rotary_dim / 2) a longrope config may list. */
#define FT_MAX_ROPE_FREQS 512
/* The most layers a per-layer RoPE list (smollm3's no_rope_layers) may describe. */
#define FT_MAX_NOPE_LAYERS 1024
/* The most layers a config with per-layer attention types (layer_types) may have. */
#define FT_MAX_LAYER_TYPES 1024
/* The most experts a MoE config may route a token to (kernels/ops.h's FT_MOE_MAX_K). */
#define FT_MAX_EXPERTS_PER_TOK 64

/* The MLP's gate activation: act(gate(x)) * up(x). */
typedef enum ft_mlp_act {
    FT_ACT_SILU = 0,  /* SwiGLU (llama, mistral, qwen2, granite) */
    FT_ACT_GELU_TANH  /* GeGLU with gelu's tanh approximation (gemma) */
} ft_mlp_act;

/* The RMSNorms around a decoder layer's two branches (attention, MLP). A branch may have
 * a norm on its input (pre), on its output before the residual add (post), or both:
 *   h += post(branch(pre(h)))
 * (a missing norm is the identity). */
typedef enum ft_branch_norm {
    FT_NORM_ATTN_PRE = 0, /* llama input_layernorm */
    FT_NORM_ATTN_POST,    /* olmo2 post_attention_layernorm */
    FT_NORM_MLP_PRE,      /* llama post_attention_layernorm */
    FT_NORM_MLP_POST,     /* olmo2 post_feedforward_layernorm */
    FT_NBRANCH_NORMS
} ft_branch_norm;

/* RMSNorm of the attention's q and k projections, before RoPE. */
typedef enum ft_qk_norm {
    FT_QK_NORM_NONE = 0,
    FT_QK_NORM_HEAD, /* over each head's head_dim, one weight [head_dim] shared by the heads
                      * (qwen3) */
    FT_QK_NORM_PROJ  /* over the whole projection: q's [num_heads * head_dim], k's
                      * [num_kv_heads * head_dim] (olmo2) */
} ft_qk_norm;

typedef struct ft_model_config {
    char model_type[32]; /* "llama", "mistral", "qwen2", "qwen3", "granite", "gemma",
                          * "gemma2", "gemma3_text", "gemma3" (multimodal: its text
                          * model), "olmo2", "phi3", "smollm3", "mixtral",
                          * "qwen3_moe", "qwen2_moe" */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_layers;
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int max_position_embeddings;
    float rms_norm_eps;
    double rope_theta;
    ft_rope_kind rope_kind;
    float rope_factor;
    float rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position;
    /* RoPE rotates the first rotary_dim dims of each head (head_dim * partial_rotary_factor,
     * even); the rest pass through. */
    int rotary_dim;
    /* longrope: inv_freq[i] = 1 / (factor[i] * theta^(2i/rotary_dim)), with the long
     * factors when a forward's largest position + 1 exceeds rope_original_max_position,
     * else the short ones (transformers' dynamic update); cos and sin are multiplied by
     * rope_attention_factor (1 for the other kinds). */
    float rope_short_factor[FT_MAX_ROPE_FREQS], rope_long_factor[FT_MAX_ROPE_FREQS];
    float rope_attention_factor;
    /* yarn: frequency i is the default one up to the ramp (i <= low: the short
     * wavelengths, extrapolated) and the default one / rope_factor after it (i >= high:
     * the long wavelengths, interpolated), a linear blend in between. [low, high] is
     * transformers' correction range, truncated and clamped (rope_yarn_high already moved
     * off rope_yarn_low where they met). cos and sin are multiplied by
     * rope_attention_factor (YaRN's mscale). */
    double rope_yarn_low, rope_yarn_high;
    /* 0, or the sliding layers (ft_layer_window > 0) rotate with default RoPE at this base
     * while the full-attention layers take rope_theta and the scaling above (gemma3's
     * local and global RoPE: rope_local_base_freq or rope_parameters.sliding_attention).
     * Read it with ft_layer_rope_local. */
    double rope_local_theta;
    /* Bit l set: layer l applies no RoPE (NoPE: q and k enter attention unrotated;
     * smollm3's no_rope_layers[l] == 0). Read it with ft_layer_uses_rope. */
    uint64_t nope_layers[FT_MAX_NOPE_LAYERS / 64];
    bool tie_word_embeddings;
    bool qkv_bias; /* bias on q, k, v projections (attention_bias, or qwen2) */
    bool o_bias;   /* bias on o_proj (attention_bias) */
    bool mlp_bias; /* bias on gate, up, down (llama mlp_bias) */
    int sliding_window; /* 0 = full causal attention; else the window of the sliding
                         * layers (every layer but those of layer_full_attention) */
    /* layers that attend fully although sliding_window > 0 (gemma2's alternating layers,
     * config layer_types); read it through ft_layer_window */
    bool layer_full_attention[FT_MAX_LAYER_TYPES];
    int bos_token_id;   /* -1 if absent */
    int eos_token_ids[FT_MAX_EOS];
    int n_eos;
    int pad_token_id; /* -1 if absent */
    /* The row of embed_tokens that gets no gradient: transformers builds the embedding as
     * nn.Embedding(..., padding_idx=config.pad_token_id), with the config class's default
     * pad_token_id when config.json has none (gemma* 0, olmo2 1, phi3 32000, smollm3
     * 128004); -1: none (null, or a default outside the vocabulary) */
    int embed_padding_idx;
    char torch_dtype[16]; /* "float32", "bfloat16", "float16" or "" */
    /* The family's block description (a family is data: one forward reads these).
     *   embed_scale        h0 = embed(ids) * embed_scale (granite embedding_multiplier;
     *                      gemma sqrt(hidden_size), which the model rounds to its
     *                      activation dtype as transformers does: embed_scale_round)
     *   residual_scale     h += branch * residual_scale, for both branches (granite
     *                      residual_multiplier)
     *   attention_scale    the softmax scale: 1/sqrt(head_dim), or granite's
     *                      attention_multiplier
     *   logits_scale       logits = lm_head(h) / logits_scale (granite logits_scaling)
     *   norm_w_offset      RMSNorm out = norm(x) * (norm_w_offset + w): 0, or 1 for gemma
     *                      and gemma2 (their weights are stored as offsets from 1)
     *   mlp_act            the MLP gate's activation
     *   fused_proj         the checkpoint holds q, k, v as one self_attn.qkv_proj weight
     *                      (rows [q; k; v]) and gate, up as one mlp.gate_up_proj (rows
     *                      [gate; up]), and LoRA targets those modules (phi3)
     *   norm_name          each branch norm's module name in the layer, as the family's
     *                      checkpoints name it (model.layers.N.<name>.weight), "" where the
     *                      branch has no such norm: llama input_layernorm (attention pre)
     *                      and post_attention_layernorm (MLP pre); olmo2
     *                      post_attention_layernorm (attention post) and
     *                      post_feedforward_layernorm (MLP post); gemma2 all four:
     *                      input_layernorm, post_attention_layernorm,
     *                      pre_feedforward_layernorm, post_feedforward_layernorm
     *   qk_norm            q/k RMSNorm before RoPE (self_attn.q_norm, self_attn.k_norm):
     *                      none; per head (qwen3); over the whole projection (olmo2)
     *   attn_softcap       0, or the attention scores are capped: S = c tanh(S / c) after
     *                      the scale, before mask and softmax (gemma2
     *                      attn_logit_softcapping)
     *   final_softcap      0, or the logits are capped: c tanh(logits / c) (gemma2
     *                      final_logit_softcapping)
     * gemma2's attention scale is query_pre_attn_scalar^-0.5 (attention_scale). */
    double embed_scale;
    bool embed_scale_round;
    float residual_scale;
    float attention_scale;
    float logits_scale;
    float norm_w_offset;
    ft_mlp_act mlp_act;
    bool fused_proj;
    float attn_softcap;
    float final_softcap;
    char norm_name[FT_NBRANCH_NORMS][32];
    ft_qk_norm qk_norm;
    /* The names of the text model's weights. A causal LM's checkpoint holds
     * model.embed_tokens.weight, model.layers.N.<module>.weight, model.norm.weight and
     * lm_head.weight (ckpt_prefix ""); a multimodal gemma3 checkpoint (multimodal,
     * model_type "gemma3": Gemma3ForConditionalGeneration) holds them under
     * ckpt_prefix "language_model." as transformers writes it (language_model.model.*,
     * language_model.lm_head.weight), beside the vision tower and projector
     * (vision_tower.*, multi_modal_projector.*), which the model does not read and ft-merge
     * carries through unchanged. module_prefix is the decoder's module path in the
     * loaded transformers model, which PEFT's adapter keys
     * (base_model.model.<module_prefix>layers.N.self_attn.q_proj.lora_A.weight) and
     * target regexes name: "model." or "model.language_model.". */
    char ckpt_prefix[32];
    char module_prefix[32];
    bool multimodal;
    /* Mixture of experts (mixtral, qwen3_moe, qwen2_moe): num_experts > 0 makes each sparse
     * layer's MLP (ft_layer_sparse) a sparse MoE block (ops.h's mixture-of-experts
     * section): the router <moe_name>.gate [num_experts, hidden] scores each token, its top
     * experts_per_tok of the softmax are kept (renormalised to sum 1 when norm_topk_prob)
     * and weight the outputs of those experts' SwiGLU MLPs, expert e's modules
     * <moe_name>.experts.e.<expert_proj[0..2]> (gate [I, C], up [I, C], down [C, I];
     * mixtral: w1, w3, w2; qwen3_moe and qwen2_moe: moe_name mlp, gate_proj, up_proj,
     * down_proj, and I = intermediate_size holds their moe_intermediate_size). qwen2_moe
     * adds a shared expert to each sparse block: a SwiGLU MLP of width shared_expert_size
     * (mlp.shared_expert.{gate,up,down}_proj, the layer's gate, up, down projections),
     * its output times sigmoid(x G^T), G = mlp.shared_expert_gate.weight [1, C]. The
     * qwen models' dense layers (mlp_only_layers, decoder_sparse_step: bit l of
     * dense_layers) have a plain MLP of dense_intermediate_size (mlp.{gate,up,down}_proj).
     * ft_layer_mlp_width, ft_layer_projections and ft_layer_proj_path describe each
     * layer's plain MLP. With output_router_logits the loss gains router_aux_loss_coef
     * times transformers' load_balancing_loss_func over the sparse layers, the batch's
     * padding left out as transformers does given the attention_mask (its value:
     * ft_model_aux_loss). num_experts 0: the dense MLP of intermediate_size.
     * ft_block_projections then lists attention only (the LoRA modules of a MoE block:
     * PEFT on transformers 5 maps the MLP names to the experts). */
    int num_experts;
    int experts_per_tok;
    bool norm_topk_prob;
    bool output_router_logits;
    float router_aux_loss_coef;
    char moe_name[24];
    char expert_proj[3][16];
    int shared_expert_size;      /* 0: no shared expert */
    /* LoRA: PEFT on transformers 5 converts a mixtral or qwen3_moe adapter's MLP module
     * names (w1, w3, w2; gate_proj, up_proj, down_proj; gate) and all-linear to the router
     * and the fused experts (target_parameters); qwen2_moe has no such conversion there,
     * so those names, all-linear included, stay on its linear layers (the shared expert,
     * its gate, the dense layers' MLPs): moe_lora_plain, ft_layer_lora_projections. An
     * adapter's explicit target_parameters still reach its router and experts. */
    bool moe_lora_plain;
    int dense_intermediate_size; /* the dense layers' MLP width (0: every layer sparse) */
    uint64_t dense_layers[FT_MAX_LAYER_TYPES / 64];
    /* "quantization_config": the checkpoint holds bitsandbytes 4/8-bit weights
     * (present = false for a dense checkpoint) */
    ft_quant_config quant;
} ft_model_config;

/* The attention window of layer l (0-based): sliding_window, or 0 (full causal attention)
 * for a full-attention layer of a model with per-layer types. */
int ft_layer_window(const ft_model_config *cfg, int l);
/* Whether the layer has branch norm n (its name is set). */
static inline bool ft_has_branch_norm(const ft_model_config *cfg, ft_branch_norm n)
{
    return cfg->norm_name[n][0] != '\0';
}

/* Reads and validates path (a config.json). */
int ft_model_config_load(ft_model_config *cfg, const char *path, ft_err *err);

/* The RoPE inverse frequencies, [rotary_dim/2], as transformers computes them in fp32,
 * with the configured scaling applied (longrope: the short factors). */
void ft_rope_inv_freq(const ft_model_config *cfg, float *inv_freq);
/* longrope's long-context set, [rotary_dim/2]. */
void ft_rope_inv_freq_long(const ft_model_config *cfg, float *inv_freq);
/* Whether a forward whose largest position id is max_pos uses the long set: longrope and
 * max_pos + 1 > rope_original_max_position (transformers' longrope_frequency_update). */
bool ft_rope_uses_long(const ft_model_config *cfg, long max_pos);

/* gemma3's local RoPE: [rotary_dim/2] default frequencies at base rope_local_theta. */
void ft_rope_inv_freq_local(const ft_model_config *cfg, float *inv_freq);
/* Whether decoder layer l rotates with the local set (rope_local_theta > 0 and l is a
 * sliding layer). */
bool ft_layer_rope_local(const ft_model_config *cfg, int layer);

/* Whether decoder layer l rotates q and k (false for smollm3's NoPE layers). */
bool ft_layer_uses_rope(const ft_model_config *cfg, int layer);

/* The linear modules of the block (bitmask of 1u << ft_proj): q, k, v, o, gate, up,
 * down, or with fused_proj qkv, o, gate_up, down. */
unsigned ft_block_projections(const ft_model_config *cfg);
/* Layer l of a MoE model is a sparse MoE block (false for every layer of a dense
 * family). */
bool ft_layer_sparse(const ft_model_config *cfg, int l);
/* The width of layer l's plain SwiGLU MLP (gate, up, down projections): intermediate_size
 * for a dense family, a MoE model's dense layer's dense_intermediate_size, a sparse
 * layer's shared expert (shared_expert_size; 0: none). */
int ft_layer_mlp_width(const ft_model_config *cfg, int l);
/* The most of ft_layer_mlp_width over layers [l0, l1) (0 when none has an MLP). */
int ft_max_mlp_width(const ft_model_config *cfg, int l0, int l1);
/* The projections layer l holds weights for: ft_block_projections, plus gate, up, down
 * where a MoE layer has a plain MLP (a dense layer, a shared expert), and the shared
 * expert's gate (FT_PROJ_SHGATE, [1, hidden]) in a qwen2_moe sparse layer. */
unsigned ft_layer_projections(const ft_model_config *cfg, int l);
/* The modules of layer l a LoRA pair can sit on (bitmask of 1u << ft_proj): the
 * attention's for mixtral and qwen3_moe (their MLP names reach the experts instead:
 * moe_lora_plain), else ft_layer_projections. ft_lora_projections: their union over the
 * layers. */
unsigned ft_layer_lora_projections(const ft_model_config *cfg, int l);
unsigned ft_lora_projections(const ft_model_config *cfg);
/* The module path of p in layer l (below "model.layers.N."): ft_proj_path, or for a
 * sparse layer's shared expert "mlp.shared_expert.gate_proj", ... */
const char *ft_layer_proj_path(const ft_model_config *cfg, int l, ft_proj p);
/* ft_proj_dims with layer l's MLP width (ft_layer_mlp_width). */
void ft_layer_proj_dims(const ft_model_config *cfg, int l, ft_proj p, int *in, int *out);
/* In and out features of projection p (any of the ten: q, k, v, gate, up are also the
 * row blocks of a fused weight). */
void ft_proj_dims(const ft_model_config *cfg, ft_proj p, int *in, int *out);
/* The fused module holding p's rows, and their first row there (p itself and 0 when the
 * block does not fuse p). */
ft_proj ft_proj_module(const ft_model_config *cfg, ft_proj p, int *row0);

/* Reads dir/config.json as a JSON object into *out (the caller's reference): for tools
 * that copy it with changes. Errors name the file and line. */
int ft_read_model_config_json(const char *dir, json_t **out, ft_err *err);

/* Writes cfg (a config.json's object) as dir/config.json, atomically, indented; with
 * torch_dtype (not NULL) its dtype set first under both names, "torch_dtype" (what
 * transformers 4 reads) and "dtype" (transformers 5's, which it reads first). */
int ft_write_model_config(json_t *cfg, const char *dir, const char *torch_dtype, ft_err *err);

#endif
