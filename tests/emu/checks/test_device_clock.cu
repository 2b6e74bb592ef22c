/* ft_device_clock (lib/device/device_clock.h), bench-train's timer, on the emulated device
 * in its deferred mode (FT_EMU_ASYNC=1, set here): work issued through the ops and not
 * waited for is queued (ft_emu_pending), and the clock of the CUDA device must wait for it
 * before it reads the time, else a timed span ends while the GPU still works on its last
 * op (the bug 9293e1a fixed in bench-train, which no test caught: every call ran when
 * issued). The CPU's clock waits for nothing. */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

extern "C" {
#include "device/device_clock.h"
#include "ops.h"
}
#include "check.h"
#include "ft_emu.h"

static void test_clock_waits_for_the_device(void)
{
    const size_t n = 1024;
    float *p = NULL, *g = NULL, *m = NULL, *v = NULL;
    CHECK(cudaMalloc(&p, n * sizeof(float)) == cudaSuccess && cudaMalloc(&g, n * sizeof(float)) == cudaSuccess &&
          cudaMalloc(&m, n * sizeof(float)) == cudaSuccess && cudaMalloc(&v, n * sizeof(float)) == cudaSuccess);
    ft_tensor tp = ft_view(p, n, FT_F32, FT_DEV_CUDA), tg = ft_view(g, n, FT_F32, FT_DEV_CUDA);
    ft_tensor tm = ft_view(m, n, FT_F32, FT_DEV_CUDA), tv = ft_view(v, n, FT_F32, FT_DEV_CUDA);
    ft_zero(tp, n), ft_zero(tg, n), ft_zero(tm, n), ft_zero(tv, n);
    /* the start of a span: what was issued before it is finished first */
    CHECK(ft_emu_pending() > 0);
    double t0 = ft_device_clock(FT_DEV_CUDA);
    CHECK(ft_emu_pending() == 0);
    /* the end of a span that ends with an optimizer update, as a training step does */
    ft_add(tg, tp, n);
    ft_adamw_hparams hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f};
    ft_adamw_step(tp, tg, tm, tv, n, hp, 1, 1.0f);
    size_t queued = ft_emu_pending();
    CHECK(queued >= 2);
    CHECK(ft_device_clock(FT_DEV_CPU) >= t0 && ft_emu_pending() == queued); /* the CPU's waits for nothing */
    double t1 = ft_device_clock(FT_DEV_CUDA);
    CHECK(ft_emu_pending() == 0 && t1 >= t0);
    cudaFree(p), cudaFree(g), cudaFree(m), cudaFree(v);
}

int main(void)
{
    setenv("FT_EMU_ASYNC", "1", 1);
    RUN(test_clock_waits_for_the_device);
    return check_summary("device_clock");
}
