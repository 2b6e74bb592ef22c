/* The ops interface: every numeric operation the model needs, forward and backward,
 * declared once. The device of the tensors picks the implementation: kernels/cpu/ is
 * the fp32 reference (OpenMP, BLAS), kernels/cuda/ the GPU twin. Model code never loops
 * over tensor data itself.
 *
 * An ft_tensor is a typed view of a contiguous buffer; the shape of each operand is
 * given by the op's integer arguments, and the dispatcher checks that every view holds
 * exactly the elements the op will touch. Row-major throughout. N is the number of
 * token rows (batch x sequence).
 *
 * Gradient convention (as in llm.c): backward ops ACCUMULATE into their gradient
 * outputs (dx += ..., dw += ...). Callers zero gradient buffers when a new
 * accumulation starts. A gradient output that is not wanted may be passed as
 * ft_none(). */
#ifndef FT_OPS_H
#define FT_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef enum ft_device { FT_DEV_CPU = 0, FT_DEV_CUDA = 1 } ft_device;

typedef enum ft_dtype { FT_F32 = 0, FT_BF16, FT_F16, FT_I32, FT_U8, FT_I8 } ft_dtype;

typedef struct ft_tensor {
    void *data;
    size_t numel;
    ft_dtype dtype;
    ft_device device;
} ft_tensor;

/* View constructors: ft_view for any dtype and device, the others for CPU views. */
static inline ft_tensor ft_view(void *p, size_t numel, ft_dtype dtype, ft_device device)
{
    ft_tensor t = {p, numel, dtype, device};
    return t;
}
static inline ft_tensor ft_f32(float *p, size_t numel)
{
    ft_tensor t = {p, numel, FT_F32, FT_DEV_CPU};
    return t;
}
static inline ft_tensor ft_i32(int32_t *p, size_t numel)
{
    ft_tensor t = {p, numel, FT_I32, FT_DEV_CPU};
    return t;
}
static inline ft_tensor ft_u8(uint8_t *p, size_t numel)
{
    ft_tensor t = {p, numel, FT_U8, FT_DEV_CPU};
    return t;
}
static inline ft_tensor ft_i8(int8_t *p, size_t numel)
{
    ft_tensor t = {p, numel, FT_I8, FT_DEV_CPU};
    return t;
}
static inline ft_tensor ft_none(void)
{
    ft_tensor t = {NULL, 0, FT_F32, FT_DEV_CPU};
    return t;
}
/* A view of elements [offset, offset + numel) of t. */
ft_tensor ft_slice(ft_tensor t, size_t offset, size_t numel);

/* ---- linear: y[N,out] = alpha * x[N,in] @ w[out,in]^T + b[out] ---------------------
 * accumulate = 0 overwrites y, 1 adds to it (LoRA adds its low-rank path onto the base
 * output). b may be ft_none(); it is added unscaled.
 * backward: dx[N,in] += alpha * dy @ w; dw[out,in] += alpha * dy^T @ x;
 *           db[out] += sum_n dy. Any of dx, dw, db may be ft_none(). */
void ft_linear_forward(ft_tensor y, ft_tensor x, ft_tensor w, ft_tensor b, int N, int in,
                       int out, float alpha, int accumulate);
void ft_linear_backward(ft_tensor dx, ft_tensor dw, ft_tensor db, ft_tensor dy,
                        ft_tensor x, ft_tensor w, int N, int in, int out, float alpha);

/* ---- a linear layer with its LoRA pair: the frozen base plus s * (xd A^T) B^T ------
 * forward:  y[N,out] = x[N,in] w[out,in]^T + b + s h B^T with h[N,r] = xd A^T (xd: x or
 *           its dropout, [N,in]; A [r,in], B [out,r]), h written; compute_h = 0 takes h
 *           as it is (a fused module's later row blocks share the first block's h).
 *           b may be ft_none().
 * backward: dx[N,in] += dy w; dB += s dy^T h; dh[N,r] = s dy B (written); dA += dh^T
 *           xd; dx_lora += dh A. dx, dA, dB and dx_lora may be ft_none(); dx_lora is dx
 *           itself, or a buffer the caller takes through dropout's backward (never xd).
 *           The base's own weight and bias gradients are ft_linear_backward's.
 * The same GEMMs as ft_linear_forward / backward's, one after another; the CPU runs a
 * pass's GEMMs in one parallel region (kernels/cpu/lora_linear.c). */
void ft_lora_linear_forward(ft_tensor y, ft_tensor h, ft_tensor x, ft_tensor xd, ft_tensor w,
                            ft_tensor b, ft_tensor a, ft_tensor bl, int N, int in, int out,
                            int r, float s, int compute_h);
void ft_lora_linear_backward(ft_tensor dx, ft_tensor dx_lora, ft_tensor da, ft_tensor dbl,
                             ft_tensor dh, ft_tensor dy, ft_tensor xd, ft_tensor h,
                             ft_tensor w, ft_tensor a, ft_tensor bl, int N, int in, int out,
                             int r, float s);

/* ---- embedding: out[n,:] = table[ids[n],:], table [V,C] -----------------------------
 * ids must be in [0, V) (validated by the data layer). backward: dtable[ids[n]] += dout[n]
 * for every n with ids[n] != pad: the padding row gets no gradient, as torch's
 * nn.Embedding(padding_idx=pad) gives none (pad < 0: no padding row). */
void ft_embedding_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N, int V,
                          int C);
void ft_embedding_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids, int N, int V,
                           int C, int pad);
/* The same on a transposed table [C, V] (LoRA's lora_embedding_A): out[n,c] =
 * table[c, ids[n]]; backward dtable[c, ids[n]] += dout[n,c], for every n in order but
 * those with ids[n] == pad (PEFT's F.embedding(x, A^T, padding_idx=...)). */
void ft_embedding_t_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N, int V, int C);
void ft_embedding_t_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids, int N, int V,
                             int C, int pad);

/* ---- RMSNorm: rstd[n] = 1/sqrt(mean(x[n]^2) + eps); out = x * rstd[n] * (w_offset + w) --
 * w_offset is 0 (Llama: the weight itself) or 1 (Gemma: weights stored as offsets from 1,
 * applied as 1 + w in fp32). rstd [N] is saved for backward. backward: dx += ...,
 * dw += sum_n dout * x * rstd (the offset does not change dw). */
void ft_rmsnorm_forward(ft_tensor out, ft_tensor rstd, ft_tensor x, ft_tensor w, int N,
                        int C, float eps, float w_offset);
void ft_rmsnorm_backward(ft_tensor dx, ft_tensor dw, ft_tensor dout, ft_tensor x,
                         ft_tensor w, ft_tensor rstd, int N, int C, float w_offset);
/* The residual add fused before the norm: sum = x + res (stored; sum may be x), then
 * ft_rmsnorm_forward(out, rstd, sum, w): one pass over the rows instead of ft_add's and
 * the norm's. The norm reads sum as stored (rounded to its dtype), so the result equals
 * the two ops in turn. Backward is ft_rmsnorm_backward on sum (the add passes its
 * gradient through). */
void ft_add_rmsnorm_forward(ft_tensor sum, ft_tensor out, ft_tensor rstd, ft_tensor x,
                            ft_tensor res, ft_tensor w, int N, int C, float eps,
                            float w_offset);

/* ---- RoPE, HF rotate-half convention, in place -------------------------------------
 * x [N, heads, D]; pos [N] (int32 positions); inv_freq [rd/2]. Only the first rd dims
 * of each head rotate (rd even, 2 <= rd <= D: partial rotary; rd = D the usual case);
 * dims rd..D-1 pass through. With h = rd/2, angle = pos[n] * inv_freq[i] (fp32 product,
 * as HF); c = fl(cos * scale), s = fl(sin * scale) (scale: longrope's attention factor,
 * else 1), i < h:
 *   y[i] = x[i] c - x[i+h] s;   y[i+h] = x[i+h] c + x[i] s.
 * backward (in place on the gradient): the transpose, dx[i] = dy[i] c + dy[i+h] s,
 * dx[i+h] = dy[i+h] c - dy[i] s; the pass-through dims keep their gradient. */
void ft_rope_forward(ft_tensor x, ft_tensor pos, ft_tensor inv_freq, int N, int heads,
                     int D, int rd, float scale);
void ft_rope_backward(ft_tensor dx, ft_tensor pos, ft_tensor inv_freq, int N, int heads,
                      int D, int rd, float scale);

/* ---- causal grouped-query attention -----------------------------------------------
 * q [B,T,Hq,D], k and v [B,T,Hkv,D] (Hq % Hkv == 0; query head h reads kv head
 * h / (Hq/Hkv)), out [B,T,Hq,D], lse [B,Hq,T] (log-sum-exp of each softmax row, saved
 * for backward, which recomputes the probabilities).
 * Token i of a row attends to token j when j <= i, seg[b,j] == seg[b,i] (packed
 * sequences stay apart; seg may be ft_none() for one sequence a row) and, when
 * window > 0, i - j < window (sliding-window attention). scale is usually 1/sqrt(D).
 * softcap > 0 caps the scores (Gemma 2's attn_logit_softcapping): S = softcap *
 * tanh(scale q.k / softcap) before the mask and the softmax; 0: S = scale q.k.
 * backward: dq, dk, dv += ... (dk, dv summed over the query heads sharing a kv head). */
void ft_attention_forward(ft_tensor out, ft_tensor lse, ft_tensor q, ft_tensor k,
                          ft_tensor v, ft_tensor seg, int B, int T, int Hq, int Hkv, int D,
                          float scale, int window, float softcap);
void ft_attention_backward(ft_tensor dq, ft_tensor dk, ft_tensor dv, ft_tensor dout,
                           ft_tensor q, ft_tensor k, ft_tensor v, ft_tensor out,
                           ft_tensor lse, ft_tensor seg, int B, int T, int Hq, int Hkv,
                           int D, float scale, int window, float softcap);

/* ---- SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); all [n] -------------
 * backward (overwriting dgate and dup; either may be ft_none()):
 *   dgate = dout * up * silu'(gate); dup = dout * silu(gate). */
void ft_swiglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n);
void ft_swiglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate,
                        ft_tensor up, size_t n);

/* ---- GeGLU (Gemma's MLP): out = gelu_tanh(gate) * up; all [n] ------------------------
 * gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (torch's
 * gelu(approximate="tanh"), transformers' gelu_pytorch_tanh).
 * backward (overwriting, as SwiGLU's): dgate = dout * up * gelu_tanh'(gate);
 *   dup = dout * gelu_tanh(gate). */
void ft_geglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n);
void ft_geglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate,
                       ft_tensor up, size_t n);

/* ---- mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE): routing and grouping -------
 * N token rows, E experts, each row sent to its top k (1 <= k <= min(E, FT_MOE_MAX_K)).
 * router: probs [N,E] = softmax(logits [N,E]) (fp32; kept for backward and the aux
 *   loss); idx [N,k] (i32) the k largest probs of each row in descending order (ties: the
 *   lower expert first); w [N,k] (fp32) their probs, divided by their sum when renorm
 *   (Mixtral always; Qwen's norm_topk_prob).
 *   backward: dlogits [N,E] += the gradient through softmax, top-k values and the renorm,
 *   the selection held constant (as autograd: gradient reaches the selected probs), from
 *   dw [N,k] (may be ft_none()) plus aux_dp [E] (may be ft_none()), a gradient added to
 *   every row's probs (the load-balancing loss's: see ft_moe_aux_stats).
 * plan (host arrays; a GPU model copies idx back for it): the N k (row, expert) pairs
 *   grouped expert by expert, rows ascending within one: expert e's pairs are grouped
 *   positions offsets[e] .. offsets[e+1]-1 (offsets [E+1]), rows [N k] gives the row of
 *   each position, slot [N k] the position of pair (n, j). Host code then runs one GEMM
 *   per expert on its contiguous block of gathered rows.
 * gather: xe [M,C] row m = x [.,C] row rows[m] (M = N k).
 *   backward: dx [N,C] row n += the k rows dxe[slot[n, j]] (no atomics: one writer a row).
 * combine: out [N,C] (=, or += when accumulate) sum over j of w[n,j] * ye[slot[n,j]], the
 *   terms added in ascending expert order.
 *   backward: dye[slot[n,j]] += w[n,j] dout[n]; dw[n,j] += dout[n] . ye[slot[n,j]]
 *   (either may be ft_none()).
 * aux_stats: counts [E] += how many of the N k pairs chose e; psum [E] += sum_n probs[n,e].
 *   Over all layers, transformers' load_balancing_loss_func (no attention mask) is
 *   E sum_e (counts_e / R)(psum_e / R), R = N x layers; its gradient with respect to
 *   every layer's probs[n, e] is E counts_e / R^2 (the counts are constants): aux_dp. */
/* LoRA on experts stored as PEFT's ParamWrapper holds a 3-D parameter's pair: B [out,
 * r E] with expert e's B_e[o, j] = B[o, j E + e] (columns interleaved by expert; A's rows
 * are expert-major, contiguous). lora_b_split: dst [E, out, r] (expert-major, each B_e
 * contiguous for a GEMM) from src [out, r E]. lora_b_merge_add: the adjoint, dst [out,
 * r E] += src [E, out, r] (a gradient back into PEFT's layout; dst fp32). Exact copies. */
void ft_moe_lora_b_split(ft_tensor dst, ft_tensor src, int out, int r, int E);
void ft_moe_lora_b_merge_add(ft_tensor dst, ft_tensor src, int out, int r, int E);
#define FT_MOE_MAX_K 64
void ft_moe_router_forward(ft_tensor probs, ft_tensor idx, ft_tensor w, ft_tensor logits,
                           int N, int E, int k, int renorm);
void ft_moe_router_backward(ft_tensor dlogits, ft_tensor dw, ft_tensor aux_dp,
                            ft_tensor probs, ft_tensor idx, ft_tensor w, int N, int E, int k,
                            int renorm);
void ft_moe_plan(int32_t *offsets, int32_t *rows, int32_t *slot, const int32_t *idx, int N,
                 int E, int k);
void ft_moe_gather_forward(ft_tensor xe, ft_tensor x, ft_tensor rows, int N, int k, int C);
void ft_moe_gather_backward(ft_tensor dx, ft_tensor dxe, ft_tensor slot, int N, int k, int C);
void ft_moe_combine_forward(ft_tensor out, ft_tensor ye, ft_tensor w, ft_tensor slot, int N,
                            int k, int C, int accumulate);
void ft_moe_combine_backward(ft_tensor dye, ft_tensor dw, ft_tensor dout, ft_tensor ye,
                             ft_tensor w, ft_tensor slot, int N, int k, int C);
/* The logistic sigmoid of a gate (qwen2_moe's shared_expert_gate): s [n] fp32 =
 * 1 / (1 + exp(-z)), z [n] in the compute dtype; backward dz [n] += ds s (1 - s) (ds
 * fp32). The gated sum out += s[n] * y[n] is ft_moe_combine with k = 1 and slot[n] = n. */
void ft_sigmoid_forward(ft_tensor s, ft_tensor z, size_t n);
void ft_sigmoid_backward(ft_tensor dz, ft_tensor ds, ft_tensor s, size_t n);
void ft_moe_aux_stats(ft_tensor counts, ft_tensor psum, ft_tensor probs, ft_tensor idx,
                      int N, int E, int k);

/* ---- cross-entropy over logits [N,V] with targets [N] (-100 = not counted) ----------
 * Returns sum over counted rows of -log softmax(logits[n])[targets[n]] (a double, so
 * the caller can average over any number of rows: HF divides by the count of counted
 * tokens). When dlogits is not ft_none(), also writes (overwrites)
 *   dlogits[n] = grad_scale * (softmax(logits[n]) - onehot(targets[n]))
 * for counted rows and 0 for the others; grad_scale is d(loss)/d(sum), e.g. 1/count.
 * dlogits may alias logits (computed in place). Targets must be -100 or in [0, V).
 * softcap > 0: the logits are soft-capped, z = softcap tanh(x / softcap) (ft_softcap,
 * Gemma 2's final_logit_softcapping), and dlogits is the gradient w.r.t. the uncapped x:
 * the above times 1 - (z / softcap)^2 (tanh' from tanh's value, as torch's autograd
 * takes it). 0: no cap. */
double ft_cross_entropy(ft_tensor dlogits, ft_tensor logits, ft_tensor targets, int N,
                        int V, float grad_scale, float softcap);

/* ---- elementwise ------------------------------------------------------------------ */
/* y += x */
void ft_add(ft_tensor y, ft_tensor x, size_t n);
/* y = x */
void ft_copy(ft_tensor y, ft_tensor x, size_t n);
/* y = 0 */
void ft_zero(ft_tensor y, size_t n);
/* sum of x^2 in double: for global gradient norms. */
double ft_sumsq(ft_tensor x, size_t n);
/* x *= s */
void ft_scale(ft_tensor x, float s, size_t n);
/* x = cap * tanh(x / cap), cap > 0 (soft-capping; its gradient: ft_cross_entropy's
 * softcap). */
void ft_softcap(ft_tensor x, float cap, size_t n);

/* ---- DoRA (PEFT's weight-decomposed LoRA: y = (m / ||W + s B A||_row) (x W^T + s x A^T B^T))
 * dora_norm: for each row r of w [R, C]: n = sqrt(sum_c w[r,c]^2) (accumulated in double
 *            on the CPU, fp32 on the GPU); g[r] = mag[r] / n and inv[r] = 1 / n (g, inv
 *            fp32 [R]; mag [R] and w of the compute dtype).
 * col_scale: y[n,c] = (alpha g[c] + beta) x[n,c] over [N, C] (accumulate: +=); g fp32.
 * col_dot:   d[c] += s[c] * sum_n a[n,c] b[n,c] over [N, C]; d, s fp32 [C]. */
void ft_dora_norm(ft_tensor g, ft_tensor inv, ft_tensor mag, ft_tensor w, int R, int C);
void ft_col_scale(ft_tensor y, ft_tensor x, ft_tensor g, float alpha, float beta, int N, int C,
                  int accumulate);
void ft_col_dot(ft_tensor d, ft_tensor a, ft_tensor b, ft_tensor s, int N, int C);

/* ---- dropout: out = x * keep / (1 - p), keep decided by a counter-based RNG ----------
 * keep(i) is a pure function of (seed, offset + i), so backward and a gradient-
 * checkpoint recompute regenerate the same mask without storing it.
 * backward: dx += dout * keep / (1 - p). p == 0 copies (forward) / adds (backward). */
void ft_dropout_forward(ft_tensor out, ft_tensor x, size_t n, float p, uint64_t seed,
                        uint64_t offset);
void ft_dropout_backward(ft_tensor dx, ft_tensor dout, size_t n, float p, uint64_t seed,
                         uint64_t offset);

/* ---- AdamW (torch.optim.AdamW semantics), over one flat range ------------------------
 * g = grad * grad_scale (gradient clipping folds into grad_scale);
 * param *= 1 - lr * weight_decay; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * param -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).
 * step counts from 1. */
typedef struct ft_adamw_hparams {
    float lr, beta1, beta2, eps, weight_decay;
} ft_adamw_hparams;
void ft_adamw_step(ft_tensor param, ft_tensor grad, ft_tensor m, ft_tensor v, size_t n,
                   ft_adamw_hparams hp, int step, float grad_scale);

/* ---- dequantization of bitsandbytes weights (QLoRA's frozen base; lib/quant/quant.h) -------
 * 4-bit: out[i] = code[q(i)] * absmax[i / blocksize], i < n; q(i) the i-th nibble of
 *   packed [ceil(n/2)] u8, the high nibble first; code [16] (NF4 or FP4 values).
 * 8-bit blockwise (the double-quantized absmax): out[i] = map[q[i]] * absmax[i / blocksize]
 *   + offset, i < n; q [n] u8, map [256].
 * int8 rows (LLM.int8 weights): out[r, c] = (q[r, c] * scb[r]) * (1/127 in fp32); q i8.
 * All products in fp32, as bitsandbytes computes them. */
void ft_dequant_4bit(ft_tensor out, ft_tensor packed, ft_tensor absmax, ft_tensor code,
                     size_t n, int blocksize);
void ft_dequant_8bit_blockwise(ft_tensor out, ft_tensor q, ft_tensor absmax, ft_tensor map,
                               size_t n, int blocksize, float offset);
void ft_dequant_int8_rows(ft_tensor out, ft_tensor q, ft_tensor scb, int rows, int cols);

#endif
