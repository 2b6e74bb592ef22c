/* Token embedding on the GPU (kernels/cpu/embedding.c's twin).
 *   forward:  out[n, c] = table[ids[n], c]            one thread per element
 *   backward: dtable[ids[n], c] += dout[n, c]         for every n, in order of n, but
 *             the rows with ids[n] == pad (nn.Embedding's padding_idx: no gradient)
 * Rows of dtable repeat when a token repeats, so the backward is a scatter-add that no
 * two blocks may share: block j owns columns 32 j .. 32 j + 31 of every row of dtable
 * and walks the rows n in rounds of EMB_WARPS, one row a warp (lane = column, so a warp
 * reads 32 contiguous values of dout). In a round, the warp of the first row with a
 * given id adds that id's rows of the round into dtable in row order; the other warps
 * with the id do nothing; a barrier ends the round. Every element of dtable is thus
 * updated by one thread at a time, with the rows in increasing n, as on the CPU (each
 * sum rounded in turn): no atomics, the same bits on every run. The rows are parallel
 * EMB_WARPS-fold within a block, the columns across blocks. */
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

#define EMB_WARPS 32
#define EMB_THREADS (32 * EMB_WARPS)

__global__ void embedding_backward_kernel(fview dtable, fview dout, const int32_t *ids, int N,
                                          int C, int pad)
{
    __shared__ int id_s[EMB_WARPS];
    __shared__ float val_s[EMB_WARPS][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    for (int n0 = 0; n0 < N; n0 += EMB_WARPS) {
        int n = n0 + warp;
        if (lane == 0)
            id_s[warp] = n < N && ids[n] != pad ? ids[n] : -1; /* -1: adds nothing */
        val_s[warp][lane] = n < N && c < C ? ld(dout, (size_t)n * C + c) : 0.0f;
        __syncthreads();
        int id = id_s[warp];
        bool first = id >= 0;
        for (int w = 0; w < warp; w++)
            first = first && id_s[w] != id;
        if (first && c < C) {
            size_t dst = (size_t)id * C + c;
            float acc = ld(dtable, dst);
            for (int w = warp; w < EMB_WARPS; w++)
                if (id_s[w] == id)
                    acc += val_s[w][lane];
            st(dtable, dst, acc);
        }
        __syncthreads(); /* the round's writes are seen, and id_s, val_s free, by the next */
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
                                           int N, int V, int C, int pad)
{
    (void)V;
    if (N <= 0 || C <= 0)
        return;
    FT_LAUNCH(embedding_backward_kernel, (C + 31) / 32, EMB_THREADS, 0, ft_cuda_stream())(
        fv(dtable), fv(dout), (const int32_t *)ids.data, N, C, pad);
    LAUNCH_CHECK();
}

/* The transposed table [C, V] (LoRA's lora_embedding_A). Forward: one thread per element.
 * Backward: one thread per row c of dtable, walking every n in order (C is a LoRA rank:
 * few threads, each a serial pass over the rows; no two threads share an element). */
__global__ void embedding_t_forward_kernel(fview out, const int32_t *ids, fview table, size_t N,
                                           int V, int C)
{
    GRID_STRIDE(i, N * (size_t)C)
    {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        st(out, i, ld(table, c * (size_t)V + (size_t)ids[n]));
    }
}

__global__ void embedding_t_backward_kernel(fview dtable, fview dout, const int32_t *ids, int N,
                                            int V, int C, int pad)
{
    int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= C)
        return;
    for (int n = 0; n < N; n++) {
        if (ids[n] == pad) /* the padding row: no gradient */
            continue;
        size_t dst = (size_t)c * V + (size_t)ids[n];
        st(dtable, dst, ld(dtable, dst) + ld(dout, (size_t)n * C + c));
    }
}

extern "C" void ft_cuda_embedding_t_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N,
                                            int V, int C)
{
    size_t n = (size_t)N * (size_t)C;
    if (n == 0)
        return;
    FT_LAUNCH(embedding_t_forward_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(out), (const int32_t *)ids.data, fv(table), (size_t)N, V, C);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_embedding_t_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids,
                                             int N, int V, int C, int pad)
{
    if (N <= 0 || C <= 0)
        return;
    FT_LAUNCH(embedding_t_backward_kernel, (unsigned)((C + 31) / 32), 32, 0, ft_cuda_stream())(
        fv(dtable), fv(dout), (const int32_t *)ids.data, N, V, C, pad);
    LAUNCH_CHECK();
}
