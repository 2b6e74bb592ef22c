/* Tokens added by a run (model.add_special_tokens): the model options they set, and the
 * tokenizer files and config.json saved beside the run's weights. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "formats/lora.h"
#include "run/run_internal.h"

static void saved_names(unsigned mods, char *out, size_t n)
{
    snprintf(out, n, "%s%s%s", mods & FT_SAVE_EMBED ? "embed_tokens" : "",
             mods == (FT_SAVE_EMBED | FT_SAVE_HEAD) ? ", " : "",
             mods & FT_SAVE_HEAD ? "lm_head" : "");
}

int run_tokens_setup(const ft_run_config *c, const ft_run_data *d, const char *model_dir,
                     const char *adapter, ft_model_options *mo, FILE *log, ft_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    ft_model_config mc;
    if (ft_model_config_load(&mc, path, err))
        return -1;
    int64_t V = mc.vocab_size, G;
    if (c->model.resize_to_multiple_of && !ft_run_adds_tokens(c))
        return ft_fail(err, "config: model.resize_to_multiple_of applies to a vocabulary grown "
                            "by model.add_special_tokens, which this run does not set");
    if (ft_run_model_vocab(c->model.tokenizer[0] ? c->model.tokenizer : model_dir,
                           c->model.add_special_tokens, c->model.resize_to_multiple_of,
                           adapter, V, &G, err))
        return ft_fail_prefix(err, "the tokenizer with model.add_special_tokens");
    if (ft_run_adds_tokens(c) && log)
        fprintf(log, "tokens: model.add_special_tokens %s: the tokenizer has %d tokens%s\n",
                c->model.add_special_tokens, ft_run_data_vocab_size(d),
                G > V ? "" : ", which the model's vocabulary holds");
    if (G > V && log)
        fprintf(log, "tokens: vocabulary %lld -> %lld (%s; new rows: the mean of the old "
                     "rows, as resize_token_embeddings(len(tokenizer)%s))\n",
                (long long)V, (long long)G,
                ft_run_adds_tokens(c) ? "model.add_special_tokens"
                                      : "tuning.lora.init_adapter's, as the tokenizer's",
                c->model.resize_to_multiple_of > 1 ? ", pad_to_multiple_of" : "");
    mo->grow_vocab = G > V ? G : 0;
    /* LoRA: the new rows are trained (the embedding and the head in full, as PEFT's
     * modules_to_save) unless the user chose the modules; from an adapter, its settings */
    if (ft_run_adds_tokens(c) && mo->mode == FT_TRAIN_LORA && !adapter) {
        unsigned mods = ft_added_tokens_saved_modules(&mo->lora, mc.tie_word_embeddings);
        if (mods != mo->lora.modules_to_save && log) {
            char names[64];
            saved_names(mods, names, sizeof names);
            fprintf(log, "tokens: tuning.lora.modules_to_save: %s (tokens added: their rows "
                         "are trained; set modules_to_save or target_modules to choose)\n",
                    names);
        }
        mo->lora.modules_to_save = mods;
    }
    return 0;
}

int run_tokens_save(const ft_run_config *c, const char *model_dir, const char *dir,
                    int64_t vocab, bool full, ft_err *err)
{
    if (!ft_run_adds_tokens(c))
        return 0;
    if (ft_run_tokenizer_save(c, model_dir, dir, err))
        return -1;
    if (!full)
        return 0;
    /* a full model dir: config.json with the grown vocab_size, as resize_token_embeddings
     * sets it */
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(path, 0, &je);
    if (!cfg)
        return ft_fail(err, "%s:%d: %s", path, je.line, je.text);
    int rc = json_object_set_new(cfg, "vocab_size", json_integer(vocab));
    char *text = rc == 0 ? json_dumps(cfg, JSON_INDENT(2)) : NULL;
    json_decref(cfg);
    if (!text)
        return ft_fail(err, "%s: out of memory", path);
    rc = ft_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}
