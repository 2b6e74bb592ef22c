/* SwiGLU gating (the Llama MLP's act_fn(gate) * up), fp32 CPU reference.
 *
 * All operands are flat [n] (the caller passes N * intermediate elements).
 * Forward:   s = sigmoid(g) = 1 / (1 + exp(-g));  silu(g) = g * s;  out = silu(g) * u
 * Backward:  silu'(g) = s + g s (1 - s) = s (1 + g (1 - s))
 *            dgate += dout * u * silu'(g)
 *            dup   += dout * silu(g)
 * dgate or dup may be NULL.
 *
 * silu is computed as torch's CPU kernel does, g / (1 + exp(-g)), and silu' as torch's
 * silu_backward, s * (1 + g * (1 - s)). For g -> -inf, exp(-g) overflows to inf and
 * both silu and s go to 0 without a NaN; for g -> +inf, s = 1 and silu = g. exp is
 * fast_exp.h's (vectorized, within 2 ulp of expf). */
#include <math.h>

#include "cpu_ops.h"
#include "fast_exp.h"

void ft_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    long len = (long)n;
#pragma omp parallel for simd schedule(static) if (len >= 32768)
    for (long i = 0; i < len; i++) {
        float g = gate[i];
        float silu = g / (1.0f + ft_exp(-g));
        out[i] = silu * up[i];
    }
}

void ft_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n)
{
    long len = (long)n;
    if (dgate && dup) {
#pragma omp parallel for simd schedule(static) if (len >= 32768)
        for (long i = 0; i < len; i++) {
            float g = gate[i];
            float s = 1.0f / (1.0f + ft_exp(-g));
            float d = dout[i];
            dgate[i] += d * up[i] * (s * (1.0f + g * (1.0f - s)));
            dup[i] += d * (g * s);
        }
    } else if (dgate) {
#pragma omp parallel for simd schedule(static) if (len >= 32768)
        for (long i = 0; i < len; i++) {
            float g = gate[i];
            float s = 1.0f / (1.0f + ft_exp(-g));
            dgate[i] += dout[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
        }
    } else if (dup) {
#pragma omp parallel for simd schedule(static) if (len >= 32768)
        for (long i = 0; i < len; i++) {
            float g = gate[i];
            dup[i] += dout[i] * (g / (1.0f + ft_exp(-g)));
        }
    }
}
