/* Rendering: walks the tree with scopes as jinja2 keeps them (each iteration of a for
 * loop, a macro call and a with block open a scope; if does not; set writes the innermost
 * scope, so a set inside a loop is seen neither after it nor by the next iteration: what
 * namespace() is for), jinja2's default Undefined, and
 * the bounds of ft_jinja_limits. Every allocation of a render lives in one arena. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/jinja_internal.h"

typedef struct scope {
    struct scope *parent;
    jdict vars;
} scope;

struct jctx {
    jarena a;
    jmp_buf jb;
    jbuf top, *out;
    scope *root, *cur;
    long steps, max_steps;
    int depth, max_depth;
    const char *stack_base; /* the renderer's first frame: nesting is bounded by the stack
                               it takes (MAX_STACK), whatever mix of macros and blocks */
    int brk; /* 1: break, 2: continue pending */
    ft_jinja_span *spans;
    size_t n_spans, cap_spans;
    size_t max_output;
    /* names as string values, by the address of their text (which the tree or the
     * builtins own), so that assigning a variable does not allocate each time */
    const char **intern_k;
    jv *intern_v;
    size_t intern_n, intern_cap;
};

jarena *jx_arena(jctx *x) { return &x->a; }

void jx_fail(jctx *x, const jnode *at, const char *fmt, ...)
{
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ja_fail(&x->a, at ? at->line : 0, at ? at->col : 0, "%s", msg);
}

/* The C stack a render may take: nested macro calls times nested blocks could otherwise
 * reach the stack's end before max_depth does. */
enum { MAX_STACK = 1 << 20 };

void jx_step(jctx *x, const jnode *at)
{
    char here;
    if (++x->steps > x->max_steps)
        jx_fail(x, at, "template step limit exceeded (%ld steps): a loop that does not end?",
                x->max_steps);
    uintptr_t a = (uintptr_t)x->stack_base, b = (uintptr_t)&here;
    if ((a > b ? a - b : b - a) > MAX_STACK)
        jx_fail(x, at, "template nested too deeply at run time (macro calls inside deep "
                       "blocks)");
}

static jv lookup(jctx *x, const char *name)
{
    for (scope *s = x->cur; s; s = s->parent) {
        jv *v = jd_gets(&s->vars, name);
        if (v)
            return *v;
    }
    jv g;
    if (jb_global(x, name, &g))
        return g;
    size_t n = strlen(name) + 32;
    char *why = ja_alloc(&x->a, n);
    snprintf(why, n, "'%s' is undefined", name);
    return jv_undef(why);
}

static jv intern(jctx *x, const char *name)
{
    if (x->intern_n * 2 >= x->intern_cap) {
        size_t cap = x->intern_cap ? x->intern_cap * 2 : 256;
        const char **k = ja_alloc(&x->a, cap * sizeof *k);
        jv *v = ja_alloc(&x->a, cap * sizeof *v);
        for (size_t i = 0; i < x->intern_cap; i++)
            if (x->intern_k[i]) {
                size_t h = ((uintptr_t)x->intern_k[i] >> 3) & (cap - 1);
                while (k[h])
                    h = (h + 1) & (cap - 1);
                k[h] = x->intern_k[i];
                v[h] = x->intern_v[i];
            }
        x->intern_k = k;
        x->intern_v = v;
        x->intern_cap = cap;
    }
    size_t h = ((uintptr_t)name >> 3) & (x->intern_cap - 1);
    while (x->intern_k[h]) {
        if (x->intern_k[h] == name)
            return x->intern_v[h];
        h = (h + 1) & (x->intern_cap - 1);
    }
    x->intern_k[h] = name;
    x->intern_v[h] = jv_cstr(&x->a, name);
    x->intern_n++;
    return x->intern_v[h];
}

static void assign(jctx *x, const char *name, jv v)
{
    jd_set(&x->a, &x->cur->vars, intern(x, name), v);
}

static scope *push_scope(jctx *x, scope *parent)
{
    scope *s = ja_alloc(&x->a, sizeof *s);
    s->parent = parent;
    return s;
}

/* ---- expressions ---------------------------------------------------------------------- */

static jv eval(jctx *x, const jnode *n);
static void exec_body(jctx *x, jnode *const *body, int n);

/* What body renders, as a string value (the output goes to a buffer of its own). */
static jv capture(jctx *x, jnode *const *body, int n)
{
    jbuf *saved = x->out;
    jbuf buf = {.a = &x->a, .limit = x->max_output};
    x->out = &buf;
    exec_body(x, body, n);
    x->out = saved;
    return jb_value(&buf);
}

static _Noreturn void undefined_use(jctx *x, const jnode *at, jv v)
{
    jx_fail(x, at, "%s", v.why ? v.why : "undefined value");
}

static jv arith(jctx *x, const jnode *n, jv a, jv b)
{
    const char *op = n->name;
    jarena *A = &x->a;
    if (!strcmp(op, "~")) {
        jbuf buf = {.a = A};
        jv_write_str(&buf, a);
        jv_write_str(&buf, b);
        return jb_value(&buf);
    }
    if (a.t == JV_UNDEF)
        undefined_use(x, n, a);
    if (b.t == JV_UNDEF)
        undefined_use(x, n, b);
    bool an = a.t == JV_INT || a.t == JV_FLOAT || a.t == JV_BOOL;
    bool bn = b.t == JV_INT || b.t == JV_FLOAT || b.t == JV_BOOL;
    if (an && bn) {
        bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
        int64_t ai = a.t == JV_BOOL ? a.b : a.i, bi = b.t == JV_BOOL ? b.b : b.i;
        double af = a.t == JV_FLOAT ? a.f : (double)ai, bf = b.t == JV_FLOAT ? b.f : (double)bi;
        switch (op[0]) {
        case '+':
            if (ints) {
                int64_t r;
                if (__builtin_add_overflow(ai, bi, &r))
                    jx_fail(x, n, "integer overflow");
                return jv_int(r);
            }
            return jv_float(af + bf);
        case '-':
            if (ints) {
                int64_t r;
                if (__builtin_sub_overflow(ai, bi, &r))
                    jx_fail(x, n, "integer overflow");
                return jv_int(r);
            }
            return jv_float(af - bf);
        case '*':
            if (op[1] == '*') {
                if (ints && bi >= 0) {
                    int64_t r = 1;
                    for (int64_t k = 0; k < bi; k++)
                        if (__builtin_mul_overflow(r, ai, &r))
                            jx_fail(x, n, "integer overflow");
                    return jv_int(r);
                }
                return jv_float(pow(af, bf));
            }
            if (ints) {
                int64_t r;
                if (__builtin_mul_overflow(ai, bi, &r))
                    jx_fail(x, n, "integer overflow");
                return jv_int(r);
            }
            return jv_float(af * bf);
        case '/':
            if (bf == 0)
                jx_fail(x, n, "division by zero");
            if (op[1] == '/') {
                if (ints) {
                    if (ai == INT64_MIN && bi == -1)
                        jx_fail(x, n, "integer overflow");
                    int64_t q = ai / bi;
                    if ((ai % bi != 0) && ((ai < 0) != (bi < 0)))
                        q--;
                    return jv_int(q);
                }
                return jv_float(floor(af / bf));
            }
            return jv_float(af / bf);
        case '%':
            if (bf == 0)
                jx_fail(x, n, "modulo by zero");
            if (ints) {
                if (bi == -1)
                    return jv_int(0);
                int64_t r = ai % bi;
                if (r != 0 && ((r < 0) != (bi < 0)))
                    r += bi;
                return jv_int(r);
            } else {
                double r = fmod(af, bf);
                if (r != 0 && ((r < 0) != (bf < 0)))
                    r += bf;
                return jv_float(r);
            }
        }
    }
    if (op[0] == '+' && a.t == JV_STR && b.t == JV_STR) {
        jbuf buf = {.a = A};
        jb_addn(&buf, a.s->s, a.s->n);
        jb_addn(&buf, b.s->s, b.s->n);
        return jb_value(&buf);
    }
    if (op[0] == '+' && a.t == JV_LIST && b.t == JV_LIST && a.l->tuple == b.l->tuple &&
        !a.l->view && !b.l->view) {
        jv r = jv_list(A, a.l->n + b.l->n);
        memcpy(r.l->v, a.l->v, a.l->n * sizeof(jv));
        memcpy(r.l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
        r.l->tuple = a.l->tuple;
        return r;
    }
    if (!strcmp(op, "*") && (a.t == JV_STR || a.t == JV_LIST) && b.t == JV_INT) {
        int64_t k = b.i < 0 ? 0 : b.i;
        size_t unit = a.t == JV_STR ? a.s->n : a.l->n;
        if (unit && (uint64_t)k > (A->limit ? A->limit : ((size_t)1 << 32)) / unit)
            jx_fail(x, n, "template memory limit exceeded (repeating %zu items %lld times)",
                    unit, (long long)k);
        if (a.t == JV_STR) {
            jbuf buf = {.a = A};
            for (int64_t i = 0; i < k; i++)
                jb_addn(&buf, a.s->s, a.s->n);
            return jb_value(&buf);
        }
        jv r = jv_list(A, unit * (size_t)k);
        for (int64_t i = 0; i < k; i++)
            memcpy(r.l->v + (size_t)i * unit, a.l->v, unit * sizeof(jv));
        return r;
    }
    if (!strcmp(op, "*") && a.t == JV_INT && (b.t == JV_STR || b.t == JV_LIST)) {
        jnode swapped = *n;
        return arith(x, &swapped, b, a);
    }
    if (op[0] == '%' && a.t == JV_STR)
        jx_fail(x, n, "unsupported: %%-formatting of strings");
    jx_fail(x, n, "unsupported operand types for %s: '%s' and '%s'", op, jv_type_name(a),
            jv_type_name(b));
}

static bool contains(jctx *x, const jnode *at, jv item, jv c)
{
    switch (c.t) {
    case JV_UNDEF: return false;
    case JV_STR:
        if (item.t != JV_STR)
            jx_fail(x, at, "'in <string>' requires string as left operand, not %s",
                    jv_type_name(item));
        return item.s->n == 0 || memmem(c.s->s, c.s->n, item.s->s, item.s->n) != NULL;
    case JV_LIST:
        for (size_t i = 0; i < c.l->n; i++)
            if (jv_equal(c.l->v[i], item))
                return true;
        return false;
    case JV_DICT: case JV_NS: return jd_get(c.d, item) != NULL;
    default:
        jx_fail(x, at, "argument of type '%s' is not iterable", jv_type_name(c));
    }
}

static bool compare(jctx *x, const jnode *at, const char *op, jv a, jv b)
{
    if (!strcmp(op, "==")) return jv_equal(a, b);
    if (!strcmp(op, "!=")) return !jv_equal(a, b);
    if (!strcmp(op, "in")) return contains(x, at, a, b);
    if (!strcmp(op, "not in")) return !contains(x, at, a, b);
    bool ok;
    int c = jv_compare(a, b, &ok);
    if (!ok)
        jx_fail(x, at, "'%s' not supported between instances of '%s' and '%s'", op,
                jv_type_name(a), jv_type_name(b));
    if (!strcmp(op, "<")) return c < 0;
    if (!strcmp(op, "<=")) return c <= 0;
    if (!strcmp(op, ">")) return c > 0;
    return c >= 0;
}

/* Python's slice indices for a sequence of length len. */
static size_t slice_indices(jctx *x, const jnode *n, jv *part, int64_t len, int64_t *start,
                            int64_t *step)
{
    int64_t st = 1;
    if (part[2].t != JV_NONE && part[2].t != JV_UNDEF) {
        if (part[2].t != JV_INT)
            jx_fail(x, n, "slice indices must be integers or None");
        st = part[2].i;
        if (st == 0)
            jx_fail(x, n, "slice step cannot be zero");
    }
    int64_t lo, hi;
    for (int k = 0; k < 2; k++)
        if (part[k].t != JV_NONE && part[k].t != JV_UNDEF && part[k].t != JV_INT)
            jx_fail(x, n, "slice indices must be integers or None");
    bool has0 = part[0].t == JV_INT, has1 = part[1].t == JV_INT;
    if (st > 0) {
        lo = has0 ? part[0].i : 0;
        hi = has1 ? part[1].i : len;
        if (lo < 0) lo += len;
        if (lo < 0) lo = 0;
        if (lo > len) lo = len;
        if (hi < 0) hi += len;
        if (hi < 0) hi = 0;
        if (hi > len) hi = len;
        *start = lo;
        *step = st;
        return hi > lo ? (size_t)((hi - lo + st - 1) / st) : 0;
    }
    lo = has0 ? part[0].i : len - 1;
    hi = has1 ? part[1].i : -1 - len;
    if (lo < 0) lo += len;
    if (lo < -1) lo = -1;
    if (lo >= len) lo = len - 1;
    if (hi < 0) hi += len;
    if (hi < -1) hi = -1;
    if (hi >= len) hi = len - 1;
    *start = lo;
    *step = st;
    return lo > hi ? (size_t)((lo - hi - st - 1) / -st) : 0;
}

static jv slice(jctx *x, const jnode *n, jv obj, jv *part)
{
    int64_t start, step;
    if (obj.t == JV_LIST && !obj.l->view) {
        size_t k = slice_indices(x, n, part, (int64_t)obj.l->n, &start, &step);
        jv r = jv_list(&x->a, k);
        for (size_t i = 0; i < k; i++)
            r.l->v[i] = obj.l->v[start + (int64_t)i * step];
        r.l->tuple = obj.l->tuple;
        return r;
    }
    if (obj.t == JV_STR) {
        size_t ncp;
        uint32_t *cp = ju_decode(&x->a, obj.s->s, obj.s->n, &ncp);
        size_t k = slice_indices(x, n, part, (int64_t)ncp, &start, &step);
        jbuf b = {.a = &x->a};
        for (size_t i = 0; i < k; i++)
            ju_encode(&b, cp[start + (int64_t)i * step]);
        return jb_value(&b);
    }
    if (obj.t == JV_UNDEF)
        undefined_use(x, n, obj);
    /* jinja2's getitem gives an undefined value for what cannot be sliced */
    return jv_undef("that object is not subscriptable");
}

/* Evaluates a call's arguments into fresh arrays. */
static void eval_args(jctx *x, const jnode *n, jv **args, jv **kwv)
{
    *args = ja_alloc(&x->a, ((size_t)n->nargs + 1) * sizeof(jv));
    *kwv = ja_alloc(&x->a, ((size_t)n->nkw + 2) * sizeof(jv));
    for (int i = 0; i < n->nargs; i++)
        (*args)[i] = eval(x, n->args[i]);
    for (int i = 0; i < n->nkw; i++)
        (*kwv)[i] = eval(x, n->kwargs[i]);
}

static jv call_macro(jctx *x, const jnode *at, const jnode *m, jv *args, int nargs,
                     const char **kw, jv *kwv, int nkw)
{
    if (nargs > m->nargs)
        jx_fail(x, at, "macro '%s' takes not more than %d argument(s)", m->name, m->nargs);
    if (++x->depth > x->max_depth)
        jx_fail(x, at, "macro calls nested too deeply (more than %d): endless recursion?",
                x->max_depth);
    scope *saved = x->cur;
    x->cur = push_scope(x, x->root);
    for (int k = 0; k < nkw; k++) {
        bool known = !strcmp(kw[k], "caller");
        for (int i = 0; i < m->nargs && !known; i++)
            known = !strcmp(m->kw[i], kw[k]);
        if (!known)
            jx_fail(x, at, "macro '%s' has no argument named '%s'", m->name, kw[k]);
        assign(x, kw[k], kwv[k]);
    }
    for (int i = 0; i < m->nargs; i++) {
        if (i < nargs) {
            assign(x, m->kw[i], args[i]);
            continue;
        }
        if (jd_gets(&x->cur->vars, m->kw[i]))
            continue;
        if (m->args[i]) {
            assign(x, m->kw[i], eval(x, m->args[i]));
        } else {
            size_t len = strlen(m->kw[i]) + 64;
            char *why = ja_alloc(&x->a, len);
            snprintf(why, len, "'%s' is undefined (an argument of macro '%s')", m->kw[i],
                     m->name);
            assign(x, m->kw[i], jv_undef(why));
        }
    }
    jv out = capture(x, m->body, m->nbody);
    x->cur = saved;
    x->depth--;
    x->brk = 0;
    return out;
}

static jv call_caller(jctx *x, const jnode *at, jfunc *fn, jv *args, int nargs)
{
    const jnode *cb = fn->caller;
    if (++x->depth > x->max_depth)
        jx_fail(x, at, "macro calls nested too deeply (more than %d)", x->max_depth);
    scope *saved = x->cur;
    x->cur = push_scope(x, (scope *)fn->caller_env);
    for (int i = 0; i < cb->nargs; i++)
        assign(x, cb->kw[i], i < nargs ? args[i]
                             : cb->args[i] ? eval(x, cb->args[i]) : jv_undef("caller argument"));
    jv out = capture(x, cb->body, cb->nbody);
    x->cur = saved;
    x->depth--;
    return out;
}

jv jx_call(jctx *x, const jnode *at, jv fn, jv *args, int nargs, const char **kw, jv *kwv,
           int nkw)
{
    jx_step(x, at);
    if (fn.t == JV_MACRO)
        return call_macro(x, at, fn.m, args, nargs, kw, kwv, nkw);
    if (fn.t == JV_FUNC) {
        if (fn.fn->caller)
            return call_caller(x, at, fn.fn, args, nargs);
        return jb_call_builtin(x, at, fn.fn, args, nargs, kw, kwv, nkw);
    }
    if (fn.t == JV_UNDEF)
        undefined_use(x, at, fn);
    jx_fail(x, at, "'%s' object is not callable", jv_type_name(fn));
}

static jv eval_call(jctx *x, const jnode *n, jv caller)
{
    jv fn = eval(x, n->a);
    jv *args, *kwv;
    eval_args(x, n, &args, &kwv);
    const char **kw = n->kw;
    int nkw = n->nkw;
    if (caller.t == JV_FUNC) {
        const char **k2 = ja_alloc(&x->a, ((size_t)nkw + 1) * sizeof *k2);
        if (nkw)
            memcpy(k2, kw, (size_t)nkw * sizeof *k2);
        k2[nkw] = "caller";
        kwv[nkw] = caller;
        kw = k2;
        nkw++;
    }
    return jx_call(x, n, fn, args, n->nargs, kw, kwv, nkw);
}

static jv eval_filter(jctx *x, const jnode *n, jv input)
{
    jv v = n->a ? eval(x, n->a) : input;
    jv *args, *kwv;
    eval_args(x, n, &args, &kwv);
    return jb_filter(x, n, n->name, v, args, n->nargs, n->kw, kwv, n->nkw);
}

/* A chain of filters whose innermost operand is missing (a filter block or a set block
 * with filters) applied to input. */
static jv apply_chain(jctx *x, const jnode *f, jv input)
{
    if (!f)
        return input;
    jv v = apply_chain(x, f->a, input);
    jv *args, *kwv;
    eval_args(x, f, &args, &kwv);
    return jb_filter(x, f, f->name, v, args, f->nargs, f->kw, kwv, f->nkw);
}

static jv eval(jctx *x, const jnode *n)
{
    jx_step(x, n);
    switch (n->kind) {
    case E_LIT: return n->lit;
    case E_NAME: return lookup(x, n->name);
    case E_LIST: case E_TUPLE: {
        jv l = jv_list(&x->a, (size_t)n->nargs);
        for (int i = 0; i < n->nargs; i++)
            l.l->v[i] = eval(x, n->args[i]);
        l.l->tuple = n->kind == E_TUPLE;
        return l;
    }
    case E_DICT: {
        jv d = jv_dict(&x->a);
        for (int i = 0; i < n->nargs; i++) {
            jv k = eval(x, n->args[i]);
            if (k.t == JV_LIST && !k.l->tuple)
                jx_fail(x, n, "unhashable type: 'list'");
            if (k.t == JV_DICT)
                jx_fail(x, n, "unhashable type: 'dict'");
            jd_set(&x->a, d.d, k, eval(x, n->kwargs[i]));
        }
        return d;
    }
    case E_ATTR: {
        jv o = eval(x, n->a);
        if (o.t == JV_UNDEF)
            undefined_use(x, n, o);
        return jb_getattr(x, n, o, n->name);
    }
    case E_ITEM: {
        jv o = eval(x, n->a);
        if (o.t == JV_UNDEF)
            undefined_use(x, n, o);
        return jb_getitem(x, n, o, eval(x, n->b));
    }
    case E_SLICE: {
        jv o = eval(x, n->a), part[3];
        for (int i = 0; i < 3; i++)
            part[i] = n->args[i] ? eval(x, n->args[i]) : jv_none();
        return slice(x, n, o, part);
    }
    case E_CALL: return eval_call(x, n, jv_undef(NULL));
    case E_FILTER: return eval_filter(x, n, jv_undef(NULL));
    case E_TEST: {
        jv v = eval(x, n->a);
        jv *args, *kwv;
        eval_args(x, n, &args, &kwv);
        bool r = jb_test(x, n, n->name, v, args, n->nargs);
        return jv_bool(n->negated ? !r : r);
    }
    case E_NEG: case E_POS: {
        jv v = eval(x, n->a);
        if (v.t == JV_BOOL)
            v = jv_int(v.b);
        if (v.t == JV_INT) {
            if (n->kind == E_NEG && v.i == INT64_MIN)
                jx_fail(x, n, "integer overflow");
            return n->kind == E_NEG ? jv_int(-v.i) : v;
        }
        if (v.t == JV_FLOAT)
            return n->kind == E_NEG ? jv_float(-v.f) : v;
        if (v.t == JV_UNDEF)
            undefined_use(x, n, v);
        jx_fail(x, n, "bad operand type for unary %s: '%s'", n->kind == E_NEG ? "-" : "+",
                jv_type_name(v));
    }
    case E_NOT: return jv_bool(!jv_truthy(eval(x, n->a)));
    case E_AND: {
        jv a = eval(x, n->a);
        return jv_truthy(a) ? eval(x, n->b) : a;
    }
    case E_OR: {
        jv a = eval(x, n->a);
        return jv_truthy(a) ? a : eval(x, n->b);
    }
    case E_BIN: return arith(x, n, eval(x, n->a), eval(x, n->b));
    case E_CMP: {
        jv a = eval(x, n->a);
        for (int i = 0; i < n->nargs; i++) {
            jv b = eval(x, n->args[i]);
            if (!compare(x, n, n->kw[i], a, b))
                return jv_bool(false);
            a = b;
        }
        return jv_bool(true);
    }
    case E_COND:
        if (jv_truthy(eval(x, n->a)))
            return eval(x, n->b);
        return n->c ? eval(x, n->c) : jv_undef("the else branch of a conditional expression");
    default:
        jx_fail(x, n, "internal error: not an expression");
    }
}

/* ---- statements ----------------------------------------------------------------------- */

static void assign_target(jctx *x, const jnode *t, jv v)
{
    if (t->kind == E_NAME) {
        assign(x, t->name, v);
    } else if (t->kind == E_TUPLE) {
        jlist *l = jb_iter(x, t, v);
        if (l->n != (size_t)t->nargs)
            jx_fail(x, t, "cannot unpack %zu values into %d names", l->n, t->nargs);
        for (int i = 0; i < t->nargs; i++)
            assign(x, t->args[i]->name, l->v[i]);
    } else { /* ns.attr */
        jv ns = lookup(x, t->a->name);
        if (ns.t != JV_NS)
            jx_fail(x, t, "cannot assign attribute on non-namespace object '%s'",
                    t->a->name);
        if (t->name[0] == '_')
            jx_fail(x, t, "cannot store underscore-prefixed attributes on a namespace ('%s')",
                    t->name);
        jd_set(&x->a, ns.d, jv_cstr(&x->a, t->name), v);
    }
}

/* The loop object of iteration i: one dict per loop, updated in place as jinja2's
 * LoopContext is, so that a long loop does not allocate per iteration. */
static void loop_update(jctx *x, jv d, jlist *items, size_t i)
{
    jarena *A = &x->a;
    size_t n = items->n;
#define SET(k, v) jd_set(A, d.d, jv_cstr(A, k), v)
    if (d.d->n == 0) {
        SET("index", jv_none());
        SET("index0", jv_none());
        SET("revindex", jv_none());
        SET("revindex0", jv_none());
        SET("first", jv_none());
        SET("last", jv_none());
        SET("length", jv_int((int64_t)n));
        SET("depth", jv_int(1));
        SET("depth0", jv_int(0));
        SET("previtem", jv_none());
        SET("nextitem", jv_none());
        jfunc *cyc = ja_alloc(A, sizeof *cyc);
        cyc->name = "loop.cycle";
        jv f = {.t = JV_FUNC};
        f.fn = cyc;
        SET("cycle", f);
    }
#undef SET
    jv *v = d.d->v; /* in the order set above */
    v[0] = jv_int((int64_t)i + 1);
    v[1] = jv_int((int64_t)i);
    v[2] = jv_int((int64_t)(n - i));
    v[3] = jv_int((int64_t)(n - i - 1));
    v[4] = jv_bool(i == 0);
    v[5] = jv_bool(i + 1 == n);
    v[9] = i > 0 ? items->v[i - 1] : jv_undef("there is no previous item");
    v[10] = i + 1 < n ? items->v[i + 1] : jv_undef("there is no next item");
    v[11].fn->self = jv_int((int64_t)i);
}

static void exec_for(jctx *x, const jnode *n)
{
    jv it = eval(x, n->a);
    jlist *all = jb_iter(x, n->a, it);
    scope *saved = x->cur;
    x->cur = push_scope(x, saved);
    jlist *items = all;
    if (n->b) { /* the loop filter sees the loop's targets, not loop */
        items = ja_alloc(&x->a, sizeof *items);
        items->v = ja_alloc(&x->a, (all->n + 1) * sizeof(jv));
        for (size_t i = 0; i < all->n; i++) {
            assign_target(x, n->c, all->v[i]);
            if (jv_truthy(eval(x, n->b)))
                items->v[items->n++] = all->v[i];
        }
    }
    jv loop = jv_dict(&x->a);
    scope *body = push_scope(x, saved);
    x->cur = body;
    for (size_t i = 0; i < items->n; i++) {
        jx_step(x, n);
        body->vars.n = 0; /* each iteration starts from the outer scope */
        assign_target(x, n->c, items->v[i]);
        loop_update(x, loop, items, i);
        assign(x, "loop", loop);
        exec_body(x, n->body, n->nbody);
        if (x->brk == 1) {
            x->brk = 0;
            break;
        }
        x->brk = 0;
    }
    x->cur = saved;
    if (items->n == 0)
        exec_body(x, n->orelse, n->norelse);
}

static void exec(jctx *x, const jnode *n)
{
    jx_step(x, n);
    switch (n->kind) {
    case S_TEXT: jb_addn(x->out, n->lit.s->s, n->lit.s->n); return;
    case S_OUT: jv_write_str(x->out, eval(x, n->a)); return;
    case S_IF:
        if (jv_truthy(eval(x, n->a)))
            exec_body(x, n->body, n->nbody);
        else
            exec_body(x, n->orelse, n->norelse);
        return;
    case S_FOR: exec_for(x, n); return;
    case S_SET: assign_target(x, n->c, eval(x, n->a)); return;
    case S_SETBLOCK: assign_target(x, n->c, apply_chain(x, n->a, capture(x, n->body,
                                                                       n->nbody)));
        return;
    case S_MACRO: {
        jv m = {.t = JV_MACRO};
        m.m = n;
        assign(x, n->name, m);
        return;
    }
    case S_CALLBLOCK: {
        jfunc *fn = ja_alloc(&x->a, sizeof *fn);
        fn->name = "caller";
        fn->caller = n;
        fn->caller_env = x->cur;
        jv c = {.t = JV_FUNC};
        c.fn = fn;
        jv_write_str(x->out, eval_call(x, n->a, c));
        return;
    }
    case S_FILTERBLOCK:
        jv_write_str(x->out, apply_chain(x, n->a, capture(x, n->body, n->nbody)));
        return;
    case S_GENERATION: {
        if (x->out != &x->top)
            jx_fail(x, n, "unsupported: a generation block inside a macro, call, filter or "
                          "set block");
        size_t start = x->top.n;
        exec_body(x, n->body, n->nbody);
        if (x->n_spans == x->cap_spans) {
            size_t cap = x->cap_spans ? x->cap_spans * 2 : 16;
            ft_jinja_span *s = ja_alloc(&x->a, cap * sizeof *s);
            if (x->n_spans)
                memcpy(s, x->spans, x->n_spans * sizeof *s);
            x->spans = s;
            x->cap_spans = cap;
        }
        x->spans[x->n_spans++] = (ft_jinja_span){start, x->top.n};
        return;
    }
    case S_BREAK: x->brk = 1; return;
    case S_CONTINUE: x->brk = 2; return;
    case S_WITH: {
        scope *saved = x->cur;
        scope *s = push_scope(x, saved);
        jv *vals = ja_alloc(&x->a, ((size_t)n->nkw + 1) * sizeof *vals);
        for (int i = 0; i < n->nkw; i++)
            vals[i] = eval(x, n->kwargs[i]);
        x->cur = s;
        for (int i = 0; i < n->nkw; i++)
            assign(x, n->kw[i], vals[i]);
        exec_body(x, n->body, n->nbody);
        x->cur = saved;
        return;
    }
    default:
        jx_fail(x, n, "internal error: not a statement");
    }
}

static void exec_body(jctx *x, jnode *const *body, int n)
{
    for (int i = 0; i < n && !x->brk; i++)
        exec(x, body[i]);
}

/* ---- the public entry points ---------------------------------------------------------- */

int ft_jinja_compile(ft_jinja **out, const char *src, ft_err *err)
{
    *out = NULL;
    ft_jinja *t = calloc(1, sizeof *t);
    if (!t)
        return ft_fail(err, "out of memory");
    jmp_buf jb;
    t->arena.jb = &jb;
    t->arena.err = err;
    t->arena.limit = (size_t)1 << 30;
    if (setjmp(jb)) {
        ja_free(&t->arena);
        free(t);
        return -1;
    }
    jj_parse(t, src);
    t->arena.jb = NULL;
    t->arena.err = NULL;
    *out = t;
    return 0;
}

void ft_jinja_free(ft_jinja *t)
{
    if (!t)
        return;
    ja_free(&t->arena);
    free(t);
}

bool ft_jinja_has_generation(const ft_jinja *t) { return t && t->has_generation; }

int ft_jinja_render(const ft_jinja *t, const json_t *vars, const ft_jinja_limits *limits,
                    char **out, size_t *len, ft_jinja_span **spans, size_t *n_spans,
                    ft_err *err)
{
    *out = NULL;
    if (len)
        *len = 0;
    if (spans) {
        *spans = NULL;
        *n_spans = 0;
    }
    if (vars && !json_is_object(vars))
        return ft_fail(err, "template variables: not a JSON object");
    jctx *x = calloc(1, sizeof *x);
    if (!x)
        return ft_fail(err, "out of memory");
    ft_jinja_limits L = limits ? *limits : (ft_jinja_limits){0};
    x->a.jb = &x->jb;
    x->a.err = err;
    x->a.limit = L.max_memory ? L.max_memory : (size_t)256 << 20;
    x->max_output = L.max_output ? L.max_output : (size_t)64 << 20;
    x->max_steps = L.max_steps ? L.max_steps : 50000000L;
    x->max_depth = L.max_depth ? L.max_depth : 64;
    if (setjmp(x->jb)) {
        ja_free(&x->a);
        free(x);
        return -1;
    }
    char base;
    x->stack_base = &base;
    x->top = (jbuf){.a = &x->a, .limit = x->max_output};
    x->out = &x->top;
    x->root = push_scope(x, NULL);
    x->cur = x->root;
    if (vars) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v)
            assign(x, k, jv_from_json(&x->a, v));
    }
    exec_body(x, t->body, t->nbody);
    size_t n = x->top.n;
    char *s = malloc(n + 1);
    ft_jinja_span *sp = NULL;
    if (spans && x->n_spans) {
        sp = malloc(x->n_spans * sizeof *sp);
        if (sp)
            memcpy(sp, x->spans, x->n_spans * sizeof *sp);
    }
    if (!s || (spans && x->n_spans && !sp)) {
        free(s);
        free(sp);
        ja_free(&x->a);
        free(x);
        return ft_fail(err, "out of memory");
    }
    if (n)
        memcpy(s, x->top.s, n);
    s[n] = 0;
    *out = s;
    if (len)
        *len = n;
    if (spans) {
        *spans = sp;
        *n_spans = x->n_spans;
    }
    ja_free(&x->a);
    free(x);
    return 0;
}
