/* RoPE on the GPU, HF rotate-half convention, in place (kernels/cpu/rope.c's twin).
 * x [N, heads, D]; the first rd dims of each head rotate, the rest pass through;
 * h = rd/2; for i < h, a = (float)pos[n] * inv_freq[i], c = fl(cos a * scale),
 * s = fl(sin a * scale):
 *   y[i] = x[i] c - x[i+h] s;   y[i+h] = x[i+h] c + x[i] s
 * backward applies the transpose (s negated). One thread per (n, i) rotates that pair in
 * every head: the coefficients depend on n and i only, and their double-precision cos and
 * sin are the costly part (computed once for all heads instead of once a head). cos and
 * sin are evaluated in double from the fp32 angle and rounded, then scaled in fp32, as
 * the CPU op does, so both backends rotate by the same fp32 coefficients. */
#include "cuda_common.cuh"

__global__ void rope_kernel(fview x, const int32_t *pos, const float *inv_freq, size_t N,
                            int heads, int h, int D, float scale, float sign)
{
    GRID_STRIDE(p, N * (size_t)h)
    {
        int i = (int)(p % (size_t)h);
        size_t n = p / (size_t)h;
        float a = __fmul_rn((float)pos[n], inv_freq[i]);
        float c = __fmul_rn((float)cos((double)a), scale);
        float s = sign * __fmul_rn((float)sin((double)a), scale);
        for (int head = 0; head < heads; head++) {
            size_t i1 = (n * (size_t)heads + (size_t)head) * (size_t)D + i, i2 = i1 + h;
            float a1 = ld(x, i1), a2 = ld(x, i2);
            st(x, i1, __fsub_rn(__fmul_rn(a1, c), __fmul_rn(a2, s)));
            st(x, i2, __fadd_rn(__fmul_rn(a2, c), __fmul_rn(a1, s)));
        }
    }
}

static void rope(ft_tensor x, ft_tensor pos, ft_tensor inv_freq, int N, int heads, int D,
                 int rd, float scale, float sign)
{
    int h = rd / 2;
    if (N <= 0 || heads <= 0 || h <= 0)
        return;
    size_t pairs = (size_t)N * h; /* (n, i): each thread takes every head */
    FT_LAUNCH(rope_kernel, grid_for(pairs, 256), 256, 0, ft_cuda_stream())(
        fv(x), (const int32_t *)pos.data, (const float *)inv_freq.data, (size_t)N, heads, h,
        D, scale, sign);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_rope_forward(ft_tensor x, ft_tensor pos, ft_tensor inv_freq, int N,
                                     int heads, int D, int rd, float scale)
{
    rope(x, pos, inv_freq, N, heads, D, rd, scale, 1.0f);
}

extern "C" void ft_cuda_rope_backward(ft_tensor dx, ft_tensor pos, ft_tensor inv_freq, int N,
                                      int heads, int D, int rd, float scale)
{
    rope(dx, pos, inv_freq, N, heads, D, rd, scale, -1.0f);
}
