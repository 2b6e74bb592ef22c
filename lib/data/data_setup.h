/* From a run config to data: the tokenizer, the datasets (train, and eval from a file or a
 * held-out fraction) and a batch loader, with the config keys mapped onto the data
 * options. Shared by ft-train and ft-eval. */
#ifndef FT_DATA_SETUP_H
#define FT_DATA_SETUP_H

#include "config/run_config.h"
#include "data/data.h"
#include "data/pref_data.h"

typedef struct ft_run_data {
    ft_tokenizer *tok; /* NULL for the tokens format without a tokenizer */
    ft_dataset train, eval;
    /* train.objective dpo (orpo): the preference pairs, in place of train and eval */
    bool pref;
    ft_pref_dataset pref_train, pref_eval;
    int32_t pad_id;
} ft_run_data;

/* Loads the tokenizer (model.tokenizer, else model.name) unless data.format is tokens,
 * then data.train_path, then the eval split (data.eval_path or data.eval_fraction): as
 * samples, or as preference pairs (pref_train, pref_eval) when train.objective is not
 * sft.
 * Progress and counts (skipped lines, dropped samples) go to `log`. */
int ft_run_data_load(ft_run_data *d, const ft_run_config *c, FILE *log, ft_err *err);
void ft_run_data_free(ft_run_data *d);

/* The data options the config describes (model.max_seq_len, data.*). */
ft_data_options ft_run_data_options(const ft_run_config *c);

/* Loader options from the config: train.batch_size ("auto" reads as 1 here),
 * model.max_seq_len, data.packing, data.shuffle, train.seed; rank and world given. */
ft_loader_options ft_run_loader_options(const ft_run_config *c, const ft_run_data *d, int rank,
                                        int world);

#endif
