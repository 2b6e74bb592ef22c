/* The names of the embedding and the head (model.h's "outer" modules) in the two layouts
 * a model comes in (hf_config.h's ckpt_prefix and module_prefix):
 *
 *                         causal LM                     multimodal gemma3
 *   checkpoint weight     model.embed_tokens.weight     language_model.model.embed_tokens.weight
 *                         lm_head.weight                language_model.lm_head.weight
 *   module path (PEFT)    model.embed_tokens            model.language_model.embed_tokens
 *                         lm_head                       lm_head
 *
 * PEFT's adapter keys are base_model.model.<module path><suffix>: the pairs
 * (.lora_embedding_A, .lora_A.weight ...), a module trained in full (.weight), a LoRA
 * module's base weight (.base_layer.weight). Gemma3ForConditionalGeneration's lm_head is
 * the top-level model's, so its keys are a causal LM's. */
#include <stdio.h>
#include <string.h>

#include "model/model_internal.h"

void ft_model_outer_key(const ft_model_config *c, unsigned bit, const char *suffix, char *out,
                        size_t n)
{
    if (bit == FT_LORA_EMBED)
        snprintf(out, n, "base_model.model.%sembed_tokens%s", c->module_prefix, suffix);
    else
        snprintf(out, n, "base_model.model.lm_head%s", suffix);
}

void ft_model_outer_weight(const ft_model_config *c, unsigned bit, char *out, size_t n)
{
    snprintf(out, n, "%s%s", c->ckpt_prefix,
             bit == FT_LORA_EMBED ? "model.embed_tokens.weight" : "lm_head.weight");
}

int ft_model_module_weight(const ft_model_config *c, const char *path, size_t len, char *out,
                           size_t n)
{
    size_t nm = strlen(c->module_prefix);
    if (len > nm && strncmp(path, c->module_prefix, nm) == 0)
        snprintf(out, n, "%smodel.%.*s.weight", c->ckpt_prefix, (int)(len - nm), path + nm);
    else if (len == 7 && strncmp(path, "lm_head", 7) == 0)
        ft_model_outer_weight(c, FT_LORA_HEAD, out, n);
    else
        return -1;
    return 0;
}

ft_param *model_outer_param(ft_model *m, unsigned bit, bool tied_head)
{
    char name[160];
    ft_model_outer_weight(&m->cfg, bit, name, sizeof name);
    ft_param *p = ft_model_find_param(m, name);
    if (!p && bit == FT_LORA_HEAD && tied_head && m->cfg.tie_word_embeddings)
        p = model_outer_param(m, FT_LORA_EMBED, false);
    return p;
}

unsigned model_vocab_bit(const ft_model *m, const ft_param *p)
{
    char name[160];
    for (unsigned bit = FT_LORA_EMBED; bit <= FT_LORA_HEAD; bit <<= 1) {
        ft_model_outer_weight(&m->cfg, bit, name, sizeof name);
        if (strcmp(p->name, name) == 0)
            return bit;
    }
    return 0;
}
