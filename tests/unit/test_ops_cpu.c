/* Unit tests of the CPU reference ops (kernels/cpu/): each forward against a plain
 * double-precision loop written here, each backward against central finite differences
 * of that double-precision forward, on seeded random inputs.
 *
 * Backward checks use a random projection L = sum(out * r): dL/dout = r, so one scalar
 * loss checks every output's gradient at once. The finite differences are taken in
 * double on the double reference (h = 1e-5 on O(1) inputs: truncation ~h^2 = 1e-10,
 * cancellation ~1e-16 |L| / h < 1e-9), so they are exact at fp32 resolution and the
 * tolerances below only budget for the fp32 op's own rounding.
 *
 * Tolerances, per element: |got - ref| <= rtol * |ref| + atol, with atol = rtol times
 * the largest |ref| of the array where outputs come out of sums whose terms can cancel
 * (dot products, gradients): fp32 accumulations of K terms of O(1) are good to about
 * sqrt(K) * 6e-8 of the term size, far inside 1e-5 for the sizes used here.
 *   forward ops              rtol 1e-5   (products only: pure relative, atol ~ 0)
 *   backward ops vs FD       rtol 1e-5, atol 1e-5 * max|ref|
 *   cross-entropy loss       1e-6 relative (double sum of per-row double log terms)
 *   sumsq                    1e-12 relative (double accumulation)
 *   adamw, 5 steps           rtol 1e-6, atol 1e-6 * max|ref| (m crosses zero)
 *   copy/add/zero/scale, embedding forward, dropout masks: bitwise.
 *   fast_exp.h's exp             2 ulp of double exp over the normal range.
 * Set FT_TEST_VERBOSE=1 to print, for each comparison, the worst error as a fraction of
 * its allowance. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/cpu_ops.h"
#include "cpu/fast_exp.h"

/* ---- helpers ------------------------------------------------------------------------ */

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
    rng_state = s;
}

/* splitmix64: uniform double in [0, 1). */
static double urand(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1.0p-53;
}

static void fill(float *a, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(lo + (hi - lo) * urand());
}

static float *fnew(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static double *dnew(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static double *to_d(const float *a, size_t n)
{
    double *d = dnew(n);
    for (size_t i = 0; i < n; i++)
        d[i] = a[i];
    return d;
}

static float *fdup(const float *a, size_t n)
{
    float *p = fnew(n);
    memcpy(p, a, n * sizeof(float));
    return p;
}

static double maxabs(const double *a, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

static int verbose;

/* |got[i] - ref[i]| <= rtol |ref[i]| + atol for all i; reports the first failure. */
static int close_arr(const char *what, const float *got, const double *ref, size_t n,
                     double rtol, double atol)
{
    double worst = 0.0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]);
        double allow = rtol * fabs(ref[i]) + atol;
        double ratio = allow > 0 ? err / allow : (err > 0 ? INFINITY : 0.0);
        if (!(ratio <= 1.0)) {
            if (ok)
                fprintf(stderr, "  %s[%zu]: got %.9g, want %.9g (err %.3g, allowed %.3g)\n",
                        what, i, got[i], ref[i], err, allow);
            ok = 0;
        }
        if (ratio > worst || isnan(ratio))
            worst = ratio;
    }
    if (verbose)
        fprintf(stderr, "    %-28s worst err / allowed = %.3g\n", what, worst);
    return ok;
}

/* Normwise-floored comparison: atol = rtol * max|ref|. */
static int close_norm(const char *what, const float *got, const double *ref, size_t n,
                      double rtol)
{
    return close_arr(what, got, ref, n, rtol, rtol * maxabs(ref, n));
}

/* Expected value of a gradient buffer that started as g0 and received `calls`
 * accumulations of grad. */
static double *accum(const float *g0, const double *grad, size_t n, int calls)
{
    double *e = dnew(n);
    for (size_t i = 0; i < n; i++)
        e[i] = (double)g0[i] + calls * grad[i];
    return e;
}

static int bitwise_eq(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* Central differences of a double loss with respect to each element of param (which
 * the loss reads through ctx). */
typedef double (*loss_fn)(const void *ctx);
#define FD_H 1e-5

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

/* ---- linear ------------------------------------------------------------------------- */

typedef struct {
    int N, in, out;
    double alpha;
    double *x, *w, *b, *r; /* b may be NULL */
} lin_ctx;

static void lin_ref(double *y, const lin_ctx *c)
{
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->out; o++) {
            double s = 0.0;
            for (int k = 0; k < c->in; k++)
                s += c->x[(size_t)n * c->in + k] * c->w[(size_t)o * c->in + k];
            y[(size_t)n * c->out + o] = c->alpha * s + (c->b ? c->b[o] : 0.0);
        }
}

static double lin_loss(const void *vc)
{
    const lin_ctx *c = vc;
    size_t ny = (size_t)c->N * c->out;
    double *y = dnew(ny);
    lin_ref(y, c);
    double L = 0.0;
    for (size_t i = 0; i < ny; i++)
        L += y[i] * c->r[i];
    free(y);
    return L;
}

static void test_linear_forward(void)
{
    const int N = 67, in = 150, out = 93;
    const float alpha = 0.75f;
    rng_seed(1);
    float *x = fnew((size_t)N * in), *w = fnew((size_t)out * in), *b = fnew(out);
    float *y0 = fnew((size_t)N * out), *y = fnew((size_t)N * out);
    fill(x, (size_t)N * in, -1, 1);
    fill(w, (size_t)out * in, -1, 1);
    fill(b, out, -1, 1);
    fill(y0, (size_t)N * out, -1, 1);
    lin_ctx c = {N, in, out, alpha, to_d(x, (size_t)N * in), to_d(w, (size_t)out * in),
                 NULL, NULL};
    double *bd = to_d(b, out);
    double *ref = dnew((size_t)N * out);
    size_t ny = (size_t)N * out;
    for (int with_b = 0; with_b <= 1; with_b++)
        for (int acc = 0; acc <= 1; acc++) {
            c.b = with_b ? bd : NULL;
            lin_ref(ref, &c);
            if (acc)
                for (size_t i = 0; i < ny; i++)
                    ref[i] += y0[i];
            /* Overwrite mode must not read y: start from NaN. */
            for (size_t i = 0; i < ny; i++)
                y[i] = acc ? y0[i] : NAN;
            ft_cpu_linear_forward(y, x, w, with_b ? b : NULL, N, in, out, alpha, acc);
            char what[64];
            snprintf(what, sizeof what, "linear y (bias %d, acc %d)", with_b, acc);
            CHECK(close_norm(what, y, ref, ny, 1e-5));
        }
    /* A big enough GEMM for OpenBLAS to use its threads. */
    {
        const int N2 = 256, in2 = 512, out2 = 384;
        float *x2 = fnew((size_t)N2 * in2), *w2 = fnew((size_t)out2 * in2);
        float *b2 = fnew(out2), *y2 = fnew((size_t)N2 * out2);
        fill(x2, (size_t)N2 * in2, -1, 1);
        fill(w2, (size_t)out2 * in2, -1, 1);
        fill(b2, out2, -1, 1);
        lin_ctx c2 = {N2, in2, out2, 1.0, to_d(x2, (size_t)N2 * in2),
                      to_d(w2, (size_t)out2 * in2), to_d(b2, out2), NULL};
        double *ref2 = dnew((size_t)N2 * out2);
        lin_ref(ref2, &c2);
        ft_cpu_linear_forward(y2, x2, w2, b2, N2, in2, out2, 1.0f, 0);
        CHECK(close_norm("linear y (256x512x384)", y2, ref2, (size_t)N2 * out2, 1e-5));
        free(x2), free(w2), free(b2), free(y2), free(ref2);
        free(c2.x), free(c2.w), free(c2.b);
    }
    /* in == 0: an empty product; y is the bias (overwrite) or keeps its value + bias. */
    {
        float yb[3] = {NAN, NAN, NAN}, bb[3] = {1, 2, 3};
        ft_cpu_linear_forward(yb, x, w, bb, 1, 0, 3, 1.0f, 0);
        CHECK(yb[0] == 1 && yb[1] == 2 && yb[2] == 3);
        float yz[2] = {NAN, NAN};
        ft_cpu_linear_forward(yz, x, w, NULL, 1, 0, 2, 1.0f, 0);
        CHECK(yz[0] == 0 && yz[1] == 0);
    }
    free(x), free(w), free(b), free(y0), free(y), free(ref), free(bd);
    free(c.x), free(c.w);
}

static void test_linear_backward(void)
{
    /* out = 130: three column blocks of the db reduction, the last one partial. */
    const int N = 6, in = 11, out = 130;
    const float alpha = 1.5f;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    rng_seed(2);
    float *x = fnew(nx), *w = fnew(nw), *b = fnew(out), *r = fnew(ny);
    fill(x, nx, -1, 1);
    fill(w, nw, -1, 1);
    fill(b, out, -1, 1);
    fill(r, ny, -1, 1);
    lin_ctx c = {N, in, out, alpha, to_d(x, nx), to_d(w, nw), to_d(b, out), to_d(r, ny)};
    double *gx = dnew(nx), *gw = dnew(nw), *gb = dnew(out);
    fd_grad(lin_loss, &c, c.x, nx, gx);
    fd_grad(lin_loss, &c, c.w, nw, gw);
    fd_grad(lin_loss, &c, c.b, out, gb);

    /* Accumulation: two calls onto non-zero buffers add twice. */
    float *dx0 = fnew(nx), *dw0 = fnew(nw), *db0 = fnew(out);
    fill(dx0, nx, -1, 1);
    fill(dw0, nw, -1, 1);
    fill(db0, out, -1, 1);
    float *dx = fdup(dx0, nx), *dw = fdup(dw0, nw), *db = fdup(db0, out);
    ft_cpu_linear_backward(dx, dw, db, r, x, w, N, in, out, alpha);
    ft_cpu_linear_backward(dx, dw, db, r, x, w, N, in, out, alpha);
    double *ex = accum(dx0, gx, nx, 2), *ew = accum(dw0, gw, nw, 2), *eb = accum(db0, gb, out, 2);
    CHECK(close_norm("linear dx (accumulated)", dx, ex, nx, 1e-5));
    CHECK(close_norm("linear dw (accumulated)", dw, ew, nw, 1e-5));
    CHECK(close_norm("linear db (accumulated)", db, eb, out, 1e-5));

    /* NULL outputs are skipped; x is not needed without dw, w not without dx. */
    float *zx = fnew(nx), *zw = fnew(nw), *zb = fnew(out);
    ft_cpu_linear_backward(zx, NULL, NULL, r, NULL, w, N, in, out, alpha);
    ft_cpu_linear_backward(NULL, zw, NULL, r, x, NULL, N, in, out, alpha);
    ft_cpu_linear_backward(NULL, NULL, zb, r, NULL, NULL, N, in, out, alpha);
    CHECK(close_norm("linear dx (alone)", zx, gx, nx, 1e-5));
    CHECK(close_norm("linear dw (alone)", zw, gw, nw, 1e-5));
    CHECK(close_norm("linear db (alone)", zb, gb, out, 1e-5));

    free(x), free(w), free(b), free(r), free(c.x), free(c.w), free(c.b), free(c.r);
    free(gx), free(gw), free(gb), free(dx0), free(dw0), free(db0), free(dx), free(dw);
    free(db), free(ex), free(ew), free(eb), free(zx), free(zw), free(zb);
}

/* Large backward (threaded BLAS and the parallel db path) against the analytic
 * double-precision products. */
static void test_linear_backward_large(void)
{
    const int N = 300, in = 256, out = 320;
    const float alpha = 0.5f;
    const size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    rng_seed(3);
    float *x = fnew(nx), *w = fnew(nw), *dy = fnew(ny);
    fill(x, nx, -1, 1);
    fill(w, nw, -1, 1);
    fill(dy, ny, -1, 1);
    double *ex = dnew(nx), *ew = dnew(nw), *eb = dnew(out);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            double g = dy[(size_t)n * out + o];
            eb[o] += g;
            for (int k = 0; k < in; k++) {
                ex[(size_t)n * in + k] += alpha * g * w[(size_t)o * in + k];
                ew[(size_t)o * in + k] += alpha * g * x[(size_t)n * in + k];
            }
        }
    float *dx = fnew(nx), *dw = fnew(nw), *db = fnew(out);
    ft_cpu_linear_backward(dx, dw, db, dy, x, w, N, in, out, alpha);
    CHECK(close_norm("linear dx (large)", dx, ex, nx, 1e-5));
    CHECK(close_norm("linear dw (large)", dw, ew, nw, 1e-5));
    CHECK(close_norm("linear db (large)", db, eb, out, 1e-5));
    free(x), free(w), free(dy), free(ex), free(ew), free(eb), free(dx), free(dw), free(db);
}

/* ---- embedding ---------------------------------------------------------------------- */

typedef struct {
    int N, C;
    const int32_t *ids;
    double *table, *r;
} emb_ctx;

static double emb_loss(const void *vc)
{
    const emb_ctx *c = vc;
    double L = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->C; j++)
            L += c->table[(size_t)c->ids[n] * c->C + j] * c->r[(size_t)n * c->C + j];
    return L;
}

static void test_embedding(void)
{
    /* Small case against finite differences; ids repeat (N > V). */
    {
        const int N = 20, V = 7, C = 70;
        rng_seed(4);
        int32_t ids[20];
        for (int n = 0; n < N; n++)
            ids[n] = (int32_t)(urand() * V);
        ids[3] = ids[4] = ids[11] = 5;
        float *table = fnew((size_t)V * C), *out = fnew((size_t)N * C);
        float *r = fnew((size_t)N * C);
        fill(table, (size_t)V * C, -1, 1);
        fill(r, (size_t)N * C, -1, 1);
        ft_cpu_embedding_forward(out, ids, table, N, V, C);
        int ok = 1;
        for (int n = 0; n < N; n++)
            ok &= bitwise_eq(out + (size_t)n * C, table + (size_t)ids[n] * C, C);
        CHECK(ok);
        emb_ctx c = {N, C, ids, to_d(table, (size_t)V * C), to_d(r, (size_t)N * C)};
        double *g = dnew((size_t)V * C);
        fd_grad(emb_loss, &c, c.table, (size_t)V * C, g);
        float *d0 = fnew((size_t)V * C);
        fill(d0, (size_t)V * C, -1, 1);
        float *d = fdup(d0, (size_t)V * C);
        ft_cpu_embedding_backward(d, r, ids, N, V, C, -1);
        ft_cpu_embedding_backward(d, r, ids, N, V, C, -1);
        double *e = accum(d0, g, (size_t)V * C, 2);
        CHECK(close_norm("embedding dtable (FD)", d, e, (size_t)V * C, 1e-5));
        /* padding row 5 (three of the ids): its gradient stays as it was, the others
         * get theirs, as torch's nn.Embedding(padding_idx=5) does */
        float *dp = fdup(d0, (size_t)V * C);
        ft_cpu_embedding_backward(dp, r, ids, N, V, C, 5);
        ft_cpu_embedding_backward(dp, r, ids, N, V, C, 5);
        CHECK(bitwise_eq(dp + 5 * C, d0 + 5 * C, C));
        for (int j = 0; j < C; j++)
            e[5 * C + j] = d0[5 * C + j];
        CHECK(close_norm("embedding dtable (padding row)", dp, e, (size_t)V * C, 1e-5));
        free(dp);
        free(table), free(out), free(r), free(c.table), free(c.r), free(g), free(d0);
        free(d), free(e);
    }
    /* Large case (parallel column blocks) with many duplicate ids, against a double
     * scatter-add. */
    {
        const int N = 512, V = 9, C = 300;
        rng_seed(5);
        int32_t *ids = malloc(N * sizeof(int32_t));
        for (int n = 0; n < N; n++)
            ids[n] = (int32_t)(urand() * V);
        float *dout = fnew((size_t)N * C), *d = fnew((size_t)V * C);
        fill(dout, (size_t)N * C, -1, 1);
        double *e = dnew((size_t)V * C);
        for (int n = 0; n < N; n++)
            for (int j = 0; j < C; j++)
                e[(size_t)ids[n] * C + j] += dout[(size_t)n * C + j];
        ft_cpu_embedding_backward(d, dout, ids, N, V, C, -1);
        CHECK(close_norm("embedding dtable (dup ids)", d, e, (size_t)V * C, 1e-5));
        /* Deterministic: a second run from zero gives the same bits. */
        float *d2 = fnew((size_t)V * C);
        ft_cpu_embedding_backward(d2, dout, ids, N, V, C, -1);
        CHECK(bitwise_eq(d, d2, (size_t)V * C));
        free(ids), free(dout), free(d), free(d2), free(e);
    }
}

/* ---- RMSNorm ------------------------------------------------------------------------ */

/* off: the weight offset (0 Llama, 1 Gemma: out = norm(x) * (off + w)) */
typedef struct {
    int N, C;
    double eps;
    double *x, *w, *r;
    double off;
} rms_ctx;

static void rms_ref(double *out, double *rstd, const rms_ctx *c)
{
    for (int n = 0; n < c->N; n++) {
        const double *xn = c->x + (size_t)n * c->C;
        double ss = 0.0;
        for (int j = 0; j < c->C; j++)
            ss += xn[j] * xn[j];
        double rs = 1.0 / sqrt(ss / c->C + c->eps);
        if (rstd)
            rstd[n] = rs;
        for (int j = 0; j < c->C; j++)
            out[(size_t)n * c->C + j] = xn[j] * rs * (c->off + c->w[j]);
    }
}

static double rms_loss(const void *vc)
{
    const rms_ctx *c = vc;
    size_t n = (size_t)c->N * c->C;
    double *out = dnew(n);
    rms_ref(out, NULL, c);
    double L = 0.0;
    for (size_t i = 0; i < n; i++)
        L += out[i] * c->r[i];
    free(out);
    return L;
}

static void rmsnorm_forward_case(float off)
{
    /* Rows of ordinary scale, a large-scale row and a tiny row where eps matters. */
    const int N = 40, C = 300;
    const float eps = 1e-5f;
    const size_t nx = (size_t)N * C;
    rng_seed(6);
    float *x = fnew(nx), *w = fnew(C), *out = fnew(nx), *rstd = fnew(N);
    fill(x, nx, -2, 2);
    fill(w, C, 0.5, 1.5);
    for (int j = 0; j < C; j++) {
        x[1 * C + j] *= 1000.0f;
        x[2 * C + j] *= 1e-3f;
    }
    rms_ctx c = {N, C, eps, to_d(x, nx), to_d(w, C), NULL, off};
    double *ref = dnew(nx), *rref = dnew(N);
    rms_ref(ref, rref, &c);
    ft_cpu_rmsnorm_forward(out, rstd, x, w, N, C, eps, off);
    CHECK(close_arr("rmsnorm out", out, ref, nx, 1e-5, 0.0));
    CHECK(close_arr("rmsnorm rstd", rstd, rref, N, 1e-5, 0.0));
    free(x), free(w), free(out), free(rstd), free(c.x), free(c.w), free(ref), free(rref);
}

static void test_rmsnorm_forward(void)
{
    rmsnorm_forward_case(0.0f);
    rmsnorm_forward_case(1.0f); /* Gemma's (1 + w) */
}

/* The fused residual add: sum = x + res, then the norm of sum; bit for bit the two ops
 * in turn, out of place and in place (sum = x). */
static void add_rmsnorm_forward_case(float off)
{
    const int N = 17, C = 130;
    const size_t nx = (size_t)N * C;
    rng_seed(16);
    float *x = fnew(nx), *res = fnew(nx), *w = fnew(C);
    fill(x, nx, -2, 2);
    fill(res, nx, -1, 1);
    fill(w, C, 0.5, 1.5);
    float *sum_ref = fdup(x, nx), *out_ref = fnew(nx), *rstd_ref = fnew(N);
    ft_cpu_add(sum_ref, res, nx);
    ft_cpu_rmsnorm_forward(out_ref, rstd_ref, sum_ref, w, N, C, 1e-5f, off);
    for (int in_place = 0; in_place < 2; in_place++) {
        float *xi = fdup(x, nx), *sum = in_place ? xi : fnew(nx), *out = fnew(nx),
              *rstd = fnew(N);
        ft_add_rmsnorm_forward(ft_f32(sum, nx), ft_f32(out, nx), ft_f32(rstd, N),
                               ft_f32(xi, nx), ft_f32(res, nx), ft_f32(w, C), N, C, 1e-5f,
                               off);
        CHECK(memcmp(sum, sum_ref, nx * sizeof(float)) == 0);
        CHECK(memcmp(out, out_ref, nx * sizeof(float)) == 0);
        CHECK(memcmp(rstd, rstd_ref, N * sizeof(float)) == 0);
        if (!in_place)
            free(sum);
        free(xi), free(out), free(rstd);
    }
    free(x), free(res), free(w), free(sum_ref), free(out_ref), free(rstd_ref);
}

static void test_add_rmsnorm_forward(void)
{
    add_rmsnorm_forward_case(0.0f);
    add_rmsnorm_forward_case(1.0f);
}

static void rmsnorm_backward_case(float off)
{
    /* C = 150: three dw column blocks, the last one partial. */
    const int N = 5, C = 150;
    const float eps = 1e-5f;
    const size_t nx = (size_t)N * C;
    rng_seed(7);
    float *x = fnew(nx), *w = fnew(C), *r = fnew(nx), *out = fnew(nx), *rstd = fnew(N);
    fill(x, nx, -2, 2);
    fill(w, C, 0.5, 1.5);
    fill(r, nx, -1, 1);
    ft_cpu_rmsnorm_forward(out, rstd, x, w, N, C, eps, off);
    rms_ctx c = {N, C, eps, to_d(x, nx), to_d(w, C), to_d(r, nx), off};
    double *gx = dnew(nx), *gw = dnew(C);
    fd_grad(rms_loss, &c, c.x, nx, gx);
    fd_grad(rms_loss, &c, c.w, C, gw);

    float *dx0 = fnew(nx), *dw0 = fnew(C);
    fill(dx0, nx, -1, 1);
    fill(dw0, C, -1, 1);
    float *dx = fdup(dx0, nx), *dw = fdup(dw0, C);
    ft_cpu_rmsnorm_backward(dx, dw, r, x, w, rstd, N, C, off);
    ft_cpu_rmsnorm_backward(dx, dw, r, x, w, rstd, N, C, off);
    double *ex = accum(dx0, gx, nx, 2), *ew = accum(dw0, gw, C, 2);
    CHECK(close_norm("rmsnorm dx (accumulated)", dx, ex, nx, 1e-5));
    CHECK(close_norm("rmsnorm dw (accumulated)", dw, ew, C, 1e-5));

    float *zx = fnew(nx), *zw = fnew(C);
    ft_cpu_rmsnorm_backward(zx, NULL, r, x, w, rstd, N, C, off);
    ft_cpu_rmsnorm_backward(NULL, zw, r, x, w, rstd, N, C, off);
    CHECK(close_norm("rmsnorm dx (alone)", zx, gx, nx, 1e-5));
    CHECK(close_norm("rmsnorm dw (alone)", zw, gw, C, 1e-5));

    free(x), free(w), free(r), free(out), free(rstd), free(c.x), free(c.w), free(c.r);
    free(gx), free(gw), free(dx0), free(dw0), free(dx), free(dw), free(ex), free(ew);
    free(zx), free(zw);
}

static void test_rmsnorm_backward(void)
{
    rmsnorm_backward_case(0.0f);
    rmsnorm_backward_case(1.0f);
}

/* Large backward (parallel rows and column blocks) against the closed form in double. */
static void rmsnorm_backward_large_case(float off)
{
    const int N = 64, C = 1000;
    const float eps = 1e-6f;
    const size_t nx = (size_t)N * C;
    rng_seed(8);
    float *x = fnew(nx), *w = fnew(C), *dout = fnew(nx), *out = fnew(nx), *rstd = fnew(N);
    fill(x, nx, -2, 2);
    fill(w, C, -1.5, 1.5);
    fill(dout, nx, -1, 1);
    ft_cpu_rmsnorm_forward(out, rstd, x, w, N, C, eps, off);
    double *ex = dnew(nx), *ew = dnew(C);
    for (int n = 0; n < N; n++) {
        const float *xn = x + (size_t)n * C, *gn = dout + (size_t)n * C;
        double ss = 0.0, dot = 0.0;
        for (int j = 0; j < C; j++) {
            ss += (double)xn[j] * xn[j];
            dot += ((double)off + w[j]) * gn[j] * xn[j];
        }
        double rs = 1.0 / sqrt(ss / C + eps);
        for (int j = 0; j < C; j++) {
            ex[(size_t)n * C + j] =
                rs * (((double)off + w[j]) * gn[j] - xn[j] * rs * rs * dot / C);
            ew[j] += (double)gn[j] * xn[j] * rs;
        }
    }
    float *dx = fnew(nx), *dw = fnew(C);
    ft_cpu_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C, off);
    CHECK(close_norm("rmsnorm dx (large)", dx, ex, nx, 1e-5));
    CHECK(close_norm("rmsnorm dw (large)", dw, ew, C, 1e-5));
    free(x), free(w), free(dout), free(out), free(rstd), free(ex), free(ew), free(dx), free(dw);
}

static void test_rmsnorm_backward_large(void)
{
    rmsnorm_backward_large_case(0.0f);
    rmsnorm_backward_large_case(1.0f);
}

/* ---- q/k norm: RMSNorm of the attention's q or k, then RoPE ----------------------------
 *
 * x [N, H, D] (a q or k projection). Per head (qwen3): each head's D values are a norm
 * row, one weight [D] shared by the heads; whole (olmo2): each token's H * D values, a
 * weight [H * D]. Then RoPE at position pos[n]. The model runs the RMSNorm op on N * H
 * rows of D, or N rows of H * D, and the RoPE op; here that chain, forward and backward
 * (the RoPE backward into the norm's backward), against a double loop and its finite
 * differences (the weight's gradient sums over every row: tokens and heads). */
typedef struct {
    int N, H, D, per_head;
    double eps, off;
    double *x, *w, *r;
    const int32_t *pos;
    const float *inv;
} qkn_ctx;

static void qkn_ref(double *out, const qkn_ctx *c)
{
    int W = c->per_head ? c->D : c->H * c->D, D = c->D;
    size_t rows = (size_t)c->N * c->H * c->D / W;
    for (size_t r = 0; r < rows; r++) {
        const double *xr = c->x + r * W;
        double ss = 0.0;
        for (int j = 0; j < W; j++)
            ss += xr[j] * xr[j];
        double rs = 1.0 / sqrt(ss / W + c->eps);
        for (int j = 0; j < W; j++)
            out[r * W + j] = xr[j] * rs * (c->off + c->w[j]);
    }
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->H; h++) {
            double *y = out + ((size_t)n * c->H + h) * D;
            for (int i = 0; i < D / 2; i++) {
                double a = (double)((float)c->pos[n] * c->inv[i]); /* fp32 angle, as HF */
                double co = cos(a), si = sin(a), y1 = y[i], y2 = y[i + D / 2];
                y[i] = y1 * co - y2 * si;
                y[i + D / 2] = y2 * co + y1 * si;
            }
        }
}

static double qkn_loss(const void *vc)
{
    const qkn_ctx *c = vc;
    size_t n = (size_t)c->N * c->H * c->D;
    double *out = dnew(n);
    qkn_ref(out, c);
    double L = 0.0;
    for (size_t i = 0; i < n; i++)
        L += out[i] * c->r[i];
    free(out);
    return L;
}

static void qk_norm_case(int per_head, float off)
{
    const int N = 6, H = 3, D = 8, W = per_head ? D : H * D;
    const int rows = N * H * D / W;
    const size_t nx = (size_t)N * H * D;
    const float eps = 1e-6f;
    const int32_t pos[6] = {0, 1, 2, 7, 31, 3};
    float inv[4];
    for (int i = 0; i < D / 2; i++)
        inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)D);
    rng_seed(21 + per_head);
    float *x = fnew(nx), *w = fnew(W), *r = fnew(nx), *out = fnew(nx), *rstd = fnew(rows);
    fill(x, nx, -2, 2);
    fill(w, W, 0.5, 1.5);
    fill(r, nx, -1, 1);
    qkn_ctx c = {N, H, D, per_head, eps, off, to_d(x, nx), to_d(w, W), to_d(r, nx), pos, inv};

    /* forward: the norm over `rows` rows of W, then RoPE over N tokens of H heads */
    ft_cpu_rmsnorm_forward(out, rstd, x, w, rows, W, eps, off);
    ft_cpu_rope_forward(out, pos, inv, N, H, D, D, 1.0f);
    double *ref = dnew(nx);
    qkn_ref(ref, &c);
    CHECK(close_norm(per_head ? "q/k norm per head fwd" : "q/k norm whole fwd", out, ref, nx,
                     1e-5));

    /* backward: dL/d(out) = r through RoPE's backward, then the norm's */
    double *gx = dnew(nx), *gw = dnew(W);
    fd_grad(qkn_loss, &c, c.x, nx, gx);
    fd_grad(qkn_loss, &c, c.w, W, gw);
    float *d = fdup(r, nx), *dx = fnew(nx), *dw = fnew(W);
    ft_cpu_rope_backward(d, pos, inv, N, H, D, D, 1.0f);
    ft_cpu_rmsnorm_backward(dx, dw, d, x, w, rstd, rows, W, off);
    CHECK(close_norm(per_head ? "q/k norm per head dx" : "q/k norm whole dx", dx, gx, nx, 1e-5));
    CHECK(close_norm(per_head ? "q/k norm per head dw" : "q/k norm whole dw", dw, gw, W, 1e-5));

    free(x), free(w), free(r), free(out), free(rstd), free(c.x), free(c.w), free(c.r);
    free(ref), free(gx), free(gw), free(d), free(dx), free(dw);
}

/* qwen3 (per head, weight [D] shared by the heads) and olmo2 (the whole projection);
 * Gemma 3's q/k norms are per head with (1 + w) */
static void test_qk_norm(void)
{
    qk_norm_case(1, 0.0f);
    qk_norm_case(0, 0.0f);
    qk_norm_case(1, 1.0f);
}

/* ---- SwiGLU ------------------------------------------------------------------------- */

typedef struct {
    size_t n;
    double *g, *u, *r;
} swi_ctx;

static double silu_d(double g)
{
    return g / (1.0 + exp(-g));
}

static double swi_loss(const void *vc)
{
    const swi_ctx *c = vc;
    double L = 0.0;
    for (size_t i = 0; i < c->n; i++)
        L += silu_d(c->g[i]) * c->u[i] * c->r[i];
    return L;
}

static void test_swiglu_forward(void)
{
    const size_t n = 100003;
    rng_seed(9);
    float *g = fnew(n), *u = fnew(n), *out = fnew(n);
    fill(g, n, -12, 12);
    fill(u, n, -2, 2);
    /* Saturated gates: exp(-g) overflows for g < -88; no NaN, silu -> 0 or g. */
    g[0] = -1000.0f, g[1] = -100.0f, g[2] = 100.0f, g[3] = 0.0f, g[4] = -88.5f;
    double *ref = dnew(n);
    for (size_t i = 0; i < n; i++)
        ref[i] = silu_d(g[i]) * u[i];
    ft_cpu_swiglu_forward(out, g, u, n);
    CHECK(close_arr("swiglu out", out, ref, n, 1e-5, 1e-30));
    free(g), free(u), free(out), free(ref);
}

static void test_swiglu_backward(void)
{
    const size_t n = 600;
    rng_seed(10);
    float *g = fnew(n), *u = fnew(n), *r = fnew(n);
    fill(g, n, -8, 8);
    fill(u, n, -2, 2);
    fill(r, n, -1, 1);
    swi_ctx c = {n, to_d(g, n), to_d(u, n), to_d(r, n)};
    double *gg = dnew(n), *gu = dnew(n);
    fd_grad(swi_loss, &c, c.g, n, gg);
    fd_grad(swi_loss, &c, c.u, n, gu);
    /* the gradients overwrite what dgate and dup held (here: not zeros) */
    float *dg = fnew(n), *du = fnew(n);
    fill(dg, n, -1, 1);
    fill(du, n, -1, 1);
    ft_cpu_swiglu_backward(dg, du, r, g, u, n);
    CHECK(close_norm("swiglu dgate (overwritten)", dg, gg, n, 1e-5));
    CHECK(close_norm("swiglu dup (overwritten)", du, gu, n, 1e-5));
    float *zg = fnew(n), *zu = fnew(n);
    fill(zg, n, -1, 1);
    fill(zu, n, -1, 1);
    ft_cpu_swiglu_backward(zg, NULL, r, g, u, n);
    ft_cpu_swiglu_backward(NULL, zu, r, g, u, n);
    CHECK(close_norm("swiglu dgate (alone)", zg, gg, n, 1e-5));
    CHECK(close_norm("swiglu dup (alone)", zu, gu, n, 1e-5));

    /* Saturated gates give finite gradients: silu'(-inf) = 0, silu'(+inf) = 1. */
    float sg[3] = {-1000.0f, -100.0f, 100.0f}, su[3] = {1, 1, 1}, sd[3] = {1, 1, 1};
    float sdg[3] = {0, 0, 0}, sdu[3] = {0, 0, 0};
    ft_cpu_swiglu_backward(sdg, sdu, sd, sg, su, 3);
    CHECK(sdg[0] == 0.0f && sdg[1] == 0.0f && sdg[2] == 1.0f);
    CHECK(sdu[0] == 0.0f && sdu[1] == 0.0f && sdu[2] == 100.0f);

    free(g), free(u), free(r), free(c.g), free(c.u), free(c.r), free(gg), free(gu);
    free(dg), free(du), free(zg), free(zu);
}

/* ---- GeGLU (gelu tanh) -------------------------------------------------------------- */

/* gelu with the tanh approximation, in double */
static double gelu_tanh_d(double g)
{
    return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

static double geg_loss(const void *vc)
{
    const swi_ctx *c = vc;
    double L = 0.0;
    for (size_t i = 0; i < c->n; i++)
        L += gelu_tanh_d(c->g[i]) * c->u[i] * c->r[i];
    return L;
}

static void test_geglu_forward(void)
{
    const size_t n = 100003;
    rng_seed(19);
    float *g = fnew(n), *u = fnew(n), *out = fnew(n);
    fill(g, n, -8, 8);
    fill(u, n, -2, 2);
    /* saturated gates: gelu -> 0 or g, no NaN (g^3 overflows to -inf / inf at 1e20) */
    g[0] = -1e20f, g[1] = -100.0f, g[2] = 100.0f, g[3] = 0.0f, g[4] = 1e20f;
    double *ref = dnew(n);
    for (size_t i = 0; i < n; i++)
        ref[i] = gelu_tanh_d(g[i]) * u[i];
    ft_cpu_geglu_forward(out, g, u, n);
    /* For g < 0, 1 + tanh(inner) cancels: fp32 (as torch computes it) loses digits of the
     * tiny result, up to |g u| 2^-23 absolute (g -8..8, u -2..2: 2e-6). */
    CHECK(close_arr("geglu out", out, ref, n, 1e-5, 2e-6));
    CHECK(out[0] == 0.0f && out[1] == 0.0f && out[2] == 100.0f * u[2]);
    free(g), free(u), free(out), free(ref);
}

/* Against finite differences of the double reference, both gradients and each alone
 * (overwriting what the buffers held), and
 * saturated gates (finite gradients: gelu'(-inf) = 0, gelu'(+inf) = 1). */
static void test_geglu_backward(void)
{
    const size_t n = 600;
    rng_seed(20);
    float *g = fnew(n), *u = fnew(n), *r = fnew(n);
    fill(g, n, -6, 6);
    fill(u, n, -2, 2);
    fill(r, n, -1, 1);
    swi_ctx c = {n, to_d(g, n), to_d(u, n), to_d(r, n)};
    double *gg = dnew(n), *gu = dnew(n);
    fd_grad(geg_loss, &c, c.g, n, gg);
    fd_grad(geg_loss, &c, c.u, n, gu);
    /* the gradients overwrite what dgate and dup held (here: not zeros) */
    float *dg = fnew(n), *du = fnew(n);
    fill(dg, n, -1, 1);
    fill(du, n, -1, 1);
    ft_cpu_geglu_backward(dg, du, r, g, u, n);
    CHECK(close_norm("geglu dgate (overwritten)", dg, gg, n, 1e-5));
    CHECK(close_norm("geglu dup (overwritten)", du, gu, n, 1e-5));
    float *zg = fnew(n), *zu = fnew(n);
    fill(zg, n, -1, 1);
    fill(zu, n, -1, 1);
    ft_cpu_geglu_backward(zg, NULL, r, g, u, n);
    ft_cpu_geglu_backward(NULL, zu, r, g, u, n);
    CHECK(close_norm("geglu dgate (alone)", zg, gg, n, 1e-5));
    CHECK(close_norm("geglu dup (alone)", zu, gu, n, 1e-5));

    float sg[4] = {-1e20f, -100.0f, 100.0f, 1e20f}, su[4] = {1, 1, 1, 1}, sd[4] = {1, 1, 1, 1};
    float sdg[4] = {0}, sdu[4] = {0};
    ft_cpu_geglu_backward(sdg, sdu, sd, sg, su, 4);
    CHECK(sdg[0] == 0.0f && sdg[1] == 0.0f && sdg[2] == 1.0f && sdg[3] == 1.0f);
    CHECK(sdu[0] == 0.0f && sdu[1] == 0.0f && sdu[2] == 100.0f && sdu[3] == 1e20f);

    free(g), free(u), free(r), free(c.g), free(c.u), free(c.r), free(gg), free(gu);
    free(dg), free(du), free(zg), free(zu);
}

/* ---- cross-entropy ------------------------------------------------------------------ */

/* Sum of -log softmax[t] over counted rows; with d != NULL also
 * d = scale * (softmax - onehot) (0 for ignored rows). */
static double ce_ref(double *d, const double *logits, const int32_t *t, int N, int V,
                     double scale)
{
    double L = 0.0;
    for (int n = 0; n < N; n++) {
        const double *row = logits + (size_t)n * V;
        double *dr = d ? d + (size_t)n * V : NULL;
        if (t[n] == -100) {
            if (dr)
                for (int j = 0; j < V; j++)
                    dr[j] = 0.0;
            continue;
        }
        double m = row[0];
        for (int j = 1; j < V; j++)
            m = fmax(m, row[j]);
        double S = 0.0;
        for (int j = 0; j < V; j++)
            S += exp(row[j] - m);
        L += m + log(S) - row[t[n]];
        if (dr)
            for (int j = 0; j < V; j++)
                dr[j] = scale * (exp(row[j] - m) / S - (j == t[n]));
    }
    return L;
}

typedef struct {
    int N, V;
    const int32_t *t;
    double *logits;
} ce_ctx;

static double ce_loss(const void *vc)
{
    const ce_ctx *c = vc;
    return ce_ref(NULL, c->logits, c->t, c->N, c->V, 1.0);
}

static void test_cross_entropy(void)
{
    /* N = 300 > 256 row blocks, so blocks hold one or two rows; parallel path. */
    const int N = 300, V = 257;
    const size_t nl = (size_t)N * V;
    rng_seed(11);
    float *logits = fnew(nl), *d = fnew(nl);
    fill(logits, nl, -4, 4);
    int32_t *t = malloc(N * sizeof(int32_t));
    int count = 0;
    for (int n = 0; n < N; n++) {
        t[n] = n % 5 == 3 ? -100 : (int32_t)(urand() * V);
        count += t[n] != -100;
    }
    t[0] = 0, t[1] = V - 1;
    const float scale = 1.0f / count;
    double *ld = to_d(logits, nl), *ed = dnew(nl);
    double lref = ce_ref(ed, ld, t, N, V, scale);

    for (size_t i = 0; i < nl; i++)
        d[i] = 123.0f; /* ignored rows must be overwritten with 0 */
    double loss = ft_cpu_cross_entropy(d, logits, t, N, V, scale, 0.0f);
    CHECK_CLOSE(loss / lref, 1.0, 1e-6);
    CHECK(close_norm("ce dlogits", d, ed, nl, 1e-5));
    int zero_ok = 1;
    for (int n = 0; n < N; n++)
        if (t[n] == -100)
            for (int j = 0; j < V; j++)
                zero_ok &= d[(size_t)n * V + j] == 0.0f;
    CHECK(zero_ok);

    /* Without dlogits: the same loss, bit for bit. */
    double loss2 = ft_cpu_cross_entropy(NULL, logits, t, N, V, scale, 0.0f);
    CHECK(loss2 == loss);

    /* In place: dlogits aliasing logits gives the same bits as out of place. */
    float *inplace = fdup(logits, nl);
    double loss3 = ft_cpu_cross_entropy(inplace, inplace, t, N, V, scale, 0.0f);
    CHECK(loss3 == loss);
    CHECK(bitwise_eq(inplace, d, nl));

    /* All rows ignored: loss 0, gradient 0. */
    int32_t *none = malloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++)
        none[n] = -100;
    for (size_t i = 0; i < nl; i++)
        d[i] = 123.0f;
    double loss0 = ft_cpu_cross_entropy(d, logits, none, N, V, 1.0f, 0.0f);
    CHECK(loss0 == 0.0);
    int all_zero = 1;
    for (size_t i = 0; i < nl; i++)
        all_zero &= d[i] == 0.0f;
    CHECK(all_zero);

    /* Wide logits (spread of hundreds): max subtraction keeps it finite and exact. */
    for (size_t i = 0; i < nl; i++)
        logits[i] *= 60.0f;
    free(ld);
    ld = to_d(logits, nl);
    lref = ce_ref(ed, ld, t, N, V, scale);
    loss = ft_cpu_cross_entropy(d, logits, t, N, V, scale, 0.0f);
    CHECK(isfinite(loss));
    CHECK_CLOSE(loss / lref, 1.0, 1e-6);
    CHECK(close_norm("ce dlogits (wide)", d, ed, nl, 1e-5));

    free(logits), free(d), free(t), free(ld), free(ed), free(inplace), free(none);
}

static void test_cross_entropy_fd(void)
{
    /* dlogits = grad_scale * d(sum loss)/d(logits), against finite differences. */
    const int N = 6, V = 50;
    const size_t nl = (size_t)N * V;
    const float scale = 0.25f;
    rng_seed(12);
    float *logits = fnew(nl), *d = fnew(nl);
    fill(logits, nl, -3, 3);
    int32_t t[6] = {3, -100, 49, 0, 17, -100};
    ce_ctx c = {N, V, t, to_d(logits, nl)};
    double *g = dnew(nl);
    fd_grad(ce_loss, &c, c.logits, nl, g);
    for (size_t i = 0; i < nl; i++)
        g[i] *= scale;
    ft_cpu_cross_entropy(d, logits, t, N, V, scale, 0.0f);
    CHECK(close_norm("ce dlogits (FD)", d, g, nl, 1e-5));
    free(logits), free(d), free(c.logits), free(g);
}

/* Soft-capped logits (Gemma 2's final_logit_softcapping): the loss of z = c tanh(x / c)
 * as a function of the uncapped x, in double. */
typedef struct cap_ctx {
    int N, V;
    const int32_t *t;
    double *x;
    double cap;
} cap_ctx;

static double cap_loss(const void *vc)
{
    const cap_ctx *c = vc;
    size_t n = (size_t)c->N * c->V;
    double *z = dnew(n);
    for (size_t i = 0; i < n; i++)
        z[i] = c->cap * tanh(c->x[i] / c->cap);
    double L = ce_ref(NULL, z, c->t, c->N, c->V, 1.0);
    free(z);
    return L;
}

static void test_softcap_cross_entropy_fd(void)
{
    /* ft_cpu_softcap, then the loss of the capped logits and dlogits w.r.t. the uncapped
     * ones (cap 4 on logits of +-8: well into tanh's bend), against finite differences;
     * in place the same bits. */
    const int N = 6, V = 50;
    const size_t nl = (size_t)N * V;
    const float scale = 0.25f, cap = 4.0f;
    rng_seed(14);
    float *x = fnew(nl), *z = fnew(nl), *d = fnew(nl);
    fill(x, nl, -8, 8);
    int32_t t[6] = {3, -100, 49, 0, 17, -100};
    cap_ctx c = {N, V, t, to_d(x, nl), cap};
    memcpy(z, x, nl * sizeof(float));
    ft_cpu_softcap(z, cap, nl);
    int cap_ok = 1;
    for (size_t i = 0; i < nl; i++)
        cap_ok &= z[i] == tanhf(x[i] / cap) * cap && fabsf(z[i]) < cap;
    CHECK(cap_ok);
    double *g = dnew(nl);
    fd_grad(cap_loss, &c, c.x, nl, g);
    for (size_t i = 0; i < nl; i++)
        g[i] *= scale;
    double loss = ft_cpu_cross_entropy(d, z, t, N, V, scale, cap);
    CHECK_CLOSE(loss / cap_loss(&c), 1.0, 1e-6);
    CHECK(close_norm("softcapped ce dlogits (FD)", d, g, nl, 1e-5));
    /* without the cap's factor the gradient is another one (the test can fail) */
    float *d0 = fnew(nl);
    ft_cpu_cross_entropy(d0, z, t, N, V, scale, 0.0f);
    CHECK(!close_norm("(uncapped gradient, expected to differ)", d0, g, nl, 1e-3));
    float *inplace = fdup(z, nl);
    CHECK(ft_cpu_cross_entropy(inplace, inplace, t, N, V, scale, cap) == loss);
    CHECK(bitwise_eq(inplace, d, nl));
    free(x), free(z), free(d), free(d0), free(c.x), free(g), free(inplace);
}

/* ---- elementwise -------------------------------------------------------------------- */

static void test_elementwise(void)
{
    const size_t sizes[2] = {1001, 200003}; /* serial and parallel paths */
    rng_seed(13);
    for (int s = 0; s < 2; s++) {
        size_t n = sizes[s];
        float *x = fnew(n), *y0 = fnew(n), *y = fnew(n), *e = fnew(n);
        fill(x, n, -3, 3);
        fill(y0, n, -3, 3);

        memcpy(y, y0, n * sizeof(float));
        ft_cpu_add(y, x, n);
        for (size_t i = 0; i < n; i++)
            e[i] = y0[i] + x[i];
        CHECK(bitwise_eq(y, e, n));

        memcpy(y, y0, n * sizeof(float));
        ft_cpu_copy(y, x, n);
        CHECK(bitwise_eq(y, x, n));

        memcpy(y, y0, n * sizeof(float));
        ft_cpu_zero(y, n);
        int zero = 1;
        for (size_t i = 0; i < n; i++)
            zero &= y[i] == 0.0f;
        CHECK(zero);

        memcpy(y, y0, n * sizeof(float));
        ft_cpu_scale(y, 0.37f, n);
        for (size_t i = 0; i < n; i++)
            e[i] = y0[i] * 0.37f;
        CHECK(bitwise_eq(y, e, n));

        double ref = 0.0;
        for (size_t i = 0; i < n; i++)
            ref += (double)x[i] * x[i];
        double got = ft_cpu_sumsq(x, n);
        CHECK_CLOSE(got / ref, 1.0, 1e-12);
        CHECK(ft_cpu_sumsq(x, n) == got); /* deterministic */
        free(x), free(y0), free(y), free(e);
    }
    CHECK(ft_cpu_sumsq(NULL, 0) == 0.0);
    float one = 3.0f;
    CHECK(ft_cpu_sumsq(&one, 1) == 9.0);
}

/* ---- embedding of a transposed table: the embedding of the transpose -------------- */

static void test_embedding_t(void)
{
    enum { N = 9, V = 7, C = 3 };
    int32_t ids[N] = {0, 6, 3, 3, 1, 6, 6, 2, 5};
    float t[C * V], tt[V * C], out[N * C], want[N * C], dout[N * C];
    float dt[C * V], dtt[V * C];
    rng_seed(21);
    fill(t, C * V, -1, 1);
    fill(dout, N * C, -1, 1);
    for (int c = 0; c < C; c++)
        for (int v = 0; v < V; v++) {
            tt[v * C + c] = t[c * V + v];
            dt[c * V + v] = 0.25f * (float)(c - v);
            dtt[v * C + c] = dt[c * V + v];
        }
    ft_cpu_embedding_t_forward(out, ids, t, N, V, C);
    ft_cpu_embedding_forward(want, ids, tt, N, V, C);
    CHECK(bitwise_eq(out, want, N * C));
    /* no padding row, then 6 (three of the ids) as padding_idx: the transposed table's
     * gradient equals the plain one's, the padding row untouched in both */
    for (int pad = -1; pad <= 6; pad += 7) {
        float dt0[C * V];
        memcpy(dt0, dt, sizeof dt);
        ft_cpu_embedding_t_backward(dt, dout, ids, N, V, C, pad);
        ft_cpu_embedding_backward(dtt, dout, ids, N, V, C, pad);
        int same = 1, kept = 1;
        for (int c = 0; c < C; c++) {
            for (int v = 0; v < V; v++)
                same &= dt[c * V + v] == dtt[v * C + c];
            kept &= pad < 0 || dt[c * V + pad] == dt0[c * V + pad];
        }
        CHECK(same && kept);
    }
}

/* ---- DoRA helpers: known values ------------------------------------------------------ */

static void test_dora_ops(void)
{
    /* rows [3, 4] and [0, -2]: norms 5 and 2 */
    float w[4] = {3, 4, 0, -2}, mag[2] = {10, -1}, g[2], inv[2];
    ft_cpu_dora_norm(g, inv, mag, w, 2, 2);
    CHECK(g[0] == 2.0f && g[1] == -0.5f && inv[0] == 0.2f && inv[1] == 0.5f);
    /* y[n,c] = (2 g[c] - 1) x[n,c], then += the same */
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6], sc[3] = {1, 0.5f, -1};
    ft_cpu_col_scale(y, x, sc, 2.0f, -1.0f, 2, 3, 0);
    float want[6] = {1, 0, -9, 4, 0, -18};
    CHECK(bitwise_eq(y, want, 6));
    ft_cpu_col_scale(y, x, sc, 2.0f, -1.0f, 2, 3, 1);
    for (int i = 0; i < 6; i++)
        want[i] *= 2;
    CHECK(bitwise_eq(y, want, 6));
    /* d[c] += s[c] sum_n x[n,c] y[n,c]: columns (1*2 + 4*8, 0, 3*-18 + 6*-36) */
    float d[3] = {1, 1, 1}, s[3] = {0.5f, 2, -1};
    ft_cpu_col_dot(d, x, y, s, 2, 3);
    float dw[3] = {1 + 0.5f * 34, 1, 1 + 270};
    CHECK(bitwise_eq(d, dw, 3));
}

/* ---- LoRA linear ---------------------------------------------------------------------- */

/* out[n, o] = sum_k a[n, k] b[o, k]: a [rows, K], b [cols, K] */
static void dot_rows(double *out, const float *a, const float *b, int rows, int cols, int K)
{
    for (int n = 0; n < rows; n++)
        for (int o = 0; o < cols; o++) {
            double acc = 0;
            for (int k = 0; k < K; k++)
                acc += (double)a[(size_t)n * K + k] * b[(size_t)o * K + k];
            out[(size_t)n * cols + o] = acc;
        }
}

/* ft_cpu_lora_linear_forward / backward against their definitions in double: y = x W^T
 * + b + s h B^T with h = xd A^T; dx += dy W + dh A, dB += s dy^T h, dh = s dy B, dA +=
 * dh^T xd, gradients accumulating onto what the buffers held. Shapes small enough to run
 * whole, and large ones whose GEMMs are cut into blocks (cpu_gemm.c). */
static void lora_linear_case(int N, int in, int out, int r, int bias, int compute_h,
                             int with_dx_lora)
{
    float s = 2.0f / (float)r;
    size_t nx = (size_t)N * in, ny = (size_t)N * out, nh = (size_t)N * r;
    float *x = fnew(nx), *xd = fnew(nx), *w = fnew((size_t)out * in), *b = fnew(out);
    float *a = fnew((size_t)r * in), *bl = fnew((size_t)out * r), *dy = fnew(ny);
    float *y = fnew(ny), *h = fnew(nh), *dh = fnew(nh), *dx = fnew(nx);
    float *ga = fnew((size_t)r * in), *gb = fnew((size_t)out * r);
    fill(x, nx, -1, 1);
    fill(xd, nx, -1, 1);
    fill(w, (size_t)out * in, -0.5, 0.5);
    fill(b, out, -1, 1);
    fill(a, (size_t)r * in, -0.5, 0.5);
    fill(bl, (size_t)out * r, -0.5, 0.5);
    fill(dy, ny, -1, 1);
    fill(y, ny, -9, 9); /* overwritten */
    fill(dh, nh, -9, 9); /* overwritten */
    fill(dx, nx, -1, 1);
    fill(ga, (size_t)r * in, -1, 1);
    fill(gb, (size_t)out * r, -1, 1);
    if (compute_h)
        fill(h, nh, -9, 9); /* overwritten */
    else
        fill(h, nh, -1, 1); /* a fused module's first block's */
    double *href = dnew(nh), *yref = dnew(ny), *t = dnew(ny > nx ? ny : nx);
    if (compute_h)
        dot_rows(href, xd, a, N, r, in);
    else
        for (size_t i = 0; i < nh; i++)
            href[i] = h[i];
    dot_rows(yref, x, w, N, out, in);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < out; o++) {
            double acc = 0;
            for (int k = 0; k < r; k++)
                acc += href[(size_t)n * r + k] * bl[(size_t)o * r + k];
            yref[(size_t)n * out + o] += (bias ? b[o] : 0.0) + (double)s * acc;
        }
    ft_cpu_lora_linear_forward(y, h, x, xd, w, bias ? b : NULL, a, bl, N, in, out, r, s,
                               compute_h);
    CHECK(close_norm("lora y", y, yref, ny, 1e-5));
    CHECK(close_norm("lora h", h, href, nh, 1e-5));

    /* backward, from the forward's h (as float, as the op reads it) */
    double *dhref = dnew(nh), *dxref = to_d(dx, nx), *garef = to_d(ga, (size_t)r * in);
    double *gbref = to_d(gb, (size_t)out * r);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < r; k++) {
            double acc = 0;
            for (int o = 0; o < out; o++)
                acc += (double)dy[(size_t)n * out + o] * bl[(size_t)o * r + k];
            dhref[(size_t)n * r + k] = s * acc;
        }
    for (int n = 0; n < N; n++)
        for (int i = 0; i < in; i++) {
            double acc = 0;
            for (int o = 0; o < out; o++)
                acc += (double)dy[(size_t)n * out + o] * w[(size_t)o * in + i];
            for (int k = 0; k < r && with_dx_lora; k++)
                acc += dhref[(size_t)n * r + k] * a[(size_t)k * in + i];
            dxref[(size_t)n * in + i] += acc;
        }
    for (int o = 0; o < out; o++)
        for (int k = 0; k < r; k++) {
            double acc = 0;
            for (int n = 0; n < N; n++)
                acc += (double)dy[(size_t)n * out + o] * h[(size_t)n * r + k];
            gbref[(size_t)o * r + k] += s * acc;
        }
    for (int k = 0; k < r; k++)
        for (int i = 0; i < in; i++) {
            double acc = 0;
            for (int n = 0; n < N; n++)
                acc += dhref[(size_t)n * r + k] * xd[(size_t)n * in + i];
            garef[(size_t)k * in + i] += acc;
        }
    ft_cpu_lora_linear_backward(dx, with_dx_lora ? dx : NULL, ga, gb, dh, dy, xd, h, w, a, bl,
                                N, in, out, r, s);
    CHECK(close_norm("lora dh", dh, dhref, nh, 1e-5));
    CHECK(close_norm("lora dx", dx, dxref, nx, 1e-5));
    CHECK(close_norm("lora dA", ga, garef, (size_t)r * in, 1e-5));
    CHECK(close_norm("lora dB", gb, gbref, (size_t)out * r, 1e-5));
    void *all[] = {x, xd, w, b, a, bl, dy, y, h, dh, dx, ga, gb, href, yref, t, dhref, dxref,
                   garef, gbref};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static void test_lora_linear(void)
{
    rng_seed(31);
    lora_linear_case(7, 5, 6, 2, 0, 1, 1);
    lora_linear_case(37, 29, 41, 3, 1, 1, 1);
    lora_linear_case(37, 29, 41, 3, 0, 0, 1);  /* a fused module's later block */
    lora_linear_case(45, 33, 18, 4, 1, 1, 0);  /* dropout: dx_lora is the caller's */
    lora_linear_case(512, 576, 192, 16, 0, 1, 1); /* SmolLM's k / v: cut into blocks */
    lora_linear_case(300, 1536, 576, 8, 1, 1, 1);
}

/* ---- dropout ------------------------------------------------------------------------ */

static void test_dropout(void)
{
    const size_t n = 1u << 20;
    const uint64_t seed = 1234, offset = 77;
    rng_seed(14);
    float *x = fnew(n), *out = fnew(n), *out2 = fnew(n);
    fill(x, n, 0.5, 2); /* no zeros: out == 0 means dropped */

    /* p = 0: forward is a copy, backward an add. */
    ft_cpu_dropout_forward(out, x, n, 0.0f, seed, offset);
    CHECK(bitwise_eq(out, x, n));
    float *dx = fnew(n), *e = fnew(n);
    fill(dx, n, -1, 1);
    for (size_t i = 0; i < n; i++)
        e[i] = dx[i] + x[i];
    ft_cpu_dropout_backward(dx, x, n, 0.0f, seed, offset);
    CHECK(bitwise_eq(dx, e, n));

    const float ps[3] = {0.1f, 0.5f, 0.9f};
    for (int k = 0; k < 3; k++) {
        float p = ps[k];
        float kscale = 1.0f / (float)(1.0 - (double)p);
        ft_cpu_dropout_forward(out, x, n, p, seed, offset);
        /* Kept elements are exactly x * 1/(1-p); the kept fraction is 1 - p within
         * 6 standard deviations of a binomial(n, 1 - p). */
        size_t kept = 0;
        int vals_ok = 1;
        for (size_t i = 0; i < n; i++) {
            if (out[i] != 0.0f) {
                kept++;
                vals_ok &= out[i] == x[i] * kscale;
            }
        }
        CHECK(vals_ok);
        double frac = (double)kept / n, sd = sqrt(p * (1.0 - p) / n);
        CHECK(fabs(frac - (1.0 - p)) < 6 * sd);
        if (verbose)
            fprintf(stderr, "    dropout p=%.1f kept %.5f (sd %.2g)\n", p, frac, sd);

        /* Same mask on a repeated call. */
        ft_cpu_dropout_forward(out2, x, n, p, seed, offset);
        CHECK(bitwise_eq(out, out2, n));

        /* Pure function of offset + i: a piece at offset + 1000 is a slice of the whole. */
        ft_cpu_dropout_forward(out2, x + 1000, 5000, p, seed, offset + 1000);
        CHECK(bitwise_eq(out + 1000, out2, 5000));

        /* Backward uses forward's mask: dx0 + dout * keep / (1 - p). */
        float *dout = fnew(n), *dx0 = fnew(n);
        fill(dout, n, -1, 1);
        fill(dx0, n, -1, 1);
        memcpy(dx, dx0, n * sizeof(float));
        ft_cpu_dropout_backward(dx, dout, n, p, seed, offset);
        int bw_ok = 1;
        for (size_t i = 0; i < n; i++) {
            float want = out[i] != 0.0f ? dx0[i] + dout[i] * kscale : dx0[i];
            bw_ok &= dx[i] == want;
        }
        CHECK(bw_ok);
        free(dout), free(dx0);

        /* Another seed gives an independent mask: agreement ~ p^2 + (1-p)^2. */
        ft_cpu_dropout_forward(out2, x, n, p, seed + 1, offset);
        size_t agree = 0;
        for (size_t i = 0; i < n; i++)
            agree += (out[i] != 0.0f) == (out2[i] != 0.0f);
        double q = p * p + (1.0 - p) * (1.0 - p);
        CHECK(fabs((double)agree / n - q) < 6 * sqrt(q * (1 - q) / n));
    }

    /* p = 1 drops everything. */
    ft_cpu_dropout_forward(out, x, 1000, 1.0f, seed, offset);
    int zero = 1;
    for (size_t i = 0; i < 1000; i++)
        zero &= out[i] == 0.0f;
    CHECK(zero);
    free(x), free(out), free(out2), free(dx), free(e);
}

/* ---- AdamW -------------------------------------------------------------------------- */

/* fast_exp.h's vectorized exp against double exp: within 2 ulp (of the float result)
 * over the normal range on a dense sweep, 0 below it (and at -inf), +inf above it,
 * NaN kept; the loop is the kind the kernels vectorize. */
static void test_fast_exp(void)
{
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++)
        x[i] = -90.0f + 180.0f * (float)i / (float)N;
#pragma omp simd
    for (int i = 0; i < N; i++)
        y[i] = ft_exp(x[i]);
    double worst = 0.0;
    for (int i = 0; i < N; i++) {
        double e = exp((double)x[i]);
        if (x[i] < -87.33654f) {
            CHECK(y[i] == 0.0f);
        } else if (x[i] > 88.72284f) {
            CHECK(isinf(y[i]) && y[i] > 0);
        } else {
            double ulp = ldexp(1.0, ilogb((float)e) - 23);
            worst = fmax(worst, fabs((double)y[i] - e) / ulp);
        }
    }
    CHECK(worst <= 2.0);
    CHECK(ft_exp(-INFINITY) == 0.0f);
    CHECK(ft_exp(INFINITY) == INFINITY);
    CHECK(isnan(ft_exp(NAN)));
    CHECK(ft_exp(0.0f) == 1.0f);
    free(x);
    free(y);
}

static void test_adamw(void)
{
    const size_t sizes[2] = {1000, 50000}; /* serial and parallel paths */
    const ft_adamw_hparams hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f};
    const float grad_scale = 0.5f;
    const int steps = 5;
    rng_seed(15);
    for (int s = 0; s < 2; s++) {
        size_t n = sizes[s];
        float *p = fnew(n), *g = fnew(n), *m = fnew(n), *v = fnew(n);
        fill(p, n, -1, 1);
        double *pd = to_d(p, n), *md = dnew(n), *vd = dnew(n);
        for (int step = 1; step <= steps; step++) {
            fill(g, n, -2, 2);
            for (size_t i = 0; i < n; i += 7)
                g[i] *= 1e-8f; /* where eps matters in the denominator */
            ft_cpu_adamw_step(p, g, m, v, n, hp, step, grad_scale);
            /* torch.optim.AdamW, in double. */
            double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr;
            double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
            for (size_t i = 0; i < n; i++) {
                double gi = (double)g[i] * grad_scale;
                pd[i] *= 1.0 - lr * hp.weight_decay;
                md[i] = b1 * md[i] + (1.0 - b1) * gi;
                vd[i] = b2 * vd[i] + (1.0 - b2) * gi * gi;
                double denom = sqrt(vd[i]) / sqrt(bc2) + hp.eps;
                pd[i] -= lr / bc1 * md[i] / denom;
            }
        }
        CHECK(close_norm("adamw param", p, pd, n, 1e-6));
        CHECK(close_norm("adamw m", m, md, n, 1e-6));
        CHECK(close_norm("adamw v", v, vd, n, 1e-6));
        free(p), free(g), free(m), free(v), free(pd), free(md), free(vd);
    }
}

int main(void)
{
    const char *vb = getenv("FT_TEST_VERBOSE");
    verbose = vb && *vb && strcmp(vb, "0") != 0;
    RUN(test_linear_forward);
    RUN(test_linear_backward);
    RUN(test_linear_backward_large);
    RUN(test_embedding);
    RUN(test_rmsnorm_forward);
    RUN(test_add_rmsnorm_forward);
    RUN(test_rmsnorm_backward);
    RUN(test_rmsnorm_backward_large);
    RUN(test_qk_norm);
    RUN(test_swiglu_forward);
    RUN(test_geglu_forward);
    RUN(test_geglu_backward);
    RUN(test_swiglu_backward);
    RUN(test_cross_entropy);
    RUN(test_cross_entropy_fd);
    RUN(test_softcap_cross_entropy_fd);
    RUN(test_elementwise);
    RUN(test_embedding_t);
    RUN(test_dora_ops);
    RUN(test_lora_linear);
    RUN(test_dropout);
    RUN(test_adamw);
    RUN(test_fast_exp);
    return check_summary("ops_cpu");
}
