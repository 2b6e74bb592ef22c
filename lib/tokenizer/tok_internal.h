/* Internal structures of the tokenizer, shared by lib/tokenizer/tokenizer.c and lib/tokenizer/tok_*.c.
 *
 * Encoding mirrors the `tokenizers` pipeline: the text becomes a list of pieces (tk_pieces,
 * byte ranges in one arena); added tokens split it first, the normalizer rewrites the
 * pieces that are not added tokens, the pre-tokenizers split them further, and the BPE
 * model turns each remaining piece into ids. A piece already holding an id (an added
 * token) passes through the later stages untouched. */
#ifndef FT_TOK_INTERNAL_H
#define FT_TOK_INTERNAL_H

#include <jansson.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/ft_error.h"
#include "tokenizer/tokenizer.h"

/* A growable byte buffer. */
typedef struct tk_buf {
    char *data;
    size_t n, cap;
} tk_buf;

/* ---- hash maps (tok_map.c) ---- */

/* String -> int32 map with open addressing; keys are copied into the map. */
typedef struct tk_strmap {
    uint32_t *slots; /* index+1 into keys, 0 = empty */
    size_t cap;      /* power of two */
    char **keys;
    uint32_t *klen;
    int32_t *vals;
    size_t n, kcap;
} tk_strmap;

int tk_strmap_init(tk_strmap *m, size_t expected);
void tk_strmap_free(tk_strmap *m);
/* Inserts or overwrites; -1 on out-of-memory. */
int tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val);
/* -1 when absent. */
int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len);

/* (left id, right id) -> (rank, merged id) for BPE merges. */
typedef struct tk_pairmap {
    uint64_t *keys; /* UINT64_MAX = empty */
    int32_t *rank, *merged;
    size_t cap, n;
} tk_pairmap;

int tk_pairmap_init(tk_pairmap *m, size_t expected);
void tk_pairmap_free(tk_pairmap *m);
int tk_pairmap_put(tk_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
/* false when absent. */
bool tk_pairmap_get(const tk_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged);

/* ---- UTF-8 helpers (tok_utf8.c) ---- */

/* Whether s[0..len) is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF). */
bool tk_utf8_valid(const char *s, size_t len);
/* Decodes one code point of valid UTF-8 at s; returns its byte length. */
int tk_utf8_next(const char *s, uint32_t *cp);
int tk_utf8_encode(uint32_t cp, char out[4]);
/* Appends s as Rust's String::from_utf8_lossy does (U+FFFD per maximal invalid
 * subpart). */
int tk_utf8_lossy_append(const unsigned char *s, size_t len, tk_buf *b);
bool tk_is_whitespace(uint32_t cp);  /* Rust char::is_whitespace */
/* Code points whose normalization tokenizers' older Unicode tables treat differently
 * (tok_unicode_compat.c, generated): normalizers pass them through as starters. */
bool tk_unicode_opaque(uint32_t cp);
/* A regex class whose code points differ between PCRE2's Unicode tables and those of
 * tokenizers' regex engine (tok_unicode_compat.c, generated): name is a general category
 * ("L", "Nd", ...) or "d" (\d); add and remove are PCRE2 class members ("\x{1C89}-..."),
 * either may be empty. tk_unicode_class(name, len): NULL when the two agree. */
typedef struct tk_uclass {
    const char *name, *add, *remove;
} tk_uclass;
const tk_uclass *tk_unicode_class(const char *name, size_t len);
bool tk_is_word_char(uint32_t cp);   /* Unicode word character, as single_word checks */

/* ---- growable byte buffer and piece list ---- */

int tk_buf_reserve(tk_buf *b, size_t extra);
int tk_buf_append(tk_buf *b, const void *s, size_t len);

typedef struct tk_piece {
    size_t off, len; /* into the arena */
    int32_t id;      /* >= 0: an added token, done */
    bool first;      /* starts at offset 0 of the original text */
} tk_piece;

typedef struct tk_pieces {
    tk_piece *p;
    size_t n, cap;
} tk_pieces;

int tk_pieces_push(tk_pieces *v, size_t off, size_t len, int32_t id, bool first);

/* Per-call scratch: the arena and two piece lists swapped between stages. */
typedef struct tk_work {
    tk_buf arena;
    tk_pieces a, b;
    pcre2_match_data *md;
    tk_buf tmp;
} tk_work;

/* ---- regex-based splitting ---- */

typedef enum {
    TK_SPLIT_REMOVED,
    TK_SPLIT_ISOLATED,
    TK_SPLIT_MERGED_PREV,
    TK_SPLIT_MERGED_NEXT,
    TK_SPLIT_CONTIGUOUS,
} tk_split_behavior;

/* Compiles pattern (literal when is_literal) with UTF|UCP and JIT, rewritten first to
 * match what tokenizers' engine matches (tok_regex.c: \s, Unicode classes). */
pcre2_code *tk_regex_compile(const char *pattern, bool is_literal, char *errbuf, size_t errlen);

/* ---- normalizers (tok_normalize.c) ---- */

typedef enum {
    TK_NORM_SEQUENCE,
    TK_NORM_NFC,
    TK_NORM_NFD,
    TK_NORM_NFKC,
    TK_NORM_NFKD,
    TK_NORM_PREPEND,
    TK_NORM_REPLACE,
    TK_NORM_LOWERCASE,
    TK_NORM_STRIP,
} tk_norm_type;

typedef struct tk_normalizer {
    tk_norm_type type;
    struct tk_normalizer *subs;
    size_t nsubs;
    char *str;     /* Prepend text, Replace content */
    char *pattern; /* Replace string pattern */
    pcre2_code *re; /* Replace regex pattern */
    bool left, right;
} tk_normalizer;

/* Parses a normalizer JSON object (jansson json_t *). */
int tk_normalizer_parse(tk_normalizer *n, const void *json, ft_err *err);
void tk_normalizer_free(tk_normalizer *n);
/* Normalizes s[0..len) into out (cleared first). */
int tk_normalize(const tk_normalizer *n, const char *s, size_t len, tk_buf *out, tk_work *w,
                 ft_err *err);

/* ---- pre-tokenizers (tok_pretokenize.c) ---- */

typedef enum {
    TK_PRE_SEQUENCE,
    TK_PRE_BYTELEVEL,
    TK_PRE_SPLIT,
    TK_PRE_METASPACE,
    TK_PRE_DIGITS,
    TK_PRE_WHITESPACE_SPLIT,
} tk_pre_type;

typedef enum { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER } tk_prepend_scheme;

typedef struct tk_pretok {
    tk_pre_type type;
    struct tk_pretok *subs;
    size_t nsubs;
    pcre2_code *re;
    tk_split_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* ByteLevel */
    char replacement[8];              /* Metaspace */
    size_t replacement_len;
    tk_prepend_scheme prepend;
    bool split;
    bool individual_digits;
} tk_pretok;

int tk_pretok_parse(tk_pretok *p, const void *json, ft_err *err);
void tk_pretok_free(tk_pretok *p);
/* Runs the pre-tokenizer over w->a (result back in w->a). */
int tk_pretokenize(const tk_pretok *p, tk_work *w, ft_err *err);
/* Splits piece list in -> out with a regex (the shared step of Split / ByteLevel). */
int tk_split_regex(const pcre2_code *re, tk_split_behavior behavior, bool invert, tk_work *w,
                   const tk_pieces *in, tk_pieces *out, ft_err *err);

/* The GPT-2 bytes_to_unicode table. */
extern const uint16_t tk_byte_to_cp[256];
/* Inverse: code point -> byte, -1 when not in the table (indexed up to 0x144). */
int tk_cp_to_byte(uint32_t cp);

/* ---- BPE model (tok_bpe.c) ---- */

typedef struct tk_bpe {
    tk_strmap vocab;
    char **id_to_tok; /* indexed by id, NULL for holes */
    size_t nid;
    tk_pairmap merges;
    int32_t *cp_id; /* single-code-point tokens below 0x10000 -> id, -1 absent */
    bool byte_fallback, fuse_unk, ignore_merges;
    char *unk_token;
    int32_t unk_id;
    int32_t byte_ids[256]; /* <0xNN> ids, -1 absent */
    /* word cache */
    pthread_mutex_t cache_lock;
    struct tk_cache *cache;
} tk_bpe;

/* The number of ids a vocabulary of n_vocab model.vocab entries and n_added added tokens
 * may use: n_vocab + n_added (at most INT32_MAX, ids being int32), so every id is below
 * it. tokenizers gives an added token that is not in model.vocab the next id from the
 * vocab's size on (AddedVocabulary::add_tokens), so a file it wrote never goes further;
 * an id beyond is a corrupt or hostile file (and would size the id tables). */
static inline size_t tk_vocab_limit(size_t n_vocab, size_t n_added)
{
    size_t n = n_vocab + n_added;
    return n < (size_t)INT32_MAX ? n : (size_t)INT32_MAX;
}

/* Parses the "model" object. n_added: the number of added tokens (for the id limit).
 * Errors name path: an id at or past tk_vocab_limit, two tokens with one id. */
int tk_bpe_parse(tk_bpe *m, const void *json, size_t n_added, const char *path, ft_err *err);
void tk_bpe_free(tk_bpe *m);
int tk_bpe_encode(const tk_bpe *m, const char *s, size_t len, ft_ids *out, ft_err *err);

/* ---- added tokens (tok_added.c) ---- */

typedef struct tk_added_token {
    char *content;
    size_t len;
    /* A normalized=true token's content after the tokenizer's normalizer (NULL when there
     * is none): what tokenizers >= 0.21 gives back for its id (id_to_token, decode). */
    char *text;
    size_t text_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tk_added_token;

/* A set of patterns matched leftmost-longest (a trie over bytes). */
typedef struct tk_matcher {
    struct tk_trie_node *nodes;
    size_t n, cap;
    char **patterns; /* the (possibly normalized) pattern strings */
    size_t npat;
} tk_matcher;

typedef struct tk_added {
    tk_added_token *toks;
    size_t n;
    tk_matcher raw, norm; /* non-normalized / normalized tokens */
    tk_strmap by_content;
    int32_t *index_of_id; /* id -> index into toks, -1 when not an added token */
    size_t nindex;
} tk_added;

/* Parses "added_tokens" (json_array) against the parsed model. Errors: an id at or past
 * tk_vocab_limit, an id that model.vocab or another added token gives to a different
 * token, a token that model.vocab gives another id. */
int tk_added_parse(tk_added *a, const void *json_array, const tk_bpe *model,
                   const tk_normalizer *norm, ft_err *err);
void tk_added_free(tk_added *a);
/* Splits the id < 0 pieces of w->a on added tokens of the raw or normalized set. */
int tk_added_split(const tk_added *a, bool normalized, tk_work *w, ft_err *err);

/* ---- added special tokens (tok_grow.c) ---- */

/* Adds the tokens of tokens_json (a JSON array of non-empty strings) to tokenizer.json's
 * object tj as tokenizer.add_special_tokens does (tok_grow.c); errors name file. */
int tk_json_add_special(json_t *tj, const char *tokens_json, const char *file, ft_err *err);

/* ---- decoders (tok_decode.c) ---- */

typedef enum {
    TK_DEC_SEQUENCE,
    TK_DEC_BYTELEVEL,
    TK_DEC_REPLACE,
    TK_DEC_BYTEFALLBACK,
    TK_DEC_FUSE,
    TK_DEC_STRIP,
    TK_DEC_METASPACE,
} tk_dec_type;

typedef struct tk_decoder {
    tk_dec_type type;
    struct tk_decoder *subs;
    size_t nsubs;
    char *pattern, *content;
    uint32_t strip_char;
    size_t strip_start, strip_stop;
    uint32_t replacement;
    tk_prepend_scheme prepend;
} tk_decoder;

int tk_decoder_parse(tk_decoder *d, const void *json, ft_err *err);
void tk_decoder_free(tk_decoder *d);

/* A list of token strings being decoded. */
typedef struct tk_strlist {
    char **s;
    size_t *len;
    size_t n, cap;
} tk_strlist;

int tk_strlist_push(tk_strlist *l, const char *s, size_t len);
void tk_strlist_free(tk_strlist *l);
/* Runs decoder d over l (in place). */
int tk_decode_chain(const tk_decoder *d, tk_strlist *l, ft_err *err);

/* ---- the tokenizer ---- */

struct ft_tokenizer {
    bool has_normalizer, has_pretok, has_decoder;
    tk_normalizer normalizer;
    tk_pretok pretok;
    tk_bpe bpe;
    tk_added added;
    tk_decoder decoder;
    /* the post-processor's single-sequence template: ids before and after the text */
    ft_ids prefix, suffix;
    int vocab_size;
    char *bos, *eos, *pad, *unk;
    json_t *special;        /* transformers' special_tokens_map: {"bos_token": "<s>", ...} */
    char *chat_template;    /* the default template (NULL: none) */
    json_t *chat_templates; /* every template by name ("default" included), or NULL */
};

#endif
