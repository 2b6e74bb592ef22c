/* Unit tests of the mixture-of-experts ops (kernels/ops.h's mixture-of-experts section,
 * kernels/cpu/moe.c), through the dispatcher on CPU views: each forward against a
 * double-precision loop written here, each backward against central finite differences
 * of that double forward (the top-k selection held fixed, as autograd holds it; the
 * seeded inputs keep every selection at least 1e-3 from a tie, far beyond h = 1e-5), and
 * the grouping (plan, gather, combine) against a direct per-pair computation.
 *
 * Backward checks use a random projection L = sum(out * r), so one scalar checks every
 * output's gradient. Tolerances as in test_ops_cpu.c: forward rtol 1e-5; gradients rtol
 * 1e-5 with atol 1e-5 * max|ref|; gather, plan and the index outputs exact. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops.h"

static uint64_t rng_state;

static double urand(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static float *fnew(size_t n)
{
    return xcalloc(n, sizeof(float));
}

static double *dnew(size_t n)
{
    return xcalloc(n, sizeof(double));
}

static void fill(float *a, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(lo + (hi - lo) * urand());
}

static double maxabs(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

static int close_arr(const char *what, const float *got, const double *ref, size_t n,
                     double rtol, double atol)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]);
        if (!(err <= rtol * fabs(ref[i]) + atol)) {
            fprintf(stderr, "  %s[%zu]: got %.9g, want %.9g (err %.3g)\n", what, i, got[i],
                    ref[i], err);
            return 0;
        }
    }
    return 1;
}

static int close_norm(const char *what, const float *got, const double *ref, size_t n)
{
    return close_arr(what, got, ref, n, 1e-5, 1e-5 * maxabs(ref, n));
}

#define FD_H 1e-5
typedef double (*loss_fn)(const void *ctx);

static void fd_grad(loss_fn f, const void *ctx, double *param, size_t n, double *grad)
{
    for (size_t i = 0; i < n; i++) {
        double save = param[i];
        param[i] = save + FD_H;
        double lp = f(ctx);
        param[i] = save - FD_H;
        double lm = f(ctx);
        param[i] = save;
        grad[i] = (lp - lm) / (2 * FD_H);
    }
}

/* Logits whose sorted values per row are at least `gap` apart (so the top-k choice is
 * not a near tie): a random permutation of evenly spaced values plus a small jitter. */
static void fill_logits(float *l, int N, int E, double gap)
{
    for (int n = 0; n < N; n++) {
        int perm[64];
        for (int e = 0; e < E; e++)
            perm[e] = e;
        for (int e = E - 1; e > 0; e--) {
            int r = (int)(urand() * (e + 1));
            int t = perm[e];
            perm[e] = perm[r];
            perm[r] = t;
        }
        double step = 4.0 / E;
        for (int e = 0; e < E; e++)
            l[(size_t)n * E + e] =
                (float)(-2.0 + step * perm[e] + (step - gap) * 0.5 * urand());
    }
}

/* ---- router ------------------------------------------------------------------------ */

typedef struct {
    int N, E, k, renorm;
    double *logits;      /* [N,E] */
    const int32_t *idx;  /* [N,k]: the selection, held fixed */
    const double *rw;    /* [N,k]: projection of w */
    const double *aux;   /* [E] or NULL: projection of probs (same for every row) */
} router_ctx;

/* probs and w in double for the fixed selection; returns sum rw*w + sum aux*probs */
static double router_ref(const router_ctx *c, double *probs, double *w)
{
    double L = 0.0;
    for (int n = 0; n < c->N; n++) {
        const double *l = c->logits + (size_t)n * c->E;
        double mx = l[0], sum = 0.0;
        for (int e = 1; e < c->E; e++)
            mx = fmax(mx, l[e]);
        double p[64];
        for (int e = 0; e < c->E; e++)
            sum += p[e] = exp(l[e] - mx);
        for (int e = 0; e < c->E; e++) {
            p[e] /= sum;
            if (probs)
                probs[(size_t)n * c->E + e] = p[e];
            if (c->aux)
                L += c->aux[e] * p[e];
        }
        double s = 0.0, wn[64];
        for (int j = 0; j < c->k; j++)
            s += wn[j] = p[c->idx[(size_t)n * c->k + j]];
        for (int j = 0; j < c->k; j++) {
            if (c->renorm)
                wn[j] /= s;
            if (w)
                w[(size_t)n * c->k + j] = wn[j];
            if (c->rw)
                L += c->rw[(size_t)n * c->k + j] * wn[j];
        }
    }
    return L;
}

static double router_loss(const void *vc)
{
    return router_ref(vc, NULL, NULL);
}

/* The expected top-k of a row of doubles: descending, lower index first on ties. */
static void topk_ref(int32_t *ix, const float *l, int E, int k)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int m = 0; m < j; m++)
                taken |= ix[m] == e;
            if (!taken && (best < 0 || l[e] > l[best]))
                best = e;
        }
        ix[j] = best;
    }
}

static void router_case(int N, int E, int k, int renorm, int with_aux)
{
    size_t NE = (size_t)N * E, NK = (size_t)N * k;
    float *logits = fnew(NE), *probs = fnew(NE), *w = fnew(NK), *dw = fnew(NK);
    float *aux = fnew(E), *dl = fnew(NE);
    int32_t *idx = xcalloc(NK, sizeof(int32_t)), *want = xcalloc(NK, sizeof(int32_t));
    fill_logits(logits, N, E, 1e-3 * 4.0 / E);
    ft_moe_router_forward(ft_f32(probs, NE), ft_i32(idx, NK), ft_f32(w, NK),
                          ft_f32(logits, NE), N, E, k, renorm);
    for (int n = 0; n < N; n++)
        topk_ref(want + (size_t)n * k, logits + (size_t)n * E, E, k);
    CHECK(memcmp(idx, want, NK * sizeof(int32_t)) == 0);

    double *dlog = dnew(NE), *rw = dnew(NK), *da = dnew(E);
    for (size_t i = 0; i < NE; i++)
        dlog[i] = logits[i];
    fill(dw, NK, -1, 1);
    fill(aux, E, -1, 1);
    for (size_t i = 0; i < NK; i++)
        rw[i] = dw[i];
    for (int e = 0; e < E; e++)
        da[e] = aux[e];
    router_ctx c = {N, E, k, renorm, dlog, want, rw, with_aux ? da : NULL};
    double *pref = dnew(NE), *wref = dnew(NK), *g = dnew(NE);
    router_ref(&c, pref, wref);
    CHECK(close_arr("router probs", probs, pref, NE, 1e-5, 0));
    CHECK(close_arr("router w", w, wref, NK, 1e-5, 0));

    fd_grad(router_loss, &c, dlog, NE, g);
    fill(dl, NE, -1, 1); /* backward accumulates: start from a nonzero gradient */
    float *dl0 = fnew(NE);
    memcpy(dl0, dl, NE * sizeof(float));
    ft_moe_router_backward(ft_f32(dl, NE), ft_f32(dw, NK),
                           with_aux ? ft_f32(aux, E) : ft_none(), ft_f32(probs, NE),
                           ft_i32(idx, NK), ft_f32(w, NK), N, E, k, renorm);
    for (size_t i = 0; i < NE; i++)
        g[i] += dl0[i];
    CHECK(close_norm("router dlogits", dl, g, NE));

    free(logits), free(probs), free(w), free(dw), free(aux), free(dl), free(dl0);
    free(idx), free(want), free(dlog), free(rw), free(da), free(pref), free(wref), free(g);
}

static void test_router(void)
{
    rng_state = 11;
    router_case(7, 8, 2, 1, 0);  /* Mixtral: top-2 of 8, renormalised */
    router_case(7, 8, 2, 1, 1);  /* with the load-balancing term */
    router_case(5, 6, 3, 0, 1);  /* Qwen2-MoE's default: no renorm */
    router_case(5, 6, 3, 1, 0);
    router_case(4, 5, 1, 0, 0);  /* top-1 */
    router_case(4, 5, 1, 1, 1);  /* top-1 renormalised: w = 1, gradient only from aux */
    router_case(3, 4, 4, 1, 1);  /* k = E */
    router_case(3, 60, 8, 0, 1); /* wide */
}

/* Equal logits: the lower expert wins, as the selection's documented tie rule. */
static void test_router_ties(void)
{
    float logits[6] = {0.5f, 1.0f, 1.0f, 0.5f, 1.0f, 0.0f};
    float probs[6], w[3];
    int32_t idx[3];
    ft_moe_router_forward(ft_f32(probs, 6), ft_i32(idx, 3), ft_f32(w, 3), ft_f32(logits, 6),
                          1, 6, 3, 0);
    CHECK(idx[0] == 1 && idx[1] == 2 && idx[2] == 4);
}

/* ---- plan, gather, combine ---------------------------------------------------------- */

static void random_idx(int32_t *idx, int N, int E, int k)
{
    for (int n = 0; n < N; n++) {
        float l[64];
        for (int e = 0; e < E; e++)
            l[e] = (float)urand();
        topk_ref(idx + (size_t)n * k, l, E, k);
    }
}

static void test_plan(void)
{
    rng_state = 12;
    int N = 9, E = 5, k = 2;
    int32_t idx[18], offsets[6], rows[18], slot[18];
    random_idx(idx, N, E, k);
    idx[0] = 4, idx[1] = 3; /* experts 0..2 of row 0 unused: keep some empty experts */
    ft_moe_plan(offsets, rows, slot, idx, N, E, k);
    CHECK(offsets[0] == 0 && offsets[E] == N * k);
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int i = 0; i < N * k; i++)
            cnt += idx[i] == e;
        CHECK(offsets[e + 1] - offsets[e] == cnt);
        for (int m = offsets[e] + 1; m < offsets[e + 1]; m++)
            CHECK(rows[m] > rows[m - 1]); /* ascending rows within an expert */
    }
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            int m = slot[n * k + j], e = idx[n * k + j];
            CHECK(rows[m] == n && m >= offsets[e] && m < offsets[e + 1]);
        }
}

typedef struct {
    int N, k, C;
    const int32_t *slot;
    double *ye, *w;      /* [M,C], [N,k] */
    const double *r;     /* [N,C] */
} comb_ctx;

static double comb_loss(const void *vc)
{
    const comb_ctx *c = vc;
    double L = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->k; j++) {
            const double *y = c->ye + (size_t)c->slot[n * c->k + j] * c->C;
            for (int ch = 0; ch < c->C; ch++)
                L += c->r[(size_t)n * c->C + ch] * c->w[n * c->k + j] * y[ch];
        }
    return L;
}

static void test_gather_combine(void)
{
    rng_state = 13;
    int N = 11, E = 6, k = 3, C = 7, M = N * k;
    int32_t *idx = xcalloc(M, 4), *rows = xcalloc(M, 4), *slot = xcalloc(M, 4);
    int32_t offsets[7];
    random_idx(idx, N, E, k);
    ft_moe_plan(offsets, rows, slot, idx, N, E, k);

    float *x = fnew((size_t)N * C), *xe = fnew((size_t)M * C);
    fill(x, (size_t)N * C, -1, 1);
    ft_moe_gather_forward(ft_f32(xe, (size_t)M * C), ft_f32(x, (size_t)N * C),
                          ft_i32(rows, M), N, k, C);
    int ok = 1;
    for (int m = 0; m < M; m++)
        ok &= memcmp(xe + (size_t)m * C, x + (size_t)rows[m] * C, C * sizeof(float)) == 0;
    CHECK(ok);

    /* gather backward: dx[n] += sum_j dxe[slot[n,j]] */
    float *dxe = fnew((size_t)M * C), *dx = fnew((size_t)N * C);
    fill(dxe, (size_t)M * C, -1, 1);
    fill(dx, (size_t)N * C, -1, 1);
    double *dxr = dnew((size_t)N * C);
    for (int n = 0; n < N; n++)
        for (int ch = 0; ch < C; ch++) {
            double s = dx[(size_t)n * C + ch];
            for (int j = 0; j < k; j++)
                s += dxe[(size_t)slot[n * k + j] * C + ch];
            dxr[(size_t)n * C + ch] = s;
        }
    ft_moe_gather_backward(ft_f32(dx, (size_t)N * C), ft_f32(dxe, (size_t)M * C),
                           ft_i32(slot, M), N, k, C);
    CHECK(close_arr("gather dx", dx, dxr, (size_t)N * C, 1e-6, 1e-6));

    /* combine forward, = and += */
    float *ye = fnew((size_t)M * C), *w = fnew(M), *out = fnew((size_t)N * C);
    fill(ye, (size_t)M * C, -1, 1);
    fill(w, M, 0, 1);
    double *r = dnew((size_t)N * C), *dye_d = dnew((size_t)M * C), *w_d = dnew(M);
    double *outr = dnew((size_t)N * C);
    for (size_t i = 0; i < (size_t)M * C; i++)
        dye_d[i] = ye[i];
    for (int i = 0; i < M; i++)
        w_d[i] = w[i];
    for (int n = 0; n < N; n++)
        for (int ch = 0; ch < C; ch++) {
            double s = 0.0;
            for (int j = 0; j < k; j++)
                s += w_d[n * k + j] * dye_d[(size_t)slot[n * k + j] * C + ch];
            outr[(size_t)n * C + ch] = s;
        }
    fill(out, (size_t)N * C, -5, 5);
    ft_moe_combine_forward(ft_f32(out, (size_t)N * C), ft_f32(ye, (size_t)M * C),
                           ft_f32(w, M), ft_i32(slot, M), N, k, C, 0);
    CHECK(close_arr("combine out", out, outr, (size_t)N * C, 1e-5, 1e-6));
    ft_moe_combine_forward(ft_f32(out, (size_t)N * C), ft_f32(ye, (size_t)M * C),
                           ft_f32(w, M), ft_i32(slot, M), N, k, C, 1);
    for (size_t i = 0; i < (size_t)N * C; i++)
        outr[i] *= 2;
    CHECK(close_arr("combine out (accumulated)", out, outr, (size_t)N * C, 1e-5, 1e-6));

    /* combine backward against finite differences, accumulating onto nonzero grads */
    float *dout = fnew((size_t)N * C), *dye = fnew((size_t)M * C), *dw = fnew(M);
    fill(dout, (size_t)N * C, -1, 1);
    for (size_t i = 0; i < (size_t)N * C; i++)
        r[i] = dout[i];
    fill(dye, (size_t)M * C, -1, 1);
    fill(dw, M, -1, 1);
    comb_ctx c = {N, k, C, slot, dye_d, w_d, r};
    double *gy = dnew((size_t)M * C), *gw = dnew(M);
    fd_grad(comb_loss, &c, dye_d, (size_t)M * C, gy);
    fd_grad(comb_loss, &c, w_d, M, gw);
    for (size_t i = 0; i < (size_t)M * C; i++)
        gy[i] += dye[i];
    for (int i = 0; i < M; i++)
        gw[i] += dw[i];
    ft_moe_combine_backward(ft_f32(dye, (size_t)M * C), ft_f32(dw, M),
                            ft_f32(dout, (size_t)N * C), ft_f32(ye, (size_t)M * C),
                            ft_f32(w, M), ft_i32(slot, M), N, k, C);
    CHECK(close_norm("combine dye", dye, gy, (size_t)M * C));
    CHECK(close_norm("combine dw", dw, gw, M));
    /* either gradient alone */
    float *dw2 = fnew(M);
    ft_moe_combine_backward(ft_none(), ft_f32(dw2, M), ft_f32(dout, (size_t)N * C),
                            ft_f32(ye, (size_t)M * C), ft_f32(w, M), ft_i32(slot, M), N, k,
                            C);
    double *fdw = dnew(M);
    fd_grad(comb_loss, &c, w_d, M, fdw);
    CHECK(close_norm("combine dw (alone)", dw2, fdw, M));

    free(idx), free(rows), free(slot), free(x), free(xe), free(dxe), free(dx), free(dxr);
    free(ye), free(w), free(out), free(r), free(dye_d), free(w_d), free(outr), free(dout);
    free(dye), free(dw), free(gy), free(gw), free(dw2), free(fdw);
}

/* ---- load-balancing loss ------------------------------------------------------------ */

/* Two layers' router logits; the aux loss of transformers' load_balancing_loss_func
 * (no mask) in double with the selections fixed. */
typedef struct {
    int N, E, k, L;
    double *logits;         /* [L,N,E] */
    const int32_t *idx;     /* [L,N,k] */
} aux_ctx;

static double aux_loss(const void *vc)
{
    const aux_ctx *c = vc;
    double cnt[64] = {0}, ps[64] = {0}, R = (double)c->N * c->L;
    for (int l = 0; l < c->L; l++)
        for (int n = 0; n < c->N; n++) {
            const double *lg = c->logits + ((size_t)l * c->N + n) * c->E;
            double mx = lg[0], s = 0.0;
            for (int e = 1; e < c->E; e++)
                mx = fmax(mx, lg[e]);
            for (int e = 0; e < c->E; e++)
                s += exp(lg[e] - mx);
            for (int e = 0; e < c->E; e++)
                ps[e] += exp(lg[e] - mx) / s;
            for (int j = 0; j < c->k; j++)
                cnt[c->idx[((size_t)l * c->N + n) * c->k + j]] += 1.0;
        }
    double a = 0.0;
    for (int e = 0; e < c->E; e++)
        a += (cnt[e] / R) * (ps[e] / R);
    return a * c->E;
}

static void test_aux(void)
{
    rng_state = 14;
    enum { N = 6, E = 5, K = 2, L = 2 };
    size_t NE = (size_t)N * E, NK = (size_t)N * K;
    float logits[L * N * E], probs[L * N * E], w[L * N * K], counts[E] = {0}, psum[E] = {0};
    int32_t idx[L * N * K];
    fill_logits(logits, L * N, E, 1e-3 * 4.0 / E);
    for (int l = 0; l < L; l++) {
        ft_moe_router_forward(ft_f32(probs + l * NE, NE), ft_i32(idx + l * NK, NK),
                              ft_f32(w + l * NK, NK), ft_f32(logits + l * NE, NE), N, E, K, 1);
        ft_moe_aux_stats(ft_f32(counts, E), ft_f32(psum, E), ft_f32(probs + l * NE, NE),
                         ft_i32(idx + l * NK, NK), N, E, K);
    }
    double dl[L * N * E];
    for (size_t i = 0; i < L * NE; i++)
        dl[i] = logits[i];
    aux_ctx c = {N, E, K, L, dl, idx};
    double R = (double)N * L, a = 0.0;
    float cnt_total = 0.0f;
    for (int e = 0; e < E; e++) {
        a += (counts[e] / R) * (psum[e] / R);
        cnt_total += counts[e];
    }
    CHECK(cnt_total == (float)(L * N * K));
    CHECK_CLOSE(a * E, aux_loss(&c), 1e-6);

    /* gradient: router backward with aux_dp = E counts / R^2, no dw */
    float aux_dp[E], dlog[L * N * E];
    for (int e = 0; e < E; e++)
        aux_dp[e] = (float)(E * counts[e] / (R * R));
    memset(dlog, 0, sizeof dlog);
    for (int l = 0; l < L; l++)
        ft_moe_router_backward(ft_f32(dlog + l * NE, NE), ft_none(), ft_f32(aux_dp, E),
                               ft_f32(probs + l * NE, NE), ft_i32(idx + l * NK, NK),
                               ft_f32(w + l * NK, NK), N, E, K, 1);
    double g[L * N * E];
    fd_grad(aux_loss, &c, dl, L * NE, g);
    CHECK(close_norm("aux dlogits", dlog, g, L * NE));
}

/* PEFT's layout of an expert LoRA B (ParamWrapper.get_delta_weight): B.reshape(out, r, E),
 * expert e's B_e[o, j] = B[o, j E + e]. split gives each B_e contiguous, merge_add is its
 * adjoint (<split(B), Y> = <B, merge_add(Y)>), both exact. */
static void test_lora_b_layout(void)
{
    rng_state = 15;
    enum { OUT = 5, R = 3, E = 4 };
    size_t n = (size_t)OUT * R * E;
    float b[OUT * R * E], split[OUT * R * E], y[OUT * R * E], acc[OUT * R * E];
    fill(b, n, -1, 1);
    ft_moe_lora_b_split(ft_f32(split, n), ft_f32(b, n), OUT, R, E);
    int ok = 1;
    for (int e = 0; e < E; e++)
        for (int o = 0; o < OUT; o++)
            for (int j = 0; j < R; j++)
                ok &= split[(e * OUT + o) * R + j] == b[o * R * E + j * E + e];
    CHECK(ok);
    fill(y, n, -1, 1);
    fill(acc, n, -1, 1);
    float acc0[OUT * R * E];
    memcpy(acc0, acc, sizeof acc);
    ft_moe_lora_b_merge_add(ft_f32(acc, n), ft_f32(y, n), OUT, R, E);
    double lhs = 0.0, rhs = 0.0;
    for (size_t i = 0; i < n; i++) {
        lhs += (double)split[i] * y[i];
        rhs += (double)b[i] * ((double)acc[i] - acc0[i]);
    }
    CHECK_CLOSE(lhs, rhs, 1e-6);
    /* merge_add after split gives back B (onto zeros): a permutation */
    float back[OUT * R * E] = {0};
    ft_moe_lora_b_merge_add(ft_f32(back, n), ft_f32(split, n), OUT, R, E);
    CHECK(memcmp(back, b, sizeof b) == 0);
}

int main(void)
{
    RUN(test_router);
    RUN(test_router_ties);
    RUN(test_plan);
    RUN(test_gather_combine);
    RUN(test_aux);
    RUN(test_lora_b_layout);
    return check_summary("test_moe_ops");
}
