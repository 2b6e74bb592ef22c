/* bench-gemm: the GEMMs of kernels/cuda/linear.cu timed on the GPU, as linear.cu calls
 * cuBLAS and as cublasLt's other candidate algorithms would run them (CUDA builds only).
 *
 *   bench-gemm [--iters N] [OP:N:IN:OUT ...]
 *
 * OP is fwd (y[N,out] = x[N,in] w[out,in]^T), dx (dx[N,in] += dy[N,out] w) or dw
 * (dw[out,in] += dy^T x), each the cuBLAS call of linear.cu with bf16 inputs. Without
 * shapes it times the GEMMs of a LoRA r=16 and a full step of the Llama-3.2-1B shape at
 * 4 x 2048 tokens, whose slow ones the first H200 profile showed (bench/results). For each
 * shape it prints one line per variant: cublasGemmEx as linear.cu calls it with a bf16
 * and with an fp32 output, then every algorithm cublasLt's heuristic offers for the bf16
 * output (up to 8, 32 MiB workspace, as cuBLAS's handle has), with the mean time of
 * --iters runs (default 20) after 3 warm-ups and its TFLOP/s (2 N in out FLOPs). The
 * inputs are random bf16; nothing is checked: the op tests check the values. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t rc_ = (call);                                                         \
        if (rc_ != cudaSuccess) {                                                         \
            fprintf(stderr, "bench-gemm: %s: %s\n", #call, cudaGetErrorString(rc_));      \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)
#define CB(call)                                                                          \
    do {                                                                                  \
        int st_ = (int)(call);                                                            \
        if (st_ != 0) {                                                                   \
            fprintf(stderr, "bench-gemm: %s: cuBLAS status %d\n", #call, st_);            \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

enum { FWD, DX, DW };
static const char *OP_NAMES[] = {"fwd", "dx", "dw"};

typedef struct {
    int op, N, in, out;
} shape;

/* LoRA r=16 and full fine-tuning of Llama-3.2-1B (hidden 2048, MLP 8192, kv 512, vocab
 * 128256) at 8192 tokens, the loss chunk of 523 rows and its last of 347 */
static const shape DEFAULTS[] = {
    {FWD, 8192, 2048, 2048},   {FWD, 8192, 2048, 8192},  {FWD, 8192, 8192, 2048},
    {FWD, 8192, 2048, 512},    {FWD, 523, 2048, 128256}, {DX, 8192, 2048, 2048},
    {DX, 8192, 2048, 8192},    {DX, 523, 2048, 128256},  {DW, 8192, 2048, 2048},
    {DW, 8192, 2048, 8192},    {DW, 523, 2048, 128256},  {DW, 347, 2048, 128256},
    {DW, 384, 2048, 128256},   {FWD, 8192, 2048, 16},    {FWD, 8192, 16, 2048},
    {DW, 8192, 16, 2048},      {DW, 8192, 16, 8192},     {DW, 8192, 2048, 16},
    {DX, 8192, 16, 2048},      {DX, 8192, 8192, 16},
};

/* the cuBLAS arguments of linear.cu's call for s (column-major view of row-major buffers) */
typedef struct {
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    size_t a_elems, b_elems, c_elems;
    float beta;
} gemm_args;

static gemm_args args_for(shape s)
{
    gemm_args g;
    size_t N = (size_t)s.N, in = (size_t)s.in, out = (size_t)s.out;
    switch (s.op) {
    case FWD: /* y^T [out,N] = (w^T)^T x^T */
        g = (gemm_args){CUBLAS_OP_T, CUBLAS_OP_N, s.out, s.N, s.in, s.in, s.in, s.out,
                        out * in, N * in, N * out, 0.0f};
        break;
    case DX: /* dx^T [in,N] += w^T dy^T */
        g = (gemm_args){CUBLAS_OP_N, CUBLAS_OP_N, s.in, s.N, s.out, s.in, s.out, s.in,
                        out * in, N * out, N * in, 1.0f};
        break;
    default: /* dw^T [in,out] += x^T (dy^T)^T */
        g = (gemm_args){CUBLAS_OP_N, CUBLAS_OP_T, s.in, s.out, s.N, s.in, s.out, s.in,
                        N * in, N * out, out * in, 1.0f};
        break;
    }
    return g;
}

static void *dev_random_bf16(size_t n)
{
    uint16_t *h = malloc(n * sizeof *h); /* bf16 bits: the top half of an fp32 */
    unsigned x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        float f = ((float)(x >> 8) / 16777216.0f - 0.5f) * 0.1f;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        h[i] = (uint16_t)(bits >> 16);
    }
    void *d;
    CK(cudaMalloc(&d, n * sizeof *h));
    CK(cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int iters = 20;
static cudaEvent_t ev0, ev1;

static void report(shape s, const char *variant, float ms)
{
    double us = 1e3 * ms / iters, flops = 2.0 * s.N * s.in * s.out;
    printf("%-4s N=%-6d in=%-6d out=%-7d %-30s %10.1f us %8.1f TFLOP/s\n", OP_NAMES[s.op], s.N,
           s.in, s.out, variant, us, flops / (us * 1e-6) / 1e12);
}

static void bench_shape(cublasHandle_t h, cublasLtHandle_t lt, void *ws, size_t ws_bytes,
                        shape s)
{
    gemm_args g = args_for(s);
    void *A = dev_random_bf16(g.a_elems), *B = dev_random_bf16(g.b_elems), *C;
    CK(cudaMalloc(&C, g.c_elems * sizeof(float)));
    CK(cudaMemset(C, 0, g.c_elems * sizeof(float)));
    float alpha = 1.0f;

    for (int out_fp32 = 0; out_fp32 < 2; out_fp32++) {
        cudaDataType_t ct = out_fp32 ? CUDA_R_32F : CUDA_R_16BF;
        for (int i = 0; i < 3 + iters; i++) {
            if (i == 3)
                CK(cudaEventRecord(ev0, 0));
            CB(cublasGemmEx(h, g.ta, g.tb, g.m, g.n, g.k, &alpha, A, CUDA_R_16BF, g.lda, B,
                            CUDA_R_16BF, g.ldb, &g.beta, C, ct, g.ldc, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
        }
        CK(cudaEventRecord(ev1, 0));
        CK(cudaEventSynchronize(ev1));
        float ms;
        CK(cudaEventElapsedTime(&ms, ev0, ev1));
        report(s, out_fp32 ? "cublasGemmEx ->fp32" : "cublasGemmEx ->bf16", ms);
    }

    /* cublasLt: the heuristic's candidates for the bf16 output, each timed */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta, sizeof g.ta));
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.tb, sizeof g.tb));
    /* a stored matrix's rows and columns: op(A) is m x k, op(B) k x n */
    int a_rows = g.ta == CUBLAS_OP_N ? g.m : g.k, a_cols = g.ta == CUBLAS_OP_N ? g.k : g.m;
    int b_rows = g.tb == CUBLAS_OP_N ? g.k : g.n, b_cols = g.tb == CUBLAS_OP_N ? g.n : g.k;
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, a_rows, a_cols, g.lda));
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, b_rows, b_cols, g.ldb));
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, g.m, g.n, g.ldc));
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t res[8];
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, res, &found) != 0)
        found = 0;
    for (int a = 0; a < found; a++) {
        int ok = 1;
        for (int i = 0; i < 3 + iters && ok; i++) {
            if (i == 3)
                CK(cudaEventRecord(ev0, 0));
            ok = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &g.beta, C, lc, C, lc,
                                &res[a].algo, ws, ws_bytes, 0) == CUBLAS_STATUS_SUCCESS;
        }
        CK(cudaEventRecord(ev1, 0));
        CK(cudaEventSynchronize(ev1));
        float ms;
        CK(cudaEventElapsedTime(&ms, ev0, ev1));
        char name[64];
        snprintf(name, sizeof name, "cublasLt heuristic #%d%s", a, ok ? "" : " (failed)");
        if (ok)
            report(s, name, ms);
        else
            printf("%-4s N=%-6d in=%-6d out=%-7d %s\n", OP_NAMES[s.op], s.N, s.in, s.out, name);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
}

static int parse_shape(const char *arg, shape *s)
{
    char op[8];
    if (sscanf(arg, "%7[a-z]:%d:%d:%d", op, &s->N, &s->in, &s->out) != 4 || s->N <= 0 ||
        s->in <= 0 || s->out <= 0)
        return -1;
    for (s->op = 0; s->op < 3; s->op++)
        if (strcmp(op, OP_NAMES[s->op]) == 0)
            return 0;
    return -1;
}

int main(int argc, char **argv)
{
    shape shapes[64];
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
            if (iters < 1) {
                fprintf(stderr, "bench-gemm: --iters: not a positive count: %s\n", argv[i]);
                return 2;
            }
        } else if (n < 64 && parse_shape(argv[i], &shapes[n]) == 0) {
            n++;
        } else {
            fprintf(stderr, "bench-gemm: %s: not OP:N:IN:OUT (OP fwd, dx or dw; at most 64)\n"
                            "usage: bench-gemm [--iters N] [OP:N:IN:OUT ...]\n", argv[i]);
            return 2;
        }
    }
    if (n == 0)
        for (; n < (int)(sizeof DEFAULTS / sizeof *DEFAULTS); n++)
            shapes[n] = DEFAULTS[n];
    cublasHandle_t h;
    cublasLtHandle_t lt;
    size_t ws_bytes = (size_t)32 << 20;
    void *ws;
    CB(cublasCreate(&h));
    CB(cublasLtCreate(&lt));
    CK(cudaMalloc(&ws, ws_bytes));
    CB(cublasSetWorkspace(h, ws, ws_bytes));
    CK(cudaEventCreate(&ev0));
    CK(cudaEventCreate(&ev1));
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("bench-gemm: %s, %d iterations per variant after 3 warm-ups\n", p.name, iters);
    for (int i = 0; i < n; i++)
        bench_shape(h, lt, ws, ws_bytes, shapes[i]);
    return 0;
}
