/* Cross-entropy over a vocabulary on the GPU (kernels/cpu/cross_entropy.c's twin).
 * logits [N,V] (fp32 or bf16), targets [N] int32 (-100: not counted). For a counted row
 * with target t and m = max_j logits[j]:
 *   S = sum_j exp(logits[j] - m) (double),  loss = (m - logits[t]) + log S
 *   dlogits[j] = grad_scale * exp(logits[j] - m) / S - [j == t] grad_scale
 * and dlogits = 0 on rows not counted. softcap > 0: the logits are capped values
 * z = softcap tanh(x / softcap) and dlogits[j] is also multiplied by 1 - (z_j / softcap)^2,
 * the gradient w.r.t. x (each thread reads its z_j just before it overwrites it).
 *
 * Made for bandwidth: a row is read twice and written once. A block of CE_THREADS
 * threads takes one row at a time. Pass 1 reads the row once and keeps, per thread, a
 * running max m and the sum s of exp(x - m) (online softmax: when the max grows from m
 * to m', s is rescaled by exp(m - m'), in double); the block then combines the threads'
 * (m, s) pairs into the row's max and S. Pass 2 reads the row again and writes dlogits.
 * When V is a multiple of 8 and the pointers are 16-byte aligned, a thread loads and
 * stores 8 elements at a time (one 16-byte access of bf16, two of fp32); otherwise one
 * element at a time (ld/st). The 8 terms exp(x - m) of a group are added in fp32, the
 * groups into the thread's double s.
 *
 * In place: dlogits may alias logits. Thread 0 reads logits[t] first; every read of
 * pass 1 happens before the block combine's barriers and every write after them, and in
 * pass 2 a thread writes only the elements it has just read. Rows are disjoint.
 *
 * Determinism: the rows are cut into nblocks = min(N, CE_MAX_BLOCKS) fixed contiguous
 * ranges, one block each; within a row the elements a thread sees, and the order the
 * threads' and warps' pairs are combined in, are fixed by CE_THREADS (not by the GPU);
 * a block adds its rows' losses in order (double) into the scratch (CE_MAX_BLOCKS
 * partials, well under FT_CUDA_SCRATCH_DOUBLES, whatever N), and ft_cuda_sum_partials
 * adds the blocks' sums in order and reads the total back. No atomics: the same bits on
 * every run. */
#include <float.h>
#include <string.h>

#include "cuda_common.cuh"
#include "vec_io.cuh"

#define CE_THREADS 256
/* One row per block up to this many rows (enough blocks to fill a GPU); more rows, and a
 * block takes a contiguous range of them. */
#define CE_MAX_BLOCKS 2048
#define CE_IGNORE (-100)
#define CE_VEC VEC8 /* elements per vector access (vec_io.cuh) */

static_assert(CE_MAX_BLOCKS < FT_CUDA_SCRATCH_DOUBLES, "the partials fit the scratch");

/* x[0..W) = elements i .. i+W-1 of v. W = CE_VEC: i a multiple of 8 and v.p 16-byte
 * aligned (ld8). */
template <int W> __device__ __forceinline__ void load_group(fview v, size_t i, float *x);

template <> __device__ __forceinline__ void load_group<1>(fview v, size_t i, float *x)
{
    x[0] = ld(v, i);
}

template <> __device__ __forceinline__ void load_group<CE_VEC>(fview v, size_t i, float *x)
{
    ld8(v, i, x);
}

/* elements i .. i+W-1 of v = d[0..W) (bf16: rounded to nearest even) */
template <int W> __device__ __forceinline__ void store_group(fview v, size_t i, const float *d);

template <> __device__ __forceinline__ void store_group<1>(fview v, size_t i, const float *d)
{
    st(v, i, d[0]);
}

template <>
__device__ __forceinline__ void store_group<CE_VEC>(fview v, size_t i, const float *d)
{
    st8(v, i, d);
}

/* Adds the W terms exp(x_k - m) to the running pair (m, s), first raising m to the
 * group's max (and rescaling s) when it is larger. A NaN in x makes s NaN (fmaxf skips
 * it, exp does not), as on the CPU. */
template <int W> __device__ __forceinline__ void online_add(float &m, double &s, const float *x)
{
    float gm = x[0];
    for (int k = 1; k < W; k++)
        gm = fmaxf(gm, x[k]);
    if (gm > m) {
        s *= exp((double)m - (double)gm);
        m = gm;
    }
    float e = 0.0f;
    for (int k = 0; k < W; k++)
        e += expf(x[k] - m);
    s += e;
}

/* (m, s) = the pair of the union of two element sets' pairs */
__device__ __forceinline__ void online_merge(float &m, double &s, float m2, double s2)
{
    float M = fmaxf(m, m2);
    double a = m == M ? s : s * exp((double)m - (double)M);
    double b = m2 == M ? s2 : s2 * exp((double)m2 - (double)M);
    s = a + b;
    m = M;
}

/* Every thread gets the block's (m, s): each warp's lane-0 pair after a butterfly, then
 * the warps' pairs merged in index order, the same in every thread. shm_* hold 32. */
__device__ void block_online(float &m, double &s, float *shm_m, double *shm_s)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        double s2 = __shfl_xor_sync(0xffffffffu, s, o);
        online_merge(m, s, m2, s2);
    }
    __syncthreads(); /* the previous row's pairs may still be read */
    if (lane == 0) {
        shm_m[warp] = m;
        shm_s[warp] = s;
    }
    __syncthreads();
    m = shm_m[0];
    s = shm_s[0];
    for (int w = 1; w < nwarps; w++)
        online_merge(m, s, shm_m[w], shm_s[w]);
}

/* W = CE_VEC: the vector accesses (V % 8 == 0, aligned pointers); W = 1: any V. */
template <int W>
__global__ void __launch_bounds__(CE_THREADS)
    cross_entropy_kernel(double *partial, fview dlogits, fview logits, const int32_t *targets,
                         int N, int V, float grad_scale, float softcap, int nblocks)
{
    __shared__ float shm_m[32];
    __shared__ double shm_s[32];
    int b = blockIdx.x;
    int n0 = (int)((long)N * b / nblocks), n1 = (int)((long)N * (b + 1) / nblocks);
    int groups = V / W;
    double acc = 0.0;
    for (int n = n0; n < n1; n++) {
        size_t row = (size_t)n * V;
        int t = targets[n];
        if (t == CE_IGNORE) {
            if (dlogits.p) {
                const float zero[W] = {};
                for (int g = threadIdx.x; g < groups; g += blockDim.x)
                    store_group<W>(dlogits, row + (size_t)g * W, zero);
            }
            continue;
        }
        float xt = threadIdx.x == 0 ? ld(logits, row + t) : 0.0f;
        float m = -FLT_MAX; /* not -inf: exp(x - m) of an all -inf group stays 0 */
        double s = 0.0;
#pragma unroll 4
        for (int g = threadIdx.x; g < groups; g += blockDim.x) {
            float x[W];
            load_group<W>(logits, row + (size_t)g * W, x);
            online_add<W>(m, s, x);
        }
        block_online(m, s, shm_m, shm_s);
        if (dlogits.p) {
            float k = (float)(grad_scale / s);
#pragma unroll 2
            for (int g = threadIdx.x; g < groups; g += blockDim.x) {
                size_t j0 = (size_t)g * W;
                float z[W], d[W];
                load_group<W>(logits, row + j0, z);
                for (int i = 0; i < W; i++) {
                    float di = __fmul_rn(expf(z[i] - m), k);
                    di = (int)j0 + i == t ? di - grad_scale : di;
                    if (softcap > 0.0f) {
                        float u = z[i] / softcap;
                        di *= 1.0f - u * u;
                    }
                    d[i] = di;
                }
                store_group<W>(dlogits, row + j0, d);
            }
        }
        if (threadIdx.x == 0)
            acc += ((double)m - (double)xt) + log(s);
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
    int nblocks = N < CE_MAX_BLOCKS ? N : CE_MAX_BLOCKS;
    fview dl = fv(dlogits), lg = fv(logits);
    const int32_t *tg = (const int32_t *)targets.data;
    bool vec = vec8_ok((size_t)V, lg.p, dl.p);
    if (vec)
        FT_LAUNCH(cross_entropy_kernel<CE_VEC>, nblocks, CE_THREADS, 0, s)(
            partial, dl, lg, tg, N, V, grad_scale, softcap, nblocks);
    else
        FT_LAUNCH(cross_entropy_kernel<1>, nblocks, CE_THREADS, 0, s)(
            partial, dl, lg, tg, N, V, grad_scale, softcap, nblocks);
    LAUNCH_CHECK();
    return ft_cuda_sum_partials(partial, nblocks);
}
