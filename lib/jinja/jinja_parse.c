/* The parser: tokens into a tree, with jinja2's grammar and precedence (parser.py):
 *   expression := or ["if" or ["else" expression]]
 *   or := and ("or" and)*          and := not ("and" not)*       not := "not" not | compare
 *   compare := add (("=="|"!="|"<"|"<="|">"|">="|"in"|"not in") add)*
 *   add := concat (("+"|"-") concat)*                  concat := mul ("~" mul)*
 *   mul := pow (("*"|"/"|"//"|"%") pow)*               pow := unary ("**" unary)*
 *   unary := ("-"|"+") unary | primary postfix* (("|" filter) | ("is" test) | call)*
 * Statements: if/elif/else, for/else (loop filter), set (and block set), macro, call,
 * filter, with, generation, break, continue; raw and comments are gone in the lexer.
 * Nesting is bounded (MAX_NEST) so that a hostile template cannot exhaust the stack. */
#include <stdio.h>
#include <string.h>

#include "jinja/jinja_internal.h"

enum { MAX_NEST = 200 };

typedef struct parser {
    jarena *a;
    jtok *t;
    size_t n, i;
    int depth;
    bool has_generation;
} parser;

/* a growable array of node pointers, copied into the arena when done */
typedef struct nvec {
    jnode **v;
    int n, cap;
    const char **names;
} nvec;

static void nv_push(parser *P, nvec *v, jnode *x, const char *name)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        jnode **nv = ja_alloc(P->a, (size_t)cap * sizeof *nv);
        const char **nn = ja_alloc(P->a, (size_t)cap * sizeof *nn);
        if (v->n) {
            memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
            memcpy(nn, v->names, (size_t)v->n * sizeof *nn);
        }
        v->v = nv;
        v->names = nn;
        v->cap = cap;
    }
    v->names[v->n] = name;
    v->v[v->n++] = x;
}

static jtok *cur(parser *P) { return &P->t[P->i]; }
static jtok *peek(parser *P, size_t k)
{
    return P->i + k < P->n ? &P->t[P->i + k] : &P->t[P->n - 1];
}

static const char *tok_desc(const jtok *t)
{
    switch (t->k) {
    case T_TEXT: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_EOF: return "end of template";
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: return t->s;
    }
}

static _Noreturn void pfail_at(parser *P, const jtok *t, const char *fmt, const char *arg)
{
    char msg[400];
    snprintf(msg, sizeof msg, fmt, arg);
    ja_fail(P->a, t->line, t->col, "%s", msg);
}

static bool is_op(const jtok *t, const char *op)
{
    return t->k == T_OP && strcmp(t->s, op) == 0;
}
static bool is_name(const jtok *t, const char *nm)
{
    return t->k == T_NAME && strcmp(t->s, nm) == 0;
}

static void expect_op(parser *P, const char *op)
{
    if (!is_op(cur(P), op)) {
        char msg[200];
        snprintf(msg, sizeof msg, "expected '%s', got %s", op, tok_desc(cur(P)));
        ja_fail(P->a, cur(P)->line, cur(P)->col, "%s", msg);
    }
    P->i++;
}

static const char *expect_name(parser *P)
{
    if (cur(P)->k != T_NAME)
        pfail_at(P, cur(P), "expected a name, got %s", tok_desc(cur(P)));
    return P->t[P->i++].s;
}

static jnode *node(parser *P, jnode_kind k, const jtok *at)
{
    jnode *n = ja_alloc(P->a, sizeof *n);
    n->kind = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static void enter(parser *P)
{
    if (++P->depth > MAX_NEST)
        ja_fail(P->a, cur(P)->line, cur(P)->col, "template nested too deeply (more than %d)",
                MAX_NEST);
}

/* ---- expressions ---------------------------------------------------------------------- */

static jnode *parse_expr(parser *P);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, bool with_filter);
static jnode *parse_primary(parser *P);
static jnode *parse_postfix(parser *P, jnode *n);

/* ( ... ) call arguments: positional then keyword (name=value). */
static void parse_call_args(parser *P, jnode *n)
{
    expect_op(P, "(");
    nvec pos = {0}, kw = {0};
    while (!is_op(cur(P), ")")) {
        if (pos.n || kw.n)
            expect_op(P, ",");
        if (is_op(cur(P), ")"))
            break;
        if (is_op(cur(P), "*") || is_op(cur(P), "**"))
            pfail_at(P, cur(P), "unsupported: %s arguments in a call",
                     is_op(cur(P), "*") ? "*" : "**");
        if (cur(P)->k == T_NAME && is_op(peek(P, 1), "=")) {
            const char *k = P->t[P->i].s;
            P->i += 2;
            nv_push(P, &kw, parse_expr(P), k);
        } else {
            if (kw.n)
                pfail_at(P, cur(P), "%s", "a positional argument after keyword arguments");
            nv_push(P, &pos, parse_expr(P), NULL);
        }
    }
    P->i++;
    n->args = pos.v;
    n->nargs = pos.n;
    n->kwargs = kw.v;
    n->kw = kw.names;
    n->nkw = kw.n;
}

/* expr, expr, ... as a tuple when there is a comma (or when explicit parentheses made
 * it empty), else the one expression. with_cond: whether x if c else y is allowed. */
static jnode *parse_tuple(parser *P, bool with_cond, bool parens)
{
    const jtok *at = cur(P);
    nvec items = {0};
    bool comma = false;
    for (;;) {
        if (items.n) {
            if (!is_op(cur(P), ","))
                break;
            P->i++;
            comma = true;
        }
        jtok *c = cur(P);
        if (c->k == T_BLOCK_END || c->k == T_VAR_END || is_op(c, ")") ||
            (items.n && (is_name(c, "if") || is_name(c, "recursive") || is_op(c, "="))))
            break;
        nv_push(P, &items, with_cond ? parse_expr(P) : parse_or(P), NULL);
    }
    if (!comma && items.n == 1)
        return items.v[0];
    if (!items.n && !parens)
        pfail_at(P, at, "expected an expression, got %s", tok_desc(at));
    jnode *t = node(P, E_TUPLE, at);
    t->args = items.v;
    t->nargs = items.n;
    return t;
}

static jnode *parse_primary(parser *P)
{
    jtok *t = cur(P);
    enter(P);
    jnode *n;
    switch (t->k) {
    case T_NAME:
        P->i++;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") ||
            !strcmp(t->s, "False")) {
            n = node(P, E_LIT, t);
            n->lit = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            n = node(P, E_LIT, t);
            n->lit = jv_none();
        } else {
            n = node(P, E_NAME, t);
            n->name = t->s;
        }
        break;
    case T_STR: {
        jbuf b = {.a = P->a};
        while (cur(P)->k == T_STR) { /* adjacent strings concatenate */
            jb_addn(&b, cur(P)->s, cur(P)->n);
            P->i++;
        }
        n = node(P, E_LIT, t);
        n->lit = jb_value(&b);
        break;
    }
    case T_INT:
        P->i++;
        n = node(P, E_LIT, t);
        n->lit = jv_int(t->i);
        break;
    case T_FLOAT:
        P->i++;
        n = node(P, E_LIT, t);
        n->lit = jv_float(t->f);
        break;
    case T_OP:
        if (is_op(t, "(")) {
            P->i++;
            n = parse_tuple(P, true, true);
            expect_op(P, ")");
        } else if (is_op(t, "[")) {
            P->i++;
            nvec items = {0};
            while (!is_op(cur(P), "]")) {
                if (items.n)
                    expect_op(P, ",");
                if (is_op(cur(P), "]"))
                    break;
                nv_push(P, &items, parse_expr(P), NULL);
            }
            P->i++;
            n = node(P, E_LIST, t);
            n->args = items.v;
            n->nargs = items.n;
        } else if (is_op(t, "{")) {
            P->i++;
            nvec keys = {0}, vals = {0};
            while (!is_op(cur(P), "}")) {
                if (keys.n)
                    expect_op(P, ",");
                if (is_op(cur(P), "}"))
                    break;
                nv_push(P, &keys, parse_expr(P), NULL);
                expect_op(P, ":");
                nv_push(P, &vals, parse_expr(P), NULL);
            }
            P->i++;
            n = node(P, E_DICT, t);
            n->args = keys.v;
            n->kwargs = vals.v;
            n->nargs = n->nkw = keys.n;
        } else {
            pfail_at(P, t, "unexpected %s", tok_desc(t));
        }
        break;
    default:
        pfail_at(P, t, "unexpected %s", tok_desc(t));
    }
    P->depth--;
    return n;
}

static jnode *parse_subscript(parser *P, jnode *obj, const jtok *at)
{
    /* [a], [a:b], [a:b:c] with any part left out */
    jnode *part[3] = {NULL, NULL, NULL};
    bool slice = false;
    int k = 0;
    for (;;) {
        if (is_op(cur(P), ":")) {
            slice = true;
            if (++k > 2)
                pfail_at(P, cur(P), "%s", "a slice has at most three parts");
            P->i++;
            continue;
        }
        if (is_op(cur(P), "]"))
            break;
        if (part[k])
            pfail_at(P, cur(P), "expected ']', got %s", tok_desc(cur(P)));
        part[k] = parse_expr(P);
    }
    P->i++;
    jnode *n = node(P, slice ? E_SLICE : E_ITEM, at);
    n->a = obj;
    if (slice) {
        n->args = ja_alloc(P->a, 3 * sizeof *n->args);
        memcpy(n->args, part, sizeof part);
        n->nargs = 3;
    } else if (part[0]) {
        n->b = part[0];
    } else { /* x[] is x[()] in jinja2 */
        n->b = node(P, E_TUPLE, at);
    }
    return n;
}

static jnode *parse_postfix(parser *P, jnode *n)
{
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, ".")) {
            P->i++;
            jtok *nm = cur(P);
            if (nm->k == T_NAME) {
                P->i++;
                jnode *a = node(P, E_ATTR, t);
                a->a = n;
                a->name = nm->s;
                n = a;
            } else if (nm->k == T_INT) {
                P->i++;
                jnode *a = node(P, E_ITEM, t);
                a->a = n;
                a->b = node(P, E_LIT, nm);
                a->b->lit = jv_int(nm->i);
                n = a;
            } else {
                pfail_at(P, nm, "expected an attribute name after '.', got %s", tok_desc(nm));
            }
        } else if (is_op(t, "[")) {
            P->i++;
            n = parse_subscript(P, n, t);
        } else if (is_op(t, "(")) {
            jnode *c = node(P, E_CALL, t);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *parse_filter(parser *P, jnode *n)
{
    /* after '|': name [(args)] */
    jtok *t = cur(P);
    const char *name = expect_name(P);
    while (is_op(cur(P), ".")) { /* a dotted name (no builtin has one: an error if used) */
        P->i++;
        const char *part = expect_name(P);
        size_t n = strlen(name) + strlen(part) + 2;
        char *joined = ja_alloc(P->a, n);
        snprintf(joined, n, "%s.%s", name, part);
        name = joined;
    }
    jnode *f = node(P, E_FILTER, t);
    f->a = n;
    f->name = name;
    if (is_op(cur(P), "("))
        parse_call_args(P, f);
    return f;
}

static jnode *parse_filter_expr(parser *P, jnode *n)
{
    for (;;) {
        jtok *t = cur(P);
        if (is_op(t, "|")) {
            P->i++;
            n = parse_filter(P, n);
        } else if (is_name(t, "is")) {
            P->i++;
            bool neg = false;
            if (is_name(cur(P), "not")) {
                neg = true;
                P->i++;
            }
            jtok *nt = cur(P);
            const char *name = expect_name(P);
            jnode *x = node(P, E_TEST, nt);
            x->a = n;
            x->name = name;
            x->negated = neg;
            jtok *c = cur(P);
            if (is_op(c, "(")) {
                parse_call_args(P, x);
            } else if ((c->k == T_NAME || c->k == T_STR || c->k == T_INT || c->k == T_FLOAT ||
                        is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is"))
                    pfail_at(P, c, "%s", "tests cannot be chained with 'is'");
                x->args = ja_alloc(P->a, sizeof *x->args);
                x->args[0] = parse_postfix(P, parse_primary(P));
                x->nargs = 1;
            }
            n = x;
        } else if (is_op(t, "(")) {
            jnode *c = node(P, E_CALL, t);
            c->a = n;
            parse_call_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *parse_unary(parser *P, bool with_filter)
{
    jtok *t = cur(P);
    enter(P);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        n = node(P, is_op(t, "-") ? E_NEG : E_POS, t);
        n->a = parse_unary(P, false);
    } else {
        n = parse_postfix(P, parse_primary(P));
    }
    if (with_filter)
        n = parse_filter_expr(P, n);
    P->depth--;
    return n;
}

static jnode *binary(parser *P, const jtok *at, const char *op, jnode *a, jnode *b)
{
    jnode *n = node(P, E_BIN, at);
    n->name = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *P)
{
    jnode *n = parse_unary(P, true);
    while (is_op(cur(P), "**")) {
        jtok *t = &P->t[P->i++];
        n = binary(P, t, "**", n, parse_unary(P, true));
    }
    return n;
}

static jnode *parse_mul(parser *P)
{
    jnode *n = parse_pow(P);
    while (is_op(cur(P), "*") || is_op(cur(P), "/") || is_op(cur(P), "//") ||
           is_op(cur(P), "%")) {
        jtok *t = &P->t[P->i++];
        n = binary(P, t, t->s, n, parse_pow(P));
    }
    return n;
}

static jnode *parse_concat(parser *P)
{
    jnode *n = parse_mul(P);
    while (is_op(cur(P), "~")) {
        jtok *t = &P->t[P->i++];
        n = binary(P, t, "~", n, parse_mul(P));
    }
    return n;
}

static jnode *parse_add(parser *P)
{
    jnode *n = parse_concat(P);
    while (is_op(cur(P), "+") || is_op(cur(P), "-")) {
        jtok *t = &P->t[P->i++];
        n = binary(P, t, t->s, n, parse_concat(P));
    }
    return n;
}

static jnode *parse_compare(parser *P)
{
    jtok *at = cur(P);
    jnode *first = parse_add(P);
    nvec ops = {0};
    for (;;) {
        jtok *t = cur(P);
        const char *op = NULL;
        if (t->k == T_OP && (!strcmp(t->s, "==") || !strcmp(t->s, "!=") || !strcmp(t->s, "<") ||
                             !strcmp(t->s, "<=") || !strcmp(t->s, ">") || !strcmp(t->s, ">="))) {
            op = t->s;
            P->i++;
        } else if (is_name(t, "in")) {
            op = "in";
            P->i++;
        } else if (is_name(t, "not") && is_name(peek(P, 1), "in")) {
            op = "not in";
            P->i += 2;
        } else {
            break;
        }
        nv_push(P, &ops, parse_add(P), op);
    }
    if (!ops.n)
        return first;
    jnode *n = node(P, E_CMP, at);
    n->a = first;
    n->args = ops.v;
    n->kw = ops.names;
    n->nargs = ops.n;
    return n;
}

static jnode *parse_not(parser *P)
{
    jtok *t = cur(P);
    if (is_name(t, "not")) {
        P->i++;
        enter(P);
        jnode *n = node(P, E_NOT, t);
        n->a = parse_not(P);
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P)
{
    jnode *n = parse_not(P);
    while (is_name(cur(P), "and")) {
        jtok *t = &P->t[P->i++];
        jnode *x = node(P, E_AND, t);
        x->a = n;
        x->b = parse_not(P);
        n = x;
    }
    return n;
}

static jnode *parse_or(parser *P)
{
    jnode *n = parse_and(P);
    while (is_name(cur(P), "or")) {
        jtok *t = &P->t[P->i++];
        jnode *x = node(P, E_OR, t);
        x->a = n;
        x->b = parse_and(P);
        n = x;
    }
    return n;
}

static jnode *parse_expr(parser *P)
{
    enter(P);
    jnode *n = parse_or(P);
    while (is_name(cur(P), "if")) {
        jtok *t = &P->t[P->i++];
        jnode *c = node(P, E_COND, t);
        c->b = n;
        c->a = parse_or(P);
        if (is_name(cur(P), "else")) {
            P->i++;
            c->c = parse_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* ---- statements ----------------------------------------------------------------------- */

static void parse_body(parser *P, nvec *body, const char *const *ends);

static void expect_block_end(parser *P)
{
    if (cur(P)->k != T_BLOCK_END)
        pfail_at(P, cur(P), "expected '%%}', got %s", tok_desc(cur(P)));
    P->i++;
}

/* The name of the tag that ended a body (the current token, after '{%'). */
static const char *end_tag(parser *P) { return P->t[P->i++].s; }

/* The body of a block statement whose opening tag has been read up to its '%}': the
 * '%}', the statements into n->body, and the closing tag's name; returns that name (its
 * own '%}' is the caller's to expect). */
static const char *parse_block_body(parser *P, jnode *n, const char *const *ends)
{
    nvec body = {0};
    expect_block_end(P);
    parse_body(P, &body, ends);
    n->body = body.v;
    n->nbody = body.n;
    return end_tag(P);
}

/* More filters after the first: f | g | h. */
static jnode *parse_filter_chain(parser *P, jnode *f)
{
    while (is_op(cur(P), "|")) {
        P->i++;
        f = parse_filter(P, f);
    }
    return f;
}

/* An assignment target: a name, names separated by commas, or name.attr. */
static jnode *parse_target(parser *P, bool attr_ok)
{
    jtok *at = cur(P);
    bool paren = is_op(at, "(");
    if (paren)
        P->i++;
    nvec names = {0};
    for (;;) {
        jtok *t = cur(P);
        const char *nm = expect_name(P);
        jnode *n = node(P, E_NAME, t);
        n->name = nm;
        if (attr_ok && is_op(cur(P), ".") && !names.n) {
            P->i++;
            jnode *x = node(P, E_ATTR, cur(P));
            x->a = n;
            x->name = expect_name(P);
            return x;
        }
        nv_push(P, &names, n, NULL);
        if (!is_op(cur(P), ","))
            break;
        P->i++;
    }
    if (paren)
        expect_op(P, ")");
    if (names.n == 1 && !paren)
        return names.v[0];
    jnode *t = node(P, E_TUPLE, at);
    t->args = names.v;
    t->nargs = names.n;
    return t;
}

/* (a, b=default, ...) of a macro or a call block's caller. */
static void parse_params(parser *P, jnode *n)
{
    nvec defs = {0};
    expect_op(P, "(");
    while (!is_op(cur(P), ")")) {
        if (defs.n)
            expect_op(P, ",");
        const char *nm = expect_name(P);
        jnode *d = NULL;
        if (is_op(cur(P), "=")) {
            P->i++;
            d = parse_expr(P);
        } else {
            for (int i = 0; i < defs.n; i++)
                if (defs.v[i])
                    pfail_at(P, cur(P), "parameter '%s' without a default after one with a "
                                        "default", nm);
        }
        nv_push(P, &defs, d, nm);
    }
    P->i++;
    n->args = defs.v;
    n->kw = defs.names;
    n->nargs = n->nkw = defs.n;
}

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_FOR[] = {"else", "endfor", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};
static const char *const END_WITH[] = {"endwith", NULL};

static jnode *parse_if(parser *P, jtok *at)
{
    jnode *n = node(P, S_IF, at);
    n->a = parse_tuple(P, true, false);
    expect_block_end(P);
    nvec body = {0};
    parse_body(P, &body, END_IF);
    n->body = body.v;
    n->nbody = body.n;
    jtok *t = cur(P);
    const char *e = end_tag(P);
    if (!strcmp(e, "elif")) {
        jnode *el = parse_if(P, t);
        n->orelse = ja_alloc(P->a, sizeof *n->orelse);
        n->orelse[0] = el;
        n->norelse = 1;
        return n; /* the elif chain consumed endif */
    }
    if (!strcmp(e, "else")) {
        expect_block_end(P);
        nvec els = {0};
        static const char *const END_ELSE[] = {"endif", NULL};
        parse_body(P, &els, END_ELSE);
        n->orelse = els.v;
        n->norelse = els.n;
        end_tag(P);
    }
    expect_block_end(P);
    return n;
}

static jnode *parse_statement(parser *P)
{
    jtok *at = cur(P);
    if (at->k != T_NAME)
        pfail_at(P, at, "expected a statement name after '{%%', got %s", tok_desc(at));
    const char *kw = at->s;
    P->i++;
    jnode *n;
    if (!strcmp(kw, "if"))
        return parse_if(P, at);
    if (!strcmp(kw, "for")) {
        n = node(P, S_FOR, at);
        n->c = parse_target(P, false);
        if (!is_name(cur(P), "in"))
            pfail_at(P, cur(P), "expected 'in' in a for loop, got %s", tok_desc(cur(P)));
        P->i++;
        n->a = parse_tuple(P, false, false);
        if (is_name(cur(P), "if")) {
            P->i++;
            n->b = parse_expr(P);
        }
        if (is_name(cur(P), "recursive"))
            pfail_at(P, cur(P), "%s", "unsupported: recursive for loops");
        if (!strcmp(parse_block_body(P, n, END_FOR), "else")) {
            expect_block_end(P);
            nvec els = {0};
            parse_body(P, &els, END_FOR2);
            n->orelse = els.v;
            n->norelse = els.n;
            end_tag(P);
        }
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "set")) {
        jnode *target = parse_target(P, true);
        if (is_op(cur(P), "=")) {
            P->i++;
            n = node(P, S_SET, at);
            n->c = target;
            n->a = parse_tuple(P, true, false);
            expect_block_end(P);
            return n;
        }
        n = node(P, S_SETBLOCK, at);
        n->c = target;
        /* {% set x | filter %}: filters applied to the body */
        n->a = parse_filter_chain(P, NULL);
        parse_block_body(P, n, END_SET);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "macro")) {
        n = node(P, S_MACRO, at);
        n->name = expect_name(P);
        parse_params(P, n);
        parse_block_body(P, n, END_MACRO);
        if (cur(P)->k == T_NAME) /* {% endmacro name %} */
            P->i++;
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "call")) {
        n = node(P, S_CALLBLOCK, at);
        if (is_op(cur(P), "("))
            parse_params(P, n);
        n->a = parse_expr(P);
        if (n->a->kind != E_CALL)
            pfail_at(P, at, "%s", "a call block needs a call expression");
        parse_block_body(P, n, END_CALL);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "filter")) {
        n = node(P, S_FILTERBLOCK, at);
        n->a = parse_filter_chain(P, parse_filter(P, NULL));
        parse_block_body(P, n, END_FILTER);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "generation")) {
        n = node(P, S_GENERATION, at);
        P->has_generation = true;
        parse_block_body(P, n, END_GEN);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "with")) {
        n = node(P, S_WITH, at);
        nvec vals = {0};
        while (cur(P)->k != T_BLOCK_END) {
            if (vals.n)
                expect_op(P, ",");
            const char *nm = expect_name(P);
            expect_op(P, "=");
            nv_push(P, &vals, parse_expr(P), nm);
        }
        n->kwargs = vals.v;
        n->kw = vals.names;
        n->nkw = vals.n;
        parse_block_body(P, n, END_WITH);
        expect_block_end(P);
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        n = node(P, kw[0] == 'b' ? S_BREAK : S_CONTINUE, at);
        expect_block_end(P);
        return n;
    }
    pfail_at(P, at, "unsupported statement '%s'", kw);
}

/* Statements up to a {% NAME %} with NAME in ends (left as the current token), or the
 * end of the template when ends is NULL. */
static void parse_body(parser *P, nvec *body, const char *const *ends)
{
    enter(P);
    jtok *open = P->i > 0 ? &P->t[P->i - 1] : cur(P);
    for (;;) {
        jtok *t = cur(P);
        switch (t->k) {
        case T_EOF:
            if (ends)
                pfail_at(P, open, "missing {%% %s %%} for the block opened here",
                         ends[0] && ends[1] && ends[2] ? ends[2] : ends[1] ? ends[1] : ends[0]);
            P->depth--;
            return;
        case T_TEXT: {
            P->i++;
            jnode *n = node(P, S_TEXT, t);
            n->lit = jv_str(P->a, t->s, t->n);
            nv_push(P, body, n, NULL);
            break;
        }
        case T_VAR_BEGIN: {
            P->i++;
            jnode *n = node(P, S_OUT, t);
            n->a = parse_tuple(P, true, false);
            if (cur(P)->k != T_VAR_END)
                pfail_at(P, cur(P), "expected '}}', got %s", tok_desc(cur(P)));
            P->i++;
            nv_push(P, body, n, NULL);
            break;
        }
        case T_BLOCK_BEGIN: {
            P->i++;
            jtok *nm = cur(P);
            if (nm->k == T_NAME && ends)
                for (int k = 0; ends[k]; k++)
                    if (!strcmp(nm->s, ends[k])) {
                        P->depth--;
                        return;
                    }
            if (nm->k == T_NAME && (!strncmp(nm->s, "end", 3) || !strcmp(nm->s, "else") ||
                                    !strcmp(nm->s, "elif")))
                pfail_at(P, nm, "unexpected {%% %s %%}", nm->s);
            nv_push(P, body, parse_statement(P), NULL);
            break;
        }
        default:
            pfail_at(P, t, "unexpected %s", tok_desc(t));
        }
    }
}

void jj_parse(ft_jinja *t, const char *src)
{
    parser P = {.a = &t->arena};
    P.t = jj_lex(&t->arena, src, &P.n);
    nvec body = {0};
    parse_body(&P, &body, NULL);
    t->body = body.v;
    t->nbody = body.n;
    t->has_generation = P.has_generation;
}
