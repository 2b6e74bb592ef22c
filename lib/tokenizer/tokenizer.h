/* tokenizer/: Hugging Face tokenizers in C.
 *
 * Owns: tokenizer.json and its companions (tokenizer.h), and its parts (tok_*.c:
 * normalizers, pre-tokenizers, BPE, added tokens, decoding; tok_internal.h).
 * May call: core.
 * (This is the folder's main header.) */

/* Hugging Face tokenizers in C: reads tokenizer.json (plus tokenizer_config.json and
 * special_tokens_map.json beside it when present) and encodes / decodes exactly as the
 * `tokenizers` library does for the model families we load:
 *   - byte-level BPE (GPT-2, Llama 3, Qwen2/2.5): ByteLevel pre-tokenizer / decoder,
 *     Split pre-tokenizers with their Unicode regexes (PCRE2), NFC normalizer (utf8proc);
 *   - SentencePiece-style BPE (Llama 2, Mistral, TinyLlama): Prepend/Replace normalizers
 *     or a Metaspace pre-tokenizer, byte-fallback tokens <0xNN>, the matching decoders;
 *   - added and special tokens, matched before the model runs;
 *   - post-processors (TemplateProcessing, ByteLevel, Sequence) adding BOS/EOS.
 * A component it cannot honour (unknown model type, normalizer, pre-tokenizer,
 * post-processor or decoder, or an option of one it does not implement) is an error
 * naming it, never a silent approximation. */
#ifndef FT_TOKENIZER_H
#define FT_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ft_error.h"

/* A growable vector of token ids. */
typedef struct ft_ids {
    int32_t *data;
    size_t n, cap;
} ft_ids;

/* Appends one id; -1 on out-of-memory. */
int ft_ids_push(ft_ids *v, int32_t id);
void ft_ids_free(ft_ids *v);

typedef struct ft_tokenizer ft_tokenizer;

/* path is a directory holding tokenizer.json (and optionally tokenizer_config.json,
 * special_tokens_map.json), or a tokenizer.json file itself. */
int ft_tokenizer_load(ft_tokenizer **out, const char *path, ft_err *err);
void ft_tokenizer_free(ft_tokenizer *t);

/* Special tokens added as transformers' tokenizer.add_special_tokens({
 * "additional_special_tokens": tokens}) adds them (tok_grow.c; run config
 * model.add_special_tokens): tokens_json is a JSON array of non-empty strings; each one
 * that is not an added token already becomes one (special, normalized=false: matched
 * whole, never split), with its model.vocab id when the vocabulary holds it, else the
 * next id as tokenizers numbers added tokens (ft_tokenizer_vocab_size grows by those).
 * ft_tokenizer_load_adding loads path so; ft_tokenizer_save_adding writes path's
 * tokenizer.json and tokenizer_config.json so (extra_special_tokens = the tokens, as
 * transformers 5 saves them) into dir, which AutoTokenizer then loads with the same
 * vocabulary (the other companion files are the caller's to copy). */
int ft_tokenizer_load_adding(ft_tokenizer **out, const char *path, const char *tokens_json,
                             ft_err *err);
int ft_tokenizer_save_adding(const char *path, const char *dir, const char *tokens_json,
                             ft_err *err);

/* Encodes len bytes of UTF-8 text, appending ids to out (out is not cleared).
 * add_special applies the post-processor as tokenizers' encode(add_special_tokens=True).
 * Invalid UTF-8 is an error. */
int ft_tokenizer_encode(const ft_tokenizer *t, const char *text, size_t len, bool add_special,
                        ft_ids *out, ft_err *err);

/* Decodes ids as tokenizers' decode(ids, skip_special_tokens): *text is malloc'ed,
 * NUL-terminated, *len its length without the NUL. An out-of-range id is an error. */
int ft_tokenizer_decode(const ft_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                        char **text, size_t *len, ft_err *err);

/* Vocabulary size including added tokens (max id + 1). */
int ft_tokenizer_vocab_size(const ft_tokenizer *t);
/* -1 when absent. */
int32_t ft_tokenizer_token_to_id(const ft_tokenizer *t, const char *token);
/* NULL when out of range. */
const char *ft_tokenizer_id_to_token(const ft_tokenizer *t, int32_t id);

/* Special tokens as tokenizer_config.json / special_tokens_map.json name them
 * (bos_token, eos_token, pad_token, unk_token); -1 when absent. */
int32_t ft_tokenizer_bos_id(const ft_tokenizer *t);
int32_t ft_tokenizer_eos_id(const ft_tokenizer *t);
int32_t ft_tokenizer_pad_id(const ft_tokenizer *t);
/* The token strings, NULL when absent. */
const char *ft_tokenizer_bos_token(const ft_tokenizer *t);
const char *ft_tokenizer_eos_token(const ft_tokenizer *t);
const char *ft_tokenizer_pad_token(const ft_tokenizer *t);
const char *ft_tokenizer_unk_token(const ft_tokenizer *t);

/* The special tokens a chat template sees, as transformers 5's special_tokens_map has
 * them: {"bos_token": "<s>", ...} for those of bos, eos, unk, sep, pad, cls and
 * mask_token the tokenizer defines (tokenizer_config.json, then special_tokens_map.json
 * when the config has no added_tokens_decoder; unk_token also from the BPE model), then
 * its model-specific ones (every other "*_token" key holding a token, and the entries of
 * an extra_special_tokens mapping). A jansson object owned by the tokenizer. */
typedef struct json_t json_t;
const json_t *ft_tokenizer_special_tokens(const ft_tokenizer *t);

/* The model's chat templates (Jinja sources), read as transformers 5 reads them:
 * chat_template.jinja beside tokenizer.json ("default") and
 * additional_chat_templates/NAME.jinja, when any of these files exists; else
 * tokenizer_config.json's "chat_template", a string ("default") or a list of
 * {"name", "template"}. ft_tokenizer_chat_template: the default, NULL when there is
 * none. lib/data renders them. */
const char *ft_tokenizer_chat_template(const ft_tokenizer *t);
/* The template named name ("default", "tool_use", ...); NULL when absent. */
const char *ft_tokenizer_chat_template_named(const ft_tokenizer *t, const char *name);
/* The names of the templates (at most max of them into names, valid while t lives);
 * returns how many there are. */
size_t ft_tokenizer_chat_template_names(const ft_tokenizer *t, const char **names, size_t max);

/* Whether the post-processor adds a BOS token at the start (as Llama's does). */
bool ft_tokenizer_adds_bos(const ft_tokenizer *t);

#endif
