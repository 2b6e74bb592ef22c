/* Elementwise helpers over flat fp32 ranges [n], CPU reference.
 *
 *   add:   y += x          copy:  y = x          zero:  y = 0
 *   scale: x *= s          sumsq: sum_i x_i^2, accumulated in double (global grad norm)
 *   softcap: x = cap * tanh(x / cap) (divided, then multiplied, as transformers does)
 *
 * These are memory-bound; OpenMP splits them across threads only when n is large enough
 * to pay for the fork. sumsq must give the same bits whatever the thread count (the grad
 * norm feeds clipping, and a resumed run must repeat its steps exactly): the range is cut
 * into SUMSQ_BLOCKS fixed contiguous pieces, each summed on its own (vectorised within
 * the piece, in a fixed lane order), and the piece sums are added in order. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "cpu_parallel.h"

#define PAR_MIN FT_PAR_MIN_PASS
#define SUMSQ_BLOCKS 64

void ft_cpu_add(float *y, const float *x, size_t n)
{
    long len = (long)n;
#pragma omp parallel for simd schedule(static) if (len >= PAR_MIN)
    for (long i = 0; i < len; i++)
        y[i] += x[i];
}

void ft_cpu_copy(float *y, const float *x, size_t n)
{
    if (n == 0 || y == x)
        return;
    /* Overlapping views (not expected, but harmless to allow) go through memmove. */
    if (n < PAR_MIN || (y < x + n && x < y + n)) {
        memmove(y, x, n * sizeof(float));
        return;
    }
    int nblocks = 16;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < nblocks; b++) {
        size_t i0 = n * (size_t)b / nblocks, i1 = n * (size_t)(b + 1) / nblocks;
        memcpy(y + i0, x + i0, (i1 - i0) * sizeof(float));
    }
}

void ft_cpu_zero(float *y, size_t n)
{
    if (n == 0)
        return;
    if (n < PAR_MIN) {
        memset(y, 0, n * sizeof(float));
        return;
    }
    int nblocks = 16;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < nblocks; b++) {
        size_t i0 = n * (size_t)b / nblocks, i1 = n * (size_t)(b + 1) / nblocks;
        memset(y + i0, 0, (i1 - i0) * sizeof(float));
    }
}

double ft_cpu_sumsq(const float *x, size_t n)
{
    if (n == 0)
        return 0.0;
    int nblocks = n < SUMSQ_BLOCKS ? (int)n : SUMSQ_BLOCKS;
    double partial[SUMSQ_BLOCKS];
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int b = 0; b < nblocks; b++) {
        long i0 = (long)(n * (size_t)b / nblocks), i1 = (long)(n * (size_t)(b + 1) / nblocks);
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (long i = i0; i < i1; i++)
            acc += (double)x[i] * x[i];
        partial[b] = acc;
    }
    double s = 0.0;
    for (int b = 0; b < nblocks; b++)
        s += partial[b];
    return s;
}

void ft_cpu_softcap(float *x, float cap, size_t n)
{
    long len = (long)n;
#pragma omp parallel for schedule(static) if (len >= PAR_MIN)
    for (long i = 0; i < len; i++)
        x[i] = tanhf(x[i] / cap) * cap;
}

void ft_cpu_scale(float *x, float s, size_t n)
{
    long len = (long)n;
#pragma omp parallel for simd schedule(static) if (len >= PAR_MIN)
    for (long i = 0; i < len; i++)
        x[i] *= s;
}
