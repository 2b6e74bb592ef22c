/* ROUGE-L and exact match (see rouge.h).
 *
 * Tokenizing as rouge_score does: text.lower(), then re.sub(r"[^a-z0-9]+", " "), then
 * split. Python's lower() is Unicode-aware, but only two non-ASCII characters lower to
 * something that contains [a-z0-9]: U+0130 (LATIN CAPITAL LETTER I WITH DOT ABOVE) lowers
 * to "i" + U+0307, and U+212A (KELVIN SIGN) to "k". Every other non-ASCII character ends
 * up a separator. Tokens are kept as (offset, length) spans of a lowered ASCII copy. */
#include "eval/rouge.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct toks {
    char *buf;      /* the lowered text: [a-z0-9] kept, everything else a space */
    size_t *start;  /* token i is buf[start[i] .. start[i] + len[i]) */
    size_t *len;
    size_t n;
} toks;

static void toks_free(toks *t)
{
    free(t->buf);
    free(t->start);
    free(t->len);
}

/* Decodes one UTF-8 sequence at s (already valid or not: a bad byte is read as itself). */
static uint32_t utf8_next(const unsigned char *s, size_t *adv)
{
    unsigned c = s[0];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *adv = 1;
            return 0xfffd;
        }
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    *adv = (size_t)n;
    return cp;
}

static int tokenize(const char *text, toks *t)
{
    size_t n = strlen(text);
    memset(t, 0, sizeof *t);
    t->buf = malloc(n + 1);
    /* at most one token per two bytes, plus one */
    t->start = malloc((n / 2 + 1) * sizeof *t->start);
    t->len = malloc((n / 2 + 1) * sizeof *t->len);
    if (!t->buf || !t->start || !t->len) {
        toks_free(t);
        return -1;
    }
    const unsigned char *s = (const unsigned char *)text;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t cp = utf8_next(s + i, &adv);
        i += adv;
        char ch = ' ';
        if (cp >= 'A' && cp <= 'Z')
            ch = (char)(cp - 'A' + 'a');
        else if ((cp >= 'a' && cp <= 'z') || (cp >= '0' && cp <= '9'))
            ch = (char)cp;
        else if (cp == 0x130)
            ch = 'i';
        else if (cp == 0x212a)
            ch = 'k';
        t->buf[o++] = ch; /* o <= i: each code point is at least one byte */
    }
    t->buf[o] = '\0';
    for (size_t i = 0; i < o;) {
        if (t->buf[i] == ' ') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < o && t->buf[j] != ' ')
            j++;
        t->start[t->n] = i;
        t->len[t->n] = j - i;
        t->n++;
        i = j;
    }
    return 0;
}

static bool tok_eq(const toks *a, size_t i, const toks *b, size_t j)
{
    return a->len[i] == b->len[j] &&
           memcmp(a->buf + a->start[i], b->buf + b->start[j], a->len[i]) == 0;
}

int ft_rouge_l(const char *reference, const char *prediction, double *f1, ft_err *err)
{
    toks r, p;
    *f1 = 0.0;
    if (tokenize(reference, &r))
        return ft_fail(err, "out of memory (ROUGE-L)");
    if (tokenize(prediction, &p)) {
        toks_free(&r);
        return ft_fail(err, "out of memory (ROUGE-L)");
    }
    int rc = 0;
    if (r.n > 0 && p.n > 0) {
        /* LCS by dynamic programming over two rows of length |pred| + 1. */
        size_t *prev = calloc(p.n + 1, sizeof *prev), *cur = calloc(p.n + 1, sizeof *cur);
        if (!prev || !cur) {
            rc = ft_fail(err, "out of memory (ROUGE-L)");
        } else {
            for (size_t i = 1; i <= r.n; i++) {
                for (size_t j = 1; j <= p.n; j++)
                    cur[j] = tok_eq(&r, i - 1, &p, j - 1) ? prev[j - 1] + 1
                             : prev[j] > cur[j - 1]       ? prev[j]
                                                          : cur[j - 1];
                size_t *t = prev;
                prev = cur;
                cur = t;
            }
            double lcs = (double)prev[p.n];
            double prec = lcs / (double)p.n, rec = lcs / (double)r.n;
            *f1 = prec + rec > 0 ? 2.0 * prec * rec / (prec + rec) : 0.0;
        }
        free(prev);
        free(cur);
    }
    toks_free(&r);
    toks_free(&p);
    return rc;
}

/* Python's str.isspace() for a code point (the Unicode White_Space property plus the
 * separators U+001C..U+001F that Python also counts). */
static bool py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* [*b, *e) of s without leading and trailing whitespace. */
static void strip(const char *s, size_t *b, size_t *e)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), i = 0, end = 0;
    *b = n;
    while (i < n) {
        size_t adv;
        uint32_t cp = utf8_next(u + i, &adv);
        if (!py_space(cp)) {
            if (*b == n)
                *b = i;
            end = i + adv;
        }
        i += adv;
    }
    *e = *b == n ? n : end;
}

bool ft_exact_match(const char *a, const char *b)
{
    size_t ab, ae, bb, be;
    strip(a, &ab, &ae);
    strip(b, &bb, &be);
    return ae - ab == be - bb && memcmp(a + ab, b + bb, ae - ab) == 0;
}
