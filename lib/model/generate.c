/* Greedy decoding (see generate.h).
 *
 * There is no KV cache yet: every new token reruns the full forward over the prompt and
 * what has been generated so far, so generating N tokens after a prompt of P costs about
 * N forwards of P..P+N tokens (quadratic in the length). That is fine for evaluation of
 * short completions; a cache in the model's attention is the fix when it is not. */
#include "model/generate.h"

#include <stdlib.h>
#include <string.h>

static void add_eos(ft_gen_options *o, int32_t id)
{
    if (id < 0)
        return;
    for (int i = 0; i < o->n_eos; i++)
        if (o->eos[i] == id)
            return;
    if (o->n_eos < FT_GEN_MAX_EOS)
        o->eos[o->n_eos++] = id;
}

void ft_gen_eos_ids(const ft_model_config *cfg, const ft_tokenizer *tok, ft_gen_options *o)
{
    o->n_eos = 0;
    for (int i = 0; i < cfg->n_eos; i++)
        add_eos(o, cfg->eos_token_ids[i]);
    if (tok)
        add_eos(o, ft_tokenizer_eos_id(tok));
}

static int32_t argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

int ft_generate_greedy(ft_model *m, const int32_t *prompt, int n_prompt,
                       const ft_gen_options *o, ft_ids *out, bool *stopped_eos, ft_err *err)
{
    if (stopped_eos)
        *stopped_eos = false;
    if (n_prompt < 1)
        return ft_fail(err, "generate: empty prompt (no token to continue from)");
    if (o->max_new_tokens < 1)
        return ft_fail(err, "generate: max_new_tokens %d < 1", o->max_new_tokens);
    int V = ft_model_cfg(m)->vocab_size;
    int cap = n_prompt + o->max_new_tokens;
    int32_t *seq = malloc((size_t)cap * sizeof *seq);
    if (!seq)
        return ft_fail(err, "out of memory");
    memcpy(seq, prompt, (size_t)n_prompt * sizeof *seq);
    int T = n_prompt, rc = 0;
    while (T < cap) {
        ft_batch b = {.B = 1, .T = T, .input_ids = seq};
        if (ft_model_forward(m, &b, NULL, NULL, err)) {
            rc = ft_fail_prefix(err, "generate");
            break;
        }
        const float *last = ft_model_row_logits(m, (size_t)T - 1);
        if (!last) {
            rc = ft_fail(err, "generate: the logits of position %d could not be read", T - 1);
            break;
        }
        int32_t next = argmax(last, V);
        seq[T++] = next;
        if (ft_ids_push(out, next)) {
            rc = ft_fail(err, "out of memory");
            break;
        }
        bool eos = false;
        for (int i = 0; i < o->n_eos; i++)
            eos |= next == o->eos[i];
        if (eos) {
            if (stopped_eos)
                *stopped_eos = true;
            break;
        }
    }
    free(seq);
    return rc;
}
