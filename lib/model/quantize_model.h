/* Quantizing a Hugging Face checkpoint on disk (what ft-quantize does): a 16/32-bit model
 * dir in, a dir in the layout transformers + bitsandbytes save a quantized model in out
 * (see quant_io.h), which ft_model_load reads back as it is.
 *
 * Quantized: the linear weights of the transformer blocks,
 * model.layers.N.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj}.weight (2-D), unless
 * their module path contains one of the skip substrings ("lm_head" always; transformers'
 * default). Everything else (embeddings, norms, biases, lm_head, skipped modules) is
 * written dense, byte for byte, in its source dtype, or converted to the chosen dtype.
 *
 * Memory: the source is mmap'ed; one weight at a time goes to fp32 in a single buffer of
 * the largest quantized tensor's size and is quantized from there; the quantized outputs
 * stay in memory until the save, dense tensors are written straight from the mapping.
 * Peak RAM is the largest weight in fp32 plus the quantized model (plus the dense
 * tensors when they are converted). */
#ifndef FT_QUANTIZE_MODEL_H
#define FT_QUANTIZE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ft_error.h"
#include "quant/quant.h"
#include "formats/safetensors.h"

/* One tensor done, for progress output. */
typedef struct ft_quantize_progress {
    size_t index, count;       /* 1-based position among the checkpoint's tensors */
    const char *name;
    bool quantized;            /* false: written dense */
    ft_st_dtype src_dtype;
    ft_st_dtype out_dtype;     /* dense only: the written dtype */
    int ndim;
    const int64_t *shape;
    size_t bytes_in, bytes_out; /* data bytes; quantized: every tensor of its state */
} ft_quantize_progress;

typedef struct ft_quantize_model_options {
    const char *model_dir;   /* source HF model dir (config.json + safetensors) */
    const char *out_dir;     /* must not exist unless force */
    ft_quant_options quant;  /* type nf4 / fp4 / int8; blocksize and double_quant: 4-bit */
    const char *skip;        /* comma-separated module-path substrings left dense, added to
                                "lm_head" (NULL: none) */
    const char *dtype;       /* dense tensors: NULL or "keep" (as in the source), "bf16",
                                "f16", "f32" (a conversion also rounds the weights to that
                                dtype before quantizing, as loading the model in that dtype
                                and quantizing it would) */
    size_t max_shard_bytes;  /* 0: 5 GB, transformers' default */
    bool force;              /* replace an existing out_dir */
    void (*progress)(const ft_quantize_progress *p, void *ctx); /* NULL: none */
    void *progress_ctx;
} ft_quantize_model_options;

typedef struct ft_quantize_summary {
    size_t n_tensors, n_quantized;
    size_t bytes_in, bytes_out; /* tensor data of the source and of the output */
} ft_quantize_summary;

/* Quantizes o->model_dir into o->out_dir: model.safetensors (sharded with an index past
 * max_shard_bytes; a weight's quantized parts always share a shard), config.json = the
 * source's with "quantization_config" as transformers' BitsAndBytesConfig.to_dict() writes
 * it (plus "bnb_4bit_blocksize" when not 64) and torch_dtype updated when converted, and
 * the tokenizer and generation files copied. Everything is written into a temporary dir
 * next to out_dir and renamed at the end; on error nothing is left behind.
 * Errors (each naming the file and tensor): no config.json or safetensors, an already
 * quantized source, a weight to quantize that is not a 2-D float tensor or holds inf /
 * NaN (the element is named), no weight to quantize, an existing out_dir, I/O. */
int ft_quantize_model(const ft_quantize_model_options *o, ft_quantize_summary *sum,
                      ft_err *err);

#endif
