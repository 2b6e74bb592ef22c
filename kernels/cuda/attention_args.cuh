/* The arguments of the attention kernels (attention.cu and flash_attention_kernels.cuh),
 * passed by value: the operands (those an op does not use are null) and the shape. Not
 * a public header. */
#ifndef FT_ATTENTION_ARGS_CUH
#define FT_ATTENTION_ARGS_CUH

#include <stdint.h>

#ifndef FT_CUDA_EMU /* tests/emu brings its own fview */
#include "cuda_common.cuh"
#endif

struct att_args {
    fview q, k, v, out, dout, dq, dk, dv;
    float *lse_out;      /* forward */
    const float *lse_in; /* backward */
    const int32_t *seg;  /* [B, T] or NULL */
    int B, T, Hq, Hkv, G, D;
    float scale;
    int window;
};

#endif
