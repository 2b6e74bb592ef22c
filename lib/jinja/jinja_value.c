/* Values of the interpreter, as Python holds them for a template: arenas, strings,
 * lists, dicts; str() / repr() / json.dumps() written exactly as Python writes them. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_internal.h"

/* ---- arenas -------------------------------------------------------------------------- */

struct ja_chunk {
    ja_chunk *next;
    size_t size, used;
    max_align_t data[];
};

void *ja_alloc(jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    ja_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > 65536 ? n : 65536;
        if (a->limit && a->used + size + sizeof *c > a->limit)
            ja_fail(a, 0, 0, "template memory limit exceeded (%zu bytes)", a->limit);
        c = malloc(sizeof *c + size);
        if (!c)
            ja_fail(a, 0, 0, "out of memory");
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->used += size + sizeof *c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strndup(jarena *a, const char *s, size_t n)
{
    char *p = ja_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ja_free(jarena *a)
{
    ja_chunk *c = a->head;
    while (c) {
        ja_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void ja_fail(jarena *a, int line, int col, const char *fmt, ...)
{
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0 && col > 0)
        ft_fail(a->err, "line %d, column %d: %s", line, col, msg);
    else if (line > 0)
        ft_fail(a->err, "line %d: %s", line, msg);
    else
        ft_fail(a->err, "%s", msg);
    longjmp(*a->jb, 1);
}

void ja_fail_raw(jarena *a, const char *msg)
{
    ft_fail(a->err, "%s", msg);
    longjmp(*a->jb, 1);
}

/* ---- buffers ------------------------------------------------------------------------- */

void jb_addn(jbuf *b, const char *s, size_t n)
{
    if (n == 0 && b->s)
        return;
    if (b->limit && b->n + n > b->limit)
        ja_fail(b->a, 0, 0, "template output limit exceeded (%zu bytes)", b->limit);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = ja_alloc(b->a, cap);
        if (b->n)
            memcpy(p, b->s, b->n);
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void jb_add(jbuf *b, const char *s) { jb_addn(b, s, strlen(s)); }
void jb_addc(jbuf *b, char c) { jb_addn(b, &c, 1); }

void jb_addf(jbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    jb_addn(b, tmp, k < (int)sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

jv jb_value(jbuf *b) { return jv_str(b->a, b->s ? b->s : "", b->n); }

/* ---- constructors -------------------------------------------------------------------- */

jv jv_str(jarena *a, const char *s, size_t n)
{
    jstr *p = ja_alloc(a, sizeof *p + n + 1);
    p->n = n;
    if (n)
        memcpy(p->s, s, n);
    p->s[n] = 0;
    jv v = {.t = JV_STR};
    v.s = p;
    return v;
}

jv jv_cstr(jarena *a, const char *s) { return jv_str(a, s, strlen(s)); }

jv jv_list(jarena *a, size_t n)
{
    jlist *l = ja_alloc(a, sizeof *l);
    if (n > ((size_t)1 << 40) / sizeof(jv))
        ja_fail(a, 0, 0, "template memory limit exceeded (a list of %zu items)", n);
    l->n = n;
    l->v = ja_alloc(a, (n ? n : 1) * sizeof(jv));
    jv v = {.t = JV_LIST};
    v.l = l;
    return v;
}

jv jv_dict(jarena *a)
{
    jv v = {.t = JV_DICT};
    v.d = ja_alloc(a, sizeof(jdict));
    return v;
}

jv *jd_get(const jdict *d, jv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], k))
            return &d->v[i];
    return NULL;
}

jv *jd_gets(const jdict *d, const char *k)
{
    size_t n = strlen(k);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].s->n == n && memcmp(d->k[i].s->s, k, n) == 0)
            return &d->v[i];
    return NULL;
}

void jd_set(jarena *a, jdict *d, jv k, jv v)
{
    jv *p = jd_get(d, k);
    if (p) {
        *p = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        jv *nk = ja_alloc(a, cap * sizeof *nk), *nv = ja_alloc(a, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

jv jv_from_json(jarena *a, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jv d = jv_dict(a);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v)
            jd_set(a, d.d, jv_cstr(a, k), jv_from_json(a, v));
        return d;
    }
    case JSON_ARRAY: {
        jv l = jv_list(a, json_array_size(j));
        for (size_t i = 0; i < l.l->n; i++)
            l.l->v[i] = jv_from_json(a, json_array_get(j, i));
        return l;
    }
    case JSON_STRING: return jv_str(a, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    case JSON_NULL: break;
    }
    return jv_none();
}

/* ---- truth, equality, order ---------------------------------------------------------- */

bool jv_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.b;
    case JV_INT: return v.i != 0;
    case JV_FLOAT: return v.f != 0;
    case JV_STR: return v.s->n > 0;
    case JV_LIST: return v.l->view == 'g' || v.l->n > 0;
    case JV_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool numeric(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num(jv v) { return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : v.b; }

bool jv_equal(jv a, jv b)
{
    if (numeric(a) && numeric(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return (a.t == JV_INT ? a.i : a.b) == (b.t == JV_INT ? b.i : b.b);
        return num(a) == num(b);
    }
    if (a.t != b.t)
        return false;
    switch (a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR: return a.s->n == b.s->n && memcmp(a.s->s, b.s->s, a.s->n) == 0;
    case JV_LIST:
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n)
            return false;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_equal(a.l->v[i], b.l->v[i]))
                return false;
        return true;
    case JV_DICT:
        if (a.d->n != b.d->n)
            return false;
        for (size_t i = 0; i < a.d->n; i++) {
            jv *o = jd_get(b.d, a.d->k[i]);
            if (!o || !jv_equal(a.d->v[i], *o))
                return false;
        }
        return true;
    case JV_NS: return a.d == b.d;
    case JV_MACRO: return a.m == b.m;
    case JV_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

int jv_compare(jv a, jv b, bool *ok)
{
    *ok = true;
    if (numeric(a) && numeric(b)) {
        double x = num(a), y = num(b);
        if (a.t == JV_INT && b.t == JV_INT)
            return (a.i > b.i) - (a.i < b.i);
        return (x > y) - (x < y);
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        /* UTF-8 byte order is code point order, as Python compares str */
        size_t n = a.s->n < b.s->n ? a.s->n : b.s->n;
        int c = memcmp(a.s->s, b.s->s, n);
        if (c)
            return c;
        return (a.s->n > b.s->n) - (a.s->n < b.s->n);
    }
    if (a.t == JV_LIST && b.t == JV_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_equal(a.l->v[i], b.l->v[i]))
                continue;
            return jv_compare(a.l->v[i], b.l->v[i], ok);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    *ok = false;
    return 0;
}

const char *jv_type_name(jv v)
{
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST:
        return v.l->view == 'g' ? "generator" : v.l->view == 'k' ? "dict_keys"
             : v.l->view == 'v' ? "dict_values" : v.l->view == 'i' ? "dict_items"
             : v.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    default: return "function";
    }
}

/* ---- UTF-8 --------------------------------------------------------------------------- */

uint32_t *ju_decode(jarena *a, const char *s, size_t len, size_t *n)
{
    uint32_t *cp = ja_alloc(a, (len + 1) * sizeof *cp);
    const unsigned char *p = (const unsigned char *)s, *e = p + len;
    size_t k = 0;
    while (p < e) {
        unsigned c = *p;
        int l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (p + l > e)
            l = (int)(e - p);
        uint32_t v = l == 1 ? c : l == 2 ? c & 0x1F : l == 3 ? c & 0x0F : c & 0x07;
        for (int i = 1; i < l; i++)
            v = (v << 6) | (p[i] & 0x3F);
        cp[k++] = v;
        p += l;
    }
    *n = k;
    return cp;
}

void ju_encode(jbuf *b, uint32_t c)
{
    char t[4];
    int n;
    if (c < 0x80) { t[0] = (char)c; n = 1; }
    else if (c < 0x800) { t[0] = (char)(0xC0 | c >> 6); t[1] = (char)(0x80 | (c & 0x3F)); n = 2; }
    else if (c < 0x10000) {
        t[0] = (char)(0xE0 | c >> 12); t[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        t[2] = (char)(0x80 | (c & 0x3F)); n = 3;
    } else {
        t[0] = (char)(0xF0 | c >> 18); t[1] = (char)(0x80 | ((c >> 12) & 0x3F));
        t[2] = (char)(0x80 | ((c >> 6) & 0x3F)); t[3] = (char)(0x80 | (c & 0x3F)); n = 4;
    }
    jb_addn(b, t, (size_t)n);
}

bool ju_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- str, repr, json ------------------------------------------------------------------ */

void jv_write_float(jbuf *b, double f)
{
    if (isnan(f)) { jb_add(b, "nan"); return; }
    if (isinf(f)) { jb_add(b, f < 0 ? "-inf" : "inf"); return; }
    /* the shortest digits that read back as f, then Python's repr layout: positional
     * for exponents -4 <= e < 16, else d.ddde+XX */
    char t[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, f);
        if (strtod(t, NULL) == f)
            break;
    }
    char digits[32];
    int nd = 0, neg = t[0] == '-';
    const char *q = t + neg;
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9')
            digits[nd++] = *q;
    int e = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    if (neg)
        jb_addc(b, '-');
    if (e >= -4 && e < 16) {
        if (e < 0) {
            jb_add(b, "0.");
            for (int i = 0; i < -e - 1; i++)
                jb_addc(b, '0');
            jb_addn(b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= e; i++)
                jb_addc(b, i < nd ? digits[i] : '0');
            jb_addc(b, '.');
            if (nd > e + 1)
                jb_addn(b, digits + e + 1, (size_t)(nd - e - 1));
            else
                jb_addc(b, '0');
        }
    } else {
        jb_addc(b, digits[0]);
        if (nd > 1) {
            jb_addc(b, '.');
            jb_addn(b, digits + 1, (size_t)(nd - 1));
        }
        jb_addf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* repr(str): single quotes unless the text has ' and no "; escapes as Python's. */
static void write_str_repr(jbuf *b, const jstr *s)
{
    bool sq = memchr(s->s, '\'', s->n) != NULL, dq = memchr(s->s, '"', s->n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jb_addc(b, q);
    size_t n;
    uint32_t *cp = ju_decode(b->a, s->s, s->n, &n);
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[i];
        if (c == (uint32_t)q || c == '\\') { jb_addc(b, '\\'); jb_addc(b, (char)c); }
        else if (c == '\n') jb_add(b, "\\n");
        else if (c == '\r') jb_add(b, "\\r");
        else if (c == '\t') jb_add(b, "\\t");
        else if (c < 0x20 || c == 0x7F) jb_addf(b, "\\x%02x", c);
        else if (c >= 0x80 && c < 0xA0) jb_addf(b, "\\x%02x", c);
        else ju_encode(b, c);
    }
    jb_addc(b, q);
}

void jv_write_repr(jbuf *b, jv v)
{
    switch (v.t) {
    case JV_STR: write_str_repr(b, v.s); return;
    case JV_LIST:
        if (v.l->view == 'g')
            ja_fail(b->a, 0, 0, "cannot render the generator a filter returns (select, map, "
                                "unique, items, reverse ...): add |list");
        if (v.l->view)
            jb_add(b, v.l->view == 'k' ? "dict_keys(" : v.l->view == 'v' ? "dict_values("
                                                                        : "dict_items(");
        jb_addc(b, v.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i)
                jb_add(b, ", ");
            jv_write_repr(b, v.l->v[i]);
        }
        if (v.l->tuple && v.l->n == 1)
            jb_addc(b, ',');
        jb_addc(b, v.l->tuple ? ')' : ']');
        if (v.l->view)
            jb_addc(b, ')');
        return;
    case JV_DICT:
        jb_addc(b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i)
                jb_add(b, ", ");
            jv_write_repr(b, v.d->k[i]);
            jb_add(b, ": ");
            jv_write_repr(b, v.d->v[i]);
        }
        jb_addc(b, '}');
        return;
    default: jv_write_str(b, v);
    }
}

void jv_write_str(jbuf *b, jv v)
{
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_add(b, "None"); return;
    case JV_BOOL: jb_add(b, v.b ? "True" : "False"); return;
    case JV_INT: jb_addf(b, "%lld", (long long)v.i); return;
    case JV_FLOAT: jv_write_float(b, v.f); return;
    case JV_STR: jb_addn(b, v.s->s, v.s->n); return;
    case JV_LIST: case JV_DICT: jv_write_repr(b, v); return;
    case JV_NS: jb_add(b, "<Namespace>"); return;
    case JV_MACRO: jb_add(b, "<Macro>"); return;
    default: jb_add(b, "<function>"); return;
    }
}

jv jv_to_str(jarena *a, jv v)
{
    if (v.t == JV_STR)
        return v;
    jbuf b = {.a = a};
    jv_write_str(&b, v);
    return jb_value(&b);
}

/* json.dumps(ensure_ascii=False) string escaping. */
static void write_json_str(jbuf *b, const char *s, size_t n)
{
    jb_addc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': jb_add(b, "\\\""); break;
        case '\\': jb_add(b, "\\\\"); break;
        case '\n': jb_add(b, "\\n"); break;
        case '\r': jb_add(b, "\\r"); break;
        case '\t': jb_add(b, "\\t"); break;
        case '\b': jb_add(b, "\\b"); break;
        case '\f': jb_add(b, "\\f"); break;
        default:
            if (c < 0x20)
                jb_addf(b, "\\u%04x", c);
            else
                jb_addc(b, (char)c);
        }
    }
    jb_addc(b, '"');
}

static void json_newline(jbuf *b, int indent, const char *istr, int depth)
{
    jb_addc(b, '\n');
    for (int i = 0; i < depth; i++) {
        if (istr)
            jb_add(b, istr);
        else
            for (int k = 0; k < indent; k++)
                jb_addc(b, ' ');
    }
}

static int key_order(const void *x, const void *y)
{
    const jv *a = x, *b = y;
    bool ok;
    return jv_compare(*a, *b, &ok);
}

void jv_write_json(jbuf *b, jv v, int indent, const char *istr, bool sort_keys, int depth)
{
    bool pretty = indent >= 0 || istr;
    if (depth > 200)
        ja_fail(b->a, 0, 0, "tojson: value nested too deeply");
    switch (v.t) {
    case JV_NONE: jb_add(b, "null"); return;
    case JV_BOOL: jb_add(b, v.b ? "true" : "false"); return;
    case JV_INT: jb_addf(b, "%lld", (long long)v.i); return;
    case JV_FLOAT:
        if (isnan(v.f)) jb_add(b, "NaN");
        else if (isinf(v.f)) jb_add(b, v.f < 0 ? "-Infinity" : "Infinity");
        else jv_write_float(b, v.f);
        return;
    case JV_STR: write_json_str(b, v.s->s, v.s->n); return;
    case JV_LIST:
        if (v.l->view)
            ja_fail(b->a, 0, 0, "tojson: Object of type %s is not JSON serializable",
                    v.l->view == 'g' ? "generator" : v.l->view == 'k' ? "dict_keys"
                    : v.l->view == 'v' ? "dict_values" : "dict_items");
        if (v.l->n == 0) { jb_add(b, "[]"); return; }
        jb_addc(b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i)
                jb_add(b, pretty ? "," : ", ");
            if (pretty)
                json_newline(b, indent, istr, depth + 1);
            jv_write_json(b, v.l->v[i], indent, istr, sort_keys, depth + 1);
        }
        if (pretty)
            json_newline(b, indent, istr, depth);
        jb_addc(b, ']');
        return;
    case JV_DICT: {
        if (v.d->n == 0) { jb_add(b, "{}"); return; }
        size_t n = v.d->n;
        jv *keys = v.d->k;
        if (sort_keys) {
            keys = ja_alloc(b->a, n * sizeof *keys);
            memcpy(keys, v.d->k, n * sizeof *keys);
            qsort(keys, n, sizeof *keys, key_order);
        }
        jb_addc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i)
                jb_add(b, pretty ? "," : ", ");
            if (pretty)
                json_newline(b, indent, istr, depth + 1);
            jv k = keys[i];
            /* json.dumps turns int, float, bool and None keys into strings */
            if (k.t == JV_STR) {
                write_json_str(b, k.s->s, k.s->n);
            } else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
                jbuf t = {.a = b->a};
                jv_write_json(&t, k, -1, NULL, false, depth + 1);
                write_json_str(b, t.s, t.n);
            } else {
                ja_fail(b->a, 0, 0, "tojson: keys must be str, int, float, bool or None, "
                                    "not %s", jv_type_name(k));
            }
            jb_add(b, ": ");
            jv_write_json(b, *jd_get(v.d, k), indent, istr, sort_keys, depth + 1);
        }
        if (pretty)
            json_newline(b, indent, istr, depth);
        jb_addc(b, '}');
        return;
    }
    default:
        ja_fail(b->a, 0, 0, "tojson: Object of type %s is not JSON serializable",
                jv_type_name(v));
    }
}
