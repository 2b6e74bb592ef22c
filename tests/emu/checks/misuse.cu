/* Programs that each do one thing wrong on the emulated device, for test_checks.sh: run as
 * `misuse CASE`, a case must stop with the emulation's message (ft-emu: ...) and a non-zero
 * exit, where compute-sanitizer would report it on a GPU (or the GPU would fault or hang).
 * The ok-* cases do the same things right and must exit 0, so a check that stops correct
 * code fails the test too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

extern "C" {
#include "ops.h"
}
#include "cuda/kernel_common.cuh"

#define LAUNCH FT_EMU_LAUNCH

static void ok(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        fprintf(stderr, "misuse: %s: %s\n", what, cudaGetErrorString(rc));
        exit(3);
    }
}

static float *dev_floats(size_t n, float v)
{
    float *d;
    ok(cudaMalloc(&d, n * sizeof(float)), "cudaMalloc");
    float *h = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = v;
    ok(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
    /* the copy may land later (FT_EMU_ASYNC=1): the cases that check device memory from the
     * host, as the NCCL emulation does after its stream's work, need it there */
    ok(cudaStreamSynchronize(0), "cudaStreamSynchronize");
    free(h);
    return d;
}

/* ---- kernels ---------------------------------------------------------------------------- */

__global__ void scale_kernel(float *p, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        p[i] *= 2.0f;
}

struct pair_args {
    fview x;
    float *y;
    int n;
};

__global__ void pair_kernel(pair_args a)
{
    for (int i = threadIdx.x; i < a.n; i += blockDim.x)
        a.y[i] = ld(a.x, (size_t)i);
}

__global__ void write_at_kernel(float *p, long at) { p[at] = 1.0f; }

__global__ void read_at_kernel(float *out, const float *p, long at) { out[0] = p[at]; }

__global__ void copy_ld_kernel(fview out, fview in, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        st(out, (size_t)i, ld(in, (size_t)i));
}

__global__ void divergent_kernel(float *p)
{
    if (threadIdx.x < 32) {
        p[threadIdx.x] = 1.0f;
        __syncthreads();
    } else {
        __syncthreads();
        p[threadIdx.x] = 2.0f;
    }
}

__global__ void warp_exit_kernel(float *p)
{
    if (threadIdx.x % 32 >= 16)
        return;
    p[threadIdx.x] = warp_sum(1.0f); /* full mask, half the warp gone */
}

__global__ void mask_kernel(float *p)
{
    /* lane 20 shuffles with a mask of lanes 0-15 only */
    p[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.0f, 1);
}

__global__ void deadlock_kernel(float *p)
{
    if (threadIdx.x == 0)
        __syncwarp(0x3u); /* waits for lane 1 ... */
    else
        __syncthreads(); /* ... which waits for thread 0 */
    p[threadIdx.x] = 0.0f;
}

__global__ void smem_write_kernel(float *p, int at)
{
    FT_DYNAMIC_SHARED(float, s);
    if (threadIdx.x == 0)
        s[at] = 1.0f;
    __syncthreads();
    p[threadIdx.x] = 0.0f;
}

__global__ void big_stack_kernel(float *p)
{
    volatile float big[128 * 1024]; /* 512 KiB of locals */
    for (int i = 0; i < 128 * 1024; i += 1024)
        big[i] = (float)i;
    p[threadIdx.x] = big[threadIdx.x * 1024];
}

/* ---- the cases ---------------------------------------------------------------------------- */

static void kernel_host_pointer(void)
{
    static float host[64];
    LAUNCH(scale_kernel, 1, 32, 0, 0)(host, 64);
}

static void kernel_struct_host_pointer(void)
{
    static float host[64];
    pair_args a = {{dev_floats(64, 1.0f), 0}, host, 64};
    LAUNCH(pair_kernel, 1, 32, 0, 0)(a);
}

static void kernel_freed_pointer(void)
{
    float *d = dev_floats(64, 1.0f);
    cudaFree(d);
    LAUNCH(scale_kernel, 1, 32, 0, 0)(d, 64);
}

static void kernel_other_device(void)
{
    ok(cudaSetDevice(1), "cudaSetDevice");
    float *d = dev_floats(64, 1.0f);
    ok(cudaSetDevice(0), "cudaSetDevice");
    LAUNCH(scale_kernel, 1, 32, 0, 0)(d, 64);
}

static void kernel_write_past_end(void) /* into the slack after the allocation */
{
    float *d = dev_floats(10, 1.0f);
    LAUNCH(write_at_kernel, 1, 1, 0, 0)(d, 12L);
}

static void kernel_read_far_past_end(void) /* into the guard page */
{
    float *d = dev_floats(10, 1.0f), *out = dev_floats(1, 0.0f);
    LAUNCH(read_at_kernel, 1, 1, 0, 0)(out, d, 100L); /* 360 bytes past the end */
}

static void kernel_read_before_start(void)
{
    float *d = dev_floats(1024, 1.0f), *out = dev_floats(1, 0.0f);
    LAUNCH(read_at_kernel, 1, 1, 0, 0)(out, d, -10L);
}

static void kernel_read_freed_host(void) /* host code touching freed device memory */
{
    float *d = dev_floats(64, 1.0f);
    cudaFree(d);
    volatile float x = d[3];
    (void)x;
}

static void kernel_uninitialised_ld(void)
{
    float *in, *out = dev_floats(64, 0.0f);
    ok(cudaMalloc(&in, 64 * sizeof(float)), "cudaMalloc");
    LAUNCH(copy_ld_kernel, 1, 32, 0, 0)(fview{out, 0}, fview{in, 0}, 64);
}

static void kernel_uninitialised_ld_bf16(void)
{
    void *in, *out;
    ok(cudaMalloc(&in, 64 * 2), "cudaMalloc");
    ok(cudaMalloc(&out, 64 * 2), "cudaMalloc");
    ok(cudaMemset(in, 0, 62 * 2), "cudaMemset"); /* the last element is never written */
    LAUNCH(copy_ld_kernel, 1, 32, 0, 0)(fview{out, 1}, fview{in, 1}, 64);
}

static void copy_host_as_device(void)
{
    static float a[16], b[16];
    cudaMemcpy(a, b, sizeof a, cudaMemcpyHostToDevice);
}

static void copy_device_as_host(void)
{
    float *d = dev_floats(16, 1.0f), *e = dev_floats(16, 2.0f);
    cudaMemcpy(d, e, 16 * sizeof(float), cudaMemcpyHostToDevice);
}

static void copy_to_host_kind_wrong(void)
{
    float h[16], *d = dev_floats(16, 1.0f);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToDevice);
}

static void copy_past_end(void)
{
    float h[20], *d = dev_floats(16, 1.0f);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
}

static void copy_after_free(void)
{
    float h[16], *d = dev_floats(16, 1.0f);
    cudaFree(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDefault);
}

static void memset_host(void)
{
    static float h[16];
    cudaMemset(h, 0, sizeof h);
}

static void double_free(void)
{
    float *d = dev_floats(16, 1.0f);
    cudaFree(d);
    cudaFree(d);
}

static void free_host(void)
{
    static float h[16];
    cudaFree(h);
}

static void free_interior(void)
{
    float *d = dev_floats(16, 1.0f);
    cudaFree(d + 4);
}

/* C[4x4] = A B with A, B, C of 16 floats; what goes wrong is picked by `bad` */
static void gemm(const char *bad)
{
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
        exit(3);
    static float host[16];
    float *A = dev_floats(16, 1.0f), *B = dev_floats(16, 2.0f), *C = dev_floats(16, 0.0f);
    float one = 1.0f, zero = 0.0f, *alpha = &one;
    int lda = 4;
    if (!strcmp(bad, "host-operand"))
        A = host;
    if (!strcmp(bad, "uninitialised"))
        ok(cudaMalloc(&B, 16 * sizeof(float)), "cudaMalloc");
    if (!strcmp(bad, "device-alpha"))
        alpha = dev_floats(1, 1.0f);
    if (!strcmp(bad, "past-end"))
        lda = 5; /* column 3 of A ends at 5 * 3 + 4 = 19 > 16 floats */
    cublasStatus_t s;
    if (!strcmp(bad, "batch-past-end")) /* the second of two batches of A starts at float 16 */
        s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, alpha, A, CUDA_R_32F,
                                       lda, 16, B, CUDA_R_32F, 4, 0, &zero, C, CUDA_R_32F, 4, 0, 2,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, alpha, A, CUDA_R_32F, lda, B,
                         CUDA_R_32F, 4, &zero, C, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        exit(3);
    float out[16];
    ok(cudaMemcpy(out, C, sizeof out, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (out[0] != 8.0f)
        exit(4);
}

static void launch(void (*k)(float *), int threads)
{
    LAUNCH(k, 1, threads, 0, 0)(dev_floats((size_t)threads, 0.0f));
}

static void check_device_api(void) /* as the NCCL emulation calls it */
{
    static float h[16];
    ft_emu_check_device(h, sizeof h, "ncclAllReduce", "sendbuff");
}

static void check_device_api_short(void)
{
    float *d = dev_floats(16, 1.0f);
    ft_emu_check_device(d, 17 * sizeof(float), "ncclAllReduce", "recvbuff");
}

static void check_written_api(void)
{
    float *d;
    ok(cudaMalloc(&d, 16 * sizeof(float)), "cudaMalloc");
    ok(cudaMemset(d, 0, 8 * sizeof(float)), "cudaMemset");
    ft_emu_stream_flush(NULL); /* as the NCCL emulation does: its stream's work first */
    ft_emu_check_written(d, 16 * sizeof(float), 4, "ncclAllReduce", "sendbuff");
}

/* flash attention through the library ops, bf16 D = 128: its shared memory (up to 104 KiB
 * a block) is over the opt-in limit of sm_86 / sm_89 (99 KiB), where the reference kernels
 * run instead (with one note on stderr), within sm_80's and sm_90's. Either way forward
 * and backward, called twice, must match the CPU op (bf16 tolerance); exit 4 if not. */
static void flash_attention_d128(void)
{
    const int B = 1, T = 8, H = 1, D = 128;
    const size_t n = (size_t)B * T * H * D, nl = (size_t)B * H * T;
    const float scale = 0.088f;
    float *x = (float *)malloc(n * 4), *g = (float *)malloc(n * 4);
    uint16_t *hb = (uint16_t *)malloc(n * 2), *hg = (uint16_t *)malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        hb[i] = __float2bfloat16_rn(0.1f * (float)(i % 17) - 0.8f).bits;
        hg[i] = __float2bfloat16_rn(0.05f * (float)(i % 13) - 0.3f).bits;
        x[i] = __bfloat162float(__nv_bfloat16{hb[i]});
        g[i] = __bfloat162float(__nv_bfloat16{hg[i]});
    }
    /* the CPU op: out, lse, then dq (= dk = dv: q = k = v) from zero */
    float *out = (float *)calloc(n, 4), *lse = (float *)calloc(nl, 4);
    float *dq = (float *)calloc(n, 4), *dk = (float *)calloc(n, 4), *dv = (float *)calloc(n, 4);
    ft_attention_forward(ft_f32(out, n), ft_f32(lse, nl), ft_f32(x, n), ft_f32(x, n),
                         ft_f32(x, n), ft_none(), B, T, H, H, D, scale, 0, 0.0f);
    ft_attention_backward(ft_f32(dq, n), ft_f32(dk, n), ft_f32(dv, n), ft_f32(g, n),
                          ft_f32(x, n), ft_f32(x, n), ft_f32(x, n), ft_f32(out, n),
                          ft_f32(lse, nl), ft_none(), B, T, H, H, D, scale, 0, 0.0f);
    void *q, *dout, *gout, *glse, *gd[3];
    ok(cudaMalloc(&q, n * 2), "cudaMalloc");
    ok(cudaMalloc(&dout, n * 2), "cudaMalloc");
    ok(cudaMalloc(&gout, n * 2), "cudaMalloc");
    ok(cudaMalloc(&glse, nl * 4), "cudaMalloc");
    ok(cudaMemcpy(q, hb, n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    ok(cudaMemcpy(dout, hg, n * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
    ft_tensor tq = ft_view(q, n, FT_BF16, FT_DEV_CUDA), to = ft_view(gout, n, FT_BF16, FT_DEV_CUDA);
    ft_tensor tg = ft_view(dout, n, FT_BF16, FT_DEV_CUDA);
    ft_tensor tl = ft_view(glse, nl, FT_F32, FT_DEV_CUDA), td[3];
    for (int rep = 0; rep < 2; rep++) {
        for (int i = 0; i < 3; i++) {
            gd[i] = dev_floats(n, 0.0f);
            td[i] = ft_view(gd[i], n, FT_F32, FT_DEV_CUDA);
        }
        ft_attention_forward(to, tl, tq, tq, tq, ft_none(), B, T, H, H, D, scale, 0, 0.0f);
        ft_attention_backward(td[0], td[1], td[2], tg, tq, tq, tq, to, tl, ft_none(), B, T, H,
                              H, D, scale, 0, 0.0f);
        ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        /* the largest error against the largest reference value, per result */
        uint16_t *ho = (uint16_t *)malloc(n * 2);
        float *hf = (float *)malloc(n * 4);
        ok(cudaMemcpy(ho, gout, n * 2, cudaMemcpyDeviceToHost), "cudaMemcpy");
        const float *refs[4] = {out, dq, dk, dv};
        for (int r = 0; r < 4; r++) {
            if (r > 0)
                ok(cudaMemcpy(hf, gd[r - 1], n * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
            double err = 0, big = 0;
            for (size_t i = 0; i < n; i++) {
                float got = r == 0 ? __bfloat162float(__nv_bfloat16{ho[i]}) : hf[i];
                err = fmax(err, fabs((double)got - refs[r][i]));
                big = fmax(big, fabs((double)refs[r][i]));
            }
            if (!(err <= 1e-2 * big)) {
                fprintf(stderr, "misuse: attention D=128 result %d: error %g of %g\n", r, err,
                        big);
                exit(4);
            }
        }
        free(ho);
        free(hf);
        for (int i = 0; i < 3; i++)
            cudaFree(gd[i]);
    }
    cudaFree(q), cudaFree(dout), cudaFree(gout), cudaFree(glse);
    free(x), free(g), free(hb), free(hg), free(out), free(lse), free(dq), free(dk), free(dv);
}

/* Host code that reads what asynchronous work writes before it waits for it: on a GPU it
 * may see the old contents; under FT_EMU_ASYNC=1 it always does, and the program's own
 * check of the value stops it (the emulation cannot see a host read). With `sync` the
 * same thing done right. */
static void async_read(bool sync)
{
    float *d = dev_floats(64, 2.0f), h[64] = {0};
    cudaStream_t s;
    ok(cudaStreamCreate(&s), "cudaStreamCreate");
    LAUNCH(scale_kernel, 1, 32, 0, s)(d, 64);
    ok(cudaMemcpyAsync(h, d, sizeof h, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync");
    if (sync)
        ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    if (h[0] != 4.0f || h[63] != 4.0f) {
        fprintf(stderr, "misuse: the copy's destination read before the stream's work ran: "
                        "%g, want 4\n", h[0]);
        exit(4);
    }
    ok(cudaStreamDestroy(s), "cudaStreamDestroy");
}

/* Two non-blocking streams, a producer and a consumer, without the cudaStreamWaitEvent
 * between them (`wait`: with it): the consumer's kernel runs first under FT_EMU_ASYNC=1. */
static void stream_order(bool wait)
{
    float *a = dev_floats(64, 0.0f), *b = dev_floats(64, 1.0f), h[64];
    cudaStream_t prod, cons;
    cudaEvent_t ev;
    ok(cudaStreamCreateWithFlags(&prod, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    ok(cudaStreamCreateWithFlags(&cons, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ok(cudaMemcpyAsync(a, b, 64 * sizeof(float), cudaMemcpyDeviceToDevice, prod),
       "cudaMemcpyAsync"); /* a = 1 */
    ok(cudaEventRecord(ev, prod), "cudaEventRecord");
    if (wait)
        ok(cudaStreamWaitEvent(cons, ev, 0), "cudaStreamWaitEvent");
    LAUNCH(scale_kernel, 1, 32, 0, cons)(a, 64); /* a = 2, after the copy */
    ok(cudaStreamSynchronize(cons), "cudaStreamSynchronize");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ok(cudaMemcpy(h, a, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (h[0] != 2.0f) {
        fprintf(stderr, "misuse: the consumer stream ran before the producer: a = %g, want 2\n",
                h[0]);
        exit(4);
    }
}

/* the same things done right */
static void ok_all(void)
{
    float *d = dev_floats(64, 1.0f), *e = dev_floats(64, 0.0f), h[64];
    LAUNCH(scale_kernel, 1, 32, 0, 0)(d, 64);
    pair_args a = {{d, 0}, e, 64};
    LAUNCH(pair_kernel, 1, 32, 0, 0)(a);
    LAUNCH(write_at_kernel, 1, 1, 0, 0)(d, 63L);
    ok(cudaMemcpy(h, e, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy");
    ok(cudaMemcpy(e, d, sizeof h, cudaMemcpyDefault), "cudaMemcpy");
    ok(cudaGetLastError(), "launch");
    ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (h[0] != 2.0f)
        exit(4);
    cudaFree(d);
    cudaFree(e);
    gemm("none");
    ft_emu_check_device(dev_floats(4, 0.0f), 16, "ncclAllReduce", "sendbuff");
    ft_emu_check_written(dev_floats(4, 0.0f), 16, 4, "ncclAllReduce", "sendbuff");
    float *s = dev_floats(64, 0.0f);
    LAUNCH(smem_write_kernel, 1, 64, 64 * sizeof(float), 0)(s, 63);
    ok(cudaGetLastError(), "launch");
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"kernel-host-pointer", kernel_host_pointer},
    {"kernel-struct-host-pointer", kernel_struct_host_pointer},
    {"kernel-freed-pointer", kernel_freed_pointer},
    {"kernel-other-device", kernel_other_device},
    {"kernel-write-past-end", kernel_write_past_end},
    {"kernel-read-far-past-end", kernel_read_far_past_end},
    {"kernel-read-before-start", kernel_read_before_start},
    {"host-read-freed", kernel_read_freed_host},
    {"kernel-uninitialised-ld", kernel_uninitialised_ld},
    {"kernel-uninitialised-ld-bf16", kernel_uninitialised_ld_bf16},
    {"copy-host-as-device", copy_host_as_device},
    {"copy-device-as-host", copy_device_as_host},
    {"copy-to-host-kind-wrong", copy_to_host_kind_wrong},
    {"copy-past-end", copy_past_end},
    {"copy-after-free", copy_after_free},
    {"memset-host", memset_host},
    {"double-free", double_free},
    {"free-host", free_host},
    {"free-interior", free_interior},
    {"gemm-host-operand", [] { gemm("host-operand"); }},
    {"gemm-uninitialised", [] { gemm("uninitialised"); }},
    {"gemm-device-alpha", [] { gemm("device-alpha"); }},
    {"gemm-past-end", [] { gemm("past-end"); }},
    {"gemm-batch-past-end", [] { gemm("batch-past-end"); }},
    {"divergent-barrier", [] { launch(divergent_kernel, 64); }},
    {"warp-lane-exited", [] { launch(warp_exit_kernel, 32); }},
    {"shuffle-outside-mask", [] { launch(mask_kernel, 32); }},
    {"deadlock", [] { launch(deadlock_kernel, 64); }},
    {"shared-write-past-end", [] { LAUNCH(smem_write_kernel, 1, 32, 100 * 4, 0)(dev_floats(32, 0), 101); }},
    {"shared-write-far-past-end", [] { LAUNCH(smem_write_kernel, 1, 32, 100 * 4, 0)(dev_floats(32, 0), 200); }},
    {"stack-overflow", [] { launch(big_stack_kernel, 1); }},
    {"check-device-host", check_device_api},
    {"check-device-short", check_device_api_short},
    {"check-written", check_written_api},
    {"flash-attention-d128", flash_attention_d128},
    {"async-read-no-sync", [] { async_read(false); }},
    {"ok-async-read", [] { async_read(true); }},
    {"stream-no-wait", [] { stream_order(false); }},
    {"ok-stream-wait", [] { stream_order(true); }},
    {"ok-all", ok_all},
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: misuse CASE\n");
        return 2;
    }
    for (const auto &c : cases)
        if (!strcmp(argv[1], c.name)) {
            c.run();
            printf("misuse: %s ran to the end\n", c.name);
            return 0;
        }
    fprintf(stderr, "misuse: no case '%s'\n", argv[1]);
    return 2;
}
