/* The logistic sigmoid of a gate on the GPU (kernels/cpu/sigmoid.c's twin): one thread
 * per element, z and dz in the compute dtype, s and ds fp32. */
#include "cuda_common.cuh"

__global__ void sigmoid_forward_kernel(float *s, fview z, size_t n)
{
    GRID_STRIDE(i, n)
    {
        s[i] = 1.0f / (1.0f + expf(-ld(z, i)));
    }
}

__global__ void sigmoid_backward_kernel(fview dz, const float *ds, const float *s, size_t n)
{
    GRID_STRIDE(i, n)
    {
        st(dz, i, ld(dz, i) + ds[i] * (s[i] * (1.0f - s[i])));
    }
}

extern "C" void ft_cuda_sigmoid_forward(ft_tensor s, ft_tensor z, size_t n)
{
    if (n == 0)
        return;
    FT_LAUNCH(sigmoid_forward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        (float *)s.data, fv(z), n);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_sigmoid_backward(ft_tensor dz, ft_tensor ds, ft_tensor s, size_t n)
{
    if (n == 0)
        return;
    FT_LAUNCH(sigmoid_backward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(dz), (const float *)ds.data, (const float *)s.data, n);
    LAUNCH_CHECK();
}
