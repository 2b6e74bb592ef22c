/* SwiGLU gating on the GPU (kernels/cpu/swiglu.c's twin), elementwise over [n]:
 *   forward:  out = silu(g) * u,  silu(g) = g / (1 + exp(-g))
 *   backward: s = 1 / (1 + exp(-g));  dgate += dout * u * s (1 + g (1 - s));
 *             dup += dout * (g s)
 * The same expressions as torch's silu and silu_backward; exp(-g) overflowing to inf
 * for very negative g gives 0, not NaN.
 * Both directions move 8 elements a thread where the operands allow (vec_io.cuh). */
#include "cuda_common.cuh"
#include "vec_io.cuh"

__device__ __forceinline__ float swiglu_value(float g, float u)
{
    float silu = g / (1.0f + expf(-g));
    return silu * u;
}

/* dgate and dup after adding element (g, u, d)'s gradients to dg and du */
__device__ __forceinline__ void swiglu_grads(float g, float u, float d, float &dg, float &du)
{
    float s = 1.0f / (1.0f + expf(-g));
    dg = dg + d * u * (s * (1.0f + g * (1.0f - s)));
    du = du + d * (g * s);
}

__global__ void swiglu_forward_kernel(fview out, fview gate, fview up, size_t n)
{
    GRID_STRIDE(i, n)
    st(out, i, swiglu_value(ld(gate, i), ld(up, i)));
}

__global__ void swiglu_backward_kernel(fview dgate, fview dup, fview dout, fview gate, fview up,
                                       size_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ld(gate, i), u = ld(up, i), d = ld(dout, i);
        float dg = dgate.p ? ld(dgate, i) : 0.0f, du = dup.p ? ld(dup, i) : 0.0f;
        swiglu_grads(g, u, d, dg, du);
        if (dgate.p)
            st(dgate, i, dg);
        if (dup.p)
            st(dup, i, du);
    }
}

/* the same, 8 elements a thread (vec_io.cuh), n a multiple of 8 */
__global__ void swiglu_forward_vec8_kernel(fview out, fview gate, fview up, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        size_t i = j * VEC8;
        float g[VEC8], u[VEC8], o[VEC8];
        ld8(gate, i, g);
        ld8(up, i, u);
#pragma unroll
        for (int k = 0; k < VEC8; k++)
            o[k] = swiglu_value(g[k], u[k]);
        st8(out, i, o);
    }
}

__global__ void swiglu_backward_vec8_kernel(fview dgate, fview dup, fview dout, fview gate,
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
            swiglu_grads(g[k], u[k], d[k], dg[k], du[k]);
        if (dgate.p)
            st8(dgate, i, dg);
        if (dup.p)
            st8(dup, i, du);
    }
}

extern "C" void ft_cuda_swiglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = ft_cuda_stream();
    if (vec8_ok(n, out.data, gate.data, up.data))
        FT_LAUNCH(swiglu_forward_vec8_kernel, grid_for(n / VEC8, 256), 256, 0, s)(
            fv(out), fv(gate), fv(up), n);
    else
        FT_LAUNCH(swiglu_forward_kernel, grid_for(n, 256), 256, 0, s)(fv(out), fv(gate),
                                                                      fv(up), n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_swiglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout,
                                        ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0 || (!dgate.data && !dup.data))
        return;
    cudaStream_t s = ft_cuda_stream();
    if (vec8_ok(n, dgate.data, dup.data, dout.data, gate.data, up.data))
        FT_LAUNCH(swiglu_backward_vec8_kernel, grid_for(n / VEC8, 256), 256, 0, s)(
            fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    else
        FT_LAUNCH(swiglu_backward_kernel, grid_for(n, 256), 256, 0, s)(
            fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    LAUNCH_CHECK();
}
