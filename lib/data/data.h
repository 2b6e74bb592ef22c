/* data/: training data.
 *
 * Owns: JSONL records to token ids and labels, chat templates, shuffling, sharding,
 * padding and packing into batches (data.h, loader.c, chat_template.c), and the data a
 * run config names (data_setup.h).
 * May call: core, config, formats, jinja, model, tokenizer.
 * (This is the folder's main header.) */

/* Datasets: JSONL records -> token ids and labels, as a transformers/TRL SFT pipeline
 * makes them; then shuffling, sharding across ranks, padding or packing into batches.
 *
 * Record formats (one JSON object a line; detected from the keys, or set):
 *   text               {"text"}: ids = encode(text, add_special) (+ EOS when add_eos and
 *                      not already last); every token counted.
 *   prompt_completion  {"prompt", "completion"}: ids = encode(prompt + completion,
 *                      add_special) + EOS; labels -100 on the first len(encode(prompt,
 *                      add_special)) tokens unless train_on_all (TRL's completion-only
 *                      loss).
 *   alpaca             {"instruction", "input"?, "output"}: rendered with the Alpaca
 *                      prompt format into prompt/completion, then as above.
 *   chat               {"messages": [{"role": "system"|"user"|"assistant", "content"}]}:
 *                      rendered by the chat template into text, encoded without adding
 *                      special tokens (the template writes them, as apply_chat_template
 *                      does); labels only on the assistant turns (their content and the
 *                      template's end-of-turn marker) unless train_on_all.
 *   tokens             {"input_ids": [...], "labels"?: [...]} (same length, -100 = not
 *                      counted): no tokenizer needed.
 * Every sample is truncated to max_seq_len. A bad line (invalid JSON or UTF-8, a missing
 * field, a wrong type, an empty completion, an unknown role) is an error naming file:line
 * and the problem; with skip_bad_lines it is skipped and counted instead. A sample left
 * with no counted token (e.g. its completion truncated away) is dropped and counted;
 * nothing is dropped silently. */
#ifndef FT_DATA_H
#define FT_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/ft_error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef enum ft_data_format {
    FT_DATA_AUTO = 0,
    FT_DATA_TEXT,
    FT_DATA_PROMPT_COMPLETION,
    FT_DATA_ALPACA,
    FT_DATA_CHAT,
    FT_DATA_TOKENS
} ft_data_format;

/* Chat templates, each rendering exactly what transformers' apply_chat_template renders
 * with that model family's own template. */
typedef enum ft_chat_template {
    FT_TMPL_AUTO = 0, /* detect from tokenizer_config.json's chat_template */
    FT_TMPL_CHATML,   /* Qwen2 / Qwen2.5 */
    FT_TMPL_LLAMA3,   /* Llama 3 / 3.1 / 3.2 */
    FT_TMPL_LLAMA2,   /* Llama 2 chat [INST] <<SYS>> */
    FT_TMPL_MISTRAL,  /* Mistral [INST] */
    FT_TMPL_PLAIN,    /* "role: content" lines, no special tokens */
    FT_TMPL_ALPACA    /* the Alpaca prompt format for chats of one user + assistant turn */
} ft_chat_template;

/* Names as in configs: "auto", "text", "prompt_completion", "alpaca", "chat", "tokens";
 * "auto", "chatml", "llama3", "llama2", "mistral", "plain", "alpaca". -1 with err naming
 * the value and the known ones. */
int ft_data_format_parse(const char *name, ft_data_format *f, ft_err *err);
int ft_chat_template_parse(const char *name, ft_chat_template *t, ft_err *err);

typedef struct ft_data_options {
    ft_data_format format;
    ft_chat_template chat_template;
    int max_seq_len;
    bool train_on_all;   /* count prompt / user tokens too */
    bool add_eos;        /* text format: append EOS (default true) */
    bool skip_bad_lines;
} ft_data_options;

typedef struct ft_sample {
    int32_t *ids;
    int32_t *labels; /* same length; -100 = not counted */
    int n;
    long line; /* 1-based line of the record in its file */
} ft_sample;

typedef struct ft_dataset {
    ft_sample *samples;
    size_t n;
    size_t skipped_lines;  /* bad lines skipped (skip_bad_lines) */
    size_t dropped_empty;  /* samples with no counted token after truncation */
} ft_dataset;

/* Reads path ("-" = stdin). tok may be NULL only for the tokens format. */
int ft_dataset_load(ft_dataset *ds, const char *path, const ft_tokenizer *tok,
                    const ft_data_options *o, ft_err *err);
void ft_dataset_free(ft_dataset *ds);

/* Moves a deterministic (by seed) fraction of ds's samples into eval (at least one when
 * fraction > 0 and ds has two or more). */
int ft_dataset_split(ft_dataset *ds, ft_dataset *eval, double fraction, uint64_t seed,
                     ft_err *err);

/* Renders a chat ({"role","content"} objects in `messages`, a jansson array) as text.
 * add_generation_prompt appends the assistant header, as apply_chat_template does.
 * *out is malloc'ed. */
typedef struct json_t json_t;
int ft_chat_render(ft_chat_template tmpl, const ft_tokenizer *tok, const json_t *messages,
                   bool add_generation_prompt, char **out, ft_err *err);

/* The built-in template matching a tokenizer's chat_template source; error when there is
 * none or it is not recognised (then the config must name one). */
int ft_chat_template_detect(const ft_tokenizer *tok, ft_chat_template *t, ft_err *err);

/* The core of ft_chat_render, with what a tokenizer would give passed in: source is the
 * template's Jinja text (NULL: the newest variant of the family: Qwen2.5's default system
 * message, Llama 3.1's system header), bos / eos the token strings (NULL when absent; an
 * error for a template that writes them). ft_chat_render_n renders only the first count
 * messages (the prefixes that place assistant labels). */
int ft_chat_render_with(ft_chat_template tmpl, const char *source, const char *bos,
                        const char *eos, const json_t *messages, bool add_generation_prompt,
                        char **out, ft_err *err);
int ft_chat_render_n(ft_chat_template tmpl, const char *source, const char *bos,
                     const char *eos, const json_t *messages, size_t count,
                     bool add_generation_prompt, char **out, ft_err *err);
/* ft_chat_template_detect on a Jinja source (NULL: error). */
int ft_chat_template_detect_source(const char *source, ft_chat_template *t, ft_err *err);
/* "chatml", "llama3", ... ("auto" for FT_TMPL_AUTO). */
const char *ft_chat_template_name(ft_chat_template t);
const char *ft_data_format_name(ft_data_format f);

/* The Alpaca prompt (Stanford Alpaca's, with or without an input when input is NULL or
 * empty), ending with "### Response:\n". *out is malloc'ed. */
int ft_alpaca_prompt(const char *instruction, const char *input, char **out, ft_err *err);

/* Fisher-Yates shuffle of idx[0..n) keyed by (seed, stream), counter-based (ft_mix64): the
 * same arguments give the same order on every machine and run. */
void ft_shuffle_indices(size_t *idx, size_t n, uint64_t seed, uint64_t stream);

/* ---- batches --------------------------------------------------------------------
 * Each epoch the samples are shuffled by (seed, epoch) (when shuffle), then rank r of
 * world takes every world-th sample starting at r (disjoint shards; the tail that would
 * give ranks unequal batch counts is dropped). Without packing a batch holds
 * batch_size samples, right-padded to its longest with pad_id and labels -100. With
 * packing, samples are laid end to end into rows of seq_len tokens (a sample never split;
 * positions restart at 0 for each sample, the first label of each sample is -100 as in
 * transformers' DataCollatorWithFlattening), batch_size rows a batch. */
typedef struct ft_loader ft_loader;

typedef struct ft_loader_options {
    int batch_size;
    int seq_len;  /* packing row length (usually max_seq_len) */
    bool packing;
    bool shuffle;
    uint64_t seed;
    int rank, world;
    int32_t pad_id;
} ft_loader_options;

int ft_loader_new(ft_loader **out, const ft_dataset *ds, const ft_loader_options *o,
                  ft_err *err);
void ft_loader_free(ft_loader *l);
/* Batches per epoch on this rank. */
int ft_loader_n_batches(ft_loader *l, int epoch);
/* Batch `index` of `epoch`; the arrays belong to the loader and stay valid until the
 * next call. position_ids is set (non-NULL) when packing. */
int ft_loader_batch(ft_loader *l, int epoch, int index, ft_batch *b, ft_err *err);

/* Writes every row of the epoch as the model sees it, one JSON object a line:
 * {"input_ids": [...], "labels": [...]} (+ "position_ids" when packing). */
int ft_loader_dump(ft_loader *l, int epoch, FILE *out, ft_err *err);

#endif
