/* The YAML reader of the run config (see config.h): libyaml's event parser over a file of
 * nested mappings, each leaf set through ft_config_set_key with "file:line" as its
 * source. One document, one mapping; a key given twice in a mapping and an empty file are
 * errors naming the file (and line and dotted key). */
#include "config/config.h"

#include <errno.h>
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
        if (v.type == YAML_MAPPING_START_EVENT) {
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

