/* ft-conform: runs the library on a JSON spec and writes what the conformance suite
 * compares against Hugging Face transformers + PEFT into a safetensors file.
 *
 *   ft-conform SPEC.json OUT.safetensors
 *
 * SPEC: {"model_dir", "adapter_dir"?, "mode": "eval"|"full"|"lora",
 *        "input_ids": [[...]], "labels"?: [[...]], "position_ids"?: [[...]],
 *        "grad_ckpt"?: bool, "grad_accum"?: k, "seed"?: n,
 *        "quant"?: {"type": "nf4"|"fp4"|"int8", "blocksize"?: 64, "double_quant"?: bool,
 *                   "skip"?: "lm_head,..."},
 *        "train"?: {"steps", "lr", "betas", "eps", "weight_decay", "warmup_steps",
 *                   "scheduler", "max_grad_norm"}}
 * OUT: "logits" [B,T,V] and "loss" [] of the first forward; without "train" in full or
 * LoRA mode "grad.<name>" for every trainable parameter; with "train" "losses" [steps]
 * and "weight.<name>" after the last step. Names are HF state-dict names, or PEFT
 * adapter keys for LoRA weights. With a quantized base ("quant": quantized on load, or a
 * checkpoint quantized already) also "dequant.<name>": every quantized weight as the
 * model dequantizes it. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "optim.h"
#include "safetensors.h"
#include "schedule.h"
#include "train_step.h"

typedef struct spec {
    json_t *root;
    const char *model_dir, *adapter_dir;
    ft_train_mode mode;
    int B, T, accum;
    int32_t *ids, *labels, *pos;
    bool grad_ckpt;
    uint64_t seed;
    json_t *train;
    ft_quant_options quant;
    const char *quant_skip;
} spec;

static int read_matrix(json_t *root, const char *key, int *B, int *T, int32_t **out,
                       ft_err *err)
{
    json_t *rows = json_object_get(root, key);
    *out = NULL;
    if (!rows)
        return 0;
    if (!json_is_array(rows) || json_array_size(rows) == 0)
        return ft_fail(err, "spec: '%s' must be a non-empty list of rows", key);
    int b = (int)json_array_size(rows);
    int t = (int)json_array_size(json_array_get(rows, 0));
    if (*B && (b != *B || t != *T))
        return ft_fail(err, "spec: '%s' must have the shape of input_ids", key);
    if (t == 0)
        return ft_fail(err, "spec: '%s' has empty rows", key);
    *B = b;
    *T = t;
    *out = malloc((size_t)b * t * sizeof(int32_t));
    for (int r = 0; r < b; r++) {
        json_t *row = json_array_get(rows, r);
        if (!json_is_array(row) || (int)json_array_size(row) != t)
            return ft_fail(err, "spec: '%s' row %d is not a list of %d ints", key, r, t);
        for (int c = 0; c < t; c++) {
            json_t *v = json_array_get(row, c);
            if (!json_is_integer(v))
                return ft_fail(err, "spec: '%s'[%d][%d] is not an integer", key, r, c);
            (*out)[(size_t)r * t + c] = (int32_t)json_integer_value(v);
        }
    }
    return 0;
}

static int parse_spec(spec *s, const char *path, ft_err *err)
{
    json_error_t jerr;
    memset(s, 0, sizeof *s);
    s->root = json_load_file(path, 0, &jerr);
    if (!s->root)
        return ft_fail(err, "%s: line %d: %s", path, jerr.line, jerr.text);
    json_t *v = json_object_get(s->root, "model_dir");
    if (!json_is_string(v))
        return ft_fail(err, "%s: 'model_dir' is required", path);
    s->model_dir = json_string_value(v);
    v = json_object_get(s->root, "adapter_dir");
    s->adapter_dir = json_is_string(v) ? json_string_value(v) : NULL;
    s->mode = s->adapter_dir ? FT_TRAIN_LORA : FT_TRAIN_NONE;
    v = json_object_get(s->root, "mode");
    if (json_is_string(v)) {
        const char *m = json_string_value(v);
        if (strcmp(m, "full") == 0)
            s->mode = FT_TRAIN_FULL;
        else if (strcmp(m, "lora") == 0)
            s->mode = FT_TRAIN_LORA;
        else if (strcmp(m, "eval") == 0)
            s->mode = FT_TRAIN_NONE;
        else
            return ft_fail(err, "%s: unknown mode '%s'", path, m);
    }
    if (s->mode == FT_TRAIN_LORA && !s->adapter_dir)
        return ft_fail(err, "%s: mode lora needs 'adapter_dir'", path);
    if (read_matrix(s->root, "input_ids", &s->B, &s->T, &s->ids, err) ||
        read_matrix(s->root, "labels", &s->B, &s->T, &s->labels, err) ||
        read_matrix(s->root, "position_ids", &s->B, &s->T, &s->pos, err))
        return ft_fail_prefix(err, "%s", path);
    if (!s->ids)
        return ft_fail(err, "%s: 'input_ids' is required", path);
    s->grad_ckpt = json_is_true(json_object_get(s->root, "grad_ckpt"));
    v = json_object_get(s->root, "grad_accum");
    s->accum = json_is_integer(v) ? (int)json_integer_value(v) : 1;
    if (s->accum < 1 || s->B % s->accum)
        return ft_fail(err, "%s: grad_accum %d does not divide %d rows", path, s->accum, s->B);
    v = json_object_get(s->root, "seed");
    s->seed = json_is_integer(v) ? (uint64_t)json_integer_value(v) : 1234;
    s->train = json_object_get(s->root, "train");
    json_t *q = json_object_get(s->root, "quant");
    if (q) {
        json_t *bs = json_object_get(q, "blocksize"), *dq = json_object_get(q, "double_quant");
        if (ft_quant_parse(json_string_value(json_object_get(q, "type")), &s->quant.type, err))
            return ft_fail_prefix(err, "%s: quant.type", path);
        s->quant.blocksize = json_is_integer(bs) ? (int)json_integer_value(bs) : 64;
        s->quant.double_quant = dq ? json_is_true(dq) : true;
        s->quant_skip = json_string_value(json_object_get(q, "skip"));
    }
    return 0;
}

static double num(json_t *obj, const char *key, double dflt)
{
    json_t *v = json_object_get(obj, key);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* Copies n floats into a buffer owned by the keep list, so the writer can point at it. */
typedef struct keep {
    void **bufs;
    size_t n;
} keep;

static float *kept_copy(keep *k, const float *src, size_t n)
{
    float *dst = malloc((n ? n : 1) * sizeof(float));
    memcpy(dst, src, n * sizeof(float));
    k->bufs = realloc(k->bufs, (k->n + 1) * sizeof *k->bufs);
    k->bufs[k->n++] = dst;
    return dst;
}

static int add_params(ft_st_writer *w, ft_model *m, keep *k, const char *prefix, bool grads,
                      ft_err *err)
{
    for (size_t i = 0; i < ft_model_param_count(m); i++) {
        ft_param *p = ft_model_param(m, i);
        if (!p->grad)
            continue;
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        float *data = kept_copy(k, grads ? p->grad : p->data, p->numel);
        if (ft_st_writer_add(w, name, FT_ST_F32, p->ndim, p->shape, data, err))
            return -1;
    }
    return 0;
}

static int run(const spec *s, const char *out_path, ft_err *err)
{
    ft_model_options opt = {.mode = s->mode, .grad_ckpt = s->grad_ckpt, .seed = s->seed,
                            .quant = s->quant, .quant_skip = s->quant_skip};
    if (s->mode == FT_TRAIN_LORA && ft_lora_config_load(&opt.lora, s->adapter_dir, err))
        return -1;
    ft_model *m;
    if (ft_model_load(&m, s->model_dir, &opt, err))
        return -1;
    int rc = -1;
    ft_st_writer *w = ft_st_writer_new();
    keep k = {0};
    ft_optimizer o = {0};
    const ft_model_config *c = ft_model_cfg(m);
    ft_batch whole = {s->B, s->T, s->ids, s->labels, s->pos};
    int mb = s->B / s->accum;
    ft_batch micro[64];
    if (s->accum > 64) {
        ft_fail(err, "grad_accum %d > 64", s->accum);
        goto done;
    }
    for (int i = 0; i < s->accum; i++) {
        size_t off = (size_t)i * mb * s->T;
        micro[i] = (ft_batch){mb, s->T, s->ids + off, s->labels ? s->labels + off : NULL,
                              s->pos ? s->pos + off : NULL};
    }
    if (s->mode == FT_TRAIN_LORA && ft_model_load_adapter(m, s->adapter_dir, err))
        goto done;

    for (int unit = 1; unit <= c->num_layers; unit++) {
        ft_model_materialize(m, unit);
        for (size_t i = 0; i < ft_model_param_count(m); i++) {
            ft_param *p = ft_model_param(m, i);
            if (p->unit != unit || !p->quantized)
                continue;
            char name[256];
            snprintf(name, sizeof name, "dequant.%s", p->name);
            if (ft_st_writer_add(w, name, FT_ST_F32, p->ndim, p->shape,
                                 kept_copy(&k, p->data, p->numel), err))
                goto done;
        }
    }

    double loss_sum;
    long n_tok;
    if (ft_model_forward(m, &whole, &loss_sum, &n_tok, err))
        goto done;
    int64_t lshape[3] = {s->B, s->T, c->vocab_size};
    float loss = (float)(loss_sum / (double)n_tok);
    if (ft_st_writer_add(w, "logits", FT_ST_F32, 3, lshape,
                         kept_copy(&k, ft_model_logits(m), (size_t)s->B * s->T * c->vocab_size),
                         err) ||
        ft_st_writer_add(w, "loss", FT_ST_F32, 0, NULL, kept_copy(&k, &loss, 1), err))
        goto done;

    if (s->train) {
        int steps = (int)num(s->train, "steps", 5);
        json_t *betas = json_object_get(s->train, "betas");
        ft_adamw_hparams hp = {
            .lr = (float)num(s->train, "lr", 1e-3),
            .beta1 = (float)(json_is_array(betas) ? json_number_value(json_array_get(betas, 0)) : 0.9),
            .beta2 = (float)(json_is_array(betas) ? json_number_value(json_array_get(betas, 1)) : 0.999),
            .eps = (float)num(s->train, "eps", 1e-8),
            .weight_decay = (float)num(s->train, "weight_decay", 0.0)};
        ft_lr_schedule sched = {.base_lr = hp.lr,
                                .warmup_steps = (int)num(s->train, "warmup_steps", 0),
                                .total_steps = steps};
        json_t *kind = json_object_get(s->train, "scheduler");
        if (ft_lr_kind_parse(json_is_string(kind) ? json_string_value(kind) : "constant",
                             &sched.kind, err))
            goto done;
        size_t n;
        ft_model_trainable(m, &n);
        if (ft_optimizer_init(&o, ft_model_mem(m), n, hp, err))
            goto done;
        float *losses = calloc((size_t)steps, sizeof(float));
        for (int i = 0; i < steps; i++) {
            ft_step_stats st;
            if (ft_train_step(m, &o, &sched, micro, s->accum, num(s->train, "max_grad_norm", 0),
                              &st, err)) {
                free(losses);
                goto done;
            }
            losses[i] = (float)st.loss;
        }
        int64_t sshape[1] = {steps};
        float *kl = kept_copy(&k, losses, (size_t)steps);
        free(losses);
        if (ft_st_writer_add(w, "losses", FT_ST_F32, 1, sshape, kl, err) ||
            add_params(w, m, &k, "weight.", false, err))
            goto done;
    } else if (s->mode != FT_TRAIN_NONE) {
        long total = 0;
        for (int i = 0; i < s->accum; i++)
            total += ft_batch_counted_tokens(&micro[i]);
        ft_model_zero_grad(m);
        for (int i = 0; i < s->accum; i++)
            if (ft_model_forward(m, &micro[i], NULL, NULL, err) ||
                ft_model_backward(m, (float)(1.0 / (double)total), err))
                goto done;
        if (add_params(w, m, &k, "grad.", true, err))
            goto done;
    }
    rc = ft_st_writer_save(w, out_path, err);
done:
    ft_optimizer_free(&o);
    ft_st_writer_free(w);
    for (size_t i = 0; i < k.n; i++)
        free(k.bufs[i]);
    free(k.bufs);
    ft_model_free(m);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: ft-conform SPEC.json OUT.safetensors\n");
        return 2;
    }
    ft_err err = {{0}};
    spec s;
    int rc = parse_spec(&s, argv[1], &err);
    if (rc == 0)
        rc = run(&s, argv[2], &err);
    if (rc)
        fprintf(stderr, "ft-conform: error: %s\n", err.msg);
    free(s.ids);
    free(s.labels);
    free(s.pos);
    json_decref(s.root);
    return rc ? 1 : 0;
}
