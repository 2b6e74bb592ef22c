/* GeGLU gating on the GPU (kernels/cpu/geglu.c's twin, where the math is derived),
 * elementwise over [n], fp32 arithmetic:
 *   forward:  out = gelu_tanh(g) * u,  gelu_tanh(g) = 0.5 g (1 + tanh(beta (g + kappa g^3)))
 *   backward: dgate += dout * u * gelu_tanh'(g);  dup += dout * gelu_tanh(g)
 * The same fp32 expressions as the CPU op (and torch's kernels), saturation included.
 * Both directions move 8 elements a thread where the operands allow (vec_io.cuh). */
#include "cuda_common.cuh"
#include "vec_io.cuh"

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

/* dgate and dup after adding element (g, u, d)'s gradients to dg and du */
__device__ __forceinline__ void geglu_grads(float g, float u, float d, float &dg, float &du)
{
    dg = dg + d * u * gelu_tanh_grad(g);
    du = du + d * gelu_tanh(g);
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
        float g = ld(gate, i), u = ld(up, i), d = ld(dout, i);
        float dg = dgate.p ? ld(dgate, i) : 0.0f, du = dup.p ? ld(dup, i) : 0.0f;
        geglu_grads(g, u, d, dg, du);
        if (dgate.p)
            st(dgate, i, dg);
        if (dup.p)
            st(dup, i, du);
    }
}

/* the same, 8 elements a thread (vec_io.cuh), n a multiple of 8 */
__global__ void geglu_forward_vec8_kernel(fview out, fview gate, fview up, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        size_t i = j * VEC8;
        float g[VEC8], u[VEC8], o[VEC8];
        ld8(gate, i, g);
        ld8(up, i, u);
#pragma unroll
        for (int k = 0; k < VEC8; k++)
            o[k] = gelu_tanh(g[k]) * u[k];
        st8(out, i, o);
    }
}

__global__ void geglu_backward_vec8_kernel(fview dgate, fview dup, fview dout, fview gate,
                                           fview up, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        size_t i = j * VEC8;
        float g[VEC8], u[VEC8], d[VEC8], dg[VEC8] = {0}, du[VEC8] = {0};
        ld8(gate, i, g);
        ld8(up, i, u);
        ld8(dout, i, d);
        if (dgate.p)
            ld8(dgate, i, dg);
        if (dup.p)
            ld8(dup, i, du);
#pragma unroll
        for (int k = 0; k < VEC8; k++)
            geglu_grads(g[k], u[k], d[k], dg[k], du[k]);
        if (dgate.p)
            st8(dgate, i, dg);
        if (dup.p)
            st8(dup, i, du);
    }
}

extern "C" void ft_cuda_geglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = ft_cuda_stream();
    if (vec8_ok(n, out.data, gate.data, up.data))
        FT_LAUNCH(geglu_forward_vec8_kernel, grid_for(n / VEC8, 256), 256, 0, s)(
            fv(out), fv(gate), fv(up), n);
    else
        FT_LAUNCH(geglu_forward_kernel, grid_for(n, 256), 256, 0, s)(fv(out), fv(gate), fv(up),
                                                                     n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_geglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout,
                                       ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0 || (!dgate.data && !dup.data))
        return;
    cudaStream_t s = ft_cuda_stream();
    if (vec8_ok(n, dgate.data, dup.data, dout.data, gate.data, up.data))
        FT_LAUNCH(geglu_backward_vec8_kernel, grid_for(n / VEC8, 256), 256, 0, s)(
            fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    else
        FT_LAUNCH(geglu_backward_kernel, grid_for(n, 256), 256, 0, s)(
            fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    LAUNCH_CHECK();
}
