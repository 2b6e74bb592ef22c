/* Dropout with a counter-based mask, fp32 CPU reference.
 *
 * Forward:   out[i] = x[i] * keep(i) * k,       k = 1 / (1 - p)
 * Backward:  dx[i] += dout[i] * keep(i) * k
 * p == 0: forward copies, backward adds. p >= 1: nothing is kept (out = 0, dx += 0).
 * k is computed as torch does (noise.div_(1 - p)): 1 - p in double, rounded to float,
 * then 1.0f / that; kept values are x * k.
 *
 * The mask is never stored: keep(i) is a pure function of (seed, offset + i), so the
 * backward, a gradient-checkpoint recompute and the CUDA twin all regenerate it, and a
 * range processed in pieces gets the same mask as processed whole (piece at offset o
 * covers counters o, o + 1, ...). The RNG, in 64-bit unsigned arithmetic (mod 2^64):
 *   mix(z):  z ^= z >> 30; z *= 0xbf58476d1ce4e5b9;
 *            z ^= z >> 27; z *= 0x94d049bb133111eb;
 *            z ^= z >> 31                            (the splitmix64 finaliser)
 *   key      = mix(seed + 0x9e3779b97f4a7c15)        (decorrelates nearby seeds)
 *   bits(c)  = mix(key + (c + 1) * 0x9e3779b97f4a7c15), c = offset + i
 *   u(c)     = (bits(c) >> 40) * 2^-24               (uniform on the 2^24 floats
 *                                                      j/2^24 in [0, 1), exact in fp32)
 *   keep(c)  = u(c) >= p,  tested as the equivalent (bits(c) >> 40) >= ceil(p 2^24)
 * This is splitmix64's stream for state `key`, read at position c: a bijective mix of a
 * Weyl sequence, which passes BigCrush as a generator. P(keep) = 1 - ceil(p 2^24)/2^24.
 * The mask multiplies (out = x * (keep ? k : 0), as torch's input * mask): no branch on
 * the random bit in the loop, and a dropped non-finite x gives NaN, as in torch.
 * The generator's functions live in kernels/dropout_mask.h, shared with the CUDA op. */
#include <math.h>
#include <string.h>

#include "../dropout_mask.h"
#include "cpu_ops.h"

void ft_cpu_dropout_forward(float *out, const float *x, size_t n, float p, uint64_t seed,
                            uint64_t offset)
{
    if (p <= 0.0f) {
        if (out != x)
            memmove(out, x, n * sizeof(float));
        return;
    }
    long len = (long)n;
    if (p >= 1.0f) {
        memset(out, 0, n * sizeof(float));
        return;
    }
    float k = ft_dropout_keep_scale(p);
    uint64_t key = ft_dropout_key(seed), thr = ft_dropout_threshold(p);
#pragma omp parallel for schedule(static) if (len >= 32768)
    for (long i = 0; i < len; i++)
        out[i] = x[i] * ft_dropout_factor(key, offset + (uint64_t)i, thr, k);
}

void ft_cpu_dropout_backward(float *dx, const float *dout, size_t n, float p,
                             uint64_t seed, uint64_t offset)
{
    long len = (long)n;
    if (p <= 0.0f) {
#pragma omp parallel for simd schedule(static) if (len >= 65536)
        for (long i = 0; i < len; i++)
            dx[i] += dout[i];
        return;
    }
    if (p >= 1.0f)
        return;
    float k = ft_dropout_keep_scale(p);
    uint64_t key = ft_dropout_key(seed), thr = ft_dropout_threshold(p);
#pragma omp parallel for schedule(static) if (len >= 32768)
    for (long i = 0; i < len; i++)
        dx[i] += dout[i] * ft_dropout_factor(key, offset + (uint64_t)i, thr, k);
}
