/* Quantized checkpoints in the layout transformers + bitsandbytes save and load.
 *
 * State-dict tensors of one quantized Linear (prefix = its module path, e.g.
 * "model.layers.0.self_attn.q_proj"):
 *   4-bit  prefix.weight                                U8 [ceil(n/2), 1] packed codes
 *          prefix.weight.absmax                         F32 [n_blocks], or U8 codes (nested)
 *          prefix.weight.quant_map                      F32 [16]
 *          prefix.weight.nested_absmax                  F32 (nested only)
 *          prefix.weight.nested_quant_map               F32 [256] (nested only)
 *          prefix.weight.quant_state.bitsandbytes__nf4  U8: UTF-8 JSON {quant_type,
 *              blocksize, dtype, shape, nested_blocksize, nested_dtype, nested_offset}
 *              (__fp4 for FP4)
 *   int8   prefix.weight                                I8 [rows, cols]
 *          prefix.SCB                                   F32 [rows]
 *          prefix.weight_format                         U8 [] = 0 ("row")
 * Biases stay prefix.bias in 16-bit or fp32.
 *
 * config.json carries "quantization_config" (quant_method "bitsandbytes", load_in_4bit /
 * load_in_8bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant, bnb_4bit_compute_dtype,
 * bnb_4bit_quant_storage, bnb_4bit_blocksize when not 64 (ours; bitsandbytes always
 * uses 64 through transformers), llm_int8_skip_modules, llm_int8_threshold, ...). */
#ifndef FT_QUANT_IO_H
#define FT_QUANT_IO_H

#include <stdbool.h>

#include "quant/quant.h"
#include "formats/safetensors.h"

/* Adds q's tensors under prefix; dtype ("bfloat16", "float16", "float32") is the one the
 * weight had before quantization (quant_state's "dtype"). The writer keeps pointers into
 * q until it is freed (the quant_state JSON it owns). */
int ft_qtensor_write(ft_st_writer *w, const char *prefix, const ft_qtensor *q,
                     const char *dtype, ft_err *err);

/* What form prefix.weight has in the checkpoint: FT_QUANT_NONE (a plain 16/32-bit
 * tensor, or absent), NF4, FP4 (its quant_state key) or INT8 (an I8 weight with SCB). */
ft_quant_type ft_qtensor_probe(const ft_checkpoint *ck, const char *prefix);

/* Reads prefix's quantized weight, checking it is [rows, cols]: every length (packed,
 * absmax, nested state), the quant_map against our code table, the scales (absmax, SCB,
 * nested absmax and code) finite, and the quant_state JSON: every field of its type
 * (dtype bfloat16, float16 or float32; nested_dtype float32), no key twice. Errors name
 * the file and tensor. out's arrays are copies (the checkpoint may close). */
int ft_qtensor_read(const ft_checkpoint *ck, const char *prefix, int64_t rows, int64_t cols,
                    ft_qtensor *out, ft_err *err);

/* config.json's quantization_config. */
typedef struct ft_quant_config {
    bool present;           /* the config has one */
    ft_quant_options opt;   /* type, blocksize, double_quant */
    char compute_dtype[16]; /* "bfloat16", "float16", "float32" */
    char skip[512];         /* llm_int8_skip_modules, comma-separated ("" = none) */
} ft_quant_config;

/* Reads it from the config.json at path (present = false when there is none); a
 * quant_method other than bitsandbytes, or an unknown quant type, is an error. */
int ft_quant_config_read(const char *path, ft_quant_config *out, ft_err *err);

#endif
