/* LoRA merge (lib/model/merge.c) and adapter init (lib/model/lora_init.c) on tiny random Llamas
 * written by the test itself: W' = W + s B @ A against a double-precision reference for
 * plain, rsLoRA, subset and tied models; dtype conversion (bf16 / f16 values equal to
 * the rounded fp32 merge; default dtype from config.json); sharding; copied tokenizer
 * files; atomic output (nothing left behind on error); and the errors a user can cause
 * (missing adapter, r or targets not matching the tensors, existing output dir,
 * quantized base). The comparison with transformers + PEFT is in
 * tests/conformance/test_tools_peft.py. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "core/fsutil.h"
#include "model/lora_init.h"
#include "model/merge.h"
#include "model/model.h"
#include "core/rng.h"
#include "formats/safetensors.h"


static char root[256];

/* A tiny llama (tests/unit/tiny_model.h); torch_dtype NULL leaves the key out;
 * `extra_cfg` is spliced into config.json (", \"key\": value"). */
static void write_model_with(const char *dir, int tied, const char *torch_dtype,
                             const char *extra_cfg)
{
    char cfg[256] = "";
    if (torch_dtype)
        snprintf(cfg, sizeof cfg, ", \"torch_dtype\": \"%s\"", torch_dtype);
    if (extra_cfg)
        strncat(cfg, extra_cfg, sizeof cfg - strlen(cfg) - 1);
    tiny_model_opts o = {.tied = tied, .extra_cfg = cfg};
    write_tiny_model(dir, &o);
}

/* An adapter for model_dir with random A and B (B would be zero after init). */
static void write_adapter(const char *model_dir, const char *dir, const ft_lora_config *c)
{
    ft_model_options opt = {.mode = FT_TRAIN_LORA, .lora = *c, .seed = 5};
    ft_model *m = NULL;
    ft_err err;
    CHECK(ft_model_load(&m, model_dir, &opt, &err) == 0);
    if (!m) {
        fprintf(stderr, "  load: %s\n", err.msg);
        return;
    }
    for (size_t i = 0; i < ft_model_param_count(m); i++) {
        ft_param *p = ft_model_param(m, i);
        if (strstr(p->name, "lora_B"))
            for (size_t j = 0; j < p->numel; j++)
                p->data[j] = 0.5f * (ft_uniform(31 + i, j) - 0.5f);
    }
    CHECK(ft_model_save_adapter(m, dir, model_dir, &err) == 0);
    ft_model_free(m);
}

static int do_merge(const char *model, const char *adapter, const char *out, const char *dtype,
                    size_t shard, int force, ft_err *err)
{
    ft_merge_options o = {.model_dir = model, .adapter_dir = adapter, .out_dir = out,
                          .dtype = dtype, .max_shard_bytes = shard, .force = force};
    return ft_merge(&o, err);
}

static float *tensor_f32(const ft_checkpoint *ck, const char *name, size_t *n)
{
    const ft_st_tensor *t = ft_ckpt_find(ck, name);
    if (!t)
        return NULL;
    float *v = malloc(t->numel * sizeof *v);
    ft_err err;
    CHECK(ft_st_to_f32(t, v, t->numel, &err) == 0);
    *n = t->numel;
    return v;
}

/* Checks out_dir against base + adapter: every base tensor present, adapted ones equal
 * to W + s B @ A computed in double (fp32 storage: 1e-6 relative covers the GEMM's
 * rounding), the others bitwise equal; no LoRA or lm_head (when tied) tensors. */
static void check_merged(const char *model_dir, const char *adapter_dir, const char *out_dir,
                         float scaling, int tied)
{
    ft_err err;
    ft_checkpoint *base = NULL, *ad = NULL, *out = NULL;
    CHECK(ft_ckpt_open(&base, model_dir, "model", &err) == 0);
    CHECK(ft_ckpt_open(&ad, adapter_dir, "adapter_model", &err) == 0);
    CHECK(ft_ckpt_open(&out, out_dir, "model", &err) == 0);
    if (!base || !ad || !out)
        goto done;
    CHECK(ft_ckpt_count(out) == ft_ckpt_count(base));
    CHECK((ft_ckpt_find(out, "lm_head.weight") == NULL) == !!tied);
    int adapted = 0;
    for (size_t i = 0; i < ft_ckpt_count(base); i++) {
        const ft_st_tensor *bt = ft_ckpt_at(base, i);
        size_t n, no, na = 0, nb = 0;
        float *w = tensor_f32(base, bt->name, &n);
        float *o = tensor_f32(out, bt->name, &no);
        CHECK(o != NULL && no == n);
        if (!o) {
            free(w);
            continue;
        }
        char an[256], bn[256];
        size_t len = strlen(bt->name) - strlen(".weight");
        snprintf(an, sizeof an, "base_model.model.%.*s.lora_A.weight", (int)len, bt->name);
        snprintf(bn, sizeof bn, "base_model.model.%.*s.lora_B.weight", (int)len, bt->name);
        float *A = tensor_f32(ad, an, &na), *B = tensor_f32(ad, bn, &nb);
        if (A && B) {
            adapted++;
            int64_t in = bt->shape[1], outd = bt->shape[0], r = (int64_t)(na / (size_t)in);
            double worst = 0;
            for (int64_t a = 0; a < outd; a++)
                for (int64_t b = 0; b < in; b++) {
                    double acc = 0;
                    for (int64_t k = 0; k < r; k++)
                        acc += (double)B[a * r + k] * A[k * in + b];
                    double want = w[a * in + b] + scaling * acc;
                    double e = fabs(o[a * in + b] - want) / fmax(1.0, fabs(want));
                    worst = fmax(worst, e);
                }
            if (worst > 1e-6)
                fprintf(stderr, "  %s: merged weight off by %g\n", bt->name, worst);
            CHECK(worst <= 1e-6);
        } else {
            CHECK(memcmp(w, o, n * sizeof *w) == 0);
        }
        free(A);
        free(B);
        free(w);
        free(o);
    }
    for (size_t i = 0; i < ft_ckpt_count(out); i++)
        CHECK(strstr(ft_ckpt_at(out, i)->name, "lora") == NULL);
    CHECK(adapted * 2 == (int)ft_ckpt_count(ad));
done:
    ft_ckpt_close(base);
    ft_ckpt_close(ad);
    ft_ckpt_close(out);
}

static void merge_case(const char *tag, int tied, int r, float alpha, int rslora,
                       unsigned targets)
{
    char model[300], adapter[300], out[300];
    snprintf(model, sizeof model, "%s/%s-model", root, tag);
    snprintf(adapter, sizeof adapter, "%s/%s-adapter", root, tag);
    snprintf(out, sizeof out, "%s/%s-merged", root, tag);
    write_model_with(model, tied, NULL, NULL);
    ft_lora_config c = {.r = r, .alpha = alpha, .rslora = rslora, .targets = targets};
    write_adapter(model, adapter, &c);
    ft_err err;
    int rc = do_merge(model, adapter, out, NULL, 0, 0, &err);
    if (rc)
        fprintf(stderr, "  merge: %s\n", err.msg);
    CHECK(rc == 0);
    float s = rslora ? alpha / sqrtf((float)r) : alpha / (float)r;
    check_merged(model, adapter, out, s, tied);
    /* no torch_dtype in the base: float32 output, config says so */
    ft_checkpoint *ck = NULL;
    CHECK(ft_ckpt_open(&ck, out, "model", &err) == 0);
    if (ck)
        CHECK(ft_ckpt_at(ck, 0)->dtype == FT_ST_F32);
    ft_ckpt_close(ck);
    ft_model_config cfg;
    char path[400];
    snprintf(path, sizeof path, "%s/config.json", out);
    CHECK(ft_model_config_load(&cfg, path, &err) == 0);
    CHECK(strcmp(cfg.torch_dtype, "float32") == 0);
    CHECK(cfg.tie_word_embeddings == !!tied);
}

static void test_merge_all_linear(void) { merge_case("all", 0, 2, 4, 0, FT_LORA_ALL_LINEAR); }
static void test_merge_subset_rslora(void)
{
    merge_case("qv", 0, 4, 8, 1, (1u << FT_PROJ_Q) | (1u << FT_PROJ_V));
}
static void test_merge_tied(void)
{
    merge_case("tied", 1, 3, 5, 0, (1u << FT_PROJ_O) | (1u << FT_PROJ_DOWN));
}

/* The merged model in LoRA mode with zero B equals the merged checkpoint loaded plainly;
 * and the merged model's logits equal the base + adapter's (fp32, 1e-5). */
static void test_merged_logits(void)
{
    char model[300], adapter[300], out[300];
    snprintf(model, sizeof model, "%s/all-model", root);
    snprintf(adapter, sizeof adapter, "%s/all-adapter", root);
    snprintf(out, sizeof out, "%s/all-merged", root);
    ft_lora_config c;
    ft_err err;
    CHECK(ft_lora_config_load(&c, adapter, &err) == 0);
    ft_model_options lo = {.mode = FT_TRAIN_LORA, .lora = c}, no = {.mode = FT_TRAIN_NONE};
    ft_model *a = NULL, *b = NULL;
    CHECK(ft_model_load(&a, model, &lo, &err) == 0);
    CHECK(a && ft_model_load_adapter(a, adapter, &err) == 0);
    CHECK(ft_model_load(&b, out, &no, &err) == 0);
    if (!a || !b) {
        ft_model_free(a);
        ft_model_free(b);
        return;
    }
    int32_t ids[8] = {1, 5, 9, 3, 30, 2, 7, 0};
    ft_batch batch = {1, 8, ids, NULL, NULL, NULL};
    CHECK(ft_model_forward(a, &batch, NULL, NULL, &err) == 0);
    CHECK(ft_model_forward(b, &batch, NULL, NULL, &err) == 0);
    const float *la = ft_model_logits(a), *lb = ft_model_logits(b);
    double num = 0, den = 0;
    for (int i = 0; i < 8 * V; i++) {
        num += (double)(la[i] - lb[i]) * (la[i] - lb[i]);
        den += (double)la[i] * la[i];
    }
    CHECK(sqrt(num / den) <= 1e-5);
    ft_model_free(a);
    ft_model_free(b);
}

/* bf16 / f16 output: each value is the fp32 merge rounded to nearest even; the default
 * dtype follows config.json's torch_dtype. */
static void test_dtypes(void)
{
    char model[300], adapter[300], out32[300], out[300], path[400];
    snprintf(model, sizeof model, "%s/dt-model", root);
    snprintf(adapter, sizeof adapter, "%s/dt-adapter", root);
    snprintf(out32, sizeof out32, "%s/dt-f32", root);
    write_model_with(model, 0, "bfloat16", NULL);
    ft_lora_config c = {.r = 2, .alpha = 16, .targets = FT_LORA_ALL_LINEAR};
    write_adapter(model, adapter, &c);
    ft_err err;
    CHECK(do_merge(model, adapter, out32, "f32", 0, 0, &err) == 0);
    ft_checkpoint *ref = NULL;
    CHECK(ft_ckpt_open(&ref, out32, "model", &err) == 0);
    const char *dts[3] = {"bf16", "f16", NULL}; /* NULL: config.json says bfloat16 */
    const char *torch[3] = {"bfloat16", "float16", "bfloat16"};
    for (int d = 0; d < 3 && ref; d++) {
        snprintf(out, sizeof out, "%s/dt-%d", root, d);
        CHECK(do_merge(model, adapter, out, dts[d], 0, 0, &err) == 0);
        ft_st_dtype want = d == 1 ? FT_ST_F16 : FT_ST_BF16;
        ft_checkpoint *ck = NULL;
        CHECK(ft_ckpt_open(&ck, out, "model", &err) == 0);
        if (!ck)
            continue;
        CHECK(ft_ckpt_count(ck) == ft_ckpt_count(ref));
        size_t bad = 0;
        for (size_t i = 0; i < ft_ckpt_count(ck); i++) {
            const ft_st_tensor *t = ft_ckpt_at(ck, i);
            const ft_st_tensor *rt = ft_ckpt_find(ref, t->name);
            CHECK(t->dtype == want && rt && rt->numel == t->numel);
            if (!rt || t->dtype != want)
                continue;
            const float *rv = rt->data;
            const uint16_t *v = t->data;
            for (size_t j = 0; j < t->numel; j++) {
                float f;
                memcpy(&f, &rv[j], sizeof f);
                uint16_t h;
                memcpy(&h, &v[j], sizeof h);
                bad += h != (want == FT_ST_BF16 ? ft_f32_to_bf16(f) : ft_f32_to_f16(f));
            }
        }
        CHECK(bad == 0);
        ft_ckpt_close(ck);
        ft_model_config cfg;
        snprintf(path, sizeof path, "%s/config.json", out);
        CHECK(ft_model_config_load(&cfg, path, &err) == 0);
        CHECK(strcmp(cfg.torch_dtype, torch[d]) == 0);
    }
    ft_ckpt_close(ref);
}

static int count_files(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Small shard limit: shards plus an index, loadable as a checkpoint; tokenizer files
 * copied byte for byte. */
static void test_sharded_and_files(void)
{
    char model[300], adapter[300], out[300], path[400];
    snprintf(model, sizeof model, "%s/all-model", root);
    snprintf(adapter, sizeof adapter, "%s/all-adapter", root);
    snprintf(out, sizeof out, "%s/sharded", root);
    const char *tok = "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n";
    const char *gen = "{\"bos_token_id\": 1}\n";
    ft_err err;
    snprintf(path, sizeof path, "%s/tokenizer.json", model);
    CHECK(ft_write_file_atomic(path, tok, strlen(tok), &err) == 0);
    snprintf(path, sizeof path, "%s/generation_config.json", model);
    CHECK(ft_write_file_atomic(path, gen, strlen(gen), &err) == 0);
    CHECK(do_merge(model, adapter, out, "f32", 4096, 0, &err) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    CHECK(exists(path));
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    CHECK(!exists(path));
    CHECK(count_files(out, "model-0") > 2);
    check_merged(model, adapter, out, 2.0f, 0);
    const char *files[2] = {"tokenizer.json", "generation_config.json"};
    const char *want[2] = {tok, gen};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", out, files[i]);
        char buf[256] = {0};
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            CHECK(n == strlen(want[i]) && memcmp(buf, want[i], n) == 0);
        }
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
    CHECK(!exists(path));
    snprintf(path, sizeof path, "%s/tokenizer.json", model);
    unlink(path);
    snprintf(path, sizeof path, "%s/generation_config.json", model);
    unlink(path);
}

static void expect_merge_error(const char *model, const char *adapter, const char *out,
                               int force, const char *needle)
{
    ft_err err = {0};
    CHECK(do_merge(model, adapter, out, NULL, 0, force, &err) != 0);
    if (!strstr(err.msg, needle)) {
        fprintf(stderr, "  message '%s' lacks '%s'\n", err.msg, needle);
        CHECK(0);
    }
}

/* Rewrites key `key` of <dir>/adapter_config.json with the JSON text `value`. */
static void patch_adapter_config(const char *dir, const char *key, const char *value)
{
    char path[400];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *v = json_loads(value, JSON_DECODE_ANY, &jerr);
    CHECK(root && v);
    json_object_set_new(root, key, v);
    CHECK(json_dump_file(root, path, JSON_INDENT(2)) == 0);
    json_decref(root);
}

static void copy_adapter(const char *src, const char *dst)
{
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    CHECK(system(cmd) == 0);
}

/* Every failure leaves neither the output dir nor a temporary dir behind. */
static void test_errors(void)
{
    char model[300], adapter[300], bad[300], out[300];
    snprintf(model, sizeof model, "%s/all-model", root);
    snprintf(adapter, sizeof adapter, "%s/all-adapter", root);
    snprintf(bad, sizeof bad, "%s/bad-adapter", root);
    snprintf(out, sizeof out, "%s/err-out", root);

    snprintf(bad, sizeof bad, "%s/no-such-adapter", root);
    expect_merge_error(model, bad, out, 0, "no-such-adapter");

    snprintf(bad, sizeof bad, "%s/bad-adapter", root);
    copy_adapter(adapter, bad);
    patch_adapter_config(bad, "r", "3"); /* tensors have r = 2 */
    expect_merge_error(model, bad, out, 0, "wrong shape");

    copy_adapter(adapter, bad);
    patch_adapter_config(bad, "target_modules", "[\"q_proj\", \"v_proj\"]");
    expect_merge_error(model, bad, out, 0, "unexpected adapter tensor");

    char model_qv[300], adapter_qv[300];
    snprintf(model_qv, sizeof model_qv, "%s/qv-model", root);
    snprintf(adapter_qv, sizeof adapter_qv, "%s/qv-adapter", root);
    copy_adapter(adapter_qv, bad);
    patch_adapter_config(bad, "target_modules", "\"all-linear\"");
    patch_adapter_config(bad, "r", "4");
    expect_merge_error(model_qv, bad, out, 0, "missing");

    char qmodel[300];
    snprintf(qmodel, sizeof qmodel, "%s/quant-model", root);
    write_model_with(qmodel, 0, NULL, ", \"quantization_config\": {\"load_in_4bit\": true}");
    expect_merge_error(qmodel, adapter, out, 0, "quantization_config");

    /* a failure after the weights were written: tokenizer.json is a directory */
    char tokdir[400];
    snprintf(tokdir, sizeof tokdir, "%s/tokenizer.json", model);
    CHECK(mkdir(tokdir, 0755) == 0);
    expect_merge_error(model, adapter, out, 0, "tokenizer.json");
    CHECK(rmdir(tokdir) == 0);

    CHECK(!exists(out));
    CHECK(count_files(root, "err-out") == 0);

    /* an existing output dir: error without force, its contents untouched */
    ft_err err;
    CHECK(ft_mkdir_p(out, &err) == 0);
    char keep[400];
    snprintf(keep, sizeof keep, "%s/keep.txt", out);
    CHECK(ft_write_file_atomic(keep, "x", 1, &err) == 0);
    expect_merge_error(model, adapter, out, 0, "already exists");
    CHECK(exists(keep));
    /* --force replaces it whole */
    CHECK(do_merge(model, adapter, out, NULL, 0, 1, &err) == 0);
    CHECK(!exists(keep));
    check_merged(model, adapter, out, 2.0f, 0);
    CHECK(count_files(root, "err-out") == 1);
    /* --force never replaces the model itself */
    expect_merge_error(model, adapter, model, 1, "must not be");
}

/* ft-lora-init's adapter: PEFT's init (|A| <= 1/sqrt(in), B = 0), config as asked, and
 * it loads back into the model. */
static void test_lora_init(void)
{
    char model[300], adapter[300];
    snprintf(model, sizeof model, "%s/all-model", root);
    snprintf(adapter, sizeof adapter, "%s/init-adapter", root);
    ft_lora_config c = {.r = 8, .alpha = 16, .dropout = 0.1f, .rslora = true,
                        .targets = (1u << FT_PROJ_K) | (1u << FT_PROJ_UP)};
    ft_err err;
    CHECK(ft_lora_init_adapter(model, adapter, &c, 3, &err) == 0);
    ft_lora_config got;
    CHECK(ft_lora_config_load(&got, adapter, &err) == 0);
    CHECK(got.r == 8 && got.alpha == 16 && got.rslora && got.targets == c.targets);
    CHECK(fabsf(got.dropout - 0.1f) < 1e-6f);
    ft_checkpoint *ck = NULL;
    CHECK(ft_ckpt_open(&ck, adapter, "adapter_model", &err) == 0);
    if (!ck)
        return;
    CHECK(ft_ckpt_count(ck) == 2 * 2 * L);
    for (size_t i = 0; i < ft_ckpt_count(ck); i++) {
        const ft_st_tensor *t = ft_ckpt_at(ck, i);
        size_t n;
        float *v = tensor_f32(ck, t->name, &n);
        int is_a = strstr(t->name, "lora_A") != NULL;
        CHECK(strstr(t->name, "k_proj") || strstr(t->name, "up_proj"));
        double bound = 1.0 / sqrt((double)t->shape[1]), maxabs = 0;
        for (size_t j = 0; j < n; j++)
            maxabs = fmax(maxabs, fabs(v[j]));
        if (is_a)
            CHECK(maxabs <= bound && maxabs > 0.5 * bound);
        else
            CHECK(maxabs == 0);
        free(v);
    }
    ft_ckpt_close(ck);
    /* the same seed gives the same adapter */
    char again[300];
    snprintf(again, sizeof again, "%s/init-again", root);
    CHECK(ft_lora_init_adapter(model, again, &c, 3, &err) == 0);
    ft_checkpoint *a = NULL, *b = NULL;
    CHECK(ft_ckpt_open(&a, adapter, "adapter_model", &err) == 0);
    CHECK(ft_ckpt_open(&b, again, "adapter_model", &err) == 0);
    for (size_t i = 0; a && b && i < ft_ckpt_count(a); i++) {
        const ft_st_tensor *t = ft_ckpt_at(a, i), *u = ft_ckpt_find(b, t->name);
        CHECK(u && u->nbytes == t->nbytes && memcmp(u->data, t->data, t->nbytes) == 0);
    }
    ft_ckpt_close(a);
    ft_ckpt_close(b);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft-test-merge-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_merge_all_linear);
    RUN(test_merge_subset_rslora);
    RUN(test_merge_tied);
    RUN(test_merged_logits);
    RUN(test_dtypes);
    RUN(test_sharded_and_files);
    RUN(test_errors);
    RUN(test_lora_init);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("merge");
}
