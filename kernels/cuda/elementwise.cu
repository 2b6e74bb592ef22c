/* Elementwise ops on the GPU (kernels/cpu/elementwise.c's twin):
 *   add: y += x   copy: y = x (also fp32 <-> bf16)   zero: y = 0   scale: x *= s
 *   softcap: x = cap * tanh(x / cap)
 *   sumsq: sum_i x_i^2 in double
 * add, copy and scale move 8 elements a thread where their operands allow (vec_io.cuh).
 * sumsq feeds gradient clipping, so it must not change from run to run: a fixed grid of
 * SUMSQ_BLOCKS blocks (so each thread's grid-stride share is fixed) sums in double into
 * the scratch, and ft_cuda_sum_partials adds the partials in index order and reads the
 * result back (the gradient-norm read of a step). */
#include "cuda_common.cuh"
#include "vec_io.cuh"

#define EW_THREADS 256
#define SUMSQ_BLOCKS 1024
#define SUMSQ_THREADS 256

__global__ void add_kernel(fview y, fview x, size_t n)
{
    GRID_STRIDE(i, n)
    st(y, i, ld(y, i) + ld(x, i));
}

__global__ void copy_kernel(fview y, fview x, size_t n)
{
    GRID_STRIDE(i, n)
    st(y, i, ld(x, i));
}

__global__ void scale_kernel(fview x, float s, size_t n)
{
    GRID_STRIDE(i, n)
    st(x, i, ld(x, i) * s);
}

/* add, copy (across dtypes) and scale 8 elements a thread (vec_io.cuh), n a multiple of 8 */
__global__ void add_vec8_kernel(fview y, fview x, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        float a[VEC8], b[VEC8];
        ld8(y, j * VEC8, a);
        ld8(x, j * VEC8, b);
#pragma unroll
        for (int k = 0; k < VEC8; k++)
            a[k] = a[k] + b[k];
        st8(y, j * VEC8, a);
    }
}

__global__ void copy_vec8_kernel(fview y, fview x, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        float a[VEC8];
        ld8(x, j * VEC8, a);
        st8(y, j * VEC8, a);
    }
}

__global__ void scale_vec8_kernel(fview x, float s, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        float a[VEC8];
        ld8(x, j * VEC8, a);
#pragma unroll
        for (int k = 0; k < VEC8; k++)
            a[k] = a[k] * s;
        st8(x, j * VEC8, a);
    }
}

__global__ void softcap_kernel(fview x, float cap, size_t n)
{
    GRID_STRIDE(i, n)
    st(x, i, tanhf(ld(x, i) / cap) * cap);
}

__global__ void sumsq_partial_kernel(double *partial, fview x, size_t n)
{
    __shared__ double shm[32];
    double acc = 0.0;
    GRID_STRIDE(i, n)
    {
        double v = ld(x, i);
        acc += v * v;
    }
    acc = block_sum(acc, shm);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = acc;
}

extern "C" void ft_cuda_add(ft_tensor y, ft_tensor x, size_t n)
{
    if (n == 0)
        return;
    if (vec8_ok(n, y.data, x.data))
        FT_LAUNCH(add_vec8_kernel, grid_for(n / VEC8, EW_THREADS), EW_THREADS, 0,
                  ft_cuda_stream())(fv(y), fv(x), n);
    else
        FT_LAUNCH(add_kernel, grid_for(n, EW_THREADS), EW_THREADS, 0, ft_cuda_stream())(
            fv(y), fv(x), n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_copy(ft_tensor y, ft_tensor x, size_t n)
{
    if (n == 0 || (y.data == x.data && y.dtype == x.dtype))
        return;
    if (y.dtype == x.dtype) {
        size_t bytes = n * (y.dtype == FT_BF16 ? 2 : 4);
        CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, bytes, cudaMemcpyDeviceToDevice,
                                   ft_cuda_stream()));
        return;
    }
    if (vec8_ok(n, y.data, x.data))
        FT_LAUNCH(copy_vec8_kernel, grid_for(n / VEC8, EW_THREADS), EW_THREADS, 0,
                  ft_cuda_stream())(fv(y), fv(x), n);
    else
        FT_LAUNCH(copy_kernel, grid_for(n, EW_THREADS), EW_THREADS, 0, ft_cuda_stream())(
            fv(y), fv(x), n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_zero(ft_tensor y, size_t n)
{
    if (n == 0)
        return;
    /* +0.0 is all-zero bits in fp32 and bf16 alike. */
    CUDA_CHECK(cudaMemsetAsync(y.data, 0, n * (y.dtype == FT_BF16 ? 2 : 4), ft_cuda_stream()));
}

extern "C" void ft_cuda_scale(ft_tensor x, float s, size_t n)
{
    if (n == 0)
        return;
    if (vec8_ok(n, x.data))
        FT_LAUNCH(scale_vec8_kernel, grid_for(n / VEC8, EW_THREADS), EW_THREADS, 0,
                  ft_cuda_stream())(fv(x), s, n);
    else
        FT_LAUNCH(scale_kernel, grid_for(n, EW_THREADS), EW_THREADS, 0, ft_cuda_stream())(
            fv(x), s, n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_softcap(ft_tensor x, float cap, size_t n)
{
    if (n == 0)
        return;
    FT_LAUNCH(softcap_kernel, grid_for(n, EW_THREADS), EW_THREADS, 0, ft_cuda_stream())(
        fv(x), cap, n);
    LAUNCH_CHECK();
}

extern "C" double ft_cuda_sumsq(ft_tensor x, size_t n)
{
    if (n == 0)
        return 0.0;
    cudaStream_t s = ft_cuda_stream();
    double *partial = ft_cuda_scratch();
    FT_LAUNCH(sumsq_partial_kernel, SUMSQ_BLOCKS, SUMSQ_THREADS, 0, s)(partial, fv(x), n);
    LAUNCH_CHECK();
    return ft_cuda_sum_partials(partial, SUMSQ_BLOCKS);
}
