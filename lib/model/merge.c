/* LoRA merge: base + PEFT adapter -> plain Hugging Face checkpoint.
 *
 * The math: a LoRA linear computes y = x W^T + s (x A^T) B^T = x (W + s B A)^T, so the
 * merged weight is W' = W + s B @ A (A [r, in], B [out, r], s = alpha / r or
 * alpha / sqrt(r)), as peft's merge_and_unload does, in fp32. The product is one GEMM
 * through the ops interface: linear_backward's dx += alpha * dy @ w with dy = B [out, r]
 * and w = A [r, in] is exactly W += s * B @ A. With DoRA (a magnitude m [out] beside the
 * pair) PEFT's merge then rescales each row to its magnitude: W' = (m / ||W + s B A||_row)
 * (W + s B A).
 *
 * The output: every non-LoRA parameter of the model in the chosen dtype (the model's
 * parameter list has no lm_head.weight when embeddings are tied, which is what
 * transformers writes too), and a multimodal gemma3 base's other tensors (vision tower,
 * projector) as they were, sharded like save_pretrained when over the shard limit;
 * config.json with its dtype key updated; tokenizer / generation files copied. An adapter
 * for a grown vocabulary (tokens added, the embedding and head resized: lib/model/adapter.c)
 * gives config.json its vocab_size, and the tokenizer files in the adapter dir replace the
 * base's. A
 * quantized base (bitsandbytes 4/8-bit, e.g. from ft-quantize) is dequantized first and
 * the output is dense 16-bit (bf16, or f16 when that is the base's compute dtype) with
 * no quantization_config. All of it
 * goes into "<out>.tmp-<pid>-<n>" in the same parent dir and is renamed to <out> at the
 * end; on any error the temporary dir is removed. */
#include "model/merge.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"
#include "formats/lora.h"
#include "ops.h"
#include "formats/safetensors.h"

#define PEFT_PREFIX "base_model.model."

/* The base weight and B of the LoRA A parameter `a`, by name: A is
 * base_model.model.<module_prefix>layers.N.<proj>.lora_A.weight, its weight
 * <ckpt_prefix>model.layers.N.<proj>.weight (model.layers.N.<proj>.weight but in a
 * multimodal gemma3: hf_config.h); or base_model.model.lm_head.lora_A.weight, its weight
 * <ckpt_prefix>lm_head.weight (tied: the embedding; model.h's ft_model_module_weight). */
static int find_pair(ft_model *m, const ft_param *a, ft_param **w, ft_param **b, ft_err *err)
{
    const ft_model_config *c = ft_model_cfg(m);
    const char *suffix = ".lora_A.weight";
    size_t n = strlen(a->name), np = strlen(PEFT_PREFIX), ns = strlen(suffix);
    if (n <= np + ns || strncmp(a->name, PEFT_PREFIX, np) != 0 ||
        strcmp(a->name + n - ns, suffix) != 0)
        return ft_fail(err, "LoRA parameter '%s' does not follow PEFT's naming", a->name);
    /* path: the module's path in the transformers model, past base_model.model. */
    char path[sizeof a->name], name[sizeof a->name + 64];
    snprintf(path, sizeof path, "%.*s", (int)(n - np - ns), a->name + np);
    if (ft_model_module_weight(c, path, strlen(path), name, sizeof name))
        return ft_fail(err, "LoRA parameter '%s' does not follow PEFT's naming", a->name);
    *w = ft_model_find_param(m, name);
    /* tied: the head's weight is the embedding, which then gains both deltas (PEFT's
     * merge_and_unload adds each module's into the one tensor; transformers saves it tied) */
    if (!*w && c->tie_word_embeddings && strcmp(path, "lm_head") == 0) {
        ft_model_outer_weight(c, FT_LORA_EMBED, name, sizeof name);
        *w = ft_model_find_param(m, name);
    }
    snprintf(name, sizeof name, PEFT_PREFIX "%s.lora_B.weight", path);
    *b = ft_model_find_param(m, name);
    if (!*w || !*b)
        return ft_fail(err, "LoRA parameter '%s' has no %s", a->name,
                       !*w ? "base weight" : "lora_B partner");
    return 0;
}

/* DoRA: the rows of w (already W + s B A) times m / their norm, when the pair of the LoRA
 * A parameter `a` has a magnitude. */
static int dora_rescale(ft_model *m, const ft_param *a, ft_param *w, ft_err *err)
{
    char name[sizeof a->name + 32];
    snprintf(name, sizeof name, "%.*s.lora_magnitude_vector",
             (int)(strlen(a->name) - strlen(".lora_A.weight")), a->name);
    ft_param *mag = ft_model_find_param(m, name);
    if (!mag)
        return 0;
    int64_t out = w->shape[0], in = w->shape[1];
    if (mag->ndim != 1 || mag->shape[0] != out)
        return ft_fail(err, "'%s' does not fit the weight [%lld, %lld]", name, (long long)out,
                       (long long)in);
    float *g = malloc(2 * (size_t)out * sizeof *g);
    if (!g)
        return ft_fail(err, "out of memory");
    ft_dora_norm(ft_f32(g, (size_t)out), ft_f32(g + out, (size_t)out),
                 ft_f32(mag->data, mag->numel), ft_f32(w->data, w->numel), (int)out, (int)in);
    for (int64_t r = 0; r < out; r++)
        for (int64_t c = 0; c < in; c++)
            w->data[r * in + c] *= g[r];
    free(g);
    return 0;
}

/* DoRA on the embedding (PEFT's DoraEmbeddingVariant merge): the columns of e (already
 * E + s (B A)^T) times m / their norm, when the embedding's pair has a magnitude [C]. */
static int embedding_dora_rescale(ft_model *m, ft_param *e, ft_err *err)
{
    char name[256];
    ft_model_outer_key(ft_model_cfg(m), FT_LORA_EMBED, ".lora_magnitude_vector", name,
                       sizeof name);
    ft_param *mag = ft_model_find_param(m, name);
    if (!mag)
        return 0;
    int64_t V = e->shape[0], C = e->shape[1];
    if (mag->ndim != 1 || mag->shape[0] != C)
        return ft_fail(err, "'%s' does not fit the embedding [%lld, %lld]", mag->name,
                       (long long)V, (long long)C);
    double *nrm = calloc((size_t)C, sizeof *nrm);
    if (!nrm)
        return ft_fail(err, "out of memory");
    for (int64_t v = 0; v < V; v++)
        for (int64_t c = 0; c < C; c++)
            nrm[c] += (double)e->data[v * C + c] * e->data[v * C + c];
    for (int64_t c = 0; c < C; c++) /* the factor in fp32, as PEFT's m / ||.|| */
        nrm[c] = (float)(mag->data[c] / (float)sqrt(nrm[c]));
    for (int64_t v = 0; v < V; v++)
        for (int64_t c = 0; c < C; c++)
            e->data[v * C + c] *= (float)nrm[c];
    free(nrm);
    return 0;
}

/* LoRA on the embedding (PEFT's Embedding: its delta is (B A)^T): E[v, c] += s sum_j A[j, v]
 * B[c, j], summed in double. 1 when merged, 0 when the model has none. */
static int merge_embedding(ft_model *m, const ft_lora_config *lc, ft_err *err)
{
    const ft_model_config *c = ft_model_cfg(m);
    char na[256], nb[256], ne[256], module[160];
    ft_model_outer_key(c, FT_LORA_EMBED, ".lora_embedding_A", na, sizeof na);
    ft_model_outer_key(c, FT_LORA_EMBED, ".lora_embedding_B", nb, sizeof nb);
    ft_model_outer_weight(c, FT_LORA_EMBED, ne, sizeof ne);
    ft_param *a = ft_model_find_param(m, na), *b = ft_model_find_param(m, nb);
    ft_param *e = ft_model_find_param(m, ne);
    snprintf(module, sizeof module, "%sembed_tokens",
             lc->module_prefix[0] ? lc->module_prefix : "model.");
    float scaling = ft_lora_module_scaling(lc, module);
    if (!a || !b)
        return 0;
    int64_t r = a->shape[0], V = a->shape[1], C = b->shape[0];
    if (!e || b->shape[1] != r || e->shape[0] != V || e->shape[1] != C)
        return ft_fail(err, "LoRA on the embedding: shapes A [%lld, %lld], B [%lld, %lld] do not "
                            "fit the embedding",
                       (long long)r, (long long)V, (long long)C, (long long)b->shape[1]);
    for (int64_t v = 0; v < V; v++)
        for (int64_t c = 0; c < C; c++) {
            double acc = 0.0;
            for (int64_t j = 0; j < r; j++)
                acc += (double)a->data[j * V + v] * b->data[c * r + j];
            e->data[v * C + c] += (float)(scaling * acc);
        }
    return embedding_dora_rescale(m, e, err) ? -1 : 1;
}

/* LoRA on a MoE (lora.h's target_params: PEFT's ParamWrapper layout). The router's pair
 * (<...>layers.N.mlp.gate.lora_A/B) on the checkpoint's model.layers.N.<moe_name>.gate.
 * weight: R += s B A, as a linear layer's. The fused experts': expert e's checkpoint
 * weights (w1, w3 the rows [0, I), [I, 2I) of gate_up; w2 for down) gain s B_e A_e, with
 * A_e = A's rows [e R, (e+1) R) and B_e[o, j] = B[o, j E + e]. Summed in double; the
 * ranks and scalings: their parameters' under lc's patterns (ft_lora_module_scaling of
 * <module_prefix>layers.N.mlp.gate.weight, ...mlp.experts.gate_up_proj, ...down_proj). */
static int merge_moe(ft_model *m, const ft_lora_config *lc, ft_err *err)
{
    const ft_model_config *c = ft_model_cfg(m);
    int E = c->num_experts, C = c->hidden_size, I = c->intermediate_size;
    for (int l = 0; l < c->num_layers && E > 0; l++) {
        if (!ft_layer_sparse(c, l)) /* a dense layer (mlp_only_layers ...): no pairs */
            continue;
        if (lc->target_params & FT_LORA_PARAM_ROUTER) {
            char na[256], nb[256], nw[256];
            snprintf(na, sizeof na, PEFT_PREFIX "%slayers.%d.mlp.gate.lora_A.weight",
                     c->module_prefix, l);
            snprintf(nb, sizeof nb, PEFT_PREFIX "%slayers.%d.mlp.gate.lora_B.weight",
                     c->module_prefix, l);
            snprintf(nw, sizeof nw, "%smodel.layers.%d.%s.gate.weight", c->ckpt_prefix, l,
                     c->moe_name);
            ft_param *a = ft_model_find_param(m, na), *b = ft_model_find_param(m, nb);
            ft_param *w = ft_model_find_param(m, nw);
            char module[256];
            snprintf(module, sizeof module, "%slayers.%d.mlp.gate.weight", c->module_prefix, l);
            int r = ft_lora_module_rank(lc, module);
            if (!a || !b || !w || a->shape[0] != r || a->shape[1] != C || b->shape[0] != E ||
                b->shape[1] != r || w->shape[0] != E || w->shape[1] != C)
                return ft_fail(err, "the router's LoRA pair %s does not fit %s", na, nw);
            double s = ft_lora_module_scaling(lc, module);
            for (int o = 0; o < E; o++)
                for (int i = 0; i < C; i++) {
                    double acc = 0.0;
                    for (int j = 0; j < r; j++)
                        acc += (double)b->data[(size_t)o * r + j] * a->data[(size_t)j * C + i];
                    w->data[(size_t)o * C + i] += (float)(s * acc);
                }
        }
        for (int h = 0; h < 2; h++) {
            unsigned bit = h == 0 ? FT_LORA_PARAM_GATE_UP : FT_LORA_PARAM_DOWN;
            if (!(lc->target_params & bit))
                continue;
            const char *nest = h == 0 && (lc->target_params & FT_LORA_PARAM_DOWN)
                                   ? ".base_layer" : "";
            char na[256], nb[256];
            snprintf(na, sizeof na, PEFT_PREFIX "%slayers.%d.mlp.experts%s.lora_A.weight",
                     c->module_prefix, l, nest);
            snprintf(nb, sizeof nb, PEFT_PREFIX "%slayers.%d.mlp.experts%s.lora_B.weight",
                     c->module_prefix, l, nest);
            ft_param *a = ft_model_find_param(m, na), *b = ft_model_find_param(m, nb);
            char module[256];
            snprintf(module, sizeof module, "%slayers.%d.mlp.experts.%s", c->module_prefix, l,
                     h == 0 ? "gate_up_proj" : "down_proj");
            int R = ft_lora_module_rank(lc, module), in = h == 0 ? C : I, out = h == 0 ? 2 * I : C;
            if (!a || !b || a->shape[0] != (int64_t)E * R || a->shape[1] != in ||
                b->shape[0] != out || b->shape[1] != (int64_t)E * R)
                return ft_fail(err, "the experts' LoRA pair %s does not fit layer %d", na, l);
            double s = ft_lora_module_scaling(lc, module);
            for (int e = 0; e < E; e++)
                for (int part = 0; part < (h == 0 ? 2 : 1); part++) {
                    char nw[256];
                    snprintf(nw, sizeof nw, "%smodel.layers.%d.%s.experts.%d.%s.weight",
                             c->ckpt_prefix, l, c->moe_name, e,
                             c->expert_proj[h == 1 ? 2 : part]);
                    ft_param *w = ft_model_find_param(m, nw);
                    int rows = h == 0 ? I : C;
                    if (!w || w->shape[0] != rows || w->shape[1] != in)
                        return ft_fail(err, "the experts' LoRA pair %s: no weight %s", na, nw);
                    for (int o = 0; o < rows; o++)
                        for (int i = 0; i < in; i++) {
                            double acc = 0.0;
                            int bo = part * I + o; /* B's row */
                            for (int j = 0; j < R; j++)
                                acc += (double)b->data[(size_t)bo * E * R + (size_t)j * E + e] *
                                       a->data[((size_t)e * R + j) * in + i];
                            w->data[(size_t)o * in + i] += (float)(s * acc);
                        }
                }
        }
    }
    return 0;
}

int ft_merge_lora_weights(ft_model *m, const ft_lora_config *lc, ft_err *err)
{
    int pairs = merge_embedding(m, lc, err);
    if (pairs < 0)
        return -1;
    for (size_t i = 0; i < ft_model_param_count(m); i++) {
        ft_param *a = ft_model_param(m, i);
        if (!a->is_lora || !strstr(a->name, ".lora_A."))
            continue;
        if (strstr(a->name, ".mlp.experts.") || strstr(a->name, ".mlp.gate.lora_A")) {
            /* merge_moe's */
            pairs++;
            continue;
        }
        ft_param *w = NULL, *b = NULL;
        if (find_pair(m, a, &w, &b, err))
            return -1;
        int64_t r = a->shape[0], in = a->shape[1], out = b->shape[0];
        /* the module's path: the name between base_model.model. and .lora_A.weight */
        char module[sizeof a->name];
        size_t np = strlen(PEFT_PREFIX), ns = strlen(".lora_A.weight");
        snprintf(module, sizeof module, "%.*s", (int)(strlen(a->name) - np - ns),
                 a->name + np);
        float scaling = ft_lora_module_scaling(lc, module);
        if (a->ndim != 2 || b->ndim != 2 || w->ndim != 2 || b->shape[1] != r ||
            w->shape[0] != out || w->shape[1] != in)
            return ft_fail(err, "LoRA pair of '%s': shapes A [%lld, %lld], B [%lld, %lld] do "
                                "not fit the weight [%lld, %lld]",
                           w->name, (long long)a->shape[0], (long long)a->shape[1],
                           (long long)b->shape[0], (long long)b->shape[1],
                           (long long)w->shape[0], (long long)w->shape[1]);
        if (r > INT_MAX || in > INT_MAX || out > INT_MAX)
            return ft_fail(err, "'%s': dimensions too large", w->name);
        /* dx[N=out, in] += s * dy[out, r] @ w[r, in]  ==  W += s * B @ A */
        ft_linear_backward(ft_f32(w->data, w->numel), ft_none(), ft_none(),
                           ft_f32(b->data, b->numel), ft_none(), ft_f32(a->data, a->numel),
                           (int)out, (int)in, (int)r, scaling);
        if (dora_rescale(m, a, w, err))
            return -1;
        pairs++;
    }
    if (pairs == 0)
        return ft_fail(err, "the model has no LoRA weights to merge");
    return 0;
}

/* ---- dtype ------------------------------------------------------------------------- */

typedef struct dtype_choice {
    ft_st_dtype st;
    const char *torch; /* config.json's name */
} dtype_choice;

static int parse_dtype(const char *s, dtype_choice *d)
{
    static const struct {
        const char *a, *b;
        ft_st_dtype st;
    } names[] = {{"f32", "float32", FT_ST_F32},
                 {"bf16", "bfloat16", FT_ST_BF16},
                 {"f16", "float16", FT_ST_F16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].a) == 0 || strcmp(s, names[i].b) == 0) {
            d->st = names[i].st;
            d->torch = names[i].b;
            return 0;
        }
    return -1;
}

/* Converts n fp32 values to bf16 / f16 in place: the 2-byte result j lands on bytes
 * [2j, 2j+2), which only overlap input values already read (input j sits at [4j, 4j+4)),
 * so one forward pass is safe. Going through memcpy keeps it free of aliasing UB. */
static void narrow_in_place(float *data, size_t n, ft_st_dtype dt)
{
    unsigned char *bytes = (unsigned char *)data;
    for (size_t j = 0; j < n; j++) {
        float f;
        memcpy(&f, bytes + 4 * j, sizeof f);
        uint16_t h = dt == FT_ST_BF16 ? ft_f32_to_bf16(f) : ft_f32_to_f16(f);
        memcpy(bytes + 2 * j, &h, sizeof h);
    }
}

/* ---- files ------------------------------------------------------------------------- */

/* The files of a model dir besides weights and config that a merged checkpoint keeps. */
static const char *const passthrough_files[] = {
    "tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
    "tokenizer.model",   "generation_config.json", "added_tokens.json",
    "vocab.json",        "merges.txt",             "chat_template.jinja",
};

int ft_copy_passthrough_files(const char *model_dir, const char *dst_dir, ft_err *err)
{
    for (size_t i = 0; i < sizeof passthrough_files / sizeof passthrough_files[0]; i++) {
        char src[4400], dst[4400];
        snprintf(src, sizeof src, "%s/%s", model_dir, passthrough_files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dst_dir, passthrough_files[i]);
        struct stat st;
        if (stat(src, &st) != 0)
            continue;
        if (ft_copy_file(src, dst, err))
            return -1;
    }
    return 0;
}

/* The merged weights, and the base checkpoint's tensors outside the text model (a
 * multimodal gemma3's vision tower and projector: ft_model_carried_tensor) with their
 * names, dtypes and bytes unchanged. */
static int write_weights(ft_model *m, const char *model_dir, const char *dir, ft_st_dtype dt,
                         size_t max_shard, ft_err *err)
{
    ft_st_writer *w = ft_st_writer_new();
    if (!w)
        return ft_fail(err, "out of memory");
    ft_checkpoint *ck = NULL;
    int rc = ft_st_writer_metadata(w, "format", "pt", err);
    for (size_t i = 0; i < ft_model_param_count(m) && rc == 0; i++) {
        ft_param *p = ft_model_param(m, i);
        if (p->is_lora)
            continue;
        if (dt != FT_ST_F32)
            narrow_in_place(p->data, p->numel, dt);
        rc = ft_st_writer_add(w, p->name, dt, p->ndim, p->shape, p->data, err);
    }
    if (rc == 0 && ft_model_cfg(m)->multimodal)
        rc = ft_ckpt_open(&ck, model_dir, "model", err);
    for (size_t i = 0; ck && i < ft_ckpt_count(ck) && rc == 0; i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        if (ft_model_carried_tensor(ft_model_cfg(m), t->name))
            rc = ft_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, err);
    }
    if (rc == 0)
        rc = ft_st_writer_save_sharded(w, dir, "model", max_shard, err);
    ft_st_writer_free(w);
    ft_ckpt_close(ck); /* (after the save: the writer reads the carried bytes there) */
    return rc;
}

/* config.json's vocabulary, where transformers' resize_token_embeddings puts it:
 * vocab_size, or a multimodal gemma3's text_config.vocab_size. */
static int set_vocab_size(json_t *cfg_json, const ft_model_config *c)
{
    json_t *obj = cfg_json;
    if (c->multimodal) {
        obj = json_object_get(cfg_json, "text_config");
        if (!json_is_object(obj) && (json_object_set_new(cfg_json, "text_config", json_object()) ||
                                     !(obj = json_object_get(cfg_json, "text_config"))))
            return -1;
    }
    return json_object_set_new(obj, "vocab_size", json_integer(c->vocab_size));
}

int ft_merge(const ft_merge_options *o, ft_err *err)
{
    if (!o->model_dir || !o->adapter_dir || !o->out_dir || !o->out_dir[0])
        return ft_fail(err, "merge needs a model dir, an adapter dir and an output dir");
    char out[4096];
    const char *inputs[] = {o->model_dir, o->adapter_dir};
    if (ft_out_dir_check(o->out_dir, o->force, inputs, 2, out, sizeof out, err))
        return -1;
    struct stat st;
    if (stat(o->adapter_dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return ft_fail(err, "%s: adapter dir not found", o->adapter_dir);

    json_t *cfg_json = NULL;
    if (ft_read_model_config_json(o->model_dir, &cfg_json, err))
        return -1;
    dtype_choice dt = {FT_ST_F32, "float32"};
    int rc = 0;
    if (o->dtype) {
        if (parse_dtype(o->dtype, &dt))
            rc = ft_fail(err, "unknown dtype '%s' (expected bf16, f16 or f32)", o->dtype);
    } else if (json_object_get(cfg_json, "quantization_config")) {
        /* a quantized base: 16-bit out, the compute dtype when it is one */
        json_t *v = json_object_get(json_object_get(cfg_json, "quantization_config"),
                                    "bnb_4bit_compute_dtype");
        if (!json_is_string(v) || strcmp(json_string_value(v), "float16") != 0)
            v = json_string("bfloat16");
        else
            json_incref(v);
        parse_dtype(json_string_value(v), &dt);
        json_decref(v);
    } else {
        json_t *v = json_object_get(cfg_json, "torch_dtype");
        if (!json_is_string(v))
            v = json_object_get(cfg_json, "dtype");
        if (json_is_string(v) && parse_dtype(json_string_value(v), &dt))
            rc = ft_fail(err, "%s/config.json: torch_dtype '%s' is not bfloat16, float16 or "
                              "float32; choose the output dtype",
                         o->model_dir, json_string_value(v));
    }

    ft_lora_config lc;
    if (rc == 0 && ft_lora_config_load(&lc, o->adapter_dir, err))
        rc = -1;
    ft_model *m = NULL;
    if (rc == 0) {
        ft_model_options mo = {.mode = FT_TRAIN_LORA, .lora = lc};
        mo.lora.dropout = 0; /* dropout plays no part in the merge */
        if (ft_model_load(&m, o->model_dir, &mo, err))
            rc = -1;
    }
    if (rc == 0 && ft_model_load_adapter(m, o->adapter_dir, err))
        rc = -1;
    /* a quantized multimodal base: its vision weights would be carried quantized into a
     * config without quantization_config */
    if (rc == 0 && ft_model_cfg(m)->multimodal && ft_model_quant(m).type != FT_QUANT_NONE)
        rc = ft_fail(err, "%s: merging into a quantized multimodal gemma3 checkpoint is not "
                     "supported (merge into its dense checkpoint)", o->model_dir);
    if (rc == 0 && ft_model_dequantize_base(m, err))
        rc = -1;
    json_object_del(cfg_json, "quantization_config"); /* the output is dense */
    /* an adapter for a grown vocabulary (added tokens): the merged model has its
     * vocabulary, as resize_token_embeddings sets config.vocab_size (a multimodal
     * gemma3's text_config.vocab_size: its top level has none) */
    bool resized = rc == 0 && ft_model_checkpoint_vocab(m) != ft_model_cfg(m)->vocab_size;
    if (resized && set_vocab_size(cfg_json, ft_model_cfg(m)))
        rc = ft_fail(err, "%s/config.json: out of memory", o->model_dir);
    /* modules_to_save without ensure_weight_tying untied a tied model: merge_and_unload
     * sets tie_word_embeddings false and save_pretrained writes both tensors */
    if (rc == 0 && ft_model_head_untied(m))
        json_object_set_new(cfg_json, "tie_word_embeddings", json_false());
    if (rc == 0 && (merge_moe(m, ft_model_lora_config(m), err) ||
                    ft_merge_lora_weights(m, ft_model_lora_config(m), err)))
        rc = ft_fail_prefix(err, "%s", o->adapter_dir);
    if (rc) {
        ft_model_free(m);
        json_decref(cfg_json);
        return -1;
    }

    char tmp[4200];
    if (ft_make_temp_dir(out, tmp, sizeof tmp, err)) {
        ft_model_free(m);
        json_decref(cfg_json);
        return -1;
    }
    size_t max_shard = o->max_shard_bytes ? o->max_shard_bytes : FT_MERGE_DEFAULT_SHARD_BYTES;
    rc = write_weights(m, o->model_dir, tmp, dt.st, max_shard, err);
    ft_model_free(m);
    if (rc == 0)
        rc = ft_write_model_config(cfg_json, tmp, dt.torch, err);
    json_decref(cfg_json);
    if (rc == 0)
        rc = ft_copy_passthrough_files(o->model_dir, tmp, err);
    /* ... and the tokenizer with the added tokens, saved beside the adapter
     * (tokenizer.save_pretrained there): its files replace the base model's */
    if (rc == 0 && resized)
        rc = ft_copy_passthrough_files(o->adapter_dir, tmp, err);
    if (rc == 0)
        rc = ft_publish_dir(tmp, out, o->force, "ft-merge", err);
    if (rc)
        ft_remove_tree(tmp);
    return rc;
}
