/* Special tokens added to a tokenizer, as transformers' tokenizer.add_special_tokens(
 * {"additional_special_tokens": tokens}) does it (run config model.add_special_tokens):
 * each becomes an added token of tokenizer.json (special, normalized=false, no
 * lstrip / rstrip / single_word: matched whole on the raw text, never split), with
 *   - its model.vocab id when the BPE vocabulary holds it (no new id),
 *   - else the next id as tokenizers' AddedVocabulary::add_tokens numbers it: the
 *     vocab's size, or one past the largest added id when that is at or past it;
 * a token that is an added token already is left as it is (tokenizers skips it).
 * tokenizers writes added_tokens sorted by id; transformers 5 writes tokenizer_config.json
 * with extra_special_tokens = the tokens given (add_special_tokens replaces that list). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"
#include "tokenizer/tok_internal.h"

/* The tokens of a JSON array text: non-empty strings (the config checked it already; a
 * caller with other text gets the error). */
static json_t *parse_tokens(const char *tokens_json, ft_err *err)
{
    json_error_t je;
    json_t *t = json_loads(tokens_json, 0, &je);
    if (!t || !json_is_array(t)) {
        json_decref(t);
        return ft_fail(err, "added special tokens: expected a JSON array of strings, got '%s'",
                       tokens_json),
               NULL;
    }
    for (size_t i = 0; i < json_array_size(t); i++) {
        const json_t *e = json_array_get(t, i);
        if (!json_is_string(e) || json_string_length(e) == 0) {
            json_decref(t);
            return ft_fail(err, "added special tokens: entry %zu is not a non-empty string", i),
                   NULL;
        }
    }
    return t;
}

static int by_id(const void *a, const void *b)
{
    json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "id"));
    json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "id"));
    return x < y ? -1 : x > y;
}

int tk_json_add_special(json_t *tj, const char *tokens_json, const char *file, ft_err *err)
{
    json_t *tokens = parse_tokens(tokens_json, err);
    if (!tokens)
        return ft_fail_prefix(err, "%s", file);
    json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab");
    json_t *added = json_object_get(tj, "added_tokens");
    int rc = 0;
    if (!json_is_object(vocab))
        rc = ft_fail(err, "%s: model.vocab: expected an object", file);
    else if (added && !json_is_null(added) && !json_is_array(added))
        rc = ft_fail(err, "%s: added_tokens: expected an array", file);
    if (rc == 0 && !json_is_array(added)) {
        added = json_array();
        if (!added || json_object_set_new(tj, "added_tokens", added))
            rc = ft_fail(err, "out of memory");
    }
    json_int_t vsize = (json_int_t)json_object_size(vocab);
    for (size_t i = 0; rc == 0 && i < json_array_size(tokens); i++) {
        const char *s = json_string_value(json_array_get(tokens, i));
        bool known = false;
        json_int_t max_added = -1;
        for (size_t k = 0; k < json_array_size(added); k++) {
            json_t *e = json_array_get(added, k);
            const char *c = json_string_value(json_object_get(e, "content"));
            known |= c && strcmp(c, s) == 0;
            json_int_t id = json_integer_value(json_object_get(e, "id"));
            max_added = id > max_added ? id : max_added;
        }
        if (known)
            continue;
        json_t *vid = json_object_get(vocab, s);
        json_int_t id = json_is_integer(vid)  ? json_integer_value(vid)
                        : max_added >= vsize ? max_added + 1
                                              : vsize;
        if (id >= INT32_MAX) {
            rc = ft_fail(err, "%s: no id left for added token '%s' (ids are 32-bit)", file, s);
            break;
        }
        json_t *e = json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", s,
                              "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                              "special", 1);
        if (!e || json_array_append_new(added, e))
            rc = ft_fail(err, "out of memory");
    }
    json_decref(tokens);
    /* sorted by id, as tokenizers writes them */
    size_t n = json_array_size(added);
    json_t **v = rc == 0 && n ? malloc(n * sizeof *v) : NULL;
    if (rc == 0 && n && !v)
        rc = ft_fail(err, "out of memory");
    if (v) {
        for (size_t k = 0; k < n; k++)
            v[k] = json_incref(json_array_get(added, k));
        qsort(v, n, sizeof *v, by_id);
        json_array_clear(added);
        for (size_t k = 0; k < n; k++)
            json_array_append_new(added, v[k]);
        free(v);
    }
    return rc;
}

/* path (a dir or its tokenizer.json) -> the dir and the tokenizer.json path */
static void split_path(const char *path, char *dir, char *file, size_t n)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(dir, n, "%s", path);
        snprintf(file, n, "%s/tokenizer.json", path);
        return;
    }
    snprintf(file, n, "%s", path);
    snprintf(dir, n, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, n, ".");
}

static int write_json(json_t *j, const char *path, ft_err *err)
{
    char *text = json_dumps(j, JSON_INDENT(2));
    if (!text)
        return ft_fail(err, "%s: out of memory", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* (json_dumps' NUL becomes the final newline) */
    int rc = ft_write_file_atomic(path, text, len + 1, err);
    free(text);
    return rc;
}

/* tokenizer_config.json with the tokens: extra_special_tokens as transformers 5 writes it
 * (the list given), and an added_tokens_decoder entry for each token it lacks when the
 * file has that map (older transformers wrote one). */
static int grown_config(json_t *cfg, const json_t *tj, const char *tokens_json, ft_err *err)
{
    json_error_t je;
    json_t *tokens = json_loads(tokens_json, 0, &je);
    if (!tokens)
        return ft_fail(err, "out of memory");
    json_t *extra = json_object_get(cfg, "extra_special_tokens");
    int rc = 0;
    if (!extra || json_is_array(extra) || json_is_null(extra))
        rc = json_object_set(cfg, "extra_special_tokens", tokens);
    json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    const json_t *added = json_object_get(tj, "added_tokens");
    for (size_t i = 0; rc == 0 && json_is_object(dec) && i < json_array_size(added); i++) {
        const json_t *e = json_array_get(added, i);
        char key[32];
        snprintf(key, sizeof key, "%lld",
                 (long long)json_integer_value(json_object_get(e, "id")));
        if (json_object_get(dec, key))
            continue;
        json_t *d = json_deep_copy(e);
        if (!d || json_object_del(d, "id") || json_object_set_new(dec, key, d))
            rc = -1;
    }
    json_decref(tokens);
    return rc ? ft_fail(err, "out of memory") : 0;
}

int ft_tokenizer_save_adding(const char *path, const char *dir, const char *tokens_json,
                             ft_err *err)
{
    char src_dir[4096], src[4096], dst[4200];
    if (strlen(path) > 4000)
        return ft_fail(err, "%.100s...: path too long", path);
    split_path(path, src_dir, src, sizeof src);
    json_error_t je;
    json_t *tj = json_load_file(src, JSON_REJECT_DUPLICATES, &je);
    if (!tj)
        return ft_fail(err, "%s:%d:%d: invalid JSON: %s", src, je.line, je.column, je.text);
    int rc = tk_json_add_special(tj, tokens_json, src, err);
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    if (rc == 0)
        rc = write_json(tj, dst, err);
    /* tokenizer_config.json: its integers as they are, or as reals where one is beyond 64
     * bits (transformers' model_max_length 1e30) */
    char cpath[4200];
    snprintf(cpath, sizeof cpath, "%s/tokenizer_config.json", src_dir);
    struct stat st;
    json_t *cfg = NULL;
    if (rc == 0 && stat(cpath, &st) == 0 &&
        !(cfg = json_load_file(cpath, JSON_REJECT_DUPLICATES, &je)) &&
        !(cfg = json_load_file(cpath, JSON_DECODE_INT_AS_REAL | JSON_REJECT_DUPLICATES, &je)))
        rc = ft_fail(err, "%s:%d:%d: invalid JSON: %s", cpath, je.line, je.column, je.text);
    if (rc == 0 && !cfg && !(cfg = json_object()))
        rc = ft_fail(err, "out of memory");
    if (rc == 0)
        rc = grown_config(cfg, tj, tokens_json, err);
    snprintf(dst, sizeof dst, "%s/tokenizer_config.json", dir);
    if (rc == 0)
        rc = write_json(cfg, dst, err);
    json_decref(cfg);
    json_decref(tj);
    return rc;
}
