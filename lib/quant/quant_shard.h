/* A quantized weight split across ranks by whole blocks (ZeRO-3 / FSDP of a QLoRA base,
 * lib/dist): the same bytes as the qtensor, no re-quantization.
 *
 * The weight's sharded arrays (quant.h) are, in this order:
 *   4-bit            packed codes, absmax (fp32, one per block)
 *   4-bit nested     packed codes, absmax codes (one byte per block)
 *   int8             q (cols bytes per row), scb (fp32, one per row)
 * and it is cut into granules that carry their own state: a block of `blocksize`
 * elements with its absmax or absmax code (4-bit), a row with its scale (int8). Rank r
 * of W keeps granules [G r / W, G (r + 1) / W) of the G, i.e. a contiguous byte range of
 * every array (blocksize is even, so a block's codes are whole bytes; the last granule
 * may be short). Gathering each array's ranges in rank order gives the array back.
 * What is not cut, the same on every rank: the nested state of double quantization (one
 * fp32 nested absmax per nested_blocksize blocks, the 256-value map, the offset:
 * ft_qshard_replicated bytes) and the 16 code values. */
#ifndef FT_QUANT_SHARD_H
#define FT_QUANT_SHARD_H

#include <stddef.h>

#include "quant/quant.h"

enum { FT_QSHARD_MAX_ARRAYS = 2 };

/* The number of sharded arrays of q (2; 0 when q is not quantized) and each one's bytes. */
int ft_qshard_arrays(const ft_qtensor *q, size_t bytes[FT_QSHARD_MAX_ARRAYS]);
/* The address of array a of q (q's own arrays, in the order above). */
void **ft_qshard_array(ft_qtensor *q, int a);
/* Granules of q, and the byte range [lo, hi) of array a that rank `rank` of `world`
 * keeps. */
size_t ft_qshard_granules(const ft_qtensor *q);
void ft_qshard_range(const ft_qtensor *q, int a, int rank, int world, size_t *lo, size_t *hi);
/* Bytes rank `rank` keeps of q's sharded arrays (the sum of its ranges). */
size_t ft_qshard_bytes(const ft_qtensor *q, int rank, int world);
/* Elements of q's nested absmax (0 unless double quantized), and the bytes of the state
 * every rank keeps whole: the nested absmax and the map. */
size_t ft_qshard_nested_n(const ft_qtensor *q);
size_t ft_qshard_replicated(const ft_qtensor *q);
/* A qtensor with q's type and shape as a [rows, cols] weight quantized with o would have
 * (no arrays): what the planner computes shards of. */
ft_qtensor ft_qshard_meta(const ft_quant_options *o, int64_t rows, int64_t cols);

#endif
