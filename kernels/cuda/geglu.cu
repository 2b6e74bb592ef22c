/* GeGLU gating on the GPU (kernels/cpu/geglu.c's twin, where the math is derived),
 * elementwise over [n], fp32 arithmetic:
 *   forward:  out = gelu_tanh(g) * u,  gelu_tanh(g) = 0.5 g (1 + tanh(beta (g + kappa g^3)))
 *   backward: dgate += dout * u * gelu_tanh'(g);  dup += dout * gelu_tanh(g)
 * The same fp32 expressions as the CPU op (and torch's kernels), saturation included. */
#include "cuda_common.cuh"

#define GELU_BETA 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_KAPPA 0.044715f

__device__ __forceinline__ float gelu_tanh(float g)
{
    float inner = GELU_BETA * (g + GELU_KAPPA * (g * g * g));
    return 0.5f * g * (1.0f + tanhf(inner));
}

__device__ __forceinline__ float gelu_tanh_grad(float g)
{
    float g2 = g * g;
    float inner = GELU_BETA * (g + GELU_KAPPA * (g2 * g));
    float t = tanhf(inner);
    float right = 1.0f + t, dtanh = 1.0f - t * t;
    if (dtanh == 0.0f)
        return 0.5f * right;
    float dinner = GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * g2);
    return 0.5f * right + (0.5f * g) * dtanh * dinner;
}

__global__ void geglu_forward_kernel(fview out, fview gate, fview up, size_t n)
{
    GRID_STRIDE(i, n)
    st(out, i, gelu_tanh(ld(gate, i)) * ld(up, i));
}

__global__ void geglu_backward_kernel(fview dgate, fview dup, fview dout, fview gate, fview up,
                                      size_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ld(gate, i), d = ld(dout, i);
        if (dgate.p)
            st(dgate, i, ld(dgate, i) + d * ld(up, i) * gelu_tanh_grad(g));
        if (dup.p)
            st(dup, i, ld(dup, i) + d * gelu_tanh(g));
    }
}

extern "C" void ft_cuda_geglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0)
        return;
    FT_LAUNCH(geglu_forward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(out), fv(gate), fv(up), n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_geglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout,
                                       ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0 || (!dgate.data && !dup.data))
        return;
    FT_LAUNCH(geglu_backward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    LAUNCH_CHECK();
}
