/* GeGLU gating (Gemma's MLP: act_fn(gate) * up with gelu_pytorch_tanh), fp32 CPU
 * reference.
 *
 * All operands are flat [n] (the caller passes N * intermediate elements).
 * With beta = sqrt(2/pi) and kappa = 0.044715 (torch's constants, in fp32):
 *   inner   = beta (g + kappa g^3),  t = tanh(inner)
 *   gelu(g) = 0.5 g (1 + t)                                      out = gelu(g) * u
 * Backward, with d t / d g = (1 - t^2) beta (1 + 3 kappa g^2):
 *   gelu'(g) = 0.5 (1 + t) + 0.5 g (1 - t^2) beta (1 + 3 kappa g^2)
 *   dgate = dout * u * gelu'(g);   dup = dout * gelu(g)   (overwritten)
 * dgate or dup may be NULL.
 *
 * The expressions are torch's (GeluKernel / GeluBackwardKernel, approximate="tanh"),
 * term by term in fp32. tanh saturates to +-1 for large |inner| (g^3 overflowing to inf
 * gives tanh(inf) = 1), so gelu -> g or 0 and gelu' -> 1 or 0 without a NaN, except the
 * derivative's g^2 (1 - t^2) product at |g| > 1e19, where 0 * inf is avoided by the
 * t^2 == 1 test below. */
#include <math.h>

#include "cpu_ops.h"

#define GELU_BETA 0.7978845608028654f /* sqrt(2 / pi), rounded to fp32 */
#define GELU_KAPPA 0.044715f

static inline float gelu_tanh(float g)
{
    float inner = GELU_BETA * (g + GELU_KAPPA * (g * g * g));
    return 0.5f * g * (1.0f + tanhf(inner));
}

static inline float gelu_tanh_grad(float g)
{
    float g2 = g * g;
    float inner = GELU_BETA * (g + GELU_KAPPA * (g2 * g));
    float t = tanhf(inner);
    float left = 0.5f * g, right = 1.0f + t;
    float dtanh = 1.0f - t * t;
    if (dtanh == 0.0f) /* saturated: the right-hand term is 0 (not 0 * inf) */
        return 0.5f * right;
    float dinner = GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * g2);
    return 0.5f * right + left * dtanh * dinner;
}

void ft_cpu_geglu_forward(float *out, const float *gate, const float *up, size_t n)
{
    long len = (long)n;
#pragma omp parallel for schedule(static) if (len >= 32768)
    for (long i = 0; i < len; i++)
        out[i] = gelu_tanh(gate[i]) * up[i];
}

void ft_cpu_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                           const float *up, size_t n)
{
    long len = (long)n;
    if (!dgate && !dup)
        return;
#pragma omp parallel for schedule(static) if (len >= 32768)
    for (long i = 0; i < len; i++) {
        float g = gate[i], d = dout[i];
        if (dgate)
            dgate[i] = d * up[i] * gelu_tanh_grad(g);
        if (dup)
            dup[i] = d * gelu_tanh(g);
    }
}
