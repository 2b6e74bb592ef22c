/* Normalizers of tokenizer.json: Sequence, NFC/NFD/NFKC/NFKD (utf8proc), Prepend, Replace
 * (string or regex pattern), Lowercase (per character, as tokenizers' NormalizedString
 * does) and Strip. Each rewrites the text of one piece; an unknown type is an error
 * naming it. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

static char *dupstr(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

/* Reads {"String": s} or {"Regex": r}; exactly one of *str / *re is set. */
static int parse_pattern(const json_t *pat, const char *what, char **str, pcre2_code **re,
                         ft_err *err)
{
    json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
    if (json_is_string(s)) {
        *str = dupstr(json_string_value(s));
        return *str ? 0 : ft_fail(err, "%s: out of memory", what);
    }
    if (json_is_string(r)) {
        char eb[300];
        *re = tk_regex_compile(json_string_value(r), false, eb, sizeof eb);
        if (!*re)
            return ft_fail(err, "%s: pattern /%s/: %s", what, json_string_value(r), eb);
        return 0;
    }
    return ft_fail(err, "%s: 'pattern' must be {\"String\": ...} or {\"Regex\": ...}", what);
}

int tk_normalizer_parse(tk_normalizer *n, const void *json, ft_err *err)
{
    const json_t *j = json;
    memset(n, 0, sizeof *n);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type)
        return ft_fail(err, "normalizer: missing 'type'");
    if (!strcmp(type, "Sequence")) {
        n->type = TK_NORM_SEQUENCE;
        json_t *arr = json_object_get(j, "normalizers");
        if (!json_is_array(arr))
            return ft_fail(err, "normalizer Sequence: 'normalizers' must be an array");
        n->subs = calloc(json_array_size(arr) + 1, sizeof *n->subs);
        if (!n->subs)
            return ft_fail(err, "normalizer: out of memory");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            if (tk_normalizer_parse(&n->subs[i], json_array_get(arr, i), err))
                return -1;
            n->nsubs++;
        }
    } else if (!strcmp(type, "NFC")) {
        n->type = TK_NORM_NFC;
    } else if (!strcmp(type, "NFD")) {
        n->type = TK_NORM_NFD;
    } else if (!strcmp(type, "NFKC")) {
        n->type = TK_NORM_NFKC;
    } else if (!strcmp(type, "NFKD")) {
        n->type = TK_NORM_NFKD;
    } else if (!strcmp(type, "Lowercase")) {
        n->type = TK_NORM_LOWERCASE;
    } else if (!strcmp(type, "Strip")) {
        n->type = TK_NORM_STRIP;
        n->left = json_is_true(json_object_get(j, "strip_left"));
        n->right = json_is_true(json_object_get(j, "strip_right"));
    } else if (!strcmp(type, "Prepend")) {
        n->type = TK_NORM_PREPEND;
        const char *p = json_string_value(json_object_get(j, "prepend"));
        if (!p)
            return ft_fail(err, "normalizer Prepend: missing 'prepend' string");
        n->str = dupstr(p);
    } else if (!strcmp(type, "Replace")) {
        n->type = TK_NORM_REPLACE;
        const char *c = json_string_value(json_object_get(j, "content"));
        if (!c)
            return ft_fail(err, "normalizer Replace: missing 'content' string");
        n->str = dupstr(c);
        if (parse_pattern(json_object_get(j, "pattern"), "normalizer Replace", &n->pattern, &n->re,
                          err))
            return -1;
    } else {
        return ft_fail(err, "normalizer: unsupported type '%s'", type);
    }
    return 0;
}

void tk_normalizer_free(tk_normalizer *n)
{
    for (size_t i = 0; i < n->nsubs; i++)
        tk_normalizer_free(&n->subs[i]);
    free(n->subs);
    free(n->str);
    free(n->pattern);
    if (n->re)
        pcre2_code_free(n->re);
    memset(n, 0, sizeof *n);
}

/* Appends the utf8proc normalization (opts) of text[0..len) to out. */
static int normalize_run(const char *text, size_t len, int opts, tk_buf *out, ft_err *err)
{
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t r =
        utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &res, opts);
    if (r < 0)
        return ft_fail(err, "normalizer: %s", utf8proc_errmsg(r));
    int rc = tk_buf_append(out, res, (size_t)r);
    free(res);
    return rc ? ft_fail(err, "normalizer: out of memory") : 0;
}

/* Applies n to cur (result in cur), tmp as scratch. */
static int apply(const tk_normalizer *n, tk_buf *cur, tk_buf *tmp, pcre2_match_data *md,
                 ft_err *err)
{
    tmp->n = 0;
    if (tk_buf_reserve(tmp, 0))
        return ft_fail(err, "normalizer: out of memory");
    tmp->data[0] = 0;
    switch (n->type) {
    case TK_NORM_SEQUENCE:
        for (size_t i = 0; i < n->nsubs; i++)
            if (apply(&n->subs[i], cur, tmp, md, err))
                return -1;
        return 0;
    case TK_NORM_NFC:
    case TK_NORM_NFD:
    case TK_NORM_NFKC:
    case TK_NORM_NFKD: {
        if (cur->n == 0)
            return 0;
        int opts = UTF8PROC_STABLE;
        opts |= (n->type == TK_NORM_NFC || n->type == TK_NORM_NFKC) ? UTF8PROC_COMPOSE
                                                                     : UTF8PROC_DECOMPOSE;
        if (n->type == TK_NORM_NFKC || n->type == TK_NORM_NFKD)
            opts |= UTF8PROC_COMPAT;
        /* Runs between "opaque" code points are normalized; those pass through as
         * starters, which is how tokenizers' older Unicode tables see them. */
        size_t run = 0;
        for (size_t i = 0; i <= cur->n;) {
            uint32_t cp = 0;
            int k = i < cur->n ? tk_utf8_next(cur->data + i, &cp) : 0;
            if (i < cur->n && !tk_unicode_opaque(cp)) {
                i += (size_t)k;
                continue;
            }
            if (i > run && normalize_run(cur->data + run, i - run, opts, tmp, err))
                return -1;
            if (i == cur->n)
                break;
            if (tk_buf_append(tmp, cur->data + i, (size_t)k))
                return ft_fail(err, "normalizer: out of memory");
            i += (size_t)k;
            run = i;
        }
        break;
    }
    case TK_NORM_LOWERCASE:
        for (size_t i = 0; i < cur->n;) {
            uint32_t cp;
            i += (size_t)tk_utf8_next(cur->data + i, &cp);
            char enc[8];
            int k;
            if (cp == 0x130) { /* the one unconditional multi-character lowercase */
                memcpy(enc, "i\xCC\x87", 3);
                k = 3;
            } else {
                k = tk_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
            }
            if (tk_buf_append(tmp, enc, (size_t)k))
                return ft_fail(err, "normalizer: out of memory");
        }
        break;
    case TK_NORM_STRIP: {
        size_t s = 0, e = cur->n;
        if (n->left)
            while (s < e) {
                uint32_t cp;
                int k = tk_utf8_next(cur->data + s, &cp);
                if (!tk_is_whitespace(cp))
                    break;
                s += (size_t)k;
            }
        if (n->right)
            while (e > s) {
                size_t p = e - 1;
                while (p > s && ((unsigned char)cur->data[p] & 0xC0) == 0x80)
                    p--;
                uint32_t cp;
                tk_utf8_next(cur->data + p, &cp);
                if (!tk_is_whitespace(cp))
                    break;
                e = p;
            }
        if (tk_buf_append(tmp, cur->data + s, e - s))
            return ft_fail(err, "normalizer: out of memory");
        break;
    }
    case TK_NORM_PREPEND:
        if (cur->n == 0)
            return 0;
        if (tk_buf_append(tmp, n->str, strlen(n->str)) || tk_buf_append(tmp, cur->data, cur->n))
            return ft_fail(err, "normalizer: out of memory");
        break;
    case TK_NORM_REPLACE: {
        size_t clen = strlen(n->str);
        if (n->pattern) {
            size_t plen = strlen(n->pattern);
            if (plen == 0)
                return 0;
            const char *p = cur->data, *end = cur->data + cur->n;
            for (;;) {
                const char *hit = memmem(p, (size_t)(end - p), n->pattern, plen);
                if (!hit)
                    break;
                if (tk_buf_append(tmp, p, (size_t)(hit - p)) || tk_buf_append(tmp, n->str, clen))
                    return ft_fail(err, "normalizer: out of memory");
                p = hit + plen;
            }
            if (tk_buf_append(tmp, p, (size_t)(end - p)))
                return ft_fail(err, "normalizer: out of memory");
        } else {
            size_t pos = 0, prev = 0;
            while (pos <= cur->n) {
                int rc = pcre2_match(n->re, (PCRE2_SPTR)cur->data, cur->n, pos, PCRE2_NO_UTF_CHECK,
                                     md, NULL);
                if (rc < 0)
                    break;
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
                if (tk_buf_append(tmp, cur->data + prev, ov[0] - prev) ||
                    tk_buf_append(tmp, n->str, clen))
                    return ft_fail(err, "normalizer: out of memory");
                prev = ov[1];
                if (ov[1] == ov[0]) {
                    if (ov[1] >= cur->n)
                        break;
                    uint32_t cp;
                    pos = ov[1] + (size_t)tk_utf8_next(cur->data + ov[1], &cp);
                } else {
                    pos = ov[1];
                }
            }
            if (tk_buf_append(tmp, cur->data + prev, cur->n - prev))
                return ft_fail(err, "normalizer: out of memory");
        }
        break;
    }
    }
    tk_buf t = *cur;
    *cur = *tmp;
    *tmp = t;
    return 0;
}

int tk_normalize(const tk_normalizer *n, const char *s, size_t len, tk_buf *out, tk_work *w,
                 ft_err *err)
{
    out->n = 0;
    if (tk_buf_append(out, s, len))
        return ft_fail(err, "normalizer: out of memory");
    return apply(n, out, &w->tmp, w->md, err);
}
