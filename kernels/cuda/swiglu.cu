/* SwiGLU gating on the GPU (kernels/cpu/swiglu.c's twin), elementwise over [n]:
 *   forward:  out = silu(g) * u,  silu(g) = g / (1 + exp(-g))
 *   backward: s = 1 / (1 + exp(-g));  dgate = dout * u * s (1 + g (1 - s));
 *             dup = dout * (g s)   (overwritten)
 * The same expressions as torch's silu and silu_backward; exp(-g) overflowing to inf
 * for very negative g gives 0, not NaN.
 * The kernels are glu_kernels.cuh's (8 elements a thread where the operands allow). */
#include "glu_kernels.cuh"

struct swiglu_op {
    static __device__ __forceinline__ float value(float g, float u)
    {
        float silu = g / (1.0f + expf(-g));
        return silu * u;
    }

    static __device__ __forceinline__ void grads(float g, float u, float d, float &dg, float &du)
    {
        float s = 1.0f / (1.0f + expf(-g));
        dg = d * u * (s * (1.0f + g * (1.0f - s)));
        du = d * (g * s);
    }
};

extern "C" void ft_cuda_swiglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    glu_forward<swiglu_op>(out, gate, up, n);
}

extern "C" void ft_cuda_swiglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout,
                                        ft_tensor gate, ft_tensor up, size_t n)
{
    glu_backward<swiglu_op>(dgate, dup, dout, gate, up, n);
}
