/* RMSNorm on the GPU, and the residual add fused before it: the launches of
 * rmsnorm_kernels.cuh (the math is there and in kernels/cpu/rmsnorm.c). */
#include "cuda_common.cuh"
#include "rmsnorm_kernels.cuh"

static void forward(rms_args a)
{
    if (a.N <= 0 || a.C <= 0)
        return;
    FT_LAUNCH(rmsnorm_forward_kernel, a.N, RMS_THREADS, 0, ft_cuda_stream())(a);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_rmsnorm_forward(ft_tensor out, ft_tensor rstd, ft_tensor x, ft_tensor w,
                                        int N, int C, float eps, float w_offset)
{
    rms_args a = {};
    a.out = fv(out), a.x = fv(x), a.w = fv(w), a.rstd = (float *)rstd.data;
    a.N = N, a.C = C, a.eps = eps, a.w_off = w_offset;
    forward(a);
}

extern "C" void ft_cuda_add_rmsnorm_forward(ft_tensor sum, ft_tensor out, ft_tensor rstd,
                                            ft_tensor x, ft_tensor res, ft_tensor w, int N,
                                            int C, float eps, float w_offset)
{
    rms_args a = {};
    a.out = fv(out), a.x = fv(x), a.w = fv(w), a.res = fv(res), a.sum = fv(sum);
    a.rstd = (float *)rstd.data, a.N = N, a.C = C, a.eps = eps, a.w_off = w_offset;
    forward(a);
}

extern "C" void ft_cuda_rmsnorm_backward(ft_tensor dx, ft_tensor dw, ft_tensor dout, ft_tensor x,
                                         ft_tensor w, ft_tensor rstd, int N, int C,
                                         float w_offset)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = ft_cuda_stream();
    rms_args a = {};
    a.dx = fv(dx), a.dw = fv(dw), a.dout = fv(dout), a.x = fv(x), a.w = fv(w);
    a.rstd = (float *)rstd.data, a.N = N, a.C = C, a.w_off = w_offset;
    if (dx.data) {
        FT_LAUNCH(rmsnorm_backward_dx_kernel, N, RMS_THREADS, 0, s)(a);
        LAUNCH_CHECK();
    }
    if (dw.data) {
        size_t room;
        a.partial = colsum_partials(&room);
        colsum_plan p = colsum_plan_for(N, C, room);
        a.chunk_rows = p.rows;
        FT_LAUNCH(rmsnorm_backward_dw_kernel, colsum_grid(p, C), COLSUM_THREADS, 0, s)(a);
        LAUNCH_CHECK();
        colsum_finish(a.dw, a.partial, p, C, s);
    }
}
