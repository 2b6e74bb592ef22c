/* The kernels of flash_attention.cu: causal GQA attention on the tensor cores,
 * flash-attention style (Dao, "FlashAttention-2", 2023): the same op, layout, mask and
 * lse as attention.cu (see there), for bf16 q, k, v (and out, dout) with D a multiple of
 * 16 up to 128. Memory is O(T): the T x T scores only ever exist as one 64 x 64 tile in
 * shared memory.
 *
 * Tiles: a block of 4 warps takes 64 query rows (forward, dq) or 64 keys (dk, dv) of
 * one head; each warp owns 16 of them. Key (or query) tiles of 64 stream through shared
 * memory as bf16. The matmuls are WMMA 16x16x16 bf16 products with fp32 accumulators:
 *
 *   forward  S = Q K^T (fp32) -> online softmax in fp32 -> P rounded to bf16 -> O += P V
 *            O is kept in shared memory as fp32, because each tile rescales its rows by
 *            exp(m_old - m_new) and WMMA hides which lane holds which row;
 *            out = O / l, lse = m + log l (l summed from the fp32 P).
 *   dq       per key tile: S = Q K^T, P = exp(scale S - lse), dP = dO V^T,
 *            dS = P (dP - Dlt) rounded to bf16, dQ += dS K   (dQ in registers)
 *   dk, dv   per query tile of every query head of the group: S^T = K Q^T,
 *            dP^T = V dO^T, P^T and dS^T rounded to bf16,
 *            dV += P^T dO, dK += dS^T Q                     (dK, dV in registers)
 * with Dlt_i = dO_i . o_i recomputed from out and dout for each tile (no workspace).
 * With a softcap (att_args.softcap > 0) each scaled score goes through att_score before
 * the mask and softmax, in fp32, and dS is multiplied by its derivative.
 * Like attention.cu, the backward has no atomics: dq is summed by the block of its
 * query rows and dk, dv by the block of their keys, in a fixed order, so a backward
 * repeats bit for bit. The scores are computed twice in backward (once per pass),
 * FlashAttention-2's price for determinism.
 *
 * Rounding differs from the reference kernel only where flash attention rounds: P and
 * dS are bf16 inputs of the second matmuls. Out and the gradients stay within the bf16
 * tolerance of the CPU op; lse, computed in fp32 from exact bf16 products, within fp32's.
 *
 * Shared memory rows are padded (+8 bf16, +4 fp32) against bank conflicts; every WMMA
 * pointer stays 32-byte aligned (tile starts and row strides are multiples of 16
 * elements of 2 bytes or 8 of 4). */
#ifndef FT_FLASH_ATTENTION_KERNELS_CUH
#define FT_FLASH_ATTENTION_KERNELS_CUH

#include <mma.h>

#include "attention_args.cuh"
#include "cuda_common.cuh"

using namespace nvcuda;

namespace fa {

typedef __nv_bfloat16 bf16;

#define FA_ROWS 64 /* query rows or keys per block, and per streamed tile */
#define FA_WARPS 4 /* 16 rows each */
#define FA_THREADS (32 * FA_WARPS)
#define FA_LS (FA_ROWS + 4) /* fp32 row stride of a score tile */
#define FA_LP (FA_ROWS + 8) /* bf16 row stride of a probability tile */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_bt;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* bf16 row stride of a [64, D] tile */
template <int D> __host__ __device__ constexpr int fa_ld() { return D + 8; }

/* May query token i see key token j? (attention.cu's mask, with the bounds of T.) */
__device__ __forceinline__ bool fa_allowed(int i, int j, int T, int window, int si, int sj)
{
    return i < T && j <= i && (window <= 0 || i - j < window) && si == sj;
}

/* dst[r][d] = x[b, t0 + r, h, d] as bf16 for the 64 rows of a tile (0 past T); the
 * segment id of each row into seg_s (0 without seg ids). */
template <int D>
__device__ void fa_load_rows(bf16 *dst, int *seg_s, fview x, const int32_t *seg, int b,
                             int t0, int T, int H, int h)
{
    for (int idx = threadIdx.x; idx < FA_ROWS * D; idx += FA_THREADS) {
        int r = idx / D, d = idx - r * D, t = t0 + r;
        float val = t < T ? ld(x, (((size_t)b * T + t) * H + h) * D + d) : 0.0f;
        dst[r * fa_ld<D>() + d] = __float2bfloat16_rn(val);
    }
    if (seg_s)
        for (int r = threadIdx.x; r < FA_ROWS; r += FA_THREADS)
            seg_s[r] = seg && t0 + r < T ? seg[(size_t)b * T + t0 + r] : 0;
}

/* out[16 x 64] (fp32, stride FA_LS) = A[16 x D] B^T, B given as [64 x D] rows: the
 * scores of a warp's 16 rows against a tile's 64 rows. */
template <int D>
__device__ __forceinline__ void fa_scores(float *out, const bf16 *A, const bf16 *Bm)
{
#pragma unroll
    for (int n = 0; n < FA_ROWS / 16; n++) {
        frag_c c;
        wmma::fill_fragment(c, 0.0f);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            frag_a a;
            frag_bt bt;
            wmma::load_matrix_sync(a, A + kk * 16, fa_ld<D>());
            wmma::load_matrix_sync(bt, Bm + n * 16 * fa_ld<D>() + kk * 16, fa_ld<D>());
            wmma::mma_sync(c, a, bt, c);
        }
        wmma::store_matrix_sync(out + n * 16, c, FA_LS, wmma::mem_row_major);
    }
}

/* acc[D/16] += P[16 x 64] (bf16, stride FA_LP) X[64 x D] */
template <int D>
__device__ __forceinline__ void fa_accumulate(frag_c (&acc)[D / 16], const bf16 *P,
                                              const bf16 *X)
{
#pragma unroll
    for (int kk = 0; kk < FA_ROWS / 16; kk++) {
        frag_a a;
        wmma::load_matrix_sync(a, P + kk * 16, FA_LP);
#pragma unroll
        for (int dt = 0; dt < D / 16; dt++) {
            frag_b bm;
            wmma::load_matrix_sync(bm, X + kk * 16 * fa_ld<D>() + dt * 16, fa_ld<D>());
            wmma::mma_sync(acc[dt], a, bm, acc[dt]);
        }
    }
}

/* Dlt of the 64 rows of a query tile: dO_i . o_i in fp32 from the stored values (two
 * threads a row, halves added by one shuffle). */
template <int D>
__device__ void fa_delta(float *dlt_s, const att_args &a, int b, int i0, int h)
{
    int row = threadIdx.x >> 1, half = threadIdx.x & 1, i = i0 + row;
    float s = 0.0f;
    if (i < a.T) {
        size_t base = (((size_t)b * a.T + i) * a.Hq + h) * D;
        for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
            s += ld(a.dout, base + d) * ld(a.out, base + d);
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if (!half)
        dlt_s[row] = s;
}

/* x[b, t0 + r, h, d] += scale * tile[r][d] for the block's 64 rows (tile fp32, stride
 * D + 4). */
template <int D>
__device__ void fa_add_rows(fview x, const float *tile, float scale, const att_args &a, int b,
                            int t0, int H, int h)
{
    for (int idx = threadIdx.x; idx < FA_ROWS * D; idx += FA_THREADS) {
        int r = idx / D, d = idx - r * D, t = t0 + r;
        if (t >= a.T)
            continue;
        size_t at = (((size_t)b * a.T + t) * H + h) * D + d;
        st(x, at, ld(x, at) + scale * tile[r * (D + 4) + d]);
    }
}

/* x[b, t0 + r, h, :] += scale * (the warps' accumulators: warp w rows 16w .. 16w+15),
 * staged through stage ([64][D + 4] fp32, which the two score tiles hold). Every warp
 * calls it; the first barrier waits for the score tiles to be read. Nothing when x is
 * not wanted (ft_none()). */
template <int D>
__device__ void fa_stage_add(fview x, frag_c (&acc)[D / 16], float *stage, float scale,
                             const att_args &a, int b, int t0, int H, int h)
{
    const int wr = (threadIdx.x >> 5) * 16;
    __syncthreads();
#pragma unroll
    for (int dt = 0; dt < D / 16; dt++)
        wmma::store_matrix_sync(stage + wr * (D + 4) + dt * 16, acc[dt], D + 4,
                                wmma::mem_row_major);
    __syncthreads();
    if (x.p)
        fa_add_rows<D>(x, stage, scale, a, b, t0, H, h);
}

template <int D> constexpr size_t fa_forward_smem()
{
    return 3 * FA_ROWS * fa_ld<D>() * sizeof(bf16) + FA_ROWS * FA_LS * sizeof(float) +
           FA_ROWS * FA_LP * sizeof(bf16) + FA_ROWS * (D + 4) * sizeof(float) +
           2 * FA_ROWS * sizeof(float) + 2 * FA_ROWS * sizeof(int);
}

/* grid (ceil(T / 64), B * Hq): the block's 64 query rows of head h. */
template <int D> __global__ void __launch_bounds__(FA_THREADS) fa_forward_kernel(att_args a)
{
    FT_DYNAMIC_SHARED(unsigned char, smem);
    const int LD = fa_ld<D>(), LO = D + 4;
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + FA_ROWS * LD, *Vs = Ks + FA_ROWS * LD;
    float *Ss = (float *)(Vs + FA_ROWS * LD);
    bf16 *Ps = (bf16 *)(Ss + FA_ROWS * FA_LS);
    float *Os = (float *)(Ps + FA_ROWS * FA_LP);
    float *row_m = Os + FA_ROWS * LO, *row_l = row_m + FA_ROWS;
    int *segq = (int *)(row_l + FA_ROWS), *segk = segq + FA_ROWS;

    const int i0 = blockIdx.x * FA_ROWS, b = blockIdx.y / a.Hq, h = blockIdx.y % a.Hq;
    const int g = h / a.G, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    fa_load_rows<D>(Qs, segq, a.q, a.seg, b, i0, a.T, a.Hq, h);
    for (int idx = threadIdx.x; idx < FA_ROWS * LO; idx += FA_THREADS)
        Os[idx] = 0.0f;
    for (int r = threadIdx.x; r < FA_ROWS; r += FA_THREADS) {
        row_m[r] = -INFINITY;
        row_l[r] = 0.0f;
    }
    /* each warp: rows w*16 .. w*16+15; in the softmax, two lanes a row, 32 keys each */
    const int wr = warp * 16, r = wr + (lane >> 1), half = lane & 1, i = i0 + r;
    const int last = min(i0 + FA_ROWS, a.T) - 1;
    for (int j0 = att_first_key(i0, a.window) / FA_ROWS * FA_ROWS; j0 <= last; j0 += FA_ROWS) {
        __syncthreads(); /* the previous tile's K, V are read */
        fa_load_rows<D>(Ks, segk, a.k, a.seg, b, j0, a.T, a.Hkv, g);
        fa_load_rows<D>(Vs, NULL, a.v, a.seg, b, j0, a.T, a.Hkv, g);
        __syncthreads();
        fa_scores<D>(Ss + wr * FA_LS, Qs + wr * LD, Ks);
        __syncwarp();

        float s[32], tile_max = -INFINITY;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            bool ok = fa_allowed(i, j0 + col, a.T, a.window, segq[r], segk[col]);
            float unused;
            s[c] = ok ? att_score(a.scale * Ss[r * FA_LS + col], a.softcap, &unused)
                      : -INFINITY;
            tile_max = fmaxf(tile_max, s[c]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        float m_old = row_m[r], m_new = fmaxf(m_old, tile_max);
        /* no allowed key yet: nothing to add, nothing to rescale */
        float alpha = m_new == -INFINITY ? 1.0f : __expf(m_old - m_new), sum = 0.0f;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            float p = s[c] == -INFINITY ? 0.0f : __expf(s[c] - m_new);
            sum += p;
            Ps[r * FA_LP + half * 32 + c] = __float2bfloat16_rn(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
            Os[r * LO + d] *= alpha;
        __syncwarp(); /* both lanes of the row read row_m before it changes */
        if (!half) {
            row_m[r] = m_new;
            row_l[r] = alpha * row_l[r] + sum;
        }
        __syncwarp();

        frag_c acc[D / 16];
#pragma unroll
        for (int dt = 0; dt < D / 16; dt++)
            wmma::load_matrix_sync(acc[dt], Os + wr * LO + dt * 16, LO, wmma::mem_row_major);
        fa_accumulate<D>(acc, Ps + wr * FA_LP, Vs);
#pragma unroll
        for (int dt = 0; dt < D / 16; dt++)
            wmma::store_matrix_sync(Os + wr * LO + dt * 16, acc[dt], LO, wmma::mem_row_major);
        __syncwarp();
    }
    if (i < a.T) { /* j = i is always allowed, so l >= 1 */
        float l = row_l[r];
        size_t base = (((size_t)b * a.T + i) * a.Hq + h) * D;
        for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
            st(a.out, base + d, Os[r * LO + d] / l);
        if (!half)
            a.lse_out[((size_t)b * a.Hq + h) * a.T + i] = row_m[r] + logf(l);
    }
}

template <int D> constexpr size_t fa_dq_smem()
{
    return 4 * FA_ROWS * fa_ld<D>() * sizeof(bf16) + 2 * FA_ROWS * FA_LS * sizeof(float) +
           FA_ROWS * FA_LP * sizeof(bf16) + 2 * FA_ROWS * sizeof(float) +
           2 * FA_ROWS * sizeof(int);
}

/* grid (ceil(T / 64), B * Hq): dq of the block's 64 query rows of head h. */
template <int D> __global__ void __launch_bounds__(FA_THREADS) fa_dq_kernel(att_args a)
{
    FT_DYNAMIC_SHARED(unsigned char, smem);
    const int LD = fa_ld<D>();
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + FA_ROWS * LD, *Ks = dOs + FA_ROWS * LD;
    bf16 *Vs = Ks + FA_ROWS * LD;
    float *Ss = (float *)(Vs + FA_ROWS * LD), *dPs = Ss + FA_ROWS * FA_LS;
    bf16 *dSs = (bf16 *)(dPs + FA_ROWS * FA_LS);
    float *lse_s = (float *)(dSs + FA_ROWS * FA_LP), *dlt_s = lse_s + FA_ROWS;
    int *segq = (int *)(dlt_s + FA_ROWS), *segk = segq + FA_ROWS;

    const int i0 = blockIdx.x * FA_ROWS, b = blockIdx.y / a.Hq, h = blockIdx.y % a.Hq;
    const int g = h / a.G, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    fa_load_rows<D>(Qs, segq, a.q, a.seg, b, i0, a.T, a.Hq, h);
    fa_load_rows<D>(dOs, NULL, a.dout, a.seg, b, i0, a.T, a.Hq, h);
    fa_delta<D>(dlt_s, a, b, i0, h);
    for (int r = threadIdx.x; r < FA_ROWS; r += FA_THREADS)
        lse_s[r] = i0 + r < a.T ? a.lse_in[((size_t)b * a.Hq + h) * a.T + i0 + r] : 0.0f;

    const int wr = warp * 16, r = wr + (lane >> 1), half = lane & 1, i = i0 + r;
    frag_c acc[D / 16];
#pragma unroll
    for (int dt = 0; dt < D / 16; dt++)
        wmma::fill_fragment(acc[dt], 0.0f);
    const int last = min(i0 + FA_ROWS, a.T) - 1;
    for (int j0 = att_first_key(i0, a.window) / FA_ROWS * FA_ROWS; j0 <= last; j0 += FA_ROWS) {
        __syncthreads();
        fa_load_rows<D>(Ks, segk, a.k, a.seg, b, j0, a.T, a.Hkv, g);
        fa_load_rows<D>(Vs, NULL, a.v, a.seg, b, j0, a.T, a.Hkv, g);
        __syncthreads();
        fa_scores<D>(Ss + wr * FA_LS, Qs + wr * LD, Ks);
        fa_scores<D>(dPs + wr * FA_LS, dOs + wr * LD, Vs);
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            float ds = 0.0f;
            if (fa_allowed(i, j0 + col, a.T, a.window, segq[r], segk[col])) {
                float dx;
                float p = __expf(att_score(a.scale * Ss[r * FA_LS + col], a.softcap, &dx) -
                                 lse_s[r]);
                ds = p * (dPs[r * FA_LS + col] - dlt_s[r]) * dx;
            }
            dSs[r * FA_LP + col] = __float2bfloat16_rn(ds);
        }
        __syncwarp();
        fa_accumulate<D>(acc, dSs + wr * FA_LP, Ks);
    }
    fa_stage_add<D>(a.dq, acc, Ss, a.scale, a, b, i0, a.Hq, h);
}

template <int D> constexpr size_t fa_dkdv_smem()
{
    return 4 * FA_ROWS * fa_ld<D>() * sizeof(bf16) + 2 * FA_ROWS * FA_LS * sizeof(float) +
           2 * FA_ROWS * FA_LP * sizeof(bf16) + 2 * FA_ROWS * sizeof(float) +
           2 * FA_ROWS * sizeof(int);
}

/* grid (ceil(T / 64), B * Hkv): dk, dv of the block's 64 keys of kv head g, summed over
 * the G query heads of the group and every query tile that can see them. */
template <int D> __global__ void __launch_bounds__(FA_THREADS) fa_dkdv_kernel(att_args a)
{
    FT_DYNAMIC_SHARED(unsigned char, smem);
    const int LD = fa_ld<D>();
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + FA_ROWS * LD, *Qs = Vs + FA_ROWS * LD;
    bf16 *dOs = Qs + FA_ROWS * LD;
    float *Ss = (float *)(dOs + FA_ROWS * LD), *dPs = Ss + FA_ROWS * FA_LS;
    bf16 *Ps = (bf16 *)(dPs + FA_ROWS * FA_LS), *dSs = Ps + FA_ROWS * FA_LP;
    float *lse_s = (float *)(dSs + FA_ROWS * FA_LP), *dlt_s = lse_s + FA_ROWS;
    int *segk = (int *)(dlt_s + FA_ROWS), *segq = segk + FA_ROWS;

    const int j0 = blockIdx.x * FA_ROWS, b = blockIdx.y / a.Hkv, g = blockIdx.y % a.Hkv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    fa_load_rows<D>(Ks, segk, a.k, a.seg, b, j0, a.T, a.Hkv, g);
    fa_load_rows<D>(Vs, NULL, a.v, a.seg, b, j0, a.T, a.Hkv, g);

    /* each warp: keys w*16 .. w*16+15; in the elementwise step, two lanes a key */
    const int wr = warp * 16, r = wr + (lane >> 1), half = lane & 1, j = j0 + r;
    frag_c dk[D / 16], dv[D / 16];
#pragma unroll
    for (int dt = 0; dt < D / 16; dt++) {
        wmma::fill_fragment(dk[dt], 0.0f);
        wmma::fill_fragment(dv[dt], 0.0f);
    }
    /* the last query that may see one of the block's keys: the last key's */
    const int i_last = att_last_query(min(j0 + FA_ROWS, a.T) - 1, a.T, a.window);
    for (int h = g * a.G; h < (g + 1) * a.G; h++) {
        for (int i0 = j0; i0 <= i_last; i0 += FA_ROWS) {
            __syncthreads();
            fa_load_rows<D>(Qs, segq, a.q, a.seg, b, i0, a.T, a.Hq, h);
            fa_load_rows<D>(dOs, NULL, a.dout, a.seg, b, i0, a.T, a.Hq, h);
            fa_delta<D>(dlt_s, a, b, i0, h);
            for (int c = threadIdx.x; c < FA_ROWS; c += FA_THREADS)
                lse_s[c] = i0 + c < a.T ? a.lse_in[((size_t)b * a.Hq + h) * a.T + i0 + c] : 0.0f;
            __syncthreads();
            fa_scores<D>(Ss + wr * FA_LS, Ks + wr * LD, Qs);   /* S^T: keys x queries */
            fa_scores<D>(dPs + wr * FA_LS, Vs + wr * LD, dOs); /* dP^T */
            __syncwarp();
            for (int c = 0; c < 32; c++) {
                int col = half * 32 + c; /* query i0 + col */
                float p = 0.0f, ds = 0.0f;
                if (j < a.T && fa_allowed(i0 + col, j, a.T, a.window, segq[col], segk[r])) {
                    float dx;
                    p = __expf(att_score(a.scale * Ss[r * FA_LS + col], a.softcap, &dx) -
                               lse_s[col]);
                    ds = p * (dPs[r * FA_LS + col] - dlt_s[col]) * dx;
                }
                Ps[r * FA_LP + col] = __float2bfloat16_rn(p);
                dSs[r * FA_LP + col] = __float2bfloat16_rn(ds);
            }
            __syncwarp();
            fa_accumulate<D>(dv, Ps + wr * FA_LP, dOs);
            fa_accumulate<D>(dk, dSs + wr * FA_LP, Qs);
        }
    }
    fa_stage_add<D>(a.dk, dk, Ss, a.scale, a, b, j0, a.Hkv, g);
    fa_stage_add<D>(a.dv, dv, Ss, 1.0f, a, b, j0, a.Hkv, g);
}

} // namespace fa

#endif
