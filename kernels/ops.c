/* Dispatch of the ops interface: checks that every operand is a view large enough for
 * the op's shape arguments, of an accepted dtype and on the op's device (the device of
 * its first operand), then calls that device's implementation: kernels/cpu/ for CPU
 * views, kernels/cuda/ for GPU views (CUDA builds). A mismatch is a bug in the caller,
 * not bad user input, so it prints what was wrong and aborts.
 *
 * dtypes: the CPU backend is fp32. On the GPU a floating-point operand may be fp32 or
 * bf16; the few operands that must be fp32 there (rstd, lse, the optimizer's master
 * weights and state, dequantization tables) are checked as such. */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>

#include "cpu/cpu_ops.h"
#ifdef FT_HAVE_CUDA
#include "cuda/cuda_ops.h"
#endif

static size_t dtype_size(ft_dtype d)
{
    return d == FT_F32 || d == FT_I32 ? 4 : d == FT_U8 || d == FT_I8 ? 1 : 2;
}

ft_tensor ft_slice(ft_tensor t, size_t offset, size_t numel)
{
    if (offset + numel > t.numel) {
        fprintf(stderr, "ft_slice: [%zu, %zu) out of a view of %zu elements\n", offset,
                offset + numel, t.numel);
        abort();
    }
    t.data = (char *)t.data + offset * dtype_size(t.dtype);
    t.numel = numel;
    return t;
}

/* The op being checked and the device it runs on. */
typedef struct opcheck {
    const char *op;
    ft_device dev;
} opcheck;

static const char *device_name(ft_device d)
{
    return d == FT_DEV_CUDA ? "the GPU" : "the CPU";
}

static opcheck begin(const char *op, ft_tensor first)
{
    opcheck c = {op, first.device};
#ifndef FT_HAVE_CUDA
    if (c.dev == FT_DEV_CUDA) {
        fprintf(stderr, "%s: a GPU operand, but this build has no CUDA backend\n", op);
        abort();
    }
#endif
    return c;
}

static _Noreturn void bad_operand(opcheck c, const char *name, ft_tensor t, size_t numel,
                                  const char *want)
{
    fprintf(stderr,
            "%s: operand %s: need %zu elements of %s on %s, got %zu of dtype %d on "
            "device %d%s\n",
            c.op, name, numel, want, device_name(c.dev), t.numel, (int)t.dtype,
            (int)t.device, t.data ? "" : " (null)");
    abort();
}

/* An operand of exactly this dtype, present and big enough. */
static void need(opcheck c, const char *name, ft_tensor t, size_t numel, ft_dtype dtype)
{
    if (!t.data || t.numel < numel || t.dtype != dtype || t.device != c.dev)
        bad_operand(c, name, t, numel, dtype == FT_F32 ? "fp32" : "the op's integer dtype");
}

/* A floating-point operand: fp32, or bf16 on the GPU. */
static void needf(opcheck c, const char *name, ft_tensor t, size_t numel)
{
    int ok_dtype = t.dtype == FT_F32 || (c.dev == FT_DEV_CUDA && t.dtype == FT_BF16);
    if (!t.data || t.numel < numel || !ok_dtype || t.device != c.dev)
        bad_operand(c, name, t, numel, c.dev == FT_DEV_CUDA ? "fp32 or bf16" : "fp32");
}

/* Operands that may be ft_none(). */
static void maybe(opcheck c, const char *name, ft_tensor t, size_t numel, ft_dtype dtype)
{
    if (t.data)
        need(c, name, t, numel, dtype);
}

static void maybef(opcheck c, const char *name, ft_tensor t, size_t numel)
{
    if (t.data)
        needf(c, name, t, numel);
}

/* GPU GEMMs (cuBLAS) take both inputs in one dtype, and fp32 inputs give an fp32
 * result only: a present `t` must be `like`'s dtype (same_as) or, for outputs, fp32
 * or like's dtype. */
static void same_dtype(opcheck c, const char *name, ft_tensor t, ft_tensor like,
                       const char *like_name)
{
    if (t.data && t.dtype != like.dtype) {
        fprintf(stderr, "%s: operand %s has dtype %d but %s has %d: the GEMM inputs must share one dtype\n",
                c.op, name, (int)t.dtype, like_name, (int)like.dtype);
        abort();
    }
}

static void output_dtype(opcheck c, const char *name, ft_tensor t, ft_tensor in)
{
    if (t.data && t.dtype != FT_F32 && t.dtype != in.dtype) {
        fprintf(stderr, "%s: operand %s is bf16 but the GEMM inputs are fp32\n", c.op, name);
        abort();
    }
}

#define ON_GPU(c) ((c).dev == FT_DEV_CUDA)
#ifdef FT_HAVE_CUDA
/* Each call under FT_CUDA_PROFILE's timer (kernels/cuda/op_profile.cu), keyed by the op's
 * name, or by `key` (GPU_CALL_KEY: a GEMM's shape) */
#define GPU_CALL_KEY(c, key, call)                                                      \
    do {                                                                                \
        if (ON_GPU(c)) {                                                                \
            int timed_ = ft_cuda_profile_begin(key);                                    \
            call;                                                                       \
            if (timed_)                                                                 \
                ft_cuda_profile_end();                                                  \
            return;                                                                     \
        }                                                                               \
    } while (0)
#define GPU_CALL(c, call) GPU_CALL_KEY(c, (c).op, call)
#define GPU_RETURN(c, call)                                                             \
    do {                                                                                \
        if (ON_GPU(c)) {                                                                \
            int timed_ = ft_cuda_profile_begin((c).op);                                 \
            double r_ = call;                                                           \
            if (timed_)                                                                 \
                ft_cuda_profile_end();                                                  \
            return r_;                                                                  \
        }                                                                               \
    } while (0)
#else
#define GPU_CALL_KEY(c, key, call) ((void)0)
#define GPU_CALL(c, call) ((void)0)
#define GPU_RETURN(c, call) ((void)0)
#endif

#define F(t) ((float *)(t).data)
#define I(t) ((int32_t *)(t).data)
#define SZ(a, b) ((size_t)(a) * (size_t)(b))

#ifdef FT_HAVE_CUDA
/* FT_CUDA_PROFILE's key of a GEMM: its op, input dtype, shape and the outputs it makes
 * with their dtypes, e.g. "linear_forward bf16 N=8192 in=2048 out=2048 y->fp32 +=" or
 * "linear_backward bf16 N=512 in=2048 out=128256 dx->bf16 dw->fp32" (an fp32 output of
 * bf16 inputs is another cuBLAS kernel, and twice the bytes written). An output without
 * data is left out. */
static const char *gemm_key(char *buf, size_t len, const char *op, ft_tensor x, int N, int in,
                            int out, const char *tail, int nout, const char *const *names,
                            const ft_tensor *outs)
{
    if (!ft_cuda_profile_enabled())
        return op;
    int k = snprintf(buf, len, "%s %s N=%d in=%d out=%d", op,
                     x.dtype == FT_BF16 ? "bf16" : "fp32", N, in, out);
    for (int i = 0; i < nout && k >= 0 && (size_t)k < len; i++)
        if (outs[i].data)
            k += snprintf(buf + k, len - (size_t)k, " %s->%s", names[i],
                          outs[i].dtype == FT_BF16 ? "bf16" : "fp32");
    if (k >= 0 && (size_t)k < len)
        snprintf(buf + k, len - (size_t)k, "%s", tail);
    return buf;
}
#endif

void ft_linear_forward(ft_tensor y, ft_tensor x, ft_tensor w, ft_tensor b, int N, int in,
                       int out, float alpha, int accumulate)
{
    opcheck c = begin("linear_forward", y);
    needf(c, "y", y, SZ(N, out));
    needf(c, "x", x, SZ(N, in));
    needf(c, "w", w, SZ(out, in));
    maybef(c, "b", b, out);
    if (ON_GPU(c)) {
        same_dtype(c, "w", w, x, "x");
        output_dtype(c, "y", y, x);
    }
#ifdef FT_HAVE_CUDA
    char key[128];
    static const char *const names[] = {"y"};
    GPU_CALL_KEY(c, gemm_key(key, sizeof key, c.op, x, N, in, out, accumulate ? " +=" : "", 1,
                             names, &y),
                 ft_cuda_linear_forward(y, x, w, b, N, in, out, alpha, accumulate));
#endif
    ft_cpu_linear_forward(F(y), F(x), F(w), F(b), N, in, out, alpha, accumulate);
}

void ft_linear_backward(ft_tensor dx, ft_tensor dw, ft_tensor db, ft_tensor dy,
                        ft_tensor x, ft_tensor w, int N, int in, int out, float alpha)
{
    opcheck c = begin("linear_backward", dy);
    maybef(c, "dx", dx, SZ(N, in));
    maybef(c, "dw", dw, SZ(out, in));
    maybef(c, "db", db, out);
    needf(c, "dy", dy, SZ(N, out));
    if (dw.data)
        needf(c, "x", x, SZ(N, in));
    if (dx.data)
        needf(c, "w", w, SZ(out, in));
    if (ON_GPU(c)) {
        if (dw.data)
            same_dtype(c, "x", x, dy, "dy");
        if (dx.data)
            same_dtype(c, "w", w, dy, "dy");
        output_dtype(c, "dx", dx, dy);
        output_dtype(c, "dw", dw, dy);
    }
#ifdef FT_HAVE_CUDA
    char key[128];
    static const char *const names[] = {"dx", "dw"};
    const ft_tensor outs[] = {dx, dw};
    GPU_CALL_KEY(c, gemm_key(key, sizeof key, c.op, dy, N, in, out, "", 2, names, outs),
                 ft_cuda_linear_backward(dx, dw, db, dy, x, w, N, in, out, alpha));
#endif
    ft_cpu_linear_backward(F(dx), F(dw), F(db), F(dy), F(x), F(w), N, in, out, alpha);
}

/* On the GPU the LoRA linear is the linear ops in sequence (each under its own profile
 * key); on the CPU one kernel runs their GEMMs in one parallel region. */
void ft_lora_linear_forward(ft_tensor y, ft_tensor h, ft_tensor x, ft_tensor xd, ft_tensor w,
                            ft_tensor b, ft_tensor a, ft_tensor bl, int N, int in, int out,
                            int r, float s, int compute_h)
{
    opcheck c = begin("lora_linear_forward", y);
    if (ON_GPU(c)) {
        ft_linear_forward(y, x, w, b, N, in, out, 1.0f, 0);
        if (compute_h)
            ft_linear_forward(h, xd, a, ft_none(), N, in, r, 1.0f, 0);
        ft_linear_forward(y, h, bl, ft_none(), N, r, out, s, 1);
        return;
    }
    needf(c, "y", y, SZ(N, out));
    needf(c, "h", h, SZ(N, r));
    needf(c, "x", x, SZ(N, in));
    needf(c, "w", w, SZ(out, in));
    maybef(c, "b", b, out);
    needf(c, "b_lora", bl, SZ(out, r));
    if (compute_h) {
        needf(c, "xd", xd, SZ(N, in));
        needf(c, "a", a, SZ(r, in));
    }
    ft_cpu_lora_linear_forward(F(y), F(h), F(x), F(xd), F(w), F(b), F(a), F(bl), N, in, out,
                               r, s, compute_h);
}

void ft_lora_linear_backward(ft_tensor dx, ft_tensor dx_lora, ft_tensor da, ft_tensor dbl,
                             ft_tensor dh, ft_tensor dy, ft_tensor xd, ft_tensor h,
                             ft_tensor w, ft_tensor a, ft_tensor bl, int N, int in, int out,
                             int r, float s)
{
    opcheck c = begin("lora_linear_backward", dy);
    if (dx_lora.data && dx_lora.data == xd.data) {
        fprintf(stderr, "%s: dx_lora is xd, which dA still reads\n", c.op);
        abort();
    }
    if (ON_GPU(c)) {
        if (dx.data)
            ft_linear_backward(dx, ft_none(), ft_none(), dy, ft_none(), w, N, in, out, 1.0f);
        ft_linear_backward(ft_none(), dbl, ft_none(), dy, h, bl, N, r, out, s);
        ft_zero(dh, SZ(N, r));
        ft_linear_backward(dh, ft_none(), ft_none(), dy, h, bl, N, r, out, s);
        ft_linear_backward(ft_none(), da, ft_none(), dh, xd, a, N, in, r, 1.0f);
        if (dx_lora.data)
            ft_linear_backward(dx_lora, ft_none(), ft_none(), dh, ft_none(), a, N, in, r, 1.0f);
        return;
    }
    maybef(c, "dx", dx, SZ(N, in));
    maybef(c, "dx_lora", dx_lora, SZ(N, in));
    maybef(c, "da", da, SZ(r, in));
    maybef(c, "db_lora", dbl, SZ(out, r));
    needf(c, "dh", dh, SZ(N, r));
    needf(c, "dy", dy, SZ(N, out));
    needf(c, "b_lora", bl, SZ(out, r));
    if (dx.data)
        needf(c, "w", w, SZ(out, in));
    if (dbl.data)
        needf(c, "h", h, SZ(N, r));
    if (da.data)
        needf(c, "xd", xd, SZ(N, in));
    if (dx_lora.data)
        needf(c, "a", a, SZ(r, in));
    ft_cpu_lora_linear_backward(F(dx), F(dx_lora), F(da), F(dbl), F(dh), F(dy), F(xd), F(h),
                                F(w), F(a), F(bl), N, in, out, r, s);
}

void ft_embedding_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N, int V,
                          int C)
{
    opcheck c = begin("embedding_forward", out);
    needf(c, "out", out, SZ(N, C));
    need(c, "ids", ids, N, FT_I32);
    needf(c, "table", table, SZ(V, C));
    GPU_CALL(c, ft_cuda_embedding_forward(out, ids, table, N, V, C));
    ft_cpu_embedding_forward(F(out), I(ids), F(table), N, V, C);
}

void ft_embedding_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids, int N, int V,
                           int C, int pad)
{
    opcheck c = begin("embedding_backward", dtable);
    needf(c, "dtable", dtable, SZ(V, C));
    needf(c, "dout", dout, SZ(N, C));
    need(c, "ids", ids, N, FT_I32);
    GPU_CALL(c, ft_cuda_embedding_backward(dtable, dout, ids, N, V, C, pad));
    ft_cpu_embedding_backward(F(dtable), F(dout), I(ids), N, V, C, pad);
}

void ft_embedding_t_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N, int V, int C)
{
    opcheck c = begin("embedding_t_forward", out);
    needf(c, "out", out, SZ(N, C));
    need(c, "ids", ids, (size_t)N, FT_I32);
    needf(c, "table", table, SZ(V, C));
    GPU_CALL(c, ft_cuda_embedding_t_forward(out, ids, table, N, V, C));
    ft_cpu_embedding_t_forward(F(out), I(ids), F(table), N, V, C);
}

void ft_embedding_t_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids, int N, int V,
                             int C, int pad)
{
    opcheck c = begin("embedding_t_backward", dtable);
    need(c, "dtable", dtable, SZ(V, C), FT_F32);
    needf(c, "dout", dout, SZ(N, C));
    need(c, "ids", ids, (size_t)N, FT_I32);
    GPU_CALL(c, ft_cuda_embedding_t_backward(dtable, dout, ids, N, V, C, pad));
    ft_cpu_embedding_t_backward(F(dtable), F(dout), I(ids), N, V, C, pad);
}

void ft_rmsnorm_forward(ft_tensor out, ft_tensor rstd, ft_tensor x, ft_tensor w, int N,
                        int C, float eps, float w_offset)
{
    opcheck c = begin("rmsnorm_forward", out);
    needf(c, "out", out, SZ(N, C));
    need(c, "rstd", rstd, N, FT_F32);
    needf(c, "x", x, SZ(N, C));
    needf(c, "w", w, C);
    GPU_CALL(c, ft_cuda_rmsnorm_forward(out, rstd, x, w, N, C, eps, w_offset));
    ft_cpu_rmsnorm_forward(F(out), F(rstd), F(x), F(w), N, C, eps, w_offset);
}

void ft_add_rmsnorm_forward(ft_tensor sum, ft_tensor out, ft_tensor rstd, ft_tensor x,
                            ft_tensor res, ft_tensor w, int N, int C, float eps,
                            float w_offset)
{
    opcheck c = begin("add_rmsnorm_forward", out);
    needf(c, "sum", sum, SZ(N, C));
    needf(c, "out", out, SZ(N, C));
    need(c, "rstd", rstd, N, FT_F32);
    needf(c, "x", x, SZ(N, C));
    needf(c, "res", res, SZ(N, C));
    needf(c, "w", w, C);
    GPU_CALL(c, ft_cuda_add_rmsnorm_forward(sum, out, rstd, x, res, w, N, C, eps, w_offset));
    ft_cpu_add_rmsnorm_forward(F(sum), F(out), F(rstd), F(x), F(res), F(w), N, C, eps,
                               w_offset);
}

void ft_rmsnorm_backward(ft_tensor dx, ft_tensor dw, ft_tensor dout, ft_tensor x,
                         ft_tensor w, ft_tensor rstd, int N, int C, float w_offset)
{
    opcheck c = begin("rmsnorm_backward", dout);
    maybef(c, "dx", dx, SZ(N, C));
    maybef(c, "dw", dw, C);
    needf(c, "dout", dout, SZ(N, C));
    needf(c, "x", x, SZ(N, C));
    needf(c, "w", w, C);
    need(c, "rstd", rstd, N, FT_F32);
    GPU_CALL(c, ft_cuda_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C, w_offset));
    ft_cpu_rmsnorm_backward(F(dx), F(dw), F(dout), F(x), F(w), F(rstd), N, C, w_offset);
}

static void rope_dims(opcheck c, int D, int rd)
{
    if (rd < 2 || rd > D || rd % 2 != 0) {
        fprintf(stderr, "%s: %d rotary dims: need an even number in [2, head_dim = %d]\n",
                c.op, rd, D);
        abort();
    }
}

void ft_rope_forward(ft_tensor x, ft_tensor pos, ft_tensor inv_freq, int N, int heads,
                     int D, int rd, float scale)
{
    opcheck c = begin("rope_forward", x);
    rope_dims(c, D, rd);
    needf(c, "x", x, SZ(N, heads) * (size_t)D);
    need(c, "pos", pos, N, FT_I32);
    need(c, "inv_freq", inv_freq, (size_t)rd / 2, FT_F32);
    GPU_CALL(c, ft_cuda_rope_forward(x, pos, inv_freq, N, heads, D, rd, scale));
    ft_cpu_rope_forward(F(x), I(pos), F(inv_freq), N, heads, D, rd, scale);
}

void ft_rope_backward(ft_tensor dx, ft_tensor pos, ft_tensor inv_freq, int N, int heads,
                      int D, int rd, float scale)
{
    opcheck c = begin("rope_backward", dx);
    rope_dims(c, D, rd);
    needf(c, "dx", dx, SZ(N, heads) * (size_t)D);
    need(c, "pos", pos, N, FT_I32);
    need(c, "inv_freq", inv_freq, (size_t)rd / 2, FT_F32);
    GPU_CALL(c, ft_cuda_rope_backward(dx, pos, inv_freq, N, heads, D, rd, scale));
    ft_cpu_rope_backward(F(dx), I(pos), F(inv_freq), N, heads, D, rd, scale);
}

static void attention_heads(opcheck c, int Hq, int Hkv, int D)
{
    if (Hkv <= 0 || Hq % Hkv != 0) {
        fprintf(stderr, "%s: %d query heads are not a multiple of %d kv heads\n", c.op, Hq,
                Hkv);
        abort();
    }
#ifdef FT_HAVE_CUDA
    if (ON_GPU(c) && D > FT_CUDA_ATT_MAX_D) {
        fprintf(stderr, "%s: head_dim %d is above the GPU kernel's %d\n", c.op, D,
                FT_CUDA_ATT_MAX_D);
        abort();
    }
#else
    (void)D;
#endif
}

void ft_attention_forward(ft_tensor out, ft_tensor lse, ft_tensor q, ft_tensor k,
                          ft_tensor v, ft_tensor seg, int B, int T, int Hq, int Hkv, int D,
                          float scale, int window, float softcap)
{
    opcheck c = begin("attention_forward", out);
    size_t nq = SZ(B, T) * SZ(Hq, D), nkv = SZ(B, T) * SZ(Hkv, D);
    attention_heads(c, Hq, Hkv, D);
    needf(c, "out", out, nq);
    need(c, "lse", lse, SZ(B, Hq) * (size_t)T, FT_F32);
    needf(c, "q", q, nq);
    needf(c, "k", k, nkv);
    needf(c, "v", v, nkv);
    maybe(c, "seg", seg, SZ(B, T), FT_I32);
    GPU_CALL(c, ft_cuda_attention_forward(out, lse, q, k, v, seg, B, T, Hq, Hkv, D, scale,
                                          window, softcap));
    ft_cpu_attention_forward(F(out), F(lse), F(q), F(k), F(v), I(seg), B, T, Hq, Hkv, D,
                             scale, window, softcap);
}

void ft_attention_backward(ft_tensor dq, ft_tensor dk, ft_tensor dv, ft_tensor dout,
                           ft_tensor q, ft_tensor k, ft_tensor v, ft_tensor out,
                           ft_tensor lse, ft_tensor seg, int B, int T, int Hq, int Hkv,
                           int D, float scale, int window, float softcap)
{
    opcheck c = begin("attention_backward", dout);
    size_t nq = SZ(B, T) * SZ(Hq, D), nkv = SZ(B, T) * SZ(Hkv, D);
    attention_heads(c, Hq, Hkv, D);
    maybef(c, "dq", dq, nq);
    maybef(c, "dk", dk, nkv);
    maybef(c, "dv", dv, nkv);
    needf(c, "dout", dout, nq);
    needf(c, "q", q, nq);
    needf(c, "k", k, nkv);
    needf(c, "v", v, nkv);
    needf(c, "out", out, nq);
    need(c, "lse", lse, SZ(B, Hq) * (size_t)T, FT_F32);
    maybe(c, "seg", seg, SZ(B, T), FT_I32);
    GPU_CALL(c, ft_cuda_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, seg, B, T,
                                           Hq, Hkv, D, scale, window, softcap));
    ft_cpu_attention_backward(F(dq), F(dk), F(dv), F(dout), F(q), F(k), F(v), F(out),
                              F(lse), I(seg), B, T, Hq, Hkv, D, scale, window, softcap);
}

void ft_swiglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    opcheck c = begin("swiglu_forward", out);
    needf(c, "out", out, n);
    needf(c, "gate", gate, n);
    needf(c, "up", up, n);
    GPU_CALL(c, ft_cuda_swiglu_forward(out, gate, up, n));
    ft_cpu_swiglu_forward(F(out), F(gate), F(up), n);
}

void ft_swiglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate,
                        ft_tensor up, size_t n)
{
    opcheck c = begin("swiglu_backward", dout);
    needf(c, "dgate", dgate, n);
    needf(c, "dup", dup, n);
    needf(c, "dout", dout, n);
    needf(c, "gate", gate, n);
    needf(c, "up", up, n);
    GPU_CALL(c, ft_cuda_swiglu_backward(dgate, dup, dout, gate, up, n));
    ft_cpu_swiglu_backward(F(dgate), F(dup), F(dout), F(gate), F(up), n);
}

static void moe_check_k(const char *op, int E, int k)
{
    if (E < 1 || k < 1 || k > E || k > FT_MOE_MAX_K) {
        fprintf(stderr, "%s: top-k %d of %d experts (need 1 <= k <= min(E, %d))\n", op, k,
                E, FT_MOE_MAX_K);
        abort();
    }
}

void ft_moe_router_forward(ft_tensor probs, ft_tensor idx, ft_tensor w, ft_tensor logits,
                           int N, int E, int k, int renorm)
{
    opcheck c = begin("moe_router_forward", probs);
    moe_check_k(c.op, E, k);
    need(c, "probs", probs, SZ(N, E), FT_F32);
    need(c, "idx", idx, SZ(N, k), FT_I32);
    need(c, "w", w, SZ(N, k), FT_F32);
    needf(c, "logits", logits, SZ(N, E));
    GPU_CALL(c, ft_cuda_moe_router_forward(probs, idx, w, logits, N, E, k, renorm));
    ft_cpu_moe_router_forward(F(probs), I(idx), F(w), F(logits), N, E, k, renorm);
}

void ft_moe_router_backward(ft_tensor dlogits, ft_tensor dw, ft_tensor aux_dp,
                            ft_tensor probs, ft_tensor idx, ft_tensor w, int N, int E, int k,
                            int renorm)
{
    opcheck c = begin("moe_router_backward", dlogits);
    moe_check_k(c.op, E, k);
    needf(c, "dlogits", dlogits, SZ(N, E));
    maybe(c, "dw", dw, SZ(N, k), FT_F32);
    maybe(c, "aux_dp", aux_dp, E, FT_F32);
    need(c, "probs", probs, SZ(N, E), FT_F32);
    need(c, "idx", idx, SZ(N, k), FT_I32);
    need(c, "w", w, SZ(N, k), FT_F32);
    GPU_CALL(c, ft_cuda_moe_router_backward(dlogits, dw, aux_dp, probs, idx, w, N, E, k,
                                            renorm));
    ft_cpu_moe_router_backward(F(dlogits), F(dw), F(aux_dp), F(probs), I(idx), F(w), N, E,
                               k, renorm);
}

void ft_moe_plan(int32_t *offsets, int32_t *rows, int32_t *slot, const int32_t *idx, int N,
                 int E, int k)
{
    moe_check_k("moe_plan", E, k);
    for (size_t i = 0; i < SZ(N, k); i++)
        if (idx[i] < 0 || idx[i] >= E) {
            fprintf(stderr, "moe_plan: expert %d of pair %zu is not in [0, %d)\n", idx[i], i,
                    E);
            abort();
        }
    ft_cpu_moe_plan(offsets, rows, slot, idx, N, E, k);
}

void ft_moe_gather_forward(ft_tensor xe, ft_tensor x, ft_tensor rows, int N, int k, int C)
{
    opcheck c = begin("moe_gather_forward", xe);
    needf(c, "xe", xe, SZ(N, k) * (size_t)C);
    needf(c, "x", x, SZ(N, C));
    need(c, "rows", rows, SZ(N, k), FT_I32);
    GPU_CALL(c, ft_cuda_moe_gather_forward(xe, x, rows, N, k, C));
    ft_cpu_moe_gather_forward(F(xe), F(x), I(rows), N * k, C);
}

void ft_moe_gather_backward(ft_tensor dx, ft_tensor dxe, ft_tensor slot, int N, int k, int C)
{
    opcheck c = begin("moe_gather_backward", dx);
    needf(c, "dx", dx, SZ(N, C));
    needf(c, "dxe", dxe, SZ(N, k) * (size_t)C);
    need(c, "slot", slot, SZ(N, k), FT_I32);
    GPU_CALL(c, ft_cuda_moe_gather_backward(dx, dxe, slot, N, k, C));
    ft_cpu_moe_gather_backward(F(dx), F(dxe), I(slot), N, k, C);
}

void ft_moe_combine_forward(ft_tensor out, ft_tensor ye, ft_tensor w, ft_tensor slot, int N,
                            int k, int C, int accumulate)
{
    opcheck c = begin("moe_combine_forward", out);
    needf(c, "out", out, SZ(N, C));
    needf(c, "ye", ye, SZ(N, k) * (size_t)C);
    need(c, "w", w, SZ(N, k), FT_F32);
    need(c, "slot", slot, SZ(N, k), FT_I32);
    GPU_CALL(c, ft_cuda_moe_combine_forward(out, ye, w, slot, N, k, C, accumulate));
    ft_cpu_moe_combine_forward(F(out), F(ye), F(w), I(slot), N, k, C, accumulate);
}

void ft_moe_combine_backward(ft_tensor dye, ft_tensor dw, ft_tensor dout, ft_tensor ye,
                             ft_tensor w, ft_tensor slot, int N, int k, int C)
{
    opcheck c = begin("moe_combine_backward", dout);
    maybef(c, "dye", dye, SZ(N, k) * (size_t)C);
    maybe(c, "dw", dw, SZ(N, k), FT_F32);
    needf(c, "dout", dout, SZ(N, C));
    needf(c, "ye", ye, SZ(N, k) * (size_t)C);
    need(c, "w", w, SZ(N, k), FT_F32);
    need(c, "slot", slot, SZ(N, k), FT_I32);
    GPU_CALL(c, ft_cuda_moe_combine_backward(dye, dw, dout, ye, w, slot, N, k, C));
    ft_cpu_moe_combine_backward(F(dye), F(dw), F(dout), F(ye), F(w), I(slot), N, k, C);
}

void ft_moe_lora_b_split(ft_tensor dst, ft_tensor src, int out, int r, int E)
{
    opcheck c = begin("moe_lora_b_split", dst);
    size_t n = SZ(out, r) * (size_t)E;
    needf(c, "dst", dst, n);
    needf(c, "src", src, n);
    GPU_CALL(c, ft_cuda_moe_lora_b_split(dst, src, out, r, E));
    ft_cpu_moe_lora_b_split(F(dst), F(src), out, r, E);
}

void ft_moe_lora_b_merge_add(ft_tensor dst, ft_tensor src, int out, int r, int E)
{
    opcheck c = begin("moe_lora_b_merge_add", dst);
    size_t n = SZ(out, r) * (size_t)E;
    need(c, "dst", dst, n, FT_F32);
    needf(c, "src", src, n);
    GPU_CALL(c, ft_cuda_moe_lora_b_merge_add(dst, src, out, r, E));
    ft_cpu_moe_lora_b_merge_add(F(dst), F(src), out, r, E);
}

void ft_sigmoid_forward(ft_tensor s, ft_tensor z, size_t n)
{
    opcheck c = begin("sigmoid_forward", s);
    need(c, "s", s, n, FT_F32);
    needf(c, "z", z, n);
    GPU_CALL(c, ft_cuda_sigmoid_forward(s, z, n));
    ft_cpu_sigmoid_forward(F(s), F(z), n);
}

void ft_sigmoid_backward(ft_tensor dz, ft_tensor ds, ft_tensor s, size_t n)
{
    opcheck c = begin("sigmoid_backward", dz);
    needf(c, "dz", dz, n);
    need(c, "ds", ds, n, FT_F32);
    need(c, "s", s, n, FT_F32);
    GPU_CALL(c, ft_cuda_sigmoid_backward(dz, ds, s, n));
    ft_cpu_sigmoid_backward(F(dz), F(ds), F(s), n);
}

void ft_moe_aux_stats(ft_tensor counts, ft_tensor psum, ft_tensor probs, ft_tensor idx,
                      int N, int E, int k)
{
    opcheck c = begin("moe_aux_stats", counts);
    moe_check_k(c.op, E, k);
    need(c, "counts", counts, E, FT_F32);
    need(c, "psum", psum, E, FT_F32);
    need(c, "probs", probs, SZ(N, E), FT_F32);
    need(c, "idx", idx, SZ(N, k), FT_I32);
    GPU_CALL(c, ft_cuda_moe_aux_stats(counts, psum, probs, idx, N, E, k));
    ft_cpu_moe_aux_stats(F(counts), F(psum), F(probs), I(idx), N, E, k);
}

void ft_geglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    opcheck c = begin("geglu_forward", out);
    needf(c, "out", out, n);
    needf(c, "gate", gate, n);
    needf(c, "up", up, n);
    GPU_CALL(c, ft_cuda_geglu_forward(out, gate, up, n));
    ft_cpu_geglu_forward(F(out), F(gate), F(up), n);
}

void ft_geglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate,
                       ft_tensor up, size_t n)
{
    opcheck c = begin("geglu_backward", dout);
    maybef(c, "dgate", dgate, n);
    maybef(c, "dup", dup, n);
    needf(c, "dout", dout, n);
    needf(c, "gate", gate, n);
    needf(c, "up", up, n);
    GPU_CALL(c, ft_cuda_geglu_backward(dgate, dup, dout, gate, up, n));
    ft_cpu_geglu_backward(F(dgate), F(dup), F(dout), F(gate), F(up), n);
}

double ft_cross_entropy(ft_tensor dlogits, ft_tensor logits, ft_tensor targets, int N,
                        int V, float grad_scale, float softcap)
{
    opcheck c = begin("cross_entropy", logits);
    maybef(c, "dlogits", dlogits, SZ(N, V));
    needf(c, "logits", logits, SZ(N, V));
    need(c, "targets", targets, N, FT_I32);
    GPU_RETURN(c, ft_cuda_cross_entropy(dlogits, logits, targets, N, V, grad_scale, softcap));
    return ft_cpu_cross_entropy(F(dlogits), F(logits), I(targets), N, V, grad_scale, softcap);
}

void ft_add(ft_tensor y, ft_tensor x, size_t n)
{
    opcheck c = begin("add", y);
    needf(c, "y", y, n);
    needf(c, "x", x, n);
    GPU_CALL(c, ft_cuda_add(y, x, n));
    ft_cpu_add(F(y), F(x), n);
}

void ft_copy(ft_tensor y, ft_tensor x, size_t n)
{
    opcheck c = begin("copy", y);
    needf(c, "y", y, n);
    needf(c, "x", x, n);
    GPU_CALL(c, ft_cuda_copy(y, x, n));
    ft_cpu_copy(F(y), F(x), n);
}

void ft_zero(ft_tensor y, size_t n)
{
    opcheck c = begin("zero", y);
    needf(c, "y", y, n);
    GPU_CALL(c, ft_cuda_zero(y, n));
    ft_cpu_zero(F(y), n);
}

double ft_sumsq(ft_tensor x, size_t n)
{
    opcheck c = begin("sumsq", x);
    needf(c, "x", x, n);
    GPU_RETURN(c, ft_cuda_sumsq(x, n));
    return ft_cpu_sumsq(F(x), n);
}

void ft_scale(ft_tensor x, float s, size_t n)
{
    opcheck c = begin("scale", x);
    needf(c, "x", x, n);
    GPU_CALL(c, ft_cuda_scale(x, s, n));
    ft_cpu_scale(F(x), s, n);
}

void ft_softcap(ft_tensor x, float cap, size_t n)
{
    opcheck c = begin("softcap", x);
    needf(c, "x", x, n);
    if (!(cap > 0.0f)) {
        fprintf(stderr, "softcap: cap %g is not positive\n", cap);
        abort();
    }
    GPU_CALL(c, ft_cuda_softcap(x, cap, n));
    ft_cpu_softcap(F(x), cap, n);
}

void ft_dora_norm(ft_tensor g, ft_tensor inv, ft_tensor mag, ft_tensor w, int R, int C)
{
    opcheck c = begin("dora_norm", w);
    need(c, "g", g, (size_t)R, FT_F32);
    need(c, "inv", inv, (size_t)R, FT_F32);
    needf(c, "mag", mag, (size_t)R);
    needf(c, "w", w, SZ(R, C));
    GPU_CALL(c, ft_cuda_dora_norm(g, inv, mag, w, R, C));
    ft_cpu_dora_norm(F(g), F(inv), F(mag), F(w), R, C);
}

void ft_col_scale(ft_tensor y, ft_tensor x, ft_tensor g, float alpha, float beta, int N, int C,
                  int accumulate)
{
    opcheck c = begin("col_scale", y);
    needf(c, "y", y, SZ(N, C));
    needf(c, "x", x, SZ(N, C));
    need(c, "g", g, (size_t)C, FT_F32);
    GPU_CALL(c, ft_cuda_col_scale(y, x, g, alpha, beta, N, C, accumulate));
    ft_cpu_col_scale(F(y), F(x), F(g), alpha, beta, N, C, accumulate);
}

void ft_col_dot(ft_tensor d, ft_tensor a, ft_tensor b, ft_tensor s, int N, int C)
{
    opcheck c = begin("col_dot", d);
    need(c, "d", d, (size_t)C, FT_F32);
    needf(c, "a", a, SZ(N, C));
    needf(c, "b", b, SZ(N, C));
    need(c, "s", s, (size_t)C, FT_F32);
    GPU_CALL(c, ft_cuda_col_dot(d, a, b, s, N, C));
    ft_cpu_col_dot(F(d), F(a), F(b), F(s), N, C);
}

void ft_dropout_forward(ft_tensor out, ft_tensor x, size_t n, float p, uint64_t seed,
                        uint64_t offset)
{
    opcheck c = begin("dropout_forward", out);
    needf(c, "out", out, n);
    needf(c, "x", x, n);
    GPU_CALL(c, ft_cuda_dropout_forward(out, x, n, p, seed, offset));
    ft_cpu_dropout_forward(F(out), F(x), n, p, seed, offset);
}

void ft_dropout_backward(ft_tensor dx, ft_tensor dout, size_t n, float p, uint64_t seed,
                         uint64_t offset)
{
    opcheck c = begin("dropout_backward", dx);
    needf(c, "dx", dx, n);
    needf(c, "dout", dout, n);
    GPU_CALL(c, ft_cuda_dropout_backward(dx, dout, n, p, seed, offset));
    ft_cpu_dropout_backward(F(dx), F(dout), n, p, seed, offset);
}

void ft_adamw_step(ft_tensor param, ft_tensor grad, ft_tensor m, ft_tensor v, size_t n,
                   ft_adamw_hparams hp, int step, float grad_scale)
{
    opcheck c = begin("adamw_step", param);
    need(c, "param", param, n, FT_F32);
    need(c, "grad", grad, n, FT_F32);
    need(c, "m", m, n, FT_F32);
    need(c, "v", v, n, FT_F32);
    GPU_CALL(c, ft_cuda_adamw_step(param, grad, m, v, n, hp, step, grad_scale));
    ft_cpu_adamw_step(F(param), F(grad), F(m), F(v), n, hp, step, grad_scale);
}

static void check_blocksize(opcheck c, int blocksize)
{
    if (blocksize < 1) {
        fprintf(stderr, "%s: blocksize %d\n", c.op, blocksize);
        abort();
    }
}

void ft_dequant_4bit(ft_tensor out, ft_tensor packed, ft_tensor absmax, ft_tensor code,
                     size_t n, int blocksize)
{
    opcheck c = begin("dequant_4bit", out);
    check_blocksize(c, blocksize);
    needf(c, "out", out, n);
    need(c, "packed", packed, (n + 1) / 2, FT_U8);
    need(c, "absmax", absmax, (n + (size_t)blocksize - 1) / (size_t)blocksize, FT_F32);
    need(c, "code", code, 16, FT_F32);
    GPU_CALL(c, ft_cuda_dequant_4bit(out, packed, absmax, code, n, blocksize));
    ft_cpu_dequant_4bit(F(out), packed.data, F(absmax), F(code), n, (size_t)blocksize);
}

void ft_dequant_8bit_blockwise(ft_tensor out, ft_tensor q, ft_tensor absmax, ft_tensor map,
                               size_t n, int blocksize, float offset)
{
    opcheck c = begin("dequant_8bit_blockwise", out);
    check_blocksize(c, blocksize);
    needf(c, "out", out, n);
    need(c, "q", q, n, FT_U8);
    need(c, "absmax", absmax, (n + (size_t)blocksize - 1) / (size_t)blocksize, FT_F32);
    need(c, "map", map, 256, FT_F32);
    GPU_CALL(c, ft_cuda_dequant_8bit_blockwise(out, q, absmax, map, n, blocksize, offset));
    ft_cpu_dequant_8bit_blockwise(F(out), q.data, F(absmax), F(map), n, (size_t)blocksize,
                                  offset);
}

void ft_dequant_int8_rows(ft_tensor out, ft_tensor q, ft_tensor scb, int rows, int cols)
{
    opcheck c = begin("dequant_int8_rows", out);
    needf(c, "out", out, SZ(rows, cols));
    need(c, "q", q, SZ(rows, cols), FT_I8);
    need(c, "scb", scb, (size_t)rows, FT_F32);
    GPU_CALL(c, ft_cuda_dequant_int8_rows(out, q, scb, rows, cols));
    ft_cpu_dequant_int8_rows(F(out), q.data, F(scb), rows, cols);
}
