/* Quantizing a checkpoint on disk (lib/model/quantize_model.c): the output loads in our model
 * and computes exactly what quantizing the source on load computes (nf4 / fp4 / int8,
 * skipped modules, sharded output, a converted dtype); the summary and progress; errors
 * (an existing output, an already quantized source, NaN, a bad option) leave nothing
 * behind. The byte-level layout against bitsandbytes' formula and transformers'
 * BitsAndBytesConfig is checked in tests/conformance/test_quantize_tool.py. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "tiny_model.h"

#include "model/model.h"
#include "formats/quant_io.h"
#include "model/quantize_model.h"

static char root[64];

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Entries of dir whose name starts with prefix. */
static int count_prefixed(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* Logits of dir's model (quant: quantized on load; type NONE: as the checkpoint is). */
static float *logits_of(const char *dir, ft_quant_options quant, const char *skip)
{
    ft_model_options mo = {.mode = FT_TRAIN_NONE, .quant = quant, .quant_skip = skip};
    ft_model *m = NULL;
    ft_err err = {0};
    CHECK(ft_model_load(&m, dir, &mo, &err) == 0);
    if (!m) {
        fprintf(stderr, "  %s\n", err.msg);
        return NULL;
    }
    int32_t ids[2 * 6] = {1, 5, 9, 3, 30, 2, 7, 7, 0, 31, 12, 4};
    ft_batch b = {2, 6, ids, NULL, NULL, NULL};
    double loss;
    long n;
    CHECK(ft_model_forward(m, &b, &loss, &n, &err) == 0);
    float *out = malloc(2 * 6 * V * sizeof *out);
    memcpy(out, ft_model_logits(m), 2 * 6 * V * sizeof *out);
    ft_model_free(m);
    return out;
}

static bool same_logits(const float *a, const float *b)
{
    return a && b && memcmp(a, b, 2 * 6 * V * sizeof *a) == 0;
}

static int n_progress;
static size_t last_index;
static void count_progress(const ft_quantize_progress *p, void *ctx)
{
    (void)ctx;
    n_progress++;
    CHECK(p->index == last_index + 1 && p->index <= p->count);
    last_index = p->index;
    bool linear = strstr(p->name, "_proj.weight") != NULL;
    CHECK(p->quantized == (linear && !strstr(p->name, "down_proj")));
    /* (tiny weights: the 1 KiB map of double quantization can outweigh them) */
    CHECK(p->quantized ? p->bytes_out > 0 : p->bytes_out == p->bytes_in);
}

static int quantize(const char *src, const char *out, ft_quant_options q, const char *skip,
                    const char *dtype, size_t shard, ft_quantize_summary *sum, ft_err *err)
{
    ft_quantize_model_options o = {.model_dir = src, .out_dir = out, .quant = q, .skip = skip,
                                   .dtype = dtype, .max_shard_bytes = shard};
    return ft_quantize_model(&o, sum, err);
}

static void expect_fail(const char *src, const char *out, ft_quant_options q, const char *needle)
{
    ft_quantize_summary sum;
    ft_err err = {0};
    CHECK(quantize(src, out, q, NULL, NULL, 0, &sum, &err) == -1);
    CHECK(strstr(err.msg, needle) != NULL);
    if (!strstr(err.msg, needle))
        fprintf(stderr, "  expected '%s' in: %s\n", needle, err.msg);
    CHECK(count_prefixed(root, "err-out") == 0);
}

static void test_round_trip(void)
{
    char src[128], out[128];
    snprintf(src, sizeof src, "%s/src", root);
    tiny_model_opts to = {.qkv_bias = 1};
    write_tiny_model(src, &to);
    static const ft_quant_options cases[] = {{FT_QUANT_NF4, 64, true},
                                             {FT_QUANT_NF4, 32, false},
                                             {FT_QUANT_FP4, 128, true},
                                             {FT_QUANT_INT8, 0, false}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(out, sizeof out, "%s/q%zu", root, k);
        ft_quantize_summary sum;
        ft_err err = {0};
        ft_quant_options q = cases[k];
        if (q.type == FT_QUANT_INT8)
            q.blocksize = 64; /* not used */
        CHECK(quantize(src, out, q, NULL, NULL, 0, &sum, &err) == 0);
        CHECK(sum.n_quantized == 7 * L && sum.n_tensors == 1 + L * 12 + 2);
        CHECK(sum.bytes_out < sum.bytes_in || q.double_quant);
        float *a = logits_of(out, (ft_quant_options){0}, NULL);
        float *b = logits_of(src, cases[k], "lm_head");
        float *dense = logits_of(src, (ft_quant_options){0}, NULL);
        CHECK(same_logits(a, b));
        CHECK(!same_logits(a, dense));
        free(a);
        free(b);
        free(dense);
        char p[256];
        snprintf(p, sizeof p, "%s/config.json", out);
        ft_quant_config qc;
        CHECK(ft_quant_config_read(p, &qc, &err) == 0);
        CHECK(qc.present && qc.opt.type == cases[k].type && qc.skip[0] == '\0');
        if (q.type != FT_QUANT_INT8)
            CHECK(qc.opt.blocksize == q.blocksize && qc.opt.double_quant == q.double_quant);
        CHECK(strcmp(qc.compute_dtype, "float32") == 0);
    }
    CHECK(count_prefixed(root, "q0.tmp") == 0);
}

static void test_skip_shards_dtype(void)
{
    char src[128], out[128], p[256];
    snprintf(src, sizeof src, "%s/src2", root);
    tiny_model_opts to = {.tied = 1, .seed = 11};
    write_tiny_model(src, &to);
    snprintf(out, sizeof out, "%s/skip", root);
    ft_quantize_summary sum;
    ft_err err = {0};
    ft_quant_options nf4 = {FT_QUANT_NF4, 64, true};
    n_progress = 0;
    last_index = 0;
    ft_quantize_model_options o = {.model_dir = src, .out_dir = out, .quant = nf4,
                                   .skip = " down_proj,,lm_head", .max_shard_bytes = 3000,
                                   .progress = count_progress};
    CHECK(ft_quantize_model(&o, &sum, &err) == 0);
    CHECK(n_progress == (int)sum.n_tensors && sum.n_quantized == 6 * L);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    CHECK(exists(p));
    snprintf(p, sizeof p, "%s/config.json", out);
    ft_quant_config qc;
    CHECK(ft_quant_config_read(p, &qc, &err) == 0);
    CHECK(strcmp(qc.skip, "lm_head,down_proj") == 0);
    float *a = logits_of(out, (ft_quant_options){0}, NULL);
    float *b = logits_of(src, nf4, "lm_head,down_proj");
    CHECK(same_logits(a, b));
    free(a);
    free(b);

    /* --dtype bf16: dense tensors converted, torch_dtype and compute dtype follow */
    snprintf(out, sizeof out, "%s/bf16", root);
    CHECK(quantize(src, out, nf4, NULL, "bf16", 0, &sum, &err) == 0);
    snprintf(p, sizeof p, "%s/config.json", out);
    CHECK(ft_quant_config_read(p, &qc, &err) == 0);
    CHECK(strcmp(qc.compute_dtype, "bfloat16") == 0);
    json_error_t je;
    json_t *cfg = json_load_file(p, 0, &je);
    CHECK(cfg && strcmp(json_string_value(json_object_get(cfg, "torch_dtype")), "bfloat16") == 0);
    json_decref(cfg);
    ft_checkpoint *ck = NULL;
    CHECK(ft_ckpt_open(&ck, out, "model", &err) == 0);
    const ft_st_tensor *t = ck ? ft_ckpt_find(ck, "model.embed_tokens.weight") : NULL;
    CHECK(t && t->dtype == FT_ST_BF16);
    ft_ckpt_close(ck);
    a = logits_of(out, (ft_quant_options){0}, NULL);
    CHECK(a != NULL);
    free(a);
}

static void test_errors(void)
{
    char src[128], out[128], p[256];
    snprintf(src, sizeof src, "%s/src", root);
    snprintf(out, sizeof out, "%s/err-out", root);
    ft_quant_options nf4 = {FT_QUANT_NF4, 64, true};
    expect_fail(src, out, (ft_quant_options){FT_QUANT_NF4, 48, true}, "power of two");
    expect_fail(src, out, (ft_quant_options){FT_QUANT_NONE, 64, true}, "nf4, fp4 or int8");
    snprintf(p, sizeof p, "%s/none", root);
    expect_fail(p, out, nf4, "none/config.json");

    /* already quantized: by config.json, and by its tensors alone */
    snprintf(p, sizeof p, "%s/q0", root);
    expect_fail(p, out, nf4, "quantized already");
    char bare[128];
    snprintf(bare, sizeof bare, "%s/bare", root);
    write_model(bare, 0, NULL, NULL, NULL);
    char from[400], to[400];
    snprintf(from, sizeof from, "%s/model.safetensors", p);
    snprintf(to, sizeof to, "%s/model.safetensors", bare);
    ft_err err = {0};
    CHECK(ft_copy_file(from, to, &err) == 0);
    expect_fail(bare, out, nf4, "quantized already");

    /* NaN in a weight: tensor and element named */
    char nan_dir[128];
    snprintf(nan_dir, sizeof nan_dir, "%s/nan", root);
    write_model(nan_dir, 0, NULL, NULL, NULL);
    snprintf(from, sizeof from, "%s/model.safetensors", nan_dir);
    ft_st_file *f = NULL;
    CHECK(ft_st_open(&f, from, &err) == 0);
    ft_st_writer *w = ft_st_writer_new();
    float *copy[64];
    size_t nt = ft_st_count(f);
    for (size_t i = 0; i < nt; i++) {
        const ft_st_tensor *t = ft_st_at(f, i);
        copy[i] = malloc(t->nbytes);
        memcpy(copy[i], t->data, t->nbytes);
        if (strcmp(t->name, "model.layers.1.mlp.up_proj.weight") == 0)
            copy[i][2 * C + 3] = NAN;
        CHECK(ft_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, copy[i], &err) == 0);
    }
    ft_st_close(f);
    CHECK(ft_st_writer_save(w, from, &err) == 0);
    ft_st_writer_free(w);
    for (size_t i = 0; i < nt; i++)
        free(copy[i]);
    expect_fail(nan_dir, out, nf4, "tensor 'model.layers.1.mlp.up_proj.weight': element [2, 3] "
                                   "is NaN");

    /* an existing output: an error without force, replaced with it */
    CHECK(ft_mkdir_p(out, &err) == 0);
    ft_quantize_summary sum;
    CHECK(quantize(src, out, nf4, NULL, NULL, 0, &sum, &err) == -1);
    CHECK(strstr(err.msg, "already exists") != NULL);
    ft_quantize_model_options o = {.model_dir = src, .out_dir = out, .quant = nf4,
                                   .force = true};
    CHECK(ft_quantize_model(&o, &sum, &err) == 0);
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    CHECK(exists(p) && count_prefixed(root, "err-out") == 1);
    o.out_dir = src;
    CHECK(ft_quantize_model(&o, &sum, &err) == -1 && strstr(err.msg, "must not be"));
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft_qmodel_test_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_round_trip);
    RUN(test_skip_shards_dtype);
    RUN(test_errors);
    ft_remove_tree(root);
    return check_summary("quantize_model");
}
