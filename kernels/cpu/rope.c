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
 * cos/sin depend on (n, i) only, so they are computed once per row (in chunks of
 * ROPE_CHUNK frequencies) into a small stack table and reused for every head; the
 * per-head loop is contiguous over i and vectorizes. cos/sin are evaluated in double
 * from the fp32 angle and rounded to fp32, which reproduces torch's fp32 cos()/sin()
 * of the same angle to within an ulp.
 * OpenMP over rows. */
#include <math.h>

#include "cpu_ops.h"

/* Frequencies per cos/sin table: the table lives on the stack, and rd/2 is at most 128
 * for the models we target, so one chunk a row is the usual case. */
#define ROPE_CHUNK 128

/* sign = +1: the forward map; sign = -1: its transpose (backward). */
static void rope_apply(float *x, const int32_t *pos, const float *inv_freq, int N,
                       int heads, int D, int rd, float scale, float sign)
{
    const int h = rd / 2;
    if (N <= 0 || heads <= 0 || h <= 0) {
        return;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float p = (float)pos[n];
        float *row = x + (size_t)n * heads * D;
        float cosv[ROPE_CHUNK], sinv[ROPE_CHUNK];
        for (int i0 = 0; i0 < h; i0 += ROPE_CHUNK) {
            const int len = h - i0 < ROPE_CHUNK ? h - i0 : ROPE_CHUNK;
            for (int i = 0; i < len; i++) {
                const float a = p * inv_freq[i0 + i];
                cosv[i] = (float)cos((double)a) * scale;
                sinv[i] = sign * ((float)sin((double)a) * scale);
            }
            for (int hd = 0; hd < heads; hd++) {
                float *x1 = row + (size_t)hd * D + i0;
                float *x2 = x1 + h;
                for (int i = 0; i < len; i++) {
                    const float a1 = x1[i], a2 = x2[i];
                    x1[i] = a1 * cosv[i] - a2 * sinv[i];
                    x2[i] = a2 * cosv[i] + a1 * sinv[i];
                }
            }
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
