/* The generation side of evaluation: from the JSONL records, the prompt to generate from
 * and the reference completion to score against, per record.
 *
 *   prompt_completion  prompt = "prompt", ids = encode(prompt, add_special) (the prompt
 *                      tokens the data pipeline masks); reference = "completion".
 *   alpaca             prompt = the Alpaca prompt of "instruction" / "input", encoded as
 *                      above; reference = "output".
 *   chat               the last assistant message k is the reference; prompt = the
 *                      template's rendering of messages[:k] with the generation prompt,
 *                      encoded without special tokens (as the data pipeline encodes
 *                      chats); later messages are ignored.
 *   text, tokens       no prompt / reference: an error.
 * The format is resolved as ft_dataset_load resolves it (the option, or detected from the
 * first record's keys), and so is the chat template. */
#ifndef FT_EVAL_RECORDS_H
#define FT_EVAL_RECORDS_H

#include <stddef.h>
#include <stdint.h>

#include "data/data.h"

typedef struct ft_eval_record {
    long line;       /* 1-based line in its file */
    char *prompt;    /* the prompt text (rendered, for chats) */
    char *reference; /* the reference completion */
    int32_t *ids;    /* the prompt's token ids */
    int n_ids;
} ft_eval_record;

typedef struct ft_eval_records {
    ft_eval_record *r;
    size_t n;
} ft_eval_records;

/* Reads path ("-" = stdin) with the data options o. When keep is not NULL only the
 * records whose line holds one of keep's samples are returned (the records the loss was
 * computed over, after skipped and dropped lines), in file order. Errors name FILE:LINE;
 * a line that does not parse is skipped when o->skip_bad_lines (ft_dataset_load has
 * counted it). */
int ft_eval_records_load(ft_eval_records *out, const char *path, const ft_tokenizer *tok,
                         const ft_data_options *o, const ft_dataset *keep, ft_err *err);
void ft_eval_records_free(ft_eval_records *rs);

/* Copies src ("-": standard input; else a file that can be read only once, as a pipe or
 * a shell's <(...)) into a new temporary file, so it can be read twice (once for the
 * loss, once for the generation prompts); *path (malloc'ed) names it, and the caller
 * removes it (unlink) and frees *path. Errors name src ("<stdin>" for "-"). */
int ft_eval_spool(const char *src, char **path, ft_err *err);

/* Replaces every occurrence of `from` in err's message by `to` (e.g. a spooled file's
 * temporary path by "<stdin>"). */
void ft_err_replace(ft_err *err, const char *from, const char *to);

#endif
