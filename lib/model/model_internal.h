/* The inside of ft_model, shared by model.c (layout, loading), model_pass.c (forward,
 * backward) and adapter.c (PEFT adapters). Not a public header. */
#ifndef FT_MODEL_INTERNAL_H
#define FT_MODEL_INTERNAL_H

#include "model/lora_ranks.h"
#include "model/model.h"
#include "ops.h"

/* Buffers and dtypes. Every pointer below is a buffer on the model's device (m->dev) and
 * is only handed to ops, never dereferenced here, except on the CPU. Weights (frozen,
 * or the compute copy of trainable ones) and activations hold the compute dtype m->cdt
 * (fp32 on the CPU; fp32 or bf16 on the GPU) whatever their C type says; gradients,
 * rstd, lse and inv_freq are always fp32; ids, targets, pos, seg int32. */

/* Weights of one decoder layer: views into the flat buffers; grads NULL when frozen.
 * Indexed by module (ft_proj): a block with fused_proj has qkv and gate_up entries and no
 * q, k, v, gate, up ones (model_pass.c views their row blocks). */
typedef struct layer_weights {
    float *norm[FT_NBRANCH_NORMS];      /* [C]; NULL where the block has no such norm */
    float *q_norm, *k_norm;             /* q/k norm weights (NULL without) */
    float *w[FT_NPROJ], *b[FT_NPROJ];   /* b NULL when the projection has no bias */
    float *lora_a[FT_NPROJ], *lora_b[FT_NPROJ]; /* NULL when not a LoRA target */
    float *lora_m[FT_NPROJ];            /* DoRA's magnitude [out]; NULL without DoRA */
    float *g_norm[FT_NBRANCH_NORMS];
    float *g_q_norm, *g_k_norm;
    float *gw[FT_NPROJ], *gb[FT_NPROJ];
    float *g_lora_a[FT_NPROJ], *g_lora_b[FT_NPROJ];
    float *g_lora_m[FT_NPROJ];
    /* MoE (cfg.num_experts E > 0; moe.c): the router [E, C] and expert e's gate, up and
     * down weights at expert[3 e + 0, 1, 2] ([I, C], [I, C], [C, I]); grads likewise */
    float *router, *g_router;
    float **expert, **g_expert; /* [3 E] */
    /* (qwen2_moe's shared expert: w[gate, up, down]; its gate: w[FT_PROJ_SHGATE]) */
    /* LoRA on the router (lora.target_params FT_LORA_PARAM_ROUTER; moe_lora.c): A [r, C],
     * B [E, r]; NULL without */
    float *rlora_a, *rlora_b, *g_rlora_a, *g_rlora_b;
    /* LoRA on the experts (FT_LORA_PARAM_GATE_UP, _DOWN; moe_lora.c), in PEFT's layout
     * (lora.h's target_params): [0] the gate_up pair, [1] the down pair; NULL without */
    float *xlora_a[2], *xlora_b[2], *g_xlora_a[2], *g_xlora_b[2];
} layer_weights;

/* What backward needs from one layer's forward. With gradient checkpointing every layer
 * points at the same scratch set and only `in` (the layer input) is kept per layer.
 * Buffers of a norm the block does not have are NULL (see alloc_layer_set). */
typedef struct layer_acts {
    float *in;            /* [N, C] residual stream entering the layer */
    float *ln1;           /* [N, C] attention pre-norm output */
    float *rstd1;         /* [N] */
    float *qr, *kr;       /* [N, Hq*D], [N, Hkv*D]: q and k before their norm */
    float *rstd_q, *rstd_k; /* per norm row: [N * Hq], [N * Hkv] per head; [N] whole */
    float *q, *k, *v;     /* [N, Hq*D], [N, Hkv*D] x2, after RoPE */
    float *att;           /* [N, Hq*D] attention output before o_proj */
    float *lse;           /* [B, Hq, T] */
    float *ao;            /* [N, C] o_proj output before the attention post-norm */
    float *rstd_ao;       /* [N] */
    float *mid;           /* [N, C] residual after attention */
    float *ln2;           /* [N, C] MLP pre-norm output */
    float *rstd2;         /* [N] */
    float *gate, *up;     /* [N, W] (W: the widest plain MLP the set serves) */
    float *act;           /* [N, W] silu(gate) * up */
    float *mo;            /* [N, C] down_proj output before the MLP post-norm */
    float *rstd_mo;       /* [N] */
    float *lora_h[FT_NPROJ]; /* [N, r] dropout(x) A^T of each LoRA target module (r: the
                              * largest rank of the module over the layers the set serves) */
    /* MoE (moe.c; instead of gate, up, act), M = N k grouped (row, expert) pairs: */
    float *rlogits;       /* [N, E] router logits */
    float *probs;         /* [N, E] fp32 softmax */
    int32_t *idx;         /* [N, k] chosen experts */
    float *rw;            /* [N, k] fp32 their weights */
    int32_t *rows, *slot; /* [M] the grouping (ft_moe_plan) */
    int32_t *offsets;     /* [E + 1] host: expert e's pairs are [offsets[e], offsets[e+1]) */
    float *xe;            /* [M, C] the gathered MLP input */
    float *ge, *ue, *acte; /* [M, I] gate, up, silu(gate) * up */
    float *ye;            /* [M, C] expert outputs before weighting */
    /* qwen2_moe's shared expert (its MLP in gate, up, act above, width shared_expert_size) */
    float *sh;            /* [N, C] its output */
    float *sz;            /* [N] the gate's logit x G^T */
    float *ss;            /* [N] fp32 sigmoid(sz) */
    float *rlora_h;       /* [N, r] x A^T of the router's LoRA (NULL without) */
    float *xlora_h[2];    /* [M, 2r], [M, r]: each grouped row's xe A_e^T, acte A_e^T of
                           * the experts' gate_up and down pairs (NULL without) */
} layer_acts;

/* The activations of one forward (a GPipe activation slot; see ft_model_use_activation_slot):
 * the fields of ft_model from B to rope_long, and iota, saved while another slot is
 * current. */
typedef struct act_slot {
    int B, T;
    size_t max_rows;
    layer_acts *acts;
    float *final_in, *lnf, *rstdf, *logits;
    size_t logits_first;
    int32_t *ids, *targets, *pos, *seg;
    bool has_seg, logits_valid, can_backward;
    uint64_t dropout_seed;
    bool rope_long;
    int32_t *iota;
} act_slot;

struct ft_model {
    ft_model_config cfg;
    ft_model_options opt;
    ft_device dev;        /* opt.device */
    ft_dtype cdt;         /* opt.dtype: the compute dtype of weights and activations */
    unsigned *lora_mask;  /* [L]: projections of each layer with a LoRA pair */
    ft_lora_ranks lora_rk; /* each pair's rank and scaling (rank_pattern / alpha_pattern) */
    unsigned lora_union;  /* OR of lora_mask */
    ft_mem mem;

    /* parameters */
    ft_param *params;
    size_t n_params;
    float ***slot_data, ***slot_grad; /* [n_params]: where each param's pointers live */
    float *train_data, *train_grad, *frozen_data; /* whole-model buffers, NULL if unbound */
    float *train_compute; /* the compute-dtype copy of train_data (= train_data in fp32) */
    bool owns_buffers;
    size_t n_train, n_frozen;
    size_t *unit_begin; /* [L+3]: unit u spans [unit_begin[u], unit_begin[u+1]) */
    size_t *frozen_begin; /* [L+3]: the same in the frozen buffer */
    char dir[4096];     /* the model dir (ft_model_init_unit reads it) */
    ft_model_hooks hooks;
    /* QLoRA: quantized layer weights and the window one layer is dequantized into */
    ft_quant_options quant;      /* in force; type NONE: a dense base */
    bool quant_from_ckpt;        /* the checkpoint holds them quantized */
    char quant_skip[512];
    ft_qtensor *qt;              /* [n_params]: type NONE where not quantized; on the
                                  * model's device (a GPU model keeps no host copy) */
    bool *qt_lent;               /* [n_params]: qt[i]'s arrays belong to a strategy that
                                  * shards the base (ft_model_lend_qtensor): never freed here */
    float *qwin;                 /* one unit's quantized weights dequantized, of the
                                  * compute dtype, on the device; allocated on first use */
    size_t qwin_n;               /* the most quantized elements in one unit (0: none) */
    int qwin_unit;               /* the unit the window holds, -1 none */
    float *qabsmax;              /* fp32 [qabsmax_n] on the device: a double-quantized
                                  * weight's block absmax, reconstructed (ft_dequantize_to) */
    size_t qabsmax_n;
    float **qdense;              /* [n_params]: ft_model_dequantize_base's buffers (compute
                                  * dtype, on the device) */
    int stage_first, stage_last; /* units this model computes (pipeline stage) */
    float *embed, *g_embed;
    float *norm_f, *g_norm_f;
    float *lm_head, *g_lm_head; /* = embed when tied */
    /* LoRA on the embedding (lora_embedding_A [r, V], _B [C, r]) and on lm_head (A [r, C],
     * B [V, r]); NULL when not targeted (FT_LORA_EMBED, FT_LORA_HEAD) */
    float *elora_a, *elora_b, *g_elora_a, *g_elora_b;
    float *hlora_a, *hlora_b, *g_hlora_a, *g_hlora_b;
    /* DoRA's magnitudes there (lib/model/dora_outer.c): the embedding's [C] (its columns),
     * the head's [V] (its rows); NULL without DoRA */
    float *elora_m, *g_elora_m, *hlora_m, *g_hlora_m;
    unsigned outer_base_read; /* FT_LORA_EMBED / _HEAD: an adapter's base_layer weight
                               * replaced that base weight (saved again with the adapter) */
    /* An adapter made after resize_token_embeddings (opt.lora.vocab_size above
     * config.json's): config.json's vocabulary (cfg.vocab_size is the adapter's); 0 when
     * not resized. The checkpoint fills the first base_vocab rows of the embedding and
     * the head, the adapter all of them (model_read_adapter checks it does). */
    int64_t base_vocab;
    /* config.json ties lm_head to the embedding, but an adapter's modules_to_save without
     * ensure_weight_tying unties them (PEFT trains separate copies, and merges untied):
     * cfg.tie_word_embeddings is then false and lm_head.weight is read from the
     * checkpoint's embedding (untie_head in model.c) */
    bool head_untied;
    layer_weights *layers;
    float *inv_freq; /* [model_rope_sets][rotary_dim/2] on the host: the RoPE frequencies,
                      * then (longrope) the long-context set or (gemma3) the sliding
                      * layers' local set */
    float *inv_freq_dev; /* the same on the model's device (= inv_freq on the CPU) */
    int32_t *batch_h;    /* GPU: host staging of ids, targets, pos, seg ([4][max_rows]) */
    float *logits_h;     /* GPU: the logits copied to the host for ft_model_logits */
    bool logits_h_valid;
    float *row_logits_h; /* GPU: [V], one row copied for ft_model_row_logits */

    /* activations, sized for max_rows tokens (B x T) */
    int B, T;
    size_t max_rows;
    layer_acts *acts;     /* [L] */
    float *final_in;      /* [N, C] output of the last layer */
    float *lnf, *rstdf;   /* [N, C], [N] */
    float *logits;        /* [R, V]: R = ft_loss_chunk_rows(opt.loss_chunk_rows, V, N) */
    size_t logits_first;  /* the batch row logits' first row holds (0, or the last chunk's) */
    int32_t *ids, *targets, *pos, *seg; /* [N] */
    int32_t *iota;        /* [N] n (qwen2_moe's shared expert; NULL without) */
    bool has_seg;
    bool logits_valid, can_backward;
    bool eval_mode;       /* ft_model_set_training(m, false): no dropout */
    bool adapter_off;     /* ft_model_set_adapter(m, false): the LoRA path is skipped */
    /* preference objectives (model_rows.c): during ft_model_forward_rows the head sums
     * each batch row's token losses into row_nll[B]; during ft_model_backward_rows row r's
     * cross-entropy gradient is scaled by row_scale[r]. NULL otherwise. */
    double *row_nll;
    const float *row_scale;
    /* and with row_split (ORPO): row r's targets before row_split[r] go to row_nll_pre[r] /
     * take row_scale_pre[r] instead (NULL: none) */
    const int32_t *row_split;
    double *row_nll_pre;
    const float *row_scale_pre;
    uint64_t dropout_seed; /* of the last forward (a fresh one each forward) */
    bool rope_long;        /* the forward's batch rotates with inv_freq's second set
                            * (longrope beyond the original context) */
    uint64_t n_forward;
    act_slot *slots;      /* [n_slots]: the saved state of every slot (cur's is stale) */
    int n_slots, cur_slot;

    /* backward scratch, shared by every activation slot: sized for scratch_rows, the most
     * rows any slot has reserved (a smaller slot must not shrink it under a larger one) */
    size_t scratch_rows;
    float *d_h, *d_ln;           /* [N, C] */
    float *d_br;                 /* [N, C]: a branch output's gradient before its post-norm
                                  * (allocated only when the block has one) */
    float *d_att, *d_q, *d_k, *d_v; /* [N, Hq*D], [N, Hkv*D] */
    float *d_act, *d_gate, *d_up;   /* [N, I] */
    float *d_lora_h;             /* [N, r]: r the largest rank but the experts'
                                  * (ft_lora_ranks_max_dense) */
    float *x_drop;               /* [N, max(C, I, Hq*D)]: dropout(x) for LoRA */
    /* DoRA (lib/model/dora.c): W + s B A of one projection, its row factors, and two
     * [N, out] temporaries; sized by ft_dora_scratch_dims */
    size_t dora_out, dora_w_n;
    float *dora_w;               /* [dora_w_n], compute dtype */
    float *dora_g, *dora_inv;    /* [dora_out] fp32: m / ||.||, 1 / ||.|| */
    float *dora_t, *dora_d;      /* [N, dora_out], compute dtype */
    /* [N, r]: the embedding's A^T[ids], or the head's dropout(lnf) A^T (recomputed in the
     * backward, not kept); with LoRA on the embedding or the head (r: the larger rank) */
    float *lora_xh;
    /* LoRA on the experts (moe_lora.c): one pair's B split expert-major [E, out, R]
     * (compute dtype), its gradient so (fp32), and dh [M, 2r] */
    float *xlora_bs, *xlora_gbs, *xlora_dh;
    /* MoE (moe.c): d_act, d_gate, d_up hold [N k, I] then; and */
    float *d_moe;                /* [N k, C]: d ye, then d xe */
    float *d_rw;                 /* [N, k] fp32 */
    float *d_rlogits;            /* [N, E] */
    /* load-balancing loss (cfg.output_router_logits): counts and prob sums per expert
     * over the forward's MoE layers (fp32 [E] each), its gradient w.r.t. every layer's
     * probs (aux_dp [E], set by the backward), and the term it added to the loss */
    float *aux_counts, *aux_psum, *aux_dp;
    /* host [2 E + 1] doubles: the statistics as moe_aux_end sums them over the ranks
     * (allocated by its first call, kept so that later steps allocate nothing) */
    double *aux_sums;
    double aux_loss;
    double aux_balance; /* the load-balancing loss before the coefficient (aux_loss / coef) */
    /* the real tokens of the forward's batch (its attention_mask; moe_aux_mask), the only
     * rows the statistics count and the aux gradient reaches: aux_n_runs flat row ranges
     * [aux_runs[2i], aux_runs[2i+1]) of the B T, ascending and apart, aux_real rows in all
     * (host; aux_runs_cap pairs) */
    int32_t *aux_runs;
    size_t aux_runs_cap, aux_n_runs;
    long aux_real;
    /* GPU MoE: host staging of one layer's idx, rows and slot ([3 N k] int32, at least
     * 3 E floats for the statistics), with the activations */
    int32_t *moe_host;
    ft_model_aux_reduce_fn aux_reduce; /* ft_model_set_aux_reduce */
    void *aux_reduce_ctx;
};

/* Bytes of one element of the compute dtype. */
static inline size_t model_esize(const ft_model *m)
{
    return m->cdt == FT_BF16 || m->cdt == FT_F16 ? 2 : 4;
}

/* p + i elements of the compute dtype. */
static inline float *model_at(const ft_model *m, float *p, size_t i)
{
    return p ? (float *)((char *)p + i * model_esize(m)) : NULL;
}

/* A view on the model's device: of the compute dtype (weights, activations) or fp32. */
static inline ft_tensor model_view(const ft_model *m, const void *p, size_t n, ft_dtype dt)
{
    return ft_view((void *)p, n, dt, m->dev);
}

/* Shape of projection p: in and out features. */
static inline void proj_dims(const ft_model_config *c, ft_proj p, int *in, int *out)
{
    ft_proj_dims(c, p, in, out);
}

/* The rows and width of the q/k norm of a projection with `heads` heads over N tokens:
 * N * heads rows of head_dim (per head), or N rows of heads * head_dim (whole). */
static inline void qk_norm_rows(const ft_model_config *c, int heads, size_t N, size_t *rows,
                                int *width)
{
    bool per_head = c->qk_norm == FT_QK_NORM_HEAD;
    *rows = per_head ? N * (size_t)heads : N;
    *width = per_head ? c->head_dim : heads * c->head_dim;
}

static inline int proj_has_bias(const ft_model_config *c, ft_proj p)
{
    if (p == FT_PROJ_Q || p == FT_PROJ_K || p == FT_PROJ_V || p == FT_PROJ_QKV)
        return c->qkv_bias;
    if (p == FT_PROJ_O)
        return c->o_bias;
    return c->mlp_bias;
}

/* Whether the embedding is trained: in full mode, or in LoRA mode as a module to save. */
static inline bool model_embed_trains(const ft_model *m)
{
    return m->opt.mode == FT_TRAIN_FULL ||
           (m->opt.mode == FT_TRAIN_LORA && (m->opt.lora.modules_to_save & FT_SAVE_EMBED));
}

/* LoRA on the embedding / on lm_head (the settings: a strategy binds the pointers only
 * while the unit is acquired). */
static inline bool model_embed_lora(const ft_model *m)
{
    return m->opt.mode == FT_TRAIN_LORA && (m->opt.lora.targets & FT_LORA_EMBED);
}

static inline bool model_head_lora(const ft_model *m)
{
    return m->opt.mode == FT_TRAIN_LORA && (m->opt.lora.targets & FT_LORA_HEAD);
}

/* The embedding's (FT_LORA_EMBED) or the untied head's (FT_LORA_HEAD) parameter, by its
 * checkpoint name (outer_names.c); a tied head: NULL, or the embedding with tied_head. */
ft_param *model_outer_param(ft_model *m, unsigned bit, bool tied_head);
/* FT_LORA_EMBED or FT_LORA_HEAD for the embedding's or the untied head's weight, else 0. */
unsigned model_vocab_bit(const ft_model *m, const ft_param *p);

/* The RoPE frequency sets inv_freq holds: 2 for longrope (short, long) and for a local
 * RoPE (gemma3: the full-attention layers' set, then the sliding layers'), else 1. */
static inline size_t model_rope_sets(const ft_model *m)
{
    return m->cfg.rope_kind == FT_ROPE_LONGROPE || m->cfg.rope_local_theta > 0 ? 2 : 1;
}

/* Reads the base weights of unit (-1: every unit) from dir into the bound storage. */
int model_read_weights(ft_model *m, const char *dir, int unit, ft_err *err);
/* Rows old_rows..rows of the [rows, cols] w set to the mean of its first old_rows
 * (added_vocab.c: resize_token_embeddings' mean_resizing). */
void model_mean_rows(float *w, int64_t old_rows, int64_t rows, int64_t cols);
/* Reads the LoRA weights of unit (-1: every unit) of the adapter in dir (checked against
 * the model's LoRA options), and the modules it saves in full (modules_to_save). */
int model_read_adapter(ft_model *m, const char *dir, int unit, ft_err *err);

/* Adds p's values (fp32, copied to the host first where needed) to w as tensor `name`. */
int model_param_to_writer_as(ft_model *m, const ft_param *p, const char *name, ft_st_writer *w,
                             ft_err *err);

/* dora.c: projection p of layer l with DoRA (see lora.h): the forward adds the DoRA
 * terms to y = x W^T + b (h = dropout(x) A^T already computed); the backward takes dy and
 * accumulates dx, dA, dB and dm. The views are of the projection's rows (proj_view). */
typedef struct proj_view {
    ft_proj mod;      /* the module carrying the weights (p when not fused) */
    bool first_block; /* the module's first block: the forward computes h here */
    int in, out;      /* p's features */
    int r;            /* the module's LoRA rank (0: no pair) */
    float s;          /* and scaling */
    float *w, *b, *lora_a, *lora_b, *lora_m, *lora_h; /* compute dtype */
    float *gw, *gb, *g_lora_a, *g_lora_b, *g_lora_m;  /* fp32, NULL when frozen */
} proj_view;
/* dora_outer.c: DoRA on the embedding and on lm_head (model_pass.c calls them where the
 * pairs' LoRA is). The scratch: ft_dora_scratch_outer; the forward after embed_lora_forward
 * rescales h0's columns; head_logits / the head's backward chunk by chunk; the embedding's
 * backward instead of embed_lora_backward's pair gradients. */
void dora_embed_forward(ft_model *m, int N);
void dora_embed_backward(ft_model *m, int N);
void dora_head_logits(ft_model *m, size_t r0, size_t rows, float alpha);
void dora_head_backward(ft_model *m, size_t r0, size_t rows, float alpha, const float *xd,
                        uint64_t seed);
void dora_forward(ft_model *m, const proj_view *v, const float *x, const float *xd, float *y);
/* xd: dropout(x) (x itself without dropout); pd, seed: the dropout applied. */
void dora_backward(ft_model *m, const proj_view *v, const float *x, const float *xd,
                   const float *dy, float *dx, float pd, uint64_t seed);

/* model_device.c: where prepare_batch writes the batch (host staging on the GPU), the
 * copy of those arrays to the device, and the device copy of inv_freq. */
void model_batch_arrays(ft_model *m, int32_t **ids, int32_t **targets, int32_t **pos,
                        int32_t **seg);
int model_upload_batch(ft_model *m, ft_err *err);
int model_upload_inv_freq(ft_model *m, ft_err *err);

/* moe.c: the sparse MoE block of layer l (cfg.num_experts > 0), y = moe(x) over the
 * batch's N rows (x, y [N, C]); record: add the routing to the load-balancing statistics
 * (not in a gradient-checkpoint recompute). Backward: dx += d moe(x)/dx from dy, the
 * trainable weights' gradients accumulating. */
void moe_forward(ft_model *m, int l, const float *x, float *y, bool record);
void moe_backward(ft_model *m, int l, const float *x, const float *dy, float *dx);
/* The load-balancing term of the forward that just ended (moe_aux_begin before its
 * layers): m->aux_loss; and its gradient for the backward (aux_dp). Reduced over the
 * ranks first when a reduce is set (ft_model_set_aux_reduce). */
void moe_aux_begin(ft_model *m);
/* The real tokens of batch b (its attention_mask, checked) for the statistics and the
 * gradient of the next forward (no-op without the load-balancing loss). */
int moe_aux_mask(ft_model *m, const ft_batch *b, ft_err *err);
/* moe_lora.c: LoRA on layer l's router (no-ops without it). Forward: rlogits += s (x A^T)
 * B^T, keeping x A^T; backward: from d_rlogits, dA, dB, and dx += s d_rlogits B A. */
void moe_router_lora_forward(ft_model *m, int l, const float *x, float *rlogits);
void moe_router_lora_backward(ft_model *m, int l, const float *x, const float *d_rlogits,
                              float *dx);
/* LoRA on layer l's experts, pair bit (FT_LORA_PARAM_GATE_UP or _DOWN; no-ops without
 * it), over the grouping of the layer's forward. Forward, after the base GEMMs of that
 * pair: ge, ue += s (xe A_e^T) B_e^T (gate_up) or ye += s (acte A_e^T) B_e^T (down), per
 * expert. Backward, after the base backward of the pair: from d ge, d ue (d_gate, d_up)
 * or d ye (d_moe), dA, dB and d xe (d_moe) or d acte (d_act). */
void moe_experts_lora_forward(ft_model *m, int l, unsigned bit);
void moe_experts_lora_backward(ft_model *m, int l, unsigned bit);
/* The sizes of the scratch above for a model (elements): split B, dh per row. */
void moe_experts_lora_dims(const ft_model *m, size_t *bs, size_t *dh_per_row);
int moe_aux_end(ft_model *m, ft_err *err);

/* (Re)allocates activation and scratch buffers for B x T tokens. */
int model_reserve_activations(ft_model *m, int B, int T, ft_err *err);

#endif
