/* The interpreter's insides: arenas, values, the syntax tree, and the functions the
 * files of lib/jinja/ share. Errors inside the interpreter jump (longjmp) back to the
 * public entry point, which owns every allocation through an arena and frees it whole. */
#ifndef FT_JINJA_INTERNAL_H
#define FT_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>

#include "jinja/jinja.h"

/* ---- arenas: bump allocation, freed whole; a limit turns into an error ------------- */

typedef struct ja_chunk ja_chunk;
typedef struct jarena {
    ja_chunk *head;
    size_t used, limit;
    jmp_buf *jb; /* where errors go */
    ft_err *err;
} jarena;

void *ja_alloc(jarena *a, size_t n); /* zeroed */
char *ja_strndup(jarena *a, const char *s, size_t n);
void ja_free(jarena *a);
/* Formats "line L, column C: msg" (the position part left out where line <= 0) into
 * a->err and jumps. */
_Noreturn void ja_fail(jarena *a, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same with a message already formatted (raise_exception). */
_Noreturn void ja_fail_raw(jarena *a, const char *msg);

/* ---- values ------------------------------------------------------------------------- */

typedef enum jv_type {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS,
    JV_MACRO, JV_FUNC
} jv_type;

typedef struct jstr { size_t n; char s[]; } jstr;   /* UTF-8, NUL-terminated */
typedef struct jv jv;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;
typedef struct jnode jnode;

struct jv {
    jv_type t;
    union {
        bool b;
        int64_t i;
        double f;
        const jstr *s;
        jlist *l;
        jdict *d;      /* JV_DICT and JV_NS (a namespace: attributes settable) */
        const jnode *m; /* JV_MACRO: the macro statement */
        jfunc *fn;
        const char *why; /* JV_UNDEF: what is undefined, for the error when it is used */
    };
};

/* view: 0 for a list or tuple; 'k', 'v', 'i' for what dict.keys() / values() / items()
 * return (Python writes them as dict_keys([...]) and so on); 'g' for what the filters
 * that yield return (select, map, unique, items, reverse of a list ...): as a Python
 * generator it is true even when empty and has no len() or items by index; rendering
 * one is an error (jinja2 would write "<generator object ...>"). */
struct jlist { size_t n; jv *v; bool tuple; char view; };
struct jdict { size_t n, cap; jv *k, *v; };

/* A callable that is not a macro: a global (range, namespace, ...) or a method bound to
 * its object ("abc".upper, d.items, loop.cycle, caller). */
struct jfunc {
    const char *name;
    jv self;
    const jnode *caller; /* for "caller": the call block's body */
    void *caller_env;
};

static inline jv jv_undef(const char *why) { jv v = {.t = JV_UNDEF}; v.why = why; return v; }
static inline jv jv_none(void) { jv v = {.t = JV_NONE}; return v; }
static inline jv jv_bool(bool b) { jv v = {.t = JV_BOOL}; v.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {.t = JV_INT}; v.i = i; return v; }
static inline jv jv_float(double f) { jv v = {.t = JV_FLOAT}; v.f = f; return v; }

jv jv_str(jarena *a, const char *s, size_t n);
jv jv_cstr(jarena *a, const char *s);
jv jv_list(jarena *a, size_t n); /* n undefined slots, to fill */
jv jv_dict(jarena *a);
void jd_set(jarena *a, jdict *d, jv k, jv v);
/* NULL when absent. */
jv *jd_get(const jdict *d, jv k);
jv *jd_gets(const jdict *d, const char *k);
jv jv_from_json(jarena *a, const json_t *j);

bool jv_truthy(jv v);
bool jv_equal(jv a, jv b);
/* <0, 0, >0; ok false when the two cannot be ordered. */
int jv_compare(jv a, jv b, bool *ok);
const char *jv_type_name(jv v); /* as Python names it: 'str', 'list', 'dict', ... */

/* ---- a growable byte string in an arena ---------------------------------------------- */

typedef struct jbuf {
    jarena *a;
    char *s;
    size_t n, cap, limit; /* limit: the most bytes (0: none) */
} jbuf;

void jb_addn(jbuf *b, const char *s, size_t n);
void jb_add(jbuf *b, const char *s);
void jb_addc(jbuf *b, char c);
void jb_addf(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv jb_value(jbuf *b);

/* str(v) and repr(v) as Python writes them (jinja2 renders str(v)); json.dumps. */
void jv_write_str(jbuf *b, jv v);
void jv_write_repr(jbuf *b, jv v);
jv jv_to_str(jarena *a, jv v);
/* indent < 0: none (separators ", " and ": "); else that many spaces (or istr, when not
 * NULL) per level with "," and ": ". */
void jv_write_json(jbuf *b, jv v, int indent, const char *istr, bool sort_keys, int depth);
void jv_write_float(jbuf *b, double f); /* Python's repr(float) */

/* UTF-8: code points of s (decoded, *n of them). */
uint32_t *ju_decode(jarena *a, const char *s, size_t len, size_t *n);
void ju_encode(jbuf *b, uint32_t c);
bool ju_space(uint32_t c); /* str.isspace() */

/* ---- the syntax tree ----------------------------------------------------------------- */

typedef enum jnode_kind {
    /* expressions */
    E_LIT, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER,
    E_TEST, E_NEG, E_POS, E_NOT, E_BIN, E_AND, E_OR, E_CMP, E_COND,
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK,
    S_GENERATION, S_BREAK, S_CONTINUE, S_WITH
} jnode_kind;

struct jnode {
    jnode_kind kind;
    int line, col;
    const char *name;   /* E_NAME, E_ATTR, E_FILTER, E_TEST, E_BIN's operator, S_MACRO */
    jv lit;             /* E_LIT, S_TEXT (a string) */
    jnode *a, *b, *c;   /* operands; S_IF/S_FOR: a = condition / iterable, b = loop filter;
                           S_SET / S_FOR / S_SETBLOCK: c = target */
    jnode **args;       /* positional arguments, items, E_CMP operands, S_MACRO defaults */
    int nargs;
    const char **kw;    /* E_CALL / E_FILTER keyword names; E_CMP operators; S_MACRO and
                           S_CALLBLOCK parameter names; S_WITH names */
    jnode **kwargs;     /* their values (E_DICT: the keys are args, the values kwargs) */
    int nkw;
    jnode **body, **orelse; /* S_IF / S_FOR / S_MACRO / ... bodies; else branch */
    int nbody, norelse;
    bool negated;       /* E_TEST: is not */
};

struct ft_jinja {
    jarena arena;
    jnode **body;
    int nbody;
    bool has_generation;
};

/* ---- tokens (jinja_lex.c) ------------------------------------------------------------ */

typedef enum jtok_kind {
    T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STR, T_INT,
    T_FLOAT, T_OP, T_EOF
} jtok_kind;

typedef struct jtok {
    jtok_kind k;
    int line, col;
    const char *s; /* T_TEXT, T_STR (decoded), T_NAME, T_OP: the text */
    size_t n;
    int64_t i;
    double f;
} jtok;

/* Splits a template into tokens with jinja2's whitespace rules (trim_blocks,
 * lstrip_blocks, "-" and "+" markers, raw blocks, comments dropped). *n counts the
 * tokens including the final T_EOF. */
jtok *jj_lex(jarena *a, const char *src, size_t *n);

/* Parses src into t (arena-allocated; errors jump through t->arena). */
void jj_parse(ft_jinja *t, const char *src);

/* ---- rendering (jinja_eval.c) and the builtins (jinja_builtins.c) -------------------- */

typedef struct jctx jctx;
jarena *jx_arena(jctx *x);
_Noreturn void jx_fail(jctx *x, const jnode *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Calls a callable value with evaluated arguments. */
jv jx_call(jctx *x, const jnode *at, jv fn, jv *args, int nargs, const char **kw, jv *kwv,
           int nkw);
void jx_step(jctx *x, const jnode *at);

/* Filters, tests, attributes and methods, globals. found = false when there is no such
 * name (the caller reports it). */
jv jb_filter(jctx *x, const jnode *at, const char *name, jv v, jv *args, int nargs,
             const char **kw, jv *kwv, int nkw);
bool jb_test(jctx *x, const jnode *at, const char *name, jv v, jv *args, int nargs);
bool jb_has_test(const char *name);
/* obj.name (jinja2's getattr: a method of str/dict/list first, then an item). */
jv jb_getattr(jctx *x, const jnode *at, jv obj, const char *name);
jv jb_getitem(jctx *x, const jnode *at, jv obj, jv key);
jv jb_call_builtin(jctx *x, const jnode *at, jfunc *fn, jv *args, int nargs,
                   const char **kw, jv *kwv, int nkw);
/* The global named name, or an undefined value. */
bool jb_global(jctx *x, const char *name, jv *out);
/* Elements of an iterable (list, tuple, dict keys, string characters); error else. */
jlist *jb_iter(jctx *x, const jnode *at, jv v);
int64_t jb_length(jctx *x, const jnode *at, jv v);

#endif
