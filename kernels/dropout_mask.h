/* The counter-based dropout mask, shared by the CPU op (kernels/cpu/dropout.c, which
 * documents the generator) and its CUDA twin (kernels/cuda/dropout.cu), so both backends
 * drop exactly the same elements: one definition, compiled for the host and, under nvcc,
 * for the device. */
#ifndef FT_DROPOUT_MASK_H
#define FT_DROPOUT_MASK_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define FT_HOST_DEVICE __host__ __device__
#else
#define FT_HOST_DEVICE
#endif

#define FT_DROPOUT_GOLDEN 0x9e3779b97f4a7c15ULL

/* The splitmix64 finaliser. */
FT_HOST_DEVICE static inline uint64_t ft_dropout_mix64(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z;
}

/* The stream key of a seed. */
static inline uint64_t ft_dropout_key(uint64_t seed)
{
    return ft_dropout_mix64(seed + FT_DROPOUT_GOLDEN);
}

/* k = 1 / (1 - p), as torch computes it: 1 - p in double, rounded to float. */
static inline float ft_dropout_keep_scale(float p)
{
    return 1.0f / (float)(1.0 - (double)p);
}

/* ceil(p 2^24) for 0 < p < 1: p * 2^24 is exact in fp32. */
static inline uint64_t ft_dropout_threshold(float p)
{
    return (uint64_t)ceilf(p * 16777216.0f);
}

/* k if counter c is kept, else 0. */
FT_HOST_DEVICE static inline float ft_dropout_factor(uint64_t key, uint64_t c, uint64_t thr,
                                                     float k)
{
    return (ft_dropout_mix64(key + (c + 1) * FT_DROPOUT_GOLDEN) >> 40) >= thr ? k : 0.0f;
}

#endif
