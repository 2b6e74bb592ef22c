/* Linear layer, fp32 CPU reference (BLAS for the GEMMs).
 *
 * Forward:   y[N,out] = alpha * x[N,in] @ w[out,in]^T + b[out]
 *            accumulate = 0 overwrites y, 1 adds onto it (the LoRA path adds its
 *            low-rank product onto the base output). b may be NULL; it is not scaled.
 * Backward:  dx[N,in]   += alpha * dy[N,out] @ w[out,in]
 *            dw[out,in] += alpha * dy^T @ x
 *            db[out]    += sum_n dy[n,:]
 *            Any of dx, dw, db may be NULL (not wanted); x is only read for dw and w
 *            only for dx.
 *
 * Layout: row-major; w is stored [out,in] like torch.nn.Linear.weight, so the forward
 * GEMM is x @ w^T (CblasTrans on w), the same as F.linear.
 *
 * The bias is written into y before the GEMM, which then runs with beta = 1: one pass
 * over y for the bias and one GEMM. db is summed per column in double, over column
 * blocks that each thread owns whole, so the result does not depend on the thread
 * count. The GEMMs are ft_cpu_sgemm's (cpu_gemm.c): a block of the output per thread of
 * libgomp's pool, the same threads as our loops (lib/core/cpu_env.c), each block one
 * single-threaded OpenBLAS call. */
#include "cpu_gemm.h"
#include "cpu_ops.h"
#include "cpu_parallel.h"

/* Columns per block of the db reduction: 64 floats = 4 cache lines, so two threads
 * never write the same line of db. */
#define DB_BLOCK 64

void ft_cpu_linear_bias(float *y, const float *b, int N, int out, int accumulate)
{
#pragma omp parallel for schedule(static) if ((long)N * out >= FT_PAR_MIN_PASS)
    for (int n = 0; n < N; n++) {
        float *yn = y + (size_t)n * out;
        if (accumulate) {
#pragma omp simd
            for (int o = 0; o < out; o++)
                yn[o] += b[o];
        } else {
#pragma omp simd
            for (int o = 0; o < out; o++)
                yn[o] = b[o];
        }
    }
}

void ft_cpu_linear_forward(float *y, const float *x, const float *w, const float *b, int N,
                           int in, int out, float alpha, int accumulate)
{
    if (N <= 0 || out <= 0)
        return;
    float beta = accumulate ? 1.0f : 0.0f;
    if (b) {
        ft_cpu_linear_bias(y, b, N, out, accumulate);
        beta = 1.0f;
    }
    if (in <= 0) {
        /* An empty reduction: the product is 0, y is the bias (or its old value). */
        if (beta == 0.0f)
            for (size_t i = 0; i < (size_t)N * out; i++)
                y[i] = 0.0f;
        return;
    }
    ft_cpu_sgemm(false, true, N, out, in, alpha, x, in, w, in, beta, y, out);
}

void ft_cpu_linear_backward(float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, int N, int in, int out,
                            float alpha)
{
    if (N <= 0 || out <= 0)
        return;
    if (in > 0 && dx)
        ft_cpu_sgemm(false, false, N, in, out, alpha, dy, out, w, in, 1.0f, dx, in);
    if (in > 0 && dw)
        ft_cpu_sgemm(true, false, out, in, N, alpha, dy, out, x, in, 1.0f, dw, in);
    if (db) {
        int nblocks = (out + DB_BLOCK - 1) / DB_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * out >= FT_PAR_MIN_PASS)
        for (int blk = 0; blk < nblocks; blk++) {
            int o0 = blk * DB_BLOCK;
            int len = out - o0 < DB_BLOCK ? out - o0 : DB_BLOCK;
            double acc[DB_BLOCK] = {0};
            for (int n = 0; n < N; n++) {
                const float *dyn = dy + (size_t)n * out + o0;
#pragma omp simd
                for (int j = 0; j < len; j++)
                    acc[j] += dyn[j];
            }
            for (int j = 0; j < len; j++)
                db[o0 + j] = (float)((double)db[o0 + j] + acc[j]);
        }
    }
}
