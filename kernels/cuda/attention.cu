/* Causal grouped-query attention (GQA / MQA / MHA), the CUDA twin of
 * kernels/cpu/attention.c: same layout, mask and math, fp32 arithmetic on fp32 or bf16
 * storage.
 *
 * Layout (row-major):
 *   q, out, dq, dout  [B, T, Hq,  D]   element (b,t,h,d) at ((b*T + t)*Hq  + h)*D + d
 *   k, v, dk, dv      [B, T, Hkv, D]   element (b,t,g,d) at ((b*T + t)*Hkv + g)*D + d
 *   lse               [B, Hq, T] fp32  element (b,h,t)   at (b*Hq + h)*T + t
 *   seg               [B, T] int32 segment ids, or NULL (one sequence a row)
 * Query head h reads kv head g = h / G, G = Hq / Hkv. Any float operand but lse may be
 * fp32 or bf16 (fview), each independently; D <= FT_CUDA_ATT_MAX_D.
 *
 * Mask: query token i of row b attends to key token j when j <= i, seg[b,j] == seg[b,i]
 * (with seg ids) and i - j < window (when window > 0). j = i is always allowed.
 * With softcap > 0 every S_ij below is softcap * tanh(scale q_i . k_j / softcap), and
 * the backward's dS_ij is multiplied by its derivative 1 - tanh^2 (att_score).
 *
 * Forward, per (b, h, i), over allowed j in increasing order:
 *   S_ij = scale * q_i . k_j,   lse_i = log sum_j exp(S_ij),   o_i = sum_j P_ij v_j
 * with an online softmax, one key at a time: a running maximum m and denominator l
 * (fp32); when a score exceeds m, the accumulator and l are rescaled by exp(m - S_ij).
 * At the end o_i = acc / l and lse_i = m + log(l) (l >= 1: the maximum's own term).
 *
 * Backward (P recomputed from the saved lse, as flash attention does):
 *   Dlt_i = dO_i . o_i,   dP_ij = dO_i . v_j,   dS_ij = P_ij (dP_ij - Dlt_i)
 *   dq_i += scale sum_j dS_ij k_j
 *   dk_j += scale sum_{h in group} sum_i dS_ij q_i
 *   dv_j +=       sum_{h in group} sum_i P_ij dO_i
 * Gradients ACCUMULATE; any of dq, dk, dv may be ft_none().
 *
 * Parallel decomposition: one warp per output row, D spread over its lanes (lane owns
 * d = lane + 32 t, t < NT = ceil(D / 32), in registers). Dot products are warp_sum
 * butterflies, which hand every lane the same bits, so the softmax state and every
 * branch on it stay uniform across the warp.
 *   forward:  warp (b, h, i) -> out_i, lse_i       (loop over allowed j <= i)
 *   rows:     warp (b, h, i) -> dq_i               (loop over allowed j <= i)
 *   columns:  warp (b, g, j) -> dk_j, dv_j         (loop over the G query heads of kv
 *                                                   head g, then the allowed i >= j)
 * No atomics: every gradient element is read, summed and written by one warp, in a fixed
 * loop order, so a backward pass repeats bit for bit (cuda_ops.h). The price is that the
 * scores are computed twice in backward (once per pass) and Dlt_i is recomputed for
 * every key in the column pass; this first version favours being right over being fast.
 *
 * NT is a template parameter (1 .. FT_CUDA_ATT_MAX_D / 32), picked at launch from D, so
 * the register arrays are only as long as the head needs and are indexed only in fully
 * unrolled loops (a dynamic index would put them in local memory). */
#include <stdlib.h>
#include <string.h>

#include "attention_args.cuh"
#include "flash_attention.cuh"

#define ATT_WARPS 4 /* warps (rows) per block */
#define ATT_THREADS (32 * ATT_WARPS)
#define ATT_MAX_NT (FT_CUDA_ATT_MAX_D / 32)

namespace {

/* r[t] = x[base + lane + 32 t] for the lane's elements, 0 past D. */
template <int NT>
__device__ __forceinline__ void att_load(float (&r)[NT], fview x, size_t base, int lane,
                                         int D)
{
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int d = lane + 32 * t;
        r[t] = d < D ? ld(x, base + d) : 0.0f;
    }
}

/* a . b over the warp (elements past D are 0 in both); every lane gets the sum. */
template <int NT>
__device__ __forceinline__ float att_dot(const float (&a)[NT], const float (&b)[NT])
{
    float s = 0.0f;
#pragma unroll
    for (int t = 0; t < NT; t++)
        s += a[t] * b[t];
    return warp_sum(s);
}

/* The query row (b, h, i) of warp `row` = (b*Hq + h)*T + i (also its lse index), and
 * where its vectors and its kv head's keys start. */
struct att_qrow {
    int i;
    size_t qoff;           /* q_i, out_i, dout_i, dq_i */
    size_t kbase, kstride; /* key (and value) token j of kv head h / G at kbase + j kstride */
    const int32_t *sb;     /* row b's segment ids, or NULL */
    int32_t si;            /* seg id of token i (0 without seg ids) */
};

__device__ __forceinline__ att_qrow att_query_row(const att_args &a, size_t row)
{
    att_qrow r;
    r.i = (int)(row % a.T);
    const int h = (int)((row / a.T) % a.Hq);
    const int b = (int)(row / ((size_t)a.T * a.Hq));
    const int g = h / a.G;
    r.qoff = ((size_t)b * a.T + r.i) * a.Hq * a.D + (size_t)h * a.D;
    r.kbase = (size_t)b * a.T * a.Hkv * a.D + (size_t)g * a.D;
    r.kstride = (size_t)a.Hkv * a.D;
    r.sb = a.seg ? a.seg + (size_t)b * a.T : NULL;
    r.si = r.sb ? r.sb[r.i] : 0;
    return r;
}

/* Forward: one warp per query row (b, h, i); row index (b*Hq + h)*T + i is also the
 * lse index. */
template <int NT> __global__ void __launch_bounds__(ATT_THREADS) att_forward_kernel(att_args a)
{
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (row >= (size_t)a.B * a.Hq * a.T)
        return; /* the whole warp: the butterflies below see all 32 lanes */
    const att_qrow r = att_query_row(a, row);
    const int i = r.i, D = a.D;
    const size_t qoff = r.qoff, kbase = r.kbase, kstride = r.kstride;
    const int32_t *sb = r.sb;
    const int32_t si = r.si;

    float qr[NT], acc[NT], kr[NT];
    att_load(qr, a.q, qoff, lane, D);
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    float m = -INFINITY, l = 0.0f;

    for (int j = att_first_key(i, a.window); j <= i; j++) {
        if (sb && sb[j] != si)
            continue;
        const size_t koff = kbase + (size_t)j * kstride;
        att_load(kr, a.k, koff, lane, D);
        float unused;
        const float s = att_score(a.scale * att_dot(qr, kr), a.softcap, &unused);
        float p;
        if (s > m) {
            /* exp(-inf) = 0 on the first key: acc and l are still 0. */
            const float r = expf(m - s);
            l *= r;
#pragma unroll
            for (int t = 0; t < NT; t++)
                acc[t] *= r;
            m = s;
            p = 1.0f;
        } else {
            p = expf(s - m);
        }
        l += p;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const int d = lane + 32 * t;
            if (d < D)
                acc[t] += p * ld(a.v, koff + d);
        }
    }

    const float inv = 1.0f / l;
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int d = lane + 32 * t;
        if (d < D)
            st(a.out, qoff + d, acc[t] * inv);
    }
    if (lane == 0)
        a.lse_out[row] = m + logf(l);
}

/* Rows pass: one warp per query row (b, h, i) -> dq_i. */
template <int NT> __global__ void __launch_bounds__(ATT_THREADS) att_dq_kernel(att_args a)
{
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (row >= (size_t)a.B * a.Hq * a.T)
        return; /* the whole warp: the butterflies below see all 32 lanes */
    const att_qrow r = att_query_row(a, row);
    const int i = r.i, D = a.D;
    const size_t qoff = r.qoff, kbase = r.kbase, kstride = r.kstride;
    const int32_t *sb = r.sb;
    const int32_t si = r.si;
    const float lse_i = a.lse_in[row];

    float qr[NT], dor[NT], acc[NT], kr[NT], vr[NT];
    att_load(qr, a.q, qoff, lane, D);
    att_load(dor, a.dout, qoff, lane, D);
    float dlt;
    {
        float orow[NT];
        att_load(orow, a.out, qoff, lane, D);
        dlt = att_dot(dor, orow);
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;

    for (int j = att_first_key(i, a.window); j <= i; j++) {
        if (sb && sb[j] != si)
            continue;
        const size_t koff = kbase + (size_t)j * kstride;
        att_load(kr, a.k, koff, lane, D);
        att_load(vr, a.v, koff, lane, D);
        float dx;
        const float s = att_score(a.scale * att_dot(qr, kr), a.softcap, &dx);
        const float dp = att_dot(dor, vr);
        const float ds = expf(s - lse_i) * (dp - dlt) * dx;
#pragma unroll
        for (int t = 0; t < NT; t++)
            acc[t] += ds * kr[t];
    }

#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int d = lane + 32 * t;
        if (d < D)
            st(a.dq, qoff + d, ld(a.dq, qoff + d) + a.scale * acc[t]);
    }
}

/* Columns pass: one warp per key row (b, g, j) -> dk_j, dv_j, over the query heads
 * h = g*G .. g*G + G-1 of kv head g and, for each, the rows i = j .. that see j. */
template <int NT> __global__ void __launch_bounds__(ATT_THREADS) att_dkdv_kernel(att_args a)
{
    const int lane = threadIdx.x & 31;
    const size_t row = (size_t)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    const size_t nrows = (size_t)a.B * a.Hkv * a.T;
    if (row >= nrows)
        return;
    const int j = (int)(row % a.T);
    const int g = (int)((row / a.T) % a.Hkv);
    const int b = (int)(row / ((size_t)a.T * a.Hkv));
    const int D = a.D;

    const size_t koff = ((size_t)b * a.T + j) * a.Hkv * D + (size_t)g * D;
    const size_t qstride = (size_t)a.Hq * D;
    const int32_t *sb = a.seg ? a.seg + (size_t)b * a.T : NULL;
    const int32_t sj = sb ? sb[j] : 0;
    const int ilast = att_last_query(j, a.T, a.window);

    float kr[NT], vr[NT], dk_acc[NT], dv_acc[NT], qr[NT], dor[NT], orow[NT];
    att_load(kr, a.k, koff, lane, D);
    att_load(vr, a.v, koff, lane, D);
#pragma unroll
    for (int t = 0; t < NT; t++)
        dk_acc[t] = dv_acc[t] = 0.0f;

    for (int h = g * a.G; h < (g + 1) * a.G; h++) {
        const float *lse_bh = a.lse_in + ((size_t)b * a.Hq + h) * a.T;
        for (int i = j; i <= ilast; i++) {
            if (sb && sb[i] != sj)
                continue;
            const size_t qoff = ((size_t)b * a.T + i) * qstride + (size_t)h * D;
            att_load(qr, a.q, qoff, lane, D);
            att_load(dor, a.dout, qoff, lane, D);
            att_load(orow, a.out, qoff, lane, D);
            float dx;
            const float s = att_score(a.scale * att_dot(kr, qr), a.softcap, &dx);
            const float dp = att_dot(vr, dor);
            const float dlt = att_dot(dor, orow);
            const float p = expf(s - lse_bh[i]);
            const float ds = p * (dp - dlt) * dx;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                dv_acc[t] += p * dor[t];
                dk_acc[t] += ds * qr[t];
            }
        }
    }

#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int d = lane + 32 * t;
        if (d < D) {
            if (a.dk.p)
                st(a.dk, koff + d, ld(a.dk, koff + d) + a.scale * dk_acc[t]);
            if (a.dv.p)
                st(a.dv, koff + d, ld(a.dv, koff + d) + dv_acc[t]);
        }
    }
}

typedef void (*att_kernel)(att_args);

/* The instances of each kernel for NT = 1 .. ATT_MAX_NT, indexed by NT - 1. */
const att_kernel att_forward_kernels[ATT_MAX_NT] = {
    att_forward_kernel<1>, att_forward_kernel<2>, att_forward_kernel<3>,
    att_forward_kernel<4>, att_forward_kernel<5>, att_forward_kernel<6>,
    att_forward_kernel<7>, att_forward_kernel<8>};
const att_kernel att_dq_kernels[ATT_MAX_NT] = {
    att_dq_kernel<1>, att_dq_kernel<2>, att_dq_kernel<3>, att_dq_kernel<4>,
    att_dq_kernel<5>, att_dq_kernel<6>, att_dq_kernel<7>, att_dq_kernel<8>};
const att_kernel att_dkdv_kernels[ATT_MAX_NT] = {
    att_dkdv_kernel<1>, att_dkdv_kernel<2>, att_dkdv_kernel<3>, att_dkdv_kernel<4>,
    att_dkdv_kernel<5>, att_dkdv_kernel<6>, att_dkdv_kernel<7>, att_dkdv_kernel<8>};

/* Launches kernel[NT - 1] with one warp per row, nrows rows. */
void att_launch(const att_kernel *kernels, const att_args &a, size_t nrows)
{
    const int nt = (a.D + 31) / 32;
    const size_t blocks = (nrows + ATT_WARPS - 1) / ATT_WARPS;
    if (blocks > 0x7fffffffu) {
        fprintf(stderr, "attention: %zu rows are too many for one launch\n", nrows);
        abort();
    }
    FT_LAUNCH(kernels[nt - 1], (unsigned)blocks, ATT_THREADS, 0, ft_cuda_stream())(a);
    LAUNCH_CHECK();
}

/* The shared part of both entry points; returns 0 when there is nothing to do. */
int att_setup(att_args &a, ft_tensor seg, int B, int T, int Hq, int Hkv, int D,
              float scale, int window, float softcap)
{
    if (B <= 0 || T <= 0 || Hq <= 0 || Hkv <= 0 || D <= 0)
        return 0;
    if (D > FT_CUDA_ATT_MAX_D) { /* the dispatcher checks; a bug if it gets here */
        fprintf(stderr, "attention: head dim %d > %d\n", D, FT_CUDA_ATT_MAX_D);
        abort();
    }
    a.seg = (const int32_t *)seg.data;
    a.B = B;
    a.T = T;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.G = Hq / Hkv;
    a.D = D;
    a.scale = scale;
    a.window = window;
    a.softcap = softcap;
    return 1;
}

/* The tensor-core kernels where they apply, unless FT_CUDA_ATTENTION=reference. */
bool flash_wanted(void)
{
    const char *e = getenv("FT_CUDA_ATTENTION");
    return !(e && !strcmp(e, "reference"));
}

} // namespace

const char *ft_cuda_attention_kernel(ft_dtype dtype, int D)
{
    ft_tensor t = {NULL, 0, dtype, FT_DEV_CUDA};
    return flash_wanted() && ft_cuda_flash_attention_fits(D, &t, 1) ? "flash" : "reference";
}

void ft_cuda_attention_forward(ft_tensor out, ft_tensor lse, ft_tensor q, ft_tensor k,
                               ft_tensor v, ft_tensor seg, int B, int T, int Hq, int Hkv,
                               int D, float scale, int window, float softcap)
{
    att_args a = {};
    if (!att_setup(a, seg, B, T, Hq, Hkv, D, scale, window, softcap))
        return;
    a.q = fv(q);
    a.k = fv(k);
    a.v = fv(v);
    a.out = fv(out);
    a.lse_out = (float *)lse.data;
    const ft_tensor io[] = {out, q, k, v};
    if (flash_wanted() && ft_cuda_flash_attention_fits(D, io, 4))
        ft_cuda_flash_attention_forward(a);
    else
        att_launch(att_forward_kernels, a, (size_t)B * Hq * T);
}

void ft_cuda_attention_backward(ft_tensor dq, ft_tensor dk, ft_tensor dv, ft_tensor dout,
                                ft_tensor q, ft_tensor k, ft_tensor v, ft_tensor out,
                                ft_tensor lse, ft_tensor seg, int B, int T, int Hq, int Hkv,
                                int D, float scale, int window, float softcap)
{
    att_args a = {};
    if (!att_setup(a, seg, B, T, Hq, Hkv, D, scale, window, softcap))
        return;
    a.q = fv(q);
    a.k = fv(k);
    a.v = fv(v);
    a.out = fv(out);
    a.dout = fv(dout);
    a.dq = fv(dq);
    a.dk = fv(dk);
    a.dv = fv(dv);
    a.lse_in = (const float *)lse.data;
    const ft_tensor in[] = {dout, q, k, v, out};
    if (flash_wanted() && ft_cuda_flash_attention_fits(D, in, 5)) {
        ft_cuda_flash_attention_backward(a);
        return;
    }
    if (dq.data)
        att_launch(att_dq_kernels, a, (size_t)B * Hq * T);
    if (dk.data || dv.data)
        att_launch(att_dkdv_kernels, a, (size_t)B * Hkv * T);
}
