/* RoPE (rotary position embedding), HF rotate-half convention, fp32, in place.
 *
 * Layout: x [N, heads, D] row-major (N token rows, each holding `heads` vectors of
 * D = head_dim floats); pos [N] int32 positions; inv_freq [rd/2] fp32. Only the first
 * rd dims of each head rotate (partial rotary, Phi-4-mini: rd = 0.75 D; rd = D for
 * most models); dims rd..D-1 pass through unchanged, as transformers' apply_rotary_pos_emb
 * concatenates them back. rd is even, and with h = rd/2 dimension i (i < h) pairs with
 * dimension i + h (HF checkpoints are already permuted for this pairing; Meta's original
 * interleaves pairs instead).
 *
 * Forward, for every head of row n, with i < h:
 *   a = (float)pos[n] * inv_freq[i]          (an fp32 product, as transformers does:
 *                                             freqs = inv_freq @ position_ids in fp32)
 *   c = fl(cos(a) * scale), s = fl(sin(a) * scale)
 *                                            (the same angle for both halves: HF repeats
 *                                             the h frequencies twice; scale is longrope's
 *                                             attention factor, cos() * attention_scaling
 *                                             in fp32, and 1 otherwise)
 *   y[i]     = x[i] c - x[i+h] s
 *   y[i + h] = x[i+h] c + x[i] s
 * This is a rotation of each pair (x[i], x[i+h]) by +a times scale, so its transpose is
 * the same map with s negated: the backward applies it in place to the gradient:
 *   dx[i]     =  dy[i] c + dy[i+h] s
 *   dx[i + h] =  dy[i+h] c - dy[i] s
 * and the pass-through dims keep dy. (RoPE has no parameters, so there is nothing to
 * accumulate: backward maps dy to dx in the same buffer.)
 *
 * cos/sin depend on the position and i only. Where the positions are fewer than the rows
 * (max pos < N: a batch of several rows of the same positions, the usual case), they come
 * from a table of every position below max pos + 1 (up to ROPE_TABLE_MAX_BYTES), which
 * the calling thread keeps while the frequencies and the scale stay the same: a training
 * step's 2 x layers x (forward + backward) calls compute it once a run. Otherwise (long positions in few rows, or more
 * than ROPE_TABLE_MAX_H frequencies) they are computed per row, in chunks of ROPE_CHUNK
 * frequencies into a small stack table reused for every head. Either way each value is
 * cos/sin evaluated in double from the fp32 angle and rounded to fp32 (which reproduces
 * torch's fp32 cos()/sin() of the same angle to within an ulp), so both give the same
 * bits. The per-head loop is contiguous over i and vectorizes; a row is one call of a
 * function cloned per vector width (simd_clones.h; an element-wise map, the same bits at
 * any width). OpenMP over rows. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "cpu_parallel.h"
#include "cpu_scratch.h"
#include "simd_clones.h"

/* Frequencies per cos/sin chunk of the per-row path: the chunk lives on the stack, and
 * rd/2 is at most 128 for the models we target, so one chunk a row is the usual case. */
#define ROPE_CHUNK 128
/* The most frequencies the position table serves (rd up to 512), and its most bytes. */
#define ROPE_TABLE_MAX_H 256
#define ROPE_TABLE_MAX_BYTES (16u << 20)

/* The calling thread's position table: for p < npos, cos then sin of the h angles
 * (float)p * freq[i], times scale, at table + p * 2h (in its cpu_scratch slot). */
typedef struct rope_table {
    const float *cs;
    int npos, h;
    float scale;
    float freq[ROPE_TABLE_MAX_H];
} rope_table;

static _Thread_local rope_table rope_tab;

static void angle_cos_sin(float *c, float *s, float p, const float *inv_freq, int len,
                          float scale)
{
    for (int i = 0; i < len; i++) {
        const float a = p * inv_freq[i];
        c[i] = (float)cos((double)a) * scale;
        s[i] = (float)sin((double)a) * scale;
    }
}

/* The table covering positions [0, npos) for these frequencies and scale: the kept one,
 * or a new one. */
static const float *position_table(int npos, const float *inv_freq, int h, float scale)
{
    rope_table *t = &rope_tab;
    if (t->cs && t->h == h && t->scale == scale && t->npos >= npos &&
        !memcmp(t->freq, inv_freq, (size_t)h * sizeof(float)))
        return t->cs;
    float *cs = ft_cpu_scratch(FT_SCRATCH_ROPE, (size_t)npos * 2 * h * sizeof(float),
                               "rope");
#pragma omp parallel for schedule(static)
    for (int p = 0; p < npos; p++)
        angle_cos_sin(cs + (size_t)p * 2 * h, cs + (size_t)p * 2 * h + h, (float)p, inv_freq,
                      h, scale);
    t->cs = cs;
    t->npos = npos;
    t->h = h;
    t->scale = scale;
    memcpy(t->freq, inv_freq, (size_t)h * sizeof(float));
    return cs;
}

/* Rotates the pairs of dims (i0 + i, i0 + i + h), i < len, of every head of one row by
 * cos c[i] and sin sign * s[i]. */
FT_SIMD_CLONES
static void rotate_row(float *row, const float *c, const float *s, float sign, int heads,
                       int D, int h, int i0, int len)
{
    for (int hd = 0; hd < heads; hd++) {
        float *x1 = row + (size_t)hd * D + i0;
        float *x2 = x1 + h;
#pragma omp simd
        for (int i = 0; i < len; i++) {
            const float a1 = x1[i], a2 = x2[i], si = sign * s[i];
            x1[i] = a1 * c[i] - a2 * si;
            x2[i] = a2 * c[i] + a1 * si;
        }
    }
}

/* sign = +1: the forward map; sign = -1: its transpose (backward). */
static void rope_apply(float *x, const int32_t *pos, const float *inv_freq, int N,
                       int heads, int D, int rd, float scale, float sign)
{
    const int h = rd / 2;
    if (N <= 0 || heads <= 0 || h <= 0) {
        return;
    }
    int32_t max_pos = 0;
    for (int n = 0; n < N; n++)
        max_pos = pos[n] > max_pos ? pos[n] : max_pos;
    if (max_pos < N && h <= ROPE_TABLE_MAX_H &&
        ((size_t)max_pos + 1) * 2 * h * sizeof(float) <= ROPE_TABLE_MAX_BYTES) {
        const float *cs = position_table(max_pos + 1, inv_freq, h, scale);
#pragma omp parallel for schedule(static) if ((long)N * heads * D >= FT_PAR_MIN_PASS)
        for (int n = 0; n < N; n++) {
            const float *c = cs + (size_t)pos[n] * 2 * h;
            rotate_row(x + (size_t)n * heads * D, c, c + h, sign, heads, D, h, 0, h);
        }
        return;
    }
#pragma omp parallel for schedule(static) if ((long)N * heads * D >= FT_PAR_MIN_PASS)
    for (int n = 0; n < N; n++) {
        float cosv[ROPE_CHUNK], sinv[ROPE_CHUNK];
        for (int i0 = 0; i0 < h; i0 += ROPE_CHUNK) {
            const int len = h - i0 < ROPE_CHUNK ? h - i0 : ROPE_CHUNK;
            angle_cos_sin(cosv, sinv, (float)pos[n], inv_freq + i0, len, scale);
            rotate_row(x + (size_t)n * heads * D, cosv, sinv, sign, heads, D, h, i0, len);
        }
    }
}
void ft_cpu_rope_forward(float *x, const int32_t *pos, const float *inv_freq, int N,
                         int heads, int D, int rd, float scale)
{
    rope_apply(x, pos, inv_freq, N, heads, D, rd, scale, 1.0f);
}

void ft_cpu_rope_backward(float *dx, const int32_t *pos, const float *inv_freq, int N,
                          int heads, int D, int rd, float scale)
{
    rope_apply(dx, pos, inv_freq, N, heads, D, rd, scale, -1.0f);
}
