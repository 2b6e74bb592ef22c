/* Per-row losses for preference objectives (DPO, ORPO) and the adapter switch (model.h). */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

int ft_model_forward_rows(ft_model *m, const ft_batch *b, double *row_nll, ft_err *err)
{
    if (b->position_ids)
        return ft_fail(err, "per-row losses need one sequence a row (no packing)");
    memset(row_nll, 0, (size_t)(b->B > 0 ? b->B : 0) * sizeof *row_nll);
    m->row_nll = row_nll;
    int rc = ft_model_forward(m, b, NULL, NULL, err);
    m->row_nll = NULL;
    return rc;
}

int ft_model_backward_rows(ft_model *m, const float *row_scale, ft_err *err)
{
    m->row_scale = row_scale;
    int rc = ft_model_backward(m, 0.0f, err);
    m->row_scale = NULL;
    return rc;
}

void ft_model_set_adapter(ft_model *m, bool enabled) { m->adapter_off = !enabled; }
