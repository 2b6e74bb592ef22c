/* The template lexer: text and tags into tokens, with jinja2's rules for whitespace as
 * transformers configures them (trim_blocks=True, lstrip_blocks=True,
 * keep_trailing_newline=False):
 *   - "\r\n" and "\r" become "\n", and one trailing newline of the template is dropped;
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag; "-%}", "-}}", "-#}" all
 *     whitespace after it;
 *   - a block or comment tag ("%}", "#}", not "+%}") eats the one newline after it;
 *   - a block or comment tag ("{%", "{#", not "{%+") alone on its line after only spaces
 *     and tabs takes those with it (jinja2 checks "only whitespace between the last
 *     newline and the tag, or the start of the text when the text starts a line");
 *   - {% raw %}...{% endraw %} is text; comments go.
 * Inside tags: names, strings (Python escapes), integers, floats, operators; a tag ends
 * at its end marker only outside brackets, as in jinja2. */
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_internal.h"

typedef struct lexer {
    jarena *a;
    const char *s; /* the normalized source */
    size_t n, pos;
    size_t *nl;    /* offsets of the newlines, for line numbers */
    size_t n_nl;
    jtok *t;
    size_t nt, cap;
} lexer;

static void where(const lexer *L, size_t pos, int *line, int *col)
{
    size_t lo = 0, hi = L->n_nl; /* number of newlines before pos */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (L->nl[mid] < pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    *line = (int)lo + 1;
    *col = (int)(pos - (lo ? L->nl[lo - 1] + 1 : 0)) + 1;
}

static _Noreturn void lfail(const lexer *L, size_t pos, const char *msg)
{
    int line, col;
    where(L, pos, &line, &col);
    ja_fail(L->a, line, col, "%s", msg);
}

static jtok *emit(lexer *L, jtok_kind k, size_t pos)
{
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok *t = ja_alloc(L->a, cap * sizeof *t);
        if (L->nt)
            memcpy(t, L->t, L->nt * sizeof *t);
        L->t = t;
        L->cap = cap;
    }
    jtok *t = &L->t[L->nt++];
    memset(t, 0, sizeof *t);
    t->k = k;
    where(L, pos, &t->line, &t->col);
    return t;
}

/* Python's \s on one code point starting at s (ASCII and the Unicode spaces). */
static size_t space_at(const char *s, size_t left)
{
    unsigned char c = (unsigned char)s[0];
    if (c < 0x80)
        return ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) ? 1 : 0;
    size_t n;
    uint32_t cp;
    int l = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if ((size_t)l > left)
        return 0;
    cp = l == 2 ? c & 0x1F : l == 3 ? c & 0x0F : c & 0x07;
    for (int i = 1; i < l; i++)
        cp = (cp << 6) | ((unsigned char)s[i] & 0x3F);
    n = (size_t)l;
    return ju_space(cp) ? n : 0;
}

static size_t skip_space(const lexer *L, size_t p)
{
    size_t k;
    while (p < L->n && (k = space_at(L->s + p, L->n - p)) > 0)
        p += k;
    return p;
}

/* Length of text[0..n) without its trailing whitespace. */
static size_t rstrip_len(const char *s, size_t n)
{
    size_t end = 0, p = 0, k;
    while (p < n) {
        k = space_at(s + p, n - p);
        if (k) {
            p += k;
        } else {
            unsigned char c = (unsigned char)s[p];
            p += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            if (p > n)
                p = n;
            end = p;
        }
    }
    return end;
}

/* Emits text [start, end) before a tag whose opening is at end: sign is the tag's
 * '-', '+' or 0, lstrip whether the tag kind takes part in lstrip_blocks. */
static void text_before(lexer *L, size_t start, size_t end, char sign, bool lstrip,
                        bool line_starting)
{
    const char *s = L->s + start;
    size_t n = end - start;
    if (sign == '-') {
        n = rstrip_len(s, n);
    } else if (sign != '+' && lstrip) {
        size_t l_pos = 0;
        for (size_t i = n; i > 0; i--)
            if (s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if (l_pos > 0 || line_starting) {
            size_t p = l_pos, k;
            while (p < n && (k = space_at(s + p, n - p)) > 0)
                p += k;
            if (p == n)
                n = l_pos;
        }
    }
    if (n) {
        jtok *t = emit(L, T_TEXT, start);
        t->s = ja_strndup(L->a, s, n);
        t->n = n;
    }
}

/* The end of a block / comment tag at p ("-%}", "+%}", "%}" with c = '%' or '#'):
 * returns the position after it and what it eats, or 0 when there is none at p. */
static size_t tag_end(const lexer *L, size_t p, char c, bool trim, bool *nl_end)
{
    const char *s = L->s;
    size_t q;
    if (p + 3 <= L->n && (s[p] == '-' || s[p] == '+') && s[p + 1] == c && s[p + 2] == '}') {
        q = p + 3;
        if (s[p] == '-')
            q = skip_space(L, q);
    } else if (p + 2 <= L->n && s[p] == c && s[p + 1] == '}') {
        q = p + 2;
        if (trim && q < L->n && s[q] == '\n')
            q++;
    } else {
        return 0;
    }
    *nl_end = s[q - 1] == '\n';
    return q;
}

static void lex_string(lexer *L, size_t *pp)
{
    size_t p = *pp, start = p;
    char q = L->s[p++];
    jbuf b = {.a = L->a};
    for (;;) {
        if (p >= L->n)
            lfail(L, start, "unterminated string");
        char c = L->s[p];
        if (c == q) {
            p++;
            break;
        }
        if (c != '\\') {
            jb_addc(&b, c);
            p++;
            continue;
        }
        if (p + 1 >= L->n)
            lfail(L, start, "unterminated string");
        char e = L->s[p + 1];
        p += 2;
        uint32_t cp;
        int hex = 0;
        switch (e) {
        case 'n': jb_addc(&b, '\n'); continue;
        case 't': jb_addc(&b, '\t'); continue;
        case 'r': jb_addc(&b, '\r'); continue;
        case '\\': jb_addc(&b, '\\'); continue;
        case '\'': jb_addc(&b, '\''); continue;
        case '"': jb_addc(&b, '"'); continue;
        case 'a': jb_addc(&b, '\a'); continue;
        case 'b': jb_addc(&b, '\b'); continue;
        case 'f': jb_addc(&b, '\f'); continue;
        case 'v': jb_addc(&b, '\v'); continue;
        case '\n': continue;
        case 'x': hex = 2; break;
        case 'u': hex = 4; break;
        case 'U': hex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && p < L->n && L->s[p] >= '0' && L->s[p] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(L->s[p++] - '0');
                ju_encode(&b, cp);
                continue;
            }
            /* unknown escapes stay as written */
            jb_addc(&b, '\\');
            jb_addc(&b, e);
            continue;
        }
        cp = 0;
        for (int k = 0; k < hex; k++) {
            char h = p < L->n ? L->s[p] : 0;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0)
                lfail(L, p, "truncated \\x / \\u escape in a string");
            cp = cp * 16 + (uint32_t)d;
            p++;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            lfail(L, p, "escape outside Unicode in a string");
        ju_encode(&b, cp);
    }
    jtok *t = emit(L, T_STR, start);
    t->s = b.s ? b.s : "";
    t->n = b.n;
    *pp = p;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_name0(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static void lex_number(lexer *L, size_t *pp)
{
    size_t p = *pp, start = p;
    char buf[128];
    size_t k = 0;
    bool is_float = false;
    while (p < L->n && (is_digit(L->s[p]) || (L->s[p] == '_' && p + 1 < L->n &&
                                              is_digit(L->s[p + 1])))) {
        if (L->s[p] != '_' && k < sizeof buf - 1)
            buf[k++] = L->s[p];
        p++;
    }
    if (p + 1 < L->n && L->s[p] == '.' && is_digit(L->s[p + 1])) {
        is_float = true;
        buf[k++] = '.';
        p++;
        while (p < L->n && (is_digit(L->s[p]) || L->s[p] == '_')) {
            if (L->s[p] != '_' && k < sizeof buf - 1)
                buf[k++] = L->s[p];
            p++;
        }
    }
    if (p < L->n && (L->s[p] == 'e' || L->s[p] == 'E')) {
        size_t q = p + 1;
        if (q < L->n && (L->s[q] == '+' || L->s[q] == '-'))
            q++;
        if (q < L->n && is_digit(L->s[q])) {
            is_float = true;
            while (p < q && k < sizeof buf - 1)
                buf[k++] = L->s[p++];
            while (p < L->n && is_digit(L->s[p])) {
                if (k < sizeof buf - 1)
                    buf[k++] = L->s[p];
                p++;
            }
        }
    }
    buf[k] = 0;
    jtok *t = emit(L, is_float ? T_FLOAT : T_INT, start);
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        char *end;
        unsigned long long v = strtoull(buf, &end, 10);
        if (k > 18 && (v > (unsigned long long)INT64_MAX || k > 19))
            lfail(L, start, "integer literal too large");
        t->i = (int64_t)v;
    }
    *pp = p;
}

static const char *const OPS2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char OPS1[] = "+-*/%~()[]{},.:|=<>";

/* Tokens of a tag's inside, up to its end marker (c = '%' or '}' for "}}"). Returns
 * the position after the end. */
static size_t lex_tag(lexer *L, size_t p, char c, bool *nl_end)
{
    int depth = 0;
    for (;;) {
        p = skip_space(L, p);
        if (p >= L->n)
            lfail(L, p, c == '%' ? "unexpected end of template inside {% ... %}"
                                 : "unexpected end of template inside {{ ... }}");
        if (depth == 0) {
            size_t q = 0;
            if (c == '%') {
                q = tag_end(L, p, '%', true, nl_end);
            } else if (L->s[p] == '-' && p + 2 < L->n && L->s[p + 1] == '}' &&
                       L->s[p + 2] == '}') {
                q = skip_space(L, p + 3);
                *nl_end = L->s[q - 1] == '\n';
            } else if (L->s[p] == '}' && p + 1 < L->n && L->s[p + 1] == '}') {
                q = p + 2;
                *nl_end = false;
            }
            if (q) {
                emit(L, c == '%' ? T_BLOCK_END : T_VAR_END, p);
                return q;
            }
        }
        char ch = L->s[p];
        if (ch == '\'' || ch == '"') {
            lex_string(L, &p);
        } else if (is_digit(ch)) {
            lex_number(L, &p);
        } else if (is_name0(ch)) {
            size_t s0 = p;
            while (p < L->n && (is_name0(L->s[p]) || is_digit(L->s[p])))
                p++;
            jtok *t = emit(L, T_NAME, s0);
            t->s = ja_strndup(L->a, L->s + s0, p - s0);
            t->n = p - s0;
        } else {
            size_t len = 0;
            for (size_t i = 0; i < sizeof OPS2 / sizeof *OPS2; i++)
                if (p + 1 < L->n && L->s[p] == OPS2[i][0] && L->s[p + 1] == OPS2[i][1])
                    len = 2;
            if (!len && strchr(OPS1, ch) && ch)
                len = 1;
            if (!len) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected character '%c'",
                         (unsigned char)ch >= 0x20 && (unsigned char)ch < 0x7F ? ch : '?');
                lfail(L, p, msg);
            }
            if (ch == '(' || ch == '[' || ch == '{')
                depth++;
            else if ((ch == ')' || ch == ']' || ch == '}') && depth > 0)
                depth--;
            jtok *t = emit(L, T_OP, p);
            t->s = ja_strndup(L->a, L->s + p, len);
            t->n = len;
            p += len;
        }
    }
}

/* "{% raw %}" at p (p at "{%")? Sets *after to the position after its end. */
static bool raw_begin(const lexer *L, size_t p, size_t *after)
{
    size_t q = p + 2;
    if (q < L->n && (L->s[q] == '-' || L->s[q] == '+'))
        q++;
    q = skip_space(L, q);
    if (q + 3 > L->n || strncmp(L->s + q, "raw", 3) != 0)
        return false;
    q = skip_space(L, q + 3);
    if (q + 3 <= L->n && L->s[q] == '-' && L->s[q + 1] == '%' && L->s[q + 2] == '}') {
        *after = skip_space(L, q + 3);
        return true;
    }
    if (q + 2 <= L->n && L->s[q] == '%' && L->s[q + 1] == '}') {
        *after = q + 2;
        return true;
    }
    return false;
}

/* The "{% endraw %}" at or after p: its start, sign and the position after it. */
static bool raw_end(const lexer *L, size_t p, size_t *start, char *sign, size_t *after,
                    bool *nl_end)
{
    for (; p + 1 < L->n; p++) {
        if (L->s[p] != '{' || L->s[p + 1] != '%')
            continue;
        size_t q = p + 2;
        char sg = 0;
        if (q < L->n && (L->s[q] == '-' || L->s[q] == '+'))
            sg = L->s[q++];
        q = skip_space(L, q);
        if (q + 6 > L->n || strncmp(L->s + q, "endraw", 6) != 0)
            continue;
        q = skip_space(L, q + 6);
        size_t e = tag_end(L, q, '%', true, nl_end);
        if (!e)
            continue;
        *start = p;
        *sign = sg;
        *after = e;
        return true;
    }
    return false;
}

jtok *jj_lex(jarena *a, const char *src, size_t *count)
{
    lexer L = {.a = a};
    size_t n = strlen(src);
    char *s = ja_alloc(a, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < n && src[i + 1] == '\n')
                i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k > 0 && s[k - 1] == '\n')
        k--;
    s[k] = 0;
    L.s = s;
    L.n = k;
    for (size_t i = 0; i < k; i++)
        if (s[i] == '\n')
            L.n_nl++;
    L.nl = ja_alloc(a, (L.n_nl + 1) * sizeof *L.nl);
    for (size_t i = 0, j = 0; i < k; i++)
        if (s[i] == '\n')
            L.nl[j++] = i;

    size_t p = 0;
    bool line_starting = true;
    while (p < L.n) {
        size_t q = p;
        while (q + 1 < L.n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' ||
                                                 s[q + 1] == '#')))
            q++;
        if (q + 1 >= L.n) {
            text_before(&L, p, L.n, 0, false, line_starting);
            break;
        }
        char kind = s[q + 1];
        char sign = q + 2 < L.n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
        size_t after;
        if (kind == '%' && raw_begin(&L, q, &after)) {
            text_before(&L, p, q, sign, true, line_starting);
            size_t e0, e1;
            char esign;
            bool nl_end;
            if (!raw_end(&L, after, &e0, &esign, &e1, &nl_end))
                lfail(&L, q, "missing {% endraw %}");
            text_before(&L, after, e0, esign, true, false);
            p = e1;
            line_starting = nl_end;
            continue;
        }
        text_before(&L, p, q, sign, kind != '{', line_starting);
        size_t body = q + 2 + (sign ? 1 : 0);
        bool nl_end = false;
        if (kind == '#') {
            size_t e = 0;
            for (size_t r = body; r + 1 < L.n; r++)
                if (s[r] == '#' && s[r + 1] == '}') {
                    size_t from = r > body && (s[r - 1] == '-' || s[r - 1] == '+') ? r - 1 : r;
                    e = tag_end(&L, from, '#', true, &nl_end);
                    break;
                }
            if (!e)
                lfail(&L, q, "missing end of comment tag");
            p = e;
        } else if (kind == '%') {
            emit(&L, T_BLOCK_BEGIN, q);
            p = lex_tag(&L, body, '%', &nl_end);
        } else {
            emit(&L, T_VAR_BEGIN, q);
            p = lex_tag(&L, body, '}', &nl_end);
        }
        line_starting = nl_end;
    }
    emit(&L, T_EOF, L.n);
    *count = L.nt;
    return L.t;
}
