/* Mixture-of-experts routing and token grouping, fp32 CPU reference (ops.h's
 * "mixture of experts" section has the definitions).
 *
 * Router forward, per row n (E experts, top k):
 *   p = softmax(logits[n]) (max-subtracted, the denominator summed in double);
 *   idx[n, 0..k-1] = the k largest p, in descending order (ties: the lower index first);
 *   w[n, j] = p[idx[n, j]], divided by s = sum_j p[idx[n, j]] when renorm.
 * Router backward (the top-k selection is a constant, as torch's autograd treats it):
 *   dp[e] = a[e] (the aux-loss term, 0 when absent) + (selected at j ? g_j : 0), with
 *     g_j = dw_j without renorm, (dw_j - sum_m dw_m w_m) / s with it;
 *   dlogits[n, e] += p[e] (dp[e] - sum_f p[f] dp[f]).
 * The grouped layout (ft_moe_plan) puts the k N (row, expert) pairs expert by expert,
 * rows ascending within an expert; gather, combine and their backwards only read it.
 * combine sums a row's k terms in ascending expert order (as transformers' expert loop
 * index_adds them), each term rounded as fl(w * y). */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

void ft_cpu_moe_router_forward(float *probs, int32_t *idx, float *w, const float *logits,
                               int N, int E, int k, int renorm)
{
#pragma omp parallel for schedule(static) if ((long)N * E >= 32768)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        float *p = probs + (size_t)n * E;
        float mx = l[0];
        for (int e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        double sum = 0.0;
        for (int e = 0; e < E; e++) {
            p[e] = expf(l[e] - mx);
            sum += p[e];
        }
        float inv = (float)(1.0 / sum);
        for (int e = 0; e < E; e++)
            p[e] *= inv;
        int32_t *ix = idx + (size_t)n * k;
        float *wn = w + (size_t)n * k;
        /* selection: k passes, each the largest not yet taken (k is small) */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int m = 0; m < j; m++)
                    taken |= ix[m] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            ix[j] = best;
            wn[j] = p[best];
        }
        if (renorm) {
            float s = 0.0f;
            for (int j = 0; j < k; j++)
                s += wn[j];
            for (int j = 0; j < k; j++)
                wn[j] /= s;
        }
    }
}

void ft_cpu_moe_router_backward(float *dlogits, const float *dw, const float *aux_dp,
                                const float *probs, const int32_t *idx, const float *w,
                                int N, int E, int k, int renorm)
{
#pragma omp parallel for schedule(static) if ((long)N * E >= 32768)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * E;
        const int32_t *ix = idx + (size_t)n * k;
        const float *dwn = dw ? dw + (size_t)n * k : NULL;
        const float *wn = w + (size_t)n * k;
        float *dl = dlogits + (size_t)n * E;
        float s = 0.0f, dot_w = 0.0f;
        if (renorm && dwn) {
            for (int j = 0; j < k; j++) {
                s += p[ix[j]];
                dot_w += dwn[j] * wn[j];
            }
        }
        /* dp is sparse plus the dense aux term: sum_f p[f] dp[f] in double */
        double pdp = 0.0;
        for (int e = 0; e < E; e++) {
            float d = aux_dp ? aux_dp[e] : 0.0f;
            pdp += (double)p[e] * d;
        }
        float g[64]; /* k <= FT_MOE_MAX_K */
        for (int j = 0; j < k; j++) {
            g[j] = !dwn ? 0.0f : renorm ? (dwn[j] - dot_w) / s : dwn[j];
            pdp += (double)p[ix[j]] * g[j];
        }
        float c = (float)pdp;
        for (int e = 0; e < E; e++) {
            float d = aux_dp ? aux_dp[e] : 0.0f;
            for (int j = 0; j < k; j++)
                if (ix[j] == e)
                    d += g[j];
            dl[e] += p[e] * (d - c);
        }
    }
}

void ft_cpu_moe_plan(int32_t *offsets, int32_t *rows, int32_t *slot, const int32_t *idx,
                     int N, int E, int k)
{
    memset(offsets, 0, (size_t)(E + 1) * sizeof(int32_t));
    for (long i = 0; i < (long)N * k; i++)
        offsets[idx[i] + 1]++;
    for (int e = 0; e < E; e++)
        offsets[e + 1] += offsets[e];
    /* fill expert by expert in row order, offsets[e] serving as expert e's cursor (it
     * ends at the next expert's start), then shift the starts back into place */
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < k; j++) {
            int m = offsets[idx[(size_t)n * k + j]]++;
            rows[m] = n;
            slot[(size_t)n * k + j] = m;
        }
    }
    for (int e = E; e > 0; e--)
        offsets[e] = offsets[e - 1];
    offsets[0] = 0;
}

void ft_cpu_moe_gather_forward(float *xe, const float *x, const int32_t *rows, int M, int C)
{
#pragma omp parallel for schedule(static) if ((long)M * C >= 32768)
    for (int m = 0; m < M; m++)
        memcpy(xe + (size_t)m * C, x + (size_t)rows[m] * C, (size_t)C * sizeof(float));
}

void ft_cpu_moe_gather_backward(float *dx, const float *dxe, const int32_t *slot, int N,
                                int k, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * k * C >= 32768)
    for (int n = 0; n < N; n++) {
        float *d = dx + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const float *s = dxe + (size_t)slot[(size_t)n * k + j] * C;
            for (int c = 0; c < C; c++)
                d[c] += s[c];
        }
    }
}

/* The order of row n's k slots by ascending grouped position (= ascending expert). */
static void slot_order(int *ord, const int32_t *sl, int k)
{
    for (int j = 0; j < k; j++)
        ord[j] = j;
    for (int a = 1; a < k; a++)
        for (int b = a; b > 0 && sl[ord[b]] < sl[ord[b - 1]]; b--) {
            int t = ord[b];
            ord[b] = ord[b - 1];
            ord[b - 1] = t;
        }
}

void ft_cpu_moe_combine_forward(float *out, const float *ye, const float *w,
                                const int32_t *slot, int N, int k, int C, int accumulate)
{
#pragma omp parallel for schedule(static) if ((long)N * k * C >= 32768)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        const int32_t *sl = slot + (size_t)n * k;
        int ord[64];
        slot_order(ord, sl, k);
        if (!accumulate)
            memset(o, 0, (size_t)C * sizeof(float));
        for (int a = 0; a < k; a++) {
            int j = ord[a];
            float wj = w[(size_t)n * k + j];
            const float *y = ye + (size_t)sl[j] * C;
            for (int c = 0; c < C; c++)
                o[c] += wj * y[c];
        }
    }
}

void ft_cpu_moe_combine_backward(float *dye, float *dw, const float *dout, const float *ye,
                                 const float *w, const int32_t *slot, int N, int k, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * k * C >= 32768)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            size_t m = (size_t)slot[(size_t)n * k + j];
            const float *y = ye + m * C;
            if (dw) {
                double acc = 0.0;
                for (int c = 0; c < C; c++)
                    acc += (double)d[c] * y[c];
                dw[(size_t)n * k + j] += (float)acc;
            }
            if (dye) {
                float wj = w[(size_t)n * k + j];
                float *dy = dye + m * C;
                for (int c = 0; c < C; c++)
                    dy[c] += wj * d[c];
            }
        }
    }
}

void ft_cpu_moe_lora_b_split(float *dst, const float *src, int out, int r, int E)
{
    size_t rE = (size_t)r * E;
#pragma omp parallel for schedule(static) if ((long)out * r * E >= 32768)
    for (int o = 0; o < out; o++)
        for (int e = 0; e < E; e++)
            for (int j = 0; j < r; j++)
                dst[((size_t)e * out + o) * r + j] = src[(size_t)o * rE + (size_t)j * E + e];
}

void ft_cpu_moe_lora_b_merge_add(float *dst, const float *src, int out, int r, int E)
{
    size_t rE = (size_t)r * E;
#pragma omp parallel for schedule(static) if ((long)out * r * E >= 32768)
    for (int o = 0; o < out; o++)
        for (int e = 0; e < E; e++)
            for (int j = 0; j < r; j++)
                dst[(size_t)o * rE + (size_t)j * E + e] += src[((size_t)e * out + o) * r + j];
}

void ft_cpu_moe_aux_stats(float *counts, float *psum, const float *probs,
                          const int32_t *idx, int N, int E, int k)
{
    for (long i = 0; i < (long)N * k; i++)
        counts[idx[i]] += 1.0f;
    for (int e = 0; e < E; e++) {
        double s = 0.0;
        for (int n = 0; n < N; n++)
            s += probs[(size_t)n * E + e];
        psum[e] += (float)s;
    }
}
