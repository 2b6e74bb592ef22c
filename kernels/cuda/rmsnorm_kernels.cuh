/* The RMSNorm kernels (kernels/cpu/rmsnorm.c's twins; the math is derived there), launched
 * by rmsnorm.cu and run on the host by tests/emu. fview, ld, st and block_sum come first
 * (cuda_common.cuh, or the emulation).
 * w below is the effective weight w_off + w (w_off 0, or 1 for Gemma's offset weights,
 * added in fp32; dw is the same either way).
 *   forward:  rstd[n] = 1 / sqrt(mean_c s[n,c]^2 + eps);  out = (s * rstd) * w, where s
 *             is x, or with a residual sum = x + res, stored (sum may be x itself)
 *   backward: dx[n,c] += r (w_c g_c - x_c k),  k = r^2 mean_c(w_c g_c x_c)   (g = dout)
 *             dw[c]   += sum_n g[n,c] x[n,c] r[n]
 * One block per row for forward and dx: each thread takes the columns c = tid,
 * tid + blockDim, ... and the row sums are block sums in a fixed order (fp32 terms and
 * partial sums). dw is a column sum over row chunks in two passes (colsum.cuh: a fixed
 * order, no atomics, the same on every run). rstd is fp32. */
#ifndef FT_RMSNORM_KERNELS_CUH
#define FT_RMSNORM_KERNELS_CUH

#include "colsum.cuh"

#define RMS_THREADS 256

struct rms_args {
    fview out, x, w; /* forward: out = rmsnorm(x, or x + res) * w */
    fview res, sum;  /* the residual added first (res.p NULL: none) and where x + res goes */
    fview dx, dw, dout;
    float *rstd;
    int N, C;
    float eps;
    float w_off;    /* the weight applied is w_off + w */
    float *partial; /* dw's row-chunk sums (colsum.cuh), chunk_rows rows a chunk */
    int chunk_rows;
};

__global__ void rmsnorm_forward_kernel(rms_args a)
{
    __shared__ float shm[32];
    size_t row = (size_t)blockIdx.x * a.C;
    /* With a residual the norm reads sum back as stored (rounded to its dtype), so it
     * sees the values a separate add would have left there. Each thread reads back only
     * its own columns: no barrier needed. */
    fview s = a.res.p ? a.sum : a.x;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < a.C; c += blockDim.x) {
        if (a.res.p)
            st(a.sum, row + c, ld(a.x, row + c) + ld(a.res, row + c));
        float v = ld(s, row + c);
        ss += v * v;
    }
    ss = block_sum(ss, shm);
    float r = 1.0f / sqrtf(ss / (float)a.C + a.eps);
    if (threadIdx.x == 0)
        a.rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < a.C; c += blockDim.x)
        st(a.out, row + c, __fmul_rn(ld(s, row + c), r) * (a.w_off + ld(a.w, c)));
}

__global__ void rmsnorm_backward_dx_kernel(rms_args a)
{
    __shared__ float shm[32];
    size_t row = (size_t)blockIdx.x * a.C;
    float r = a.rstd[blockIdx.x];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < a.C; c += blockDim.x)
        dot += ((a.w_off + ld(a.w, c)) * ld(a.dout, row + c)) * ld(a.x, row + c);
    dot = block_sum(dot, shm);
    float k = r * r * (dot / (float)a.C);
    for (int c = threadIdx.x; c < a.C; c += blockDim.x) {
        float g = (a.w_off + ld(a.w, c)) * ld(a.dout, row + c);
        st(a.dx, row + c, ld(a.dx, row + c) + r * (g - ld(a.x, row + c) * k));
    }
}

/* dw's column sum, pass 1 (colsum.cuh): grid (ceil(C / 32), chunks) of COLSUM_THREADS,
 * a.chunk_rows rows a chunk, into a.partial (or dw itself with one chunk); pass 2 is
 * colsum_finish_kernel. */
__global__ void rmsnorm_backward_dw_kernel(rms_args a)
{
    __shared__ float shm[COLSUM_WARPS * COLSUM_COLS];
    int c = colsum_column(), n, end;
    colsum_rows(a.N, a.chunk_rows, &n, &end);
    float acc = 0.0f;
    if (c < a.C)
        for (; n < end; n += COLSUM_WARPS) {
            size_t i = (size_t)n * a.C + c;
            acc += ld(a.dout, i) * (ld(a.x, i) * a.rstd[n]);
        }
    colsum_store(acc, shm, a.dw, a.partial, a.C);
}

#endif
