/* The device-side pieces every kernel uses: the typed operand view (fview, ld, st),
 * deterministic warp and block reductions, and the block's dynamic shared memory
 * (FT_DYNAMIC_SHARED). Included by cuda_common.cuh after cuda_bf16.h, and by the host
 * tests of tests/emu (cuda_emu.h); in the emulated build (FT_CUDA_EMU: make CUDA=emu and
 * tests/emu) the CUDA pieces come from tests/emu/include, and ld() checks what it loads. */
#ifndef FT_KERNEL_COMMON_CUH
#define FT_KERNEL_COMMON_CUH

/* `type name[]`: the block's dynamic shared memory, the launch's smem bytes. The emulation
 * has no extern __shared__: there it is a pointer to the running block's buffer. */
#ifdef FT_CUDA_EMU
#define FT_DYNAMIC_SHARED(type, name) type *const name = (type *)::ft_emu::dynamic_shared(NULL)
#else
#define FT_DYNAMIC_SHARED(type, name) extern __shared__ __align__(128) type name[]
#endif

/* The emulation stops the run when ld() loads the all-ones pattern of device memory that
 * was never written (tests/emu/include/ft_emu_kernel.h); nothing under nvcc. */
#ifdef FT_CUDA_EMU
#define FT_CHECK_LOAD(p, bytes) ft_emu_check_load((p), (bytes))
#else
#define FT_CHECK_LOAD(p, bytes) ((void)0)
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
    if (v.bf16) {
        const __nv_bfloat16 *p = (const __nv_bfloat16 *)v.p + i;
        FT_CHECK_LOAD(p, 2);
        return __bfloat162float(*p);
    }
    const float *p = (const float *)v.p + i;
    FT_CHECK_LOAD(p, 4);
    return *p;
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
