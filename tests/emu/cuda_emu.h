/* The host tests of single CUDA kernels (tests/emu/test_..._emu.cc), on the emulated
 * device's own headers and engine: the same tests/emu/include and tests/emu/runtime/exec.cc
 * that make CUDA=emu runs all of kernels/cuda on (docs/gpu.md, The emulated device), so
 * there is one emulation. These tests run in make test-unit of every build: they link only
 * the engine (and context.cc), none of the emulated CUDA runtime, so a CUDA build links
 * them beside the real one. The kernels take host memory here (no cudaMalloc), and are
 * launched directly (emu_launch), not through FT_LAUNCH's checks.
 *
 * What the engine gives the kernels: a block's threads as coroutines, so __syncthreads,
 * __syncwarp and __shfl_xor_sync are real barriers and exchanges and a missing barrier can
 * show as a wrong result; WMMA by its documented meaning (mma.h); the dynamic shared
 * memory of the launch's size, ending at a guard page. Hardware fragment layouts, bank
 * conflicts, occupancy and speed are out of its reach: those are the GPU tier's. */
#ifndef FT_CUDA_EMU_H
#define FT_CUDA_EMU_H

#define FT_CUDA_EMU 1

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

extern "C" {
#include "ops.h"
}

/* fview, ld, st, warp_sum, block_sum, ... as the kernels have them */
#include "cuda/kernel_common.cuh"

using namespace nvcuda;

/* Runs kernel(args) over grid (gx, gy) with `threads` threads a block and smem bytes of
 * dynamic shared memory; exits when a thread traps. */
template <typename A>
void emu_launch(void (*kernel)(A), unsigned gx, unsigned gy, int threads, const A &args,
                size_t smem = 0)
{
    struct call {
        void (*kernel)(A);
        const A *args;
    } c = {kernel, &args};
    ft_emu::grid_run run = {dim3(gx, gy), dim3((unsigned)threads), smem, "kernel",
                            [](void *p) {
                                call *k = (call *)p;
                                k->kernel(*k->args);
                            },
                            &c};
    if (!ft_emu::run_grid(run)) {
        fprintf(stderr, "emu_launch: a thread trapped\n");
        exit(1);
    }
}

#endif
