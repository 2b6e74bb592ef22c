/* Deterministic column sums on the GPU, parallel over rows and columns:
 *   dst[c] += sum_{n < N} term(n, c)        over an N x C row-major operand
 * for the bias gradient (term = dy, linear.cu) and RMSNorm's weight gradient (term =
 * dout x rstd, rmsnorm_kernels.cuh). Two passes, a fixed order, no atomics, so a run
 * repeats bit for bit:
 *   pass 1  grid (ceil(C / 32), chunks) of COLSUM_THREADS threads. Block (j, k) takes
 *           columns 32 j .. 32 j + 31 over the rows of chunk k, [k R, min(N, (k+1) R));
 *           lane l of warp w sums column 32 j + l over rows k R + w, + COLSUM_WARPS, ...
 *           in order (a warp reads one row's 32 contiguous columns at a time), then the
 *           warps' sums are added in warp order: partial[k, c]; with a single chunk that
 *           sum goes into dst[c] directly.
 *   pass 2  one thread a column: dst[c] += partial[0, c] + partial[1, c] + ... in chunk
 *           order (colsum_finish, colsum.cu).
 * The chunking (colsum_plan_for) depends on N and C only, never on the device, so the
 * bits are the same on any GPU. The partials live in the backend's scratch
 * (ft_cuda_scratch, cuda_context.cu; one op at a time, in stream order).
 * This header is also compiled by the host tests of tests/emu (after kernel_common.cuh). */
#ifndef FT_COLSUM_CUH
#define FT_COLSUM_CUH

#include <stddef.h>

#define COLSUM_COLS 32
#define COLSUM_WARPS 8
#define COLSUM_THREADS (32 * COLSUM_WARPS)
#define COLSUM_MIN_ROWS 64    /* rows a chunk at least: 8 per warp */
#define COLSUM_MAX_CHUNKS 256 /* bounds pass 2's serial sum */

struct colsum_plan {
    int rows;   /* R: rows per chunk (the last may have fewer) */
    int chunks; /* ceil(N / R), at least 1 */
};

/* As many chunks of at least COLSUM_MIN_ROWS rows as the partials' room (room floats:
 * chunks x C of them) and COLSUM_MAX_CHUNKS allow; one chunk (no partials) when there is
 * no room for two. */
static inline colsum_plan colsum_plan_for(int N, int C, size_t room)
{
    size_t cap = C > 0 ? room / (size_t)C : 1;
    cap = cap > COLSUM_MAX_CHUNKS ? COLSUM_MAX_CHUNKS : cap < 1 ? 1 : cap;
    size_t chunks = ((size_t)N + COLSUM_MIN_ROWS - 1) / COLSUM_MIN_ROWS;
    chunks = chunks > cap ? cap : chunks < 1 ? 1 : chunks;
    colsum_plan p;
    p.rows = (int)(((size_t)N + chunks - 1) / chunks);
    if (p.rows < 1)
        p.rows = 1;
    p.chunks = (int)(((size_t)N + p.rows - 1) / p.rows); /* no empty chunk */
    if (p.chunks < 1)
        p.chunks = 1;
    return p;
}

/* Pass 1's rows for this thread: n = first, first + COLSUM_WARPS, ... < end. */
__device__ __forceinline__ void colsum_rows(int N, int rows, int *first, int *end)
{
    int n0 = (int)blockIdx.y * rows;
    *first = n0 + (int)(threadIdx.x >> 5);
    *end = N < n0 + rows ? N : n0 + rows;
}

/* The block's column this thread sums (may be >= C: then it sums nothing but still
 * takes part in the block's barrier). */
__device__ __forceinline__ int colsum_column(void)
{
    return (int)blockIdx.x * COLSUM_COLS + (int)(threadIdx.x & 31);
}

/* End of pass 1: acc, this thread's sum, is added to the other warps' in warp order; the
 * result goes to partial[chunk, c], or into dst[c] when the grid has one chunk. Every
 * thread of the block must call it. shm: COLSUM_WARPS x COLSUM_COLS floats. */
__device__ __forceinline__ void colsum_store(float acc, float *shm, fview dst, float *partial,
                                             int C)
{
    int lane = (int)(threadIdx.x & 31), warp = (int)(threadIdx.x >> 5);
    int c = colsum_column();
    shm[warp * COLSUM_COLS + lane] = acc;
    __syncthreads();
    if (warp == 0 && c < C) {
        float s = shm[lane];
        for (int w = 1; w < COLSUM_WARPS; w++)
            s += shm[w * COLSUM_COLS + lane];
        if (gridDim.y == 1)
            st(dst, (size_t)c, ld(dst, (size_t)c) + s);
        else
            partial[(size_t)blockIdx.y * C + c] = s;
    }
}

/* Pass 2: dst[c] += partial[0, c] + ... + partial[chunks - 1, c], in that order, one
 * thread a column. (A template, so that each .cu file that launches it has its own.) */
struct colsum_args {
    fview dst;
    const float *partial;
    int chunks, C;
};

template <int = 0> __global__ void colsum_finish_kernel(colsum_args a)
{
    int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= a.C)
        return;
    float s = a.partial[c];
    for (int k = 1; k < a.chunks; k++)
        s += a.partial[(size_t)k * a.C + c];
    st(a.dst, (size_t)c, ld(a.dst, (size_t)c) + s);
}

#ifdef FT_LAUNCH /* the launches, in kernels/cuda (the host tests of tests/emu launch by hand) */
/* The partials' room in the backend's scratch, in floats. */
static inline float *colsum_partials(size_t *room)
{
    *room = FT_CUDA_SCRATCH_DOUBLES * (sizeof(double) / sizeof(float));
    return (float *)ft_cuda_scratch();
}

/* Pass 1's grid for plan p over C columns. */
static inline dim3 colsum_grid(colsum_plan p, int C)
{
    return dim3((unsigned)((C + COLSUM_COLS - 1) / COLSUM_COLS), (unsigned)p.chunks);
}

/* Pass 2, when pass 1 left partials (more than one chunk). */
static inline void colsum_finish(fview dst, const float *partial, colsum_plan p, int C,
                                 cudaStream_t s)
{
    if (p.chunks <= 1)
        return;
    colsum_args a = {dst, partial, p.chunks, C};
    FT_LAUNCH(colsum_finish_kernel<>, (unsigned)((C + 255) / 256), 256, 0, s)(a);
    LAUNCH_CHECK();
}
#endif

#endif
