/* Quantized checkpoints in bitsandbytes' state-dict layout (see quant_io.h). */
#include "formats/quant_io.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/json_file.h"

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* Python's repr of a double: the shortest decimal that reads back as the same value. */
static void shortest_double(char *buf, size_t cap, double v)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    if (!strpbrk(buf, ".en")) /* json.dumps writes a float with a point: 1.0, not 1 */
        strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* bitsandbytes' pack_dict_to_tensor(json.dumps(...)) of a QuantState's non-tensor part. */
static char *quant_state_json(const ft_qtensor *q, const char *dtype)
{
    char *buf = malloc(512);
    if (!buf)
        return NULL;
    int n = snprintf(buf, 512,
                     "{\"quant_type\": \"%s\", \"blocksize\": %d, \"dtype\": \"%s\", "
                     "\"shape\": [%lld, %lld]",
                     ft_quant_name(q->type), q->blocksize, dtype, (long long)q->rows,
                     (long long)q->cols);
    if (q->nested) {
        char off[40];
        shortest_double(off, sizeof off, (double)q->nested_offset);
        n += snprintf(buf + n, 512 - (size_t)n,
                      ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", "
                      "\"nested_offset\": %s",
                      q->nested_blocksize, off);
    }
    snprintf(buf + n, 512 - (size_t)n, "}");
    return buf;
}

static int add(ft_st_writer *w, const char *prefix, const char *suffix, ft_st_dtype dt,
               int ndim, int64_t d0, int64_t d1, const void *data, ft_err *err)
{
    char name[512];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    int64_t shape[2] = {d0, d1};
    return ft_st_writer_add(w, name, dt, ndim, shape, data, err);
}

int ft_qtensor_write(ft_st_writer *w, const char *prefix, const ft_qtensor *q,
                     const char *dtype, ft_err *err)
{
    static const uint8_t row_format = 0; /* weight_format "row" */
    if (q->type == FT_QUANT_INT8)
        return add(w, prefix, ".weight", FT_ST_I8, 2, q->rows, q->cols, q->q, err) ||
               add(w, prefix, ".SCB", FT_ST_F32, 1, q->rows, 0, q->scb, err) ||
               add(w, prefix, ".weight_format", FT_ST_U8, 0, 0, 0, &row_format, err);
    size_t n = (size_t)q->rows * (size_t)q->cols;
    int64_t nb = (int64_t)q->n_blocks;
    char *js = quant_state_json(q, dtype);
    if (!js || ft_st_writer_keep(w, js)) {
        free(js);
        return ft_fail(err, "%s: out of memory", prefix);
    }
    char state_key[64];
    snprintf(state_key, sizeof state_key, ".weight.quant_state.bitsandbytes__%s",
             ft_quant_name(q->type));
    int rc = add(w, prefix, ".weight", FT_ST_U8, 2, (int64_t)ceil_div(n, 2), 1, q->packed, err) ||
             add(w, prefix, ".weight.quant_map", FT_ST_F32, 1, 16, 0, ft_quant_code(q->type), err) ||
             add(w, prefix, state_key, FT_ST_U8, 1, (int64_t)strlen(js), 0, js, err);
    if (rc)
        return -1;
    if (!q->nested)
        return add(w, prefix, ".weight.absmax", FT_ST_F32, 1, nb, 0, q->absmax, err);
    int64_t n2 = (int64_t)ceil_div(q->n_blocks, (size_t)q->nested_blocksize);
    return add(w, prefix, ".weight.absmax", FT_ST_U8, 1, nb, 0, q->absmax_q, err) ||
           add(w, prefix, ".weight.nested_absmax", FT_ST_F32, 1, n2, 0, q->nested_absmax, err) ||
           add(w, prefix, ".weight.nested_quant_map", FT_ST_F32, 1, 256, 0, q->nested_map, err);
}

static const ft_st_tensor *find(const ft_checkpoint *ck, const char *prefix, const char *suffix)
{
    char name[512];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    return ft_ckpt_find(ck, name);
}

ft_quant_type ft_qtensor_probe(const ft_checkpoint *ck, const char *prefix)
{
    if (find(ck, prefix, ".weight.quant_state.bitsandbytes__nf4"))
        return FT_QUANT_NF4;
    if (find(ck, prefix, ".weight.quant_state.bitsandbytes__fp4"))
        return FT_QUANT_FP4;
    const ft_st_tensor *w = find(ck, prefix, ".weight");
    if (w && w->dtype == FT_ST_I8 && (find(ck, prefix, ".SCB") || find(ck, prefix, ".weight.SCB")))
        return FT_QUANT_INT8;
    return FT_QUANT_NONE;
}

/* A tensor of exactly `numel` elements of dtype dt (ANY: any dtype, counted in bytes). */
enum { ANY_DTYPE = -1 };
static int expect(const ft_st_tensor *t, const char *prefix, const char *suffix, int dt,
                  size_t numel, ft_err *err)
{
    if (!t)
        return ft_fail(err, "quantized weight '%s': tensor '%s%s' is missing", prefix, prefix,
                       suffix);
    if (dt != ANY_DTYPE && t->dtype != (ft_st_dtype)dt)
        return ft_fail(err, "%s: tensor '%s' is %s, expected %s", t->file, t->name,
                       ft_st_dtype_name(t->dtype), ft_st_dtype_name((ft_st_dtype)dt));
    size_t have = dt == ANY_DTYPE ? t->nbytes : t->numel;
    if (have != numel)
        return ft_fail(err, "%s: tensor '%s' holds %zu %s, expected %zu for its weight", t->file,
                       t->name, have, dt == ANY_DTYPE ? "bytes" : "values", numel);
    return 0;
}

static int oom(ft_err *err, const char *prefix)
{
    return ft_fail(err, "%s: out of memory reading the quantized weight", prefix);
}

static void *copy_of(const ft_st_tensor *t)
{
    void *p = malloc(t->nbytes ? t->nbytes : 1);
    if (p && t->nbytes)
        memcpy(p, t->data, t->nbytes);
    return p;
}

/* Quantization scales (absmax, SCB, the nested code and absmax) must be finite: one NaN
 * or infinity dequantizes a whole block or row to NaN, which would only show as a loss of
 * nan. */
static int finite_scales(const ft_st_tensor *t, ft_err *err)
{
    size_t i = ft_f32_first_nonfinite(t->data, t->numel);
    if (i == t->numel)
        return 0;
    float v;
    memcpy(&v, (const unsigned char *)t->data + 4 * i, sizeof v);
    return ft_fail(err, "%s: tensor '%s': element [%zu] is %s; quantization scales must be "
                        "finite",
                   t->file, t->name, i, isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf");
}

/* bitsandbytes writes str(torch dtype) without "torch.": the compute dtype a 4-bit
 * weight dequantizes to. */
static bool state_dtype_ok(const json_t *v)
{
    const char *s = json_string_value(v);
    return s && (!strcmp(s, "bfloat16") || !strcmp(s, "float16") || !strcmp(s, "float32"));
}

/* The quant_state JSON of a 4-bit weight (bitsandbytes' QuantState.as_dict without its
 * tensors), checked against the weight's shape: every field of the right type. */
static int read_quant_state(const ft_st_tensor *t, ft_qtensor *q, int64_t rows, int64_t cols,
                            ft_err *err)
{
    json_error_t jerr;
    json_t *js = json_loadb(t->data, t->nbytes, JSON_REJECT_DUPLICATES, &jerr);
    if (!js || !json_is_object(js)) {
        json_decref(js);
        return ft_fail(err, "%s: tensor '%s': not a JSON object (%s)", t->file, t->name,
                       js ? "another JSON value" : jerr.text);
    }
    int rc = -1;
    const char *type = json_string_value(json_object_get(js, "quant_type"));
    json_t *bs = json_object_get(js, "blocksize"), *shape = json_object_get(js, "shape");
    if (!type || strcmp(type, ft_quant_name(q->type)) != 0) {
        ft_fail(err, "%s: tensor '%s': quant_type %s does not match the key", t->file, t->name,
                type ? type : "(missing)");
        goto done;
    }
    long long b = json_is_integer(bs) ? json_integer_value(bs) : 0;
    if (b < 32 || b > 4096 || (b & (b - 1))) {
        ft_fail(err, "%s: tensor '%s': blocksize must be a power of two in [32, 4096] (an "
                     "integer)",
                t->file, t->name);
        goto done;
    }
    q->blocksize = (int)b;
    if (!json_is_array(shape) || json_array_size(shape) != 2 ||
        !json_is_integer(json_array_get(shape, 0)) || !json_is_integer(json_array_get(shape, 1)) ||
        json_integer_value(json_array_get(shape, 0)) != rows ||
        json_integer_value(json_array_get(shape, 1)) != cols) {
        ft_fail(err, "%s: tensor '%s': shape is not [%lld, %lld], the model's for this weight",
                t->file, t->name, (long long)rows, (long long)cols);
        goto done;
    }
    json_t *dt = json_object_get(js, "dtype");
    if (!state_dtype_ok(dt)) {
        char got[64];
        snprintf(got, sizeof got, "%s%s%s", json_is_string(dt) ? "'" : "",
                 json_is_string(dt) ? json_string_value(dt) : dt ? "not a string" : "missing",
                 json_is_string(dt) ? "'" : "");
        ft_fail(err, "%s: tensor '%s': dtype %s is not bfloat16, float16 or float32", t->file,
                t->name, got);
        goto done;
    }
    json_t *off = json_object_get(js, "nested_offset");
    if (off) {
        json_t *nbs = json_object_get(js, "nested_blocksize");
        json_t *ndt = json_object_get(js, "nested_dtype");
        long long nb = json_is_integer(nbs) ? json_integer_value(nbs) : 0;
        if (!json_is_number(off) || !isfinite((float)json_number_value(off)) || nb < 1 ||
            nb > (1 << 20)) {
            ft_fail(err, "%s: tensor '%s': nested_offset / nested_blocksize are not numbers "
                         "(finite; a blocksize in [1, 2^20])",
                    t->file, t->name);
            goto done;
        }
        /* the nested absmax is read as F32 below, as bitsandbytes always writes it */
        const char *nd = json_string_value(ndt);
        if (!nd || strcmp(nd, "float32") != 0) {
            ft_fail(err, "%s: tensor '%s': nested_dtype %s is not float32", t->file, t->name,
                    nd ? nd : ndt ? "(not a string)" : "(missing)");
            goto done;
        }
        q->nested = true;
        q->nested_offset = (float)json_number_value(off);
        q->nested_blocksize = (int)nb;
    }
    rc = 0;
done:
    json_decref(js);
    return rc;
}

static int read_4bit(const ft_checkpoint *ck, const char *prefix, ft_qtensor *q, int64_t rows,
                     int64_t cols, ft_err *err)
{
    char key[64];
    snprintf(key, sizeof key, ".weight.quant_state.bitsandbytes__%s", ft_quant_name(q->type));
    if (read_quant_state(find(ck, prefix, key), q, rows, cols, err))
        return -1;
    size_t n = (size_t)rows * (size_t)cols;
    q->n_blocks = ceil_div(n, (size_t)q->blocksize);
    /* bnb_4bit_quant_storage may be another dtype: the same bytes, reinterpreted */
    const ft_st_tensor *w = find(ck, prefix, ".weight"), *map = find(ck, prefix, ".weight.quant_map"),
                       *am = find(ck, prefix, ".weight.absmax");
    if (expect(w, prefix, ".weight", ANY_DTYPE, ceil_div(n, 2), err) ||
        expect(map, prefix, ".weight.quant_map", FT_ST_F32, 16, err) ||
        expect(am, prefix, ".weight.absmax", q->nested ? FT_ST_U8 : FT_ST_F32, q->n_blocks, err))
        return -1;
    if (memcmp(map->data, ft_quant_code(q->type), 16 * sizeof(float)) != 0)
        return ft_fail(err, "%s: tensor '%s' is not bitsandbytes' %s code table", map->file,
                       map->name, ft_quant_name(q->type));
    if (!(q->packed = copy_of(w)))
        return oom(err, prefix);
    if (!q->nested) {
        if (finite_scales(am, err))
            return -1;
        q->absmax = copy_of(am);
        return q->absmax ? 0 : oom(err, prefix);
    }
    const ft_st_tensor *na = find(ck, prefix, ".weight.nested_absmax"),
                       *nm = find(ck, prefix, ".weight.nested_quant_map");
    if (expect(na, prefix, ".weight.nested_absmax", FT_ST_F32,
               ceil_div(q->n_blocks, (size_t)q->nested_blocksize), err) ||
        expect(nm, prefix, ".weight.nested_quant_map", FT_ST_F32, 256, err) ||
        finite_scales(na, err) || finite_scales(nm, err))
        return -1;
    q->absmax_q = copy_of(am);
    q->nested_absmax = copy_of(na);
    q->nested_map = copy_of(nm);
    return q->absmax_q && q->nested_absmax && q->nested_map ? 0 : oom(err, prefix);
}

static int read_int8(const ft_checkpoint *ck, const char *prefix, ft_qtensor *q, int64_t rows,
                     int64_t cols, ft_err *err)
{
    const ft_st_tensor *w = find(ck, prefix, ".weight"), *scb = find(ck, prefix, ".SCB");
    const ft_st_tensor *fmt = find(ck, prefix, ".weight_format");
    if (!scb)
        scb = find(ck, prefix, ".weight.SCB");
    if (expect(w, prefix, ".weight", FT_ST_I8, (size_t)(rows * cols), err) ||
        expect(scb, prefix, ".SCB", FT_ST_F32, (size_t)rows, err) || finite_scales(scb, err))
        return -1;
    if (w->ndim != 2 || w->shape[0] != rows)
        return ft_fail(err, "%s: tensor '%s' is not [%lld, %lld]", w->file, w->name,
                       (long long)rows, (long long)cols);
    if (fmt && (fmt->nbytes != 1 || *(const uint8_t *)fmt->data != 0))
        return ft_fail(err, "%s: tensor '%s': only the row-major int8 format (0) is supported "
                            "(turing/ampere tile layouts are not)",
                       fmt->file, fmt->name);
    q->q = copy_of(w);
    q->scb = copy_of(scb);
    return q->q && q->scb ? 0 : oom(err, prefix);
}

int ft_qtensor_read(const ft_checkpoint *ck, const char *prefix, int64_t rows, int64_t cols,
                    ft_qtensor *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    out->type = ft_qtensor_probe(ck, prefix);
    out->rows = rows;
    out->cols = cols;
    int rc;
    switch (out->type) {
    case FT_QUANT_INT8:
        rc = read_int8(ck, prefix, out, rows, cols, err);
        break;
    case FT_QUANT_NF4:
    case FT_QUANT_FP4:
        rc = read_4bit(ck, prefix, out, rows, cols, err);
        break;
    default:
        return ft_fail(err, "quantized checkpoint: '%s.weight' is missing or stored dense, with "
                            "no bitsandbytes quant_state or SCB (a module left dense must be "
                            "listed in quantization_config.llm_int8_skip_modules)",
                       prefix);
    }
    if (rc)
        ft_qtensor_free(out);
    return rc;
}

int ft_quant_config_read(const char *path, ft_quant_config *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    json_t *root = ft_json_read_file(path, 0, err);
    if (!root)
        return -1;
    json_t *qc = json_object_get(root, "quantization_config");
    int rc = -1;
    if (!qc) {
        rc = 0;
        goto done;
    }
    const char *method = json_string_value(json_object_get(qc, "quant_method"));
    if (!method || strcmp(method, "bitsandbytes") != 0) {
        ft_fail(err, "%s: quantization_config.quant_method '%s' is not supported (only "
                     "bitsandbytes 4-bit and 8-bit checkpoints are)",
                path, method ? method : "(missing)");
        goto done;
    }
    out->present = true;
    out->opt.blocksize = 64;
    bool in4 = json_is_true(json_object_get(qc, "load_in_4bit"));
    bool in8 = json_is_true(json_object_get(qc, "load_in_8bit"));
    if (in4 == in8) {
        ft_fail(err, "%s: quantization_config needs exactly one of load_in_4bit and load_in_8bit "
                     "true",
                path);
        goto done;
    }
    if (in8) {
        out->opt.type = FT_QUANT_INT8;
    } else {
        const char *t = json_string_value(json_object_get(qc, "bnb_4bit_quant_type"));
        if (ft_quant_parse(t ? t : "fp4", &out->opt.type, err) || out->opt.type == FT_QUANT_INT8 ||
            out->opt.type == FT_QUANT_NONE) {
            ft_fail(err, "%s: quantization_config.bnb_4bit_quant_type '%s' (nf4 or fp4)", path,
                    t ? t : "");
            goto done;
        }
        out->opt.double_quant = json_is_true(json_object_get(qc, "bnb_4bit_use_double_quant"));
        json_t *bs = json_object_get(qc, "bnb_4bit_blocksize");
        if (json_is_integer(bs))
            out->opt.blocksize = (int)json_integer_value(bs);
    }
    const char *cd = json_string_value(json_object_get(qc, "bnb_4bit_compute_dtype"));
    snprintf(out->compute_dtype, sizeof out->compute_dtype, "%s", cd ? cd : "float32");
    json_t *skip = json_object_get(qc, "llm_int8_skip_modules");
    size_t i;
    json_t *v;
    json_array_foreach(skip, i, v)
    {
        const char *s = json_string_value(v);
        if (!s)
            continue;
        size_t len = strlen(out->skip);
        snprintf(out->skip + len, sizeof out->skip - len, "%s%s", len ? "," : "", s);
    }
    rc = 0;
done:
    json_decref(root);
    return rc;
}
