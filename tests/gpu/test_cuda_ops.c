/* The CUDA ops (kernels/cuda) against the CPU reference ops (kernels/cpu), through the
 * public dispatcher (kernels/ops.h): every op other than attention (test_cuda_attention.c),
 * forward and backward, on fresh random inputs of several shapes, ragged ones included,
 * with fp32 and bf16 storage. Tolerances (normwise relative, see gpu_check.h): 1e-5 on
 * fp32 paths, 1e-2 where bf16 is stored; the dequantization ops and dropout must match
 * bit for bit in fp32. Ops whose result feeds the gradients are also run twice and must
 * repeat bit for bit (no atomics). Needs a GPU: run by `make test-gpu`. */
#include "gpu_check.h"

#include "cpu/cpu_ops.h"

static const ft_dtype DTYPES[2] = {FT_F32, FT_BF16};

/* A host copy of x rounded as a dtype-typed device buffer would hold it. */
static float *rounded(const float *x, size_t n, ft_dtype d)
{
    float *r = host_copy(x, n);
    host_round(r, n, d);
    return r;
}

/* ---- linear --------------------------------------------------------------------- */

static void linear_case(int N, int in, int out, int with_bias, int accumulate, float alpha,
                        ft_dtype din, ft_dtype dout_)
{
    size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
    float *x = rounded(host_random(nx, 1.0f), nx, din);
    float *w = rounded(host_random(nw, 0.5f), nw, din);
    float *b = with_bias ? rounded(host_random(out, 1.0f), out, dout_) : NULL;
    float *y = rounded(host_random(ny, 1.0f), ny, dout_);
    ft_tensor gx = dev_upload(x, nx, din), gw = dev_upload(w, nw, din);
    ft_tensor gb = b ? dev_upload(b, out, dout_) : ft_none();
    ft_tensor gy = dev_upload(y, ny, dout_);
    ft_linear_forward(ft_f32(y, ny), ft_f32(x, nx), ft_f32(w, nw),
                      b ? ft_f32(b, out) : ft_none(), N, in, out, alpha, accumulate);
    ft_linear_forward(gy, gx, gw, gb, N, in, out, alpha, accumulate);
    char what[128];
    snprintf(what, sizeof what, "linear fwd %dx%dx%d b%d acc%d %s->%s", N, in, out, with_bias,
             accumulate, dtype_name(din), dtype_name(dout_));
    check_dev(what, gy, y, din == FT_BF16 || dout_ == FT_BF16 ? TOL_BF16 : TOL_F32);

    /* backward from random dy into random starting gradients (accumulation) */
    float *dy = rounded(host_random(ny, 1.0f), ny, din);
    float *dx = rounded(host_random(nx, 1.0f), nx, dout_);
    float *dw = rounded(host_random(nw, 1.0f), nw, dout_);
    float *db = rounded(host_random(out, 1.0f), out, FT_F32);
    ft_tensor gdy = dev_upload(dy, ny, din), gdx = dev_upload(dx, nx, dout_);
    ft_tensor gdw = dev_upload(dw, nw, dout_), gdb = dev_upload(db, out, FT_F32);
    ft_tensor gdw2 = dev_upload(dw, nw, dout_), gdb2 = dev_upload(db, out, FT_F32);
    ft_linear_backward(ft_f32(dx, nx), ft_f32(dw, nw), ft_f32(db, out), ft_f32(dy, ny),
                       ft_f32(x, nx), ft_f32(w, nw), N, in, out, alpha);
    ft_linear_backward(gdx, gdw, gdb, gdy, gx, gw, N, in, out, alpha);
    ft_linear_backward(ft_none(), gdw2, gdb2, gdy, gx, gw, N, in, out, alpha);
    double tol = din == FT_BF16 || dout_ == FT_BF16 ? TOL_BF16 : TOL_F32;
    snprintf(what, sizeof what, "linear bwd dx %dx%dx%d %s", N, in, out, dtype_name(din));
    check_dev(what, gdx, dx, tol);
    snprintf(what, sizeof what, "linear bwd dw %dx%dx%d %s", N, in, out, dtype_name(din));
    check_dev(what, gdw, dw, tol);
    snprintf(what, sizeof what, "linear bwd db %dx%dx%d %s", N, in, out, dtype_name(din));
    check_dev(what, gdb, db, din == FT_BF16 ? TOL_BF16 : TOL_F32);
    CHECK(dev_equal(gdw, gdw2));
    CHECK(dev_equal(gdb, gdb2));

    free(x), free(w), free(b), free(y), free(dy), free(dx), free(dw), free(db);
    dev_free(gx), dev_free(gw), dev_free(gb), dev_free(gy), dev_free(gdy), dev_free(gdx);
    dev_free(gdw), dev_free(gdb), dev_free(gdw2), dev_free(gdb2);
}

/* db is a column sum over row chunks of at least 64 rows (colsum.cuh): 130 and 512 rows
 * give several chunks (130 a ragged last one), 1 to 96 columns one ragged tile or three.
 * Split-K (linear.cu: a reduction of 2048 or more onto a few tiles): the forward of
 * {3, 4096, 5} (k = in), the weight gradients of {4100, 16, 40} (k = N, a remainder of 4
 * after the equal spans) and {2048, 24, 3} (no remainder). */
static void test_linear(void)
{
    static const int shapes[][3] = {{1, 1, 1},     {7, 33, 65},    {64, 128, 96},
                                    {130, 257, 31}, {3, 4096, 5},   {512, 64, 2},
                                    {4100, 16, 40}, {2048, 24, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        linear_case(N, in, out, 1, 0, 1.0f, FT_F32, FT_F32);
        linear_case(N, in, out, 0, 1, 0.5f, FT_F32, FT_F32);
        linear_case(N, in, out, 1, 1, 2.0f, FT_BF16, FT_F32);
        linear_case(N, in, out, 1, 0, 1.0f, FT_BF16, FT_BF16);
        linear_case(N, in, out, 0, 1, 0.25f, FT_BF16, FT_BF16);
    }
}

/* ---- embedding ------------------------------------------------------------------ */

/* Shapes: rows in several of the backward's rounds (32 rows each), the last ragged, ids
 * repeating within a round and across rounds (a vocabulary of 7: each id many times a
 * round), columns ragged against its 32-column blocks. */
static void test_embedding(void)
{
    static const int shapes[][3] = {{97, 50, 37}, {300, 7, 70}, {70, 1000, 5}, {1, 3, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            int N = shapes[s][0], V = shapes[s][1], C = shapes[s][2];
            int32_t *ids = malloc(sizeof(int32_t) * N);
            for (int n = 0; n < N; n++)
                ids[n] = (int32_t)((n * 7 + n / 5) % V); /* repeats */
            size_t nt = (size_t)V * C, no = (size_t)N * C;
            float *table = rounded(host_random(nt, 1.0f), nt, d);
            float *out = host_alloc(no);
            ft_tensor gids = dev_upload_raw(ids, N, 4, FT_I32);
            ft_tensor gtable = dev_upload(table, nt, d), gout = dev_upload(out, no, d);
            ft_embedding_forward(ft_f32(out, no), ft_i32(ids, N), ft_f32(table, nt), N, V, C);
            ft_embedding_forward(gout, gids, gtable, N, V, C);
            char what[96];
            snprintf(what, sizeof what, "embedding fwd %dx%dx%d %s", N, V, C, dtype_name(d));
            check_dev(what, gout, out, 0.0);

            /* no padding row, then the row of the most repeated id as padding_idx */
            for (int pi = 0; pi < 2; pi++) {
                int pad = pi ? ids[0] : -1;
                float *dout = rounded(host_random(no, 1.0f), no, d);
                float *dtable = host_random(nt, 1.0f);
                ft_tensor gdout = dev_upload(dout, no, d);
                ft_tensor gdt = dev_upload(dtable, nt, FT_F32);
                ft_tensor gdt2 = dev_upload(dtable, nt, FT_F32);
                ft_embedding_backward(ft_f32(dtable, nt), ft_f32(dout, no), ft_i32(ids, N),
                                      N, V, C, pad);
                ft_embedding_backward(gdt, gdout, gids, N, V, C, pad);
                ft_embedding_backward(gdt2, gdout, gids, N, V, C, pad);
                snprintf(what, sizeof what, "embedding bwd %dx%dx%d %s pad %d", N, V, C,
                         dtype_name(d), pad);
                check_dev(what, gdt, dtable, TOL_F32);
                CHECK(dev_equal(gdt, gdt2));
                free(dout), free(dtable);
                dev_free(gdout), dev_free(gdt), dev_free(gdt2);
            }
            free(ids), free(table), free(out);
            dev_free(gids), dev_free(gtable), dev_free(gout);
        }
}

/* The transposed table [C, V] (LoRA on the embedding): the same checks. */
static void test_embedding_t(void)
{
    static const int shapes[][3] = {{97, 50, 37}, {300, 7, 70}, {70, 1000, 5}, {1, 3, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            int N = shapes[s][0], V = shapes[s][1], C = shapes[s][2];
            int32_t *ids = malloc(sizeof(int32_t) * N);
            for (int n = 0; n < N; n++)
                ids[n] = (int32_t)((n * 7 + n / 5) % V); /* repeats */
            size_t nt = (size_t)V * C, no = (size_t)N * C;
            float *table = rounded(host_random(nt, 1.0f), nt, d);
            float *out = host_alloc(no);
            ft_tensor gids = dev_upload_raw(ids, N, 4, FT_I32);
            ft_tensor gtable = dev_upload(table, nt, d), gout = dev_upload(out, no, d);
            ft_embedding_t_forward(ft_f32(out, no), ft_i32(ids, N), ft_f32(table, nt), N, V, C);
            ft_embedding_t_forward(gout, gids, gtable, N, V, C);
            char what[96];
            snprintf(what, sizeof what, "embedding_t fwd %dx%dx%d %s", N, V, C, dtype_name(d));
            check_dev(what, gout, out, 0.0);

            /* no padding row, then the row of ids[0] as padding_idx */
            for (int pi = 0; pi < 2; pi++) {
                int pad = pi ? ids[0] : -1;
                float *dout = rounded(host_random(no, 1.0f), no, d);
                float *dtable = host_random(nt, 1.0f);
                ft_tensor gdout = dev_upload(dout, no, d);
                ft_tensor gdt = dev_upload(dtable, nt, FT_F32);
                ft_tensor gdt2 = dev_upload(dtable, nt, FT_F32);
                ft_embedding_t_backward(ft_f32(dtable, nt), ft_f32(dout, no), ft_i32(ids, N),
                                        N, V, C, pad);
                ft_embedding_t_backward(gdt, gdout, gids, N, V, C, pad);
                ft_embedding_t_backward(gdt2, gdout, gids, N, V, C, pad);
                snprintf(what, sizeof what, "embedding_t bwd %dx%dx%d %s pad %d", N, V, C,
                         dtype_name(d), pad);
                check_dev(what, gdt, dtable, TOL_F32);
                CHECK(dev_equal(gdt, gdt2));
                free(dout), free(dtable);
                dev_free(gdout), dev_free(gdt), dev_free(gdt2);
            }
            free(ids), free(table), free(out);
            dev_free(gids), dev_free(gtable), dev_free(gout);
        }
}

/* ---- RMSNorm -------------------------------------------------------------------- */

/* dw is a column sum over row chunks of at least 64 rows (colsum.cuh): 300 and 1000 rows
 * give several chunks, 1000 a ragged last one; 96 and 70 columns ragged 32-column tiles. */
static void rmsnorm_case(float off)
{
    static const int shapes[][2] = {{1, 7}, {5, 64}, {64, 1000}, {33, 4096}, {300, 96},
                                    {1000, 70}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            int N = shapes[s][0], C = shapes[s][1];
            size_t n = (size_t)N * C;
            float *x = rounded(host_random(n, 2.0f), n, d);
            float *w = rounded(host_random(C, 1.0f), C, d);
            float *out = host_alloc(n), *rstd = host_alloc(N);
            ft_tensor gx = dev_upload(x, n, d), gw = dev_upload(w, C, d);
            ft_tensor gout = dev_upload(out, n, d), grstd = dev_upload(rstd, N, FT_F32);
            ft_rmsnorm_forward(ft_f32(out, n), ft_f32(rstd, N), ft_f32(x, n), ft_f32(w, C), N,
                               C, 1e-5f, off);
            ft_rmsnorm_forward(gout, grstd, gx, gw, N, C, 1e-5f, off);
            char what[96];
            snprintf(what, sizeof what, "rmsnorm fwd out %dx%d %s w+%g", N, C, dtype_name(d), off);
            check_dev(what, gout, out, tol_for(d));
            snprintf(what, sizeof what, "rmsnorm fwd rstd %dx%d %s", N, C, dtype_name(d));
            check_dev(what, grstd, rstd, TOL_F32);

            float *dout = rounded(host_random(n, 1.0f), n, d);
            float *dx = rounded(host_random(n, 1.0f), n, d);
            float *dw = host_random(C, 1.0f);
            ft_tensor gdout = dev_upload(dout, n, d), gdx = dev_upload(dx, n, d);
            ft_tensor gdw = dev_upload(dw, C, FT_F32), gdw2 = dev_upload(dw, C, FT_F32);
            /* both backends from the same rstd (the CPU one) */
            ft_tensor grstd_ref = dev_upload(rstd, N, FT_F32);
            ft_rmsnorm_backward(ft_f32(dx, n), ft_f32(dw, C), ft_f32(dout, n), ft_f32(x, n),
                                ft_f32(w, C), ft_f32(rstd, N), N, C, off);
            ft_rmsnorm_backward(gdx, gdw, gdout, gx, gw, grstd_ref, N, C, off);
            ft_rmsnorm_backward(ft_none(), gdw2, gdout, gx, gw, grstd_ref, N, C, off);
            snprintf(what, sizeof what, "rmsnorm bwd dx %dx%d %s w+%g", N, C, dtype_name(d), off);
            check_dev(what, gdx, dx, tol_for(d));
            snprintf(what, sizeof what, "rmsnorm bwd dw %dx%d %s w+%g", N, C, dtype_name(d), off);
            check_dev(what, gdw, dw, TOL_F32);
            CHECK(dev_equal(gdw, gdw2));
            free(x), free(w), free(out), free(rstd), free(dout), free(dx), free(dw);
            dev_free(gx), dev_free(gw), dev_free(gout), dev_free(grstd), dev_free(gdout);
            dev_free(gdx), dev_free(gdw), dev_free(gdw2), dev_free(grstd_ref);
        }
}

/* w_offset 0 (Llama) and 1 (Gemma's 1 + w) */
static void test_rmsnorm(void)
{
    rmsnorm_case(0.0f);
    rmsnorm_case(1.0f);
}

/* The residual add fused before the norm: sum = x + res as stored (rounded to bf16 by
 * the kernel as by host_round), then the CPU norm of that sum; in place (sum = x) too. */
static void test_add_rmsnorm(void)
{
    static const int shapes[][2] = {{1, 7}, {5, 64}, {33, 4096}, {300, 96}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++)
            for (int in_place = 0; in_place < 2; in_place++) {
                ft_dtype d = DTYPES[di];
                int N = shapes[s][0], C = shapes[s][1];
                size_t n = (size_t)N * C;
                float *x = rounded(host_random(n, 2.0f), n, d);
                float *res = rounded(host_random(n, 1.5f), n, d);
                float *w = rounded(host_random(C, 1.0f), C, d);
                float *sum = host_alloc(n), *out = host_alloc(n), *rstd = host_alloc(N);
                for (size_t i = 0; i < n; i++)
                    sum[i] = x[i] + res[i];
                host_round(sum, n, d);
                float off = (float)in_place; /* Gemma's 1 + w on the in-place runs */
                ft_rmsnorm_forward(ft_f32(out, n), ft_f32(rstd, N), ft_f32(sum, n),
                                   ft_f32(w, C), N, C, 1e-5f, off);
                ft_tensor gx = dev_upload(x, n, d), gres = dev_upload(res, n, d);
                ft_tensor gw = dev_upload(w, C, d), gout = dev_upload(out, n, d);
                ft_tensor grstd = dev_upload(rstd, N, FT_F32);
                ft_tensor gsum = in_place ? gx : dev_upload(out, n, d);
                ft_add_rmsnorm_forward(gsum, gout, grstd, gx, gres, gw, N, C, 1e-5f, off);
                char what[96];
                const char *ip = in_place ? " in place" : "";
                snprintf(what, sizeof what, "add_rmsnorm sum %dx%d %s%s", N, C, dtype_name(d),
                         ip);
                check_dev(what, gsum, sum, 0.0); /* the same rounding: bit for bit */
                snprintf(what, sizeof what, "add_rmsnorm out %dx%d %s%s", N, C, dtype_name(d),
                         ip);
                check_dev(what, gout, out, tol_for(d));
                snprintf(what, sizeof what, "add_rmsnorm rstd %dx%d %s%s", N, C,
                         dtype_name(d), ip);
                check_dev(what, grstd, rstd, TOL_F32);
                free(x), free(res), free(w), free(sum), free(out), free(rstd);
                dev_free(gx), dev_free(gres), dev_free(gw), dev_free(gout), dev_free(grstd);
                if (!in_place)
                    dev_free(gsum);
            }
}

/* ---- q/k norm ------------------------------------------------------------------- */

/* The attention's q/k norm as the model runs it: the RMSNorm op over N * H rows of D (per
 * head, qwen3: one weight [D] shared by the heads) or N rows of H * D (the whole
 * projection, olmo2), then RoPE; backward RoPE's into the norm's. Chain by chain against
 * the CPU ops (the CPU chain is checked against finite differences in test_ops_cpu.c).
 * dw sums over every head of every token: 1280 rows of 128 at the largest. In bf16 the
 * GPU's RoPE output is stored rounded before the norm's backward reads it, the CPU's not:
 * bf16 tolerances for dw too. */
static void test_qk_norm(void)
{
    static const int shapes[][4] = {/* N, H, D, per_head */
                                    {40, 32, 128, 1}, {33, 8, 64, 1}, {7, 3, 8, 1},
                                    {64, 16, 128, 0}, {5, 3, 8, 0}};
    static const int small[][4] = {{10, 4, 128, 1}, {7, 3, 8, 1}, {6, 4, 32, 0}, {5, 3, 8, 0}};
    int ns = gpu_test_small() ? 4 : 5;
    for (int s = 0; s < ns; s++)
        for (int di = 0; di < 2; di++) {
            const int *sh = gpu_test_small() ? small[s] : shapes[s];
            ft_dtype d = DTYPES[di];
            int N = sh[0], H = sh[1], D = sh[2], per_head = sh[3];
            int W = per_head ? D : H * D, rows = per_head ? N * H : N;
            size_t n = (size_t)N * H * D;
            int32_t *pos = malloc(sizeof(int32_t) * N);
            for (int i = 0; i < N; i++)
                pos[i] = (i * 37) % 301;
            float *inv = host_alloc(D / 2);
            for (int i = 0; i < D / 2; i++)
                inv[i] = (float)(1.0 / pow(1e6, 2.0 * i / D));
            float *x = rounded(host_random(n, 2.0f), n, d);
            float *w = rounded(host_random(W, 1.0f), W, d);
            float *out = host_alloc(n), *rstd = host_alloc(rows);
            ft_tensor gx = dev_upload(x, n, d), gw = dev_upload(w, W, d);
            ft_tensor gout = dev_upload(out, n, d), grstd = dev_upload(rstd, rows, FT_F32);
            ft_tensor gp = dev_upload_raw(pos, N, 4, FT_I32), ginv = dev_upload(inv, D / 2, FT_F32);
            ft_rmsnorm_forward(ft_f32(out, n), ft_f32(rstd, rows), ft_f32(x, n), ft_f32(w, W),
                               rows, W, 1e-6f, 0.0f);
            ft_rope_forward(ft_f32(out, n), ft_i32(pos, N), ft_f32(inv, D / 2), N, H, D, D, 1.0f);
            ft_rmsnorm_forward(gout, grstd, gx, gw, rows, W, 1e-6f, 0.0f);
            ft_rope_forward(gout, gp, ginv, N, H, D, D, 1.0f);
            char what[96];
            const char *kind = per_head ? "per head" : "whole";
            snprintf(what, sizeof what, "q/k norm %s fwd %dx%dx%d %s", kind, N, H, D,
                     dtype_name(d));
            check_dev(what, gout, out, tol_for(d));
            snprintf(what, sizeof what, "q/k norm %s rstd %dx%dx%d %s", kind, N, H, D,
                     dtype_name(d));
            check_dev(what, grstd, rstd, TOL_F32);

            float *dout = rounded(host_random(n, 1.0f), n, d);
            float *dx = host_alloc(n), *dw = host_random(W, 1.0f);
            ft_tensor gdout = dev_upload(dout, n, d), gdx = dev_upload(dx, n, d);
            ft_tensor gdw = dev_upload(dw, W, FT_F32), grstd_ref = dev_upload(rstd, rows, FT_F32);
            ft_rope_backward(ft_f32(dout, n), ft_i32(pos, N), ft_f32(inv, D / 2), N, H, D, D, 1.0f);
            ft_rmsnorm_backward(ft_f32(dx, n), ft_f32(dw, W), ft_f32(dout, n), ft_f32(x, n),
                                ft_f32(w, W), ft_f32(rstd, rows), rows, W, 0.0f);
            ft_rope_backward(gdout, gp, ginv, N, H, D, D, 1.0f);
            ft_rmsnorm_backward(gdx, gdw, gdout, gx, gw, grstd_ref, rows, W, 0.0f);
            snprintf(what, sizeof what, "q/k norm %s bwd dx %dx%dx%d %s", kind, N, H, D,
                     dtype_name(d));
            check_dev(what, gdx, dx, tol_for(d));
            snprintf(what, sizeof what, "q/k norm %s bwd dw %dx%dx%d %s", kind, N, H, D,
                     dtype_name(d));
            check_dev(what, gdw, dw, d == FT_F32 ? TOL_F32 : tol_for(d));
            free(pos), free(inv), free(x), free(w), free(out), free(rstd), free(dout), free(dx);
            free(dw);
            dev_free(gx), dev_free(gw), dev_free(gout), dev_free(grstd), dev_free(gp);
            dev_free(ginv), dev_free(gdout), dev_free(gdx), dev_free(gdw), dev_free(grstd_ref);
        }
}

/* ---- RoPE ----------------------------------------------------------------------- */

static void test_rope(void)
{
    /* N, heads, head_dim, rotary dims; scale: longrope's cos/sin factor (1 otherwise) */
    static const struct {
        int N, H, D, rd;
        float scale;
    } shapes[] = {{13, 3, 8, 8, 1.0f},   {40, 4, 64, 64, 1.0f},     {7, 32, 128, 128, 1.0f},
                  {5, 2, 6, 6, 1.0f},    {11, 3, 16, 12, 1.0f},     {9, 4, 128, 96, 1.1902f},
                  {6, 2, 12, 2, 0.75f}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            int N = shapes[s].N, H = shapes[s].H, D = shapes[s].D, rd = shapes[s].rd;
            float sc = shapes[s].scale;
            size_t n = (size_t)N * H * D;
            int32_t *pos = malloc(sizeof(int32_t) * N);
            for (int i = 0; i < N; i++)
                pos[i] = (i * 613) % 4099; /* up to 4098: large angles */
            float *inv = host_alloc(rd / 2);
            for (int i = 0; i < rd / 2; i++)
                inv[i] = (float)(1.0 / pow(10000.0, 2.0 * i / rd));
            float *x = rounded(host_random(n, 1.0f), n, d);
            ft_tensor gx = dev_upload(x, n, d), gp = dev_upload_raw(pos, N, 4, FT_I32);
            ft_tensor ginv = dev_upload(inv, rd / 2, FT_F32);
            ft_rope_forward(ft_f32(x, n), ft_i32(pos, N), ft_f32(inv, rd / 2), N, H, D, rd, sc);
            ft_rope_forward(gx, gp, ginv, N, H, D, rd, sc);
            char what[96];
            snprintf(what, sizeof what, "rope fwd %dx%dx%d rd %d %s", N, H, D, rd,
                     dtype_name(d));
            check_dev(what, gx, x, tol_for(d));
            float *g = rounded(host_random(n, 1.0f), n, d);
            ft_tensor gg = dev_upload(g, n, d);
            ft_rope_backward(ft_f32(g, n), ft_i32(pos, N), ft_f32(inv, rd / 2), N, H, D, rd,
                             sc);
            ft_rope_backward(gg, gp, ginv, N, H, D, rd, sc);
            snprintf(what, sizeof what, "rope bwd %dx%dx%d rd %d %s", N, H, D, rd,
                     dtype_name(d));
            check_dev(what, gg, g, tol_for(d));
            free(pos), free(inv), free(x), free(g);
            dev_free(gx), dev_free(gp), dev_free(ginv), dev_free(gg);
        }
}

/* ---- SwiGLU --------------------------------------------------------------------- */

typedef void (*glu_fwd)(ft_tensor, ft_tensor, ft_tensor, size_t);
typedef void (*glu_bwd)(ft_tensor, ft_tensor, ft_tensor, ft_tensor, ft_tensor, size_t);

/* SwiGLU and GeGLU (gelu tanh) share the shape and the checks. */
static void glu_case(const char *name, glu_fwd fwd, glu_bwd bwd)
{
    /* 4096: the 8-wide kernels (vec_io.cuh); the others the scalar ones */
    static const size_t sizes[] = {1, 1001, 4096, 65536 + 7};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            size_t n = sizes[s];
            float *gate = host_random(n, 8.0f);
            gate[0] = n > 2 ? -100.0f : gate[0]; /* saturated: silu, gelu -> 0 */
            if (n > 2)
                gate[1] = 100.0f;
            host_round(gate, n, d);
            float *up = rounded(host_random(n, 1.0f), n, d), *out = host_alloc(n);
            ft_tensor gg = dev_upload(gate, n, d), gu = dev_upload(up, n, d);
            ft_tensor go = dev_upload(out, n, d);
            fwd(ft_f32(out, n), ft_f32(gate, n), ft_f32(up, n), n);
            fwd(go, gg, gu, n);
            char what[96];
            snprintf(what, sizeof what, "%s fwd n=%zu %s", name, n, dtype_name(d));
            check_dev(what, go, out, tol_for(d));
            float *dout = rounded(host_random(n, 1.0f), n, d);
            float *dg = rounded(host_random(n, 1.0f), n, d);
            float *du = rounded(host_random(n, 1.0f), n, d);
            ft_tensor gdo = dev_upload(dout, n, d), gdg = dev_upload(dg, n, d);
            ft_tensor gdu = dev_upload(du, n, d);
            bwd(ft_f32(dg, n), ft_f32(du, n), ft_f32(dout, n), ft_f32(gate, n),
                ft_f32(up, n), n);
            bwd(gdg, gdu, gdo, gg, gu, n);
            snprintf(what, sizeof what, "%s bwd dgate n=%zu %s", name, n, dtype_name(d));
            check_dev(what, gdg, dg, tol_for(d));
            snprintf(what, sizeof what, "%s bwd dup n=%zu %s", name, n, dtype_name(d));
            check_dev(what, gdu, du, tol_for(d));
            free(gate), free(up), free(out), free(dout), free(dg), free(du);
            dev_free(gg), dev_free(gu), dev_free(go), dev_free(gdo), dev_free(gdg);
            dev_free(gdu);
        }
}

static void test_swiglu(void)
{
    glu_case("swiglu", ft_swiglu_forward, ft_swiglu_backward);
}

static void test_geglu(void)
{
    glu_case("geglu", ft_geglu_forward, ft_geglu_backward);
}

/* ---- cross-entropy -------------------------------------------------------------- */

/* One case against the CPU op. Every 4th row is ignored (-100); all_ignored: every row.
 * misalign: the device logits (and dlogits) start one element past a 16-byte boundary,
 * which takes the kernel's element-at-a-time path even when V is a multiple of 8. */
static void cross_entropy_case(int N, int V, ft_dtype d, int inplace, float cap, int misalign,
                               int all_ignored)
{
    size_t n = (size_t)N * V, off = misalign ? 1 : 0;
    float *raw = host_random(n, 6.0f);
    if (cap > 0.0f)
        ft_softcap(ft_f32(raw, n), cap, n);
    float *logits = rounded(raw, n, d);
    free(raw);
    int32_t *tg = malloc(sizeof(int32_t) * N);
    int counted = 0;
    for (int i = 0; i < N; i++) {
        tg[i] = (all_ignored || i % 4 == 3) ? -100 : (int32_t)((i * 7919) % V);
        counted += tg[i] != -100;
    }
    float gs = counted ? 1.0f / counted : 1.0f;
    float *dl = host_alloc(n);
    /* the device buffers hold off leading elements before the [N,V] view */
    float *padded = host_alloc(n + off);
    padded[0] = 0.0f;
    memcpy(padded + off, logits, n * sizeof(float));
    ft_tensor gl_buf = dev_upload(padded, n + off, d), gt = dev_upload_raw(tg, N, 4, FT_I32);
    ft_tensor gdl_buf = inplace ? gl_buf : dev_upload(padded, n + off, d);
    ft_tensor gl = ft_slice(gl_buf, off, n), gdl = ft_slice(gdl_buf, off, n);
    double ref = ft_cross_entropy(ft_f32(dl, n), ft_f32(logits, n), ft_i32(tg, N), N, V, gs,
                                  cap);
    double got = ft_cross_entropy(gdl, gl, gt, N, V, gs, cap);
    char what[128];
    snprintf(what, sizeof what, "cross_entropy loss %dx%d %s%s%s%s softcap %g", N, V,
             dtype_name(d), inplace ? " in place" : "", misalign ? " misaligned" : "",
             all_ignored ? " all ignored" : "", cap);
    float fg = (float)got, fr = (float)ref;
    CHECK_REL(what, &fg, &fr, 1, TOL_F32);
    if (all_ignored)
        CHECK(got == 0.0);
    snprintf(what, sizeof what, "cross_entropy dlogits %dx%d %s%s%s%s softcap %g", N, V,
             dtype_name(d), inplace ? " in place" : "", misalign ? " misaligned" : "",
             all_ignored ? " all ignored" : "", cap);
    check_dev(what, gdl, dl, tol_for(d));
    /* a rerun gives the same loss to the bit (not in place: logits intact) */
    if (!inplace)
        CHECK(ft_cross_entropy(ft_none(), gl, gt, N, V, gs, cap) == got);
    free(logits), free(tg), free(dl), free(padded);
    dev_free(gl_buf), dev_free(gt);
    if (!inplace)
        dev_free(gdl_buf);
}

/* Shapes: V a multiple of 8 takes the kernel's 8-element loads and stores (1000, 24, 8),
 * others one element at a time (5, 257, 32001, 1004: a multiple of 4, not 8); 3x8: one
 * group a row, most threads of the block without an element; 4100 rows: more rows than
 * the kernel's blocks (2048), so a block walks a range of rows. */
static void test_cross_entropy(void)
{
    static const int shapes[][2] = {{1, 5},    {37, 1000}, {300, 257}, {9, 32001},
                                    {5, 1004}, {3, 8},     {4100, 24}};
    /* softcap 4: the logits are capped ones (Gemma 2), dlogits w.r.t. the uncapped */
    static const float caps[] = {0.0f, 4.0f};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++)
            for (int v = 0; v < 4; v++)
                cross_entropy_case(shapes[s][0], shapes[s][1], DTYPES[di], v % 2, caps[v / 2],
                                   0, 0);
    for (int di = 0; di < 2; di++)
        for (int inplace = 0; inplace < 2; inplace++) {
            cross_entropy_case(37, 1000, DTYPES[di], inplace, 0.0f, 1, 0);
            cross_entropy_case(6, 1000, DTYPES[di], inplace, 4.0f, 1, 0);
            cross_entropy_case(6, 1000, DTYPES[di], inplace, 0.0f, 0, 1);
            cross_entropy_case(6, 257, DTYPES[di], inplace, 0.0f, 0, 1);
        }
}

/* ---- elementwise ---------------------------------------------------------------- */

static void test_elementwise(void)
{
    /* 4096 and 8 * 125003: the 8-wide kernels (vec_io.cuh); the others the scalar ones */
    static const size_t sizes[] = {1, 333, 4096, 8 * 125003, 1000003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            size_t n = sizes[s];
            char what[96];
            float *x = rounded(host_random(n, 3.0f), n, d);
            float *y = rounded(host_random(n, 3.0f), n, d);
            ft_tensor gx = dev_upload(x, n, d), gy = dev_upload(y, n, d);
            ft_add(ft_f32(y, n), ft_f32(x, n), n);
            ft_add(gy, gx, n);
            snprintf(what, sizeof what, "add n=%zu %s", n, dtype_name(d));
            check_dev(what, gy, y, tol_for(d));

            ft_scale(ft_f32(y, n), 0.37f, n);
            host_round(y, n, d); /* start the next check from what the device holds */
            dev_free(gy);
            gy = dev_upload(y, n, d);
            ft_scale(ft_f32(y, n), -1.7f, n);
            ft_scale(gy, -1.7f, n);
            snprintf(what, sizeof what, "scale n=%zu %s", n, dtype_name(d));
            check_dev(what, gy, y, tol_for(d));

            /* y = 2 tanh(y / 2) (values of +-5: the cap bends them) */
            ft_softcap(ft_f32(y, n), 2.0f, n);
            ft_softcap(gy, 2.0f, n);
            snprintf(what, sizeof what, "softcap n=%zu %s", n, dtype_name(d));
            check_dev(what, gy, y, tol_for(d));

            double ref = ft_sumsq(ft_f32(x, n), n), got = ft_sumsq(gx, n);
            float fr = (float)ref, fg = (float)got;
            snprintf(what, sizeof what, "sumsq n=%zu %s", n, dtype_name(d));
            CHECK_REL(what, &fg, &fr, 1, 1e-12 + TOL_F32 / 10);
            CHECK(ft_sumsq(gx, n) == got);

            /* copy across dtypes: f32 -> d -> f32 is the rounding of x */
            ft_tensor g32 = dev_upload(x, n, FT_F32), gd = dev_upload(x, n, d);
            ft_zero(gd, n);
            float *zeros = host_alloc(n);
            snprintf(what, sizeof what, "zero n=%zu %s", n, dtype_name(d));
            check_dev(what, gd, zeros, 0.0);
            ft_copy(gd, g32, n);
            ft_zero(g32, n);
            ft_copy(g32, gd, n);
            snprintf(what, sizeof what, "copy f32 -> %s -> f32 n=%zu", dtype_name(d), n);
            check_dev(what, g32, x, 0.0);
            free(x), free(y), free(zeros);
            dev_free(gx), dev_free(gy), dev_free(g32), dev_free(gd);
        }
}

/* The 8-wide kernels need 16-byte aligned operands: views one element into their
 * buffers (a multiple of 8 elements, misaligned) take the scalar kernels and agree with
 * the CPU, in both dtypes. */
static void test_vec8_misaligned(void)
{
    const size_t n = 4096;
    for (int di = 0; di < 2; di++) {
        ft_dtype d = DTYPES[di];
        size_t es = d == FT_BF16 ? 2 : 4;
        float *gate = rounded(host_random(n + 1, 4.0f), n + 1, d);
        float *up = rounded(host_random(n + 1, 1.0f), n + 1, d), *out = host_alloc(n + 1);
        ft_tensor gg = dev_upload(gate, n + 1, d), gu = dev_upload(up, n + 1, d);
        ft_tensor go = dev_upload(out, n + 1, d);
        ft_tensor vg = gg, vu = gu, vo = go; /* element 1 on: 2 or 4 bytes off alignment */
        vg.data = (char *)gg.data + es, vu.data = (char *)gu.data + es;
        vo.data = (char *)go.data + es;
        ft_swiglu_forward(ft_f32(out + 1, n), ft_f32(gate + 1, n), ft_f32(up + 1, n), n);
        ft_swiglu_forward(vo, vg, vu, n);
        ft_add(ft_f32(up + 1, n), ft_f32(gate + 1, n), n);
        ft_add(vu, vg, n);
        float *got_o = dev_download(go), *got_u = dev_download(gu);
        char what[96];
        snprintf(what, sizeof what, "swiglu fwd misaligned n=%zu %s", n, dtype_name(d));
        CHECK_REL(what, got_o + 1, out + 1, n, tol_for(d));
        snprintf(what, sizeof what, "add misaligned n=%zu %s", n, dtype_name(d));
        CHECK_REL(what, got_u + 1, up + 1, n, tol_for(d));
        free(gate), free(up), free(out), free(got_o), free(got_u);
        dev_free(gg), dev_free(gu), dev_free(go);
    }
}

/* ---- DoRA: row norms, column scaling, column dot products -------------------------- */

static void test_dora(void)
{
    /* 1 to 300 rows of 1 to 200 columns; col_dot over 130 rows is several colsum chunks */
    static const int shapes[][2] = {{1, 1}, {7, 33}, {64, 130}, {300, 200}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            int R = shapes[s][0], C = shapes[s][1];
            size_t n = (size_t)R * C;
            char what[96];
            float *w = rounded(host_random(n, 1.0f), n, d);
            float *mag = rounded(host_random((size_t)R, 2.0f), (size_t)R, d);
            float *g = host_alloc((size_t)R), *inv = host_alloc((size_t)R);
            ft_tensor gw = dev_upload(w, n, d), gmag = dev_upload(mag, (size_t)R, d);
            ft_tensor gg = dev_upload(g, (size_t)R, FT_F32), ginv = dev_upload(inv, (size_t)R, FT_F32);
            ft_dora_norm(ft_f32(g, R), ft_f32(inv, R), ft_f32(mag, R), ft_f32(w, n), R, C);
            ft_dora_norm(gg, ginv, gmag, gw, R, C);
            snprintf(what, sizeof what, "dora_norm g %dx%d %s", R, C, dtype_name(d));
            check_dev(what, gg, g, TOL_F32);
            snprintf(what, sizeof what, "dora_norm inv %dx%d %s", R, C, dtype_name(d));
            check_dev(what, ginv, inv, TOL_F32);

            /* [R, C] as N = R rows of C columns, scaled by a per-column g (C of them) */
            float *x = rounded(host_random(n, 1.0f), n, d);
            float *y = rounded(host_random(n, 1.0f), n, d);
            float *gc = host_random((size_t)C, 1.5f);
            ft_tensor gx = dev_upload(x, n, d), gy = dev_upload(y, n, d);
            ft_tensor ggc = dev_upload(gc, (size_t)C, FT_F32);
            for (int acc = 0; acc < 2; acc++) {
                ft_col_scale(ft_f32(y, n), ft_f32(x, n), ft_f32(gc, C), 0.7f, -1.0f, R, C, acc);
                ft_col_scale(gy, gx, ggc, 0.7f, -1.0f, R, C, acc);
                snprintf(what, sizeof what, "col_scale acc%d %dx%d %s", acc, R, C, dtype_name(d));
                check_dev(what, gy, y, tol_for(d));
                host_round(y, n, d);
                dev_free(gy);
                gy = dev_upload(y, n, d);
            }

            float *dd = host_random((size_t)C, 1.0f);
            ft_tensor gdd = dev_upload(dd, (size_t)C, FT_F32), gdd2 = dev_upload(dd, (size_t)C, FT_F32);
            ft_col_dot(ft_f32(dd, C), ft_f32(x, n), ft_f32(y, n), ft_f32(gc, C), R, C);
            ft_col_dot(gdd, gx, gy, ggc, R, C);
            ft_col_dot(gdd2, gx, gy, ggc, R, C);
            snprintf(what, sizeof what, "col_dot %dx%d %s", R, C, dtype_name(d));
            check_dev(what, gdd, dd, TOL_F32);
            CHECK(dev_equal(gdd, gdd2));
            free(w), free(mag), free(g), free(inv), free(x), free(y), free(gc), free(dd);
            dev_free(gw), dev_free(gmag), dev_free(gg), dev_free(ginv), dev_free(gx);
            dev_free(gy), dev_free(ggc), dev_free(gdd), dev_free(gdd2);
        }
}

/* ---- dropout -------------------------------------------------------------------- */

static void test_dropout(void)
{
    static const float ps[] = {0.0f, 0.1f, 0.5f, 0.999f, 1.0f};
    size_t n = 100003;
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            float p = ps[i];
            uint64_t seed = 1234 + i, offset = 77 * i;
            float *x = rounded(host_random(n, 1.0f), n, d), *out = host_alloc(n);
            ft_tensor gx = dev_upload(x, n, d), go = dev_upload(out, n, d);
            ft_dropout_forward(ft_f32(out, n), ft_f32(x, n), n, p, seed, offset);
            ft_dropout_forward(go, gx, n, p, seed, offset);
            char what[96];
            snprintf(what, sizeof what, "dropout fwd p=%g %s", p, dtype_name(d));
            /* the mask is identical; fp32 values exactly, bf16 after rounding x * k */
            check_dev(what, go, out, d == FT_F32 ? 0.0 : TOL_BF16);
            /* backward accumulates into a non-zero dx: dx + dout * k fused into one FMA
             * (one rounding, as nvcc contracts it unless told not to) misses the CPU's
             * two roundings in the last bit where k = 1 / (1 - p) is inexact: p = 0.1,
             * 0.999 (the emulated device contracts a * b + c in device code too) */
            float *dx = rounded(host_random(n, 1.0f), n, d);
            ft_tensor gdx = dev_upload(dx, n, d);
            ft_dropout_backward(ft_f32(dx, n), ft_f32(x, n), n, p, seed, offset);
            ft_dropout_backward(gdx, gx, n, p, seed, offset);
            snprintf(what, sizeof what, "dropout bwd p=%g %s", p, dtype_name(d));
            check_dev(what, gdx, dx, d == FT_F32 ? 0.0 : TOL_BF16);
            free(x), free(out), free(dx);
            dev_free(gx), dev_free(go), dev_free(gdx);
        }
}

/* ---- AdamW ---------------------------------------------------------------------- */

static void test_adamw(void)
{
    size_t n = 100003;
    float *p = host_random(n, 1.0f), *m = host_alloc(n), *v = host_alloc(n);
    ft_tensor gp = dev_upload(p, n, FT_F32), gm = dev_upload(m, n, FT_F32);
    ft_tensor gv = dev_upload(v, n, FT_F32);
    ft_adamw_hparams hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f};
    for (int step = 1; step <= 5; step++) {
        float *g = host_random(n, 0.1f);
        ft_tensor gg = dev_upload(g, n, FT_F32);
        float gs = step == 3 ? 0.5f : 1.0f; /* clipping folded in */
        ft_adamw_step(ft_f32(p, n), ft_f32(g, n), ft_f32(m, n), ft_f32(v, n), n, hp, step, gs);
        ft_adamw_step(gp, gg, gm, gv, n, hp, step, gs);
        free(g);
        dev_free(gg);
    }
    check_dev("adamw param after 5 steps", gp, p, TOL_F32);
    check_dev("adamw exp_avg after 5 steps", gm, m, TOL_F32);
    check_dev("adamw exp_avg_sq after 5 steps", gv, v, TOL_F32);
    free(p), free(m), free(v);
    dev_free(gp), dev_free(gm), dev_free(gv);
}

/* ---- dequantization ------------------------------------------------------------- */

static void test_dequant(void)
{
    static const size_t sizes[] = {1, 64, 1000, 4096 * 3 + 17};
    static const int blocksizes[] = {32, 64, 4096};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (size_t bi = 0; bi < sizeof blocksizes / sizeof blocksizes[0]; bi++)
            for (int di = 0; di < 2; di++) {
                ft_dtype d = DTYPES[di];
                size_t n = sizes[s], bs = (size_t)blocksizes[bi], nb = (n + bs - 1) / bs;
                uint8_t *packed = malloc((n + 1) / 2), *q8 = malloc(n);
                for (size_t i = 0; i < (n + 1) / 2; i++)
                    packed[i] = (uint8_t)(gpu_uniform() * 128 + 128);
                for (size_t i = 0; i < n; i++)
                    q8[i] = (uint8_t)(gpu_uniform() * 128 + 128);
                float *absmax = host_random(nb, 2.0f), *code = host_random(16, 1.0f);
                float *map = host_random(256, 1.0f), *ref = host_alloc(n);
                ft_tensor gpk = dev_upload_raw(packed, (n + 1) / 2, 1, FT_U8);
                ft_tensor gq8 = dev_upload_raw(q8, n, 1, FT_U8);
                ft_tensor gam = dev_upload(absmax, nb, FT_F32), gc = dev_upload(code, 16, FT_F32);
                ft_tensor gmap = dev_upload(map, 256, FT_F32), go = dev_upload(ref, n, d);
                char what[96];
                ft_dequant_4bit(ft_f32(ref, n), ft_u8(packed, (n + 1) / 2), ft_f32(absmax, nb),
                                ft_f32(code, 16), n, (int)bs);
                ft_dequant_4bit(go, gpk, gam, gc, n, (int)bs);
                host_round(ref, n, d); /* a bf16 output is the rounded fp32 value */
                snprintf(what, sizeof what, "dequant 4bit n=%zu bs=%zu %s", n, bs, dtype_name(d));
                check_dev(what, go, ref, 0.0);
                ft_dequant_8bit_blockwise(ft_f32(ref, n), ft_u8(q8, n), ft_f32(absmax, nb),
                                          ft_f32(map, 256), n, (int)bs, 0.125f);
                ft_dequant_8bit_blockwise(go, gq8, gam, gmap, n, (int)bs, 0.125f);
                host_round(ref, n, d);
                snprintf(what, sizeof what, "dequant 8bit n=%zu bs=%zu %s", n, bs, dtype_name(d));
                check_dev(what, go, ref, 0.0);
                free(packed), free(q8), free(absmax), free(code), free(map), free(ref);
                dev_free(gpk), dev_free(gq8), dev_free(gam), dev_free(gc), dev_free(gmap);
                dev_free(go);
            }
    /* int8 rows */
    for (int di = 0; di < 2; di++) {
        ft_dtype d = DTYPES[di];
        int rows = 37, cols = 129;
        size_t n = (size_t)rows * cols;
        int8_t *q = malloc(n);
        for (size_t i = 0; i < n; i++)
            q[i] = (int8_t)(gpu_uniform() * 127);
        float *scb = host_random(rows, 3.0f), *ref = host_alloc(n);
        ft_tensor gq = dev_upload_raw(q, n, 1, FT_I8), gs = dev_upload(scb, rows, FT_F32);
        ft_tensor go = dev_upload(ref, n, d);
        ft_dequant_int8_rows(ft_f32(ref, n), ft_i8(q, n), ft_f32(scb, rows), rows, cols);
        ft_dequant_int8_rows(go, gq, gs, rows, cols);
        host_round(ref, n, d);
        check_dev(d == FT_F32 ? "dequant int8 rows f32" : "dequant int8 rows bf16", go, ref, 0.0);
        free(q), free(scb), free(ref);
        dev_free(gq), dev_free(gs), dev_free(go);
    }
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        fprintf(stderr, "test_cuda_ops: no CUDA device\n");
        return 1;
    }
    gpu_seed(42);
    RUN(test_linear);
    RUN(test_embedding);
    RUN(test_embedding_t);
    RUN(test_rmsnorm);
    RUN(test_add_rmsnorm);
    RUN(test_qk_norm);
    RUN(test_rope);
    RUN(test_swiglu);
    RUN(test_geglu);
    RUN(test_vec8_misaligned);
    RUN(test_cross_entropy);
    RUN(test_elementwise);
    RUN(test_dora);
    RUN(test_dropout);
    RUN(test_adamw);
    RUN(test_dequant);
    return check_summary("cuda_ops");
}
