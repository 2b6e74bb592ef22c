/* LoRA configuration, read from and written to PEFT's adapter_config.json.
 *
 * A LoRA pair on a linear layer W [out, in] adds y += scaling * (dropout(x) A^T) B^T with
 * A [r, in], B [out, r]; scaling = alpha / r, or alpha / sqrt(r) with rsLoRA. */
#ifndef FT_LORA_H
#define FT_LORA_H

#include <stdbool.h>

#include "ft_error.h"

/* The seven linear layers of a Llama-family block, in PEFT's module names. */
typedef enum ft_proj {
    FT_PROJ_Q = 0,
    FT_PROJ_K,
    FT_PROJ_V,
    FT_PROJ_O,
    FT_PROJ_GATE,
    FT_PROJ_UP,
    FT_PROJ_DOWN,
    FT_NPROJ
} ft_proj;

/* "q_proj", "k_proj", ... */
const char *ft_proj_name(ft_proj p);
/* The module path below "model.layers.N.": "self_attn.q_proj", "mlp.down_proj", ... */
const char *ft_proj_path(ft_proj p);

#define FT_LORA_ALL_LINEAR ((1u << FT_NPROJ) - 1)

typedef struct ft_lora_config {
    int r;
    float alpha;
    float dropout;
    bool rslora;
    unsigned targets; /* bitmask of 1u << ft_proj */
} ft_lora_config;

/* alpha / r, or alpha / sqrt(r) with rsLoRA. */
float ft_lora_scaling(const ft_lora_config *c);

/* Parses a target list: names separated by commas ("q_proj,v_proj", also "q,v"), or
 * "all-linear". Error names the unknown module. */
int ft_lora_targets_parse(const char *list, unsigned *targets, ft_err *err);

/* Reads <dir>/adapter_config.json. Rejects what this LoRA does not implement, naming the
 * key: peft_type other than LORA, use_dora, bias other than "none", fan_in_fan_out,
 * modules_to_save, non-empty rank_pattern / alpha_pattern, layers_to_transform, and
 * target_modules that are not among the seven projections (or "all-linear"). */
int ft_lora_config_load(ft_lora_config *c, const char *dir, ft_err *err);

/* Writes <dir>/adapter_config.json in PEFT's format (atomic: temp file + rename). */
int ft_lora_config_save(const ft_lora_config *c, const char *dir, const char *base_model,
                        ft_err *err);

#endif
