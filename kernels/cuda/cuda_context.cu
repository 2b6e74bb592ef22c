/* The CUDA backend's context: the stream every op is enqueued on, the cuBLAS handle and
 * a small device scratch for reductions that return a value.
 *
 * The ops interface carries no context argument (the tensor's device picks the backend,
 * DESIGN.md seam 1), so this is the one piece of process-wide state of kernels/cuda,
 * created lazily on the current device by the first op and kept for the life of the
 * process, as llm.c keeps its cuBLAS handle. Ops are issued from one host thread. */
#include "cuda_common.cuh"

extern "C" {
#include "core/ft_error.h"
}

namespace {
struct cuda_context {
    bool ready;
    cudaStream_t stream;
    cublasHandle_t cublas;
    double *scratch;
};
cuda_context ctx;

/* The context on the current device, or -1 with err: its allocations (the cuBLAS handle,
 * the scratch) can meet a full device, which is an out-of-memory of the run (err->oom),
 * not a bug. */
int context_open(ft_err *err)
{
    if (ctx.ready)
        return 0;
    /* The legacy default stream: ordered with cudaMemcpy and every other library call on
     * the device, which keeps host<->device copies in the trainer simple. */
    ctx.stream = 0;
    cublasStatus_t s = cublasCreate(&ctx.cublas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        (void)cudaGetLastError();
        if (s == CUBLAS_STATUS_ALLOC_FAILED)
            return ft_fail_oom(err, "out of GPU memory creating the cuBLAS handle");
        return ft_fail(err, "cublasCreate: %s", cublasGetStatusString(s));
    }
    CUBLAS_CHECK(cublasSetStream(ctx.cublas, ctx.stream));
    /* fp32 GEMMs stay fp32 (no TF32): the fp32 path is checked at 1e-5 against the CPU. */
    CUBLAS_CHECK(cublasSetMathMode(ctx.cublas, CUBLAS_DEFAULT_MATH));
    const size_t bytes = FT_CUDA_SCRATCH_DOUBLES * sizeof(double);
    cudaError_t e = cudaMalloc(&ctx.scratch, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next op's launch check */
        (void)cublasDestroy(ctx.cublas);
        if (e == cudaErrorMemoryAllocation)
            return ft_fail_oom(err, "out of GPU memory creating the CUDA ops' context: "
                                    "%zu bytes of reduction scratch did not fit",
                               bytes);
        return ft_fail(err, "cudaMalloc of the CUDA ops' scratch: %s (%s)",
                       cudaGetErrorString(e), cudaGetErrorName(e));
    }
    ctx.ready = true;
    return 0;
}

/* The first op's lazy creation, where ft_cuda_context_open was not called first (the GPU
 * tier's op tests): a failure there aborts, as any op's CUDA error does. */
void context_init(void)
{
    if (ctx.ready)
        return;
    ft_err err;
    if (context_open(&err)) {
        fprintf(stderr, "CUDA ops: %s\n", err.msg);
        abort();
    }
}
} // namespace

extern "C" int ft_cuda_context_open(ft_err *err) { return context_open(err); }

cudaStream_t ft_cuda_stream(void)
{
    context_init();
    return ctx.stream;
}

cublasHandle_t ft_cuda_cublas(void)
{
    context_init();
    return ctx.cublas;
}

double *ft_cuda_scratch(void)
{
    context_init();
    return ctx.scratch;
}

void ft_cuda_read(void *host, const void *device, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, ft_cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(ft_cuda_stream()));
}

/* partial[n] = partial[0] + ... + partial[n-1], in order: one thread (n is a few
 * hundred partial sums at most, so the order costs nothing and matches the CPU ops'). */
__global__ static void sum_partials_kernel(double *partial, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += partial[i];
    partial[n] = s;
}

double ft_cuda_sum_partials(double *partial, int n)
{
    FT_LAUNCH(sum_partials_kernel, 1, 1, 0, ft_cuda_stream())(partial, n);
    LAUNCH_CHECK();
    double total;
    ft_cuda_read(&total, partial + n, sizeof total);
    return total;
}

extern "C" void ft_cuda_synchronize(void)
{
    CUDA_CHECK(cudaStreamSynchronize(ft_cuda_stream()));
    CUDA_CHECK(cudaGetLastError());
}
