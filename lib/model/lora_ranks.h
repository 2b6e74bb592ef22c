/* The rank and the scaling of every LoRA pair of a model, as PEFT gives them under
 * rank_pattern / alpha_pattern (lora.h's ft_lora_patterns): each pair's module name, as
 * PEFT's current_key spells it, picks its rank and alpha. One table serves the model
 * (lib/model/model.c: the shapes of the pairs, the scalings of the passes) and the memory
 * planner (lib/memory/memplan.c), so that the two cannot drift apart. */
#ifndef FT_LORA_RANKS_H
#define FT_LORA_RANKS_H

#include "core/ft_error.h"
#include "formats/hf_config.h"
#include "formats/lora.h"

/* One pair: rank r (0: the module has no pair) and scaling s (alpha / r, or
 * alpha / sqrt(r) with rsLoRA). */
typedef struct ft_lora_pair {
    int r;
    float s;
} ft_lora_pair;

typedef struct ft_lora_ranks {
    int L;
    ft_lora_pair *proj;    /* [L * FT_NPROJ]: layer l's module p at l * FT_NPROJ + p */
    ft_lora_pair *router;  /* [L]: a sparse layer's router (target_params ROUTER) */
    ft_lora_pair *experts; /* [L * 2]: its fused experts' gate_up (2 l), down (2 l + 1) */
    ft_lora_pair embed, head;
} ft_lora_ranks;

/* Fills k for model c with LoRA settings lc: pairs on the projections of layer l in
 * lora_mask[l], on the router and experts of the sparse layers in lc->target_params, on
 * the embedding and the head in lc->targets (FT_LORA_EMBED, FT_LORA_HEAD); tied_pair (the
 * head's pair is the embedding's transposed, ensure_weight_tying): the head's rank is the
 * embedding's, its scaling its own keys' alpha / r, as PEFT has them. Error: a key of
 * rank_pattern or alpha_pattern that matches none of those modules (PEFT warns and
 * ignores it), naming the pattern's origin. k is zeroed first; free it with
 * ft_lora_ranks_free. */
int ft_lora_ranks_init(ft_lora_ranks *k, const ft_model_config *c, const ft_lora_config *lc,
                       const unsigned *lora_mask, bool tied_pair, ft_err *err);
void ft_lora_ranks_free(ft_lora_ranks *k);

/* Layer l's module p ({0, 0} in a table never filled: a model without LoRA). */
static inline ft_lora_pair ft_lora_proj_pair(const ft_lora_ranks *k, int l, int p)
{
    return k->proj ? k->proj[(size_t)l * FT_NPROJ + (size_t)p] : (ft_lora_pair){0, 0.0f};
}

/* The largest rank over layers [l0, l1) of module p's pairs (p < FT_NPROJ), of the
 * router's (FT_NPROJ) or of the experts' gate_up (FT_NPROJ + 1) and down (FT_NPROJ + 2);
 * 0: none. */
#define FT_LORA_RANK_ROUTER FT_NPROJ
#define FT_LORA_RANK_GATE_UP (FT_NPROJ + 1)
#define FT_LORA_RANK_DOWN (FT_NPROJ + 2)
int ft_lora_ranks_max(const ft_lora_ranks *k, int which, int l0, int l1);

/* The largest rank of the pairs whose dh the model's shared scratch (d_lora_h [N, r])
 * holds: every projection's, the router's, the embedding's and the head's (not the
 * experts', which have their own); 0: none. */
int ft_lora_ranks_max_dense(const ft_lora_ranks *k);

#endif
