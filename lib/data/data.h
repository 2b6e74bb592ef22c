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
 *   chat               {"messages": [{"role", "content", ...}], "tools"?, "documents"?}:
 *                      rendered by the chat template into text, encoded without adding
 *                      special tokens (the template writes them, as apply_chat_template
 *                      does); labels only on the assistant turns unless train_on_all:
 *                      the template's {% generation %} spans when it has them (as
 *                      return_assistant_tokens_mask), else each assistant message's span
 *                      between the prefix rendered up to it with the generation prompt
 *                      and the prefix that includes it (its content and the template's
 *                      end-of-turn marker).
 *   sharegpt           {"conversations": [{"from": "human"|"gpt"|"system", "value"}]}:
 *                      mapped to chat messages (ft_sharegpt_messages), then as chat.
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
#include "jinja/jinja.h"
#include "tokenizer/tokenizer.h"

typedef enum ft_data_format {
    FT_DATA_AUTO = 0,
    FT_DATA_TEXT,
    FT_DATA_PROMPT_COMPLETION,
    FT_DATA_ALPACA,
    FT_DATA_CHAT,
    FT_DATA_TOKENS,
    FT_DATA_SHAREGPT
} ft_data_format;

/* Chat templates. The model's own template is the one used (FT_TMPL_AUTO): the
 * tokenizer's chat_template (tokenizer_config.json's string, the "default" entry of its
 * list form, or chat_template.jinja beside it; or the named one chosen, as
 * apply_chat_template(chat_template=NAME) picks it), interpreted by lib/jinja/ as
 * transformers' apply_chat_template renders it. The others are ours, written in Jinja in
 * chat_template.c, for models that ship no template: chatml (the plain ChatML layout,
 * without a default system message), plain ("role: content" lines) and alpaca (the Alpaca
 * prompt format for one user and one assistant turn). */
typedef enum ft_chat_template {
    FT_TMPL_AUTO = 0, /* the model's own template */
    FT_TMPL_CHATML,
    FT_TMPL_PLAIN,
    FT_TMPL_ALPACA
} ft_chat_template;

/* Names as in configs: "auto", "text", "prompt_completion", "alpaca", "chat", "sharegpt",
 * "tokens"; "auto", "chatml", "plain", "alpaca". -1 with err naming the value and the
 * known ones (the old "llama3", "llama2" and "mistral" get a message saying that the
 * model's own template is used instead). */
int ft_data_format_parse(const char *name, ft_data_format *f, ft_err *err);
int ft_chat_template_parse(const char *name, ft_chat_template *t, ft_err *err);

typedef struct ft_data_options {
    ft_data_format format;
    ft_chat_template chat_template;
    /* with FT_TMPL_AUTO: one of the model's named templates for every chat (NULL or "":
     * transformers' choice; data.chat_template_name) */
    const char *chat_template_name;
    /* more template variables: a JSON object's text (NULL or "": none;
     * data.chat_template_kwargs) */
    const char *chat_template_kwargs;
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

/* A chat template ready to render: the compiled Jinja, the tokenizer's special token
 * strings (its special_tokens_map: bos, eos, unk, sep, pad, cls, mask_token and its
 * model-specific ones, those it has; variables of the template, as transformers passes
 * them) and the template kwargs. */
typedef struct ft_chat ft_chat;
typedef struct json_t json_t;

/* t = FT_TMPL_AUTO: the tokenizer's own template (an error when it has none, naming the
 * fallbacks); with name (not NULL or ""), the template of that name (as
 * apply_chat_template(chat_template=NAME)); without, the default, and the model's
 * "tool_use" template when it has one for chats given tools, as transformers picks it.
 * Else the named fallback (a name is then an error). kwargs: a JSON object's text of more
 * template variables (NULL or "": none), checked by ft_chat_kwargs_parse. tok may be NULL
 * for a fallback. A template that does not compile is an error "chat template: line L,
 * column C: ...". */
int ft_chat_open(ft_chat **out, ft_chat_template t, const char *name, const char *kwargs,
                 const ft_tokenizer *tok, ft_err *err);
/* The checks ft_chat_open makes of a template name: none (NULL or "") passes; a name
 * with a fallback of ours, or one the model has no template of, is an error listing the
 * model's template names. */
int ft_chat_check_name(const ft_tokenizer *tok, ft_chat_template t, const char *name,
                       ft_err *err);
/* Template kwargs from a JSON object's text (*out = NULL for NULL or ""): an error when
 * it is not a JSON object, or it names a variable transformers sets itself
 * (ft_chat_template_reserved: messages, tools, ..., the seven special token names) or,
 * tok given, one of the tokenizer's special tokens. *out is a new reference. */
int ft_chat_kwargs_parse(const char *text, const ft_tokenizer *tok, json_t **out,
                         ft_err *err);
/* The same from parts: source is the Jinja text (used when t is FT_TMPL_AUTO), special
 * a JSON object of special token strings (may be NULL). */
int ft_chat_open_source(ft_chat **out, ft_chat_template t, const char *source,
                        const json_t *special, ft_err *err);
void ft_chat_free(ft_chat *c);
/* Whether the template that renders a chat with these extra variables (see
 * ft_chat_render; NULL: none) marks assistant spans itself with {% generation %}. */
bool ft_chat_has_generation(const ft_chat *c, const json_t *extra);

/* Renders the first count messages of `messages` (a JSON array of message objects:
 * "role" a string, "content" a string or a list of parts such as {"type": "text",
 * "text": ...}, any other keys as given) with add_generation_prompt, as
 * apply_chat_template(messages[:count], tokenize=False) does: keys whose value is null
 * are dropped, reasoning_content / thinking / reasoning are aliased as transformers
 * aliases them. extra (a JSON object or NULL) adds template variables (a record's tools
 * and documents); tools and documents are none unless given. The variables are, as in
 * transformers: the special tokens, then the kwargs, then extra, messages and
 * add_generation_prompt, each replacing the ones before. *out is malloc'ed; when spans
 * is not NULL it receives the {% generation %} ranges of *out (malloc'ed, *n_spans of
 * them). A template that raises fails with its message. */
int ft_chat_render(const ft_chat *c, const json_t *messages, size_t count,
                   bool add_generation_prompt, const json_t *extra, char **out,
                   ft_jinja_span **spans, size_t *n_spans, ft_err *err);

/* "chatml", "plain", ... ("auto" for FT_TMPL_AUTO). */
const char *ft_chat_template_name(ft_chat_template t);
const char *ft_data_format_name(ft_data_format f);

/* ShareGPT's {"conversations": [{"from": "human"|"gpt"|"system", "value": text}]} as
 * chat messages (human -> user, gpt -> assistant, system -> system): *messages is a new
 * JSON array. An unknown "from", a missing or non-string field is an error naming the
 * entry (the caller adds FILE:LINE). */
int ft_sharegpt_messages(const json_t *conversations, json_t **messages, ft_err *err);

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
 * transformers' DataCollatorWithFlattening), batch_size rows a batch. The batch's
 * attention_mask is 1 on the samples' tokens and 0 on the padding (as transformers'
 * collators pad; packing pads only a row's tail). */
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
 * next call. position_ids is set (non-NULL) when packing; attention_mask always. */
int ft_loader_batch(ft_loader *l, int epoch, int index, ft_batch *b, ft_err *err);

/* Writes every row of the epoch as the model sees it, one JSON object a line:
 * {"input_ids": [...], "labels": [...]} (+ "position_ids" when packing). */
int ft_loader_dump(ft_loader *l, int epoch, FILE *out, ft_err *err);

#endif
