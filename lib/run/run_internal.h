/* The parts of one ft-train run beside its loop (trainer.c): the run dir's ownership
 * (run_dir.c) and the hyperparameters for TensorBoard (run_hparams.c). */
#ifndef FT_RUN_INTERNAL_H
#define FT_RUN_INTERNAL_H

#include <stdbool.h>
#include <stdio.h>

#include "config/run_config.h"
#include "core/ft_error.h"
#include "formats/tb_writer.h"
#include "data/data_setup.h"
#include "model/model.h"

/* Whether a file name in a run dir is one of the outputs ft-train writes there:
 * checkpoint-N (and its .tmp / .deleting leftovers), final, events.out.tfevents.*,
 * metrics.jsonl, config.yaml, run_summary.json (and its .tmp). */
bool run_dir_is_output(const char *name);

/* Makes out_dir this run's before anything is written to it (call on the rank that
 * writes, once). resume_path: the checkpoint the run resumes (NULL: a new run, which
 * includes --resume auto finding none). A run that resumes a checkpoint of out_dir
 * itself continues there. Any other run finding outputs of an earlier run in out_dir
 * (run_dir_is_output) is refused with an error that names the dir, a few of them and the
 * ways out, unless overwrite (train.overwrite_output_dir): then they are removed, and
 * nothing else (notice on log). Either way the leftovers of a killed save or checkpoint
 * removal are removed (notice on log). */
int run_dir_claim(const char *out_dir, const char *resume_path, bool overwrite, FILE *log,
                  ft_err *err);

/* Writes the HParams plugin's experiment and session start to tb: every config key with
 * an effect (moot ones left out) at its resolved value, and world_size; the metrics are
 * metric_tags (scalar tags of the run). */
int run_hparams_start(ft_tb_writer *tb, const ft_run_config *cfg, int world,
                      const char *const *metric_tags, size_t n_metrics, ft_err *err);

/* Tokens added by the run (model.add_special_tokens; run_tokens.c), with d the run's
 * data (its tokenizer has those tokens added): mo->grow_vocab (the vocabulary the tokenizer grows the
 * model to), and in LoRA mode without an init_adapter mo->lora.modules_to_save
 * (ft_added_tokens_saved_modules); notices on log (NULL: none). Also the grown
 * vocabulary of an init_adapter made for it when the tokenizer (model.tokenizer: the
 * adapter's own) has that vocabulary. */
int run_tokens_setup(const ft_run_config *c, const ft_run_data *d, const char *model_dir,
                     const char *adapter, ft_model_options *mo, FILE *log, ft_err *err);
/* Writes the tokenizer with the added tokens into dir (a checkpoint, the final weights):
 * the tokenizer's companion files, its tokenizer.json and tokenizer_config.json with the
 * tokens (ft_tokenizer_save_adding); full: dir/config.json (copied already) gets
 * vocab_size vocab. Nothing without added tokens. */
int run_tokens_save(const ft_run_config *c, const char *model_dir, const char *dir,
                    int64_t vocab, bool full, ft_err *err);

#endif
