/* Linear layer on the GPU: the GEMMs in cuBLAS (cublasGemmEx, fp32 accumulation), the
 * bias in small kernels. Same math as kernels/cpu/linear.c:
 *   forward:  y[N,out] = alpha x[N,in] w[out,in]^T + b   (accumulate: y += ...)
 *   backward: dx += alpha dy w;  dw += alpha dy^T x;  db += sum_n dy[n,:]
 *
 * Layout. cuBLAS is column-major; a row-major [R,C] buffer is the column-major [C,R]
 * matrix, its transpose. Reading every buffer that way (x^T is [in,N], w^T [in,out]):
 *   y^T  [out,N]   = (w^T)^T x^T     -> gemm(T, N, m=out, n=N,   k=in)
 *   dx^T [in,N]   += w^T dy^T        -> gemm(N, N, m=in,  n=N,   k=out)
 *   dw^T [in,out] += x^T (dy^T)^T    -> gemm(N, T, m=in,  n=out, k=N)
 * (the same three calls as llm.c's matmul_forward/backward).
 *
 * dtypes: A and B of a GEMM share one dtype (bf16 or fp32); C is fp32 or, with bf16
 * inputs, bf16; compute is CUBLAS_COMPUTE_32F without TF32, so the fp32 path is plain
 * fp32 arithmetic. With beta = 1 cuBLAS reads C in its own dtype and accumulates in fp32.
 *
 * The bias is written into y before the GEMM (which then runs with beta = 1), as on the
 * CPU. db is a column sum in two passes over row chunks (colsum.cuh: a fixed order, no
 * atomics, so it is the same on every run). */
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "colsum.cuh"

static cudaDataType_t cuda_type(ft_tensor t)
{
    return t.dtype == FT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Split-K. A product whose output is a few tiles and whose reduction is long (a LoRA
 * pair's weight gradients: dB [2048, 16] and dA [16, 2048] over 8192 token rows) keeps as
 * many of the GPU's multiprocessors busy as it has tiles, each streaming the whole
 * reduction: on an H200, dB of N=8192 in=16 out=2048 took 472 us, 1 TFLOP/s, where its 33
 * MB of dy take 10 us to read (bench/results/nvidia-h200.md). Such a product is cut along
 * k into `parts` spans of the same length (a multiple of 8), one product each of a strided
 * batch, written to the split-K scratch (cuda_context.cu) with beta 0, and the remainder
 * of k as one more; splitk_reduce_kernel then adds them onto C in a fixed order, so a run
 * gives the same bits every time. */
#define SPLITK_TILE 128     /* the side of a tile of C, for counting them */
#define SPLITK_MIN_SPAN 1024 /* the shortest span of k a part gets */

/* Split-K where it applies, unless FT_CUDA_SPLITK=0 (one GEMM whole, as before it). */
static bool splitk_enabled(void)
{
    const char *e = getenv("FT_CUDA_SPLITK");
    return !e || strcmp(e, "0") != 0;
}

static int splitk_parts(int m, int n, int k)
{
    static const bool enabled = splitk_enabled();
    int sms = enabled ? ft_cuda_sm_count() : 0;
    long tiles = (long)((m + SPLITK_TILE - 1) / SPLITK_TILE) * ((n + SPLITK_TILE - 1) / SPLITK_TILE);
    if (sms <= 0 || tiles * 2 > sms || k < 2 * SPLITK_MIN_SPAN)
        return 1;
    long parts = (2L * sms + tiles - 1) / tiles; /* about two CTAs a multiprocessor */
    long most = (long)(FT_CUDA_SPLITK_FLOATS / ((size_t)m * (size_t)n)) - 1; /* + remainder */
    parts = parts < k / SPLITK_MIN_SPAN ? parts : k / SPLITK_MIN_SPAN;
    parts = parts < most ? parts : most;
    return parts > 1 ? (int)parts : 1;
}

/* C[i + j ldc] = beta C[...] + sum_p partial[p][i + j m], p in order */
__global__ void splitk_reduce_kernel(fview C, const float *partial, int m, int n, int ldc,
                                     int parts, float beta)
{
    size_t mn = (size_t)m * n;
    GRID_STRIDE(e, mn)
    {
        float s = partial[e];
        for (int p = 1; p < parts; p++)
            s += partial[(size_t)p * mn + e];
        size_t i = e % (size_t)m, j = e / (size_t)m, c = i + j * (size_t)ldc;
        st(C, c, beta == 0.0f ? s : beta * ld(C, c) + s);
    }
}

/* The element offset of k-span position `at` in an operand stored with leading dimension
 * ld: along the columns of a non-transposed A (m x k), the rows of a transposed one (k x
 * m); the rows of a non-transposed B (k x n), the columns of a transposed one (n x k). */
static size_t k_offset(bool k_is_column, int at, int ld)
{
    return k_is_column ? (size_t)at * (size_t)ld : (size_t)at;
}

static void *elem(ft_tensor t, size_t i)
{
    return (char *)t.data + i * (t.dtype == FT_BF16 ? 2 : 4);
}

/* C[m,n] (col-major, ldc) = alpha op(A) op(B) + beta C */
static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                 ft_tensor A, int lda, ft_tensor B, int ldb, float beta, ft_tensor C, int ldc)
{
    int parts = splitk_parts(m, n, k);
    if (parts == 1) {
        CUBLAS_CHECK(cublasGemmEx(ft_cuda_cublas(), ta, tb, m, n, k, &alpha, A.data,
                                  cuda_type(A), lda, B.data, cuda_type(B), ldb, &beta, C.data,
                                  cuda_type(C), ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    bool a_col = ta == CUBLAS_OP_N, b_col = tb != CUBLAS_OP_N;
    int span = k / parts / 8 * 8, rest = k - parts * span;
    float *partial = ft_cuda_splitk_scratch(), zero = 0.0f;
    long long mn = (long long)m * n;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        ft_cuda_cublas(), ta, tb, m, n, span, &alpha, A.data, cuda_type(A), lda,
        (long long)k_offset(a_col, span, lda), B.data, cuda_type(B), ldb,
        (long long)k_offset(b_col, span, ldb), &zero, partial, CUDA_R_32F, m, mn, parts,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (rest > 0) {
        size_t at = (size_t)parts * (size_t)span;
        CUBLAS_CHECK(cublasGemmEx(ft_cuda_cublas(), ta, tb, m, n, rest, &alpha,
                                  elem(A, k_offset(a_col, (int)at, lda)), cuda_type(A), lda,
                                  elem(B, k_offset(b_col, (int)at, ldb)), cuda_type(B), ldb,
                                  &zero, partial + (size_t)parts * (size_t)mn, CUDA_R_32F, m,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        parts++;
    }
    FT_LAUNCH(splitk_reduce_kernel, grid_for((size_t)mn, 256), 256, 0, ft_cuda_stream())(
        fv(C), partial, m, n, ldc, parts, beta);
    LAUNCH_CHECK();
}

/* y[n, o] = b[o] (accumulate 0) or y[n, o] += b[o] (accumulate 1) */
__global__ void bias_kernel(fview y, fview b, size_t N, int out, int accumulate)
{
    GRID_STRIDE(i, N * (size_t)out)
    {
        float bias = ld(b, i % (size_t)out);
        st(y, i, accumulate ? ld(y, i) + bias : bias);
    }
}

__global__ void fill_zero_kernel(fview y, size_t n)
{
    GRID_STRIDE(i, n)
    st(y, i, 0.0f);
}

/* db[o] += sum_n dy[n, o]: pass 1 of the column sum (colsum.cuh), rows chunk by chunk. */
__global__ void bias_grad_kernel(fview db, fview dy, float *partial, int N, int out, int rows)
{
    __shared__ float shm[COLSUM_WARPS * COLSUM_COLS];
    int o = colsum_column(), n, end;
    colsum_rows(N, rows, &n, &end);
    float acc = 0.0f;
    if (o < out)
        for (; n < end; n += COLSUM_WARPS)
            acc += ld(dy, (size_t)n * out + o);
    colsum_store(acc, shm, db, partial, out);
}

extern "C" void ft_cuda_linear_forward(ft_tensor y, ft_tensor x, ft_tensor w, ft_tensor b,
                                       int N, int in, int out, float alpha, int accumulate)
{
    if (N <= 0 || out <= 0)
        return;
    cudaStream_t s = ft_cuda_stream();
    float beta = accumulate ? 1.0f : 0.0f;
    size_t ny = (size_t)N * out;
    if (b.data) {
        FT_LAUNCH(bias_kernel, grid_for(ny, 256), 256, 0, s)(fv(y), fv(b), (size_t)N, out,
                                                             accumulate);
        LAUNCH_CHECK();
        beta = 1.0f;
    }
    if (in <= 0) {
        /* An empty reduction: y is the bias, or keeps its value. */
        if (beta == 0.0f) {
            FT_LAUNCH(fill_zero_kernel, grid_for(ny, 256), 256, 0, s)(fv(y), ny);
            LAUNCH_CHECK();
        }
        return;
    }
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, N, in, alpha, w, in, x, in, beta, y, out);
}

extern "C" void ft_cuda_linear_backward(ft_tensor dx, ft_tensor dw, ft_tensor db,
                                        ft_tensor dy, ft_tensor x, ft_tensor w, int N, int in,
                                        int out, float alpha)
{
    if (N <= 0 || out <= 0)
        return;
    if (in > 0 && dx.data)
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, N, out, alpha, w, in, dy, out, 1.0f, dx, in);
    if (in > 0 && dw.data)
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, out, N, alpha, x, in, dy, out, 1.0f, dw, in);
    if (db.data) {
        size_t room;
        float *partial = colsum_partials(&room);
        colsum_plan p = colsum_plan_for(N, out, room);
        cudaStream_t s = ft_cuda_stream();
        FT_LAUNCH(bias_grad_kernel, colsum_grid(p, out), COLSUM_THREADS, 0, s)(
            fv(db), fv(dy), partial, N, out, p.rows);
        LAUNCH_CHECK();
        colsum_finish(fv(db), partial, p, out, s);
    }
}
