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
 * Computed with an online (running-max) softmax over blocks of ATT_JB keys: each block's
 * scores go to a small stack array, the running maximum m only grows, and when it does
 * the partial output and the denominator l are rescaled by exp(m_old - m_new). l is
 * summed in double. At the end o_i /= l and lse_i = m + log(l). Nothing of size T is
 * allocated.
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
 * Two race-free passes, both fully parallel and deterministic (every output element is
 * written by one thread in a fixed order):
 *   rows:    (b, h, i) -> dq_i      (loop over allowed j <= i)
 *   columns: (b, g, j) -> dk_j, dv_j (loop over the G query heads of kv head g and the
 *                                      allowed i >= j)
 * This recomputes the scores once more than a single pass would, but needs no
 * per-thread dK/dV buffers and keeps all threads busy even when B * Hkv is small
 * (MQA). Dlt is computed once into a [B, Hq, T] buffer (recomputed inline if that
 * allocation fails).
 *
 * Hand-written loops instead of BLAS: the causal / segment / window mask makes the
 * score tiles ragged, and BLAS must not be called from inside the OpenMP regions. The
 * inner loops run over D, contiguous, and vectorize (omp simd for the dot products,
 * whose reduction order the compiler may not change on its own). Keys (forward, dq)
 * or queries (dk, dv) are taken four at a time: one pass over D computes four dot
 * products (four accumulators hide the add latency) or adds four scaled rows into
 * one output row. With seg ids, a group of four with no token of the row's segment
 * is skipped, so packed short sequences cost little outside their own segment. */
#include <math.h>
#include <stdlib.h>

#include "cpu_ops.h"

/* Keys per forward block: the scores of one block live on the stack. */
#define ATT_JB 64

static inline float att_dot(const float *a, const float *b, int D)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; d++) {
        s += a[d] * b[d];
    }
    return s;
}

/* r[c] = a . b[c * stride], c < 4: one query against four keys. */
static inline void att_dot4(const float *a, const float *b, size_t stride, int D,
                            float *r)
{
    const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
    for (int d = 0; d < D; d++) {
        s0 += a[d] * b0[d];
        s1 += a[d] * b1[d];
        s2 += a[d] * b2[d];
        s3 += a[d] * b3[d];
    }
    r[0] = s0;
    r[1] = s1;
    r[2] = s2;
    r[3] = s3;
}

/* y += a * x */
static inline void att_axpy(float *y, float a, const float *x, int D)
{
#pragma omp simd
    for (int d = 0; d < D; d++) {
        y[d] += a * x[d];
    }
}

/* y += sum_c a[c] * x[c * stride], c < 4: one pass over y for four values rows. */
static inline void att_axpy4(float *y, const float *a, const float *x, size_t stride,
                             int D)
{
    const float *x0 = x, *x1 = x + stride, *x2 = x + 2 * stride, *x3 = x + 3 * stride;
    const float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
#pragma omp simd
    for (int d = 0; d < D; d++) {
        y[d] += (a0 * x0[d] + a1 * x1[d]) + (a2 * x2[d] + a3 * x3[d]);
    }
}

/* r[c] = a . b[c * stride] for c < n <= 4. */
static inline void att_dot_n(const float *a, const float *b, size_t stride, int D, int n,
                             float *r)
{
    if (n == 4) {
        att_dot4(a, b, stride, D, r);
        return;
    }
    for (int c = 0; c < n; c++) {
        r[c] = att_dot(a, b + (size_t)c * stride, D);
    }
}

/* y += sum_c a[c] * x[c * stride] for c < n <= 4. */
static inline void att_axpy_n(float *y, const float *a, const float *x, size_t stride,
                              int D, int n)
{
    if (n == 4) {
        att_axpy4(y, a, x, stride, D);
        return;
    }
    for (int c = 0; c < n; c++) {
        att_axpy(y, a[c], x + (size_t)c * stride, D);
    }
}

/* Whether any of tokens t0 .. t0+n-1 is in segment id (always, without seg ids):
 * blocks with none are skipped, so packed rows of short sequences cost little more
 * than integer compares outside their own segment. */
static inline int att_any_in_seg(const int32_t *sb, int t0, int n, int32_t id)
{
    if (!sb) {
        return 1;
    }
    for (int c = 0; c < n; c++) {
        if (sb[t0 + c] == id) {
            return 1;
        }
    }
    return 0;
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

/* First key token query i may see (the causal upper bound is i itself). */
static inline int att_first_key(int i, int window)
{
    return (window > 0 && i - window + 1 > 0) ? i - window + 1 : 0;
}

/* Last query token that may see key j. */
static inline int att_last_query(int j, int T, int window)
{
    return (window > 0 && j + window - 1 < T - 1) ? j + window - 1 : T - 1;
}

void ft_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *seg, int B, int T, int Hq,
                              int Hkv, int D, float scale, int window, float softcap)
{
    const int G = Hq / Hkv;
    const size_t qstride = (size_t)Hq * D;  /* between tokens in q / out */
    const size_t kstride = (size_t)Hkv * D; /* between tokens in k / v */

#pragma omp parallel for collapse(3) schedule(dynamic, 16)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < Hq; h++) {
            for (int i = 0; i < T; i++) {
                const float *qi = q + ((size_t)b * T + i) * qstride + (size_t)h * D;
                float *oi = out + ((size_t)b * T + i) * qstride + (size_t)h * D;
                const float *kb = k + (size_t)b * T * kstride + (size_t)(h / G) * D;
                const float *vb = v + (size_t)b * T * kstride + (size_t)(h / G) * D;
                const int32_t *sb = seg ? seg + (size_t)b * T : NULL;
                const int32_t si = sb ? sb[i] : 0;

                for (int d = 0; d < D; d++) {
                    oi[d] = 0.0f;
                }
                float m = -INFINITY;
                double l = 0.0;
                float s[ATT_JB];
                for (int j0 = att_first_key(i, window); j0 <= i; j0 += ATT_JB) {
                    const int jn = i + 1 - j0 < ATT_JB ? i + 1 - j0 : ATT_JB;
                    for (int jj = 0; jj < jn; jj += 4) {
                        const int n = jn - jj < 4 ? jn - jj : 4;
                        const float *kj = kb + (size_t)(j0 + jj) * kstride;
                        if (att_any_in_seg(sb, j0 + jj, n, si)) {
                            att_dot_n(qi, kj, kstride, D, n, s + jj);
                        }
                    }
                    float bm = -INFINITY;
                    for (int jj = 0; jj < jn; jj++) {
                        float unused;
                        s[jj] = (sb && sb[j0 + jj] != si)
                                    ? -INFINITY
                                    : att_score(scale * s[jj], softcap, &unused);
                        bm = s[jj] > bm ? s[jj] : bm;
                    }
                    if (bm == -INFINITY) {
                        continue; /* the whole block is masked */
                    }
                    if (bm > m) {
                        if (m != -INFINITY) {
                            const float r = expf(m - bm);
                            l *= r;
                            for (int d = 0; d < D; d++) {
                                oi[d] *= r;
                            }
                        }
                        m = bm;
                    }
                    for (int jj = 0; jj < jn; jj++) {
                        s[jj] = expf(s[jj] - m); /* masked: exp(-inf) = 0 */
                        l += s[jj];
                    }
                    for (int jj = 0; jj < jn; jj += 4) {
                        const int n = jn - jj < 4 ? jn - jj : 4;
                        const float *vj = vb + (size_t)(j0 + jj) * kstride;
                        if (att_any_in_seg(sb, j0 + jj, n, si)) {
                            att_axpy_n(oi, s + jj, vj, kstride, D, n);
                        }
                    }
                }
                /* l >= 1: the maximum's own term is exp(0). */
                const float inv = (float)(1.0 / l);
                for (int d = 0; d < D; d++) {
                    oi[d] *= inv;
                }
                lse[((size_t)b * Hq + h) * T + i] = (float)((double)m + log(l));
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
    const int G = Hq / Hkv;
    const size_t qstride = (size_t)Hq * D;
    const size_t kstride = (size_t)Hkv * D;
    if (!dq && !dk && !dv) {
        return;
    }

    /* Dlt [B, Hq, T], laid out like lse. */
    float *dlt = malloc((size_t)B * Hq * T * sizeof(float));
    if (dlt) {
#pragma omp parallel for collapse(3) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < Hq; h++) {
                for (int i = 0; i < T; i++) {
                    const size_t off = ((size_t)b * T + i) * qstride + (size_t)h * D;
                    dlt[((size_t)b * Hq + h) * T + i] = att_dot(dout + off, out + off, D);
                }
            }
        }
    }

    /* Rows: dq_i += scale sum_j dS_ij k_j, four keys j at a time. */
    if (dq) {
#pragma omp parallel for collapse(3) schedule(dynamic, 16)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < Hq; h++) {
                for (int i = 0; i < T; i++) {
                    const size_t off = ((size_t)b * T + i) * qstride + (size_t)h * D;
                    const float *qi = q + off;
                    const float *doi = dout + off;
                    float *dqi = dq + off;
                    const float *kb = k + (size_t)b * T * kstride + (size_t)(h / G) * D;
                    const float *vb = v + (size_t)b * T * kstride + (size_t)(h / G) * D;
                    const int32_t *sb = seg ? seg + (size_t)b * T : NULL;
                    const int32_t si = sb ? sb[i] : 0;
                    const size_t li = ((size_t)b * Hq + h) * T + i;
                    const float lse_i = lse[li];
                    const float dlt_i = dlt ? dlt[li] : att_dot(doi, out + off, D);

                    for (int j0 = att_first_key(i, window); j0 <= i; j0 += 4) {
                        const int n = i + 1 - j0 < 4 ? i + 1 - j0 : 4;
                        if (!att_any_in_seg(sb, j0, n, si)) {
                            continue;
                        }
                        float sc[4], dp[4], ds[4];
                        att_dot_n(qi, kb + (size_t)j0 * kstride, kstride, D, n, sc);
                        att_dot_n(doi, vb + (size_t)j0 * kstride, kstride, D, n, dp);
                        for (int c = 0; c < n; c++) {
                            if (sb && sb[j0 + c] != si) {
                                ds[c] = 0.0f;
                                continue;
                            }
                            float dx;
                            const float x = att_score(scale * sc[c], softcap, &dx);
                            const float p = expf(x - lse_i);
                            ds[c] = scale * p * (dp[c] - dlt_i) * dx;
                        }
                        att_axpy_n(dqi, ds, kb + (size_t)j0 * kstride, kstride, D, n);
                    }
                }
            }
        }
    }

    /* Columns: dk_j, dv_j over the group's query heads and the rows i that see j,
     * four rows i at a time. */
    if (dk || dv) {
#pragma omp parallel for collapse(3) schedule(dynamic, 16)
        for (int b = 0; b < B; b++) {
            for (int g = 0; g < Hkv; g++) {
                for (int j = 0; j < T; j++) {
                    const size_t koff = ((size_t)b * T + j) * kstride + (size_t)g * D;
                    const float *kj = k + koff;
                    const float *vj = v + koff;
                    const int32_t *sb = seg ? seg + (size_t)b * T : NULL;
                    const int32_t sj = sb ? sb[j] : 0;
                    const int ilast = att_last_query(j, T, window);

                    for (int h = g * G; h < (g + 1) * G; h++) {
                        const float *lse_bh = lse + ((size_t)b * Hq + h) * T;
                        const float *dlt_bh = dlt ? dlt + ((size_t)b * Hq + h) * T : NULL;
                        for (int i0 = j; i0 <= ilast; i0 += 4) {
                            const int n = ilast + 1 - i0 < 4 ? ilast + 1 - i0 : 4;
                            if (!att_any_in_seg(sb, i0, n, sj)) {
                                continue;
                            }
                            const size_t off =
                                ((size_t)b * T + i0) * qstride + (size_t)h * D;
                            float sc[4], dp[4], p[4], ds[4];
                            att_dot_n(kj, q + off, qstride, D, n, sc);
                            att_dot_n(vj, dout + off, qstride, D, n, dp);
                            for (int c = 0; c < n; c++) {
                                const int i = i0 + c;
                                if (sb && sb[i] != sj) {
                                    p[c] = ds[c] = 0.0f;
                                    continue;
                                }
                                const size_t oc = off + (size_t)c * qstride;
                                const float dlt_i =
                                    dlt_bh ? dlt_bh[i] : att_dot(dout + oc, out + oc, D);
                                float dx;
                                const float x = att_score(scale * sc[c], softcap, &dx);
                                p[c] = expf(x - lse_bh[i]);
                                ds[c] = scale * p[c] * (dp[c] - dlt_i) * dx;
                            }
                            if (dv) {
                                att_axpy_n(dv + koff, p, dout + off, qstride, D, n);
                            }
                            if (dk) {
                                att_axpy_n(dk + koff, ds, q + off, qstride, D, n);
                            }
                        }
                    }
                }
            }
        }
    }
    free(dlt);
}
