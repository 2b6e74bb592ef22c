/* Tokens added to the tokenizer by a run (run config model.add_special_tokens): the
 * vocabulary they grow the model to, the modules trained for them, and the new rows'
 * values, as transformers' resize_token_embeddings(len(tokenizer)) with its default
 * mean_resizing=True and PEFT's save_embedding_layers make them.
 *
 * New rows: transformers draws each new row of the embedding (and of an untied head)
 * from N(mu, 1e-9 Sigma), mu and Sigma the mean and covariance of the old rows, when
 * 1e-9 Sigma is positive definite, else sets it to mu. We set every new row to mu (a
 * deterministic run): the draw differs from mu by about sqrt(1e-9) = 3.2e-5 of the old
 * rows' standard deviation per element, well below anything training resolves. mu is
 * summed in double (transformers: torch.mean in fp32). */
#include <string.h>

#include "model/model_internal.h"
#include "tokenizer/tokenizer.h"

unsigned ft_added_tokens_saved_modules(const ft_lora_config *lc, bool tied)
{
    if (lc->modules_to_save)
        return lc->modules_to_save; /* the user's choice */
    unsigned mods = 0;
    if (!(lc->targets & FT_LORA_EMBED))
        mods |= FT_SAVE_EMBED;
    if (!tied && !(lc->targets & FT_LORA_HEAD))
        mods |= FT_SAVE_HEAD;
    return mods;
}

int ft_added_tokens_vocab(const char *tokenizer_path, const char *tokens_json,
                          int64_t model_vocab, int64_t *vocab, int *n_tokenizer, ft_err *err)
{
    ft_tokenizer *t;
    if (ft_tokenizer_load_adding(&t, tokenizer_path, tokens_json, err))
        return -1;
    int n = ft_tokenizer_vocab_size(t);
    ft_tokenizer_free(t);
    if (n_tokenizer)
        *n_tokenizer = n;
    *vocab = n > model_vocab ? n : model_vocab;
    return 0;
}

int ft_run_model_vocab(const char *tokenizer_path, const char *tokens_json, int64_t multiple,
                       const char *adapter_dir, int64_t model_vocab, int64_t *vocab,
                       ft_err *err)
{
    *vocab = model_vocab;
    if (tokens_json && tokens_json[0] && strcmp(tokens_json, "[]") != 0) {
        if (ft_added_tokens_vocab(tokenizer_path, tokens_json, model_vocab, vocab, NULL, err))
            return -1;
        if (*vocab > model_vocab && multiple > 1)
            *vocab = (*vocab + multiple - 1) / multiple * multiple;
        return 0;
    }
    if (!adapter_dir || !adapter_dir[0])
        return 0;
    /* (an adapter that does not load, or no tokenizer of its size: the model's reading of
     * the adapter says why) */
    ft_lora_config ac;
    ft_tokenizer *t;
    ft_err ignored;
    if (ft_lora_config_load(&ac, adapter_dir, &ignored) || ac.vocab_size <= model_vocab ||
        ft_tokenizer_load(&t, tokenizer_path, &ignored))
        return 0;
    if (ft_tokenizer_vocab_size(t) == ac.vocab_size)
        *vocab = ac.vocab_size;
    ft_tokenizer_free(t);
    return 0;
}

void model_mean_rows(float *w, int64_t old_rows, int64_t rows, int64_t cols)
{
    if (old_rows <= 0 || rows <= old_rows)
        return;
    float *mu = w + old_rows * cols; /* the first new row holds the mean */
    for (int64_t c = 0; c < cols; c++) {
        double s = 0;
        for (int64_t r = 0; r < old_rows; r++)
            s += w[r * cols + c];
        mu[c] = (float)(s / (double)old_rows);
    }
    for (int64_t r = old_rows + 1; r < rows; r++)
        memcpy(w + r * cols, mu, (size_t)cols * sizeof *w);
}
