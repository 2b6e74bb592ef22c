/* Block-wise shards of a quantized weight (quant_shard.h). */
#include "quant/quant_shard.h"

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

static bool four_bit(const ft_qtensor *q)
{
    return q->type == FT_QUANT_NF4 || q->type == FT_QUANT_FP4;
}

int ft_qshard_arrays(const ft_qtensor *q, size_t bytes[FT_QSHARD_MAX_ARRAYS])
{
    size_t n = (size_t)q->rows * (size_t)q->cols;
    if (q->type == FT_QUANT_INT8) {
        bytes[0] = n;
        bytes[1] = (size_t)q->rows * sizeof(float);
        return 2;
    }
    if (!four_bit(q))
        return 0;
    bytes[0] = ceil_div(n, 2);
    bytes[1] = q->nested ? q->n_blocks : q->n_blocks * sizeof(float);
    return 2;
}

size_t ft_qshard_nested_n(const ft_qtensor *q)
{
    return four_bit(q) && q->nested ? ceil_div(q->n_blocks, (size_t)q->nested_blocksize) : 0;
}

size_t ft_qshard_replicated(const ft_qtensor *q)
{
    return four_bit(q) && q->nested ? (ft_qshard_nested_n(q) + 256) * sizeof(float) : 0;
}

void **ft_qshard_array(ft_qtensor *q, int a)
{
    if (q->type == FT_QUANT_INT8)
        return a == 0 ? (void **)&q->q : (void **)&q->scb;
    if (a == 0)
        return (void **)&q->packed;
    return q->nested ? (void **)&q->absmax_q : (void **)&q->absmax;
}

size_t ft_qshard_granules(const ft_qtensor *q)
{
    if (q->type == FT_QUANT_INT8)
        return (size_t)q->rows;
    return four_bit(q) ? q->n_blocks : 0;
}

/* Granule g's first byte in array a (g may be G: the array's end). */
static size_t granule_start(const ft_qtensor *q, int a, size_t g)
{
    size_t bytes[FT_QSHARD_MAX_ARRAYS];
    ft_qshard_arrays(q, bytes);
    if (g >= ft_qshard_granules(q))
        return bytes[a];
    if (q->type == FT_QUANT_INT8)
        return a == 0 ? g * (size_t)q->cols : g * sizeof(float);
    if (a == 0)
        return g * (size_t)q->blocksize / 2; /* (blocksize is even) */
    return q->nested ? g : g * sizeof(float);
}

void ft_qshard_range(const ft_qtensor *q, int a, int rank, int world, size_t *lo, size_t *hi)
{
    size_t G = ft_qshard_granules(q);
    size_t g0 = (size_t)((unsigned __int128)G * (unsigned)rank / (unsigned)world);
    size_t g1 = (size_t)((unsigned __int128)G * (unsigned)(rank + 1) / (unsigned)world);
    *lo = granule_start(q, a, g0);
    *hi = granule_start(q, a, g1);
}

size_t ft_qshard_bytes(const ft_qtensor *q, int rank, int world)
{
    size_t bytes[FT_QSHARD_MAX_ARRAYS], total = 0;
    int na = ft_qshard_arrays(q, bytes);
    for (int a = 0; a < na; a++) {
        size_t lo, hi;
        ft_qshard_range(q, a, rank, world, &lo, &hi);
        total += hi - lo;
    }
    return total;
}

ft_qtensor ft_qshard_meta(const ft_quant_options *o, int64_t rows, int64_t cols)
{
    ft_qtensor q = {.type = o->type, .rows = rows, .cols = cols, .blocksize = o->blocksize};
    if (four_bit(&q)) {
        q.n_blocks = ceil_div((size_t)rows * (size_t)cols, (size_t)o->blocksize);
        q.nested = o->double_quant;
        q.nested_blocksize = 256;
    }
    return q;
}
