/* PEFT LoRA adapters: adapter_config.json + adapter_model.safetensors, keys
 * base_model.model.<module path>.lora_{A,B}.weight (no adapter name on disk). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/fsutil.h"
#include "model/model_internal.h"
#include "formats/safetensors.h"

int model_read_adapter(ft_model *m, const char *dir, int unit, ft_err *err)
{
    if (m->opt.mode != FT_TRAIN_LORA)
        return ft_fail(err, "%s: loading a LoRA adapter needs a model loaded in LoRA mode", dir);
    ft_lora_config cfg;
    if (ft_lora_config_load(&cfg, dir, err))
        return -1;
    snprintf(cfg.module_prefix, sizeof cfg.module_prefix, "%s", m->cfg.module_prefix);
    const ft_lora_config *want = &m->opt.lora;
    bool same_layers = true;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        unsigned mask;
        if (ft_lora_layer_mask(&cfg, l, &mask, err))
            return ft_fail_prefix(err, "%s/adapter_config.json", dir);
        same_layers &= (mask & ft_block_projections(&m->cfg)) == m->lora_mask[l];
    }
    if (cfg.r != want->r || !same_layers || cfg.rslora != want->rslora ||
        fabsf(cfg.alpha - want->alpha) > 0)
        return ft_fail(err,
                       "%s/adapter_config.json: r=%d, lora_alpha=%g, use_rslora=%d or the "
                       "target modules differ from the model's LoRA settings (r=%d, alpha=%g, "
                       "rslora=%d)",
                       dir, cfg.r, cfg.alpha, cfg.rslora, want->r, want->alpha, want->rslora);
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, dir, "adapter_model", err))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < m->n_params && rc == 0; i++) {
        ft_param *p = &m->params[i];
        if (!p->is_lora || (unit >= 0 && p->unit != unit))
            continue;
        const ft_st_tensor *t = ft_ckpt_find(ck, p->name);
        if (!t) {
            rc = ft_fail(err, "%s: adapter tensor '%s' is missing", dir, p->name);
        } else if (t->ndim != 2 || t->shape[0] != p->shape[0] || t->shape[1] != p->shape[1]) {
            rc = ft_fail(err, "%s: tensor '%s' has the wrong shape (expected [%lld, %lld])",
                         t->file, p->name, (long long)p->shape[0], (long long)p->shape[1]);
        } else {
            rc = ft_model_param_from_st(m, p, t, err);
        }
    }
    for (size_t i = 0; i < ft_ckpt_count(ck) && rc == 0 && unit < 0; i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        ft_param *p = ft_model_find_param(m, t->name);
        if (!p || !p->is_lora)
            rc = ft_fail(err, "%s: unexpected adapter tensor '%s'", t->file, t->name);
    }
    ft_ckpt_close(ck);
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
    for (size_t i = 0; i < m->n_params && rc == 0; i++) {
        const ft_param *p = &m->params[i];
        if (p->is_lora)
            rc = ft_model_param_to_writer(m, p, w, err);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (rc == 0)
        rc = ft_st_writer_save(w, path, err);
    ft_st_writer_free(w);
    /* target_modules names the model's own modules ("all-linear" holds every bit) */
    ft_lora_config lc = m->opt.lora;
    lc.targets &= ft_block_projections(&m->cfg);
    if (rc == 0)
        rc = ft_lora_config_save(&lc, dir, base_model, err);
    return rc;
}
