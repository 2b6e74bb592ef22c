/* Preference data (DPO, ORPO): JSONL pairs -> token ids and labels, as TRL 1.16's
 * DPOTrainer prepares them (_prepare_dataset, DataCollatorForPreference); then shuffling,
 * sharding and batches of pairs.
 *
 * A record is {"prompt", "chosen", "rejected"} (and "tools"? for chats), either
 *   strings         the prompt and the two completions as text: EOS's text is appended to
 *                   a completion that does not end with it; prompt_ids = encode(prompt,
 *                   add_special), chosen sequence = encode(prompt + chosen, add_special)
 *                   (likewise rejected);
 *   conversational  lists of messages: prompt_ids = the tokens of the prompt rendered by
 *                   the chat template with the generation prompt, chosen sequence = the
 *                   tokens of prompt + chosen rendered without it (encoded without adding
 *                   special tokens: the template writes them, as apply_chat_template).
 * The prompt's length is the shorter of its common prefixes with the two sequences (TRL's
 * common_prefix_length): labels are -100 on those tokens and the token ids elsewhere (the
 * completion_mask). Each sequence is truncated to max_seq_len (TRL's max_length with
 * truncation_mode keep_start); a pair whose prompt fills max_seq_len is dropped and
 * counted (TRL drops it). A record without "prompt" (TRL would extract the common
 * prefix) is refused. A bad line is an error naming file:line (or skipped and counted
 * with skip_bad_lines). */
#ifndef FT_PREF_DATA_H
#define FT_PREF_DATA_H

#include "data/data.h"

typedef struct ft_pref_pair {
    ft_sample chosen, rejected; /* the two sequences, prompt tokens labelled -100 */
    long line;
} ft_pref_pair;

typedef struct ft_pref_dataset {
    ft_pref_pair *pairs;
    size_t n;
    size_t skipped_lines; /* bad lines skipped (skip_bad_lines) */
    size_t dropped;       /* pairs whose prompt fills max_seq_len */
} ft_pref_dataset;

/* Reads path ("-" = stdin) with o's max_seq_len, chat template choices and
 * skip_bad_lines (o->format must be auto; train_on_all is refused). */
int ft_pref_dataset_load(ft_pref_dataset *ds, const char *path, const ft_tokenizer *tok,
                         const ft_data_options *o, ft_err *err);

/* ORPO's preparation instead (TRL's experimental ORPOTrainer, FT_PREF_DATA_ORPO): a
 * conversation is first rendered to text (the prompt with the generation prompt, its last
 * message from the user or a tool; the answers what prompt + answer adds to the common
 * prefix of the three renderings), then for each answer enc(prompt + answer) without
 * special tokens, the answer starting after enc(prompt) (one token earlier when the
 * prompt's last token merged with the answer's first; the two prompts may differ in
 * their last token only), BOS before the prompt unless it starts with it, EOS after the
 * answer unless it ends with it, and the answer (never the prompt) cut to max_seq_len
 * less the prompt; a pair left with an empty answer is dropped and counted (TRL would
 * average over no token). Labels are -100 on the prompt. */
typedef enum ft_pref_style { FT_PREF_DATA_DPO = 0, FT_PREF_DATA_ORPO } ft_pref_style;
int ft_pref_dataset_load_style(ft_pref_dataset *ds, const char *path, const ft_tokenizer *tok,
                               const ft_data_options *o, ft_pref_style style, ft_err *err);
void ft_pref_dataset_free(ft_pref_dataset *ds);
/* Moves a deterministic (by seed) fraction of the pairs into eval, as ft_dataset_split. */
int ft_pref_dataset_split(ft_pref_dataset *ds, ft_pref_dataset *eval, double fraction,
                          uint64_t seed, ft_err *err);

/* Batches of pairs, with ft_loader's order (each epoch shuffled by (seed, epoch) when
 * shuffle; rank r takes every world-th pair from r, floor(n / world) each). A batch of P
 * pairs has 2P rows: the P chosen sequences, then the P rejected ones in the same order
 * (TRL's [chosen, rejected] concatenation), right-padded to the longest of the 2P with
 * pad_id and labels -100. options.packing is refused. */
typedef struct ft_pref_loader ft_pref_loader;

int ft_pref_loader_new(ft_pref_loader **out, const ft_pref_dataset *ds,
                       const ft_loader_options *o, ft_err *err);
void ft_pref_loader_free(ft_pref_loader *l);
int ft_pref_loader_n_batches(ft_pref_loader *l, int epoch);
/* The arrays belong to the loader and stay valid until the next call. */
int ft_pref_loader_batch(ft_pref_loader *l, int epoch, int index, ft_batch *b, ft_err *err);

#endif
