/* Causal grouped-query attention (GQA / MQA / MHA), fp32 CPU reference.
 *
 * Layout (row-major):
 *   q, out, dq, dout  [B, T, Hq,  D]   element (b,t,h,d) at ((b*T + t)*Hq  + h)*D + d
 *   k, v, dk, dv      [B, T, Hkv, D]   element (b,t,g,d) at ((b*T + t)*Hkv + g)*D + d
 *   lse               [B, Hq, T]       element (b,h,t)   at (b*Hq + h)*T + t
 *   seg               [B, T] int32 segment ids, or NULL (one sequence a row)
 * Query head h reads kv head g = h / G, G = Hq / Hkv (GQA; MQA is Hkv = 1, MHA G = 1).
 *
 * Mask: in row b, query token i may attend to key token j ("j allowed for i") when
 *   j <= i,  and seg[b,j] == seg[b,i] if seg != NULL (packed sequences stay apart),
 *   and i - j < window if window > 0 (sliding window; window counts the token itself).
 * j = i is always allowed, so no softmax row is empty.
 *
 * Forward, per (b, h, i), over allowed j:
 *   S_ij = scale * q_i . k_j, or with softcap c > 0 (Gemma 2's attn_logit_softcapping)
 *   S_ij = c * tanh(scale * q_i . k_j / c)
 *   lse_i = log sum_j exp(S_ij)                   (saved for backward)
 *   P_ij = exp(S_ij - lse_i)
 *   o_i  = sum_j P_ij v_j
 *
 * Backward (given dO; P recomputed from the saved lse, as flash attention does):
 *   Dlt_i = dO_i . o_i                            (= sum_j P_ij dP_ij)
 *   dP_ij = dO_i . v_j
 *   dS_ij = P_ij (dP_ij - Dlt_i)                  (softmax backward)
 *           times 1 - tanh^2(scale * q_i . k_j / c) with a softcap (the chain rule
 *           through c tanh(x / c))
 *   dq_i += scale sum_j dS_ij k_j
 *   dk_j += scale sum_{h in group} sum_i dS_ij q_i
 *   dv_j +=       sum_{h in group} sum_i P_ij dO_i
 * Gradients ACCUMULATE (ops.h convention); any of dq, dk, dv may be NULL.
 *
 * Blocked GEMMs. Queries go in blocks of ATT_BQ rows [i0, i1); a block sees the keys
 * [lo, i1), lo the first key any of its rows may see (window, segment), so the blocks
 * above the causal diagonal are never computed; within the range, the diagonal block's
 * upper triangle and the window / segment mask are applied to the score tile. Keys go
 * in chunks of at most ATT_KC, so a tile is at most ATT_BQ x ATT_KC floats whatever T
 * (nothing of size T x T is ever held). Per block and chunk:
 *   forward   S = scale Q K^T (one GEMM), the mask and softcap, an online softmax over
 *             the chunks (running row maximum m; the partial output and the row sum l,
 *             kept in double, are rescaled by exp(m_old - m_new) when m grows), then
 *             O (+)= P V (one GEMM). At the end o_i /= l and lse_i = m + log(l).
 *   backward  S = scale Q K^T and dP = dO V^T (two GEMMs), P and dS elementwise from
 *             lse and Dlt, then dQ += dS K, dK += dS^T Q, dV += P^T dO (three GEMMs):
 *             the scores are computed once.
 * The GEMMs are OpenBLAS's, called inside the OpenMP loop: its OpenMP build runs a call
 * made inside a parallel region on the calling thread (tests/unit/test_threading.c),
 * so every tile is computed whole by one thread (each concurrent call takes one of
 * OpenBLAS's buffers: 2 * MAX_THREADS of them, 128 in Debian's build, are plenty for
 * one parallel region's threads).
 *
 * Parallelism and determinism: forward tasks are (b, h, query block), each writing its
 * own rows of out and lse. Backward tasks are (b, h): a task walks its query blocks in
 * order, owns the rows of dq of head h, and sums dk / dv of head h over its blocks in
 * that order, into dk / dv themselves when G = 1, else into a per-head [T, D] partial
 * that a second loop adds over the group's heads in head order. Every output element is
 * therefore summed in one fixed order whatever the thread count. Scratch (the tiles,
 * one set a thread, and the partials) is the calling thread's grow-only buffers
 * (cpu_scratch.h): allocated by the first call of a shape, reused by every later one.
 * A task's block is one call of a function cloned per vector width (simd_clones.h), so
 * its element-wise passes run as wide as the CPU allows. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"
#include "cpu_parallel.h"
#include "cpu_scratch.h"
#include "fast_exp.h"
#include "simd_clones.h"

/* Query rows per block, and the most keys per chunk: one score tile is
 * ATT_BQ x ATT_KC floats (128 KiB). */
#define ATT_BQ 64
#define ATT_KC 512

static inline int att_min(int a, int b)
{
    return a < b ? a : b;
}

static inline int att_max(int a, int b)
{
    return a > b ? a : b;
}

/* First key token query i may see through the window (the causal upper bound is i). */
static inline int att_first_key(int i, int window)
{
    return (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
}

/* The first key any of the queries i0 .. i1-1 may see: the least over the rows of the
 * first key in the row's window that is in the row's segment (j = i always is). A row
 * in the same segment as the row before takes that row's key when it is still inside its
 * own window (the least key of a superset range, and in this one), so the scan runs only
 * where the segment changes. */
static int att_block_first_key(const int32_t *sb, int i0, int i1, int window)
{
    int lo = i1 - 1, prev = -1;
    for (int i = i0; i < i1; i++) {
        int j = att_first_key(i, window);
        if (sb && i > i0 && sb[i] == sb[i - 1] && prev >= j) {
            j = prev;
        } else {
            while (sb && sb[j] != sb[i]) {
                j++;
            }
        }
        prev = j;
        lo = att_min(lo, j);
    }
    return lo;
}

/* Whether key j is allowed for query i, given j in [first_key(i), i]. */
static inline int att_in_seg(const int32_t *sb, int i, int j)
{
    return !sb || sb[j] == sb[i];
}

/* The score of a scaled dot product x: x itself, or c tanh(x / c) with a softcap
 * c > 0 (divided, then multiplied, as transformers' eager attention does); *dx gets
 * d score / d x. */
static inline float att_score(float x, float cap, float *dx)
{
    if (cap <= 0.0f) {
        *dx = 1.0f;
        return x;
    }
    const float t = tanhf(x / cap);
    *dx = 1.0f - t * t;
    return cap * t;
}

/* The keys j0 + a .. j0 + e - 1 of a tile over keys j0 .. j0+nc-1 that the window and
 * causality allow for query i (segments aside); e > a may not hold. */
static inline void att_row_span(int i, int c0, int nc, int window, int *a, int *e)
{
    *a = att_max(att_first_key(i, window) - c0, 0);
    *e = att_min(i + 1 - c0, nc);
}

/* s[j] (and t[j] where t is not NULL) = v for the keys j of a tile over keys c0 ..
 * c0+nc-1 that query i may not see: outside the span [a, e) of att_row_span, and inside
 * it those of another segment. (The span's two ends as plain fills, which vectorize.) */
static void att_mask(float *s, float *t, float v, int i, int c0, int nc, const int32_t *sb,
                     int a, int e)
{
    a = att_min(a, nc);
    e = att_max(att_min(e, nc), a);
#pragma omp simd
    for (int j = 0; j < a; j++) {
        s[j] = v;
    }
#pragma omp simd
    for (int j = e; j < nc; j++) {
        s[j] = v;
    }
    if (t) {
        for (int j = 0; j < a; j++) {
            t[j] = v;
        }
        for (int j = e; j < nc; j++) {
            t[j] = v;
        }
    }
    if (!sb) {
        return;
    }
    for (int j = a; j < e; j++) {
        if (!att_in_seg(sb, i, c0 + j)) {
            s[j] = v;
            if (t) {
                t[j] = v;
            }
        }
    }
}

/* Row i of a forward tile over keys c0 .. c0+nc-1: s holds scale * q_i . k_j; it gets
 * the score where j is allowed for i and -inf elsewhere. Returns the row maximum
 * (-inf when no key of the chunk is allowed). */
static float att_row_scores(float *s, int i, int c0, int nc, const int32_t *sb, int window,
                            float cap)
{
    int a, e;
    att_row_span(i, c0, nc, window, &a, &e);
    for (int j = a; j < e && cap > 0.0f; j++) {
        float unused;
        s[j] = att_score(s[j], cap, &unused);
    }
    att_mask(s, NULL, -INFINITY, i, c0, nc, sb, a, e);
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = a; j < e; j++) {
        m = s[j] > m ? s[j] : m;
    }
    return m;
}

/* One forward task: query rows i0 .. i1-1 of (b, h). qb, ob: row i0 of head h (token
 * stride qs); kb, vb: token 0 of kv head g (stride ks); S: a tile; lse_bh: lse of (b, h). */
FT_SIMD_CLONES
static void att_forward_block(float *ob, float *lse_bh, const float *qb, const float *kb,
                              const float *vb, const int32_t *sb, int i0, int i1, int D,
                              size_t qs, size_t ks, float scale, int window, float cap,
                              float *S)
{
    const int nq = i1 - i0, lo = att_block_first_key(sb, i0, i1, window);
    float m[ATT_BQ];
    double l[ATT_BQ];
    for (int r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0;
    }
    for (int c0 = lo; c0 < i1; c0 += ATT_KC) {
        const int nc = att_min(i1 - c0, ATT_KC);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nc, D, scale, qb, (int)qs,
                    kb + (size_t)c0 * ks, (int)ks, 0.0f, S, ATT_KC);
        for (int r = 0; r < nq; r++) {
            float *s = S + (size_t)r * ATT_KC;
            const float bm = att_row_scores(s, i0 + r, c0, nc, sb, window, cap);
            const float mn = bm > m[r] ? bm : m[r];
            if (mn == -INFINITY) {
                for (int j = 0; j < nc; j++) {
                    s[j] = 0.0f; /* nothing allowed for this row yet */
                }
                continue;
            }
            double sum = 0.0; /* the row's share of l, in double like l */
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < nc; j++) {
                s[j] = ft_exp(s[j] - mn); /* masked: exp(-inf) = 0 */
                sum += s[j];
            }
            if (mn > m[r] && m[r] != -INFINITY && c0 != lo) {
                /* the running maximum grew: rescale what the earlier chunks summed */
                const float rs = ft_exp(m[r] - mn);
                float *o = ob + (size_t)r * qs;
                for (int d = 0; d < D; d++) {
                    o[d] *= rs;
                }
                l[r] *= rs;
            }
            l[r] += sum;
            m[r] = mn;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nc, 1.0f, S, ATT_KC,
                    vb + (size_t)c0 * ks, (int)ks, c0 == lo ? 0.0f : 1.0f, ob, (int)qs);
    }
    for (int r = 0; r < nq; r++) {
        /* l >= 1: the maximum's own term is exp(0). */
        const float inv = (float)(1.0 / l[r]);
        float *o = ob + (size_t)r * qs;
        for (int d = 0; d < D; d++) {
            o[d] *= inv;
        }
        lse_bh[i0 + r] = (float)((double)m[r] + log(l[r]));
    }
}

void ft_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *seg, int B, int T, int Hq,
                              int Hkv, int D, float scale, int window, float softcap)
{
    const int G = Hq / Hkv, nib = (T + ATT_BQ - 1) / ATT_BQ;
    const size_t qs = (size_t)Hq * D;  /* between tokens in q / out */
    const size_t ks = (size_t)Hkv * D; /* between tokens in k / v */
    if (B <= 0 || T <= 0 || Hq <= 0) {
        return;
    }
    const size_t tile = (size_t)ATT_BQ * ATT_KC;
    float *scratch = ft_cpu_scratch(FT_SCRATCH_ATT_TILES,
                                    (size_t)omp_get_max_threads() * tile * sizeof(float),
                                    "attention_forward");

#pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            for (int ib = 0; ib < nib; ib++) {
                const int i0 = ib * ATT_BQ, i1 = att_min(T, i0 + ATT_BQ);
                const size_t qoff = ((size_t)b * T + i0) * qs + (size_t)h * D;
                const size_t koff = (size_t)b * T * ks + (size_t)(h / G) * D;
                att_forward_block(out + qoff, lse + ((size_t)b * Hq + h) * T, q + qoff,
                                  k + koff, v + koff, seg ? seg + (size_t)b * T : NULL, i0,
                                  i1, D, qs, ks, scale, window, softcap,
                                  scratch + (size_t)omp_get_thread_num() * tile);
            }
        }
    }
}

/* Row i of a backward tile over keys c0 .. c0+nc-1: s holds scale * q_i . k_j and dp
 * holds dO_i . v_j; they get P_ij and dS_ij scaled by `scale` (0 where j is not
 * allowed for i). */
static void att_row_grads(float *s, float *dp, int i, int c0, int nc, const int32_t *sb,
                          int window, float cap, float scale, float lse_i, float dlt_i)
{
    int a, e;
    att_row_span(i, c0, nc, window, &a, &e);
    if (cap > 0.0f) {
        for (int j = a; j < e; j++) {
            float dx;
            const float x = att_score(s[j], cap, &dx);
            s[j] = ft_exp(x - lse_i);
            dp[j] = scale * s[j] * (dp[j] - dlt_i) * dx;
        }
    } else {
#pragma omp simd
        for (int j = a; j < e; j++) {
            const float p = ft_exp(s[j] - lse_i);
            s[j] = p;
            dp[j] = scale * p * (dp[j] - dlt_i);
        }
    }
    att_mask(s, dp, 0.0f, i, c0, nc, sb, a, e);
}

/* The backward of query rows i0 .. i1-1 of (b, h), pointers as att_forward_block's plus
 * dob, dqb (rows i0 of dout, dq; dq may be NULL) and dkh, dvh (token 0 of head h's dk,
 * dv sums, stride lds; NULL: not wanted). S and dP are two tiles. */
FT_SIMD_CLONES
static void att_backward_block(float *dqb, float *dkh, float *dvh, size_t lds,
                               const float *dob, const float *qb, const float *kb,
                               const float *vb, const float *ob, const float *lse_bh,
                               const int32_t *sb, int i0, int i1, int D, size_t qs,
                               size_t ks, float scale, int window, float cap, float *S,
                               float *dP)
{
    const int nq = i1 - i0, lo = att_block_first_key(sb, i0, i1, window);
    float dlt[ATT_BQ];
    for (int r = 0; r < nq; r++) {
        const float *dor = dob + (size_t)r * qs, *orow = ob + (size_t)r * qs;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int d = 0; d < D; d++) {
            acc += dor[d] * orow[d];
        }
        dlt[r] = acc;
    }
    for (int c0 = lo; c0 < i1; c0 += ATT_KC) {
        const int nc = att_min(i1 - c0, ATT_KC);
        const float *kc = kb + (size_t)c0 * ks, *vc = vb + (size_t)c0 * ks;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nc, D, scale, qb, (int)qs,
                    kc, (int)ks, 0.0f, S, ATT_KC);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nc, D, 1.0f, dob, (int)qs,
                    vc, (int)ks, 0.0f, dP, ATT_KC);
        for (int r = 0; r < nq; r++) {
            att_row_grads(S + (size_t)r * ATT_KC, dP + (size_t)r * ATT_KC, i0 + r, c0, nc,
                          sb, window, cap, scale, lse_bh[i0 + r], dlt[r]);
        }
        if (dqb) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nc, 1.0f, dP,
                        ATT_KC, kc, (int)ks, 1.0f, dqb, (int)qs);
        }
        if (dkh) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, nq, 1.0f, dP, ATT_KC,
                        qb, (int)qs, 1.0f, dkh + (size_t)c0 * lds, (int)lds);
        }
        if (dvh) {
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nc, D, nq, 1.0f, S, ATT_KC,
                        dob, (int)qs, 1.0f, dvh + (size_t)c0 * lds, (int)lds);
        }
    }
}

/* dst[b, t, g] += sum over the group's heads h, in order, of part[b, h, t] (D floats
 * each): the per-head dk or dv sums of a GQA backward. */
static void att_reduce_group(float *dst, const float *part, int B, int T, int Hq, int Hkv,
                             int D)
{
    const int G = Hq / Hkv;
#pragma omp parallel for collapse(2) schedule(static) \
    if ((long)B * T * Hq * D >= FT_PAR_MIN_PASS)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int g = 0; g < Hkv; g++) {
                float *y = dst + (((size_t)b * T + t) * Hkv + g) * D;
                const float *p0 = part + (((size_t)b * Hq + (size_t)g * G) * T + t) * D;
#pragma omp simd
                for (int d = 0; d < D; d++) {
                    float s = p0[d];
                    for (int h = 1; h < G; h++) {
                        s += p0[(size_t)h * T * D + d];
                    }
                    y[d] += s;
                }
            }
        }
    }
}

void ft_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const int32_t *seg,
                               int B, int T, int Hq, int Hkv, int D, float scale,
                               int window, float softcap)
{
    const int G = Hq / Hkv, nib = (T + ATT_BQ - 1) / ATT_BQ;
    const size_t qs = (size_t)Hq * D;
    const size_t ks = (size_t)Hkv * D;
    if ((!dq && !dk && !dv) || B <= 0 || T <= 0 || Hq <= 0) {
        return;
    }
    const size_t tile = (size_t)ATT_BQ * ATT_KC;
    float *scratch = ft_cpu_scratch(FT_SCRATCH_ATT_TILES,
                                    (size_t)omp_get_max_threads() * 2 * tile * sizeof(float),
                                    "attention_backward");
    /* GQA: per-head [T, D] sums of dk and dv, [B, Hq, T, D], added over each group after */
    const size_t npart = G > 1 ? (size_t)B * Hq * T * D : 0;
    float *pk = dk && npart ? ft_cpu_scratch(FT_SCRATCH_ATT_DK, npart * sizeof(float),
                                             "attention_backward")
                            : NULL;
    float *pv = dv && npart ? ft_cpu_scratch(FT_SCRATCH_ATT_DV, npart * sizeof(float),
                                             "attention_backward")
                            : NULL;

#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            const size_t koff = (size_t)b * T * ks + (size_t)(h / G) * D;
            const size_t poff = ((size_t)b * Hq + h) * T * D;
            float *dkh = NULL, *dvh = NULL;
            size_t lds = ks;
            if (G > 1) {
                lds = (size_t)D;
                if (pk) {
                    dkh = pk + poff;
                    memset(dkh, 0, (size_t)T * D * sizeof(float));
                }
                if (pv) {
                    dvh = pv + poff;
                    memset(dvh, 0, (size_t)T * D * sizeof(float));
                }
            } else {
                dkh = dk ? dk + koff : NULL;
                dvh = dv ? dv + koff : NULL;
            }
            float *S = scratch + (size_t)omp_get_thread_num() * 2 * tile;
            for (int ib = 0; ib < nib; ib++) {
                const int i0 = ib * ATT_BQ, i1 = att_min(T, i0 + ATT_BQ);
                const size_t qoff = ((size_t)b * T + i0) * qs + (size_t)h * D;
                att_backward_block(dq ? dq + qoff : NULL, dkh, dvh, lds, dout + qoff, q + qoff,
                                   k + koff, v + koff, out + qoff, lse + ((size_t)b * Hq + h) * T,
                                   seg ? seg + (size_t)b * T : NULL, i0, i1, D, qs, ks, scale,
                                   window, softcap, S, S + tile);
            }
        }
    }
    if (pk) {
        att_reduce_group(dk, pk, B, T, Hq, Hkv, D);
    }
    if (pv) {
        att_reduce_group(dv, pv, B, T, Hq, Hkv, D);
    }
}
