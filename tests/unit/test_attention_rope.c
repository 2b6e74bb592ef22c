/* Tests of the CPU reference RoPE and causal GQA attention (kernels/cpu/rope.c,
 * kernels/cpu/attention.c).
 *
 * References and tolerances (CHECK_CLOSE is |a - b| <= tol * max(1, |b|)):
 * - RoPE forward: a double reference that takes the same fp32 angle
 *   (float)pos * inv_freq[i] and rotates in double; 1e-6 (the op only adds fp32
 *   rounding of cos/sin and of two products).
 * - RoPE backward: central finite differences of L = sum(rope(x) * r) on the double
 *   reference (L is linear in x, so the difference quotient is exact up to rounding);
 *   1e-6. Plus backward(forward(x)) == x, pair norms preserved, pos 0 the identity
 *   (bitwise). Rows sharing positions (the op's position table) give the bits of the
 *   same rows one at a time, through changes of frequencies, scale, width and length.
 * - Attention forward: a naive double reference (explicit T x T scores, mask, softmax
 *   with max subtraction); out and lse to 1e-5. Cases: MHA, GQA, MQA, odd sizes, T = 1,
 *   contiguous and interleaved segment ids, sliding windows, large logits, T > 64
 *   (several query blocks) and T > 512 (several key chunks of the op's online softmax).
 * - Attention backward: central finite differences of L = sum(out * r) computed on the
 *   double reference (step 1e-5, truncation error ~1e-10), so the tolerance only has to
 *   cover the fp32 op's own rounding: 1e-4. Every element of dq, dk, dv is checked.
 *   Accumulation into non-zero gradients to 1e-6; NULL for unwanted gradients leaves
 *   the others bitwise unchanged. Long sequences (several query blocks and key chunks):
 *   the directional derivative along a random direction, per input, the same way, 1e-4.
 * - Attention forward and backward give the same bits on 1 and 3 threads and inside a
 *   parallel region.
 * - Packed sequences (seg ids, positions restarting per segment) equal running each
 *   segment alone, forward and backward, to 1e-6. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/cpu_ops.h"

/* ---- helpers ------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

/* uniform in [-1, 1) */
static float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_buf(size_t n, float amp)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        p[i] = amp * frand();
    }
    return p;
}

static float *copy_buf(const float *x, size_t n)
{
    float *p = malloc(n * sizeof(float));
    memcpy(p, x, n * sizeof(float));
    return p;
}

static double *to_double(const float *x, size_t n)
{
    double *p = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        p[i] = x[i];
    }
    return p;
}

/* inv_freq[i] = theta^(-2i/D), rounded to fp32 as HF stores it. */
static void make_inv_freq(float *inv_freq, int D, double theta)
{
    for (int i = 0; i < D / 2; i++) {
        inv_freq[i] = (float)(1.0 / pow(theta, (double)(2 * i) / D));
    }
}

/* ---- RoPE reference ------------------------------------------------------------ */

/* y = rope(x) in double, from the same fp32 angle the op uses: the first rd dims of
 * each head rotate (cos and sin times scale), the rest are copied. */
static void rope_ref_rd(double *y, const double *x, const int32_t *pos, const float *inv_freq,
                        int N, int heads, int D, int rd, double scale)
{
    const int h = rd / 2;
    for (int n = 0; n < N; n++) {
        for (int hd = 0; hd < heads; hd++) {
            const double *xr = x + ((size_t)n * heads + hd) * D;
            double *yr = y + ((size_t)n * heads + hd) * D;
            for (int i = 0; i < h; i++) {
                const float a = (float)pos[n] * inv_freq[i];
                const double c = cos((double)a) * scale, s = sin((double)a) * scale;
                yr[i] = xr[i] * c - xr[i + h] * s;
                yr[i + h] = xr[i + h] * c + xr[i] * s;
            }
            for (int i = rd; i < D; i++)
                yr[i] = xr[i];
        }
    }
}

static void rope_ref(double *y, const double *x, const int32_t *pos, const float *inv_freq,
                     int N, int heads, int D)
{
    rope_ref_rd(y, x, pos, inv_freq, N, heads, D, D, 1.0);
}

/* Shapes for the RoPE tests: D = 300 exercises more than one cos/sin chunk. */
static const int rope_D[] = {8, 6, 128, 300};
static const int32_t rope_pos[] = {0, 1, 2, 7, 31, 1000, 4095, 100000};
#define ROPE_N ((int)(sizeof(rope_pos) / sizeof(rope_pos[0])))
#define ROPE_HEADS 3

static void test_rope_forward(void)
{
    for (size_t c = 0; c < sizeof(rope_D) / sizeof(rope_D[0]); c++) {
        for (int th = 0; th < 2; th++) {
            const int D = rope_D[c];
            const size_t n = (size_t)ROPE_N * ROPE_HEADS * D;
            float inv_freq[150];
            make_inv_freq(inv_freq, D, th ? 500000.0 : 10000.0);
            float *x = rand_buf(n, 2.0f);
            double *xd = to_double(x, n);
            double *yd = malloc(n * sizeof(double));
            rope_ref(yd, xd, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D);
            ft_cpu_rope_forward(x, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, D, 1.0f);
            for (size_t i = 0; i < n; i++) {
                CHECK_CLOSE(x[i], yd[i], 1e-6);
            }
            free(x);
            free(xd);
            free(yd);
        }
    }
}

static void test_rope_backward_fd(void)
{
    for (size_t c = 0; c < sizeof(rope_D) / sizeof(rope_D[0]); c++) {
        const int D = rope_D[c];
        const size_t n = (size_t)ROPE_N * ROPE_HEADS * D;
        float inv_freq[150];
        make_inv_freq(inv_freq, D, 10000.0);
        float *x = rand_buf(n, 1.0f);
        float *r = rand_buf(n, 1.0f);
        double *xd = to_double(x, n);
        double *yd = malloc(n * sizeof(double));

        /* analytic: dL/dx = rope_backward(r) */
        float *g = copy_buf(r, n);
        ft_cpu_rope_backward(g, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, D, 1.0f);

        const double step = 1e-3;
        for (size_t e = 0; e < n; e++) {
            double lp = 0.0, lm = 0.0;
            const double x0 = xd[e];
            xd[e] = x0 + step;
            rope_ref(yd, xd, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D);
            for (size_t i = 0; i < n; i++) {
                lp += yd[i] * r[i];
            }
            xd[e] = x0 - step;
            rope_ref(yd, xd, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D);
            for (size_t i = 0; i < n; i++) {
                lm += yd[i] * r[i];
            }
            xd[e] = x0;
            CHECK_CLOSE(g[e], (lp - lm) / (2.0 * step), 1e-6);
        }

        /* backward undoes forward (the rotation is orthogonal) */
        float *y = copy_buf(x, n);
        ft_cpu_rope_forward(y, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, D, 1.0f);
        ft_cpu_rope_backward(y, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, D, 1.0f);
        for (size_t i = 0; i < n; i++) {
            CHECK_CLOSE(y[i], x[i], 1e-6);
        }
        free(x);
        free(r);
        free(xd);
        free(yd);
        free(g);
        free(y);
    }
}

/* Rows that share positions (max pos < rows: the op's kept table of every position)
 * give the bits of the same rows one at a time (pos >= 1 alone: the per-row path) and
 * match the double reference; calls that change the frequencies, the scale, the
 * partial rotary width or the longest position each get their own values (the table is
 * kept only while they are the same), and so does the backward. */
static void rope_table_case(const float *inv_freq, int D, int rd, float scale, int T,
                            int rows, int backward)
{
    const int heads = 3, N = T * rows;
    const size_t width = (size_t)heads * D, n = (size_t)N * width;
    int32_t *pos = malloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        pos[i] = i % T;
    float *x = rand_buf(n, 2.0f), *y = copy_buf(x, n), *y1 = copy_buf(x, n);
    if (backward)
        ft_cpu_rope_backward(y, pos, inv_freq, N, heads, D, rd, scale);
    else
        ft_cpu_rope_forward(y, pos, inv_freq, N, heads, D, rd, scale);
    for (int i = 0; i < N; i++) {
        if (backward)
            ft_cpu_rope_backward(y1 + i * width, pos + i, inv_freq, 1, heads, D, rd, scale);
        else
            ft_cpu_rope_forward(y1 + i * width, pos + i, inv_freq, 1, heads, D, rd, scale);
    }
    CHECK(!memcmp(y, y1, n * sizeof(float)));
    double *xd = to_double(x, n), *yd = malloc(n * sizeof(double));
    rope_ref_rd(yd, xd, pos, inv_freq, N, heads, D, rd, scale);
    for (size_t i = 0; i < n && !backward; i++)
        CHECK_CLOSE(y[i], yd[i], 1e-6);
    free(pos);
    free(x);
    free(y);
    free(y1);
    free(xd);
    free(yd);
}

static void test_rope_position_table(void)
{
    float fa[32], fb[32];
    make_inv_freq(fa, 64, 10000.0);
    make_inv_freq(fb, 64, 500000.0);
    rope_table_case(fa, 64, 64, 1.0f, 40, 3, 0);
    rope_table_case(fb, 64, 64, 1.0f, 40, 3, 0);  /* other frequencies */
    rope_table_case(fb, 64, 64, 0.75f, 40, 3, 0); /* another scale */
    rope_table_case(fb, 64, 48, 0.75f, 40, 3, 0); /* fewer frequencies (partial rotary) */
    rope_table_case(fb, 64, 64, 1.0f, 90, 2, 0);  /* longer positions than kept */
    rope_table_case(fb, 64, 64, 1.0f, 90, 2, 1);
    rope_table_case(fa, 64, 64, 1.0f, 7, 4, 1);
}

static void test_rope_norm_and_identity(void)
{
    const int D = 64, h = D / 2;
    const size_t n = (size_t)ROPE_N * ROPE_HEADS * D;
    float inv_freq[32];
    make_inv_freq(inv_freq, D, 10000.0);
    float *x = rand_buf(n, 3.0f);
    float *y = copy_buf(x, n);
    ft_cpu_rope_forward(y, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, D, 1.0f);
    for (int row = 0; row < ROPE_N * ROPE_HEADS; row++) {
        const float *xr = x + (size_t)row * D, *yr = y + (size_t)row * D;
        for (int i = 0; i < h; i++) {
            const double nx = (double)xr[i] * xr[i] + (double)xr[i + h] * xr[i + h];
            const double ny = (double)yr[i] * yr[i] + (double)yr[i + h] * yr[i + h];
            CHECK_CLOSE(ny / fmax(nx, 1e-30), 1.0, 1e-5);
        }
    }

    /* position 0 is the identity, bitwise, forward and backward */
    int32_t zeros[ROPE_N] = {0};
    memcpy(y, x, n * sizeof(float));
    ft_cpu_rope_forward(y, zeros, inv_freq, ROPE_N, ROPE_HEADS, D, D, 1.0f);
    CHECK(memcmp(x, y, n * sizeof(float)) == 0);
    ft_cpu_rope_backward(y, zeros, inv_freq, ROPE_N, ROPE_HEADS, D, D, 1.0f);
    CHECK(memcmp(x, y, n * sizeof(float)) == 0);
    free(x);
    free(y);
}

/* Partial rotary (rd < D: Phi-4-mini's 0.75) with longrope's cos/sin scale: forward
 * against the double reference (the pass-through dims bitwise), backward against central
 * finite differences of L = sum(rope(x) * r), and forward then backward is the identity
 * times scale^2 on the rotated dims (a scaled rotation). */
static void test_rope_partial_scaled(void)
{
    static const struct {
        int D, rd;
        float scale;
    } cases[] = {{8, 6, 1.0f}, {16, 12, 1.1902f}, {12, 2, 0.75f}, {300, 226, 1.0f},
                 {64, 64, 1.3f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int D = cases[c].D, rd = cases[c].rd;
        const float sc = cases[c].scale;
        const size_t n = (size_t)ROPE_N * ROPE_HEADS * D;
        float inv_freq[150];
        make_inv_freq(inv_freq, rd, 10000.0);
        float *x = rand_buf(n, 1.0f);
        float *r = rand_buf(n, 1.0f);
        double *xd = to_double(x, n);
        double *yd = malloc(n * sizeof(double));
        float *y = copy_buf(x, n);
        ft_cpu_rope_forward(y, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, rd, sc);
        rope_ref_rd(yd, xd, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, rd, sc);
        for (size_t i = 0; i < n; i++) {
            CHECK_CLOSE(y[i], yd[i], 2e-6);
            if ((int)(i % D) >= rd)
                CHECK(y[i] == x[i]);
        }
        float *g = copy_buf(r, n);
        ft_cpu_rope_backward(g, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, rd, sc);
        const double step = 1e-3;
        for (size_t e = 0; e < n; e += (D > 64 ? 7 : 1)) {
            double lp = 0.0, lm = 0.0;
            const double x0 = xd[e];
            xd[e] = x0 + step;
            rope_ref_rd(yd, xd, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, rd, sc);
            for (size_t i = 0; i < n; i++)
                lp += yd[i] * r[i];
            xd[e] = x0 - step;
            rope_ref_rd(yd, xd, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, rd, sc);
            for (size_t i = 0; i < n; i++)
                lm += yd[i] * r[i];
            xd[e] = x0;
            CHECK_CLOSE(g[e], (lp - lm) / (2.0 * step), 2e-6);
        }
        ft_cpu_rope_backward(y, rope_pos, inv_freq, ROPE_N, ROPE_HEADS, D, rd, sc);
        for (size_t i = 0; i < n; i++)
            CHECK_CLOSE(y[i], (int)(i % D) < rd ? x[i] * (double)sc * sc : x[i], 2e-6);
        free(x), free(r), free(xd), free(yd), free(y), free(g);
    }
}

/* ---- attention reference ------------------------------------------------------- */

typedef struct att_case {
    const char *name;
    int B, T, Hq, Hkv, D, window;
    float scale; /* 0: 1/sqrt(D) */
    float amp;   /* input amplitude */
    int segmented; /* 0: seg NULL; 1, 2: make_seg kind */
    float softcap;   /* 0: none; else S = softcap tanh(scale q.k / softcap) */
} att_case;

static int allowed(const int32_t *seg, int b, int T, int i, int j, int window)
{
    if (j > i) {
        return 0;
    }
    if (window > 0 && i - j >= window) {
        return 0;
    }
    if (seg && seg[b * T + j] != seg[b * T + i]) {
        return 0;
    }
    return 1;
}

/* Naive attention in double: explicit T x T scores per (b, h). */
static void att_ref(double *out, double *lse, const double *q, const double *k,
                    const double *v, const int32_t *seg, int B, int T, int Hq, int Hkv,
                    int D, double scale, int window, double softcap)
{
    const int G = Hq / Hkv;
    double *S = malloc((size_t)T * T * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            const int g = h / G;
            for (int i = 0; i < T; i++) {
                const double *qi = q + (((size_t)b * T + i) * Hq + h) * D;
                for (int j = 0; j < T; j++) {
                    const double *kj = k + (((size_t)b * T + j) * Hkv + g) * D;
                    double s = 0.0;
                    for (int d = 0; d < D; d++) {
                        s += qi[d] * kj[d];
                    }
                    s *= scale;
                    if (softcap > 0) {
                        s = softcap * tanh(s / softcap);
                    }
                    S[(size_t)i * T + j] = allowed(seg, b, T, i, j, window) ? s : -INFINITY;
                }
            }
            for (int i = 0; i < T; i++) {
                double *Si = S + (size_t)i * T;
                double m = -INFINITY, sum = 0.0;
                for (int j = 0; j < T; j++) {
                    m = fmax(m, Si[j]);
                }
                for (int j = 0; j < T; j++) {
                    Si[j] = exp(Si[j] - m);
                    sum += Si[j];
                }
                double *oi = out + (((size_t)b * T + i) * Hq + h) * D;
                for (int d = 0; d < D; d++) {
                    oi[d] = 0.0;
                }
                for (int j = 0; j < T; j++) {
                    const double *vj = v + (((size_t)b * T + j) * Hkv + g) * D;
                    for (int d = 0; d < D; d++) {
                        oi[d] += Si[j] / sum * vj[d];
                    }
                }
                if (lse) {
                    lse[((size_t)b * Hq + h) * T + i] = m + log(sum);
                }
            }
        }
    }
    free(S);
}

/* kind 1: contiguous segment ids [0,0,0,1,1,2,2,2,2,3,...] (the lengths of row b
 * start b places further along the list, so rows differ); kind 2: interleaved ids
 * (t / 2) % 3, which ops.h's definition (same id) still has to honour. */
static int32_t *make_seg(int B, int T, int kind)
{
    static const int lens[] = {3, 2, 4, 1, 5, 7};
    int32_t *seg = malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B && kind == 2; b++) {
        for (int t = 0; t < T; t++) {
            seg[b * T + t] = (t / 2 + b) % 3;
        }
    }
    for (int b = 0; b < B && kind == 1; b++) {
        int id = 0, left = lens[b % 6];
        for (int t = 0; t < T; t++) {
            if (left == 0) {
                id++;
                left = lens[(id + b) % 6];
            }
            seg[b * T + t] = id;
            left--;
        }
    }
    return seg;
}

static float case_scale(const att_case *c)
{
    return c->scale != 0.0f ? c->scale : (float)(1.0 / sqrt((double)c->D));
}

static void run_forward_case(const att_case *c)
{
    const size_t nq = (size_t)c->B * c->T * c->Hq * c->D;
    const size_t nk = (size_t)c->B * c->T * c->Hkv * c->D;
    const size_t nl = (size_t)c->B * c->Hq * c->T;
    const float scale = case_scale(c);
    float *q = rand_buf(nq, c->amp), *k = rand_buf(nk, c->amp), *v = rand_buf(nk, 1.0f);
    int32_t *seg = c->segmented ? make_seg(c->B, c->T, c->segmented) : NULL;
    float *out = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    double *qd = to_double(q, nq), *kd = to_double(k, nk), *vd = to_double(v, nk);
    double *outd = malloc(nq * sizeof(double)), *lsed = malloc(nl * sizeof(double));

    ft_cpu_attention_forward(out, lse, q, k, v, seg, c->B, c->T, c->Hq, c->Hkv, c->D,
                             scale, c->window, c->softcap);
    att_ref(outd, lsed, qd, kd, vd, seg, c->B, c->T, c->Hq, c->Hkv, c->D, scale,
            c->window, c->softcap);
    int before = check_current_failed;
    check_current_failed = 0;
    for (size_t i = 0; i < nq; i++) {
        CHECK_CLOSE(out[i], outd[i], 1e-5);
    }
    for (size_t i = 0; i < nl; i++) {
        CHECK_CLOSE(lse[i], lsed[i], 1e-5);
    }
    if (check_current_failed) {
        fprintf(stderr, "  (forward case %s)\n", c->name);
    }
    check_current_failed |= before;
    free(q);
    free(k);
    free(v);
    free(seg);
    free(out);
    free(lse);
    free(qd);
    free(kd);
    free(vd);
    free(outd);
    free(lsed);
}

static const att_case fwd_cases[] = {
    {"mha", 2, 9, 3, 3, 8, 0, 0.0f, 1.0f, 0, 0.0f},
    {"gqa", 2, 8, 6, 2, 8, 0, 0.0f, 1.0f, 0, 0.0f},
    {"mqa", 1, 10, 4, 1, 16, 0, 0.0f, 1.0f, 0, 0.0f},
    {"odd", 3, 7, 3, 1, 6, 0, 0.0f, 1.0f, 0, 0.0f},
    {"t1", 2, 1, 2, 1, 4, 0, 0.0f, 1.0f, 0, 0.0f},
    {"segments", 2, 12, 4, 2, 8, 0, 0.0f, 1.0f, 1, 0.0f},
    {"window", 2, 11, 4, 2, 8, 3, 0.0f, 1.0f, 0, 0.0f},
    {"window1", 1, 6, 2, 2, 4, 1, 0.0f, 1.0f, 0, 0.0f},
    {"segments_window", 2, 13, 6, 2, 6, 4, 0.0f, 1.0f, 1, 0.0f},
    {"large_logits", 2, 9, 4, 2, 8, 0, 2.0f, 3.0f, 0, 0.0f},
    /* more than one 64-key block: exercises the running-max rescale */
    {"long", 1, 200, 2, 1, 6, 0, 0.0f, 2.0f, 0, 0.0f},
    {"long_window", 1, 200, 2, 1, 6, 90, 0.0f, 2.0f, 0, 0.0f},
    {"long_segments", 2, 150, 2, 2, 5, 0, 0.0f, 2.0f, 1, 0.0f},
    {"interleaved_segments", 2, 90, 4, 2, 6, 0, 0.0f, 1.5f, 2, 0.0f},
    {"interleaved_segments_window", 2, 90, 4, 1, 6, 20, 0.0f, 1.5f, 2, 0.0f},
    {"long_large_logits", 1, 160, 2, 1, 8, 0, 1.0f, 2.5f, 0, 0.0f},
    /* Gemma 2's attn_logit_softcapping: scores of up to ~20 capped at 5 (well into
     * tanh's bend), alone, with a window, with segments, across 64-key blocks */
    {"softcap", 2, 9, 4, 2, 8, 0, 2.0f, 3.0f, 0, 5.0f},
    {"softcap_window", 2, 11, 4, 2, 8, 3, 1.0f, 2.5f, 0, 4.0f},
    {"softcap_segments", 2, 13, 6, 2, 6, 4, 1.0f, 2.5f, 1, 3.0f},
    {"long_softcap", 1, 160, 2, 1, 8, 50, 1.0f, 2.5f, 0, 5.0f},
    /* T past one 512-key chunk: the online softmax across chunks (the late rows' maximum
     * grows in the second chunk with the larger amplitude), with a window reaching
     * across the chunk boundary, with packed segments and a softcap */
    {"chunks", 1, 700, 4, 2, 8, 0, 0.0f, 2.0f, 0, 0.0f},
    {"chunks_window", 1, 640, 2, 1, 6, 300, 0.0f, 2.5f, 0, 0.0f},
    {"chunks_segments_softcap", 2, 600, 2, 1, 6, 0, 1.0f, 2.5f, 1, 4.0f},
};

static void test_attention_forward(void)
{
    for (size_t i = 0; i < sizeof(fwd_cases) / sizeof(fwd_cases[0]); i++) {
        run_forward_case(&fwd_cases[i]);
    }
}

/* ---- attention backward ---------------------------------------------------------- */

static double ref_loss(const double *q, const double *k, const double *v,
                       const int32_t *seg, const double *r, double *outd,
                       const att_case *c)
{
    const size_t nq = (size_t)c->B * c->T * c->Hq * c->D;
    att_ref(outd, NULL, q, k, v, seg, c->B, c->T, c->Hq, c->Hkv, c->D, case_scale(c),
            c->window, c->softcap);
    double L = 0.0;
    for (size_t i = 0; i < nq; i++) {
        L += outd[i] * r[i];
    }
    return L;
}

static void fd_check(float *grad, double *x, size_t n, const double *qd,
                     const double *kd, const double *vd, const int32_t *seg,
                     const double *rd, double *outd, const att_case *c)
{
    const double step = 1e-5;
    for (size_t e = 0; e < n; e++) {
        const double x0 = x[e];
        x[e] = x0 + step;
        const double lp = ref_loss(qd, kd, vd, seg, rd, outd, c);
        x[e] = x0 - step;
        const double lm = ref_loss(qd, kd, vd, seg, rd, outd, c);
        x[e] = x0;
        CHECK_CLOSE(grad[e], (lp - lm) / (2.0 * step), 1e-4);
    }
}

static void run_backward_case(const att_case *c)
{
    const size_t nq = (size_t)c->B * c->T * c->Hq * c->D;
    const size_t nk = (size_t)c->B * c->T * c->Hkv * c->D;
    const size_t nl = (size_t)c->B * c->Hq * c->T;
    const float scale = case_scale(c);
    float *q = rand_buf(nq, c->amp), *k = rand_buf(nk, c->amp), *v = rand_buf(nk, 1.0f);
    float *r = rand_buf(nq, 1.0f); /* dL/dout */
    int32_t *seg = c->segmented ? make_seg(c->B, c->T, c->segmented) : NULL;
    float *out = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float));
    float *dv = calloc(nk, sizeof(float));
    double *qd = to_double(q, nq), *kd = to_double(k, nk), *vd = to_double(v, nk);
    double *rd = to_double(r, nq), *outd = malloc(nq * sizeof(double));

    ft_cpu_attention_forward(out, lse, q, k, v, seg, c->B, c->T, c->Hq, c->Hkv, c->D,
                             scale, c->window, c->softcap);
    ft_cpu_attention_backward(dq, dk, dv, r, q, k, v, out, lse, seg, c->B, c->T, c->Hq,
                              c->Hkv, c->D, scale, c->window, c->softcap);

    int before = check_current_failed;
    check_current_failed = 0;
    fd_check(dq, qd, nq, qd, kd, vd, seg, rd, outd, c);
    fd_check(dk, kd, nk, qd, kd, vd, seg, rd, outd, c);
    fd_check(dv, vd, nk, qd, kd, vd, seg, rd, outd, c);

    /* Accumulate: non-zero initial gradients are added to, not overwritten. */
    float *dq2 = rand_buf(nq, 1.0f), *dk2 = rand_buf(nk, 1.0f), *dv2 = rand_buf(nk, 1.0f);
    float *dq0 = copy_buf(dq2, nq), *dk0 = copy_buf(dk2, nk), *dv0 = copy_buf(dv2, nk);
    ft_cpu_attention_backward(dq2, dk2, dv2, r, q, k, v, out, lse, seg, c->B, c->T, c->Hq,
                              c->Hkv, c->D, scale, c->window, c->softcap);
    for (size_t i = 0; i < nq; i++) {
        CHECK_CLOSE(dq2[i], (double)dq0[i] + dq[i], 1e-6);
    }
    for (size_t i = 0; i < nk; i++) {
        CHECK_CLOSE(dk2[i], (double)dk0[i] + dk[i], 1e-6);
        CHECK_CLOSE(dv2[i], (double)dv0[i] + dv[i], 1e-6);
    }

    /* Unwanted gradients may be NULL; the others are unchanged. */
    memset(dk2, 0, nk * sizeof(float));
    ft_cpu_attention_backward(NULL, dk2, NULL, r, q, k, v, out, lse, seg, c->B, c->T,
                              c->Hq, c->Hkv, c->D, scale, c->window, c->softcap);
    CHECK(memcmp(dk2, dk, nk * sizeof(float)) == 0);
    memset(dq2, 0, nq * sizeof(float));
    memset(dv2, 0, nk * sizeof(float));
    ft_cpu_attention_backward(dq2, NULL, dv2, r, q, k, v, out, lse, seg, c->B, c->T,
                              c->Hq, c->Hkv, c->D, scale, c->window, c->softcap);
    CHECK(memcmp(dq2, dq, nq * sizeof(float)) == 0);
    CHECK(memcmp(dv2, dv, nk * sizeof(float)) == 0);

    if (check_current_failed) {
        fprintf(stderr, "  (backward case %s)\n", c->name);
    }
    check_current_failed |= before;
    free(q);
    free(k);
    free(v);
    free(r);
    free(seg);
    free(out);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    free(qd);
    free(kd);
    free(vd);
    free(rd);
    free(outd);
    free(dq2);
    free(dk2);
    free(dv2);
    free(dq0);
    free(dk0);
    free(dv0);
}

static const att_case bwd_cases[] = {
    {"mha", 1, 6, 2, 2, 4, 0, 0.0f, 1.0f, 0, 0.0f},
    {"gqa", 2, 7, 6, 2, 4, 0, 0.0f, 1.0f, 0, 0.0f},
    {"mqa", 1, 8, 3, 1, 6, 0, 0.0f, 1.0f, 0, 0.0f},
    {"segments", 2, 9, 4, 2, 4, 0, 0.0f, 1.0f, 1, 0.0f},
    {"window", 2, 8, 4, 2, 4, 3, 0.0f, 1.0f, 0, 0.0f},
    {"gqa_segments_window", 2, 11, 6, 2, 6, 4, 0.0f, 1.0f, 1, 0.0f},
    {"large_logits", 1, 7, 2, 1, 4, 0, 1.0f, 2.0f, 0, 0.0f},
    {"long_segments_window", 1, 70, 2, 1, 3, 40, 0.0f, 1.5f, 1, 0.0f},
    {"interleaved_segments", 1, 17, 4, 2, 4, 0, 0.0f, 1.0f, 2, 0.0f},
    {"softcap", 1, 7, 2, 1, 4, 0, 2.0f, 2.5f, 0, 3.0f},
    {"gqa_softcap_segments_window", 2, 11, 6, 2, 6, 4, 1.0f, 2.0f, 1, 2.0f},
};

static void test_attention_backward(void)
{
    for (size_t i = 0; i < sizeof(bwd_cases) / sizeof(bwd_cases[0]); i++) {
        run_backward_case(&bwd_cases[i]);
    }
}

/* Long sequences (several query blocks and key chunks), where the element-wise finite
 * differences above would take too long: the derivative of L = sum(out * r) along a
 * random direction u, one of q, k, v at a time, by central differences on the double
 * reference, against sum(grad * u) from the op. */
static void run_directional_case(const att_case *c)
{
    const size_t nq = (size_t)c->B * c->T * c->Hq * c->D;
    const size_t nk = (size_t)c->B * c->T * c->Hkv * c->D;
    const size_t nl = (size_t)c->B * c->Hq * c->T;
    const float scale = case_scale(c);
    float *q = rand_buf(nq, c->amp), *k = rand_buf(nk, c->amp), *v = rand_buf(nk, 1.0f);
    float *r = rand_buf(nq, 1.0f);
    int32_t *seg = c->segmented ? make_seg(c->B, c->T, c->segmented) : NULL;
    float *out = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float));
    float *dv = calloc(nk, sizeof(float));
    double *qd = to_double(q, nq), *kd = to_double(k, nk), *vd = to_double(v, nk);
    double *rd = to_double(r, nq), *outd = malloc(nq * sizeof(double));

    ft_cpu_attention_forward(out, lse, q, k, v, seg, c->B, c->T, c->Hq, c->Hkv, c->D,
                             scale, c->window, c->softcap);
    ft_cpu_attention_backward(dq, dk, dv, r, q, k, v, out, lse, seg, c->B, c->T, c->Hq,
                              c->Hkv, c->D, scale, c->window, c->softcap);
    int before = check_current_failed;
    check_current_failed = 0;
    double *xs[3] = {qd, kd, vd};
    const float *gs[3] = {dq, dk, dv};
    const size_t ns[3] = {nq, nk, nk};
    const double step = 1e-5;
    for (int w = 0; w < 3; w++) {
        float *u = rand_buf(ns[w], 1.0f);
        double *x0 = malloc(ns[w] * sizeof(double));
        memcpy(x0, xs[w], ns[w] * sizeof(double));
        double want = 0.0;
        for (size_t e = 0; e < ns[w]; e++) {
            want += (double)gs[w][e] * u[e];
            xs[w][e] = x0[e] + step * u[e];
        }
        const double lp = ref_loss(qd, kd, vd, seg, rd, outd, c);
        for (size_t e = 0; e < ns[w]; e++) {
            xs[w][e] = x0[e] - step * u[e];
        }
        const double lm = ref_loss(qd, kd, vd, seg, rd, outd, c);
        memcpy(xs[w], x0, ns[w] * sizeof(double));
        CHECK_CLOSE(want, (lp - lm) / (2.0 * step), 1e-4);
        free(u);
        free(x0);
    }
    if (check_current_failed) {
        fprintf(stderr, "  (directional case %s)\n", c->name);
    }
    check_current_failed |= before;
    free(q);
    free(k);
    free(v);
    free(r);
    free(seg);
    free(out);
    free(lse);
    free(dq);
    free(dk);
    free(dv);
    free(qd);
    free(kd);
    free(vd);
    free(rd);
    free(outd);
}

static const att_case dir_cases[] = {
    {"blocks_gqa", 2, 150, 4, 2, 8, 0, 0.0f, 2.0f, 0, 0.0f},
    {"chunks", 1, 700, 4, 2, 8, 0, 0.0f, 2.0f, 0, 0.0f},
    {"chunks_mha_window", 1, 640, 2, 2, 6, 300, 0.0f, 2.5f, 0, 0.0f},
    {"chunks_segments_softcap", 2, 600, 2, 1, 6, 0, 1.0f, 2.5f, 1, 4.0f},
    {"chunks_interleaved_window", 1, 560, 3, 1, 4, 200, 0.0f, 1.5f, 2, 0.0f},
};

static void test_attention_backward_long(void)
{
    for (size_t i = 0; i < sizeof(dir_cases) / sizeof(dir_cases[0]); i++) {
        run_directional_case(&dir_cases[i]);
    }
}

/* The same bits on one thread, on three, and called from inside a parallel region (every
 * score tile and every gradient sum is one thread's, in a fixed order; OpenBLAS runs a
 * GEMM called inside a parallel region on the calling thread). */
static void test_attention_same_bits_any_threads(void)
{
    const att_case c = {"threads", 2, 300, 6, 2, 8, 0, 0.0f, 2.0f, 1, 0.0f};
    const size_t nq = (size_t)c.B * c.T * c.Hq * c.D;
    const size_t nk = (size_t)c.B * c.T * c.Hkv * c.D;
    const size_t nl = (size_t)c.B * c.Hq * c.T;
    const size_t n = 3 * nq + nl + 2 * nk; /* out, lse, dq, dk, dv, and dq again */
    float *q = rand_buf(nq, c.amp), *k = rand_buf(nk, c.amp), *v = rand_buf(nk, 1.0f);
    float *r = rand_buf(nq, 1.0f);
    int32_t *seg = make_seg(c.B, c.T, 1);
    const int threads = omp_get_max_threads();
    float *res[3];
    for (int run = 0; run < 3; run++) {
        float *o = calloc(n, sizeof(float));
        float *out = o, *lse = o + nq, *dq = lse + nl, *dk = dq + nq, *dv = dk + nk;
        omp_set_num_threads(run == 0 ? 1 : 3);
#pragma omp parallel num_threads(2) if (run == 2)
        {
#pragma omp single
            {
                ft_cpu_attention_forward(out, lse, q, k, v, seg, c.B, c.T, c.Hq, c.Hkv, c.D,
                                         case_scale(&c), c.window, c.softcap);
                ft_cpu_attention_backward(dq, dk, dv, r, q, k, v, out, lse, seg, c.B, c.T,
                                          c.Hq, c.Hkv, c.D, case_scale(&c), c.window,
                                          c.softcap);
                ft_cpu_attention_backward(dv + nk, NULL, NULL, r, q, k, v, out, lse, seg,
                                          c.B, c.T, c.Hq, c.Hkv, c.D, case_scale(&c),
                                          c.window, c.softcap);
            }
        }
        res[run] = o;
    }
    omp_set_num_threads(threads);
    CHECK(!memcmp(res[0], res[1], n * sizeof(float)));
    CHECK(!memcmp(res[0], res[2], n * sizeof(float)));
    CHECK(!memcmp(res[0] + nq + nl, res[0] + n - nq, nq * sizeof(float))); /* dq alone */
    for (int run = 0; run < 3; run++) {
        free(res[run]);
    }
    free(q);
    free(k);
    free(v);
    free(r);
    free(seg);
}

/* ---- packed sequences == separate sequences ------------------------------------ */

/* One row holding segments [0,0,0,1,1,1,1,2,2,2,...] with positions restarting at 0 in
 * each, RoPE applied to q and k, then attention (forward and backward) with seg ids,
 * against each segment run alone (seg NULL, positions 0..len-1). */
static void check_packed_vs_separate(int window, float softcap)
{
    enum { T = 23, Hq = 4, Hkv = 2, D = 8 };
    static const int lens[] = {3, 4, 3, 1, 7, 5};
    const size_t nq = (size_t)T * Hq * D, nk = (size_t)T * Hkv * D;
    const float scale = (float)(1.0 / sqrt((double)D));
    float inv_freq[D / 2];
    make_inv_freq(inv_freq, D, 10000.0);

    int32_t seg[T], pos[T], start[6];
    for (int s = 0, t = 0; s < 6; s++) {
        start[s] = t;
        for (int p = 0; p < lens[s]; p++, t++) {
            seg[t] = s;
            pos[t] = p;
        }
    }
    float *q = rand_buf(nq, 1.5f), *k = rand_buf(nk, 1.5f), *v = rand_buf(nk, 1.0f);
    float *r = rand_buf(nq, 1.0f);
    float *qp = copy_buf(q, nq), *kp = copy_buf(k, nk);
    ft_cpu_rope_forward(qp, pos, inv_freq, T, Hq, D, D, 1.0f);
    ft_cpu_rope_forward(kp, pos, inv_freq, T, Hkv, D, D, 1.0f);
    float out[T * Hq * D], lse[Hq * T];
    float dq[T * Hq * D] = {0}, dk[T * Hkv * D] = {0}, dv[T * Hkv * D] = {0};
    ft_cpu_attention_forward(out, lse, qp, kp, v, seg, 1, T, Hq, Hkv, D, scale, window,
                             softcap);
    ft_cpu_attention_backward(dq, dk, dv, r, qp, kp, v, out, lse, seg, 1, T, Hq, Hkv, D,
                              scale, window, softcap);

    for (int s = 0; s < 6; s++) {
        const int L = lens[s], t0 = start[s];
        int32_t ps[T];
        for (int p = 0; p < L; p++) {
            ps[p] = p;
        }
        float *qs = copy_buf(q + (size_t)t0 * Hq * D, (size_t)L * Hq * D);
        float *ks = copy_buf(k + (size_t)t0 * Hkv * D, (size_t)L * Hkv * D);
        const float *vs = v + (size_t)t0 * Hkv * D;
        const float *rs = r + (size_t)t0 * Hq * D;
        ft_cpu_rope_forward(qs, ps, inv_freq, L, Hq, D, D, 1.0f);
        ft_cpu_rope_forward(ks, ps, inv_freq, L, Hkv, D, D, 1.0f);
        float os[T * Hq * D], ls[Hq * T];
        float dqs[T * Hq * D] = {0}, dks[T * Hkv * D] = {0}, dvs[T * Hkv * D] = {0};
        ft_cpu_attention_forward(os, ls, qs, ks, vs, NULL, 1, L, Hq, Hkv, D, scale,
                                 window, softcap);
        ft_cpu_attention_backward(dqs, dks, dvs, rs, qs, ks, vs, os, ls, NULL, 1, L, Hq,
                                  Hkv, D, scale, window, softcap);
        for (int i = 0; i < L * Hq * D; i++) {
            CHECK_CLOSE(out[t0 * Hq * D + i], os[i], 1e-6);
            CHECK_CLOSE(dq[t0 * Hq * D + i], dqs[i], 1e-6);
        }
        for (int i = 0; i < L * Hkv * D; i++) {
            CHECK_CLOSE(dk[t0 * Hkv * D + i], dks[i], 1e-6);
            CHECK_CLOSE(dv[t0 * Hkv * D + i], dvs[i], 1e-6);
        }
        for (int h = 0; h < Hq; h++) {
            for (int p = 0; p < L; p++) {
                CHECK_CLOSE(lse[h * T + t0 + p], ls[h * L + p], 1e-6);
            }
        }
        free(qs);
        free(ks);
    }
    free(q);
    free(k);
    free(v);
    free(r);
    free(qp);
    free(kp);
}

static void test_packed_equals_separate(void)
{
    check_packed_vs_separate(0, 0.0f);
    check_packed_vs_separate(3, 0.0f);
    check_packed_vs_separate(3, 1.0f);
}

int main(void)
{
    RUN(test_rope_forward);
    RUN(test_rope_partial_scaled);
    RUN(test_rope_backward_fd);
    RUN(test_rope_norm_and_identity);
    RUN(test_rope_position_table);
    RUN(test_attention_forward);
    RUN(test_attention_backward);
    RUN(test_attention_backward_long);
    RUN(test_attention_same_bits_any_threads);
    RUN(test_packed_equals_separate);
    return check_summary("attention_rope");
}
