/* Eight consecutive elements of an operand at a time (fview, kernel_common.cuh): one
 * 16-byte load or store for bf16, two for fp32, where the elementwise kernels would
 * otherwise move 2 or 4 bytes a thread per instruction and stay well under the memory's
 * bandwidth. The values are those of ld() and st() element by element (bf16 widened,
 * rounded to nearest-even on store), so a kernel's result does not depend on the path.
 *
 * An op takes the 8-wide kernel when vec8_ok says so for its operands (n a multiple of 8,
 * every present pointer 16-byte aligned), else its scalar one. The emulated device runs
 * ld8/st8 as eight ld/st, which checks each element's load and the kernels' indexing;
 * the vector access itself is the GPU's. */
#ifndef FT_VEC_IO_CUH
#define FT_VEC_IO_CUH

#include <stdint.h>

#include "cuda_common.cuh"

#define VEC8 8

/* Whether an op over n elements can use the 8-wide kernels with these operands (NULL for
 * an absent one). */
static inline bool vec8_ok(size_t n, const void *a, const void *b = NULL, const void *c = NULL,
                           const void *d = NULL, const void *e = NULL)
{
    const void *ps[5] = {a, b, c, d, e};
    if (n % VEC8)
        return false;
    for (int i = 0; i < 5; i++)
        if (ps[i] && ((uintptr_t)ps[i] & 15u))
            return false;
    return true;
}

/* x[k] = element i + k of v, k < 8 (i a multiple of 8) */
__device__ __forceinline__ void ld8(fview v, size_t i, float (&x)[VEC8])
{
#ifdef FT_CUDA_EMU
    for (int k = 0; k < VEC8; k++)
        x[k] = ld(v, i + k);
#else
    if (v.bf16) {
        uint4 u = *(const uint4 *)((const __nv_bfloat16 *)v.p + i);
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
        for (int k = 0; k < VEC8 / 2; k++) {
            float2 f = __bfloat1622float2(h[k]);
            x[2 * k] = f.x;
            x[2 * k + 1] = f.y;
        }
    } else {
        const float4 *p = (const float4 *)((const float *)v.p + i);
        float4 a = p[0], b = p[1];
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
        x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    }
#endif
}

/* elements i .. i + 7 of v = x (rounded to nearest-even when v is bf16) */
__device__ __forceinline__ void st8(fview v, size_t i, const float (&x)[VEC8])
{
#ifdef FT_CUDA_EMU
    for (int k = 0; k < VEC8; k++)
        st(v, i + k, x[k]);
#else
    if (v.bf16) {
        uint4 u;
        __nv_bfloat162 *h = (__nv_bfloat162 *)&u;
#pragma unroll
        for (int k = 0; k < VEC8 / 2; k++)
            h[k] = __floats2bfloat162_rn(x[2 * k], x[2 * k + 1]);
        *(uint4 *)((__nv_bfloat16 *)v.p + i) = u;
    } else {
        float4 *p = (float4 *)((float *)v.p + i);
        p[0] = make_float4(x[0], x[1], x[2], x[3]);
        p[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
#endif
}

#endif
