/* The run config: one object for every tool. YAML file (libyaml) -> `--set key=value`
 * overrides -> validation against the schema in config_schema.c. Keys are dotted paths
 * ("train.batch_size", "tuning.lora.r"). Every key is checked: an unknown key is an error
 * that names the file and line and suggests the nearest known key; a value of the wrong
 * type or outside its choices is an error naming the key. Keys whose meaning our design
 * makes moot (ddp_find_unused_parameters, dataloader_pin_memory, ...) are accepted with a
 * one-line notice saying why. Values may be "auto" where the schema allows it; tools
 * resolve those. */
#ifndef FT_CONFIG_H
#define FT_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "core/ft_error.h"

typedef enum ft_cfg_type {
    FT_CFG_INT = 0,
    FT_CFG_FLOAT,
    FT_CFG_BOOL,
    FT_CFG_STRING,
    FT_CFG_ENUM
} ft_cfg_type;

/* One key of the schema. */
typedef struct ft_cfg_key {
    const char *name;    /* "train.batch_size" */
    ft_cfg_type type;
    const char *dflt;    /* default as text; NULL = no default (required where used) */
    const char *choices; /* FT_CFG_ENUM: "lora|qlora|full" */
    bool allow_auto;     /* "auto" is accepted */
    double min;          /* numeric lower bound (inclusive); NAN = none */
    double max;          /* numeric upper bound (inclusive); NAN = none */
    const char *doc;     /* one line for the config reference */
    const char *moot;    /* non-NULL: accepted but without effect, and why */
} ft_cfg_key;

/* The schema, terminated by an entry with name NULL. */
const ft_cfg_key *ft_config_schema(void);

typedef struct ft_config ft_config;

/* A config holding every key's default. */
ft_config *ft_config_new(void);
/* A copy with the same values (NULL when out of memory). */
ft_config *ft_config_clone(const ft_config *c);
void ft_config_free(ft_config *c);

/* Reads a YAML file of nested mappings onto c. Notices for moot keys go to `notes`
 * (may be NULL). */
int ft_config_load_yaml(ft_config *c, const char *path, FILE *notes, ft_err *err);

/* Applies "key=value" (a --set argument). */
int ft_config_set(ft_config *c, const char *assignment, FILE *notes, ft_err *err);

/* Sets one key from text, validated as the YAML and --set paths do; `where` names the
 * source in error messages and notices ("ds.json: zero_optimization.stage"). */
int ft_config_set_key(ft_config *c, const char *key, const char *value, const char *where,
                      FILE *notes, ft_err *err);
/* The same for an integer value (a resolved "auto", a derived batch size). */
int ft_config_set_long(ft_config *c, const char *key, long v, const char *where, ft_err *err);

/* Applies "NAME=value" where NAME is a Make-style variable (TRAIN_BATCH_SIZE=4). A NAME
 * that stands for no key is an error suggesting the nearest variable. */
int ft_config_set_var(ft_config *c, const char *assignment, FILE *notes, ft_err *err);

/* The key a Make variable stands for: TRAIN_BATCH_SIZE -> "train.batch_size",
 * TUNING_LORA_R -> "tuning.lora.r". NULL when none matches. */
const char *ft_config_key_for_var(const char *var);

/* Typed getters. Asking for a key that is not in the schema, or with the wrong type, is a
 * programming error and aborts. A key that is unset and has no default reads as 0 / false /
 * NULL; ft_config_has tells. */
bool ft_config_has(const ft_config *c, const char *key);
bool ft_config_is_auto(const ft_config *c, const char *key);
/* True when the key was given a value (a config file, --set, --set-var or
 * ft_config_set_key), false while it holds its schema default or was reset by a YAML
 * null. Lets a second source (a DeepSpeed JSON) tell a user's choice from a default. */
bool ft_config_is_explicit(const ft_config *c, const char *key);
long ft_config_int(const ft_config *c, const char *key);
double ft_config_float(const ft_config *c, const char *key);
bool ft_config_bool(const ft_config *c, const char *key);
const char *ft_config_str(const ft_config *c, const char *key); /* strings and enums */

/* Levenshtein edit distance between a and b, for "did you mean" hints. */
size_t ft_edit_distance(const char *a, const char *b);

/* Writes the resolved config as YAML (every key, defaults included), sections in schema
 * order: the run dir keeps it. */
int ft_config_write_yaml(const ft_config *c, FILE *out, ft_err *err);

#endif
