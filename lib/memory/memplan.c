/* The memory planner (see memplan.h for the formulas). The cpu rows mirror lib/model/model.c
 * buffer by buffer: build_layout (parameters), assign_buffers (weights, gradients),
 * model_reserve_activations / alloc_layer_set (activations, backward scratch),
 * lib/train/optim.c (AdamW m and v), and the strategies' buffers of lib/dist/dist_dp.c (dp_setup)
 * and lib/dist/dist_engine.c (offload). A change there must be mirrored here; the unit test
 * (cpu-fp32) and tests/conformance/test_memcheck.py (every cpu row on real ranks) fail
 * otherwise. */
#include "memory/memplan.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "formats/lora.h"
#include "model/lora_ranks.h"
#include "model/model.h"
#include "quant/quant_shard.h"
#include "formats/model_path.h"

enum { MODE_FULL, MODE_LORA, MODE_QLORA };

/* Element counts of the activation and scratch buffers, by storage class. */
typedef struct act_counts {
    size_t tensor; /* h bytes on a GPU (the logits too) */
    size_t stat;   /* fp32 everywhere: rstd, lse */
    size_t ints;   /* int32 */
} act_counts;

static size_t act_bytes(const act_counts *a, size_t h)
{
    return a->tensor * h + (a->stat + a->ints) * 4;
}

int ft_memplan_loss_chunk(const ft_train_section *t)
{
    return t->loss_chunk_tokens == FT_CFG_AUTO ? -1 : (int)t->loss_chunk_tokens;
}

typedef struct planner {
    const ft_model_config *mc;
    int mode;
    size_t h;       /* GPU compute bytes per parameter / gradient / activation */
    size_t k;       /* GPU optimizer bytes per trainable parameter */
    size_t N;       /* world size */
    ft_memplan_result *r;
    /* per unit (0..L+1): trainable parameters, frozen bytes at GPU precision, frozen
     * parameters in the flat frozen buffer (dense ones) */
    size_t *unit_train, *unit_frozen_bytes, *unit_frozen;
    /* a quantized base (qlora, or a checkpoint quantized already): the format, the
     * modules left dense, and per unit its quantized weights' elements (the
     * dequantization window holds one unit's), bytes, and the largest absmax temporary
     * of one of them (fp32 elements; double quantization only) */
    ft_quant_options quant;
    const char *quant_skip;
    size_t *unit_quantized, *unit_quant_bytes, *unit_absmax;
    size_t *unit_qwin; /* bytes of a unit's zero3 gather window (lib/dist/dist_qshard.c) */
    size_t frozen_z3;  /* gpu-zero3's frozen bytes per rank (what offload_params moves) */
    bool qshape_overflow;
    unsigned lora_params; /* LoRA on a MoE's router / experts (lora.h's target_params) */
    const ft_lora_ranks *rk; /* each LoRA pair's rank (model/lora_ranks.h) */
} planner;

/* A quantized weight [rows, cols] for the zero3 / fsdp shards: counted by shape. */
static void add_qshape(planner *p, int unit, int64_t rows, int64_t cols)
{
    ft_memplan_result *r = p->r;
    ft_qtensor meta = ft_qshard_meta(&p->quant, rows, cols);
    size_t bytes[FT_QSHARD_MAX_ARRAYS];
    int na = ft_qshard_arrays(&meta, bytes);
    for (int a = 0; a < na; a++) /* (dist_qshard.c aligns each array to 64 bytes) */
        p->unit_qwin[unit] += (bytes[a] + 63) / 64 * 64;
    r->q_replicated += ft_qshard_replicated(&meta);
    for (int i = 0; i < r->n_qshapes; i++)
        if (r->qshapes[i].rows == rows && r->qshapes[i].cols == cols) {
            r->qshapes[i].count++;
            return;
        }
    if (r->n_qshapes == FT_PLAN_MAX_QSHAPES) {
        p->qshape_overflow = true;
        return;
    }
    r->qshapes[r->n_qshapes++] = (struct ft_plan_qshape){rows, cols, 1};
}

/* Rank `rank`'s bytes of the quantized base sharded over W ranks by blocks. */
static size_t qshard_rank_bytes(const ft_memplan_result *r, int rank, int W)
{
    size_t total = 0;
    for (int i = 0; i < r->n_qshapes; i++) {
        ft_qtensor meta = ft_qshard_meta(&r->quant_opt, r->qshapes[i].rows, r->qshapes[i].cols);
        total += r->qshapes[i].count * ft_qshard_bytes(&meta, rank, W);
    }
    return total;
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* One parameter tensor, as build_layout lists it. */
static void add_tensor(planner *p, int unit, size_t numel, bool trainable, bool quant,
                       int64_t rows, int64_t cols)
{
    ft_memplan_result *r = p->r;
    ft_memplan_row *row = r->rows;
    size_t h = p->h, k = p->k, N = p->N, shard = ceil_div(numel, N);
    if (trainable) {
        r->n_trainable += numel;
        p->unit_train[unit] += numel;
        for (int i = FT_PLAN_GPU_1; i <= FT_PLAN_GPU_ZERO3; i++) {
            bool shard_w = i == FT_PLAN_GPU_ZERO3;
            bool shard_g = i >= FT_PLAN_GPU_ZERO2;
            bool shard_o = i >= FT_PLAN_GPU_ZERO1;
            row[i].bytes[FT_MEM_WEIGHTS] += h * (shard_w ? shard : numel);
            row[i].bytes[FT_MEM_GRADS] += h * (shard_g ? shard : numel);
            row[i].bytes[FT_MEM_OPTIM] += k * (shard_o ? shard : numel);
        }
        /* FSDP: per unit, below */
    } else {
        size_t qb = quant ? ft_quant_size(&p->quant, rows, cols) : 0;
        size_t fb = quant ? qb : h * numel;
        r->n_frozen += numel;
        if (quant) {
            size_t a = ft_quant_absmax_tmp(&p->quant, rows, cols);
            r->n_quantized += numel;
            r->quant_bytes += qb;
            p->unit_quantized[unit] += numel;
            if (a > p->unit_absmax[unit])
                p->unit_absmax[unit] = a;
            add_qshape(p, unit, rows, cols);
        }
        p->unit_frozen_bytes[unit] += fb;
        if (quant)
            p->unit_quant_bytes[unit] += qb;
        else
            p->unit_frozen[unit] += numel;
        for (int i = FT_PLAN_GPU_1; i <= FT_PLAN_GPU_ZERO3; i++)
            row[i].bytes[FT_MEM_WEIGHTS] += i == FT_PLAN_GPU_ZERO3 ? ceil_div(fb, N) : fb;
        p->frozen_z3 += ceil_div(fb, N);
    }
}

/* Mirrors build_layout in lib/model/model.c; saved: LoRA's modules_to_save
 * (FT_SAVE_EMBED, FT_SAVE_HEAD), trained in full. */
static void count_params(planner *p, const unsigned *lora_mask, unsigned saved, bool dora,
                         unsigned outer)
{
    const ft_lora_ranks *rk = p->rk;
    const ft_model_config *c = p->mc;
    bool full = p->mode == MODE_FULL;
    size_t L = (size_t)c->num_layers, C = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    size_t n_norms = 0; /* the block's branch norms */
    for (int n = 0; n < FT_NBRANCH_NORMS; n++)
        n_norms += ft_has_branch_norm(c, (ft_branch_norm)n);
    size_t qk_q = 0, qk_k = 0; /* q_norm, k_norm */
    if (c->qk_norm != FT_QK_NORM_NONE) {
        bool head = c->qk_norm == FT_QK_NORM_HEAD;
        qk_q = (size_t)c->head_dim * (head ? 1 : (size_t)c->num_heads);
        qk_k = (size_t)c->head_dim * (head ? 1 : (size_t)c->num_kv_heads);
    }
    add_tensor(p, 0, V * C, full || (saved & FT_SAVE_EMBED), false, 0, 0);
    if (outer & FT_LORA_EMBED) { /* lora_embedding_A [r, V], _B [C, r] */
        add_tensor(p, 0, (size_t)rk->embed.r * V, true, false, 0, 0);
        add_tensor(p, 0, C * (size_t)rk->embed.r, true, false, 0, 0);
        if (dora) /* lora_magnitude_vector [C] */
            add_tensor(p, 0, C, true, false, 0, 0);
    }
    for (size_t l = 0; l < L; l++) {
        int unit = (int)l + 1;
        for (size_t n = 0; n < n_norms; n++) /* input_layernorm, ... */
            add_tensor(p, unit, C, full, false, 0, 0);
        if (qk_q) {
            add_tensor(p, unit, qk_q, full, false, 0, 0);
            add_tensor(p, unit, qk_k, full, false, 0, 0);
        }
        unsigned projs = ft_layer_projections(c, (int)l);
        for (int j = 0; j < FT_NPROJ; j++) {
            if (!(projs & (1u << j)))
                continue; /* (phi3: fused qkv / gate_up modules instead of q, k, v, ...) */
            int in, out;
            ft_layer_proj_dims(c, (int)l, (ft_proj)j, &in, &out);
            bool bias = j == FT_PROJ_O ? c->o_bias
                        : j <= FT_PROJ_V || j == FT_PROJ_QKV ? c->qkv_bias
                                                             : c->mlp_bias;
            char path[160];
            snprintf(path, sizeof path, "model.layers.%zu.%s", l,
                     ft_layer_proj_path(c, (int)l, (ft_proj)j));
            bool quant = p->quant.type != FT_QUANT_NONE && !ft_quant_skipped(p->quant_skip, path);
            add_tensor(p, unit, (size_t)out * (size_t)in, full, quant, out, in);
            if (bias)
                add_tensor(p, unit, (size_t)out, full, false, 0, 0);
            if (!full && (lora_mask[l] & (1u << j))) {
                size_t r = (size_t)ft_lora_proj_pair(rk, (int)l, j).r;
                add_tensor(p, unit, r * (size_t)in, true, false, 0, 0);  /* A */
                add_tensor(p, unit, (size_t)out * r, true, false, 0, 0); /* B */
                if (dora) /* lora_magnitude_vector */
                    add_tensor(p, unit, (size_t)out, true, false, 0, 0);
            }
        }
        if (ft_layer_sparse(c, (int)l)) { /* add_moe: the router, each expert's gate, up,
                                           * down */
            size_t E = (size_t)c->num_experts, I = (size_t)c->intermediate_size;
            add_tensor(p, unit, E * C, full, false, 0, 0);
            for (size_t e = 0; e < E; e++)
                for (int h = 0; h < 3; h++) {
                    /* quantized_expert: on load only, not in a quantized checkpoint */
                    char path[160];
                    snprintf(path, sizeof path, "model.layers.%zu.%s.experts.%zu.%s", l,
                             c->moe_name, e, c->expert_proj[h]);
                    bool quant = p->quant.type != FT_QUANT_NONE && !c->quant.present &&
                                 !ft_quant_skipped(p->quant_skip, path);
                    int64_t rows = (int64_t)(h == 2 ? C : I), cols = (int64_t)(h == 2 ? I : C);
                    add_tensor(p, unit, I * C, full, quant, rows, cols);
                }
            /* LoRA on the router [r, C] + [E, r], the experts' gate_up [E R, C] +
             * [2I, E R], down [E R, I] + [C, E R], each of the layer's rank (model.c,
             * after the projections' pairs: the same unit) */
            if (!full && (p->lora_params & FT_LORA_PARAM_ROUTER)) {
                size_t r = (size_t)rk->router[l].r;
                add_tensor(p, unit, r * C, true, false, 0, 0);
                add_tensor(p, unit, E * r, true, false, 0, 0);
            }
            if (!full && (p->lora_params & FT_LORA_PARAM_GATE_UP)) {
                size_t r = (size_t)rk->experts[2 * l].r;
                add_tensor(p, unit, E * r * C, true, false, 0, 0);
                add_tensor(p, unit, 2 * I * E * r, true, false, 0, 0);
            }
            if (!full && (p->lora_params & FT_LORA_PARAM_DOWN)) {
                size_t r = (size_t)rk->experts[2 * l + 1].r;
                add_tensor(p, unit, E * r * I, true, false, 0, 0);
                add_tensor(p, unit, C * E * r, true, false, 0, 0);
            }
        }
    }
    add_tensor(p, (int)L + 1, C, full, false, 0, 0); /* model.norm */
    if (!c->tie_word_embeddings)
        add_tensor(p, (int)L + 1, V * C, full || (saved & FT_SAVE_HEAD), false, 0, 0);
    if (outer & FT_LORA_HEAD) { /* lm_head's lora_A [r, C], lora_B [V, r] */
        add_tensor(p, (int)L + 1, (size_t)rk->head.r * C, true, false, 0, 0);
        add_tensor(p, (int)L + 1, V * (size_t)rk->head.r, true, false, 0, 0);
        if (dora) /* lora_magnitude_vector [V] */
            add_tensor(p, (int)L + 1, V, true, false, 0, 0);
    }
}

/* The activations of a tuning run: LoRA rank, targets and dropout. */
typedef struct act_spec {
    bool grad_ckpt, lora, lora_dropout, dora;
    unsigned outer; /* FT_LORA_EMBED, FT_LORA_HEAD */
    int loss_chunk; /* ft_model_options.loss_chunk_rows */
    unsigned lora_union;
    const ft_lora_ranks *rk; /* each LoRA pair's rank (model/lora_ranks.h) */
} act_spec;

/* A pipeline stage of units [first, last] (0 embeddings, 1..L layers, L+1 head); the
 * whole model is [0, L+1]. */
typedef struct stage_span {
    int first, last;
} stage_span;

/* Adds one layer set (model.c alloc_layer_set) for N rows serving layers [l0, l1) to *set:
 * q, k, v, att, mid, gate, up, act at the widest plain MLP (+ lora_h), lse; ln1 and rstd1,
 * ln2 and rstd2 with the pre-norms; ao and rstd_ao, mo and rstd_mo with the post-norms;
 * qr, kr, rstd_q, rstd_k with a q/k norm; with a sparse layer the MoE's rlogits, probs,
 * idx, rw, rows, slot and over the M = N k grouped rows xe, ge, ue, acte, ye (+ the
 * router's and experts' LoRA h), and the shared expert's sh, sz, ss. */
static void layer_set_counts(const ft_model_config *c, size_t N, const act_spec *sp, int l0,
                             int l1, act_counts *set)
{
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    size_t QD = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t KD = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    size_t W = (size_t)ft_max_mlp_width(c, l0, l1);
    bool moe = false;
    for (int l = l0; l < l1; l++)
        moe |= ft_layer_sparse(c, l);
    size_t E = (size_t)c->num_experts, M = N * (size_t)(E ? c->experts_per_tok : 1);
    set->tensor += N * C + N * QD * 2 + N * KD * 2 + N * W * 3;
    set->stat += N * (size_t)c->num_heads;
    if (moe) {
        set->tensor += N * E + 2 * M * C + 3 * M * I;
        set->stat += N * E + M;
        set->ints += 3 * M;
        if (c->shared_expert_size > 0) {
            set->tensor += N * C + N;
            set->stat += N;
        }
    }
    for (int n = 0; n < FT_NBRANCH_NORMS; n++)
        if (ft_has_branch_norm(c, (ft_branch_norm)n)) {
            set->tensor += N * C;
            set->stat += N;
        }
    if (c->qk_norm != FT_QK_NORM_NONE) {
        bool head = c->qk_norm == FT_QK_NORM_HEAD;
        set->tensor += N * QD + N * KD;
        set->stat += head ? N * (size_t)c->num_heads + N * (size_t)c->num_kv_heads : 2 * N;
    }
    /* LoRA's h: each module's [N, r], on a MoE the router's rlora_h [N, r] and the
     * experts' xlora_h [M, r] of gate_up and down, r the largest rank of the pairs on
     * the layers the set serves */
    for (int j = 0; sp->lora && j <= FT_LORA_RANK_DOWN; j++)
        set->tensor += (j >= FT_LORA_RANK_GATE_UP ? M : N) *
                       (size_t)ft_lora_ranks_max(sp->rk, j, l0, l1);
}

/* Mirrors model_reserve_activations / alloc_layer_set for N rows while training, on the
 * stage span. *act: the activations category, *ws: the workspace category. */
static void count_activations(const ft_model_config *c, size_t N, const act_spec *sp,
                              stage_span span, act_counts *act, act_counts *ws)
{
    size_t C = (size_t)c->hidden_size;
    size_t I = (size_t)c->intermediate_size, V = (size_t)c->vocab_size;
    size_t QD = (size_t)c->num_heads * (size_t)c->head_dim;
    size_t KD = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    int L = c->num_layers;
    memset(act, 0, sizeof *act);
    memset(ws, 0, sizeof *ws);

    size_t E = (size_t)c->num_experts, M = N * (size_t)(E ? c->experts_per_tok : 1);
    /* LoRA on the experts' scratch (moe_lora.c moe_experts_lora_dims) */
    size_t xbs = 0, xdh = 0;
    if (sp->lora && E) {
        size_t Rg = (size_t)ft_lora_ranks_max(sp->rk, FT_LORA_RANK_GATE_UP, 0, L);
        size_t Rd = (size_t)ft_lora_ranks_max(sp->rk, FT_LORA_RANK_DOWN, 0, L);
        xbs = E * 2 * I * Rg > E * C * Rd ? E * 2 * I * Rg : E * C * Rd;
        xdh = Rg > Rd ? Rg : Rd;
    }
    /* the stage keeps the input of layers l0..l1 and a set for each but l1 (whose input
     * it sends on); the whole model: every layer's input and set; with gradient
     * checkpointing one set serves them all */
    int l0 = span.first > 0 ? span.first - 1 : 0;
    int l1 = span.last < L + 1 ? span.last : L;
    bool head = span.last == L + 1;
    size_t n_in = 0;
    for (int l = l0; l < L && l <= l1; l++)
        n_in++;
    int lend = l1 < L ? l1 : L; /* the layers with a set: [l0, lend) */
    act->tensor = n_in * N * C;
    if (sp->grad_ckpt && lend > l0) {
        layer_set_counts(c, N, sp, l0, lend, act);
    } else {
        for (int l = l0; l < lend; l++)
            layer_set_counts(c, N, sp, l, l + 1, act);
    }
    if (l1 == L)
        act->tensor += N * C; /* final_in */
    if (head) {
        act->tensor += N * C; /* lnf */
        act->stat += N;       /* rstdf */
        act->tensor += ft_loss_chunk_rows(sp->loss_chunk, V, N) * V; /* logits */
    }
    act->ints += 4 * N; /* ids, targets, pos, seg */
    if (c->shared_expert_size > 0)
        act->ints += N; /* iota */

    /* d_h d_ln d_att d_q d_k d_v d_act d_gate d_up (MoE: the last three over M rows, and
     * d_moe [M, C], d_rw [M], d_rlogits [N, E]) */
    size_t DI = M / N * I, W = (size_t)ft_max_mlp_width(c, 0, L);
    ws->tensor = 2 * N * C + 2 * N * QD + 2 * N * KD + 3 * N * (DI > W ? DI : W);
    if (E) {
        ws->tensor += M * C + N * E;
        ws->stat += M;
    }
    if (ft_has_branch_norm(c, FT_NORM_ATTN_POST) || ft_has_branch_norm(c, FT_NORM_MLP_POST))
        ws->tensor += N * C; /* d_br */
    if (sp->lora) {
        ws->tensor += N * (size_t)ft_lora_ranks_max_dense(sp->rk); /* d_lora_h */
        if (sp->lora_dropout) {
            size_t w = C > I ? (C > QD ? C : QD) : (I > QD ? I : QD);
            ws->tensor += N * (W > w ? W : w); /* x_drop */
        }
        if (sp->outer) { /* lora_xh: the embedding's or the head's h */
            int r = sp->rk->embed.r > sp->rk->head.r ? sp->rk->embed.r : sp->rk->head.r;
            ws->tensor += N * (size_t)r;
        }
        /* the experts' pairs (moe_lora.c): split B, its fp32 gradient, dh [M, R] */
        ws->tensor += xbs + M * xdh;
        ws->stat += xbs;
        if (sp->dora) { /* dora_w, dora_g, dora_inv, dora_t, dora_d (lib/model/dora.c) */
            size_t out, wn, o2, w2, t2;
            ft_dora_scratch_dims(c, sp->lora_union, &out, &wn);
            size_t tn = N * out;
            /* and on the embedding / head (dora_outer.c; model.c's dora_t_elems) */
            ft_dora_scratch_outer(c, sp->outer, N, ft_loss_chunk_rows(sp->loss_chunk, V, N),
                                  &o2, &w2, &t2);
            out = o2 > out ? o2 : out;
            wn = w2 > wn ? w2 : wn;
            tn = t2 > tn ? t2 : tn;
            ws->tensor += wn + 2 * tn;
            ws->stat += 2 * out;
        }
    }
}

/* model_parallel as lib/dist/dist_pipeline.c splits it: contiguous stages balanced by
 * parameter count (split_stages), each rank's trainable and frozen range, a copy of a
 * tied embedding on the last stage, the optimizer over the stage's trainables; the
 * activations of the stage, in one activation slot per GPipe chunk
 * (dist.pipeline_micro_batches > 1; lib/dist/dist_engine.c gpipe) with the backward scratch
 * shared (the largest chunk's). Fills r->pipe_bytes, or leaves r->pipe_stages 0 when the
 * engine refuses the world size (more ranks than units). */
static void plan_pipeline(ft_memplan_result *r, const planner *p, const act_spec *sp, int chunks)
{
    const ft_model_config *mc = p->mc;
    int W = r->world_size, U = mc->num_layers + 2;
    if (W > U || W > FT_PLAN_MAX_STAGES)
        return;
    int first[FT_PLAN_MAX_STAGES + 1];
    double total = 0, run = 0;
    for (int u = 0; u < U; u++)
        total += (double)(p->unit_train[u] + p->unit_frozen[u]);
    first[0] = 0;
    int s = 1;
    for (int u = 0; u < U && s < W; u++) {
        run += (double)(p->unit_train[u] + p->unit_frozen[u]);
        bool full = run >= total * s / W;
        bool must = U - (u + 1) == W - s;
        if (u + 1 > first[s - 1] && (full || must))
            first[s++] = u + 1;
    }
    first[W] = U;
    /* GPipe chunks of the micro-batch's rows: k chunks of `rows` rows, the last smaller */
    int B = r->batch_size * (r->pref ? 2 : 1); /* DPO, ORPO: chosen + rejected rows */
    int k = chunks > 1 ? (chunks < B ? chunks : B) : 1;
    int rows = (B + k - 1) / k;
    k = (B + rows - 1) / rows;
    size_t T = (size_t)r->seq_len;
    for (int rank = 0; rank < W; rank++) {
        stage_span span = {first[rank], first[rank + 1] - 1};
        size_t nt = 0, nf = 0, qb = 0, qwin = 0, qabs = 0;
        for (int u = span.first; u <= span.last; u++) {
            nt += p->unit_train[u];
            nf += p->unit_frozen[u];
            qb += p->unit_quant_bytes[u];
            if (p->unit_quantized[u] > qwin)
                qwin = p->unit_quantized[u];
            if (p->unit_absmax[u] > qabs)
                qabs = p->unit_absmax[u];
        }
        size_t *b = r->pipe_bytes[rank];
        b[FT_MEM_WEIGHTS] = 4 * (nt + nf) + qb;
        b[FT_MEM_GRADS] = 4 * nt;
        b[FT_MEM_OPTIM] = 8 * nt;
        if (mc->tie_word_embeddings && W > 1 && rank == W - 1 && span.first > 0) {
            b[FT_MEM_WEIGHTS] += 4 * (p->unit_train[0] + p->unit_frozen[0]);
            b[FT_MEM_GRADS] += 4 * p->unit_train[0];
        }
        b[FT_MEM_ACTIVATIONS] = b[FT_MEM_WORKSPACE] = 0;
        for (int c = 0; c < k; c++) {
            size_t n = (size_t)(c + 1 < k ? rows : B - c * rows) * T;
            act_counts act, ws;
            count_activations(mc, n, sp, span, &act, &ws);
            b[FT_MEM_ACTIVATIONS] += act_bytes(&act, 4);
            if (act_bytes(&ws, 4) > b[FT_MEM_WORKSPACE])
                b[FT_MEM_WORKSPACE] = act_bytes(&ws, 4);
        }
        b[FT_MEM_WORKSPACE] += 4 * (qwin + qabs);
        if (mc->num_experts > 0 && mc->output_router_logits) /* aux counts, psum, dp */
            b[FT_MEM_WORKSPACE] += 3 * 4 * (size_t)mc->num_experts;
        if (r->pref_ref_stage) { /* DPO's starting values: the stage's part, kept */
            size_t kept = 4 * nt;
            if (r->pref_ref_outer) /* (only the embedding's and the head's units) */
                kept = 4 * ((span.first == 0 ? p->unit_train[0] : 0) +
                            (span.last == U - 1 ? p->unit_train[U - 1] : 0));
            if (mc->tie_word_embeddings && W > 1 && rank == W - 1 && span.first > 0)
                kept += 4 * p->unit_train[0];
            b[FT_MEM_WEIGHTS] += kept;
            b[FT_MEM_WORKSPACE] += kept;
        }
    }
    r->pipe_stages = W;
}

/* The cpu row of what dist.strategy (and dist.zero_stage) pick, as lib/run/trainer.c maps
 * them onto the engine's strategies; -1 for model_parallel on more ranks than units. */
static int selected_cpu_row(const ft_dist_section *d, int world_size, bool pipe_ok)
{
    switch (d->strategy) {
    case FT_CFG_STRATEGY_AUTO: return world_size > 1 ? FT_PLAN_CPU_DDP : FT_PLAN_CPU;
    case FT_CFG_STRATEGY_NONE: return FT_PLAN_CPU;
    case FT_CFG_STRATEGY_DDP: return FT_PLAN_CPU_DDP;
    case FT_CFG_STRATEGY_FSDP: return FT_PLAN_CPU_FSDP;
    case FT_CFG_STRATEGY_MODEL_PARALLEL: return pipe_ok ? FT_PLAN_CPU_MP : -1;
    default: { /* zero, zero1-3 */
        int st = ft_run_config_zero_stage(d);
        return st >= 3 ? FT_PLAN_CPU_ZERO3 : st == 2 ? FT_PLAN_CPU_ZERO2
                                          : st == 1 ? FT_PLAN_CPU_ZERO1
                                                    : FT_PLAN_CPU_DDP;
    }
    }
}

int ft_memplan_cpu_row_of(const char *strategy)
{
    static const char *const names[] = {"none",  "ddp",  "zero1",         "zero2",
                                        "zero3", "fsdp", "model_parallel"};
    for (int i = 0; i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(strategy, names[i]))
            return FT_PLAN_CPU + i;
    return -1;
}

/* Rank r's part of n elements split over W ranks as lib/dist/dist_dp.c balances them:
 * [n*r/W, n*(r+1)/W); shard_at: its first element. */
static size_t shard_at(size_t n, int W, int r)
{
    return (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)W);
}

static size_t shard_of(size_t n, int W, int r) { return shard_at(n, W, r + 1) - shard_at(n, W, r); }

/* Elements of [a, b) in [c, d). */
static size_t overlap(size_t a, size_t b, size_t c, size_t d)
{
    size_t lo = a > c ? a : c, hi = b < d ? b : d;
    return hi > lo ? hi - lo : 0;
}

/* DPO's kept embedding / head of a fresh adapter (pref_ref_outer) in rank r's zero3 shard
 * of the n_trainable: its part of the first unit's trainables and of the last one's. */
static size_t outer_in_shard(const ft_memplan_result *r, int W, int rank)
{
    size_t n = r->n_trainable, a = shard_at(n, W, rank), b = shard_at(n, W, rank + 1);
    return overlap(a, b, 0, r->pref_outer[0]) + overlap(a, b, n - r->pref_outer[1], n);
}

size_t ft_memplan_cpu_rank(const ft_memplan_result *r, ft_plan_row_id row, int rank,
                           size_t bytes[FT_MEM_NCAT], size_t *host)
{
    int W = row == FT_PLAN_CPU ? 1 : row == FT_PLAN_CPU_MP ? r->pipe_stages : r->world_size;
    if (row < FT_PLAN_CPU || row > FT_PLAN_CPU_MP || rank < 0 || rank >= W)
        return 0;
    if (row == FT_PLAN_CPU_MP) {
        size_t total = 0;
        for (int c = 0; c < FT_MEM_NCAT; c++)
            total += bytes[c] = r->pipe_bytes[rank][c];
        if (host)
            *host = 0; /* the engine refuses offload with model_parallel */
        return total;
    }
    /* a quantized base lives outside the flat frozen buffer, whole on every rank but
     * under zero3 / fsdp (this rank's blocks, the maps, and one unit whole at load), with
     * one unit's dequantization window and its absmax temporary */
    size_t Pt = r->n_trainable, Pf = r->n_frozen - r->n_quantized;
    size_t st = shard_of(Pt, W, rank), sf = shard_of(Pf, W, rank);
    size_t U = r->max_unit_trainable, F = r->max_unit_frozen;
    bool zero = row >= FT_PLAN_CPU_ZERO1, z3 = row >= FT_PLAN_CPU_ZERO3;
    bool windows = row == FT_PLAN_CPU_ZERO2 || z3; /* no whole gradient: unit windows */
    size_t own = zero ? st : Pt;                   /* what this rank's optimizer updates */
    bool off_p = z3 && r->offload_params;
    size_t qs = z3 ? qshard_rank_bytes(r, rank, W) : 0;
    size_t quant = z3 ? (off_p ? 0 : qs) + r->q_replicated + r->max_unit_quant_bytes
                      : r->quant_bytes;
    bytes[FT_MEM_WEIGHTS] = 4 * (z3 ? st + (off_p ? 0 : sf) : Pt + Pf) + quant;
    bytes[FT_MEM_GRADS] = 4 * ((windows ? 0 : Pt) + (zero ? st : 0));
    bytes[FT_MEM_OPTIM] = r->offload ? 0 : 8 * own;
    bytes[FT_MEM_ACTIVATIONS] = r->cpu_activations;
    bytes[FT_MEM_WORKSPACE] = r->cpu_workspace + 4 * (r->max_unit_quantized + r->max_quant_absmax);
    if (windows) /* two gradient windows, each with its reduce-scatter landing buffer */
        bytes[FT_MEM_WORKSPACE] += 4 * 4 * U;
    if (z3) /* parameter windows: the unit computing, the next one, a tied embedding */
        bytes[FT_MEM_WORKSPACE] +=
            (size_t)(2 + (r->tied ? 1 : 0)) * (4 * (U + F) + r->max_unit_qwin);
    /* offload: AdamW m and v, the fp32 master and the gradient of the shard; the frozen
     * base's shard */
    if (host)
        *host = (r->offload ? 16 * own : 0) + (off_p ? 4 * sf + qs : 0);
    /* DPO's reference: the same on every rank, but a kept adapter's shard under zero3 */
    size_t kept_z3 = r->pref_ref_outer ? outer_in_shard(r, W, rank) : st;
    for (int c = 0; c < FT_MEM_NCAT; c++)
        bytes[c] += r->pref_ref_adapter && z3 && r->pref_ref[c] ? 4 * kept_z3 : r->pref_ref[c];
    size_t total = 0;
    for (int c = 0; c < FT_MEM_NCAT; c++)
        total += bytes[c];
    return total;
}

/* The gpu row of dist.strategy (zero1-zero3 or zero with dist.zero_stage); model_parallel
 * has no prediction of its own: gpu-1, the whole model, bounds each stage. */
static ft_plan_row_id selected_row(const ft_dist_section *d, int world_size)
{
    switch (d->strategy) {
    case FT_CFG_STRATEGY_NONE:
    case FT_CFG_STRATEGY_MODEL_PARALLEL: return FT_PLAN_GPU_1;
    case FT_CFG_STRATEGY_AUTO: return world_size > 1 ? FT_PLAN_GPU_DDP : FT_PLAN_GPU_1;
    case FT_CFG_STRATEGY_DDP: return FT_PLAN_GPU_DDP;
    case FT_CFG_STRATEGY_FSDP: return FT_PLAN_GPU_FSDP;
    default: { /* zero, zero1-3 */
        int st = ft_run_config_zero_stage(d);
        return st >= 3   ? FT_PLAN_GPU_ZERO3
               : st == 2 ? FT_PLAN_GPU_ZERO2
               : st == 1 ? FT_PLAN_GPU_ZERO1
                         : FT_PLAN_GPU_DDP;
    }
    }
}

int ft_memplan(const ft_run_config *cfg, const ft_model_config *mc, int world_size,
               ft_memplan_result *out, ft_err *err)
{
    bool batch_auto = cfg->train.batch_size == FT_CFG_AUTO;
    int rc = ft_memplan_batch(cfg, mc, world_size, batch_auto ? 1 : (int)cfg->train.batch_size,
                              out, err);
    out->batch_auto = batch_auto;
    return rc;
}

int ft_memplan_batch(const ft_run_config *cfg, const ft_model_config *mc, int world_size,
                     int batch_size, ft_memplan_result *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (world_size < 1)
        return ft_fail(err, "memory plan: world size must be >= 1 (got %d)", world_size);
    ft_memplan_result *r = out;
    snprintf(r->mode, sizeof r->mode, "%s", ft_tuning_mode_name(cfg->tuning.mode));
    snprintf(r->model_type, sizeof r->model_type, "%s", mc->model_type);
    r->num_layers = mc->num_layers;
    r->world_size = world_size;
    r->batch_size = batch_size;
    r->seq_len = (int)cfg->model.max_seq_len;
    r->grad_ckpt = cfg->train.gradient_checkpointing;
    r->half = cfg->train.bf16 || cfg->train.fp16;
    if (r->batch_size < 1 || r->seq_len < 1)
        return ft_fail(err, "memory plan: train.batch_size and model.max_seq_len must be >= 1");

    int pmode = cfg->tuning.mode == FT_TUNING_FULL    ? MODE_FULL
                : cfg->tuning.mode == FT_TUNING_QLORA ? MODE_QLORA
                                                      : MODE_LORA;
    bool lora = pmode != MODE_FULL;
    ft_quant_options quant = {FT_QUANT_NONE, 64, false};
    const char *quant_skip = "";
    if (mc->quant.present) { /* the checkpoint's own quantization_config */
        quant = mc->quant.opt;
        quant_skip = mc->quant.skip;
    } else if (pmode == MODE_QLORA) {
        quant = ft_quant_options_of(&cfg->tuning);
        quant_skip = cfg->tuning.quant.skip_modules;
    }
    if (quant.type != FT_QUANT_NONE)
        snprintf(r->quant, sizeof r->quant, "%s%s", ft_quant_name(quant.type),
                 quant.double_quant && quant.type != FT_QUANT_INT8 ? "+dq" : "");

    /* LoRA as the trainer sets it up (lib/run/trainer.c setup_model, lib/model/model.c setup_lora) */
    ft_lora_config lc = {0};
    ft_model_config untied; /* the model an adapter's untied copies make (below) */
    unsigned *mask = calloc((size_t)mc->num_layers ? (size_t)mc->num_layers : 1, sizeof *mask);
    unsigned lora_union = 0;
    if (!mask)
        return ft_fail(err, "out of memory");
    if (lora) {
        lc.r = (int)cfg->tuning.lora.r;
        lc.alpha = (float)cfg->tuning.lora.alpha;
        lc.rslora = cfg->tuning.lora.rslora;
        lc.dropout = (float)cfg->tuning.lora.dropout;
        lc.dora = cfg->tuning.lora.use_dora;
        if (lc.r <= 0 || lc.dropout < 0 || lc.dropout >= 1) {
            free(mask);
            return ft_fail(err, "config: tuning.lora.r must be > 0 and tuning.lora.dropout in "
                                "[0, 1) (got %d, %g)",
                           lc.r, lc.dropout);
        }
        if (ft_lora_targets_parse(cfg->tuning.lora.target_modules, &lc.targets, err)) {
            free(mask);
            return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
        }
        if (ft_lora_target_parameters_parse(cfg->tuning.lora.target_parameters, &lc, err)) {
            free(mask);
            return ft_fail_prefix(err, "config: key 'tuning.lora.target_parameters'");
        }
        if (ft_lora_patterns_parse(cfg->tuning.lora.rank_pattern, true,
                                   "tuning.lora.rank_pattern", &lc.rank_pattern, err) ||
            ft_lora_patterns_parse(cfg->tuning.lora.alpha_pattern, false,
                                   "tuning.lora.alpha_pattern", &lc.alpha_pattern, err)) {
            free(mask);
            return ft_fail_prefix(err, "config");
        }
        /* (qwen2_moe: PEFT keeps its MLP names on its linear layers; model.c refuses the
         * router's and the experts' names there) */
        if (ft_lora_resolve_moe(&lc, mc->num_experts > 0 && !mc->moe_lora_plain, err)) {
            free(mask);
            return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
        }
        for (int l = 0; l < mc->num_layers; l++) {
            if (ft_lora_layer_mask(&lc, l, &mask[l], err)) {
                free(mask);
                return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
            }
            mask[l] &= ft_layer_lora_projections(mc, l);
            lora_union |= mask[l];
        }
        if (!lora_union && !(lc.targets & FT_LORA_OUTER) && !lc.target_params) {
            free(mask);
            return ft_fail(err, "config: tuning.lora.target_modules selects no linear layer of "
                                "this model");
        }
        if (ft_lora_modules_to_save_parse(cfg->tuning.lora.modules_to_save,
                                          &lc.modules_to_save, err)) {
            free(mask);
            return ft_fail_prefix(err, "config: key 'tuning.lora.modules_to_save'");
        }
        /* tokens added (model.add_special_tokens) train the embedding and the head in
         * full unless chosen otherwise (run_tokens.c; not from an init_adapter) */
        if (cfg->model.add_special_tokens[0] && strcmp(cfg->model.add_special_tokens, "[]") &&
            !cfg->tuning.lora.init_adapter[0])
            lc.modules_to_save = ft_added_tokens_saved_modules(&lc, mc->tie_word_embeddings);
        /* (tied: the pairs are each module's own, over the one embedding, as model.c has
         * them; beside modules_to_save refused there) */
        if ((lc.targets & FT_LORA_OUTER) && mc->tie_word_embeddings && lc.modules_to_save) {
            free(mask);
            return ft_fail(err, "config: key 'tuning.lora.target_modules': LoRA on embed_tokens "
                                "or lm_head beside modules_to_save on a model with tied word "
                                "embeddings is not supported");
        }
        /* tied, ensure_weight_tying true: the embedding's pair and the head's (its
         * transpose), whichever was named (lib/model/model.c lora_layers) */
        if (mc->tie_word_embeddings && (lc.targets & FT_LORA_OUTER) &&
            cfg->tuning.lora.ensure_weight_tying == FT_CFG_TYING_TRUE)
            lc.targets |= FT_LORA_OUTER;
        /* tied, ensure_weight_tying false: a copy of each listed module, the model
         * untied (lib/model/model.c untie_head) */
        if (mc->tie_word_embeddings && lc.modules_to_save &&
            cfg->tuning.lora.ensure_weight_tying == FT_CFG_TYING_FALSE) {
            untied = *mc;
            untied.tie_word_embeddings = false;
            mc = &untied;
        }
        /* tied: one copy, the embedding, shared by the head (lib/model/model.c) */
        lc.modules_to_save = ft_lora_saved_modules(&lc, mc->tie_word_embeddings);
    }
    /* each pair's rank (rank_pattern; the model's table: lib/model/lora_ranks.c) */
    ft_lora_ranks rk = {0};
    bool tied_pair = mc->tie_word_embeddings && (lc.targets & FT_LORA_OUTER) &&
                     cfg->tuning.lora.ensure_weight_tying == FT_CFG_TYING_TRUE;
    if (lora && ft_lora_ranks_init(&rk, mc, &lc, mask, tied_pair, err)) {
        free(mask);
        return ft_fail_prefix(err, "config");
    }

    size_t n_units = (size_t)mc->num_layers + 2;
    size_t *unit_buf = calloc(7 * n_units, sizeof *unit_buf);
    if (!unit_buf) {
        free(mask);
        ft_lora_ranks_free(&rk);
        return ft_fail(err, "out of memory");
    }
    planner p = {.mc = mc,
                 .mode = pmode,
                 .h = r->half ? 2 : 4,
                 .k = r->half ? 12 : 8,
                 .N = (size_t)world_size,
                 .r = r,
                 .unit_train = unit_buf,
                 .unit_frozen_bytes = unit_buf + n_units,
                 .unit_frozen = unit_buf + 2 * n_units,
                 .quant = quant,
                 .quant_skip = quant_skip,
                 .unit_quantized = unit_buf + 3 * n_units,
                 .unit_quant_bytes = unit_buf + 4 * n_units,
                 .unit_absmax = unit_buf + 5 * n_units,
                 .unit_qwin = unit_buf + 6 * n_units,
                 .rk = &rk};
    r->quant_opt = quant;

    static const char *names[FT_PLAN_NROWS] = {
        "cpu-fp32",  "cpu-ddp",   "cpu-zero1", "cpu-zero2", "cpu-zero3",
        "cpu-fsdp",  "cpu-mp",    "gpu-1",     "gpu-ddp",   "gpu-zero1",
        "gpu-zero2", "gpu-zero3", "gpu-fsdp"};
    for (int i = 0; i < FT_PLAN_NROWS; i++) {
        r->rows[i].name = names[i];
        r->rows[i].predicted = i >= FT_PLAN_GPU_1;
        r->rows[i].world_size = i == FT_PLAN_CPU || i == FT_PLAN_GPU_1 ? 1 : world_size;
    }
    p.lora_params = lora ? lc.target_params : 0;
    count_params(&p, mask, lc.modules_to_save, lc.dora, lc.targets & FT_LORA_OUTER);
    if (p.qshape_overflow) {
        free(unit_buf);
        free(mask);
        ft_lora_ranks_free(&rk);
        return ft_fail(err, "memory plan: the quantized base has more than %d distinct weight "
                            "shapes, which the planner does not lay out",
                       FT_PLAN_MAX_QSHAPES);
    }
    r->tied = mc->tie_word_embeddings;
    r->offload = cfg->dist.offload_optimizer == FT_CFG_OFFLOAD_CPU;
    r->offload_params = cfg->dist.offload_params == FT_CFG_OFFLOAD_CPU;
    for (size_t u = 0; u < n_units; u++) {
        if (p.unit_train[u] > r->max_unit_trainable)
            r->max_unit_trainable = p.unit_train[u];
        if (p.unit_frozen[u] > r->max_unit_frozen)
            r->max_unit_frozen = p.unit_frozen[u];
    }

    /* FSDP: per unit flat parameters, each padded to a multiple of N */
    size_t N = p.N, h = p.h;
    size_t max_unit_g = 0, max_unit_pg = 0, frozen_fsdp = 0;
    for (size_t u = 0; u < n_units; u++) {
        size_t t = ceil_div(p.unit_train[u], N);
        ft_memplan_row *f = &r->rows[FT_PLAN_GPU_FSDP];
        frozen_fsdp += ceil_div(p.unit_frozen_bytes[u], N);
        f->bytes[FT_MEM_WEIGHTS] += 4 * t + ceil_div(p.unit_frozen_bytes[u], N);
        f->bytes[FT_MEM_GRADS] += 4 * t;
        f->bytes[FT_MEM_OPTIM] += 8 * t;
        size_t g = h * p.unit_train[u];
        size_t pg = 2 * (h * p.unit_train[u] + p.unit_frozen_bytes[u]) + g;
        if (g > max_unit_g)
            max_unit_g = g;
        if (pg > max_unit_pg)
            max_unit_pg = pg;
    }

    /* activations and backward scratch */
    act_counts act, ws;
    act_spec sp = {.grad_ckpt = r->grad_ckpt, .lora = lora, .lora_dropout = lora && lc.dropout > 0,
                   .dora = lora && lc.dora, .outer = lora ? lc.targets & FT_LORA_OUTER : 0,
                   .lora_union = lora_union, .rk = &rk,
                   .loss_chunk = ft_memplan_loss_chunk(&cfg->train)};
    r->pref = cfg->train.objective != FT_CFG_OBJECTIVE_SFT;
    size_t rows = (size_t)r->batch_size * (r->pref ? 2 : 1); /* DPO: chosen + rejected */
    count_activations(mc, rows * (size_t)r->seq_len, &sp, (stage_span){0, mc->num_layers + 1},
                      &act, &ws);
    for (int i = FT_PLAN_GPU_1; i < FT_PLAN_NROWS; i++) {
        r->rows[i].bytes[FT_MEM_ACTIVATIONS] = act_bytes(&act, h);
        r->rows[i].bytes[FT_MEM_WORKSPACE] = act_bytes(&ws, h);
    }
    /* a quantized base: one unit's weights dequantized at a time (model.c's window, of
     * the compute dtype) with an fp32 absmax temporary for a double-quantized weight */
    for (size_t u = 0; u < n_units; u++) {
        if (p.unit_quantized[u] > r->max_unit_quantized)
            r->max_unit_quantized = p.unit_quantized[u];
        if (p.unit_absmax[u] > r->max_quant_absmax)
            r->max_quant_absmax = p.unit_absmax[u];
        if (p.unit_quant_bytes[u] > r->max_unit_quant_bytes)
            r->max_unit_quant_bytes = p.unit_quant_bytes[u];
        if (p.unit_qwin[u] > r->max_unit_qwin)
            r->max_unit_qwin = p.unit_qwin[u];
    }
    for (int i = FT_PLAN_GPU_1; i < FT_PLAN_NROWS; i++)
        r->rows[i].bytes[FT_MEM_WORKSPACE] += h * r->max_unit_quantized + 4 * r->max_quant_absmax;
    r->cpu_activations = act_bytes(&act, 4);
    r->cpu_workspace = act_bytes(&ws, 4);
    if (cfg->train.objective == FT_CFG_OBJECTIVE_DPO) { /* DPO's reference (memplan.h) */
        size_t gpu_ref[FT_MEM_NCAT] = {0};
        /* (a fresh adapter with modules trained in full: their units' starting values) */
        r->pref_ref_outer = lora && !cfg->tuning.lora.init_adapter[0] && lc.modules_to_save;
        r->pref_outer[0] = p.unit_train[0];
        r->pref_outer[1] = p.unit_train[n_units - 1];
        size_t kept = r->pref_ref_outer ? r->pref_outer[0] + r->pref_outer[1] : r->n_trainable;
        r->pref_ref_stage = pmode == MODE_FULL || cfg->tuning.lora.init_adapter[0] ||
                            r->pref_ref_outer;
        if (pmode == MODE_FULL) {
            act_counts ract, rws;
            act_spec rsp = {.grad_ckpt = true, .loss_chunk = sp.loss_chunk};
            count_activations(mc, rows * (size_t)r->seq_len, &rsp,
                              (stage_span){0, mc->num_layers + 1}, &ract, &rws);
            r->pref_ref[FT_MEM_WEIGHTS] = 4 * (r->n_trainable + r->n_frozen);
            r->pref_ref[FT_MEM_ACTIVATIONS] = act_bytes(&ract, 4);
            gpu_ref[FT_MEM_WEIGHTS] = h * (r->n_trainable + r->n_frozen);
            gpu_ref[FT_MEM_ACTIVATIONS] = act_bytes(&ract, h);
        } else if (cfg->tuning.lora.init_adapter[0] || r->pref_ref_outer) {
            r->pref_ref[FT_MEM_WEIGHTS] = r->pref_ref[FT_MEM_WORKSPACE] = 4 * kept;
            gpu_ref[FT_MEM_WEIGHTS] = gpu_ref[FT_MEM_WORKSPACE] = h * kept;
            r->pref_ref_adapter = true;
        }
        /* zero3 / fsdp: the kept part of the largest shard (of the embedding's and the
         * head's units: the rank whose shard holds most of them) */
        size_t kept_shard = ceil_div(r->n_trainable, N);
        if (r->pref_ref_outer) {
            kept_shard = 0;
            for (int rank = 0; rank < (int)N; rank++) {
                size_t k = outer_in_shard(r, (int)N, rank);
                kept_shard = k > kept_shard ? k : kept_shard;
            }
        }
        for (int i = FT_PLAN_GPU_1; i < FT_PLAN_NROWS; i++) {
            bool shard = r->pref_ref_adapter &&
                         (i == FT_PLAN_GPU_ZERO3 || i == FT_PLAN_GPU_FSDP);
            for (int c = 0; c < FT_MEM_NCAT; c++) /* (zero3 / fsdp: the adapter's shard) */
                r->rows[i].bytes[c] += shard && gpu_ref[c] ? h * kept_shard : gpu_ref[c];
        }
    }
    if (mc->num_experts > 0 && mc->output_router_logits) { /* model.c: aux counts, psum, dp */
        r->cpu_workspace += 3 * 4 * (size_t)mc->num_experts;
        for (int i = FT_PLAN_GPU_1; i < FT_PLAN_NROWS; i++)
            r->rows[i].bytes[FT_MEM_WORKSPACE] += 3 * 4 * (size_t)mc->num_experts;
    }
    plan_pipeline(r, &p, &sp, (int)cfg->dist.pipeline_micro_batches);
    r->rows[FT_PLAN_GPU_ZERO2].bytes[FT_MEM_WORKSPACE] += max_unit_g;
    r->rows[FT_PLAN_GPU_ZERO3].bytes[FT_MEM_WORKSPACE] += max_unit_pg;
    r->rows[FT_PLAN_GPU_FSDP].bytes[FT_MEM_WORKSPACE] += max_unit_pg;
    /* offload (lib/dist/dist_engine.c): the optimizer's shard to the host, as AdamW m and
     * v, an fp32 master and a gradient copy (16 B per updated parameter: the optimizer
     * column holds k B of them, 8 under FSDP); the frozen shard of zero3 / fsdp too */
    for (int i = FT_PLAN_GPU_1; i < FT_PLAN_NROWS; i++) {
        ft_memplan_row *w = &r->rows[i];
        if (r->offload) {
            size_t per = i == FT_PLAN_GPU_FSDP ? 8 : p.k;
            w->host += w->bytes[FT_MEM_OPTIM] / per * 16;
            w->bytes[FT_MEM_OPTIM] = 0;
        }
        size_t frozen = i == FT_PLAN_GPU_ZERO3 ? p.frozen_z3
                        : i == FT_PLAN_GPU_FSDP ? frozen_fsdp
                                                : 0;
        if (r->offload_params && frozen) {
            w->bytes[FT_MEM_WEIGHTS] -= frozen;
            w->host += frozen;
        }
    }

    for (int i = FT_PLAN_GPU_1; i < FT_PLAN_NROWS; i++) {
        r->rows[i].total = 0;
        for (int c = 0; c < FT_MEM_NCAT; c++)
            r->rows[i].total += r->rows[i].bytes[c];
    }
    /* the cpu rows: the rank with the largest total (the first of equals) */
    for (int i = FT_PLAN_CPU; i <= FT_PLAN_CPU_MP; i++) {
        ft_memplan_row *w = &r->rows[i];
        for (int rank = 0; rank < (i == FT_PLAN_CPU_MP ? r->pipe_stages : w->world_size); rank++) {
            size_t b[FT_MEM_NCAT], host;
            size_t total = ft_memplan_cpu_rank(r, (ft_plan_row_id)i, rank, b, &host);
            if (rank == 0 || total > w->total) {
                memcpy(w->bytes, b, sizeof b);
                w->total = total;
                w->host = host;
                w->rank = rank;
            }
        }
    }
    r->selected = selected_row(&cfg->dist, world_size);
    r->selected_cpu = selected_cpu_row(&cfg->dist, world_size, r->pipe_stages > 0);
    free(unit_buf);
    free(mask);
    ft_lora_ranks_free(&rk);
    return 0;
}

int ft_memplan_config(const ft_run_config *cfg, int world_size, ft_memplan_result *out,
                      ft_err *err)
{
    if (!cfg->model.name[0])
        return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
    char dir[4096], path[4200];
    if (ft_resolve_model_dir(cfg->model.name, dir, sizeof dir, err))
        return -1;
    snprintf(path, sizeof path, "%s/config.json", dir);
    ft_model_config mc;
    if (ft_model_config_load(&mc, path, err))
        return -1;
    /* tokens added, or an init_adapter's: the vocabulary the run grows the model to */
    int64_t V;
    if (ft_run_model_vocab(cfg->model.tokenizer[0] ? cfg->model.tokenizer : dir,
                           cfg->model.add_special_tokens, cfg->model.resize_to_multiple_of,
                           cfg->tuning.mode != FT_TUNING_FULL ? cfg->tuning.lora.init_adapter
                                                             : NULL,
                           mc.vocab_size, &V, err))
        return ft_fail_prefix(err, "the tokenizer with model.add_special_tokens");
    mc.vocab_size = (int)V;
    return ft_memplan(cfg, &mc, world_size, out, err);
}

size_t ft_memplan_gpu_reserve(size_t planned, int world_size)
{
    return FT_PLAN_CUDA_CONTEXT + FT_PLAN_CUBLAS_WORKSPACE +
           (world_size > 1 ? FT_PLAN_NCCL_BUFFERS : 0) + planned / 20;
}

/* cpu-fp32 always; the other cpu rows at several ranks or when selected. */
static bool row_shown(const ft_memplan_result *r, int i)
{
    if (i == FT_PLAN_CPU_MP && !r->pipe_stages)
        return false;
    return i == FT_PLAN_CPU || i >= FT_PLAN_GPU_1 || r->world_size > 1 || i == r->selected_cpu;
}

static void print_row(const ft_memplan_row *w, const char *name, const char *kind, FILE *out)
{
    fprintf(out, "%-11s %5d", name, w->world_size);
    for (int c = 0; c < FT_MEM_NCAT; c++)
        fprintf(out, " %11.1f", ft_mib(w->bytes[c]));
    fprintf(out, " %11.1f  %s\n", ft_mib(w->total), kind);
}

void ft_memplan_print_with(const ft_memplan_result *r, const ft_memplan_row *extra, FILE *out)
{
    char base[64] = "";
    if (r->quant[0])
        snprintf(base, sizeof base, " (%zu in %s)", r->n_quantized, r->quant);
    fprintf(out,
            "memory plan: %s, %s %d layers, %zu trainable + %zu frozen%s parameters, "
            "%d x %d tokens per rank%s, gradient checkpointing %s\n",
            r->mode, r->model_type, r->num_layers, r->n_trainable, r->n_frozen, base, r->batch_size,
            r->seq_len, r->batch_auto ? " (batch_size auto: planned for 1)" : "",
            r->grad_ckpt ? "on" : "off");
    fprintf(out, "%-11s %5s %11s %11s %11s %11s %11s %11s  %s\n", "strategy", "ranks",
            "weights", "gradients", "optimizer", "activations", "workspace", "total", "MiB/rank");
    size_t host = 0;
    for (int i = 0; i < FT_PLAN_NROWS; i++) {
        const ft_memplan_row *w = &r->rows[i];
        if (!row_shown(r, i))
            continue;
        bool sel = i == (int)r->selected || i == r->selected_cpu;
        char name[16], kind[40];
        snprintf(name, sizeof name, "%s%s", w->name, sel ? "*" : "");
        if (w->predicted)
            snprintf(kind, sizeof kind, "predicted, %s", r->half ? "16-bit" : "fp32");
        else if (w->world_size > 1)
            snprintf(kind, sizeof kind, "exact, largest rank (%d)", w->rank);
        else
            snprintf(kind, sizeof kind, "exact");
        print_row(w, name, kind, out);
        if (i == r->selected_cpu)
            host = w->host;
        if (extra && i == (r->selected_cpu >= 0 ? r->selected_cpu : FT_PLAN_CPU))
            print_row(extra, extra->name, "measured, largest rank, one step", out);
    }
    fprintf(out,
            "cpu-* are the CPU engine (fp32 on CPU ranks: what the allocator measures); "
            "gpu-* are the ZeRO paper's formulas at 16 bits, without CUDA context and "
            "library workspaces; * = the rows dist.strategy selects.\n");
    const ft_memplan_row *g = &r->rows[r->selected];
    const char *what = r->offload && r->offload_params ? "dist.offload_optimizer and "
                                                         "dist.offload_params cpu"
                       : r->offload ? "dist.offload_optimizer cpu"
                                    : "dist.offload_params cpu";
    if (host)
        fprintf(out, "%s: %.1f MiB per rank in host memory on top of the table (cpu rows)\n",
                what, ft_mib(host));
    if (g->host)
        fprintf(out, "%s: %.1f MiB per rank in host memory on top of %s's %.1f MiB\n", what,
                ft_mib(g->host), g->name, ft_mib(g->total));
    size_t reserve = ft_memplan_gpu_reserve(g->total, g->world_size);
    size_t need = g->total + reserve;
    fprintf(out,
            "%s on a 24 GB GPU (%.0f MiB): %.1f MiB planned + %.1f MiB reserve (CUDA context "
            "%.0f, cuBLAS/cuBLASLt workspaces %.0f, NCCL buffers %.0f, allocator slack 5%%) = "
            "%.1f MiB: %s %.1f MiB\n",
            g->name, ft_mib(FT_PLAN_GPU_24GB), ft_mib(g->total), ft_mib(reserve),
            ft_mib(FT_PLAN_CUDA_CONTEXT), ft_mib(FT_PLAN_CUBLAS_WORKSPACE),
            ft_mib(g->world_size > 1 ? FT_PLAN_NCCL_BUFFERS : 0), ft_mib(need),
            need <= FT_PLAN_GPU_24GB ? "fits, margin" : "does not fit, short by",
            ft_mib(need <= FT_PLAN_GPU_24GB ? FT_PLAN_GPU_24GB - need : need - FT_PLAN_GPU_24GB));
    if (row_shown(r, FT_PLAN_CPU_MP))
        fprintf(out, "cpu-mp = model_parallel: %d stages split by parameter count%s.\n",
                r->pipe_stages,
                r->pipe_stages > 1 ? ", the largest shown" : "");
    if (r->selected_cpu < 0)
        fprintf(out, "model_parallel on %d ranks: more ranks than units (embeddings, %d layers, "
                     "head), which the engine refuses\n",
                r->world_size, r->num_layers);
    if (r->note[0])
        fprintf(out, "note: %s\n", r->note);
}

void ft_memplan_print(const ft_memplan_result *r, FILE *out)
{
    ft_memplan_print_with(r, NULL, out);
}

int ft_memplan_compare_modes(const ft_run_config *cfg, int world_size, FILE *out, ft_err *err)
{
    static const ft_tuning_mode modes[] = {FT_TUNING_FULL, FT_TUNING_LORA, FT_TUNING_QLORA};
    ft_memplan_result r[3];
    ft_run_config *variant = malloc(sizeof *variant);
    if (!variant)
        return ft_fail(err, "out of memory");
    *variant = *cfg;
    int rc = 0;
    for (int i = 0; i < 3 && rc == 0; i++) {
        variant->tuning.mode = modes[i];
        rc = ft_memplan_config(variant, world_size, &r[i], err);
    }
    free(variant);
    if (rc)
        return -1;
    int cpu0 = r[0].selected_cpu >= 0 ? r[0].selected_cpu : FT_PLAN_CPU;
    fprintf(out, "by tuning mode (this model, batch and strategy; MiB per rank):\n");
    fprintf(out, "%-6s %12s %12s %12s %12s  %s\n", "mode", "trainable", "base",
            r[0].rows[cpu0].name, r[0].rows[r[0].selected].name, "quantized base");
    for (int i = 0; i < 3; i++) {
        char q[64] = "-";
        if (r[i].n_quantized)
            snprintf(q, sizeof q, "%s, %.3f B/param", r[i].quant,
                     (double)r[i].quant_bytes / (double)r[i].n_quantized);
        int cpu = r[i].selected_cpu >= 0 ? r[i].selected_cpu : FT_PLAN_CPU;
        /* (two decimals: on a small model the modes differ by less than 0.1 MiB) */
        fprintf(out, "%-6s %12zu %12zu %12.2f %12.2f  %s%s\n", r[i].mode, r[i].n_trainable,
                r[i].n_frozen, ft_mib(r[i].rows[cpu].total),
                ft_mib(r[i].rows[r[i].selected].total), q,
                modes[i] == FT_TUNING_FULL && r[i].n_quantized
                    ? " (full mode cannot train a quantized checkpoint)"
                    : "");
    }
    return 0;
}
