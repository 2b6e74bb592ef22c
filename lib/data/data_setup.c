#include "data/data_setup.h"

#include <string.h>

#include "formats/model_path.h"

int ft_run_data_options(const ft_config *c, ft_data_options *o, ft_err *err)
{
    *o = (ft_data_options){.max_seq_len = (int)ft_config_int(c, "model.max_seq_len"),
                           .train_on_all = ft_config_bool(c, "data.train_on_all"),
                           .add_eos = ft_config_bool(c, "data.add_eos"),
                           .skip_bad_lines = ft_config_bool(c, "data.skip_bad_lines")};
    if (ft_data_format_parse(ft_config_str(c, "data.format"), &o->format, err) ||
        ft_chat_template_parse(ft_config_str(c, "data.chat_template"), &o->chat_template, err))
        return ft_fail_prefix(err, "config");
    return 0;
}

int ft_run_data_load(ft_run_data *d, const ft_config *c, FILE *log, ft_err *err)
{
    memset(d, 0, sizeof *d);
    if (!ft_config_has(c, "model.name"))
        return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
    if (!ft_config_has(c, "data.train_path"))
        return ft_fail(err, "config: key 'data.train_path' is required (a JSONL file or -)");
    ft_data_options o;
    if (ft_run_data_options(c, &o, err))
        return -1;
    if (o.format != FT_DATA_TOKENS) {
        char dir[4096];
        const char *tp = dir;
        if (ft_config_has(c, "model.tokenizer"))
            tp = ft_config_str(c, "model.tokenizer");
        else if (ft_resolve_model_dir(ft_config_str(c, "model.name"), dir, sizeof dir, err))
            return -1;
        if (ft_tokenizer_load(&d->tok, tp, err))
            return ft_fail_prefix(err, "tokenizer");
    }
    d->pad_id = 0;
    if (d->tok) {
        int32_t pad = ft_tokenizer_pad_id(d->tok), eos = ft_tokenizer_eos_id(d->tok);
        d->pad_id = pad >= 0 ? pad : eos >= 0 ? eos : 0;
    }
    const char *train_path = ft_config_str(c, "data.train_path");
    if (ft_dataset_load(&d->train, train_path, d->tok, &o, err))
        goto fail;
    if (log)
        fprintf(log, "data: %s: %zu samples (%zu bad lines skipped, %zu without a counted "
                     "token dropped)\n",
                train_path, d->train.n, d->train.skipped_lines, d->train.dropped_empty);
    if (ft_config_has(c, "data.eval_path")) {
        const char *eval_path = ft_config_str(c, "data.eval_path");
        if (ft_dataset_load(&d->eval, eval_path, d->tok, &o, err))
            goto fail;
        if (log)
            fprintf(log, "data: %s: %zu eval samples\n", eval_path, d->eval.n);
    } else if (ft_config_float(c, "data.eval_fraction") > 0) {
        if (ft_dataset_split(&d->train, &d->eval, ft_config_float(c, "data.eval_fraction"),
                             (uint64_t)ft_config_int(c, "train.seed"), err))
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
    ft_tokenizer_free(d->tok);
    memset(d, 0, sizeof *d);
}

ft_loader_options ft_run_loader_options(const ft_config *c, const ft_run_data *d, int rank,
                                        int world)
{
    ft_loader_options o = {
        .batch_size = ft_config_is_auto(c, "train.batch_size")
                          ? 1
                          : (int)ft_config_int(c, "train.batch_size"),
        .seq_len = (int)ft_config_int(c, "model.max_seq_len"),
        .packing = ft_config_bool(c, "data.packing"),
        .shuffle = ft_config_bool(c, "data.shuffle"),
        .seed = (uint64_t)ft_config_int(c, "train.seed"),
        .rank = rank,
        .world = world,
        .pad_id = d->pad_id,
    };
    return o;
}
