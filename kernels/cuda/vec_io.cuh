/* Eight consecutive elements of an operand at a time (fview, kernel_common.cuh): one
 * 16-byte load or store for bf16, two for fp32, where the elementwise kernels would
 * otherwise move 2 or 4 bytes a thread per instruction and stay well under the memory's
 * bandwidth. The values are those of ld() and st() element by element (bf16 widened,
 * rounded to nearest-even on store), so a kernel's result does not depend on the path.
 *
 * An op takes the 8-wide kernel when vec8_ok says so for its operands (n a multiple of 8,
 * every present pointer 16-byte aligned), else its scalar one. The 16-byte words are
 * unpacked by bit operations (a bf16 pair is one 32-bit word, the lower element in the low
 * half), the same code in the emulated build (which also checks each element's load as
 * ld() does) as under nvcc. */
#ifndef FT_VEC_IO_CUH
#define FT_VEC_IO_CUH

#include <stdint.h>
#include <string.h>

#include "cuda_common.cuh"

#define VEC8 8

/* 16 bytes, as one load or store (uint4 under nvcc) */
#ifdef FT_CUDA_EMU
struct __align__(16) vec_u4 {
    uint32_t x, y, z, w;
};
#else
typedef uint4 vec_u4;
#endif

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

__device__ __forceinline__ float vec_f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

__device__ __forceinline__ uint32_t vec_bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

__device__ __forceinline__ uint32_t vec_bits_of_bf16(float f)
{
    __nv_bfloat16 h = __float2bfloat16_rn(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}

/* x[k] = element i + k of v, k < 8 (i a multiple of 8, v.p 16-byte aligned) */
__device__ __forceinline__ void ld8(fview v, size_t i, float *x)
{
#ifdef FT_CUDA_EMU
    for (int k = 0; k < VEC8; k++) /* ld()'s check of never-written memory */
        FT_CHECK_LOAD((const char *)v.p + (i + k) * (v.bf16 ? 2 : 4), v.bf16 ? 2 : 4);
#endif
    if (v.bf16) {
        vec_u4 q = *((const vec_u4 *)v.p + i / 8);
        uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x[2 * k] = vec_f32_of_bits(w[k] << 16);
            x[2 * k + 1] = vec_f32_of_bits(w[k] & 0xffff0000u);
        }
    } else {
        const vec_u4 *p = (const vec_u4 *)((const float *)v.p + i);
        vec_u4 a = p[0], b = p[1];
        uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int k = 0; k < 8; k++)
            x[k] = vec_f32_of_bits(w[k]);
    }
}

/* elements i .. i + 7 of v = x (rounded to nearest-even when v is bf16) */
__device__ __forceinline__ void st8(fview v, size_t i, const float *x)
{
    if (v.bf16) {
        vec_u4 q;
        q.x = vec_bits_of_bf16(x[0]) | vec_bits_of_bf16(x[1]) << 16;
        q.y = vec_bits_of_bf16(x[2]) | vec_bits_of_bf16(x[3]) << 16;
        q.z = vec_bits_of_bf16(x[4]) | vec_bits_of_bf16(x[5]) << 16;
        q.w = vec_bits_of_bf16(x[6]) | vec_bits_of_bf16(x[7]) << 16;
        *((vec_u4 *)v.p + i / 8) = q;
    } else {
        vec_u4 *p = (vec_u4 *)((float *)v.p + i);
        vec_u4 a, b;
        a.x = vec_bits_of_f32(x[0]), a.y = vec_bits_of_f32(x[1]);
        a.z = vec_bits_of_f32(x[2]), a.w = vec_bits_of_f32(x[3]);
        b.x = vec_bits_of_f32(x[4]), b.y = vec_bits_of_f32(x[5]);
        b.z = vec_bits_of_f32(x[6]), b.w = vec_bits_of_f32(x[7]);
        p[0] = a, p[1] = b;
    }
}

#endif
