/* Fuzzing the Jinja interpreter (lib/jinja/jinja.h): templates are input, so random and
 * mutated templates must compile or fail with a message, and render or fail with a
 * message, within the limits (no crash, no hang, no unbounded memory). The seeds are the
 * real chat templates of tests/conformance/templates/ (when run from the repository
 * root, as make test-unit does) plus hostile ones written here; the mutations splice in
 * Jinja tokens, delete, duplicate and flip bytes. Deterministic (a fixed seed), so a
 * failure reproduces; FT_FUZZ_ITERS sets the number of mutants (default 4000). Run
 * under AddressSanitizer (make ASAN=1 where the build offers it) to catch memory
 * errors that do not crash. */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "jinja/jinja.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static size_t below(size_t n) { return n ? (size_t)(next() % n) : 0; }

static const char *const SEEDS[] = {
    "{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}",
    "{% set ns = namespace(a=0) %}{% for x in range(5) if x is odd %}{% set ns.a = ns.a + x %}"
    "{% endfor %}{{ ns.a }}{{ loop }}",
    "{% macro m(a, b='x') %}{{ a ~ b }}{{ caller() if caller is defined }}{% endmacro %}"
    "{% call m(1) %}c{% endcall %}{{ m(2, b=3) }}",
    "{{ {'a': [1, 2.5, none, true], 'b': {'c': 'd'}} | tojson(indent=2) }}{{ 'abc'[::-1] }}",
    "{%- if messages[0]['role'] == 'system' -%}{{ raise_exception('no') }}{%- endif -%}"
    "{% raw %}{{ x }}{% endraw %}{# c #}{% generation %}g{% endgeneration %}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join }}"
    "{{ (messages | last).content.split(' ')[0].upper() }}{{ x if y else z }}",
};

/* Bits of Jinja the mutator splices in. */
static const char *const TOKENS[] = {
    "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", "{%+", "(", ")", "[",
    "]", "{", "}", ",", ".", ":", "|", "~", "+", "-", "*", "**", "/", "//", "%", "==", "!=",
    "<", ">=", "=", "'", "\"", "\\", "\n", " ", "for", "in", "endfor", "if", "elif", "else",
    "endif", "set", "endset", "macro", "endmacro", "call", "endcall", "caller()", "raw",
    "endraw", "filter", "endfilter", "generation", "endgeneration", "with", "endwith",
    "break", "continue", "not", "and", "or", "is", "defined", "none", "true", "loop",
    "loop.index", "namespace(", "range(", "range(1000000)", "messages", "messages[0]",
    "|tojson", "|trim", "|length", "|join", "|map(attribute='role')", "|selectattr(",
    "|items", "|dictsort", "|unique", "|default(", "[::-1]", "[1:2]", ".strip()",
    ".split(", ".items()", ".get(", "raise_exception(", "strftime_now('%Y')", "*1000000",
    "0", "1", "-1", "1.5e300", "9223372036854775807", "'\\u00e9'", "'\\x", "\xc3\xa9",
    "\xff", "{% for x in messages %}", "{% endfor %}", "{% if x %}", "{% endif %}",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
};

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = 0;
    fclose(f);
    return s;
}

static char *corpus[64];
static size_t n_corpus;

static void load_corpus(void)
{
    for (size_t i = 0; i < sizeof SEEDS / sizeof *SEEDS; i++)
        corpus[n_corpus++] = strdup(SEEDS[i]);
    const char *dir = "tests/conformance/templates";
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) && n_corpus < 64) {
        size_t l = strlen(e->d_name);
        if (l < 7 || strcmp(e->d_name + l - 6, ".jinja"))
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *s = slurp(path);
        if (s)
            corpus[n_corpus++] = s;
    }
    closedir(d);
}

/* One mutant of s (malloc'ed). */
static char *mutate(const char *s)
{
    size_t n = strlen(s), cap = n * 2 + 4096;
    char *m = malloc(cap);
    memcpy(m, s, n + 1);
    int edits = 1 + (int)below(8);
    for (int k = 0; k < edits; k++) {
        n = strlen(m);
        size_t at = below(n + 1);
        switch (below(5)) {
        case 0: { /* splice a token */
            const char *t = TOKENS[below(sizeof TOKENS / sizeof *TOKENS)];
            size_t tl = strlen(t);
            if (n + tl + 1 >= cap)
                break;
            memmove(m + at + tl, m + at, n - at + 1);
            memcpy(m + at, t, tl);
            break;
        }
        case 1: { /* delete a range */
            size_t len = below(n - at + 1);
            if (len > 64)
                len = below(64);
            memmove(m + at, m + at + len, n - at - len + 1);
            break;
        }
        case 2: { /* duplicate a range */
            size_t len = below(n - at + 1);
            if (len > 200)
                len = 200;
            if (n + len + 1 >= cap)
                break;
            memmove(m + at + len, m + at, n - at + 1);
            break;
        }
        case 3: /* flip a byte (never to NUL) */
            if (at < n)
                m[at] = (char)(1 + below(255));
            break;
        default: /* truncate */
            m[at] = 0;
            break;
        }
    }
    return m;
}

static json_t *vars;
static long n_compiled, n_rendered;

static void run_one(const char *src)
{
    ft_err err;
    ft_jinja *t;
    if (ft_jinja_compile(&t, src, &err)) {
        CHECK(err.msg[0] != 0);
        return;
    }
    n_compiled++;
    ft_jinja_limits lim = {.max_output = 1 << 20, .max_memory = 64 << 20,
                           .max_steps = 200000, .max_depth = 16};
    char *out = NULL;
    size_t len = 0, ns = 0;
    ft_jinja_span *sp = NULL;
    if (ft_jinja_render(t, vars, &lim, &out, &len, &sp, &ns, &err) == 0) {
        n_rendered++;
        CHECK(out && strlen(out) <= len && len <= lim.max_output);
        for (size_t i = 0; i < ns; i++)
            CHECK(sp[i].start <= sp[i].end && sp[i].end <= len);
    } else {
        CHECK(err.msg[0] != 0);
    }
    free(out);
    free(sp);
    ft_jinja_free(t);
}

static void test_seeds_render(void)
{
    for (size_t i = 0; i < n_corpus; i++)
        run_one(corpus[i]);
}

static void test_mutants(void)
{
    long iters = 4000;
    const char *e = getenv("FT_FUZZ_ITERS");
    if (e && atol(e) > 0)
        iters = atol(e);
    time_t t0 = time(NULL);
    for (long i = 0; i < iters; i++) {
        char *m = mutate(corpus[below(n_corpus)]);
        /* mutate a mutant sometimes: deeper changes */
        if (below(4) == 0) {
            char *m2 = mutate(m);
            free(m);
            m = m2;
        }
        run_one(m);
        free(m);
    }
    printf("jinja fuzz: %ld mutants, %ld compiled, %ld rendered, %lds\n", iters, n_compiled,
           n_rendered, (long)(time(NULL) - t0));
    CHECK(n_compiled > 0 && n_rendered > 0); /* the mutants reach the renderer */
}

static void test_random_bytes(void)
{
    char buf[512];
    for (int i = 0; i < 2000; i++) {
        size_t n = below(sizeof buf - 1);
        for (size_t k = 0; k < n; k++) {
            /* biased towards Jinja's punctuation */
            static const char alpha[] = "{}%#-+()[]|.,:'\"~=<>! \nabcxyz019_";
            buf[k] = below(4) ? alpha[below(sizeof alpha - 1)] : (char)(1 + below(255));
        }
        buf[n] = 0;
        run_one(buf);
    }
}

int main(void)
{
    load_corpus();
    vars = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"s\"},"
                      "{\"role\": \"user\", \"content\": \"hi there\"},"
                      "{\"role\": \"assistant\", \"content\": \"<think>a</think>b\"},"
                      "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]}],"
                      "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}],"
                      "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
                      "\"add_generation_prompt\": true}",
                      0, NULL);
    RUN(test_seeds_render);
    RUN(test_mutants);
    RUN(test_random_bytes);
    for (size_t i = 0; i < n_corpus; i++)
        free(corpus[i]);
    json_decref(vars);
    return check_summary("jinja_fuzz");
}
