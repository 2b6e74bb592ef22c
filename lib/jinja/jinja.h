/* jinja/: the Jinja subset that Hugging Face chat templates are written in, interpreted.
 *
 * Owns: compiling a template's text (lexing with jinja2's whitespace rules, parsing into
 * a tree) and rendering it with variables given as JSON, as transformers renders chat
 * templates (its ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the
 * loopcontrols extension, the {% generation %} tag, and the globals raise_exception,
 * strftime_now, namespace, dict, range).
 * May call: core.
 * (libc, jansson and utf8proc only; this is the folder's main header.)
 *
 * What is supported (docs/chat-templates.md lists it all):
 *   expressions   literals (strings, numbers, true/false/none, lists, tuples, dicts),
 *                 names, .attr and [item] (jinja2's lookup order), slices [a:b:c], calls,
 *                 + - * / // % **, ~, comparisons (chained), in / not in, and / or / not,
 *                 x if c else y, filters (|f(args)) and tests (is [not] t(args));
 *   statements    if / elif / else, for (tuple targets, loop filter "if", else, the loop
 *                 object, break / continue), set (names, tuples, namespace attributes,
 *                 block set with an optional filter), macro (defaults, keyword
 *                 arguments, caller), call blocks, filter blocks, with, raw, comments,
 *                 generation blocks;
 *   values        Python's semantics for what templates do with JSON data: str() and
 *                 repr() of lists and dicts, json.dumps for tojson, code-point strings,
 *                 jinja2's default Undefined (renders empty, is falsy, iterates empty;
 *                 an attribute, item, call or arithmetic on it is an error).
 * Anything else is an error naming the template line and column: a construct the parser
 * does not know when compiling, an unsupported filter / test / method / operation when
 * rendering. Templates are input: parsing depth, macro recursion, steps, memory and
 * output are bounded (ft_jinja_limits), and exceeding a bound is an error, never a
 * crash or a hang. */
#ifndef FT_JINJA_H
#define FT_JINJA_H

#include <stdbool.h>
#include <stddef.h>

#include "core/ft_error.h"

typedef struct ft_jinja ft_jinja;
typedef struct json_t json_t;

typedef struct ft_jinja_limits {
    size_t max_output;  /* bytes of rendered text (0: 64 MiB) */
    size_t max_memory;  /* bytes of values a render may allocate (0: 256 MiB) */
    long max_steps;     /* evaluated nodes and loop iterations (0: 50 million) */
    int max_depth;      /* nested macro calls (0: 64) */
} ft_jinja_limits;

/* Compiles src (UTF-8 Jinja text, NUL-terminated). *out is freed by ft_jinja_free. A
 * syntax error or an unsupported statement is an error "line L, column C: ...". */
int ft_jinja_compile(ft_jinja **out, const char *src, ft_err *err);
void ft_jinja_free(ft_jinja *t);

/* Whether the template has {% generation %} blocks (assistant spans it marks itself). */
bool ft_jinja_has_generation(const ft_jinja *t);

/* A [start, end) range of bytes of the rendered text a generation block wrote. */
typedef struct ft_jinja_span {
    size_t start, end;
} ft_jinja_span;

/* Renders t with the variables of vars (a JSON object: each key a template variable).
 * *out is malloc'ed and NUL-terminated, *len its length (may be NULL). When spans is not
 * NULL, *spans (malloc'ed, NULL when none) and *n_spans receive the generation blocks'
 * ranges in order. limits may be NULL (the defaults). Errors: "line L, column C: ..."
 * for a failing construct (C: where the failing expression or filter starts); a
 * template's raise_exception(msg) fails with "line L, column C: raise_exception: msg";
 * a bound exceeded fails with a message naming the bound. */
int ft_jinja_render(const ft_jinja *t, const json_t *vars, const ft_jinja_limits *limits,
                    char **out, size_t *len, ft_jinja_span **spans, size_t *n_spans,
                    ft_err *err);

#endif
