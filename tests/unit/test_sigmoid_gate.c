/* The sigmoid op (ops.h's ft_sigmoid_forward, kernels/cpu/sigmoid.c) through the
 * dispatcher on CPU views: forward against a double-precision loop, backward against
 * central finite differences of it; and qwen2_moe's shared-expert gate as the model will
 * compose it, out = sigmoid(x g^T) * y per row (ft_linear to one output, ft_sigmoid,
 * ft_moe_combine with k = 1 and slot[n] = n), every gradient (x, g, y) against finite
 * differences of the double composition. Backward checks use L = sum(out * r).
 * Tolerances as in test_moe_ops.c: rtol 1e-5 with atol 1e-5 * max|ref|. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "ops.h"

static uint64_t rng_state = 5;

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

static float *frand(size_t n, double lo, double hi)
{
    float *a = xcalloc(n, sizeof *a);
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(lo + (hi - lo) * urand());
    return a;
}

static double *dcopy(const float *a, size_t n)
{
    double *d = xcalloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = a[i];
    return d;
}

static int close_norm(const char *what, const float *got, const double *ref, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]);
        if (!(err <= 1e-5 * fabs(ref[i]) + 1e-5 * m)) {
            fprintf(stderr, "  %s[%zu]: got %.9g, want %.9g (err %.3g)\n", what, i, got[i],
                    ref[i], err);
            return 0;
        }
    }
    return 1;
}

#define FD_H 1e-5

static double dsig(double z)
{
    return 1.0 / (1.0 + exp(-z));
}

/* The elementwise op: values over a wide range (saturated ends included); dz
 * accumulates onto what it held. */
static void test_sigmoid(void)
{
    size_t n = 301;
    float *z = frand(n, -12.0, 12.0), *s = xcalloc(n, sizeof(float));
    float *ds = frand(n, -1.0, 1.0), *dz = frand(n, -0.5, 0.5);
    double *ref = xcalloc(n, sizeof(double)), *dref = dcopy(dz, n);
    ft_sigmoid_forward(ft_f32(s, n), ft_f32(z, n), n);
    for (size_t i = 0; i < n; i++) {
        ref[i] = dsig(z[i]);
        /* d/dz of sum(ds sigmoid(z)) by central differences */
        dref[i] += ds[i] * (dsig(z[i] + FD_H) - dsig(z[i] - FD_H)) / (2 * FD_H);
    }
    CHECK(close_norm("sigmoid", s, ref, n));
    ft_sigmoid_backward(ft_f32(dz, n), ft_f32(ds, n), ft_f32(s, n), n);
    CHECK(close_norm("sigmoid dz", dz, dref, n));
    free(z), free(s), free(ds), free(dz), free(ref), free(dref);
}

typedef struct gate_ctx {
    int N, C;
    double *x, *g, *y, *r;
} gate_ctx;

/* L = sum_n sum_c r[n,c] sigmoid(x[n] . g) y[n,c] in double */
static double gate_loss(const gate_ctx *c)
{
    double L = 0.0;
    for (int n = 0; n < c->N; n++) {
        double z = 0.0;
        for (int k = 0; k < c->C; k++)
            z += c->x[(size_t)n * c->C + k] * c->g[k];
        double s = dsig(z);
        for (int k = 0; k < c->C; k++)
            L += c->r[(size_t)n * c->C + k] * s * c->y[(size_t)n * c->C + k];
    }
    return L;
}

static void fd(gate_ctx *c, double *p, size_t n, double *grad)
{
    for (size_t i = 0; i < n; i++) {
        double save = p[i];
        p[i] = save + FD_H;
        double lp = gate_loss(c);
        p[i] = save - FD_H;
        double lm = gate_loss(c);
        p[i] = save;
        grad[i] = (lp - lm) / (2 * FD_H);
    }
}

/* The shared-expert gate as ops compose it, forward (accumulating onto the routed
 * experts' output, as the block adds both) and backward. */
static void gate_case(int N, int C)
{
    size_t NC = (size_t)N * C;
    float *x = frand(NC, -1.0, 1.0), *g = frand(C, -0.8, 0.8), *y = frand(NC, -1.0, 1.0);
    float *r = frand(NC, -1.0, 1.0), *base = frand(NC, -1.0, 1.0);
    float *out = xcalloc(NC, sizeof(float)), *z = xcalloc(N, sizeof(float));
    float *s = xcalloc(N, sizeof(float));
    int32_t *slot = xcalloc(N, sizeof(int32_t));
    for (int n = 0; n < N; n++)
        slot[n] = n;
    for (size_t i = 0; i < NC; i++)
        out[i] = base[i];
    ft_linear_forward(ft_f32(z, N), ft_f32(x, NC), ft_f32(g, C), ft_none(), N, C, 1, 1.0f, 0);
    ft_sigmoid_forward(ft_f32(s, N), ft_f32(z, N), N);
    ft_moe_combine_forward(ft_f32(out, NC), ft_f32(y, NC), ft_f32(s, N), ft_i32(slot, N), N, 1,
                           C, 1);
    gate_ctx c = {N, C, dcopy(x, NC), dcopy(g, C), dcopy(y, NC), dcopy(r, NC)};
    double *want = xcalloc(NC, sizeof(double));
    for (int n = 0; n < N; n++) {
        double zz = 0.0;
        for (int k = 0; k < C; k++)
            zz += c.x[(size_t)n * C + k] * c.g[k];
        for (int k = 0; k < C; k++)
            want[(size_t)n * C + k] = base[(size_t)n * C + k] + dsig(zz) * c.y[(size_t)n * C + k];
    }
    CHECK(close_norm("gate out", out, want, NC));

    /* backward: dy and ds from combine, dz from sigmoid, dx and dg from linear */
    float *dy = xcalloc(NC, sizeof(float)), *ds = xcalloc(N, sizeof(float));
    float *dz = xcalloc(N, sizeof(float)), *dx = xcalloc(NC, sizeof(float));
    float *dg = xcalloc(C, sizeof(float));
    ft_moe_combine_backward(ft_f32(dy, NC), ft_f32(ds, N), ft_f32(r, NC), ft_f32(y, NC),
                            ft_f32(s, N), ft_i32(slot, N), N, 1, C);
    ft_sigmoid_backward(ft_f32(dz, N), ft_f32(ds, N), ft_f32(s, N), N);
    ft_linear_backward(ft_f32(dx, NC), ft_f32(dg, C), ft_none(), ft_f32(dz, N), ft_f32(x, NC),
                       ft_f32(g, C), N, C, 1, 1.0f);
    double *gx = xcalloc(NC, sizeof(double)), *gg = xcalloc(C, sizeof(double));
    double *gy = xcalloc(NC, sizeof(double));
    fd(&c, c.x, NC, gx);
    fd(&c, c.g, C, gg);
    fd(&c, c.y, NC, gy);
    CHECK(close_norm("gate dx", dx, gx, NC));
    CHECK(close_norm("gate dg", dg, gg, C));
    CHECK(close_norm("gate dy", dy, gy, NC));
    free(x), free(g), free(y), free(r), free(base), free(out), free(z), free(s), free(slot);
    free(c.x), free(c.g), free(c.y), free(c.r), free(want), free(dy), free(ds), free(dz);
    free(dx), free(dg), free(gx), free(gg), free(gy);
}

static void test_shared_expert_gate(void)
{
    gate_case(1, 8);
    gate_case(7, 16);
    gate_case(33, 24);
}

int main(void)
{
    RUN(test_sigmoid);
    RUN(test_shared_expert_gate);
    return check_summary("test_sigmoid_gate");
}
