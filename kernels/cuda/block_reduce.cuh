/* Deterministic warp and block reductions of the CUDA kernels, and FT_SHARED for a
 * block's shared array declared in a kernel body. Included by cuda_common.cuh, and by the
 * host emulation (tests/emu/cuda_emu.h), which runs a launch's blocks one at a time and
 * so makes such an array a static. */
#ifndef FT_BLOCK_REDUCE_CUH
#define FT_BLOCK_REDUCE_CUH

#ifdef FT_CUDA_EMU
#define FT_SHARED static
#else
#define FT_SHARED __shared__
#endif

/* Sum over the 32 lanes of a warp, every lane gets the result: a butterfly, the same
 * order on every call. */
template <typename T> __device__ __forceinline__ T warp_sum(T x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread
 * gets the result. shm holds 32 T. Fixed order: lanes, then warps in index order. */
template <typename T> __device__ T block_sum(T x, T *shm)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_sum(x);
    __syncthreads(); /* shm may still be read by a previous call */
    if (lane == 0)
        shm[warp] = x;
    __syncthreads();
    T s = 0;
    for (int w = 0; w < nwarps; w++)
        s += shm[w];
    return s;
}

__device__ __forceinline__ float block_max(float x, float *shm)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0)
        shm[warp] = x;
    __syncthreads();
    float m = shm[0];
    for (int w = 1; w < nwarps; w++)
        m = fmaxf(m, shm[w]);
    return m;
}

#endif
