/* GeGLU gating on the GPU (kernels/cpu/geglu.c's twin, where the math is derived),
 * elementwise over [n], fp32 arithmetic:
 *   forward:  out = gelu_tanh(g) * u,  gelu_tanh(g) = 0.5 g (1 + tanh(beta (g + kappa g^3)))
 *   backward: dgate = dout * u * gelu_tanh'(g);  dup = dout * gelu_tanh(g)   (overwritten)
 * The same fp32 expressions as the CPU op (and torch's kernels), saturation included.
 * The kernels are glu_kernels.cuh's (8 elements a thread where the operands allow). */
#include "glu_kernels.cuh"

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

struct geglu_op {
    static __device__ __forceinline__ float value(float g, float u) { return gelu_tanh(g) * u; }

    static __device__ __forceinline__ void grads(float g, float u, float d, float &dg, float &du)
    {
        dg = d * u * gelu_tanh_grad(g);
        du = d * gelu_tanh(g);
    }
};

extern "C" void ft_cuda_geglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    glu_forward<geglu_op>(out, gate, up, n);
}

extern "C" void ft_cuda_geglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout,
                                       ft_tensor gate, ft_tensor up, size_t n)
{
    glu_backward<geglu_op>(dgate, dup, dout, gate, up, n);
}
