/* The emulated CUDA device (make CUDA=emu): cuda_bf16.h. __nv_bfloat16 is its 16 bits;
 * arithmetic goes through float, as the kernels do it. Conversions round to nearest even
 * (__float2bfloat16_rn), a NaN stays a NaN. */
#ifndef FT_EMU_CUDA_BF16_H
#define FT_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

typedef struct __nv_bfloat16 {
    uint16_t bits;
} __nv_bfloat16;

#ifdef __cplusplus
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
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays NaN (quiet) */
        return __nv_bfloat16{(uint16_t)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1);
    return __nv_bfloat16{(uint16_t)(u >> 16)};
}

inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
#endif

#endif
