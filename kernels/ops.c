/* Dispatch of the ops interface: checks that every operand is a view large enough for
 * the op's shape arguments and on one device, then calls that device's implementation.
 * Only the CPU backend exists so far; the CUDA twins land in kernels/cuda/. */
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>

#include "cpu/cpu_ops.h"

ft_tensor ft_slice(ft_tensor t, size_t offset, size_t numel)
{
    if (offset + numel > t.numel) {
        fprintf(stderr, "ft_slice: [%zu, %zu) out of a view of %zu elements\n", offset,
                offset + numel, t.numel);
        abort();
    }
    size_t esize = t.dtype == FT_F32 || t.dtype == FT_I32 ? 4
                   : t.dtype == FT_U8 || t.dtype == FT_I8 ? 1
                                                          : 2;
    t.data = (char *)t.data + offset * esize;
    t.numel = numel;
    return t;
}

/* An operand the op reads or writes: present, big enough, of the expected dtype. */
static void need(const char *op, const char *name, ft_tensor t, size_t numel,
                 ft_dtype dtype)
{
    if (!t.data || t.numel < numel || t.dtype != dtype || t.device != FT_DEV_CPU) {
        fprintf(stderr,
                "%s: operand %s: need %zu elements of dtype %d on the CPU, got %zu of dtype "
                "%d on device %d%s\n",
                op, name, numel, (int)dtype, t.numel, (int)t.dtype, (int)t.device,
                t.data ? "" : " (null)");
        abort();
    }
}

/* An operand that may be ft_none(). */
static void maybe(const char *op, const char *name, ft_tensor t, size_t numel,
                  ft_dtype dtype)
{
    if (t.data)
        need(op, name, t, numel, dtype);
}

#define F(t) ((float *)(t).data)
#define I(t) ((int32_t *)(t).data)
#define SZ(a, b) ((size_t)(a) * (size_t)(b))

void ft_linear_forward(ft_tensor y, ft_tensor x, ft_tensor w, ft_tensor b, int N, int in,
                       int out, float alpha, int accumulate)
{
    const char *op = "linear_forward";
    need(op, "y", y, SZ(N, out), FT_F32);
    need(op, "x", x, SZ(N, in), FT_F32);
    need(op, "w", w, SZ(out, in), FT_F32);
    maybe(op, "b", b, out, FT_F32);
    ft_cpu_linear_forward(F(y), F(x), F(w), F(b), N, in, out, alpha, accumulate);
}

void ft_linear_backward(ft_tensor dx, ft_tensor dw, ft_tensor db, ft_tensor dy,
                        ft_tensor x, ft_tensor w, int N, int in, int out, float alpha)
{
    const char *op = "linear_backward";
    maybe(op, "dx", dx, SZ(N, in), FT_F32);
    maybe(op, "dw", dw, SZ(out, in), FT_F32);
    maybe(op, "db", db, out, FT_F32);
    need(op, "dy", dy, SZ(N, out), FT_F32);
    if (dw.data)
        need(op, "x", x, SZ(N, in), FT_F32);
    if (dx.data)
        need(op, "w", w, SZ(out, in), FT_F32);
    ft_cpu_linear_backward(F(dx), F(dw), F(db), F(dy), F(x), F(w), N, in, out, alpha);
}

void ft_embedding_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N, int V,
                          int C)
{
    const char *op = "embedding_forward";
    need(op, "out", out, SZ(N, C), FT_F32);
    need(op, "ids", ids, N, FT_I32);
    need(op, "table", table, SZ(V, C), FT_F32);
    ft_cpu_embedding_forward(F(out), I(ids), F(table), N, V, C);
}

void ft_embedding_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids, int N, int V,
                           int C)
{
    const char *op = "embedding_backward";
    need(op, "dtable", dtable, SZ(V, C), FT_F32);
    need(op, "dout", dout, SZ(N, C), FT_F32);
    need(op, "ids", ids, N, FT_I32);
    ft_cpu_embedding_backward(F(dtable), F(dout), I(ids), N, V, C);
}

void ft_rmsnorm_forward(ft_tensor out, ft_tensor rstd, ft_tensor x, ft_tensor w, int N,
                        int C, float eps)
{
    const char *op = "rmsnorm_forward";
    need(op, "out", out, SZ(N, C), FT_F32);
    need(op, "rstd", rstd, N, FT_F32);
    need(op, "x", x, SZ(N, C), FT_F32);
    need(op, "w", w, C, FT_F32);
    ft_cpu_rmsnorm_forward(F(out), F(rstd), F(x), F(w), N, C, eps);
}

void ft_rmsnorm_backward(ft_tensor dx, ft_tensor dw, ft_tensor dout, ft_tensor x,
                         ft_tensor w, ft_tensor rstd, int N, int C)
{
    const char *op = "rmsnorm_backward";
    maybe(op, "dx", dx, SZ(N, C), FT_F32);
    maybe(op, "dw", dw, C, FT_F32);
    need(op, "dout", dout, SZ(N, C), FT_F32);
    need(op, "x", x, SZ(N, C), FT_F32);
    need(op, "w", w, C, FT_F32);
    need(op, "rstd", rstd, N, FT_F32);
    ft_cpu_rmsnorm_backward(F(dx), F(dw), F(dout), F(x), F(w), F(rstd), N, C);
}

void ft_rope_forward(ft_tensor x, ft_tensor pos, ft_tensor inv_freq, int N, int heads,
                     int D)
{
    const char *op = "rope_forward";
    need(op, "x", x, SZ(N, heads) * (size_t)D, FT_F32);
    need(op, "pos", pos, N, FT_I32);
    need(op, "inv_freq", inv_freq, (size_t)D / 2, FT_F32);
    ft_cpu_rope_forward(F(x), I(pos), F(inv_freq), N, heads, D);
}

void ft_rope_backward(ft_tensor dx, ft_tensor pos, ft_tensor inv_freq, int N, int heads,
                      int D)
{
    const char *op = "rope_backward";
    need(op, "dx", dx, SZ(N, heads) * (size_t)D, FT_F32);
    need(op, "pos", pos, N, FT_I32);
    need(op, "inv_freq", inv_freq, (size_t)D / 2, FT_F32);
    ft_cpu_rope_backward(F(dx), I(pos), F(inv_freq), N, heads, D);
}

void ft_attention_forward(ft_tensor out, ft_tensor lse, ft_tensor q, ft_tensor k,
                          ft_tensor v, ft_tensor seg, int B, int T, int Hq, int Hkv, int D,
                          float scale, int window)
{
    const char *op = "attention_forward";
    size_t nq = SZ(B, T) * SZ(Hq, D), nkv = SZ(B, T) * SZ(Hkv, D);
    if (Hkv <= 0 || Hq % Hkv != 0) {
        fprintf(stderr, "%s: %d query heads are not a multiple of %d kv heads\n", op, Hq,
                Hkv);
        abort();
    }
    need(op, "out", out, nq, FT_F32);
    need(op, "lse", lse, SZ(B, Hq) * (size_t)T, FT_F32);
    need(op, "q", q, nq, FT_F32);
    need(op, "k", k, nkv, FT_F32);
    need(op, "v", v, nkv, FT_F32);
    maybe(op, "seg", seg, SZ(B, T), FT_I32);
    ft_cpu_attention_forward(F(out), F(lse), F(q), F(k), F(v), I(seg), B, T, Hq, Hkv, D,
                             scale, window);
}

void ft_attention_backward(ft_tensor dq, ft_tensor dk, ft_tensor dv, ft_tensor dout,
                           ft_tensor q, ft_tensor k, ft_tensor v, ft_tensor out,
                           ft_tensor lse, ft_tensor seg, int B, int T, int Hq, int Hkv,
                           int D, float scale, int window)
{
    const char *op = "attention_backward";
    size_t nq = SZ(B, T) * SZ(Hq, D), nkv = SZ(B, T) * SZ(Hkv, D);
    need(op, "dq", dq, nq, FT_F32);
    need(op, "dk", dk, nkv, FT_F32);
    need(op, "dv", dv, nkv, FT_F32);
    need(op, "dout", dout, nq, FT_F32);
    need(op, "q", q, nq, FT_F32);
    need(op, "k", k, nkv, FT_F32);
    need(op, "v", v, nkv, FT_F32);
    need(op, "out", out, nq, FT_F32);
    need(op, "lse", lse, SZ(B, Hq) * (size_t)T, FT_F32);
    maybe(op, "seg", seg, SZ(B, T), FT_I32);
    ft_cpu_attention_backward(F(dq), F(dk), F(dv), F(dout), F(q), F(k), F(v), F(out),
                              F(lse), I(seg), B, T, Hq, Hkv, D, scale, window);
}

void ft_swiglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n)
{
    const char *op = "swiglu_forward";
    need(op, "out", out, n, FT_F32);
    need(op, "gate", gate, n, FT_F32);
    need(op, "up", up, n, FT_F32);
    ft_cpu_swiglu_forward(F(out), F(gate), F(up), n);
}

void ft_swiglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate,
                        ft_tensor up, size_t n)
{
    const char *op = "swiglu_backward";
    need(op, "dgate", dgate, n, FT_F32);
    need(op, "dup", dup, n, FT_F32);
    need(op, "dout", dout, n, FT_F32);
    need(op, "gate", gate, n, FT_F32);
    need(op, "up", up, n, FT_F32);
    ft_cpu_swiglu_backward(F(dgate), F(dup), F(dout), F(gate), F(up), n);
}

double ft_cross_entropy(ft_tensor dlogits, ft_tensor logits, ft_tensor targets, int N,
                        int V, float grad_scale)
{
    const char *op = "cross_entropy";
    maybe(op, "dlogits", dlogits, SZ(N, V), FT_F32);
    need(op, "logits", logits, SZ(N, V), FT_F32);
    need(op, "targets", targets, N, FT_I32);
    return ft_cpu_cross_entropy(F(dlogits), F(logits), I(targets), N, V, grad_scale);
}

void ft_add(ft_tensor y, ft_tensor x, size_t n)
{
    need("add", "y", y, n, FT_F32);
    need("add", "x", x, n, FT_F32);
    ft_cpu_add(F(y), F(x), n);
}

void ft_copy(ft_tensor y, ft_tensor x, size_t n)
{
    need("copy", "y", y, n, FT_F32);
    need("copy", "x", x, n, FT_F32);
    ft_cpu_copy(F(y), F(x), n);
}

void ft_zero(ft_tensor y, size_t n)
{
    need("zero", "y", y, n, FT_F32);
    ft_cpu_zero(F(y), n);
}

double ft_sumsq(ft_tensor x, size_t n)
{
    need("sumsq", "x", x, n, FT_F32);
    return ft_cpu_sumsq(F(x), n);
}

void ft_scale(ft_tensor x, float s, size_t n)
{
    need("scale", "x", x, n, FT_F32);
    ft_cpu_scale(F(x), s, n);
}

void ft_dropout_forward(ft_tensor out, ft_tensor x, size_t n, float p, uint64_t seed,
                        uint64_t offset)
{
    need("dropout_forward", "out", out, n, FT_F32);
    need("dropout_forward", "x", x, n, FT_F32);
    ft_cpu_dropout_forward(F(out), F(x), n, p, seed, offset);
}

void ft_dropout_backward(ft_tensor dx, ft_tensor dout, size_t n, float p, uint64_t seed,
                         uint64_t offset)
{
    need("dropout_backward", "dx", dx, n, FT_F32);
    need("dropout_backward", "dout", dout, n, FT_F32);
    ft_cpu_dropout_backward(F(dx), F(dout), n, p, seed, offset);
}

void ft_adamw_step(ft_tensor param, ft_tensor grad, ft_tensor m, ft_tensor v, size_t n,
                   ft_adamw_hparams hp, int step, float grad_scale)
{
    const char *op = "adamw_step";
    need(op, "param", param, n, FT_F32);
    need(op, "grad", grad, n, FT_F32);
    need(op, "m", m, n, FT_F32);
    need(op, "v", v, n, FT_F32);
    ft_cpu_adamw_step(F(param), F(grad), F(m), F(v), n, hp, step, grad_scale);
}

void ft_dequant_4bit(ft_tensor out, ft_tensor packed, ft_tensor absmax, ft_tensor code,
                     size_t n, int blocksize)
{
    const char *op = "dequant_4bit";
    if (blocksize < 1) {
        fprintf(stderr, "%s: blocksize %d\n", op, blocksize);
        abort();
    }
    need(op, "out", out, n, FT_F32);
    need(op, "packed", packed, (n + 1) / 2, FT_U8);
    need(op, "absmax", absmax, (n + (size_t)blocksize - 1) / (size_t)blocksize, FT_F32);
    need(op, "code", code, 16, FT_F32);
    ft_cpu_dequant_4bit(F(out), packed.data, F(absmax), F(code), n, (size_t)blocksize);
}

void ft_dequant_8bit_blockwise(ft_tensor out, ft_tensor q, ft_tensor absmax, ft_tensor map,
                               size_t n, int blocksize, float offset)
{
    const char *op = "dequant_8bit_blockwise";
    if (blocksize < 1) {
        fprintf(stderr, "%s: blocksize %d\n", op, blocksize);
        abort();
    }
    need(op, "out", out, n, FT_F32);
    need(op, "q", q, n, FT_U8);
    need(op, "absmax", absmax, (n + (size_t)blocksize - 1) / (size_t)blocksize, FT_F32);
    need(op, "map", map, 256, FT_F32);
    ft_cpu_dequant_8bit_blockwise(F(out), q.data, F(absmax), F(map), n, (size_t)blocksize,
                                  offset);
}

void ft_dequant_int8_rows(ft_tensor out, ft_tensor q, ft_tensor scb, int rows, int cols)
{
    const char *op = "dequant_int8_rows";
    need(op, "out", out, SZ(rows, cols), FT_F32);
    need(op, "q", q, SZ(rows, cols), FT_I8);
    need(op, "scb", scb, (size_t)rows, FT_F32);
    ft_cpu_dequant_int8_rows(F(out), q.data, F(scb), rows, cols);
}
