/* ft-conform: runs the library on a JSON spec and writes what the conformance suite
 * compares against Hugging Face transformers + PEFT into a safetensors file.
 *
 *   ft-conform SPEC.json OUT.safetensors
 *
 * SPEC: {"model_dir", "adapter_dir"?, "mode": "eval"|"full"|"lora",
 *        "input_ids": [[...]], "labels"?: [[...]], "position_ids"?: [[...]],
 *        "attention_mask"?: [[...]] (right padding: ft_batch's),
 *        "grad_ckpt"?: bool, "grad_accum"?: k, "seed"?: n,
 *        "device"?: "cpu"|"cuda", "dtype"?: "fp32"|"bf16" (the GPU model's compute dtype),
 *        "quant"?: {"type": "nf4"|"fp4"|"int8", "blocksize"?: 64, "double_quant"?: bool,
 *                   "skip"?: "lm_head,..."},
 *        "train"?: {"steps", "lr", "betas", "eps", "weight_decay", "warmup_steps",
 *                   "scheduler", "max_grad_norm"},
 *        "pref"?: {"beta", "loss_type": "sigmoid"|"ipo"|"robust"|"orpo", "label_smoothing",
 *                  "ref"?: "adapter"|"base"}},
 *        "save_adapter"?: dir (LoRA mode: the adapter saved there after training, as PEFT
 *                         lays it out)}
 * OUT: "logits" [B,T,V] and "loss" [] of the first forward; without "train" in full or
 * LoRA mode "grad.<name>" for every trainable parameter; with "train" "losses" [steps]
 * and "weight.<name>" after the last step. Names are HF state-dict names, or PEFT
 * adapter keys for LoRA weights. With a quantized base ("quant": quantized on load, or a
 * checkpoint quantized already) also "dequant.<name>": every quantized weight as the
 * model dequantizes it. With "pref" the rows are P preference pairs (the P chosen
 * sequences, then the P rejected ones) and the loss is DPO's (train/pref.h; the reference
 * in LoRA mode is the adapter as loaded, or with "ref": "base" the base with the adapter
 * off (an adapter with modules_to_save: those modules as loaded, as a fresh adapter's
 * copies of the originals); in full mode a frozen copy of the base): "pref.loss"
 * [] and "pref.metrics" [9] (rewards/chosen, rewards/rejected, rewards/accuracies,
 * rewards/margins, logps/chosen, logps/rejected means; ORPO's nll_loss, log_odds_ratio,
 * log_odds_chosen) of the first step, the gradients
 * or "losses" of DPO; grad_accum splits the pairs. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu_env.h"
#include "model/model.h"
#include "formats/quant_io.h"
#include "train/optim.h"
#include "formats/safetensors.h"
#include "train/schedule.h"
#include "train/train_step.h"
#include "train/pref.h"

typedef struct spec {
    json_t *root;
    const char *model_dir, *adapter_dir, *save_adapter;
    ft_train_mode mode;
    int B, T, accum;
    int32_t *ids, *labels, *pos, *mask;
    bool grad_ckpt;
    uint64_t seed;
    json_t *train;
    json_t *pref;
    ft_quant_options quant;
    const char *quant_skip;
    ft_device device;
    ft_dtype dtype;
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
    s->save_adapter = json_string_value(json_object_get(s->root, "save_adapter"));
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
        read_matrix(s->root, "position_ids", &s->B, &s->T, &s->pos, err) ||
        read_matrix(s->root, "attention_mask", &s->B, &s->T, &s->mask, err))
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
    s->pref = json_object_get(s->root, "pref");
    if (s->pref && (s->B % (2 * s->accum) || !s->labels))
        return ft_fail(err, "%s: pref needs labels and 2 x grad_accum x pairs rows", path);
    const char *dev = json_string_value(json_object_get(s->root, "device"));
    const char *dt = json_string_value(json_object_get(s->root, "dtype"));
    if (dev && strcmp(dev, "cpu") && strcmp(dev, "cuda"))
        return ft_fail(err, "%s: device '%s' is not cpu or cuda", path, dev);
    if (dt && strcmp(dt, "fp32") && strcmp(dt, "bf16"))
        return ft_fail(err, "%s: dtype '%s' is not fp32 or bf16", path, dt);
    s->device = dev && !strcmp(dev, "cuda") ? FT_DEV_CUDA : FT_DEV_CPU;
    s->dtype = dt && !strcmp(dt, "bf16") ? FT_BF16 : FT_F32;
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

/* Copies n floats (src NULL: zeros) into a buffer owned by the keep list, so the writer
 * can point at it. */
typedef struct keep {
    void **bufs;
    size_t n;
} keep;

static float *kept_copy(keep *k, const float *src, size_t n)
{
    float *dst = calloc(n ? n : 1, sizeof(float));
    if (src)
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
        /* the values as fp32 on the host (a GPU model's live on the device) */
        float *data = kept_copy(k, NULL, p->numel);
        if ((grads ? ft_model_grad_get(m, p, data, err) : ft_model_param_get(m, p, data, err)) ||
            ft_st_writer_add(w, name, FT_ST_F32, p->ndim, p->shape, data, err))
            return -1;
    }
    return 0;
}

static int run(const spec *s, const char *out_path, ft_err *err)
{
    ft_model_options opt = {.mode = s->mode, .grad_ckpt = s->grad_ckpt, .seed = s->seed,
                            .quant = s->quant, .quant_skip = s->quant_skip,
                            .device = s->device, .dtype = s->dtype};
    if (s->mode == FT_TRAIN_LORA && ft_lora_config_load(&opt.lora, s->adapter_dir, err))
        return -1;
    ft_model *m;
    if (ft_model_load(&m, s->model_dir, &opt, err))
        return -1;
    int rc = -1;
    ft_st_writer *w = ft_st_writer_new();
    keep k = {0};
    ft_optimizer o = {0};
    int32_t *pids = NULL, *plab = NULL; /* pref: the rows regrouped by micro-batch */
    ft_model *ref = NULL;
    ft_pref_objective po_obj = {0};
    ft_objective obj = {0};
    const ft_model_config *c = ft_model_cfg(m);
    ft_batch whole = {s->B, s->T, s->ids, s->labels, s->pos, s->mask};
    int mb = s->B / s->accum;
    ft_batch micro[64];
    if (s->accum > 64) {
        ft_fail(err, "grad_accum %d > 64", s->accum);
        goto done;
    }
    for (int i = 0; i < s->accum; i++) {
        size_t off = (size_t)i * mb * s->T;
        micro[i] = (ft_batch){mb, s->T, s->ids + off, s->labels ? s->labels + off : NULL,
                              s->pos ? s->pos + off : NULL, s->mask ? s->mask + off : NULL};
    }
    /* pref: micro-batch i holds pairs [i P/k, (i+1) P/k): their chosen rows, then their
     * rejected rows */
    if (s->pref) {
        int P = s->B / 2, pm = P / s->accum;
        size_t n = (size_t)s->B * s->T;
        pids = malloc(n * sizeof *pids);
        plab = malloc(n * sizeof *plab);
        for (int i = 0; i < s->accum; i++)
            for (int r = 0; r < 2 * pm; r++) {
                int src = r < pm ? i * pm + r : P + i * pm + (r - pm);
                size_t dst = ((size_t)i * 2 * pm + r) * s->T;
                memcpy(pids + dst, s->ids + (size_t)src * s->T, s->T * sizeof *pids);
                memcpy(plab + dst, s->labels + (size_t)src * s->T, s->T * sizeof *plab);
            }
        for (int i = 0; i < s->accum; i++) {
            size_t off = (size_t)i * 2 * pm * s->T;
            micro[i] = (ft_batch){2 * pm, s->T, pids + off, plab + off, NULL, NULL};
        }
        const char *lt = json_string_value(json_object_get(s->pref, "loss_type"));
        ft_pref_options po = {.beta = num(s->pref, "beta", 0.1),
                              .label_smoothing = num(s->pref, "label_smoothing", 0.0)};
        po.loss = !lt || !strcmp(lt, "sigmoid") ? FT_PREF_SIGMOID
                  : !strcmp(lt, "ipo")          ? FT_PREF_IPO
                  : !strcmp(lt, "orpo")         ? FT_PREF_ORPO
                                                : FT_PREF_ROBUST;
        if (ft_pref_check(&po, err))
            goto done;
        if (s->mode == FT_TRAIN_FULL && po.loss != FT_PREF_ORPO) {
            ft_model_options ro = {.mode = FT_TRAIN_NONE, .device = s->device,
                                   .dtype = s->dtype};
            if (ft_model_load(&ref, s->model_dir, &ro, err))
                goto done;
        }
        ft_pref_objective_init(&po_obj, &po, ref);
        obj = ft_pref_objective_of(&po_obj);
    }
    if (s->mode == FT_TRAIN_LORA && ft_model_load_adapter(m, s->adapter_dir, err))
        goto done;
    if (s->pref && s->mode == FT_TRAIN_LORA && po_obj.o.loss != FT_PREF_ORPO) {
        const char *r = json_string_value(json_object_get(s->pref, "ref"));
        bool base = r && !strcmp(r, "base");
        /* the base of an adapter with modules_to_save: its pairs off and those modules as
         * loaded, the original modules of a fresh adapter (train/pref.h ref_lora_off) */
        po_obj.ref_lora_off = base && opt.lora.modules_to_save;
        if ((!base || po_obj.ref_lora_off) && ft_pref_objective_keep_adapter(&po_obj, m, err))
            goto done;
    }

    /* every quantized weight as the model dequantizes it (on a GPU model: there, in its
     * compute dtype), one layer after the other */
    for (int unit = 1; unit <= c->num_layers; unit++) {
        if (ft_model_materialize(m, unit, err))
            goto done;
        for (size_t i = 0; i < ft_model_param_count(m); i++) {
            ft_param *p = ft_model_param(m, i);
            if (p->unit != unit || !p->quantized)
                continue;
            char name[256];
            snprintf(name, sizeof name, "dequant.%s", p->name);
            float *data = kept_copy(&k, NULL, p->numel);
            if (ft_model_param_get(m, p, data, err) ||
                ft_st_writer_add(w, name, FT_ST_F32, p->ndim, p->shape, data, err))
                goto done;
        }
    }

    double loss_sum;
    long n_tok;
    if (ft_model_forward(m, &whole, &loss_sum, &n_tok, err))
        goto done;
    int64_t lshape[3] = {s->B, s->T, c->vocab_size};
    /* transformers' loss: the mean token loss plus a MoE router's load-balancing term */
    float loss = (float)(loss_sum / (double)n_tok + ft_model_aux_loss(m));
    if (ft_st_writer_add(w, "logits", FT_ST_F32, 3, lshape,
                         kept_copy(&k, ft_model_logits(m), (size_t)s->B * s->T * c->vocab_size),
                         err) ||
        ft_st_writer_add(w, "loss", FT_ST_F32, 0, NULL, kept_copy(&k, &loss, 1), err))
        goto done;

    if (s->pref) {
        /* the first step's DPO loss and metrics, from the model as loaded */
        double sums[FT_PREF_NSUM] = {0};
        for (int i = 0; i < s->accum; i++)
            if (ft_pref_eval_batch(&po_obj, m, &micro[i], sums, err))
                goto done;
        float pl = (float)(sums[FT_PREF_LOSS] / sums[FT_PREF_PAIRS]), pm[9];
        for (int j = 0; j < 9; j++) /* (the pairs themselves skipped) */
            pm[j] = (float)(sums[FT_PREF_REWARD_CHOSEN + j + (j >= 6)] / sums[FT_PREF_PAIRS]);
        int64_t mshape[1] = {9};
        if (ft_st_writer_add(w, "pref.loss", FT_ST_F32, 0, NULL, kept_copy(&k, &pl, 1), err) ||
            ft_st_writer_add(w, "pref.metrics", FT_ST_F32, 1, mshape, kept_copy(&k, pm, 9), err))
            goto done;
    }
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
        if (ft_optimizer_init_on(&o, ft_model_mem(m), ft_model_device(m), n, hp, err))
            goto done;
        float *losses = calloc((size_t)steps, sizeof(float));
        for (int i = 0; i < steps; i++) {
            ft_step_stats st;
            if (ft_train_step_objective(m, &o, &sched, s->pref ? &obj : NULL, micro, s->accum,
                                        num(s->train, "max_grad_norm", 0), &st, err)) {
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
        if (s->save_adapter && ft_model_save_adapter(m, s->save_adapter, s->model_dir, err))
            goto done;
    } else if (s->mode != FT_TRAIN_NONE && s->pref) {
        double total = 0, sum;
        for (int i = 0; i < s->accum; i++)
            total += obj.count(obj.ctx, &micro[i]);
        ft_model_zero_grad(m);
        for (int i = 0; i < s->accum; i++)
            if (obj.run(obj.ctx, m, &micro[i], total, &sum, err))
                goto done;
        if (add_params(w, m, &k, "grad.", true, err))
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
    ft_pref_objective_free(&po_obj);
    ft_model_free(ref);
    free(pids);
    free(plab);
    ft_optimizer_free(&o);
    ft_st_writer_free(w);
    for (size_t i = 0; i < k.n; i++)
        free(k.bufs[i]);
    free(k.bufs);
    ft_model_free(m);
    return rc;
}

/* {"quantize": [{"rows", "cols", "values": [...], "type", "blocksize", "double_quant"}]}:
 * each tensor quantized as it is (no model), written as q<i>.packed / absmax / absmax_q /
 * nested_absmax / nested_map / nested_offset (4-bit), q<i>.q / scb (int8) and
 * q<i>.dequant, for the comparison with bitsandbytes' own code. */
static int run_quantize(json_t *list, const char *out_path, ft_err *err)
{
    ft_st_writer *w = ft_st_writer_new();
    size_t n = json_array_size(list);
    ft_qtensor *qs = calloc(n ? n : 1, sizeof *qs);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *e = json_array_get(list, i), *vals = json_object_get(e, "values");
        int64_t rows = json_integer_value(json_object_get(e, "rows"));
        int64_t cols = json_integer_value(json_object_get(e, "cols"));
        json_t *bs = json_object_get(e, "blocksize");
        ft_quant_options o = {.blocksize = json_is_integer(bs) ? (int)json_integer_value(bs) : 64,
                              .double_quant = json_is_true(json_object_get(e, "double_quant"))};
        const char *t = json_string_value(json_object_get(e, "type"));
        if (ft_quant_parse(t ? t : "nf4", &o.type, err))
            return -1;
        size_t numel = (size_t)(rows * cols);
        if (rows < 1 || cols < 1 || json_array_size(vals) != numel)
            return ft_fail(err, "quantize[%zu]: values must hold rows x cols numbers", i);
        float *x = malloc(numel * sizeof *x), *d = NULL;
        for (size_t j = 0; j < numel; j++)
            x[j] = (float)json_number_value(json_array_get(vals, j));
        rc = ft_quantize(x, rows, cols, &o, &qs[i], err);
        if (rc == 0) {
            d = malloc(numel * sizeof *d);
            rc = ft_dequantize(&qs[i], d) ? ft_fail(err, "out of memory") : 0;
            ft_st_writer_keep(w, d);
        }
        free(x);
        const ft_qtensor *q = &qs[i];
        char name[64];
#define ADD(suffix, dt, len, data)                                                       \
    do {                                                                                 \
        int64_t shape_[1] = {(int64_t)(len)};                                            \
        snprintf(name, sizeof name, "q%zu.%s", i, suffix);                              \
        rc = rc ? rc : ft_st_writer_add(w, name, dt, 1, shape_, data, err);              \
    } while (0)
        if (rc == 0)
            ADD("dequant", FT_ST_F32, numel, d);
        if (rc == 0 && q->type == FT_QUANT_INT8) {
            ADD("q", FT_ST_I8, numel, q->q);
            ADD("scb", FT_ST_F32, rows, q->scb);
        } else if (rc == 0) {
            ADD("packed", FT_ST_U8, (numel + 1) / 2, q->packed);
            if (q->nested) {
                ADD("absmax_q", FT_ST_U8, q->n_blocks, q->absmax_q);
                ADD("nested_absmax", FT_ST_F32, (q->n_blocks + 255) / 256, q->nested_absmax);
                ADD("nested_map", FT_ST_F32, 256, q->nested_map);
                ADD("nested_offset", FT_ST_F32, 1, &q->nested_offset);
            } else {
                ADD("absmax", FT_ST_F32, q->n_blocks, q->absmax);
            }
        }
#undef ADD
    }
    if (rc == 0)
        rc = ft_st_writer_save(w, out_path, err);
    ft_st_writer_free(w);
    for (size_t i = 0; i < n; i++)
        ft_qtensor_free(&qs[i]);
    free(qs);
    return rc;
}

/* {"dequantize": {"dir", "prefix", "rows", "cols"}}: reads prefix's quantized weight
 * from the checkpoint in dir (bitsandbytes' layout) and writes it dequantized as
 * "dequant" [rows * cols]. */
static int run_dequantize(json_t *d, const char *out_path, ft_err *err)
{
    const char *dir = json_string_value(json_object_get(d, "dir"));
    const char *prefix = json_string_value(json_object_get(d, "prefix"));
    int64_t rows = json_integer_value(json_object_get(d, "rows"));
    int64_t cols = json_integer_value(json_object_get(d, "cols"));
    if (!dir || !prefix || rows < 1 || cols < 1)
        return ft_fail(err, "dequantize: needs dir, prefix, rows and cols");
    ft_checkpoint *ck;
    if (ft_ckpt_open(&ck, dir, "model", err))
        return -1;
    ft_qtensor q;
    int rc = ft_qtensor_read(ck, prefix, rows, cols, &q, err);
    ft_ckpt_close(ck);
    if (rc)
        return -1;
    size_t n = (size_t)(rows * cols);
    float *out = malloc(n * sizeof *out);
    ft_st_writer *w = ft_st_writer_new();
    int64_t shape[1] = {(int64_t)n};
    rc = ft_dequantize(&q, out) ? ft_fail(err, "out of memory")
                                : ft_st_writer_add(w, "dequant", FT_ST_F32, 1, shape, out, err) ||
                                      ft_st_writer_save(w, out_path, err);
    ft_st_writer_free(w);
    ft_qtensor_free(&q);
    free(out);
    return rc;
}

int main(int argc, char **argv)
{
    ft_cpu_env_reexec(argv); /* the BLAS kernels and wait policy the tools run with */
    if (argc != 3) {
        fprintf(stderr, "usage: ft-conform SPEC.json OUT.safetensors\n");
        return 2;
    }
    ft_err err = {0};
    json_t *root = json_load_file(argv[1], 0, NULL);
    json_t *quant = json_object_get(root, "quantize"), *deq = json_object_get(root, "dequantize");
    if (quant || deq) {
        int qrc = quant ? run_quantize(quant, argv[2], &err) : run_dequantize(deq, argv[2], &err);
        if (qrc)
            fprintf(stderr, "ft-conform: error: %s\n", err.msg);
        json_decref(root);
        return qrc ? 1 : 0;
    }
    json_decref(root);
    spec s;
    int rc = parse_spec(&s, argv[1], &err);
    if (rc == 0)
        rc = run(&s, argv[2], &err);
    if (rc)
        fprintf(stderr, "ft-conform: error: %s\n", err.msg);
    free(s.ids);
    free(s.labels);
    free(s.pos);
    free(s.mask);
    json_decref(s.root);
    return rc ? 1 : 0;
}
