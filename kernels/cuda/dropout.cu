/* Dropout on the GPU with the counter-based mask of kernels/cpu/dropout.c, bit for bit:
 *   key = mix(seed + GOLDEN);  bits(c) = mix(key + (c + 1) GOLDEN),  c = offset + i
 *   keep(c) = (bits(c) >> 40) >= ceil(p 2^24)
 *   forward:  out[i] = x[i] * (keep ? k : 0);   backward: dx[i] += dout[i] * (keep ? k : 0)
 * with k = 1 / (float)(1 - p) and mix the splitmix64 finaliser (see the CPU file for why).
 * The threshold and k are computed on the host exactly as the CPU op computes them. */
#include <math.h>

#include "cuda_common.cuh"

#define GOLDEN 0x9e3779b97f4a7c15ULL

__host__ __device__ static inline uint64_t mix64(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z;
}

__device__ static inline float keep_factor(uint64_t key, uint64_t c, uint64_t thr, float k)
{
    return (mix64(key + (c + 1) * GOLDEN) >> 40) >= thr ? k : 0.0f;
}

/* backward = 0: out = x * mask;  backward = 1: out += x * mask */
__global__ void dropout_kernel(fview out, fview x, size_t n, uint64_t key, uint64_t offset,
                               uint64_t thr, float k, int backward)
{
    GRID_STRIDE(i, n)
    {
        float v = ld(x, i) * keep_factor(key, offset + i, thr, k);
        st(out, i, backward ? ld(out, i) + v : v);
    }
}

static void dropout(ft_tensor out, ft_tensor x, size_t n, float p, uint64_t seed,
                    uint64_t offset, int backward)
{
    float k = 1.0f / (float)(1.0 - (double)p);
    uint64_t key = mix64(seed + GOLDEN), thr = (uint64_t)ceilf(p * 16777216.0f);
    dropout_kernel<<<grid_for(n, 256), 256, 0, ft_cuda_stream()>>>(fv(out), fv(x), n, key,
                                                                   offset, thr, k, backward);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_dropout_forward(ft_tensor out, ft_tensor x, size_t n, float p,
                                        uint64_t seed, uint64_t offset)
{
    if (n == 0)
        return;
    if (p <= 0.0f)
        ft_cuda_copy(out, x, n);
    else if (p >= 1.0f)
        ft_cuda_zero(out, n);
    else
        dropout(out, x, n, p, seed, offset, 0);
}

extern "C" void ft_cuda_dropout_backward(ft_tensor dx, ft_tensor dout, size_t n, float p,
                                         uint64_t seed, uint64_t offset)
{
    if (n == 0 || p >= 1.0f)
        return;
    if (p <= 0.0f)
        ft_cuda_add(dx, dout, n);
    else
        dropout(dx, dout, n, p, seed, offset, 1);
}
