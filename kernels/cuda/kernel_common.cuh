/* The device-side pieces every kernel uses: the typed operand view (fview, ld, st),
 * deterministic warp and block reductions, and FT_SHARED for a block's shared array
 * declared in a kernel body. Included by cuda_common.cuh after cuda_bf16.h, and by the
 * host emulation (tests/emu/cuda_emu.h) after its own bf16 type, barriers and shuffles;
 * the emulation runs a launch's blocks one at a time, so there such an array is a
 * static. */
#ifndef FT_KERNEL_COMMON_CUH
#define FT_KERNEL_COMMON_CUH

#ifdef FT_CUDA_EMU
#define FT_SHARED static
#else
#define FT_SHARED __shared__
#endif

/* A floating-point operand as a kernel sees it: the pointer and whether it holds fp32 or
 * bf16. The dtype is uniform across a launch, so the branch in ld/st never diverges. */
struct fview {
    void *p;
    int bf16;
};

static inline fview fv(ft_tensor t)
{
    fview v = {t.data, t.dtype == FT_BF16};
    return v;
}

__device__ __forceinline__ float ld(fview v, size_t i)
{
    return v.bf16 ? __bfloat162float(((const __nv_bfloat16 *)v.p)[i]) : ((const float *)v.p)[i];
}

/* Rounds to nearest-even when the operand is bf16. */
__device__ __forceinline__ void st(fview v, size_t i, float x)
{
    if (v.bf16)
        ((__nv_bfloat16 *)v.p)[i] = __float2bfloat16_rn(x);
    else
        ((float *)v.p)[i] = x;
}

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
