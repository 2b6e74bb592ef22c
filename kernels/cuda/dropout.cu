/* Dropout on the GPU with the counter-based mask of kernels/cpu/dropout.c, bit for bit:
 *   key = mix(seed + GOLDEN);  bits(c) = mix(key + (c + 1) GOLDEN),  c = offset + i
 *   keep(c) = (bits(c) >> 40) >= ceil(p 2^24)
 *   forward:  out[i] = x[i] * (keep ? k : 0);   backward: dx[i] += dout[i] * (keep ? k : 0)
 * with k = 1 / (float)(1 - p) and mix the splitmix64 finaliser (see the CPU file for why).
 * The product and the sum are rounded separately (__fmul_rn, __fadd_rn: never fused into
 * an FMA), as the CPU op rounds them, so the results match bit for bit.
 * The mask functions are the CPU op's own (kernels/dropout_mask.h); the threshold and k
 * are computed on the host. */
#include <math.h>

#include "../dropout_mask.h"
#include "cuda_common.cuh"

/* backward = 0: out = x * mask;  backward = 1: out += x * mask */
__global__ void dropout_kernel(fview out, fview x, size_t n, uint64_t key, uint64_t offset,
                               uint64_t thr, float k, int backward)
{
    GRID_STRIDE(i, n)
    {
        /* Rounded twice, as the CPU op: nvcc would fuse out + x * mask into one FMA
         * (one rounding), which differs in the last bit wherever k = 1 / (1 - p) is
         * inexact (p = 0.1, 0.999). */
        float v = __fmul_rn(ld(x, i), ft_dropout_factor(key, offset + i, thr, k));
        st(out, i, backward ? __fadd_rn(ld(out, i), v) : v);
    }
}

static void dropout(ft_tensor out, ft_tensor x, size_t n, float p, uint64_t seed,
                    uint64_t offset, int backward)
{
    float k = ft_dropout_keep_scale(p);
    uint64_t key = ft_dropout_key(seed), thr = ft_dropout_threshold(p);
    FT_LAUNCH(dropout_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(out), fv(x), n, key, offset, thr, k, backward);
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
