/* cuBLAS on the emulated device: the handle calls and cublasGemmEx (see cublas_v2.h).
 *
 * cublasGemmEx with a CUBLAS_COMPUTE_32F compute type takes the type combinations the real
 * library takes for it: A and B fp32, bf16, fp16 or int8 (one type for both), C fp32, or C
 * of the operands' 16-bit type; anything else is CUBLAS_STATUS_NOT_SUPPORTED, as there.
 * Negative sizes and short leading dimensions are CUBLAS_STATUS_INVALID_VALUE. The
 * operands are widened exactly to fp32 (TF32 math mode and the _FAST_ compute types round
 * fp32 operands first, as they allow the GPU to), the product is OpenBLAS's sgemm (fp32
 * accumulation), and a 16-bit C gets the result of alpha op(A) op(B) + beta C rounded
 * once, to nearest even; with beta 0, C is not read. The other compute types (16F, 64F,
 * 32I) are not emulated: the run stops and says so.
 *
 * Checks: A, B and C must lie in live device allocations (their whole extent, leading
 * dimensions included), alpha and beta must be host memory (the default pointer mode) or
 * device memory (CUBLAS_POINTER_MODE_DEVICE), the elements A and B contribute (and C's
 * with beta != 0) must not hold the never-written pattern, and C's guard bytes are
 * checked after the write.
 *
 * The workspace: a handle without one set (cublasSetWorkspace) allocates the library's
 * default on its first GEMM, from the device memory, as the real library does; no room is
 * CUBLAS_STATUS_ALLOC_FAILED there. */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "cublas_v2.h"
#include "emu_internal.h"
#include "ft_emu.h"

struct ft_emu_cublas {
    bool live;
    int device;
    cudaStream_t stream;
    cublasMath_t math;
    cublasPointerMode_t pointer_mode;
    void *workspace;      /* set by cublasSetWorkspace, or the default (owned) */
    bool workspace_set, workspace_owned;
};

namespace ft_emu {
namespace {

float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0x1f)
        u = s | 0x7f800000u | (m << 13);
    else if (e)
        u = s | ((e + 112) << 23) | (m << 13);
    else if (!m)
        u = s;
    else { /* subnormal: normalise */
        int sh = 0;
        while (!(m & 0x400)) {
            m <<= 1;
            sh++;
        }
        u = s | ((uint32_t)(113 - sh) << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(s | 0x7e00);
    if (a >= 0x477ff000u) /* rounds to at least 65520: inf */
        return (uint16_t)(s | 0x7c00);
    if (a < 0x38800000u) { /* subnormal half (or 0): scale to an integer and round */
        float x;
        memcpy(&x, &a, 4);
        return (uint16_t)(s | (uint32_t)lrintf(x * 16777216.0f));
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1); /* round to nearest even at bit 13 */
    return (uint16_t)(s | ((r - 0x38000000u) >> 13));
}

/* x rounded to nearest even keeping `bits` mantissa bits (TF32: 10). */
float round_mantissa(float x, int bits)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u)
        return x;
    int drop = 23 - bits;
    u += (1u << (drop - 1)) - 1 + ((u >> drop) & 1);
    u &= ~((1u << drop) - 1);
    memcpy(&x, &u, 4);
    return x;
}

size_t type_size(cudaDataType_t t)
{
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    case CUDA_R_8I: return 1;
    default: return 0;
    }
}

bool all_ones(const unsigned char *e, size_t n)
{
    for (size_t b = 0; b < n; b++)
        if (e[b] != 0xff)
            return false;
    return true;
}

/* A rows x cols column-major operand (leading dimension ld) as fp32, contiguous; stops on
 * an element never written (int8 has no such pattern: every byte is a value). */
std::vector<float> widen(const void *p, cudaDataType_t t, int rows, int cols, int ld,
                         const char *what)
{
    std::vector<float> out((size_t)rows * (size_t)cols);
    size_t es = type_size(t);
    const unsigned char *base = (const unsigned char *)p;
    for (int c = 0; c < cols; c++)
        for (int r = 0; r < rows; r++) {
            const unsigned char *e = base + ((size_t)c * (size_t)ld + (size_t)r) * es;
            if (t != CUDA_R_8I && all_ones(e, es))
                ft_emu_abort("cublasGemmEx", "%s element (%d, %d) at %p was never written (it holds "
                                             "the all-ones pattern of fresh device memory)",
                             what, r, c, (const void *)e);
            uint16_t h;
            float f;
            switch (t) {
            case CUDA_R_32F: memcpy(&f, e, 4); break;
            case CUDA_R_16BF: memcpy(&h, e, 2); f = bf16_to_f32(h); break;
            case CUDA_R_16F: memcpy(&h, e, 2); f = f16_to_f32(h); break;
            default: f = (float)*(const int8_t *)e; break;
            }
            out[(size_t)c * (size_t)rows + (size_t)r] = f;
        }
    return out;
}

/* The scalar alpha or beta: host memory in the host pointer mode, device memory in the
 * device mode (the other is the bug cuBLAS would fault or misread on). */
float scalar(const ft_emu_cublas *h, const void *p, const char *what)
{
    if (!p)
        ft_emu_abort("cublasGemmEx", "%s is NULL", what);
    if (h->pointer_mode == CUBLAS_POINTER_MODE_DEVICE)
        ft_emu_check_device(p, sizeof(float), "cublasGemmEx", what);
    else if (ft_emu_is_device(p, 0))
        ft_emu_abort("cublasGemmEx", "%s %p is device memory, but the handle's pointer mode is "
                                     "CUBLAS_POINTER_MODE_HOST (a host float belongs there)",
                     what, p);
    float v;
    memcpy(&v, p, sizeof v);
    return v;
}

bool live(cublasHandle_t h) { return h && h->live; }

/* One cublasGemmEx, validated, as it runs on the device. */
struct gemm {
    bool ta, tb;
    int m, n, k;
    float al, be;
    const float *alpha_dev, *beta_dev; /* CUBLAS_POINTER_MODE_DEVICE: read when it runs */
    const void *A;
    cudaDataType_t Atype;
    int lda;
    const void *B;
    cudaDataType_t Btype;
    int ldb;
    void *C;
    cudaDataType_t Ctype;
    int ldc;
    cublasComputeType_t computeType;
    cublasMath_t math;
};

void gemm_run(const gemm &g)
{
    const bool ta = g.ta, tb = g.tb;
    const int m = g.m, n = g.n, k = g.k, lda = g.lda, ldb = g.ldb, ldc = g.ldc;
    const float al = g.alpha_dev ? *g.alpha_dev : g.al, be = g.beta_dev ? *g.beta_dev : g.be;
    const void *A = g.A, *B = g.B;
    void *C = g.C;
    const cudaDataType_t Atype = g.Atype, Btype = g.Btype, Ctype = g.Ctype;
    const cublasComputeType_t computeType = g.computeType;
    const int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    const size_t ec = type_size(Ctype);
    /* C as fp32, m x n contiguous: read only when beta != 0 */
    std::vector<float> c((size_t)m * (size_t)n, 0.0f);
    if (be != 0.0f)
        c = widen(C, Ctype, m, n, ldc, "C (read: beta is not 0)");
    if (k > 0 && al != 0.0f) {
        std::vector<float> a = widen(A, Atype, ar, ac, lda, "A");
        std::vector<float> b = widen(B, Btype, br, bc, ldb, "B");
        /* what the fast modes allow the GPU to do to fp32 operands, it does here */
        int keep = 23;
        const unsigned mode = (unsigned)g.math &
                              ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
        if (Atype == CUDA_R_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC &&
            mode != CUBLAS_PEDANTIC_MATH) {
            if (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                (computeType == CUBLAS_COMPUTE_32F && mode == CUBLAS_TF32_TENSOR_OP_MATH))
                keep = 10;
            else if (computeType == CUBLAS_COMPUTE_32F_FAST_16F)
                keep = 10; /* fp16's mantissa (its range is not emulated) */
            else if (computeType == CUBLAS_COMPUTE_32F_FAST_16BF)
                keep = 7;
        }
        if (keep < 23) {
            for (float &x : a)
                x = round_mantissa(x, keep);
            for (float &x : b)
                x = round_mantissa(x, keep);
        }
        cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    m, n, k, al, a.data(), ar, b.data(), br, be, c.data(), m);
    } else if (be != 1.0f) {
        for (float &x : c)
            x *= be;
    }
    unsigned char *cp = (unsigned char *)C;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float v = c[(size_t)j * (size_t)m + (size_t)i];
            unsigned char *e = cp + ((size_t)j * (size_t)ldc + (size_t)i) * ec;
            uint16_t h;
            switch (Ctype) {
            case CUDA_R_16BF: h = f32_to_bf16(v); memcpy(e, &h, 2); break;
            case CUDA_R_16F: h = f32_to_f16(v); memcpy(e, &h, 2); break;
            default: memcpy(e, &v, 4); break;
            }
        }
    bool freed;
    if (const alloc *a = find_alloc(C, &freed))
        check_guards(a, "cublasGemmEx");
}

} // namespace
} // namespace ft_emu

using namespace ft_emu;

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0 || sticky())
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new ft_emu_cublas{true, dev, 0, CUBLAS_DEFAULT_MATH, CUBLAS_POINTER_MODE_HOST,
                                nullptr, false, false};
    return CUBLAS_STATUS_SUCCESS;
}

static void drop_default_workspace(cublasHandle_t handle)
{
    if (handle->workspace_owned)
        (void)cudaFree(handle->workspace);
    handle->workspace = nullptr;
    handle->workspace_owned = false;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    drop_default_workspace(handle);
    handle->live = false; /* kept, so a stale handle is always caught */
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void *workspace, size_t workspaceSizeInBytes)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (workspaceSizeInBytes && !workspace)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (workspaceSizeInBytes)
        ft_emu_check_device(workspace, workspaceSizeInBytes, "cublasSetWorkspace", "workspace");
    drop_default_workspace(handle);
    handle->workspace = workspace;
    handle->workspace_set = true;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (check_stream(stream) != cudaSuccess)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!stream)
        return CUBLAS_STATUS_INVALID_VALUE;
    *stream = handle->stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    if (base > CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->math;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->pointer_mode = mode;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetPointerMode(cublasHandle_t handle, cublasPointerMode_t *mode)
{
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!mode)
        return CUBLAS_STATUS_INVALID_VALUE;
    *mode = handle->pointer_mode;
    return CUBLAS_STATUS_SUCCESS;
}

static const struct {
    cublasStatus_t s;
    const char *name, *text;
} statuses[] = {
    {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "the operation completed successfully"},
    {CUBLAS_STATUS_NOT_INITIALIZED, "CUBLAS_STATUS_NOT_INITIALIZED",
     "the library was not initialized"},
    {CUBLAS_STATUS_ALLOC_FAILED, "CUBLAS_STATUS_ALLOC_FAILED", "the resource allocation failed"},
    {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
     "an invalid numeric value was used as an argument"},
    {CUBLAS_STATUS_ARCH_MISMATCH, "CUBLAS_STATUS_ARCH_MISMATCH",
     "an absent device architectural feature is required"},
    {CUBLAS_STATUS_MAPPING_ERROR, "CUBLAS_STATUS_MAPPING_ERROR",
     "an access to GPU memory space failed"},
    {CUBLAS_STATUS_EXECUTION_FAILED, "CUBLAS_STATUS_EXECUTION_FAILED",
     "the GPU program failed to execute"},
    {CUBLAS_STATUS_INTERNAL_ERROR, "CUBLAS_STATUS_INTERNAL_ERROR",
     "an internal operation failed"},
    {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
     "the functionality requested is not supported"},
    {CUBLAS_STATUS_LICENSE_ERROR, "CUBLAS_STATUS_LICENSE_ERROR",
     "the functionality requested requires some license"},
};

const char *cublasGetStatusName(cublasStatus_t status)
{
    for (const auto &x : statuses)
        if (x.s == status)
            return x.name;
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t status)
{
    for (const auto &x : statuses)
        if (x.s == status)
            return x.text;
    return "unknown error";
}

/* cublasGemmEx and cublasGemmStridedBatchedEx: batch products, the i-th on A + i strideA,
 * B + i strideB and C + i strideC (elements), each checked and run as one cublasGemmEx. */
static cublasStatus_t gemm_batched(const char *name, cublasHandle_t handle,
                                   cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *A,
                                   cudaDataType_t Atype, int lda, long long strideA,
                                   const void *B, cudaDataType_t Btype, int ldb,
                                   long long strideB, const void *beta, void *C,
                                   cudaDataType_t Ctype, int ldc, long long strideC, int batch,
                                   cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    call_scope cs(name);
    if (!live(handle))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (sticky())
        return CUBLAS_STATUS_EXECUTION_FAILED;
    switch (computeType) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32: break;
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC:
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC:
        ft_emu_abort(name, "compute type %d is not emulated (only the CUBLAS_COMPUTE_32F "
                                     "family is)",
                     (int)computeType);
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
    if ((algo < CUBLAS_GEMM_DEFAULT || algo > 23) && (algo < 99 || algo > 115))
        return CUBLAS_STATUS_INVALID_VALUE;
    bool ok_op = (transa == CUBLAS_OP_N || transa == CUBLAS_OP_T || transa == CUBLAS_OP_C) &&
                 (transb == CUBLAS_OP_N || transb == CUBLAS_OP_T || transb == CUBLAS_OP_C);
    if (!ok_op || m < 0 || n < 0 || k < 0 || batch < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
    /* the library's default workspace, on the first GEMM of a handle without one */
    if (!handle->workspace_set && !handle->workspace_owned) {
        size_t bytes = (size_t)(props(handle->device).major >= 9 ? 32 : 4) << 20;
        if (cudaMalloc(&handle->workspace, bytes) != cudaSuccess) {
            (void)cudaGetLastError(); /* the status says it */
            handle->workspace = nullptr;
            return CUBLAS_STATUS_ALLOC_FAILED;
        }
        handle->workspace_owned = true;
    }
    /* A is stored ar x ac, B br x bc (column-major) */
    const int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* the 32F compute types' table: one type for A and B; C fp32 or the same 16-bit type;
     * int8 to fp32 only; the _FAST_ types take fp32 operands only */
    bool plain = computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC;
    bool types_ok =
        Atype == Btype &&
        ((Atype == CUDA_R_32F && Ctype == CUDA_R_32F) ||
         (plain && (Atype == CUDA_R_16BF || Atype == CUDA_R_16F) &&
          (Ctype == Atype || Ctype == CUDA_R_32F)) ||
         (plain && Atype == CUDA_R_8I && Ctype == CUDA_R_32F));
    if (!types_ok)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batch == 0)
        return CUBLAS_STATUS_SUCCESS;

    float al = scalar(handle, alpha, "alpha"), be = scalar(handle, beta, "beta");
    const size_t ea = type_size(Atype), ec = type_size(Ctype);
    const bool dev_scalars = handle->pointer_mode == CUBLAS_POINTER_MODE_DEVICE;
    std::vector<gemm> gs;
    for (int i = 0; i < batch; i++) {
        const char *Ai = (const char *)A + (size_t)(strideA * i) * ea;
        const char *Bi = (const char *)B + (size_t)(strideB * i) * ea;
        char *Ci = (char *)C + (size_t)(strideC * i) * ec;
        if (k > 0 && al != 0.0f) {
            ft_emu_check_device(Ai, ((size_t)lda * (size_t)(ac - 1) + (size_t)ar) * ea, name, "A");
            ft_emu_check_device(Bi, ((size_t)ldb * (size_t)(bc - 1) + (size_t)br) * ea, name, "B");
        }
        ft_emu_check_device(Ci, ((size_t)ldc * (size_t)(n - 1) + (size_t)m) * ec, name, "C");
        /* the product runs on the handle's stream (queued with FT_EMU_ASYNC): host scalars
         * are taken now, as cuBLAS takes them at the call; device ones when it runs */
        gs.push_back(gemm{ta, tb, m, n, k, al, be, dev_scalars ? (const float *)alpha : nullptr,
                          dev_scalars ? (const float *)beta : nullptr, Ai, Atype, lda, Bi, Btype,
                          ldb, Ci, Ctype, ldc, computeType, handle->math});
    }
    issue(lane_of(handle->stream), name, [gs] {
        for (const gemm &g : gs)
            gemm_run(g);
    });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void *alpha,
                            const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo)
{
    return gemm_batched("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0,
                        B, Btype, ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType_t Atype, int lda, long long strideA,
    const void *B, cudaDataType_t Btype, int ldb, long long strideB, const void *beta, void *C,
    cudaDataType_t Ctype, int ldc, long long strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    return gemm_batched("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A,
                        Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc,
                        strideC, batchCount, computeType, algo);
}

} /* extern "C" */
