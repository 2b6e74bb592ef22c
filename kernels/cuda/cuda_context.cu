/* The CUDA backend's context: the stream every op is enqueued on, the cuBLAS handle and
 * a small device scratch for reductions that return a value.
 *
 * The ops interface carries no context argument (the tensor's device picks the backend,
 * DESIGN.md seam 1), so this is the one piece of process-wide state of kernels/cuda,
 * opened on the current device by ft_cuda_context_open (the tools, when they select the
 * GPU: device/run_device.h) or else by the first op, and kept for the life of the process,
 * as llm.c keeps its cuBLAS handle. Ops are issued from one host thread. */
#include <stdio.h>
#include <stdlib.h>

#include "core/ft_error.h"
#include "cuda_common.cuh"
#include "device_memory.h"

namespace {
struct cuda_context {
    bool ready;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *workspace; /* cuBLAS's, given to it (cublasSetWorkspace) */
    size_t workspace_bytes;
    double *scratch;
    float *splitk; /* FT_CUDA_SPLITK_FLOATS: linear.cu's split-K partial products */
    int sms;       /* the device's multiprocessors */
};
cuda_context ctx;

/* The size of cuBLAS's own default workspace (4 MiB; 32 MiB on Hopper and later). */
size_t workspace_size(void)
{
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        major = 9;
    }
    return (size_t)(major >= 9 ? 32 : 4) << 20;
}

int cublas_fail(ft_err *err, const char *call, cublasStatus_t st)
{
    const char *fmt = "%s: %s (%s)";
    if (st == CUBLAS_STATUS_ALLOC_FAILED)
        return ft_fail_oom(err, fmt, call, cublasGetStatusString(st), cublasGetStatusName(st));
    return ft_fail(err, fmt, call, cublasGetStatusString(st), cublasGetStatusName(st));
}

/* Everything the context allocates, at once and recoverably: the cuBLAS handle, the
 * workspace cuBLAS would otherwise allocate by itself on the first GEMM, and the scratch.
 * An op has no error to return, so a device out of memory there could only abort; here it
 * is an out-of-memory error (err->oom) that ft-train explains with the memory plan. */
int context_open(ft_err *err)
{
    if (ctx.ready)
        return 0;
    cuda_context c = {};
    /* The legacy default stream: ordered with cudaMemcpy and every other library call on
     * the device, which keeps host<->device copies in the trainer simple. */
    c.stream = 0;
    cublasStatus_t st = cublasCreate(&c.cublas);
    if (st != CUBLAS_STATUS_SUCCESS)
        return cublas_fail(err, "cublasCreate", st);
    c.workspace_bytes = workspace_size();
    int dev = -1;
    (void)cudaGetDevice(&dev);
    if (cudaMalloc(&c.workspace, c.workspace_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        cublasDestroy(c.cublas);
        return ft_fail_oom(err, "out of GPU memory on GPU %d for cuBLAS's workspace "
                                "(%zu MiB)", dev, c.workspace_bytes >> 20);
    }
    if (cudaMalloc(&c.scratch, FT_CUDA_SCRATCH_DOUBLES * sizeof(double)) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(c.workspace);
        cublasDestroy(c.cublas);
        return ft_fail_oom(err, "out of GPU memory on GPU %d for the CUDA backend's "
                                "scratch (%zu KiB)", dev, FT_CUDA_SCRATCH_DOUBLES * sizeof(double) >> 10);
    }
    if (cudaMalloc(&c.splitk, FT_CUDA_SPLITK_FLOATS * sizeof(float)) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(c.scratch);
        cudaFree(c.workspace);
        cublasDestroy(c.cublas);
        return ft_fail_oom(err, "out of GPU memory on GPU %d for the CUDA backend's split-K "
                                "scratch (%zu MiB)", dev, FT_CUDA_SPLITK_FLOATS * sizeof(float) >> 20);
    }
    if (cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        c.sms = 0; /* no split-K */
    }
    /* fp32 GEMMs stay fp32 (no TF32): the fp32 path is checked at 1e-5 against the CPU. */
    if ((st = cublasSetStream(c.cublas, c.stream)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetMathMode(c.cublas, CUBLAS_DEFAULT_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetWorkspace(c.cublas, c.workspace, c.workspace_bytes)) !=
            CUBLAS_STATUS_SUCCESS) {
        cudaFree(c.splitk);
        cudaFree(c.scratch);
        cudaFree(c.workspace);
        cublasDestroy(c.cublas);
        return cublas_fail(err, "setting up the cuBLAS handle", st);
    }
    c.ready = true;
    ctx = c;
    return 0;
}

/* A caller that never opened the context (a test of one op): opened on first use, and a
 * failure stops the process, as a failed op would. */
void context_init(void)
{
    ft_err err;
    if (ctx.ready || context_open(&err) == 0)
        return;
    fprintf(stderr, "the CUDA backend's context: %s\n", err.msg);
    abort();
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

float *ft_cuda_splitk_scratch(void)
{
    context_init();
    return ctx.splitk;
}

int ft_cuda_sm_count(void)
{
    context_init();
    return ctx.sms;
}

void ft_cuda_read(void *host, const void *device, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, ft_cuda_stream()));
    CUDA_CHECK(cudaStreamSynchronize(ft_cuda_stream()));
}

/* partial[n] = partial[0] + ... + partial[n-1], in order (the CPU ops add their partials
 * the same way). One thread adds, since the order is fixed; the block first stages the
 * partials in shared memory, SUM_STAGE at a time with coalesced loads, so the adds wait
 * on one round trip to memory per stage rather than one per partial (the cross-entropy
 * sums up to 2048). */
#define SUM_THREADS 256
#define SUM_STAGE 2048
__global__ static void sum_partials_kernel(double *partial, int n)
{
    __shared__ double stage[SUM_STAGE];
    double s = 0.0;
    for (int base = 0; base < n; base += SUM_STAGE) {
        int len = n - base < SUM_STAGE ? n - base : SUM_STAGE;
        for (int i = threadIdx.x; i < len; i += blockDim.x)
            stage[i] = partial[base + i];
        __syncthreads();
        if (threadIdx.x == 0)
            for (int i = 0; i < len; i++)
                s += stage[i];
        __syncthreads(); /* the next stage overwrites */
    }
    if (threadIdx.x == 0)
        partial[n] = s;
}

double ft_cuda_sum_partials(double *partial, int n)
{
    FT_LAUNCH(sum_partials_kernel, 1, SUM_THREADS, 0, ft_cuda_stream())(partial, n);
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
