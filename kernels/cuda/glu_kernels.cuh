/* The gated-linear-unit kernels SwiGLU (swiglu.cu) and GeGLU (geglu.cu) share: elementwise
 * over [n], out = act(gate) * up forward, and backward writing each element's gradients
 * to dgate and dup (either may be absent; overwritten). Op gives the math:
 *   static __device__ float value(float g, float u);                       the output
 *   static __device__ void grads(float g, float u, float d, float &dg, float &du);
 *                                             dg, du: the element's two gradients
 * Each direction has a scalar kernel and an 8-wide one (vec_io.cuh), taken when n and the
 * operands allow; the same arithmetic element by element. */
#ifndef FT_GLU_KERNELS_CUH
#define FT_GLU_KERNELS_CUH

#include "cuda_common.cuh"
#include "vec_io.cuh"

template <class Op> __global__ void glu_forward_kernel(fview out, fview gate, fview up, size_t n)
{
    GRID_STRIDE(i, n)
    st(out, i, Op::value(ld(gate, i), ld(up, i)));
}

template <class Op>
__global__ void glu_backward_kernel(fview dgate, fview dup, fview dout, fview gate, fview up,
                                    size_t n)
{
    GRID_STRIDE(i, n)
    {
        float g = ld(gate, i), u = ld(up, i), d = ld(dout, i);
        float dg, du;
        Op::grads(g, u, d, dg, du);
        if (dgate.p)
            st(dgate, i, dg);
        if (dup.p)
            st(dup, i, du);
    }
}

template <class Op>
__global__ void glu_forward_vec8_kernel(fview out, fview gate, fview up, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        size_t i = j * VEC8;
        float g[VEC8], u[VEC8], o[VEC8];
        ld8(gate, i, g);
        ld8(up, i, u);
#pragma unroll
        for (int k = 0; k < VEC8; k++)
            o[k] = Op::value(g[k], u[k]);
        st8(out, i, o);
    }
}

template <class Op>
__global__ void glu_backward_vec8_kernel(fview dgate, fview dup, fview dout, fview gate,
                                         fview up, size_t n)
{
    GRID_STRIDE(j, n / VEC8)
    {
        size_t i = j * VEC8;
        float g[VEC8], u[VEC8], d[VEC8], dg[VEC8], du[VEC8];
        ld8(gate, i, g);
        ld8(up, i, u);
        ld8(dout, i, d);
#pragma unroll
        for (int k = 0; k < VEC8; k++)
            Op::grads(g[k], u[k], d[k], dg[k], du[k]);
        if (dgate.p)
            st8(dgate, i, dg);
        if (dup.p)
            st8(dup, i, du);
    }
}

template <class Op> void glu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    if (n == 0)
        return;
    cudaStream_t s = ft_cuda_stream();
    if (vec8_ok(n, out.data, gate.data, up.data))
        FT_LAUNCH(glu_forward_vec8_kernel<Op>, grid_for(n / VEC8, 256), 256, 0, s)(
            fv(out), fv(gate), fv(up), n);
    else
        FT_LAUNCH(glu_forward_kernel<Op>, grid_for(n, 256), 256, 0, s)(fv(out), fv(gate),
                                                                       fv(up), n);
    LAUNCH_CHECK();
}

template <class Op>
void glu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate, ft_tensor up,
                  size_t n)
{
    if (n == 0 || (!dgate.data && !dup.data))
        return;
    cudaStream_t s = ft_cuda_stream();
    if (vec8_ok(n, dgate.data, dup.data, dout.data, gate.data, up.data))
        FT_LAUNCH(glu_backward_vec8_kernel<Op>, grid_for(n / VEC8, 256), 256, 0, s)(
            fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    else
        FT_LAUNCH(glu_backward_kernel<Op>, grid_for(n, 256), 256, 0, s)(
            fv(dgate), fv(dup), fv(dout), fv(gate), fv(up), n);
    LAUNCH_CHECK();
}

#endif
