/* The CPU kernels' GEMM outside their own parallel loops: one block of C per thread.
 *
 * OpenBLAS's OpenMP build threads a GEMM itself: its threads share the packed panels of
 * one operand, so each waits for the others' packing in a sched_yield loop
 * (driver/level3/level3_thread.c). Where the threads do not all hold a core (a machine
 * shared with other work, or more runnable threads than cores) that waiting costs CPU
 * time, and on the LoRA products, whose one side is the rank (16), its split ran at
 * 22-36 GFLOP/s a core. Cut here instead, C's larger side into one block per thread,
 * each block a single-threaded GEMM (OpenBLAS runs a call made inside a parallel region
 * on the calling thread), the threads never wait for each other before the region's end:
 * measured on a 2-core AVX-512 Xeon, a SmolLM-shaped LoRA step took 4 to 5 % less CPU
 * time, its LoRA products 38-90 GFLOP/s. Each thread packs its part of the larger
 * operand and all of the smaller one.
 *
 * Same bits on any thread count: every element of C is computed by the same kernel with
 * the same blocking of K (OpenBLAS cuts K by K alone) whichever block holds it, as long as
 * no block takes one of OpenBLAS's paths for small products, which sum in another order:
 * the small-matrix kernels (SkylakeX: M N K <= 100^3) and the direct one (row-major NN,
 * alpha 1, beta 0, up to 28 * 512^2, with a threshold that depends on the threads
 * available). So a block has at least PART_MIN multiply-adds, and a product that could
 * take the direct path is never cut. (tests/unit/test_threading.c compares 1, 2 and 3
 * threads bit for bit on the model's shapes.)
 *
 * Small products (under SPLIT_MIN multiply-adds, a few hundred microseconds on one
 * thread: LoRA's rank-16 products) run whole on the calling thread: a parallel region
 * costs more to start than it saves there (cpu_parallel.h), and so does OpenBLAS's own
 * threading, which would open one. OpenBLAS's OpenMP build threads a call by
 * omp_get_max_threads() (its num_cpu_avail), so the calling thread's limit is set to 1
 * for the call.
 *
 * Groups (ft_cpu_sgemm_phases): independent GEMMs, and the GEMMs that depend on them in a
 * later phase, share one region, their blocks handed to the threads as each comes free
 * (a LoRA layer's base product and its rank-16 products: kernels/cpu/lora_linear.c). A
 * product cut by the threads is cut as above; a `fixed` one, into blocks by its shape
 * alone, so the small products that run whole above are shared out too with the same
 * bits on any thread count (a block may take a small-product path: it does on every
 * thread count alike). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "cpu_gemm.h"

/* The fewest multiply-adds of one block: twice the largest small-matrix product. */
#define PART_MIN (1L << 21)
/* The fewest multiply-adds of a product that is cut into blocks. */
#define SPLIT_MIN (1L << 24)
/* Block boundaries are multiples of ALIGN rows or columns (OpenBLAS's SkylakeX sgemm
 * works on 16 x 4 tiles of C). */
#define ALIGN 16

static void sgemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                   int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* One GEMM on the calling thread alone. */
static void sgemm1_serial(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                          int lda, const float *B, int ldb, float beta, float *C, int ldc)
{
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    sgemm1(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    omp_set_num_threads(threads);
}

/* OpenBLAS's direct path (row-major NN, alpha 1, beta 0) may take a product, or not, by
 * its shape and the threads it has: such a product is never cut. */
static bool direct_candidate(bool ta, bool tb, float alpha, float beta)
{
    return !ta && !tb && alpha == 1.0f && beta == 0.0f;
}

/* The blocks of a product of `macs` multiply-adds cut by the threads: as many as there are
 * threads, each of at least PART_MIN multiply-adds and ALIGN rows or columns of its
 * larger side; 1 where it is not cut. */
static int thread_parts(long macs, int M, int N)
{
    long parts = macs / PART_MIN, side = (M >= N ? M : N) / ALIGN;
    int threads = omp_get_max_threads();
    parts = parts < threads ? parts : threads;
    parts = parts < side ? parts : side;
    return parts > 1 ? (int)parts : 1;
}

/* How many blocks to cut a product into: 1 where it is one GEMM (threaded by OpenBLAS
 * as it chooses), 0 where it runs on the calling thread alone. */
static int gemm_parts(bool ta, bool tb, int M, int N, int K, float alpha, float beta)
{
    if (omp_in_parallel() || direct_candidate(ta, tb, alpha, beta))
        return 1;
    if ((long)M * N * K < SPLIT_MIN)
        return 0;
    return thread_parts((long)M * N * K, M, N);
}

/* Block p of parts of g: rows i0..i1 of C (A's rows, or with ta its columns) or columns
 * i0..i1 (B's columns, or with tb its rows), on the calling thread. */
static void gemm_block(const ft_gemm *g, int p, int parts)
{
    int len = g->rows ? g->M : g->N;
    int i0 = (int)((long)len * p / parts) / ALIGN * ALIGN;
    int i1 = p == parts - 1 ? len : (int)((long)len * (p + 1) / parts) / ALIGN * ALIGN;
    if (i1 <= i0)
        return;
    if (g->rows)
        sgemm1(g->ta, g->tb, i1 - i0, g->N, g->K, g->alpha,
               g->A + (g->ta ? (size_t)i0 : (size_t)i0 * g->lda), g->lda, g->B, g->ldb,
               g->beta, g->C + (size_t)i0 * g->ldc, g->ldc);
    else
        sgemm1(g->ta, g->tb, g->M, i1 - i0, g->K, g->alpha, g->A, g->lda,
               g->B + (g->tb ? (size_t)i0 * g->ldb : (size_t)i0), g->ldb, g->beta, g->C + i0,
               g->ldc);
}

void ft_cpu_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C,
                  int ldc)
{
    if (M <= 0 || N <= 0)
        return;
    int parts = gemm_parts(trans_a, trans_b, M, N, K, alpha, beta);
    if (parts == 0) {
        sgemm1_serial(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (parts == 1) {
        sgemm1(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    ft_gemm g = {trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, false,
                 M >= N /* cut C's rows (A's) or its columns (B's) */, 0};
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int p = 0; p < parts; p++)
        gemm_block(&g, p, parts);
}

/* The blocks of a GEMM of a group: a product cut by the threads as ft_cpu_sgemm cuts it
 * (one block where it would run whole); a `fixed` one into blocks of at least PART_MIN
 * multiply-adds, at most FIXED_MAX, by its shape alone. */
#define FIXED_MAX 8

static int group_parts(const ft_gemm *g)
{
    long macs = (long)g->M * g->N * g->K;
    if (!g->fixed)
        return direct_candidate(g->ta, g->tb, g->alpha, g->beta) || macs < SPLIT_MIN
                   ? 1
                   : thread_parts(macs, g->M, g->N);
    long parts = macs / PART_MIN, side = (g->rows ? g->M : g->N) / ALIGN;
    parts = parts < FIXED_MAX ? parts : FIXED_MAX;
    parts = parts < side ? parts : side;
    return parts > 1 ? (int)parts : 1;
}

void ft_cpu_sgemm_phases(ft_gemm *g, const int *phase_len, int phases)
{
    int total = 0, blocks[FT_GEMM_GROUP_MAX + 1] = {0}, n = 0;
    for (int ph = 0; ph < phases; ph++)
        n += phase_len[ph];
    if (n > FT_GEMM_GROUP_MAX) { /* a caller's bug: its groups are fixed and smaller */
        fprintf(stderr, "ft_cpu_sgemm_phases: %d GEMMs, over %d\n", n, FT_GEMM_GROUP_MAX);
        abort();
    }
    for (int j = 0; j < n; j++) {
        g[j].rows = g[j].M >= g[j].N;
        g[j].parts = g[j].M > 0 && g[j].N > 0 ? group_parts(&g[j]) : 0;
        blocks[j + 1] = blocks[j] + g[j].parts;
        total += g[j].parts;
    }
    int threads = omp_get_max_threads();
    bool par = total > 1 && threads > 1 && !omp_in_parallel();
    if (!par)
        omp_set_num_threads(1); /* OpenBLAS runs each block on this thread alone */
#pragma omp parallel if (par)
    {
        int first = 0;
        for (int ph = 0; ph < phases; ph++) {
            int last = first + phase_len[ph] < n ? first + phase_len[ph] : n;
            /* the blocks of this phase's GEMMs, in order; the implicit barrier at the
             * loop's end keeps the next phase from reading C before it is written */
#pragma omp for schedule(dynamic, 1)
            for (int b = blocks[first]; b < blocks[last]; b++) {
                int j = first;
                while (blocks[j + 1] <= b)
                    j++;
                gemm_block(&g[j], b - blocks[j], g[j].parts);
            }
            first = last;
        }
    }
    if (!par)
        omp_set_num_threads(threads);
}
