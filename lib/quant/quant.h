/* quant/: quantized weights in memory.
 *
 * Owns: the bitsandbytes formats (NF4, FP4 and int8 codes, blocks, double quantization)
 * on the host and the GPU (quant.h, quant_device.c). Reading and writing them in
 * checkpoints is formats/quant_io.h.
 * May call: core, config, device, kernels.
 * (This is the folder's main header.) */

/* Weight quantization in bitsandbytes' formats (QLoRA): 4-bit NF4 / FP4 with per-block
 * absmax (optionally double-quantized), and 8-bit LLM.int8 row-wise absmax. See
 * ../shared/FORMATS.md "bitsandbytes 4-bit" for the codes, packing and state-dict keys.
 *
 * 4-bit: the flattened tensor (n = rows x cols elements) runs in blocks of `blocksize`
 * (the last may be partial; blocks cross rows). absmax[b] = max |x| of block b (fp32);
 * each x / absmax[b] (0 when absmax is 0) goes to the nearest of the 16 code values; two
 * codes per byte, the first element in the high nibble (an odd n is padded with the code
 * of 0.0). Double quantization: offset = mean(absmax); absmax - offset is quantized
 * blockwise (256 per block) to 8 bits with bitsandbytes' signed dynamic map; what is
 * kept is then those codes, nested_absmax [ceil(n_blocks / 256)], the map and the offset,
 * and absmax[b] = map[code[b]] * nested_absmax[b / 256] + offset.
 *
 * int8 (LLM.int8 weight format): scb[r] = max |W[r, :]|; q[r, c] = round(127 W / scb[r]).
 *
 * Dequantization gives fp32: 4-bit x = code[q] * absmax[b]; int8 x = q * scb[r] / 127.
 *
 * A qtensor's arrays live on the host (malloc) unless ft_qtensor_to_device moved them to a
 * GPU, where a GPU model keeps them and dequantizes there (ft_dequantize_to). */
#ifndef FT_QUANT_H
#define FT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/run_config.h"
#include "core/ft_error.h"
#include "device/alloc.h"
#include "ops.h"

typedef enum ft_quant_type {
    FT_QUANT_NONE = 0,
    FT_QUANT_NF4,
    FT_QUANT_FP4,
    FT_QUANT_INT8
} ft_quant_type;

/* "none", "nf4", "fp4", "int8"; parse returns -1 (with err) for anything else. */
const char *ft_quant_name(ft_quant_type t);
int ft_quant_parse(const char *s, ft_quant_type *t, ft_err *err);

/* The 16 code values of NF4 or FP4, index = the 4-bit code. */
const float *ft_quant_code(ft_quant_type t);
/* bitsandbytes' create_dynamic_map(signed=True): the 256 values of the 8-bit map that
 * double quantization uses. */
void ft_quant_dynamic_map(float map[256]);

typedef struct ft_quant_options {
    ft_quant_type type;
    int blocksize;      /* 4-bit: 32..4096, a power of two (bitsandbytes' sizes); default 64 */
    bool double_quant;  /* 4-bit: quantize the absmax too (blocks of 256) */
} ft_quant_options;

/* What a run config's tuning.quant.* asks for (type, blocksize, double_quant). */
ft_quant_options ft_quant_options_of(const ft_tuning_section *t);

/* A quantized 2-D weight [rows, cols]. Arrays are owned: malloc'ed on the host, or
 * allocated on `device` by ft_qtensor_to_device. */
typedef struct ft_qtensor {
    ft_quant_type type;
    ft_device device;      /* where the arrays live (FT_DEV_CPU unless moved) */
    int64_t rows, cols;
    int blocksize;         /* 4-bit */
    size_t n_blocks;       /* 4-bit: ceil(rows * cols / blocksize) */
    uint8_t *packed;       /* 4-bit: ceil(rows * cols / 2) bytes */
    float *absmax;         /* 4-bit, not nested: [n_blocks] */
    bool nested;           /* 4-bit: double quantized */
    uint8_t *absmax_q;     /* nested: [n_blocks] 8-bit codes */
    float *nested_absmax;  /* nested: [ceil(n_blocks / nested_blocksize)] */
    float *nested_map;     /* nested: [256] the 8-bit code values */
    float nested_offset;   /* nested: mean of the absmax */
    int nested_blocksize;  /* nested: 256 */
    int8_t *q;             /* int8: [rows * cols] */
    float *scb;            /* int8: [rows] */
    float *code;           /* 4-bit on a GPU: its copy of the 16 code values (host: NULL,
                            * the table of ft_quant_code) */
} ft_qtensor;

/* Quantizes w [rows x cols] (fp32). inf or NaN in w is an error naming the element. */
int ft_quantize(const float *w, int64_t rows, int64_t cols, const ft_quant_options *o,
                ft_qtensor *out, ft_err *err);
/* out = the dequantized weight, through the dequantization ops of kernels/ops.h, on q's
 * device: out is a view of rows x cols elements there (fp32; fp32 or bf16 on a GPU, where
 * bf16 is the fp32 value rounded to nearest even). A double-quantized absmax is
 * reconstructed into absmax_tmp first, a view of at least ft_qtensor_absmax_tmp(q) fp32
 * on the same device (unused, may be ft_none(), when that is 0). */
void ft_dequantize_to(const ft_qtensor *q, ft_tensor out, ft_tensor absmax_tmp);
/* Elements of the absmax temporary ft_dequantize_to needs: n_blocks when double
 * quantized, else 0. */
size_t ft_qtensor_absmax_tmp(const ft_qtensor *q);
/* ft_dequantize_to for a host qtensor into host fp32 out [rows x cols], with a temporary
 * absmax of its own: -1 when that allocation fails (nothing else can). */
int ft_dequantize(const ft_qtensor *q, float *out);
/* Bytes the quantized form holds (packed codes, absmax or their codes, nested state). A
 * 4-bit qtensor on a GPU holds 16 floats more: its code table. */
size_t ft_qtensor_bytes(const ft_qtensor *q);
/* Frees a host qtensor's arrays (a qtensor on a GPU: ft_qtensor_free_on). */
void ft_qtensor_free(ft_qtensor *q);

/* lib/quant/quant_device.c. Moves a host qtensor's arrays to device (FT_DEV_CUDA): allocated
 * with ft_alloc_on(mem, device, FT_MEM_WEIGHTS, ...), so mem counts them, copied there,
 * and the host arrays freed. -1 with err (naming no tensor: the caller adds that) when
 * the device is out of memory, a copy fails, the build has no CUDA backend or device is
 * not a GPU; q is then unchanged, still on the host. */
int ft_qtensor_to_device(ft_qtensor *q, ft_mem *mem, ft_device device, ft_err *err);
/* Frees q's arrays wherever they live: a device's with ft_free_on(mem, ...) (mem: the
 * context ft_qtensor_to_device counted them in), the host's as ft_qtensor_free. */
void ft_qtensor_free_on(ft_qtensor *q, ft_mem *mem);
/* What ft_qtensor_bytes and ft_qtensor_absmax_tmp will say for a [rows, cols] weight
 * quantized with o. */
size_t ft_quant_size(const ft_quant_options *o, int64_t rows, int64_t cols);
size_t ft_quant_absmax_tmp(const ft_quant_options *o, int64_t rows, int64_t cols);

/* Whether module path (e.g. "model.layers.3.mlp.down_proj") contains one of the
 * comma-separated parts of skip ("lm_head,mlp.down_proj"): such a module stays dense. */
bool ft_quant_skipped(const char *skip, const char *path);

#endif
