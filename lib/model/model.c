/* ft_model: parameter layout, weight loading, activation buffers, accessors.
 * Forward and backward are in model_pass.c; PEFT adapters in adapter.c. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "formats/quant_io.h"
#include "core/rng.h"
#include "formats/safetensors.h"
#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"
#endif

typedef struct layout {
    ft_model *m;
    size_t cap;
} layout;

static int add_param(layout *lo, int unit, bool trainable, bool is_lora, float **data,
                     float **grad, int ndim, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 10, 11)));

static int add_param(layout *lo, int unit, bool trainable, bool is_lora, float **data,
                     float **grad, int ndim, int64_t d0, int64_t d1, const char *fmt, ...)
{
    ft_model *m = lo->m;
    if (m->n_params == lo->cap) {
        size_t cap = lo->cap ? 2 * lo->cap : 64;
        ft_param *p = realloc(m->params, cap * sizeof *p);
        if (p)
            m->params = p;
        float ***sd = realloc(m->slot_data, cap * sizeof *sd);
        if (sd)
            m->slot_data = sd;
        float ***sg = realloc(m->slot_grad, cap * sizeof *sg);
        if (sg)
            m->slot_grad = sg;
        if (!p || !sd || !sg)
            return -1;
        lo->cap = cap;
    }
    ft_param *p = &m->params[m->n_params];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 0;
    p->numel = (size_t)d0 * (size_t)(ndim > 1 ? d1 : 1);
    p->unit = unit;
    p->is_lora = is_lora;
    p->trainable = trainable;
    m->slot_data[m->n_params] = data;
    m->slot_grad[m->n_params] = grad;
    m->n_params++;
    return 0;
}

/* Whether the base keeps layer l's projection p in 4 or 8 bits: a quantized base, and p's
 * module path matches no entry of the skip list. */
static bool quantized_weight(const ft_model *m, int l, ft_proj p)
{
    char path[160];
    snprintf(path, sizeof path, "model.layers.%d.%s", l, ft_layer_proj_path(&m->cfg, l, p));
    return m->quant.type != FT_QUANT_NONE && !ft_quant_skipped(m->quant_skip, path);
}

/* Branch norm n of layer l (when the block has it), named as the family names it. */
static int add_branch_norm(layout *lo, int l, ft_branch_norm n)
{
    ft_model *m = lo->m;
    layer_weights *w = &m->layers[l];
    if (!ft_has_branch_norm(&m->cfg, n))
        return 0;
    return add_param(lo, l + 1, m->opt.mode == FT_TRAIN_FULL, false, &w->norm[n],
                     &w->g_norm[n], 1, m->cfg.hidden_size, 0, "%smodel.layers.%d.%s.weight",
                     m->cfg.ckpt_prefix, l, m->cfg.norm_name[n]);
}

/* The norms between a layer's attention projections and its MLP: q_norm, k_norm, the
 * attention's post-norm, the MLP's pre-norm (where the block has them). */
static int add_mid_norms(layout *lo, int l)
{
    ft_model *m = lo->m;
    const ft_model_config *c = &m->cfg;
    layer_weights *w = &m->layers[l];
    bool full = m->opt.mode == FT_TRAIN_FULL;
    int rc = 0;
    if (c->qk_norm != FT_QK_NORM_NONE) {
        bool head = c->qk_norm == FT_QK_NORM_HEAD;
        int D = c->head_dim;
        rc |= add_param(lo, l + 1, full, false, &w->q_norm, &w->g_q_norm, 1,
                        head ? D : c->num_heads * D, 0,
                        "%smodel.layers.%d.self_attn.q_norm.weight", c->ckpt_prefix, l);
        rc |= add_param(lo, l + 1, full, false, &w->k_norm, &w->g_k_norm, 1,
                        head ? D : c->num_kv_heads * D, 0,
                        "%smodel.layers.%d.self_attn.k_norm.weight", c->ckpt_prefix, l);
    }
    rc |= add_branch_norm(lo, l, FT_NORM_ATTN_POST);
    rc |= add_branch_norm(lo, l, FT_NORM_MLP_PRE);
    return rc;
}

/* Whether QLoRA keeps expert e's weight h of layer l in 4 or 8 bits: quantized on load
 * from a dense checkpoint (the experts are most of a MoE's weights), unless the skip list
 * names it. A checkpoint quantized already keeps its experts dense: transformers 5 holds
 * them as fused 3-D parameters, which bitsandbytes does not quantize, so its files (and
 * ft-quantize's) have dense experts. The router stays dense, as in transformers. */
static bool quantized_expert(const ft_model *m, int l, int e, int h)
{
    char path[160];
    snprintf(path, sizeof path, "model.layers.%d.%s.experts.%d.%s", l, m->cfg.moe_name, e,
             m->cfg.expert_proj[h]);
    return m->quant.type != FT_QUANT_NONE && !m->quant_from_ckpt &&
           !ft_quant_skipped(m->quant_skip, path);
}

/* A MoE layer's router, then each expert's gate, up, down weights, named as the
 * checkpoint names them (model.layers.N.block_sparse_moe.gate.weight,
 * ....experts.E.w1.weight, w3, w2 for mixtral). Trainable in full mode only. */
static int add_moe(layout *lo, int l)
{
    ft_model *m = lo->m;
    const ft_model_config *c = &m->cfg;
    layer_weights *w = &m->layers[l];
    bool full = m->opt.mode == FT_TRAIN_FULL;
    int E = c->num_experts, C = c->hidden_size, I = c->intermediate_size;
    w->expert = calloc(3 * (size_t)E, sizeof *w->expert);
    w->g_expert = calloc(3 * (size_t)E, sizeof *w->g_expert);
    if (!w->expert || !w->g_expert)
        return -1;
    int rc = add_param(lo, l + 1, full, false, &w->router, &w->g_router, 2, E, C,
                       "%smodel.layers.%d.%s.gate.weight", c->ckpt_prefix, l, c->moe_name);
    for (int e = 0; e < E; e++)
        for (int h = 0; h < 3; h++) {
            rc |= add_param(lo, l + 1, full, false, &w->expert[3 * e + h],
                            &w->g_expert[3 * e + h], 2, h == 2 ? C : I, h == 2 ? I : C,
                            "%smodel.layers.%d.%s.experts.%d.%s.weight", c->ckpt_prefix, l,
                            c->moe_name, e, c->expert_proj[h]);
            if (rc == 0)
                m->params[m->n_params - 1].quantized = quantized_expert(m, l, e, h);
        }
    return rc;
}

/* Lists every parameter in unit order (see model.h). A layer: the attention's pre-norm,
 * q, k, v, o (with biases), q_norm, k_norm, the attention's post-norm, the MLP's pre-norm,
 * gate, up, down, the MLP's post-norm (each norm where the block has it), then LoRA. The
 * modules come in ft_proj order: a fused block (phi3) has o, down, qkv, then the norms,
 * gate_up. A sparse MoE layer: q, k, v, o, the norms, its plain MLP's gate, up, down
 * when it has one (qwen2_moe's shared expert) and its gate, the router, the experts
 * (add_moe); a MoE model's dense layer is a dense family's. Base
 * weights are named as the checkpoint names them (ckpt_prefix), LoRA weights as PEFT's
 * adapter keys (module_prefix). */
static int build_layout(layout *lo)
{
    ft_model *m = lo->m;
    const ft_model_config *c = &m->cfg;
    bool full = m->opt.mode == FT_TRAIN_FULL;
    bool lora = m->opt.mode == FT_TRAIN_LORA;
    int L = c->num_layers, C = c->hidden_size, V = c->vocab_size;
    int rc = 0;

    const char *cp = c->ckpt_prefix, *mp = c->module_prefix;
    unsigned saved = lora ? m->opt.lora.modules_to_save : 0;
    rc |= add_param(lo, 0, full || (saved & FT_SAVE_EMBED), false, &m->embed, &m->g_embed, 2,
                    V, C, "%smodel.embed_tokens.weight", cp);
    const ft_lora_ranks *rk = &m->lora_rk;
    int r = rk->embed.r;
    if (lora && (m->opt.lora.targets & FT_LORA_EMBED)) {
        rc |= add_param(lo, 0, true, true, &m->elora_a, &m->g_elora_a, 2, r, V,
                        "base_model.model.%sembed_tokens.lora_embedding_A", mp);
        rc |= add_param(lo, 0, true, true, &m->elora_b, &m->g_elora_b, 2, C, r,
                        "base_model.model.%sembed_tokens.lora_embedding_B", mp);
        if (m->opt.lora.dora) /* PEFT's DoraEmbeddingLayer: one magnitude per column */
            rc |= add_param(lo, 0, true, true, &m->elora_m, &m->g_elora_m, 1, C, 0,
                            "base_model.model.%sembed_tokens.lora_magnitude_vector", mp);
    }
    for (int l = 0; l < L; l++) {
        layer_weights *w = &m->layers[l];
        unsigned projs = ft_layer_projections(c, l);
        rc |= add_branch_norm(lo, l, FT_NORM_ATTN_PRE);
        for (int p = 0; p < FT_NPROJ; p++) {
            int in, out;
            if (!(projs & (1u << p)))
                continue;
            ft_layer_proj_dims(c, l, (ft_proj)p, &in, &out);
            const char *path = ft_layer_proj_path(c, l, (ft_proj)p);
            if (p == FT_PROJ_GATE || p == FT_PROJ_GATE_UP)
                rc |= add_mid_norms(lo, l);
            rc |= add_param(lo, l + 1, full, false, &w->w[p], &w->gw[p], 2, out, in,
                            "%smodel.layers.%d.%s.weight", cp, l, path);
            if (rc == 0)
                m->params[m->n_params - 1].quantized = quantized_weight(m, l, (ft_proj)p);
            if (proj_has_bias(c, (ft_proj)p))
                rc |= add_param(lo, l + 1, full, false, &w->b[p], &w->gb[p], 1, out, 0,
                                "%smodel.layers.%d.%s.bias", cp, l, path);
        }
        if (ft_layer_sparse(c, l))
            rc |= (projs & (1u << FT_PROJ_GATE) ? 0 : add_mid_norms(lo, l)) | add_moe(lo, l);
        rc |= add_branch_norm(lo, l, FT_NORM_MLP_POST);
        if (lora) {
            for (int p = 0; p < FT_NPROJ; p++) {
                if (!(m->lora_mask[l] & (1u << p)))
                    continue;
                int in, out;
                ft_layer_proj_dims(c, l, (ft_proj)p, &in, &out);
                const char *path = ft_layer_proj_path(c, l, (ft_proj)p);
                r = ft_lora_proj_pair(rk, l, p).r;
                rc |= add_param(lo, l + 1, true, true, &w->lora_a[p], &w->g_lora_a[p], 2, r, in,
                                "base_model.model.%slayers.%d.%s.lora_A.weight", mp, l, path);
                rc |= add_param(lo, l + 1, true, true, &w->lora_b[p], &w->g_lora_b[p], 2, out, r,
                                "base_model.model.%slayers.%d.%s.lora_B.weight", mp, l, path);
                if (m->opt.lora.dora)
                    rc |= add_param(lo, l + 1, true, true, &w->lora_m[p], &w->g_lora_m[p], 1,
                                    out, 0, "base_model.model.%slayers.%d.%s."
                                    "lora_magnitude_vector", mp, l, path);
            }
            /* PEFT's ParamWrapper on the router's weight (transformers 5: mlp.gate) */
            if (ft_layer_sparse(c, l) && (m->opt.lora.target_params & FT_LORA_PARAM_ROUTER)) {
                r = rk->router[l].r;
                rc |= add_param(lo, l + 1, true, true, &w->rlora_a, &w->g_rlora_a, 2, r, C,
                                "base_model.model.%slayers.%d.mlp.gate.lora_A.weight", mp, l);
                rc |= add_param(lo, l + 1, true, true, &w->rlora_b, &w->g_rlora_b, 2,
                                c->num_experts, r,
                                "base_model.model.%slayers.%d.mlp.gate.lora_B.weight", mp, l);
            }
            /* PEFT's ParamWrappers on the fused experts (lora.h's target_params) */
            for (int h = 0; h < 2 && ft_layer_sparse(c, l); h++) {
                unsigned bit = h == 0 ? FT_LORA_PARAM_GATE_UP : FT_LORA_PARAM_DOWN;
                if (!(m->opt.lora.target_params & bit))
                    continue;
                int64_t R = rk->experts[2 * l + h].r, E = c->num_experts;
                int64_t in = h == 0 ? C : c->intermediate_size;
                int64_t out = h == 0 ? 2 * (int64_t)c->intermediate_size : C;
                const char *nest = h == 0 && (m->opt.lora.target_params & FT_LORA_PARAM_DOWN)
                                       ? ".base_layer" : "";
                rc |= add_param(lo, l + 1, true, true, &w->xlora_a[h], &w->g_xlora_a[h], 2,
                                E * R, in, "base_model.model.%slayers.%d.mlp.experts%s."
                                "lora_A.weight", mp, l, nest);
                rc |= add_param(lo, l + 1, true, true, &w->xlora_b[h], &w->g_xlora_b[h], 2,
                                out, E * R, "base_model.model.%slayers.%d.mlp.experts%s."
                                "lora_B.weight", mp, l, nest);
            }
        }
    }
    rc |= add_param(lo, L + 1, full, false, &m->norm_f, &m->g_norm_f, 1, C, 0,
                    "%smodel.norm.weight", cp);
    if (!c->tie_word_embeddings)
        rc |= add_param(lo, L + 1, full || (saved & FT_SAVE_HEAD), false, &m->lm_head,
                        &m->g_lm_head, 2, V, C, "%slm_head.weight", cp);
    if (lora && (m->opt.lora.targets & FT_LORA_HEAD)) {
        r = rk->head.r;
        rc |= add_param(lo, L + 1, true, true, &m->hlora_a, &m->g_hlora_a, 2, r, C,
                        "base_model.model.lm_head.lora_A.weight");
        rc |= add_param(lo, L + 1, true, true, &m->hlora_b, &m->g_hlora_b, 2, V, r,
                        "base_model.model.lm_head.lora_B.weight");
        if (m->opt.lora.dora)
            rc |= add_param(lo, L + 1, true, true, &m->hlora_m, &m->g_hlora_m, 1, V, 0,
                            "base_model.model.lm_head.lora_magnitude_vector");
    }
    return rc;
}

static void bind_unit(ft_model *m, int unit, float *train, float *compute, float *grad,
                      float *frozen);

/* Lays the parameters out in the flat buffers (offsets and unit ranges); allocates and
 * binds the buffers unless the model is unbound. */
static int assign_buffers(ft_model *m, ft_err *err)
{
    int L = m->cfg.num_layers;
    m->unit_begin = calloc((size_t)L + 3, sizeof *m->unit_begin);
    m->frozen_begin = calloc((size_t)L + 3, sizeof *m->frozen_begin);
    if (!m->unit_begin || !m->frozen_begin)
        return ft_fail(err, "out of memory");
    size_t to = 0, fo = 0, qo = 0;
    int unit = 0;
    for (size_t i = 0; i < m->n_params; i++) {
        ft_param *p = &m->params[i];
        while (unit < p->unit) {
            m->unit_begin[++unit] = to;
            m->frozen_begin[unit] = fo;
            qo = 0;
        }
        if (p->quantized) {
            /* not in the flat buffers: a place in the dequantization window */
            p->offset = qo;
            qo += p->numel;
            if (qo > m->qwin_n)
                m->qwin_n = qo;
            continue;
        }
        p->offset = p->trainable ? to : fo;
        *(p->trainable ? &to : &fo) += p->numel;
    }
    while (unit < L + 2) {
        m->unit_begin[++unit] = to;
        m->frozen_begin[unit] = fo;
    }
    m->n_train = to;
    m->n_frozen = fo;
    m->qwin_unit = -1;
    if (m->qwin_n && (!(m->qt = calloc(m->n_params, sizeof *m->qt)) ||
                      !(m->qt_lent = calloc(m->n_params, sizeof *m->qt_lent))))
        return ft_fail(err, "out of memory");
    if (m->opt.unbound)
        return 0;
    if (m->n_train) {
        m->train_data = ft_alloc_on(&m->mem, m->dev, FT_MEM_WEIGHTS, m->n_train * sizeof(float));
        m->train_grad = ft_alloc_on(&m->mem, m->dev, FT_MEM_GRADS, m->n_train * sizeof(float));
        /* bf16 compute: the copy the ops read (fp32: the master itself) */
        m->train_compute = m->cdt == FT_F32 ? m->train_data
                                            : ft_alloc_on(&m->mem, m->dev, FT_MEM_WEIGHTS,
                                                          m->n_train * model_esize(m));
        if (!m->train_data || !m->train_grad || !m->train_compute)
            return ft_mem_fail(err, &m->mem, m->dev, "%zu trainable parameters", m->n_train);
    }
    if (m->n_frozen) {
        m->frozen_data = ft_alloc_on(&m->mem, m->dev, FT_MEM_WEIGHTS,
                                     m->n_frozen * model_esize(m));
        if (!m->frozen_data)
            return ft_mem_fail(err, &m->mem, m->dev, "%zu frozen parameters", m->n_frozen);
    }
    m->owns_buffers = true;
    for (int u = 0; u < ft_model_n_units(m); u++)
        bind_unit(m, u, m->train_data ? m->train_data + m->unit_begin[u] : NULL,
                  model_at(m, m->train_compute, m->unit_begin[u]),
                  m->train_grad ? m->train_grad + m->unit_begin[u] : NULL,
                  model_at(m, m->frozen_data, m->frozen_begin[u]));
    return 0;
}

/* Binds unit's parameters: train and grad fp32 (the master and its gradient), compute the
 * compute-dtype copy of train the ops read (= train in fp32), frozen of the compute dtype.
 * Each points at the unit's first element. */
static void bind_unit(ft_model *m, int unit, float *train, float *compute, float *grad,
                      float *frozen)
{
    size_t tb = m->unit_begin[unit], fb = m->frozen_begin[unit];
    for (size_t i = 0; i < m->n_params; i++) {
        ft_param *p = &m->params[i];
        if (p->unit != unit || p->quantized)
            continue;
        if (p->trainable) {
            p->data = train ? train + (p->offset - tb) : NULL;
            p->grad = grad ? grad + (p->offset - tb) : NULL;
            *m->slot_data[i] = model_at(m, compute, p->offset - tb);
        } else {
            p->data = model_at(m, frozen, p->offset - fb);
            p->grad = NULL;
            *m->slot_data[i] = p->data;
        }
        *m->slot_grad[i] = p->grad;
    }
    if (unit == 0 && m->cfg.tie_word_embeddings) {
        m->lm_head = m->embed;
        m->g_lm_head = m->g_embed;
    }
}

void ft_model_bind_unit(ft_model *m, int unit, ft_unit_bufs b)
{
    bind_unit(m, unit, b.master, b.compute ? b.compute : b.master, b.grad, b.frozen);
}

void ft_model_bind_all(ft_model *m, ft_unit_bufs whole)
{
    for (int u = 0; u < ft_model_n_units(m); u++) {
        size_t t = m->unit_begin[u], f = m->frozen_begin[u];
        ft_unit_bufs b = {whole.master ? whole.master + t : NULL,
                          model_at(m, whole.compute, t),
                          whole.grad ? whole.grad + t : NULL, model_at(m, whole.frozen, f)};
        ft_model_bind_unit(m, u, b);
    }
}

/* DoRA's magnitude with B = 0: the row norms of the base weight (PEFT's update_layer),
 * read as the model holds it (a quantized one dequantized). */
static int init_magnitude(ft_model *m, ft_param *p, ft_err *err)
{
    const char *pre = "base_model.model.", *suf = ".lora_magnitude_vector";
    char name[sizeof p->name + 32] = "?", emb[sizeof p->name];
    size_t len = strlen(p->name) - strlen(pre) - strlen(suf); /* the module's path */
    ft_param *w = NULL;
    if (ft_model_module_weight(&m->cfg, p->name + strlen(pre), len, name, sizeof name) == 0)
        w = ft_model_find_param(m, name);
    if (!w && strncmp(p->name + strlen(pre), "lm_head.", 8) == 0)
        w = model_outer_param(m, FT_LORA_HEAD, true); /* the tied head's: the embedding */
    /* the embedding's (PEFT's DoraEmbeddingLayer): the norms of its columns, A = 0 */
    ft_model_outer_key(&m->cfg, FT_LORA_EMBED, suf, emb, sizeof emb);
    bool cols = strcmp(p->name, emb) == 0;
    if (!w || w->shape[cols ? 1 : 0] != p->shape[0])
        return ft_fail(err, "DoRA magnitude '%s' has no base weight '%s'", p->name, name);
    float *vals = malloc((w->numel + (size_t)p->numel) * sizeof *vals);
    if (!vals)
        return ft_fail(err, "out of memory");
    float *mag = vals + w->numel;
    int rc;
    if (w->unit == p->unit) {
        rc = ft_model_param_get(m, w, vals, err);
    } else { /* the tied head's: the embedding, of a unit a strategy may not hold bound
              * here (read a unit at a time): the checkpoint's */
        ft_checkpoint *ck = NULL;
        const ft_st_tensor *t = NULL;
        rc = ft_ckpt_open(&ck, m->dir, "model", err);
        if (rc == 0 && !(t = ft_ckpt_find(ck, w->name)))
            rc = ft_fail(err, "%s: tensor '%s' is missing from the checkpoint", m->dir, w->name);
        if (rc == 0 &&
            (t->ndim != 2 || t->shape[0] != w->shape[0] || t->shape[1] != w->shape[1]))
            rc = ft_fail(err, "%s: tensor '%s' does not fit the DoRA magnitude '%s'", m->dir,
                         w->name, p->name);
        if (rc == 0)
            rc = ft_st_to_f32_finite(t, vals, w->numel, err);
        ft_ckpt_close(ck);
    }
    int64_t R = w->shape[0], C = w->shape[1];
    for (int64_t i = 0; i < (cols ? C : R) && rc == 0; i++) {
        double acc = 0.0;
        for (int64_t j = 0; j < (cols ? R : C); j++) {
            double x = vals[cols ? j * C + i : i * C + j];
            acc += x * x;
        }
        mag[i] = (float)sqrt(acc);
    }
    if (rc == 0)
        rc = ft_model_param_set(m, p, mag, err);
    free(vals);
    return rc;
}

/* PEFT's default LoRA init: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming-uniform with
 * a = sqrt(5)), B = 0 (already zero from the allocator); DoRA's magnitude ||W||_row. */
static int init_lora(ft_model *m, int unit, ft_err *err)
{
    for (size_t i = 0; i < m->n_params; i++) {
        ft_param *p = &m->params[i];
        if (!p->is_lora || (unit >= 0 && p->unit != unit))
            continue;
        if (strstr(p->name, ".lora_magnitude_vector")) {
            if (init_magnitude(m, p, err))
                return -1;
            continue;
        }
        /* on the GPU the values are made on the host, then copied */
        float *vals = m->dev == FT_DEV_CPU ? p->data : calloc(p->numel, sizeof *vals);
        if (!vals)
            return ft_fail(err, "out of memory");
        if (strstr(p->name, "lora_embedding_B")) {
            /* PEFT's Embedding: A = 0, B ~ N(0, 1) (Box-Muller on the seeded stream) */
            uint64_t seed = ft_mix64(m->opt.seed ^ ft_mix64(i + 1));
            for (size_t j = 0; j < p->numel; j++) {
                float u1 = ft_uniform(seed, 2 * j), u2 = ft_uniform(seed, 2 * j + 1);
                vals[j] = sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853f * u2);
            }
        } else if (!strstr(p->name, "lora_A")) {
            memset(vals, 0, p->numel * sizeof(float));
        } else {
            float bound = 1.0f / sqrtf((float)p->shape[1]);
            uint64_t seed = ft_mix64(m->opt.seed ^ ft_mix64(i + 1));
            for (size_t j = 0; j < p->numel; j++)
                vals[j] = (2.0f * ft_uniform(seed, j) - 1.0f) * bound;
        }
        if (vals != p->data) {
            int rc = ft_model_param_set(m, p, vals, err);
            free(vals);
            if (rc)
                return -1;
        }
    }
    return 0;
}

/* A tensor of a quantized weight's state (prefix.weight.absmax, .quant_map, .SCB, ...). */
static bool quant_state_tensor(ft_model *m, const char *name)
{
    static const char *const suffixes[] = {
        ".weight.absmax",      ".weight.quant_map", ".weight.nested_absmax",
        ".weight.nested_quant_map", ".weight.quant_state.bitsandbytes__nf4",
        ".weight.quant_state.bitsandbytes__fp4", ".SCB", ".weight.SCB", ".weight_format"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffixes / sizeof *suffixes; i++) {
        size_t k = strlen(suffixes[i]);
        if (n <= k || strcmp(name + n - k, suffixes[i]) != 0)
            continue;
        char w[200];
        snprintf(w, sizeof w, "%.*s.weight", (int)(n - k), name);
        ft_param *p = ft_model_find_param(m, w);
        return p && p->quantized;
    }
    return false;
}

/* Frees quantized param i's arrays and takes them off the count: the host's were counted
 * by read_quantized, a device's by the allocator. */
static void drop_qtensor(ft_model *m, size_t i)
{
    ft_qtensor *q = &m->qt[i];
    if (m->qt_lent[i]) { /* a strategy's arrays */
        memset(q, 0, sizeof *q);
        m->qt_lent[i] = false;
        return;
    }
    if (q->type != FT_QUANT_NONE && q->device == FT_DEV_CPU)
        ft_mem_account(&m->mem, FT_MEM_WEIGHTS, ft_qtensor_bytes(q), false);
    ft_qtensor_free_on(q, &m->mem);
}

/* Fills quantized param i from the checkpoint: read as it is, or quantized from the
 * dense tensor t, on the host; a GPU model then moves it to the device (the host keeps
 * no copy). */
static int read_quantized(ft_model *m, ft_checkpoint *ck, size_t i, const ft_st_tensor *t,
                          ft_err *err)
{
    ft_param *p = &m->params[i];
    ft_qtensor *q = &m->qt[i];
    drop_qtensor(m, i);
    m->qwin_unit = -1;
    int rc;
    if (m->quant_from_ckpt) {
        char prefix[160];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(p->name) - strlen(".weight")),
                 p->name);
        rc = ft_qtensor_read(ck, prefix, p->shape[0], p->shape[1], q, err);
    } else {
        float *dense = malloc(p->numel * sizeof *dense);
        if (!dense)
            return ft_fail(err, "out of memory quantizing '%s'", p->name);
        rc = ft_st_to_f32(t, dense, p->numel, err);
        if (rc == 0 && ft_quantize(dense, p->shape[0], p->shape[1], &m->quant, q, err))
            rc = ft_fail_prefix(err, "%s: quantizing '%s'", t->file, p->name);
        free(dense);
    }
    if (rc || m->dev == FT_DEV_CPU) {
        if (rc == 0)
            ft_mem_account(&m->mem, FT_MEM_WEIGHTS, ft_qtensor_bytes(q), true);
        return rc;
    }
    if (ft_qtensor_to_device(q, &m->mem, m->dev, err)) {
        ft_qtensor_free(q);
        return ft_fail_prefix(err, "'%s'", p->name);
    }
    return 0;
}

/* A multimodal gemma3's head under the top-level module's name, lm_head.weight, as
 * transformers 5 saves the untied head that merge_and_unload of PEFT's modules_to_save
 * leaves (it reads it and language_model.lm_head.weight alike). */
static bool multimodal_head_alias(const ft_model_config *cfg, const char *name)
{
    return cfg->multimodal && strcmp(name, "lm_head.weight") == 0;
}

bool ft_model_carried_tensor(const ft_model_config *cfg, const char *name)
{
    size_t n = strlen(cfg->ckpt_prefix);
    return cfg->multimodal && strncmp(name, cfg->ckpt_prefix, n) != 0 &&
           !multimodal_head_alias(cfg, name);
}

static bool ignorable_tensor(ft_model *m, const char *name)
{
    if (quant_state_tensor(m, name))
        return true;
    size_t n = strlen(name);
    const char *suffix = "rotary_emb.inv_freq";
    if (n >= strlen(suffix) && strcmp(name + n - strlen(suffix), suffix) == 0)
        return true;
    if (ft_model_carried_tensor(&m->cfg, name) || multimodal_head_alias(&m->cfg, name))
        return true; /* (an untied head's alias is read as the head) */
    const char *cp = m->cfg.ckpt_prefix;
    return m->cfg.tie_word_embeddings && strncmp(name, cp, strlen(cp)) == 0 &&
           strcmp(name + strlen(cp), "lm_head.weight") == 0;
}

/* A base weight of the vocabulary (embedding, untied head) of a resized model: its first
 * base_vocab rows from tensor t, the rest their mean (tokens added by the run: the new
 * rows' start; an adapter's grown vocabulary: until the adapter fills them). */
static bool resized_rows(const ft_model *m, const ft_param *p, const ft_st_tensor *t)
{
    return m->base_vocab && !p->quantized && p->ndim == 2 && t->ndim == 2 &&
           p->shape[0] == m->cfg.vocab_size && t->shape[0] == m->base_vocab &&
           t->shape[1] == p->shape[1];
}

static int read_resized_rows(ft_model *m, ft_param *p, const ft_st_tensor *t, ft_err *err)
{
    float *host = m->dev == FT_DEV_CPU ? p->data : malloc(p->numel * sizeof *host);
    if (!host)
        return ft_fail(err, "out of host memory reading '%s'", p->name);
    int rc = ft_st_to_f32_finite(t, host, t->numel, err);
    if (rc == 0)
        model_mean_rows(host, t->shape[0], p->shape[0], p->shape[1]);
    if (rc == 0 && host != p->data)
        rc = ft_model_param_set(m, p, host, err);
    if (host != p->data)
        free(host);
    return rc;
}

int model_read_weights(ft_model *m, const char *dir, int unit, ft_err *err)
{
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, dir, "model", err))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < m->n_params && rc == 0; i++) {
        ft_param *p = &m->params[i];
        if (p->is_lora || (unit >= 0 && p->unit != unit))
            continue;
        const ft_st_tensor *t = ft_ckpt_find(ck, p->name);
        if (m->head_untied && p->unit == m->cfg.num_layers + 1 && p->ndim == 2) {
            /* the untied head (untie_head): a copy of the tied checkpoint's embedding */
            char name[sizeof p->name + 32];
            snprintf(name, sizeof name, "%smodel.embed_tokens.weight", m->cfg.ckpt_prefix);
            t = ft_ckpt_find(ck, name);
        }
        if (!t && m->cfg.multimodal && model_vocab_bit(m, p) == FT_LORA_HEAD)
            t = ft_ckpt_find(ck, "lm_head.weight"); /* (multimodal_head_alias) */
        if (!t) {
            rc = ft_fail(err, "%s: tensor '%s' is missing from the checkpoint", dir, p->name);
            break;
        }
        if (p->quantized) {
            rc = read_quantized(m, ck, i, t, err);
            continue;
        }
        if (resized_rows(m, p, t)) {
            if (p->data)
                rc = read_resized_rows(m, p, t, err);
            continue;
        }
        bool shape_ok = t->ndim == p->ndim && t->shape[0] == p->shape[0] &&
                        (p->ndim < 2 || t->shape[1] == p->shape[1]);
        if (!shape_ok) {
            rc = ft_fail(err, "%s: tensor '%s' has shape [%lld%s%lld] but config.json implies "
                              "[%lld%s%lld]",
                         t->file, p->name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                         t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)p->shape[0],
                         p->ndim > 1 ? ", " : "", p->ndim > 1 ? (long long)p->shape[1] : 0LL);
            break;
        }
        if (p->data)
            rc = ft_model_param_from_st(m, p, t, err);
    }
    for (size_t i = 0; i < ft_ckpt_count(ck) && rc == 0 && unit < 0; i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        if (!ft_model_find_param(m, t->name) && !ignorable_tensor(m, t->name))
            rc = ft_fail(err, "%s: unexpected tensor '%s': not part of a %s model as "
                              "config.json describes it",
                         t->file, t->name, m->cfg.model_type);
    }
    ft_ckpt_close(ck);
    return rc;
}

int ft_model_param_from_st(ft_model *m, ft_param *p, const ft_st_tensor *t, ft_err *err)
{
    /* a NaN or inf weight would only show up as a loss of nan */
    if (m->dev == FT_DEV_CPU)
        return ft_st_to_f32_finite(t, p->data, p->numel, err);
    float *host = malloc(p->numel * sizeof *host + 1);
    if (!host)
        return ft_fail(err, "out of host memory reading '%s'", p->name);
    int rc = ft_st_to_f32_finite(t, host, p->numel, err);
    if (rc == 0)
        rc = ft_model_param_set(m, p, host, err);
    free(host);
    return rc;
}

int ft_model_param_to_writer(ft_model *m, const ft_param *p, ft_st_writer *w, ft_err *err)
{
    return model_param_to_writer_as(m, p, p->name, w, err);
}

int model_param_to_writer_as(ft_model *m, const ft_param *p, const char *name, ft_st_writer *w,
                             ft_err *err)
{
    const float *data = p->data;
    float *host = NULL;
    /* a quantized weight's values are dequantized (ft_model_param_get) */
    if (m->dev != FT_DEV_CPU || p->quantized) {
        if (!(host = malloc(p->numel * sizeof *host + 1)))
            return ft_fail(err, "out of host memory saving '%s'", p->name);
        if (ft_model_param_get(m, p, host, err) || ft_st_writer_keep(w, host)) {
            free(host);
            return ft_fail_prefix(err, "saving '%s'", p->name);
        }
        data = host;
    }
    return ft_st_writer_add(w, name, FT_ST_F32, p->ndim, p->shape, data, err);
}

/* LoRA on the embedding or lm_head (outer) of a model with tied word embeddings. PEFT
 * without ensure_weight_tying (its default) wraps the two modules apart: each pair is its
 * own, over the one tied base weight (the embedding's Embedding pair, the head's Linear
 * pair), which is what the model computes; it warns. With ensure_weight_tying PEFT gives
 * the head the embedding's pair transposed as two more parameters on the same storage
 * (lib/model/tied_lora.c), DoRA's magnitudes each its module's. Refused: LoRA there beside
 * modules_to_save with ensure_weight_tying (an adapter's true, a run config's true or its
 * auto, which takes it with modules_to_save), which PEFT 0.21.2 has no consistent form
 * of: it ties the listed module to the other one's LoRA layer and, with LoRA on lm_head,
 * raises "modules_to_save cannot be applied to modules of type lora.Linear"; with LoRA
 * on embed_tokens alone (or a regex) it silently drops that LoRA. Without it (the model untied, untie_head) it
 * is supported: one module's pair, the other's trained copy. */
static int tied_outer_refused(const ft_lora_config *lc, unsigned outer, ft_err *err)
{
    const char *mod = outer & FT_LORA_EMBED ? "embed_tokens" : "lm_head";
    if (lc->modules_to_save)
        return ft_fail(err, "LoRA on %s beside modules_to_save on a model with tied word "
                            "embeddings under ensure_weight_tying (true, or a run config's "
                            "auto with modules_to_save) is not supported: PEFT 0.21.2 has no "
                            "consistent form of it (with LoRA on lm_head it raises "
                            "\"modules_to_save cannot be applied to modules of type "
                            "lora.Linear\"; with LoRA on embed_tokens alone it drops that "
                            "LoRA); with ensure_weight_tying false (PEFT's default) "
                            "the embedding and head train apart, LoRA on one and the listed "
                            "module's own copy",
                       mod);
    return 0;
}

/* Which projections of which layers carry LoRA; checks the options. */
static int lora_layers(ft_model *m, ft_err *err)
{
    snprintf(m->opt.lora.module_prefix, sizeof m->opt.lora.module_prefix, "%s",
             m->cfg.module_prefix);
    const ft_lora_config *lc = &m->opt.lora;
    if (lc->r <= 0)
        return ft_fail(err, "LoRA needs r > 0 (got %d)", lc->r);
    /* a target regex names the embedding by the model's module path */
    if (ft_lora_regex_outer(&m->opt.lora, err))
        return -1;
    if (lc->dropout < 0 || lc->dropout >= 1)
        return ft_fail(err, "LoRA dropout must be in [0, 1) (got %g)", lc->dropout);
    for (int i = 0; i < lc->n_layers; i++)
        if (lc->layers[i] < 0 || lc->layers[i] >= m->cfg.num_layers)
            return ft_fail(err, "LoRA layers_to_transform names layer %d; the model has %d",
                           lc->layers[i], m->cfg.num_layers);
    /* A module name the block lacks: an error in settings given here; in an adapter's
     * config, as for PEFT, fine while the targets select something (an adapter may list
     * the names of several families). */
    unsigned projs = ft_lora_projections(&m->cfg);
    bool plain = m->cfg.moe_lora_plain;
    if (plain && (lc->targets & FT_LORA_MOE))
        return ft_fail(err, "LoRA target %s on model_type '%s': PEFT has no such target there "
                       "(its router, mlp.gate, is not a linear layer, and PEFT does not map "
                       "the MLP names to its experts; gate_proj, up_proj, down_proj name the "
                       "shared expert's and the dense layers' projections)",
                       lc->targets & FT_LORA_MOE_ROUTER ? "'gate'" : "w1/w2/w3",
                       m->cfg.model_type);
    /* (an adapter's target_parameters, which PEFT takes there as given, are fine) */
    if (m->cfg.num_experts > 0 && lc->target_regex[0] && plain)
        return ft_fail(err, "LoRA target_modules as a regex on model_type '%s' is not "
                       "supported (list the modules: q_proj, k_proj, v_proj, o_proj, "
                       "gate_proj, up_proj, down_proj, shared_expert_gate, or all-linear)",
                       m->cfg.model_type);
    if (m->cfg.num_experts > 0 && lc->target_regex[0])
        return ft_fail(err, "LoRA target_modules as a regex on model_type '%s' is not "
                       "supported (PEFT resolves it against the experts' fused parameters; "
                       "list the modules: q_proj, k_proj, v_proj, o_proj, gate (the router), "
                       "w1, w2, w3, or all-linear)", m->cfg.model_type);
    if (ft_lora_resolve_moe(&m->opt.lora, m->cfg.num_experts > 0 && !plain, err))
        return -1;
    unsigned absent = lc->targets & ~projs & ~FT_LORA_OUTER;
    if ((lc->targets & ~FT_LORA_OUTER) != FT_LORA_ALL_LINEAR && absent && !lc->source[0])
        for (int p = 0; p < FT_NPROJ; p++)
            if (absent & (1u << p))
                return ft_fail(err, "LoRA target module '%s' is not a linear layer of "
                               "model_type '%s'", ft_proj_name((ft_proj)p),
                               m->cfg.model_type);
    for (int l = 0; l < m->cfg.num_layers; l++) {
        if (ft_lora_layer_mask(lc, l, &m->lora_mask[l], err))
            return -1;
        m->lora_mask[l] &= ft_layer_lora_projections(&m->cfg, l);
        m->lora_union |= m->lora_mask[l];
    }
    unsigned outer = lc->targets & FT_LORA_OUTER;
    if (lc->target_params && m->cfg.num_experts == 0)
        return ft_fail(err, "LoRA target_parameters (a MoE's router or experts) on model_type "
                       "'%s', which has neither", m->cfg.model_type);
    if (lc->target_params && lc->dropout > 0)
        return ft_fail(err, "LoRA dropout must be 0 with LoRA on a MoE's router or experts "
                       "(gate, w1, w2, w3, or all-linear: PEFT's target_parameters, where PEFT "
                       "refuses dropout; got %g): set tuning.lora.dropout to 0, or target the "
                       "attention modules only", lc->dropout);
    if (lc->target_params && lc->dora)
        return ft_fail(err, "DoRA (use_dora) with target_parameters is not supported");
    if (!m->lora_union && !outer && !lc->target_params)
        return ft_fail(err, "the LoRA target modules select no linear layer of this model");
    if (outer && m->cfg.tie_word_embeddings && tied_outer_refused(lc, outer, err))
        return -1;
    /* ensure_weight_tying there: the embedding carries the pair, lm_head the same one
     * transposed, whichever of the two was named (PEFT's _add_targets_to_tie) */
    if (outer && m->cfg.tie_word_embeddings && lc->ensure_weight_tying) {
        m->opt.lora.targets |= FT_LORA_OUTER;
        outer = FT_LORA_OUTER; /* (DoRA's magnitudes and scratch on both, below) */
    }
    if ((outer & FT_LORA_EMBED) && (lc->modules_to_save & FT_SAVE_EMBED))
        return ft_fail(err, "embed_tokens is both a LoRA target and in modules_to_save");
    if ((outer & FT_LORA_HEAD) && (lc->modules_to_save & FT_SAVE_HEAD))
        return ft_fail(err, "lm_head is both a LoRA target and in modules_to_save");
    /* PEFT with ensure_weight_tying keeps a tied embedding and head tied: one trained
     * copy, the embedding's. Without it (PEFT's default; a run config's false) it trains
     * separate copies, untying them: the model was untied then (untie_head). A run
     * config's auto takes ensure_weight_tying, and the saved adapter says so. */
    if (lc->modules_to_save && m->cfg.tie_word_embeddings) {
        m->opt.lora.modules_to_save = ft_lora_saved_modules(lc, true);
        m->opt.lora.ensure_weight_tying = true;
    }
    if (ft_lora_ranks_init(&m->lora_rk, &m->cfg, lc, m->lora_mask,
                           ft_model_tied_lora(m), err))
        return -1;
    if (lc->dora)
        ft_dora_scratch_dims(&m->cfg, m->lora_union, &m->dora_out, &m->dora_w_n);
    if (lc->dora && outer) {
        size_t out, wn, tn;
        ft_dora_scratch_outer(&m->cfg, outer, 1, 1, &out, &wn, &tn);
        if (out > m->dora_out)
            m->dora_out = out;
        if (wn > m->dora_w_n)
            m->dora_w_n = wn;
    }
    return 0;
}

/* lora_layers; an error about settings read from an adapter_config.json names it. */
static int setup_lora(ft_model *m, ft_err *err)
{
    if (lora_layers(m, err) == 0)
        return 0;
    return m->opt.lora.source[0] ? ft_fail_prefix(err, "%s", m->opt.lora.source) : -1;
}

/* Why the model cannot run on opt's device in opt's dtype; NULL when it can. */
static const char *device_unsupported(const ft_model_options *opt)
{
    if (opt->device == FT_DEV_CPU)
        return opt->dtype == FT_F32 ? NULL : "the CPU backend computes in fp32 only";
    if (opt->device != FT_DEV_CUDA)
        return "unknown device";
#ifndef FT_HAVE_CUDA
    return "this build has no CUDA backend (rebuild with nvcc on the PATH or CUDA_HOME set)";
#else
    if (opt->dtype != FT_F32 && opt->dtype != FT_BF16)
        return "the GPU model computes in fp32 or bf16";
    if (ft_cuda_device_count() == 0)
        return "no CUDA GPU is visible (see bin/gpu-info)";
    return NULL;
#endif
}

/* An adapter for a vocabulary grown by added tokens (PEFT after resize_token_embeddings):
 * the model takes the adapter's vocabulary; the checkpoint gives the old rows. */
static int resize_vocab(ft_model *m, ft_err *err)
{
    int64_t V = m->opt.mode == FT_TRAIN_LORA ? m->opt.lora.vocab_size : 0;
    int64_t G = m->opt.grow_vocab > m->cfg.vocab_size ? m->opt.grow_vocab : 0;
    if (G && V && V != G)
        return ft_fail(err, "%s: the adapter is for a vocabulary of %lld tokens, the tokenizer "
                            "with the added tokens has %lld",
                       m->opt.lora.source[0] ? m->opt.lora.source : "the LoRA settings",
                       (long long)V, (long long)G);
    if (G) {
        m->base_vocab = m->cfg.vocab_size;
        m->cfg.vocab_size = G;
        /* LoRA on the grown embedding / head: their base (the new rows) is saved with the
         * adapter as base_layer, as PEFT does */
        if (m->opt.mode == FT_TRAIN_LORA)
            m->outer_base_read |= m->opt.lora.targets & FT_LORA_OUTER;
        return 0;
    }
    if (V == 0 || V == m->cfg.vocab_size)
        return 0;
    const char *src = m->opt.lora.source[0] ? m->opt.lora.source : "the LoRA settings";
    if (V < m->cfg.vocab_size)
        return ft_fail(err, "%s: the adapter's embedding / head have %lld rows, fewer than the "
                            "model's vocabulary (%lld in %s/config.json): a shrunk vocabulary "
                            "is not supported",
                       src, (long long)V, (long long)m->cfg.vocab_size, m->dir);
    m->base_vocab = m->cfg.vocab_size;
    m->cfg.vocab_size = V;
    return 0;
}

/* PEFT's modules_to_save on a tied model without ensure_weight_tying (an adapter's
 * settings, or a run config's false; its auto is ensure_weight_tying's one copy): PEFT
 * wraps a trainable copy of each listed module, and the one not listed keeps the base
 * tensor, so the embedding and the head are apart from the start: the model unties them,
 * the head a copy of the embedding (model_read_weights). */
static void untie_head(ft_model *m)
{
    const ft_lora_config *lc = &m->opt.lora;
    if (m->opt.mode == FT_TRAIN_LORA && m->cfg.tie_word_embeddings && lc->modules_to_save &&
        !lc->ensure_weight_tying && lc->weight_tying_set) {
        m->cfg.tie_word_embeddings = false;
        m->head_untied = true;
    }
}

bool ft_model_head_untied(const ft_model *m)
{
    return m->head_untied;
}

int64_t ft_model_checkpoint_vocab(const ft_model *m)
{
    return m->base_vocab ? m->base_vocab : m->cfg.vocab_size;
}

const ft_lora_config *ft_model_lora_config(const ft_model *m)
{
    return &m->opt.lora;
}

int ft_model_load(ft_model **out, const char *dir, const ft_model_options *opt, ft_err *err)
{
    *out = NULL;
    ft_model *m = calloc(1, sizeof *m);
    if (!m)
        return ft_fail(err, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (ft_model_config_load(&m->cfg, path, err)) {
        free(m);
        return -1;
    }
    m->opt = *opt;
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    if (resize_vocab(m, err)) {
        free(m);
        return -1;
    }
    untie_head(m);
    const ft_quant_config qc = m->cfg.quant;
    if (qc.present) {
        m->quant = qc.opt;
        m->quant_from_ckpt = true;
        snprintf(m->quant_skip, sizeof m->quant_skip, "%s", qc.skip);
    } else {
        m->quant = opt->quant;
        snprintf(m->quant_skip, sizeof m->quant_skip, "%s", opt->quant_skip ? opt->quant_skip : "");
    }
    if (m->quant.type != FT_QUANT_NONE && opt->mode == FT_TRAIN_FULL) {
        ft_fail(err, "%s: a %s-quantized base cannot be trained in full mode (train LoRA "
                     "adapters on it: tuning.mode qlora)",
                dir, ft_quant_name(m->quant.type));
        free(m);
        return -1;
    }
    m->dev = opt->device;
    m->cdt = opt->dtype;
    m->mem.limit = opt->mem_limit;
    const char *bad_device = device_unsupported(opt);
    if (bad_device) {
        ft_fail(err, "%s: %s", dir, bad_device);
        free(m);
        return -1;
    }
    m->stage_first = 0;
    m->stage_last = m->cfg.num_layers + 1;
    m->lora_mask = calloc((size_t)m->cfg.num_layers, sizeof *m->lora_mask);
    if (!m->lora_mask) {
        free(m);
        return ft_fail(err, "out of memory");
    }
    if (opt->mode == FT_TRAIN_LORA && setup_lora(m, err)) {
        free(m->lora_mask);
        free(m);
        return -1;
    }
    m->layers = calloc((size_t)m->cfg.num_layers, sizeof *m->layers);
    m->acts = calloc((size_t)m->cfg.num_layers, sizeof *m->acts);
    m->inv_freq = malloc(model_rope_sets(m) * (size_t)(m->cfg.rotary_dim / 2) * sizeof(float));
    layout lo = {m, 0};
    int rc = -1;
    if (!m->layers || !m->acts || !m->inv_freq || build_layout(&lo)) {
        ft_fail(err, "out of memory");
        goto done;
    }
    if (assign_buffers(m, err))
        goto done;
    if (m->cfg.num_experts > 0 && m->cfg.output_router_logits) {
        size_t E = (size_t)m->cfg.num_experts;
        m->aux_counts = ft_alloc_on(&m->mem, m->dev, FT_MEM_WORKSPACE, 3 * E * sizeof(float));
        if (!m->aux_counts) {
            ft_mem_fail(err, &m->mem, m->dev, "the load-balancing statistics");
            goto done;
        }
        m->aux_psum = m->aux_counts + E;
        m->aux_dp = m->aux_counts + 2 * E;
    }
    ft_rope_inv_freq(&m->cfg, m->inv_freq);
    if (m->cfg.rope_local_theta > 0)
        ft_rope_inv_freq_local(&m->cfg, m->inv_freq + m->cfg.rotary_dim / 2);
    else if (model_rope_sets(m) == 2)
        ft_rope_inv_freq_long(&m->cfg, m->inv_freq + m->cfg.rotary_dim / 2);
    if (model_upload_inv_freq(m, err))
        goto done;
    if (!opt->unbound) {
        if (model_read_weights(m, dir, -1, err))
            goto done;
        if (opt->mode == FT_TRAIN_LORA &&
            (init_lora(m, -1, err) || ft_model_tied_lora_sync(m, err)))
            goto done;
    }
    rc = 0;
done:
    if (rc) {
        ft_model_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

size_t ft_loss_chunk_rows(int opt, size_t V, size_t N)
{
    size_t rows = opt > 0 ? (size_t)opt : N;
    if (opt < 0) {
        /* auto: the rows of FT_LOSS_CHUNK_AUTO_ELEMS logits, rounded down to a multiple of
         * 64 (8 below 64 rows): the head's GEMMs take the chunk's rows as a dimension, and
         * cuBLAS's bf16 tensor-core kernels are much slower on a count that is not a
         * multiple of 8 (lm_head's weight gradient over 347 rows took 39 ms on an H200
         * against 1.4 ms over 523) */
        rows = FT_LOSS_CHUNK_AUTO_ELEMS / (V ? V : 1);
        size_t align = rows >= 64 ? 64 : rows >= 8 ? 8 : 1;
        rows -= rows % align;
    }
    rows = rows < N ? rows : N;
    return rows ? rows : 1;
}

static void free_activations(ft_model *m)
{
    float **scratch[] = {&m->final_in, &m->lnf,   &m->rstdf, &m->logits, &m->d_h,
                         &m->d_ln,     &m->d_br,  &m->d_att, &m->d_q,    &m->d_k,
                         &m->d_v,      &m->d_act, &m->d_gate, &m->d_up,  &m->d_lora_h,
                         &m->x_drop,   &m->dora_w, &m->dora_g, &m->dora_inv, &m->dora_t,
                         &m->dora_d,   &m->lora_xh, &m->d_moe, &m->d_rw,   &m->d_rlogits,
                         &m->xlora_bs, &m->xlora_gbs, &m->xlora_dh};
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++) {
        ft_free_on(&m->mem, m->dev, *scratch[i]);
        *scratch[i] = NULL;
    }
    int32_t **ints[] = {&m->ids, &m->targets, &m->pos, &m->seg, &m->iota};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        ft_free_on(&m->mem, m->dev, *ints[i]);
        *ints[i] = NULL;
    }
    /* Layer activations: either one set per layer or one shared scratch set (and none
     * outside a pipeline stage); free each distinct pointer once (a set is known by its
     * q, which every set has). */
    int L = m->cfg.num_layers;
    float *first_set = NULL;
    for (int l = 0; l < L; l++) {
        layer_acts *a = &m->acts[l];
        ft_free_on(&m->mem, m->dev, a->in);
        if (!a->q || a->q == first_set)
            continue;
        if (!first_set)
            first_set = a->q;
        float *bufs[] = {a->ln1, a->rstd1, a->qr,  a->kr,   a->rstd_q, a->rstd_k, a->q,
                         a->k,   a->v,     a->att, a->lse,  a->ao,     a->rstd_ao,  a->mid,
                         a->ln2, a->rstd2, a->gate, a->up,  a->act,    a->mo,       a->rstd_mo};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            ft_free_on(&m->mem, m->dev, bufs[i]);
        for (int p = 0; p < FT_NPROJ; p++)
            ft_free_on(&m->mem, m->dev, a->lora_h[p]);
        ft_free_on(&m->mem, m->dev, a->rlora_h);
        ft_free_on(&m->mem, m->dev, a->xlora_h[0]);
        ft_free_on(&m->mem, m->dev, a->xlora_h[1]);
        void *moe[] = {a->rlogits, a->probs, a->idx, a->rw, a->rows, a->slot,
                       a->xe,      a->ge,    a->ue,  a->acte, a->ye, a->sh, a->sz, a->ss};
        for (size_t i = 0; i < sizeof moe / sizeof *moe; i++)
            ft_free_on(&m->mem, m->dev, moe[i]);
        free(a->offsets);
    }
    memset(m->acts, 0, (size_t)L * sizeof *m->acts);
    m->max_rows = 0;
    free(m->batch_h);
    m->batch_h = NULL;
    free(m->moe_host);
    m->moe_host = NULL;
}

/* One set of per-layer activation buffers for N rows, for the layers [l0, l1) that
 * share it: the MoE buffers when one of them is sparse, the plain MLP's at the widest
 * of their MLPs (ft_layer_mlp_width), the shared expert's with a sparse layer that has
 * one. */
static int alloc_layer_set(ft_model *m, layer_acts *a, size_t N, int l0, int l1)
{
    const ft_model_config *c = &m->cfg;
    size_t C = c->hidden_size, I = c->intermediate_size, e = model_esize(m), f = sizeof(float);
    size_t W = (size_t)ft_max_mlp_width(c, l0, l1);
    size_t QD = (size_t)c->num_heads * c->head_dim, KD = (size_t)c->num_kv_heads * c->head_dim;
    bool attn_pre = ft_has_branch_norm(c, FT_NORM_ATTN_PRE);
    bool attn_post = ft_has_branch_norm(c, FT_NORM_ATTN_POST);
    bool mlp_pre = ft_has_branch_norm(c, FT_NORM_MLP_PRE);
    bool mlp_post = ft_has_branch_norm(c, FT_NORM_MLP_POST);
    bool qk = c->qk_norm != FT_QK_NORM_NONE;
    bool moe = false, dense = W > 0;
    for (int l = l0; l < l1; l++)
        moe |= ft_layer_sparse(c, l);
    bool shared = moe && c->shared_expert_size > 0;
    size_t E = (size_t)c->num_experts, M = N * (size_t)c->experts_per_tok;
    size_t q_rows, k_rows;
    int width;
    qk_norm_rows(c, c->num_heads, N, &q_rows, &width);
    qk_norm_rows(c, c->num_kv_heads, N, &k_rows, &width);
    struct {
        float **p;
        size_t bytes;
        bool need;
    } bufs[] = {/* q first: free_activations knows a set by it, a partial one too */
                {&a->q, N * QD * e, true},          {&a->k, N * KD * e, true},
                {&a->ln1, N * C * e, attn_pre},     {&a->rstd1, N * f, attn_pre},
                {&a->qr, N * QD * e, qk},           {&a->kr, N * KD * e, qk},
                {&a->rstd_q, q_rows * f, qk},       {&a->rstd_k, k_rows * f, qk},
                {&a->v, N * KD * e, true},          {&a->att, N * QD * e, true},
                {&a->lse, N * c->num_heads * f, true},
                {&a->ao, N * C * e, attn_post},     {&a->rstd_ao, N * f, attn_post},
                {&a->mid, N * C * e, true},         {&a->ln2, N * C * e, mlp_pre},
                {&a->rstd2, N * f, mlp_pre},        {&a->gate, N * W * e, dense},
                {&a->up, N * W * e, dense},         {&a->act, N * W * e, dense},
                {&a->mo, N * C * e, mlp_post},      {&a->rstd_mo, N * f, mlp_post},
                /* MoE (moe.c) */
                {&a->rlogits, N * E * e, moe},      {&a->probs, N * E * f, moe},
                {(float **)&a->idx, M * f, moe},    {&a->rw, M * f, moe},
                {(float **)&a->rows, M * f, moe},   {(float **)&a->slot, M * f, moe},
                {&a->xe, M * C * e, moe},           {&a->ge, M * I * e, moe},
                {&a->ue, M * I * e, moe},           {&a->acte, M * I * e, moe},
                {&a->ye, M * C * e, moe},
                /* qwen2_moe's shared expert: its output, gate logit and sigmoid */
                {&a->sh, N * C * e, shared},        {&a->sz, N * e, shared},
                {&a->ss, N * f, shared}};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i].need &&
            !(*bufs[i].p = ft_alloc_on(&m->mem, m->dev, FT_MEM_ACTIVATIONS, bufs[i].bytes)))
            return -1;
    if (moe && !(a->offsets = malloc((E + 1) * sizeof *a->offsets)))
        return -1;
    /* LoRA's h of each module, the router and the experts: [N, r] ([M, r]), r the largest
     * rank of its pairs on the layers the set serves (none: no buffer) */
    if (m->opt.mode != FT_TRAIN_LORA)
        return 0;
    const ft_lora_ranks *rk = &m->lora_rk;
    for (int p = 0; p <= FT_LORA_RANK_DOWN; p++) {
        size_t r = (size_t)ft_lora_ranks_max(rk, p, l0, l1);
        float **h = p < FT_NPROJ                ? &a->lora_h[p]
                    : p == FT_LORA_RANK_ROUTER  ? &a->rlora_h
                    : p == FT_LORA_RANK_GATE_UP ? &a->xlora_h[0]
                                                : &a->xlora_h[1];
        size_t rows = p >= FT_LORA_RANK_GATE_UP ? M : N;
        if (r && !(*h = ft_alloc_on(&m->mem, m->dev, FT_MEM_ACTIVATIONS, rows * r * e)))
            return -1;
    }
    return 0;
}

/* dora_t / dora_d: [N, out] of the block's DoRA projections, and with DoRA on the
 * embedding or the head their rows (dora_outer.c: [N, C], the loss chunk's [R, V]). */
static size_t dora_t_elems(const ft_model *m, size_t N)
{
    size_t out, w, t;
    ft_dora_scratch_dims(&m->cfg, m->lora_union, &out, &w);
    size_t n = N * out, V = (size_t)m->cfg.vocab_size;
    ft_dora_scratch_outer(&m->cfg, m->opt.lora.targets & FT_LORA_OUTER, N,
                          ft_loss_chunk_rows(m->opt.loss_chunk_rows, V, N), &out, &w, &t);
    return t > n ? t : n;
}

int model_reserve_activations(ft_model *m, int B, int T, ft_err *err)
{
    size_t N = (size_t)B * (size_t)T;
    m->B = B;
    m->T = T;
    if (N <= m->max_rows)
        return 0;
    free_activations(m);
    const ft_model_config *c = &m->cfg;
    int L = c->num_layers;
    size_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    size_t QD = (size_t)c->num_heads * c->head_dim, KD = (size_t)c->num_kv_heads * c->head_dim;
    bool train = m->opt.mode != FT_TRAIN_NONE;
    /* Without training only one layer's activations live at a time; with gradient
     * checkpointing likewise, plus every layer's input. */
    bool shared = !train || m->opt.grad_ckpt;
    /* a pipeline stage computes layers [l0, l1) and sends the input of layer l1 */
    int l0 = m->stage_first > 0 ? m->stage_first - 1 : 0;
    int l1 = m->stage_last < L + 1 ? m->stage_last : L;
    bool head = m->stage_last == L + 1;
    int set = -1; /* the layer whose set the others share */
    for (int l = l0; l < L && l <= l1; l++) {
        layer_acts *a = &m->acts[l];
        if (!(a->in = ft_alloc_on(&m->mem, m->dev, FT_MEM_ACTIVATIONS, N * C * model_esize(m))))
            goto oom;
        if (l == l1)
            continue;
        if (shared && set >= 0) {
            float *in = a->in;
            *a = m->acts[set];
            a->in = in;
        } else if (alloc_layer_set(m, a, N, shared ? l0 : l, shared ? (l1 < L ? l1 : L) : l + 1)) {
            goto oom;
        } else {
            set = l;
        }
    }
    /* the backward scratch (freed above with the slot's activations) is shared by the
     * slots: never smaller than another slot's rows */
    size_t NS = N > m->scratch_rows ? N : m->scratch_rows;
    bool dora = m->opt.mode == FT_TRAIN_LORA && m->opt.lora.dora;
    /* MoE: the MLP's scratch holds the k grouped rows of each token */
    size_t K = c->num_experts > 0 ? (size_t)c->experts_per_tok : 1;
    bool moe = c->num_experts > 0;
    /* d_act, d_gate, d_up: the experts' N k rows, or the widest plain MLP (a MoE model's
     * dense layers, shared expert) */
    size_t WM = (size_t)ft_max_mlp_width(c, 0, L), DI = K * I > WM ? K * I : WM;
    /* x_drop: dropout(x) of the widest LoRA input (hidden, q heads, an MLP's width) */
    size_t XW = C > I ? (C > QD ? C : QD) : (I > QD ? I : QD);
    XW = WM > XW ? WM : XW;
    size_t xbs = 0, xdh = 0; /* LoRA on the experts */
    moe_experts_lora_dims(m, &xbs, &xdh);
    /* lora_xh: the embedding's or the head's h */
    int outer_r = m->lora_rk.embed.r > m->lora_rk.head.r ? m->lora_rk.embed.r : m->lora_rk.head.r;
    struct {
        float **p;
        size_t n;
        bool need;
        ft_mem_cat cat;
        bool fp32; /* else the compute dtype */
    } bufs[] = {
        {&m->final_in, N * C, l1 == L, FT_MEM_ACTIVATIONS, false},
        {&m->lnf, N * C, head, FT_MEM_ACTIVATIONS, false},
        {&m->rstdf, N, head, FT_MEM_ACTIVATIONS, true},
        {&m->logits, ft_loss_chunk_rows(m->opt.loss_chunk_rows, V, N) * V, head,
         FT_MEM_ACTIVATIONS, false},
        {&m->d_h, NS * C, train, FT_MEM_WORKSPACE, false},
        {&m->d_ln, NS * C, train, FT_MEM_WORKSPACE, false},
        {&m->d_br, NS * C,
         train && (ft_has_branch_norm(c, FT_NORM_ATTN_POST) ||
                   ft_has_branch_norm(c, FT_NORM_MLP_POST)),
         FT_MEM_WORKSPACE, false},
        {&m->d_att, NS * QD, train, FT_MEM_WORKSPACE, false},
        {&m->d_q, NS * QD, train, FT_MEM_WORKSPACE, false},
        {&m->d_k, NS * KD, train, FT_MEM_WORKSPACE, false},
        {&m->d_v, NS * KD, train, FT_MEM_WORKSPACE, false},
        {&m->d_act, NS * DI, train, FT_MEM_WORKSPACE, false},
        {&m->d_gate, NS * DI, train, FT_MEM_WORKSPACE, false},
        {&m->d_up, NS * DI, train, FT_MEM_WORKSPACE, false},
        {&m->d_moe, NS * K * C, train && moe, FT_MEM_WORKSPACE, false},
        {&m->d_rw, NS * K, train && moe, FT_MEM_WORKSPACE, true},
        {&m->d_rlogits, NS * (size_t)c->num_experts, train && moe, FT_MEM_WORKSPACE, false},
        {&m->d_lora_h, NS * (size_t)ft_lora_ranks_max_dense(&m->lora_rk),
         m->opt.mode == FT_TRAIN_LORA && ft_lora_ranks_max_dense(&m->lora_rk) > 0,
         FT_MEM_WORKSPACE, false},
        {&m->x_drop, NS * XW,
         m->opt.mode == FT_TRAIN_LORA && m->opt.lora.dropout > 0, FT_MEM_WORKSPACE, false},
        {&m->dora_w, m->dora_w_n, dora, FT_MEM_WORKSPACE, false},
        {&m->dora_g, m->dora_out, dora, FT_MEM_WORKSPACE, true},
        {&m->dora_inv, m->dora_out, dora, FT_MEM_WORKSPACE, true},
        {&m->dora_t, dora_t_elems(m, NS), dora, FT_MEM_WORKSPACE, false},
        {&m->dora_d, dora_t_elems(m, NS), dora, FT_MEM_WORKSPACE, false},
        {&m->lora_xh, NS * (size_t)outer_r,
         m->opt.mode == FT_TRAIN_LORA && (m->opt.lora.targets & FT_LORA_OUTER),
         FT_MEM_WORKSPACE, false},
        {&m->xlora_bs, xbs, xbs > 0, FT_MEM_WORKSPACE, false},
        {&m->xlora_gbs, xbs, xbs > 0 && train, FT_MEM_WORKSPACE, true},
        {&m->xlora_dh, NS * K * xdh, xdh > 0 && train, FT_MEM_WORKSPACE, false},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i].need &&
            !(*bufs[i].p = ft_alloc_on(&m->mem, m->dev, bufs[i].cat,
                                       bufs[i].n * (bufs[i].fp32 ? sizeof(float) : model_esize(m)))))
            goto oom;
    int32_t **ints[] = {&m->ids, &m->targets, &m->pos, &m->seg};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        if (!(*ints[i] = ft_alloc_on(&m->mem, m->dev, FT_MEM_ACTIVATIONS, N * sizeof(int32_t))))
            goto oom;
    /* qwen2_moe: slot[n] = n, the shared expert's gated sum as a k = 1 combine (moe.c) */
    if (c->shared_expert_size > 0) {
        int32_t *iota = malloc(N * sizeof *iota);
        if (!iota || !(m->iota = ft_alloc_on(&m->mem, m->dev, FT_MEM_ACTIVATIONS,
                                             N * sizeof(int32_t)))) {
            free(iota);
            goto oom;
        }
        for (size_t n = 0; n < N; n++)
            iota[n] = (int32_t)n;
        ft_err cerr = {0};
        int crc = ft_copy_bytes(m->iota, m->dev, iota, FT_DEV_CPU, N * sizeof *iota, &cerr);
        free(iota);
        if (crc)
            goto oom;
    }
    /* the GPU's batch is assembled on the host first (model_device.c) */
    if (m->dev != FT_DEV_CPU && !(m->batch_h = malloc(4 * N * sizeof *m->batch_h)))
        goto oom;
    /* a GPU MoE model plans the grouping on the host (moe.c) */
    if (m->dev != FT_DEV_CPU && moe) {
        size_t n = 3 * N * K > 3 * (size_t)c->num_experts ? 3 * N * K : 3 * (size_t)c->num_experts;
        if (!(m->moe_host = malloc(n * sizeof *m->moe_host)))
            goto oom;
    }
    m->max_rows = N;
    m->scratch_rows = NS;
    return 0;
oom:
    free_activations(m);
    return ft_mem_fail(err, &m->mem, m->dev, "activations for %d x %d tokens", B, T);
}

void ft_model_free(ft_model *m)
{
    if (!m)
        return;
    for (int i = 1; i < m->n_slots; i++) {
        ft_model_use_activation_slot(m, i);
        free_activations(m);
        free(m->acts);
    }
    ft_model_use_activation_slot(m, 0);
    if (m->acts)
        free_activations(m);
    free(m->slots);
    if (m->owns_buffers) {
        if (m->train_compute != m->train_data)
            ft_free_on(&m->mem, m->dev, m->train_compute);
        ft_free_on(&m->mem, m->dev, m->train_data);
        ft_free_on(&m->mem, m->dev, m->train_grad);
        ft_free_on(&m->mem, m->dev, m->frozen_data);
    }
    if (m->inv_freq_dev != m->inv_freq)
        ft_free_on(&m->mem, m->dev, m->inv_freq_dev);
    free(m->logits_h);
    free(m->row_logits_h);
    for (size_t i = 0; m->qt && i < m->n_params; i++)
        drop_qtensor(m, i);
    for (size_t i = 0; m->qdense && i < m->n_params; i++)
        ft_free_on(&m->mem, m->dev, m->qdense[i]);
    free(m->qt);
    free(m->qt_lent);
    free(m->qdense);
    ft_free_on(&m->mem, m->dev, m->qwin);
    ft_free_on(&m->mem, m->dev, m->qabsmax);
    for (int l = 0; m->layers && l < m->cfg.num_layers; l++) {
        free(m->layers[l].expert);
        free(m->layers[l].g_expert);
    }
    ft_free_on(&m->mem, m->dev, m->aux_counts);
    free(m->aux_sums);
    free(m->aux_runs);
    free(m->params);
    free(m->slot_data);
    free(m->slot_grad);
    free(m->unit_begin);
    free(m->frozen_begin);
    free(m->layers);
    free(m->acts);
    free(m->inv_freq);
    free(m->lora_mask);
    ft_lora_ranks_free(&m->lora_rk);
    free(m);
}

const ft_model_config *ft_model_cfg(const ft_model *m) { return &m->cfg; }
ft_mem *ft_model_mem(ft_model *m) { return &m->mem; }
size_t ft_model_param_count(const ft_model *m) { return m->n_params; }
ft_param *ft_model_param(ft_model *m, size_t i) { return i < m->n_params ? &m->params[i] : NULL; }

ft_param *ft_model_find_param(ft_model *m, const char *name)
{
    for (size_t i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return &m->params[i];
    return NULL;
}

float *ft_model_trainable(ft_model *m, size_t *n)
{
    *n = m->n_train;
    return m->train_data;
}

float *ft_model_grads(ft_model *m, size_t *n)
{
    *n = m->n_train;
    return m->train_grad;
}

int ft_model_n_units(const ft_model *m) { return m->cfg.num_layers + 2; }

void ft_model_unit_range(const ft_model *m, int unit, size_t *begin, size_t *end)
{
    *begin = m->unit_begin[unit];
    *end = m->unit_begin[unit + 1];
}

void ft_model_zero_grad(ft_model *m)
{
    if (m->n_train && m->train_grad)
        ft_zero(model_view(m, m->train_grad, m->n_train, FT_F32), m->n_train);
}

void ft_model_unit_frozen_range(const ft_model *m, int unit, size_t *begin, size_t *end)
{
    *begin = m->frozen_begin[unit];
    *end = m->frozen_begin[unit + 1];
}

size_t ft_model_frozen_count(const ft_model *m) { return m->n_frozen; }

float *ft_model_frozen(ft_model *m, size_t *n)
{
    *n = m->n_frozen;
    return m->frozen_data;
}

static void save_slot(const ft_model *m, act_slot *s)
{
    *s = (act_slot){m->B,        m->T,      m->max_rows,  m->acts,         m->final_in,
                    m->lnf,      m->rstdf,  m->logits,    m->logits_first, m->ids,
                    m->targets,  m->pos,    m->seg,       m->has_seg,      m->logits_valid,
                    m->can_backward, m->dropout_seed, m->rope_long, m->iota};
}

static void load_slot(ft_model *m, const act_slot *s)
{
    m->B = s->B;
    m->T = s->T;
    m->max_rows = s->max_rows;
    m->acts = s->acts;
    m->final_in = s->final_in;
    m->lnf = s->lnf;
    m->rstdf = s->rstdf;
    m->logits = s->logits;
    m->logits_first = s->logits_first;
    m->ids = s->ids;
    m->targets = s->targets;
    m->pos = s->pos;
    m->seg = s->seg;
    m->has_seg = s->has_seg;
    m->logits_valid = s->logits_valid;
    m->can_backward = s->can_backward;
    m->dropout_seed = s->dropout_seed;
    m->rope_long = s->rope_long;
    m->iota = s->iota;
}

int ft_model_set_activation_slots(ft_model *m, int k, ft_err *err)
{
    if (k < 1 || m->n_slots > 1)
        return ft_fail(err, "activation slots: %d requested (set once, at least 1)", k);
    if (k == 1)
        return 0;
    m->slots = calloc((size_t)k, sizeof *m->slots);
    if (!m->slots)
        return ft_fail(err, "out of memory");
    for (int i = 1; i < k; i++)
        if (!(m->slots[i].acts = calloc((size_t)m->cfg.num_layers, sizeof(layer_acts))))
            return ft_fail(err, "out of memory");
    m->n_slots = k;
    m->cur_slot = 0;
    return 0;
}

void ft_model_use_activation_slot(ft_model *m, int slot)
{
    if (slot == m->cur_slot || slot < 0 || slot >= m->n_slots)
        return;
    save_slot(m, &m->slots[m->cur_slot]);
    load_slot(m, &m->slots[slot]);
    m->cur_slot = slot;
}

ft_quant_options ft_model_quant(const ft_model *m) { return m->quant; }

/* The window, sized for the largest quantized layer this model computes (a pipeline
 * stage only its own), and the absmax temporary for its largest double-quantized weight,
 * allocated on first use, on the model's device. The window holds the compute dtype. */
static int alloc_window(ft_model *m)
{
    size_t n = 0, nabs = 0;
    for (int u = m->stage_first > 1 ? m->stage_first : 1;
         u <= m->stage_last && u <= m->cfg.num_layers; u++) {
        size_t in_unit = 0;
        for (size_t i = 0; i < m->n_params; i++) {
            const ft_param *p = &m->params[i];
            if (p->unit != u || !p->quantized)
                continue;
            in_unit += p->numel;
            size_t a = ft_quant_absmax_tmp(&m->quant, p->shape[0], p->shape[1]);
            nabs = a > nabs ? a : nabs;
        }
        if (in_unit > n)
            n = in_unit;
    }
    m->qwin = n ? ft_alloc_on(&m->mem, m->dev, FT_MEM_WORKSPACE, n * model_esize(m)) : NULL;
    if (n && !m->qwin)
        return -1;
    if (nabs)
        m->qabsmax = ft_alloc_on(&m->mem, m->dev, FT_MEM_WORKSPACE, nabs * sizeof(float));
    if (nabs && !m->qabsmax)
        return -1;
    m->qabsmax_n = nabs;
    return 0;
}


/* Dequantizes quantized param i into out (numel of the compute dtype on the model's
 * device). The absmax temporary grows when a checkpoint's weight needs more than its
 * quantization_config implies (a blocksize of its own). */
static int dequantize_param(ft_model *m, size_t i, float *out, ft_err *err)
{
    const ft_qtensor *q = &m->qt[i];
    const ft_param *p = &m->params[i];
    size_t nabs = ft_qtensor_absmax_tmp(q);
    if (nabs > m->qabsmax_n) {
        ft_free_on(&m->mem, m->dev, m->qabsmax);
        m->qabsmax = ft_alloc_on(&m->mem, m->dev, FT_MEM_WORKSPACE, nabs * sizeof(float));
        m->qabsmax_n = m->qabsmax ? nabs : 0;
        if (!m->qabsmax)
            return ft_mem_fail(err, &m->mem, m->dev, "the absmax temporary of '%s'", p->name);
    }
    ft_dequantize_to(q, model_view(m, out, p->numel, m->cdt),
                     model_view(m, m->qabsmax, m->qabsmax_n, FT_F32));
    return 0;
}

int ft_model_materialize(ft_model *m, int unit, ft_err *err)
{
    if (!m->qt || unit == m->qwin_unit || unit < 1 || unit > m->cfg.num_layers)
        return 0;
    if (unit < m->stage_first || unit > m->stage_last) /* the window is sized for those */
        return ft_fail(err, "layer %d is outside this pipeline stage (units %d..%d): its "
                            "quantized weights are not dequantized here",
                       unit - 1, m->stage_first, m->stage_last);
    if (!m->qwin && alloc_window(m))
        return ft_mem_fail(err, &m->mem, m->dev, "the dequantization window");
    m->qwin_unit = -1;
    for (size_t i = 0; i < m->n_params; i++) {
        ft_param *p = &m->params[i];
        if (p->unit != unit || !p->quantized)
            continue;
        p->data = model_at(m, m->qwin, p->offset);
        *m->slot_data[i] = p->data;
        if (m->qt[i].type == FT_QUANT_NONE)
            return ft_fail(err, "quantized weight '%s' has no blocks on this rank (a sharded "
                                "base is gathered by the strategy before the layer runs)",
                           p->name);
        if (dequantize_param(m, i, p->data, err))
            return -1;
    }
    m->qwin_unit = unit;
    return 0;
}

ft_qtensor *ft_model_qtensor(ft_model *m, size_t i)
{
    return m->qt && i < m->n_params && m->params[i].quantized ? &m->qt[i] : NULL;
}

void ft_model_drop_qtensor(ft_model *m, size_t i)
{
    if (ft_model_qtensor(m, i))
        drop_qtensor(m, i);
}

void ft_model_lend_qtensor(ft_model *m, size_t i, const ft_qtensor *view)
{
    if (!ft_model_qtensor(m, i))
        return;
    drop_qtensor(m, i);
    m->qt[i] = *view;
    m->qt_lent[i] = true;
}

int ft_model_dequantize_base(ft_model *m, ft_err *err)
{
    for (size_t i = 0; m->qt && i < m->n_params; i++) {
        ft_param *p = &m->params[i];
        if (!p->quantized)
            continue;
        if (!m->qdense && !(m->qdense = calloc(m->n_params, sizeof *m->qdense)))
            return ft_fail(err, "out of memory dequantizing the base");
        float *d = ft_alloc_on(&m->mem, m->dev, FT_MEM_WEIGHTS, p->numel * model_esize(m));
        if (!d)
            return ft_mem_fail(err, &m->mem, m->dev, "the dequantized '%s'", p->name);
        if (dequantize_param(m, i, d, err)) {
            ft_free_on(&m->mem, m->dev, d);
            return -1;
        }
        drop_qtensor(m, i);
        m->qdense[i] = d;
        p->data = d;
        *m->slot_data[i] = d;
        p->quantized = false;
    }
    /* nothing is quantized any more: no window, no temporary */
    ft_free_on(&m->mem, m->dev, m->qwin);
    ft_free_on(&m->mem, m->dev, m->qabsmax);
    m->qwin = m->qabsmax = NULL;
    m->qabsmax_n = 0;
    free(m->qt);
    free(m->qt_lent);
    m->qt = NULL;
    m->qt_lent = NULL;
    m->qwin_unit = -1;
    return 0;
}

void ft_model_set_hooks(ft_model *m, const ft_model_hooks *h)
{
    if (h)
        m->hooks = *h;
    else
        memset(&m->hooks, 0, sizeof m->hooks);
}

void ft_model_set_stage(ft_model *m, int first_unit, int last_unit)
{
    m->stage_first = first_unit;
    m->stage_last = last_unit;
}

int ft_model_init_unit(ft_model *m, int unit, const char *adapter_dir, ft_err *err)
{
    if (model_read_weights(m, m->dir, unit, err))
        return -1;
    if (m->opt.mode == FT_TRAIN_LORA) {
        if (init_lora(m, unit, err))
            return -1;
        if (adapter_dir && model_read_adapter(m, adapter_dir, unit, err))
            return -1;
        /* (a tied pair read unit by unit: the strategy syncs it, lib/dist/dist_tied.c) */
    }
    return 0;
}


uint64_t ft_model_rng_counter(const ft_model *m) { return m->n_forward; }
void ft_model_set_rng_counter(ft_model *m, uint64_t counter) { m->n_forward = counter; }
void ft_model_set_training(ft_model *m, bool training) { m->eval_mode = !training; }
