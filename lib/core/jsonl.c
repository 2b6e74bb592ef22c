/* JSONL line reader (see jsonl.h). getline() gives lines of any length; the buffer is
 * reused from line to line. */
#include "core/jsonl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ft_jsonl {
    FILE *f;
    bool owns;
    char *path;
    char *buf;
    size_t cap;
    long lineno;
    bool bad;
};

bool ft_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        unsigned c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        int n;
        unsigned cp, min;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 1; cp = c & 0x1F; min = 0x80;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2; cp = c & 0x0F; min = 0x800;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3; cp = c & 0x07; min = 0x10000;
        } else {
            return false; /* continuation byte, C0/C1 overlong lead, or > U+10FFFF lead */
        }
        if (end - p <= n)
            return false;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        p += n + 1;
    }
    return true;
}

int ft_jsonl_open(ft_jsonl **out, const char *path, ft_err *err)
{
    *out = NULL;
    ft_jsonl *r = calloc(1, sizeof *r);
    if (!r)
        return ft_fail(err, "%s: out of memory", path);
    if (strcmp(path, "-") == 0) {
        r->f = stdin;
        r->path = strdup("<stdin>");
    } else {
        r->f = fopen(path, "rb");
        r->owns = true;
        r->path = strdup(path);
        if (!r->f) {
            int e = errno;
            free(r->path);
            free(r);
            return ft_fail(err, "%s: cannot open: %s", path, strerror(e));
        }
    }
    if (!r->path) {
        ft_jsonl_close(r);
        return ft_fail(err, "%s: out of memory", path);
    }
    *out = r;
    return 0;
}

void ft_jsonl_close(ft_jsonl *r)
{
    if (!r)
        return;
    if (r->owns && r->f)
        fclose(r->f);
    free(r->buf);
    free(r->path);
    free(r);
}

const char *ft_jsonl_path(const ft_jsonl *r) { return r->path; }
bool ft_jsonl_bad_line(const ft_jsonl *r) { return r->bad; }

int ft_jsonl_next(ft_jsonl *r, const char **line, size_t *len, long *lineno, ft_err *err)
{
    r->bad = false;
    for (;;) {
        errno = 0;
        ssize_t n = getline(&r->buf, &r->cap, r->f);
        if (n < 0) {
            if (ferror(r->f))
                return ft_fail(err, "%s:%ld: read error: %s", r->path, r->lineno + 1,
                               strerror(errno ? errno : EIO));
            return 0;
        }
        r->lineno++;
        char *s = r->buf;
        size_t l = (size_t)n;
        if (l && s[l - 1] == '\n')
            l--;
        if (l && s[l - 1] == '\r')
            l--;
        s[l] = '\0';
        if (r->lineno == 1 && l >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
            s += 3;
            l -= 3;
        }
        size_t i = 0;
        while (i < l && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
            i++;
        if (i == l)
            continue;
        *lineno = r->lineno;
        if (!ft_utf8_valid(s, l)) {
            r->bad = true;
            return ft_fail(err, "%s:%ld: invalid UTF-8", r->path, r->lineno);
        }
        *line = s;
        *len = l;
        return 1;
    }
}
