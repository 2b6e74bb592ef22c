/* RMSNorm (Llama; Gemma with w_offset 1), fp32 CPU reference.
 *
 * Forward, for each row n of x [N,C], with the effective weight w'[c] = w_offset + w[c]
 * (w_offset 0: Llama's weight itself; 1: Gemma's, stored as an offset from 1 and applied
 * as 1 + w in fp32, as GemmaRMSNorm does):
 *   ms[n]   = mean_c x[n,c]^2
 *   rstd[n] = 1 / sqrt(ms[n] + eps)                               (saved, [N])
 *   out[n,c] = (x[n,c] * rstd[n]) * w'[c]
 * As transformers' LlamaRMSNorm in fp32: variance = x.pow(2).mean(-1) (fp32),
 * x * torch.rsqrt(variance + eps), then weight * that. The mean of squares is summed in
 * double and rounded once to float (closer to the exact value than torch's fp32 pairwise
 * sum, never farther than its rounding); ms + eps, the square root and the reciprocal
 * are then done in fp32 like torch's rsqrt (correctly rounded sqrt, then 1/s), and the
 * products in torch's order: first x * rstd, then * w.
 *
 * Backward. Write r = rstd[n], gc = w[c] * dout[n,c] (the gradient reaching the
 * normalised value x_c r). With out_c = w_c x_c r and r = (ms + eps)^(-1/2):
 *   d r / d x_j = -1/2 (ms + eps)^(-3/2) * 2 x_j / C = -r^3 x_j / C
 *   dL/dx_j = sum_c dout_c w_c (x_c dr/dx_j + r [c == j])
 *           = r g_j - (r^3 x_j / C) sum_c g_c x_c
 *           = r (g_j - x_j r^2 mean_c(g_c x_c))
 *   dL/dw_c = sum_n dout[n,c] x[n,c] r[n]
 * So: dx[n,c] += r (w_c dout[n,c] - x[n,c] r^2 mean_c(w_c dout[n,c] x[n,c])),
 *     dw[c]   += sum_n dout[n,c] x[n,c] rstd[n].
 * Everything above holds with w' for w; dL/dw = dL/dw' since w' = w_offset + w.
 * dx or dw may be NULL. The row dot product and the dw column sums are in double.
 *
 * Parallelism: forward and dx over rows; dw over column blocks that a thread owns
 * whole, walking the rows in order, so dw does not depend on the thread count. */
#include <math.h>

#include "cpu_ops.h"
#include "cpu_parallel.h"
#include "simd_clones.h"

#define DW_BLOCK 64

/* One row each (dw: one column block over all rows), as functions cloned per vector
 * width (simd_clones.h); the sums in double are the only values a width changes. */
FT_SIMD_CLONES
static void norm_row(float *on, float *rstd_n, const float *xn, const float *w, int C,
                     float eps, float w_offset)
{
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++)
        ss += (double)xn[c] * xn[c];
    float ms = (float)(ss / C);
    float r = 1.0f / sqrtf(ms + eps);
    *rstd_n = r;
#pragma omp simd
    for (int c = 0; c < C; c++)
        on[c] = (xn[c] * r) * (w_offset + w[c]);
}

void ft_cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N,
                            int C, float eps, float w_offset)
{
    if (N <= 0 || C <= 0)
        return;
#pragma omp parallel for schedule(static) if ((long)N * C >= FT_PAR_MIN_PASS)
    for (int n = 0; n < N; n++)
        norm_row(out + (size_t)n * C, rstd + n, x + (size_t)n * C, w, C, eps, w_offset);
}

void ft_cpu_add_rmsnorm_forward(float *sum, float *out, float *rstd, const float *x,
                                const float *res, const float *w, int N, int C, float eps,
                                float w_offset)
{
    if (N <= 0 || C <= 0)
        return;
#pragma omp parallel for schedule(static) if ((long)N * C >= FT_PAR_MIN_PASS)
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
#pragma omp simd
        for (int c = 0; c < C; c++)
            sum[row + c] = x[row + c] + res[row + c];
        norm_row(out + row, rstd + n, sum + row, w, C, eps, w_offset);
    }
}

FT_SIMD_CLONES
static void backward_row(float *dxn, const float *gn, const float *xn, const float *w, float r,
                         int C, float w_offset)
{
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < C; c++)
        dot += (double)((w_offset + w[c]) * gn[c]) * xn[c];
    /* k = r^2 * mean(w dout x): the coefficient of x in the bracket. */
    float k = (float)((double)r * r * (dot / C));
#pragma omp simd
    for (int c = 0; c < C; c++)
        dxn[c] += r * ((w_offset + w[c]) * gn[c] - xn[c] * k);
}

/* dw[c0 .. c0+len) += sum_n dout[n,c] x[n,c] rstd[n], the rows in order */
FT_SIMD_CLONES
static void dw_block(float *dw, const float *dout, const float *x, const float *rstd, int N,
                     int C, int c0, int len)
{
    double acc[DW_BLOCK] = {0};
    for (int n = 0; n < N; n++) {
        const float *xn = x + (size_t)n * C + c0;
        const float *gn = dout + (size_t)n * C + c0;
        float r = rstd[n];
#pragma omp simd
        for (int j = 0; j < len; j++)
            acc[j] += (double)(gn[j] * (xn[j] * r));
    }
    for (int j = 0; j < len; j++)
        dw[c0 + j] = (float)((double)dw[c0 + j] + acc[j]);
}

void ft_cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                             const float *w, const float *rstd, int N, int C, float w_offset)
{
    if (N <= 0 || C <= 0)
        return;
    if (dx) {
#pragma omp parallel for schedule(static) if ((long)N * C >= FT_PAR_MIN_PASS)
        for (int n = 0; n < N; n++)
            backward_row(dx + (size_t)n * C, dout + (size_t)n * C, x + (size_t)n * C, w,
                         rstd[n], C, w_offset);
    }
    if (dw) {
        int nblocks = (C + DW_BLOCK - 1) / DW_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * C >= FT_PAR_MIN_PASS)
        for (int blk = 0; blk < nblocks; blk++) {
            int c0 = blk * DW_BLOCK;
            dw_block(dw, dout, x, rstd, N, C, c0, C - c0 < DW_BLOCK ? C - c0 : DW_BLOCK);
        }
    }
}
