/* Pre-tokenizers of tokenizer.json: Sequence, Split (regex or literal pattern, the five
 * delimiter behaviours, invert), ByteLevel (optional prefix space, the GPT-2 regex, the
 * bytes_to_unicode mapping), Metaspace (replacement character, prepend_scheme, split),
 * Digits, Whitespace and WhitespaceSplit. Splitting follows tokenizers'
 * NormalizedString::split: the pattern yields (range, is_match) runs covering the piece,
 * the behaviour merges or drops them, and empty pieces disappear. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* bytes_to_unicode: printable Latin-1 bytes map to themselves, the others to 256+n. */
const uint16_t tk_byte_to_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79,
    80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

int tk_cp_to_byte(uint32_t cp)
{
    static int16_t inv[324];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        int16_t t[324];
        for (int i = 0; i < 324; i++)
            t[i] = -1;
        for (int b = 0; b < 256; b++)
            t[tk_byte_to_cp[b]] = (int16_t)b;
        memcpy(inv, t, sizeof t);
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    return cp < 324 ? inv[cp] : -1;
}

static int compile_into(tk_pretok *p, const char *pat, bool literal, const char *what, ft_err *err)
{
    char eb[300];
    p->re = tk_regex_compile(pat, literal, eb, sizeof eb);
    if (!p->re)
        return ft_fail(err, "pre-tokenizer %s: pattern /%s/: %s", what, pat, eb);
    return 0;
}

int tk_pretok_parse(tk_pretok *p, const void *json, ft_err *err)
{
    const json_t *j = json;
    memset(p, 0, sizeof *p);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (!type)
        return ft_fail(err, "pre-tokenizer: missing 'type'");
    if (!strcmp(type, "Sequence")) {
        p->type = TK_PRE_SEQUENCE;
        json_t *arr = json_object_get(j, "pretokenizers");
        if (!json_is_array(arr))
            return ft_fail(err, "pre-tokenizer Sequence: 'pretokenizers' must be an array");
        p->subs = calloc(json_array_size(arr) + 1, sizeof *p->subs);
        if (!p->subs)
            return ft_fail(err, "pre-tokenizer: out of memory");
        for (size_t i = 0; i < json_array_size(arr); i++) {
            if (tk_pretok_parse(&p->subs[i], json_array_get(arr, i), err))
                return -1;
            p->nsubs++;
        }
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = TK_PRE_BYTELEVEL;
        p->add_prefix_space = json_is_true(json_object_get(j, "add_prefix_space"));
        json_t *ur = json_object_get(j, "use_regex");
        p->use_regex = ur ? json_is_true(ur) : true;
        if (p->use_regex && compile_into(p, GPT2_PATTERN, false, "ByteLevel", err))
            return -1;
    } else if (!strcmp(type, "Split")) {
        p->type = TK_PRE_SPLIT;
        json_t *pat = json_object_get(j, "pattern");
        json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
        if (json_is_string(s)) {
            if (compile_into(p, json_string_value(s), true, "Split", err))
                return -1;
        } else if (json_is_string(r)) {
            if (compile_into(p, json_string_value(r), false, "Split", err))
                return -1;
        } else {
            return ft_fail(err, "pre-tokenizer Split: 'pattern' must be {\"String\": ...} or "
                                "{\"Regex\": ...}");
        }
        const char *b = json_string_value(json_object_get(j, "behavior"));
        if (!b)
            return ft_fail(err, "pre-tokenizer Split: missing 'behavior'");
        if (!strcmp(b, "Removed"))
            p->behavior = TK_SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated"))
            p->behavior = TK_SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious"))
            p->behavior = TK_SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext"))
            p->behavior = TK_SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous"))
            p->behavior = TK_SPLIT_CONTIGUOUS;
        else
            return ft_fail(err, "pre-tokenizer Split: unknown behavior '%s'", b);
        p->invert = json_is_true(json_object_get(j, "invert"));
    } else if (!strcmp(type, "Metaspace")) {
        p->type = TK_PRE_METASPACE;
        const char *r = json_string_value(json_object_get(j, "replacement"));
        if (!r)
            r = "\xE2\x96\x81";
        uint32_t cp;
        size_t rl = strlen(r);
        if (rl == 0 || rl > 4 || (size_t)tk_utf8_next(r, &cp) != rl)
            return ft_fail(err, "pre-tokenizer Metaspace: 'replacement' must be one character");
        memcpy(p->replacement, r, rl);
        p->replacement_len = rl;
        const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
        if (ps) {
            if (!strcmp(ps, "always"))
                p->prepend = TK_PREPEND_ALWAYS;
            else if (!strcmp(ps, "first"))
                p->prepend = TK_PREPEND_FIRST;
            else if (!strcmp(ps, "never"))
                p->prepend = TK_PREPEND_NEVER;
            else
                return ft_fail(err, "pre-tokenizer Metaspace: unknown prepend_scheme '%s'", ps);
        } else {
            json_t *aps = json_object_get(j, "add_prefix_space");
            p->prepend = (!aps || json_is_true(aps)) ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
        }
        json_t *sp = json_object_get(j, "split");
        p->split = sp ? json_is_true(sp) : true;
    } else if (!strcmp(type, "Digits")) {
        p->type = TK_PRE_SPLIT;
        p->individual_digits = json_is_true(json_object_get(j, "individual_digits"));
        p->behavior = p->individual_digits ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS;
        if (compile_into(p, "\\p{N}", false, "Digits", err))
            return -1;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->type = TK_PRE_SPLIT;
        p->behavior = TK_SPLIT_REMOVED;
        if (compile_into(p, "\\s", false, "WhitespaceSplit", err))
            return -1;
    } else if (!strcmp(type, "Whitespace")) {
        p->type = TK_PRE_SPLIT;
        p->behavior = TK_SPLIT_REMOVED;
        p->invert = true;
        if (compile_into(p, "\\w+|[^\\w\\s]+", false, "Whitespace", err))
            return -1;
    } else {
        return ft_fail(err, "pre-tokenizer: unsupported type '%s'", type);
    }
    return 0;
}

void tk_pretok_free(tk_pretok *p)
{
    for (size_t i = 0; i < p->nsubs; i++)
        tk_pretok_free(&p->subs[i]);
    free(p->subs);
    if (p->re)
        pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

typedef struct mark {
    size_t s, e;
    int m;
} mark;

static int mark_push(tk_buf *b, size_t s, size_t e, int m)
{
    mark k = {s, e, m};
    return tk_buf_append(b, &k, sizeof k);
}

/* Applies the delimiter behaviour to marks (in place) and pushes the non-empty results,
 * relative to piece pc, onto out. */
static int emit_marks(mark *mk, size_t n, tk_split_behavior beh, const tk_piece *pc,
                      tk_pieces *out)
{
    size_t k = 0; /* number of result ranges kept in mk[0..k) */
    if (beh == TK_SPLIT_MERGED_NEXT) {
        /* fold from the end: a match joins the range after it */
        int prev = 0;
        size_t w = n; /* results written downward into mk[w..n) */
        for (size_t i = n; i-- > 0;) {
            mark cur = mk[i];
            if (cur.m && !prev && w < n)
                mk[w].s = cur.s;
            else
                mk[--w] = (mark){cur.s, cur.e, 0};
            prev = cur.m;
        }
        memmove(mk, mk + w, (n - w) * sizeof *mk);
        k = n - w;
    } else {
        int prev = 0;
        for (size_t i = 0; i < n; i++) {
            mark cur = mk[i];
            switch (beh) {
            case TK_SPLIT_ISOLATED:
                mk[k++] = (mark){cur.s, cur.e, 0};
                break;
            case TK_SPLIT_REMOVED:
                if (!cur.m)
                    mk[k++] = cur;
                break;
            case TK_SPLIT_CONTIGUOUS:
                if (cur.m == prev && k > 0)
                    mk[k - 1].e = cur.e;
                else
                    mk[k++] = (mark){cur.s, cur.e, 0};
                break;
            case TK_SPLIT_MERGED_PREV:
                if (cur.m && !prev && k > 0)
                    mk[k - 1].e = cur.e;
                else
                    mk[k++] = (mark){cur.s, cur.e, 0};
                break;
            default:
                break;
            }
            prev = cur.m;
        }
    }
    for (size_t i = 0; i < k; i++)
        if (mk[i].e > mk[i].s &&
            tk_pieces_push(out, pc->off + mk[i].s, mk[i].e - mk[i].s, -1, pc->first && mk[i].s == 0))
            return -1;
    return 0;
}

int tk_split_regex(const pcre2_code *re, tk_split_behavior behavior, bool invert, tk_work *w,
                   const tk_pieces *in, tk_pieces *out, ft_err *err)
{
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        const tk_piece *pc = &in->p[i];
        if (pc->id >= 0) {
            if (tk_pieces_push(out, pc->off, pc->len, pc->id, pc->first))
                return ft_fail(err, "pre-tokenizer: out of memory");
            continue;
        }
        const char *s = w->arena.data + pc->off;
        size_t len = pc->len, pos = 0, prev = 0;
        w->tmp.n = 0;
        while (pos <= len) {
            int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, w->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return ft_fail(err, "pre-tokenizer: regex match failed: %s", (char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            size_t ms = ov[0], me = ov[1];
            if (ms != prev && mark_push(&w->tmp, prev, ms, invert))
                return ft_fail(err, "pre-tokenizer: out of memory");
            if (mark_push(&w->tmp, ms, me, !invert))
                return ft_fail(err, "pre-tokenizer: out of memory");
            prev = me;
            if (me == ms) {
                if (me >= len)
                    break;
                uint32_t cp;
                pos = me + (size_t)tk_utf8_next(s + me, &cp);
            } else {
                pos = me;
            }
        }
        if (prev != len && mark_push(&w->tmp, prev, len, invert))
            return ft_fail(err, "pre-tokenizer: out of memory");
        if (emit_marks((mark *)w->tmp.data, w->tmp.n / sizeof(mark), behavior, pc, out))
            return ft_fail(err, "pre-tokenizer: out of memory");
    }
    return 0;
}

static void swap_lists(tk_work *w)
{
    tk_pieces t = w->a;
    w->a = w->b;
    w->b = t;
}

static int byte_level(const tk_pretok *p, tk_work *w, ft_err *err)
{
    if (p->add_prefix_space) {
        for (size_t i = 0; i < w->a.n; i++) {
            tk_piece *pc = &w->a.p[i];
            if (pc->id >= 0 || (pc->len > 0 && w->arena.data[pc->off] == ' '))
                continue;
            if (pc->len == 0)
                continue;
            if (tk_buf_reserve(&w->arena, pc->len + 1))
                return ft_fail(err, "pre-tokenizer: out of memory");
            size_t off = w->arena.n;
            w->arena.data[off] = ' ';
            memcpy(w->arena.data + off + 1, w->arena.data + pc->off, pc->len);
            w->arena.n += pc->len + 1;
            pc->off = off;
            pc->len += 1;
        }
    }
    if (p->use_regex) {
        if (tk_split_regex(p->re, TK_SPLIT_ISOLATED, false, w, &w->a, &w->b, err))
            return -1;
        swap_lists(w);
    }
    /* map every byte to its printable stand-in (at most 2 UTF-8 bytes each) */
    for (size_t i = 0; i < w->a.n; i++) {
        tk_piece *pc = &w->a.p[i];
        if (pc->id >= 0)
            continue;
        if (tk_buf_reserve(&w->arena, pc->len * 2))
            return ft_fail(err, "pre-tokenizer: out of memory");
        const unsigned char *src = (const unsigned char *)w->arena.data + pc->off;
        char *dst = w->arena.data + w->arena.n, *d = dst;
        for (size_t k = 0; k < pc->len; k++) {
            uint32_t cp = tk_byte_to_cp[src[k]];
            if (cp < 0x80) {
                *d++ = (char)cp;
            } else {
                *d++ = (char)(0xC0 | (cp >> 6));
                *d++ = (char)(0x80 | (cp & 0x3F));
            }
        }
        pc->off = w->arena.n;
        pc->len = (size_t)(d - dst);
        w->arena.n += pc->len;
    }
    return 0;
}

static int metaspace(const tk_pretok *p, tk_work *w, ft_err *err)
{
    const char *rep = p->replacement;
    size_t rl = p->replacement_len;
    w->b.n = 0;
    for (size_t i = 0; i < w->a.n; i++) {
        tk_piece pc = w->a.p[i];
        if (pc.id >= 0 || pc.len == 0) {
            if (pc.id >= 0 && tk_pieces_push(&w->b, pc.off, pc.len, pc.id, pc.first))
                return ft_fail(err, "pre-tokenizer: out of memory");
            continue;
        }
        size_t spaces = 0;
        for (size_t k = 0; k < pc.len; k++)
            spaces += w->arena.data[pc.off + k] == ' ';
        if (tk_buf_reserve(&w->arena, pc.len + spaces * rl + rl))
            return ft_fail(err, "pre-tokenizer: out of memory");
        const char *src = w->arena.data + pc.off;
        char *dst = w->arena.data + w->arena.n, *d = dst;
        bool starts = src[0] == ' ' || (pc.len >= rl && memcmp(src, rep, rl) == 0);
        if (!starts && (p->prepend == TK_PREPEND_ALWAYS || (p->prepend == TK_PREPEND_FIRST && pc.first))) {
            memcpy(d, rep, rl);
            d += rl;
        }
        for (size_t k = 0; k < pc.len; k++) {
            if (src[k] == ' ') {
                memcpy(d, rep, rl);
                d += rl;
            } else {
                *d++ = src[k];
            }
        }
        tk_piece np = {w->arena.n, (size_t)(d - dst), -1, pc.first};
        w->arena.n += np.len;
        if (!p->split) {
            if (tk_pieces_push(&w->b, np.off, np.len, -1, np.first))
                return ft_fail(err, "pre-tokenizer: out of memory");
            continue;
        }
        /* each replacement character is a match; MergedWithNext */
        const char *s = w->arena.data + np.off;
        w->tmp.n = 0;
        size_t prev = 0;
        for (size_t k = 0; k + rl <= np.len;) {
            if (memcmp(s + k, rep, rl) == 0) {
                if (k != prev && mark_push(&w->tmp, prev, k, 0))
                    return ft_fail(err, "pre-tokenizer: out of memory");
                if (mark_push(&w->tmp, k, k + rl, 1))
                    return ft_fail(err, "pre-tokenizer: out of memory");
                k += rl;
                prev = k;
            } else {
                uint32_t cp;
                k += (size_t)tk_utf8_next(s + k, &cp);
            }
        }
        if (prev != np.len && mark_push(&w->tmp, prev, np.len, 0))
            return ft_fail(err, "pre-tokenizer: out of memory");
        if (emit_marks((mark *)w->tmp.data, w->tmp.n / sizeof(mark), TK_SPLIT_MERGED_NEXT, &np,
                       &w->b))
            return ft_fail(err, "pre-tokenizer: out of memory");
    }
    swap_lists(w);
    return 0;
}

int tk_pretokenize(const tk_pretok *p, tk_work *w, ft_err *err)
{
    switch (p->type) {
    case TK_PRE_SEQUENCE:
        for (size_t i = 0; i < p->nsubs; i++)
            if (tk_pretokenize(&p->subs[i], w, err))
                return -1;
        return 0;
    case TK_PRE_BYTELEVEL:
        return byte_level(p, w, err);
    case TK_PRE_SPLIT:
        if (tk_split_regex(p->re, p->behavior, p->invert, w, &w->a, &w->b, err))
            return -1;
        swap_lists(w);
        return 0;
    case TK_PRE_METASPACE:
        return metaspace(p, w, err);
    default:
        return ft_fail(err, "pre-tokenizer: internal error");
    }
}
