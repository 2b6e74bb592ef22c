/* RMSNorm on the GPU (kernels/cpu/rmsnorm.c's twin; the math is derived there).
 *   forward:  rstd[n] = 1 / sqrt(mean_c x[n,c]^2 + eps);  out = (x * rstd) * w
 *   backward: dx[n,c] += r (w_c g_c - x_c k),  k = r^2 mean_c(w_c g_c x_c)   (g = dout)
 *             dw[c]   += sum_n g[n,c] x[n,c] r[n]
 * One block per row for forward and dx: each thread takes the columns c = tid,
 * tid + blockDim, ... and the row sums are block sums in a fixed order (fp32 terms and
 * partial sums). dw is a column sum: one thread per column walking the rows in order
 * (no atomics, the same on every run). rstd is fp32. */
#include "cuda_common.cuh"

#define RMS_THREADS 256

__global__ void rmsnorm_forward_kernel(fview out, float *rstd, fview x, fview w, int C,
                                       float eps)
{
    __shared__ float shm[32];
    size_t row = (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = ld(x, row + c);
        ss += v * v;
    }
    ss = block_sum(ss, shm);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        st(out, row + c, __fmul_rn(ld(x, row + c), r) * ld(w, c));
}

__global__ void rmsnorm_backward_dx_kernel(fview dx, fview dout, fview x, fview w,
                                           const float *rstd, int C)
{
    __shared__ float shm[32];
    size_t row = (size_t)blockIdx.x * C;
    float r = rstd[blockIdx.x];
    float dot = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += (ld(w, c) * ld(dout, row + c)) * ld(x, row + c);
    dot = block_sum(dot, shm);
    float k = r * r * (dot / (float)C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float g = ld(w, c) * ld(dout, row + c);
        st(dx, row + c, ld(dx, row + c) + r * (g - ld(x, row + c) * k));
    }
}

__global__ void rmsnorm_backward_dw_kernel(fview dw, fview dout, fview x, const float *rstd,
                                           int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float acc = 0.0f;
    for (int n = 0; n < N; n++) {
        size_t i = (size_t)n * C + c;
        acc += ld(dout, i) * (ld(x, i) * rstd[n]);
    }
    st(dw, c, ld(dw, c) + acc);
}

extern "C" void ft_cuda_rmsnorm_forward(ft_tensor out, ft_tensor rstd, ft_tensor x, ft_tensor w,
                                        int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return;
    rmsnorm_forward_kernel<<<N, RMS_THREADS, 0, ft_cuda_stream()>>>(
        fv(out), (float *)rstd.data, fv(x), fv(w), C, eps);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_rmsnorm_backward(ft_tensor dx, ft_tensor dw, ft_tensor dout, ft_tensor x,
                                         ft_tensor w, ft_tensor rstd, int N, int C)
{
    if (N <= 0 || C <= 0)
        return;
    cudaStream_t s = ft_cuda_stream();
    const float *r = (const float *)rstd.data;
    if (dx.data) {
        rmsnorm_backward_dx_kernel<<<N, RMS_THREADS, 0, s>>>(fv(dx), fv(dout), fv(x), fv(w), r,
                                                             C);
        LAUNCH_CHECK();
    }
    if (dw.data) {
        rmsnorm_backward_dw_kernel<<<(C + 127) / 128, 128, 0, s>>>(fv(dw), fv(dout), fv(x), r,
                                                                   N, C);
        LAUNCH_CHECK();
    }
}
