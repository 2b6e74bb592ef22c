/* Decoders of tokenizer.json, as tokenizers' decode_chain: each turns a list of token
 * strings into another list, and the final list is concatenated. ByteLevel maps the
 * bytes_to_unicode characters back to bytes (lossy UTF-8, as Rust's from_utf8_lossy),
 * Replace substitutes a string, ByteFallback turns runs of <0xNN> tokens into their
 * bytes (U+FFFD per byte when invalid), Fuse joins, Strip removes a character from the
 * ends of each token, Metaspace turns the replacement character back into spaces. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

int tk_strlist_push(tk_strlist *l, const char *s, size_t len)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 64;
        char **ns = realloc(l->s, nc * sizeof *ns);
        if (!ns)
            return -1;
        l->s = ns;
        size_t *nl = realloc(l->len, nc * sizeof *nl);
        if (!nl)
            return -1;
        l->len = nl;
        l->cap = nc;
    }
    char *c = malloc(len + 1);
    if (!c)
        return -1;
    memcpy(c, s, len);
    c[len] = 0;
    l->s[l->n] = c;
    l->len[l->n++] = len;
    return 0;
}

void tk_strlist_free(tk_strlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->s[i]);
    free(l->s);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static uint32_t one_char(const char *s, bool *ok)
{
    uint32_t cp = 0;
    size_t len = strlen(s);
    *ok = len > 0 && (size_t)tk_utf8_next(s, &cp) == len;
    return cp;
}

int tk_decoder_parse(tk_decoder *d, const void *json, ft_err *err)
{
    const json_t *j = json;
    memset(d, 0, sizeof *d);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type)
        return ft_fail(err, "decoder: missing 'type'");
    if (!strcmp(type, "Sequence")) {
        d->type = TK_DEC_SEQUENCE;
        json_t *arr = json_object_get(j, "decoders");
        if (!json_is_array(arr))
            return ft_fail(err, "decoder Sequence: 'decoders' must be an array");
        d->subs = calloc(json_array_size(arr) + 1, sizeof *d->subs);
        if (!d->subs)
            return ft_fail(err, "decoder: out of memory");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            if (tk_decoder_parse(&d->subs[i], json_array_get(arr, i), err))
                return -1;
            d->nsubs++;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        d->type = TK_DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d->type = TK_DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d->type = TK_DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        d->type = TK_DEC_REPLACE;
        json_t *pat = json_object_get(j, "pattern");
        const char *s = json_string_value(json_object_get(pat, "String"));
        const char *c = json_string_value(json_object_get(j, "content"));
        if (!s || !c)
            return ft_fail(err, "decoder Replace: needs 'pattern' {\"String\": ...} and 'content' "
                                "(regex patterns are not supported)");
        d->pattern = strdup(s);
        d->content = strdup(c);
    } else if (!strcmp(type, "Strip")) {
        d->type = TK_DEC_STRIP;
        bool ok;
        const char *c = json_string_value(json_object_get(j, "content"));
        d->strip_char = c ? one_char(c, &ok) : 0;
        json_t *st = json_object_get(j, "start"), *sp = json_object_get(j, "stop");
        if (!c || !ok || !json_is_integer(st) || !json_is_integer(sp) || json_integer_value(st) < 0 ||
            json_integer_value(sp) < 0)
            return ft_fail(err, "decoder Strip: needs a one-character 'content' and integer "
                                "'start' and 'stop'");
        d->strip_start = (size_t)json_integer_value(st);
        d->strip_stop = (size_t)json_integer_value(sp);
    } else if (!strcmp(type, "Metaspace")) {
        d->type = TK_DEC_METASPACE;
        bool ok = true;
        const char *r = json_string_value(json_object_get(j, "replacement"));
        d->replacement = r ? one_char(r, &ok) : 0x2581;
        if (!ok)
            return ft_fail(err, "decoder Metaspace: 'replacement' must be one character");
        const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
        if (ps) {
            if (!strcmp(ps, "always"))
                d->prepend = TK_PREPEND_ALWAYS;
            else if (!strcmp(ps, "first"))
                d->prepend = TK_PREPEND_FIRST;
            else if (!strcmp(ps, "never"))
                d->prepend = TK_PREPEND_NEVER;
            else
                return ft_fail(err, "decoder Metaspace: unknown prepend_scheme '%s'", ps);
        } else {
            json_t *aps = json_object_get(j, "add_prefix_space");
            d->prepend = (!aps || json_is_true(aps)) ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        }
    } else {
        return ft_fail(err, "decoder: unsupported type '%s'", type);
    }
    return 0;
}

void tk_decoder_free(tk_decoder *d)
{
    for (size_t i = 0; i < d->nsubs; i++)
        tk_decoder_free(&d->subs[i]);
    free(d->subs);
    free(d->pattern);
    free(d->content);
    memset(d, 0, sizeof *d);
}

/* Replaces l->s[i] by b's contents (b keeps its buffer). */
static int set_item(tk_strlist *l, size_t i, const tk_buf *b)
{
    char *c = malloc(b->n + 1);
    if (!c)
        return -1;
    if (b->n)
        memcpy(c, b->data, b->n);
    c[b->n] = 0;
    free(l->s[i]);
    l->s[i] = c;
    l->len[i] = b->n;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

/* <0xNN> -> byte (u8::from_str_radix on NN: a leading '+' is allowed), else -1. */
static int byte_token(const char *s, size_t len)
{
    if (len != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    if (s[3] == '+') {
        int v = hexval(s[4]);
        return v;
    }
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static int flush_bytes(tk_strlist *out, tk_buf *bytes)
{
    if (!bytes->n)
        return 0;
    int rc = 0;
    if (tk_utf8_valid(bytes->data, bytes->n)) {
        rc = tk_strlist_push(out, bytes->data, bytes->n);
    } else {
        for (size_t k = 0; k < bytes->n && !rc; k++)
            rc = tk_strlist_push(out, "\xEF\xBF\xBD", 3);
    }
    bytes->n = 0;
    return rc;
}

int tk_decode_chain(const tk_decoder *d, tk_strlist *l, ft_err *err)
{
    tk_buf b = {0};
    int rc = 0;
    switch (d->type) {
    case TK_DEC_SEQUENCE:
        for (size_t i = 0; i < d->nsubs && !rc; i++)
            rc = tk_decode_chain(&d->subs[i], l, err);
        return rc;
    case TK_DEC_BYTELEVEL: {
        tk_buf bytes = {0};
        for (size_t i = 0; i < l->n && !rc; i++) {
            size_t start = bytes.n;
            bool all = true;
            for (size_t k = 0; k < l->len[i] && all;) {
                uint32_t cp;
                k += (size_t)tk_utf8_next(l->s[i] + k, &cp);
                int byte = tk_cp_to_byte(cp);
                if (byte < 0) {
                    all = false;
                } else {
                    unsigned char c = (unsigned char)byte;
                    rc = tk_buf_append(&bytes, &c, 1);
                }
            }
            if (!all) {
                bytes.n = start;
                rc = tk_buf_append(&bytes, l->s[i], l->len[i]);
            }
        }
        if (!rc)
            rc = tk_utf8_lossy_append((const unsigned char *)(bytes.data ? bytes.data : ""), bytes.n,
                                      &b);
        free(bytes.data);
        if (!rc) {
            for (size_t i = 0; i < l->n; i++)
                free(l->s[i]);
            l->n = 0;
            rc = tk_strlist_push(l, b.data ? b.data : "", b.n);
        }
        break;
    }
    case TK_DEC_FUSE:
        for (size_t i = 0; i < l->n && !rc; i++)
            rc = tk_buf_append(&b, l->s[i], l->len[i]);
        if (!rc) {
            for (size_t i = 0; i < l->n; i++)
                free(l->s[i]);
            l->n = 0;
            rc = tk_strlist_push(l, b.data ? b.data : "", b.n);
        }
        break;
    case TK_DEC_REPLACE: {
        size_t pl = strlen(d->pattern), cl = strlen(d->content);
        for (size_t i = 0; i < l->n && !rc && pl; i++) {
            b.n = 0;
            const char *p = l->s[i], *end = l->s[i] + l->len[i];
            for (;;) {
                const char *hit = memmem(p, (size_t)(end - p), d->pattern, pl);
                if (!hit)
                    break;
                rc |= tk_buf_append(&b, p, (size_t)(hit - p));
                rc |= tk_buf_append(&b, d->content, cl);
                p = hit + pl;
            }
            rc |= tk_buf_append(&b, p, (size_t)(end - p));
            if (!rc)
                rc = set_item(l, i, &b);
        }
        break;
    }
    case TK_DEC_BYTEFALLBACK: {
        tk_strlist out = {0};
        tk_buf bytes = {0};
        for (size_t i = 0; i < l->n && !rc; i++) {
            int v = byte_token(l->s[i], l->len[i]);
            if (v >= 0) {
                unsigned char c = (unsigned char)v;
                rc = tk_buf_append(&bytes, &c, 1);
            } else {
                rc = flush_bytes(&out, &bytes);
                if (!rc)
                    rc = tk_strlist_push(&out, l->s[i], l->len[i]);
            }
        }
        if (!rc)
            rc = flush_bytes(&out, &bytes);
        free(bytes.data);
        tk_strlist_free(l);
        *l = out;
        break;
    }
    case TK_DEC_STRIP:
        for (size_t i = 0; i < l->n && !rc; i++) {
            /* byte offsets of each character */
            const char *s = l->s[i];
            size_t len = l->len[i], nch = 0;
            for (size_t k = 0; k < len; k++)
                nch += ((unsigned char)s[k] & 0xC0) != 0x80;
            size_t start = 0, startch = 0;
            for (size_t c = 0; c < d->strip_start && start < len; c++) {
                uint32_t cp;
                int k = tk_utf8_next(s + start, &cp);
                if (cp != d->strip_char)
                    break;
                start += (size_t)k;
                startch++;
            }
            size_t stop = len;
            for (size_t c = 0; c < d->strip_stop && c < nch; c++) {
                size_t q = stop - 1;
                while (q > 0 && ((unsigned char)s[q] & 0xC0) == 0x80)
                    q--;
                uint32_t cp;
                tk_utf8_next(s + q, &cp);
                if (cp != d->strip_char)
                    break;
                stop = q;
            }
            b.n = 0;
            if (stop > start)
                rc = tk_buf_append(&b, s + start, stop - start);
            else
                rc = tk_buf_reserve(&b, 0);
            if (!rc)
                rc = set_item(l, i, &b);
            (void)startch;
        }
        break;
    case TK_DEC_METASPACE: {
        char rep[4];
        int rl = tk_utf8_encode(d->replacement, rep);
        for (size_t i = 0; i < l->n && !rc; i++) {
            b.n = 0;
            rc = tk_buf_reserve(&b, 0);
            const char *s = l->s[i];
            size_t len = l->len[i];
            for (size_t k = 0; k < len && !rc;) {
                if (k + (size_t)rl <= len && memcmp(s + k, rep, (size_t)rl) == 0) {
                    if (!(i == 0 && d->prepend != TK_PREPEND_NEVER)) /* all of token 0's, as tokenizers */
                        rc = tk_buf_append(&b, " ", 1);
                    k += (size_t)rl;
                } else {
                    rc = tk_buf_append(&b, s + k, 1);
                    k++;
                }
            }
            if (!rc)
                rc = set_item(l, i, &b);
        }
        break;
    }
    }
    free(b.data);
    return rc ? ft_fail(err, "decoder: out of memory") : 0;
}
