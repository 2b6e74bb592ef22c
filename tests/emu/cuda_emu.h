/* A host emulation of the CUDA pieces the kernels of kernels/cuda/..._kernels.cuh use,
 * so that they run on a machine without a GPU (tests/emu/test_..._emu.cc) and their
 * indexing, masking, tiling and synchronisation are checked against the CPU ops before a
 * GPU ever sees them.
 *
 * A launch runs its blocks one after the other; a block's threads are real threads
 * (std::thread), so __syncthreads, __syncwarp and __shfl_xor_sync are real barriers and
 * exchanges and a missing barrier can show as a wrong result. Shared memory is one
 * static buffer (fa::smem, defined before the kernels are included), the current
 * block's. WMMA fragments are emulated at the level of their documented meaning: every
 * lane holds the whole 16 x 16 tile (load_matrix_sync reads all of it, mma_sync
 * multiplies in fp32, store_matrix_sync writes the lane's share, so a read by another
 * lane needs the __syncwarp the hardware needs too). Hardware fragment layouts, bank
 * conflicts, occupancy and speed are out of its reach: those are the GPU tier's. bf16
 * rounding is round-to-nearest-even, as __float2bfloat16_rn. */
#ifndef FT_CUDA_EMU_H
#define FT_CUDA_EMU_H

#define FT_CUDA_EMU 1

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

extern "C" {
#include "ops.h"
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(n)

struct emu_dim3 {
    unsigned x, y, z;
};
inline thread_local emu_dim3 threadIdx, blockIdx, blockDim;

/* bf16 as its 16 bits; arithmetic goes through float */
struct __nv_bfloat16 {
    uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays NaN */
        return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}
inline float __expf(float x) { return expf(x); }
inline float __fmul_rn(float a, float b) { return a * b; } /* ISO C++: no contraction */
inline int min(int a, int b) { return a < b ? a : b; }

/* ---- one block's threads and their barriers ---------------------------------------- */
struct emu_block {
    std::barrier<> *all;
    std::barrier<> *warp[32];
    float *shfl; /* [threads] */
};
inline thread_local emu_block *emu_cur;

inline void __syncthreads() { emu_cur->all->arrive_and_wait(); }
inline void __syncwarp() { emu_cur->warp[threadIdx.x >> 5]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o)
{
    int t = (int)threadIdx.x;
    emu_cur->shfl[t] = v;
    __syncwarp();
    float r = emu_cur->shfl[t ^ o];
    __syncwarp();
    return r;
}

/* Runs kernel(args) over grid (gx, gy) with `threads` threads a block, a block at a time. */
template <typename K, typename A>
void emu_launch(K kernel, unsigned gx, unsigned gy, int threads, const A &args)
{
    for (unsigned by = 0; by < gy; by++)
        for (unsigned bx = 0; bx < gx; bx++) {
            std::barrier<> all(threads);
            std::vector<std::barrier<> *> warps;
            emu_block blk;
            blk.all = &all;
            for (int w = 0; w < threads / 32; w++) {
                warps.push_back(new std::barrier<>(32));
                blk.warp[w] = warps.back();
            }
            std::vector<float> shfl((size_t)threads);
            blk.shfl = shfl.data();
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; t++)
                pool.emplace_back([&, t] {
                    emu_cur = &blk;
                    threadIdx = emu_dim3{(unsigned)t, 0, 0};
                    blockIdx = emu_dim3{bx, by, 0};
                    blockDim = emu_dim3{(unsigned)threads, 1, 1};
                    kernel(args);
                });
            for (auto &th : pool)
                th.join();
            for (auto *w : warps)
                delete w;
        }
}

/* fview, ld, st, warp_sum, block_sum, ... as the kernels have them (FT_SHARED: a
 * static here) */
#include "cuda/kernel_common.cuh"

/* ---- WMMA ---------------------------------------------------------------------------- */
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    float x[16][16];
};

inline float emu_val(const __nv_bfloat16 &h) { return __bfloat162float(h); }
inline float emu_val(const float &f) { return f; }

template <typename Use, typename T, typename Layout, typename E>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout> &f, const E *p, unsigned ldm)
{
    bool col = std::is_same<Layout, col_major>::value;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r][c] = emu_val(col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]);
    __syncwarp(); /* the hardware's load is warp-wide: nobody writes the tile under it */
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p,
                             unsigned ldm, layout_t l)
{
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r][c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
    __syncwarp();
}

inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f,
                              unsigned ldm, layout_t l)
{
    int lane = (int)(threadIdx.x & 31);
    for (int e = lane; e < 256; e += 32) { /* the lane's share of the tile */
        int r = e / 16, c = e % 16;
        if (l == mem_row_major)
            p[(size_t)r * ldm + c] = f.x[r][c];
        else
            p[(size_t)c * ldm + r] = f.x[r][c];
    }
}

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float> &f, float v)
{
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++)
            f.x[r][c] = v;
}

template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b,
              const fragment<accumulator, 16, 16, 16, float> &c)
{
    float out[16][16];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r][n];
            for (int k = 0; k < 16; k++)
                s += a.x[r][k] * b.x[k][n];
            out[r][n] = s;
        }
    memcpy(d.x, out, sizeof out);
}
} // namespace wmma

#endif
