/* The builtins templates use, with jinja2's and Python's semantics: filters, tests,
 * attribute and item lookup (jinja2's Environment.getattr / getitem), the methods of
 * str, dict and list that chat templates call, and the globals transformers gives
 * (range, namespace, dict, raise_exception, strftime_now). A name not here is an error
 * saying so. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "jinja/jinja_internal.h"

#define A (jx_arena(x))

static jv func(jctx *x, const char *name, jv self)
{
    jfunc *f = ja_alloc(A, sizeof *f);
    f->name = name;
    f->self = self;
    jv v = {.t = JV_FUNC};
    v.fn = f;
    return v;
}

static jv undef_attr(jctx *x, jv obj, const char *name)
{
    size_t n = strlen(name) + 64;
    char *why = ja_alloc(A, n);
    snprintf(why, n, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
    return jv_undef(why);
}

/* ---- iteration, length ---------------------------------------------------------------- */

jlist *jb_iter(jctx *x, const jnode *at, jv v)
{
    switch (v.t) {
    case JV_LIST: return v.l;
    case JV_UNDEF: {
        jv l = jv_list(A, 0);
        return l.l;
    }
    case JV_DICT: {
        jv l = jv_list(A, v.d->n);
        memcpy(l.l->v, v.d->k, v.d->n * sizeof(jv));
        return l.l;
    }
    case JV_STR: {
        size_t n;
        uint32_t *cp = ju_decode(A, v.s->s, v.s->n, &n);
        jv l = jv_list(A, n);
        for (size_t i = 0; i < n; i++) {
            jbuf b = {.a = A};
            ju_encode(&b, cp[i]);
            l.l->v[i] = jb_value(&b);
        }
        return l.l;
    }
    default:
        jx_fail(x, at, "'%s' object is not iterable", jv_type_name(v));
    }
}

static size_t cp_count(const jstr *s)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += ((unsigned char)s->s[i] & 0xC0) != 0x80;
    return n;
}

int64_t jb_length(jctx *x, const jnode *at, jv v)
{
    switch (v.t) {
    case JV_UNDEF: return 0;
    case JV_STR: return (int64_t)cp_count(v.s);
    case JV_LIST:
        if (v.l->view == 'g')
            break;
        return (int64_t)v.l->n;
    case JV_DICT: case JV_NS: return (int64_t)v.d->n;
    default: break;
    }
    jx_fail(x, at, "object of type '%s' has no len()", jv_type_name(v));
}

/* ---- strings -------------------------------------------------------------------------- */

static jv str_of(jctx *x, jv v) { return jv_to_str(A, v); }

static bool in_set(uint32_t c, const uint32_t *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == c)
            return true;
    return false;
}

/* str.strip / lstrip / rstrip: which = 3 both, 1 left, 2 right; chars: NONE for space. */
static jv strip(jctx *x, const jnode *at, jv s, jv chars, int which)
{
    s = str_of(x, s);
    if (chars.t != JV_NONE && chars.t != JV_UNDEF && chars.t != JV_STR)
        jx_fail(x, at, "strip arg must be None or str");
    size_t n, nc = 0;
    uint32_t *cp = ju_decode(A, s.s->s, s.s->n, &n), *set = NULL;
    if (chars.t == JV_STR)
        set = ju_decode(A, chars.s->s, chars.s->n, &nc);
    size_t lo = 0, hi = n;
#define STRIP_ME(c) (set ? in_set((c), set, nc) : ju_space(c))
    if (which & 1)
        while (lo < hi && STRIP_ME(cp[lo]))
            lo++;
    if (which & 2)
        while (hi > lo && STRIP_ME(cp[hi - 1]))
            hi--;
#undef STRIP_ME
    jbuf b = {.a = A};
    for (size_t i = lo; i < hi; i++)
        ju_encode(&b, cp[i]);
    return jb_value(&b);
}

/* case: 'u' upper, 'l' lower, 't' str.title, 'T' jinja2's title filter, 'c' capitalize */
static jv recase(jctx *x, jv s, char mode)
{
    s = str_of(x, s);
    size_t n;
    uint32_t *cp = ju_decode(A, s.s->s, s.s->n, &n);
    jbuf b = {.a = A};
    bool prev_cased = false;
    for (size_t i = 0; i < n; i++) {
        utf8proc_int32_t c = (utf8proc_int32_t)cp[i], r = c;
        bool cased = utf8proc_toupper(c) != c || utf8proc_tolower(c) != c;
        switch (mode) {
        case 'u': r = utf8proc_toupper(c); break;
        case 'l': r = utf8proc_tolower(c); break;
        case 'c': r = i == 0 ? utf8proc_toupper(c) : utf8proc_tolower(c); break;
        case 't': /* str.title(): words are runs of cased characters */
            r = prev_cased ? utf8proc_tolower(c) : utf8proc_toupper(c);
            prev_cased = cased;
            break;
        case 'T': { /* the title filter: words begin after - ( { [ < or whitespace */
            bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' ||
                       ju_space((uint32_t)c);
            r = sep ? c : (i == 0 || prev_cased) ? utf8proc_toupper(c) : utf8proc_tolower(c);
            prev_cased = sep;
            break;
        }
        }
        ju_encode(&b, (uint32_t)r);
    }
    return jb_value(&b);
}

static jv replace(jctx *x, const jnode *at, jv s, jv old, jv new_, jv count)
{
    s = str_of(x, s);
    if (old.t != JV_STR || new_.t != JV_STR)
        jx_fail(x, at, "replace() arguments must be strings");
    int64_t max = count.t == JV_INT ? count.i : -1;
    jbuf b = {.a = A};
    if (old.s->n == 0) { /* Python inserts new between every character */
        size_t n;
        uint32_t *cp = ju_decode(A, s.s->s, s.s->n, &n);
        int64_t done = 0;
        for (size_t i = 0; i <= n; i++) {
            if (max < 0 || done < max) {
                jb_addn(&b, new_.s->s, new_.s->n);
                done++;
            }
            if (i < n)
                ju_encode(&b, cp[i]);
        }
        return jb_value(&b);
    }
    const char *p = s.s->s, *e = p + s.s->n;
    int64_t done = 0;
    while (p < e) {
        const char *q = (max < 0 || done < max) ? memmem(p, (size_t)(e - p), old.s->s, old.s->n)
                                                : NULL;
        if (!q) {
            jb_addn(&b, p, (size_t)(e - p));
            break;
        }
        jb_addn(&b, p, (size_t)(q - p));
        jb_addn(&b, new_.s->s, new_.s->n);
        p = q + old.s->n;
        done++;
    }
    return jb_value(&b);
}

static jv split(jctx *x, const jnode *at, jv s, jv sep, jv maxsplit)
{
    s = str_of(x, s);
    int64_t max = maxsplit.t == JV_INT ? maxsplit.i : -1;
    jv *items = ja_alloc(A, (s.s->n + 2) * sizeof(jv));
    size_t k = 0;
    const char *p = s.s->s, *e = p + s.s->n;
    if (sep.t == JV_NONE || sep.t == JV_UNDEF) {
        size_t n;
        uint32_t *cp = ju_decode(A, p, s.s->n, &n);
        size_t i = 0;
        while (i < n) {
            while (i < n && ju_space(cp[i]))
                i++;
            if (i == n)
                break;
            jbuf b = {.a = A};
            if (max >= 0 && (int64_t)k >= max) {
                size_t j = n;
                while (j > i && ju_space(cp[j - 1]))
                    j--;
                for (; i < j; i++)
                    ju_encode(&b, cp[i]);
                items[k++] = jb_value(&b);
                break;
            }
            while (i < n && !ju_space(cp[i]))
                ju_encode(&b, cp[i++]);
            items[k++] = jb_value(&b);
        }
    } else {
        if (sep.t != JV_STR)
            jx_fail(x, at, "split() separator must be str or None");
        if (sep.s->n == 0)
            jx_fail(x, at, "empty separator");
        for (;;) {
            const char *q = (max < 0 || (int64_t)k < max)
                                ? memmem(p, (size_t)(e - p), sep.s->s, sep.s->n) : NULL;
            if (!q) {
                items[k++] = jv_str(A, p, (size_t)(e - p));
                break;
            }
            items[k++] = jv_str(A, p, (size_t)(q - p));
            p = q + sep.s->n;
        }
    }
    jv l = jv_list(A, k);
    memcpy(l.l->v, items, k * sizeof(jv));
    return l;
}

static bool affix(jctx *x, const jnode *at, jv s, jv what, bool end)
{
    if (s.t != JV_STR)
        jx_fail(x, at, "startswith / endswith on a %s", jv_type_name(s));
    if (what.t == JV_LIST && what.l->tuple) {
        for (size_t i = 0; i < what.l->n; i++)
            if (affix(x, at, s, what.l->v[i], end))
                return true;
        return false;
    }
    if (what.t != JV_STR)
        jx_fail(x, at, "startswith / endswith first arg must be str or a tuple of str, not %s",
                jv_type_name(what));
    if (what.s->n > s.s->n)
        return false;
    return memcmp(s.s->s + (end ? s.s->n - what.s->n : 0), what.s->s, what.s->n) == 0;
}

static jv join(jctx *x, const jnode *at, jv seq, jv sep, jv attribute)
{
    jlist *l = jb_iter(x, at, seq);
    jbuf b = {.a = A};
    for (size_t i = 0; i < l->n; i++) {
        if (i && sep.t == JV_STR)
            jb_addn(&b, sep.s->s, sep.s->n);
        jv v = l->v[i];
        if (attribute.t == JV_STR)
            v = jb_getattr(x, at, v, attribute.s->s);
        jv_write_str(&b, v);
    }
    return jb_value(&b);
}

/* ---- attributes and items ------------------------------------------------------------- */

static const char *const STR_METHODS[] = {
    "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower",
    "replace", "title", "capitalize", "find", "rfind", "count", "join", "isdigit",
    "isalpha", "isspace", "isalnum", "isupper", "islower", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const DICT_MUTATORS[] = {"pop", "popitem", "update", "clear",
                                            "setdefault", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
static const char *const LIST_MUTATORS[] = {"append", "extend", "insert", "pop", "remove",
                                            "sort", "reverse", "clear", NULL};

static bool listed(const char *const *names, const char *name)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name))
            return true;
    return false;
}

jv jb_getattr(jctx *x, const jnode *at, jv obj, const char *name)
{
    switch (obj.t) {
    case JV_STR:
        if (listed(STR_METHODS, name))
            return func(x, name, obj);
        break;
    case JV_DICT: {
        if (listed(DICT_METHODS, name))
            return func(x, name, obj);
        if (listed(DICT_MUTATORS, name))
            jx_fail(x, at, "unsupported: dict.%s (templates cannot change data; use "
                           "namespace())", name);
        jv *v = jd_gets(obj.d, name);
        if (v)
            return *v;
        break;
    }
    case JV_NS: {
        jv *v = jd_gets(obj.d, name);
        if (v)
            return *v;
        break;
    }
    case JV_LIST:
        if (listed(LIST_METHODS, name))
            return func(x, name, obj);
        if (listed(LIST_MUTATORS, name))
            jx_fail(x, at, "unsupported: list.%s (templates cannot change data; use "
                           "namespace() or list concatenation)", name);
        break;
    default: break;
    }
    return undef_attr(x, obj, name);
}

jv jb_getitem(jctx *x, const jnode *at, jv obj, jv key)
{
    if (obj.t == JV_LIST && obj.l->view)
        return jv_undef("that object is not subscriptable");
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = key.t == JV_INT ? key.i : key.b;
        if (obj.t == JV_LIST) {
            int64_t n = (int64_t)obj.l->n;
            if (i < 0)
                i += n;
            if (i >= 0 && i < n)
                return obj.l->v[i];
            return jv_undef("list index out of range");
        }
        size_t n;
        uint32_t *cp = ju_decode(A, obj.s->s, obj.s->n, &n);
        if (i < 0)
            i += (int64_t)n;
        if (i >= 0 && i < (int64_t)n) {
            jbuf b = {.a = A};
            ju_encode(&b, cp[i]);
            return jb_value(&b);
        }
        return jv_undef("string index out of range");
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        jv *v = jd_get(obj.d, key);
        if (v)
            return *v;
    }
    if (key.t == JV_STR)
        return jb_getattr(x, at, obj, key.s->s);
    return jv_undef("no such item");
}

/* ---- tests ---------------------------------------------------------------------------- */

static const char *const TESTS[] = {
    "defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
    "iterable", "sequence", "boolean", "true", "false", "equalto", "eq", "==", "ne", "!=",
    "lt", "<", "le", "<=", "gt", ">", "ge", ">=", "in", "odd", "even", "divisibleby",
    "sameas", "callable", "lower", "upper", "escaped", NULL};

bool jb_has_test(const char *name) { return listed(TESTS, name); }

bool jb_test(jctx *x, const jnode *at, const char *name, jv v, jv *args, int nargs)
{
    jv a0 = nargs > 0 ? args[0] : jv_undef("a test's missing argument");
#define IS(s) (!strcmp(name, s))
    if (IS("defined")) return v.t != JV_UNDEF;
    if (IS("undefined")) return v.t == JV_UNDEF;
    if (IS("none")) return v.t == JV_NONE;
    if (IS("string")) return v.t == JV_STR;
    if (IS("number")) return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
    if (IS("integer")) return v.t == JV_INT;
    if (IS("float")) return v.t == JV_FLOAT;
    if (IS("mapping")) return v.t == JV_DICT;
    if (IS("iterable")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR ||
                               v.t == JV_UNDEF;
    if (IS("sequence")) return v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR ||
                               v.t == JV_UNDEF;
    if (IS("boolean")) return v.t == JV_BOOL;
    if (IS("true")) return v.t == JV_BOOL && v.b;
    if (IS("false")) return v.t == JV_BOOL && !v.b;
    if (IS("callable")) return v.t == JV_MACRO || v.t == JV_FUNC;
    if (IS("escaped")) return false;
    if (IS("lower") || IS("upper")) {
        if (v.t != JV_STR)
            return false;
        jv r = recase(x, v, IS("lower") ? 'l' : 'u');
        return jv_equal(r, v) && !jv_equal(recase(x, v, IS("lower") ? 'u' : 'l'), v);
    }
    if (nargs < 1 && !IS("odd") && !IS("even"))
        jx_fail(x, at, "test '%s' needs an argument", name);
    if (IS("equalto") || IS("eq") || IS("==")) return jv_equal(v, a0);
    if (IS("ne") || IS("!=")) return !jv_equal(v, a0);
    if (IS("sameas")) {
        if (v.t != a0.t)
            return false;
        if (v.t == JV_NONE || v.t == JV_UNDEF) return true;
        if (v.t == JV_BOOL) return v.b == a0.b;
        if (v.t == JV_INT) return v.i == a0.i && v.i >= -5 && v.i <= 256;
        if (v.t == JV_LIST) return v.l == a0.l;
        if (v.t == JV_DICT || v.t == JV_NS) return v.d == a0.d;
        return false;
    }
    if (IS("in")) {
        if (a0.t == JV_STR && v.t == JV_STR)
            return v.s->n == 0 || memmem(a0.s->s, a0.s->n, v.s->s, v.s->n) != NULL;
        if (a0.t == JV_LIST) {
            for (size_t i = 0; i < a0.l->n; i++)
                if (jv_equal(a0.l->v[i], v))
                    return true;
            return false;
        }
        if (a0.t == JV_DICT)
            return jd_get(a0.d, v) != NULL;
        jx_fail(x, at, "test 'in': argument of type '%s' is not a container",
                jv_type_name(a0));
    }
    if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (v.t == JV_BOOL)
            v = jv_int(v.b);
        if (v.t != JV_INT)
            jx_fail(x, at, "test '%s' on a %s", name, jv_type_name(v));
        if (IS("odd")) return (v.i % 2) != 0;
        if (IS("even")) return (v.i % 2) == 0;
        if (a0.t != JV_INT || a0.i == 0)
            jx_fail(x, at, "divisibleby needs a non-zero integer");
        return v.i % a0.i == 0;
    }
    {
        bool ok;
        int c = jv_compare(v, a0, &ok);
        if (!ok)
            jx_fail(x, at, "test '%s': '%s' and '%s' cannot be ordered", name, jv_type_name(v),
                    jv_type_name(a0));
        if (IS("lt") || IS("<")) return c < 0;
        if (IS("le") || IS("<=")) return c <= 0;
        if (IS("gt") || IS(">")) return c > 0;
        if (IS("ge") || IS(">=")) return c >= 0;
    }
#undef IS
    jx_fail(x, at, "unsupported test '%s'", name);
}

/* ---- filters -------------------------------------------------------------------------- */

/* Keyword or positional argument k (position pos) of a filter; undefined when absent. */
static jv arg(jv *args, int nargs, const char **kw, jv *kwv, int nkw, int pos,
              const char *name)
{
    for (int i = 0; i < nkw; i++)
        if (!strcmp(kw[i], name))
            return kwv[i];
    return pos < nargs ? args[pos] : jv_undef(NULL);
}

static bool given(jv v) { return v.t != JV_UNDEF; }

/* For sorting: the key of an item, lower-cased strings unless case sensitive. */
typedef struct sort_item {
    jv key, val;
    size_t idx;
} sort_item;

static int sort_cmp_err;
static int sort_cmp(const void *p, const void *q)
{
    const sort_item *a = p, *b = q;
    bool ok;
    int c = jv_compare(a->key, b->key, &ok);
    if (!ok)
        sort_cmp_err = 1;
    if (c == 0)
        c = (a->idx > b->idx) - (a->idx < b->idx); /* stable, as Python's sort */
    return c;
}

static jv sort_key(jctx *x, jv v, bool case_sensitive)
{
    if (v.t == JV_STR && !case_sensitive)
        return recase(x, v, 'l');
    return v;
}

static void sort_items(jctx *x, const jnode *at, sort_item *it, size_t n, bool reverse)
{
    sort_cmp_err = 0;
    if (reverse) /* Python's reverse sort keeps equal items in order */
        for (size_t i = 0; i < n; i++)
            it[i].idx = n - 1 - it[i].idx;
    qsort(it, n, sizeof *it, sort_cmp);
    if (sort_cmp_err)
        jx_fail(x, at, "cannot sort: items of types that cannot be ordered");
    if (reverse)
        for (size_t i = 0, j = n ? n - 1 : 0; i < j; i++, j--) {
            sort_item t = it[i];
            it[i] = it[j];
            it[j] = t;
        }
}

/* A dotted attribute path ("a.b" or "0") of an item, as jinja2's make_attrgetter. */
static jv attr_path(jctx *x, const jnode *at, jv v, jv path)
{
    if (path.t == JV_INT)
        return jb_getitem(x, at, v, path);
    if (path.t != JV_STR)
        jx_fail(x, at, "attribute must be a string");
    const char *p = path.s->s;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        char *part = ja_strndup(A, p, n);
        char *end;
        long idx = strtol(part, &end, 10);
        if (n && *end == 0)
            v = jb_getitem(x, at, v, jv_int(idx));
        else
            v = jb_getitem(x, at, v, jv_cstr(A, part));
        if (v.t == JV_UNDEF && dot)
            return v;
        p += n + (dot ? 1 : 0);
    }
    return v;
}

static jv select_filter(jctx *x, const jnode *at, const char *name, jv v, jv *args, int nargs)
{
    bool by_attr = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    bool reject = name[0] == 'r';
    jlist *l = jb_iter(x, at, v);
    int first = by_attr ? 1 : 0;
    if (by_attr && nargs < 1)
        jx_fail(x, at, "%s needs an attribute name", name);
    const char *test = NULL;
    if (nargs > first) {
        if (args[first].t != JV_STR)
            jx_fail(x, at, "%s: the test name must be a string", name);
        test = args[first].s->s;
        if (!jb_has_test(test))
            jx_fail(x, at, "%s: unsupported test '%s'", name, test);
    }
    jv r = jv_list(A, l->n);
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        jv item = by_attr ? attr_path(x, at, l->v[i], args[0]) : l->v[i];
        bool t = test ? jb_test(x, at, test, item, args + first + 1, nargs - first - 1)
                      : jv_truthy(item);
        if (t != reject)
            r.l->v[k++] = l->v[i];
    }
    r.l->n = k;
    r.l->view = 'g';
    return r;
}

static jv to_int(jctx *x, jv v, jv def)
{
    jv d = given(def) ? def : jv_int(0);
    switch (v.t) {
    case JV_INT: return v;
    case JV_BOOL: return jv_int(v.b);
    case JV_FLOAT:
        if (v.f != v.f || v.f > 9.2e18 || v.f < -9.2e18)
            return d;
        return jv_int((int64_t)v.f);
    case JV_STR: {
        jv s = strip(x, NULL, v, jv_none(), 3);
        const char *p = s.s->s;
        char *end;
        if (*p) {
            long long i = strtoll(p, &end, 10);
            if (*end == 0)
                return jv_int(i);
            double f = strtod(p, &end);
            if (*end == 0 && f == f && f < 9.2e18 && f > -9.2e18)
                return jv_int((int64_t)f);
        }
        return d;
    }
    default: return d;
    }
}

static jv to_float(jctx *x, jv v, jv def)
{
    jv d = given(def) ? def : jv_float(0);
    switch (v.t) {
    case JV_INT: return jv_float((double)v.i);
    case JV_BOOL: return jv_float(v.b);
    case JV_FLOAT: return v;
    case JV_STR: {
        jv s = strip(x, NULL, v, jv_none(), 3);
        char *end;
        double f = strtod(s.s->s, &end);
        return *s.s->s && *end == 0 ? jv_float(f) : d;
    }
    default: return d;
    }
}

/* json.dumps(ensure_ascii=True): non-ASCII as \uXXXX (surrogate pairs above U+FFFF). */
static jv ascii_json(jctx *x, jv s)
{
    size_t n;
    uint32_t *cp = ju_decode(A, s.s->s, s.s->n, &n);
    jbuf b = {.a = A};
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cp[i];
        if (c < 0x80)
            jb_addc(&b, (char)c);
        else if (c < 0x10000)
            jb_addf(&b, "\\u%04x", c);
        else {
            c -= 0x10000;
            jb_addf(&b, "\\u%04x\\u%04x", 0xD800 + (c >> 10), 0xDC00 + (c & 0x3FF));
        }
    }
    return jb_value(&b);
}

static jv do_tojson(jctx *x, const jnode *at, jv v, jv *args, int nargs, const char **kw,
                    jv *kwv, int nkw)
{
    jv indent = arg(args, nargs, kw, kwv, nkw, 0, "indent");
    jv ensure_ascii = arg(args, nargs, kw, kwv, nkw, 99, "ensure_ascii");
    jv sort_keys = arg(args, nargs, kw, kwv, nkw, 99, "sort_keys");
    jv separators = arg(args, nargs, kw, kwv, nkw, 99, "separators");
    if (given(separators) && separators.t != JV_NONE)
        jx_fail(x, at, "unsupported: tojson(separators=...)");
    int ind = -1;
    const char *istr = NULL;
    if (indent.t == JV_INT)
        ind = indent.i < 0 ? 0 : indent.i > 64 ? 64 : (int)indent.i;
    else if (indent.t == JV_STR)
        istr = indent.s->s;
    else if (given(indent) && indent.t != JV_NONE)
        jx_fail(x, at, "tojson: indent must be an integer or a string");
    if (v.t == JV_UNDEF)
        jx_fail(x, at, "tojson: Object of type Undefined is not JSON serializable");
    jbuf b = {.a = A};
    jv_write_json(&b, v, ind, istr, jv_truthy(sort_keys), 0);
    jv r = jb_value(&b);
    return jv_truthy(ensure_ascii) ? ascii_json(x, r) : r;
}

static jv do_indent(jctx *x, jv s, jv width, jv first, jv blank)
{
    s = str_of(x, s);
    jbuf pad = {.a = A};
    if (width.t == JV_STR)
        jb_addn(&pad, width.s->s, width.s->n);
    else
        for (int64_t i = 0; i < (width.t == JV_INT ? width.i : 4) && i < 256; i++)
            jb_addc(&pad, ' ');
    jv lines = split(x, NULL, s, jv_cstr(A, "\n"), jv_undef(NULL));
    jbuf b = {.a = A};
    for (size_t i = 0; i < lines.l->n; i++) {
        jv ln = lines.l->v[i];
        if (i)
            jb_addc(&b, '\n');
        bool add = i == 0 ? jv_truthy(first)
                          : (jv_truthy(blank) || ln.s->n > 0);
        if (add && pad.n)
            jb_addn(&b, pad.s, pad.n);
        jb_addn(&b, ln.s->s, ln.s->n);
    }
    return jb_value(&b);
}

jv jb_filter(jctx *x, const jnode *at, const char *name, jv v, jv *args, int nargs,
             const char **kw, jv *kwv, int nkw)
{
#define IS(s) (!strcmp(name, s))
#define ARG(pos, nm) arg(args, nargs, kw, kwv, nkw, pos, nm)
    jx_step(x, at);
    if (IS("trim")) return strip(x, at, v, given(ARG(0, "chars")) ? ARG(0, "chars")
                                                                  : jv_none(), 3);
    if (IS("tojson")) return do_tojson(x, at, v, args, nargs, kw, kwv, nkw);
    if (IS("replace")) return replace(x, at, v, ARG(0, "old"), ARG(1, "new"), ARG(2, "count"));
    if (IS("length") || IS("count")) return jv_int(jb_length(x, at, v));
    if (IS("lower")) return recase(x, v, 'l');
    if (IS("upper")) return recase(x, v, 'u');
    if (IS("title")) return recase(x, v, 'T');
    if (IS("capitalize")) return recase(x, v, 'c');
    if (IS("string")) return str_of(x, v);
    if (IS("safe")) return v;
    if (IS("escape") || IS("e") || IS("forceescape")) {
        jv s = str_of(x, v);
        jbuf b = {.a = A};
        for (size_t i = 0; i < s.s->n; i++) {
            char c = s.s->s[i];
            if (c == '&') jb_add(&b, "&amp;");
            else if (c == '<') jb_add(&b, "&lt;");
            else if (c == '>') jb_add(&b, "&gt;");
            else if (c == '"') jb_add(&b, "&#34;");
            else if (c == '\'') jb_add(&b, "&#39;");
            else jb_addc(&b, c);
        }
        return jb_value(&b);
    }
    if (IS("default") || IS("d")) {
        jv def = given(ARG(0, "default_value")) ? ARG(0, "default_value") : jv_cstr(A, "");
        bool boolean = jv_truthy(ARG(1, "boolean"));
        if (v.t == JV_UNDEF || (boolean && !jv_truthy(v)))
            return def;
        return v;
    }
    if (IS("items")) {
        if (v.t == JV_UNDEF)
            return jv_list(A, 0);
        if (v.t != JV_DICT)
            jx_fail(x, at, "can only get item pairs from a mapping, not %s", jv_type_name(v));
        jv r = jv_list(A, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) {
            jv p = jv_list(A, 2);
            p.l->tuple = true;
            p.l->v[0] = v.d->k[i];
            p.l->v[1] = v.d->v[i];
            r.l->v[i] = p;
        }
        r.l->view = 'g';
        return r;
    }
    if (IS("join")) return join(x, at, v, given(ARG(0, "d")) ? ARG(0, "d") : jv_cstr(A, ""),
                                ARG(1, "attribute"));
    if (IS("first") || IS("last")) {
        if (v.t == JV_UNDEF)
            return jv_undef("No first item, sequence was empty.");
        if (IS("last") && v.t == JV_LIST && v.l->view == 'g')
            jx_fail(x, at, "'generator' object is not reversible");
        jlist *l = jb_iter(x, at, v);
        if (!l->n)
            return jv_undef(IS("first") ? "No first item, sequence was empty."
                                        : "No last item, sequence was empty.");
        return l->v[IS("first") ? 0 : l->n - 1];
    }
    if (IS("list")) {
        jlist *l = jb_iter(x, at, v);
        jv r = jv_list(A, l->n);
        memcpy(r.l->v, l->v, l->n * sizeof(jv));
        return r;
    }
    if (IS("reverse")) {
        if (v.t == JV_STR) {
            size_t n;
            uint32_t *cp = ju_decode(A, v.s->s, v.s->n, &n);
            jbuf b = {.a = A};
            for (size_t i = n; i > 0; i--)
                ju_encode(&b, cp[i - 1]);
            return jb_value(&b);
        }
        jlist *l = jb_iter(x, at, v);
        jv r = jv_list(A, l->n);
        for (size_t i = 0; i < l->n; i++)
            r.l->v[i] = l->v[l->n - 1 - i];
        r.l->view = 'g'; /* reversed(): an iterator */
        return r;
    }
    if (IS("int")) return to_int(x, v, ARG(0, "default"));
    if (IS("float")) return to_float(x, v, ARG(0, "default"));
    if (IS("abs")) {
        if (v.t == JV_INT) return jv_int(v.i < 0 ? -v.i : v.i);
        if (v.t == JV_FLOAT) return jv_float(v.f < 0 ? -v.f : v.f);
        jx_fail(x, at, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (IS("map")) {
        jlist *l = jb_iter(x, at, v);
        jv attribute = ARG(99, "attribute"), def = ARG(99, "default");
        jv r = jv_list(A, l->n);
        for (size_t i = 0; i < l->n; i++) {
            if (given(attribute)) {
                jv a = attr_path(x, at, l->v[i], attribute);
                r.l->v[i] = a.t == JV_UNDEF && given(def) ? def : a;
            } else {
                if (nargs < 1 || args[0].t != JV_STR)
                    jx_fail(x, at, "map needs a filter name or attribute=");
                r.l->v[i] = jb_filter(x, at, args[0].s->s, l->v[i], args + 1, nargs - 1,
                                      NULL, NULL, 0);
            }
        }
        r.l->view = 'g';
        return r;
    }
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr"))
        return select_filter(x, at, name, v, args, nargs);
    if (IS("unique")) {
        jlist *l = jb_iter(x, at, v);
        bool cs = jv_truthy(ARG(0, "case_sensitive"));
        jv attribute = ARG(1, "attribute");
        jv r = jv_list(A, l->n), *keys = ja_alloc(A, (l->n + 1) * sizeof(jv));
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            jv key = sort_key(x, given(attribute) ? attr_path(x, at, l->v[i], attribute)
                                                  : l->v[i], cs);
            bool seen = false;
            for (size_t j = 0; j < k && !seen; j++)
                seen = jv_equal(keys[j], key);
            if (!seen) {
                keys[k] = key;
                r.l->v[k++] = l->v[i];
            }
        }
        r.l->n = k;
        r.l->view = 'g';
        return r;
    }
    if (IS("dictsort") || IS("sort")) {
        bool dict = IS("dictsort");
        bool cs = jv_truthy(ARG(dict ? 0 : 1, "case_sensitive"));
        bool rev = jv_truthy(ARG(dict ? 2 : 0, "reverse"));
        jv by = dict ? ARG(1, "by") : jv_undef(NULL), attribute = dict ? jv_undef(NULL)
                                                                      : ARG(2, "attribute");
        bool by_value = by.t == JV_STR && !strcmp(by.s->s, "value");
        if (dict && v.t != JV_DICT)
            jx_fail(x, at, "dictsort needs a mapping, not %s", jv_type_name(v));
        jlist *l = dict ? NULL : jb_iter(x, at, v);
        size_t n = dict ? v.d->n : l->n;
        sort_item *it = ja_alloc(A, (n + 1) * sizeof *it);
        for (size_t i = 0; i < n; i++) {
            if (dict) {
                jv p = jv_list(A, 2);
                p.l->tuple = true;
                p.l->v[0] = v.d->k[i];
                p.l->v[1] = v.d->v[i];
                it[i].val = p;
                it[i].key = sort_key(x, by_value ? v.d->v[i] : v.d->k[i], cs);
            } else {
                it[i].val = l->v[i];
                it[i].key = sort_key(x, given(attribute) ? attr_path(x, at, l->v[i], attribute)
                                                         : l->v[i], cs);
            }
            it[i].idx = i;
        }
        sort_items(x, at, it, n, rev);
        jv r = jv_list(A, n);
        for (size_t i = 0; i < n; i++)
            r.l->v[i] = it[i].val;
        return r;
    }
    if (IS("min") || IS("max") || IS("sum")) {
        jlist *l = jb_iter(x, at, v);
        jv attribute = ARG(IS("sum") ? 0 : 1, "attribute");
        if (IS("sum")) {
            jv acc = given(ARG(1, "start")) ? ARG(1, "start") : jv_int(0);
            for (size_t i = 0; i < l->n; i++) {
                jv item = given(attribute) ? attr_path(x, at, l->v[i], attribute) : l->v[i];
                bool ia = acc.t == JV_INT && item.t == JV_INT;
                if (ia)
                    acc = jv_int(acc.i + item.i);
                else if ((acc.t == JV_INT || acc.t == JV_FLOAT) &&
                         (item.t == JV_INT || item.t == JV_FLOAT))
                    acc = jv_float((acc.t == JV_INT ? (double)acc.i : acc.f) +
                                   (item.t == JV_INT ? (double)item.i : item.f));
                else
                    jx_fail(x, at, "sum: unsupported operand types");
            }
            return acc;
        }
        if (!l->n)
            return jv_undef("No aggregated item, sequence was empty.");
        bool cs = jv_truthy(ARG(0, "case_sensitive"));
        size_t best = 0;
        for (size_t i = 1; i < l->n; i++) {
            jv a = sort_key(x, given(attribute) ? attr_path(x, at, l->v[i], attribute)
                                                : l->v[i], cs);
            jv b = sort_key(x, given(attribute) ? attr_path(x, at, l->v[best], attribute)
                                                : l->v[best], cs);
            bool ok;
            int c = jv_compare(a, b, &ok);
            if (!ok)
                jx_fail(x, at, "%s: items cannot be ordered", name);
            if (IS("min") ? c < 0 : c > 0)
                best = i;
        }
        return l->v[best];
    }
    if (IS("indent"))
        return do_indent(x, v, ARG(0, "width"), ARG(1, "first"), ARG(2, "blank"));
    if (IS("round")) { /* round(value, precision): half to even; ints stay ints */
        jv prec = ARG(0, "precision");
        jv method = ARG(1, "method");
        int64_t p = prec.t == JV_INT ? prec.i : 0;
        const char *how = method.t == JV_STR ? method.s->s : "common";
        if (strcmp(how, "common") && strcmp(how, "floor") && strcmp(how, "ceil"))
            jx_fail(x, at, "method must be common, ceil or floor");
        if (v.t == JV_BOOL)
            v = jv_int(v.b);
        if (v.t == JV_INT && !strcmp(how, "common") && p >= 0)
            return v;
        if (v.t != JV_INT && v.t != JV_FLOAT)
            jx_fail(x, at, "type %s doesn't define __round__ method", jv_type_name(v));
        double f = v.t == JV_INT ? (double)v.i : v.f, m = 1;
        for (int64_t i = 0; i < (p < 0 ? -p : p) && i < 308; i++)
            m *= 10;
        double y = p >= 0 ? f * m : f / m;
        y = !strcmp(how, "floor") ? __builtin_floor(y) : !strcmp(how, "ceil") ? __builtin_ceil(y)
                                                                            : __builtin_rint(y);
        return jv_float(p >= 0 ? y / m : y * m);
    }
    if (IS("wordcount")) return jv_int((int64_t)split(x, at, v, jv_none(), jv_undef(NULL)).l->n);
    if (IS("center") || IS("truncate") || IS("wordwrap") || IS("format") || IS("batch") ||
        IS("slice") || IS("groupby") || IS("striptags") || IS("urlencode") ||
        IS("xmlattr") || IS("filesizeformat") || IS("pprint") || IS("random") ||
        IS("attr") || IS("urlize") || IS("tojson_pretty"))
        jx_fail(x, at, "unsupported filter '%s'", name);
    jx_fail(x, at, "unknown filter '%s'", name);
#undef ARG
#undef IS
}

/* ---- globals and methods --------------------------------------------------------------- */

static const char *const GLOBALS[] = {"range", "namespace", "dict", "raise_exception",
                                      "strftime_now", NULL};

bool jb_global(jctx *x, const char *name, jv *out)
{
    for (int i = 0; GLOBALS[i]; i++)
        if (!strcmp(GLOBALS[i], name)) {
            *out = func(x, GLOBALS[i], jv_undef(NULL));
            return true;
        }
    return false;
}

static jv find(jctx *x, const jnode *at, jv s, jv sub, bool last)
{
    if (sub.t != JV_STR)
        jx_fail(x, at, "find: must be str, not %s", jv_type_name(sub));
    size_t n;
    uint32_t *cp = ju_decode(A, s.s->s, s.s->n, &n);
    size_t m;
    uint32_t *sc = ju_decode(A, sub.s->s, sub.s->n, &m);
    int64_t found = -1;
    for (size_t i = 0; i + m <= n; i++)
        if (memcmp(cp + i, sc, m * sizeof *cp) == 0) {
            found = (int64_t)i;
            if (!last)
                break;
        }
    return jv_int(found);
}

static jv str_method(jctx *x, const jnode *at, const char *m, jv s, jv *args, int nargs,
                     const char **kw, jv *kwv, int nkw)
{
#define IS(t) (!strcmp(m, t))
#define ARG(pos, nm) arg(args, nargs, kw, kwv, nkw, pos, nm)
    jv a0 = ARG(0, "");
    if (IS("strip")) return strip(x, at, s, given(a0) ? a0 : jv_none(), 3);
    if (IS("lstrip")) return strip(x, at, s, given(a0) ? a0 : jv_none(), 1);
    if (IS("rstrip")) return strip(x, at, s, given(a0) ? a0 : jv_none(), 2);
    if (IS("split")) return split(x, at, s, given(ARG(0, "sep")) ? ARG(0, "sep") : jv_none(),
                                  ARG(1, "maxsplit"));
    if (IS("startswith") || IS("endswith")) {
        if (nargs < 1)
            jx_fail(x, at, "%s() takes at least 1 argument", m);
        return jv_bool(affix(x, at, s, a0, IS("endswith")));
    }
    if (IS("upper")) return recase(x, s, 'u');
    if (IS("lower")) return recase(x, s, 'l');
    if (IS("title")) return recase(x, s, 't');
    if (IS("capitalize")) return recase(x, s, 'c');
    if (IS("replace")) return replace(x, at, s, a0, ARG(1, ""), ARG(2, "count"));
    if (IS("find")) return find(x, at, s, a0, false);
    if (IS("rfind")) return find(x, at, s, a0, true);
    if (IS("count")) {
        if (a0.t != JV_STR)
            jx_fail(x, at, "count: must be str");
        if (a0.s->n == 0)
            return jv_int((int64_t)cp_count(s.s) + 1);
        int64_t c = 0;
        const char *p = s.s->s, *e = p + s.s->n, *q;
        while ((q = memmem(p, (size_t)(e - p), a0.s->s, a0.s->n))) {
            c++;
            p = q + a0.s->n;
        }
        return jv_int(c);
    }
    if (IS("join")) return join(x, at, a0, s, jv_undef(NULL));
    /* isdigit / isalpha / isspace / isalnum / isupper / islower */
    size_t n;
    uint32_t *cp = ju_decode(A, s.s->s, s.s->n, &n);
    bool r = n > 0, any_cased = false;
    for (size_t i = 0; i < n; i++) {
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp[i]);
        bool alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        if (IS("isdigit")) r = r && digit;
        else if (IS("isalpha")) r = r && alpha;
        else if (IS("isalnum")) r = r && (alpha || digit || c == UTF8PROC_CATEGORY_NL ||
                                          c == UTF8PROC_CATEGORY_NO);
        else if (IS("isspace")) r = r && ju_space(cp[i]);
        else if (IS("isupper") || IS("islower")) {
            if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL ||
                c == UTF8PROC_CATEGORY_LT)
                any_cased = true;
            if (IS("isupper") && (c == UTF8PROC_CATEGORY_LL))
                r = false;
            if (IS("islower") && (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT))
                r = false;
        }
    }
    if (IS("isupper") || IS("islower"))
        r = r && any_cased;
    return jv_bool(r);
#undef ARG
#undef IS
}

jv jb_call_builtin(jctx *x, const jnode *at, jfunc *fn, jv *args, int nargs,
                   const char **kw, jv *kwv, int nkw)
{
    const char *m = fn->name;
    jv self = fn->self;
#define IS(t) (!strcmp(m, t))
    if (self.t == JV_STR)
        return str_method(x, at, m, self, args, nargs, kw, kwv, nkw);
    if (self.t == JV_DICT) {
        jdict *d = self.d;
        if (IS("items") || IS("keys") || IS("values")) {
            jv r = jv_list(A, d->n);
            r.l->view = m[0] == 'k' ? 'k' : m[0] == 'v' ? 'v' : 'i';
            for (size_t i = 0; i < d->n; i++) {
                if (IS("items")) {
                    jv p = jv_list(A, 2);
                    p.l->tuple = true;
                    p.l->v[0] = d->k[i];
                    p.l->v[1] = d->v[i];
                    r.l->v[i] = p;
                } else {
                    r.l->v[i] = IS("keys") ? d->k[i] : d->v[i];
                }
            }
            return r;
        }
        if (IS("get")) {
            if (nargs < 1)
                jx_fail(x, at, "get expected at least 1 argument, got 0");
            jv *v = jd_get(d, args[0]);
            return v ? *v : nargs > 1 ? args[1] : jv_none();
        }
        if (IS("copy")) {
            jv r = jv_dict(A);
            for (size_t i = 0; i < d->n; i++)
                jd_set(A, r.d, d->k[i], d->v[i]);
            return r;
        }
    }
    if (self.t == JV_LIST) {
        if (IS("copy")) {
            jv r = jv_list(A, self.l->n);
            memcpy(r.l->v, self.l->v, self.l->n * sizeof(jv));
            return r;
        }
        if (nargs < 1)
            jx_fail(x, at, "%s() takes exactly one argument", m);
        int64_t c = 0;
        for (size_t i = 0; i < self.l->n; i++)
            if (jv_equal(self.l->v[i], args[0])) {
                if (IS("index"))
                    return jv_int((int64_t)i);
                c++;
            }
        if (IS("index"))
            jx_fail(x, at, "list.index(x): x not in list");
        return jv_int(c);
    }
    if (IS("loop.cycle")) {
        if (nargs < 1)
            jx_fail(x, at, "no items for cycling given");
        return args[self.i % nargs];
    }
    if (IS("range")) {
        int64_t a[3] = {0, 0, 1};
        if (nargs < 1 || nargs > 3 || nkw)
            jx_fail(x, at, "range expected 1 to 3 integer arguments");
        for (int i = 0; i < nargs; i++) {
            if (args[i].t != JV_INT && args[i].t != JV_BOOL)
                jx_fail(x, at, "range: '%s' object cannot be interpreted as an integer",
                        jv_type_name(args[i]));
            a[nargs == 1 ? 1 : i] = args[i].t == JV_INT ? args[i].i : args[i].b;
        }
        if (a[2] == 0)
            jx_fail(x, at, "range() arg 3 must not be zero");
        int64_t n = a[2] > 0 ? (a[1] > a[0] ? (a[1] - a[0] + a[2] - 1) / a[2] : 0)
                             : (a[0] > a[1] ? (a[0] - a[1] - a[2] - 1) / -a[2] : 0);
        if (n > 10000000)
            jx_fail(x, at, "range of %lld items is too long for a template", (long long)n);
        jv r = jv_list(A, (size_t)n);
        for (int64_t i = 0; i < n; i++)
            r.l->v[i] = jv_int(a[0] + i * a[2]);
        return r;
    }
    if (IS("namespace") || IS("dict")) {
        jv d = jv_dict(A);
        if (IS("namespace"))
            d.t = JV_NS;
        for (int i = 0; i < nargs; i++) {
            if (args[i].t != JV_DICT)
                jx_fail(x, at, "%s() takes keyword arguments (or a dict)", m);
            for (size_t k = 0; k < args[i].d->n; k++)
                jd_set(A, d.d, args[i].d->k[k], args[i].d->v[k]);
        }
        for (int i = 0; i < nkw; i++) {
            if (d.t == JV_NS && kw[i][0] == '_')
                jx_fail(x, at, "cannot store underscore-prefixed attributes on a namespace "
                               "('%s')", kw[i]);
            jd_set(A, d.d, jv_cstr(A, kw[i]), kwv[i]);
        }
        return d;
    }
    if (IS("raise_exception")) {
        jv msg = nargs > 0 ? str_of(x, args[0]) : jv_cstr(A, "");
        jx_fail(x, at, "raise_exception: %s", msg.s->s);
    }
    if (IS("strftime_now")) {
        if (nargs < 1 || args[0].t != JV_STR)
            jx_fail(x, at, "strftime_now needs a format string");
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char out[512];
        size_t k = strftime(out, sizeof out, args[0].s->s, &tm);
        if (k == 0 && args[0].s->n)
            jx_fail(x, at, "strftime_now: format too long");
        return jv_str(A, out, k);
    }
#undef IS
    jx_fail(x, at, "'%s' is not callable here", m);
}
