/* Per-row losses for preference objectives (DPO, ORPO) and the adapter switch (model.h). */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

int ft_model_forward_rows(ft_model *m, const ft_batch *b, double *row_nll, ft_err *err)
{
    return ft_model_forward_split(m, b, NULL, NULL, row_nll, err);
}

int ft_model_backward_rows(ft_model *m, const float *row_scale, ft_err *err)
{
    return ft_model_backward_split(m, NULL, NULL, row_scale, err);
}

int ft_model_forward_split(ft_model *m, const ft_batch *b, const int32_t *split,
                           double *nll_pre, double *row_nll, ft_err *err)
{
    if (b->position_ids)
        return ft_fail(err, "per-row losses need one sequence a row (no packing)");
    size_t B = (size_t)(b->B > 0 ? b->B : 0);
    for (size_t r = 0; split && r < B; r++)
        if (split[r] < 0 || split[r] > b->T)
            return ft_fail(err, "row %zu: split %d outside [0, %d]", r, split[r], b->T);
    memset(row_nll, 0, B * sizeof *row_nll);
    if (split)
        memset(nll_pre, 0, B * sizeof *nll_pre);
    m->row_nll = row_nll;
    m->row_split = split;
    m->row_nll_pre = nll_pre;
    int rc = ft_model_forward(m, b, NULL, NULL, err);
    m->row_nll = m->row_nll_pre = NULL;
    m->row_split = NULL;
    return rc;
}

int ft_model_backward_split(ft_model *m, const int32_t *split, const float *scale_pre,
                            const float *row_scale, ft_err *err)
{
    m->row_scale = row_scale;
    m->row_split = split;
    m->row_scale_pre = scale_pre;
    int rc = ft_model_backward(m, 0.0f, err);
    m->row_scale = m->row_scale_pre = NULL;
    m->row_split = NULL;
    return rc;
}

int ft_model_set_adapter(ft_model *m, bool enabled, ft_err *err)
{
    if (!enabled && m->opt.mode == FT_TRAIN_LORA && m->opt.lora.modules_to_save)
        return ft_fail(err, "the adapter trains %s in full (modules_to_save): with the adapter "
                       "switched off PEFT computes with the original module, which this "
                       "objective did not keep (ft_pref_objective_keep_originals, or the "
                       "engine's ft_engine_keep_reference, keeps it)",
                       m->opt.lora.modules_to_save == FT_SAVE_EMBED  ? "embed_tokens"
                       : m->opt.lora.modules_to_save == FT_SAVE_HEAD ? "lm_head"
                                                                     : "embed_tokens and lm_head");
    ft_model_set_lora(m, enabled);
    return 0;
}

void ft_model_set_lora(ft_model *m, bool enabled) { m->adapter_off = !enabled; }
