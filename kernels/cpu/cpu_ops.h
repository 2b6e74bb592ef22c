/* The CPU reference implementations of kernels/ops.h, on raw fp32 buffers.
 * Same math, same argument order and the same accumulate-into-gradients convention
 * as the dispatching ops; see ops.h for the definitions. fp32 storage; sums that
 * decide accuracy (norms, softmax denominators) are done in higher precision where
 * noted in each file. */
#ifndef FT_CPU_OPS_H
#define FT_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "../ops.h"

void ft_cpu_linear_forward(float *y, const float *x, const float *w, const float *b, int N,
                           int in, int out, float alpha, int accumulate);
void ft_cpu_linear_backward(float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, int N, int in, int out,
                            float alpha);
/* y[n, :] = b (accumulate 0) or y[n, :] += b (1), for n < N */
void ft_cpu_linear_bias(float *y, const float *b, int N, int out, int accumulate);
void ft_cpu_lora_linear_forward(float *y, float *h, const float *x, const float *xd,
                                const float *w, const float *b, const float *a,
                                const float *bl, int N, int in, int out, int r, float s,
                                int compute_h);
void ft_cpu_lora_linear_backward(float *dx, float *dx_lora, float *ga, float *gb, float *dh,
                                 const float *dy, const float *xd, const float *h,
                                 const float *w, const float *a, const float *bl, int N,
                                 int in, int out, int r, float s);

void ft_cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int N,
                              int V, int C);
void ft_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N,
                               int V, int C, int pad);
/* on a transposed table [C, V] */
void ft_cpu_embedding_t_forward(float *out, const int32_t *ids, const float *table, int N,
                                int V, int C);
void ft_cpu_embedding_t_backward(float *dtable, const float *dout, const int32_t *ids, int N,
                                 int V, int C, int pad);

void ft_cpu_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int N,
                            int C, float eps, float w_offset);
/* sum = x + res (sum may be x), then the norm of sum */
void ft_cpu_add_rmsnorm_forward(float *sum, float *out, float *rstd, const float *x,
                                const float *res, const float *w, int N, int C, float eps,
                                float w_offset);
void ft_cpu_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x,
                             const float *w, const float *rstd, int N, int C, float w_offset);

void ft_cpu_rope_forward(float *x, const int32_t *pos, const float *inv_freq, int N,
                         int heads, int D, int rd, float scale);
void ft_cpu_rope_backward(float *dx, const int32_t *pos, const float *inv_freq, int N,
                          int heads, int D, int rd, float scale);

void ft_cpu_attention_forward(float *out, float *lse, const float *q, const float *k,
                              const float *v, const int32_t *seg, int B, int T, int Hq,
                              int Hkv, int D, float scale, int window, float softcap);
void ft_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout,
                               const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const int32_t *seg,
                               int B, int T, int Hq, int Hkv, int D, float scale,
                               int window, float softcap);

void ft_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void ft_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                            const float *up, size_t n);

/* geglu.c */
void ft_cpu_geglu_forward(float *out, const float *gate, const float *up, size_t n);
void ft_cpu_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                           const float *up, size_t n);

double ft_cpu_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                            int N, int V, float grad_scale, float softcap);

void ft_cpu_add(float *y, const float *x, size_t n);
void ft_cpu_copy(float *y, const float *x, size_t n);
void ft_cpu_zero(float *y, size_t n);
double ft_cpu_sumsq(const float *x, size_t n);
void ft_cpu_scale(float *x, float s, size_t n);
void ft_cpu_softcap(float *x, float cap, size_t n);

void ft_cpu_dropout_forward(float *out, const float *x, size_t n, float p, uint64_t seed,
                            uint64_t offset);
void ft_cpu_dropout_backward(float *dx, const float *dout, size_t n, float p,
                             uint64_t seed, uint64_t offset);

void ft_cpu_adamw_step(float *param, const float *grad, float *m, float *v, size_t n,
                       ft_adamw_hparams hp, int step, float grad_scale);

/* dequant.c */
void ft_cpu_dequant_4bit(float *out, const uint8_t *packed, const float *absmax,
                         const float *code, size_t n, size_t blocksize);
void ft_cpu_dequant_8bit_blockwise(float *out, const uint8_t *q, const float *absmax,
                                   const float *map, size_t n, size_t blocksize, float offset);
void ft_cpu_dequant_int8_rows(float *out, const int8_t *q, const float *scb, int rows,
                              int cols);

/* dora.c */
void ft_cpu_dora_norm(float *g, float *inv, const float *mag, const float *w, int R, int C);
void ft_cpu_col_scale(float *y, const float *x, const float *g, float alpha, float beta, int N,
                      int C, int accumulate);
void ft_cpu_col_dot(float *d, const float *a, const float *b, const float *s, int N, int C);

void ft_cpu_moe_router_forward(float *probs, int32_t *idx, float *w, const float *logits,
                               int N, int E, int k, int renorm);
void ft_cpu_moe_router_backward(float *dlogits, const float *dw, const float *aux_dp,
                                const float *probs, const int32_t *idx, const float *w,
                                int N, int E, int k, int renorm);
void ft_cpu_moe_plan(int32_t *offsets, int32_t *rows, int32_t *slot, const int32_t *idx,
                     int N, int E, int k);
void ft_cpu_moe_gather_forward(float *xe, const float *x, const int32_t *rows, int M, int C);
void ft_cpu_moe_gather_backward(float *dx, const float *dxe, const int32_t *slot, int N,
                                int k, int C);
void ft_cpu_moe_combine_forward(float *out, const float *ye, const float *w,
                                const int32_t *slot, int N, int k, int C, int accumulate);
void ft_cpu_moe_combine_backward(float *dye, float *dw, const float *dout, const float *ye,
                                 const float *w, const int32_t *slot, int N, int k, int C);
void ft_cpu_moe_lora_b_split(float *dst, const float *src, int out, int r, int E);
void ft_cpu_moe_lora_b_merge_add(float *dst, const float *src, int out, int r, int E);
void ft_cpu_moe_aux_stats(float *counts, float *psum, const float *probs,
                          const int32_t *idx, int N, int E, int k);

/* sigmoid.c (ops.h's ft_sigmoid_forward) */
void ft_cpu_sigmoid_forward(float *s, const float *z, size_t n);
void ft_cpu_sigmoid_backward(float *dz, const float *ds, const float *s, size_t n);

#endif
