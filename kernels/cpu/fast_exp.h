/* exp(x) in fp32 that the compiler vectorizes, for the CPU kernels' softmax and gating
 * loops (libm's expf is a call per element, which no loop around it vectorizes).
 *
 *   n = round(x / ln2), r = x - n ln2 (Cody-Waite: ln2 in two parts, the first exact in
 *   a few bits so n * C1 is exact), |r| <= ln2 / 2;
 *   e^r by Cephes' expf polynomial (degree 7 with the 1 + r + r^2 p(r) form);
 *   2^n as two powers of two (n up to 128 at x = ln(FLT_MAX) would overflow one).
 * n is rounded by adding and subtracting 1.5 * 2^23, and its integer read from the
 * sum's low bits; no branch, no libm call.
 *
 * Within 2 ulp of exp over the normal range (tests/unit/test_ops_cpu.c checks a sweep
 * against double exp). x < -87.33654 (exp below FLT_MIN) gives 0, so exp(-inf) = 0 as a
 * masked score needs; x > 88.72284 gives +inf; NaN stays NaN. */
#ifndef FT_CPU_FAST_EXP_H
#define FT_CPU_FAST_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float ft_bits_float(int32_t i)
{
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static inline int32_t ft_float_bits(float f)
{
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

static inline float ft_exp(float x)
{
    /* (one comparison each, both always evaluated: the compiler if-converts and
     * vectorizes them, which a nested ?: it may not under -ftrapping-math) */
    float xc = x < -88.0f ? -88.0f : x;
    xc = xc > 88.75f ? 88.75f : xc;
    const float t = xc * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23 */
    const int32_t n = ft_float_bits(t) - 0x4B400000;          /* round(xc / ln2) */
    const float fn = t - 12582912.0f;
    const float r = (xc - fn * 0.693359375f) + fn * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t n1 = n >> 1, n2 = n - n1; /* 2^n = 2^n1 2^n2, each a normal float */
    float y = p * ft_bits_float((n1 + 127) << 23) * ft_bits_float((n2 + 127) << 23);
    y = x < -87.33654f ? 0.0f : y;
    y = x > 88.72284f ? INFINITY : y;
    return x != x ? x : y;
}

#endif
