/* The run config (see config.h): values are kept as validated canonical text, one slot
 * per schema key; getters parse them. */
#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

struct ft_config {
    size_t n;
    char **value; /* NULL = unset (no default) */
    bool *given;  /* set by the user (not a default): ft_config_is_explicit */
};

static size_t schema_len(void)
{
    size_t n = 0;
    while (ft_config_schema()[n].name)
        n++;
    return n;
}

static int key_index(const char *key)
{
    const ft_cfg_key *s = ft_config_schema();
    for (int i = 0; s[i].name; i++)
        if (strcmp(s[i].name, key) == 0)
            return i;
    return -1;
}

ft_config *ft_config_new(void)
{
    ft_config *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->n = schema_len();
    c->value = calloc(c->n, sizeof *c->value);
    c->given = calloc(c->n, sizeof *c->given);
    if (!c->value || !c->given) {
        free(c->value);
        free(c->given);
        free(c);
        return NULL;
    }
    for (size_t i = 0; i < c->n; i++)
        if (ft_config_schema()[i].dflt)
            c->value[i] = strdup(ft_config_schema()[i].dflt);
    return c;
}

ft_config *ft_config_clone(const ft_config *src)
{
    ft_config *c = ft_config_new();
    if (!c)
        return NULL;
    for (size_t i = 0; i < c->n; i++) {
        free(c->value[i]);
        c->value[i] = NULL;
        if (src->value[i] && !(c->value[i] = strdup(src->value[i]))) {
            ft_config_free(c);
            return NULL;
        }
        c->given[i] = src->given[i];
    }
    return c;
}

void ft_config_free(ft_config *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->value[i]);
    free(c->value);
    free(c->given);
    free(c);
}

size_t ft_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    size_t *row = malloc((lb + 1) * sizeof *row);
    if (!row)
        return (size_t)-1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    size_t d = row[lb];
    free(row);
    return d;
}

static int unknown_key(const char *where, const char *key, ft_err *err)
{
    const ft_cfg_key *s = ft_config_schema();
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (int i = 0; s[i].name; i++) {
        size_t d = ft_edit_distance(key, s[i].name);
        if (d < best_d) {
            best_d = d;
            best = s[i].name;
        }
    }
    size_t limit = strlen(key) / 3 > 2 ? strlen(key) / 3 : 2;
    if (best && best_d <= limit)
        return ft_fail(err, "%s: unknown key '%s' (did you mean '%s'?)", where, key, best);
    return ft_fail(err, "%s: unknown key '%s' (see configs/README.md for the keys)", where, key);
}

static bool parse_bool(const char *t, bool *out)
{
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(t, yes[i]) == 0)
            return *out = true, true;
        if (strcasecmp(t, no[i]) == 0)
            return *out = false, true;
    }
    return false;
}

static bool in_choices(const char *choices, const char *t)
{
    size_t n = strlen(t);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, t, n) == 0)
            return true;
        if (!bar)
            break;
        p = bar + 1;
    }
    return false;
}

/* Validates text for key i and stores its canonical form. where names the source. */
static int set_value(ft_config *c, int i, const char *text, const char *where, ft_err *err)
{
    const ft_cfg_key *k = &ft_config_schema()[i];
    char canon[64];
    const char *store = text;
    if (k->allow_auto && strcmp(text, "auto") == 0) {
        store = "auto";
    } else {
        switch (k->type) {
        case FT_CFG_INT: {
            char *end;
            errno = 0;
            long v = strtol(text, &end, 10);
            if (!*text || *end || errno)
                return ft_fail(err, "%s: key '%s' must be an integer%s, got '%s'", where, k->name,
                               k->allow_auto ? " or auto" : "", text);
            if (!isnan(k->min) && v < k->min)
                return ft_fail(err, "%s: key '%s' must be >= %g, got %ld", where, k->name, k->min,
                               v);
            if (!isnan(k->max) && v > k->max)
                return ft_fail(err, "%s: key '%s' must be <= %g, got %ld", where, k->name, k->max,
                               v);
            snprintf(canon, sizeof canon, "%ld", v);
            store = canon;
            break;
        }
        case FT_CFG_FLOAT: {
            char *end;
            errno = 0;
            double v = strtod(text, &end);
            if (!*text || *end || errno || !isfinite(v))
                return ft_fail(err, "%s: key '%s' must be a number%s, got '%s'", where, k->name,
                               k->allow_auto ? " or auto" : "", text);
            if (!isnan(k->min) && v < k->min)
                return ft_fail(err, "%s: key '%s' must be >= %g, got %g", where, k->name, k->min,
                               v);
            if (!isnan(k->max) && v > k->max)
                return ft_fail(err, "%s: key '%s' must be <= %g, got %g", where, k->name, k->max,
                               v);
            snprintf(canon, sizeof canon, "%.17g", v);
            store = canon;
            break;
        }
        case FT_CFG_BOOL: {
            bool b;
            if (!parse_bool(text, &b))
                return ft_fail(err, "%s: key '%s' must be true or false, got '%s'", where, k->name,
                               text);
            store = b ? "true" : "false";
            break;
        }
        case FT_CFG_ENUM:
            if (!in_choices(k->choices, text))
                return ft_fail(err, "%s: key '%s' must be one of %s, got '%s'", where, k->name,
                               k->choices, text);
            break;
        case FT_CFG_STRING:
            break;
        }
    }
    char *copy = strdup(store);
    if (!copy)
        return ft_fail(err, "out of memory");
    free(c->value[i]);
    c->value[i] = copy;
    c->given[i] = true;
    return 0;
}

static int set_key(ft_config *c, const char *key, const char *text, const char *where,
                   FILE *notes, ft_err *err)
{
    int i = key_index(key);
    if (i < 0)
        return unknown_key(where, key, err);
    if (set_value(c, i, text, where, err))
        return -1;
    const ft_cfg_key *k = &ft_config_schema()[i];
    if (k->moot && notes)
        fprintf(notes, "note: %s: '%s' has no effect here: %s\n", where, key, k->moot);
    return 0;
}

int ft_config_set(ft_config *c, const char *assignment, FILE *notes, ft_err *err)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return ft_fail(err, "--set '%s': expected key=value", assignment);
    char key[128];
    size_t n = (size_t)(eq - assignment);
    if (n >= sizeof key)
        return ft_fail(err, "--set '%s': key too long", assignment);
    memcpy(key, assignment, n);
    key[n] = '\0';
    return set_key(c, key, eq + 1, "--set", notes, err);
}

int ft_config_set_key(ft_config *c, const char *key, const char *value, const char *where,
                      FILE *notes, ft_err *err)
{
    return set_key(c, key, value, where, notes, err);
}

const char *ft_config_key_for_var(const char *var)
{
    const ft_cfg_key *s = ft_config_schema();
    for (int i = 0; s[i].name; i++) {
        const char *a = s[i].name, *b = var;
        for (; *a && *b; a++, b++)
            if ((*a == '.' ? '_' : toupper((unsigned char)*a)) != *b)
                break;
        if (!*a && !*b)
            return s[i].name;
    }
    return NULL;
}

/* The Make-style variable of a key: train.batch_size -> TRAIN_BATCH_SIZE. */
static void var_of_key(const char *key, char *out, size_t n)
{
    size_t i = 0;
    for (; key[i] && i + 1 < n; i++)
        out[i] = key[i] == '.' ? '_' : (char)toupper((unsigned char)key[i]);
    out[i] = '\0';
}

int ft_config_set_var(ft_config *c, const char *assignment, FILE *notes, ft_err *err)
{
    const char *eq = strchr(assignment, '=');
    char name[128];
    if (!eq || eq == assignment || (size_t)(eq - assignment) >= sizeof name)
        return ft_fail(err, "--set-var '%s': expected NAME=value, e.g. TRAIN_BATCH_SIZE=4",
                       assignment);
    memcpy(name, assignment, (size_t)(eq - assignment));
    name[eq - assignment] = '\0';
    const char *key = ft_config_key_for_var(name);
    if (!key) {
        char best[128] = "", var[128];
        size_t best_d = (size_t)-1;
        for (const ft_cfg_key *k = ft_config_schema(); k->name; k++) {
            var_of_key(k->name, var, sizeof var);
            size_t d = ft_edit_distance(name, var);
            if (d < best_d) {
                best_d = d;
                snprintf(best, sizeof best, "%s", var);
            }
        }
        size_t limit = strlen(name) / 3 > 2 ? strlen(name) / 3 : 2;
        if (best_d <= limit)
            return ft_fail(err, "variable %s names no config key (did you mean %s?)", name, best);
        return ft_fail(err, "variable %s names no config key (SECTION_KEY of a key in "
                            "configs/README.md, e.g. TRAIN_BATCH_SIZE for train.batch_size)",
                       name);
    }
    char where[160];
    snprintf(where, sizeof where, "--set-var %s (%s)", name, key);
    return set_key(c, key, eq + 1, where, notes, err);
}

/* ---- YAML --------------------------------------------------------------------- */

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
                rc = set_key(w->c, key, list, where, w->notes, err);
        } else if (v.type == YAML_SCALAR_EVENT) {
            int i = key_index(key);
            if (i < 0) {
                rc = unknown_key(where, key, err);
            } else if (is_null_scalar(&v)) {
                const char *d = ft_config_schema()[i].dflt;
                free(w->c->value[i]);
                w->c->value[i] = d ? strdup(d) : NULL;
                w->c->given[i] = false;
            } else {
                rc = set_key(w->c, key, (const char *)v.data.scalar.value, where, w->notes, err);
            }
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

/* ---- getters -------------------------------------------------------------------- */

static const char *raw(const ft_config *c, const char *key, ft_cfg_type want)
{
    int i = key_index(key);
    if (i < 0 || (ft_config_schema()[i].type != want &&
                  !(want == FT_CFG_STRING && ft_config_schema()[i].type == FT_CFG_ENUM))) {
        fprintf(stderr, "internal error: config key '%s' read as the wrong type\n", key);
        abort();
    }
    return c->value[i];
}

bool ft_config_has(const ft_config *c, const char *key)
{
    int i = key_index(key);
    return i >= 0 && c->value[i] && c->value[i][0];
}

bool ft_config_is_explicit(const ft_config *c, const char *key)
{
    int i = key_index(key);
    return i >= 0 && c->given[i];
}

bool ft_config_is_auto(const ft_config *c, const char *key)
{
    int i = key_index(key);
    return i >= 0 && c->value[i] && strcmp(c->value[i], "auto") == 0;
}

long ft_config_int(const ft_config *c, const char *key)
{
    const char *v = raw(c, key, FT_CFG_INT);
    return v && strcmp(v, "auto") ? strtol(v, NULL, 10) : 0;
}

double ft_config_float(const ft_config *c, const char *key)
{
    const char *v = raw(c, key, FT_CFG_FLOAT);
    return v && strcmp(v, "auto") ? strtod(v, NULL) : 0.0;
}

bool ft_config_bool(const ft_config *c, const char *key)
{
    const char *v = raw(c, key, FT_CFG_BOOL);
    return v && strcmp(v, "true") == 0;
}

const char *ft_config_str(const ft_config *c, const char *key)
{
    return raw(c, key, FT_CFG_STRING);
}

/* Quotes a string for YAML when it is not a plain safe token. */
static void write_scalar(FILE *out, const ft_cfg_key *k, const char *v)
{
    if (!v) {
        fputs("null", out);
        return;
    }
    if (k->type != FT_CFG_STRING) {
        fputs(v, out);
        return;
    }
    fputc('"', out);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            fputc('\\', out);
        fputc(*p, out);
    }
    fputc('"', out);
}

int ft_config_write_yaml(const ft_config *c, FILE *out, ft_err *err)
{
    const ft_cfg_key *s = ft_config_schema();
    char sections[8][64];
    int depth = 0;
    for (size_t i = 0; i < c->n; i++) {
        /* split "a.b.c" into sections a, b and the leaf c */
        char parts[8][64];
        int np = 0;
        const char *p = s[i].name;
        while (np < 8) {
            const char *dot = strchr(p, '.');
            size_t len = dot ? (size_t)(dot - p) : strlen(p);
            snprintf(parts[np++], sizeof parts[0], "%.*s", (int)len, p);
            if (!dot)
                break;
            p = dot + 1;
        }
        int same = 0;
        while (same < depth && same < np - 1 && strcmp(sections[same], parts[same]) == 0)
            same++;
        depth = same;
        for (int d = depth; d < np - 1; d++) {
            fprintf(out, "%*s%s:\n", 2 * d, "", parts[d]);
            snprintf(sections[d], sizeof sections[0], "%s", parts[d]);
        }
        depth = np - 1;
        fprintf(out, "%*s%s: ", 2 * depth, "", parts[np - 1]);
        write_scalar(out, &s[i], c->value[i]);
        fputc('\n', out);
    }
    if (ferror(out))
        return ft_fail(err, "writing the config failed");
    return 0;
}

int ft_config_set_long(ft_config *c, const char *key, long v, const char *where, ft_err *err)
{
    char text[32];
    snprintf(text, sizeof text, "%ld", v);
    return ft_config_set_key(c, key, text, where, NULL, err);
}
