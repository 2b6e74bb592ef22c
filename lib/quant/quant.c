/* Weight quantization in bitsandbytes' formats (see quant.h for the layout).
 *
 * The arithmetic follows bitsandbytes' CUDA kernels step for step, so that the same
 * input gives the same bytes:
 *   - a block's scale is the reciprocal inv = 1.0f / absmax, and the normalised value
 *     x * inv (fp32) picks the code (kQuantizeBlockwise);
 *   - NF4 codes come from a decision tree whose thresholds are the midpoints between
 *     neighbouring code values, compared with a strict '>' (dQuantizeNF4): a tie goes to
 *     the lower code; FP4 codes from the fp32 midpoints as the reference backend
 *     computes them (see fp4_index);
 *   - the 8-bit absmax codes of double quantization come from a 7-step binary search
 *     over the dynamic map with a midpoint check at the end (dQuantize);
 *   - the scale of an all-zero block is taken from absmax clamped to 1e-38, as the
 *     reference backend of bitsandbytes 0.50 does (older CUDA kernels divided by 0 and
 *     wrote code 0 there): its elements get the code of 0.0, so they dequantize to
 *     exactly 0 even when the absmax is double-quantized; the absmax stored is 0;
 *   - an odd element count is padded with the code of 0.0. */
#include "quant/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

static const float nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f};

/* bitsandbytes' FP4 (1 sign, 2 exponent, 1 mantissa bit, bias 3): these values divided
 * by their largest, 12, in fp32 (constant expressions: the compiler rounds each quotient
 * to fp32 as torch's division does). Code 8 ("-0") is +0.0 in its table (get_4bit_type
 * writes the integer -0), and so in the quant_map of every checkpoint. */
static const float fp4_code[16] = {
    0.0f,          0.0625f / 12.0f,  8.0f / 12.0f,  12.0f / 12.0f, 4.0f / 12.0f,  6.0f / 12.0f,
    2.0f / 12.0f,  3.0f / 12.0f,     0.0f,          -0.0625f / 12.0f, -8.0f / 12.0f,
    -12.0f / 12.0f, -4.0f / 12.0f,   -6.0f / 12.0f, -2.0f / 12.0f, -3.0f / 12.0f};

const char *ft_quant_name(ft_quant_type t)
{
    switch (t) {
    case FT_QUANT_NF4:
        return "nf4";
    case FT_QUANT_FP4:
        return "fp4";
    case FT_QUANT_INT8:
        return "int8";
    default:
        return "none";
    }
}

int ft_quant_parse(const char *s, ft_quant_type *t, ft_err *err)
{
    static const ft_quant_type all[] = {FT_QUANT_NONE, FT_QUANT_NF4, FT_QUANT_FP4,
                                        FT_QUANT_INT8};
    for (size_t i = 0; s && i < sizeof all / sizeof *all; i++)
        if (strcmp(s, ft_quant_name(all[i])) == 0) {
            *t = all[i];
            return 0;
        }
    return ft_fail(err, "unknown quantization type '%s' (nf4, fp4, int8 or none)", s ? s : "");
}

ft_quant_options ft_quant_options_of(const ft_tuning_section *t)
{
    ft_quant_type type = t->quant.type == FT_CFG_QUANT_FP4    ? FT_QUANT_FP4
                         : t->quant.type == FT_CFG_QUANT_INT8 ? FT_QUANT_INT8
                                                              : FT_QUANT_NF4;
    return (ft_quant_options){type, (int)t->quant.blocksize, t->quant.double_quant};
}

const float *ft_quant_code(ft_quant_type t)
{
    return t == FT_QUANT_NF4 ? nf4_code : t == FT_QUANT_FP4 ? fp4_code : NULL;
}

/* dQuantizeNF4: the code of the nearest NF4 value to x in [-1, 1]. */
static uint8_t nf4_index(float x)
{
    if (x > 0.03979014977812767f) {
        if (x > 0.3893125355243683f) {
            if (x > 0.6427869200706482f)
                return x > 0.8614784181118011f ? 15 : 14;
            return x > 0.5016634166240692f ? 13 : 12;
        }
        if (x > 0.2035212516784668f)
            return x > 0.2920137718319893f ? 11 : 10;
        return x > 0.1202552504837513f ? 9 : 8;
    }
    if (x > -0.33967943489551544f) {
        if (x > -0.13791173323988914f)
            return x > -0.045525018125772476f ? 7 : 6;
        return x > -0.23460740596055984f ? 5 : 4;
    }
    if (x > -0.6106329262256622f)
        return x > -0.4599952697753906f ? 3 : 2;
    return x > -0.8480964004993439f ? 1 : 0;
}

/* FP4: the nearest code value, ties to the lower value, by fp32 midpoints of the sorted
 * values (bitsandbytes' reference backend: torch.bucketize over (c[i] + c[i+1]) / 2).
 * Its CUDA kernel walks a tree of rounded thresholds on |x| instead, which can differ
 * exactly at a midpoint; those ties are common with bf16 weights. A value that lands on
 * zero keeps the sign of x (code 8 for -0; both decode to 0). */
static uint8_t fp4_index(float x)
{
    /* the codes of the sorted values -1, -2/3, ..., -0.0625/12, 0, 0.0625/12, ..., 1 */
    static const uint8_t order[15] = {11, 10, 13, 12, 15, 14, 9, 0, 1, 6, 7, 4, 5, 2, 3};
    for (int i = 0; i < 14; i++) {
        float mid = (fp4_code[order[i]] + fp4_code[order[i + 1]]) / 2.0f;
        if (x <= mid)
            return order[i] == 0 && x < 0 ? 8 : order[i];
    }
    return 3;
}

/* bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for
 * each exponent i = 0..6, the 2^i means of neighbouring points of
 * torch.linspace(0.1, 1, 2^i + 1) in fp32, times 10^(i-6), with both signs; then 0 and 1;
 * sorted. A table, not the formula: the values depend on how torch's fp32 linspace rounds
 * (vectorized or not, fused multiply-add or not), and these are the ones bitsandbytes
 * computes with the CPU kernel of torch 2.15 (scripts/python-requirements.txt; torch 1.13
 * gave 42 of them an ulp apart). tests/conformance/test_bnb_reference.py runs its
 * create_dynamic_map and compares. A checkpoint carries its own copy of the map
 * (nested_quant_map), which is what reading uses. */
static const float dynamic_map[256] = {
    -0.992968738f, -0.978906274f, -0.96484375f, -0.950781226f, -0.936718762f, -0.922656238f,
    -0.908593774f, -0.89453125f, -0.880468726f, -0.866406262f, -0.852343738f, -0.838281274f,
    -0.82421875f, -0.810156226f, -0.796093762f, -0.782031238f, -0.767968774f, -0.75390625f,
    -0.739843726f, -0.725781262f, -0.711718798f, -0.697656274f, -0.68359375f, -0.669531226f,
    -0.655468762f, -0.641406298f, -0.627343774f, -0.61328125f, -0.599218726f, -0.585156262f,
    -0.571093798f, -0.557031274f, -0.54296875f, -0.528906226f, -0.514843702f, -0.500781238f,
    -0.486718714f, -0.47265625f, -0.458593726f, -0.444531262f, -0.430468738f, -0.416406244f,
    -0.40234375f, -0.388281226f, -0.374218762f, -0.360156238f, -0.346093744f, -0.33203125f,
    -0.317968726f, -0.303906262f, -0.289843738f, -0.275781274f, -0.26171875f, -0.247656241f,
    -0.233593747f, -0.219531253f, -0.205468744f, -0.19140625f, -0.177343756f, -0.163281247f,
    -0.149218753f, -0.135156244f, -0.12109375f, -0.107031256f, -0.0985937491f, -0.0957812592f,
    -0.0929687545f, -0.0901562497f, -0.0873437524f, -0.0845312476f, -0.0817187577f, -0.078906253f,
    -0.0760937482f, -0.0732812509f, -0.0704687461f, -0.0676562563f, -0.0648437515f, -0.0620312504f,
    -0.0592187531f, -0.0564062484f, -0.053593751f, -0.05078125f, -0.047968749f, -0.0451562516f,
    -0.0423437469f, -0.0395312496f, -0.0367187522f, -0.0339062512f, -0.0310937501f, -0.028281251f,
    -0.0254687499f, -0.0226562507f, -0.0198437516f, -0.0170312505f, -0.0142187504f, -0.0114062503f,
    -0.00971874967f, -0.00915624946f, -0.00859375019f, -0.00803124998f, -0.00746874977f,
    -0.00690625003f, -0.00634374982f, -0.00578125007f, -0.00521875033f, -0.00465624966f,
    -0.00409374991f, -0.00353124971f, -0.00296874996f, -0.00240624999f, -0.00184375001f,
    -0.00128124992f, -0.000943750085f, -0.000831249985f, -0.00071875006f, -0.000606250076f,
    -0.000493750034f, -0.000381250022f, -0.000268750038f, -0.000156250011f, -8.87499991e-05f,
    -6.62500024e-05f, -4.37499984e-05f, -2.12499981e-05f, -7.7499999e-06f, -3.25000019e-06f,
    -5.50000038e-07f, 0.0f, 5.50000038e-07f, 3.25000019e-06f, 7.7499999e-06f, 2.12499981e-05f,
    4.37499984e-05f, 6.62500024e-05f, 8.87499991e-05f, 0.000156250011f, 0.000268750038f,
    0.000381250022f, 0.000493750034f, 0.000606250076f, 0.00071875006f, 0.000831249985f,
    0.000943750085f, 0.00128124992f, 0.00184375001f, 0.00240624999f, 0.00296874996f, 0.00353124971f,
    0.00409374991f, 0.00465624966f, 0.00521875033f, 0.00578125007f, 0.00634374982f, 0.00690625003f,
    0.00746874977f, 0.00803124998f, 0.00859375019f, 0.00915624946f, 0.00971874967f, 0.0114062503f,
    0.0142187504f, 0.0170312505f, 0.0198437516f, 0.0226562507f, 0.0254687499f, 0.028281251f,
    0.0310937501f, 0.0339062512f, 0.0367187522f, 0.0395312496f, 0.0423437469f, 0.0451562516f,
    0.047968749f, 0.05078125f, 0.053593751f, 0.0564062484f, 0.0592187531f, 0.0620312504f,
    0.0648437515f, 0.0676562563f, 0.0704687461f, 0.0732812509f, 0.0760937482f, 0.078906253f,
    0.0817187577f, 0.0845312476f, 0.0873437524f, 0.0901562497f, 0.0929687545f, 0.0957812592f,
    0.0985937491f, 0.107031256f, 0.12109375f, 0.135156244f, 0.149218753f, 0.163281247f,
    0.177343756f, 0.19140625f, 0.205468744f, 0.219531253f, 0.233593747f, 0.247656241f, 0.26171875f,
    0.275781274f, 0.289843738f, 0.303906262f, 0.317968726f, 0.33203125f, 0.346093744f, 0.360156238f,
    0.374218762f, 0.388281226f, 0.40234375f, 0.416406244f, 0.430468738f, 0.444531262f, 0.458593726f,
    0.47265625f, 0.486718714f, 0.500781238f, 0.514843702f, 0.528906226f, 0.54296875f, 0.557031274f,
    0.571093798f, 0.585156262f, 0.599218726f, 0.61328125f, 0.627343774f, 0.641406298f, 0.655468762f,
    0.669531226f, 0.68359375f, 0.697656274f, 0.711718798f, 0.725781262f, 0.739843726f, 0.75390625f,
    0.767968774f, 0.782031238f, 0.796093762f, 0.810156226f, 0.82421875f, 0.838281274f, 0.852343738f,
    0.866406262f, 0.880468726f, 0.89453125f, 0.908593774f, 0.922656238f, 0.936718762f, 0.950781226f,
    0.96484375f, 0.978906274f, 0.992968738f, 1.0f};

void ft_quant_dynamic_map(float map[256]) { memcpy(map, dynamic_map, sizeof dynamic_map); }

/* dQuantize<0>: the 8-bit code of x in [-1, 1] under a sorted 256-value map. */
static uint8_t dynamic_index(const float *code, float x)
{
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f, val = code[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = code[pivot];
    }
    if (upper_pivot == 255)
        upper = code[upper_pivot];
    if (lower_pivot == 0)
        lower = code[lower_pivot];
    if (x > val)
        return (uint8_t)(x > (upper + val) * 0.5f ? upper_pivot : pivot);
    return (uint8_t)(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* elements from which a weight is quantized on every core (below, a parallel region
 * costs more than it saves; see kernels/cpu/cpu_parallel.h) */
#define FT_QUANT_MIN_PARALLEL (1L << 18)

/* Double quantization of the block absmax (see quant.h): q->absmax gives way to its
 * 8-bit codes, the nested absmax, the map and the offset. */
static int quantize_absmax(ft_qtensor *q)
{
    enum { NESTED_BLOCK = 256 };
    size_t nb = q->n_blocks, n2 = ceil_div(nb, NESTED_BLOCK);
    q->absmax_q = malloc(nb);
    q->nested_absmax = malloc(n2 * sizeof *q->nested_absmax);
    q->nested_map = malloc(256 * sizeof *q->nested_map);
    if (!q->absmax_q || !q->nested_absmax || !q->nested_map)
        return -1;
    double sum = 0;
    for (size_t i = 0; i < nb; i++)
        sum += q->absmax[i];
    float offset = (float)(sum / (double)nb);
    float *map = q->nested_map;
    ft_quant_dynamic_map(map);
    for (size_t j = 0; j < n2; j++) {
        size_t b0 = j * NESTED_BLOCK, b1 = b0 + NESTED_BLOCK < nb ? b0 + NESTED_BLOCK : nb;
        float amax = 0.0f;
        for (size_t i = b0; i < b1; i++)
            amax = fmaxf(amax, fabsf(q->absmax[i] - offset));
        float inv = 1.0f / amax;
        q->nested_absmax[j] = amax;
        for (size_t i = b0; i < b1; i++)
            q->absmax_q[i] = dynamic_index(map, (q->absmax[i] - offset) * inv);
    }
    free(q->absmax);
    q->absmax = NULL;
    q->nested = true;
    q->nested_offset = offset;
    q->nested_blocksize = NESTED_BLOCK;
    return 0;
}

static int quantize_4bit(const float *w, size_t n, const ft_quant_options *o, ft_qtensor *q)
{
    size_t bs = (size_t)o->blocksize;
    q->blocksize = o->blocksize;
    q->n_blocks = ceil_div(n, bs);
    q->packed = calloc(ceil_div(n, 2), 1);
    q->absmax = malloc(q->n_blocks * sizeof *q->absmax);
    if (!q->packed || !q->absmax)
        return -1;
    uint8_t (*index)(float) = q->type == FT_QUANT_NF4 ? nf4_index : fp4_index;
    /* The blocks are independent, so a large weight is quantized on every core (quantizing
     * on load is on the way to an 8B model's first step); an even block size keeps each
     * packed byte in one block, and no value depends on the split. */
    long nblocks = (long)q->n_blocks;
#pragma omp parallel for schedule(static) if (bs % 2 == 0 && n >= FT_QUANT_MIN_PARALLEL)
    for (long bl = 0; bl < nblocks; bl++) {
        size_t b = (size_t)bl;
        size_t i0 = b * bs, i1 = i0 + bs < n ? i0 + bs : n;
        float amax = 0.0f;
        for (size_t i = i0; i < i1; i++)
            amax = fmaxf(amax, fabsf(w[i]));
        q->absmax[b] = amax;
        float inv = 1.0f / fmaxf(amax, 1e-38f);
        for (size_t i = i0; i < i1; i++)
            q->packed[i / 2] |= (uint8_t)(index(w[i] * inv) << (i % 2 ? 0 : 4));
        if (i1 == n && n % 2)
            q->packed[n / 2] |= index(0.0f);
    }
    return o->double_quant ? quantize_absmax(q) : 0;
}

static int quantize_int8(const float *w, int64_t rows, int64_t cols, ft_qtensor *q)
{
    q->q = malloc((size_t)(rows * cols));
    q->scb = malloc((size_t)rows * sizeof *q->scb);
    if (!q->q || !q->scb)
        return -1;
    for (int64_t r = 0; r < rows; r++) {
        const float *row = w + r * cols;
        float amax = 0.0f;
        for (int64_t c = 0; c < cols; c++)
            amax = fmaxf(amax, fabsf(row[c]));
        q->scb[r] = amax;
        /* int8_vectorwise_quant: A * (127.0 / row_stats), which torch evaluates as
         * reciprocal(row_stats) * 127; then round half to even */
        float scale = (1.0f / amax) * 127.0f;
        for (int64_t c = 0; c < cols; c++)
            q->q[r * cols + c] = amax > 0 ? (int8_t)rintf(row[c] * scale) : 0;
    }
    return 0;
}

int ft_quantize(const float *w, int64_t rows, int64_t cols, const ft_quant_options *o,
                ft_qtensor *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (rows <= 0 || cols <= 0)
        return ft_fail(err, "cannot quantize a [%lld, %lld] tensor", (long long)rows,
                       (long long)cols);
    if (o->type == FT_QUANT_NF4 || o->type == FT_QUANT_FP4) {
        int bs = o->blocksize;
        if (bs < 32 || bs > 4096 || (bs & (bs - 1)))
            return ft_fail(err, "blocksize %d: it must be a power of two in [32, 4096]", bs);
    } else if (o->type != FT_QUANT_INT8) {
        return ft_fail(err, "quantization type '%s' is not a quantized format",
                       ft_quant_name(o->type));
    }
    size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i]))
            return ft_fail(err, "element [%zu, %zu] is %s; only finite weights can be quantized",
                           i / (size_t)cols, i % (size_t)cols, isnan(w[i]) ? "NaN" : "inf");
    out->type = o->type;
    out->rows = rows;
    out->cols = cols;
    int rc = o->type == FT_QUANT_INT8 ? quantize_int8(w, rows, cols, out)
                                      : quantize_4bit(w, n, o, out);
    if (rc) {
        ft_qtensor_free(out);
        return ft_fail(err, "out of memory quantizing a [%lld, %lld] tensor", (long long)rows,
                       (long long)cols);
    }
    return 0;
}

size_t ft_qtensor_absmax_tmp(const ft_qtensor *q)
{
    return q->type != FT_QUANT_INT8 && q->nested ? q->n_blocks : 0;
}

void ft_dequantize_to(const ft_qtensor *q, ft_tensor out, ft_tensor absmax_tmp)
{
    size_t n = (size_t)q->rows * (size_t)q->cols;
    ft_device d = q->device;
    if (q->type == FT_QUANT_INT8) {
        ft_dequant_int8_rows(out, ft_view(q->q, n, FT_I8, d),
                             ft_view(q->scb, (size_t)q->rows, FT_F32, d), (int)q->rows,
                             (int)q->cols);
        return;
    }
    ft_tensor absmax = ft_view(q->absmax, q->n_blocks, FT_F32, d);
    if (q->nested) { /* the block absmax first, from their 8-bit codes */
        size_t n2 = ceil_div(q->n_blocks, (size_t)q->nested_blocksize);
        absmax = absmax_tmp;
        ft_dequant_8bit_blockwise(absmax, ft_view(q->absmax_q, q->n_blocks, FT_U8, d),
                                  ft_view(q->nested_absmax, n2, FT_F32, d),
                                  ft_view(q->nested_map, 256, FT_F32, d), q->n_blocks,
                                  q->nested_blocksize, q->nested_offset);
    }
    float *code = q->code ? q->code : (float *)ft_quant_code(q->type);
    ft_dequant_4bit(out, ft_view(q->packed, (n + 1) / 2, FT_U8, d), absmax,
                    ft_view(code, 16, FT_F32, d), n, q->blocksize);
}

int ft_dequantize(const ft_qtensor *q, float *out)
{
    size_t nt = ft_qtensor_absmax_tmp(q);
    float *tmp = nt ? malloc(nt * sizeof *tmp) : NULL;
    if (nt && !tmp)
        return -1;
    ft_dequantize_to(q, ft_f32(out, (size_t)q->rows * (size_t)q->cols), ft_f32(tmp, nt));
    free(tmp);
    return 0;
}

bool ft_quant_skipped(const char *skip, const char *path)
{
    for (const char *s = skip; s && *s;) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        if (len && memmem(path, strlen(path), s, len))
            return true;
        s = end ? end + 1 : NULL;
    }
    return false;
}

size_t ft_quant_size(const ft_quant_options *o, int64_t rows, int64_t cols)
{
    ft_qtensor q = {.type = o->type, .rows = rows, .cols = cols, .blocksize = o->blocksize,
                    .nested = o->double_quant && o->type != FT_QUANT_INT8,
                    .nested_blocksize = 256};
    if (o->type == FT_QUANT_NF4 || o->type == FT_QUANT_FP4)
        q.n_blocks = ceil_div((size_t)(rows * cols), (size_t)o->blocksize);
    return ft_qtensor_bytes(&q);
}

size_t ft_quant_absmax_tmp(const ft_quant_options *o, int64_t rows, int64_t cols)
{
    if ((o->type != FT_QUANT_NF4 && o->type != FT_QUANT_FP4) || !o->double_quant)
        return 0;
    return ceil_div((size_t)(rows * cols), (size_t)o->blocksize);
}

size_t ft_qtensor_bytes(const ft_qtensor *q)
{
    size_t n = (size_t)q->rows * (size_t)q->cols;
    switch (q->type) {
    case FT_QUANT_INT8:
        return n + (size_t)q->rows * sizeof(float);
    case FT_QUANT_NF4:
    case FT_QUANT_FP4:
        if (q->nested)
            return ceil_div(n, 2) + q->n_blocks +
                   ceil_div(q->n_blocks, (size_t)q->nested_blocksize) * sizeof(float) +
                   256 * sizeof(float);
        return ceil_div(n, 2) + q->n_blocks * sizeof(float);
    default:
        return 0;
    }
}

void ft_qtensor_free(ft_qtensor *q)
{
    free(q->packed);
    free(q->absmax);
    free(q->absmax_q);
    free(q->nested_absmax);
    free(q->nested_map);
    free(q->q);
    free(q->scb);
    memset(q, 0, sizeof *q);
}
