/* Building a run config (run_config.h): the schema, and a config under construction that
 * the YAML file, the overrides and the DeepSpeed JSON are applied to, key by key.
 *
 * Keys are dotted paths ("train.batch_size", "tuning.lora.r"). Every key is checked: an
 * unknown key is an error that names the file and line and suggests the nearest known
 * key; a value of the wrong type, outside its bounds or choices, or longer than its field
 * is an error naming the key. Keys whose meaning our design makes moot
 * (ddp_find_unused_parameters, dataloader_pin_memory, ...) are accepted with a one-line
 * notice saying why. Values may be "auto" where the schema allows it.
 *
 * Only lib/config/ reads keys by name (the getters below); the rest of the library reads
 * the typed ft_run_config that ft_config_values gives. */
#ifndef FT_CONFIG_H
#define FT_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config/run_config.h"
#include "core/ft_error.h"

typedef enum ft_cfg_type {
    FT_CFG_INT = 0, /* a long field */
    FT_CFG_FLOAT,   /* a double field (finite) */
    FT_CFG_BOOL,    /* a bool field */
    FT_CFG_STRING,  /* a char array field */
    FT_CFG_ENUM,    /* an enum field: the index of the value in choices */
    FT_CFG_JSON     /* a char array field holding the text of a JSON object (YAML: a
                     * mapping, or that text); "{}" = empty; a key whose default is "[]"
                     * holds a JSON array of non-empty strings instead (YAML: a list) */
} ft_cfg_type;

/* One key of the schema. */
typedef struct ft_cfg_key {
    const char *name;           /* "train.batch_size" */
    size_t offset, size;        /* the field of ft_run_config the value lands in */
    ft_cfg_type type;
    const char *dflt;           /* default as text; NULL = no default (required where used;
                                 * string keys only) */
    const char *const *choices; /* FT_CFG_ENUM: the names, NULL-terminated, in enum order;
                                 * FT_CFG_JSON: the names the object may not hold */
    bool allow_auto;            /* "auto" is accepted (int keys with min >= 0, strings) */
    double min;                 /* numeric lower bound (inclusive); NAN = none */
    double max;                 /* numeric upper bound (inclusive); NAN = none */
    const char *doc;            /* one line for the config reference */
    const char *moot;           /* non-NULL: accepted but without effect, and why */
} ft_cfg_key;

/* The schema, terminated by an entry with name NULL. */
const ft_cfg_key *ft_config_schema(void);

/* The schema entry of key; NULL when there is none. */
const ft_cfg_key *ft_config_find_key(const char *key);

/* "lora|qlora|full" (sep "|"): an enum key's choices joined, into out (n bytes). */
void ft_config_choices_text(const ft_cfg_key *k, const char *sep, char *out, size_t n);

typedef struct ft_config ft_config;

/* A config holding every key's default (NULL when out of memory). */
ft_config *ft_config_new(void);
void ft_config_free(ft_config *c);

/* The typed values: what the rest of the library reads (valid while c lives). */
const ft_run_config *ft_config_values(const ft_config *c);

/* Reads a YAML file of nested mappings onto c. Notices for moot keys go to `notes`
 * (may be NULL). A YAML null resets a key to its default. */
int ft_config_load_yaml(ft_config *c, const char *path, FILE *notes, ft_err *err);

/* Applies "key=value" (a --set argument). */
int ft_config_set(ft_config *c, const char *assignment, FILE *notes, ft_err *err);

/* Sets one key from text, validated as the YAML and --set paths do; `where` names the
 * source in error messages and notices ("ds.json: zero_optimization.stage"). */
int ft_config_set_key(ft_config *c, const char *key, const char *value, const char *where,
                      FILE *notes, ft_err *err);

/* Resets key to its default, as if never given (a YAML null). */
void ft_config_reset_key(ft_config *c, const char *key);

/* Applies "NAME=value" where NAME is a Make-style variable (TRAIN_BATCH_SIZE=4). A NAME
 * that stands for no key is an error suggesting the nearest variable. */
int ft_config_set_var(ft_config *c, const char *assignment, FILE *notes, ft_err *err);

/* The key a Make variable stands for: TRAIN_BATCH_SIZE -> "train.batch_size",
 * TUNING_LORA_R -> "tuning.lora.r". NULL when none matches. */
const char *ft_config_key_for_var(const char *var);

/* Getters by key, for this folder (the DeepSpeed mapping) and the tests. Asking for a key
 * that is not in the schema, or with the wrong type, is a programming error and aborts.
 * ft_config_has: a string key holds a non-empty value, a JSON key a non-empty object
 * (every other key always holds one). */
bool ft_config_has(const ft_config *c, const char *key);
bool ft_config_is_auto(const ft_config *c, const char *key);
/* True when the key was given a value (a config file, --set, --set-var or
 * ft_config_set_key), false while it holds its schema default or was reset by a YAML
 * null. Lets a second source (a DeepSpeed JSON) tell a user's choice from a default. */
bool ft_config_is_explicit(const ft_config *c, const char *key);
long ft_config_int(const ft_config *c, const char *key);    /* auto reads as 0 */
double ft_config_float(const ft_config *c, const char *key);
bool ft_config_bool(const ft_config *c, const char *key);
/* Strings and enums (the choice's name); NULL for a required string key never set. */
const char *ft_config_str(const ft_config *c, const char *key);

/* Levenshtein edit distance between a and b, for "did you mean" hints. */
size_t ft_edit_distance(const char *a, const char *b);

#endif
