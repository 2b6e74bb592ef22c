/* Helpers of the CUDA op tests (tests/gpu/test_cuda_*.c): each test draws random fp32
 * inputs on the host, runs the CPU op (the reference) and the CUDA op on copies, reads
 * the result back and compares.
 *
 * For a bf16 run the host inputs are first rounded to bf16 (round-to-nearest-even, as
 * the device does), so the CPU reference sees exactly the values the GPU sees and the
 * comparison measures the op's own error: its bf16 output rounding and fp32-vs-CPU
 * summation order, not the input quantization.
 *
 * The measure is normwise: max_i |got_i - ref_i| / max_i |ref_i| (a relative error
 * scaled by the largest reference value, so elements near 0 do not blow it up). A NaN
 * or inf anywhere in the result fails whatever the tolerance. Each comparison prints its
 * figure, so the log records how close every op came. */
#ifndef FT_GPU_CHECK_H
#define FT_GPU_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops.h"

#include <cuda_runtime.h>

#define TOL_F32 1e-5
#define TOL_BF16 1e-2

static uint64_t gpu_rng_state = 0x2545f4914f6cdd1dULL;

static inline void gpu_seed(uint64_t s)
{
    gpu_rng_state = s * 0x9e3779b97f4a7c15ULL + 1;
}

/* Uniform in [-1, 1). */
static inline float gpu_uniform(void)
{
    gpu_rng_state ^= gpu_rng_state << 13;
    gpu_rng_state ^= gpu_rng_state >> 7;
    gpu_rng_state ^= gpu_rng_state << 17;
    return (float)((gpu_rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* FT_GPU_TEST_SMALL=1 (the emulated device's tier, make test-gpu-emu): the tests that
 * take real-size shapes take small ones of the same kind instead, every check kept, so
 * that a host emulating the GPU runs them in seconds. */
static inline int gpu_test_small(void)
{
    const char *e = getenv("FT_GPU_TEST_SMALL");
    return e && *e && strcmp(e, "0") != 0;
}

static inline float *host_alloc(size_t n)
{
    float *p = (float *)calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "out of host memory (%zu floats)\n", n);
        exit(2);
    }
    return p;
}

/* n random values in [-scale, scale). */
static inline float *host_random(size_t n, float scale)
{
    float *p = host_alloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = scale * gpu_uniform();
    return p;
}

static inline float *host_copy(const float *src, size_t n)
{
    float *p = host_alloc(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* fp32 -> bf16 bits, round to nearest even (NaN kept a NaN). */
static inline uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rounds x[0..n) to bf16 values in place when dtype is FT_BF16. */
static inline void host_round(float *x, size_t n, ft_dtype dtype)
{
    if (dtype == FT_BF16)
        for (size_t i = 0; i < n; i++)
            x[i] = bf16_value(bf16_bits(x[i]));
}

static inline void gpu_fail_cuda(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(rc));
        exit(2);
    }
}

/* A device copy of host[0..n) stored as dtype (FT_F32 or FT_BF16). */
static inline ft_tensor dev_upload(const float *host, size_t n, ft_dtype dtype)
{
    size_t es = dtype == FT_BF16 ? 2 : 4;
    void *d = NULL;
    gpu_fail_cuda(cudaMalloc(&d, n * es + 16), "cudaMalloc");
    if (dtype == FT_BF16) {
        uint16_t *tmp = (uint16_t *)malloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++)
            tmp[i] = bf16_bits(host[i]);
        gpu_fail_cuda(cudaMemcpy(d, tmp, n * 2, cudaMemcpyHostToDevice), "upload");
        free(tmp);
    } else {
        gpu_fail_cuda(cudaMemcpy(d, host, n * 4, cudaMemcpyHostToDevice), "upload");
    }
    return ft_view(d, n, dtype, FT_DEV_CUDA);
}

/* A device copy of raw bytes (ids, quantized codes) viewed as dtype. */
static inline ft_tensor dev_upload_raw(const void *host, size_t n, size_t esize,
                                       ft_dtype dtype)
{
    void *d = NULL;
    gpu_fail_cuda(cudaMalloc(&d, n * esize + 16), "cudaMalloc");
    gpu_fail_cuda(cudaMemcpy(d, host, n * esize, cudaMemcpyHostToDevice), "upload");
    return ft_view(d, n, dtype, FT_DEV_CUDA);
}

/* The device tensor as fp32 host values (a new buffer). Waits for the device. */
static inline float *dev_download(ft_tensor t)
{
    float *h = host_alloc(t.numel);
    gpu_fail_cuda(cudaDeviceSynchronize(), "kernel");
    if (t.dtype == FT_BF16) {
        uint16_t *tmp = (uint16_t *)malloc(t.numel * 2 + 2);
        gpu_fail_cuda(cudaMemcpy(tmp, t.data, t.numel * 2, cudaMemcpyDeviceToHost),
                      "download");
        for (size_t i = 0; i < t.numel; i++)
            h[i] = bf16_value(tmp[i]);
        free(tmp);
    } else {
        gpu_fail_cuda(cudaMemcpy(h, t.data, t.numel * 4, cudaMemcpyDeviceToHost),
                      "download");
    }
    return h;
}

static inline void dev_free(ft_tensor t)
{
    if (t.data)
        cudaFree(t.data);
}

/* Are two device tensors bitwise equal (a rerun of a deterministic op)? */
static inline int dev_equal(ft_tensor a, ft_tensor b)
{
    size_t es = a.dtype == FT_BF16 ? 2 : 4, bytes = a.numel * es;
    unsigned char *ha = (unsigned char *)malloc(bytes + 1), *hb = (unsigned char *)malloc(bytes + 1);
    gpu_fail_cuda(cudaDeviceSynchronize(), "kernel");
    gpu_fail_cuda(cudaMemcpy(ha, a.data, bytes, cudaMemcpyDeviceToHost), "download");
    gpu_fail_cuda(cudaMemcpy(hb, b.data, bytes, cudaMemcpyDeviceToHost), "download");
    int eq = a.numel == b.numel && memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return eq;
}

static inline const char *dtype_name(ft_dtype d)
{
    return d == FT_BF16 ? "bf16" : "f32";
}

static inline double tol_for(ft_dtype d)
{
    return d == FT_BF16 ? TOL_BF16 : TOL_F32;
}

/* Normwise relative error of got against ref; -1 when got holds a NaN or inf. */
static inline double rel_error(const float *got, const float *ref, size_t n)
{
    double maxdiff = 0, maxref = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return -1;
        double d = fabs((double)got[i] - ref[i]);
        if (d > maxdiff)
            maxdiff = d;
        if (fabs(ref[i]) > maxref)
            maxref = fabs(ref[i]);
    }
    return maxref > 0 ? maxdiff / maxref : maxdiff;
}

/* Compares, prints "  what: rel err E (tol T)" and records a failure. */
#define CHECK_REL(what, got, ref, n, tol)                                              \
    do {                                                                               \
        double e_ = rel_error((got), (ref), (n));                                      \
        printf("  %-48s rel err %.3g (tol %.0e)%s\n", (what), e_, (double)(tol),      \
               e_ < 0 ? "  NON-FINITE" : e_ > (tol) ? "  FAIL" : "");                 \
        if (e_ < 0 || e_ > (tol)) {                                                    \
            fprintf(stderr, "  %s:%d: %s: rel err %.3g > %.0e\n", __FILE__, __LINE__,   \
                    (what), e_, (double)(tol));                                        \
            check_current_failed = 1;                                                  \
        }                                                                              \
    } while (0)

/* Downloads t and compares it with ref, then frees the host copy. */
static inline void check_dev(const char *what, ft_tensor t, const float *ref, double tol)
{
    float *got = dev_download(t);
    CHECK_REL(what, got, ref, t.numel, tol);
    free(got);
}

#endif
