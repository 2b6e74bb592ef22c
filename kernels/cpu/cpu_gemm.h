/* The CPU kernels' GEMM outside their own parallel loops (cpu_gemm.c). */
#ifndef FT_CPU_GEMM_H
#define FT_CPU_GEMM_H

#include <stdbool.h>

/* Row-major C[M,N] = alpha op(A) op(B) + beta C, op(X) = X^T where trans_x, with the
 * leading dimensions of cblas_sgemm. Large products are cut into one block of C per
 * thread, each a single-threaded GEMM (cpu_gemm.c says why and when); every element of
 * C gets the same bits whatever the thread count. Inside a parallel region it is one
 * GEMM on the calling thread. */
void ft_cpu_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C,
                  int ldc);

/* One GEMM of a group run by ft_cpu_sgemm_phases: C[M,N] = alpha op(A) op(B) + beta C as
 * above. fixed: cut into blocks by its shape alone (small products, whose blocks would
 * otherwise depend on the thread count); else cut as ft_cpu_sgemm cuts it. `rows` and
 * `parts` are the runner's. */
typedef struct ft_gemm {
    bool ta, tb;
    int M, N, K;
    float alpha;
    const float *A;
    int lda;
    const float *B;
    int ldb;
    float beta;
    float *C;
    int ldc;
    bool fixed;
    bool rows;
    int parts;
} ft_gemm;

#define FT_GEMM_GROUP_MAX 16

/* GEMMs g[0..] in phases, in one parallel region: phase k is the next phase_len[k] of
 * them, independent of each other (no C of one is an operand or the C of another), run
 * after every GEMM of the phases before it. Their blocks are shared out among the
 * threads as each comes free; each block is a single-threaded GEMM, so every element
 * gets the same bits on any thread count. At most FT_GEMM_GROUP_MAX GEMMs. */
void ft_cpu_sgemm_phases(ft_gemm *g, const int *phase_len, int phases);

#endif
