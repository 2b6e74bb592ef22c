/* Tokenizer loading and the public API of lib/tokenizer/tokenizer.h: reads tokenizer.json (model,
 * added tokens, normalizer, pre-tokenizer, post-processor, decoder) and the
 * tokenizer_config.json / special_tokens_map.json beside it, and runs the encode pipeline
 * of tokenizers (added tokens on the raw text, normalizer, added tokens on the normalized
 * text, pre-tokenizer, BPE, post-processor) and the decode one. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "tokenizer/tok_internal.h"

int ft_ids_push(ft_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        int32_t *d = realloc(v->data, nc * sizeof *d);
        if (!d)
            return -1;
        v->data = d;
        v->cap = nc;
    }
    v->data[v->n++] = id;
    return 0;
}

void ft_ids_free(ft_ids *v)
{
    free(v->data);
    memset(v, 0, sizeof *v);
}

/* int_as_real: transformers writes model_max_length = 1e30 as an integer literal into
 * tokenizer_config.json, beyond jansson's 64-bit integers; the config files are read with
 * integers as reals (no id is read from them), tokenizer.json with exact integers.
 * Only a regular file is read (a FIFO would block), and a key given twice in one object is
 * an error (Python's json keeps the last one silently). An optional file that does not
 * exist gives NULL with err untouched. */
static json_t *load_json(const char *path, bool optional, bool int_as_real, ft_err *err)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (!optional)
            ft_fail(err, "%s: cannot open: no such file", path);
        return NULL;
    }
    int fd = ft_open_regular(path, err);
    if (fd < 0)
        return NULL;
    json_error_t je;
    size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES |
                   (int_as_real ? JSON_DECODE_INT_AS_REAL : 0);
    json_t *j = json_loadfd(fd, flags, &je);
    close(fd);
    if (!j)
        ft_fail(err, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
    return j;
}

static json_t *get_opt(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* Token id of a TemplateProcessing special token name. */
static int template_ids(const json_t *special, const char *name, ft_ids *dst, const char *path,
                        ft_err *err)
{
    json_t *st = json_object_get(special, name);
    json_t *ids = json_object_get(st, "ids");
    if (!json_is_array(ids))
        return ft_fail(err, "%s: post_processor TemplateProcessing: special token '%s' has no "
                            "'ids'",
                       path, name);
    for (size_t i = 0; i < json_array_size(ids); i++) {
        json_t *x = json_array_get(ids, i);
        if (!json_is_integer(x) || ft_ids_push(dst, (int32_t)json_integer_value(x)))
            return ft_fail(err, "%s: post_processor: bad id for '%s'", path, name);
    }
    return 0;
}

/* Parses a post-processor into prefix / suffix ids; a Sequence composes its members. */
static int parse_post(ft_tokenizer *t, const json_t *j, const char *path, ft_err *err)
{
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type)
        return ft_fail(err, "%s: post_processor: missing 'type'", path);
    ft_ids pre = {0}, suf = {0};
    int rc = 0;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(j, "processors");
        if (!json_is_array(arr))
            return ft_fail(err, "%s: post_processor Sequence: 'processors' must be an array", path);
        for (size_t i = 0; i < json_array_size(arr); i++)
            if (parse_post(t, json_array_get(arr, i), path, err))
                return -1;
        return 0;
    } else if (!strcmp(type, "ByteLevel")) {
        return 0; /* only adjusts offsets */
    } else if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(j, "single"), *special = json_object_get(j, "special_tokens");
        if (!json_is_array(single))
            return ft_fail(err, "%s: post_processor TemplateProcessing: 'single' must be an array",
                           path);
        bool seen_seq = false;
        for (size_t i = 0; i < json_array_size(single) && !rc; i++) {
            json_t *e = json_array_get(single, i);
            json_t *sp = json_object_get(e, "SpecialToken"), *sq = json_object_get(e, "Sequence");
            if (sp) {
                const char *name = json_string_value(json_object_get(sp, "id"));
                if (!name)
                    rc = ft_fail(err, "%s: post_processor: SpecialToken without 'id'", path);
                else
                    rc = template_ids(special, name, seen_seq ? &suf : &pre, path, err);
            } else if (sq) {
                seen_seq = true;
            } else {
                rc = ft_fail(err, "%s: post_processor TemplateProcessing: bad 'single' entry", path);
            }
        }
    } else if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
        json_t *ci = json_array_get(cls, 1), *si = json_array_get(sep, 1);
        if (!json_is_integer(ci) || !json_is_integer(si))
            return ft_fail(err, "%s: post_processor %s: needs 'cls' and 'sep' [token, id]", path,
                           type);
        rc = ft_ids_push(&pre, (int32_t)json_integer_value(ci)) ||
             ft_ids_push(&suf, (int32_t)json_integer_value(si));
        if (rc)
            rc = ft_fail(err, "%s: out of memory", path);
    } else {
        return ft_fail(err, "%s: post_processor: unsupported type '%s'", path, type);
    }
    /* applying this processor after the previous ones wraps them */
    for (size_t i = 0; i < t->prefix.n && !rc; i++)
        rc = ft_ids_push(&pre, t->prefix.data[i]);
    for (size_t i = 0; i < suf.n && !rc; i++)
        rc = ft_ids_push(&t->suffix, suf.data[i]);
    ft_ids_free(&t->prefix);
    t->prefix = pre;
    ft_ids_free(&suf);
    return rc ? -1 : 0;
}

/* A special token entry: a string or {"content": ...}. */
static const char *token_string(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* A whole text file into *out (malloc'ed); *out = NULL when there is no such file. */
static int read_text_file(const char *path, char **out, ft_err *err)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    int fd = ft_open_regular(path, err);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return ft_fail(err, "%s: cannot read: %s", path, strerror(errno));
    }
    tk_buf b = {0};
    char chunk[4096];
    size_t r;
    int rc = 0;
    while (rc == 0 && (r = fread(chunk, 1, sizeof chunk, f)) > 0)
        rc = tk_buf_append(&b, chunk, r);
    if (rc || ferror(f)) {
        free(b.data);
        fclose(f);
        return ft_fail(err, "%s: %s", path, rc ? "out of memory" : "read error");
    }
    fclose(f);
    if (!b.data && tk_buf_append(&b, "", 0)) /* an empty file: "" */
        return ft_fail(err, "%s: out of memory", path);
    *out = b.data;
    return 0;
}

/* A template of t's by name (chat_templates created on first use). */
static int add_template(ft_tokenizer *t, const char *name, const char *src, ft_err *err)
{
    if (!t->chat_templates && !(t->chat_templates = json_object()))
        return ft_fail(err, "out of memory");
    if (json_object_set_new(t->chat_templates, name, json_string(src)))
        return ft_fail(err, "chat template '%s': not valid UTF-8 or out of memory", name);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* chat_template.jinja beside tokenizer.json (the "default" template, where recent
 * transformers save it) and additional_chat_templates/NAME.jinja (every other named
 * template): *found tells whether there was any, as transformers 5's from_pretrained
 * reads them (they take priority over tokenizer_config.json's chat_template). */
static int read_template_files(ft_tokenizer *t, const char *dir, bool *found, ft_err *err)
{
    char path[4200];
    *found = false;
    char *s;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (read_text_file(path, &s, err))
        return -1;
    if (s) {
        *found = true;
        int rc = add_template(t, "default", s, err);
        free(s);
        if (rc)
            return -1;
    }
    snprintf(path, sizeof path, "%s/additional_chat_templates", dir);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len <= 6 || strcmp(e->d_name + len - 6, ".jinja") != 0)
            continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 8) * sizeof *nn);
            if (!nn) {
                rc = ft_fail(err, "out of memory");
                break;
            }
            names = nn;
        }
        if (!(names[n] = strndup(e->d_name, len - 6)))
            rc = ft_fail(err, "out of memory");
        else
            n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name); /* readdir's order is the file system's */
    for (size_t i = 0; i < n && rc == 0; i++) {
        snprintf(path, sizeof path, "%s/additional_chat_templates/%s.jinja", dir, names[i]);
        if ((rc = read_text_file(path, &s, err)) == 0 && s) {
            *found = true;
            rc = add_template(t, names[i], s, err);
            free(s);
        }
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc;
}

/* tokenizer_config.json's chat_template: a string (the default) or the list form
 * [{"name", "template"}]. */
static int read_config_templates(ft_tokenizer *t, const json_t *ct, ft_err *err)
{
    if (json_is_string(ct))
        return add_template(t, "default", json_string_value(ct), err);
    for (size_t i = 0; json_is_array(ct) && i < json_array_size(ct); i++) {
        json_t *e = json_array_get(ct, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *tpl = json_string_value(json_object_get(e, "template"));
        if (name && tpl && add_template(t, name, tpl, err))
            return -1;
    }
    return 0;
}

/* The seven named special tokens transformers 5 keeps (SPECIAL_TOKENS_ATTRIBUTES), in
 * its order. */
static const char *const SPECIAL_NAMES[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token"};

/* A model-specific special token of a config (transformers 5 keeps every "*_token" key
 * whose value is a string or an AddedToken: in tokenizer_config.json an object with
 * "__type": "AddedToken", in special_tokens_map.json any object): its string, else NULL. */
static const char *model_token(const char *key, const json_t *v, bool any_object)
{
    size_t len = strlen(key);
    if (len < 6 || strcmp(key + len - 6, "_token") != 0)
        return NULL;
    for (size_t i = 0; i < sizeof SPECIAL_NAMES / sizeof *SPECIAL_NAMES; i++)
        if (!strcmp(key, SPECIAL_NAMES[i]))
            return NULL;
    const char *type = json_string_value(json_object_get(v, "__type"));
    if (json_is_object(v) && !any_object && !(type && !strcmp(type, "AddedToken")))
        return NULL;
    return token_string(v);
}

/* Adds the special tokens of src (tokenizer_config.json, or special_tokens_map.json when
 * is_stm) to map, replacing those there. */
static void add_specials(json_t *map, const json_t *src, bool is_stm)
{
    for (size_t i = 0; i < sizeof SPECIAL_NAMES / sizeof *SPECIAL_NAMES; i++) {
        const char *s = token_string(json_object_get(src, SPECIAL_NAMES[i]));
        if (s)
            json_object_set_new(map, SPECIAL_NAMES[i], json_string(s));
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)src, k, v) {
        const char *s = model_token(k, v, is_stm);
        if (s)
            json_object_set_new(map, k, json_string(s));
    }
    json_t *extra = json_object_get(src, "extra_special_tokens");
    json_object_foreach(json_is_object(extra) ? extra : NULL, k, v)
        if (token_string(v))
            json_object_set_new(map, k, json_string(token_string(v)));
}

static int read_configs(ft_tokenizer *t, const char *dir, ft_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    ft_err e2;
    e2.msg[0] = 0;
    json_t *cfg = load_json(path, true, true, &e2);
    if (!cfg && e2.msg[0])
        return ft_fail(err, "%s", e2.msg);
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    json_t *stm = load_json(path, true, true, &e2);
    if (!stm && e2.msg[0]) {
        json_decref(cfg);
        return ft_fail(err, "%s", e2.msg);
    }
    /* transformers 5 reads special_tokens_map.json (a legacy file) only when
     * tokenizer_config.json has no added_tokens_decoder, and then its entries win */
    if (!(t->special = json_object())) {
        json_decref(cfg);
        json_decref(stm);
        return ft_fail(err, "out of memory");
    }
    add_specials(t->special, cfg, false);
    if (!json_object_get(cfg, "added_tokens_decoder"))
        add_specials(t->special, stm, true);
    if (!json_object_get(t->special, "unk_token") && t->bpe.unk_token)
        json_object_set_new(t->special, "unk_token", json_string(t->bpe.unk_token));
    /* the special_tokens_map as the map in SPECIAL_NAMES' order, then the others */
    json_t *ordered = json_object();
    for (size_t i = 0; ordered && i < sizeof SPECIAL_NAMES / sizeof *SPECIAL_NAMES; i++)
        if (json_object_get(t->special, SPECIAL_NAMES[i]))
            json_object_set(ordered, SPECIAL_NAMES[i],
                            json_object_get(t->special, SPECIAL_NAMES[i]));
    json_object_update_missing(ordered, t->special);
    json_decref(t->special);
    t->special = ordered;
    const char *names[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    char **dst[4] = {&t->bos, &t->eos, &t->pad, &t->unk};
    for (int i = 0; i < 4 && ordered; i++) {
        const char *s = json_string_value(json_object_get(ordered, names[i]));
        if (s)
            *dst[i] = strdup(s);
    }
    bool files = false;
    int rc = ordered ? read_template_files(t, dir, &files, err) : ft_fail(err, "out of memory");
    if (rc == 0 && !files)
        rc = read_config_templates(t, json_object_get(cfg, "chat_template"), err);
    const char *dflt = json_string_value(json_object_get(t->chat_templates, "default"));
    if (rc == 0 && dflt && !(t->chat_template = strdup(dflt)))
        rc = ft_fail(err, "out of memory");
    json_decref(cfg);
    json_decref(stm);
    return rc;
}

static int load_tokenizer(ft_tokenizer **out, const char *path, const char *add_special,
                          ft_err *err)
{
    *out = NULL;
    char file[4096], dir[4096];
    struct stat st;
    if (strlen(path) > 4000)
        return ft_fail(err, "%.100s...: path too long", path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        snprintf(dir, sizeof dir, "%s", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    json_t *j = load_json(file, false, false, err);
    if (!j)
        return -1;
    if (add_special && json_is_object(j) && tk_json_add_special(j, add_special, file, err)) {
        json_decref(j);
        return -1;
    }
    ft_tokenizer *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(j);
        return ft_fail(err, "%s: out of memory", file);
    }
    int rc = 0;
    json_t *v;
    if (!json_is_object(j))
        rc = ft_fail(err, "%s: expected a JSON object", file);
    json_t *added = json_object_get(j, "added_tokens");
    if (!rc)
        rc = tk_bpe_parse(&t->bpe, json_object_get(j, "model"),
                          json_is_array(added) ? json_array_size(added) : 0, file, err);
    if (!rc && (v = get_opt(j, "normalizer"))) {
        t->has_normalizer = true;
        if (tk_normalizer_parse(&t->normalizer, v, err))
            rc = ft_fail_prefix(err, "%s", file);
    }
    if (!rc && (v = get_opt(j, "pre_tokenizer"))) {
        t->has_pretok = true;
        if (tk_pretok_parse(&t->pretok, v, err))
            rc = ft_fail_prefix(err, "%s", file);
    }
    if (!rc && (v = get_opt(j, "decoder"))) {
        t->has_decoder = true;
        if (tk_decoder_parse(&t->decoder, v, err))
            rc = ft_fail_prefix(err, "%s", file);
    }
    if (!rc && (v = get_opt(j, "post_processor")))
        rc = parse_post(t, v, file, err);
    if (!rc && tk_added_parse(&t->added, added, &t->bpe,
                              t->has_normalizer ? &t->normalizer : NULL, err))
        rc = ft_fail_prefix(err, "%s", file);
    json_decref(j);
    if (!rc) {
        t->vocab_size = (int)t->bpe.nid;
        if ((int)t->added.nindex > t->vocab_size)
            t->vocab_size = (int)t->added.nindex;
        for (size_t i = 0; i < t->prefix.n && !rc; i++)
            if (t->prefix.data[i] < 0 || t->prefix.data[i] >= t->vocab_size)
                rc = ft_fail(err, "%s: post_processor: id %d out of range", file,
                             t->prefix.data[i]);
        for (size_t i = 0; i < t->suffix.n && !rc; i++)
            if (t->suffix.data[i] < 0 || t->suffix.data[i] >= t->vocab_size)
                rc = ft_fail(err, "%s: post_processor: id %d out of range", file,
                             t->suffix.data[i]);
    }
    if (!rc)
        rc = read_configs(t, dir, err);
    if (rc) {
        ft_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

int ft_tokenizer_load(ft_tokenizer **out, const char *path, ft_err *err)
{
    return load_tokenizer(out, path, NULL, err);
}

int ft_tokenizer_load_adding(ft_tokenizer **out, const char *path, const char *tokens_json,
                             ft_err *err)
{
    return load_tokenizer(out, path, tokens_json, err);
}

void ft_tokenizer_free(ft_tokenizer *t)
{
    if (!t)
        return;
    if (t->has_normalizer)
        tk_normalizer_free(&t->normalizer);
    if (t->has_pretok)
        tk_pretok_free(&t->pretok);
    if (t->has_decoder)
        tk_decoder_free(&t->decoder);
    tk_bpe_free(&t->bpe);
    tk_added_free(&t->added);
    ft_ids_free(&t->prefix);
    ft_ids_free(&t->suffix);
    free(t->bos);
    free(t->eos);
    free(t->pad);
    free(t->unk);
    free(t->chat_template);
    json_decref(t->chat_templates);
    json_decref(t->special);
    free(t);
}

static int normalize_pieces(const ft_tokenizer *t, tk_work *w, ft_err *err)
{
    tk_buf nb = {0};
    for (size_t i = 0; i < w->a.n; i++) {
        tk_piece *pc = &w->a.p[i];
        if (pc->id >= 0)
            continue;
        if (tk_normalize(&t->normalizer, w->arena.data + pc->off, pc->len, &nb, w, err)) {
            free(nb.data);
            return -1;
        }
        pc->off = w->arena.n;
        pc->len = nb.n;
        if (tk_buf_append(&w->arena, nb.data ? nb.data : "", nb.n)) {
            free(nb.data);
            return ft_fail(err, "tokenizer: out of memory");
        }
    }
    free(nb.data);
    return 0;
}

int ft_tokenizer_encode(const ft_tokenizer *t, const char *text, size_t len, bool add_special,
                        ft_ids *out, ft_err *err)
{
    if (!tk_utf8_valid(text, len))
        return ft_fail(err, "tokenizer: input is not valid UTF-8");
    tk_work w = {0};
    int rc = 0;
    w.md = pcre2_match_data_create(1, NULL);
    if (!w.md || tk_buf_append(&w.arena, text, len) || tk_pieces_push(&w.a, 0, len, -1, true))
        rc = ft_fail(err, "tokenizer: out of memory");
    if (!rc)
        rc = tk_added_split(&t->added, false, &w, err);
    if (!rc && t->has_normalizer)
        rc = normalize_pieces(t, &w, err);
    if (!rc)
        rc = tk_added_split(&t->added, true, &w, err);
    if (!rc && t->has_pretok)
        rc = tk_pretokenize(&t->pretok, &w, err);
    if (!rc && add_special)
        for (size_t i = 0; i < t->prefix.n && !rc; i++)
            rc = ft_ids_push(out, t->prefix.data[i]) ? ft_fail(err, "tokenizer: out of memory") : 0;
    for (size_t i = 0; i < w.a.n && !rc; i++) {
        const tk_piece *pc = &w.a.p[i];
        if (pc->id >= 0)
            rc = ft_ids_push(out, pc->id) ? ft_fail(err, "tokenizer: out of memory") : 0;
        else
            rc = tk_bpe_encode(&t->bpe, w.arena.data + pc->off, pc->len, out, err);
    }
    if (!rc && add_special)
        for (size_t i = 0; i < t->suffix.n && !rc; i++)
            rc = ft_ids_push(out, t->suffix.data[i]) ? ft_fail(err, "tokenizer: out of memory") : 0;
    free(w.arena.data);
    free(w.tmp.data);
    free(w.a.p);
    free(w.b.p);
    if (w.md)
        pcre2_match_data_free(w.md);
    return rc;
}

static const tk_added_token *added_of(const ft_tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->added.nindex || t->added.index_of_id[id] < 0)
        return NULL;
    return &t->added.toks[t->added.index_of_id[id]];
}

int ft_tokenizer_decode(const ft_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                        char **text, size_t *len, ft_err *err)
{
    *text = NULL;
    *len = 0;
    tk_strlist l = {0};
    for (size_t i = 0; i < n; i++) {
        const tk_added_token *a = added_of(t, ids[i]);
        const char *s = ft_tokenizer_id_to_token(t, ids[i]);
        if (!s) {
            tk_strlist_free(&l);
            return ft_fail(err, "tokenizer: decode: id %d at position %zu is out of range "
                                "(vocab size %d)",
                           ids[i], i, t->vocab_size);
        }
        if (skip_special && a && a->special)
            continue;
        if (tk_strlist_push(&l, s, a ? (a->text ? a->text_len : a->len) : strlen(s))) {
            tk_strlist_free(&l);
            return ft_fail(err, "tokenizer: out of memory");
        }
    }
    if (t->has_decoder && tk_decode_chain(&t->decoder, &l, err)) {
        tk_strlist_free(&l);
        return -1;
    }
    tk_buf b = {0};
    int rc = tk_buf_reserve(&b, 0);
    for (size_t i = 0; i < l.n && !rc; i++) {
        if (!t->has_decoder && i > 0)
            rc = tk_buf_append(&b, " ", 1);
        if (!rc)
            rc = tk_buf_append(&b, l.s[i], l.len[i]);
    }
    tk_strlist_free(&l);
    if (rc) {
        free(b.data);
        return ft_fail(err, "tokenizer: out of memory");
    }
    *text = b.data;
    *len = b.n;
    return 0;
}

int ft_tokenizer_vocab_size(const ft_tokenizer *t)
{
    return t->vocab_size;
}

int32_t ft_tokenizer_token_to_id(const ft_tokenizer *t, const char *token)
{
    size_t len = strlen(token);
    int32_t id = tk_strmap_get(&t->added.by_content, token, len);
    return id >= 0 ? id : tk_strmap_get(&t->bpe.vocab, token, len);
}

const char *ft_tokenizer_id_to_token(const ft_tokenizer *t, int32_t id)
{
    const tk_added_token *a = added_of(t, id);
    if (a) /* a normalized token as normalized, as tokenizers >= 0.21 gives it back */
        return a->text ? a->text : a->content;
    if (id < 0 || (size_t)id >= t->bpe.nid)
        return NULL;
    return t->bpe.id_to_tok[id];
}

static int32_t id_or_none(const ft_tokenizer *t, const char *s)
{
    return s ? ft_tokenizer_token_to_id(t, s) : -1;
}

int32_t ft_tokenizer_bos_id(const ft_tokenizer *t)
{
    return id_or_none(t, t->bos);
}

int32_t ft_tokenizer_eos_id(const ft_tokenizer *t)
{
    return id_or_none(t, t->eos);
}

int32_t ft_tokenizer_pad_id(const ft_tokenizer *t)
{
    return id_or_none(t, t->pad);
}

const char *ft_tokenizer_bos_token(const ft_tokenizer *t)
{
    return t->bos;
}

const char *ft_tokenizer_eos_token(const ft_tokenizer *t)
{
    return t->eos;
}

const char *ft_tokenizer_pad_token(const ft_tokenizer *t)
{
    return t->pad;
}

const char *ft_tokenizer_unk_token(const ft_tokenizer *t)
{
    return t->unk;
}

const char *ft_tokenizer_chat_template(const ft_tokenizer *t)
{
    return t->chat_template;
}

const char *ft_tokenizer_chat_template_named(const ft_tokenizer *t, const char *name)
{
    return json_string_value(json_object_get(t->chat_templates, name));
}

size_t ft_tokenizer_chat_template_names(const ft_tokenizer *t, const char **names, size_t max)
{
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(t->chat_templates, k, v) {
        (void)v;
        if (n < max)
            names[n] = k;
        n++;
    }
    return n;
}

const json_t *ft_tokenizer_special_tokens(const ft_tokenizer *t)
{
    return t->special;
}

bool ft_tokenizer_adds_bos(const ft_tokenizer *t)
{
    return t->prefix.n > 0;
}
