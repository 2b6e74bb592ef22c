#include "data/data_setup.h"

#include <jansson.h>
#include <string.h>

#include "formats/model_path.h"
#include "model/merge.h"

/* The data module's names of the config's choices (the same values, in the same order,
 * spelled out so that a new choice is a compile-time decision here). */
static ft_data_format format_of(ft_cfg_data_format f)
{
    switch (f) {
    case FT_CFG_FORMAT_TEXT: return FT_DATA_TEXT;
    case FT_CFG_FORMAT_PROMPT_COMPLETION: return FT_DATA_PROMPT_COMPLETION;
    case FT_CFG_FORMAT_ALPACA: return FT_DATA_ALPACA;
    case FT_CFG_FORMAT_CHAT: return FT_DATA_CHAT;
    case FT_CFG_FORMAT_SHAREGPT: return FT_DATA_SHAREGPT;
    case FT_CFG_FORMAT_TOKENS: return FT_DATA_TOKENS;
    case FT_CFG_FORMAT_AUTO: break;
    }
    return FT_DATA_AUTO;
}

static ft_chat_template template_of(ft_cfg_chat_template t)
{
    switch (t) {
    case FT_CFG_TMPL_CHATML: return FT_TMPL_CHATML;
    case FT_CFG_TMPL_PLAIN: return FT_TMPL_PLAIN;
    case FT_CFG_TMPL_ALPACA: return FT_TMPL_ALPACA;
    case FT_CFG_TMPL_AUTO: break;
    }
    return FT_TMPL_AUTO;
}

bool ft_run_adds_tokens(const ft_run_config *c)
{
    return c->model.add_special_tokens[0] && strcmp(c->model.add_special_tokens, "[]") != 0;
}

ft_data_options ft_run_data_options(const ft_run_config *c)
{
    return (ft_data_options){.max_seq_len = (int)c->model.max_seq_len,
                             .format = format_of(c->data.format),
                             .chat_template = template_of(c->data.chat_template),
                             .chat_template_name = c->data.chat_template_name,
                             .chat_template_kwargs = c->data.chat_template_kwargs,
                             .train_on_all = c->data.train_on_all,
                             .add_eos = c->data.add_eos,
                             .skip_bad_lines = c->data.skip_bad_lines};
}

/* The preference pairs of data.train_path and the eval split (as below, for pairs). */
static int load_pairs(ft_run_data *d, const ft_run_config *c, const ft_data_options *o,
                      FILE *log, ft_err *err)
{
    d->pref = true;
    const char *train_path = c->data.train_path;
    ft_pref_style style = c->train.objective == FT_CFG_OBJECTIVE_ORPO ? FT_PREF_DATA_ORPO
                                                                       : FT_PREF_DATA_DPO;
    if (ft_pref_dataset_load_style(&d->pref_train, train_path, d->tok, o, style, err))
        goto fail;
    if (log)
        fprintf(log, "data: %s: %zu preference pairs (%zu bad lines skipped, %zu whose prompt "
                     "fills model.max_seq_len dropped)\n",
                train_path, d->pref_train.n, d->pref_train.skipped_lines, d->pref_train.dropped);
    if (c->data.eval_path[0]) {
        if (ft_pref_dataset_load_style(&d->pref_eval, c->data.eval_path, d->tok, o, style, err))
            goto fail;
        if (log)
            fprintf(log, "data: %s: %zu eval preference pairs\n", c->data.eval_path,
                    d->pref_eval.n);
    } else if (c->data.eval_fraction > 0) {
        if (ft_pref_dataset_split(&d->pref_train, &d->pref_eval, c->data.eval_fraction,
                                  (uint64_t)c->train.seed, err))
            goto fail;
        if (log)
            fprintf(log, "data: %zu preference pairs held out for evaluation\n", d->pref_eval.n);
    }
    return 0;
fail:
    ft_run_data_free(d);
    return -1;
}

int ft_run_data_load(ft_run_data *d, const ft_run_config *c, FILE *log, ft_err *err)
{
    memset(d, 0, sizeof *d);
    if (!c->model.name[0])
        return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
    if (!c->data.train_path[0])
        return ft_fail(err, "config: key 'data.train_path' is required (a JSONL file or -)");
    ft_data_options o = ft_run_data_options(c);
    /* tokens added (model.add_special_tokens) need the tokenizer whatever the format: it
     * sizes the grown vocabulary and is saved with the weights */
    bool adding = ft_run_adds_tokens(c);
    if (o.format != FT_DATA_TOKENS || adding) {
        char dir[4096];
        const char *tp = dir;
        if (c->model.tokenizer[0])
            tp = c->model.tokenizer;
        else if (ft_resolve_model_dir(c->model.name, dir, sizeof dir, err))
            return -1;
        if (adding ? ft_tokenizer_load_adding(&d->tok, tp, c->model.add_special_tokens, err)
                   : ft_tokenizer_load(&d->tok, tp, err))
            return ft_fail_prefix(err, adding ? "tokenizer with model.add_special_tokens"
                                              : "tokenizer");
        /* the template choices, checked against the model before any data is read */
        json_t *kw = NULL;
        int rc = 0;
        if (ft_chat_check_name(d->tok, o.chat_template, o.chat_template_name, err))
            rc = ft_fail_prefix(err, "config: key 'data.chat_template_name'");
        else if (ft_chat_kwargs_parse(o.chat_template_kwargs, d->tok, &kw, err))
            rc = ft_fail_prefix(err, "config: key 'data.chat_template_kwargs'");
        json_decref(kw);
        if (rc) {
            ft_run_data_free(d);
            return -1;
        }
    }
    d->pad_id = 0;
    if (d->tok && o.format != FT_DATA_TOKENS) {
        int32_t pad = ft_tokenizer_pad_id(d->tok), eos = ft_tokenizer_eos_id(d->tok);
        d->pad_id = pad >= 0 ? pad : eos >= 0 ? eos : 0;
    }
    const char *train_path = c->data.train_path;
    if (c->train.objective != FT_CFG_OBJECTIVE_SFT)
        return load_pairs(d, c, &o, log, err);
    if (ft_dataset_load(&d->train, train_path, d->tok, &o, err))
        goto fail;
    if (log)
        fprintf(log, "data: %s: %zu samples (%zu bad lines skipped, %zu without a counted "
                     "token dropped)\n",
                train_path, d->train.n, d->train.skipped_lines, d->train.dropped_empty);
    if (c->data.eval_path[0]) {
        const char *eval_path = c->data.eval_path;
        if (ft_dataset_load(&d->eval, eval_path, d->tok, &o, err))
            goto fail;
        if (log)
            fprintf(log, "data: %s: %zu eval samples\n", eval_path, d->eval.n);
    } else if (c->data.eval_fraction > 0) {
        if (ft_dataset_split(&d->train, &d->eval, c->data.eval_fraction,
                             (uint64_t)c->train.seed, err))
            goto fail;
        if (log)
            fprintf(log, "data: %zu samples held out for evaluation\n", d->eval.n);
    }
    return 0;
fail:
    ft_run_data_free(d);
    return -1;
}

void ft_run_data_free(ft_run_data *d)
{
    ft_dataset_free(&d->train);
    ft_dataset_free(&d->eval);
    ft_pref_dataset_free(&d->pref_train);
    ft_pref_dataset_free(&d->pref_eval);
    ft_tokenizer_free(d->tok);
    memset(d, 0, sizeof *d);
}

ft_loader_options ft_run_loader_options(const ft_run_config *c, const ft_run_data *d, int rank,
                                        int world)
{
    ft_loader_options o = {
        .batch_size = c->train.batch_size == FT_CFG_AUTO ? 1 : (int)c->train.batch_size,
        .seq_len = (int)c->model.max_seq_len,
        .packing = c->data.packing,
        .shuffle = c->data.shuffle,
        .seed = (uint64_t)c->train.seed,
        .rank = rank,
        .world = world,
        .pad_id = d->pad_id,
    };
    return o;
}

int ft_run_data_vocab_size(const ft_run_data *d)
{
    return d->tok ? ft_tokenizer_vocab_size(d->tok) : 0;
}

int ft_run_tokenizer_save(const ft_run_config *c, const char *model_dir, const char *dir,
                          ft_err *err)
{
    const char *tp = c->model.tokenizer[0] ? c->model.tokenizer : model_dir;
    char tdir[4096];
    snprintf(tdir, sizeof tdir, "%s", tp);
    size_t n = strlen(tdir);
    if (n >= 15 && strcmp(tdir + n - 15, "/tokenizer.json") == 0)
        tdir[n - 15] = '\0';
    /* the tokenizer's companion files, then its two files with the tokens */
    if (ft_copy_passthrough_files(tdir, dir, err) ||
        ft_tokenizer_save_adding(tp, dir, c->model.add_special_tokens, err))
        return ft_fail_prefix(err, "%s: the tokenizer with model.add_special_tokens", dir);
    return 0;
}
