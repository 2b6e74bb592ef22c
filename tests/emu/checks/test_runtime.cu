/* The emulated CUDA device against the semantics it claims (tests/emu/include, docs/gpu.md):
 *
 * - devices: FT_EMU_DEVICES, FT_EMU_ARCH's properties (sharedMemPerBlockOptin of each
 *   architecture), FT_EMU_MEM's limit (cudaErrorMemoryAllocation past it, the memory back
 *   after cudaFree), CUDA_VISIBLE_DEVICES (order, hiding all), PCI bus ids;
 * - errors: the last error of a failed call, cleared by cudaGetLastError and not by
 *   cudaPeekAtLastError; a trapped kernel's sticky cudaErrorLaunchFailure, never cleared and
 *   returned by every later call; the names and texts;
 * - memory: 256-byte alignment, fresh memory all 0xFF, every cudaMemcpyKind (Default both
 *   ways), sets, the async forms, cudaPointerGetAttributes, the refusals (NULL pointers, a
 *   bad kind);
 * - streams and events: flags, record, query, wait, elapsed time, a destroyed handle;
 * - launches: the configuration limits, dynamic shared memory against 48 KiB and
 *   cudaFuncSetAttribute against the device's opt-in limit, the launch error left for
 *   cudaGetLastError and the kernel not run;
 * - the engine: coordinates in 3-D grids and blocks, __syncthreads as a real barrier (a
 *   kernel that leaves it out reads what others have not written), shuffles (xor, down, up,
 *   broadcast), kernel_common.cuh's block_sum, dynamic shared memory fresh (0xFF) in every
 *   block, WMMA against a plain product, FMA contraction in device code and none for the
 *   _rn intrinsics;
 * - cuBLAS: every type combination CUBLAS_COMPUTE_32F takes, transposes, alpha and beta
 *   (beta 0 does not read C), round-to-nearest-even into bf16 (ties), TF32 math mode, and the
 *   refusals (NOT_SUPPORTED, INVALID_VALUE, NOT_INITIALIZED);
 * - ft_emu.h's calls for the NCCL emulation.
 * What needs a process of its own (another configuration, a sticky error) runs this binary
 * again with an argument and reads what it prints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

extern "C" {
#include "ops.h"
}
#include "check.h"
#include "cuda/kernel_common.cuh"

static const char *self;

/* Runs this binary with `env` and `arg`; its stdout. */
static std::string rerun(const char *env, const char *arg)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env %s '%s' %s 2>&1", env, self, arg);
    FILE *f = popen(cmd, "r");
    std::string out;
    char buf[512];
    while (f && fgets(buf, sizeof buf, f))
        out += buf;
    if (f)
        pclose(f);
    return out;
}

static bool has(const std::string &s, const char *what) { return s.find(what) != std::string::npos; }

/* ---- devices -------------------------------------------------------------------------- */

/* The child side: what the device(s) look like under this process's environment. */
static int print_devices(void)
{
    int n = -1;
    cudaError_t rc = cudaGetDeviceCount(&n);
    printf("count %d %s\n", n, cudaGetErrorName(rc));
    for (int d = 0; d < n; d++) {
        cudaDeviceProp p;
        char bus[32];
        cudaGetDeviceProperties(&p, d);
        cudaDeviceGetPCIBusId(bus, sizeof bus, d);
        int optin = 0;
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d);
        printf("device %d name=%s cc=%d.%d optin=%zu attr_optin=%d bus=%s mem=%zu\n", d, p.name,
               p.major, p.minor, p.sharedMemPerBlockOptin, optin, bus, p.totalGlobalMem);
    }
    if (n > 0) {
        size_t free_b, total;
        void *p = NULL;
        cudaMemGetInfo(&free_b, &total);
        printf("meminfo %zu %zu\n", free_b, total);
        rc = cudaMalloc(&p, total + 1);
        printf("malloc_over %s %s\n", cudaGetErrorName(rc), cudaGetErrorName(cudaGetLastError()));
        size_t part = total > ((size_t)64 << 20) ? (size_t)1 << 20 : total / 2;
        rc = cudaMalloc(&p, part);
        size_t before = free_b;
        cudaMemGetInfo(&free_b, &total);
        printf("after_part %s took=%zu\n", cudaGetErrorName(rc), before - free_b);
        cudaFree(p);
        cudaMemGetInfo(&free_b, &total);
        printf("after_free free=%zu\n", free_b);
    }
    return 0;
}

static void test_devices(void)
{
    int n = 0;
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 1);
    std::string s = rerun("FT_EMU_ARCH=sm_86", "--devices");
    CHECK(has(s, "count 1 cudaSuccess"));
    CHECK(has(s, "name=NVIDIA RTX A6000 (emulated) cc=8.6 optin=101376 attr_optin=101376"));
    s = rerun("FT_EMU_ARCH=sm_89", "--devices");
    CHECK(has(s, "cc=8.9 optin=101376"));
    s = rerun("FT_EMU_ARCH=sm_80", "--devices");
    CHECK(has(s, "cc=8.0 optin=166912"));
    s = rerun("FT_EMU_ARCH=sm_90", "--devices");
    CHECK(has(s, "name=NVIDIA H100 80GB HBM3 (emulated) cc=9.0 optin=232448"));
    s = rerun("FT_EMU_DEVICES=3", "--devices");
    CHECK(has(s, "count 3 cudaSuccess") && has(s, "bus=0000:12:00.0"));
    s = rerun("FT_EMU_DEVICES=3 CUDA_VISIBLE_DEVICES=2,0", "--devices");
    CHECK(has(s, "count 2") && has(s, "device 0 name") && has(s, "bus=0000:12:00.0"));
    CHECK(has(s, "device 1 name") && has(s, "bus=0000:10:00.0") && !has(s, "device 2"));
    s = rerun("FT_EMU_DEVICES=3 CUDA_VISIBLE_DEVICES=1,7,0", "--devices"); /* stops at 7 */
    CHECK(has(s, "count 1 cudaSuccess"));
    s = rerun("CUDA_VISIBLE_DEVICES=", "--devices");
    CHECK(has(s, "count 0 cudaErrorNoDevice"));
    s = rerun("FT_EMU_MEM=1MiB", "--devices");
    CHECK(has(s, "mem=1048576") && has(s, "meminfo 1048576 1048576"));
    CHECK(has(s, "malloc_over cudaErrorMemoryAllocation cudaErrorMemoryAllocation"));
    CHECK(has(s, "after_part cudaSuccess took=524288") && has(s, "after_free free=1048576"));
    s = rerun("FT_EMU_MEM=3G", "--devices");
    CHECK(has(s, "mem=3221225472"));
    s = rerun("FT_EMU_ARCH=sm_75", "--devices");
    CHECK(has(s, "FT_EMU_ARCH='sm_75'") && has(s, "sm_80, sm_86, sm_89 or sm_90"));
    CHECK(cudaSetDevice(1) == cudaErrorInvalidDevice);
    int d = -1;
    CHECK(cudaGetDevice(&d) == cudaSuccess && d == 0);
    CHECK(ft_emu_device_count() == 1 && ft_emu_current_device() == 0);
    (void)cudaGetLastError();
}

/* ---- errors --------------------------------------------------------------------------- */

__global__ void trap_kernel(int *p)
{
    if (threadIdx.x == 5)
        __trap();
    __syncthreads();
    p[threadIdx.x] = 1;
}

__global__ void write_kernel(int *p, int v) { p[threadIdx.x] = v; }

/* The child side: a kernel that traps, then what the runtime answers. */
static int print_sticky(void)
{
    int *p;
    cudaMalloc(&p, 64 * sizeof(int));
    cudaMemset(p, 0, 64 * sizeof(int));
    FT_EMU_LAUNCH(trap_kernel, 1, 64, 0, 0)(p);
    printf("sync %s\n", cudaGetErrorName(cudaDeviceSynchronize()));
    printf("get %s\n", cudaGetErrorName(cudaGetLastError()));
    printf("get_again %s\n", cudaGetErrorName(cudaGetLastError()));
    int h[64];
    printf("memcpy %s\n", cudaGetErrorName(cudaMemcpy(h, p, sizeof h, cudaMemcpyDeviceToHost)));
    void *q;
    printf("malloc %s\n", cudaGetErrorName(cudaMalloc(&q, 16)));
    FT_EMU_LAUNCH(write_kernel, 1, 64, 0, 0)(p, 7);
    printf("launch %s\n", cudaGetErrorName(cudaPeekAtLastError()));
    return 0;
}

static void test_errors(void)
{
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaSetDevice(7) == cudaErrorInvalidDevice);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);
    CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice); /* peek keeps it */
    CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
    CHECK(cudaGetLastError() == cudaSuccess); /* get cleared it */
    CHECK(!strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation"));
    CHECK(!strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory"));
    CHECK(!strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument"));
    CHECK(!strcmp(cudaGetErrorName(cudaErrorLaunchFailure), "cudaErrorLaunchFailure"));
    std::string s = rerun("", "--sticky");
    CHECK(has(s, "sync cudaErrorLaunchFailure"));
    CHECK(has(s, "get cudaErrorLaunchFailure") && has(s, "get_again cudaErrorLaunchFailure"));
    CHECK(has(s, "memcpy cudaErrorLaunchFailure") && has(s, "malloc cudaErrorLaunchFailure"));
    CHECK(has(s, "launch cudaErrorLaunchFailure"));
}

/* ---- memory --------------------------------------------------------------------------- */

static void test_memory(void)
{
    unsigned char *a = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, 1000) == cudaSuccess && ((uintptr_t)a & 255) == 0);
    CHECK(cudaMalloc(&b, 1000) == cudaSuccess && ((uintptr_t)b & 255) == 0);
    std::vector<unsigned char> h(1000), g(1000);
    CHECK(cudaMemcpy(h.data(), a, 1000, cudaMemcpyDeviceToHost) == cudaSuccess);
    bool ones = true;
    for (unsigned char c : h)
        ones &= c == 0xff;
    CHECK(ones); /* fresh memory: the never-written pattern */
    for (int i = 0; i < 1000; i++)
        h[(size_t)i] = (unsigned char)(i * 7);
    CHECK(cudaMemcpy(a, h.data(), 1000, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(b, a, 1000, cudaMemcpyDeviceToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(g.data(), b, 1000, cudaMemcpyDefault) == cudaSuccess && g == h);
    CHECK(cudaMemset(b, 3, 500) == cudaSuccess);
    CHECK(cudaMemcpy(g.data(), b, 1000, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(g[0] == 3 && g[499] == 3 && g[500] == h[500]);
    std::vector<unsigned char> h2(1000, 9);
    CHECK(cudaMemcpy(b, h2.data(), 1000, cudaMemcpyDefault) == cudaSuccess);
    CHECK(cudaMemcpy(g.data(), h2.data(), 1000, cudaMemcpyHostToHost) == cudaSuccess && g == h2);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    /* the blocking copy to b may still be in flight (CUDA: "the DMA to final destination
     * may not have completed"), and s does not wait for the legacy stream */
    CHECK(cudaStreamSynchronize(0) == cudaSuccess);
    CHECK(cudaMemcpyAsync(a, b, 1000, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    CHECK(cudaMemsetAsync(b, 0, 1000, s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(g.data(), a, 1000, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && g == h2);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    cudaPointerAttributes at;
    CHECK(cudaPointerGetAttributes(&at, a + 10) == cudaSuccess && at.type == cudaMemoryTypeDevice &&
          at.device == 0);
    CHECK(cudaPointerGetAttributes(&at, h.data()) == cudaSuccess &&
          at.type == cudaMemoryTypeUnregistered);
    /* refusals: recoverable errors, as on the GPU */
    CHECK(cudaMemcpy(NULL, a, 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(g.data(), a, 4, (cudaMemcpyKind)7) == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaMemcpy(g.data(), a, 0, cudaMemcpyDeviceToHost) == cudaSuccess);
    void *z = &z;
    CHECK(cudaMalloc(&z, 0) == cudaSuccess && z == NULL);
    CHECK(ft_emu_is_device(a, 1000) && !ft_emu_is_device(a, 1001) && ft_emu_is_device(a + 1000, 0));
    CHECK(!ft_emu_is_device(h.data(), 1));
    ft_emu_check_device(a + 10, 990, "test", "a");
    ft_emu_check_written(a, 1000, 4, "test", "a");
    CHECK(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess && cudaFree(NULL) == cudaSuccess);
    CHECK(!ft_emu_is_device(a, 0)); /* freed */
    (void)cudaGetLastError();
    /* page-locked host memory: ranges that overlap are refused, unregister takes the
     * registered pointer; device memory and NULL are not host memory */
    std::vector<unsigned char> pin(4096);
    CHECK(cudaHostRegister(pin.data(), 2048, cudaHostRegisterDefault) == cudaSuccess);
    CHECK(cudaHostRegister(pin.data() + 1024, 2048, 0) == cudaErrorHostMemoryAlreadyRegistered);
    CHECK(cudaHostRegister(pin.data() + 2048, 2048, 0) == cudaSuccess); /* adjacent */
    CHECK(cudaHostUnregister(pin.data() + 1) == cudaErrorHostMemoryNotRegistered);
    CHECK(cudaHostUnregister(pin.data()) == cudaSuccess);
    CHECK(cudaHostUnregister(pin.data()) == cudaErrorHostMemoryNotRegistered);
    CHECK(cudaHostUnregister(pin.data() + 2048) == cudaSuccess);
    CHECK(cudaHostRegister(NULL, 16, 0) == cudaErrorInvalidValue);
    unsigned char *d = NULL;
    CHECK(cudaMalloc(&d, 64) == cudaSuccess);
    CHECK(cudaHostRegister(d, 64, 0) == cudaErrorInvalidValue);
    CHECK(cudaFree(d) == cudaSuccess);
    (void)cudaGetLastError();
}

/* ---- streams and events --------------------------------------------------------------- */

static void test_streams_events(void)
{
    cudaStream_t s;
    cudaEvent_t e, t0, t1;
    CHECK(cudaStreamCreateWithFlags(&s, 0x4) == cudaErrorInvalidValue);
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaSuccess); /* never recorded: complete */
    CHECK(cudaEventRecord(e, cudaStreamLegacy) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(s, e, 0) == cudaSuccess);
    CHECK(cudaEventQuery(e) == cudaSuccess && cudaStreamQuery(s) == cudaSuccess);
    CHECK(cudaEventCreate(&t0) == cudaSuccess && cudaEventCreate(&t1) == cudaSuccess);
    CHECK(cudaEventRecord(t0, s) == cudaSuccess && cudaEventRecord(t1, 0) == cudaSuccess);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, t0, t1) == cudaSuccess && ms >= 0);
    CHECK(cudaEventElapsedTime(&ms, e, t1) == cudaErrorInvalidResourceHandle); /* no timing */
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle); /* destroyed */
    CHECK(cudaStreamDestroy(0) == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventDestroy(e) == cudaSuccess);
    CHECK(cudaEventRecord(e, 0) == cudaErrorInvalidResourceHandle);
    CHECK(cudaEventDestroy(t0) == cudaSuccess && cudaEventDestroy(t1) == cudaSuccess);
    int *p;
    cudaMalloc(&p, 64 * sizeof(int));
    FT_EMU_LAUNCH(write_kernel, 1, 32, 0, s)(p, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    cudaFree(p);
}

/* ---- launches ------------------------------------------------------------------------- */

__global__ void smem_kernel(int *out, int n)
{
    FT_DYNAMIC_SHARED(int, s);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s[i] = i;
    __syncthreads();
    if (threadIdx.x == 0) {
        int sum = 0;
        for (int i = 0; i < n; i++)
            sum += s[i];
        out[blockIdx.x] = sum;
    }
}

static int print_smem_limits(void)
{
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    int optin = (int)p.sharedMemPerBlockOptin;
    printf("set_optin %s\n", cudaGetErrorName(cudaFuncSetAttribute(smem_kernel,
                                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, optin)));
    printf("set_over %s\n", cudaGetErrorName(cudaFuncSetAttribute(smem_kernel,
                                                                  cudaFuncAttributeMaxDynamicSharedMemorySize, optin + 1)));
    printf("set_flash128 %s\n", cudaGetErrorName(cudaFuncSetAttribute(smem_kernel,
                                                                      cudaFuncAttributeMaxDynamicSharedMemorySize, 113664)));
    return 0;
}

static void test_launches(void)
{
    int *out;
    cudaMalloc(&out, 8 * sizeof(int));
    cudaMemset(out, 0, 8 * sizeof(int));
    FT_EMU_LAUNCH(write_kernel, 1, 1025, 0, 0)(out, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    FT_EMU_LAUNCH(write_kernel, dim3(1, 65536), 1, 0, 0)(out, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    FT_EMU_LAUNCH(write_kernel, dim3(1, 1), dim3(8, 8, 65), 0, 0)(out, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    FT_EMU_LAUNCH(write_kernel, 0, 8, 0, 0)(out, 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    int h[8];
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == 0); /* no refused launch ran */
    /* dynamic shared memory: 48 KiB without the attribute */
    int n = 48 * 1024 / 4;
    FT_EMU_LAUNCH(smem_kernel, 2, 128, (size_t)n * 4, 0)(out, n);
    CHECK(cudaGetLastError() == cudaSuccess);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == n * (n - 1) / 2 && h[1] == h[0]);
    FT_EMU_LAUNCH(smem_kernel, 1, 128, (size_t)n * 4 + 4, 0)(out, n + 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    n = 200 * 1024 / 4; /* under sm_90's opt-in, the default architecture */
    CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4) ==
          cudaSuccess);
    FT_EMU_LAUNCH(smem_kernel, 1, 256, (size_t)n * 4, 0)(out, n);
    CHECK(cudaGetLastError() == cudaSuccess);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[0] == (int)((long long)n * (n - 1) / 2));
    FT_EMU_LAUNCH(smem_kernel, 1, 256, (size_t)n * 4 + 4, 0)(out, n + 1);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, -1) ==
          cudaErrorInvalidValue);
    (void)cudaGetLastError();
    std::string s = rerun("FT_EMU_ARCH=sm_89", "--smem");
    CHECK(has(s, "set_optin cudaSuccess") && has(s, "set_over cudaErrorInvalidValue"));
    CHECK(has(s, "set_flash128 cudaErrorInvalidValue")); /* flash_attention.cu's D = 128 */
    s = rerun("FT_EMU_ARCH=sm_80", "--smem");
    CHECK(has(s, "set_over cudaErrorInvalidValue") && has(s, "set_flash128 cudaSuccess"));
    cudaFree(out);
}

/* ---- the engine ----------------------------------------------------------------------- */

__global__ void coords_kernel(unsigned *out)
{
    unsigned b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    unsigned n = blockDim.x * blockDim.y * blockDim.z;
    out[b * n + t] = b * 1000 + t;
}

/* each thread writes its slot, then reads its neighbour's: needs the barrier */
__global__ void neighbour_kernel(int *out, int base, int barrier)
{
    __shared__ int s[256];
    s[threadIdx.x] = base + (int)threadIdx.x + 1;
    if (barrier)
        __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

__global__ void shuffle_kernel(float *out)
{
    float v = (float)threadIdx.x;
    out[threadIdx.x] = warp_sum(v);                                       /* butterfly */
    out[64 + threadIdx.x] = __shfl_sync(0xffffffffu, v, 3);               /* broadcast */
    out[128 + threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 1);
    out[192 + threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 2);
    double d = (double)threadIdx.x * 0.5;
    out[256 + threadIdx.x] = (float)__shfl_xor_sync(0xffffffffu, d, 16);  /* 8-byte values */
}

__global__ void block_sum_kernel(double *out, const float *x, int n)
{
    __shared__ double shm[32];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        acc += x[i];
    acc = block_sum(acc, shm);
    if (threadIdx.x == 0)
        out[blockIdx.x] = acc;
}

/* block 0 writes its shared memory; block 1 must find the never-written pattern again */
__global__ void fresh_smem_kernel(unsigned *out)
{
    FT_DYNAMIC_SHARED(unsigned, s);
    if (blockIdx.x == 1 && threadIdx.x == 0)
        out[0] = s[0] == 0xffffffffu && s[63] == 0xffffffffu;
    s[threadIdx.x] = 0;
}

__global__ void wmma_kernel(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c)
{
    using namespace nvcuda;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_col_major);
}

/* one FMA, as nvcc makes it; two roundings with the intrinsics (a kernel each, so the
 * compiler cannot share the product between them) */
__global__ void contract_kernel(float *out, float a, float b, float c) { out[0] = a * b + c; }
__global__ void rn_kernel(float *out, float a, float b, float c)
{
    out[1] = __fadd_rn(__fmul_rn(a, b), c);
}

static void test_engine(void)
{
    unsigned *u;
    const unsigned nb = 2 * 3 * 2, nt = 4 * 2 * 3;
    cudaMalloc(&u, nb * nt * sizeof(unsigned));
    FT_EMU_LAUNCH(coords_kernel, dim3(2, 3, 2), dim3(4, 2, 3), 0, 0)(u);
    std::vector<unsigned> hu(nb * nt);
    cudaMemcpy(hu.data(), u, hu.size() * 4, cudaMemcpyDeviceToHost);
    bool ok = true;
    for (unsigned b = 0; b < nb; b++)
        for (unsigned t = 0; t < nt; t++)
            ok &= hu[b * nt + t] == b * 1000 + t;
    CHECK(ok);
    cudaFree(u);

    int *o;
    cudaMalloc(&o, 256 * sizeof(int));
    std::vector<int> ho(256);
    FT_EMU_LAUNCH(neighbour_kernel, 1, 256, 0, 0)(o, 0, 1);
    cudaMemcpy(ho.data(), o, 256 * 4, cudaMemcpyDeviceToHost);
    ok = true;
    for (int t = 0; t < 256; t++)
        ok &= ho[(size_t)t] == (t + 1) % 256 + 1;
    CHECK(ok);
    /* without the barrier thread 0 reads slot 1 before thread 1 writes it: it finds the
     * previous launch's value there (shared memory is not cleared), not this one's */
    FT_EMU_LAUNCH(neighbour_kernel, 1, 256, 0, 0)(o, 1000, 0);
    cudaMemcpy(ho.data(), o, 256 * 4, cudaMemcpyDeviceToHost);
    CHECK(ho[0] == 2 && ho[255] == 1001);
    cudaFree(o);

    float *f;
    cudaMalloc(&f, 320 * sizeof(float));
    FT_EMU_LAUNCH(shuffle_kernel, 1, 64, 0, 0)(f);
    std::vector<float> hf(320);
    cudaMemcpy(hf.data(), f, 320 * 4, cudaMemcpyDeviceToHost);
    ok = true;
    for (int t = 0; t < 64; t++) {
        int w = t / 32 * 32, lane = t % 32;
        ok &= hf[(size_t)t] == (float)(32 * w + 496);
        ok &= hf[64 + (size_t)t] == (float)(w + 3);
        ok &= hf[128 + (size_t)t] == (float)(lane < 31 ? t + 1 : t);
        ok &= hf[192 + (size_t)t] == (float)(lane >= 2 ? t - 2 : t);
        ok &= hf[256 + (size_t)t] == (float)((w + (lane ^ 16)) * 0.5);
    }
    CHECK(ok);
    cudaFree(f);

    const int n = 10007;
    std::vector<float> hx(n);
    double ref = 0;
    for (int i = 0; i < n; i++)
        ref += hx[(size_t)i] = (float)((i * 37) % 101) / 7.0f;
    float *x;
    double *sum;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&sum, 2 * sizeof(double));
    cudaMemcpy(x, hx.data(), n * 4, cudaMemcpyHostToDevice);
    FT_EMU_LAUNCH(block_sum_kernel, 2, 256, 0, 0)(sum, x, n);
    double got[2];
    cudaMemcpy(got, sum, sizeof got, cudaMemcpyDeviceToHost);
    CHECK(fabs(got[0] - ref) < 1e-9 * ref && got[0] == got[1]);
    cudaFree(x);
    cudaFree(sum);

    unsigned *fresh;
    cudaMalloc(&fresh, 4);
    FT_EMU_LAUNCH(fresh_smem_kernel, 2, 64, 64 * 4, 0)(fresh);
    unsigned hfresh = 0;
    cudaMemcpy(&hfresh, fresh, 4, cudaMemcpyDeviceToHost);
    CHECK(hfresh == 1);
    cudaFree(fresh);

    /* WMMA: D = A B + C, A row-major, B column-major, D stored column-major */
    std::vector<__nv_bfloat16> ha(256), hb(256);
    std::vector<float> hc(256), hd(256);
    for (int i = 0; i < 256; i++) {
        ha[(size_t)i] = __float2bfloat16_rn((float)((i * 7) % 13) - 6.0f);
        hb[(size_t)i] = __float2bfloat16_rn((float)((i * 5) % 11) * 0.25f);
        hc[(size_t)i] = (float)(i % 3);
    }
    __nv_bfloat16 *da, *db;
    float *dc, *dd;
    cudaMalloc(&da, 512);
    cudaMalloc(&db, 512);
    cudaMalloc(&dc, 1024);
    cudaMalloc(&dd, 1024);
    cudaMemcpy(da, ha.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(db, hb.data(), 512, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, hc.data(), 1024, cudaMemcpyHostToDevice);
    FT_EMU_LAUNCH(wmma_kernel, 1, 32, 0, 0)(dd, da, db, dc);
    cudaMemcpy(hd.data(), dd, 1024, cudaMemcpyDeviceToHost);
    ok = true;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) {
            double s = hc[(size_t)(r * 16 + c)];
            for (int k = 0; k < 16; k++)
                s += (double)__bfloat162float(ha[(size_t)(r * 16 + k)]) *
                     __bfloat162float(hb[(size_t)(c * 16 + k)]);
            ok &= hd[(size_t)(c * 16 + r)] == (float)s; /* exact: small values */
        }
    CHECK(ok);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);

    /* a b + c where one rounding and two differ */
    float a = 1.0f + 0x1p-23f, b = 1.0f - 0x1p-23f, c = -1.0f, *fc;
    cudaMalloc(&fc, 8);
    FT_EMU_LAUNCH(contract_kernel, 1, 1, 0, 0)(fc, a, b, c);
    FT_EMU_LAUNCH(rn_kernel, 1, 1, 0, 0)(fc, a, b, c);
    float r2[2];
    cudaMemcpy(r2, fc, 8, cudaMemcpyDeviceToHost);
    volatile float va = a, vb = b;
    float two = va * vb;
    two = two + c;
#if defined(__FMA__)
    CHECK(r2[0] == fmaf(a, b, c) && r2[0] != two);
#endif
    CHECK(r2[1] == two);
    cudaFree(fc);
}

/* Two host threads launch at once (the block workers serve one launch at a time; the
 * other runs its blocks itself): both results are whole. */
__global__ void fill_kernel(int *p, int v)
{
    p[blockIdx.x * blockDim.x + threadIdx.x] = v + (int)(blockIdx.x * blockDim.x + threadIdx.x);
}

static void test_concurrent_launches(void)
{
    const int blocks = 64, threads = 128, n = blocks * threads;
    int *a, *b;
    cudaMalloc(&a, n * sizeof(int));
    cudaMalloc(&b, n * sizeof(int));
    auto launch = [&](int *p, int v) {
        for (int r = 0; r < 20; r++)
            FT_EMU_LAUNCH(fill_kernel, blocks, threads, 0, 0)(p, v + r);
    };
    std::thread t1(launch, a, 1000), t2(launch, b, 5000);
    t1.join();
    t2.join();
    std::vector<int> ha(n), hb(n);
    cudaMemcpy(ha.data(), a, n * sizeof(int), cudaMemcpyDeviceToHost);
    cudaMemcpy(hb.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost);
    bool ok = true;
    for (int i = 0; i < n; i++)
        ok &= ha[(size_t)i] == 1019 + i && hb[(size_t)i] == 5019 + i;
    CHECK(ok);
    cudaFree(a);
    cudaFree(b);
}

/* ---- cuBLAS --------------------------------------------------------------------------- */

static uint16_t to_bf16(float f) { return __float2bfloat16_rn(f).bits; }

/* A device copy of host values stored as type t. */
static void *upload(const std::vector<float> &v, cudaDataType_t t)
{
    size_t es = t == CUDA_R_32F ? 4 : t == CUDA_R_8I ? 1 : 2;
    std::vector<unsigned char> raw(v.size() * es);
    for (size_t i = 0; i < v.size(); i++) {
        if (t == CUDA_R_32F)
            memcpy(&raw[i * 4], &v[i], 4);
        else if (t == CUDA_R_8I)
            raw[i] = (unsigned char)(int8_t)v[i];
        else {
            uint16_t h = to_bf16(v[i]);
            if (t == CUDA_R_16F) { /* the values used are small integers and quarters: exact */
                float x = v[i];
                int e = 0;
                float m = frexpf(fabsf(x), &e);
                h = x == 0 ? 0 : (uint16_t)((x < 0 ? 0x8000 : 0) | ((e + 14) << 10) | ((int)(m * 2048) & 0x3ff));
            }
            memcpy(&raw[i * 2], &h, 2);
        }
    }
    void *d;
    cudaMalloc(&d, raw.size());
    cudaMemcpy(d, raw.data(), raw.size(), cudaMemcpyHostToDevice);
    return d;
}

static float f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float v = e ? ldexpf(1.0f + (float)m / 1024.0f, e - 15) : ldexpf((float)m / 1024.0f, -14);
    return h & 0x8000 ? -v : v;
}

static std::vector<float> download(const void *d, size_t n, cudaDataType_t t)
{
    size_t es = t == CUDA_R_32F ? 4 : 2;
    std::vector<unsigned char> raw(n * es);
    cudaMemcpy(raw.data(), d, raw.size(), cudaMemcpyDeviceToHost);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        if (t == CUDA_R_32F) {
            memcpy(&v[i], &raw[i * 4], 4);
        } else {
            uint16_t h;
            memcpy(&h, &raw[i * 2], 2);
            v[i] = t == CUDA_R_16BF ? __bfloat162float(__nv_bfloat16{h}) : f16_value(h);
        }
    }
    return v;
}

/* C = alpha op(A) op(B) + beta C against a double reference: exact integer data, so the
 * fp32 result is exact and a 16-bit C must be its rounding to nearest even. */
static void gemm_case(cudaDataType_t ab, cudaDataType_t ct, bool ta, bool tb, float alpha, float beta)
{
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const int m = 5, n = 7, k = 9, lda = (ta ? k : m) + 2, ldb = (tb ? n : k) + 1, ldc = m + 3;
    std::vector<float> A((size_t)lda * (ta ? m : k)), B((size_t)ldb * (tb ? k : n)),
        C((size_t)ldc * n);
    for (size_t i = 0; i < A.size(); i++)
        A[i] = (float)((int)(i * 7 % 9) - 4);
    for (size_t i = 0; i < B.size(); i++)
        B[i] = (float)((int)(i * 5 % 7) - 3);
    for (size_t i = 0; i < C.size(); i++)
        C[i] = ct == CUDA_R_32F ? (float)((int)(i % 5) - 2) * 0.5f : (float)((int)(i % 5) - 2);
    void *dA = upload(A, ab), *dB = upload(B, ab), *dC = upload(C, ct);
    CHECK(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                       &alpha, dA, ab, lda, dB, ab, ldb, &beta, dC, ct, ldc, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    std::vector<float> got = download(dC, C.size(), ct);
    bool ok = true;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                double a = ta ? A[(size_t)i * lda + p] : A[(size_t)p * lda + i];
                double b = tb ? B[(size_t)p * ldb + j] : B[(size_t)j * ldb + p];
                s += a * b;
            }
            double want = alpha * s + beta * C[(size_t)j * ldc + i];
            float w = (float)want;
            if (ct == CUDA_R_16BF)
                w = __bfloat162float(__float2bfloat16_rn(w));
            ok &= got[(size_t)j * ldc + i] == w || ct == CUDA_R_16F;
            if (ct == CUDA_R_16F)
                ok &= fabs(got[(size_t)j * ldc + i] - want) <= fabs(want) * 1e-3;
        }
    for (int j = 0; j < n; j++) /* the padding rows of C are not touched */
        for (int i = m; i < ldc; i++)
            ok &= got[(size_t)j * ldc + i] == C[(size_t)j * ldc + i];
    if (!ok)
        fprintf(stderr, "  gemm %d x %d -> %d ta=%d tb=%d alpha=%g beta=%g wrong\n", ab, ab, ct, ta,
                tb, alpha, beta);
    CHECK(ok);
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    cublasDestroy(h);
}

static void test_cublas(void)
{
    static const cudaDataType_t combos[][2] = {{CUDA_R_32F, CUDA_R_32F},   {CUDA_R_16BF, CUDA_R_16BF},
                                               {CUDA_R_16BF, CUDA_R_32F},  {CUDA_R_16F, CUDA_R_16F},
                                               {CUDA_R_16F, CUDA_R_32F},   {CUDA_R_8I, CUDA_R_32F}};
    for (const auto &c : combos)
        for (int t = 0; t < 4; t++) {
            gemm_case(c[0], c[1], t & 1, t & 2, 1.0f, 0.0f);
            gemm_case(c[0], c[1], t & 1, t & 2, 0.5f, 1.0f);
        }
    cublasHandle_t h;
    cublasCreate(&h);
    float *dA, *dC, one = 1.0f, zero = 0.0f;
    cudaMalloc(&dA, 64 * 4);
    cudaMalloc(&dC, 64 * 4);
    cudaMemset(dA, 0, 64 * 4);
    /* beta 0: C is not read, so a NaN (never written) in it does not matter */
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dA, CUDA_R_32F, 4, dA, CUDA_R_32F,
                       4, &zero, dC, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
          CUBLAS_STATUS_SUCCESS);
    std::vector<float> hc = download(dC, 16, CUDA_R_32F);
    CHECK(hc[0] == 0.0f && hc[15] == 0.0f);
    /* bf16 ties round to even: 257 -> 256, 259 -> 260 (the fp32 result is exact) */
    void *ones = upload(std::vector<float>(2, 1.0f), CUDA_R_16BF);
    void *cb = upload(std::vector<float>(2, 0.0f), CUDA_R_16BF);
    float a257 = 257.0f, a259 = 259.0f;
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &a257, ones, CUDA_R_16BF, 1, ones,
                       CUDA_R_16BF, 1, &zero, cb, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(download(cb, 1, CUDA_R_16BF)[0] == 256.0f);
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &a259, ones, CUDA_R_16BF, 1, ones,
                       CUDA_R_16BF, 1, &zero, cb, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(download(cb, 1, CUDA_R_16BF)[0] == 260.0f);
    /* TF32 math mode rounds fp32 operands to 10 mantissa bits; the default does not */
    float x = 1.0f + 0x1p-20f;
    void *dx = upload(std::vector<float>(1, x), CUDA_R_32F), *dy = upload(std::vector<float>(1, 0.0f), CUDA_R_32F);
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dx, CUDA_R_32F, 1, dx, CUDA_R_32F,
                       1, &zero, dy, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(download(dy, 1, CUDA_R_32F)[0] == x * x);
    CHECK(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dx, CUDA_R_32F, 1, dx, CUDA_R_32F,
                       1, &zero, dy, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(download(dy, 1, CUDA_R_32F)[0] == 1.0f);
    CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS);
    /* what the library refuses */
#define GEMM(m_, n_, k_, ta_, lda_, ldb_, ldc_, at, bt, ct_)                                       \
    cublasGemmEx(h, ta_, CUBLAS_OP_N, m_, n_, k_, &one, dA, at, lda_, dA, bt, ldb_, &zero, dC, ct_, \
                 ldc_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
    CHECK(GEMM(2, 2, 2, CUBLAS_OP_N, 2, 2, 2, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16F) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(2, 2, 2, CUBLAS_OP_N, 2, 2, 2, CUDA_R_32F, CUDA_R_16BF, CUDA_R_32F) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(2, 2, 2, CUBLAS_OP_N, 2, 2, 2, CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(2, 2, 2, CUBLAS_OP_N, 2, 2, 2, CUDA_R_8I, CUDA_R_8I, CUDA_R_8I) ==
          CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(GEMM(-1, 2, 2, CUBLAS_OP_N, 2, 2, 2, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F) ==
          CUBLAS_STATUS_INVALID_VALUE);
    CHECK(GEMM(4, 2, 2, CUBLAS_OP_N, 3, 2, 4, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F) ==
          CUBLAS_STATUS_INVALID_VALUE); /* lda < m */
    CHECK(GEMM(2, 2, 4, CUBLAS_OP_T, 3, 4, 2, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F) ==
          CUBLAS_STATUS_INVALID_VALUE); /* transposed A: lda < k */
    CHECK(GEMM(2, 2, 4, CUBLAS_OP_N, 2, 3, 2, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F) ==
          CUBLAS_STATUS_INVALID_VALUE); /* ldb < k */
    CHECK(GEMM(4, 2, 2, CUBLAS_OP_N, 4, 2, 3, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F) ==
          CUBLAS_STATUS_INVALID_VALUE); /* ldc < m */
    CHECK(!strcmp(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED"));
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS);
    CHECK(GEMM(2, 2, 2, CUBLAS_OP_N, 2, 2, 2, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F) ==
          CUBLAS_STATUS_NOT_INITIALIZED);
#undef GEMM
    cudaFree(dA), cudaFree(dC), cudaFree(ones), cudaFree(cb), cudaFree(dx), cudaFree(dy);
}

/* cublasGemmStridedBatchedEx: each of its products is the cublasGemmEx of that batch's
 * operands (exact integer data, so the results are equal), in a k-split such as
 * kernels/cuda/linear.cu makes (the batches' A and B spans adjacent, C's apart); a batch
 * count of 0 does nothing, a negative one is refused. */
static void test_cublas_strided_batched(void)
{
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const int m = 3, n = 5, span = 4, batch = 3, k = span * batch;
    std::vector<float> A((size_t)m * k), B((size_t)n * k), C((size_t)m * n * batch, 7.0f);
    for (size_t i = 0; i < A.size(); i++)
        A[i] = (float)((int)(i * 7 % 9) - 4);
    for (size_t i = 0; i < B.size(); i++)
        B[i] = (float)((int)(i * 5 % 7) - 3);
    void *dA = upload(A, CUDA_R_16BF), *dB = upload(B, CUDA_R_16BF);
    void *dC = upload(C, CUDA_R_32F), *dR = upload(C, CUDA_R_32F);
    float alpha = 0.5f, zero = 0.0f;
    /* A m x k (column-major, lda m), B^T: B stored n x k (ldb n); batch i takes columns
     * [i span, (i + 1) span) of both */
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, span, &alpha, dA,
                                     CUDA_R_16BF, m, (long long)span * m, dB, CUDA_R_16BF, n,
                                     (long long)span * n, &zero, dC, CUDA_R_32F, m,
                                     (long long)m * n, batch, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    for (int i = 0; i < batch; i++)
        CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, span, &alpha,
                           (char *)dA + (size_t)i * span * m * 2, CUDA_R_16BF, m,
                           (char *)dB + (size_t)i * span * n * 2, CUDA_R_16BF, n, &zero,
                           (float *)dR + (size_t)i * m * n, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    std::vector<float> got = download(dC, C.size(), CUDA_R_32F);
    std::vector<float> want = download(dR, C.size(), CUDA_R_32F);
    CHECK(got == want);
    double s = 0; /* and one element against its definition: batch 1, (2, 4) */
    for (int p = span; p < 2 * span; p++)
        s += (double)A[(size_t)p * m + 2] * B[(size_t)p * n + 4];
    CHECK(got[(size_t)m * n + 4 * m + 2] == (float)(alpha * s));
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, span, &alpha, dA,
                                     CUDA_R_16BF, m, 0, dB, CUDA_R_16BF, n, 0, &zero, dR,
                                     CUDA_R_32F, m, 0, 0, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(download(dR, C.size(), CUDA_R_32F) == want);
    CHECK(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_T, m, n, span, &alpha, dA,
                                     CUDA_R_16BF, m, 0, dB, CUDA_R_16BF, n, 0, &zero, dR,
                                     CUDA_R_32F, m, 0, -1, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dR);
    cublasDestroy(h);
}

int main(int argc, char **argv)
{
    self = argv[0];
    if (argc > 1 && !strcmp(argv[1], "--devices"))
        return print_devices();
    if (argc > 1 && !strcmp(argv[1], "--sticky"))
        return print_sticky();
    if (argc > 1 && !strcmp(argv[1], "--smem"))
        return print_smem_limits();
    RUN(test_devices);
    RUN(test_errors);
    RUN(test_memory);
    RUN(test_streams_events);
    RUN(test_launches);
    RUN(test_engine);
    RUN(test_concurrent_launches);
    RUN(test_cublas);
    RUN(test_cublas_strided_batched);
    return check_summary("emu_runtime");
}
