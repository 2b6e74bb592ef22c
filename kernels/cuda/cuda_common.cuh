/* Shared pieces of the CUDA kernels (the .cu files of kernels/cuda): typed loads and
 * stores of fp32/bf16 operands and deterministic warp and block sums (kernel_common.cuh),
 * launch sizes, and the backend context (stream, cuBLAS handle, scratch) from
 * cuda_context.cu. Not a public header. */
#ifndef FT_CUDA_COMMON_CUH
#define FT_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_check.h"
#include "cuda_ops.h"
#include "kernel_common.cuh"

/* Blocks of `threads` for n elements in a grid-stride loop: enough to fill the GPU, no
 * more than the work. */
static inline unsigned grid_for(size_t n, int threads)
{
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    const size_t cap = 65535;
    return (unsigned)(blocks < 1 ? 1 : blocks > cap ? cap : blocks);
}

/* The one launch form of kernels/cuda: FT_LAUNCH(k, grid, block, smem, stream)(args...).
 * Under nvcc it is k<<<grid, block, smem, stream>>>(args...); the emulated build (make
 * CUDA=emu) compiles these same sources with the host compiler, where it is a launcher
 * object that checks the launch and its arguments and runs the kernel on the host
 * (tests/emu/include/ft_emu_kernel.h). */
#ifdef FT_CUDA_EMU
#define FT_LAUNCH(k, grid, block, smem, stream) FT_EMU_LAUNCH(k, grid, block, smem, stream)
#else
#define FT_LAUNCH(k, grid, block, smem, stream) k<<<grid, block, smem, stream>>>
#endif

#define GRID_STRIDE(i, n)                                                               \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);            \
         i += (size_t)gridDim.x * blockDim.x)

/* After a launch: a bad configuration is a bug in the backend, so it aborts. */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* cuda_context.cu: the backend's per-process state, created on first use for the
 * current device. */
cudaStream_t ft_cuda_stream(void);
cublasHandle_t ft_cuda_cublas(void);
/* Device scratch of FT_CUDA_SCRATCH_DOUBLES doubles (1 MiB), for the partial sums of the
 * reductions that return a value (cross-entropy, sumsq) and of the column sums
 * (colsum.cuh: as fp32, up to 256 row chunks of C columns). One op uses it at a time (ops
 * run in stream order). */
#define FT_CUDA_SCRATCH_DOUBLES 131072
double *ft_cuda_scratch(void);
/* Device scratch of FT_CUDA_SPLITK_FLOATS floats (16 MiB) for the partial products of a
 * GEMM cut along its reduction (linear.cu), and the device's multiprocessor count (0 where
 * unknown). */
#define FT_CUDA_SPLITK_FLOATS ((size_t)1 << 22)
float *ft_cuda_splitk_scratch(void);
int ft_cuda_sm_count(void);
/* Copies `bytes` from the device to the host after the work enqueued so far. */
void ft_cuda_read(void *host, const void *device, size_t bytes);
/* The sum of partial[0..n) (n < FT_CUDA_SCRATCH_DOUBLES), added in index order on the
 * device after the work enqueued so far, read back to the host. */
double ft_cuda_sum_partials(double *partial, int n);

#endif
