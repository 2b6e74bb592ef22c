/* DoRA's helpers on the GPU (kernels/cpu/dora.c's twin; definitions in ops.h):
 *   dora_norm  one block a row: the row's sum of squares (block_sum, fixed order), then
 *              g = mag / n and inv = 1 / n;
 *   col_scale  elementwise, y[n,c] (+)= (alpha g[c] + beta) x[n,c];
 *   col_dot    d[c] += s[c] * sum_n a[n,c] b[n,c]: a column sum (colsum.cuh: two passes in
 *              a fixed order, no atomics) of a * b * s[c]. */
#include "cuda_common.cuh"

#include "colsum.cuh"

#define NORM_THREADS 256
#define EW_THREADS 256

__global__ void dora_norm_kernel(fview g, fview inv, fview mag, fview w, int C)
{
    __shared__ float shm[32];
    size_t r = blockIdx.x;
    float acc = 0.0f;
    for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
        float v = ld(w, r * (size_t)C + (size_t)c);
        acc += v * v;
    }
    acc = block_sum(acc, shm);
    if (threadIdx.x == 0) {
        float n = sqrtf(acc);
        st(g, r, ld(mag, r) / n);
        st(inv, r, 1.0f / n);
    }
}

__global__ void col_scale_kernel(fview y, fview x, fview g, float alpha, float beta, int C,
                                 size_t n, int accumulate)
{
    GRID_STRIDE(i, n)
    {
        float v = (alpha * ld(g, i % (size_t)C) + beta) * ld(x, i);
        st(y, i, accumulate ? ld(y, i) + v : v);
    }
}

/* pass 1 of d[c] += sum_n a[n,c] b[n,c] s[c] */
__global__ void col_dot_kernel(fview d, fview a, fview b, fview s, float *partial, int N, int C,
                               int rows)
{
    __shared__ float shm[COLSUM_WARPS * COLSUM_COLS];
    int c = colsum_column(), n, end;
    colsum_rows(N, rows, &n, &end);
    float acc = 0.0f;
    if (c < C) {
        for (; n < end; n += COLSUM_WARPS)
            acc += ld(a, (size_t)n * C + c) * ld(b, (size_t)n * C + c);
        acc *= ld(s, (size_t)c);
    }
    colsum_store(acc, shm, d, partial, C);
}

extern "C" void ft_cuda_dora_norm(ft_tensor g, ft_tensor inv, ft_tensor mag, ft_tensor w, int R,
                                  int C)
{
    if (R <= 0)
        return;
    FT_LAUNCH(dora_norm_kernel, (unsigned)R, NORM_THREADS, 0, ft_cuda_stream())(
        fv(g), fv(inv), fv(mag), fv(w), C);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_col_scale(ft_tensor y, ft_tensor x, ft_tensor g, float alpha, float beta,
                                  int N, int C, int accumulate)
{
    size_t n = (size_t)N * (size_t)C;
    if (n == 0)
        return;
    FT_LAUNCH(col_scale_kernel, grid_for(n, EW_THREADS), EW_THREADS, 0, ft_cuda_stream())(
        fv(y), fv(x), fv(g), alpha, beta, C, n, accumulate);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_col_dot(ft_tensor d, ft_tensor a, ft_tensor b, ft_tensor s, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    size_t room;
    float *partial = colsum_partials(&room);
    colsum_plan p = colsum_plan_for(N, C, room);
    cudaStream_t st = ft_cuda_stream();
    FT_LAUNCH(col_dot_kernel, colsum_grid(p, C), COLSUM_THREADS, 0, st)(
        fv(d), fv(a), fv(b), fv(s), partial, N, C, p.rows);
    LAUNCH_CHECK();
    colsum_finish(fv(d), partial, p, C, st);
}
