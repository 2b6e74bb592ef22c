/* Merging a PEFT LoRA adapter into its base model (what ft-merge does).
 *
 * For every LoRA pair on a linear layer W [out, in]: W += scaling * B @ A, with
 * A [r, in], B [out, r], scaling = alpha / r (alpha / sqrt(r) with rsLoRA), in fp32.
 * The result is a plain Hugging Face checkpoint that loads without PEFT. */
#ifndef FT_MERGE_H
#define FT_MERGE_H

#include <stdbool.h>
#include <stddef.h>

#include "core/ft_error.h"
#include "model/model.h"

/* Hugging Face's default max shard size (5 GB). */
#define FT_MERGE_DEFAULT_SHARD_BYTES ((size_t)5000000000ULL)

typedef struct ft_merge_options {
    const char *model_dir;   /* base HF model dir (config.json + safetensors) */
    const char *adapter_dir; /* PEFT adapter dir */
    const char *out_dir;     /* the merged checkpoint; must not exist unless force */
    const char *dtype;       /* "f32", "bf16", "f16" (or the torch names "float32",
                                "bfloat16", "float16"); NULL: the base's torch_dtype from
                                config.json, float32 when absent */
    size_t max_shard_bytes;  /* 0: FT_MERGE_DEFAULT_SHARD_BYTES */
    bool force;              /* replace an existing out_dir */
} ft_merge_options;

/* Folds the LoRA weights of m (loaded in LoRA mode) into its base weights:
 * W += s * B @ A for every pair, in place, using the parameter names (the pair of
 * base_model.model.<path>.lora_{A,B}.weight belongs to <path>.weight), s the scaling lc
 * gives module <path> (lora.h's ft_lora_module_scaling: rank_pattern / alpha_pattern);
 * with DoRA's <path>.lora_magnitude_vector m beside them, each row is then scaled by m /
 * its norm. The pairs on a MoE's router and fused experts (mlp.gate, mlp.experts) are not
 * folded here: ft_merge folds them (lora.h's target_params). */
int ft_merge_lora_weights(ft_model *m, const ft_lora_config *lc, ft_err *err);

/* base + adapter -> merged checkpoint in out_dir: model.safetensors (or shards plus
 * model.safetensors.index.json when larger than max_shard_bytes), every tensor in the
 * chosen dtype; config.json with torch_dtype set to it; the tokenizer and generation
 * files of the base copied when present. Tied embeddings are written once, as
 * model.embed_tokens.weight. Everything is written into a temporary dir next to out_dir
 * and renamed into place at the end, so out_dir either appears complete or not at all.
 * Errors: missing or mismatched adapter (r, targets, shapes), quantized base, an
 * existing out_dir without force, I/O; each names the file, key or tensor. */
int ft_merge(const ft_merge_options *o, ft_err *err);

/* Copies the files of a model dir that a derived checkpoint keeps beside its weights
 * and config (tokenizer files, generation_config.json, ...), those present. */
int ft_copy_passthrough_files(const char *model_dir, const char *dst_dir, ft_err *err);

#endif
