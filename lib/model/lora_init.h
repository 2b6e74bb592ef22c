/* A fresh PEFT LoRA adapter for a Hugging Face model dir (what ft-lora-init writes). */
#ifndef FT_LORA_INIT_H
#define FT_LORA_INIT_H

#include <stdint.h>

#include "core/ft_error.h"
#include "formats/lora.h"

/* Loads model_dir in LoRA mode with the settings of c (PEFT's default init: A
 * kaiming-uniform, bound 1/sqrt(in), from `seed`; B = 0) and writes the adapter into
 * out_dir (created if needed): adapter_config.json with base_model_name_or_path =
 * model_dir, and adapter_model.safetensors (F32). The adapted model starts equal to the
 * base. Errors name the file, key or tensor (from the model loader) or the output path.
 * The whole base model is loaded to learn the shapes. */
int ft_lora_init_adapter(const char *model_dir, const char *out_dir, const ft_lora_config *c,
                         uint64_t seed, ft_err *err);

#endif
