/* LoRA configuration and PEFT's adapter_config.json (see lora.h). */
#include "formats/lora.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <limits.h>
#include <pcre2.h>
#include <stdlib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "formats/json_file.h"
#include "formats/safetensors.h"

static const char *const proj_names[FT_NPROJ] = {
    "q_proj",    "k_proj",  "v_proj",    "o_proj",      "gate_proj",
    "up_proj",   "down_proj", "qkv_proj", "gate_up_proj", "shared_expert_gate"};
static const char *const proj_paths[FT_NPROJ] = {
    "self_attn.q_proj", "self_attn.k_proj",   "self_attn.v_proj",
    "self_attn.o_proj", "mlp.gate_proj",      "mlp.up_proj",
    "mlp.down_proj",    "self_attn.qkv_proj", "mlp.gate_up_proj",
    "mlp.shared_expert_gate"};

#define KNOWN_MODULES "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj qkv_proj " \
                      "gate_up_proj shared_expert_gate embed_tokens lm_head; on a MoE gate " \
                      "(the router), w1, w2, w3"

/* The pattern keys PEFT sets for fused experts, w1 + w3 (re.escape'd "gate_up_proj"). */
#define GATE_UP_PATTERN ".*\\.gate_up_proj"

static int set_pattern(ft_lora_patterns *ps, const char *key, double value, ft_err *err);
static int regex_fullmatch(pcre2_code *re, const char *name);

const char *ft_proj_name(ft_proj p)
{
    return (unsigned)p < FT_NPROJ ? proj_names[p] : "?";
}

const char *ft_proj_path(ft_proj p)
{
    return (unsigned)p < FT_NPROJ ? proj_paths[p] : "?";
}

int ft_lora_resolve_moe(ft_lora_config *c, bool moe, ft_err *err)
{
    unsigned t = c->targets;
    c->targets &= ~FT_LORA_MOE;
    if (!moe)
        return 0;
    /* "gate": the router, not gate_proj's short form */
    if (t & FT_LORA_MOE_ROUTER)
        c->targets &= ~(1u << FT_PROJ_GATE);
    if ((t & ~FT_LORA_OUTER & ~FT_LORA_MOE) == FT_LORA_ALL_LINEAR)
        t |= FT_LORA_MOE;
    if (!(t & FT_LORA_MOE_W1) != !(t & FT_LORA_MOE_W3))
        return ft_fail(err, "LoRA target %s without %s: they are fused into one parameter "
                       "(gate_up_proj), so PEFT targets both or neither",
                       t & FT_LORA_MOE_W1 ? "w1" : "w3", t & FT_LORA_MOE_W1 ? "w3" : "w1");
    if ((t & FT_LORA_MOE_W1) && (c->target_params & FT_LORA_PARAM_GATE_UP))
        return ft_fail(err, "LoRA on gate_up_proj both by the target modules w1 / w3 (or "
                       "all-linear: rank 2r, as PEFT converts them) and by target_parameters "
                       "(rank r) is not supported: give one of them");
    if (t & FT_LORA_MOE_ROUTER)
        c->target_params |= FT_LORA_PARAM_ROUTER;
    if (t & FT_LORA_MOE_W1) {
        c->target_params |= FT_LORA_PARAM_GATE_UP;
        /* PEFT's conversion keeps w1's and w3's rank and scaling on the fused pair:
         * rank_pattern[GATE_UP_PATTERN] = 2 r, alpha_pattern[...] = 2 alpha (a key given
         * already keeps its place, as in a Python dict) */
        if (set_pattern(&c->rank_pattern, GATE_UP_PATTERN, 2.0 * c->r, err) ||
            set_pattern(&c->alpha_pattern, GATE_UP_PATTERN, 2.0 * (double)c->alpha, err))
            return -1;
    }
    if (t & FT_LORA_MOE_W2)
        c->target_params |= FT_LORA_PARAM_DOWN;
    return 0;
}

float ft_lora_scaling_of(const ft_lora_config *c, int r, float alpha)
{
    return c->rslora ? alpha / sqrtf((float)r) : alpha / (float)r;
}

/* A pattern key as PEFT's get_pattern_key matches it, re.match(rf"(.*\.)?({key})$", name):
 * compiled anchored at the start (re.match) with PCRE2, whose syntax and `$` (the end,
 * or before a final newline) are Python's for what patterns use. NULL: it does not
 * compile (msg says why, when given). */
static pcre2_code *pattern_compile(const char *key, char *msg, size_t n)
{
    char re[FT_LORA_PATTERN_KEY + 16];
    snprintf(re, sizeof re, "(.*\\.)?(%s)$", key);
    int code;
    PCRE2_SIZE where;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)re, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &code,
                                  &where, NULL);
    if (!c && msg) {
        PCRE2_UCHAR text[256];
        pcre2_get_error_message(code, text, sizeof text);
        snprintf(msg, n, "%s", (char *)text);
    }
    return c;
}

bool ft_lora_pattern_matches(const char *key, const char *name)
{
    pcre2_code *re = pattern_compile(key, NULL, 0);
    bool hit = re && regex_fullmatch(re, name);
    pcre2_code_free(re);
    return hit;
}

int ft_lora_pattern_find(const ft_lora_patterns *ps, const char *name)
{
    for (int i = 0; i < ps->n; i++)
        if (ft_lora_pattern_matches(ps->p[i].key, name))
            return i;
    return -1;
}

int ft_lora_module_rank(const ft_lora_config *c, const char *name)
{
    int i = ft_lora_pattern_find(&c->rank_pattern, name);
    return i < 0 ? c->r : (int)c->rank_pattern.p[i].value;
}

float ft_lora_module_alpha(const ft_lora_config *c, const char *name)
{
    int i = ft_lora_pattern_find(&c->alpha_pattern, name);
    return i < 0 ? c->alpha : (float)c->alpha_pattern.p[i].value;
}

float ft_lora_module_scaling(const ft_lora_config *c, const char *name)
{
    return ft_lora_scaling_of(c, ft_lora_module_rank(c, name), ft_lora_module_alpha(c, name));
}

/* ps[key] = value: in place when the key is there, else appended. */
static int set_pattern(ft_lora_patterns *ps, const char *key, double value, ft_err *err)
{
    for (int i = 0; i < ps->n; i++)
        if (strcmp(ps->p[i].key, key) == 0) {
            ps->p[i].value = value;
            return 0;
        }
    if (ps->n == FT_LORA_MAX_PATTERNS)
        return ft_fail(err, "%s: more than %d keys", ps->origin[0] ? ps->origin : "pattern",
                       FT_LORA_MAX_PATTERNS);
    snprintf(ps->p[ps->n].key, sizeof ps->p[ps->n].key, "%s", key);
    ps->p[ps->n++].value = value;
    return 0;
}

/* Reads a rank_pattern / alpha_pattern object v (NULL or null: none) into out; where
 * prefixes the errors ("<path>: key 'rank_pattern'"). */
static int read_patterns(const json_t *v, bool rank, const char *where, ft_lora_patterns *out,
                         ft_err *err)
{
    out->n = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return ft_fail(err, "%s must be a mapping of module patterns to %s", where,
                       rank ? "ranks" : "alphas");
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val)
    {
        if (out->n == FT_LORA_MAX_PATTERNS)
            return ft_fail(err, "%s: more than %d keys", where, FT_LORA_MAX_PATTERNS);
        if (!key[0] || strlen(key) >= FT_LORA_PATTERN_KEY)
            return ft_fail(err, "%s: key '%.80s' must be a module pattern of 1 to %d "
                                "characters", where, key, FT_LORA_PATTERN_KEY - 1);
        char msg[256];
        pcre2_code *re = pattern_compile(key, msg, sizeof msg);
        if (!re)
            return ft_fail(err, "%s: key '%s' is not a regular expression (%s)", where, key,
                           msg);
        pcre2_code_free(re);
        double x = json_number_value(val);
        bool bad = rank ? !json_is_integer(val) || json_integer_value(val) <= 0 ||
                              json_integer_value(val) > INT_MAX
                        : !json_is_number(val) || !(x > 0) || !isfinite((float)x);
        if (bad) {
            char *text = json_dumps(val, JSON_ENCODE_ANY);
            ft_fail(err, "%s: key '%s': %s must be a positive %s, got %.40s", where, key,
                    rank ? "the rank" : "lora_alpha",
                    rank ? "integer" : "number (that fits a float)", text ? text : "?");
            free(text);
            return -1;
        }
        snprintf(out->p[out->n].key, sizeof out->p[out->n].key, "%s", key);
        out->p[out->n++].value = x;
    }
    return 0;
}

int ft_lora_patterns_parse(const char *json, bool rank, const char *origin,
                           ft_lora_patterns *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    snprintf(out->origin, sizeof out->origin, "%s", origin);
    if (!json[0])
        return 0;
    json_error_t je;
    json_t *v = json_loads(json, JSON_REJECT_DUPLICATES, &je);
    if (!v)
        return ft_fail(err, "%s: not JSON: %s (column %d)", origin, je.text, je.column);
    int rc = read_patterns(v, rank, origin, out, err);
    json_decref(v);
    return rc;
}

/* A name of the embedding's module as PEFT's lists give it: its last component or its
 * path, a causal LM's model.embed_tokens or a multimodal gemma3's
 * model.language_model.embed_tokens (PEFT's ensure_weight_tying adds the path). */
static bool embed_name(const char *key)
{
    static const char *const names[] = {"embed_tokens", "model.embed_tokens",
                                        "language_model.embed_tokens",
                                        "model.language_model.embed_tokens"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(key, names[i]) == 0)
            return true;
    return false;
}

/* PEFT matches a target key against a module name when the name equals it or ends with
 * "." + key; for our modules that means the key is the module's last component or a
 * suffix path of it ("q_proj", "self_attn.q_proj"). The short forms (the name without
 * "_proj": "q", "k", ..., "gate", "up", "down", "qkv", "gate_up") are accepted on the
 * command line. */
static int match_target(const char *key, unsigned *targets)
{
    /* a MoE's router and experts (lora.h's FT_LORA_MOE); "gate" is gate_proj's short form
     * too */
    static const struct {
        const char *name;
        unsigned bits;
    } moe[] = {{"gate", FT_LORA_MOE_ROUTER | (1u << FT_PROJ_GATE)},
               {"w1", FT_LORA_MOE_W1},
               {"w3", FT_LORA_MOE_W3},
               {"w2", FT_LORA_MOE_W2}};
    for (size_t i = 0; i < sizeof moe / sizeof *moe; i++)
        if (strcmp(key, moe[i].name) == 0) {
            *targets |= moe[i].bits;
            return 0;
        }
    /* the embedding and the head: PEFT's module names model.embed_tokens (a multimodal
     * gemma3's model.language_model.embed_tokens) and lm_head */
    if (embed_name(key)) {
        *targets |= FT_LORA_EMBED;
        return 0;
    }
    if (strcmp(key, "lm_head") == 0) {
        *targets |= FT_LORA_HEAD;
        return 0;
    }
    for (int p = 0; p < FT_NPROJ; p++) {
        const char *path = proj_paths[p];
        size_t lk = strlen(key), lp = strlen(path);
        int suffix = lk <= lp && strcmp(path + lp - lk, key) == 0 &&
                     (lk == lp || path[lp - lk - 1] == '.');
        char shortname[24];
        snprintf(shortname, sizeof shortname, "%s", proj_names[p]);
        size_t ns = strlen(shortname), np = strlen("_proj");
        if (ns > np && strcmp(shortname + ns - np, "_proj") == 0)
            shortname[ns - np] = '\0';
        if (suffix || strcmp(key, shortname) == 0) {
            *targets |= 1u << p;
            return 0;
        }
    }
    return -1;
}

/* A list entry naming one layer's module by path: "model.layers.N.<proj path>" or a
 * dotted suffix of it that includes the layer ("layers.N.mlp.up_proj"), optionally
 * prefixed by PEFT's "base_model.model.". Sets layer_paths and returns 0; -1 if it is no
 * such path. */
static int match_layer_path(const char *key, ft_lora_config *c)
{
    const char *k = key;
    if (strncmp(k, "base_model.model.", 17) == 0)
        k += 17;
    if (strncmp(k, "model.language_model.", 21) == 0) /* a multimodal gemma3's decoder */
        k += 21;
    else if (strncmp(k, "model.", 6) == 0)
        k += 6;
    if (strncmp(k, "layers.", 7) != 0)
        return -1;
    char *end;
    long l = strtol(k + 7, &end, 10);
    if (end == k + 7 || *end != '.' || l < 0 || l >= FT_LORA_MAX_LAYER_LIST)
        return -1;
    for (int p = 0; p < FT_NPROJ; p++)
        if (strcmp(end + 1, proj_paths[p]) == 0) {
            c->layer_paths[p][l / 64] |= 1ull << (l % 64);
            c->has_layer_paths = true;
            return 0;
        }
    return -1;
}

int ft_lora_targets_parse(const char *list, unsigned *targets, ft_err *err)
{
    *targets = 0;
    if (strcmp(list, "all-linear") == 0 || strcmp(list, "all") == 0) {
        *targets = FT_LORA_ALL_LINEAR;
        return 0;
    }
    char buf[256];
    if (strlen(list) >= sizeof buf)
        return ft_fail(err, "LoRA target list too long: '%s'", list);
    strcpy(buf, list);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok;
         tok = strtok_r(NULL, ", ", &save)) {
        if (strcmp(tok, "all-linear") == 0) /* with embed_tokens / lm_head beside it */
            *targets |= FT_LORA_ALL_LINEAR;
        else if (match_target(tok, targets) != 0)
            return ft_fail(err,
                           "unknown LoRA target module '%s' (known: " KNOWN_MODULES
                           ", or all-linear)",
                           tok);
    }
    if (!*targets)
        return ft_fail(err, "empty LoRA target list");
    return 0;
}

/* One modules_to_save entry: PEFT wraps every module whose name ends with it; of this
 * model's modules, only the embedding and the head are supported. */
static int match_saved_module(const char *key, unsigned *mods)
{
    if (embed_name(key))
        *mods |= FT_SAVE_EMBED;
    else if (strcmp(key, "lm_head") == 0)
        *mods |= FT_SAVE_HEAD;
    else
        return -1;
    return 0;
}

#define SAVED_MODULES "embed_tokens (or model.embed_tokens, model.language_model.embed_tokens) " \
                      "and lm_head"

unsigned ft_lora_saved_modules(const ft_lora_config *c, bool tied)
{
    return tied && c->modules_to_save ? FT_SAVE_EMBED : c->modules_to_save;
}

int ft_lora_modules_to_save_parse(const char *list, unsigned *mods, ft_err *err)
{
    *mods = 0;
    char buf[256];
    if (strlen(list) >= sizeof buf)
        return ft_fail(err, "modules_to_save list too long: '%s'", list);
    strcpy(buf, list);
    for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok;
         tok = strtok_r(NULL, ", ", &save))
        if (match_saved_module(tok, mods))
            return ft_fail(err, "modules_to_save: module '%s' is not supported (supported: "
                                SAVED_MODULES ")", tok);
    return 0;
}

/* modules_to_save of adapter_config.json: null or a list of module names. */
static int read_modules_to_save(json_t *root, const char *path, ft_lora_config *c,
                                ft_err *err)
{
    json_t *v = json_object_get(root, "modules_to_save");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return ft_fail(err, "%s: key 'modules_to_save' must be a list of module names or null",
                       path);
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item)
    {
        if (!json_is_string(item) || match_saved_module(json_string_value(item),
                                                        &c->modules_to_save))
            return ft_fail(err, "%s: key 'modules_to_save': module %s is not supported "
                                "(supported: " SAVED_MODULES ")",
                           path, json_is_string(item) ? json_string_value(item)
                                                      : "(not a string)");
    }
    return 0;
}

static int reject_if_set(json_t *root, const char *path, const char *key, ft_err *err)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v) || json_is_false(v))
        return 0;
    if ((json_is_object(v) && json_object_size(v) == 0) ||
        (json_is_array(v) && json_array_size(v) == 0))
        return 0;
    return ft_fail(err, "%s: key '%s' is set, which this LoRA implementation does not support",
                   path, key);
}

/* Appends one entry of layers_to_transform: a layer index, >= 0 and an int (a larger
 * integer would wrap around to another layer). */
static int layer_index(const json_t *v, const char *path, ft_lora_config *c, ft_err *err)
{
    json_int_t l = json_integer_value(v);
    if (l < 0 || l > INT_MAX)
        return ft_fail(err, "%s: key 'layers_to_transform': %lld is not a layer index", path,
                       (long long)l);
    c->layers[c->n_layers++] = (int)l;
    return 0;
}

/* The rows of the vocabulary of an adapter tensor under name (0: not one of the
 * embedding's or the head's): embed_tokens / lm_head weights saved in full (their base
 * weights, modules_to_save, base_layer) have V rows, lora_embedding_A is [r, V], the
 * head's lora_B [V, r]. */
static int64_t tensor_vocab(const ft_st_tensor *t)
{
    static const char *const rows[] = {"embed_tokens.weight", "embed_tokens.base_layer.weight",
                                       "lm_head.weight", "lm_head.base_layer.weight",
                                       "lm_head.lora_B.weight"};
    size_t n = strlen(t->name);
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        size_t k = strlen(rows[i]);
        if (n >= k && strcmp(t->name + n - k, rows[i]) == 0 && t->ndim == 2)
            return t->shape[0];
    }
    const char *a = "embed_tokens.lora_embedding_A";
    size_t k = strlen(a);
    return n >= k && strcmp(t->name + n - k, a) == 0 && t->ndim == 2 ? t->shape[1] : 0;
}

/* c->vocab_size from dir/adapter_model.safetensors (0 when it is absent: settings about
 * to be written); its tensors must agree on one vocabulary. */
static int adapter_vocab(const char *dir, ft_lora_config *c, ft_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    c->vocab_size = 0;
    if (access(path, F_OK) != 0)
        return 0;
    ft_st_file *f;
    if (ft_st_open(&f, path, err))
        return -1;
    int rc = 0;
    const char *first = NULL;
    for (size_t i = 0; i < ft_st_count(f) && rc == 0; i++) {
        const ft_st_tensor *t = ft_st_at(f, i);
        int64_t V = tensor_vocab(t);
        if (V > 0 && c->vocab_size > 0 && V != c->vocab_size)
            rc = ft_fail(err, "%s: tensor '%s' is for a vocabulary of %lld tokens, '%s' for "
                              "one of %lld",
                         path, t->name, (long long)V, first, (long long)c->vocab_size);
        else if (V > 0 && !first) {
            c->vocab_size = V;
            first = t->name;
        }
    }
    ft_st_close(f);
    return rc;
}

/* One target_parameters entry: PEFT matches it as the parameter's name or a dotted
 * suffix of it. */
static bool param_matches(const char *s, const char *name)
{
    size_t n = strlen(s), k = strlen(name);
    return n >= k && strcmp(s + n - k, name) == 0 && (n == k || s[n - k - 1] == '.');
}

int ft_lora_target_parameters_parse(const char *list, ft_lora_config *c, ft_err *err)
{
    char buf[1024];
    if (strlen(list) >= sizeof buf)
        return ft_fail(err, "target_parameters list too long");
    snprintf(buf, sizeof buf, "%s", list);
    unsigned params = 0;
    for (char *save = NULL, *s = strtok_r(buf, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
        while (*s == ' ')
            s++;
        size_t n = strlen(s);
        while (n > 0 && s[n - 1] == ' ')
            s[--n] = 0;
        if (!n)
            continue;
        if (param_matches(s, "gate.weight"))
            params |= FT_LORA_PARAM_ROUTER;
        else if (param_matches(s, "gate_up_proj"))
            params |= FT_LORA_PARAM_GATE_UP;
        else if (param_matches(s, "down_proj"))
            params |= FT_LORA_PARAM_DOWN;
        else
            return ft_fail(err, "target parameter '%s' is not supported (supported: a MoE's "
                                "gate.weight, gate_up_proj, down_proj)", s);
    }
    c->target_params |= params;
    return 0;
}

/* target_parameters of adapter_config.json (PEFT's LoRA on nn.Parameter tensors, which
 * is how PEFT on transformers 5 reaches a MoE's router and fused experts): null, or a
 * list of the names in lora.h's target_params. A non-zero lora_dropout beside them is
 * refused, as PEFT refuses it; then the rank and alpha patterns. */
static int read_target_parameters(json_t *root, const char *path, ft_lora_config *c,
                                  ft_err *err)
{
    json_t *v = json_object_get(root, "target_parameters");
    if (v && !json_is_null(v) && !json_is_array(v))
        return ft_fail(err, "%s: key 'target_parameters' must be a list of parameter names "
                            "or null", path);
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item)
    {
        const char *s = json_is_string(item) ? json_string_value(item) : "";
        if (param_matches(s, "gate.weight"))
            c->target_params |= FT_LORA_PARAM_ROUTER;
        else if (param_matches(s, "gate_up_proj"))
            c->target_params |= FT_LORA_PARAM_GATE_UP;
        else if (param_matches(s, "down_proj"))
            c->target_params |= FT_LORA_PARAM_DOWN;
        else
            return ft_fail(err, "%s: key 'target_parameters': parameter %s is not supported "
                                "(supported: a MoE's gate.weight, gate_up_proj, down_proj)",
                           path, json_is_string(item) ? s : "(not a string)");
    }
    if (c->target_params && c->dropout > 0)
        return ft_fail(err, "%s: key 'lora_dropout' must be 0 with target_parameters (PEFT "
                            "refuses dropout on a parameter's LoRA)", path);
    return 0;
}

/* rank_pattern and alpha_pattern of adapter_config.json (see ft_lora_patterns). */
static int read_config_patterns(json_t *root, const char *path, ft_lora_config *c, ft_err *err)
{
    static const char *const keys[2] = {"rank_pattern", "alpha_pattern"};
    for (int i = 0; i < 2; i++) {
        ft_lora_patterns *ps = i == 0 ? &c->rank_pattern : &c->alpha_pattern;
        char where[4200];
        snprintf(where, sizeof where, "%s: key '%s'", path, keys[i]);
        if (read_patterns(json_object_get(root, keys[i]), i == 0, where, ps, err))
            return -1;
        snprintf(ps->origin, sizeof ps->origin, "key '%s'", keys[i]);
    }
    return 0;
}

int ft_lora_config_load(ft_lora_config *c, const char *dir, ft_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *root = ft_json_read_file(path, 0, err);
    if (!root)
        return -1;
    int rc = -1;
    memset(c, 0, sizeof *c);
    snprintf(c->source, sizeof c->source, "%s", path);
    if (!json_is_object(root)) {
        ft_fail(err, "%s: not a JSON object", path);
        goto out;
    }
    json_t *v = json_object_get(root, "peft_type");
    if (v && (!json_is_string(v) || strcmp(json_string_value(v), "LORA") != 0)) {
        ft_fail(err, "%s: peft_type must be \"LORA\"", path);
        goto out;
    }
    v = json_object_get(root, "r");
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > INT_MAX) {
        ft_fail(err, "%s: key 'r' must be a positive integer (at most %d)", path, INT_MAX);
        goto out;
    }
    c->r = (int)json_integer_value(v);
    v = json_object_get(root, "lora_alpha");
    if (!json_is_number(v) || !isfinite((float)json_number_value(v))) {
        ft_fail(err, "%s: key 'lora_alpha' must be a number (that fits a float)", path);
        goto out;
    }
    c->alpha = (float)json_number_value(v);
    v = json_object_get(root, "lora_dropout");
    c->dropout = v && json_is_number(v) ? (float)json_number_value(v) : 0.0f;
    if (c->dropout < 0 || c->dropout >= 1) {
        ft_fail(err, "%s: key 'lora_dropout' must be in [0, 1)", path);
        goto out;
    }
    v = json_object_get(root, "use_rslora");
    c->rslora = v && json_is_true(v);
    v = json_object_get(root, "bias");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "none"))) {
        ft_fail(err, "%s: key 'bias' must be \"none\"", path);
        goto out;
    }
    v = json_object_get(root, "use_dora");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        ft_fail(err, "%s: key 'use_dora' must be true or false", path);
        goto out;
    }
    c->dora = v && json_is_true(v);
    /* lora_bias: PEFT's bias on lora_B (a trainable [out] beside each pair, added to
     * the base bias on merge) */
    static const char *const unsupported[] = {"fan_in_fan_out", "layer_replication",
                                              "trainable_token_indices", "lora_bias"};
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (reject_if_set(root, path, unsupported[i], err))
            goto out;
    if (read_target_parameters(root, path, c, err) || read_config_patterns(root, path, c, err))
        goto out;
    if (read_modules_to_save(root, path, c, err))
        goto out;
    v = json_object_get(root, "ensure_weight_tying");
    if (v && !json_is_null(v) && !json_is_boolean(v)) {
        ft_fail(err, "%s: key 'ensure_weight_tying' must be true or false", path);
        goto out;
    }
    c->ensure_weight_tying = v && json_is_true(v);
    c->weight_tying_set = true; /* (PEFT's default when absent: false) */
    v = json_object_get(root, "layers_to_transform");
    if (json_is_integer(v)) {
        if (layer_index(v, path, c, err))
            goto out;
    } else if (json_is_array(v)) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item)
        {
            if (!json_is_integer(item) || i >= FT_LORA_MAX_LAYER_LIST) {
                ft_fail(err, "%s: key 'layers_to_transform' must be a list of at most %d "
                             "layer indices",
                        path, FT_LORA_MAX_LAYER_LIST);
                goto out;
            }
            if (layer_index(item, path, c, err))
                goto out;
        }
    } else if (v && !json_is_null(v)) {
        ft_fail(err, "%s: key 'layers_to_transform' must be an integer or a list", path);
        goto out;
    }
    v = json_object_get(root, "layers_pattern");
    if (v && !json_is_null(v) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "layers") == 0)) {
        ft_fail(err, "%s: key 'layers_pattern': only \"layers\" (model.layers.N) is supported",
                path);
        goto out;
    }
    v = json_object_get(root, "target_modules");
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        if (strcmp(t, "all-linear") == 0) {
            c->targets = FT_LORA_ALL_LINEAR;
        } else if (strlen(t) >= sizeof c->target_regex) {
            ft_fail(err, "%s: key 'target_modules': regular expression too long", path);
            goto out;
        } else {
            strcpy(c->target_regex, t);
            unsigned mask;
            if (ft_lora_layer_mask(c, 0, &mask, err) || ft_lora_regex_outer(c, err)) {
                ft_fail_prefix(err, "%s: key 'target_modules'", path);
                goto out;
            }
        }
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item)
        {
            if (!json_is_string(item) || (match_target(json_string_value(item), &c->targets) &&
                                          match_layer_path(json_string_value(item), c))) {
                ft_fail(err,
                        "%s: key 'target_modules': unknown module %s (known: " KNOWN_MODULES
                        ", or one layer's, model.layers.N.self_attn.q_proj)",
                        path, json_is_string(item) ? json_string_value(item) : "(not a string)");
                goto out;
            }
        }
    } else if (!(c->target_params && (!v || json_is_null(v) || json_is_array(v)))) {
        ft_fail(err, "%s: key 'target_modules' must be a list of module names or \"all-linear\"",
                path);
        goto out;
    }
    if (adapter_vocab(dir, c, err))
        goto out;
    rc = 0;
out:
    json_decref(root);
    return rc;
}

/* The targets of c (no regex, no per-layer paths) as a regex over the module paths below
 * module_prefix, for PEFT's re.fullmatch: module_prefix layers.(any, or the listed
 * layers).(the target modules' paths), then the embedding's and the head's paths where
 * they are targets, e.g. model\.language_model\.layers\.\d+\.(?:self_attn\.q_proj|
 * mlp\.down_proj)|model\.language_model\.embed_tokens|lm_head. */
static int targets_regex(const ft_lora_config *c, char *out, size_t n, const char *dir,
                         ft_err *err)
{
    size_t len = 0;
    out[0] = '\0';
#define PUT(...) (len += (size_t)snprintf(out + (len < n ? len : n), len < n ? n - len : 0, \
                                          __VA_ARGS__))
#define PUT_PREFIX()                                                                       \
    for (const char *q = c->module_prefix; *q; q++) {                                       \
        if (*q == '.')                                                                      \
            PUT("\\.");                                                                    \
        else                                                                                \
            PUT("%c", *q);                                                                  \
    }
    if (c->targets & ~FT_LORA_OUTER) {
        PUT_PREFIX();
        PUT("layers\\.");
        if (c->n_layers == 0) {
            PUT("\\d+");
        } else {
            PUT("(?:");
            for (int i = 0; i < c->n_layers; i++)
                PUT("%s%d", i ? "|" : "", c->layers[i]);
            PUT(")");
        }
        PUT("\\.(?:");
        for (int p = 0, k = 0; p < FT_NPROJ; p++) {
            if (!(c->targets & (1u << p)))
                continue;
            const char *path = proj_paths[p], *dot = strchr(path, '.');
            PUT("%s%.*s\\.%s", k++ ? "|" : "", (int)(dot - path), path, dot + 1);
        }
        PUT(")");
    }
    if (c->targets & FT_LORA_EMBED) {
        PUT("%s", len ? "|" : "");
        PUT_PREFIX();
        PUT("embed_tokens");
    }
    if (c->targets & FT_LORA_HEAD)
        PUT("%slm_head", len ? "|" : "");
#undef PUT_PREFIX
#undef PUT
    if (len >= n || len >= sizeof c->target_regex)
        return ft_fail(err, "%s: the target modules' regular expression is too long", dir);
    return 0;
}

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* root's text, its keys sorted as PEFT writes them, the pattern maps' kept in order
 * (JSON_SORT_KEYS would sort them too); NULL when out of memory. */
static char *dump_sorted_top(json_t *root)
{
    size_t n = json_object_size(root), i = 0;
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    json_t *sorted = json_object();
    char *text = NULL;
    if (keys && sorted) {
        const char *k;
        json_t *v;
        json_object_foreach(root, k, v)
            keys[i++] = k;
        qsort(keys, n, sizeof *keys, key_cmp);
        for (i = 0; i < n; i++)
            json_object_set(sorted, keys[i], json_object_get(root, keys[i]));
        text = json_dumps(sorted, JSON_INDENT(2));
    }
    json_decref(sorted);
    free(keys);
    return text;
}

int ft_lora_config_save(const ft_lora_config *c, const char *dir, const char *base_model,
                        ft_err *err)
{
    /* a decoder inside a larger model: a regex keeps PEFT off the other modules */
    char regex[sizeof c->target_regex];
    bool nested = c->module_prefix[0] && strcmp(c->module_prefix, "model.") != 0 &&
                  !c->target_regex[0];
    if (nested && c->has_layer_paths)
        return ft_fail(err, "%s: LoRA targets given as per-layer module paths cannot be saved "
                       "for a model whose decoder is %s", dir, c->module_prefix);
    if (nested && targets_regex(c, regex, sizeof regex, dir, err))
        return -1;
    json_t *root = json_object();
    json_t *targets = json_array();
    for (int p = 0; p < FT_NPROJ; p++)
        if (c->targets & (1u << p))
            json_array_append_new(targets, json_string(proj_names[p]));
    for (int l = 0; c->has_layer_paths && l < FT_LORA_MAX_LAYER_LIST; l++)
        for (int p = 0; p < FT_NPROJ; p++)
            if (c->layer_paths[p][l / 64] >> (l % 64) & 1) {
                char path[96];
                snprintf(path, sizeof path, "model.layers.%d.%s", l, proj_paths[p]);
                json_array_append_new(targets, json_string(path));
            }
    if (c->targets & FT_LORA_EMBED)
        json_array_append_new(targets, json_string("embed_tokens"));
    if (c->targets & FT_LORA_HEAD)
        json_array_append_new(targets, json_string("lm_head"));
    json_object_set_new(root, "peft_type", json_string("LORA"));
    json_object_set_new(root, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(root, "base_model_name_or_path", json_string(base_model ? base_model : ""));
    json_object_set_new(root, "r", json_integer(c->r));
    json_object_set_new(root, "lora_alpha", json_real(c->alpha));
    json_object_set_new(root, "lora_dropout", json_real(c->dropout));
    if (c->target_regex[0] || nested) {
        json_decref(targets);
        json_object_set_new(root, "target_modules",
                            json_string(nested ? regex : c->target_regex));
    } else {
        json_object_set_new(root, "target_modules", targets);
    }
    if (c->n_layers > 0 && !nested) { /* (nested: in the regex) */
        json_t *layers = json_array();
        for (int i = 0; i < c->n_layers; i++)
            json_array_append_new(layers, json_integer(c->layers[i]));
        json_object_set_new(root, "layers_to_transform", layers);
    }
    json_object_set_new(root, "bias", json_string("none"));
    json_object_set_new(root, "use_rslora", json_boolean(c->rslora));
    json_object_set_new(root, "use_dora", json_boolean(c->dora));
    json_object_set_new(root, "ensure_weight_tying", json_boolean(c->ensure_weight_tying));
    json_object_set_new(root, "fan_in_fan_out", json_false());
    json_object_set_new(root, "init_lora_weights", json_true());
    json_object_set_new(root, "inference_mode", json_true());
    if (c->target_params) {
        json_t *params = json_array();
        if (c->target_params & FT_LORA_PARAM_ROUTER)
            json_array_append_new(params, json_string("gate.weight"));
        if (c->target_params & FT_LORA_PARAM_GATE_UP)
            json_array_append_new(params, json_string("gate_up_proj"));
        if (c->target_params & FT_LORA_PARAM_DOWN)
            json_array_append_new(params, json_string("down_proj"));
        json_object_set_new(root, "target_parameters", params);
    }
    /* in the order given, which decides between keys matching one module (PEFT's own
     * save sorts them) */
    json_t *rp = json_object(), *ap = json_object();
    for (int i = 0; i < c->rank_pattern.n; i++)
        json_object_set_new(rp, c->rank_pattern.p[i].key,
                            json_integer((json_int_t)c->rank_pattern.p[i].value));
    for (int i = 0; i < c->alpha_pattern.n; i++) { /* (an integral alpha as PEFT's int) */
        double x = c->alpha_pattern.p[i].value;
        json_object_set_new(ap, c->alpha_pattern.p[i].key,
                            x == floor(x) && fabs(x) < 1e15 ? json_integer((json_int_t)x)
                                                            : json_real(x));
    }
    json_object_set_new(root, "rank_pattern", rp);
    json_object_set_new(root, "alpha_pattern", ap);
    if (c->modules_to_save) {
        json_t *mods = json_array();
        if (c->modules_to_save & FT_SAVE_EMBED)
            json_array_append_new(mods, json_string("embed_tokens"));
        if (c->modules_to_save & FT_SAVE_HEAD)
            json_array_append_new(mods, json_string("lm_head"));
        json_object_set_new(root, "modules_to_save", mods);
    } else {
        json_object_set_new(root, "modules_to_save", json_null());
    }
    char *text = dump_sorted_top(root);
    json_decref(root);
    if (!text)
        return ft_fail(err, "%s: out of memory writing adapter_config.json", dir);
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int rc = ft_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* re.fullmatch(regex, name) with PCRE2, whose syntax is Python's for what adapters use. */
static int regex_fullmatch(pcre2_code *re, const char *name)
{
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)name, strlen(name), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

int ft_lora_layer_mask(const ft_lora_config *c, int layer, unsigned *mask, ft_err *err)
{
    *mask = 0;
    if (!c->target_regex[0]) {
        bool in_list = c->n_layers == 0;
        for (int i = 0; i < c->n_layers; i++)
            in_list |= c->layers[i] == layer;
        *mask = in_list ? c->targets : 0;
        for (int p = 0; c->has_layer_paths && p < FT_NPROJ; p++)
            if (layer < FT_LORA_MAX_LAYER_LIST &&
                (c->layer_paths[p][layer / 64] >> (layer % 64) & 1))
                *mask |= 1u << p;
        return 0;
    }
    int code;
    PCRE2_SIZE where;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)c->target_regex, PCRE2_ZERO_TERMINATED,
                                   PCRE2_ANCHORED | PCRE2_ENDANCHORED, &code, &where, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return ft_fail(err, "regular expression '%s': %s at offset %zu", c->target_regex,
                       (char *)msg, (size_t)where);
    }
    int rc = 0;
    const char *mp = c->module_prefix[0] ? c->module_prefix : "model.";
    for (int p = 0; p < FT_NPROJ; p++) {
        char name[128];
        snprintf(name, sizeof name, "%slayers.%d.%s", mp, layer, proj_paths[p]);
        if (regex_fullmatch(re, name))
            *mask |= 1u << p;
    }
    pcre2_code_free(re);
    return rc;
}

int ft_lora_regex_outer(ft_lora_config *c, ft_err *err)
{
    if (!c->target_regex[0])
        return 0;
    int code;
    PCRE2_SIZE where;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)c->target_regex, PCRE2_ZERO_TERMINATED,
                                   PCRE2_ANCHORED | PCRE2_ENDANCHORED, &code, &where, NULL);
    if (!re)
        return ft_fail(err, "regular expression '%s' does not compile", c->target_regex);
    char embed[64];
    snprintf(embed, sizeof embed, "%sembed_tokens",
             c->module_prefix[0] ? c->module_prefix : "model.");
    c->targets &= ~FT_LORA_OUTER;
    if (regex_fullmatch(re, embed))
        c->targets |= FT_LORA_EMBED;
    if (regex_fullmatch(re, "lm_head"))
        c->targets |= FT_LORA_HEAD;
    pcre2_code_free(re);
    return 0;
}
