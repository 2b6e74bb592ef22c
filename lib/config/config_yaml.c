/* The YAML reader of the run config (see config.h): libyaml's event parser over a file of
 * nested mappings, each leaf set through ft_config_set_key with "file:line" as its
 * source. */
#include "config/config.h"

#include <errno.h>
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

/* Reads the pairs of a mapping whose start event has been consumed. */
static int read_mapping(yaml_walk *w, yaml_parser_t *p, ft_err *err)
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
        yaml_event_delete(&k);
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

int ft_config_load_yaml(ft_config *c, const char *path, FILE *notes, ft_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return ft_fail(err, "%s: cannot open: %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    yaml_walk w = {.c = c, .path = path, .notes = notes};
    int rc = 0;
    bool done = false;
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
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_START_EVENT:
        case YAML_DOCUMENT_END_EVENT:
            break;
        case YAML_MAPPING_START_EVENT:
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
    return rc;
}

