/* The kernels of flash_attention.cu: causal GQA attention on the tensor cores,
 * FlashAttention-2 style (Dao, "FlashAttention-2", 2023): the same op, layout, mask and
 * lse as attention.cu (see there), for bf16 q, k, v, out, dout (16-byte aligned) with D a
 * multiple of 16 up to 128. Memory is O(T): scores only ever exist as a warp's registers.
 *
 * Tiles: a block of 4 warps takes 64 query rows (forward, dq) or 64 keys (dk, dv) of one
 * head; each warp owns 16 of them. Key (or query) tiles of 64 rows stream through shared
 * memory as bf16, copied with cp.async 16 bytes at a time, double-buffered (the next
 * tile's copy runs under this tile's math). Rows are padded to D + 8 bf16, so the eight
 * 16-byte rows an ldmatrix reads fall in distinct banks. The matmuls are mma.sync
 * m16n8k16 bf16 products with fp32 accumulators (mma_sm80.cuh, which gives the register
 * layouts), every score and accumulator in registers:
 *
 *   forward  S = Q K^T (fp32; Q's fragments loaded once) -> online softmax on the
 *            fragments (a row is spread over the 4 lanes of a quad: max and sum by two
 *            __shfl_xor) -> P rounded to bf16, its C fragments reused as A fragments
 *            -> O = O * exp(m_old - m_new) + P V;  out = O / l, lse = m + log l (l
 *            summed from the fp32 P).
 *   dq       per key tile: S = Q K^T, P = exp(scale S - lse), dP = dO V^T,
 *            dS = P (dP - Dlt) rounded to bf16, dQ += dS K
 *   dk, dv   per query tile (in halves of 32 queries) of every query head of the group:
 *            S^T = K Q^T, dP^T = V dO^T, P^T and dS^T rounded to bf16,
 *            dV += P^T dO, dK += dS^T Q
 * with Dlt_i = dO_i . o_i (fa_row_delta, one warp a row, in fp32 from the stored bf16):
 * the dq kernel computes it for its own rows; the dk/dv kernel reads it from a buffer a
 * pre-kernel filled (fa_delta_kernel; fa_bwd_args.delta), or computes it per tile where
 * there is no buffer, with the same function, so the result is the same bit for bit.
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
 * Masks: a tile whose every (query, key) pair is allowed (no segment ids, keys all at or
 * before the tile's first query, within the window, rows within T) skips the per-element
 * test. */
#ifndef FT_FLASH_ATTENTION_KERNELS_CUH
#define FT_FLASH_ATTENTION_KERNELS_CUH

#include "attention_args.cuh"
#include "cuda_common.cuh"
#include "mma_sm80.cuh"

namespace fa {

typedef __nv_bfloat16 bf16;

#define FA_ROWS 64 /* query rows or keys per block, and per streamed tile */
#define FA_WARPS 4 /* 16 rows each */
#define FA_THREADS (32 * FA_WARPS)

/* bf16 row stride of a [64, D] tile in shared memory */
template <int D> __host__ __device__ constexpr int fa_ld() { return D + 8; }

/* The backward kernels' arguments: the op's, and the batches b0 .. b0 + nb - 1 this
 * launch covers (grid.y = nb * heads). delta: Dlt of those batches, [nb, Hq, T] (as lse),
 * or NULL (the dk/dv kernel computes it). */
struct fa_bwd_args {
    att_args a;
    float *delta;
    int b0, nb;
};

/* May query token i see key token j? (attention.cu's mask, with the bounds of T.) */
__device__ __forceinline__ bool fa_allowed(int i, int j, int T, int window, int si, int sj)
{
    return i < T && j <= i && (window <= 0 || i - j < window) && si == sj;
}

/* The query tile of a forward or dq block: the last tiles, which see the most keys, first
 * (blocks start roughly in blockIdx order), so the short ones fill the tail of the grid.
 * A dk/dv block's key tile is blockIdx.x: there the first tiles are the long ones. */
__device__ __forceinline__ int fa_heavy_first() { return (int)(gridDim.x - 1 - blockIdx.x); }

/* Is every pair of query rows i0 .. i0 + 63 and keys j0 .. j0 + 63 allowed? */
__device__ __forceinline__ bool fa_tile_full(const att_args &a, int i0, int j0)
{
    return !a.seg && j0 + FA_ROWS - 1 <= i0 && i0 + FA_ROWS <= a.T &&
           (a.window <= 0 || i0 + FA_ROWS - 1 - j0 < a.window);
}

/* Starts copying x[b, t0 + r, h, :] into dst row r (stride fa_ld) for the 64 rows of a
 * tile, zeros past T: one 16-byte cp.async per piece, spread over the block. */
template <int D>
__device__ __forceinline__ void fa_async_rows(bf16 *dst, const bf16 *x, int b, int t0, int T,
                                              int H, int h)
{
    constexpr int P = D / 8; /* 16-byte pieces a row */
    for (int idx = threadIdx.x; idx < FA_ROWS * P; idx += FA_THREADS) {
        const int r = idx / P, c = idx - r * P, t = t0 + r;
        const bf16 *src = x + (((size_t)b * T + (t < T ? t : T - 1)) * H + h) * D + c * 8;
        cp_async_16(dst + r * fa_ld<D>() + c * 8, src, t < T ? 16 : 0);
    }
}

/* s[r] = the segment id of token t0 + r (0 without segment ids, or past T). */
__device__ __forceinline__ void fa_load_seg(int *s, const int32_t *seg, int b, int t0, int T)
{
    for (int r = threadIdx.x; r < FA_ROWS; r += FA_THREADS)
        s[r] = seg && t0 + r < T ? seg[(size_t)b * T + t0 + r] : 0;
}

/* The K/V double buffer of the forward and dq kernels: with a tile after j0 (j0 + 64 <=
 * last) its copy into buffer nb (K, V and the keys' segment ids) starts under the current
 * tile's math; then waits until the current tile's copy has landed. */
template <int D>
__device__ __forceinline__ void fa_next_kv(bf16 *Ks, bf16 *Vs, int *segk, int nb, const bf16 *k,
                                           const bf16 *v, const att_args &a, int b, int g,
                                           int j0, int last)
{
    constexpr int TILE = FA_ROWS * fa_ld<D>();
    if (j0 + FA_ROWS <= last) {
        fa_async_rows<D>(Ks + nb * TILE, k, b, j0 + FA_ROWS, a.T, a.Hkv, g);
        fa_async_rows<D>(Vs + nb * TILE, v, b, j0 + FA_ROWS, a.T, a.Hkv, g);
        fa_load_seg(segk + nb * FA_ROWS, a.seg, b, j0 + FA_ROWS, a.T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
}

/* Dlt of query row i of head h: dout . out over D, in fp32; lanes over d, the warp's
 * butterfly sum (every lane gets it). One warp, uniform arguments. */
template <int D>
__device__ __forceinline__ float fa_row_delta(const att_args &a, int b, int i, int h, int lane)
{
    const bf16 *o = (const bf16 *)a.out.p, *dout = (const bf16 *)a.dout.p;
    const size_t base = (((size_t)b * a.T + i) * a.Hq + h) * D;
    float s = 0.0f;
#pragma unroll
    for (int d = lane; d < D; d += 32)
        s += __bfloat162float(dout[base + d]) * __bfloat162float(o[base + d]);
    return warp_sum(s);
}

/* ---- fragments (mma_sm80.cuh's layouts) ----------------------------------------------- */

/* The A fragment of k step kk (columns 16 kk ..) of the 16 rows at `rows`. */
template <int D>
__device__ __forceinline__ void fa_frag_a(uint32_t (&f)[4], const bf16 *rows, int kk, int lane)
{
    ldmatrix_x4(f, rows + (lane % 16) * fa_ld<D>() + kk * 16 + (lane / 16) * 8);
}

/* B fragments of k step kk for two n-tiles, B[k][n] = rows[n][k] for the 16 rows at
 * `rows` (a tile whose rows are the product's columns): f[0], f[1] for rows 0..7, f[2],
 * f[3] for rows 8..15. */
template <int D>
__device__ __forceinline__ void fa_frag_b(uint32_t (&f)[4], const bf16 *rows, int kk, int lane)
{
    ldmatrix_x4(f, rows + ((lane / 16) * 8 + lane % 8) * fa_ld<D>() + kk * 16 +
                       ((lane / 8) % 2) * 8);
}

/* B fragments for a 16-row k step of B[k][n] = rows[k][n] (a tile whose rows are the
 * product's k), columns n0 .. n0 + 15: f[0], f[1] for n0.., f[2], f[3] for n0 + 8.. */
template <int D>
__device__ __forceinline__ void fa_frag_bt(uint32_t (&f)[4], const bf16 *rows, int n0, int lane)
{
    ldmatrix_x4_trans(f, rows + (((lane / 8) % 2) * 8 + lane % 8) * fa_ld<D>() + n0 +
                             (lane / 16) * 8);
}

/* s[n] (n < NT: columns 8n ..) = A Bm^T for A's fragments af[D / 16] and NT * 8 rows of Bm. */
template <int D, int NT>
__device__ __forceinline__ void fa_scores_frag(float (&s)[NT][4], const uint32_t (&af)[D / 16][4],
                                               const bf16 *Bm, int lane)
{
#pragma unroll
    for (int n = 0; n < NT; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bf[4];
            fa_frag_b<D>(bf, Bm + np * 16 * fa_ld<D>(), kk, lane);
            const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            mma_bf16_16816(s[2 * np], af[kk], b0, s[2 * np]);
            mma_bf16_16816(s[2 * np + 1], af[kk], b1, s[2 * np + 1]);
        }
}

/* The same with A the 16 rows at A in shared memory. */
template <int D, int NT>
__device__ __forceinline__ void fa_scores(float (&s)[NT][4], const bf16 *A, const bf16 *Bm,
                                          int lane)
{
#pragma unroll
    for (int n = 0; n < NT; n++)
        s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t af[4];
        fa_frag_a<D>(af, A, kk, lane);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bf[4];
            fa_frag_b<D>(bf, Bm + np * 16 * fa_ld<D>(), kk, lane);
            const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            mma_bf16_16816(s[2 * np], af, b0, s[2 * np]);
            mma_bf16_16816(s[2 * np + 1], af, b1, s[2 * np + 1]);
        }
    }
}

/* C fragments of NT n-tiles (fp32) -> A fragments of NT / 2 k steps (bf16). */
template <int NT>
__device__ __forceinline__ void fa_to_a(uint32_t (&pa)[NT / 2][4], const float (&p)[NT][4])
{
#pragma unroll
    for (int kt = 0; kt < NT / 2; kt++) {
        pa[kt][0] = pack_bf16(p[2 * kt][0], p[2 * kt][1]);
        pa[kt][1] = pack_bf16(p[2 * kt][2], p[2 * kt][3]);
        pa[kt][2] = pack_bf16(p[2 * kt + 1][0], p[2 * kt + 1][1]);
        pa[kt][3] = pack_bf16(p[2 * kt + 1][2], p[2 * kt + 1][3]);
    }
}

/* acc[D / 8] += P X: P's A fragments for KT k steps (16 rows of X each), X [16 KT, D]. */
template <int D, int KT>
__device__ __forceinline__ void fa_accumulate(float (&acc)[D / 8][4], const uint32_t (&pa)[KT][4],
                                              const bf16 *X, int lane)
{
#pragma unroll
    for (int kt = 0; kt < KT; kt++)
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t bf[4];
            fa_frag_bt<D>(bf, X + kt * 16 * fa_ld<D>(), dp * 16, lane);
            const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
            mma_bf16_16816(acc[2 * dp], pa[kt], b0, acc[2 * dp]);
            mma_bf16_16816(acc[2 * dp + 1], pa[kt], b1, acc[2 * dp + 1]);
        }
}

/* x[b, t, h, :] += scale * acc for the lane's rows t = t_g (elements 0, 1) and t_g + 8
 * (2, 3), those below T. */
template <int D>
__device__ __forceinline__ void fa_add_frag(fview x, const float (&acc)[D / 8][4], float scale,
                                            int T, int b, int t_g, int H, int h, int lane)
{
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int t = t_g + 8 * hr;
        if (t >= T)
            continue;
        const size_t base = (((size_t)b * T + t) * H + h) * D + 2 * (lane % 4);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const size_t at = base + n * 8 + e;
                st(x, at, ld(x, at) + scale * acc[n][2 * hr + e]);
            }
    }
}

/* ---- forward ---------------------------------------------------------------------------- */

template <int D> constexpr size_t fa_forward_smem()
{
    return 5 * FA_ROWS * fa_ld<D>() * sizeof(bf16) + 3 * FA_ROWS * sizeof(int);
}

/* grid (ceil(T / 64), B * Hq): the block's 64 query rows of head h. */
template <int D> __global__ void __launch_bounds__(FA_THREADS) fa_forward_kernel(att_args a)
{
    FT_DYNAMIC_SHARED(unsigned char, smem);
    constexpr int LD = fa_ld<D>(), TILE = FA_ROWS * LD;
    bf16 *Qs = (bf16 *)smem, *Ks = Qs + TILE, *Vs = Ks + 2 * TILE; /* K, V: two buffers */
    int *segq = (int *)(Vs + 2 * TILE), *segk = segq + FA_ROWS;     /* segk: two buffers */

    const int i0 = fa_heavy_first() * FA_ROWS, b = blockIdx.y / a.Hq, h = blockIdx.y % a.Hq;
    const int g = h / a.G, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wr = warp * 16;
    const bf16 *q = (const bf16 *)a.q.p, *k = (const bf16 *)a.k.p, *v = (const bf16 *)a.v.p;
    const int first = att_first_key(i0, a.window) / FA_ROWS * FA_ROWS;
    const int last = min(i0 + FA_ROWS, a.T) - 1;
    const int row0 = i0 + wr + lane / 4; /* the lane's query rows: row0, row0 + 8 */

    fa_async_rows<D>(Qs, q, b, i0, a.T, a.Hq, h);
    fa_load_seg(segq, a.seg, b, i0, a.T);
    fa_async_rows<D>(Ks, k, b, first, a.T, a.Hkv, g);
    fa_async_rows<D>(Vs, v, b, first, a.T, a.Hkv, g);
    fa_load_seg(segk, a.seg, b, first, a.T);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this lane's columns */
    uint32_t qf[D / 16][4];
    int sq[2] = {0, 0};
    for (int j0 = first, buf = 0; j0 <= last; j0 += FA_ROWS, buf ^= 1) {
        fa_next_kv<D>(Ks, Vs, segk, buf ^ 1, k, v, a, b, g, j0, last);
        __syncthreads();
        if (j0 == first) {
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                fa_frag_a<D>(qf[kk], Qs + wr * LD, kk, lane);
            sq[0] = segq[row0 - i0];
            sq[1] = segq[row0 + 8 - i0];
        }
        const bf16 *Kt = Ks + buf * TILE, *Vt = Vs + buf * TILE;
        const int *sk = segk + buf * FA_ROWS;

        float s[FA_ROWS / 8][4];
        fa_scores_frag<D, FA_ROWS / 8>(s, qf, Kt, lane);
        const bool full = fa_tile_full(a, i0, j0);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < FA_ROWS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hr = e / 2, c = n * 8 + 2 * (lane % 4) + e % 2;
                float unused, x = att_score(a.scale * s[n][e], a.softcap, &unused);
                if (!full && !fa_allowed(row0 + 8 * hr, j0 + c, a.T, a.window, sq[hr], sk[c]))
                    x = -INFINITY;
                s[n][e] = x;
                mx[hr] = fmaxf(mx[hr], x);
            }
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 1));
            mx[hr] = fmaxf(mx[hr], __shfl_xor_sync(0xffffffffu, mx[hr], 2));
            const float m_new = fmaxf(m[hr], mx[hr]);
            /* no allowed key yet: nothing to add, nothing to rescale */
            alpha[hr] = m_new == -INFINITY ? 1.0f : __expf(m[hr] - m_new);
            m[hr] = m_new;
        }
        float sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < FA_ROWS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hr = e / 2;
                const float p = s[n][e] == -INFINITY ? 0.0f : __expf(s[n][e] - m[hr]);
                s[n][e] = p;
                sum[hr] += p;
            }
#pragma unroll
        for (int hr = 0; hr < 2; hr++)
            l[hr] = alpha[hr] * l[hr] + sum[hr];
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }
        uint32_t pa[FA_ROWS / 16][4];
        fa_to_a<FA_ROWS / 8>(pa, s);
        fa_accumulate<D, FA_ROWS / 16>(o, pa, Vt, lane);
        __syncthreads(); /* this buffer is read before the next iteration refills it */
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 1);
        l[hr] += __shfl_xor_sync(0xffffffffu, l[hr], 2);
        const int i = row0 + 8 * hr;
        if (i >= a.T)
            continue;
        /* j = i is always allowed, so l >= 1 */
        uint32_t *out = (uint32_t *)((bf16 *)a.out.p + (((size_t)b * a.T + i) * a.Hq + h) * D);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            out[n * 4 + lane % 4] = pack_bf16(o[n][2 * hr] / l[hr], o[n][2 * hr + 1] / l[hr]);
        if (lane % 4 == 0)
            a.lse_out[((size_t)b * a.Hq + h) * a.T + i] = m[hr] + logf(l[hr]);
    }
}

/* ---- backward ---------------------------------------------------------------------------- */

/* grid (ceil(nb * Hq * T / 4)): p.delta[r] = Dlt of row r = ((b - b0) Hq + h) T + i, one
 * warp a row. */
template <int D> __global__ void __launch_bounds__(FA_THREADS) fa_delta_kernel(fa_bwd_args p)
{
    const att_args &a = p.a;
    const size_t row = (size_t)blockIdx.x * FA_WARPS + (threadIdx.x >> 5);
    if (row >= (size_t)p.nb * a.Hq * a.T)
        return; /* the whole warp */
    const int i = (int)(row % a.T), bh = (int)(row / a.T);
    const float d = fa_row_delta<D>(a, p.b0 + bh / a.Hq, i, bh % a.Hq, threadIdx.x & 31);
    if ((threadIdx.x & 31) == 0)
        p.delta[row] = d;
}

template <int D> constexpr size_t fa_dq_smem()
{
    return 6 * FA_ROWS * fa_ld<D>() * sizeof(bf16) + 3 * FA_ROWS * sizeof(int) +
           2 * FA_ROWS * sizeof(float);
}

/* grid (ceil(T / 64), nb * Hq): dq of the block's 64 query rows of head h. */
template <int D> __global__ void __launch_bounds__(FA_THREADS) fa_dq_kernel(fa_bwd_args p)
{
    FT_DYNAMIC_SHARED(unsigned char, smem);
    const att_args &a = p.a;
    constexpr int LD = fa_ld<D>(), TILE = FA_ROWS * LD;
    bf16 *Qs = (bf16 *)smem, *dOs = Qs + TILE, *Ks = dOs + TILE, *Vs = Ks + 2 * TILE;
    int *segq = (int *)(Vs + 2 * TILE), *segk = segq + FA_ROWS; /* segk: two buffers */
    float *lse_s = (float *)(segk + 2 * FA_ROWS), *dlt_s = lse_s + FA_ROWS;

    const int i0 = fa_heavy_first() * FA_ROWS, b = p.b0 + blockIdx.y / a.Hq;
    const int h = blockIdx.y % a.Hq;
    const int g = h / a.G, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wr = warp * 16;
    const bf16 *k = (const bf16 *)a.k.p, *v = (const bf16 *)a.v.p;
    const int first = att_first_key(i0, a.window) / FA_ROWS * FA_ROWS;
    const int last = min(i0 + FA_ROWS, a.T) - 1;
    const int row0 = i0 + wr + lane / 4;

    fa_async_rows<D>(Qs, (const bf16 *)a.q.p, b, i0, a.T, a.Hq, h);
    fa_async_rows<D>(dOs, (const bf16 *)a.dout.p, b, i0, a.T, a.Hq, h);
    fa_load_seg(segq, a.seg, b, i0, a.T);
    fa_async_rows<D>(Ks, k, b, first, a.T, a.Hkv, g);
    fa_async_rows<D>(Vs, v, b, first, a.T, a.Hkv, g);
    fa_load_seg(segk, a.seg, b, first, a.T);
    cp_async_commit();
    for (int r = threadIdx.x; r < FA_ROWS; r += FA_THREADS)
        lse_s[r] = i0 + r < a.T ? a.lse_in[((size_t)b * a.Hq + h) * a.T + i0 + r] : 0.0f;
    for (int r = wr; r < wr + 16 && i0 + r < a.T; r++) { /* the warp's rows */
        const float d = fa_row_delta<D>(a, b, i0 + r, h, lane);
        if (lane == 0)
            dlt_s[r] = d;
    }

    float dq[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
        dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
    int sq[2] = {0, 0};
    float lse_r[2] = {0.0f, 0.0f}, dlt_r[2] = {0.0f, 0.0f};
    for (int j0 = first, buf = 0; j0 <= last; j0 += FA_ROWS, buf ^= 1) {
        fa_next_kv<D>(Ks, Vs, segk, buf ^ 1, k, v, a, b, g, j0, last);
        __syncthreads();
        if (j0 == first)
            for (int hr = 0; hr < 2; hr++) {
                const int r = row0 + 8 * hr - i0;
                sq[hr] = segq[r];
                lse_r[hr] = lse_s[r];
                dlt_r[hr] = row0 + 8 * hr < a.T ? dlt_s[r] : 0.0f;
            }
        const bf16 *Kt = Ks + buf * TILE, *Vt = Vs + buf * TILE;
        const int *sk = segk + buf * FA_ROWS;

        float s[FA_ROWS / 8][4], dp[FA_ROWS / 8][4];
        fa_scores<D, FA_ROWS / 8>(s, Qs + wr * LD, Kt, lane);
        fa_scores<D, FA_ROWS / 8>(dp, dOs + wr * LD, Vt, lane);
        const bool full = fa_tile_full(a, i0, j0);
#pragma unroll
        for (int n = 0; n < FA_ROWS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hr = e / 2, c = n * 8 + 2 * (lane % 4) + e % 2;
                float ds = 0.0f;
                if (full || fa_allowed(row0 + 8 * hr, j0 + c, a.T, a.window, sq[hr], sk[c])) {
                    float dx;
                    const float pr =
                        __expf(att_score(a.scale * s[n][e], a.softcap, &dx) - lse_r[hr]);
                    ds = pr * (dp[n][e] - dlt_r[hr]) * dx;
                }
                s[n][e] = ds;
            }
        uint32_t pa[FA_ROWS / 16][4];
        fa_to_a<FA_ROWS / 8>(pa, s);
        fa_accumulate<D, FA_ROWS / 16>(dq, pa, Kt, lane);
        __syncthreads();
    }
    fa_add_frag<D>(a.dq, dq, a.scale, a.T, b, row0, a.Hq, h, lane);
}

template <int D> constexpr size_t fa_dkdv_smem()
{
    return 6 * FA_ROWS * fa_ld<D>() * sizeof(bf16) + 3 * FA_ROWS * sizeof(int) +
           4 * FA_ROWS * sizeof(float);
}

/* Query tile `it` of a dk/dv block (query head h = g G + it / n_i, rows i0 = j0 + 64 (it %
 * n_i)): starts the copies of its Q and dO rows into Qs, dOs, and fills its segment ids,
 * lse and Dlt (Dlt from p.delta, or computed by the warps: 16 rows each). */
template <int D>
__device__ __forceinline__ void fa_dkdv_issue(const fa_bwd_args &p, int it, int n_i, int j0, int b,
                                              int g, bf16 *Qs, bf16 *dOs, int *segq, float *lse_s,
                                              float *dlt_s)
{
    const att_args &a = p.a;
    const int h = g * a.G + it / n_i, i0 = j0 + FA_ROWS * (it % n_i);
    fa_async_rows<D>(Qs, (const bf16 *)a.q.p, b, i0, a.T, a.Hq, h);
    fa_async_rows<D>(dOs, (const bf16 *)a.dout.p, b, i0, a.T, a.Hq, h);
    fa_load_seg(segq, a.seg, b, i0, a.T);
    const size_t at = ((size_t)b * a.Hq + h) * a.T + i0;
    const size_t dat = ((size_t)(b - p.b0) * a.Hq + h) * a.T + i0;
    for (int r = threadIdx.x; r < FA_ROWS; r += FA_THREADS) {
        lse_s[r] = i0 + r < a.T ? a.lse_in[at + r] : 0.0f;
        if (p.delta)
            dlt_s[r] = i0 + r < a.T ? p.delta[dat + r] : 0.0f;
    }
    if (!p.delta) {
        const int wr = (threadIdx.x >> 5) * 16, lane = threadIdx.x & 31;
        for (int r = wr; r < wr + 16; r++) {
            const float d = i0 + r < a.T ? fa_row_delta<D>(a, b, i0 + r, h, lane) : 0.0f;
            if (lane == 0)
                dlt_s[r] = d;
        }
    }
}

/* grid (ceil(T / 64), nb * Hkv): dk, dv of the block's 64 keys of kv head g, summed over
 * the G query heads of the group and every query tile that can see them. */
template <int D> __global__ void __launch_bounds__(FA_THREADS) fa_dkdv_kernel(fa_bwd_args p)
{
    FT_DYNAMIC_SHARED(unsigned char, smem);
    const att_args &a = p.a;
    constexpr int LD = fa_ld<D>(), TILE = FA_ROWS * LD, QH = FA_ROWS / 2;
    bf16 *Ks = (bf16 *)smem, *Vs = Ks + TILE, *Qs = Vs + TILE, *dOs = Qs + 2 * TILE;
    int *segk = (int *)(dOs + 2 * TILE), *segq = segk + FA_ROWS; /* segq..: two buffers */
    float *lse_s = (float *)(segq + 2 * FA_ROWS), *dlt_s = lse_s + 2 * FA_ROWS;

    const int j0 = blockIdx.x * FA_ROWS, b = p.b0 + blockIdx.y / a.Hkv, g = blockIdx.y % a.Hkv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wr = warp * 16;
    const int key0 = j0 + wr + lane / 4; /* the lane's keys: key0, key0 + 8 */
    /* the last query that may see one of the block's keys: the last key's */
    const int i_last = att_last_query(min(j0 + FA_ROWS, a.T) - 1, a.T, a.window);
    const int n_i = (i_last - j0) / FA_ROWS + 1, total = a.G * n_i;

    fa_async_rows<D>(Ks, (const bf16 *)a.k.p, b, j0, a.T, a.Hkv, g);
    fa_async_rows<D>(Vs, (const bf16 *)a.v.p, b, j0, a.T, a.Hkv, g);
    fa_load_seg(segk, a.seg, b, j0, a.T);
    fa_dkdv_issue<D>(p, 0, n_i, j0, b, g, Qs, dOs, segq, lse_s, dlt_s);
    cp_async_commit();

    float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[n][e] = dv[n][e] = 0.0f;
    int sk[2] = {0, 0};
    for (int it = 0, buf = 0; it < total; it++, buf ^= 1) {
        if (it + 1 < total) {
            const int nb = buf ^ 1;
            fa_dkdv_issue<D>(p, it + 1, n_i, j0, b, g, Qs + nb * TILE, dOs + nb * TILE,
                             segq + nb * FA_ROWS, lse_s + nb * FA_ROWS, dlt_s + nb * FA_ROWS);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (it == 0) {
            sk[0] = segk[key0 - j0];
            sk[1] = segk[key0 + 8 - j0];
        }
        const int i0 = j0 + FA_ROWS * (it % n_i);
        const bf16 *Qt = Qs + buf * TILE, *dOt = dOs + buf * TILE;
        const int *sq = segq + buf * FA_ROWS;
        const float *lse_t = lse_s + buf * FA_ROWS, *dlt_t = dlt_s + buf * FA_ROWS;
        const bool full = fa_tile_full(a, i0, j0);
#pragma unroll 1
        for (int c0 = 0; c0 < FA_ROWS; c0 += QH) { /* queries i0 + c0 .. i0 + c0 + 31 */
            float s[QH / 8][4], dp[QH / 8][4];
            fa_scores<D, QH / 8>(s, Ks + wr * LD, Qt + c0 * LD, lane);   /* S^T */
            fa_scores<D, QH / 8>(dp, Vs + wr * LD, dOt + c0 * LD, lane); /* dP^T */
#pragma unroll
            for (int n = 0; n < QH / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hr = e / 2, c = c0 + n * 8 + 2 * (lane % 4) + e % 2;
                    float pr = 0.0f, ds = 0.0f;
                    if (full || fa_allowed(i0 + c, key0 + 8 * hr, a.T, a.window, sq[c], sk[hr])) {
                        float dx;
                        pr = __expf(att_score(a.scale * s[n][e], a.softcap, &dx) - lse_t[c]);
                        ds = pr * (dp[n][e] - dlt_t[c]) * dx;
                    }
                    s[n][e] = pr;
                    dp[n][e] = ds;
                }
            uint32_t pa[QH / 16][4];
            fa_to_a<QH / 8>(pa, s);
            fa_accumulate<D, QH / 16>(dv, pa, dOt + c0 * LD, lane);
            fa_to_a<QH / 8>(pa, dp);
            fa_accumulate<D, QH / 16>(dk, pa, Qt + c0 * LD, lane);
        }
        __syncthreads();
    }
    if (a.dk.p)
        fa_add_frag<D>(a.dk, dk, a.scale, a.T, b, key0, a.Hkv, g, lane);
    if (a.dv.p)
        fa_add_frag<D>(a.dv, dv, 1.0f, a.T, b, key0, a.Hkv, g, lane);
}

} // namespace fa

#endif
