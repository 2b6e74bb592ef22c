/* DPO's reference with the adapter off for an adapter read from disk that trains the
 * embedding or the head in full (pref.h ft_pref_objective_keep_originals): PEFT's
 * disable_adapter() computes those modules with their ModulesToSaveWrapper's
 * original_module, which PEFT's loading fills with the base's module, or with the
 * adapter's <module>.original_module.weight where the adapter holds one (its
 * save_embedding_layers writes it beside the trained copy when the vocabulary grew; its
 * loading puts it back in the wrapper). */
#include <stdio.h>
#include <string.h>

#include "formats/safetensors.h"
#include "train/pref.h"

/* PEFT's key of a module's original values: base_model.model.<module>.original_module.weight
 * for the parameter <module>.weight; 0 when name is not a module's weight. */
static int original_key(const char *name, char *key, size_t n)
{
    const char *suffix = ".weight";
    size_t len = strlen(name), k = strlen(suffix);
    if (len <= k || strcmp(name + len - k, suffix) != 0)
        return 0;
    return snprintf(key, n, "base_model.model.%.*s.original_module.weight", (int)(len - k),
                    name) < (int)n;
}

int ft_pref_objective_keep_originals(ft_pref_objective *p, ft_model *m, const char *adapter_dir,
                                     ft_err *err)
{
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, adapter_dir, "adapter_model", err))
        return -1;
    int rc = 0;
    for (size_t i = 0; i < ft_model_param_count(m) && rc == 0; i++) {
        ft_param *q = ft_model_param(m, i);
        char key[sizeof q->name + 48];
        /* a module trained in full: trainable beside the LoRA pairs (a tied embedding is
         * the head's too: PEFT saves the one tensor under both modules' keys) */
        if (!q->trainable || q->is_lora || !original_key(q->name, key, sizeof key))
            continue;
        const ft_st_tensor *t = ft_ckpt_find(ck, key);
        if (!t)
            continue; /* not saved: the values the checkpoint gave it are the originals */
        if (t->ndim != q->ndim || t->shape[0] != q->shape[0] ||
            (q->ndim > 1 && t->shape[1] != q->shape[1]))
            rc = ft_fail(err, "%s: tensor '%s' has the wrong shape (expected [%lld, %lld], the "
                              "shape of the module it is the original of)",
                         t->file, key, (long long)q->shape[0],
                         (long long)(q->ndim > 1 ? q->shape[1] : 1));
        else
            rc = ft_model_param_from_st(m, q, t, err);
    }
    ft_ckpt_close(ck);
    if (rc || ft_pref_objective_keep_adapter(p, m, err))
        return -1;
    p->ref_lora_off = true;
    return 0;
}
