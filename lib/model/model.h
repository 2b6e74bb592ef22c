/* model/: the model.
 *
 * Owns: parameters in flat per-unit buffers, forward and backward (model.h,
 * model_pass.c) on the host or the GPU (model_device.c), LoRA adapters (adapter.c,
 * lora_init.h), the quantized base, merging (merge.h), quantizing a checkpoint on disk
 * (quantize_model.h) and generation (generate.h).
 * May call: core, device, formats, kernels, quant, tokenizer.
 * (This is the folder's main header.) */

/* A decoder-only causal LM (llama, mistral, qwen2, qwen3, granite, gemma, gemma2,
 * gemma3_text, olmo2, phi3, smollm3; the text model of a multimodal gemma3; the
 * mixture-of-experts mixtral, qwen3_moe and qwen2_moe) with explicit forward and backward. A family
 * is data (ft_model_config's block description): one forward and backward read it.
 *
 * This is the library API the tools build on:
 *
 *     ft_model_load(&m, dir, &opt, &err);          config.json + safetensors -> fp32 model
 *     ft_model_load_adapter(m, adapter_dir, &err); optional: PEFT LoRA weights
 *     ft_model_zero_grad(m);
 *     for each micro-batch:
 *         ft_model_forward(m, &batch, &loss_sum, &n_tokens, &err);
 *         ft_model_backward(m, 1.0f / tokens_in_whole_batch, &err);
 *     then an optimizer step over ft_model_trainable(m) (see optim.h / train_step.h).
 *
 * Block (HF LlamaDecoderLayer):  h += r * o(attn(rope(q,k), v)(rmsnorm1(h)));
 *                                h += r * down(act(gate(x)) * up(x)), x = rmsnorm2(h),
 * with h0 = embed(ids) * e and logits = lm_head(rmsnorm_f(h)) / z. act is silu, or
 * gelu-tanh for gemma(2); rmsnorm multiplies by w (by 1 + w for gemma(2)); the attention
 * scale is 1/sqrt(head_dim), granite's attention_multiplier or gemma2's
 * query_pre_attn_scalar^-0.5; r, e, z are 1 except for granite (residual_multiplier,
 * embedding_multiplier, logits_scaling), and e = sqrt(hidden) for gemma(2) (see
 * ft_model_config). In general each branch has an optional norm before it and one after
 * it: h += r * post(branch(pre(h))) (olmo2: post-norms only, named
 * post_attention_layernorm and post_feedforward_layernorm; gemma2: both on each branch),
 * and q and k may be RMSNorm'd before RoPE, per head (qwen3, weight [head_dim]) or over
 * the whole projection (olmo2): ft_model_config.norm_name and qk_norm. gemma2 also caps
 * the attention scores, S = c tanh(S / c) before the mask, and the logits likewise
 * (attn_softcap, final_softcap), and attends within a window on every other layer
 * (ft_layer_window). gemma3 has gemma2's four norms without the attention cap, per-head
 * q/k norms (applied as 1 + w), and two RoPEs: its sliding layers rotate with the local
 * base (ft_layer_rope_local), the others with rope_theta and its scaling.
 * rope rotates the first rotary_dim dims of each head (all but phi3's
 * partial rotary), with cos and sin times longrope's attention factor (phi3), and is
 * skipped in smollm3's NoPE layers. phi3's checkpoint fuses q, k, v into one qkv_proj
 * weight and gate, up into gate_up_proj: the ops read their row blocks, and a LoRA pair
 * sits on the fused module (one A; B's row blocks).
 * A MoE family (mixtral, qwen3_moe, qwen2_moe) replaces the MLP of its sparse layers
 * (ft_layer_sparse) by a router and experts (moe.c: each token's top-k experts' MLPs,
 * weighted by the router softmax, renormalised over the top k when cfg.norm_topk_prob);
 * qwen2_moe adds a shared expert, a plain MLP (the layer's gate, up, down projections)
 * whose output is weighted by sigmoid(x G^T) (G: the FT_PROJ_SHGATE projection [1, C]),
 * and the qwen models' dense layers keep a plain MLP of their own width
 * (ft_layer_mlp_width). LoRA may sit on the router and on the experts as PEFT's
 * ParamWrapper puts it (lora.h's target_params; moe_lora.c; mixtral, qwen3_moe), on
 * qwen2_moe's plain MLPs and shared expert gate as on any linear layer, and QLoRA
 * quantizes the experts too.
 * A linear layer is y = x W^T + b, plus with LoRA: y += scaling * (dropout(x) A^T) B^T; with
 * DoRA (lora.dora) y = b + m / ||W + s B A||_row (x W^T + s dropout(x) A^T B^T) (dora.c
 * for dropout). LoRA may also sit on lm_head (a linear layer, before the logit scaling and
 * soft-cap) and on the embedding (h0 += s A^T[ids] B^T before the embedding scale), and
 * lora.modules_to_save trains the embedding and/or lm_head in full.
 *
 * Parameters live in two flat buffers (fp32; on a bf16 GPU model the frozen one is bf16
 * and the trainable one has a bf16 twin for the ops), trainable and frozen, laid out unit by unit
 * (unit 0: embeddings; units 1..L: the layers; unit L+1: final norm and lm_head), so a
 * DDP bucket, a ZeRO shard or an FSDP unit is a contiguous range of the trainable
 * buffer, and the optimizer runs over one range. Gradients mirror the trainable buffer.
 *
 * Activations: forward keeps what backward needs for every layer; with gradient
 * checkpointing it keeps only each layer's input and recomputes the layer in backward
 * (same ops, same dropout masks: gradients are bitwise identical). */
#ifndef FT_MODEL_H
#define FT_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device/alloc.h"
#include "core/ft_error.h"
#include "ops.h"
#include "formats/hf_config.h"
#include "formats/lora.h"
#include "quant/quant.h"
#include "formats/safetensors.h"

typedef enum ft_train_mode {
    FT_TRAIN_NONE = 0, /* inference / evaluation: nothing trainable, no activations kept */
    FT_TRAIN_LORA,     /* base frozen, LoRA A and B trainable, and the embedding and/or
                        * lm_head in full when lora.modules_to_save names them */
    FT_TRAIN_FULL      /* every weight trainable */
} ft_train_mode;

typedef struct ft_model_options {
    ft_train_mode mode;
    ft_lora_config lora; /* used when mode == FT_TRAIN_LORA */
    bool grad_ckpt;
    uint64_t seed; /* LoRA init and dropout masks */
    /* Layout only: no flat parameter buffers are allocated and no weight is read. A
     * distributed strategy (lib/dist/) binds each unit's storage with
     * ft_model_bind_unit and fills it with ft_model_init_unit (ZeRO-3 / FSDP shards,
     * pipeline stages). */
    bool unbound;
    /* QLoRA: quantize the layers' linear weights on load (type FT_QUANT_NONE: keep them
     * dense). A checkpoint that is already quantized (config.json quantization_config,
     * as ft-quantize or transformers + bitsandbytes write it) is read as it is,
     * whatever this says. Not with FT_TRAIN_FULL. */
    ft_quant_options quant;
    const char *quant_skip; /* module-name substrings left dense (NULL: none) */
    /* Where the model computes and in what dtype. FT_DEV_CPU (the default) is the fp32
     * reference. FT_DEV_CUDA keeps parameters, gradients and activations on the GPU
     * (weights read and written through the host): with dtype FT_F32 everything is fp32;
     * with FT_BF16 the frozen weights and the activations are bf16 and the trainable
     * parameters keep an fp32 master copy (what ft_param.data and ft_model_trainable
     * point at) beside the bf16 copy the ops read, refreshed by ft_model_sync_compute;
     * gradients are fp32 (an unbound model's strategy keeps that copy: ft_unit_bufs).
     * A quantized base (QLoRA) is read or quantized on the host, then kept on the GPU in
     * its quantized form only, and dequantized there one layer at a time into a window
     * of the compute dtype (ft_model_materialize). */
    ft_device device;
    ft_dtype dtype;
    /* 0, or the most bytes the model's allocator (and a strategy's buffers beside it) may
     * hold at once: an allocation beyond it fails as out-of-memory (ft_mem.limit). */
    size_t mem_limit;
    /* Rows (tokens) whose logits the head computes at once: 0 all of the micro-batch;
     * -1 auto (at most FT_LOSS_CHUNK_AUTO_ELEMS logits, a multiple of 64 rows:
     * ft_loss_chunk_rows); else that many. Chunked, the [N, V]
     * logits are never held: the forward keeps only the loss (and the last chunk's
     * logits), the backward recomputes each chunk's logits, turns them into dlogits in
     * place and accumulates dx and dW (the fused lm_head + cross-entropy of Liger and
     * Apple's Cut Cross-Entropy). Costs one more lm_head GEMM per step; saves N x V. */
    int loss_chunk_rows;
    /* 0, or the vocabulary tokens added to the tokenizer grow the model to (above
     * config.json's vocab_size; ft_added_tokens_vocab): the checkpoint fills the first
     * rows of the embedding and the head, the rest are the mean of those. An adapter
     * read for it (LoRA settings or init_adapter) must be for the same vocabulary. */
    int64_t grow_vocab;
} ft_model_options;

/* auto: at most 64M logits a chunk (256 MiB fp32, 128 MiB bf16) */
#define FT_LOSS_CHUNK_AUTO_ELEMS ((size_t)64 << 20)

/* The rows of one head chunk for a micro-batch of N rows, vocabulary V and
 * ft_model_options.loss_chunk_rows opt: between 1 and N. opt > 0: opt rows; 0: N; auto
 * (< 0): FT_LOSS_CHUNK_AUTO_ELEMS / V rows rounded down to a multiple of 64 (of 8 when
 * fewer than 64; 512 rows of a 128256 vocabulary), so that every chunk but the last, and
 * the last too when N is a multiple of 64, gives the head's GEMMs an aligned dimension.
 * The model and the memory plan both size the logits buffer with it. */
size_t ft_loss_chunk_rows(int opt, size_t V, size_t N);

/* One named parameter: a view into the flat buffers (on the model's device: read and
 * write the values of a GPU model through ft_model_param_get / _set). */
typedef struct ft_param {
    char name[160];   /* HF state-dict name, or the PEFT adapter key for LoRA weights */
    int ndim;
    int64_t shape[2];
    size_t numel;
    float *data;      /* fp32; on a bf16 GPU model a frozen weight's data is bf16 */
    float *grad;      /* NULL when frozen (or, with a strategy, while unbound) */
    bool trainable;
    bool quantized;   /* a frozen linear weight held in 4 or 8 bits (QLoRA): data points
                       * into the dequantization window while its layer is in use */
    size_t offset;    /* in the flat trainable or frozen buffer (quantized: the window) */
    int unit;         /* 0 embeddings, 1..L layers, L+1 final norm / lm_head */
    bool is_lora;
} ft_param;

/* A micro-batch of B rows of T tokens. labels NULL means labels = input_ids; -100 is not
 * counted. position_ids NULL means 0..T-1 in every row; otherwise a position 0 after the
 * start of a row begins a new packed sequence (attention does not cross it). The loss
 * follows transformers' causal LM: logits at t predict labels at t+1.
 * attention_mask NULL means every token is real; otherwise [B, T] of 1 (a real token) and
 * 0 (padding), right padding only (no 1 after a 0 in a row; anything else is refused):
 * attention is causal, so real tokens never see the padding after them and the mask
 * changes no logit of theirs. It leaves the padding out of a MoE router's load-balancing
 * statistics, as transformers' load_balancing_loss_func given the attention_mask. */
typedef struct ft_batch {
    int B, T;
    const int32_t *input_ids;
    const int32_t *labels;
    const int32_t *position_ids;
    const int32_t *attention_mask;
} ft_batch;

typedef struct ft_model ft_model;

/* Tokens of the batch whose (shifted) label counts: the loss denominator. */
long ft_batch_counted_tokens(const ft_batch *b);

/* Whether a checkpoint tensor lies outside the text model: a multimodal gemma3
 * checkpoint's vision tower and projector (every name outside cfg->ckpt_prefix), which
 * the model does not read and ft-merge copies unchanged into its output. */
bool ft_model_carried_tensor(const ft_model_config *cfg, const char *name);

/* The embedding's (bit FT_LORA_EMBED) and the head's (FT_LORA_HEAD) names in the model's
 * layout (lib/model/outer_names.c): PEFT's adapter key base_model.model.<module path>
 * <suffix> (<module_prefix>embed_tokens, lm_head), and the checkpoint's weight
 * (<ckpt_prefix>model.embed_tokens.weight, <ckpt_prefix>lm_head.weight). */
void ft_model_outer_key(const ft_model_config *c, unsigned bit, const char *suffix, char *out,
                        size_t n);
void ft_model_outer_weight(const ft_model_config *c, unsigned bit, char *out, size_t n);
/* The checkpoint's weight of the module at path[0, len) of the transformers model (a
 * decoder module <module_prefix>X: <ckpt_prefix>model.X.weight; lm_head); -1: neither. */
int ft_model_module_weight(const ft_model_config *c, const char *path, size_t len, char *out,
                           size_t n);

/* Loads config.json and the weights (model.safetensors or a sharded index; F32, F16 or
 * BF16, converted to fp32) from dir. In LoRA mode, creates A with PEFT's default init
 * (kaiming-uniform, bound 1/sqrt(in), seeded) and B = 0. With opt->lora.vocab_size above
 * config.json's (LoRA settings read from an adapter for a grown vocabulary) the model has
 * that vocabulary (ft_model_cfg's vocab_size): the checkpoint fills the embedding's and
 * the head's first rows, and ft_model_load_adapter must then fill every row. With
 * opt->grow_vocab above it (tokens added by a run) likewise, the rows past the
 * checkpoint's set to their mean (added_vocab.c). Errors name the file, key or tensor. */
int ft_model_load(ft_model **out, const char *dir, const ft_model_options *opt, ft_err *err);
void ft_model_free(ft_model *m);

/* Tokens added to the tokenizer by a run (model.add_special_tokens; added_vocab.c).
 * ft_added_tokens_vocab: the vocabulary they grow the model to, as
 * resize_token_embeddings(len(tokenizer)) (never below model_vocab, config.json's), from
 * the tokenizer at tokenizer_path with tokens_json added (ft_tokenizer_load_adding);
 * *n_tokenizer (may be NULL) is the tokenizer's own size. ft_model_options.grow_vocab
 * takes it: the new rows of the embedding and of an untied head are then the mean of the
 * old rows (transformers' mean_resizing; see added_vocab.c for its noise, which we leave
 * out). ft_added_tokens_saved_modules: the modules_to_save a LoRA run trains the new rows
 * in: the user's when given, else each of embed_tokens and an untied lm_head that is not
 * a LoRA target (as PEFT's save_embedding_layers saves them for a resized vocabulary). */
int ft_added_tokens_vocab(const char *tokenizer_path, const char *tokens_json,
                          int64_t model_vocab, int64_t *vocab, int *n_tokenizer, ft_err *err);
unsigned ft_added_tokens_saved_modules(const ft_lora_config *lc, bool tied);
/* The vocabulary of a run's model (ft-train and its memory plan): model_vocab
 * (config.json's) grown by tokens_json added to the tokenizer at tokenizer_path
 * (ft_added_tokens_vocab; NULL or "[]": none added), rounded up to a multiple of
 * multiple (> 1) when it grows (resize_token_embeddings' pad_to_multiple_of), else by an
 * init adapter for a grown vocabulary (adapter_dir, NULL or "": none) when that
 * tokenizer has the adapter's vocabulary (the adapter's own tokenizer files, say). */
int ft_run_model_vocab(const char *tokenizer_path, const char *tokens_json, int64_t multiple,
                       const char *adapter_dir, int64_t model_vocab, int64_t *vocab,
                       ft_err *err);

/* Replaces the LoRA weights (and the modules_to_save weights) with those of a PEFT
 * adapter dir (adapter_model.safetensors). The adapter's config must match the model's
 * LoRA options (r, targets, modules_to_save); every expected key must be present with the
 * right shape. A grown vocabulary's embedding / head (lib/model/adapter.c) must all be in
 * it. */
int ft_model_load_adapter(ft_model *m, const char *adapter_dir, ft_err *err);

const ft_model_config *ft_model_cfg(const ft_model *m);
ft_mem *ft_model_mem(ft_model *m);

size_t ft_model_param_count(const ft_model *m);
ft_param *ft_model_param(ft_model *m, size_t i);
/* NULL if absent. */
ft_param *ft_model_find_param(ft_model *m, const char *name);

/* The flat trainable buffer, its gradient, and its length (0 in FT_TRAIN_NONE). */
float *ft_model_trainable(ft_model *m, size_t *n);
float *ft_model_grads(ft_model *m, size_t *n);
/* [begin, end) of a unit in the trainable buffer; units 0..L+1. */
void ft_model_unit_range(const ft_model *m, int unit, size_t *begin, size_t *end);
int ft_model_n_units(const ft_model *m);

void ft_model_zero_grad(ft_model *m);

/* Runs the forward pass; *loss_sum gets the summed token losses and *n_tokens the
 * number of counted tokens (either may be NULL). Logits stay available until the next
 * forward or backward. Validates token ids (error names the row and column). */
int ft_model_forward(ft_model *m, const ft_batch *batch, double *loss_sum, long *n_tokens,
                     ft_err *err);

/* The router's load-balancing term of the last forward (a MoE model with
 * output_router_logits: router_aux_loss_coef times transformers' load_balancing_loss_func
 * with the batch's attention_mask: padding left out; 0 when no token is real; else 0). transformers' loss is loss_sum / n_tokens plus this; the backward adds its
 * gradient once per forward, whatever grad_scale says (as the Trainer adds each
 * micro-batch's aux_loss to that micro-batch's loss). */
double ft_model_aux_loss(const ft_model *m);
/* The same before router_aux_loss_coef: transformers' output aux_loss (the load-balancing
 * loss itself; 0 without it). */
double ft_model_aux_balance(const ft_model *m);

/* Logits [B, T, V] of the last forward, fp32 on the host (a GPU model copies them back
 * on the first call after a forward). NULL after a backward, and when the head was
 * chunked (ft_model_options.loss_chunk_rows) over more than one chunk. */
const float *ft_model_logits(ft_model *m);

/* The V logits of token row n (= b * T + t) of the last forward, fp32 on the host, or
 * NULL when they are not held: after a backward, or when the head was chunked and n is
 * not in the last chunk (the last row always is: greedy decoding reads that one). */
const float *ft_model_row_logits(ft_model *m, size_t n);

/* The model's device and compute dtype (ft_model_options.device / .dtype). */
ft_device ft_model_device(const ft_model *m);
ft_dtype ft_model_dtype(const ft_model *m);

/* A parameter's values as fp32 on the host, and back (set also refreshes the compute
 * copy of a trainable parameter). host holds p->numel floats. On the CPU these copy.
 * A quantized weight reads as dequantized (its layer is materialized first; on a bf16
 * model the bf16 values the ops use); setting one is an error. */
int ft_model_param_get(ft_model *m, const ft_param *p, float *host, ft_err *err);
int ft_model_param_set(ft_model *m, ft_param *p, const float *host, ft_err *err);
/* A trainable parameter's gradient as fp32 on the host. */
int ft_model_grad_get(ft_model *m, const ft_param *p, float *host, ft_err *err);

/* A parameter filled from a checkpoint tensor (shape already checked; a NaN or infinite
 * value is an error naming the file, the tensor and the element), or added to a writer
 * (its values as fp32, copied to the host first on the GPU). */
int ft_model_param_from_st(ft_model *m, ft_param *p, const ft_st_tensor *t, ft_err *err);
int ft_model_param_to_writer(ft_model *m, const ft_param *p, ft_st_writer *w, ft_err *err);

/* After the fp32 master weights changed (an optimizer step, a load): refreshes the bf16
 * copy of the trainable parameters the ops read. A no-op unless the model is bf16. */
void ft_model_sync_compute(ft_model *m);
/* The compute-dtype copy of the flat trainable buffer that sync_compute refreshes and the
 * ops read (the master itself in fp32; NULL when unbound or without trainables): zero1
 * gathers the other ranks' bf16 copies into it (lib/dist). */
float *ft_model_trainable_compute(ft_model *m);

/* Accumulates into the gradients d(grad_scale * loss_sum)/d(params) for the last
 * forward; grad_scale is usually 1 / (counted tokens of the whole accumulated batch).
 * Overwrites the logits. */
int ft_model_backward(ft_model *m, float grad_scale, ft_err *err);

/* Preference objectives (lib/train/pref.h) need each sequence's log-probability, not the
 * batch's summed loss: ft_model_forward_rows is ft_model_forward with row_nll[r] (r <
 * B) = the summed token losses of batch row r (its -log p of the counted labels; 0 on a
 * pipeline stage without the head); ft_model_backward_rows accumulates the gradient of
 * sum_r row_scale[r] * row_nll[r]. The rows must be one sequence each (no position_ids).
 * Same ops as the plain forward and backward, called on each row's part of a head chunk. */
int ft_model_forward_rows(ft_model *m, const ft_batch *b, double *row_nll, ft_err *err);
int ft_model_backward_rows(ft_model *m, const float *row_scale, ft_err *err);
/* The same with each row r cut at target index split[r] (in [0, T]; target t predicts
 * the label at t + 1): nll_pre[r] gets the part before it, row_nll[r] the rest, and the
 * backward scales them by scale_pre[r] and row_scale[r] (ORPO: its NLL term covers the
 * prompt, its odds ratio only the completion). */
int ft_model_forward_split(ft_model *m, const ft_batch *b, const int32_t *split,
                           double *nll_pre, double *row_nll, ft_err *err);
int ft_model_backward_split(ft_model *m, const int32_t *split, const float *scale_pre,
                            const float *row_scale, ft_err *err);

/* LoRA adapter on (the default) or off: off, forwards compute the base model alone (the
 * DPO reference of a LoRA run, as PEFT's disable_adapter) and cannot be followed by a
 * backward. Switching off an adapter with modules_to_save fails (PEFT then uses the
 * original embedding / head, which the model does not keep). */
int ft_model_set_adapter(ft_model *m, bool enabled, ft_err *err);
/* The same without that check: the LoRA pairs (those on the embedding and the head
 * included) on or off, the modules trained in full computing with whatever values they
 * hold (DPO's reference of a fresh adapter puts their starting values, the original
 * modules, in place first: train/pref.h ref_lora_off). */
void ft_model_set_lora(ft_model *m, bool enabled);

/* Training mode (the default for a trainable model) applies LoRA dropout; evaluation
 * mode (false) does not, as torch's model.eval(). */
void ft_model_set_training(ft_model *m, bool training);

/* The position of the model's random stream (dropout masks): a counter of forward
 * passes. A checkpoint saves it so a resumed run draws the masks it would have drawn. */
uint64_t ft_model_rng_counter(const ft_model *m);
void ft_model_set_rng_counter(ft_model *m, uint64_t counter);

/* ---- Seams for distributed strategies (lib/dist/) ----
 *
 * Unit hooks: the model calls acquire before it reads a unit's parameters and release
 * after, in forward and in backward (where release with grads_final says the unit's
 * gradients of this micro-batch are complete: a DDP bucket can go, a ZeRO-2/3 shard can
 * be reduce-scattered). With tied embeddings the head also acquires unit 0 (its weight
 * is the embedding). Pipeline hooks: a model that computes only units [first, last]
 * (ft_model_set_stage) receives the residual stream entering unit first and sends the
 * one leaving unit last in forward, and the reverse for its gradient in backward. */
typedef enum ft_unit_phase { FT_UNIT_FORWARD = 0, FT_UNIT_BACKWARD } ft_unit_phase;

typedef struct ft_model_hooks {
    void *ctx;
    int (*acquire)(void *ctx, int unit, ft_unit_phase phase, ft_err *err);
    int (*release)(void *ctx, int unit, ft_unit_phase phase, bool grads_final, ft_err *err);
    /* pipeline: [n] floats (n = B x T x hidden) */
    int (*recv_hidden)(void *ctx, float *h, size_t n, ft_err *err);
    int (*send_hidden)(void *ctx, const float *h, size_t n, ft_err *err);
    int (*recv_grad)(void *ctx, float *dh, size_t n, ft_err *err);
    int (*send_grad)(void *ctx, const float *dh, size_t n, ft_err *err);
} ft_model_hooks;

/* NULL removes them. Any hook may be NULL. */
void ft_model_set_hooks(ft_model *m, const ft_model_hooks *h);

/* A MoE model's load-balancing loss over several ranks (ft_model_aux_loss): at the end of
 * each forward, reduce sums n doubles (the per-expert statistics and the rows they cover)
 * over every rank of the run, so that data-parallel ranks share the step's micro-batch
 * and pipeline stages the model's layers, as one process of the whole would count them.
 * Every rank must run its forwards in step. NULL (the default): this process only. */
typedef int (*ft_model_aux_reduce_fn)(void *ctx, double *v, size_t n, ft_err *err);
void ft_model_set_aux_reduce(ft_model *m, ft_model_aux_reduce_fn fn, void *ctx);

/* Pipeline stage: forward and backward compute units first..last only (default: all).
 * A stage without the last unit computes no loss (loss_sum 0, tokens still counted). */
void ft_model_set_stage(ft_model *m, int first_unit, int last_unit);

/* GPipe: k activation slots, each holding one forward's activations until its backward,
 * so a pipeline stage can run the forwards of k micro-batches before their backwards.
 * Forward and backward use the current slot (0 by default). */
int ft_model_set_activation_slots(ft_model *m, int k, ft_err *err);
void ft_model_use_activation_slot(ft_model *m, int slot);

/* [begin, end) of a unit in the frozen buffer, and the buffer's length. */
void ft_model_unit_frozen_range(const ft_model *m, int unit, size_t *begin, size_t *end);
size_t ft_model_frozen_count(const ft_model *m);
float *ft_model_frozen(ft_model *m, size_t *n);

/* Storage of parameters bound by a strategy (ft_model_bind_unit):
 *   master   the trainable parameters in fp32 (what ft_param.data points at);
 *   compute  the copy of the trainables the ops read, in the compute dtype; NULL: the
 *            master itself (an fp32 model, or a binding only read and written through
 *            ft_model_param_get/set, as a checkpoint save or load is);
 *   grad     their fp32 gradient (NULL when none is needed);
 *   frozen   the frozen parameters, in the compute dtype.
 * An unbound model never refreshes compute from master itself: the strategy that binds
 * it does, after it changes the masters. */
typedef struct ft_unit_bufs {
    float *master, *compute, *grad, *frozen;
} ft_unit_bufs;

/* Points unit's parameters into storage for exactly that unit (each pointer at the
 * unit's first element; NULL leaves that part unbound). Binding unit 0 also moves a
 * tied lm_head. Host pointers may be bound to a GPU model for ft_model_param_get/set
 * (values travel wherever the pointer is), not for forward or backward. */
void ft_model_bind_unit(ft_model *m, int unit, ft_unit_bufs b);
/* Binds every unit to whole-model buffers (n_train trainable and n_frozen frozen
 * elements), each pointer at element 0. */
void ft_model_bind_all(ft_model *m, ft_unit_bufs whole);
/* Fills the bound storage of unit: base weights from the model dir, LoRA A with its
 * seeded init (B = 0), and, when adapter_dir is not NULL, the adapter's LoRA weights. */
int ft_model_init_unit(ft_model *m, int unit, const char *adapter_dir, ft_err *err);

/* The quantization of the base in force (type FT_QUANT_NONE when the base is dense). */
ft_quant_options ft_model_quant(const ft_model *m);
/* LoRA on embed_tokens / lm_head of a tied model with PEFT's ensure_weight_tying
 * (lib/model/tied_lora.c): lm_head's pair is the embedding's transposed, two more
 * parameters on one storage that torch's AdamW steps in turn. The model keeps both pairs
 * holding the same values; an optimizer step over the whole trainable fp32 buffer params
 * is bracketed by before_step (after the gradients) and after_step (with the step's
 * learning rate and weight decay). sync: the embedding's pair from the head's (an
 * adapter's values, which PEFT's loading takes from the head's keys, read last; PEFT's
 * init, the head's); a model read unit by unit (ft_model_init_unit) leaves it to the
 * strategy, which steps it too (lib/dist/dist_tied.c). All no-ops on another model. */
bool ft_model_tied_lora(const ft_model *m);
int ft_model_tied_lora_sync(ft_model *m, ft_err *err);
void ft_model_tied_lora_before_step(ft_model *m, float *params);
void ft_model_tied_lora_after_step(ft_model *m, float *params, float lr, float weight_decay);
/* Where the tied pair lies in the flat trainable buffer, for a strategy that splits it
 * (lib/dist/dist_tied.c): pairs[0] the embedding's lora_embedding_B [rows, cols] and the
 * head's lora_A [cols, rows], pairs[1] lora_embedding_A and the head's lora_B; false on
 * another model. transpose_f32: dst [rows, cols] = src^T, fp32 on the model's device. */
typedef struct ft_tied_pair {
    size_t embed, head;  /* element offsets in the flat trainable buffer */
    int64_t rows, cols;  /* the embedding's shape */
} ft_tied_pair;
bool ft_model_tied_lora_layout(ft_model *m, ft_tied_pair pairs[2]);
void ft_model_transpose_f32(ft_model *m, float *dst, const float *src, int64_t rows,
                            int64_t cols);
/* Whether an adapter's modules_to_save without ensure_weight_tying untied the head of a
 * model config.json ties (PEFT's separate copies; ft_model_cfg then says untied). */
bool ft_model_head_untied(const ft_model *m);
/* The vocabulary of the checkpoint's config.json: below ft_model_cfg's vocab_size when the
 * model grew it (an adapter's resized vocabulary, tokens added by a run). */
int64_t ft_model_checkpoint_vocab(const ft_model *m);
/* The LoRA settings of a model loaded in LoRA mode as in force: a MoE's target names
 * resolved (ft_lora_resolve_moe, its patterns added), the decoder's module_prefix set. */
const ft_lora_config *ft_model_lora_config(const ft_model *m);
/* Dequantizes the quantized weights of unit (a layer) into the model's window and points
 * their params at it (valid until another unit is materialized); a no-op for units
 * without quantized weights. The window (one layer's quantized weights in the compute
 * dtype, on the model's device, with an fp32 temporary for a double-quantized absmax;
 * the workspace category) is allocated on first use: -1 when that fails. */
int ft_model_materialize(ft_model *m, int unit, ft_err *err);
/* A strategy that shards the quantized base (ZeRO-3 / FSDP, lib/dist) takes each weight's
 * blocks after ft_model_init_unit has read them, and lends the gathered arrays back
 * before the layer runs (the unit hook's acquire comes before the layer is materialized).
 * ft_model_qtensor: param i's quantized arrays (NULL when i is not quantized).
 * ft_model_drop_qtensor: frees them (lent ones are only forgotten); until a view is lent
 *   again, materializing the layer is an error naming the weight.
 * ft_model_lend_qtensor: view's arrays (on the model's device, owned by the caller, alive
 *   until dropped or lent again) become param i's. */
ft_qtensor *ft_model_qtensor(ft_model *m, size_t i);
void ft_model_drop_qtensor(ft_model *m, size_t i);
void ft_model_lend_qtensor(ft_model *m, size_t i, const ft_qtensor *view);
/* Replaces every quantized weight by its dequantized copy for good (ft-merge: the whole
 * base dense, so the adapter can be added to it), in the compute dtype on the model's
 * device (fp32 on the CPU), and frees the quantized arrays and the window. The
 * quantization stays readable through ft_model_quant. */
int ft_model_dequantize_base(ft_model *m, ft_err *err);

/* DoRA's scratch for LoRA on the modules of lora_union (bitmask of 1u << ft_proj): the most
 * output rows, and the most weight elements, of one projection (a fused module's row
 * block) carrying a pair. The model's scratch and the memory plan both size it so. */
void ft_dora_scratch_dims(const ft_model_config *c, unsigned lora_union, size_t *max_out,
                          size_t *max_w);
/* The same for DoRA on the embedding and / or lm_head (outer: FT_LORA_EMBED, FT_LORA_HEAD;
 * lib/model/dora_outer.c), over N rows with the loss chunk's R: the most outputs (its
 * factors), weight elements, and elements of each of its two row temporaries. */
void ft_dora_scratch_outer(const ft_model_config *c, unsigned outer, size_t N, size_t R,
                           size_t *max_out, size_t *max_w, size_t *max_t);

/* Saves the LoRA weights as a PEFT adapter (adapter_config.json +
 * adapter_model.safetensors) into dir, created if needed, with the modules_to_save
 * weights under PEFT's keys (base_model.model.<HF name>). */
int ft_model_save_adapter(ft_model *m, const char *dir, const char *base_model, ft_err *err);

#endif
