/* Unit tests of lib/tokenizer/tokenizer.c and lib/tokenizer/tok_*.c: tiny hand-written tokenizer.json files
 * (written into a mkdtemp directory) covering each component — byte-level and
 * SentencePiece-style BPE, both merges encodings, byte fallback, unk fusing,
 * ignore_merges, the Split behaviours, Metaspace prepend schemes, normalizers, added
 * tokens (special, lstrip, rstrip, single_word), post-processors, decoders, the config
 * files — and every error path. JSON is written with ' for " to keep it readable. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fifo_guard.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define SP "\xE2\x96\x81" /* ▁ */
#define GS "\xC4\xA0"     /* Ġ, the byte-level space */

static char tmpdir[64];

/* Writes text (with ' turned into ") to tmpdir/sub/name; returns the directory. */
static const char *write_tok(const char *sub, const char *name, const char *text)
{
    static char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0)
        return dir;
    char path[400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    for (const char *p = text; *p; p++)
        fputc(*p == '\'' ? '"' : *p, f);
    fclose(f);
    return dir;
}

static ft_tokenizer *load(const char *sub, const char *json)
{
    const char *dir = write_tok(sub, "tokenizer.json", json);
    ft_tokenizer *t = NULL;
    ft_err err;
    if (ft_tokenizer_load(&t, dir, &err)) {
        fprintf(stderr, "  load %s: %s\n", sub, err.msg);
        return NULL;
    }
    return t;
}

/* Encodes text and compares with the expected ids (terminated by -1). */
static int enc_is(const ft_tokenizer *t, const char *text, bool add_special, const int32_t *want)
{
    ft_ids ids = {0};
    ft_err err;
    if (ft_tokenizer_encode(t, text, strlen(text), add_special, &ids, &err)) {
        fprintf(stderr, "  encode '%s': %s\n", text, err.msg);
        return 0;
    }
    size_t n = 0;
    while (want[n] >= 0)
        n++;
    int ok = ids.n == n && (n == 0 || memcmp(ids.data, want, n * sizeof *want) == 0);
    if (!ok) {
        fprintf(stderr, "  encode '%s' gave", text);
        for (size_t i = 0; i < ids.n; i++)
            fprintf(stderr, " %d", ids.data[i]);
        fprintf(stderr, "\n");
    }
    ft_ids_free(&ids);
    return ok;
}

static int dec_is(const ft_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *want)
{
    char *text;
    size_t len;
    ft_err err;
    if (ft_tokenizer_decode(t, ids, n, skip, &text, &len, &err)) {
        fprintf(stderr, "  decode: %s\n", err.msg);
        return 0;
    }
    int ok = len == strlen(want) && memcmp(text, want, len) == 0;
    if (!ok)
        fprintf(stderr, "  decode gave '%s', want '%s'\n", text, want);
    free(text);
    return ok;
}

static const char *BYTELEVEL_JSON =
    "{'added_tokens': [{'id': 6, 'content': '<|end|>', 'special': true, 'normalized': false,"
    "  'lstrip': false, 'rstrip': false, 'single_word': false}],"
    " 'normalizer': null,"
    " 'pre_tokenizer': {'type': 'ByteLevel', 'add_prefix_space': false, 'trim_offsets': true,"
    "   'use_regex': true},"
    " 'post_processor': {'type': 'ByteLevel', 'trim_offsets': false},"
    " 'decoder': {'type': 'ByteLevel'},"
    " 'model': {'type': 'BPE', 'dropout': null, 'unk_token': null, 'byte_fallback': false,"
    "   'vocab': {'a': 0, 'b': 1, '" GS "': 2, 'ab': 3, '" GS "ab': 4, '\xC4\x8A': 5},"
    "   'merges': %s}}";

static void test_bytelevel(void)
{
    char json[2048];
    const char *forms[2] = {"['a b', '" GS " ab']", "[['a', 'b'], ['" GS "', 'ab']]"};
    for (int f = 0; f < 2; f++) {
        snprintf(json, sizeof json, BYTELEVEL_JSON, forms[f]);
        ft_tokenizer *t = load(f ? "bl_pairs" : "bl", json);
        CHECK(t);
        if (!t)
            return;
        CHECK(enc_is(t, "ab ab<|end|>\n", true, (int32_t[]){3, 4, 6, 5, -1}));
        CHECK(enc_is(t, "", true, (int32_t[]){-1}));
        CHECK(enc_is(t, "ba", false, (int32_t[]){1, 0, -1}));
        int32_t ids[] = {3, 4, 6, 5};
        CHECK(dec_is(t, ids, 4, false, "ab ab<|end|>\n"));
        CHECK(dec_is(t, ids, 4, true, "ab ab\n"));
        CHECK(ft_tokenizer_vocab_size(t) == 7);
        CHECK(ft_tokenizer_token_to_id(t, "<|end|>") == 6);
        CHECK(ft_tokenizer_token_to_id(t, GS "ab") == 4);
        CHECK(ft_tokenizer_token_to_id(t, "zz") == -1);
        CHECK(!strcmp(ft_tokenizer_id_to_token(t, 3), "ab"));
        CHECK(ft_tokenizer_id_to_token(t, 7) == NULL);
        CHECK(!ft_tokenizer_adds_bos(t));
        CHECK(ft_tokenizer_bos_id(t) == -1);
        ft_tokenizer_free(t);
    }
}

/* An invalid byte sequence in byte-level tokens decodes to U+FFFD, as from_utf8_lossy. */
static void test_bytelevel_lossy(void)
{
    ft_tokenizer *t = load("lossy",
        "{'model': {'type': 'BPE', 'vocab': {'\xC3\x83': 0, 'a': 1}, 'merges': []},"
        " 'decoder': {'type': 'ByteLevel'}}");
    CHECK(t);
    if (!t)
        return;
    /* U+00C3 is the byte-level stand-in of byte 0xC3: a lone lead byte */
    CHECK(dec_is(t, (int32_t[]){0, 1}, 2, false, "\xEF\xBF\xBD" "a"));
    ft_tokenizer_free(t);
}

static const char *LLAMA2_JSON =
    "{'added_tokens': ["
    "  {'id': 0, 'content': '<unk>', 'special': true, 'normalized': false, 'lstrip': false,"
    "   'rstrip': false, 'single_word': false},"
    "  {'id': 1, 'content': '<s>', 'special': true, 'normalized': false, 'lstrip': false,"
    "   'rstrip': false, 'single_word': false},"
    "  {'id': 2, 'content': '</s>', 'special': true, 'normalized': false, 'lstrip': false,"
    "   'rstrip': false, 'single_word': false}],"
    " 'normalizer': {'type': 'Sequence', 'normalizers': ["
    "   {'type': 'Prepend', 'prepend': '" SP "'},"
    "   {'type': 'Replace', 'pattern': {'String': ' '}, 'content': '" SP "'}]},"
    " 'pre_tokenizer': null,"
    " 'post_processor': {'type': 'TemplateProcessing',"
    "   'single': [{'SpecialToken': {'id': '<s>', 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}}],"
    "   'pair': [], 'special_tokens': {'<s>': {'id': '<s>', 'ids': [1], 'tokens': ['<s>']}}},"
    " 'decoder': {'type': 'Sequence', 'decoders': ["
    "   {'type': 'Replace', 'pattern': {'String': '" SP "'}, 'content': ' '},"
    "   {'type': 'ByteFallback'}, {'type': 'Fuse'},"
    "   {'type': 'Strip', 'content': ' ', 'start': 1, 'stop': 0}]},"
    " 'model': {'type': 'BPE', 'dropout': null, 'unk_token': '<unk>', 'fuse_unk': true,"
    "   'byte_fallback': %s,"
    "   'vocab': {'<unk>': 0, '<s>': 1, '</s>': 2, '<0xC3>': 3, '<0xA9>': 4, '" SP "': 5,"
    "     'h': 6, 'i': 7, 'hi': 8, '" SP "hi': 9},"
    "   'merges': ['h i', '" SP " hi']}}";

static void test_sentencepiece_legacy(void)
{
    char json[4096];
    snprintf(json, sizeof json, LLAMA2_JSON, "true");
    ft_tokenizer *t = load("llama2", json);
    CHECK(t);
    if (!t)
        return;
    /* "hi hi é" -> "▁hi▁hi▁é": é has no token and falls back to its UTF-8 bytes */
    CHECK(enc_is(t, "hi hi \xC3\xA9", true, (int32_t[]){1, 9, 9, 5, 3, 4, -1}));
    CHECK(enc_is(t, "hi", false, (int32_t[]){9, -1}));
    /* special tokens split the text; each piece gets its own ▁ prefix */
    CHECK(enc_is(t, "hi</s>hi", false, (int32_t[]){9, 2, 9, -1}));
    CHECK(enc_is(t, "", true, (int32_t[]){1, -1}));
    int32_t ids[] = {1, 9, 9, 5, 3, 4};
    CHECK(dec_is(t, ids, 6, false, "<s> hi hi \xC3\xA9"));
    CHECK(dec_is(t, ids, 6, true, "hi hi \xC3\xA9"));
    /* an invalid byte run decodes to one U+FFFD per byte */
    CHECK(dec_is(t, (int32_t[]){3, 3, 9}, 3, false, "\xEF\xBF\xBD\xEF\xBF\xBD hi"));
    CHECK(ft_tokenizer_adds_bos(t));
    ft_tokenizer_free(t);

    /* without byte fallback, unknown characters become <unk>, fused when consecutive */
    snprintf(json, sizeof json, LLAMA2_JSON, "false");
    t = load("llama2_unk", json);
    CHECK(t);
    if (!t)
        return;
    CHECK(enc_is(t, "hxyi", false, (int32_t[]){5, 6, 0, 7, -1}));
    ft_tokenizer_free(t);
}

static const char *META_JSON =
    "{'pre_tokenizer': {'type': 'Metaspace', 'replacement': '" SP "', 'prepend_scheme': '%s',"
    "   'split': %s},"
    " 'added_tokens': [{'id': 9, 'content': '<x>', 'special': true, 'normalized': false,"
    "   'lstrip': false, 'rstrip': false, 'single_word': false}],"
    " 'decoder': {'type': 'Metaspace', 'replacement': '" SP "', 'prepend_scheme': '%s', 'split': true},"
    " 'model': {'type': 'BPE', 'unk_token': '<unk>', 'byte_fallback': false, 'fuse_unk': false,"
    "   'vocab': {'<unk>': 0, '" SP "': 1, 'h': 2, 'i': 3, 'hi': 4, '" SP "hi': 5,"
    "     '" SP SP "': 6, 'i" SP "': 7, 'i" SP "h': 8},"
    "   'merges': ['h i', '" SP " hi', '" SP " " SP "', 'i " SP "', 'i" SP " h']}}";

static ft_tokenizer *load_meta(const char *scheme, const char *split)
{
    char json[4096], sub[64];
    snprintf(json, sizeof json, META_JSON, scheme, split, scheme);
    snprintf(sub, sizeof sub, "meta_%s_%s", scheme, split);
    return load(sub, json);
}

static void test_metaspace(void)
{
    ft_tokenizer *t = load_meta("always", "true");
    CHECK(t);
    if (!t)
        return;
    /* split: each ▁ starts a new piece, so "i▁" never forms */
    CHECK(enc_is(t, "hi hi", false, (int32_t[]){5, 5, -1}));
    CHECK(enc_is(t, "hi<x>hi", false, (int32_t[]){5, 9, 5, -1}));
    CHECK(enc_is(t, " hi", false, (int32_t[]){5, -1}));
    CHECK(dec_is(t, (int32_t[]){5, 5}, 2, false, "hi hi"));
    /* the decoder drops every ▁ of the first token, as tokenizers does */
    CHECK(dec_is(t, (int32_t[]){6, 5}, 2, false, " hi"));
    ft_tokenizer_free(t);

    t = load_meta("first", "true");
    CHECK(t);
    if (!t)
        return;
    /* only the piece at the start of the text gets the ▁ */
    CHECK(enc_is(t, "hi<x>hi", false, (int32_t[]){5, 9, 4, -1}));
    CHECK(dec_is(t, (int32_t[]){5, 1, 5}, 3, false, "hi  hi"));
    ft_tokenizer_free(t);

    t = load_meta("never", "false");
    CHECK(t);
    if (!t)
        return;
    /* no split, no prefix: "hi▁hi" is one piece, "▁hi" merges across the piece */
    CHECK(enc_is(t, "hi hi", false, (int32_t[]){4, 5, -1}));
    CHECK(dec_is(t, (int32_t[]){5}, 1, false, " hi"));
    ft_tokenizer_free(t);
}

static void test_ignore_merges(void)
{
    const char *json =
        "{'model': {'type': 'BPE', 'ignore_merges': %s,"
        "  'vocab': {'a': 0, 'b': 1, 'c': 2, 'ab': 3, 'bc': 4, 'abc': 5},"
        "  'merges': ['b c', 'a b']}}";
    char buf[512];
    snprintf(buf, sizeof buf, json, "false");
    ft_tokenizer *t = load("im_off", buf);
    CHECK(t);
    if (t)
        CHECK(enc_is(t, "abc", false, (int32_t[]){0, 4, -1}));
    ft_tokenizer_free(t);
    snprintf(buf, sizeof buf, json, "true");
    t = load("im_on", buf);
    CHECK(t);
    if (t)
        CHECK(enc_is(t, "abc", false, (int32_t[]){5, -1}));
    ft_tokenizer_free(t);
}

/* Split behaviours on "a-b--c" with the literal pattern "-" (through the internal API). */
static void split_is(tk_split_behavior beh, bool invert, const char *const *want)
{
    char eb[128];
    pcre2_code *re = tk_regex_compile("-", true, eb, sizeof eb);
    tk_work w = {0};
    w.md = pcre2_match_data_create(1, NULL);
    tk_buf_append(&w.arena, "a-b--c", 6);
    tk_pieces_push(&w.a, 0, 6, -1, true);
    ft_err err;
    CHECK(tk_split_regex(re, beh, invert, &w, &w.a, &w.b, &err) == 0);
    size_t n = 0;
    while (want[n])
        n++;
    CHECK(w.b.n == n);
    for (size_t i = 0; i < n && i < w.b.n; i++)
        CHECK(w.b.p[i].len == strlen(want[i]) &&
              !memcmp(w.arena.data + w.b.p[i].off, want[i], w.b.p[i].len));
    free(w.arena.data);
    free(w.tmp.data);
    free(w.a.p);
    free(w.b.p);
    pcre2_match_data_free(w.md);
    pcre2_code_free(re);
}

static void test_split_behaviors(void)
{
    split_is(TK_SPLIT_REMOVED, false, (const char *const[]){"a", "b", "c", NULL});
    split_is(TK_SPLIT_ISOLATED, false, (const char *const[]){"a", "-", "b", "-", "-", "c", NULL});
    split_is(TK_SPLIT_MERGED_PREV, false, (const char *const[]){"a-", "b-", "-", "c", NULL});
    split_is(TK_SPLIT_MERGED_NEXT, false, (const char *const[]){"a", "-b", "-", "-c", NULL});
    split_is(TK_SPLIT_CONTIGUOUS, false, (const char *const[]){"a", "-", "b", "--", "c", NULL});
    split_is(TK_SPLIT_REMOVED, true, (const char *const[]){"-", "-", "-", NULL});
}

/* A Split pre-tokenizer from JSON with a Unicode regex, then ByteLevel without regex. */
static void test_split_regex_json(void)
{
    ft_tokenizer *t = load("split",
        "{'pre_tokenizer': {'type': 'Sequence', 'pretokenizers': ["
        "   {'type': 'Split', 'pattern': {'Regex': '\\\\p{N}'}, 'behavior': 'Isolated', 'invert': false},"
        "   {'type': 'ByteLevel', 'add_prefix_space': false, 'use_regex': false}]},"
        " 'model': {'type': 'BPE', 'vocab': {'1': 0, '2': 1, '12': 2, '\xC3\xA9': 3}, 'merges': ['1 2']}}");
    CHECK(t);
    if (!t)
        return;
    /* digits are isolated, so "12" never merges */
    CHECK(enc_is(t, "12", false, (int32_t[]){0, 1, -1}));
    ft_tokenizer_free(t);
}

static int norm_is(const char *json, const char *in, const char *want)
{
    json_error_t je;
    json_t *j = json_loads(json, 0, &je);
    tk_normalizer n;
    ft_err err;
    int ok = 0;
    if (j && tk_normalizer_parse(&n, j, &err) == 0) {
        tk_work w = {0};
        w.md = pcre2_match_data_create(1, NULL);
        tk_buf out = {0};
        if (tk_normalize(&n, in, strlen(in), &out, &w, &err) == 0)
            ok = out.n == strlen(want) && !memcmp(out.data, want, out.n);
        if (!ok)
            fprintf(stderr, "  normalize '%s' gave '%.*s'\n", in, (int)out.n, out.data);
        free(out.data);
        free(w.tmp.data);
        pcre2_match_data_free(w.md);
        tk_normalizer_free(&n);
    }
    json_decref(j);
    return ok;
}

static void test_normalizers(void)
{
    CHECK(norm_is("{\"type\": \"NFC\"}", "e\xCC\x81", "\xC3\xA9"));
    CHECK(norm_is("{\"type\": \"NFD\"}", "\xC3\xA9", "e\xCC\x81"));
    CHECK(norm_is("{\"type\": \"NFKC\"}", "\xEF\xAC\x81", "fi"));
    CHECK(norm_is("{\"type\": \"NFKD\"}", "\xE2\x91\xA0", "1"));
    CHECK(norm_is("{\"type\": \"Lowercase\"}", "AbC\xC3\x89", "abc\xC3\xA9"));
    CHECK(norm_is("{\"type\": \"Strip\", \"strip_left\": true, \"strip_right\": true}", "  x y \t",
                  "x y"));
    CHECK(norm_is("{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"\\\\s+\"}, \"content\": \"_\"}",
                  "a  b\tc", "a_b_c"));
    CHECK(norm_is("{\"type\": \"Prepend\", \"prepend\": \"#\"}", "", ""));
    CHECK(norm_is("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"},"
                  " {\"type\": \"Prepend\", \"prepend\": \"#\"}]}",
                  "AB", "#ab"));
}

static void test_added_tokens(void)
{
    ft_tokenizer *t = load("added",
        "{'added_tokens': ["
        "  {'id': 4, 'content': '<m>', 'special': true, 'normalized': false, 'lstrip': true,"
        "   'rstrip': true, 'single_word': false},"
        "  {'id': 5, 'content': 'ab', 'special': false, 'normalized': true, 'lstrip': false,"
        "   'rstrip': false, 'single_word': true},"
        "  {'id': 6, 'content': '<m>x', 'special': false, 'normalized': false, 'lstrip': false,"
        "   'rstrip': false, 'single_word': false}],"
        " 'normalizer': {'type': 'Lowercase'},"
        " 'pre_tokenizer': {'type': 'WhitespaceSplit'},"
        " 'model': {'type': 'BPE', 'unk_token': '<unk>', 'vocab': {'<unk>': 0, 'a': 1, 'b': 2, 'x': 3},"
        "   'merges': []}}");
    CHECK(t);
    if (!t)
        return;
    /* lstrip / rstrip absorb the spaces around <m> */
    CHECK(enc_is(t, "a  <m>  b", false, (int32_t[]){1, 4, 2, -1}));
    /* the longest match wins: <m>x over <m> */
    CHECK(enc_is(t, "<m>x", false, (int32_t[]){6, -1}));
    /* single_word: "ab" only when not touching word characters; matched after lowercasing */
    CHECK(enc_is(t, "AB xab", false, (int32_t[]){5, 3, 1, 2, -1}));
    CHECK(dec_is(t, (int32_t[]){1, 4, 5}, 3, false, "a <m> ab"));
    CHECK(dec_is(t, (int32_t[]){1, 4, 5}, 3, true, "a ab"));
    ft_tokenizer_free(t);
}

/* Special tokens added (model.add_special_tokens), as tokenizers' add_special_tokens numbers
 * them: a token of model.vocab keeps its id (and becomes special: matched whole), an added
 * token already is left alone, new ones take the vocab's size on (or one past the largest
 * added id at or past it); encoding matches them whole; the saved files load to the same
 * vocabulary and say extra_special_tokens. Bad lists are errors. */
static void test_add_special_tokens(void)
{
    const char *json =
        "{'added_tokens': [{'id': 3, 'content': '<e>', 'special': true, 'normalized': false}],"
        " 'pre_tokenizer': {'type': 'WhitespaceSplit'},"
        " 'model': {'type': 'BPE', 'vocab': {'a': 0, 'b': 1, 'ab': 2, '<e>': 3}, "
        "   'merges': ['a b']}}";
    const char *dir = write_tok("grow", "tokenizer.json", json);
    write_tok("grow", "tokenizer_config.json", "{'eos_token': '<e>', 'model_max_length': 1e30}");
    ft_tokenizer *t = NULL;
    ft_err err = {0};
    const char *add = "[\"<s1>\", \"ab\", \"<e>\", \"<s2>\", \"<s1>\"]";
    CHECK(ft_tokenizer_load_adding(&t, dir, add, &err) == 0);
    if (!t)
        return;
    CHECK(ft_tokenizer_vocab_size(t) == 6);
    CHECK(ft_tokenizer_token_to_id(t, "<s1>") == 4 && ft_tokenizer_token_to_id(t, "<s2>") == 5);
    CHECK(ft_tokenizer_token_to_id(t, "ab") == 2 && ft_tokenizer_token_to_id(t, "<e>") == 3);
    /* whole, never split, even inside a word ("ab" is now a special token) */
    CHECK(enc_is(t, "a<s1>b<s2>aab", false, (int32_t[]){0, 4, 1, 5, 0, 2, -1}));
    CHECK(dec_is(t, (int32_t[]){0, 4, 5}, 3, true, "a"));
    ft_tokenizer_free(t);
    /* saved, then read back as it is */
    char out[300];
    snprintf(out, sizeof out, "%s/grow_saved", tmpdir);
    CHECK(mkdir(out, 0755) == 0);
    CHECK(ft_tokenizer_save_adding(dir, out, add, &err) == 0);
    t = NULL;
    CHECK(ft_tokenizer_load(&t, out, &err) == 0);
    if (t) {
        CHECK(ft_tokenizer_vocab_size(t) == 6 && ft_tokenizer_eos_id(t) == 3);
        CHECK(enc_is(t, "a<s1>b<s2>aab", false, (int32_t[]){0, 4, 1, 5, 0, 2, -1}));
        ft_tokenizer_free(t);
    }
    char path[400];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    CHECK(cfg && json_array_size(json_object_get(cfg, "extra_special_tokens")) == 5);
    json_decref(cfg);
    /* bad lists */
    static const char *const bad[] = {"[\"<x>\", 3]", "[\"\"]", "\"<x>\"", "[\"<x>\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        t = NULL;
        err.msg[0] = '\0';
        CHECK(ft_tokenizer_load_adding(&t, dir, bad[i], &err) != 0 && !t);
        CHECK(strstr(err.msg, "tokenizer.json") != NULL);
    }
}

/* The special token named name in t's special_tokens_map, or NULL. */
static const char *special(const ft_tokenizer *t, const char *name)
{
    return json_string_value(json_object_get(ft_tokenizer_special_tokens(t), name));
}

static void test_config_files(void)
{
    /* with added_tokens_decoder (transformers 5 then ignores special_tokens_map.json) */
    write_tok("cfg", "tokenizer_config.json",
              "{'bos_token': {'__type': 'AddedToken', 'content': '<s>', 'lstrip': false},"
              " 'eos_token': '</s>', 'added_tokens_decoder': {},"
              " 'sep_token': '</s>', 'image_token': '<s>', 'add_bos_token': true,"
              " 'odd_token': {'content': 'no __type: not a token'},"
              " 'extra_special_tokens': {'boi': '</s>'},"
              " 'chat_template': [{'name': 'tool_use', 'template': 'T'},"
              "                   {'name': 'default', 'template': 'D'}]}");
    write_tok("cfg", "special_tokens_map.json", "{'pad_token': '</s>', 'eos_token': '<s>'}");
    char json[4096];
    snprintf(json, sizeof json, LLAMA2_JSON, "true");
    ft_tokenizer *t = load("cfg", json);
    CHECK(t);
    if (!t)
        return;
    CHECK(ft_tokenizer_bos_id(t) == 1);
    CHECK(ft_tokenizer_eos_id(t) == 2);
    CHECK(ft_tokenizer_pad_id(t) == -1);
    CHECK(!strcmp(ft_tokenizer_bos_token(t), "<s>"));
    CHECK(!strcmp(ft_tokenizer_eos_token(t), "</s>"));
    CHECK(!ft_tokenizer_pad_token(t));
    /* the special_tokens_map: the seven named ones it has, then the model-specific ones */
    CHECK(json_object_size(ft_tokenizer_special_tokens(t)) == 6);
    CHECK(special(t, "sep_token") && !strcmp(special(t, "sep_token"), "</s>"));
    CHECK(special(t, "unk_token") && !strcmp(special(t, "unk_token"), "<unk>"));
    CHECK(special(t, "image_token") && !strcmp(special(t, "image_token"), "<s>"));
    CHECK(special(t, "boi") && !strcmp(special(t, "boi"), "</s>"));
    CHECK(!special(t, "odd_token") && !special(t, "add_bos_token"));
    CHECK(ft_tokenizer_chat_template(t) && !strcmp(ft_tokenizer_chat_template(t), "D"));
    CHECK(ft_tokenizer_chat_template_named(t, "tool_use") &&
          !strcmp(ft_tokenizer_chat_template_named(t, "tool_use"), "T"));
    CHECK(!ft_tokenizer_chat_template_named(t, "rag"));
    const char *names[4];
    CHECK(ft_tokenizer_chat_template_names(t, names, 4) == 2 && !strcmp(names[0], "tool_use") &&
          !strcmp(names[1], "default"));
    ft_tokenizer_free(t);
    /* loading the tokenizer.json file path directly finds the config beside it */
    char path[400];
    snprintf(path, sizeof path, "%s/cfg/tokenizer.json", tmpdir);
    ft_err err;
    CHECK(ft_tokenizer_load(&t, path, &err) == 0);
    if (t)
        CHECK(ft_tokenizer_bos_id(t) == 1);
    ft_tokenizer_free(t);

    /* without added_tokens_decoder special_tokens_map.json is read, and its entries win
     * (its objects are tokens); template files replace the config's templates: the
     * default from chat_template.jinja, the others from additional_chat_templates/ */
    write_tok("cfg2", "tokenizer_config.json",
              "{'eos_token': '</s>', 'chat_template': 'CONFIG'}");
    write_tok("cfg2", "special_tokens_map.json",
              "{'pad_token': '</s>', 'eos_token': '<s>', 'mask_token': {'content': '<unk>'},"
              " 'foo_token': {'content': '<s>', 'special': true}}");
    write_tok("cfg2", "chat_template.jinja", "FILE");
    write_tok("cfg2/additional_chat_templates", "rag.jinja", "RAG");
    write_tok("cfg2/additional_chat_templates", "a_b.jinja", "AB");
    write_tok("cfg2/additional_chat_templates", "notes.txt", "not a template");
    t = load("cfg2", json);
    CHECK(t);
    if (!t)
        return;
    CHECK(!strcmp(ft_tokenizer_eos_token(t), "<s>") && ft_tokenizer_eos_id(t) == 1);
    CHECK(ft_tokenizer_pad_token(t) && !strcmp(ft_tokenizer_pad_token(t), "</s>"));
    CHECK(special(t, "mask_token") && !strcmp(special(t, "mask_token"), "<unk>"));
    CHECK(special(t, "foo_token") && !strcmp(special(t, "foo_token"), "<s>"));
    CHECK(ft_tokenizer_chat_template(t) && !strcmp(ft_tokenizer_chat_template(t), "FILE"));
    CHECK(ft_tokenizer_chat_template_named(t, "rag") &&
          !strcmp(ft_tokenizer_chat_template_named(t, "rag"), "RAG"));
    CHECK(ft_tokenizer_chat_template_names(t, names, 4) == 3 && !strcmp(names[1], "a_b") &&
          !strcmp(names[2], "rag"));
    ft_tokenizer_free(t);
}

/* Loads json expecting failure with a message containing each of the needles. */
static int load_fails(const char *sub, const char *json, const char *n1, const char *n2)
{
    const char *dir = write_tok(sub, "tokenizer.json", json);
    ft_tokenizer *t = NULL;
    ft_err err = {0};
    if (ft_tokenizer_load(&t, dir, &err) == 0) {
        ft_tokenizer_free(t);
        fprintf(stderr, "  %s: load succeeded\n", sub);
        return 0;
    }
    int ok = strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2));
    if (!ok)
        fprintf(stderr, "  %s: message '%s'\n", sub, err.msg);
    return ok && t == NULL;
}

#define MODEL_OK "'model': {'type': 'BPE', 'vocab': {'a': 0}, 'merges': []}"

/* load_fails with every needle of a NULL-terminated list, and the file's path. */
static int load_fails_naming(const char *sub, const char *json, const char *const *needles)
{
    if (!load_fails(sub, json, "tokenizer.json", NULL))
        return 0;
    ft_tokenizer *t = NULL;
    ft_err err = {0};
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir, sub);
    ft_tokenizer_load(&t, dir, &err);
    for (; *needles; needles++)
        if (!strstr(err.msg, *needles)) {
            fprintf(stderr, "  %s: message '%s' lacks '%s'\n", sub, err.msg, *needles);
            return 0;
        }
    return strstr(err.msg, dir) != NULL;
}

#define ADDED(id, content) \
    "{'id': " #id ", 'content': '" content "', 'special': true, 'normalized': false}"
#define TOK(added, vocab) \
    "{'added_tokens': [" added "], 'model': {'type': 'BPE', 'vocab': {" vocab "}, 'merges': []}}"

/* Ids are bounded by the vocabulary (model.vocab's entries plus the added tokens, as
 * tokenizers numbers added tokens) and name one token each. */
static void test_vocab_ids(void)
{
    /* an added token may extend the vocab by the count of added tokens, no further */
    ft_tokenizer *t = load("ids_ok", TOK(ADDED(2, "<x>") "," ADDED(3, "<y>") "," ADDED(1, "b")
                                         "," ADDED(3, "<y>"),
                                         "'a': 0, 'b': 1"));
    CHECK(t && ft_tokenizer_vocab_size(t) == 4);
    CHECK(t && ft_tokenizer_token_to_id(t, "<y>") == 3 && ft_tokenizer_token_to_id(t, "b") == 1);
    ft_tokenizer_free(t);
    CHECK(load_fails_naming("ids_added_far", TOK(ADDED(1000000000, "<x>"), "'a': 0, 'b': 1"),
                            (const char *[]){"added_tokens[0]", "'<x>'", "1000000000",
                                             "beyond the vocabulary", NULL}));
    CHECK(load_fails_naming("ids_added_limit", TOK(ADDED(2, "<x>") "," ADDED(4, "<y>"), "'a': 0"),
                            (const char *[]){"added_tokens[1]", "'<y>'", "id 4", NULL}));
    CHECK(load_fails_naming("ids_vocab_far", TOK("", "'a': 0, 'b': 2147483646"),
                            (const char *[]){"model.vocab['b']", "2147483646", NULL}));
    CHECK(load_fails_naming("ids_vocab_huge", TOK("", "'a': 0, 'b': 99999999999"),
                            (const char *[]){"model.vocab['b']", "99999999999", NULL}));
    /* one id, two tokens: in the vocab, between the vocab and an added token, between two
       added tokens; and one added token with two ids */
    CHECK(load_fails_naming("ids_dup_vocab", TOK("", "'a': 0, 'b': 1, 'c': 1"),
                            (const char *[]){"id 1", "'b'", "'c'", NULL}));
    CHECK(load_fails_naming("ids_dup_added_vocab", TOK(ADDED(1, "<x>"), "'a': 0, 'b': 1"),
                            (const char *[]){"id 1", "'<x>'", "'b'", NULL}));
    CHECK(load_fails_naming("ids_dup_added", TOK(ADDED(2, "<x>") "," ADDED(2, "<y>"), "'a': 0, 'b': 1"),
                            (const char *[]){"id 2", "'<x>'", "'<y>'", NULL}));
    CHECK(load_fails_naming("ids_two_ids", TOK(ADDED(2, "<x>") "," ADDED(3, "<x>"), "'a': 0, 'b': 1"),
                            (const char *[]){"'<x>'", "2", "3", NULL}));
    CHECK(load_fails_naming("ids_vocab_other", TOK(ADDED(2, "b"), "'a': 0, 'b': 1"),
                            (const char *[]){"'b'", "id 2", "id 1", NULL}));
}

static void test_errors(void)
{
    ft_tokenizer *t = NULL;
    ft_err err;
    char path[300];
    snprintf(path, sizeof path, "%s/does_not_exist", tmpdir);
    CHECK(ft_tokenizer_load(&t, path, &err) == -1 && strstr(err.msg, "does_not_exist"));
    snprintf(path, sizeof path, "%s/empty_dir", tmpdir);
    write_tok("empty_dir", "other.json", "{}");
    CHECK(ft_tokenizer_load(&t, path, &err) == -1 && strstr(err.msg, "empty_dir/tokenizer.json"));
    CHECK(load_fails("badjson", "{'model': {\n 'type': 'BPE',,\n}}", "tokenizer.json:2", NULL));
    CHECK(load_fails("wordpiece", "{'model': {'type': 'WordPiece', 'vocab': {}}}", "model",
                     "WordPiece"));
    CHECK(load_fails("nonorm", "{'normalizer': {'type': 'BertNormalizer'}, " MODEL_OK "}",
                     "normalizer", "BertNormalizer"));
    CHECK(load_fails("nopre", "{'pre_tokenizer': {'type': 'CharDelimiterSplit'}, " MODEL_OK "}",
                     "pre-tokenizer", "CharDelimiterSplit"));
    CHECK(load_fails("nopost", "{'post_processor': {'type': 'Frobnicate'}, " MODEL_OK "}",
                     "post_processor", "Frobnicate"));
    CHECK(load_fails("nodec", "{'decoder': {'type': 'WordPiece'}, " MODEL_OK "}", "decoder",
                     "WordPiece"));
    CHECK(load_fails("dropout", "{'model': {'type': 'BPE', 'dropout': 0.1, 'vocab': {}, 'merges': []}}",
                     "dropout", NULL));
    CHECK(load_fails("cswp", "{'model': {'type': 'BPE', 'continuing_subword_prefix': '##',"
                             " 'vocab': {}, 'merges': []}}",
                     "continuing_subword_prefix", NULL));
    CHECK(load_fails("badmerge", "{'model': {'type': 'BPE', 'vocab': {'a': 0}, 'merges': ['a q']}}",
                     "merges[0]", NULL));
    CHECK(load_fails("badregex", "{'pre_tokenizer': {'type': 'Split', 'pattern': {'Regex': '(a'},"
                                 " 'behavior': 'Isolated'}, " MODEL_OK "}",
                     "Split", "(a"));
    write_tok("badcfg2", "tokenizer_config.json", "{'bos_token': ");
    CHECK(load_fails("badcfg2", "{" MODEL_OK "}", "tokenizer_config.json:1", NULL));

    t = load("errs", "{" MODEL_OK "}");
    CHECK(t);
    if (!t)
        return;
    ft_ids ids = {0};
    CHECK(ft_tokenizer_encode(t, "a\xC3(", 3, false, &ids, &err) == -1 &&
          strstr(err.msg, "UTF-8"));
    CHECK(ft_tokenizer_encode(t, "\xED\xA0\x80", 3, false, &ids, &err) == -1); /* surrogate */
    CHECK(ft_tokenizer_encode(t, "\xC0\xAF", 2, false, &ids, &err) == -1);     /* overlong */
    CHECK(ids.n == 0);
    char *text = NULL;
    size_t len;
    CHECK(ft_tokenizer_decode(t, (int32_t[]){0, 5}, 2, false, &text, &len, &err) == -1 &&
          strstr(err.msg, "5") && text == NULL);
    CHECK(ft_tokenizer_decode(t, (int32_t[]){-1}, 1, false, &text, &len, &err) == -1);
    /* characters not in the vocab with neither unk nor byte fallback are dropped, as in
       tokenizers */
    CHECK(enc_is(t, "aza", false, (int32_t[]){0, 0, -1}));
    ft_tokenizer_free(t);
}

/* The files of a tokenizer that a hostile dir may hold: a key given twice (Python's json
 * keeps the last one silently) and files that are FIFOs (the open would wait for a
 * writer) are errors naming the file. */
static void test_hostile_files(void)
{
    CHECK(load_fails_naming("dup_vocab", "{'model': {'type': 'BPE', 'vocab': {'a': 0, 'a': 1},"
                                         " 'merges': []}}",
                            (const char *[]){"duplicate", "'\"a\"'", NULL}));
    CHECK(load_fails_naming("dup_top", "{" MODEL_OK ", 'added_tokens': [], 'added_tokens': []}",
                            (const char *[]){"duplicate", "added_tokens", NULL}));
    write_tok("dup_cfg", "tokenizer_config.json", "{'eos_token': '</s>',\n 'eos_token': '<s>'}");
    CHECK(load_fails("dup_cfg", "{" MODEL_OK "}", "tokenizer_config.json:2", "eos_token"));
    write_tok("dup_stm", "special_tokens_map.json", "{'pad_token': 'a', 'pad_token': 'b'}");
    CHECK(load_fails("dup_stm", "{" MODEL_OK "}", "special_tokens_map.json", "duplicate"));

    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json",
                                        "special_tokens_map.json", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char sub[64], path[400];
        snprintf(sub, sizeof sub, "fifo%zu", i);
        const char *dir = write_tok(sub, "tokenizer.json", "{" MODEL_OK "}");
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        CHECK(make_fifo(path));
        ft_tokenizer *t = NULL;
        ft_err err = {0};
        fifo_guard(true);
        CHECK(ft_tokenizer_load(&t, dir, &err) == -1 && t == NULL);
        fifo_guard(false);
        if (!strstr(err.msg, path) || !strstr(err.msg, "not a regular file (a FIFO)")) {
            fprintf(stderr, "  %s: message '%s'\n", names[i], err.msg);
            CHECK(0);
        }
        /* and the tokenizer.json path given directly */
        if (i == 0) {
            fifo_guard(true);
            CHECK(ft_tokenizer_load(&t, path, &err) == -1 && strstr(err.msg, "FIFO"));
            fifo_guard(false);
        }
    }
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ft_tok_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_bytelevel);
    RUN(test_bytelevel_lossy);
    RUN(test_sentencepiece_legacy);
    RUN(test_metaspace);
    RUN(test_ignore_merges);
    RUN(test_split_behaviors);
    RUN(test_split_regex_json);
    RUN(test_normalizers);
    RUN(test_added_tokens);
    RUN(test_add_special_tokens);
    RUN(test_config_files);
    RUN(test_errors);
    RUN(test_vocab_ids);
    RUN(test_hostile_files);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return check_summary("tokenizer");
}
