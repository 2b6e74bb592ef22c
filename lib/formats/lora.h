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
 * there. A model has either set (ft_block_projections in hf_config.h says which). */
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
    FT_NPROJ
} ft_proj;

/* "q_proj", "k_proj", ... */
const char *ft_proj_name(ft_proj p);
/* The module path below "model.layers.N.": "self_attn.q_proj", "mlp.down_proj", ... */
const char *ft_proj_path(ft_proj p);

/* "all-linear": every module bit; a model keeps those of its block (the nine bits, 0x1ff). */
#define FT_LORA_ALL_LINEAR ((1u << FT_NPROJ) - 1)

#define FT_LORA_MAX_LAYER_LIST 256

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
    unsigned targets;
    char target_regex[256];
    int n_layers;
    int layers[FT_LORA_MAX_LAYER_LIST];
    bool has_layer_paths;
    uint64_t layer_paths[FT_NPROJ][FT_LORA_MAX_LAYER_LIST / 64];
    /* The adapter_config.json these settings were read from (ft_lora_config_load), for
     * the messages of the checks made once the model is known (a layer it lacks, targets
     * that select nothing); "" for settings from elsewhere. */
    char source[4096];
} ft_lora_config;

/* The projections of decoder layer `layer` that carry a LoRA pair (bitmask). Errors: a
 * regex that does not compile, or one that selects lm_head or the embeddings (LoRA on
 * those is not implemented). */
int ft_lora_layer_mask(const ft_lora_config *c, int layer, unsigned *mask, ft_err *err);

/* alpha / r, or alpha / sqrt(r) with rsLoRA. */
float ft_lora_scaling(const ft_lora_config *c);

/* Parses a target list: names separated by commas ("q_proj,v_proj", also "q,v",
 * "qkv", "gate_up"), or "all-linear". Error names the unknown module. */
int ft_lora_targets_parse(const char *list, unsigned *targets, ft_err *err);

/* Reads <dir>/adapter_config.json (a regular file; a key given twice is an error). Every
 * error names the file and the key. Rejects what this LoRA does not implement:
 * peft_type other than LORA, use_dora, bias other than "none", fan_in_fan_out,
 * modules_to_save, non-empty rank_pattern / alpha_pattern, layer_replication,
 * target_parameters (PEFT's LoRA on parameters: a MoE's fused experts), a
 * layers_pattern other than "layers", and target_modules naming modules other than the
 * nine projections; and values out of range (r not a positive int, a lora_alpha that
 * does not fit a float, a layer index that is negative or not an int). target_modules
 * may be a list, "all-linear" or a regex string. Sets c->source to the file's path. */
int ft_lora_config_load(ft_lora_config *c, const char *dir, ft_err *err);

/* Writes <dir>/adapter_config.json in PEFT's format (atomic: temp file + rename). */
int ft_lora_config_save(const ft_lora_config *c, const char *dir, const char *base_model,
                        ft_err *err);

#endif
