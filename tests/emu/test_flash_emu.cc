/* The flash-attention kernels (kernels/cuda/flash_attention_kernels.cuh) run on the host
 * through cuda_emu.h, against the CPU attention op (kernels/cpu/attention.c): forward
 * out and lse, and dq, dk, dv, on shapes that cover a ragged last tile, several tiles,
 * GQA and MQA, packed sequences, a sliding window shorter and longer than a tile, and
 * every head dim the kernels take in steps of 16 up to 128, a window that starts a
 * query tile's keys one tile back, and attention logit soft-capping.
 *
 * As in tests/gpu/test_cuda_attention.c: inputs are rounded to bf16 first, so both sides
 * see the same values; the backward takes the CPU forward's out (rounded to bf16) and
 * lse; gradients start from random values (the op accumulates). out, dq, dk, dv must be
 * within bf16's tolerance (1e-2 normwise relative), lse within fp32's (1e-5). The backward
 * runs twice: all batches at once with Dlt from fa_delta_kernel's buffer, then a batch a
 * launch (b0 > 0) with Dlt computed in the dk/dv kernel; the two must agree bit for bit.
 *
 * This checks the kernels' logic (tiles, masks, online softmax, barriers) without a GPU;
 * the GPU tier checks them again on the hardware, with the real mma.sync and ldmatrix
 * (mma_sm80.cuh emulates them in their documented register layouts; test_mma_emu.cc). */
#include "cuda_emu.h"
#include "emu_check.h"

#include "cuda/flash_attention_kernels.cuh"

static std::vector<float> random_bf16(size_t n, float scale)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = round_bf16(scale * uniform());
    return v;
}

static std::vector<__nv_bfloat16> to_bf16(const std::vector<float> &v)
{
    std::vector<__nv_bfloat16> out(v.size());
    for (size_t i = 0; i < v.size(); i++)
        out[i] = __float2bfloat16_rn(v[i]);
    return out;
}

static std::vector<float> from_bf16(const std::vector<__nv_bfloat16> &v)
{
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); i++)
        out[i] = __bfloat162float(v[i]);
    return out;
}

struct att_case {
    const char *name;
    int B, T, Hq, Hkv, D, window, nseg;
    float softcap; /* > 0: Gemma 2's attention logit soft-capping */
};

static ft_tensor bf(std::vector<__nv_bfloat16> &v)
{
    return ft_view(v.data(), v.size(), FT_BF16, FT_DEV_CUDA);
}

static void run_case(const att_case &c)
{
    printf(" %s: B=%d T=%d Hq=%d Hkv=%d D=%d window=%d segments=%d softcap=%g\n", c.name, c.B,
           c.T, c.Hq, c.Hkv, c.D, c.window, c.nseg, c.softcap);
    size_t nq = (size_t)c.B * c.T * c.Hq * c.D, nkv = (size_t)c.B * c.T * c.Hkv * c.D;
    size_t nl = (size_t)c.B * c.Hq * c.T;
    float scale = 1.0f / sqrtf((float)c.D);
    std::vector<float> q = random_bf16(nq, 1.5f), k = random_bf16(nkv, 1.5f),
                       v = random_bf16(nkv, 1.0f), dout = random_bf16(nq, 1.0f),
                       dq0 = random_bf16(nq, 0.1f), dk0 = random_bf16(nkv, 0.1f),
                       dv0 = random_bf16(nkv, 0.1f);
    std::vector<int32_t> seg((size_t)c.B * c.T, 0);
    if (c.nseg > 1) /* equal pieces, a new sequence every ceil(T / nseg) tokens */
        for (int b = 0; b < c.B; b++)
            for (int t = 0; t < c.T; t++)
                seg[(size_t)b * c.T + t] = t / ((c.T + c.nseg - 1) / c.nseg);
    ft_tensor seg_t = c.nseg > 1 ? ft_i32(seg.data(), seg.size()) : ft_none();

    /* the CPU reference */
    std::vector<float> out_ref(nq), lse_ref(nl);
    ft_attention_forward(ft_f32(out_ref.data(), nq), ft_f32(lse_ref.data(), nl),
                         ft_f32(q.data(), nq), ft_f32(k.data(), nkv), ft_f32(v.data(), nkv),
                         seg_t, c.B, c.T, c.Hq, c.Hkv, c.D, scale, c.window, c.softcap);
    std::vector<float> out_in(nq); /* the backward's out: the reference, stored as bf16 */
    for (size_t i = 0; i < nq; i++)
        out_in[i] = round_bf16(out_ref[i]);
    std::vector<float> dq_ref = dq0, dk_ref = dk0, dv_ref = dv0;
    ft_attention_backward(ft_f32(dq_ref.data(), nq), ft_f32(dk_ref.data(), nkv),
                          ft_f32(dv_ref.data(), nkv), ft_f32(dout.data(), nq),
                          ft_f32(q.data(), nq), ft_f32(k.data(), nkv), ft_f32(v.data(), nkv),
                          ft_f32(out_in.data(), nq), ft_f32(lse_ref.data(), nl), seg_t, c.B,
                          c.T, c.Hq, c.Hkv, c.D, scale, c.window, c.softcap);

    /* the kernels */
    auto qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v), doutb = to_bf16(dout);
    std::vector<__nv_bfloat16> outb(nq);
    std::vector<float> lse(nl);
    att_args a = {};
    a.q = fv(bf(qb));
    a.k = fv(bf(kb));
    a.v = fv(bf(vb));
    a.out = fv(bf(outb));
    a.lse_out = lse.data();
    a.seg = c.nseg > 1 ? seg.data() : NULL;
    a.B = c.B;
    a.T = c.T;
    a.Hq = c.Hq;
    a.Hkv = c.Hkv;
    a.G = c.Hq / c.Hkv;
    a.scale = scale;
    a.window = c.window;
    a.softcap = c.softcap;
    unsigned tiles = (unsigned)((c.T + FA_ROWS - 1) / FA_ROWS);
    void (*fwd)(att_args);
    void (*dq_k)(fa::fa_bwd_args), (*dkdv_k)(fa::fa_bwd_args), (*delta_k)(fa::fa_bwd_args);
    size_t fwd_smem, dq_smem, dkdv_smem;
    switch (c.D) {
#define FA_CASE(D)                                                                           \
    case D:                                                                                  \
        fwd = fa::fa_forward_kernel<D>;                                                      \
        dq_k = fa::fa_dq_kernel<D>;                                                          \
        dkdv_k = fa::fa_dkdv_kernel<D>;                                                      \
        delta_k = fa::fa_delta_kernel<D>;                                                    \
        fwd_smem = fa::fa_forward_smem<D>();                                                 \
        dq_smem = fa::fa_dq_smem<D>();                                                       \
        dkdv_smem = fa::fa_dkdv_smem<D>();                                                   \
        break;
        FA_CASE(16)
        FA_CASE(32)
        FA_CASE(48)
        FA_CASE(64)
        FA_CASE(80)
        FA_CASE(96)
        FA_CASE(112)
        FA_CASE(128)
    default:
        fprintf(stderr, "no kernel for D=%d\n", c.D);
        exit(2);
    }
    emu_launch(fwd, tiles, (unsigned)(c.B * c.Hq), FA_THREADS, a, fwd_smem);
    expect_close(c.name, "out", from_bf16(outb), out_ref, 1e-2);
    expect_close(c.name, "lse", lse, lse_ref, 1e-5);

    auto outin_b = to_bf16(out_in);
    a.out = fv(bf(outin_b));
    a.dout = fv(bf(doutb));
    a.lse_in = lse_ref.data();
    /* Dlt from the pre-kernel's buffer, and computed by the dk/dv kernel (no buffer): the
     * same gradients bit for bit, twice over (a backward repeats) */
    std::vector<float> delta(nl);
    std::vector<__nv_bfloat16> first[3];
    for (int run = 0; run < 2; run++) {
        auto dqb = to_bf16(dq0), dkb = to_bf16(dk0), dvb = to_bf16(dv0);
        a.dq = fv(bf(dqb));
        a.dk = fv(bf(dkb));
        a.dv = fv(bf(dvb));
        if (!run) { /* every batch at once */
            fa::fa_bwd_args p = {a, delta.data(), 0, c.B};
            emu_launch(delta_k, (unsigned)((nl + FA_WARPS - 1) / FA_WARPS), 1, FA_THREADS, p);
            emu_launch(dq_k, tiles, (unsigned)(c.B * c.Hq), FA_THREADS, p, dq_smem);
            emu_launch(dkdv_k, tiles, (unsigned)(c.B * c.Hkv), FA_THREADS, p, dkdv_smem);
        } else /* one batch a launch, as flash_attention.cu slices them */
            for (int b0 = 0; b0 < c.B; b0++) {
                fa::fa_bwd_args p = {a, NULL, b0, 1};
                emu_launch(dq_k, tiles, (unsigned)c.Hq, FA_THREADS, p, dq_smem);
                emu_launch(dkdv_k, tiles, (unsigned)c.Hkv, FA_THREADS, p, dkdv_smem);
            }
        if (!run) {
            expect_close(c.name, "dq", from_bf16(dqb), dq_ref, 1e-2);
            expect_close(c.name, "dk", from_bf16(dkb), dk_ref, 1e-2);
            expect_close(c.name, "dv", from_bf16(dvb), dv_ref, 1e-2);
            first[0] = dqb;
            first[1] = dkb;
            first[2] = dvb;
        } else {
            bool same = !memcmp(first[0].data(), dqb.data(), nq * 2) &&
                        !memcmp(first[1].data(), dkb.data(), nkv * 2) &&
                        !memcmp(first[2].data(), dvb.data(), nkv * 2);
            char label[128];
            snprintf(label, sizeof label, "%s backward without Dlt buffer: same bits", c.name);
            check(same, label, same ? 0.0 : 1.0, 0.0);
        }
    }
}

int main(void)
{
    static const att_case cases[] = {
        {"one-tile-d128", 1, 20, 2, 2, 128, 0, 0, 0.0f},
        {"ragged-mha-d64", 1, 70, 2, 2, 64, 0, 0, 0.0f},
        {"gqa-3tiles-d32", 1, 150, 4, 2, 32, 0, 0, 0.0f},
        {"mqa-d16", 2, 33, 3, 1, 16, 0, 0, 0.0f},
        {"packed-window5-d48", 2, 100, 2, 1, 48, 5, 3, 0.0f},
        {"window70-packed-d80", 1, 150, 2, 1, 80, 70, 2, 0.0f},
        {"packed-gqa-d96", 1, 130, 4, 2, 96, 0, 3, 0.0f},
        {"window-t1-d112", 1, 1, 2, 1, 112, 5, 0, 0.0f},
        /* a window of 2: query 64's first key, 63, sits in the tile before its own */
        {"window2-t128-d16", 1, 128, 1, 1, 16, 2, 0, 0.0f},
        /* Gemma 2's attention logit soft-capping (scores of a few units, capped at 1, 2) */
        {"softcap-gqa-3tiles-d64", 1, 150, 4, 2, 64, 0, 0, 1.0f},
        {"softcap-packed-window5-d32", 2, 100, 2, 1, 32, 5, 3, 1.0f},
        {"softcap-window70-d128", 1, 150, 2, 2, 128, 70, 0, 2.0f},
    };
    for (const att_case &c : cases)
        run_case(c);
    printf("flash_emu: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
