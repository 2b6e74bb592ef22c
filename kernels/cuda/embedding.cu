/* Token embedding on the GPU (kernels/cpu/embedding.c's twin).
 *   forward:  out[n, c] = table[ids[n], c]            one thread per element
 *   backward: dtable[ids[n], c] += dout[n, c]
 * Rows of dtable repeat when a token repeats, so the backward gives each column c to
 * one thread, which walks the rows n in order: no two threads write one element and the
 * sums come out the same on every run (no atomics). */
#include "cuda_common.cuh"

__global__ void embedding_forward_kernel(fview out, const int32_t *ids, fview table, size_t N,
                                         int C)
{
    GRID_STRIDE(i, N * (size_t)C)
    {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        st(out, i, ld(table, (size_t)ids[n] * C + c));
    }
}

__global__ void embedding_backward_kernel(fview dtable, fview dout, const int32_t *ids, int N,
                                          int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int n = 0; n < N; n++) {
        size_t dst = (size_t)ids[n] * C + c;
        st(dtable, dst, ld(dtable, dst) + ld(dout, (size_t)n * C + c));
    }
}

extern "C" void ft_cuda_embedding_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N,
                                          int V, int C)
{
    (void)V;
    if (N <= 0 || C <= 0)
        return;
    size_t n = (size_t)N * C;
    FT_LAUNCH(embedding_forward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(out), (const int32_t *)ids.data, fv(table), (size_t)N, C);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_embedding_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids,
                                           int N, int V, int C)
{
    (void)V;
    if (N <= 0 || C <= 0)
        return;
    FT_LAUNCH(embedding_backward_kernel, (C + 127) / 128, 128, 0, ft_cuda_stream())(
        fv(dtable), fv(dout), (const int32_t *)ids.data, N, C);
    LAUNCH_CHECK();
}
