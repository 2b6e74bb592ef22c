/* Regex patterns of tokenizer.json compiled by PCRE2 so that they match what tokenizers'
 * engine (Oniguruma) matches. Two differences are rewritten away before compiling:
 *
 * - \s and \S: Oniguruma's \s is Unicode's White_Space property; PCRE2's \s in UCP mode
 *   also matches U+180E (MONGOLIAN VOWEL SEPARATOR, no longer White_Space since Unicode
 *   6.3), so \s becomes the White_Space set written out.
 * - \p{X}, \p{^X}, \P{X} of a general category X, and \d, \D: tokenizers' Unicode
 *   tables are newer than the system PCRE2's, so a category holds code points PCRE2 does
 *   not know (U+1E030.., Cyrillic Extended-D, are letters since Unicode 15). The generated
 *   table (tok_unicode_compat.c, scripts/gen-unicode-compat.py) lists, per class, what
 *   Oniguruma adds and takes out; the class is written with them:
 *       outside [...]:  \p{X} -> (?:(?![remove])[\p{X}add])   \P{X} -> (?:[^\p{X}add]|[remove])
 *       inside [...]:   \p{X} -> \p{X}add                      \P{X} -> \P{X}remove
 *   (\d and \D alike)
 *   (the (?!) and |[remove] parts only when remove is not empty). Inside a class, a
 *   positive class with code points to take out, or a negated one with code points to
 *   add, has no PCRE2 spelling: the pattern is refused with a message naming it.
 * Script properties (\p{Han}) and \w are left to PCRE2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define WHITE_SPACE "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static int put(tk_buf *b, const char *s)
{
    return tk_buf_append(b, s, strlen(s));
}

/* Writes class `base` (e.g. "\p{L}", "\d"), negated or not, with the code points of u
 * added and taken out, as above. Returns 0, 1 when it cannot be written in a class, -1 on
 * out-of-memory. */
static int put_class(tk_buf *b, const char *base, bool negated, bool in_class, const tk_uclass *u)
{
    bool rem = u->remove[0] != '\0', add = u->add[0] != '\0';
    int e = 0;
    if (in_class) {
        if (negated ? add : rem)
            return 1;
        e |= put(b, base);
        e |= put(b, negated ? u->remove : u->add);
        return e ? -1 : 0;
    }
    if (!negated) {
        e |= put(b, "(?:");
        if (rem)
            e |= put(b, "(?![") | put(b, u->remove) | put(b, "])");
        e |= put(b, "[") | put(b, base) | put(b, u->add) | put(b, "])");
    } else {
        e |= put(b, "(?:[^") | put(b, base) | put(b, u->add) | put(b, "]");
        if (rem)
            e |= put(b, "|[") | put(b, u->remove) | put(b, "]");
        e |= put(b, ")");
    }
    return e ? -1 : 0;
}

/* Copies pattern with the rewrites above. Returns malloc'ed text, or NULL with a message
 * in errbuf. */
static char *rewrite(const char *pattern, char *errbuf, size_t errlen)
{
    tk_buf b = {0};
    size_t n = strlen(pattern);
    bool in_class = false;
    int e = 0;
    for (size_t i = 0; i < n && e == 0; i++) {
        char c = pattern[i];
        if (c == '\\' && i + 1 < n) {
            char x = pattern[i + 1];
            const char *name = NULL;
            size_t name_len = 0, end = i + 2; /* end: past the escape */
            bool negated = false;
            if (x == 's' || (x == 'S' && !in_class)) {
                if (in_class)
                    e = put(&b, WHITE_SPACE);
                else
                    e = put(&b, x == 's' ? "[" : "[^") | put(&b, WHITE_SPACE) | put(&b, "]");
                i++;
                continue;
            }
            if (x == 'd' || x == 'D') {
                name = "d";
                name_len = 1;
                negated = x == 'D';
            } else if ((x == 'p' || x == 'P') && pattern[i + 2] == '{') {
                /* (\pL without braces is PCRE2's alone: Oniguruma does not read it) */
                const char *close = strchr(pattern + i + 3, '}');
                if (close) {
                    negated = x == 'P';
                    name = pattern + i + 3;
                    if (*name == '^') {
                        negated = !negated;
                        name++;
                    }
                    name_len = (size_t)(close - name);
                    end = (size_t)(close - pattern) + 1;
                }
            }
            const tk_uclass *u = name ? tk_unicode_class(name, name_len) : NULL;
            if (!u) { /* any other escape: copied as it is */
                e = tk_buf_append(&b, pattern + i, 2);
                i++;
                continue;
            }
            /* the class itself: positive outside [...] (negated there by [^...]), as
             * written inside */
            bool neg_base = in_class && negated;
            char base[16];
            if (x == 'd' || x == 'D')
                snprintf(base, sizeof base, "\\%c", neg_base ? 'D' : 'd');
            else
                snprintf(base, sizeof base, "\\%c{%.*s}", neg_base ? 'P' : 'p', (int)name_len, name);
            e = put_class(&b, base, negated, in_class, u);
            if (e == 1) {
                snprintf(errbuf, errlen,
                         "%.*s inside a character class: tokenizers' Unicode tables %s code "
                         "points %s it that PCRE2's do not, which a PCRE2 class cannot express",
                         (int)(end - i), pattern + i, negated ? "add" : "take out",
                         negated ? "to" : "from");
                free(b.data);
                return NULL;
            }
            i = end - 1;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            e = tk_buf_append(&b, &c, 1);
            /* a ']' right after '[' or '[^' is a literal */
            if (pattern[i + 1] == '^')
                e |= tk_buf_append(&b, &pattern[++i], 1);
            if (pattern[i + 1] == ']')
                e |= tk_buf_append(&b, &pattern[++i], 1);
            continue;
        }
        if (in_class && c == '[' && pattern[i + 1] == ':') {
            /* a POSIX class [:name:] inside a class */
            const char *close = strstr(pattern + i + 2, ":]");
            size_t len = close ? (size_t)(close - (pattern + i)) + 2 : 1;
            e = tk_buf_append(&b, pattern + i, len);
            i += len - 1;
            continue;
        }
        if (in_class && c == ']')
            in_class = false;
        e = tk_buf_append(&b, &c, 1);
    }
    if (e || tk_buf_append(&b, "", 1)) {
        snprintf(errbuf, errlen, "out of memory");
        free(b.data);
        return NULL;
    }
    return b.data;
}

pcre2_code *tk_regex_compile(const char *pattern, bool is_literal, char *errbuf, size_t errlen)
{
    int ec;
    PCRE2_SIZE eo;
    char *rewritten = NULL;
    if (!is_literal) {
        rewritten = rewrite(pattern, errbuf, errlen);
        if (!rewritten)
            return NULL;
        pattern = rewritten;
    }
    /* PCRE2_LITERAL admits UTF but not UCP (which a literal does not need) */
    uint32_t opts = PCRE2_UTF | PCRE2_NO_UTF_CHECK | (is_literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &ec, &eo, NULL);
    free(rewritten);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(errbuf, errlen, "bad regex at offset %zu: %s", (size_t)eo, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter on failure */
    return re;
}
