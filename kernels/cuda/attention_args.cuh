/* What the attention kernels (attention.cu and flash_attention_kernels.cuh) share: their
 * arguments, passed by value (the operands, null where an op does not use them, and the
 * shape), and the bounds of the causal / sliding-window mask. Not a public header. */
#ifndef FT_ATTENTION_ARGS_CUH
#define FT_ATTENTION_ARGS_CUH

#include <stdint.h>

#include "cuda_common.cuh"

struct att_args {
    fview q, k, v, out, dout, dq, dk, dv;
    float *lse_out;      /* forward */
    const float *lse_in; /* backward */
    const int32_t *seg;  /* [B, T] or NULL */
    int B, T, Hq, Hkv, G, D;
    float scale;
    int window;
    float softcap; /* > 0: S = softcap * tanh(scale q.k / softcap) */
};

/* The score of a scaled dot product x: x, or softcap * tanh(x / softcap) (divided, then
 * multiplied, as transformers' eager attention does); *dx gets d score / d x
 * (1 - tanh^2), the factor the backward applies to dS. */
__device__ __forceinline__ float att_score(float x, float softcap, float *dx)
{
    if (softcap <= 0.0f) {
        *dx = 1.0f;
        return x;
    }
    const float t = tanhf(x / softcap);
    *dx = 1.0f - t * t;
    return softcap * t;
}

/* First key token query i may see (the causal upper bound is i itself). */
__device__ __forceinline__ int att_first_key(int i, int window)
{
    return (window > 0 && window <= i) ? i - window + 1 : 0;
}

/* Last query token that may see key j; written so that a huge window cannot overflow. */
__device__ __forceinline__ int att_last_query(int j, int T, int window)
{
    return (window > 0 && window < T - j) ? j + window - 1 : T - 1;
}

#endif
