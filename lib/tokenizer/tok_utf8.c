/* UTF-8 helpers of the tokenizer: validation, decoding one code point, Rust's
 * from_utf8_lossy, the whitespace / alphanumeric tests that `tokenizers` uses (Rust's
 * char methods), and the growable buffers and piece lists of the encode pipeline. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

int tk_buf_reserve(tk_buf *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap) {
        b->data[b->n] = '\0';
        return 0;
    }
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->n + extra + 1)
        nc *= 2;
    char *d = realloc(b->data, nc);
    if (!d)
        return -1;
    b->data = d;
    b->cap = nc;
    b->data[b->n] = '\0'; /* the contents stay a C string, also when nothing is appended */
    return 0;
}

int tk_buf_append(tk_buf *b, const void *s, size_t len)
{
    if (tk_buf_reserve(b, len))
        return -1;
    if (len)
        memcpy(b->data + b->n, s, len);
    b->n += len;
    b->data[b->n] = 0;
    return 0;
}

int tk_pieces_push(tk_pieces *v, size_t off, size_t len, int32_t id, bool first)
{
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 64;
        tk_piece *p = realloc(v->p, nc * sizeof *p);
        if (!p)
            return -1;
        v->p = p;
        v->cap = nc;
    }
    v->p[v->n++] = (tk_piece){off, len, id, first};
    return 0;
}

/* Length of the valid UTF-8 sequence at s (at most avail bytes), or -k where k >= 1 is
 * the length of the maximal invalid subpart to replace. */
static int utf8_seq(const unsigned char *s, size_t avail)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else
        return -1;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= avail)
            return -k;
        unsigned x = s[k];
        unsigned l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (x < l || x > h)
            return -k;
    }
    return need;
}

bool tk_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        /* fast path over ASCII, 8 bytes at a time */
        while (i + 8 <= len) {
            uint64_t x;
            memcpy(&x, s + i, 8);
            if (x & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int k = utf8_seq(s + i, len - i);
        if (k < 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

int tk_utf8_next(const char *str, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        *cp = ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    return 4;
}

int tk_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

int tk_utf8_lossy_append(const unsigned char *s, size_t len, tk_buf *b)
{
    size_t i = 0;
    while (i < len) {
        int k = utf8_seq(s + i, len - i);
        if (k > 0) {
            if (tk_buf_append(b, s + i, (size_t)k))
                return -1;
            i += (size_t)k;
        } else {
            if (tk_buf_append(b, "\xEF\xBF\xBD", 3))
                return -1;
            i += (size_t)-k;
        }
    }
    return 0;
}

bool tk_is_whitespace(uint32_t cp)
{
    /* Unicode White_Space, as Rust's char::is_whitespace */
    if (cp <= 0x20)
        return cp == ' ' || (cp >= 0x09 && cp <= 0x0D);
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool tk_is_word_char(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D || (cp >= 0x24B6 && cp <= 0x24E9))
        return true;
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}
