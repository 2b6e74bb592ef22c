/* LoRA on embed_tokens / lm_head of a model with tied word embeddings under PEFT's
 * ensure_weight_tying (peft/tuners/lora/model.py _create_and_replace's tied_adapter): PEFT
 * puts its pair on the embedding only and gives lm_head the embedding's pair transposed,
 *
 *     lm_head.lora_A = lora_embedding_B^T [r, C],   lm_head.lora_B = lora_embedding_A^T [V, r]
 *
 * as two more nn.Parameters on the same storage. So the head computes with the
 * embedding's values, each of the four parameters gets its own gradient (the embedding's
 * from the embedding's path, the head's from the head's), clipping counts all four, and
 * torch's AdamW (one tensor after another, in the model's parameter order: the embedding's
 * first) steps the one storage twice, with two moment states:
 *
 *     x1 = x0 (1 - lr wd) - u_embedding,   x2 = x1 (1 - lr wd) - u_head.
 *
 * The model keeps the head's pair as parameters of its own holding the same (transposed)
 * values, so that forward, backward, the saved keys and the merge (which adds the delta
 * twice, as PEFT's does) need nothing else; around each optimizer step over the flat
 * buffer the head's fp32 masters are zeroed first, so that the step leaves -u_head there
 * (AdamW's update does not depend on the value it updates but through the decay, and
 * 0 decays to 0), then folded into the embedding's, x2 = x1 (1 - lr wd) + (-u_head), and
 * set to its transpose again. An adapter's values: the head's keys are read last, as
 * PEFT's loading fills the storage from them (ft_model_tied_lora_sync). */
#include "model/model_internal.h"

#define F_(p, n) model_view(m, (p), (size_t)(n), FT_F32)

bool ft_model_tied_lora(const ft_model *m)
{
    return m->opt.mode == FT_TRAIN_LORA && m->cfg.tie_word_embeddings &&
           m->opt.lora.ensure_weight_tying && (m->opt.lora.targets & FT_LORA_OUTER);
}

/* The four parameters: the embedding's A [r, V] and B [C, r], the head's A [r, C] and
 * B [V, r]; NULL when the model has no such pair. */
static bool pairs(ft_model *m, ft_param **ea, ft_param **eb, ft_param **ha, ft_param **hb)
{
    static const struct {
        unsigned bit;
        const char *suffix;
    } keys[4] = {{FT_LORA_EMBED, ".lora_embedding_A"}, {FT_LORA_EMBED, ".lora_embedding_B"},
                 {FT_LORA_HEAD, ".lora_A.weight"}, {FT_LORA_HEAD, ".lora_B.weight"}};
    ft_param **out[4] = {ea, eb, ha, hb};
    for (int i = 0; i < 4; i++) {
        char key[256];
        ft_model_outer_key(&m->cfg, keys[i].bit, keys[i].suffix, key, sizeof key);
        *out[i] = ft_model_find_param(m, key);
    }
    return ft_model_tied_lora(m) && *ea && *eb && *ha && *hb;
}

/* dst [rows, cols] = src^T (src [cols, rows]), fp32: the r = 1 case of the experts'
 * column split, a transposing copy (ft_moe_lora_b_split). */
static void transpose_to(ft_model *m, float *dst, const float *src, int64_t rows, int64_t cols)
{
    size_t n = (size_t)(rows * cols);
    ft_moe_lora_b_split(F_(dst, n), F_((float *)src, n), (int)cols, 1, (int)rows);
}

int ft_model_tied_lora_sync(ft_model *m, ft_err *err)
{
    ft_param *ea, *eb, *ha, *hb;
    if (!pairs(m, &ea, &eb, &ha, &hb))
        return 0;
    if (!ea->data || !eb->data || !ha->data || !hb->data)
        return ft_fail(err, "LoRA tied to the embedding (ensure_weight_tying): the embedding's "
                            "and the head's pairs are not both held here");
    transpose_to(m, eb->data, ha->data, eb->shape[0], eb->shape[1]);
    transpose_to(m, ea->data, hb->data, ea->shape[0], ea->shape[1]);
    ft_model_sync_compute(m);
    return 0;
}

bool ft_model_tied_lora_layout(ft_model *m, ft_tied_pair out[2])
{
    ft_param *ea, *eb, *ha, *hb;
    if (!pairs(m, &ea, &eb, &ha, &hb))
        return false;
    out[0] = (ft_tied_pair){eb->offset, ha->offset, eb->shape[0], eb->shape[1]};
    out[1] = (ft_tied_pair){ea->offset, hb->offset, ea->shape[0], ea->shape[1]};
    return true;
}

void ft_model_transpose_f32(ft_model *m, float *dst, const float *src, int64_t rows,
                            int64_t cols)
{
    transpose_to(m, dst, src, rows, cols);
}

void ft_model_tied_lora_before_step(ft_model *m, float *params)
{
    ft_param *ea, *eb, *ha, *hb;
    if (!pairs(m, &ea, &eb, &ha, &hb))
        return;
    ft_zero(F_(params + ha->offset, ha->numel), ha->numel);
    ft_zero(F_(params + hb->offset, hb->numel), hb->numel);
}

void ft_model_tied_lora_after_step(ft_model *m, float *params, float lr, float weight_decay)
{
    ft_param *ea, *eb, *ha, *hb;
    if (!pairs(m, &ea, &eb, &ha, &hb))
        return;
    float keep = 1.0f - lr * weight_decay; /* (the AdamW kernels' factor) */
    const struct {
        ft_param *e, *h;
    } tied[2] = {{eb, ha}, {ea, hb}};
    for (int i = 0; i < 2; i++) {
        float *e = params + tied[i].e->offset, *h = params + tied[i].h->offset;
        int64_t R = tied[i].e->shape[0], C = tied[i].e->shape[1]; /* e [R, C], h [C, R] */
        size_t n = tied[i].e->numel;
        if (keep != 1.0f)
            ft_scale(F_(e, n), keep, n);
        /* e[o, j] += h[j, o]: the experts' merge-add with r = 1 */
        ft_moe_lora_b_merge_add(F_(e, n), F_(h, n), (int)R, 1, (int)C);
        transpose_to(m, h, e, C, R);
    }
}
