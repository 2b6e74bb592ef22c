/* A run config under construction (see config.h): the typed values, filled key by key
 * through the schema's field offsets, and which keys were given. */
#include "config/config.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "core/numparse.h"

struct ft_config {
    ft_run_config v;
    size_t n;
    bool *given; /* set by the user (not a default): ft_config_is_explicit */
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

const ft_cfg_key *ft_config_find_key(const char *key)
{
    int i = key_index(key);
    return i < 0 ? NULL : &ft_config_schema()[i];
}

void ft_config_choices_text(const ft_cfg_key *k, const char *sep, char *out, size_t n)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; k->choices && k->choices[i] && len < n; i++)
        len += (size_t)snprintf(out + len, n - len, "%s%s", i ? sep : "", k->choices[i]);
}

/* The field of key k in v. */
static void *field(ft_run_config *v, const ft_cfg_key *k) { return (char *)v + k->offset; }
static const void *cfield(const ft_run_config *v, const ft_cfg_key *k)
{
    return (const char *)v + k->offset;
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

static int choice_index(const ft_cfg_key *k, const char *t)
{
    for (int i = 0; k->choices[i]; i++)
        if (strcmp(k->choices[i], t) == 0)
            return i;
    return -1;
}

/* A JSON key's text: a JSON object (duplicate names refused) that holds none of the
 * key's reserved names and fits the field. */
static int check_json(const ft_cfg_key *k, const char *text, const char *where, ft_err *err)
{
    if (strlen(text) >= k->size)
        return ft_fail(err, "%s: key '%s' is longer than %zu bytes", where, k->name,
                       k->size - 1);
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    /* a key whose default is "[]" holds a JSON array (of strings: model.add_special_tokens) */
    bool list = k->dflt && k->dflt[0] == '[';
    if (!j && list)
        return ft_fail(err, "%s: key '%s' must be a list of tokens (YAML [a, b] or JSON "
                            "[\"a\", \"b\"]): %s (column %d)",
                       where, k->name, je.text, je.column);
    if (!j)
        return ft_fail(err, "%s: key '%s' must be a JSON object: %s (column %d)", where,
                       k->name, je.text, je.column);
    int rc = 0;
    if (list && !json_is_array(j))
        rc = ft_fail(err, "%s: key '%s' must be a list of tokens (YAML [a, b] or JSON "
                          "[\"a\", \"b\"]), got '%s'", where, k->name, text);
    for (size_t i = 0; list && rc == 0 && i < json_array_size(j); i++) {
        const json_t *e = json_array_get(j, i);
        if (!json_is_string(e) || json_string_length(e) == 0)
            rc = ft_fail(err, "%s: key '%s': entry %zu must be a non-empty string (a token), "
                              "got %s",
                         where, k->name, i, json_is_string(e) ? "\"\"" : "another JSON type");
    }
    if (!list && !json_is_object(j))
        rc = ft_fail(err, "%s: key '%s' must be a JSON object (a mapping of names to "
                          "values), got '%s'", where, k->name, text);
    for (int i = 0; rc == 0 && k->choices && k->choices[i]; i++)
        if (json_object_get(j, k->choices[i])) {
            char names[1024];
            ft_config_choices_text(k, ", ", names, sizeof names);
            rc = ft_fail(err, "%s: key '%s' may not set '%s' (reserved: %s)", where, k->name,
                         k->choices[i], names);
        }
    json_decref(j);
    return rc;
}

/* Validates text for key k and stores it in k's field of v; an invalid text leaves the
 * field as it was. where names the source in the error. */
static int store(ft_run_config *v, const ft_cfg_key *k, const char *text, const char *where,
                 ft_err *err)
{
    void *f = field(v, k);
    bool is_auto = k->allow_auto && strcmp(text, "auto") == 0;
    switch (k->type) {
    case FT_CFG_INT: {
        if (is_auto) {
            *(long *)f = FT_CFG_AUTO;
            return 0;
        }
        long x;
        if (ft_parse_long(text, LONG_MIN, LONG_MAX, &x))
            return ft_fail(err, "%s: key '%s' must be an integer%s, got '%s'", where, k->name,
                           k->allow_auto ? " or auto" : "", text);
        if (!isnan(k->min) && x < k->min)
            return ft_fail(err, "%s: key '%s' must be >= %g, got %ld", where, k->name, k->min, x);
        if (!isnan(k->max) && x > k->max)
            return ft_fail(err, "%s: key '%s' must be <= %g, got %ld", where, k->name, k->max, x);
        *(long *)f = x;
        return 0;
    }
    case FT_CFG_FLOAT: {
        double x;
        if (ft_parse_double(text, -HUGE_VAL, HUGE_VAL, 0, &x))
            return ft_fail(err, "%s: key '%s' must be a number, got '%s'", where, k->name, text);
        if (!isnan(k->min) && x < k->min)
            return ft_fail(err, "%s: key '%s' must be >= %g, got %g", where, k->name, k->min, x);
        if (!isnan(k->max) && x > k->max)
            return ft_fail(err, "%s: key '%s' must be <= %g, got %g", where, k->name, k->max, x);
        *(double *)f = x;
        return 0;
    }
    case FT_CFG_BOOL:
        if (!parse_bool(text, (bool *)f))
            return ft_fail(err, "%s: key '%s' must be true or false, got '%s'", where, k->name,
                           text);
        return 0;
    case FT_CFG_ENUM: {
        int i = choice_index(k, text);
        if (i < 0) {
            char choices[256];
            ft_config_choices_text(k, "|", choices, sizeof choices);
            return ft_fail(err, "%s: key '%s' must be one of %s, got '%s'", where, k->name,
                           choices, text);
        }
        *(int *)f = i;
        return 0;
    }
    case FT_CFG_STRING:
        if (strlen(text) >= k->size)
            return ft_fail(err, "%s: key '%s' is longer than %zu bytes", where, k->name,
                           k->size - 1);
        memcpy(f, text, strlen(text) + 1);
        return 0;
    case FT_CFG_JSON:
        if (check_json(k, text, where, err))
            return -1;
        memcpy(f, text, strlen(text) + 1);
        return 0;
    }
    return ft_fail(err, "%s: key '%s' has no type", where, k->name);
}

/* Key k's default into v ("" for a string key without one). */
static void store_default(ft_run_config *v, const ft_cfg_key *k)
{
    ft_err err;
    if (!k->dflt) {
        memset(field(v, k), 0, k->size);
    } else if (store(v, k, k->dflt, "schema", &err)) {
        fprintf(stderr, "internal error: %s\n", err.msg);
        abort();
    }
}

void ft_run_config_defaults(ft_run_config *out)
{
    memset(out, 0, sizeof *out);
    for (const ft_cfg_key *k = ft_config_schema(); k->name; k++)
        store_default(out, k);
}

ft_config *ft_config_new(void)
{
    ft_config *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->n = schema_len();
    if (!(c->given = calloc(c->n, sizeof *c->given))) {
        free(c);
        return NULL;
    }
    ft_run_config_defaults(&c->v);
    return c;
}

void ft_config_free(ft_config *c)
{
    if (!c)
        return;
    free(c->given);
    free(c);
}

const ft_run_config *ft_config_values(const ft_config *c) { return &c->v; }

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

int ft_config_set_key(ft_config *c, const char *key, const char *value, const char *where,
                      FILE *notes, ft_err *err)
{
    int i = key_index(key);
    if (i < 0)
        return unknown_key(where, key, err);
    const ft_cfg_key *k = &ft_config_schema()[i];
    if (store(&c->v, k, value, where, err)) /* stores only a valid value */
        return -1;
    c->given[i] = true;
    if (k->moot && notes)
        fprintf(notes, "note: %s: '%s' has no effect here: %s\n", where, key, k->moot);
    return 0;
}

void ft_config_reset_key(ft_config *c, const char *key)
{
    int i = key_index(key);
    if (i < 0)
        return;
    store_default(&c->v, &ft_config_schema()[i]);
    c->given[i] = false;
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
    return ft_config_set_key(c, key, eq + 1, "--set", notes, err);
}

void ft_config_var_name(const char *key, char *out, size_t n)
{
    size_t i = 0;
    for (; key[i] && i + 1 < n; i++)
        out[i] = key[i] == '.' ? '_' : (char)toupper((unsigned char)key[i]);
    out[i] = '\0';
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
            ft_config_var_name(k->name, var, sizeof var);
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
    return ft_config_set_key(c, key, eq + 1, where, notes, err);
}

/* ---- getters -------------------------------------------------------------------- */

static const ft_cfg_key *typed_key(const char *key, ft_cfg_type want)
{
    const ft_cfg_key *k = ft_config_find_key(key);
    if (!k || (k->type != want &&
               !(want == FT_CFG_STRING && (k->type == FT_CFG_ENUM || k->type == FT_CFG_JSON)))) {
        fprintf(stderr, "internal error: config key '%s' read as the wrong type\n", key);
        abort();
    }
    return k;
}

bool ft_config_has(const ft_config *c, const char *key)
{
    const ft_cfg_key *k = ft_config_find_key(key);
    return k && (k->type != FT_CFG_STRING || *(const char *)cfield(&c->v, k)) &&
           (k->type != FT_CFG_JSON || (strcmp(cfield(&c->v, k), "{}") != 0 &&
                                       strcmp(cfield(&c->v, k), "[]") != 0));
}

bool ft_config_is_explicit(const ft_config *c, const char *key)
{
    int i = key_index(key);
    return i >= 0 && c->given[i];
}

bool ft_config_is_auto(const ft_config *c, const char *key)
{
    const ft_cfg_key *k = ft_config_find_key(key);
    if (!k || !k->allow_auto)
        return false;
    if (k->type == FT_CFG_INT)
        return *(const long *)cfield(&c->v, k) == FT_CFG_AUTO;
    return k->type == FT_CFG_STRING && strcmp(cfield(&c->v, k), "auto") == 0;
}

long ft_config_int(const ft_config *c, const char *key)
{
    long v = *(const long *)cfield(&c->v, typed_key(key, FT_CFG_INT));
    return ft_config_is_auto(c, key) ? 0 : v;
}

double ft_config_float(const ft_config *c, const char *key)
{
    return *(const double *)cfield(&c->v, typed_key(key, FT_CFG_FLOAT));
}

bool ft_config_bool(const ft_config *c, const char *key)
{
    return *(const bool *)cfield(&c->v, typed_key(key, FT_CFG_BOOL));
}

const char *ft_config_str(const ft_config *c, const char *key)
{
    const ft_cfg_key *k = typed_key(key, FT_CFG_STRING);
    if (k->type == FT_CFG_ENUM)
        return k->choices[*(const int *)cfield(&c->v, k)];
    const char *s = cfield(&c->v, k);
    return !*s && !k->dflt && !c->given[k - ft_config_schema()] ? NULL : s;
}
