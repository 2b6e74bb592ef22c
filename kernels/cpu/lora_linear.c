/* A linear layer with its LoRA pair on the CPU, each pass's GEMMs in one parallel region.
 *
 *   forward:  y = x W^T + b + s h B^T,  h = xd A^T      (xd: x or its dropout)
 *   backward: dx += dy W;  dB += s dy^T h;  dh = s dy B;  dA += dh^T xd;  dx_lora += dh A
 *
 * The same GEMMs as ft_cpu_linear_forward / backward called one by one (ops.h), run as
 * the phases of ft_cpu_sgemm_phases (cpu_gemm.c). Alone, the rank-r products (a few
 * hundred microseconds each at rank 16) are too small to be worth a parallel region and
 * run on one thread while the others wait: on a 2-core machine a SmolLM-shaped LoRA step
 * kept one core idle 13 % of the time. Here they share the region of the base GEMM: the
 * forward's h beside the base product, then B's product onto y; the backward's dh and dB
 * beside the base's dx, then A's products (dA, and dx_lora, which adds onto the dx just
 * written). The rank-r products are cut into blocks by their shape alone (`fixed`), so
 * each element has the same bits on any thread count. */
#include <string.h>

#include "cpu_gemm.h"
#include "cpu_ops.h"

static ft_gemm gemm_of(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                       int lda, const float *B, int ldb, float beta, float *C, int ldc,
                       bool fixed)
{
    ft_gemm g = {ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, fixed, false, 0};
    return g;
}

void ft_cpu_lora_linear_forward(float *y, float *h, const float *x, const float *xd,
                                const float *w, const float *b, const float *a,
                                const float *bl, int N, int in, int out, int r, float s,
                                int compute_h)
{
    if (r <= 0) { /* no pair: the base alone */
        ft_cpu_linear_forward(y, x, w, b, N, in, out, 1.0f, 0);
        return;
    }
    if (N <= 0 || out <= 0)
        return;
    ft_gemm g[3];
    int n = 0;
    if (b)
        ft_cpu_linear_bias(y, b, N, out, 0);
    if (in > 0)
        g[n++] = gemm_of(false, true, N, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y,
                         out, false);
    else if (!b)
        memset(y, 0, sizeof(float) * (size_t)N * out);
    if (compute_h && in <= 0)
        memset(h, 0, sizeof(float) * (size_t)N * r);
    else if (compute_h)
        g[n++] = gemm_of(false, true, N, r, in, 1.0f, xd, in, a, in, 0.0f, h, r, true);
    g[n] = gemm_of(false, true, N, out, r, s, h, r, bl, r, 1.0f, y, out, true);
    int phases[2] = {n, 1};
    ft_cpu_sgemm_phases(g, phases, 2);
}

void ft_cpu_lora_linear_backward(float *dx, float *dx_lora, float *ga, float *gb, float *dh,
                                 const float *dy, const float *xd, const float *h,
                                 const float *w, const float *a, const float *bl, int N,
                                 int in, int out, int r, float s)
{
    if (r <= 0) {
        ft_cpu_linear_backward(dx, NULL, NULL, dy, NULL, w, N, in, out, 1.0f);
        return;
    }
    if (N <= 0 || out <= 0)
        return;
    /* dh is written whole: zeroed, then accumulated like every other output (a NN product
     * with beta = 0 could take OpenBLAS's direct path, cpu_gemm.c) */
    memset(dh, 0, sizeof(float) * (size_t)N * r);
    ft_gemm g[5];
    int n1 = 0, n2 = 0;
    if (dx && in > 0)
        g[n1++] = gemm_of(false, false, N, in, out, 1.0f, dy, out, w, in, 1.0f, dx, in, false);
    g[n1++] = gemm_of(false, false, N, r, out, s, dy, out, bl, r, 1.0f, dh, r, true);
    if (gb)
        g[n1++] = gemm_of(true, false, out, r, N, s, dy, out, h, r, 1.0f, gb, r, true);
    if (ga && in > 0)
        g[n1 + n2++] = gemm_of(true, false, r, in, N, 1.0f, dh, r, xd, in, 1.0f, ga, in, true);
    if (dx_lora && in > 0)
        g[n1 + n2++] = gemm_of(false, false, N, in, r, 1.0f, dh, r, a, in, 1.0f, dx_lora, in,
                               true);
    int phases[2] = {n1, n2};
    ft_cpu_sgemm_phases(g, phases, 2);
}
