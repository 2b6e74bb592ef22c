/* LoRA configuration, read from and written to PEFT's adapter_config.json.
 *
 * A LoRA pair on a linear layer W [out, in] adds y += scaling * (dropout(x) A^T) B^T with
 * A [r, in], B [out, r]; scaling = alpha / r, or alpha / sqrt(r) with rsLoRA. */
#ifndef FT_LORA_H
#define FT_LORA_H

#include <stdbool.h>
#include <stdint.h>

#include "core/ft_error.h"

/* The linear layers of a decoder block, in PEFT's module names: the seven of a
 * Llama-family block, and the two fused modules of Phi-3 (qkv_proj holds q, k, v as row
 * blocks [q; k; v]; gate_up_proj holds [gate; up]), which replace q, k, v and gate, up
 * there. A model has either set (ft_block_projections in hf_config.h says which; a MoE
 * model's layers: ft_layer_projections), and qwen2_moe's sparse layers also the shared
 * expert's gate, shared_expert_gate. */
typedef enum ft_proj {
    FT_PROJ_Q = 0,
    FT_PROJ_K,
    FT_PROJ_V,
    FT_PROJ_O,
    FT_PROJ_GATE,
    FT_PROJ_UP,
    FT_PROJ_DOWN,
    FT_PROJ_QKV,
    FT_PROJ_GATE_UP,
    FT_PROJ_SHGATE, /* qwen2_moe's mlp.shared_expert_gate [1, hidden] (sparse layers) */
    FT_NPROJ
} ft_proj;

/* "q_proj", "k_proj", ... */
const char *ft_proj_name(ft_proj p);
/* The module path below "model.layers.N.": "self_attn.q_proj", "mlp.down_proj", ... */
const char *ft_proj_path(ft_proj p);

/* "all-linear": every module bit; a model keeps those of its block (the ten bits, 0x3ff). */
#define FT_LORA_ALL_LINEAR ((1u << FT_NPROJ) - 1)
/* LoRA outside the block, bits of ft_lora_config.targets above the ten: on the token
 * embedding (PEFT's Embedding layer: lora_embedding_A [r, vocab], lora_embedding_B
 * [hidden, r], h0 += s A^T[ids] B^T, no dropout) and on lm_head (a linear layer). */
#define FT_LORA_EMBED (1u << FT_NPROJ)
#define FT_LORA_HEAD (1u << (FT_NPROJ + 1))
#define FT_LORA_OUTER (FT_LORA_EMBED | FT_LORA_HEAD)
/* A MoE's router and experts by the module names PEFT's users give for Mixtral (v4
 * names, which PEFT on transformers 5 turns into target_params: ft_lora_resolve_moe):
 * "gate" (also the short form of gate_proj: on a MoE model the router), "w1" with "w3"
 * (the fused gate_up_proj), "w2" (down_proj). Ignored on a dense model. */
#define FT_LORA_MOE_ROUTER (1u << (FT_NPROJ + 2))
#define FT_LORA_MOE_W1 (1u << (FT_NPROJ + 3))
#define FT_LORA_MOE_W3 (1u << (FT_NPROJ + 4))
#define FT_LORA_MOE_W2 (1u << (FT_NPROJ + 5))
#define FT_LORA_MOE (FT_LORA_MOE_ROUTER | FT_LORA_MOE_W1 | FT_LORA_MOE_W3 | FT_LORA_MOE_W2)

#define FT_LORA_MAX_LAYER_LIST 256

/* PEFT's rank_pattern / alpha_pattern: per-module overrides of r and lora_alpha, a map
 * from a key to a value, in the order given (the first key that matches wins). A key
 * matches a module whose name (PEFT's module path, "model.layers.0.self_attn.q_proj",
 * "model.embed_tokens", "lm_head"; for a target_parameters pair the parameter's path,
 * "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj") matches
 * the regular expression (.*\.)?(key)$ from its start (PEFT's get_pattern_key): the key
 * as a regex over the whole name or over a dotted suffix of it ("q_proj",
 * "layers.0.self_attn.q_proj", "model\.layers\.[01]\..*"). */
#define FT_LORA_MAX_PATTERNS 64
#define FT_LORA_PATTERN_KEY 256

typedef struct ft_lora_patterns {
    int n;
    struct {
        char key[FT_LORA_PATTERN_KEY];
        double value; /* rank_pattern: a positive int; alpha_pattern: a positive number */
    } p[FT_LORA_MAX_PATTERNS];
    /* where the map came from, for messages: "key 'rank_pattern'" (an adapter's config,
     * whose path the model's checks prefix), "tuning.lora.rank_pattern", "--rank-pattern" */
    char origin[40];
} ft_lora_patterns;

/* Bits of ft_lora_config.target_params. */
#define FT_LORA_PARAM_ROUTER 1u
#define FT_LORA_PARAM_GATE_UP 2u
#define FT_LORA_PARAM_DOWN 4u
#define FT_LORA_PARAM_EXPERTS (FT_LORA_PARAM_GATE_UP | FT_LORA_PARAM_DOWN)


/* PEFT's modules_to_save: modules trained in full beside the LoRA pairs (PEFT wraps a
 * trainable copy of each; its adapter file holds the copy under the module's own key,
 * base_model.model.model.embed_tokens.weight, base_model.model.lm_head.weight). */
#define FT_SAVE_EMBED 1u /* model.embed_tokens */
#define FT_SAVE_HEAD 2u  /* lm_head */

typedef struct ft_lora_config {
    int r;
    float alpha;
    float dropout;
    bool rslora;
    /* Which linear layers carry LoRA, as PEFT decides it: either target_regex (PEFT's
     * string form, re.fullmatch against the module path "model.layers.N.self_attn.q_proj")
     * or the module names in `targets` (bitmask of 1u << ft_proj), restricted to the
     * layer indices in `layers` when n_layers > 0 (layers_to_transform; PEFT ignores it
     * with a regex), plus the modules a list names by their full path (PEFT matches a
     * list entry as the module's name or a dotted suffix of it; recent PEFT writes
     * "all-linear" out as every layer's paths, "model.layers.0.self_attn.q_proj", ...):
     * layer l's projection p when layer_paths[p] has bit l (layers_to_transform does not
     * restrict those). Use ft_lora_layer_mask for the answer of one layer. */
    unsigned targets; /* also FT_LORA_EMBED, FT_LORA_HEAD */
    char target_regex[1024];
    int n_layers;
    int layers[FT_LORA_MAX_LAYER_LIST];
    bool has_layer_paths;
    uint64_t layer_paths[FT_NPROJ][FT_LORA_MAX_LAYER_LIST / 64];
    /* The decoder's module path in the transformers model, which target_regex matches
     * and a saved adapter names: "" means "model." (a causal LM); a multimodal gemma3
     * model sets "model.language_model." (hf_config.h's module_prefix), and its adapters
     * are saved with a target_modules regex over that path, so that PEFT leaves the
     * vision tower's modules of the same names alone. */
    char module_prefix[32];
    unsigned modules_to_save; /* FT_SAVE_EMBED | FT_SAVE_HEAD */
    /* PEFT's target_parameters (LoRA on a parameter through its ParamWrapper, no dropout),
     * how PEFT on transformers 5 reaches a MoE's router and fused experts (E experts,
     * hidden C, expert width I):
     *   FT_LORA_PARAM_ROUTER  "gate.weight": <prefix>layers.N.mlp.gate.lora_A [r, C],
     *                         lora_B [E, r]; logits += s x A^T B^T.
     *   FT_LORA_PARAM_GATE_UP "gate_up_proj": A [E R, C], B [2I, E R], R its rank (PEFT's
     *                         w1 + w3 converted: rank 2r and alpha 2 alpha, by the patterns
     *                         {".*\.gate_up_proj": ...} that ft_lora_resolve_moe adds;
     *                         named in target_parameters: r and alpha).
     *   FT_LORA_PARAM_DOWN    "down_proj" (w2): A [E R, I], B [C, E R].
     * (Each pair's rank and alpha: its module's under the patterns, ft_lora_module_rank.)
     * An expert pair's A rows are expert-major (expert e's rows [e R, (e+1) R)); its B
     * columns are interleaved (expert e's column j is column j E + e; ops.h's
     * ft_moe_lora_b_split). Keys: <prefix>layers.N.mlp.experts.lora_A/B.weight, the gate_up
     * pair under experts.base_layer.lora_A/B when down_proj is targeted too (PEFT nests
     * the down_proj wrapper around it). */
    unsigned target_params;
    /* Per-module ranks and alphas (see ft_lora_patterns; empty: every pair has r and
     * alpha). ft_lora_resolve_moe adds PEFT's pair for fused w1 + w3. */
    ft_lora_patterns rank_pattern, alpha_pattern;
    /* PEFT's ensure_weight_tying, on a model with tied embeddings: modules_to_save trains
     * one copy shared by the embedding and the head (saved under both keys), LoRA on them
     * gives the head the embedding's pair (lib/model/tied_lora.c). Without it PEFT trains
     * a copy of each listed module, which unties the model (lib/model/model.c
     * untie_head), and puts a pair of its own on each. */
    bool ensure_weight_tying;
    /* ensure_weight_tying was given (an adapter's config; a run config's true or false):
     * else a run config's auto, which ties a tied model's modules_to_save */
    bool weight_tying_set;
    /* DoRA (PEFT's use_dora): each pair's layer computes
     * y = b + (m / ||W + s B A||_row) (x W^T + s dropout(x) A^T B^T) with a trainable
     * magnitude m [out] (key <module>.lora_magnitude_vector), the norm taken as a constant
     * in the gradient, as PEFT does (see lib/model/dora.c for dropout). */
    bool dora;
    /* The vocabulary the adapter was made for: the rows of the embedding or head tensors
     * in its adapter_model.safetensors (PEFT saves them, or LoRA on them, of the grown
     * vocabulary after tokenizer.add_special_tokens + resize_token_embeddings); 0 when it
     * holds none (or for settings from elsewhere). ft_model_load grows the model's
     * vocabulary to it (lib/model/adapter.c). */
    int64_t vocab_size;
    /* The adapter_config.json these settings were read from (ft_lora_config_load), for
     * the messages of the checks made once the model is known (a layer it lacks, targets
     * that select nothing); "" for settings from elsewhere. */
    char source[4096];
} ft_lora_config;

/* On a MoE model (moe true), as PEFT converts a config for transformers 5's fused
 * experts: targets' FT_LORA_MOE names and "all-linear" (the block's linear layers: also
 * the router and the experts) become target_params (w1 and w3: gate_up_proj, with the
 * doubled rank and alpha of the pattern key ".*\.gate_up_proj" it sets in rank_pattern
 * and alpha_pattern, after the keys given). Clears the FT_LORA_MOE bits either way.
 * Error: w1 without w3 or the reverse (PEFT's too); w1 / w3 beside gate_up_proj in
 * target_parameters; no room for the pattern keys. */
int ft_lora_resolve_moe(ft_lora_config *c, bool moe, ft_err *err);

/* The projections of decoder layer `layer` that carry a LoRA pair (bitmask). Error: a
 * regex that does not compile. (A regex's FT_LORA_EMBED / FT_LORA_HEAD: in targets, set
 * by ft_lora_regex_outer.) */
int ft_lora_layer_mask(const ft_lora_config *c, int layer, unsigned *mask, ft_err *err);

/* A target regex's FT_LORA_EMBED / FT_LORA_HEAD bits in c->targets: whether it
 * fullmatches the embedding's module path (module_prefix embed_tokens; "" as "model.")
 * and lm_head. ft_lora_config_load sets them for a causal LM's paths; a model of
 * another layout sets module_prefix and calls this again. No regex: nothing changes. */
int ft_lora_regex_outer(ft_lora_config *c, ft_err *err);

/* alpha / r, or alpha / sqrt(r) with rsLoRA: the scaling of a pair of rank r. */
float ft_lora_scaling_of(const ft_lora_config *c, int r, float alpha);

/* Whether pattern key `key` matches module `name` (see ft_lora_patterns; false for a key
 * that does not compile); the first key of ps that does, -1 when none. */
bool ft_lora_pattern_matches(const char *key, const char *name);
int ft_lora_pattern_find(const ft_lora_patterns *ps, const char *name);

/* The rank, alpha and scaling of the pair on module `name` (see ft_lora_patterns): the
 * value of the first key of rank_pattern (alpha_pattern) that matches it, else r
 * (alpha). */
int ft_lora_module_rank(const ft_lora_config *c, const char *name);
float ft_lora_module_alpha(const ft_lora_config *c, const char *name);
float ft_lora_module_scaling(const ft_lora_config *c, const char *name);

/* Parses a pattern map from JSON text (a run config's tuning.lora.rank_pattern, an
 * option's value): an object of keys to values, each key a regular expression that
 * compiles, each value a positive integer (rank) or a positive number (alpha, rank
 * false), at most FT_LORA_MAX_PATTERNS keys; "" or "{}" for none. origin names the map
 * in this function's errors and in later ones (ft_lora_patterns.origin). */
int ft_lora_patterns_parse(const char *json, bool rank, const char *origin,
                           ft_lora_patterns *out, ft_err *err);

/* Parses a target list: names separated by commas ("q_proj,v_proj", also "q,v",
 * "qkv", "gate_up", and "embed_tokens", "lm_head"), or "all-linear" (PEFT's: the block's
 * linear layers, not lm_head; in a list beside embed_tokens / lm_head too). Error names
 * the unknown module. */
int ft_lora_targets_parse(const char *list, unsigned *targets, ft_err *err);

/* Parses a target_parameters list as PEFT's explicit LoraConfig(target_parameters=[...])
 * (a run config's tuning.lora.target_parameters): names separated by commas, each
 * gate.weight, gate_up_proj or down_proj or a dotted path ending so
 * ("mlp.experts.gate_up_proj"), or "" for none. Sets c->target_params (gate_up_proj:
 * rank r, as PEFT writes no pattern for an explicit list). Error names the parameter it
 * does not support. */
int ft_lora_target_parameters_parse(const char *list, ft_lora_config *c, ft_err *err);

/* The modules trained in full on a model (tied: its embeddings tied): modules_to_save, or
 * on a tied model with any of them, FT_SAVE_EMBED (the one copy the head shares). */
unsigned ft_lora_saved_modules(const ft_lora_config *c, bool tied);

/* Parses a modules_to_save list: names separated by commas ("embed_tokens,lm_head"; also
 * "model.embed_tokens"), or "" for none. Error names the module it does not support. */
int ft_lora_modules_to_save_parse(const char *list, unsigned *mods, ft_err *err);

/* Reads <dir>/adapter_config.json (a regular file; a key given twice is an error). Every
 * error names the file and the key. Rejects what this LoRA does not implement:
 * peft_type other than LORA, bias other than "none", fan_in_fan_out,
 * modules_to_save naming other modules than embed_tokens and lm_head, lora_bias,
 * layer_replication, target_parameters other than gate.weight, gate_up_proj, down_proj
 * (and lora_dropout beside them), rank_pattern / alpha_pattern keys that are no regular
 * expression or values that are not positive (integers for ranks), a
 * layers_pattern other than "layers", and target_modules naming modules other than the
 * nine projections; and values out of range (r not a positive int, a lora_alpha that
 * does not fit a float, a layer index that is negative or not an int). target_modules
 * may be a list, "all-linear" or a regex string (or empty or null when target_parameters
 * names something). Sets c->source to the file's path. */
int ft_lora_config_load(ft_lora_config *c, const char *dir, ft_err *err);

/* Writes <dir>/adapter_config.json in PEFT's format (atomic: temp file + rename). */
int ft_lora_config_save(const ft_lora_config *c, const char *dir, const char *base_model,
                        ft_err *err);

#endif
