/* Quantization (lib/quant/quant.c, lib/formats/quant_io.c): round-trip error within the format's
 * bound for normal and heavy-tailed weights, the codes against an independent nearest-
 * code search, packing order, edge cases (all-zero blocks, sizes that are no multiple of
 * the blocksize, odd counts, inf/NaN), and the checkpoint layout read back, with every
 * corruption a clear error; block-wise shards (quant_shard.h) tile each array. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ops.h"
#include "quant/quant.h"
#include "quant/quant_shard.h"
#include "formats/quant_io.h"
#include "formats/safetensors.h"

static uint64_t rng_state = 88172645463325252ull;
static double uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) { return (float)(sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform())); }

/* Weights like a trained layer's: mostly N(0, 0.02), a Student-t-ish tail and a few
 * outlier columns 20x larger. */
static void real_looking(float *w, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float x = 0.02f * normal();
            if (uniform() < 0.05)
                x /= (float)sqrt(uniform() + 0.05);
            if (c % 97 == 3)
                x *= 20;
            w[r * cols + c] = x;
        }
}

static float max_half_gap(const float *code, int n)
{
    float sorted[256];
    memcpy(sorted, code, (size_t)n * sizeof *code);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (sorted[j] < sorted[i]) {
                float t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    float g = 0;
    for (int i = 0; i + 1 < n; i++)
        g = fmaxf(g, sorted[i + 1] - sorted[i]);
    return g / 2;
}

/* Every element within the bound: 4-bit |x - x'| <= half_gap * absmax + |absmax - absmax'|
 * (the second term with double quantization: at most half the 8-bit map's gap times the
 * nested absmax); int8 |x - x'| <= scb / 254. Plus a few ulps of fp32 rounding. */
static int count_out_of_bound(const float *w, const float *d, const ft_qtensor *q)
{
    size_t n = (size_t)(q->rows * q->cols);
    int bad = 0;
    if (q->type == FT_QUANT_INT8) {
        for (size_t i = 0; i < n; i++) {
            float scb = q->scb[i / (size_t)q->cols];
            bad += fabsf(w[i] - d[i]) > scb / 254 * (1 + 1e-5f) + 1e-30f;
        }
        return bad;
    }
    float gap4 = max_half_gap(ft_quant_code(q->type), 16);
    float map[256];
    ft_quant_dynamic_map(map);
    float gap8 = max_half_gap(map, 256);
    for (size_t b = 0; b < q->n_blocks; b++) {
        size_t i0 = b * (size_t)q->blocksize, i1 = i0 + (size_t)q->blocksize;
        if (i1 > n)
            i1 = n;
        float amax = 0;
        for (size_t i = i0; i < i1; i++)
            amax = fmaxf(amax, fabsf(w[i]));
        float nested = q->nested ? gap8 * q->nested_absmax[b / 256] * 1.0001f + 1e-7f * amax : 0;
        for (size_t i = i0; i < i1; i++)
            bad += fabsf(w[i] - d[i]) > gap4 * amax * (1 + 1e-5f) + nested + 1e-30f;
    }
    return bad;
}

static void roundtrip(ft_quant_type type, int bs, bool dq, int64_t rows, int64_t cols, bool real)
{
    size_t n = (size_t)(rows * cols);
    float *w = malloc(n * sizeof *w), *d = malloc(n * sizeof *d);
    if (real)
        real_looking(w, rows, cols);
    else
        for (size_t i = 0; i < n; i++)
            w[i] = normal();
    ft_quant_options o = {type, bs, dq};
    ft_qtensor q;
    ft_err err = {0};
    CHECK(ft_quantize(w, rows, cols, &o, &q, &err) == 0);
    CHECK(ft_dequantize(&q, d) == 0);
    int bad = count_out_of_bound(w, d, &q);
    if (bad)
        fprintf(stderr, "  %s bs %d dq %d [%lld,%lld] real %d: %d elements out of bound\n",
                ft_quant_name(type), bs, dq, (long long)rows, (long long)cols, real, bad);
    CHECK(bad == 0);
    /* it quantized: not a copy, and the mean error is far below the bound */
    double err_sum = 0;
    for (size_t i = 0; i < n; i++)
        err_sum += fabs(w[i] - d[i]);
    CHECK(err_sum > 0);
    if (type != FT_QUANT_INT8 && n >= 50000) /* half a byte + the absmax per weight */
        CHECK(ft_qtensor_bytes(&q) < n * (0.52 + (dq ? 1.0 : 4.0) / bs));
    ft_qtensor_free(&q);
    free(w);
    free(d);
}

static void test_roundtrip_bounds(void)
{
    ft_quant_type types[] = {FT_QUANT_NF4, FT_QUANT_FP4};
    int sizes[][2] = {{64, 64}, {37, 91}, {7, 9}, {3, 3}, {256, 300}};
    int blocks[] = {32, 64, 128, 4096};
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < 5; s++)
            for (int b = 0; b < 4; b++)
                for (int dq = 0; dq < 2; dq++)
                    for (int real = 0; real < 2; real++)
                        roundtrip(types[t], blocks[b], dq, sizes[s][0], sizes[s][1], real);
    for (int s = 0; s < 5; s++)
        for (int real = 0; real < 2; real++)
            roundtrip(FT_QUANT_INT8, 0, false, sizes[s][0], sizes[s][1], real);
    /* enough blocks that double quantization has several nested blocks of 256 */
    roundtrip(FT_QUANT_NF4, 32, true, 300, 200, true);
}

/* A weight large enough to be quantized on every core gives the same bytes on 1 and 4
 * threads (the split is by whole blocks; FT_QUANT_MIN_PARALLEL in quant.c). */
static void test_threads_same_bytes(void)
{
    const int64_t rows = 512, cols = 1024;
    size_t n = (size_t)(rows * cols);
    float *w = malloc(n * sizeof *w);
    for (size_t i = 0; i < n; i++)
        w[i] = 0.02f * normal();
    ft_quant_type types[] = {FT_QUANT_NF4, FT_QUANT_FP4};
    int blocks[] = {64, 4096};
    int saved = omp_get_max_threads();
    for (int t = 0; t < 2; t++)
        for (int b = 0; b < 2; b++) {
            ft_quant_options o = {types[t], blocks[b], true};
            ft_qtensor one = {0}, four = {0};
            ft_err err = {0};
            omp_set_num_threads(1);
            CHECK(ft_quantize(w, rows, cols, &o, &one, &err) == 0);
            omp_set_num_threads(4);
            CHECK(ft_quantize(w, rows, cols, &o, &four, &err) == 0);
            CHECK(one.n_blocks == four.n_blocks);
            CHECK(memcmp(one.packed, four.packed, (n + 1) / 2) == 0);
            CHECK(memcmp(one.absmax_q, four.absmax_q, one.n_blocks) == 0);
            CHECK(one.nested_offset == four.nested_offset);
            ft_qtensor_free(&one);
            ft_qtensor_free(&four);
        }
    omp_set_num_threads(saved);
    free(w);
}

/* The decision trees against a plain nearest-code search: equal, except where x lies
 * within fp32 rounding of a midpoint. */
static void test_codes_are_nearest(void)
{
    ft_quant_type types[] = {FT_QUANT_NF4, FT_QUANT_FP4};
    for (int t = 0; t < 2; t++) {
        const float *code = ft_quant_code(types[t]);
        enum { N = 20000 };
        float *w = malloc(N * sizeof *w);
        for (int i = 0; i < N; i++)
            w[i] = (float)(2 * uniform() - 1);
        w[0] = 1.0f; /* absmax exactly 1: x * inv = x */
        ft_quant_options o = {types[t], 4096, false};
        ft_qtensor q;
        CHECK(ft_quantize(w, 1, N, &o, &q, NULL) == 0);
        int mismatches = 0;
        for (int i = 0; i < N && i < 4096; i++) {
            float x = w[i] * (1.0f / q.absmax[0]);
            int best = 0;
            for (int c = 1; c < 16; c++)
                if (fabsf(x - code[c]) < fabsf(x - code[best]))
                    best = c;
            int got = i % 2 ? q.packed[i / 2] & 15 : q.packed[i / 2] >> 4;
            if (got != best && fabsf(fabsf(x - code[got]) - fabsf(x - code[best])) > 1e-6f)
                mismatches++;
        }
        CHECK(mismatches == 0);
        ft_qtensor_free(&q);
        free(w);
    }
}

static void test_code_tables(void)
{
    const float *nf4 = ft_quant_code(FT_QUANT_NF4), *fp4 = ft_quant_code(FT_QUANT_FP4);
    CHECK(nf4[0] == -1.0f && nf4[7] == 0.0f && nf4[15] == 1.0f);
    for (int i = 0; i + 1 < 16; i++)
        CHECK(nf4[i] < nf4[i + 1]);
    CHECK(fp4[3] == 1.0f && fp4[11] == -1.0f && fp4[0] == 0.0f && fp4[8] == 0.0f);
    CHECK(fp4[2] == 8.0f / 12.0f && fp4[1] == 0.0625f / 12.0f);
    CHECK(ft_quant_code(FT_QUANT_INT8) == NULL);
    float map[256];
    ft_quant_dynamic_map(map);
    for (int i = 0; i + 1 < 256; i++)
        CHECK(map[i] <= map[i + 1]);
    CHECK(map[255] == 1.0f);
    int zeros = 0;
    for (int i = 0; i < 256; i++)
        zeros += map[i] == 0.0f;
    CHECK(zeros == 1);
    CHECK(map[0] < -0.99f && map[0] > -1.0f); /* the largest mean below 1, negated */
    CHECK(map[1] == -map[253] && map[127] == 0.0f);
}

/* Packing: the first element in the high nibble; an odd count padded with the code of 0. */
static void test_packing_order(void)
{
    float w[5] = {-1.0f, 1.0f, 0.0f, 1.0f, 0.0f};
    ft_quant_options o = {FT_QUANT_NF4, 64, false};
    ft_qtensor q;
    CHECK(ft_quantize(w, 1, 5, &o, &q, NULL) == 0);
    CHECK(q.packed[0] == 0x0F); /* -1 -> 0, 1 -> 15 */
    CHECK(q.packed[1] == 0x7F); /* 0 -> 7, 1 -> 15 */
    CHECK(q.packed[2] == 0x77); /* 0 -> 7, padding: the code of 0.0 */
    CHECK(q.n_blocks == 1 && q.absmax[0] == 1.0f);
    ft_qtensor_free(&q);
    o.type = FT_QUANT_FP4;
    CHECK(ft_quantize(w, 1, 5, &o, &q, NULL) == 0);
    CHECK(q.packed[0] == 0xB3); /* -1 -> sign 8 + 3, 1 -> 3 */
    CHECK(q.packed[1] == 0x03 && q.packed[2] == 0x00);
    ft_qtensor_free(&q);
}

/* All-zero blocks: absmax 0 and the code of 0.0 (the scale clamped to 1e-38, as in
 * bitsandbytes' reference backend); they dequantize to exactly 0, with double
 * quantization too. A size that is no multiple of the blocksize gets a partial last
 * block with its own absmax. */
static void test_zero_blocks_and_partial(void)
{
    enum { N = 64 * 3 + 5 };
    float w[N] = {0}, d[N];
    for (int i = 64; i < 128; i++)
        w[i] = (float)(i - 100) / 7.0f;
    w[N - 1] = 0.5f;
    ft_quant_options o = {FT_QUANT_NF4, 64, false};
    ft_qtensor q;
    CHECK(ft_quantize(w, 1, N, &o, &q, NULL) == 0);
    CHECK(q.n_blocks == 4);
    CHECK(q.absmax[0] == 0.0f && q.absmax[1] == 36.0f / 7.0f && q.absmax[2] == 0.0f);
    CHECK(q.absmax[3] == 0.5f);
    CHECK(q.packed[0] == 0x77 && q.packed[31] == 0x77);
    CHECK(ft_dequantize(&q, d) == 0);
    for (int i = 0; i < 64; i++)
        CHECK(d[i] == 0.0f);
    CHECK(d[N - 1] == 0.5f);
    ft_qtensor_free(&q);
    o.double_quant = true;
    CHECK(ft_quantize(w, 1, N, &o, &q, NULL) == 0);
    CHECK(ft_dequantize(&q, d) == 0);
    for (int i = 0; i < 64; i++)
        CHECK(d[i] == 0.0f);
    ft_qtensor_free(&q);
    o.double_quant = false;
    /* int8: a zero row stays zero, values round half to even */
    float r[6] = {0, 0, 0, 127, 63.5f, -0.5f};
    o.type = FT_QUANT_INT8;
    CHECK(ft_quantize(r, 2, 3, &o, &q, NULL) == 0);
    CHECK(q.scb[0] == 0 && q.q[0] == 0 && q.q[2] == 0);
    CHECK(q.q[3] == 127 && q.q[4] == 64 && q.q[5] == 0);
    ft_qtensor_free(&q);
}

/* The dequantization ops (kernels/ops.h) against their formulas written out: odd counts,
 * partial blocks, the high nibble first. */
static void test_dequant_ops(void)
{
    enum { N = 77, BS = 32, NB = (N + BS - 1) / BS };
    uint8_t packed[(N + 1) / 2], q8[N];
    int8_t qi[N];
    float absmax[NB], out[N], code[16], map[256], scb[7];
    for (int i = 0; i < (N + 1) / 2; i++)
        packed[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < N; i++) {
        q8[i] = (uint8_t)(i * 53 + 5);
        qi[i] = (int8_t)(i * 29 - 100);
    }
    for (int b = 0; b < NB; b++)
        absmax[b] = 0.5f + (float)b;
    for (int c = 0; c < 16; c++)
        code[c] = (float)c / 16 - 0.5f;
    for (int c = 0; c < 256; c++)
        map[c] = (float)c / 256 - 0.25f;
    for (int r = 0; r < 7; r++)
        scb[r] = 0.1f * (float)(r + 1);
    ft_dequant_4bit(ft_f32(out, N), ft_u8(packed, sizeof packed), ft_f32(absmax, NB),
                    ft_f32(code, 16), N, BS);
    for (int i = 0; i < N; i++) {
        int nib = i % 2 ? packed[i / 2] & 15 : packed[i / 2] >> 4;
        CHECK(out[i] == code[nib] * absmax[i / BS]);
    }
    ft_dequant_8bit_blockwise(ft_f32(out, N), ft_u8(q8, N), ft_f32(absmax, NB), ft_f32(map, 256),
                              N, BS, 0.125f);
    for (int i = 0; i < N; i++)
        CHECK(out[i] == map[q8[i]] * absmax[i / BS] + 0.125f);
    ft_dequant_int8_rows(ft_f32(out, N), ft_i8(qi, N), ft_f32(scb, 7), 7, 11);
    for (int i = 0; i < N; i++)
        CHECK(out[i] == ((float)qi[i] * scb[i / 11]) * 7.874015718698502e-3f);
}

/* ft_dequantize_to with a caller's absmax temporary computes what ft_dequantize does,
 * and the temporary's size is what the options predict; moving a qtensor to a device
 * either works (a GPU: counted in the weights category, all of it freed again) or fails
 * leaving it on the host as it was (no GPU, no CUDA backend, or the host asked for). */
static void test_dequantize_to_and_device_copy(void)
{
    enum { R = 37, CC = 45 };
    static float w[R * CC], a[R * CC], b[R * CC];
    real_looking(w, R, CC);
    static const ft_quant_options cases[] = {
        {FT_QUANT_NF4, 64, true}, {FT_QUANT_FP4, 32, false}, {FT_QUANT_NF4, 128, true},
        {FT_QUANT_INT8, 64, true}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ft_qtensor q;
        ft_err err = {0};
        CHECK(ft_quantize(w, R, CC, &cases[c], &q, &err) == 0);
        size_t nt = ft_qtensor_absmax_tmp(&q);
        CHECK(nt == ft_quant_absmax_tmp(&cases[c], R, CC));
        CHECK(nt == (cases[c].type != FT_QUANT_INT8 && cases[c].double_quant ? q.n_blocks : 0));
        float tmp[R * CC / 32 + 1];
        CHECK(ft_dequantize(&q, a) == 0);
        memset(b, 0xff, sizeof b);
        ft_dequantize_to(&q, ft_f32(b, R * CC), ft_f32(tmp, nt));
        CHECK(memcmp(a, b, sizeof a) == 0);

        ft_mem mem;
        memset(&mem, 0, sizeof mem);
        uint8_t *packed = q.packed;
        int8_t *q8 = q.q;
        CHECK(ft_qtensor_to_device(&q, &mem, FT_DEV_CPU, &err) == -1);
        CHECK(q.device == FT_DEV_CPU && q.packed == packed && q.q == q8 && mem.live_total == 0);
        if (ft_qtensor_to_device(&q, &mem, FT_DEV_CUDA, &err) == 0) {
            size_t code = cases[c].type == FT_QUANT_INT8 ? 0 : 16 * sizeof(float);
            CHECK(q.device == FT_DEV_CUDA);
            CHECK(mem.live[FT_MEM_WEIGHTS] == ft_qtensor_bytes(&q) + code);
        } else {
            CHECK(q.device == FT_DEV_CPU && q.packed == packed && q.q == q8);
            CHECK(mem.live_total == 0 && err.msg[0]);
        }
        ft_qtensor_free_on(&q, &mem);
        CHECK(mem.live_total == 0 && q.type == FT_QUANT_NONE);
    }
}

static void test_rejects_bad_input(void)
{
    float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ft_qtensor q;
    ft_err err = {0};
    ft_quant_options o = {FT_QUANT_NF4, 64, true};
    w[5] = INFINITY;
    CHECK(ft_quantize(w, 2, 4, &o, &q, &err) != 0);
    CHECK(strstr(err.msg, "[1, 1]") && strstr(err.msg, "inf"));
    w[5] = NAN;
    CHECK(ft_quantize(w, 2, 4, &o, &q, &err) != 0 && strstr(err.msg, "NaN"));
    w[5] = 6;
    o.blocksize = 48;
    CHECK(ft_quantize(w, 2, 4, &o, &q, &err) != 0 && strstr(err.msg, "blocksize 48"));
    o.blocksize = 8192;
    CHECK(ft_quantize(w, 2, 4, &o, &q, &err) != 0);
    o = (ft_quant_options){FT_QUANT_NONE, 64, false};
    CHECK(ft_quantize(w, 2, 4, &o, &q, &err) != 0);
    ft_quant_type t;
    CHECK(ft_quant_parse("nf5", &t, &err) != 0 && strstr(err.msg, "nf5"));
    CHECK(ft_quant_parse("fp4", &t, &err) == 0 && t == FT_QUANT_FP4);
}

/* ---- the checkpoint layout */

static char dir[64];

static int save_one(const char *name, const ft_qtensor *q, const char *drop, const char *swap,
                    const void *swap_data, ft_st_dtype swap_dt, int64_t swap_len)
{
    ft_st_writer *w = ft_st_writer_new();
    ft_st_writer *out = ft_st_writer_new();
    ft_err err;
    int rc = ft_qtensor_write(w, name, q, "float32", &err);
    /* copy into a second writer, dropping or replacing one tensor */
    char path[128];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (rc == 0 && ft_st_writer_save(w, path, &err) == 0) {
        ft_st_file *f;
        CHECK(ft_st_open(&f, path, &err) == 0);
        for (size_t i = 0; i < ft_st_count(f); i++) {
            const ft_st_tensor *t = ft_st_at(f, i);
            if (drop && strcmp(t->name, drop) == 0)
                continue;
            if (swap && strcmp(t->name, swap) == 0)
                ft_st_writer_add(out, t->name, swap_dt, 1, &swap_len, swap_data, &err);
            else
                ft_st_writer_add(out, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
        }
        rc = ft_st_writer_save(out, path, &err);
        ft_st_close(f);
    }
    ft_st_writer_free(w);
    ft_st_writer_free(out);
    return rc;
}

static int read_back(const char *name, int64_t rows, int64_t cols, ft_qtensor *q, ft_err *err)
{
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, dir, "model", err))
        return -1;
    int rc = ft_qtensor_read(ck, name, rows, cols, q, err);
    ft_ckpt_close(ck);
    return rc;
}

static void test_checkpoint_roundtrip(void)
{
    const char *p = "model.layers.0.mlp.up_proj";
    ft_quant_options opts[] = {{FT_QUANT_NF4, 64, true}, {FT_QUANT_FP4, 128, false},
                               {FT_QUANT_INT8, 0, false}, {FT_QUANT_NF4, 32, true}};
    int64_t rows = 48, cols = 77;
    float *w = malloc((size_t)(rows * cols) * sizeof *w), *a = malloc((size_t)(rows * cols) * 4),
          *b = malloc((size_t)(rows * cols) * 4);
    real_looking(w, rows, cols);
    for (int k = 0; k < 4; k++) {
        ft_qtensor q, r;
        ft_err err = {0};
        CHECK(ft_quantize(w, rows, cols, &opts[k], &q, &err) == 0);
        CHECK(save_one(p, &q, NULL, NULL, NULL, 0, 0) == 0);
        ft_checkpoint *ck;
        CHECK(ft_ckpt_open(&ck, dir, "model", &err) == 0);
        CHECK(ft_qtensor_probe(ck, p) == opts[k].type);
        CHECK(ft_qtensor_probe(ck, "model.layers.0.mlp.down_proj") == FT_QUANT_NONE);
        ft_ckpt_close(ck);
        CHECK(read_back(p, rows, cols, &r, &err) == 0);
        CHECK(ft_dequantize(&q, a) == 0 && ft_dequantize(&r, b) == 0);
        CHECK(memcmp(a, b, (size_t)(rows * cols) * 4) == 0);
        CHECK(ft_qtensor_bytes(&q) == ft_qtensor_bytes(&r));
        CHECK(read_back(p, rows, cols + 1, &r, &err) != 0);
        ft_qtensor_free(&q);
    }
    free(w);
    free(a);
    free(b);
}

static void expect_corrupt(const ft_qtensor *q, const char *drop, const char *swap,
                           const void *data, ft_st_dtype dt, int64_t len, const char *want)
{
    ft_qtensor r;
    ft_err err = {0};
    CHECK(save_one("m.q_proj", q, drop, swap, data, dt, len) == 0);
    int rc = read_back("m.q_proj", q->rows, q->cols, &r, &err);
    CHECK(rc != 0);
    if (rc == 0)
        ft_qtensor_free(&r);
    else if (!strstr(err.msg, want))
        fprintf(stderr, "  want '%s' in: %s\n", want, err.msg);
    CHECK(rc != 0 && strstr(err.msg, want));
}

static void test_corrupt_checkpoints(void)
{
    float w[40 * 70];
    real_looking(w, 40, 70);
    ft_quant_options o = {FT_QUANT_NF4, 64, true};
    ft_qtensor q;
    CHECK(ft_quantize(w, 40, 70, &o, &q, NULL) == 0);
    uint8_t bytes[64] = {0};
    float floats[300] = {0};
    expect_corrupt(&q, NULL, "m.q_proj.weight.absmax", bytes, FT_ST_U8, 40,
                   "m.q_proj.weight.absmax' holds 40 values, expected 44");
    expect_corrupt(&q, NULL, "m.q_proj.weight.absmax", floats, FT_ST_F32, 44,
                   "'m.q_proj.weight.absmax' is F32, expected U8");
    expect_corrupt(&q, "m.q_proj.weight.nested_absmax", NULL, NULL, 0, 0,
                   "'m.q_proj.weight.nested_absmax' is missing");
    expect_corrupt(&q, NULL, "m.q_proj.weight.quant_map", floats, FT_ST_F32, 16,
                   "not bitsandbytes' nf4 code table");
    expect_corrupt(&q, NULL, "m.q_proj.weight", bytes, FT_ST_U8, 64, "expected 1400");
    const char *bad_json = "{\"quant_type\": \"nf4\", \"blocksize\": 64";
    expect_corrupt(&q, NULL, "m.q_proj.weight.quant_state.bitsandbytes__nf4", bad_json, FT_ST_U8,
                   (int64_t)strlen(bad_json), "not a JSON object");
    const char *bad_shape = "{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", "
                            "\"shape\": [70, 40], \"nested_blocksize\": 256, "
                            "\"nested_dtype\": \"float32\", \"nested_offset\": 0.5}";
    expect_corrupt(&q, NULL, "m.q_proj.weight.quant_state.bitsandbytes__nf4", bad_shape,
                   FT_ST_U8, (int64_t)strlen(bad_shape), "shape is not [40, 70]");
    const char *bad_bs = "{\"quant_type\": \"nf4\", \"blocksize\": 60, \"shape\": [40, 70]}";
    expect_corrupt(&q, NULL, "m.q_proj.weight.quant_state.bitsandbytes__nf4", bad_bs, FT_ST_U8,
                   (int64_t)strlen(bad_bs), "blocksize must be a power of two");
    const char *fp4_state = "{\"quant_type\": \"fp4\", \"blocksize\": 64, \"shape\": [40, 70]}";
    expect_corrupt(&q, NULL, "m.q_proj.weight.quant_state.bitsandbytes__nf4", fp4_state,
                   FT_ST_U8, (int64_t)strlen(fp4_state), "quant_type fp4 does not match");
    /* every field of the quant_state of its type; no key twice */
    static const struct {
        const char *json, *want;
    } states[] = {
#define NESTED "\"nested_blocksize\": 256, \"nested_dtype\": \"float32\", \"nested_offset\": 0.5"
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"int4\", \"shape\": [40, 70], "
         NESTED "}", "dtype 'int4' is not bfloat16, float16 or float32"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"torch.float16\", "
         "\"shape\": [40, 70], " NESTED "}", "dtype 'torch.float16'"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": 16, \"shape\": [40, 70], "
         NESTED "}", "dtype not a string"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"shape\": [40, 70], " NESTED "}",
         "dtype missing"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": \"64\", \"dtype\": \"float32\", "
         "\"shape\": [40, 70], " NESTED "}", "blocksize"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", "
         "\"shape\": [40, \"70\"], " NESTED "}", "shape is not [40, 70]"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", "
         "\"shape\": [40, 70], \"nested_blocksize\": 256, \"nested_dtype\": \"float16\", "
         "\"nested_offset\": 0.5}", "nested_dtype float16 is not float32"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", "
         "\"shape\": [40, 70], \"nested_blocksize\": 256, \"nested_offset\": 0.5}",
         "nested_dtype (missing)"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", "
         "\"shape\": [40, 70], \"nested_blocksize\": 256, \"nested_dtype\": \"float32\", "
         "\"nested_offset\": 1e300}", "nested_offset"},
        {"{\"quant_type\": \"nf4\", \"blocksize\": 64, \"dtype\": \"float32\", "
         "\"dtype\": \"bfloat16\", \"shape\": [40, 70], " NESTED "}", "duplicate"},
#undef NESTED
    };
    for (size_t i = 0; i < sizeof states / sizeof *states; i++)
        expect_corrupt(&q, NULL, "m.q_proj.weight.quant_state.bitsandbytes__nf4", states[i].json,
                       FT_ST_U8, (int64_t)strlen(states[i].json), states[i].want);
    /* the scales must be finite: one NaN makes a block (or a row) NaN */
    float scales[256];
    memcpy(scales, q.nested_map, sizeof scales);
    scales[200] = NAN;
    expect_corrupt(&q, NULL, "m.q_proj.weight.nested_quant_map", scales, FT_ST_F32, 256,
                   "'m.q_proj.weight.nested_quant_map': element [200] is NaN");
    for (int i = 0; i < 256; i++)
        scales[i] = 0.5f;
    scales[0] = INFINITY;
    expect_corrupt(&q, NULL, "m.q_proj.weight.nested_absmax", scales, FT_ST_F32, 1,
                   "'m.q_proj.weight.nested_absmax': element [0] is inf");
    ft_qtensor_free(&q);
    o.double_quant = false;
    CHECK(ft_quantize(w, 40, 70, &o, &q, NULL) == 0);
    memcpy(scales, q.absmax, 44 * sizeof *scales);
    scales[43] = -INFINITY;
    expect_corrupt(&q, NULL, "m.q_proj.weight.absmax", scales, FT_ST_F32, 44,
                   "'m.q_proj.weight.absmax': element [43] is -inf");
    ft_qtensor_free(&q);
    o.type = FT_QUANT_INT8;
    CHECK(ft_quantize(w, 40, 70, &o, &q, NULL) == 0);
    expect_corrupt(&q, NULL, "m.q_proj.SCB", floats, FT_ST_F32, 39, "expected 40");
    for (int i = 0; i < 40; i++)
        scales[i] = 1.0f;
    scales[7] = NAN;
    expect_corrupt(&q, NULL, "m.q_proj.SCB", scales, FT_ST_F32, 40,
                   "'m.q_proj.SCB': element [7] is NaN");
    uint8_t fmt = 2;
    expect_corrupt(&q, NULL, "m.q_proj.weight_format", &fmt, FT_ST_U8, 1, "row-major");
    ft_qtensor_free(&q);
}

/* Block-wise shards (quant_shard.h): over 1..5 ranks each array is cut into contiguous
 * ranges that tile it in rank order, cut at block (int8: row) boundaries, the same
 * blocks in every array; the ranges of a rank, dequantized as a qtensor of their own,
 * give that rank's part of the whole weight, bit for bit (the nested state whole); and
 * ft_qshard_meta describes what ft_quantize makes. */
static void test_shards(void)
{
    static const struct {
        ft_quant_type t;
        int bs;
        bool dq;
        int64_t rows, cols;
    } cases[] = {{FT_QUANT_NF4, 64, true, 33, 97},   {FT_QUANT_NF4, 64, false, 8, 16},
                 {FT_QUANT_FP4, 32, false, 5, 13},   {FT_QUANT_NF4, 128, true, 300, 129},
                 {FT_QUANT_INT8, 64, false, 7, 11},  {FT_QUANT_NF4, 64, true, 1, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int64_t R = cases[c].rows, C = cases[c].cols;
        size_t n = (size_t)(R * C);
        float *w = malloc(n * sizeof *w), *whole = malloc(n * sizeof *whole),
              *part = malloc(n * sizeof *part);
        for (size_t i = 0; i < n; i++)
            w[i] = (float)(uniform() * 2 - 1) * (i % 7 == 0 ? 5.0f : 1.0f);
        ft_quant_options o = {cases[c].t, cases[c].bs, cases[c].dq};
        ft_qtensor q;
        ft_err err;
        CHECK(ft_quantize(w, R, C, &o, &q, &err) == 0);
        CHECK(ft_dequantize(&q, whole) == 0);
        ft_qtensor meta = ft_qshard_meta(&o, R, C);
        CHECK(meta.type == q.type && meta.n_blocks == q.n_blocks && meta.nested == q.nested &&
              meta.blocksize == (q.type == FT_QUANT_INT8 ? meta.blocksize : q.blocksize));
        size_t bytes[FT_QSHARD_MAX_ARRAYS];
        int na = ft_qshard_arrays(&q, bytes);
        CHECK(na == 2);
        size_t total = 0;
        for (int a = 0; a < na; a++)
            total += bytes[a];
        CHECK(total + ft_qshard_replicated(&q) == ft_qtensor_bytes(&q));
        size_t G = ft_qshard_granules(&q);
        for (int W = 1; W <= 5; W++) {
            size_t sum = 0;
            for (int r = 0; r < W; r++) {
                size_t lo[FT_QSHARD_MAX_ARRAYS], hi[FT_QSHARD_MAX_ARRAYS];
                for (int a = 0; a < na; a++) {
                    ft_qshard_range(&q, a, r, W, &lo[a], &hi[a]);
                    size_t plo, phi; /* the previous rank's range ends where this starts */
                    if (r > 0) {
                        ft_qshard_range(&q, a, r - 1, W, &plo, &phi);
                        CHECK(phi == lo[a]);
                    } else {
                        CHECK(lo[a] == 0);
                    }
                    if (r == W - 1)
                        CHECK(hi[a] == bytes[a]);
                }
                sum += ft_qshard_bytes(&q, r, W);
                /* granules [g0, g1): the part of the weight this rank's bytes hold */
                size_t g0 = G * (size_t)r / (size_t)W, g1 = G * (size_t)(r + 1) / (size_t)W;
                size_t per = q.type == FT_QUANT_INT8 ? (size_t)C : (size_t)q.blocksize;
                size_t e0 = g0 * per, e1 = g1 * per < n ? g1 * per : n;
                if (e1 <= e0)
                    continue;
                ft_qtensor v = q; /* a qtensor of this rank's granules only */
                if (q.type == FT_QUANT_INT8) {
                    v.rows = (int64_t)(g1 - g0);
                } else {
                    v.rows = 1;
                    v.cols = (int64_t)(e1 - e0);
                    v.n_blocks = g1 - g0;
                }
                for (int a = 0; a < na; a++)
                    *ft_qshard_array(&v, a) = (char *)*ft_qshard_array(&q, a) + lo[a];
                if (q.nested) { /* the nested absmax of this rank's first block onward */
                    if (g0 % (size_t)q.nested_blocksize != 0)
                        continue; /* (a group split between ranks: only whole gathers read it) */
                    v.nested_absmax = q.nested_absmax + g0 / (size_t)q.nested_blocksize;
                }
                CHECK(ft_dequantize(&v, part) == 0);
                CHECK(memcmp(part, whole + e0, (e1 - e0) * sizeof(float)) == 0);
            }
            CHECK(sum == total);
        }
        ft_qtensor_free(&q);
        free(w);
        free(whole);
        free(part);
    }
}

static void test_quant_config(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    struct {
        const char *json, *want;
    } cases[] = {
        {"{\"quantization_config\": {\"quant_method\": \"gptq\"}}", "'gptq' is not supported"},
        {"{\"quantization_config\": {\"quant_method\": \"bitsandbytes\"}}", "exactly one"},
        {"{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, "
         "\"bnb_4bit_quant_type\": \"int4\"}}",
         "bnb_4bit_quant_type 'int4'"},
    };
    ft_quant_config qc;
    ft_err err;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        FILE *f = fopen(path, "w");
        fputs(cases[i].json, f);
        fclose(f);
        CHECK(ft_quant_config_read(path, &qc, &err) != 0 && strstr(err.msg, cases[i].want));
    }
    FILE *f = fopen(path, "w");
    fputs("{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true,"
          " \"load_in_8bit\": false, \"bnb_4bit_quant_type\": \"nf4\", "
          "\"bnb_4bit_use_double_quant\": true, \"bnb_4bit_compute_dtype\": \"bfloat16\", "
          "\"llm_int8_skip_modules\": [\"lm_head\", \"mlp.down_proj\"]}}",
          f);
    fclose(f);
    CHECK(ft_quant_config_read(path, &qc, &err) == 0);
    CHECK(qc.present && qc.opt.type == FT_QUANT_NF4 && qc.opt.double_quant && qc.opt.blocksize == 64);
    CHECK(strcmp(qc.compute_dtype, "bfloat16") == 0 && strcmp(qc.skip, "lm_head,mlp.down_proj") == 0);
    f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\"}", f);
    fclose(f);
    CHECK(ft_quant_config_read(path, &qc, &err) == 0 && !qc.present);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/ft-test-quant-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    RUN(test_code_tables);
    RUN(test_roundtrip_bounds);
    RUN(test_codes_are_nearest);
    RUN(test_threads_same_bytes);
    RUN(test_packing_order);
    RUN(test_zero_blocks_and_partial);
    RUN(test_dequant_ops);
    RUN(test_dequantize_to_and_device_copy);
    RUN(test_rejects_bad_input);
    RUN(test_checkpoint_roundtrip);
    RUN(test_corrupt_checkpoints);
    RUN(test_quant_config);
    RUN(test_shards);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("quant");
}
