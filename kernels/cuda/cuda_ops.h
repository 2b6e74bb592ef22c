/* The CUDA twins of kernels/ops.h, called by the dispatcher (kernels/ops.c) once it has
 * checked that every operand lives on the GPU and is large enough. Same math, argument
 * order and accumulate-into-gradients convention as ops.h; see there for definitions.
 *
 * Storage: a floating-point operand is FT_F32 or FT_BF16, each independently unless an
 * op says otherwise (the dispatcher checks). Arithmetic is fp32 throughout: bf16 values
 * are widened on load and rounded to nearest-even on store. Reductions (norms, softmax
 * sums, losses, bias and weight-norm gradients) run in a fixed order, with no atomics,
 * so a run on one GPU repeats bit for bit.
 *
 * Every op is enqueued on the backend's stream (cuda_context.cu) and returns without
 * waiting, except the two that return a value to the host (ft_cuda_cross_entropy,
 * ft_cuda_sumsq): those wait for their result, the only host round-trips of a step.
 *
 * Exists only in CUDA builds (FT_HAVE_CUDA). */
#ifndef FT_CUDA_OPS_H
#define FT_CUDA_OPS_H

#include <stdio.h>

#include "../ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* linear.cu: cuBLAS GEMMs (bf16 or fp32 in, fp32 accumulate). x, w and dy share one
 * dtype (the GEMM's input type); y, dx, dw are fp32, or bf16 when the inputs are. */
void ft_cuda_linear_forward(ft_tensor y, ft_tensor x, ft_tensor w, ft_tensor b, int N,
                            int in, int out, float alpha, int accumulate);
void ft_cuda_linear_backward(ft_tensor dx, ft_tensor dw, ft_tensor db, ft_tensor dy,
                             ft_tensor x, ft_tensor w, int N, int in, int out, float alpha);

/* embedding.cu */
void ft_cuda_embedding_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N, int V,
                               int C);
void ft_cuda_embedding_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids, int N,
                                int V, int C, int pad);

/* rmsnorm.cu (rstd is fp32) */
void ft_cuda_rmsnorm_forward(ft_tensor out, ft_tensor rstd, ft_tensor x, ft_tensor w, int N,
                             int C, float eps, float w_offset);
void ft_cuda_add_rmsnorm_forward(ft_tensor sum, ft_tensor out, ft_tensor rstd, ft_tensor x,
                                 ft_tensor res, ft_tensor w, int N, int C, float eps,
                                 float w_offset);
void ft_cuda_rmsnorm_backward(ft_tensor dx, ft_tensor dw, ft_tensor dout, ft_tensor x,
                              ft_tensor w, ft_tensor rstd, int N, int C, float w_offset);

/* rope.cu */
void ft_cuda_rope_forward(ft_tensor x, ft_tensor pos, ft_tensor inv_freq, int N, int heads,
                          int D, int rd, float scale);
void ft_cuda_rope_backward(ft_tensor dx, ft_tensor pos, ft_tensor inv_freq, int N,
                           int heads, int D, int rd, float scale);

/* attention.cu (lse is fp32; D <= FT_CUDA_ATT_MAX_D). Two kernels: the tensor-core
 * kernels of flash_attention.cu for bf16 operands and D a multiple of 16 up to 128, and
 * the reference (one warp a row, fp32 arithmetic, any dtype and D) for the rest, or for
 * everything with FT_CUDA_ATTENTION=reference in the environment. */
#define FT_CUDA_ATT_MAX_D 256
/* "flash" or "reference": the kernel a call with bf16 or fp32 operands and head dim D
 * would run now. */
const char *ft_cuda_attention_kernel(ft_dtype dtype, int D);
/* The most dynamic shared memory (bytes) a block of the flash kernels of head dim D takes
 * (forward, dq or dk/dv); 0 for a D they do not take. Where it is over the device's
 * opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin: 99 KiB on sm_86 and sm_89, for
 * D = 128) the reference kernels run instead, with a note on stderr once. */
size_t ft_cuda_flash_attention_smem(int D);
void ft_cuda_attention_forward(ft_tensor out, ft_tensor lse, ft_tensor q, ft_tensor k,
                               ft_tensor v, ft_tensor seg, int B, int T, int Hq, int Hkv,
                               int D, float scale, int window, float softcap);
void ft_cuda_attention_backward(ft_tensor dq, ft_tensor dk, ft_tensor dv, ft_tensor dout,
                                ft_tensor q, ft_tensor k, ft_tensor v, ft_tensor out,
                                ft_tensor lse, ft_tensor seg, int B, int T, int Hq, int Hkv,
                                int D, float scale, int window, float softcap);

/* swiglu.cu */
void ft_cuda_swiglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n);
void ft_cuda_swiglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate,
                             ft_tensor up, size_t n);

/* geglu.cu */
void ft_cuda_geglu_forward(ft_tensor out, ft_tensor gate, ft_tensor up, size_t n);
void ft_cuda_geglu_backward(ft_tensor dgate, ft_tensor dup, ft_tensor dout, ft_tensor gate,
                            ft_tensor up, size_t n);

/* cross_entropy.cu: the loss is summed in double and read back (waits). */
double ft_cuda_cross_entropy(ft_tensor dlogits, ft_tensor logits, ft_tensor targets, int N,
                             int V, float grad_scale, float softcap);

/* elementwise.cu: copy converts between fp32 and bf16; sumsq waits for its result. */
void ft_cuda_add(ft_tensor y, ft_tensor x, size_t n);
void ft_cuda_copy(ft_tensor y, ft_tensor x, size_t n);
void ft_cuda_zero(ft_tensor y, size_t n);
double ft_cuda_sumsq(ft_tensor x, size_t n);
void ft_cuda_scale(ft_tensor x, float s, size_t n);
void ft_cuda_softcap(ft_tensor x, float cap, size_t n);

/* dropout.cu: the same counter-based mask as kernels/cpu/dropout.c, bit for bit. */
void ft_cuda_dropout_forward(ft_tensor out, ft_tensor x, size_t n, float p, uint64_t seed,
                             uint64_t offset);
void ft_cuda_dropout_backward(ft_tensor dx, ft_tensor dout, size_t n, float p,
                              uint64_t seed, uint64_t offset);

/* adamw.cu: param, grad, m, v fp32 (the master copy and its state). */
void ft_cuda_adamw_step(ft_tensor param, ft_tensor grad, ft_tensor m, ft_tensor v, size_t n,
                        ft_adamw_hparams hp, int step, float grad_scale);

/* dequant.cu: out fp32 or bf16; the quantization arrays as in ops.h. */
void ft_cuda_dequant_4bit(ft_tensor out, ft_tensor packed, ft_tensor absmax, ft_tensor code,
                          size_t n, int blocksize);
void ft_cuda_dequant_8bit_blockwise(ft_tensor out, ft_tensor q, ft_tensor absmax,
                                    ft_tensor map, size_t n, int blocksize, float offset);
void ft_cuda_dequant_int8_rows(ft_tensor out, ft_tensor q, ft_tensor scb, int rows,
                               int cols);

/* embedding.cu: on a transposed table [C, V] */
void ft_cuda_embedding_t_forward(ft_tensor out, ft_tensor ids, ft_tensor table, int N, int V,
                                 int C);
void ft_cuda_embedding_t_backward(ft_tensor dtable, ft_tensor dout, ft_tensor ids, int N, int V,
                                  int C, int pad);

/* dora.cu */
void ft_cuda_dora_norm(ft_tensor g, ft_tensor inv, ft_tensor mag, ft_tensor w, int R, int C);
void ft_cuda_col_scale(ft_tensor y, ft_tensor x, ft_tensor g, float alpha, float beta, int N,
                       int C, int accumulate);
void ft_cuda_col_dot(ft_tensor d, ft_tensor a, ft_tensor b, ft_tensor s, int N, int C);

/* cuda_context.cu: waits until every op enqueued so far has finished; aborts with the
 * CUDA error if one failed (a kernel fault is a bug, not an input error). */
void ft_cuda_synchronize(void);

/* op_profile.cu: with FT_CUDA_PROFILE=1 in the environment kernels/ops.c brackets each op
 * it runs here with ft_cuda_profile_begin (1 when profiling, 0 otherwise) and, where that
 * returned 1, ft_cuda_profile_end; the GPU time per key is printed at exit. */
int ft_cuda_profile_enabled(void);
int ft_cuda_profile_begin(const char *key);
void ft_cuda_profile_end(void);
/* The table so far into f (what the process prints to stderr at exit); nothing when no
 * op was timed. */
void ft_cuda_profile_write(FILE *f);

/* moe.cu: routing and token grouping (ops.h's mixture-of-experts section). */
void ft_cuda_moe_router_forward(ft_tensor probs, ft_tensor idx, ft_tensor w,
                                ft_tensor logits, int N, int E, int k, int renorm);
void ft_cuda_moe_router_backward(ft_tensor dlogits, ft_tensor dw, ft_tensor aux_dp,
                                 ft_tensor probs, ft_tensor idx, ft_tensor w, int N, int E,
                                 int k, int renorm);
void ft_cuda_moe_gather_forward(ft_tensor xe, ft_tensor x, ft_tensor rows, int N, int k,
                                int C);
void ft_cuda_moe_gather_backward(ft_tensor dx, ft_tensor dxe, ft_tensor slot, int N, int k,
                                 int C);
void ft_cuda_moe_combine_forward(ft_tensor out, ft_tensor ye, ft_tensor w, ft_tensor slot,
                                 int N, int k, int C, int accumulate);
void ft_cuda_moe_combine_backward(ft_tensor dye, ft_tensor dw, ft_tensor dout, ft_tensor ye,
                                  ft_tensor w, ft_tensor slot, int N, int k, int C);
void ft_cuda_moe_lora_b_split(ft_tensor dst, ft_tensor src, int out, int r, int E);
void ft_cuda_moe_lora_b_merge_add(ft_tensor dst, ft_tensor src, int out, int r, int E);
void ft_cuda_moe_aux_stats(ft_tensor counts, ft_tensor psum, ft_tensor probs, ft_tensor idx,
                           int N, int E, int k);

/* sigmoid.cu (ops.h's ft_sigmoid_forward) */
void ft_cuda_sigmoid_forward(ft_tensor s, ft_tensor z, size_t n);
void ft_cuda_sigmoid_backward(ft_tensor dz, ft_tensor ds, ft_tensor s, size_t n);

#ifdef __cplusplus
}
#endif

#endif
