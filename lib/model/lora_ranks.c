/* The rank and scaling of each LoRA pair (see lora_ranks.h). The module names are PEFT's
 * current_key, which its get_pattern_key matches the pattern keys against: a linear
 * layer's module path (<module_prefix>layers.N.self_attn.q_proj; a qwen2_moe shared
 * expert's ...mlp.shared_expert.gate_proj), the embedding's <module_prefix>embed_tokens,
 * "lm_head", and for a target_parameters pair the parameter's path:
 * <module_prefix>layers.N.mlp.gate.weight (the router), ...mlp.experts.gate_up_proj and
 * ...mlp.experts.down_proj. */
#include "model/lora_ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pair of the module `name`; marks the pattern keys that match it in hit_r, hit_a. */
static ft_lora_pair pair_of(const ft_lora_config *lc, const char *name, bool *hit_r,
                            bool *hit_a)
{
    const ft_lora_patterns *ps[2] = {&lc->rank_pattern, &lc->alpha_pattern};
    bool *hit[2] = {hit_r, hit_a};
    /* every key that matches (PEFT's unmatched-key check counts those a first match
     * shadows as matched too) */
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < ps[j]->n; i++)
            if (!hit[j][i])
                hit[j][i] = ft_lora_pattern_matches(ps[j]->p[i].key, name);
    int r = ft_lora_module_rank(lc, name);
    return (ft_lora_pair){r, ft_lora_scaling_of(lc, r, ft_lora_module_alpha(lc, name))};
}

int ft_lora_ranks_init(ft_lora_ranks *k, const ft_model_config *c, const ft_lora_config *lc,
                       const unsigned *lora_mask, bool tied_pair, ft_err *err)
{
    memset(k, 0, sizeof *k);
    int L = c->num_layers;
    k->L = L;
    size_t n = L > 0 ? (size_t)L : 1;
    k->proj = calloc(n * FT_NPROJ, sizeof *k->proj);
    k->router = calloc(n, sizeof *k->router);
    k->experts = calloc(2 * n, sizeof *k->experts);
    bool hit_r[FT_LORA_MAX_PATTERNS] = {0}, hit_a[FT_LORA_MAX_PATTERNS] = {0};
    if (!k->proj || !k->router || !k->experts) {
        ft_lora_ranks_free(k);
        return ft_fail(err, "out of memory");
    }
    const char *mp = c->module_prefix;
    char name[256];
    for (int l = 0; l < L; l++) {
        for (int p = 0; p < FT_NPROJ; p++)
            if (lora_mask[l] & (1u << p)) {
                snprintf(name, sizeof name, "%slayers.%d.%s", mp, l,
                         ft_layer_proj_path(c, l, (ft_proj)p));
                k->proj[(size_t)l * FT_NPROJ + p] = pair_of(lc, name, hit_r, hit_a);
            }
        if (!ft_layer_sparse(c, l))
            continue;
        if (lc->target_params & FT_LORA_PARAM_ROUTER) {
            snprintf(name, sizeof name, "%slayers.%d.mlp.gate.weight", mp, l);
            k->router[l] = pair_of(lc, name, hit_r, hit_a);
        }
        for (int h = 0; h < 2; h++)
            if (lc->target_params & (h == 0 ? FT_LORA_PARAM_GATE_UP : FT_LORA_PARAM_DOWN)) {
                snprintf(name, sizeof name, "%slayers.%d.mlp.experts.%s", mp, l,
                         h == 0 ? "gate_up_proj" : "down_proj");
                k->experts[2 * l + h] = pair_of(lc, name, hit_r, hit_a);
            }
    }
    if (lc->targets & FT_LORA_EMBED) {
        snprintf(name, sizeof name, "%sembed_tokens", mp);
        k->embed = pair_of(lc, name, hit_r, hit_a);
    }
    if (lc->targets & FT_LORA_HEAD)
        k->head = pair_of(lc, "lm_head", hit_r, hit_a);
    const ft_lora_patterns *ps[2] = {&lc->rank_pattern, &lc->alpha_pattern};
    const bool *hit[2] = {hit_r, hit_a};
    static const char *const kind[2] = {"rank_pattern", "alpha_pattern"};
    for (int j = 0; j < 2; j++)
        for (int i = 0; i < ps[j]->n; i++)
            if (!hit[j][i]) {
                ft_fail(err, "%s: '%s' matches none of the modules that LoRA targets on this "
                             "model (names as PEFT's: %slayers.N.self_attn.q_proj, "
                             "%sembed_tokens, lm_head; a MoE's %slayers.N.mlp.gate.weight, "
                             "%slayers.N.mlp.experts.gate_up_proj / down_proj)",
                        ps[j]->origin[0] ? ps[j]->origin : kind[j], ps[j]->p[i].key, mp, mp,
                        mp, mp);
                ft_lora_ranks_free(k);
                return -1;
            }
    /* the head's pair is the embedding's (transposed), so of its rank; PEFT keeps the
     * scaling of the head's own rank and alpha (its LoraLayer.update_layer with the
     * lm_head's pattern values, the tied tensors put in afterwards) */
    if (tied_pair)
        k->head.r = k->embed.r;
    return 0;
}

void ft_lora_ranks_free(ft_lora_ranks *k)
{
    free(k->proj);
    free(k->router);
    free(k->experts);
    memset(k, 0, sizeof *k);
}

int ft_lora_ranks_max(const ft_lora_ranks *k, int which, int l0, int l1)
{
    int r = 0;
    for (int l = l0 < 0 ? 0 : l0; l < l1 && l < k->L; l++) {
        int x = which < FT_NPROJ               ? ft_lora_proj_pair(k, l, which).r
                : which == FT_LORA_RANK_ROUTER ? k->router[l].r
                                               : k->experts[2 * l + (which - FT_NPROJ - 1)].r;
        if (x > r)
            r = x;
    }
    return r;
}

int ft_lora_ranks_max_dense(const ft_lora_ranks *k)
{
    int r = k->embed.r > k->head.r ? k->embed.r : k->head.r;
    for (int w = 0; w <= FT_LORA_RANK_ROUTER; w++) {
        int x = ft_lora_ranks_max(k, w, 0, k->L);
        if (x > r)
            r = x;
    }
    return r;
}
