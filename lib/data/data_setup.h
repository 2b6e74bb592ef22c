/* From a run config to data: the tokenizer, the datasets (train, and eval from a file or a
 * held-out fraction) and a batch loader, with the config keys mapped onto the data
 * options. Shared by ft-train and ft-eval. */
#ifndef FT_DATA_SETUP_H
#define FT_DATA_SETUP_H

#include "config/run_config.h"
#include "data/data.h"
#include "data/pref_data.h"

typedef struct ft_run_data {
    ft_tokenizer *tok; /* NULL for the tokens format without a tokenizer (and no tokens
                        * added) */
    ft_dataset train, eval;
    /* train.objective dpo (orpo): the preference pairs, in place of train and eval */
    bool pref;
    ft_pref_dataset pref_train, pref_eval;
    int32_t pad_id;
} ft_run_data;

/* Whether the config adds tokens to the tokenizer (model.add_special_tokens not empty). */
bool ft_run_adds_tokens(const ft_run_config *c);

/* Loads the tokenizer (model.tokenizer, else model.name; with model.add_special_tokens
 * added: ft_tokenizer_load_adding) unless data.format is tokens and no tokens are added,
 * then data.train_path, then the eval split (data.eval_path or data.eval_fraction): as
 * samples, or as preference pairs (pref_train, pref_eval) when train.objective is not
 * sft.
 * Progress and counts (skipped lines, dropped samples) go to `log`. */
int ft_run_data_load(ft_run_data *d, const ft_run_config *c, FILE *log, ft_err *err);
void ft_run_data_free(ft_run_data *d);

/* The size of the run's tokenizer (ft_tokenizer_vocab_size), 0 without one. */
int ft_run_data_vocab_size(const ft_run_data *d);

/* The run's tokenizer (model.tokenizer, else model_dir) with model.add_special_tokens
 * added, into dir: its companion files copied, tokenizer.json and tokenizer_config.json
 * written with the tokens (ft_tokenizer_save_adding). */
int ft_run_tokenizer_save(const ft_run_config *c, const char *model_dir, const char *dir,
                          ft_err *err);

/* The data options the config describes (model.max_seq_len, data.*). */
ft_data_options ft_run_data_options(const ft_run_config *c);

/* Loader options from the config: train.batch_size ("auto" reads as 1 here),
 * model.max_seq_len, data.packing, data.shuffle, train.seed; rank and world given. */
ft_loader_options ft_run_loader_options(const ft_run_config *c, const ft_run_data *d, int rank,
                                        int world);

#endif
