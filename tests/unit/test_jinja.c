/* The Jinja interpreter (lib/jinja/jinja.h): each construct rendered against what
 * jinja2 renders with transformers' settings (the expected strings are jinja2's output,
 * checked with tests/conformance/test_chat_templates.py's construct fixtures), errors that
 * name the line and column, and the bounds that keep a hostile template from crashing,
 * hanging or eating memory. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jinja/jinja.h"

static const char MSGS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"},"
    " {\"role\": \"user\", \"content\": \"hi\"},"
    " {\"role\": \"assistant\", \"content\": \"yo\"},"
    " {\"role\": \"user\", \"content\": \"bye\"}],"
    " \"bos_token\": \"<s>\", \"add_generation_prompt\": true}";

/* Renders src with vars (JSON text or NULL); returns the text (static) or NULL with
 * the error in *err. */
static const char *render_l(const char *src, const char *vars, const ft_jinja_limits *lim,
                            ft_err *err)
{
    static char *last;
    free(last);
    last = NULL;
    ft_jinja *t;
    if (ft_jinja_compile(&t, src, err))
        return NULL;
    json_t *v = vars ? json_loads(vars, 0, NULL) : NULL;
    int rc = ft_jinja_render(t, v, lim, &last, NULL, NULL, NULL, err);
    json_decref(v);
    ft_jinja_free(t);
    return rc ? NULL : last;
}

static const char *render(const char *src, const char *vars)
{
    ft_err err;
    const char *r = render_l(src, vars, NULL, &err);
    if (!r)
        fprintf(stderr, "  render error: %s\n", err.msg);
    return r ? r : "<error>";
}

#define EQ(src, vars, want)                                                            \
    do {                                                                               \
        const char *got_ = render(src, vars);                                          \
        if (strcmp(got_, want)) {                                                      \
            fprintf(stderr, "  %s:%d: %s\n    got  [%s]\n    want [%s]\n", __FILE__,     \
                    __LINE__, src, got_, want);                                        \
            check_current_failed = 1;                                                  \
        }                                                                              \
    } while (0)

/* An error whose message contains each of the given parts. */
static int fails_with(const char *src, const char *vars, const char *part1, const char *part2)
{
    ft_err err;
    if (render_l(src, vars, NULL, &err))
        return 0;
    if ((part1 && !strstr(err.msg, part1)) || (part2 && !strstr(err.msg, part2))) {
        fprintf(stderr, "  error was: %s\n", err.msg);
        return 0;
    }
    return 1;
}

static void test_expressions(void)
{
    EQ("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}", NULL,
       "7 3 -4 3.5 2 1024");
    EQ("{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-7 }} {{ 3.0 }} {{ 1.5e-5 }} {{ 0.0001 }}", NULL,
       "0.30000000000000004 1e+20 1e-07 3.0 1.5e-05 0.0001");
    EQ("{{ 'a' ~ 1 ~ none ~ true ~ nothing }}|{{ 'x' * 3 }}|{{ [1, 2] + [3] }}", NULL,
       "a1NoneTrue|xxx|[1, 2, 3]");
    EQ("{{ (1, 'a') }} {{ (1,) }} {{ {'a': 1, 'b': [2.5, none, 'q\"s', \"it's\"]} }}", NULL,
       "(1, 'a') (1,) {'a': 1, 'b': [2.5, None, 'q\"s', \"it's\"]}");
    EQ("{{ [1,2,3][::-1] }} {{ 'h\xc3\xa9llo'[1:3] }} {{ 'abcdef'[::2] }} {{ 'abcdef'[-2:] }} "
       "{{ 'abc'[::-1] }} {{ 'abc'[5:] }}|",
       NULL, "[3, 2, 1] \xc3\xa9l ace ef cba |");
    EQ("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 3 not in [1, 2] }} "
       "{{ not none }} {{ none or 'd' }} {{ 0 and 5 }} {{ 'x' if false else 'y' }} "
       "{{ 'x' if false }}|",
       NULL, "True True True True True d 0 y |");
    EQ("{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }} "
       "{{ messages | length }} [{{ messages[0].missing }}] {{ messages.0.role }}",
       MSGS, "system hi bye 4 [] system");
    EQ("{{ 10 - 2 - 3 }} {{ 2 * 3 ~ 4 }} {{ -2 ** 2 }} {{ 1 if 0 else 2 if 0 else 3 }} "
       "{{ 'a' 'b' }} {{ '\\u00e9\\x41\\t|' }}",
       NULL, "5 64 4 3 ab \xc3\xa9" "A\t|");
}

static void test_filters(void)
{
    EQ("{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'Hello' | lower }} "
       "{{ \"hello world's\" | title }} {{ 'hELLO' | capitalize }} {{ 'abc' | upper }} "
       "{{ 'a-b' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }}",
       NULL, "pad|hi|hello Hello World's Hello ABC a+b bba");
    EQ("{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort(reverse=true) }} "
       "{{ [1, 1, 2, 'a', 'A'] | unique | list }} {{ {'b': 1, 'a': 2} | dictsort }} "
       "{{ {'b': 1} | items | list }}",
       NULL, "[1, 2, 3] ['c', 'b', 'A'] [1, 2, 'a'] [('a', 2), ('b', 1)] [('b', 1)]");
    EQ("{{ [1, 2, 3] | join(', ') }} {{ [1, 2] | first }} {{ [1, 2] | last }} "
       "{{ 'abc' | list }} {{ 42 | string }} {{ '42' | int + 1 }} {{ '3.5' | float }} "
       "{{ 'x' | int }} {{ 3.9 | int }} {{ -3 | abs }}",
       NULL, "1, 2, 3 1 2 ['a', 'b', 'c'] 42 43 3.5 0 3 3");
    EQ("{{ messages | map(attribute='role') | list }} "
       "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} "
       "{{ messages | rejectattr('role', 'eq', 'user') | map(attribute='content') | join('|') }}",
       MSGS, "['system', 'user', 'assistant', 'user'] 2 sys|yo");
    EQ("{{ [1, 2, 3, 4] | select('odd') | list }} {{ [0, 1, none, 2] | select | list }} "
       "{{ [1, 2, 3] | reject('even') | list }} {{ ['a', 'b'] | map('upper') | list }}",
       NULL, "[1, 3] [1, 2] [1, 3] ['A', 'B']");
    EQ("{{ nothing | default('d') }} {{ '' | default('e', true) }} {{ none | default('n') }} "
       "{{ nothing | length }}",
       NULL, "d e None 0");
    EQ("{{ {'k': [1, {'n': '\xc3\xa9\\n\"\\\\'}], 'f': 1.0, 'b': false, 'z': none} | tojson }}",
       NULL,
       "{\"k\": [1, {\"n\": \"\xc3\xa9\\n\\\"\\\\\"}], \"f\": 1.0, \"b\": false, \"z\": null}");
    EQ("{{ {'k': [1], 'e': [], 'd': {}} | tojson(indent=2) }}", NULL,
       "{\n  \"k\": [\n    1\n  ],\n  \"e\": [],\n  \"d\": {}\n}");
    EQ("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }} "
       "{{ '\xc3\xbc' | tojson(ensure_ascii=true) }}",
       NULL, "{\"a\": 2, \"b\": 1} \"\\u00fc\"");
    EQ("{{ range(3) | list }} {{ range(5, 0, -2) | list }} {{ [1,2,3] | sum }} "
       "{{ [3,1,2] | max }} {{ 'ab' | reverse }} {{ 'l1\\nl2\\n\\nl3' | indent(2) }}",
       NULL, "[0, 1, 2] [5, 3, 1] 6 3 ba l1\n  l2\n\n  l3");
}

static void test_tests_and_methods(void)
{
    EQ("{{ x is defined }} {{ messages is defined }} {{ none is none }} {{ 1 is number }} "
       "{{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ true is boolean }} "
       "{{ 1 is boolean }} {{ 3 is divisibleby 3 }} {{ 2 is in [1, 2] }} {{ 'a' is eq 'a' }} "
       "{{ 5 is gt 3 }} {{ x is undefined }} {{ false is false }} {{ [] is sequence }}",
       MSGS, "False True True True True True True True False True True True True True True True");
    EQ("{{ ' a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} "
       "[{{ '  x '.strip() }}|{{ '  x '.lstrip() }}|{{ '  x '.rstrip() }}|{{ 'xyx'.strip('x') }}] "
       "{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} {{ 'Ab'.upper() }}"
       "{{ 'Ab'.lower() }} {{ 'aXa'.replace('a', 'b') }} {{ \"it's\".title() }}",
       NULL, "['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b,c'] [x|x |  x|y] True True ABab "
             "bXb It'S");
    EQ("{{ {'a': 1}.items() | list }} {{ {'a': 1}.keys() | list }} {{ {'a': 1}.values() | list }} "
       "{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b') }} {{ {'a': 1}.get('b', 7) }}",
       NULL, "[('a', 1)] ['a'] [1] 1 None 7");
    /* what filters that yield return is a generator: true even when empty, no len() */
    EQ("{{ [] | select | list }}{{ 'T' if ([] | select) else 'F' }} {{ {'a': 1}.keys() }} "
       "{{ {'a': 1}.items() }} {{ [1, 2] | reverse | list }}",
       NULL, "[]T dict_keys(['a']) dict_items([('a', 1)]) [2, 1]");
    CHECK(fails_with("{{ [1] | select | length }}", NULL, "has no len()", NULL));
    CHECK(fails_with("{{ [1] | map('string') }}", NULL, "add |list", NULL));
    /* round as Python's: half to even, an int stays an int */
    EQ("{{ 2.5 | round }} {{ 3.5 | round }} {{ 1 | round }} {{ 2.567 | round(2) }} "
       "{{ 2.1 | round(0, 'ceil') }}",
       NULL, "2.0 4.0 1 2.57 3.0");
}

static void test_statements(void)
{
    EQ("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
       "{{ loop.first }}{{ loop.last }}{{ loop.length }}"
       "{{ loop.previtem.role if loop.previtem is defined }}"
       "{{ loop.cycle('o', 'e') }};{% endfor %}",
       MSGS, "104TrueFalse4o;213FalseFalse4systeme;322FalseFalse4usero;"
             "431FalseTrue4assistante;");
    EQ("{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }} "
       "{% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
       MSGS, "1user 2assistant 3user |empty");
    EQ("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", NULL,
       "a=1;b=2;");
    EQ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
       "{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
       NULL, "0134");
    /* a set inside a loop is per iteration and not seen after it */
    EQ("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
       NULL, "231");
    EQ("{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'user' %}"
       "{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ ns.n }}",
       MSGS, "2");
    EQ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set blk %} in {{ a }} {% endset %}[{{ blk }}]"
       "{% set up | upper %}x{% endset %}{{ up }}",
       NULL, "12[ in 1 ]X");
    EQ("{% macro g(name, p='!') -%}\nHi {{ name }}{{ p }}\n{%- endmacro %}"
       "{{ g('A') }} {{ g('B', '?') }} {{ g(p='.', name='C') }} {{ g() }}|",
       NULL, "Hi A! Hi B? Hi C. Hi !|");
    EQ("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}"
       "{% filter upper %}f{% endfilter %}{% with y = 5 %}{{ y }}{% endwith %}[{{ y }}]",
       NULL, "<in>F5[]");
    EQ("{% raw %}{{ x }}{% if %}{% endraw %}{# gone #}", NULL, "{{ x }}{% if %}");
    EQ("{% if false %}a{% elif true %}b{% else %}c{% endif %}", NULL, "b");
}

static void test_whitespace(void)
{
    /* trim_blocks eats the newline after a block tag, lstrip_blocks the indentation
     * before it; "-" strips all whitespace, "+" turns lstrip off; one trailing newline
     * of the template goes */
    EQ("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", NULL, "a\n  b\nc");
    EQ("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    EQ("x\n  {%+ if true %}y{% endif %}", NULL, "x\n  y");
    EQ("{{ 'a' }}\n{{- 'b' }} {{ 'c' -}}\n  d", NULL, "ab cd");
    EQ("a\r\nb\r\n\r\n", NULL, "a\nb\n");
    EQ("  {# c #}\nx", NULL, "x");
}

static void test_generation_spans(void)
{
    ft_err err;
    ft_jinja *t;
    CHECK(ft_jinja_compile(&t, "<s>{% for m in messages %}[{{ m.role }}]"
                               "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
                               "<e>{% endgeneration %}{% endif %}{% endfor %}",
                           &err) == 0);
    CHECK(ft_jinja_has_generation(t));
    json_t *v = json_loads(MSGS, 0, NULL);
    char *out;
    size_t len, n;
    ft_jinja_span *sp;
    CHECK(ft_jinja_render(t, v, NULL, &out, &len, &sp, &n, &err) == 0);
    CHECK(!strcmp(out, "<s>[system][user][assistant]yo<e>[user]"));
    CHECK(n == 1 && sp[0].start == strlen("<s>[system][user][assistant]") &&
          sp[0].end == sp[0].start + strlen("yo<e>"));
    free(out);
    free(sp);
    json_decref(v);
    ft_jinja_free(t);
    CHECK(ft_jinja_compile(&t, "{{ x }}", &err) == 0 && !ft_jinja_has_generation(t));
    ft_jinja_free(t);
}

static void test_errors(void)
{
    /* a construct the parser does not know names the line and column */
    CHECK(fails_with("a\n{% include 'x' %}", NULL, "line 2, column 4",
                     "unsupported statement 'include'"));
    CHECK(fails_with("{% for x in y recursive %}{% endfor %}", NULL, "line 1", "recursive"));
    CHECK(fails_with("\n\n{{ x | nosuchfilter }}", NULL, "line 3", "nosuchfilter"));
    CHECK(fails_with("{{ x is nosuchtest }}", NULL, "line 1", "nosuchtest"));
    CHECK(fails_with("{% if x %}\nno end", NULL, "line 1", "endif"));
    CHECK(fails_with("{{ 'abc }}", NULL, "line 1", "unterminated string"));
    CHECK(fails_with("x {{ a + }}", NULL, "line 1, column", "unexpected"));
    CHECK(fails_with("{% endfor %}", NULL, "line 1", "endfor"));
    CHECK(fails_with("{# open", NULL, "line 1", "comment"));
    CHECK(fails_with("{{ 'x' % 2 }}", NULL, "line 1", "%-formatting"));
    /* raise_exception carries the template's message */
    CHECK(fails_with("a\nb {{ raise_exception('Roles must alternate!') }}", NULL, "line 2",
                     "raise_exception: Roles must alternate!"));
    /* jinja2's default Undefined: attribute of an undefined value is an error */
    CHECK(fails_with("{{ nothing.attr }}", NULL, "'nothing' is undefined", NULL));
    CHECK(fails_with("{{ nothing + 1 }}", NULL, "'nothing' is undefined", NULL));
    CHECK(fails_with("{{ [].append(1) }}", NULL, "list.append", NULL));
    CHECK(fails_with("{% set x = 1 %}{% set x.a = 2 %}", NULL, "non-namespace", NULL));
    CHECK(fails_with("{{ 1 // 0 }}", NULL, "division by zero", NULL));
    CHECK(fails_with("{{ 1 < 'a' }}", NULL, "not supported between", NULL));
    CHECK(fails_with("{{ undefined_var | tojson }}", NULL, "not JSON serializable", NULL));
}

static void test_limits(void)
{
    ft_err err;
    ft_jinja_limits lim = {.max_output = 1 << 20, .max_memory = 32 << 20,
                           .max_steps = 2000000, .max_depth = 32};
    CHECK(!render_l("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim,
                    &err) && strstr(err.msg, "nested too deeply"));
    CHECK(!render_l("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}"
                    "{% endfor %}", NULL, &lim, &err) && strstr(err.msg, "limit exceeded"));
    CHECK(!render_l("{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxx{% endfor %}", NULL, &lim,
                    &err) && strstr(err.msg, "output limit"));
    CHECK(!render_l("{{ 'x' * 100000000 }}", NULL, &lim, &err) && strstr(err.msg, "memory"));
    CHECK(!render_l("{{ range(1000000000) | list }}", NULL, &lim, &err));
    /* parsing depth is bounded too */
    size_t n = 5000;
    char *deep = malloc(n * 12 + 16);
    strcpy(deep, "{{ ");
    for (size_t i = 0; i < n; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (size_t i = 0; i < n; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    CHECK(!render_l(deep, NULL, &lim, &err) && strstr(err.msg, "nested too deeply"));
    deep[0] = 0;
    for (size_t i = 0; i < n; i++)
        strcat(deep, "{% if 1 %}");
    CHECK(!render_l(deep, NULL, &lim, &err) && strstr(err.msg, "nested too deeply"));
    /* macro recursion inside deep blocks: bounded by the stack it takes, not a crash */
    strcpy(deep, "{% macro f(d) %}");
    for (int i = 0; i < 185; i++)
        strcat(deep, "{% if true %}");
    strcat(deep, "{{ f(d + 1) }}");
    for (int i = 0; i < 185; i++)
        strcat(deep, "{% endif %}");
    strcat(deep, "{% endmacro %}{{ f(0) }}");
    CHECK(!render_l(deep, NULL, NULL, &err) && strstr(err.msg, "nested too deeply"));
    free(deep);
}

int main(void)
{
    RUN(test_expressions);
    RUN(test_filters);
    RUN(test_tests_and_methods);
    RUN(test_statements);
    RUN(test_whitespace);
    RUN(test_generation_spans);
    RUN(test_errors);
    RUN(test_limits);
    return check_summary("jinja");
}
