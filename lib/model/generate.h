/* Greedy decoding with a loaded model.
 *
 * From a prompt of token ids, repeatedly takes the argmax of the last position's logits
 * (the first index of the maximum, as torch.argmax) and appends it, until an end-of-
 * sequence id is produced or max_new_tokens ids have been appended: what transformers'
 * model.generate(input_ids, do_sample=False, max_new_tokens=N) returns after the prompt.
 * The EOS id that stopped the loop is part of the output, as in transformers. */
#ifndef FT_GENERATE_H
#define FT_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/ft_error.h"
#include "formats/hf_config.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define FT_GEN_MAX_EOS (FT_MAX_EOS + 1)

typedef struct ft_gen_options {
    int max_new_tokens; /* >= 1 */
    int32_t eos[FT_GEN_MAX_EOS];
    int n_eos; /* 0: stop only at max_new_tokens */
} ft_gen_options;

/* The ids that end generation: config.json's eos_token_id (one or a list) and the
 * tokenizer's eos_token (tok may be NULL), without duplicates. */
void ft_gen_eos_ids(const ft_model_config *cfg, const ft_tokenizer *tok, ft_gen_options *o);

/* Appends the generated ids to out (not cleared; the prompt is not copied). *stopped_eos
 * (may be NULL) tells whether an EOS ended it. Errors: an empty prompt, a bad token id,
 * out of memory (from the model's forward). */
int ft_generate_greedy(ft_model *m, const int32_t *prompt, int n_prompt,
                       const ft_gen_options *o, ft_ids *out, bool *stopped_eos, ft_err *err);

#endif
