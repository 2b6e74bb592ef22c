/* PEFT LoRA adapters: adapter_config.json + adapter_model.safetensors, keys
 * base_model.model.<module path>.lora_{A,B}.weight (no adapter name on disk), DoRA's
 * <module path>.lora_magnitude_vector, the embedding's <...>.embed_tokens.lora_embedding_A
 * and _B; for a module trained in full (modules_to_save) base_model.model.<module
 * path>.weight: PEFT keeps its trainable copy as <module>.modules_to_save.default.weight
 * and saves it under the module's own name; and with LoRA on the embedding or lm_head,
 * PEFT's copy of that module's base weight, <module>.base_layer.weight. The module paths
 * are the model's layout's (outer_names.c: a multimodal gemma3's embedding is
 * model.language_model.embed_tokens, its head lm_head). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/fsutil.h"
#include "model/model_internal.h"
#include "formats/safetensors.h"

/* A module saved in full beside the LoRA pairs (embedding, head): trainable in LoRA mode
 * without being a LoRA weight. */
static bool saved_module(const ft_model *m, const ft_param *p)
{
    return m->opt.mode == FT_TRAIN_LORA && p->trainable && !p->is_lora;
}

/* PEFT's key of the embedding's (FT_LORA_EMBED) or the head's (FT_LORA_HEAD) module with
 * suffix: base_model.model.<module path><suffix> (outer_names.c). */
static void outer_key(const ft_model *m, unsigned bit, const char *suffix, char *key, size_t n)
{
    ft_model_outer_key(&m->cfg, bit, suffix, key, n);
}

static bool is_outer_key(const ft_model *m, unsigned bit, const char *suffix, const char *key)
{
    char k[256];
    outer_key(m, bit, suffix, k, sizeof k);
    return strcmp(key, k) == 0;
}

/* The adapter file's key of a LoRA weight or a saved module (the module's own key:
 * base_model.model.<module path>.weight). */
static void adapter_key(const ft_model *m, const ft_param *p, char *key, size_t n)
{
    if (saved_module(m, p))
        outer_key(m, model_vocab_bit(m, p), ".weight", key, n);
    else
        snprintf(key, n, "%s", p->name);
}

/* With LoRA on the embedding or lm_head, PEFT also saves their base weights
 * (save_embedding_layers "auto"), as base_model.model.<module>.base_layer.weight, and its
 * loading puts them in the base: the base weight of an adapter key, or NULL. */
static ft_param *embedding_base_layer(ft_model *m, const char *key)
{
    for (unsigned bit = FT_LORA_EMBED; bit <= FT_LORA_HEAD; bit <<= 1)
        if ((m->opt.lora.targets & bit) && is_outer_key(m, bit, ".base_layer.weight", key))
            /* tied: the head's base layer is the embedding (PEFT wraps the one tensor) */
            return model_outer_param(m, bit, true);
    return NULL;
}

/* A tied model's trained embedding (ensure_weight_tying): PEFT saves the one copy under
 * the head's key too. */
static bool tied_head_alias(const ft_model *m, const char *key)
{
    return m->cfg.tie_word_embeddings && m->opt.mode == FT_TRAIN_LORA &&
           (m->opt.lora.modules_to_save & FT_SAVE_EMBED) &&
           is_outer_key(m, FT_LORA_HEAD, ".weight", key);
}

/* A resized vocabulary (m->base_vocab): PEFT's save_embedding_layers saves the embedding
 * and the head that are neither trained (modules_to_save) nor carry LoRA (their
 * base_layer) in full, under base_model.model.<module>.weight, and its loading puts them
 * in the base: the base weight of such a key, or NULL. A tied head's key names the
 * embedding (PEFT saves the one tensor under both). */
static ft_param *resized_base(ft_model *m, const char *key)
{
    if (!m->base_vocab)
        return NULL;
    for (unsigned k = FT_LORA_EMBED; k <= FT_LORA_HEAD; k <<= 1) {
        if (!is_outer_key(m, k, ".weight", key))
            continue;
        ft_param *p = model_outer_param(m, k, true);
        unsigned bit = p ? model_vocab_bit(m, p) : 0;
        return bit && !p->trainable && !(m->opt.lora.targets & bit) ? p : NULL;
    }
    return NULL;
}

/* A resized vocabulary's module trained in full: PEFT's save_embedding_layers also
 * writes its wrapper's two copies, <module>.modules_to_save.weight (the trained copy,
 * again) and <module>.original_module.weight (the resized base, only for the adapter
 * disabled); PEFT's loading takes the trained copy from <module>.weight. The saved module
 * of such a key (not read: ours is the trained copy), or NULL. */
static ft_param *resized_wrapper_copy(ft_model *m, const char *key)
{
    static const char *const copies[] = {".modules_to_save.weight", ".original_module.weight"};
    if (!m->base_vocab)
        return NULL;
    for (unsigned bit = FT_LORA_EMBED; bit <= FT_LORA_HEAD; bit <<= 1)
        for (size_t i = 0; i < 2; i++) {
            if (!is_outer_key(m, bit, copies[i], key))
                continue;
            ft_param *p = model_outer_param(m, bit, false);
            char alias[256];
            outer_key(m, bit, ".weight", alias, sizeof alias);
            if (!p && tied_head_alias(m, alias))
                p = model_outer_param(m, FT_LORA_EMBED, false);
            return p && saved_module(m, p) ? p : NULL;
        }
    return NULL;
}

/* The LoRA weight or saved module an adapter tensor fills; NULL: none. */
static ft_param *adapter_param(ft_model *m, const char *key)
{
    ft_param *p = ft_model_find_param(m, key);
    if (p && p->is_lora)
        return p;
    if ((p = embedding_base_layer(m, key)) || (p = resized_base(m, key)) ||
        (p = resized_wrapper_copy(m, key)))
        return p;
    if (tied_head_alias(m, key)) /* the same tensor as the embedding's: not read again */
        return model_outer_param(m, FT_LORA_EMBED, false);
    for (unsigned bit = FT_LORA_EMBED; bit <= FT_LORA_HEAD; bit <<= 1)
        if (is_outer_key(m, bit, ".weight", key)) {
            p = model_outer_param(m, bit, false);
            return p && saved_module(m, p) ? p : NULL;
        }
    return NULL;
}

/* The error for adapter tensor t (key) that does not have p's shape: a vocabulary that
 * differs from the model's (the model takes the adapter's vocabulary from its embedding
 * and head tensors, ft_lora_config.vocab_size: another adapter's) says so. */
static int shape_error(const ft_model *m, const ft_st_tensor *t, const char *key,
                       const ft_param *p, ft_err *err)
{
    int64_t V = m->cfg.vocab_size;
    for (int d = 0; d < p->ndim && t->ndim == p->ndim; d++)
        if (p->shape[d] == V && t->shape[d] != V)
            return ft_fail(err, "%s: tensor '%s' is for a vocabulary of %lld tokens, the model "
                                "(with the adapter it was loaded for) has %lld",
                           t->file, key, (long long)t->shape[d], (long long)V);
    /* a pair's rank: r, or its rank_pattern key */
    const char *why = p->is_lora && p->ndim > 1 ? ": its pair's rank is r or the rank_pattern "
                                                  "key of adapter_config.json that matches it"
                                                : "";
    if (p->ndim > 1)
        return ft_fail(err, "%s: tensor '%s' has the wrong shape (expected [%lld, %lld]%s)",
                       t->file, key, (long long)p->shape[0], (long long)p->shape[1], why);
    return ft_fail(err, "%s: tensor '%s' has the wrong shape (expected [%lld])", t->file, key,
                   (long long)p->shape[0]);
}

static void saved_names(unsigned mods, char *out, size_t n)
{
    snprintf(out, n, "%s%s%s", mods & FT_SAVE_EMBED ? "embed_tokens" : "",
             mods == (FT_SAVE_EMBED | FT_SAVE_HEAD) ? ", " : "",
             mods & FT_SAVE_HEAD ? "lm_head" : mods ? "" : "none");
}

/* target_params as PEFT's target_parameters names */
static const char *params_names(unsigned t, char *out, size_t n)
{
    snprintf(out, n, "%s%s%s%s", t & FT_LORA_PARAM_ROUTER ? "gate.weight " : "",
             t & FT_LORA_PARAM_GATE_UP ? "gate_up_proj " : "",
             t & FT_LORA_PARAM_DOWN ? "down_proj " : "", t ? "" : "none");
    return out;
}

/* Every pair of the adapter's settings cfg (rank_pattern / alpha_pattern) has the rank
 * and the scaling of the model's: else the error names the first module that differs. */
static int same_pairs(const ft_model *m, const ft_lora_config *cfg, const char *dir,
                      ft_err *err)
{
    /* over the model's pairs (a tied head's pair, which PEFT's target_modules leave out:
     * the embedding's) */
    ft_lora_config c = *cfg;
    c.targets = m->opt.lora.targets;
    ft_lora_ranks k;
    if (ft_lora_ranks_init(&k, &m->cfg, &c, m->lora_mask, ft_model_tied_lora(m), err))
        return ft_fail_prefix(err, "%s/adapter_config.json", dir);
    const ft_lora_ranks *w = &m->lora_rk;
    char name[160] = "";
    ft_lora_pair have = {0, 0}, want = {0, 0};
    for (int l = 0; l < k.L && !name[0]; l++) {
        for (int p = 0; p < FT_NPROJ && !name[0]; p++)
            if (ft_lora_proj_pair(&k, l, p).r != ft_lora_proj_pair(w, l, p).r ||
                ft_lora_proj_pair(&k, l, p).s != ft_lora_proj_pair(w, l, p).s) {
                have = ft_lora_proj_pair(&k, l, p);
                want = ft_lora_proj_pair(w, l, p);
                snprintf(name, sizeof name, "layers.%d.%s", l,
                         ft_layer_proj_path(&m->cfg, l, (ft_proj)p));
            }
        for (int j = 0; j < 3 && !name[0]; j++) {
            ft_lora_pair a = j == 0 ? k.router[l] : k.experts[2 * l + j - 1];
            ft_lora_pair b = j == 0 ? w->router[l] : w->experts[2 * l + j - 1];
            if (a.r != b.r || a.s != b.s) {
                have = a;
                want = b;
                snprintf(name, sizeof name, "layers.%d.mlp.%s", l,
                         j == 0 ? "gate.weight" : j == 1 ? "experts.gate_up_proj"
                                                         : "experts.down_proj");
            }
        }
    }
    for (int j = 0; j < 2 && !name[0]; j++) {
        ft_lora_pair a = j == 0 ? k.embed : k.head, b = j == 0 ? w->embed : w->head;
        if (a.r != b.r || a.s != b.s) {
            have = a;
            want = b;
            snprintf(name, sizeof name, "%s", j == 0 ? "embed_tokens" : "lm_head");
        }
    }
    ft_lora_ranks_free(&k);
    if (name[0])
        return ft_fail(err, "%s/adapter_config.json: the pair on %s has rank %d and scaling %g "
                            "(r, lora_alpha, rank_pattern, alpha_pattern), the model's LoRA "
                            "settings give it rank %d and scaling %g",
                       dir, name, have.r, have.s, want.r, want.s);
    return 0;
}

int model_read_adapter(ft_model *m, const char *dir, int unit, ft_err *err)
{
    if (m->opt.mode != FT_TRAIN_LORA)
        return ft_fail(err, "%s: loading a LoRA adapter needs a model loaded in LoRA mode", dir);
    ft_lora_config cfg;
    if (ft_lora_config_load(&cfg, dir, err))
        return -1;
    snprintf(cfg.module_prefix, sizeof cfg.module_prefix, "%s", m->cfg.module_prefix);
    if (ft_lora_resolve_moe(&cfg, m->cfg.num_experts > 0 && !m->cfg.moe_lora_plain, err))
        return ft_fail_prefix(err, "%s/adapter_config.json", dir);
    const ft_lora_config *want = &m->opt.lora;
    /* the model takes a grown vocabulary from the LoRA settings read from this adapter
     * (ft_model_load): a model built from other settings (a run config's) has the
     * checkpoint's */
    if (cfg.vocab_size && cfg.vocab_size != m->cfg.vocab_size)
        return ft_fail(err, "%s: the adapter is for a vocabulary of %lld tokens (tokens added "
                            "to the tokenizer, the embedding and head resized), the model has "
                            "%lld: training from it (tuning.lora.init_adapter) needs the same "
                            "tokens added to the run's tokenizer (model.add_special_tokens, or "
                            "model.tokenizer set to the adapter dir)",
                       dir, (long long)cfg.vocab_size, (long long)m->cfg.vocab_size);
    bool same_layers = true;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        unsigned mask;
        if (ft_lora_layer_mask(&cfg, l, &mask, err))
            return ft_fail_prefix(err, "%s/adapter_config.json", dir);
        same_layers &= (mask & ft_layer_lora_projections(&m->cfg, l)) == m->lora_mask[l];
    }
    if (cfg.dora != want->dora)
        return ft_fail(err, "%s/adapter_config.json: use_dora=%s differs from the model's LoRA "
                            "settings (use_dora=%s)",
                       dir, cfg.dora ? "true" : "false", want->dora ? "true" : "false");
    if (cfg.r != want->r || !same_layers || cfg.rslora != want->rslora ||
        fabsf(cfg.alpha - want->alpha) > 0)
        return ft_fail(err,
                       "%s/adapter_config.json: r=%d, lora_alpha=%g, use_rslora=%d or the "
                       "target modules differ from the model's LoRA settings (r=%d, alpha=%g, "
                       "rslora=%d)",
                       dir, cfg.r, cfg.alpha, cfg.rslora, want->r, want->alpha, want->rslora);
    char have_p[64], want_p[64];
    if (cfg.target_params != want->target_params)
        return ft_fail(err, "%s/adapter_config.json: key 'target_parameters' (%s) differs from "
                            "the model's LoRA settings (%s)",
                       dir, params_names(cfg.target_params, have_p, sizeof have_p),
                       params_names(want->target_params, want_p, sizeof want_p));
    if (same_pairs(m, &cfg, dir, err))
        return -1;
    bool tied = m->cfg.tie_word_embeddings;
    if (tied && (want->targets & FT_LORA_OUTER) &&
        cfg.ensure_weight_tying != want->ensure_weight_tying)
        return ft_fail(err, "%s/adapter_config.json: key 'ensure_weight_tying' (%s) differs from "
                            "the model's LoRA settings (%s): with LoRA on embed_tokens / lm_head "
                            "of a tied model it says whether the head's pair is the "
                            "embedding's",
                       dir, cfg.ensure_weight_tying ? "true" : "false",
                       want->ensure_weight_tying ? "true" : "false");
    if (tied && cfg.modules_to_save && !cfg.ensure_weight_tying)
        return ft_fail(err, "%s/adapter_config.json: key 'modules_to_save' on a model with tied "
                            "word embeddings without ensure_weight_tying (PEFT then trains "
                            "separate copies, untying them) differs from the model's LoRA "
                            "settings (ensure_weight_tying: one copy shared by both)",
                       dir);
    if (ft_lora_saved_modules(&cfg, tied) != want->modules_to_save) {
        char have[64], need[64];
        saved_names(ft_lora_saved_modules(&cfg, tied), have, sizeof have);
        saved_names(want->modules_to_save, need, sizeof need);
        return ft_fail(err, "%s/adapter_config.json: key 'modules_to_save' (%s) differs from the "
                            "model's LoRA settings (%s)",
                       dir, have, need);
    }
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, dir, "adapter_model", err))
        return -1;
    int rc = 0;
    unsigned filled = 0; /* vocab_bit of the base weights the adapter gave in full */
    for (size_t i = 0; i < m->n_params && rc == 0; i++) {
        ft_param *p = &m->params[i];
        if (!(p->is_lora || saved_module(m, p)) || (unit >= 0 && p->unit != unit))
            continue;
        if (saved_module(m, p))
            filled |= model_vocab_bit(m, p);
        char key[sizeof p->name + 32];
        adapter_key(m, p, key, sizeof key);
        const ft_st_tensor *t = ft_ckpt_find(ck, key);
        if (!t) {
            rc = ft_fail(err, "%s: adapter tensor '%s' is missing", dir, key);
        } else if (t->ndim != p->ndim || t->shape[0] != p->shape[0] ||
                   (p->ndim > 1 && t->shape[1] != p->shape[1])) {
            rc = shape_error(m, t, key, p, err);
        } else {
            rc = ft_model_param_from_st(m, p, t, err);
        }
    }
    /* the embedding's and the head's base weights, where the adapter holds them, in the
     * order PEFT's loading fills the model (module order: on a tied model the head's is
     * the one kept) */
    for (size_t i = 0; i < 2 && rc == 0; i++) {
        char key[256];
        outer_key(m, i == 0 ? FT_LORA_EMBED : FT_LORA_HEAD, ".base_layer.weight", key,
                  sizeof key);
        const ft_st_tensor *t = ft_ckpt_find(ck, key);
        ft_param *p = t ? embedding_base_layer(m, t->name) : NULL;
        if (!p || p->is_lora)
            continue;
        if (t->ndim != 2 || t->shape[0] != p->shape[0] || t->shape[1] != p->shape[1])
            rc = shape_error(m, t, t->name, p, err);
        /* (known to every rank of a strategy that reads a unit each, the one saving too) */
        if (rc == 0)
            m->outer_base_read |= i == 0 ? FT_LORA_EMBED : FT_LORA_HEAD;
        if (unit >= 0 && p->unit != unit)
            continue;
        if (rc == 0 && p->data)
            rc = ft_model_param_from_st(m, p, t, err);
        filled |= model_vocab_bit(m, p);
    }
    /* a resized vocabulary's embedding and head saved in full (not tied again) */
    for (size_t i = 0; i < ft_ckpt_count(ck) && rc == 0; i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        ft_param *p = resized_base(m, t->name);
        if (!p || (unit >= 0 && p->unit != unit) ||
            !is_outer_key(m, model_vocab_bit(m, p), ".weight", t->name))
            continue;
        if (t->ndim != 2 || t->shape[0] != p->shape[0] || t->shape[1] != p->shape[1])
            rc = shape_error(m, t, t->name, p, err);
        else if (p->data)
            rc = ft_model_param_from_st(m, p, t, err);
        filled |= model_vocab_bit(m, p);
    }
    /* a resized model's new rows exist only in the adapter: every vocabulary-sized base
     * weight must come from it (PEFT's save_embedding_layers leaves the head out when
     * only the embedding carries LoRA, and PEFT's own loading then keeps random rows) */
    for (size_t i = 0; i < m->n_params && rc == 0 && m->base_vocab; i++) {
        const ft_param *p = &m->params[i];
        unsigned bit = model_vocab_bit(m, p);
        if (bit && !(filled & bit) && (unit < 0 || p->unit == unit))
            rc = ft_fail(err, "%s: the adapter is for a vocabulary of %lld tokens (config.json "
                              "has %lld) but holds no '%s' of that size to fill the added "
                              "tokens' rows",
                         dir, (long long)m->cfg.vocab_size, (long long)m->base_vocab, p->name);
    }
    for (size_t i = 0; i < ft_ckpt_count(ck) && rc == 0 && unit < 0; i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        if (!adapter_param(m, t->name))
            rc = ft_fail(err, "%s: unexpected adapter tensor '%s'", t->file, t->name);
    }
    ft_ckpt_close(ck);
    /* tied pairs (ensure_weight_tying): PEFT's loading fills the one storage from the
     * head's keys last (a unit-by-unit read syncs once the head's unit is in) */
    if (rc == 0 && unit < 0)
        rc = ft_model_tied_lora_sync(m, err);
    return rc;
}

int ft_model_load_adapter(ft_model *m, const char *dir, ft_err *err)
{
    return model_read_adapter(m, dir, -1, err);
}

int ft_model_save_adapter(ft_model *m, const char *dir, const char *base_model, ft_err *err)
{
    if (m->opt.mode != FT_TRAIN_LORA)
        return ft_fail(err, "%s: the model has no LoRA weights to save", dir);
    if (ft_mkdir_p(dir, err))
        return -1;
    ft_st_writer *w = ft_st_writer_new();
    if (!w)
        return ft_fail(err, "out of memory");
    int rc = ft_st_writer_metadata(w, "format", "pt", err);
    char head[256];
    outer_key(m, FT_LORA_HEAD, ".weight", head, sizeof head);
    for (size_t i = 0; i < m->n_params && rc == 0; i++) {
        const ft_param *p = &m->params[i];
        char key[sizeof p->name + 32];
        adapter_key(m, p, key, sizeof key);
        if (p->is_lora || saved_module(m, p))
            rc = model_param_to_writer_as(m, p, key, w, err);
        if (rc == 0 && saved_module(m, p) && p->unit == 0 && tied_head_alias(m, head))
            rc = model_param_to_writer_as(m, p, head, w, err);
    }
    /* The base weights of the embedding and the head that carry LoRA, when an adapter's
     * base_layer replaced them (PEFT writes them always; without them PEFT keeps the base
     * model's own, which are then the same). */
    for (size_t i = 0; i < 2 && rc == 0; i++) {
        char key[256];
        outer_key(m, i == 0 ? FT_LORA_EMBED : FT_LORA_HEAD, ".base_layer.weight", key,
                  sizeof key);
        ft_param *p = embedding_base_layer(m, key);
        if (!p || !(m->outer_base_read & (i == 0 ? FT_LORA_EMBED : FT_LORA_HEAD)))
            continue;
        if (!p->data)
            rc = ft_fail(err, "%s: the adapter read replaced the base weight of %s "
                              "(%s), which is not bound here to save it again (a strategy "
                              "gathers it for its save)",
                         dir, p->name, key);
        else
            rc = model_param_to_writer_as(m, p, key, w, err);
    }
    /* A grown vocabulary: the embedding and the head neither trained nor targeted, in
     * full, as PEFT's save_embedding_layers writes them (a tied head: the embedding again
     * under the head's key) */
    for (size_t i = 0; i < 2 && rc == 0; i++) {
        char key[256];
        outer_key(m, i == 0 ? FT_LORA_EMBED : FT_LORA_HEAD, ".weight", key, sizeof key);
        ft_param *p = resized_base(m, key);
        if (!p)
            continue;
        if (!p->data)
            rc = ft_fail(err, "%s: the resized vocabulary's %s is not held whole by this "
                              "distributed strategy to save it (save with dist.strategy ddp "
                              "or zero1/2)",
                         dir, p->name);
        else
            rc = model_param_to_writer_as(m, p, key, w, err);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (rc == 0)
        rc = ft_st_writer_save(w, path, err);
    ft_st_writer_free(w);
    /* target_modules names the model's own modules ("all-linear" holds every bit) */
    ft_lora_config lc = m->opt.lora;
    lc.targets &= ft_lora_projections(&m->cfg) | FT_LORA_OUTER;
    if (rc == 0)
        rc = ft_lora_config_save(&lc, dir, base_model, err);
    return rc;
}
