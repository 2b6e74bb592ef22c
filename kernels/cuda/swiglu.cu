/* SwiGLU gating on the GPU (kernels/cpu/swiglu.c's twin), elementwise over [n]:
 *   forward:  out = silu(g) * u,  silu(g) = g / (1 + exp(-g))
 *   backward: s = 1 / (1 + exp(-g));  dgate += dout * u * s (1 + g (1 - s));
 *             dup += dout * (g s)
 * The same expressions as torch's silu and silu_backward; exp(-g) overflowing to inf
 * for very negative g gives 0, not NaN. */
#include "cuda_common.cuh"

__global__ void swiglu_forward_kernel(fview out, fview gate, fview up, size_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ld(gate, i);
        float silu = g / (1.0f + expf(-g));
        st(out, i, silu * ld(up, i));
    }
}

__global__ void swiglu_backward_kernel(fview dgate, fview dup, fview dout, fview gate, fview up,
                                       size_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ld(gate, i), d = ld(dout, i);
        float s = 1.0f / (1.0f + expf(-g));
        if (dgate.p)
            st(dgate, i, ld(dgate, i) + d * ld(up, i) * (s * (1.0f + g * (1.0f - s))));
        if (dup.p)
            st(dup, i, ld(dup, i) + d * (g * s));
    }
}

extern "C" void ft_cuda_swiglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0)
        return;
    FT_LAUNCH(swiglu_forward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(out), fv(gate), fv(up), n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_swiglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout,
                                        ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0 || (!dgate.data && !dup.data))
        return;
    FT_LAUNCH(swiglu_backward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    LAUNCH_CHECK();
}
