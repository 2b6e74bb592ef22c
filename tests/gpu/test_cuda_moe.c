/* The CUDA mixture-of-experts ops (kernels/cuda/moe.cu) against the CPU reference
 * (kernels/cpu/moe.c, itself checked against finite differences in
 * tests/unit/test_moe_ops.c), in fp32 and bf16 storage of the float operands the ops
 * take in either dtype (router logits, gathered and combined rows, their gradients).
 * The router's probs, indices and weights stay fp32 on both devices.
 *
 * Exactness: the selection (idx) must match exactly; gather and its backward are exact
 * in fp32 (copies and sums in the same order); the rest is within TOL_F32 / TOL_BF16
 * normwise (gpu_check.h). Each backward also runs twice to check it repeats bit for bit.
 * Shapes: Mixtral's top-2 of 8 (renormalised), Qwen's top-4 of 60 and top-8 of 128
 * without renorm, top-1, and rows ragged against the kernels' 128/256-thread blocks. */
#include "gpu_check.h"

static const ft_dtype DTYPES[2] = {FT_F32, FT_BF16};

static float *rounded(const float *x, size_t n, ft_dtype d)
{
    float *r = host_copy(x, n);
    host_round(r, n, d);
    return r;
}

static int32_t *idx_download(ft_tensor t)
{
    int32_t *h = malloc(t.numel * sizeof(int32_t) + 4);
    gpu_fail_cuda(cudaDeviceSynchronize(), "kernel");
    gpu_fail_cuda(cudaMemcpy(h, t.data, t.numel * 4, cudaMemcpyDeviceToHost), "download");
    return h;
}

static void moe_case(int N, int E, int k, int renorm, int C, ft_dtype d)
{
    size_t NE = (size_t)N * E, NK = (size_t)N * k, NC = (size_t)N * C, MC = NK * C;
    char what[128];
    const char *dn = dtype_name(d);

    /* router */
    float *logits = rounded(host_random(NE, 3.0f), NE, d);
    float *probs = host_alloc(NE), *w = host_alloc(NK);
    int32_t *idx = malloc(NK * sizeof(int32_t));
    ft_moe_router_forward(ft_f32(probs, NE), ft_i32(idx, NK), ft_f32(w, NK),
                          ft_f32(logits, NE), N, E, k, renorm);
    ft_tensor glog = dev_upload(logits, NE, d), gprobs = dev_upload(probs, NE, FT_F32);
    ft_tensor gw = dev_upload(w, NK, FT_F32);
    ft_tensor gidx = dev_upload_raw(idx, NK, 4, FT_I32);
    ft_moe_router_forward(gprobs, gidx, gw, glog, N, E, k, renorm);
    int32_t *gi = idx_download(gidx);
    snprintf(what, sizeof what, "router idx %dx%d top%d %s", N, E, k, dn);
    printf("  %-48s %s\n", what, memcmp(gi, idx, NK * 4) ? "DIFFER" : "equal");
    CHECK(memcmp(gi, idx, NK * 4) == 0);
    snprintf(what, sizeof what, "router probs %dx%d top%d %s", N, E, k, dn);
    check_dev(what, gprobs, probs, TOL_F32);
    snprintf(what, sizeof what, "router w %dx%d top%d r%d %s", N, E, k, renorm, dn);
    check_dev(what, gw, w, TOL_F32);

    /* router backward: dw and the aux term; the GPU reads the CPU's forward results */
    float *dw = host_random(NK, 1.0f), *aux = host_random(E, 0.5f);
    float *dl = rounded(host_random(NE, 1.0f), NE, d);
    ft_tensor gdw = dev_upload(dw, NK, FT_F32), gaux = dev_upload(aux, E, FT_F32);
    ft_tensor gdl = dev_upload(dl, NE, d), gdl2 = dev_upload(dl, NE, d);
    ft_tensor gp2 = dev_upload(probs, NE, FT_F32), gw2 = dev_upload(w, NK, FT_F32);
    ft_tensor gi2 = dev_upload_raw(idx, NK, 4, FT_I32);
    ft_moe_router_backward(ft_f32(dl, NE), ft_f32(dw, NK), ft_f32(aux, E), ft_f32(probs, NE),
                           ft_i32(idx, NK), ft_f32(w, NK), N, E, k, renorm);
    ft_moe_router_backward(gdl, gdw, gaux, gp2, gi2, gw2, N, E, k, renorm);
    ft_moe_router_backward(gdl2, gdw, gaux, gp2, gi2, gw2, N, E, k, renorm);
    snprintf(what, sizeof what, "router bwd %dx%d top%d r%d %s", N, E, k, renorm, dn);
    check_dev(what, gdl, dl, tol_for(d));
    CHECK(dev_equal(gdl, gdl2));

    /* aux stats */
    float *counts = host_random(E, 1.0f), *psum = host_random(E, 1.0f);
    ft_tensor gc = dev_upload(counts, E, FT_F32), gps = dev_upload(psum, E, FT_F32);
    ft_moe_aux_stats(ft_f32(counts, E), ft_f32(psum, E), ft_f32(probs, NE), ft_i32(idx, NK),
                     N, E, k);
    ft_moe_aux_stats(gc, gps, gp2, gi2, N, E, k);
    snprintf(what, sizeof what, "aux counts %dx%d top%d", N, E, k);
    check_dev(what, gc, counts, 0.0);
    snprintf(what, sizeof what, "aux psum %dx%d top%d", N, E, k);
    check_dev(what, gps, psum, TOL_F32);

    /* plan on the host, then gather / combine on the grouped rows */
    int32_t *offsets = malloc((size_t)(E + 1) * 4), *rows = malloc(NK * 4),
            *slot = malloc(NK * 4);
    ft_moe_plan(offsets, rows, slot, idx, N, E, k);
    ft_tensor grows = dev_upload_raw(rows, NK, 4, FT_I32);
    ft_tensor gslot = dev_upload_raw(slot, NK, 4, FT_I32);
    float *x = rounded(host_random(NC, 1.0f), NC, d), *xe = host_alloc(MC);
    ft_tensor gx = dev_upload(x, NC, d), gxe = dev_upload(xe, MC, d);
    ft_moe_gather_forward(ft_f32(xe, MC), ft_f32(x, NC), ft_i32(rows, NK), N, k, C);
    ft_moe_gather_forward(gxe, gx, grows, N, k, C);
    snprintf(what, sizeof what, "gather fwd %dx%d top%d %s", N, C, k, dn);
    check_dev(what, gxe, xe, 0.0);

    float *dxe = rounded(host_random(MC, 1.0f), MC, d);
    float *dx = rounded(host_random(NC, 1.0f), NC, d);
    ft_tensor gdxe = dev_upload(dxe, MC, d), gdx = dev_upload(dx, NC, d);
    ft_moe_gather_backward(ft_f32(dx, NC), ft_f32(dxe, MC), ft_i32(slot, NK), N, k, C);
    ft_moe_gather_backward(gdx, gdxe, gslot, N, k, C);
    snprintf(what, sizeof what, "gather bwd %dx%d top%d %s", N, C, k, dn);
    check_dev(what, gdx, dx, d == FT_F32 ? 0.0 : TOL_BF16);

    float *ye = rounded(host_random(MC, 1.0f), MC, d);
    float *out = rounded(host_random(NC, 1.0f), NC, d);
    ft_tensor gye = dev_upload(ye, MC, d), gout = dev_upload(out, NC, d);
    for (int acc = 0; acc < 2; acc++) {
        ft_moe_combine_forward(ft_f32(out, NC), ft_f32(ye, MC), ft_f32(w, NK),
                               ft_i32(slot, NK), N, k, C, acc);
        ft_moe_combine_forward(gout, gye, gw2, gslot, N, k, C, acc);
        snprintf(what, sizeof what, "combine fwd %dx%d top%d acc%d %s", N, C, k, acc, dn);
        check_dev(what, gout, out, tol_for(d));
    }

    float *dout = rounded(host_random(NC, 1.0f), NC, d);
    float *dye = rounded(host_random(MC, 1.0f), MC, d), *dwc = host_random(NK, 1.0f);
    ft_tensor gdout = dev_upload(dout, NC, d), gdye = dev_upload(dye, MC, d);
    ft_tensor gdye2 = dev_upload(dye, MC, d);
    ft_tensor gdwc = dev_upload(dwc, NK, FT_F32), gdwc2 = dev_upload(dwc, NK, FT_F32);
    ft_moe_combine_backward(ft_f32(dye, MC), ft_f32(dwc, NK), ft_f32(dout, NC),
                            ft_f32(ye, MC), ft_f32(w, NK), ft_i32(slot, NK), N, k, C);
    ft_moe_combine_backward(gdye, gdwc, gdout, gye, gw2, gslot, N, k, C);
    ft_moe_combine_backward(gdye2, gdwc2, gdout, gye, gw2, gslot, N, k, C);
    snprintf(what, sizeof what, "combine bwd dye %dx%d top%d %s", N, C, k, dn);
    check_dev(what, gdye, dye, tol_for(d));
    snprintf(what, sizeof what, "combine bwd dw %dx%d top%d %s", N, C, k, dn);
    check_dev(what, gdwc, dwc, TOL_F32);
    CHECK(dev_equal(gdwc, gdwc2));

    free(logits), free(probs), free(w), free(idx), free(gi), free(dw), free(aux), free(dl);
    free(counts), free(psum), free(offsets), free(rows), free(slot), free(x), free(xe);
    free(dxe), free(dx), free(ye), free(out), free(dout), free(dye), free(dwc);
    ft_tensor all[] = {glog, gprobs, gw, gidx, gdw, gaux, gdl, gdl2, gp2, gw2, gi2, gc, gps,
                       grows, gslot, gx, gxe, gdxe, gdx, gye, gout, gdout, gdye, gdye2, gdwc,
                       gdwc2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dev_free(all[i]);
}

static void test_moe(void)
{
    static const int shapes[][5] = {
        /* N, E, k, renorm, C */
        {37, 8, 2, 1, 48}, {300, 8, 2, 1, 33}, {129, 60, 4, 0, 40}, {65, 128, 8, 0, 24},
        {50, 4, 1, 1, 17}, {3, 4, 4, 1, 5},
    };
    int n = sizeof shapes / sizeof shapes[0];
    for (int s = 0; s < n; s++)
        for (int di = 0; di < 2; di++)
            moe_case(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4],
                     DTYPES[di]);
}

/* The expert LoRA B permutation (ops.h) against the CPU op, bit for bit; merge_add onto
 * nonzero fp32 gradients. */
static void test_lora_b_layout(void)
{
    static const int shapes[][3] = {{48, 8, 8}, {33, 4, 60}, {7, 1, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int di = 0; di < 2; di++) {
            ft_dtype d = DTYPES[di];
            int out = shapes[s][0], r = shapes[s][1], E = shapes[s][2];
            size_t n = (size_t)out * r * E;
            float *b = rounded(host_random(n, 1.0f), n, d), *split = host_alloc(n);
            float *g = host_random(n, 1.0f);
            ft_tensor gb = dev_upload(b, n, d), gs = dev_upload(split, n, d);
            ft_tensor gg = dev_upload(g, n, FT_F32);
            ft_moe_lora_b_split(ft_f32(split, n), ft_f32(b, n), out, r, E);
            ft_moe_lora_b_split(gs, gb, out, r, E);
            char what[96];
            snprintf(what, sizeof what, "lora_b split %dx%dx%d %s", out, r, E, dtype_name(d));
            check_dev(what, gs, split, 0.0);
            ft_moe_lora_b_merge_add(ft_f32(g, n), ft_f32(split, n), out, r, E);
            ft_moe_lora_b_merge_add(gg, gs, out, r, E);
            snprintf(what, sizeof what, "lora_b merge_add %dx%dx%d %s", out, r, E,
                     dtype_name(d));
            check_dev(what, gg, g, 0.0);
            free(b), free(split), free(g);
            dev_free(gb), dev_free(gs), dev_free(gg);
        }
}

int main(void)
{
    gpu_seed(22);
    RUN(test_moe);
    RUN(test_lora_b_layout);
    return check_summary("cuda_moe");
}
