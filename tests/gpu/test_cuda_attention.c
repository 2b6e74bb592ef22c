/* CUDA causal grouped-query attention (kernels/cuda/attention.cu) against the CPU
 * reference (kernels/cpu/attention.c), both through the public ops (kernels/ops.h).
 *
 * Each case runs in fp32 and in bf16 storage. The host inputs are rounded to the
 * storage dtype first, so the CPU and the GPU see identical values (gpu_check.h). The
 * backward pass gets the CPU forward's out (rounded to the dtype, as the GPU would have
 * stored it) and its fp32 lse as inputs on both sides, so it is checked on its own, not
 * through the forward's error. Gradients start from random values: the op accumulates.
 *
 * Tolerances: out, dq, dk, dv at tol_for(dtype) (bf16: the output rounding; fp32: the
 * summation order). lse is fp32 storage computed in fp32 from identical inputs in both
 * dtypes, so it is held to the fp32 tolerance. Every GPU run is repeated and must match
 * bit for bit (no atomics). One test asks for a subset of the gradients (the others
 * ft_none()). bf16 runs through both kernels (cuda_ops.h), chosen by FT_CUDA_ATTENTION:
 * the reference, and the tensor-core kernels where the head dim suits them. */
#include <stdbool.h>

#include "cuda/cuda_ops.h"
#include "gpu_check.h"

typedef struct att_case {
    const char *name;
    int B, T, Hq, Hkv, D;
    int window; /* > 0: sliding window */
    int nseg;   /* segments per row (packed sequences); 0: no seg ids */
    float softcap; /* > 0: Gemma 2's attention logit soft-capping */
} att_case;

/* One case's host inputs for one dtype (rounded to it) and the CPU forward's results. */
typedef struct att_data {
    att_case c;
    ft_dtype dt;
    size_t nq, nkv, nl, nseg_ids;
    float scale;
    float *q, *k, *v, *dout;
    int32_t *seg; /* NULL without seg ids */
    float *out;   /* CPU forward out, rounded to dt (the backward's input) */
    float *lse;   /* CPU forward lse (fp32) */
    float *out_ref, *lse_ref;
    float *dq0, *dk0, *dv0; /* starting gradients */
} att_data;

/* Monotone segment ids per row: nseg - 1 random cut points in [1, T-1], so ids run
 * 0,0,..,1,1,..,2,.. (an empty segment when two cuts meet). */
static int32_t *make_seg(int B, int T, int nseg)
{
    int32_t *seg = (int32_t *)calloc((size_t)B * T, sizeof(int32_t));
    if (!seg) {
        fprintf(stderr, "out of host memory\n");
        exit(2);
    }
    for (int b = 0; b < B; b++) {
        int cuts[8] = {0};
        int nc = nseg - 1 < 8 ? nseg - 1 : 8;
        for (int c = 0; c < nc; c++) {
            int x = 1 + (int)((gpu_uniform() + 1.0f) * 0.5f * (float)(T - 1));
            cuts[c] = x < 1 ? 1 : x > T - 1 ? T - 1 : x;
        }
        for (int c = 1; c < nc; c++) /* insertion sort */
            for (int e = c; e > 0 && cuts[e - 1] > cuts[e]; e--) {
                int tmp = cuts[e];
                cuts[e] = cuts[e - 1];
                cuts[e - 1] = tmp;
            }
        for (int t = 0; t < T; t++) {
            int id = 0;
            for (int c = 0; c < nc; c++)
                id += t >= cuts[c];
            seg[(size_t)b * T + t] = id;
        }
    }
    return seg;
}

static float *rounded_random(size_t n, float scale, ft_dtype dt)
{
    float *p = host_random(n, scale);
    host_round(p, n, dt);
    return p;
}

static att_data att_make(att_case c, ft_dtype dt, uint64_t seed)
{
    att_data a;
    memset(&a, 0, sizeof(a));
    gpu_seed(seed);
    a.c = c;
    a.dt = dt;
    a.nq = (size_t)c.B * c.T * c.Hq * c.D;
    a.nkv = (size_t)c.B * c.T * c.Hkv * c.D;
    a.nl = (size_t)c.B * c.Hq * c.T;
    a.nseg_ids = (size_t)c.B * c.T;
    a.scale = 1.0f / sqrtf((float)c.D);
    /* q and k at +-2: scores of a few units, so the softmax is not flat. */
    a.q = rounded_random(a.nq, 2.0f, dt);
    a.k = rounded_random(a.nkv, 2.0f, dt);
    a.v = rounded_random(a.nkv, 1.0f, dt);
    a.dout = rounded_random(a.nq, 1.0f, dt);
    a.dq0 = rounded_random(a.nq, 0.5f, dt);
    a.dk0 = rounded_random(a.nkv, 0.5f, dt);
    a.dv0 = rounded_random(a.nkv, 0.5f, dt);
    a.seg = c.nseg > 0 ? make_seg(c.B, c.T, c.nseg) : NULL;

    a.out_ref = host_alloc(a.nq);
    a.lse_ref = host_alloc(a.nl);
    ft_attention_forward(ft_f32(a.out_ref, a.nq), ft_f32(a.lse_ref, a.nl),
                         ft_f32(a.q, a.nq), ft_f32(a.k, a.nkv), ft_f32(a.v, a.nkv),
                         a.seg ? ft_i32(a.seg, a.nseg_ids) : ft_none(), c.B, c.T, c.Hq,
                         c.Hkv, c.D, a.scale, c.window, c.softcap);
    a.out = host_copy(a.out_ref, a.nq);
    host_round(a.out, a.nq, dt);
    a.lse = a.lse_ref;
    return a;
}

static void att_free(att_data *a)
{
    free(a->q);
    free(a->k);
    free(a->v);
    free(a->dout);
    free(a->dq0);
    free(a->dk0);
    free(a->dv0);
    free(a->seg);
    free(a->out);
    free(a->out_ref);
    free(a->lse_ref);
}

static ft_tensor seg_dev(const att_data *a)
{
    return a->seg ? dev_upload_raw(a->seg, a->nseg_ids, sizeof(int32_t), FT_I32)
                  : ft_none();
}

static void label(char *buf, size_t n, const att_data *a, const char *what)
{
    snprintf(buf, n, "%s %s %s", a->c.name, dtype_name(a->dt), what);
}

/* GPU forward against the CPU's; a second run must give the same bits. */
static void check_forward(const att_data *a)
{
    const att_case c = a->c;
    char what[128];
    float *zq = host_alloc(a->nq), *zl = host_alloc(a->nl);
    ft_tensor q = dev_upload(a->q, a->nq, a->dt), k = dev_upload(a->k, a->nkv, a->dt),
              v = dev_upload(a->v, a->nkv, a->dt), seg = seg_dev(a);
    ft_tensor out = dev_upload(zq, a->nq, a->dt), lse = dev_upload(zl, a->nl, FT_F32);
    ft_tensor out2 = dev_upload(zq, a->nq, a->dt), lse2 = dev_upload(zl, a->nl, FT_F32);

    ft_attention_forward(out, lse, q, k, v, seg, c.B, c.T, c.Hq, c.Hkv, c.D, a->scale,
                         c.window, c.softcap);
    label(what, sizeof(what), a, "forward out");
    check_dev(what, out, a->out_ref, tol_for(a->dt));
    label(what, sizeof(what), a, "forward lse");
    check_dev(what, lse, a->lse_ref, tol_for(FT_F32));

    ft_attention_forward(out2, lse2, q, k, v, seg, c.B, c.T, c.Hq, c.Hkv, c.D, a->scale,
                         c.window, c.softcap);
    CHECK(dev_equal(out, out2));
    CHECK(dev_equal(lse, lse2));

    dev_free(q);
    dev_free(k);
    dev_free(v);
    dev_free(seg);
    dev_free(out);
    dev_free(lse);
    dev_free(out2);
    dev_free(lse2);
    free(zq);
    free(zl);
}

enum { GRAD_Q = 1, GRAD_K = 2, GRAD_V = 4, GRAD_ALL = 7 };

/* GPU backward against the CPU's for the gradients in `want` (the others ft_none()).
 * With all three, a second run from the same starting gradients must give the same
 * bits. */
static void check_backward(const att_data *a, int want)
{
    const att_case c = a->c;
    char what[128];
    float *dq_ref = host_copy(a->dq0, a->nq), *dk_ref = host_copy(a->dk0, a->nkv),
          *dv_ref = host_copy(a->dv0, a->nkv);
    ft_attention_backward(ft_f32(dq_ref, a->nq), ft_f32(dk_ref, a->nkv),
                          ft_f32(dv_ref, a->nkv), ft_f32(a->dout, a->nq), ft_f32(a->q, a->nq), ft_f32(a->k, a->nkv),
                          ft_f32(a->v, a->nkv), ft_f32(a->out, a->nq), ft_f32(a->lse, a->nl),
                          a->seg ? ft_i32(a->seg, a->nseg_ids) : ft_none(), c.B, c.T, c.Hq,
                          c.Hkv, c.D, a->scale, c.window, c.softcap);

    ft_tensor q = dev_upload(a->q, a->nq, a->dt), k = dev_upload(a->k, a->nkv, a->dt),
              v = dev_upload(a->v, a->nkv, a->dt), dout = dev_upload(a->dout, a->nq, a->dt),
              out = dev_upload(a->out, a->nq, a->dt), lse = dev_upload(a->lse, a->nl, FT_F32),
              seg = seg_dev(a);
    ft_tensor dq = want & GRAD_Q ? dev_upload(a->dq0, a->nq, a->dt) : ft_none();
    ft_tensor dk = want & GRAD_K ? dev_upload(a->dk0, a->nkv, a->dt) : ft_none();
    ft_tensor dv = want & GRAD_V ? dev_upload(a->dv0, a->nkv, a->dt) : ft_none();

    ft_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, seg, c.B, c.T, c.Hq, c.Hkv,
                          c.D, a->scale, c.window, c.softcap);
    const char *suffix = want == GRAD_ALL ? "" : " (alone)";
    if (want & GRAD_Q) {
        snprintf(what, sizeof(what), "%s %s dq%s", c.name, dtype_name(a->dt), suffix);
        check_dev(what, dq, dq_ref, tol_for(a->dt));
    }
    if (want & GRAD_K) {
        snprintf(what, sizeof(what), "%s %s dk%s", c.name, dtype_name(a->dt), suffix);
        check_dev(what, dk, dk_ref, tol_for(a->dt));
    }
    if (want & GRAD_V) {
        snprintf(what, sizeof(what), "%s %s dv%s", c.name, dtype_name(a->dt), suffix);
        check_dev(what, dv, dv_ref, tol_for(a->dt));
    }

    if (want == GRAD_ALL) {
        ft_tensor dq2 = dev_upload(a->dq0, a->nq, a->dt);
        ft_tensor dk2 = dev_upload(a->dk0, a->nkv, a->dt);
        ft_tensor dv2 = dev_upload(a->dv0, a->nkv, a->dt);
        ft_attention_backward(dq2, dk2, dv2, dout, q, k, v, out, lse, seg, c.B, c.T, c.Hq,
                              c.Hkv, c.D, a->scale, c.window, c.softcap);
        CHECK(dev_equal(dq, dq2));
        CHECK(dev_equal(dk, dk2));
        CHECK(dev_equal(dv, dv2));
        dev_free(dq2);
        dev_free(dk2);
        dev_free(dv2);
    }

    dev_free(q);
    dev_free(k);
    dev_free(v);
    dev_free(dout);
    dev_free(out);
    dev_free(lse);
    dev_free(seg);
    dev_free(dq);
    dev_free(dk);
    dev_free(dv);
    free(dq_ref);
    free(dk_ref);
    free(dv_ref);
}

/* The dynamic shared memory a block of the current device may opt in to. */
static size_t device_smem_optin(void)
{
    int dev = 0, optin = 0;
    gpu_fail_cuda(cudaGetDevice(&dev), "cudaGetDevice");
    gpu_fail_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                  "cudaDeviceGetAttribute");
    return (size_t)optin;
}

/* Picks the kernel bf16 calls run (FT_CUDA_ATTENTION): "reference" or "flash". With
 * flash, a head dim the flash kernels take must get them where their shared memory fits
 * the device (else the case would test the reference twice), and the reference where it
 * does not (sm_86, sm_89: 99 KiB a block, under the 104 KiB of D = 128). */
static void use_kernel(const char *kernel, int D)
{
    setenv("FT_CUDA_ATTENTION", kernel, 1);
    const char *got = ft_cuda_attention_kernel(FT_BF16, D);
    size_t smem = ft_cuda_flash_attention_smem(D);
    bool flash_fits = D % 16 == 0 && D <= 128 && smem > 0 && smem <= device_smem_optin();
    printf("  bf16 kernel: %s\n", got);
    CHECK(strcmp(got, !strcmp(kernel, "flash") && flash_fits ? "flash" : "reference") == 0);
    CHECK(strcmp(ft_cuda_attention_kernel(FT_F32, D), "reference") == 0);
}

/* Forward and backward of each case in fp32 and bf16, bf16 with each kernel. */
static void run_cases(const att_case *cases, int n)
{
    static const ft_dtype dtypes[3] = {FT_F32, FT_BF16, FT_BF16};
    static const char *kernels[3] = {"reference", "reference", "flash"};
    for (int i = 0; i < n; i++) {
        const att_case c = cases[i];
        printf(" %s: B=%d T=%d Hq=%d Hkv=%d D=%d window=%d segments=%d softcap=%g\n",
               c.name, c.B, c.T, c.Hq, c.Hkv, c.D, c.window, c.nseg, c.softcap);
        for (int d = 0; d < 3; d++) {
            use_kernel(kernels[d], c.D);
            att_data a = att_make(c, dtypes[d], 1000 + (uint64_t)i * 17 + (uint64_t)d);
            check_forward(&a);
            check_backward(&a, GRAD_ALL);
            att_free(&a);
        }
    }
    use_kernel("reference", 0);
}

#define NCASES(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void test_attention_mha(void)
{
    static const att_case cases[] = {
        {"mha", 2, 33, 4, 4, 64, 0, 0, 0.0f},
        {"mha-d128", 2, 130, 2, 2, 128, 0, 0, 0.0f},
    };
    run_cases(cases, NCASES(cases));
}

static void test_attention_gqa(void)
{
    static const att_case cases[] = {
        {"gqa", 2, 130, 8, 2, 128, 0, 0, 0.0f},
        {"gqa-d80", 3, 33, 6, 2, 80, 0, 0, 0.0f},
    };
    run_cases(cases, NCASES(cases));
}

static void test_attention_mqa(void)
{
    static const att_case cases[] = {
        {"mqa", 3, 7, 4, 1, 40, 0, 0, 0.0f},
        {"mqa-d64", 2, 130, 4, 1, 64, 0, 0, 0.0f},
    };
    run_cases(cases, NCASES(cases));
}

/* T of one token and T not a multiple of anything; D from 8 to the maximum. */
static void test_attention_shapes(void)
{
    static const att_case cases[] = {
        {"t1", 2, 1, 2, 1, 8, 0, 0, 0.0f},        {"t1-window", 3, 1, 4, 2, 40, 5, 0, 0.0f},
        {"t7-d8", 2, 7, 3, 1, 8, 0, 0, 0.0f},     {"t33-d96", 2, 33, 4, 2, 96, 0, 0, 0.0f},
        {"t7-d256", 2, 7, 2, 1, 256, 0, 0, 0.0f}, {"t33-d1", 2, 33, 2, 2, 1, 0, 0, 0.0f},
    };
    run_cases(cases, NCASES(cases));
}

static void test_attention_packed(void)
{
    static const att_case cases[] = {
        {"packed-gqa", 2, 130, 8, 2, 64, 0, 3, 0.0f},
        {"packed-mha", 3, 33, 2, 2, 40, 0, 2, 0.0f},
        {"packed-mqa", 2, 7, 4, 1, 80, 0, 3, 0.0f},
    };
    run_cases(cases, NCASES(cases));
}

/* window = 5 < T, and a window of at least T (the same as none). */
static void test_attention_window(void)
{
    static const att_case cases[] = {
        {"window-gqa", 2, 33, 4, 2, 64, 5, 0, 0.0f},
        {"window-mqa-d8", 2, 7, 3, 1, 8, 5, 0, 0.0f},
        {"window-t130", 3, 130, 8, 2, 128, 5, 0, 0.0f},
        {"window-wide", 2, 7, 2, 2, 40, 16, 0, 0.0f},
    };
    run_cases(cases, NCASES(cases));
}

static void test_attention_window_packed(void)
{
    static const att_case cases[] = {
        {"window-packed", 3, 130, 8, 2, 80, 5, 3, 0.0f},
        {"window-packed-mha", 2, 33, 2, 2, 64, 5, 2, 0.0f},
    };
    run_cases(cases, NCASES(cases));
}

/* Gemma 2's attention logit soft-capping (softcap * tanh(S / softcap) before the mask
 * and softmax; the scores here are of a few units, so caps of 1 and 2 bend them well
 * into tanh's curve): full, windowed and packed, flash head dims and Gemma 2's 256 (the
 * reference kernel). */
static void test_attention_softcap(void)
{
    static const att_case cases[] = {
        {"softcap-gqa", 2, 130, 8, 2, 64, 0, 0, 1.0f},
        {"softcap-window-packed", 2, 70, 4, 2, 128, 5, 3, 2.0f},
        {"softcap-window-mqa-d40", 2, 33, 4, 1, 40, 4, 0, 1.0f},
        {"softcap-gemma2-d256", 1, 33, 4, 2, 256, 8, 0, 1.5f},
    };
    run_cases(cases, NCASES(cases));
}

/* Each gradient on its own and dk, dv without dq (the others ft_none()): the wanted
 * ones come out the same. */
static void test_attention_partial_grads(void)
{
    static const att_case c = {"partial", 2, 33, 8, 2, 48, 5, 2, 1.0f};
    static const ft_dtype dtypes[3] = {FT_F32, FT_BF16, FT_BF16};
    static const char *kernels[3] = {"reference", "reference", "flash"};
    for (int d = 0; d < 3; d++) {
        use_kernel(kernels[d], c.D);
        att_data a = att_make(c, dtypes[d], 77 + (uint64_t)d);
        check_backward(&a, GRAD_Q);
        check_backward(&a, GRAD_K);
        check_backward(&a, GRAD_V);
        check_backward(&a, GRAD_K | GRAD_V);
        att_free(&a);
    }
    use_kernel("reference", 0);
}

/* A Llama-3-shaped layer at a real length, through both bf16 kernels: T = 1024, 32 query
 * heads on 8 kv heads of 128 (8B) and of 64 (1B), one packed row of 3 sequences. Small
 * (gpu_test_small): the same head dims, grouping (4 query heads a kv head) and packing,
 * 8 query heads on 2 at T = 130 (three tiles of the flash kernels, the last ragged). */
static void test_attention_llama_shapes(void)
{
    if (getenv("FT_UNDER_MEMCHECK")) { /* minutes under the sanitizer; the cases above cover it */
        printf("  (skipped under compute-sanitizer)\n");
        return;
    }
    static const att_case cases[] = {
        {"llama8b-t1024", 1, 1024, 32, 8, 128, 0, 3, 0.0f},
        {"llama1b-t1024", 1, 1024, 32, 8, 64, 0, 0, 0.0f},
    };
    static const att_case small[] = {
        {"llama8b-heads-t130", 1, 130, 8, 2, 128, 0, 3, 0.0f},
        {"llama1b-heads-t130", 1, 130, 8, 2, 64, 0, 0, 0.0f},
    };
    if (gpu_test_small())
        run_cases(small, NCASES(small));
    else
        run_cases(cases, NCASES(cases));
}

/* The head dims around the shared memory limit of sm_86 / sm_89 GPUs (99 KiB a block):
 * D = 80, 96 and 112 fit there, D = 128 does not and runs the reference kernels
 * (a note on stderr, once a head dim), within every limit of sm_80 and sm_90. Run alone
 * (`test_cuda_attention head_dims`) under FT_EMU_ARCH=sm_89 and sm_86 by
 * tests/emu/checks/test_checks.sh. */
static void test_attention_head_dims(void)
{
    static const att_case cases[] = {
        {"d80", 1, 70, 2, 1, 80, 0, 0, 0.0f},
        {"d96", 1, 70, 2, 1, 96, 0, 2, 0.0f},
        {"d112", 1, 33, 2, 2, 112, 5, 0, 0.0f},
        {"d128", 2, 70, 4, 2, 128, 0, 0, 0.0f},
    };
    printf("  device opt-in shared memory: %zu bytes; flash needs %zu (D=80), %zu (96), "
           "%zu (112), %zu (128)\n",
           device_smem_optin(), ft_cuda_flash_attention_smem(80),
           ft_cuda_flash_attention_smem(96), ft_cuda_flash_attention_smem(112),
           ft_cuda_flash_attention_smem(128));
    run_cases(cases, NCASES(cases));
}

/* With arguments: only the tests named (without their test_attention_ prefix). */
static bool wanted(int argc, char **argv, const char *name)
{
    if (argc < 2)
        return true;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], name))
            return true;
    return false;
}

#define RUN_IF(name)                                                                        \
    do {                                                                                    \
        if (wanted(argc, argv, #name))                                                      \
            RUN(test_attention_##name);                                                     \
    } while (0)

int main(int argc, char **argv)
{
    RUN_IF(mha);
    RUN_IF(gqa);
    RUN_IF(mqa);
    RUN_IF(shapes);
    RUN_IF(packed);
    RUN_IF(window);
    RUN_IF(window_packed);
    RUN_IF(softcap);
    RUN_IF(partial_grads);
    RUN_IF(head_dims);
    RUN_IF(llama_shapes);
    return check_summary("cuda_attention");
}
