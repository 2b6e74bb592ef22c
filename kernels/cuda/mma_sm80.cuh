/* The sm_80 tensor-core primitives the flash-attention kernels use, one warp each, with
 * the register layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating
 * point type", "ldmatrix"). Under nvcc they are inline PTX; in the emulated build
 * (FT_CUDA_EMU) every lane computes its own registers in exactly that layout, from the
 * warp's registers exchanged through a per-warp buffer, so the emulation checks the same
 * lane arithmetic the GPU does.
 *
 * In a lane l of the warp, g = l / 4 (the group) and t = l % 4 (the thread in the group);
 * a .b32 register holds two bf16, the lower-index element in the low 16 bits.
 *
 *   mma_bf16_16816(d, a, b, c):  D[16 x 8] = A[16 x 16] B[16 x 8] + C, fp32 C and D
 *     A (4 regs): a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
 *                 a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
 *     B (2 regs): b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
 *     C, D (4 fp32): c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
 *   So the C fragments of two adjacent n-tiles (columns 0..7, 8..15), rounded to bf16, are
 *   the A fragment of a 16-wide k step: {pack(c0[0], c0[1]), pack(c0[2], c0[3]),
 *   pack(c1[0], c1[1]), pack(c1[2], c1[3])}.
 *
 *   ldmatrix_x4(r, p) / ldmatrix_x2(r, p): four (two) 8 x 8 bf16 matrices from shared
 *     memory; lane 8j + i gives the address of row i of matrix j (16 contiguous bytes,
 *     16-byte aligned; for x2 lanes 0..15 count). r[j] = matrix j's row g, columns 2t, 2t+1.
 *   ldmatrix_x4_trans(r, p): the same addresses, each matrix transposed: r[j] = matrix j's
 *     rows 2t, 2t+1 of column g.
 *
 *   cp_async_16(dst, src, n): copies n (16 or 0: zero-fill) bytes from global to shared
 *     memory, 16 bytes at dst; complete after cp_async_wait<N>() (all but the N most recent
 *     commit groups) and a barrier for other threads. The emulation copies at once. */
#ifndef FT_MMA_SM80_CUH
#define FT_MMA_SM80_CUH

#include <stdint.h>

#include "cuda_common.cuh"

namespace fa {

/* Two floats rounded to bf16 (nearest even) in one register, lo in the low half. */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
#ifdef FT_CUDA_EMU
    return (uint32_t)__float2bfloat16_rn(lo).bits | (uint32_t)__float2bfloat16_rn(hi).bits << 16;
#else
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
#endif
}

#ifdef FT_CUDA_EMU

namespace emu {
/* What the lanes of a warp exchange: per host thread (the running block), per warp. */
struct lane_regs {
    uint32_t r[6];
    const void *p;
};
inline lane_regs (&warp_regs())[32]
{
    static thread_local lane_regs regs[32][32]; /* [warp][lane]; blocks of <= 1024 threads */
    return regs[threadIdx.x / 32];
}
inline float lo(uint32_t r) { return __bfloat162float(__nv_bfloat16{(uint16_t)(r & 0xffff)}); }
inline float hi(uint32_t r) { return __bfloat162float(__nv_bfloat16{(uint16_t)(r >> 16)}); }
inline float half(uint32_t r, int h) { return h ? hi(r) : lo(r); }
inline uint16_t bits_at(const void *row, int col)
{
    uint16_t v;
    memcpy(&v, (const char *)row + 2 * col, 2);
    return v;
}
} // namespace emu

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2], const float (&c)[4])
{
    emu::lane_regs(&w)[32] = emu::warp_regs();
    const int l = (int)ft_emu::lane_id(), g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++)
        w[l].r[i] = a[i];
    w[l].r[4] = b[0];
    w[l].r[5] = b[1];
    __syncwarp();
    float out[4];
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
        float acc = c[e];
        for (int k = 0; k < 16; k++) {
            /* A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, reg (row >= 8) + 2 (k >= 8) */
            const int ra = (row >= 8) + 2 * (k >= 8);
            float av = emu::half(w[(row % 8) * 4 + (k % 8) / 2].r[ra], k % 2);
            /* B[k][col]: lane col * 4 + (k % 8) / 2, reg 4 + (k >= 8) */
            float bv = emu::half(w[col * 4 + (k % 8) / 2].r[4 + (k >= 8)], k % 2);
            acc += av * bv;
        }
        out[e] = acc;
    }
    __syncwarp(); /* every lane has read the warp's registers */
    for (int e = 0; e < 4; e++)
        d[e] = out[e];
}

template <int N, bool TRANS>
__device__ __forceinline__ void ldmatrix_emu(uint32_t *r, const void *p)
{
    emu::lane_regs(&w)[32] = emu::warp_regs();
    const int l = (int)ft_emu::lane_id(), g = l / 4, t = l % 4;
    w[l].p = p;
    __syncwarp();
    for (int j = 0; j < N; j++) {
        uint16_t e0, e1;
        if (TRANS) {
            e0 = emu::bits_at(w[8 * j + 2 * t].p, g);
            e1 = emu::bits_at(w[8 * j + 2 * t + 1].p, g);
        } else {
            e0 = emu::bits_at(w[8 * j + g].p, 2 * t);
            e1 = emu::bits_at(w[8 * j + g].p, 2 * t + 1);
        }
        r[j] = (uint32_t)e0 | (uint32_t)e1 << 16;
    }
    __syncwarp();
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p)
{
    ldmatrix_emu<4, false>(r, p);
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void *p)
{
    ldmatrix_emu<2, false>(r, p);
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p)
{
    ldmatrix_emu<4, true>(r, p);
}

__device__ __forceinline__ void cp_async_16(void *dst, const void *src, int n)
{
    if (n) {
        for (int i = 0; i < 8; i++) /* ld()'s check of memory never written */
            ft_emu_check_load((const char *)src + 2 * i, 2);
        memcpy(dst, src, 16);
    }
    else
        memset(dst, 0, 16);
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N> __device__ __forceinline__ void cp_async_wait() {}

#else /* nvcc */

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2], const float (&c)[4])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void cp_async_16(void *dst, const void *src, int n)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif

} // namespace fa

#endif
