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

#endif
