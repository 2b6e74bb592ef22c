/* SwiGLU gating (the Llama MLP's act_fn(gate) * up), fp32 CPU reference.
 *
 * All operands are flat [n] (the caller passes N * intermediate elements).
 * Forward:   s = sigmoid(g) = 1 / (1 + exp(-g));  silu(g) = g * s;  out = silu(g) * u
 * Backward:  silu'(g) = s + g s (1 - s) = s (1 + g (1 - s))
 *            dgate = dout * u * silu'(g)
 *            dup   = dout * silu(g)
 * dgate or dup may be NULL. The backward overwrites them (the model's caller used to zero
 * both, N x intermediate floats each a layer, only to add onto the zeros).
 *
 * silu is computed as torch's CPU kernel does, g / (1 + exp(-g)), and silu' as torch's
 * silu_backward, s * (1 + g * (1 - s)). For g -> -inf, exp(-g) overflows to inf and
 * both silu and s go to 0 without a NaN; for g -> +inf, s = 1 and silu = g. exp is
 * fast_exp.h's (vectorized, within 2 ulp of expf). The passes go in spans of SPAN
 * elements, each a call of a function cloned per vector width (simd_clones.h; an
 * element-wise map, so the same bits at any width). */
#include <math.h>

#include "cpu_ops.h"
#include "cpu_parallel.h"
#include "fast_exp.h"
#include "simd_clones.h"

/* Elements per span: the unit of the OpenMP loop and of one call of a (cloned) span
 * function. */
#define SPAN 4096

FT_SIMD_CLONES
static void forward_span(float *out, const float *gate, const float *up, long len)
{
#pragma omp simd
    for (long i = 0; i < len; i++) {
        float g = gate[i];
        float silu = g / (1.0f + ft_exp(-g));
        out[i] = silu * up[i];
    }
}

/* dgate or dup may be NULL (not both) */
FT_SIMD_CLONES
static void backward_span(float *dgate, float *dup, const float *dout, const float *gate,
                          const float *up, long len)
{
    if (dgate && dup) {
#pragma omp simd
        for (long i = 0; i < len; i++) {
            float g = gate[i];
            float s = 1.0f / (1.0f + ft_exp(-g));
            float d = dout[i];
            dgate[i] = d * up[i] * (s * (1.0f + g * (1.0f - s)));
            dup[i] = d * (g * s);
        }
    } else if (dgate) {
#pragma omp simd
        for (long i = 0; i < len; i++) {
            float g = gate[i];
            float s = 1.0f / (1.0f + ft_exp(-g));
            dgate[i] = dout[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
        }
    } else {
#pragma omp simd
        for (long i = 0; i < len; i++) {
            float g = gate[i];
            dup[i] = dout[i] * (g / (1.0f + ft_exp(-g)));
        }
    }
}

static float *at(float *p, long i)
{
    return p ? p + i : NULL;
}

void ft_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    long len = (long)n, nspan = (len + SPAN - 1) / SPAN;
#pragma omp parallel for schedule(static) if (len >= FT_PAR_MIN_MATH)
    for (long k = 0; k < nspan; k++) {
        long i0 = k * SPAN;
        forward_span(out + i0, gate + i0, up + i0, len - i0 < SPAN ? len - i0 : SPAN);
    }
}

void ft_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n)
{
    long len = (long)n, nspan = (len + SPAN - 1) / SPAN;
    if (!dgate && !dup)
        return;
#pragma omp parallel for schedule(static) if (len >= FT_PAR_MIN_MATH)
    for (long k = 0; k < nspan; k++) {
        long i0 = k * SPAN;
        backward_span(at(dgate, i0), at(dup, i0), dout + i0, gate + i0, up + i0,
                      len - i0 < SPAN ? len - i0 : SPAN);
    }
}
