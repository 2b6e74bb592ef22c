/* The YAML reader of the run config (see config.h): libyaml's event parser over a file of
 * nested mappings, each leaf set through ft_config_set_key with "file:line" as its
 * source. One document, one mapping; a key given twice in a mapping and an empty file are
 * errors naming the file (and line and dotted key). */
#include "config/config.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* A nested mapping walked with libyaml's event parser; the dotted key of the current
 * position is prefix[0..depth). Sequences become comma-separated strings. */
typedef struct yaml_walk {
    ft_config *c;
    const char *path;
    FILE *notes;
    char prefix[8][64];
    int depth;
} yaml_walk;

static void dotted(const yaml_walk *w, const char *last, char *out, size_t n)
{
    out[0] = '\0';
    for (int i = 0; i < w->depth; i++) {
        strncat(out, w->prefix[i], n - strlen(out) - 1);
        strncat(out, ".", n - strlen(out) - 1);
    }
    strncat(out, last, n - strlen(out) - 1);
}

static bool is_null_scalar(const yaml_event_t *e)
{
    const char *v = (const char *)e->data.scalar.value;
    return e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*v || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 ||
            strcmp(v, "NULL") == 0);
}

static int next_event(yaml_parser_t *p, yaml_event_t *e, const char *path, ft_err *err)
{
    if (!yaml_parser_parse(p, e))
        return ft_fail(err, "%s:%zu: YAML error: %s", path, p->problem_mark.line + 1,
                       p->problem ? p->problem : "malformed");
    return 0;
}

/* Reads a sequence of scalars (after its start event) into "a,b,c". */
static int read_sequence(yaml_parser_t *p, const char *path, char *out, size_t n, ft_err *err)
{
    out[0] = '\0';
    for (;;) {
        yaml_event_t e;
        if (next_event(p, &e, path, err))
            return -1;
        if (e.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&e);
            return 0;
        }
        if (e.type != YAML_SCALAR_EVENT) {
            size_t line = e.start_mark.line + 1;
            yaml_event_delete(&e);
            return ft_fail(err, "%s:%zu: a list may hold only plain values", path, line);
        }
        if (out[0])
            strncat(out, ",", n - strlen(out) - 1);
        strncat(out, (const char *)e.data.scalar.value, n - strlen(out) - 1);
        yaml_event_delete(&e);
    }
}

/* The keys of one mapping read so far, with their lines: a key given twice is an error
 * (YAML says keys are unique; libyaml and PyYAML keep the last one silently). */
typedef struct seen_keys {
    char **name;
    size_t *line;
    size_t n, cap;
} seen_keys;

static void seen_free(seen_keys *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->name[i]);
    free(s->name);
    free(s->line);
}

/* Records key name at line; fails if this mapping has it already. */
static int seen_add(seen_keys *s, const yaml_walk *w, const char *name, size_t line,
                    ft_err *err)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0) {
            char key[256];
            dotted(w, name, key, sizeof key);
            return ft_fail(err, "%s:%zu: key '%s' is given twice (first on line %zu)", w->path,
                           line, key, s->line[i]);
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        char **nn = realloc(s->name, cap * sizeof *nn);
        if (nn)
            s->name = nn;
        size_t *nl = realloc(s->line, cap * sizeof *nl);
        if (nl)
            s->line = nl;
        if (!nn || !nl)
            return ft_fail(err, "%s: out of memory", w->path);
        s->cap = cap;
    }
    if (!(s->name[s->n] = strdup(name)))
        return ft_fail(err, "%s: out of memory", w->path);
    s->line[s->n++] = line;
    return 0;
}

static int read_mapping(yaml_walk *w, yaml_parser_t *p, ft_err *err);

/* ---- a YAML value as JSON text (the value of a JSON key) ------------------------------ */

typedef struct json_text {
    char *s;
    size_t n, cap;
} json_text;

static int jt_put(json_text *t, const char *s, size_t n)
{
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        while (cap < t->n + n + 1)
            cap *= 2;
        char *ns = realloc(t->s, cap);
        if (!ns)
            return -1;
        t->s = ns;
        t->cap = cap;
    }
    memcpy(t->s + t->n, s, n);
    t->n += n;
    t->s[t->n] = '\0';
    return 0;
}

static int jt_puts(json_text *t, const char *s) { return jt_put(t, s, strlen(s)); }

/* A string as JSON (quoted, escaped); -1 when it is not UTF-8 or out of memory. */
static int jt_string(json_text *t, const char *s)
{
    json_t *j = json_string(s);
    char *q = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    int rc = q ? jt_puts(t, q) : -1;
    free(q);
    json_decref(j);
    return rc;
}

static bool all_digits(const char *s, const char *set)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!strchr(set, *s))
            return false;
    return true;
}

/* A YAML 1.2 float: [-+]?(.d+|d+(.d*)?)([eE][-+]?d+)? */
static bool is_float(const char *s)
{
    if (*s == '-' || *s == '+')
        s++;
    size_t a = strspn(s, "0123456789");
    s += a;
    size_t b = 0;
    if (*s == '.') {
        s++;
        b = strspn(s, "0123456789");
        s += b;
    }
    if (!a && !b)
        return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '-' || *s == '+')
            s++;
        size_t e = strspn(s, "0123456789");
        if (!e)
            return false;
        s += e;
    }
    return !*s;
}

/* A plain scalar as JSON, resolved by YAML 1.2's core schema: null, true / false,
 * integers (decimal, 0x hex, 0o octal), floats; anything else is a string. YAML 1.1's
 * booleans (yes, no, on, off) are refused (PyYAML would read a boolean, YAML 1.2 a
 * string), and so are .inf and .nan (JSON has none). */
static int plain_scalar(json_text *t, const char *v, const char *where, ft_err *err)
{
    static const char *const NULLS[] = {"", "~", "null", "Null", "NULL"};
    static const char *const TRUES[] = {"true", "True", "TRUE"};
    static const char *const FALSES[] = {"false", "False", "FALSE"};
    static const char *const YAML11[] = {"yes", "Yes", "YES", "no", "No", "NO",
                                         "on", "On", "ON", "off", "Off", "OFF", "y", "Y",
                                         "n", "N"};
    for (size_t i = 0; i < 5; i++)
        if (!strcmp(v, NULLS[i]))
            return jt_puts(t, "null");
    for (size_t i = 0; i < 3; i++) {
        if (!strcmp(v, TRUES[i]))
            return jt_puts(t, "true");
        if (!strcmp(v, FALSES[i]))
            return jt_puts(t, "false");
    }
    for (size_t i = 0; i < sizeof YAML11 / sizeof *YAML11; i++)
        if (!strcmp(v, YAML11[i]))
            return ft_fail(err, "%s: '%s' is a boolean to YAML 1.1 and a string to YAML 1.2: "
                                "write true or false, or quote it for a string", where, v);
    const char *d = v + (*v == '-' || *v == '+');
    char num[64];
    if (all_digits(d, "0123456789") ||
        (d == v && !strncmp(v, "0x", 2) && all_digits(v + 2, "0123456789abcdefABCDEF")) ||
        (d == v && !strncmp(v, "0o", 2) && all_digits(v + 2, "01234567"))) {
        errno = 0;
        long long x = d != v || (strncmp(v, "0x", 2) && strncmp(v, "0o", 2))
                          ? strtoll(v, NULL, 10)
                          : strtoll(v + 2, NULL, v[1] == 'x' ? 16 : 8);
        if (errno)
            return ft_fail(err, "%s: the integer %s is out of range", where, v);
        snprintf(num, sizeof num, "%lld", x);
        return jt_puts(t, num);
    }
    if (is_float(v)) {
        double x = strtod(v, NULL);
        for (int digits = 15; digits <= 17; digits++) { /* the shortest that reads back */
            snprintf(num, sizeof num, "%.*g", digits, x);
            if (strtod(num, NULL) == x)
                break;
        }
        if (!strpbrk(num, ".eEin"))
            strcat(num, ".0"); /* stays a float */
        if (strpbrk(num, "in")) /* inf: past the double range */
            return ft_fail(err, "%s: the number %s is out of range", where, v);
        return jt_puts(t, num);
    }
    const char *low = d;
    if (!strcmp(low, ".inf") || !strcmp(low, ".Inf") || !strcmp(low, ".INF") ||
        !strcmp(v, ".nan") || !strcmp(v, ".NaN") || !strcmp(v, ".NAN"))
        return ft_fail(err, "%s: %s has no JSON form", where, v);
    return jt_string(t, v);
}

/* Writes the YAML value that starts with event e (consumed by the caller) as JSON. */
static int json_value(yaml_parser_t *p, yaml_event_t *e, json_text *t, const char *path,
                      int depth, ft_err *err)
{
    char where[512];
    snprintf(where, sizeof where, "%s:%zu", path, e->start_mark.line + 1);
    if (depth > 32)
        return ft_fail(err, "%s: nesting too deep", where);
    if (e->type == YAML_SCALAR_EVENT) {
        const char *v = (const char *)e->data.scalar.value;
        int rc = e->data.scalar.style == YAML_PLAIN_SCALAR_STYLE
                     ? plain_scalar(t, v, where, err)
                     : jt_string(t, v);
        if (rc && !err->msg[0])
            return ft_fail(err, "%s: a string that is not UTF-8, or out of memory", where);
        return rc;
    }
    bool map = e->type == YAML_MAPPING_START_EVENT;
    if (!map && e->type != YAML_SEQUENCE_START_EVENT)
        return ft_fail(err, "%s: unsupported YAML construct (anchors and aliases are not "
                            "supported)", where);
    if (jt_puts(t, map ? "{" : "["))
        return ft_fail(err, "%s: out of memory", where);
    for (int i = 0;; i++) {
        yaml_event_t k;
        if (next_event(p, &k, path, err))
            return -1;
        if (k.type == YAML_MAPPING_END_EVENT || k.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&k);
            return jt_puts(t, map ? "}" : "]") ? ft_fail(err, "%s: out of memory", where) : 0;
        }
        int rc = i && jt_puts(t, ", ") ? ft_fail(err, "%s: out of memory", where) : 0;
        if (rc == 0 && map) {
            if (k.type != YAML_SCALAR_EVENT)
                rc = ft_fail(err, "%s:%zu: keys must be plain names", path,
                             k.start_mark.line + 1);
            else if (jt_string(t, (const char *)k.data.scalar.value) || jt_puts(t, ": "))
                rc = ft_fail(err, "%s:%zu: a key that is not UTF-8, or out of memory", path,
                             k.start_mark.line + 1);
            yaml_event_delete(&k);
            if (rc == 0 && next_event(p, &k, path, err))
                return -1;
        }
        if (rc == 0)
            rc = json_value(p, &k, t, path, depth + 1, err);
        yaml_event_delete(&k);
        if (rc)
            return -1;
    }
}

/* Reads the pairs of a mapping whose start event has been consumed, into seen. */
static int read_pairs(yaml_walk *w, yaml_parser_t *p, seen_keys *seen, ft_err *err)
{
    for (;;) {
        yaml_event_t k;
        if (next_event(p, &k, w->path, err))
            return -1;
        if (k.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&k);
            return 0;
        }
        size_t line = k.start_mark.line + 1;
        if (k.type != YAML_SCALAR_EVENT) {
            yaml_event_delete(&k);
            return ft_fail(err, "%s:%zu: keys must be plain names", w->path, line);
        }
        char name[64];
        snprintf(name, sizeof name, "%s", (const char *)k.data.scalar.value);
        int dup = seen_add(seen, w, (const char *)k.data.scalar.value, line, err);
        yaml_event_delete(&k);
        if (dup)
            return -1;
        char key[256], where[512];
        dotted(w, name, key, sizeof key);
        snprintf(where, sizeof where, "%s:%zu", w->path, line);

        yaml_event_t v;
        if (next_event(p, &v, w->path, err))
            return -1;
        int rc = 0;
        const ft_cfg_key *ck = ft_config_find_key(key);
        if (ck && ck->type == FT_CFG_JSON &&
            (v.type == YAML_MAPPING_START_EVENT || v.type == YAML_SEQUENCE_START_EVENT)) {
            /* a JSON key's mapping is its value, as JSON text */
            json_text t = {0};
            err->msg[0] = '\0';
            rc = json_value(p, &v, &t, w->path, 0, err);
            if (rc == 0)
                rc = ft_config_set_key(w->c, key, t.s, where, w->notes, err);
            free(t.s);
        } else if (v.type == YAML_MAPPING_START_EVENT) {
            if (w->depth == 8) {
                rc = ft_fail(err, "%s: nesting too deep", where);
            } else {
                snprintf(w->prefix[w->depth++], sizeof w->prefix[0], "%s", name);
                rc = read_mapping(w, p, err);
                w->depth--;
            }
        } else if (v.type == YAML_SEQUENCE_START_EVENT) {
            char list[1024];
            rc = read_sequence(p, w->path, list, sizeof list, err);
            if (rc == 0)
                rc = ft_config_set_key(w->c, key, list, where, w->notes, err);
        } else if (v.type == YAML_SCALAR_EVENT) {
            if (is_null_scalar(&v) && ft_config_find_key(key))
                ft_config_reset_key(w->c, key);
            else
                rc = ft_config_set_key(w->c, key, (const char *)v.data.scalar.value, where,
                                       w->notes, err);
        } else {
            rc = ft_fail(err, "%s: unsupported YAML construct (anchors and aliases are not "
                              "supported)",
                         where);
        }
        yaml_event_delete(&v);
        if (rc)
            return -1;
    }
}

/* Reads a mapping whose start event has been consumed. */
static int read_mapping(yaml_walk *w, yaml_parser_t *p, ft_err *err)
{
    seen_keys seen = {0};
    int rc = read_pairs(w, p, &seen, err);
    seen_free(&seen);
    return rc;
}

int ft_config_load_yaml(ft_config *c, const char *path, FILE *notes, ft_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return ft_fail(err, "%s: cannot open: %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    yaml_walk w = {.c = c, .path = path, .notes = notes};
    int rc = 0, documents = 0;
    bool done = false, mapping = false;
    while (!done && rc == 0) {
        yaml_event_t e;
        if (next_event(&p, &e, path, err)) {
            rc = -1;
            break;
        }
        switch (e.type) {
        case YAML_STREAM_END_EVENT:
            done = true;
            break;
        case YAML_DOCUMENT_START_EVENT:
            /* a second document would set the keys again, the last one winning */
            if (++documents > 1)
                rc = ft_fail(err, "%s:%zu: a second YAML document ('---'); a run config is one "
                                  "mapping",
                             path, e.start_mark.line + 1);
            break;
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
            break;
        case YAML_MAPPING_START_EVENT:
            mapping = true;
            rc = read_mapping(&w, &p, err);
            break;
        case YAML_SCALAR_EVENT:
            if (!is_null_scalar(&e))
                rc = ft_fail(err, "%s:%zu: the config must be a mapping of sections", path,
                             e.start_mark.line + 1);
            break;
        default:
            rc = ft_fail(err, "%s:%zu: the config must be a mapping of sections", path,
                         e.start_mark.line + 1);
        }
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&p);
    fclose(f);
    /* YAML reads an empty file as null, not as a mapping: a run config without a single
     * key (model.name is required) is a mistake, said here where the file is known */
    if (rc == 0 && !mapping)
        rc = ft_fail(err, "%s: the file is empty (no keys); a run config needs at least "
                          "model.name (configs/README.md lists the keys)",
                     path);
    return rc;
}

