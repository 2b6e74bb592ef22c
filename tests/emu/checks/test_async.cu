/* The emulated device's deferred mode (FT_EMU_ASYNC=1, tests/emu/runtime/queue.cc) against
 * CUDA's stream semantics: queued work is not visible before the host waits for it, and
 * each wait runs what CUDA says it waits for, no less and no more.
 *
 * - an async D2H copy's destination is unchanged until cudaStreamSynchronize, right after;
 * - ft_emu_pending counts the queued operations; cudaStreamQuery and cudaEventQuery say
 *   cudaErrorNotReady while work is queued (not left as the last error), and a polling
 *   loop ends;
 * - cross-stream order: without cudaStreamWaitEvent a non-blocking stream's kernel runs
 *   before the other stream's producer (reads the old data); with it, after;
 *   cudaEventSynchronize waits for the work before the record only;
 * - the legacy default stream: a blocking cudaMemcpy D2H waits for the work of a blocking
 *   stream issued before it (implicit synchronization), not for a non-blocking stream's;
 * - a blocking H2D cudaMemcpy takes its source at the call; an async one when it runs;
 *   cudaMemset and a D2D cudaMemcpy are queued; cudaFree and cudaDeviceSynchronize run
 *   everything; a queued kernel takes its arguments at the launch; cuBLAS is queued on the
 *   handle's stream with alpha and beta read at the call.
 * The binary sets FT_EMU_ASYNC=1 for itself (the mode is read once, at the first call). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "check.h"
#include "ft_emu.h"

__global__ void fill_kernel(int *p, int n, int v)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        p[i] = v;
}

__global__ void add_kernel(int *dst, const int *src, int n)
{
    int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        dst[i] += src[i];
}

static const int N = 256;

static int *dev_ints(int v)
{
    int *p = NULL;
    cudaMalloc(&p, N * sizeof(int));
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, 0)(p, N, v);
    cudaDeviceSynchronize();
    return p;
}

static void test_d2h_async(void)
{
    int *d = dev_ints(7);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    CHECK(ft_emu_pending() == 0);
    std::vector<int> h(N, -1);
    CHECK(cudaMemcpyAsync(h.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(ft_emu_pending() == 1);
    CHECK(h[0] == -1 && h[N - 1] == -1); /* not yet: the host must wait first */
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaSuccess); /* not an error */
    while (cudaStreamQuery(s) == cudaErrorNotReady) /* the device progresses between polls */
        ;
    CHECK(h[0] == 7 && h[N - 1] == 7);
    /* the same with a synchronize */
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, s)(d, N, 9);
    CHECK(cudaMemcpyAsync(h.data(), d, N * sizeof(int), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(ft_emu_pending() == 2 && h[5] == 7);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(ft_emu_pending() == 0 && h[5] == 9);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    cudaFree(d);
}

static void test_events_across_streams(void)
{
    int *a = dev_ints(1), *b = dev_ints(0);
    cudaStream_t prod, cons;
    cudaEvent_t ev;
    CHECK(cudaStreamCreateWithFlags(&prod, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&cons, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess);
    std::vector<int> h(N);

    /* no wait: cons's add reads a before prod's fill (the consumer's stream is forced) */
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, prod)(a, N, 5);
    FT_EMU_LAUNCH(add_kernel, 1, N, 0, cons)(b, a, N);
    CHECK(cudaStreamSynchronize(cons) == cudaSuccess);
    CHECK(ft_emu_pending() == 1); /* prod's fill: another stream, not waited for */
    CHECK(cudaStreamSynchronize(prod) == cudaSuccess && ft_emu_pending() == 0);
    CHECK(cudaMemcpy(h.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 1); /* the old a: the race a missing wait makes */

    /* with the event: the add follows the fill */
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, cons)(b, N, 0);
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, prod)(a, N, 6);
    CHECK(cudaEventRecord(ev, prod) == cudaSuccess);
    CHECK(cudaEventQuery(ev) == cudaErrorNotReady);
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, prod)(a, N, 100); /* after the record */
    CHECK(cudaStreamWaitEvent(cons, ev, 0) == cudaSuccess);
    FT_EMU_LAUNCH(add_kernel, 1, N, 0, cons)(b, a, N);
    CHECK(cudaStreamSynchronize(cons) == cudaSuccess);
    CHECK(ft_emu_pending() == 1); /* the fill after the record is not waited for */
    CHECK(cudaEventQuery(ev) == cudaSuccess);
    CHECK(cudaMemcpyAsync(h.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost, cons) == cudaSuccess);
    CHECK(cudaStreamSynchronize(cons) == cudaSuccess && h[0] == 6 && h[N - 1] == 6);

    /* cudaEventSynchronize: the work before the record, not what follows it */
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, prod)(a, N, 8);
    CHECK(cudaEventRecord(ev, prod) == cudaSuccess);
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, prod)(a, N, 9);
    size_t before = ft_emu_pending();
    CHECK(cudaEventSynchronize(ev) == cudaSuccess);
    CHECK(before >= 4 && ft_emu_pending() == 1);
    cudaDeviceSynchronize();
    CHECK(ft_emu_pending() == 0);
    cudaEventDestroy(ev);
    cudaStreamDestroy(prod);
    cudaStreamDestroy(cons);
    cudaFree(a);
    cudaFree(b);
}

static void test_legacy_stream(void)
{
    int *a = dev_ints(1), *b = dev_ints(2);
    cudaStream_t blocking, nonblocking;
    CHECK(cudaStreamCreate(&blocking) == cudaSuccess);
    CHECK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking) == cudaSuccess);
    std::vector<int> h(N);
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, blocking)(a, N, 3);
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, nonblocking)(b, N, 4);
    CHECK(ft_emu_pending() == 2);
    /* the blocking copy: the legacy stream, so after the blocking stream's fill */
    CHECK(cudaMemcpy(h.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 3 && h[N - 1] == 3);
    CHECK(ft_emu_pending() == 1); /* the non-blocking stream's fill is left queued */
    CHECK(cudaMemcpy(h.data(), b, N * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 2); /* ...so the copy read b before it */
    /* and the other way: a blocking stream's work follows the legacy stream's */
    CHECK(cudaMemset(a, 0, N * sizeof(int)) == cudaSuccess); /* queued on the legacy stream */
    CHECK(cudaMemcpyAsync(h.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost, blocking) ==
          cudaSuccess);
    CHECK(cudaStreamSynchronize(blocking) == cudaSuccess && h[0] == 0 && h[N - 1] == 0);
    /* cudaDeviceSynchronize: everything */
    CHECK(ft_emu_pending() == 1);
    CHECK(cudaDeviceSynchronize() == cudaSuccess && ft_emu_pending() == 0);
    cudaStreamDestroy(blocking);
    cudaStreamDestroy(nonblocking);
    cudaFree(a);
    cudaFree(b);
}

static void test_copies_sets(void)
{
    int *a = dev_ints(0), *b = dev_ints(0);
    std::vector<int> src(N, 11), h(N, -1);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    /* blocking H2D: the source is taken at the call; the host may reuse it at once */
    CHECK(cudaMemcpy(a, src.data(), N * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
    src.assign(N, 12);
    CHECK(cudaMemcpy(h.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 11);
    /* async H2D: read when it runs */
    CHECK(cudaMemcpyAsync(a, src.data(), N * sizeof(int), cudaMemcpyHostToDevice, s) == cudaSuccess);
    src.assign(N, 13);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaMemcpy(h.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 13);
    /* D2D cudaMemcpy and cudaMemset: queued on the legacy stream */
    CHECK(cudaMemset(b, 0x01, N * sizeof(int)) == cudaSuccess);
    CHECK(cudaMemcpy(a, b, N * sizeof(int), cudaMemcpyDeviceToDevice) == cudaSuccess);
    CHECK(ft_emu_pending() == 2);
    CHECK(cudaMemsetAsync(b, 0, N * sizeof(int), s) == cudaSuccess); /* after both (blocking s) */
    CHECK(ft_emu_pending() == 3);
    CHECK(cudaMemcpy(h.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 0x01010101);
    CHECK(ft_emu_pending() == 0); /* the legacy stream's copy followed s's set too */
    /* host to host: at once */
    std::vector<int> g(N, 0);
    CHECK(cudaMemcpyAsync(g.data(), src.data(), N * sizeof(int), cudaMemcpyHostToHost, s) == cudaSuccess);
    CHECK(g[0] == 13);
    /* a kernel's arguments are taken at the launch */
    int v = 21;
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, s)(a, N, v);
    v = 22;
    CHECK(ft_emu_pending() == 1 && v == 22);
    int *c = dev_ints(0);
    CHECK(ft_emu_pending() == 0); /* dev_ints synchronizes the device */
    CHECK(cudaMemcpy(h.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(h[0] == 21);
    /* cudaFree synchronizes: the queued work runs first */
    FT_EMU_LAUNCH(fill_kernel, 1, N, 0, s)(a, N, 23);
    CHECK(cudaMemcpyAsync(h.data(), a, N * sizeof(int), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaFree(c) == cudaSuccess && ft_emu_pending() == 0 && h[0] == 23);
    cudaStreamDestroy(s);
    cudaFree(a);
    cudaFree(b);
}

static void test_cublas(void)
{
    cublasHandle_t hd;
    CHECK(cublasCreate(&hd) == CUBLAS_STATUS_SUCCESS);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cublasSetStream(hd, s) == CUBLAS_STATUS_SUCCESS);
    float *x, *y, one = 1.0f, two = 2.0f, zero = 0.0f, out = -1;
    cudaMalloc(&x, sizeof(float));
    cudaMalloc(&y, sizeof(float));
    CHECK(cudaMemcpy(x, &two, sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    /* y = alpha x x with alpha on the host, changed after the call */
    float alpha = 1.0f;
    CHECK(cublasGemmEx(hd, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, x, CUDA_R_32F, 1, x, CUDA_R_32F,
                       1, &zero, y, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
          CUBLAS_STATUS_SUCCESS);
    alpha = 100.0f;
    CHECK(ft_emu_pending() == 1);
    CHECK(cudaMemcpyAsync(&out, y, sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(out == -1.0f);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess && out == 4.0f);
    (void)one;
    cudaFree(x);
    cudaFree(y);
    cublasDestroy(hd);
    cudaStreamDestroy(s);
}

int main(void)
{
    setenv("FT_EMU_ASYNC", "1", 1);
    RUN(test_d2h_async);
    RUN(test_events_across_streams);
    RUN(test_legacy_stream);
    RUN(test_copies_sets);
    RUN(test_cublas);
    return check_summary("emu_async");
}
