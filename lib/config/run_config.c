/* The typed run config (see run_config.h): loading it from its sources, writing it back as
 * YAML and as the reference, one value as text, and the rules on its values. */
#include "config/run_config.h"

#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "config/ds_config.h"

int ft_run_config_load(ft_run_config *out, const ft_config_sources *src, ft_err *err)
{
    ft_config *c = ft_config_new();
    if (!c)
        return ft_fail(err, "out of memory");
    int rc = src->yaml_path ? ft_config_load_yaml(c, src->yaml_path, src->notes, err) : 0;
    for (size_t i = 0; i < src->n_vars && rc == 0; i++)
        rc = ft_config_set_var(c, src->vars[i], src->notes, err);
    for (size_t i = 0; i < src->n_sets && rc == 0; i++)
        rc = ft_config_set(c, src->sets[i], src->notes, err);
    /* a DeepSpeed-style JSON goes on top of the file and the overrides */
    if (rc == 0 && ft_config_has(c, "dist.deepspeed_config"))
        rc = ft_config_apply_deepspeed(c, ft_config_str(c, "dist.deepspeed_config"),
                                       src->deepspeed_notes, err);
    if (rc == 0) {
        *out = *ft_config_values(c);
        out->dist.timeout_given = ft_config_is_explicit(c, "dist.timeout_s");
    }
    ft_config_free(c);
    return rc;
}

static const void *field_of(const ft_run_config *rc, const ft_cfg_key *k)
{
    return (const char *)rc + k->offset;
}

static bool is_auto(const ft_run_config *rc, const ft_cfg_key *k)
{
    if (!k->allow_auto)
        return false;
    if (k->type == FT_CFG_INT)
        return *(const long *)field_of(rc, k) == FT_CFG_AUTO;
    return k->type == FT_CFG_STRING && strcmp(field_of(rc, k), "auto") == 0;
}

/* A string for YAML: double-quoted, with " and \ escaped. */
static void write_quoted(FILE *out, const char *v)
{
    fputc('"', out);
    for (const char *p = v; *p; p++) {
        if (*p == '"' || *p == '\\')
            fputc('\\', out);
        fputc(*p, out);
    }
    fputc('"', out);
}

/* The shortest %g text of x that reads back as x exactly. */
static void shortest(double x, char *out, size_t n)
{
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(out, n, "%.*g", digits, x);
        if (strtod(out, NULL) == x)
            return;
    }
}

/* Key k's value as YAML: a number equal to its default as the schema spells it (2e-4),
 * every other one in the fewest digits that read back exactly. */
static void write_value(FILE *out, const ft_run_config *rc, const ft_cfg_key *k)
{
    const void *f = field_of(rc, k);
    if (is_auto(rc, k) && k->type != FT_CFG_STRING) {
        fputs("auto", out);
        return;
    }
    switch (k->type) {
    case FT_CFG_INT:
        fprintf(out, "%ld", *(const long *)f);
        break;
    case FT_CFG_FLOAT:
        if (k->dflt && strtod(k->dflt, NULL) == *(const double *)f) {
            fputs(k->dflt, out);
        } else {
            char text[32];
            shortest(*(const double *)f, text, sizeof text);
            fputs(text, out);
        }
        break;
    case FT_CFG_BOOL:
        fputs(*(const bool *)f ? "true" : "false", out);
        break;
    case FT_CFG_ENUM:
        fputs(k->choices[*(const int *)f], out);
        break;
    case FT_CFG_STRING:
        if (!*(const char *)f && !k->dflt)
            fputs("null", out);
        else
            write_quoted(out, f);
        break;
    case FT_CFG_JSON: /* the JSON text as a YAML string: it reads back as it is */
        write_quoted(out, f);
        break;
    }
}

int ft_run_config_write_yaml(const ft_run_config *rc, FILE *out, ft_err *err)
{
    char sections[8][64];
    int depth = 0;
    for (const ft_cfg_key *k = ft_config_schema(); k->name; k++) {
        /* split "a.b.c" into sections a, b and the leaf c */
        char parts[8][64];
        int np = 0;
        const char *p = k->name;
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
        write_value(out, rc, k);
        fputc('\n', out);
    }
    if (ferror(out))
        return ft_fail(err, "writing the config failed");
    return 0;
}

int ft_run_config_key_text(const ft_run_config *rc, const char *key, char *out, size_t n,
                           ft_err *err)
{
    const ft_cfg_key *k = ft_config_find_key(key);
    if (!k)
        return ft_fail(err, "unknown key (see configs/README.md)");
    const void *f = field_of(rc, k);
    if (k->type == FT_CFG_STRING && !*(const char *)f && !k->dflt)
        return ft_fail(err, "the key is required and not set");
    if (is_auto(rc, k)) {
        snprintf(out, n, "auto");
        return 0;
    }
    switch (k->type) {
    case FT_CFG_INT: snprintf(out, n, "%ld", *(const long *)f); break;
    case FT_CFG_FLOAT: snprintf(out, n, "%.15g", *(const double *)f); break;
    case FT_CFG_BOOL: snprintf(out, n, "%s", *(const bool *)f ? "true" : "false"); break;
    case FT_CFG_ENUM: snprintf(out, n, "%s", k->choices[*(const int *)f]); break;
    case FT_CFG_STRING:
    case FT_CFG_JSON: snprintf(out, n, "%s", (const char *)f); break;
    }
    return 0;
}

void ft_run_config_write_reference(FILE *out)
{
    static const char *const types[] = {"int", "float", "bool", "string", "enum",
                                        "JSON object"};
    fprintf(out,
            "# Run config reference\n\n"
            "`ft-train --config FILE.yaml` reads a YAML file of sections (model, tuning, train,\n"
            "data, dist); `--set section.key=value` overrides one key, and `make train\n"
            "SECTION_KEY=value` maps onto the same keys (TRAIN_BATCH_SIZE -> train.batch_size).\n"
            "An unknown key or a bad value is an error naming the file, line and key. This file\n"
            "is generated by `ft-train --config-reference`; the tests check it is current.\n\n"
            "| key | type | default | meaning |\n|---|---|---|---|\n");
    for (const ft_cfg_key *k = ft_config_schema(); k->name; k++) {
        char type[256];
        if (k->type == FT_CFG_ENUM)
            ft_config_choices_text(k, "/", type, sizeof type);
        else if (k->type == FT_CFG_JSON && k->dflt && k->dflt[0] == '[')
            snprintf(type, sizeof type, "list of strings");
        else if (k->type == FT_CFG_JSON)
            snprintf(type, sizeof type, "%s (YAML: a mapping)", types[k->type]);
        else
            snprintf(type, sizeof type, "%s%s", types[k->type], k->allow_auto ? " or auto" : "");
        const char *dflt = !k->dflt ? "required" : k->dflt[0] ? k->dflt : "\"\"";
        fprintf(out, "| `%s` | %s | %s | %s%s |\n", k->name, type, dflt,
                k->moot ? "accepted, no effect: " : "", k->moot ? k->moot : k->doc);
    }
}

/* ---- rules on the values --------------------------------------------------------------- */

#define BATCH_RULE "train.global_batch_size = train.batch_size x train.grad_accum x world size"

int ft_run_config_global_batch(ft_train_section *t, int world_size, ft_err *err)
{
    if (world_size < 1)
        return ft_fail(err, "world size must be >= 1, got %d", world_size);
    if (t->global_batch_size == FT_CFG_AUTO)
        return 0;
    long global = t->global_batch_size;
    bool micro_auto = t->batch_size == FT_CFG_AUTO, accum_auto = t->grad_accum == FT_CFG_AUTO;
    if (micro_auto && accum_auto)
        return 0;
    long micro = t->batch_size, accum = t->grad_accum;
    long per;
    if (accum_auto || micro_auto) {
        long known = accum_auto ? micro : accum;
        if (__builtin_mul_overflow(known, (long)world_size, &per) || global % per)
            return accum_auto
                       ? ft_fail(err, "train_batch_size %ld is not divisible by "
                                      "train_micro_batch_size_per_gpu %ld * world_size %d ("
                                      BATCH_RULE ")",
                                 global, micro, world_size)
                       : ft_fail(err, "train_batch_size %ld is not divisible by "
                                      "gradient_accumulation_steps %ld * world_size %d ("
                                      BATCH_RULE ")",
                                 global, accum, world_size);
        /* global >= 1 and per divides it: the derived value is >= 1 */
        *(accum_auto ? &t->grad_accum : &t->batch_size) = global / per;
        return 0;
    }
    long total;
    if (__builtin_mul_overflow(micro, accum, &per) ||
        __builtin_mul_overflow(per, (long)world_size, &total) || total != global)
        return ft_fail(err, "train_batch_size %ld != train_micro_batch_size_per_gpu %ld * "
                            "gradient_accumulation_steps %ld * world_size %d (" BATCH_RULE ")",
                       global, micro, accum, world_size);
    return 0;
}

int ft_run_config_zero_stage(const ft_dist_section *d)
{
    switch (d->strategy) {
    case FT_CFG_STRATEGY_ZERO: return (int)d->zero_stage;
    case FT_CFG_STRATEGY_ZERO1: return 1;
    case FT_CFG_STRATEGY_ZERO2: return 2;
    case FT_CFG_STRATEGY_ZERO3: return 3;
    default: return 0;
    }
}

/* The name of value v of the enum key `key`. */
static const char *choice_name(const char *key, int v)
{
    return ft_config_find_key(key)->choices[v];
}

const char *ft_tuning_mode_name(ft_tuning_mode m) { return choice_name("tuning.mode", (int)m); }

const char *ft_cfg_strategy_name(ft_cfg_strategy s)
{
    return choice_name("dist.strategy", (int)s);
}
