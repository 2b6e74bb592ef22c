/* Cross-entropy over a vocabulary on the GPU (kernels/cpu/cross_entropy.c's twin).
 * logits [N,V] (fp32 or bf16), targets [N] int32 (-100: not counted). For a counted row
 * with target t and m = max_j logits[j]:
 *   S = sum_j exp(logits[j] - m) (double),  loss = (m - logits[t]) + log S
 *   dlogits[j] = grad_scale * exp(logits[j] - m) / S - [j == t] grad_scale
 * and dlogits = 0 on rows not counted. softcap > 0: the logits are capped values
 * z = softcap tanh(x / softcap) and dlogits[j] is also multiplied by 1 - (z_j / softcap)^2,
 * the gradient w.r.t. x (each thread reads its z_j just before it overwrites it).
 * dlogits may alias logits: every thread reads the row (max, then S) before any thread
 * writes it, the block sums' barriers in between.
 *
 * Determinism, as on the CPU: the rows are cut into CE_BLOCKS fixed contiguous ranges,
 * one block each; a block adds its rows' losses in order (double) into the scratch, and
 * ft_cuda_sum_partials adds the range sums in order and reads the total back. */
#include "cuda_common.cuh"

#define CE_BLOCKS 256
#define CE_THREADS 256
#define CE_IGNORE (-100)

__global__ void cross_entropy_kernel(double *partial, fview dlogits, fview logits,
                                     const int32_t *targets, int N, int V, float grad_scale,
                                     float softcap, int nblocks)
{
    __shared__ float shm_f[32];
    __shared__ double shm_d[32];
    int b = blockIdx.x;
    int n0 = (int)((long)N * b / nblocks), n1 = (int)((long)N * (b + 1) / nblocks);
    double acc = 0.0;
    for (int n = n0; n < n1; n++) {
        size_t row = (size_t)n * V;
        int t = targets[n];
        if (t == CE_IGNORE) {
            if (dlogits.p)
                for (int j = threadIdx.x; j < V; j += blockDim.x)
                    st(dlogits, row + j, 0.0f);
            continue;
        }
        float xt = ld(logits, row + t);
        float m = -INFINITY;
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            m = fmaxf(m, ld(logits, row + j));
        m = block_max(m, shm_f);
        double s = 0.0;
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            s += expf(ld(logits, row + j) - m);
        double S = block_sum(s, shm_d);
        if (dlogits.p) {
            float k = (float)(grad_scale / S);
            for (int j = threadIdx.x; j < V; j += blockDim.x) {
                float z = ld(logits, row + j);
                float d = __fmul_rn(expf(z - m), k);
                d = j == t ? d - grad_scale : d;
                if (softcap > 0.0f) {
                    float u = z / softcap;
                    d *= 1.0f - u * u;
                }
                st(dlogits, row + j, d);
            }
            /* the next row's reads must not pass this row's writes (in-place) */
            __syncthreads();
        }
        acc += ((double)m - (double)xt) + log(S);
    }
    if (threadIdx.x == 0)
        partial[b] = acc;
}

extern "C" double ft_cuda_cross_entropy(ft_tensor dlogits, ft_tensor logits, ft_tensor targets,
                                        int N, int V, float grad_scale, float softcap)
{
    if (N <= 0 || V <= 0)
        return 0.0;
    cudaStream_t s = ft_cuda_stream();
    double *partial = ft_cuda_scratch();
    int nblocks = N < CE_BLOCKS ? N : CE_BLOCKS;
    FT_LAUNCH(cross_entropy_kernel, nblocks, CE_THREADS, 0, s)(
        partial, fv(dlogits), fv(logits), (const int32_t *)targets.data, N, V, grad_scale,
        softcap, nblocks);
    LAUNCH_CHECK();
    return ft_cuda_sum_partials(partial, nblocks);
}
