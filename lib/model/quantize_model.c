/* Quantizing a checkpoint on disk: source tensors -> bitsandbytes' state-dict layout.
 *
 * Two passes over the mmap'ed source. The first decides, tensor by tensor, what happens to
 * it (quantized or dense, in which dtype) and checks everything that can be checked
 * without the data, so that a bad checkpoint fails before any work; it also finds the
 * largest weight to quantize, the size of the one fp32 buffer. The second converts one
 * weight at a time into that buffer and quantizes it into its ft_qtensor (kept until the
 * save), or adds the dense tensor to the writer, pointing into the mapping when its dtype
 * is kept. The writer then saves everything into a temporary dir next to the output,
 * beside the new config.json and the copied tokenizer files, and the dir is renamed into
 * place (lib/core/fsutil.c). */
#include "model/quantize_model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsutil.h"
#include "formats/lora.h"
#include "model/merge.h"
#include "formats/quant_io.h"

/* Room for the skip list in the readers (ft_quant_config.skip, the model's copy). */
#define SKIP_LIST_MAX 500

/* ---- dtypes ------------------------------------------------------------------------ */

/* config.json's / quant_state's name of a float dtype; NULL for the others. */
static const char *torch_name(ft_st_dtype dt)
{
    switch (dt) {
    case FT_ST_F32: return "float32";
    case FT_ST_BF16: return "bfloat16";
    case FT_ST_F16: return "float16";
    default: return NULL;
    }
}

static bool is_float(ft_st_dtype dt) { return torch_name(dt) != NULL; }

/* "keep" (NULL) -> -1; "bf16" / "f16" / "f32" or the torch names -> the dtype. */
static int parse_out_dtype(const char *s, int *out, ft_err *err)
{
    static const struct {
        const char *a, *b;
        ft_st_dtype dt;
    } names[] = {{"f32", "float32", FT_ST_F32},
                 {"bf16", "bfloat16", FT_ST_BF16},
                 {"f16", "float16", FT_ST_F16}};
    *out = -1;
    if (!s || strcmp(s, "keep") == 0)
        return 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].a) == 0 || strcmp(s, names[i].b) == 0) {
            *out = (int)names[i].dt;
            return 0;
        }
    return ft_fail(err, "unknown dtype '%s' (expected keep, bf16, f16 or f32)", s);
}

/* Element j of a F32 / F16 / BF16 tensor's data. */
static float load_float(const void *data, ft_st_dtype dt, size_t j)
{
    if (dt == FT_ST_F32) {
        float f;
        memcpy(&f, (const char *)data + 4 * j, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)data + 2 * j, sizeof h);
    return dt == FT_ST_BF16 ? ft_bf16_to_f32(h) : ft_f16_to_f32(h);
}

static void store_float(void *data, ft_st_dtype dt, size_t j, float f)
{
    if (dt == FT_ST_F32) {
        memcpy((char *)data + 4 * j, &f, sizeof f);
        return;
    }
    uint16_t h = dt == FT_ST_BF16 ? ft_f32_to_bf16(f) : ft_f32_to_f16(f);
    memcpy((char *)data + 2 * j, &h, sizeof h);
}

/* x rounded to dt (round to nearest even), back in fp32. */
static float round_to(float x, ft_st_dtype dt)
{
    if (dt == FT_ST_BF16)
        return ft_bf16_to_f32(ft_f32_to_bf16(x));
    if (dt == FT_ST_F16)
        return ft_f16_to_f32(ft_f32_to_f16(x));
    return x;
}

/* ---- which tensors ----------------------------------------------------------------- */

/* Whether name is model.layers.N.<projection>.weight, a projection of the block or of
 * qwen2_moe's shared expert (mlp.shared_expert.gate_proj, ...) and its gate (one row, a
 * linear layer bitsandbytes quantizes too); path receives the module path. */
static bool block_linear_weight(const char *name, char *path, size_t size)
{
    const char *prefix = "model.layers.", *suffix = ".weight";
    size_t np = strlen(prefix), n = strlen(name), ns = strlen(suffix);
    if (strncmp(name, prefix, np) != 0 || n <= np + ns || strcmp(name + n - ns, suffix) != 0)
        return false;
    const char *p = name + np;
    if (*p < '0' || *p > '9')
        return false;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p++ != '.')
        return false;
    size_t rest = (size_t)(name + n - ns - p);
    /* the shared expert's projections match as the MLP's (mlp.shared_expert.gate_proj as
     * mlp.gate_proj) */
    char mod[160];
    const char *shared = "mlp.shared_expert.";
    size_t nsh = strlen(shared);
    if (rest > nsh && rest < sizeof mod && strncmp(p, shared, nsh) == 0) {
        snprintf(mod, sizeof mod, "mlp.%.*s", (int)(rest - nsh), p + nsh);
        p = mod;
        rest = strlen(mod);
    }
    for (int k = 0; k < FT_NPROJ; k++) {
        const char *proj = ft_proj_path((ft_proj)k);
        if (strlen(proj) == rest && strncmp(p, proj, rest) == 0) {
            snprintf(path, size, "%.*s", (int)(n - ns), name);
            return true;
        }
    }
    return false;
}

/* A tensor only a quantized checkpoint has. */
static bool quantized_part(const char *name)
{
    static const char *const suffixes[] = {".SCB", ".weight_format", ".weight.absmax",
                                           ".weight.quant_map", ".weight.nested_absmax"};
    if (strstr(name, ".quant_state.bitsandbytes__"))
        return true;
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t k = strlen(suffixes[i]);
        if (n > k && strcmp(name + n - k, suffixes[i]) == 0)
            return true;
    }
    return false;
}

/* ["lm_head", the user's entries (trimmed, empty ones and repeats dropped)...]. */
static int build_skip_list(const char *user, json_t **out, ft_err *err)
{
    json_t *list = json_array();
    if (!list || json_array_append_new(list, json_string("lm_head")))
        return ft_fail(err, "out of memory");
    size_t total = strlen("lm_head");
    const char *s = user ? user : "";
    while (*s) {
        const char *end = strchr(s, ',');
        if (!end)
            end = s + strlen(s);
        const char *a = s, *b = end;
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
            b--;
        s = *end ? end + 1 : end;
        if (a == b)
            continue;
        char entry[SKIP_LIST_MAX + 1];
        total += (size_t)(b - a) + 1;
        if (total > SKIP_LIST_MAX) {
            json_decref(list);
            return ft_fail(err, "the skip list is longer than %d characters", SKIP_LIST_MAX);
        }
        snprintf(entry, sizeof entry, "%.*s", (int)(b - a), a);
        bool dup = false;
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) dup |= strcmp(json_string_value(v), entry) == 0;
        if (dup)
            continue;
        json_t *js = json_string(entry);
        if (!js || json_array_append_new(list, js)) {
            json_decref(list);
            return ft_fail(err, "skip list entry '%s': not valid UTF-8", entry);
        }
    }
    *out = list;
    return 0;
}

static const char *skipped_by(const json_t *skip, const char *path)
{
    size_t i;
    json_t *v;
    json_array_foreach(skip, i, v)
    {
        if (strstr(path, json_string_value(v)))
            return json_string_value(v);
    }
    return NULL;
}

/* ---- config.json ------------------------------------------------------------------- */

static int load_source_config(const char *dir, json_t **out, ft_err *err)
{
    json_t *root;
    if (ft_read_model_config_json(dir, &root, err))
        return -1;
    json_t *q = json_object_get(root, "quantization_config");
    if (q && !json_is_null(q)) {
        const char *method = json_string_value(json_object_get(q, "quant_method"));
        ft_fail(err, "%s/config.json: the model is quantized already (quantization_config, "
                     "quant_method '%s'); ft-quantize needs a 16- or 32-bit checkpoint",
                dir, method ? method : "?");
        json_decref(root);
        return -1;
    }
    *out = root;
    return 0;
}

/* The source's torch_dtype ("dtype" in transformers 5) when it is a float dtype. */
static const char *config_dtype(const json_t *cfg)
{
    const char *s = json_string_value(json_object_get(cfg, "torch_dtype"));
    if (!s)
        s = json_string_value(json_object_get(cfg, "dtype"));
    static const char *const known[] = {"float32", "bfloat16", "float16"};
    for (size_t i = 0; s && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(s, known[i]) == 0)
            return known[i];
    return NULL;
}

/* transformers' BitsAndBytesConfig(...).to_dict(), keys in its order. */
static json_t *quantization_config(const ft_quant_options *q, const json_t *skip,
                                   const char *compute_dtype)
{
    bool int8 = q->type == FT_QUANT_INT8;
    json_t *c = json_object();
    if (!c)
        return NULL;
    int bad = 0;
    bad |= json_object_set_new(c, "quant_method", json_string("bitsandbytes"));
    bad |= json_object_set_new(c, "_load_in_8bit", json_boolean(int8));
    bad |= json_object_set_new(c, "_load_in_4bit", json_boolean(!int8));
    bad |= json_object_set_new(c, "llm_int8_threshold", json_real(6.0));
    /* None unless the list is more than transformers' own default */
    bad |= json_object_set_new(c, "llm_int8_skip_modules",
                               json_array_size(skip) > 1 ? json_deep_copy(skip) : json_null());
    bad |= json_object_set_new(c, "llm_int8_enable_fp32_cpu_offload", json_false());
    bad |= json_object_set_new(c, "llm_int8_has_fp16_weight", json_false());
    bad |= json_object_set_new(c, "bnb_4bit_quant_type",
                               json_string(int8 ? "fp4" : ft_quant_name(q->type)));
    bad |= json_object_set_new(c, "bnb_4bit_use_double_quant",
                               json_boolean(!int8 && q->double_quant));
    bad |= json_object_set_new(c, "bnb_4bit_compute_dtype", json_string(compute_dtype));
    bad |= json_object_set_new(c, "bnb_4bit_quant_storage", json_string("uint8"));
    bad |= json_object_set_new(c, "load_in_4bit", json_boolean(!int8));
    bad |= json_object_set_new(c, "load_in_8bit", json_boolean(int8));
    if (!int8 && q->blocksize != 64)
        bad |= json_object_set_new(c, "bnb_4bit_blocksize", json_integer(q->blocksize));
    if (bad) {
        json_decref(c);
        return NULL;
    }
    return c;
}

static int write_config(json_t *cfg, json_t *qc, const char *converted_to, const char *dir,
                        ft_err *err)
{
    if (json_object_set_new(cfg, "quantization_config", qc))
        return ft_fail(err, "%s: out of memory writing config.json", dir);
    return ft_write_model_config(cfg, dir, converted_to, err);
}

/* ---- the two passes ---------------------------------------------------------------- */

typedef struct plan {
    bool *quantize;      /* [n tensors] */
    size_t n_quantized;
    size_t max_numel;    /* of the weights to quantize */
    ft_st_dtype first_q; /* dtype of the first weight to quantize */
} plan;

static int make_plan(const ft_checkpoint *ck, const json_t *skip, plan *pl, ft_err *err)
{
    size_t n = ft_ckpt_count(ck);
    pl->quantize = calloc(n ? n : 1, sizeof *pl->quantize);
    if (!pl->quantize)
        return ft_fail(err, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        if (quantized_part(t->name))
            return ft_fail(err, "%s: tensor '%s' is part of a quantized weight: the checkpoint "
                                "is quantized already",
                           t->file, t->name);
        char path[200];
        if (!block_linear_weight(t->name, path, sizeof path) || skipped_by(skip, path))
            continue;
        if (t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0)
            return ft_fail(err, "%s: tensor '%s': a linear weight must be 2-D and non-empty (it "
                                "has %d dimensions)",
                           t->file, t->name, t->ndim);
        if (!is_float(t->dtype))
            return ft_fail(err, "%s: tensor '%s' is %s; only F32, F16 and BF16 weights can be "
                                "quantized",
                           t->file, t->name, ft_st_dtype_name(t->dtype));
        pl->quantize[i] = true;
        if (pl->n_quantized++ == 0)
            pl->first_q = t->dtype;
        if (t->numel > pl->max_numel)
            pl->max_numel = t->numel;
    }
    return 0;
}

/* Adds the dense tensor t as it is, or converted to out_dt (a copy the writer keeps). */
static int add_dense(ft_st_writer *w, const ft_st_tensor *t, ft_st_dtype out_dt, ft_err *err)
{
    if (t->dtype == out_dt)
        return ft_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, err);
    void *buf = malloc(t->numel ? t->numel * ft_st_dtype_size(out_dt) : 1);
    if (!buf)
        return ft_fail(err, "out of memory converting '%s'", t->name);
    for (size_t j = 0; j < t->numel; j++)
        store_float(buf, out_dt, j, load_float(t->data, t->dtype, j));
    if (ft_st_writer_keep(w, buf)) {
        free(buf);
        return ft_fail(err, "out of memory converting '%s'", t->name);
    }
    return ft_st_writer_add(w, t->name, out_dt, t->ndim, t->shape, buf, err);
}

/* Quantizes weight t through buf into q and adds its state-dict tensors to w. to: the
 * dtype the model is converted to (-1: kept). */
static int add_quantized(ft_st_writer *w, const ft_st_tensor *t, const ft_quant_options *qo,
                         int to, float *buf, ft_qtensor *q, ft_err *err)
{
    if (ft_st_to_f32(t, buf, t->numel, err))
        return ft_fail_prefix(err, "%s", t->file);
    ft_st_dtype dt = to >= 0 ? (ft_st_dtype)to : t->dtype;
    if (dt != t->dtype)
        for (size_t j = 0; j < t->numel; j++)
            buf[j] = round_to(buf[j], dt);
    if (ft_quantize(buf, t->shape[0], t->shape[1], qo, q, err))
        return ft_fail_prefix(err, "%s: tensor '%s'", t->file, t->name);
    char prefix[200];
    snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(t->name) - strlen(".weight")),
             t->name);
    size_t first = ft_st_writer_count(w);
    if (ft_qtensor_write(w, prefix, q, torch_name(dt), err))
        return -1;
    ft_st_writer_group(w, first);
    return 0;
}

static int check_options(const ft_quantize_model_options *o, ft_err *err)
{
    if (!o->model_dir || !o->model_dir[0] || !o->out_dir || !o->out_dir[0])
        return ft_fail(err, "quantizing needs a model dir and an output dir");
    const ft_quant_options *q = &o->quant;
    if (q->type != FT_QUANT_NF4 && q->type != FT_QUANT_FP4 && q->type != FT_QUANT_INT8)
        return ft_fail(err, "quantization type '%s': expected nf4, fp4 or int8",
                       ft_quant_name(q->type));
    int bs = q->blocksize;
    if (q->type != FT_QUANT_INT8 && (bs < 32 || bs > 4096 || (bs & (bs - 1))))
        return ft_fail(err, "blocksize %d: it must be a power of two in [32, 4096]", bs);
    return 0;
}

int ft_quantize_model(const ft_quantize_model_options *o, ft_quantize_summary *sum,
                      ft_err *err)
{
    memset(sum, 0, sizeof *sum);
    int to;
    if (check_options(o, err) || parse_out_dtype(o->dtype, &to, err))
        return -1;
    ft_quant_options qo = o->quant;
    if (qo.type == FT_QUANT_INT8) {
        qo.blocksize = 0;
        qo.double_quant = false;
    }
    char out[4096];
    const char *inputs[] = {o->model_dir};
    if (ft_out_dir_check(o->out_dir, o->force, inputs, 1, out, sizeof out, err))
        return -1;

    json_t *cfg = NULL, *skip = NULL, *qc = NULL;
    ft_checkpoint *ck = NULL;
    ft_st_writer *w = NULL;
    plan pl = {0};
    float *buf = NULL;
    ft_qtensor *qt = NULL;
    char tmp[4200] = "";
    int rc = -1;

    if (load_source_config(o->model_dir, &cfg, err) || build_skip_list(o->skip, &skip, err) ||
        ft_ckpt_open(&ck, o->model_dir, "model", err) || make_plan(ck, skip, &pl, err))
        goto done;
    if (pl.n_quantized == 0) {
        ft_fail(err, "%s: no linear weight of the transformer blocks to quantize (expected "
                     "model.layers.N.self_attn.q_proj.weight and the like%s)",
                o->model_dir, json_array_size(skip) > 1 ? ", not all of them skipped" : "");
        goto done;
    }
    /* the dtype the model computes in: the converted one, else the source's */
    const char *model_dtype = to >= 0 ? torch_name((ft_st_dtype)to) : config_dtype(cfg);
    if (!model_dtype)
        model_dtype = torch_name(pl.first_q);
    if (!(qc = quantization_config(&qo, skip, model_dtype))) {
        ft_fail(err, "out of memory");
        goto done;
    }

    size_t n = ft_ckpt_count(ck);
    buf = malloc(pl.max_numel * sizeof *buf);
    qt = calloc(n, sizeof *qt);
    w = ft_st_writer_new();
    if (!buf || !qt || !w) {
        ft_fail(err, "out of memory (a %zu-element fp32 buffer)", pl.max_numel);
        goto done;
    }
    if (ft_st_writer_metadata(w, "format", "pt", err))
        goto done;
    for (size_t i = 0; i < n; i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        size_t before = ft_st_writer_bytes(w);
        ft_st_dtype out_dt = to >= 0 && is_float(t->dtype) ? (ft_st_dtype)to : t->dtype;
        if (pl.quantize[i] ? add_quantized(w, t, &qo, to, buf, &qt[i], err)
                           : add_dense(w, t, out_dt, err))
            goto done;
        sum->bytes_in += t->nbytes;
        sum->n_quantized += pl.quantize[i];
        if (o->progress) {
            ft_quantize_progress p = {.index = i + 1, .count = n, .name = t->name,
                                      .quantized = pl.quantize[i], .src_dtype = t->dtype,
                                      .out_dtype = out_dt, .ndim = t->ndim, .shape = t->shape,
                                      .bytes_in = t->nbytes,
                                      .bytes_out = ft_st_writer_bytes(w) - before};
            o->progress(&p, o->progress_ctx);
        }
    }
    sum->n_tensors = n;
    sum->bytes_out = ft_st_writer_bytes(w);
    free(buf);
    buf = NULL;

    if (ft_make_temp_dir(out, tmp, sizeof tmp, err)) {
        tmp[0] = '\0';
        goto done;
    }
    size_t max_shard = o->max_shard_bytes ? o->max_shard_bytes : FT_MERGE_DEFAULT_SHARD_BYTES;
    if (ft_st_writer_save_sharded(w, tmp, "model", max_shard, err))
        goto done;
    rc = write_config(cfg, qc, to >= 0 ? model_dtype : NULL, tmp, err);
    qc = NULL; /* cfg owns it now */
    if (rc == 0)
        rc = ft_copy_passthrough_files(o->model_dir, tmp, err);
    if (rc == 0)
        rc = ft_publish_dir(tmp, out, o->force, "ft-quantize", err);
done:
    if (rc && tmp[0])
        ft_remove_tree(tmp);
    ft_st_writer_free(w);
    for (size_t i = 0; qt && i < ft_ckpt_count(ck); i++)
        ft_qtensor_free(&qt[i]);
    free(qt);
    free(buf);
    free(pl.quantize);
    ft_ckpt_close(ck);
    json_decref(qc);
    json_decref(skip);
    json_decref(cfg);
    return rc;
}
