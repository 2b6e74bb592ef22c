/* The RMSNorm kernels (kernels/cuda/rmsnorm_kernels.cuh) run on the host through
 * cuda_emu.h, against the CPU ops: the forward alone and with the residual add fused
 * before it (out-of-place and in place, sum = x), fp32 and bf16 storage, and the
 * backward's dx and dw (accumulating into random values), on rows shorter than a warp,
 * ragged against the block's 256 threads, and longer than it; dw also over several row
 * chunks of its two-pass column sum (colsum.cuh).
 *
 * fp32 storage: out, rstd, dx and dw within 1e-5 normwise relative (the kernels sum in
 * fp32, the CPU in double); sum = x + res bit for bit. bf16 storage: the inputs are bf16
 * values, sum must be x + res rounded to bf16 bit for bit, and out within 1e-2 of the
 * CPU norm of that rounded sum. */
#include "cuda_emu.h"
#include "emu_check.h"

/* (in a namespace of its own: libft, linked in, has the GPU build's kernels of these
 * names) */
namespace emu {
#include "cuda/rmsnorm_kernels.cuh"
}
using namespace emu;

static std::vector<float> random(size_t n, float scale, bool bf16)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = bf16 ? round_bf16(scale * uniform()) : scale * uniform();
    return v;
}

static void expect_same(const char *label, const char *what, const std::vector<float> &got,
                        const std::vector<float> &ref)
{
    char s[128];
    snprintf(s, sizeof s, "%s %s (bitwise)", label, what);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++)
        bad += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
    check(bad == 0, s, (double)bad, 0);
}

/* A buffer as a kernel operand: fp32 as it is, or its bf16 rounding. */
struct operand {
    std::vector<float> f;
    std::vector<__nv_bfloat16> h;
    bool bf16;
    operand(const std::vector<float> &v, bool b) : f(v), bf16(b)
    {
        if (b)
            for (float x : v)
                h.push_back(__float2bfloat16_rn(x));
    }
    fview view() { return bf16 ? fview{h.data(), 1} : fview{f.data(), 0}; }
    std::vector<float> values() const
    {
        if (!bf16)
            return f;
        std::vector<float> out;
        for (auto x : h)
            out.push_back(__bfloat162float(x));
        return out;
    }
};

static void forward_case(int N, int C, bool bf16, bool residual, bool in_place)
{
    char label[96];
    snprintf(label, sizeof label, "fwd N=%d C=%d %s%s%s", N, C, bf16 ? "bf16" : "fp32",
             residual ? " +res" : "", in_place ? " in place" : "");
    size_t n = (size_t)N * C;
    std::vector<float> xv = random(n, 2.0f, bf16), rv = random(n, 1.5f, bf16),
                       wv = random((size_t)C, 1.0f, bf16);
    operand x(xv, bf16), res(rv, bf16), w(wv, bf16), out(std::vector<float>(n), bf16),
        sum(std::vector<float>(n), bf16);
    std::vector<float> rstd((size_t)N);
    rms_args a = {};
    a.out = out.view(), a.x = x.view(), a.w = w.view(), a.rstd = rstd.data();
    a.N = N, a.C = C, a.eps = 1e-5f;
    if (residual) {
        a.res = res.view();
        a.sum = in_place ? a.x : sum.view();
    }
    emu_launch(rmsnorm_forward_kernel, (unsigned)N, 1, RMS_THREADS, a);

    /* the reference: the rounded sum, then the CPU norm of it */
    std::vector<float> s_ref = xv;
    if (residual)
        for (size_t i = 0; i < n; i++)
            s_ref[i] = bf16 ? round_bf16(xv[i] + rv[i]) : xv[i] + rv[i];
    std::vector<float> o_ref(n), r_ref((size_t)N);
    ft_rmsnorm_forward(ft_f32(o_ref.data(), n), ft_f32(r_ref.data(), (size_t)N),
                       ft_f32(s_ref.data(), n), ft_f32(wv.data(), (size_t)C), N, C, 1e-5f, 0.0f);
    if (residual)
        expect_same(label, "sum", in_place ? x.values() : sum.values(), s_ref);
    expect_close(label, "out", out.values(), o_ref, bf16 ? 1e-2 : 1e-5);
    expect_close(label, "rstd", rstd, r_ref, 1e-5);
    if (residual && !bf16 && !in_place) { /* the fused CPU op gives the same */
        std::vector<float> s2(n), o2(n), r2((size_t)N);
        ft_add_rmsnorm_forward(ft_f32(s2.data(), n), ft_f32(o2.data(), n),
                               ft_f32(r2.data(), (size_t)N), ft_f32(xv.data(), n),
                               ft_f32(rv.data(), n), ft_f32(wv.data(), (size_t)C), N, C,
                               1e-5f, 0.0f);
        expect_same(label, "CPU fused sum", s2, s_ref);
        expect_same(label, "CPU fused out", o2, o_ref);
    }
}

static void backward_case(int N, int C)
{
    char label[96];
    snprintf(label, sizeof label, "bwd N=%d C=%d fp32", N, C);
    size_t n = (size_t)N * C;
    std::vector<float> x = random(n, 2.0f, false), w = random((size_t)C, 1.0f, false),
                       dout = random(n, 1.0f, false), dx0 = random(n, 0.5f, false),
                       dw0 = random((size_t)C, 0.5f, false);
    std::vector<float> out(n), rstd((size_t)N);
    ft_rmsnorm_forward(ft_f32(out.data(), n), ft_f32(rstd.data(), (size_t)N),
                       ft_f32(x.data(), n), ft_f32(w.data(), (size_t)C), N, C, 1e-5f, 0.0f);
    std::vector<float> dx = dx0, dw = dw0, dx_ref = dx0, dw_ref = dw0;
    rms_args a = {};
    a.dx = fview{dx.data(), 0}, a.dw = fview{dw.data(), 0}, a.dout = fview{dout.data(), 0};
    a.x = fview{x.data(), 0}, a.w = fview{w.data(), 0}, a.rstd = rstd.data(), a.N = N, a.C = C;
    emu_launch(rmsnorm_backward_dx_kernel, (unsigned)N, 1, RMS_THREADS, a);
    /* dw's column sum in row chunks (colsum.cuh), partials in room for 3 chunks (fewer
     * than N = 200 rows would take: the cap) */
    colsum_plan p = colsum_plan_for(N, C, (size_t)3 * C);
    std::vector<float> partial((size_t)p.chunks * C);
    a.partial = partial.data(), a.chunk_rows = p.rows;
    emu_launch(rmsnorm_backward_dw_kernel, (unsigned)((C + COLSUM_COLS - 1) / COLSUM_COLS),
               (unsigned)p.chunks, COLSUM_THREADS, a);
    if (p.chunks > 1) {
        colsum_args f = {a.dw, partial.data(), p.chunks, C};
        emu_launch(colsum_finish_kernel<>, (unsigned)((C + 255) / 256), 1, 256, f);
    }
    ft_rmsnorm_backward(ft_f32(dx_ref.data(), n), ft_f32(dw_ref.data(), (size_t)C),
                        ft_f32(dout.data(), n), ft_f32(x.data(), n),
                        ft_f32(w.data(), (size_t)C), ft_f32(rstd.data(), (size_t)N), N, C, 0.0f);
    expect_close(label, "dx", dx, dx_ref, 1e-5);
    expect_close(label, "dw", dw, dw_ref, 1e-5);
}

int main(void)
{
    rng_state = 777;
    static const int shapes[][2] = {{3, 1}, {5, 37}, {4, 256}, {2, 1000}, {3, 2053}};
    for (const auto &s : shapes) {
        for (int bf16 = 0; bf16 < 2; bf16++) {
            forward_case(s[0], s[1], bf16, false, false);
            forward_case(s[0], s[1], bf16, true, false);
            forward_case(s[0], s[1], bf16, true, true);
        }
        backward_case(s[0], s[1]);
    }
    /* dw over several row chunks (the last ragged) and a ragged column tile */
    backward_case(200, 37);
    backward_case(130, 70);
    printf("rmsnorm_emu: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
