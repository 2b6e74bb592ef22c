/* The model end to end on a tiny random Llama written by the test itself: gradients
 * against central finite differences (full and LoRA), gradient checkpointing bitwise
 * identical (also with LoRA dropout), gradient accumulation equal to one pass, packed
 * rows equal to separate rows, adapter save/load round trip, and the errors a user can
 * cause (bad token id, missing or mis-shaped tensor, unexpected tensor, a NaN or infinite
 * weight in the base or the adapter). The comparison
 * with transformers + PEFT is in tests/conformance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tiny_model.h"
#include "core/fsutil.h"
#include "model/model.h"
#include "core/rng.h"
#include "formats/safetensors.h"

static char root[256];

static ft_model *load(const char *dir, ft_train_mode mode, int ckpt, float dropout)
{
    ft_model_options opt = {.mode = mode, .grad_ckpt = ckpt, .seed = 99};
    opt.lora = (ft_lora_config){.r = 2, .alpha = 4, .dropout = dropout,
                                .targets = FT_LORA_ALL_LINEAR};
    ft_model *m = NULL;
    ft_err err;
    if (ft_model_load(&m, dir, &opt, &err))
        fprintf(stderr, "  load: %s\n", err.msg);
    if (m && mode == FT_TRAIN_LORA) {
        /* B starts at zero, which would make every A gradient zero: randomise it. */
        for (size_t i = 0; i < ft_model_param_count(m); i++) {
            ft_param *p = ft_model_param(m, i);
            if (strstr(p->name, "lora_B"))
                for (size_t j = 0; j < p->numel; j++)
                    p->data[j] = 0.5f * (ft_uniform(31 + i, j) - 0.5f);
        }
    }
    return m;
}

enum { B = 2, T = 6 };
static int32_t ids[B * T] = {1, 5, 9, 3, 30, 2, 7, 7, 0, 31, 12, 4};
static int32_t labels[B * T] = {1, 5, -100, 3, 30, 2, 7, 7, 0, 31, -100, 4};

static double mean_loss(ft_model *m, const ft_batch *b)
{
    double sum;
    long n;
    ft_err err;
    CHECK(ft_model_forward(m, b, &sum, &n, &err) == 0);
    return sum / (double)n;
}

/* The finite-difference step of check_fd: 1e-2; a more curved model (gemma2's caps and
 * doubled norms) takes a smaller one. */
static float fd_step = 1e-2f;

/* Analytic gradient of the mean loss against central differences, for a few entries of
 * every trainable parameter. fp32 forward, step 1e-2: truncation error ~h^2 and rounding
 * ~1e-7 * loss / h, so 3% relative (plus 2e-4 absolute) separates a right gradient from a
 * wrong one, which is off by O(1). */
static void check_fd(ft_model *m)
{
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    ft_err err;
    ft_model_zero_grad(m);
    double sum;
    long n;
    /* every forward draws LoRA dropout masks from the same point of the stream */
    uint64_t rng = ft_model_rng_counter(m);
    CHECK(ft_model_forward(m, &b, &sum, &n, &err) == 0);
    CHECK(ft_model_backward(m, (float)(1.0 / n), &err) == 0);
    int checked = 0, bad = 0;
    for (size_t i = 0; i < ft_model_param_count(m); i++) {
        ft_param *p = ft_model_param(m, i);
        if (!p->grad)
            continue;
        for (int s = 0; s < 3; s++) {
            size_t j = (size_t)(ft_uniform(5, i * 3 + s) * p->numel);
            float keep = p->data[j], h = fd_step;
            p->data[j] = keep + h;
            ft_model_set_rng_counter(m, rng);
            double up = mean_loss(m, &b);
            p->data[j] = keep - h;
            ft_model_set_rng_counter(m, rng);
            double down = mean_loss(m, &b);
            p->data[j] = keep;
            double fd = (up - down) / (2 * h), an = p->grad[j];
            checked++;
            if (fabs(fd - an) > 3e-2 * fabs(fd) + 2e-4) {
                bad++;
                fprintf(stderr, "  %s[%zu]: analytic %.6g, finite difference %.6g\n", p->name,
                        j, an, fd);
            }
        }
    }
    CHECK(checked > 0);
    CHECK(bad == 0);
}

static void test_full_gradients(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    write_model(dir, 0, NULL, NULL, NULL);
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    CHECK(m != NULL);
    if (m)
        check_fd(m);
    ft_model_free(m);
}

static void test_qwen2_bias_gradients(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/qwen2", root);
    write_model(dir, 1, NULL, NULL, NULL);
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    CHECK(m != NULL);
    if (m) {
        CHECK(ft_model_find_param(m, "model.layers.1.self_attn.k_proj.bias") != NULL);
        check_fd(m);
    }
    ft_model_free(m);
}

static void test_lora_gradients(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    ft_model *m = load(dir, FT_TRAIN_LORA, 0, 0);
    CHECK(m != NULL);
    if (m) {
        size_t n;
        ft_model_trainable(m, &n);
        CHECK(n == (size_t)L * 2 * ((C + HQ * D) + 2 * (C + HKV * D) + (HQ * D + C) +
                                    2 * (C + I) + (I + C)));
        check_fd(m);
    }
    ft_model_free(m);
}

/* All gradients of one forward/backward, copied out. */
static float *grads_of(ft_model *m, const ft_batch *b, int n_micro, size_t *n)
{
    ft_err err;
    long total = 0;
    for (int i = 0; i < n_micro; i++)
        total += ft_batch_counted_tokens(&b[i]);
    ft_model_zero_grad(m);
    for (int i = 0; i < n_micro; i++) {
        CHECK(ft_model_forward(m, &b[i], NULL, NULL, &err) == 0);
        CHECK(ft_model_backward(m, (float)(1.0 / total), &err) == 0);
    }
    float *g = ft_model_grads(m, n);
    float *copy = malloc(*n * sizeof(float));
    memcpy(copy, g, *n * sizeof(float));
    return copy;
}

static void check_ckpt_identical_in(const char *dir, ft_train_mode mode, float dropout)
{
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    ft_model *plain = load(dir, mode, 0, dropout), *ckpt = load(dir, mode, 1, dropout);
    size_t n1, n2;
    float *g1 = grads_of(plain, &b, 1, &n1), *g2 = grads_of(ckpt, &b, 1, &n2);
    CHECK(n1 == n2 && n1 > 0);
    CHECK(memcmp(g1, g2, n1 * sizeof(float)) == 0);
    double norm = 0;
    for (size_t i = 0; i < n1; i++)
        norm += (double)g1[i] * g1[i];
    CHECK(norm > 0);
    free(g1);
    free(g2);
    ft_model_free(plain);
    ft_model_free(ckpt);
}

static void check_ckpt_identical(ft_train_mode mode, float dropout)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    check_ckpt_identical_in(dir, mode, dropout);
}

static void test_ckpt_full(void) { check_ckpt_identical(FT_TRAIN_FULL, 0); }
static void test_ckpt_lora_dropout(void) { check_ckpt_identical(FT_TRAIN_LORA, 0.3f); }

/* Phi-3 (fused qkv_proj / gate_up_proj, partial rotary, longrope: T 6 > original 4 picks
 * the long factors) and SmolLM3 (layer 1 without RoPE): full and LoRA gradients against
 * finite differences, LoRA with dropout (one mask per fused module, regenerated in
 * backward), gradient checkpointing bitwise identical. */
static void test_phi3_smollm3_gradients(void)
{
    char phi3[300], smol[300];
    snprintf(phi3, sizeof phi3, "%s/phi3", root);
    write_tiny_model(phi3, &(tiny_model_opts){
                               .model_type = "phi3",
                               .extra_cfg = ", \"partial_rotary_factor\": 0.5, "
                                            "\"original_max_position_embeddings\": 4, "
                                            "\"rope_scaling\": {\"type\": \"longrope\", "
                                            "\"short_factor\": [1.5], \"long_factor\": [3]}"});
    snprintf(smol, sizeof smol, "%s/smollm3", root);
    write_tiny_model(smol, &(tiny_model_opts){.model_type = "smollm3", .tied = 1,
                                              .extra_cfg = ", \"no_rope_layers\": [1, 0]"});
    const struct {
        const char *dir;
        ft_train_mode mode;
        float dropout;
    } cases[] = {{phi3, FT_TRAIN_FULL, 0}, {phi3, FT_TRAIN_LORA, 0},
                 {phi3, FT_TRAIN_LORA, 0.3f}, {smol, FT_TRAIN_FULL, 0},
                 {smol, FT_TRAIN_LORA, 0.3f}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ft_model *m = load(cases[i].dir, cases[i].mode, 0, cases[i].dropout);
        CHECK(m != NULL);
        if (m)
            check_fd(m);
        ft_model_free(m);
    }
    ft_model *m = load(phi3, FT_TRAIN_LORA, 0, 0);
    CHECK(m && ft_model_find_param(m, "base_model.model.model.layers.1.mlp.gate_up_proj."
                                      "lora_B.weight") &&
          !ft_model_find_param(m, "model.layers.0.self_attn.q_proj.weight"));
    ft_model_free(m);
    check_ckpt_identical_in(phi3, FT_TRAIN_LORA, 0.3f);
    check_ckpt_identical_in(phi3, FT_TRAIN_FULL, 0);
    check_ckpt_identical_in(smol, FT_TRAIN_LORA, 0.3f);
}

/* The families with other norms: olmo2 (post-norms in place of llama's pre-norms, q/k
 * norm over the whole projection) and qwen3 (q/k norm per head, weight [head_dim]): every
 * weight's gradient, the norms' included, against finite differences, with and without
 * gradient checkpointing (bitwise equal), LoRA with dropout too. */
/* Gradient checkpointing gives bitwise the gradients of the plain pass (full and LoRA,
 * LoRA dropout 0.3) on the model in dir. */
static void check_ckpt_bitwise(const char *dir, const ft_batch *b)
{
    for (int mode = 0; mode < 2; mode++) {
        ft_train_mode tm = mode ? FT_TRAIN_LORA : FT_TRAIN_FULL;
        ft_model *plain = load(dir, tm, 0, 0.3f), *ckpt = load(dir, tm, 1, 0.3f);
        size_t n1, n2;
        float *g1 = grads_of(plain, b, 1, &n1), *g2 = grads_of(ckpt, b, 1, &n2);
        CHECK(n1 == n2 && n1 > 0 && memcmp(g1, g2, n1 * sizeof(float)) == 0);
        free(g1);
        free(g2);
        ft_model_free(plain);
        ft_model_free(ckpt);
    }
}

static void family_gradients(const char *type)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/%s", root, type);
    write_tiny_model(dir, &(tiny_model_opts){.model_type = type});
    int olmo2 = strcmp(type, "olmo2") == 0;
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    CHECK(m != NULL);
    if (!m)
        return;
    ft_param *qn = ft_model_find_param(m, "model.layers.1.self_attn.q_norm.weight");
    ft_param *kn = ft_model_find_param(m, "model.layers.1.self_attn.k_norm.weight");
    CHECK(qn && qn->trainable && qn->numel == (size_t)(olmo2 ? HQ * D : D));
    CHECK(kn && kn->trainable && kn->numel == (size_t)(olmo2 ? HKV * D : D));
    bool pre = ft_model_find_param(m, "model.layers.0.input_layernorm.weight") != NULL;
    bool post = ft_model_find_param(m, "model.layers.0.post_feedforward_layernorm.weight");
    CHECK(pre == !olmo2 && post == olmo2);
    check_fd(m);
    ft_model_free(m);
    m = load(dir, FT_TRAIN_LORA, 0, 0);
    CHECK(m != NULL);
    if (m)
        check_fd(m);
    ft_model_free(m);
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    check_ckpt_bitwise(dir, &b);
}

static void test_olmo2_gradients(void) { family_gradients("olmo2"); }
static void test_qwen3_gradients(void) { family_gradients("qwen3"); }

static void test_grad_accumulation(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    ft_batch whole = {B, T, ids, labels, NULL, NULL};
    ft_batch halves[2] = {{1, T, ids, labels, NULL, NULL}, {1, T, ids + T, labels + T, NULL, NULL}};
    size_t n1, n2;
    float *g1 = grads_of(m, &whole, 1, &n1), *g2 = grads_of(m, halves, 2, &n2);
    double diff = 0, ref = 0;
    for (size_t i = 0; i < n1; i++) {
        diff += ((double)g1[i] - g2[i]) * ((double)g1[i] - g2[i]);
        ref += (double)g1[i] * g1[i];
    }
    CHECK(sqrt(diff / ref) < 1e-6);
    free(g1);
    free(g2);
    ft_model_free(m);
}

/* The head in chunks of R rows (ft_model_options.loss_chunk_rows) gives the loss and
 * gradients of the whole head within fp32 summation order, for a full model (lm_head's
 * gradient summed over chunks) and a tied one, with R dividing N, ragged and 1 row; only
 * the last chunk's logits stay readable. */
static void check_chunked_head(const char *dir, ft_train_mode mode)
{
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    ft_model *whole = load(dir, mode, 0, 0);
    size_t n1;
    double loss1 = mean_loss(whole, &b);
    float last1[V];
    memcpy(last1, ft_model_row_logits(whole, B * T - 1), sizeof last1);
    CHECK(ft_model_logits(whole) != NULL);
    float *g1 = grads_of(whole, &b, 1, &n1);
    int chunks[] = {1, 5, 7, 12, 100};
    for (size_t k = 0; k < sizeof chunks / sizeof *chunks; k++) {
        ft_model_options opt = {.mode = mode, .seed = 99, .loss_chunk_rows = chunks[k]};
        opt.lora = (ft_lora_config){.r = 2, .alpha = 4, .targets = FT_LORA_ALL_LINEAR};
        ft_model *m = NULL;
        ft_err err;
        CHECK(ft_model_load(&m, dir, &opt, &err) == 0);
        if (!m)
            continue;
        /* the same LoRA B as load() gave the whole model */
        size_t nt, nw;
        float *dst = ft_model_trainable(m, &nt), *src = ft_model_trainable(whole, &nw);
        CHECK(nt == nw);
        memcpy(dst, src, nt * sizeof(float));
        double loss2 = mean_loss(m, &b);
        CHECK(fabs(loss2 - loss1) <= 1e-6 * fabs(loss1));
        bool one_chunk = chunks[k] >= B * T;
        CHECK((ft_model_logits(m) != NULL) == one_chunk);
        const float *last2 = ft_model_row_logits(m, B * T - 1);
        CHECK(last2 != NULL);
        for (int v = 0; last2 && v < V; v++)
            CHECK(fabsf(last2[v] - last1[v]) <= 1e-5f * (1 + fabsf(last1[v])));
        /* the first row is held only when one chunk covers everything or a chunk is the
         * last one: R = 7 splits 12 rows into 7 + 5 */
        CHECK((ft_model_row_logits(m, 0) != NULL) == one_chunk);
        size_t n2;
        float *g2 = grads_of(m, &b, 1, &n2);
        CHECK(n2 == n1);
        double diff = 0, ref = 0;
        for (size_t i = 0; i < n1 && n2 == n1; i++) {
            diff += ((double)g1[i] - g2[i]) * ((double)g1[i] - g2[i]);
            ref += (double)g1[i] * g1[i];
        }
        CHECK(ref > 0 && sqrt(diff / ref) < 1e-6);
        CHECK(ft_model_row_logits(m, B * T - 1) == NULL); /* a backward spends them */
        free(g2);
        ft_model_free(m);
    }
    free(g1);
    ft_model_free(whole);
}

/* Gemma 2's block: four (1 + w) norms a layer, attention logits capped at 1 and final
 * logits at 2 (both bent: the tiny model's scores and logits reach a few units), a window
 * of 3 < T on layer 0 and full attention on layer 1, attention scale 6^-0.5 with head_dim
 * 4, tied head: every gradient against finite differences (full and LoRA), gradient
 * checkpointing bitwise equal, and the head in chunks (the backward recomputes each
 * chunk's capped logits) equal to the whole head. */
static const char *GEMMA2_CFG =
    ", \"head_dim\": 4, \"query_pre_attn_scalar\": 6, \"attn_logit_softcapping\": 1.0,"
    " \"final_logit_softcapping\": 2.0, \"sliding_window\": 3";

static void test_gemma2(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/gemma2", root);
    write_tiny_model(dir, &(tiny_model_opts){.model_type = "gemma2", .tied = 1,
                                             .extra_cfg = GEMMA2_CFG});
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    CHECK(m != NULL);
    if (!m)
        return;
    const ft_model_config *c = ft_model_cfg(m);
    CHECK(c->attn_softcap == 1.0f && c->final_softcap == 2.0f);
    CHECK(ft_layer_window(c, 0) == 3 && ft_layer_window(c, 1) == 0);
    static const char *norms[] = {"input_layernorm", "post_attention_layernorm",
                                  "pre_feedforward_layernorm", "post_feedforward_layernorm"};
    for (int i = 0; i < 4; i++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.1.%s.weight", norms[i]);
        ft_param *p = ft_model_find_param(m, name);
        CHECK(p && p->trainable && p->numel == C);
    }
    /* the caps bend: some logit is past half the cap, where tanh is well off the line */
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    mean_loss(m, &b);
    const float *lg = ft_model_logits(m);
    float big = 0;
    for (int i = 0; lg && i < B * T * V; i++)
        big = fmaxf(big, fabsf(lg[i]));
    CHECK(big > 1.0f && big < 2.0f);
    /* tanh's curvature (and norms applied as 1 + w, near 2 here): at the usual step of
     * 1e-2 the truncation error reaches the 3% bound on a few entries; at 5e-3 it is a
     * quarter of that, and rounding (~1e-7 * loss / h) stays under the 2e-4 floor */
    fd_step = 5e-3f;
    check_fd(m);
    ft_model_free(m);
    m = load(dir, FT_TRAIN_LORA, 0, 0);
    CHECK(m != NULL);
    if (m)
        check_fd(m);
    ft_model_free(m);
    fd_step = 1e-2f;
    check_ckpt_bitwise(dir, &b);
    check_chunked_head(dir, FT_TRAIN_FULL);
    check_chunked_head(dir, FT_TRAIN_LORA);
}

/* Gemma 3's block: gemma2's four (1 + w) norms, per-head q/k norms applied as 1 + w, the
 * sliding layer 0 rotating with the local base (100) and the global layer 1 with
 * rope_theta and linear scaling 4, final logits capped at 2 (no attention cap), tied:
 * every gradient against finite differences (full and LoRA), checkpointing bitwise, the
 * chunked head; and the two RoPE sets are each used where they belong (changing the
 * local base changes the logits, as does the global factor). */
static const char *GEMMA3_CFG =
    ", \"query_pre_attn_scalar\": 6, \"final_logit_softcapping\": 2.0,"
    " \"sliding_window\": 3, \"layer_types\": [\"sliding_attention\", \"full_attention\"],"
    " \"rope_local_base_freq\": 100.0, \"rope_scaling\": {\"rope_type\": \"linear\","
    " \"factor\": 4.0}";

/* The logits of the gemma3 test model written with extra_cfg, as a copy. */
static float *gemma3_logits(const char *dir, const char *extra_cfg)
{
    write_tiny_model(dir, &(tiny_model_opts){.model_type = "gemma3_text", .tied = 1,
                                             .extra_cfg = extra_cfg});
    ft_model *m = load(dir, FT_TRAIN_NONE, 0, 0);
    CHECK(m != NULL);
    if (!m)
        return NULL;
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    mean_loss(m, &b);
    float *out = malloc(sizeof(float) * B * T * V);
    if (out && ft_model_logits(m))
        memcpy(out, ft_model_logits(m), sizeof(float) * B * T * V);
    ft_model_free(m);
    return out;
}

static void test_gemma3(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/gemma3", root);
    write_tiny_model(dir, &(tiny_model_opts){.model_type = "gemma3_text", .tied = 1,
                                             .extra_cfg = GEMMA3_CFG});
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    CHECK(m != NULL);
    if (!m)
        return;
    const ft_model_config *c = ft_model_cfg(m);
    CHECK(c->attn_softcap == 0.0f && c->final_softcap == 2.0f && c->norm_w_offset == 1.0f);
    CHECK(ft_layer_window(c, 0) == 3 && ft_layer_window(c, 1) == 0);
    CHECK(ft_layer_rope_local(c, 0) && !ft_layer_rope_local(c, 1));
    ft_param *qn = ft_model_find_param(m, "model.layers.1.self_attn.q_norm.weight");
    CHECK(qn && qn->trainable && qn->numel == D);
    ft_param *pf = ft_model_find_param(m, "model.layers.0.pre_feedforward_layernorm.weight");
    CHECK(pf && pf->trainable);
    fd_step = 5e-3f; /* as for gemma2: the cap's curvature */
    check_fd(m);
    ft_model_free(m);
    m = load(dir, FT_TRAIN_LORA, 0, 0);
    CHECK(m != NULL);
    if (m)
        check_fd(m);
    ft_model_free(m);
    fd_step = 1e-2f;
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    check_ckpt_bitwise(dir, &b);
    check_chunked_head(dir, FT_TRAIN_FULL);
    check_chunked_head(dir, FT_TRAIN_LORA);

    /* each RoPE set reaches its layers: another local base or global factor moves the
     * logits; the same config gives the same logits */
    float *base = gemma3_logits(dir, GEMMA3_CFG), *same = gemma3_logits(dir, GEMMA3_CFG);
    float *local = gemma3_logits(dir,
        ", \"query_pre_attn_scalar\": 6, \"final_logit_softcapping\": 2.0,"
        " \"sliding_window\": 3, \"layer_types\": [\"sliding_attention\", \"full_attention\"],"
        " \"rope_local_base_freq\": 7.0, \"rope_scaling\": {\"rope_type\": \"linear\","
        " \"factor\": 4.0}");
    float *global = gemma3_logits(dir,
        ", \"query_pre_attn_scalar\": 6, \"final_logit_softcapping\": 2.0,"
        " \"sliding_window\": 3, \"layer_types\": [\"sliding_attention\", \"full_attention\"],"
        " \"rope_local_base_freq\": 100.0");
    CHECK(base && same && local && global);
    if (base && same && local && global) {
        float d_same = 0, d_local = 0, d_global = 0;
        for (int i = 0; i < B * T * V; i++) {
            d_same = fmaxf(d_same, fabsf(base[i] - same[i]));
            d_local = fmaxf(d_local, fabsf(base[i] - local[i]));
            d_global = fmaxf(d_global, fabsf(base[i] - global[i]));
        }
        CHECK(d_same == 0.0f && d_local > 1e-3f && d_global > 1e-3f);
    }
    free(base);
    free(same);
    free(local);
    free(global);
}

static void test_chunked_head(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    check_chunked_head(dir, FT_TRAIN_FULL);
    check_chunked_head(dir, FT_TRAIN_LORA);
    snprintf(dir, sizeof dir, "%s/tied", root);
    write_tiny_model(dir, &(tiny_model_opts){.tied = 1});
    check_chunked_head(dir, FT_TRAIN_FULL);
}

/* ft_loss_chunk_rows: auto gives a multiple of 64 rows (of 8 below 64) within the
 * FT_LOSS_CHUNK_AUTO_ELEMS budget, for the vocabularies of the bench models (Llama 3,
 * Qwen 2/3, Llama 2 / Mistral, Gemma 2/3) and an 8192-token micro-batch; a given chunk
 * and 0 (the whole batch) are kept; N caps every value. */
static void test_loss_chunk_rows(void)
{
    static const size_t vocabs[] = {128256, 151936, 32000, 32768, 256000, 262144, 49152};
    for (size_t i = 0; i < sizeof vocabs / sizeof *vocabs; i++) {
        size_t V = vocabs[i], R = ft_loss_chunk_rows(-1, V, 8192);
        CHECK(R % 64 == 0 && R * V <= FT_LOSS_CHUNK_AUTO_ELEMS);
        CHECK((R + 64) * V > FT_LOSS_CHUNK_AUTO_ELEMS); /* the largest such multiple */
    }
    CHECK(ft_loss_chunk_rows(-1, 128256, 8192) == 512);
    /* fewer than 64 rows fit: a multiple of 8; fewer than 8: as many as fit, at least 1 */
    CHECK(ft_loss_chunk_rows(-1, (size_t)1 << 21, 8192) == 32);
    CHECK(ft_loss_chunk_rows(-1, ((size_t)1 << 23) + 1, 8192) == 7);
    CHECK(ft_loss_chunk_rows(-1, (size_t)1 << 30, 8192) == 1);
    CHECK(ft_loss_chunk_rows(-1, 1500, 24) == 24); /* the whole batch fits */
    CHECK(ft_loss_chunk_rows(347, 128256, 8192) == 347);
    CHECK(ft_loss_chunk_rows(347, 128256, 100) == 100);
    CHECK(ft_loss_chunk_rows(0, 128256, 8192) == 8192);
}

/* The adapters of PEFT's other kinds (lora.h): DoRA; LoRA on the embedding and lm_head;
 * the embedding and lm_head trained in full (modules_to_save); DoRA on the embedding and
 * lm_head too; each with LoRA dropout 0.3.
 * Gradient checkpointing gives bitwise the plain gradients, a chunked head (5 rows) the
 * same to rounding, and (but DoRA, whose norm is a constant in the gradient, not in a
 * finite difference) the gradients match finite differences. */
static ft_model *load_kind(const char *dir, ft_lora_config lc, int ckpt, int chunk)
{
    ft_model_options opt = {.mode = FT_TRAIN_LORA, .grad_ckpt = ckpt, .seed = 99,
                            .loss_chunk_rows = chunk, .lora = lc};
    ft_model *m = NULL;
    ft_err err;
    if (ft_model_load(&m, dir, &opt, &err)) {
        fprintf(stderr, "  load: %s\n", err.msg);
        return NULL;
    }
    for (size_t i = 0; i < ft_model_param_count(m); i++) { /* the zero halves: random */
        ft_param *p = ft_model_param(m, i);
        if (strstr(p->name, "lora_B") || strstr(p->name, "lora_embedding_A"))
            for (size_t j = 0; j < p->numel; j++)
                p->data[j] = 0.5f * (ft_uniform(31 + i, j) - 0.5f);
    }
    return m;
}

static void test_adapter_kinds(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    ft_lora_config base = {.r = 2, .alpha = 4, .dropout = 0.3f, .targets = FT_LORA_ALL_LINEAR};
    ft_lora_config kinds[4] = {base, base, base, base};
    kinds[0].dora = true;
    kinds[1].targets |= FT_LORA_EMBED | FT_LORA_HEAD;
    kinds[2].targets = (1u << FT_PROJ_Q) | (1u << FT_PROJ_V);
    kinds[2].modules_to_save = FT_SAVE_EMBED | FT_SAVE_HEAD;
    /* DoRA on the embedding and the head too (the head's dropout mask by chunk rows) */
    kinds[3].dora = true;
    kinds[3].targets |= FT_LORA_EMBED | FT_LORA_HEAD;
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    for (int k = 0; k < 4; k++) {
        ft_model *plain = load_kind(dir, kinds[k], 0, 0), *ckpt = load_kind(dir, kinds[k], 1, 0);
        ft_model *chunked = load_kind(dir, kinds[k], 0, 5);
        CHECK(plain && ckpt && chunked);
        if (!plain || !ckpt || !chunked)
            continue;
        size_t n1, n2, n3;
        float *g1 = grads_of(plain, &b, 1, &n1), *g2 = grads_of(ckpt, &b, 1, &n2);
        float *g3 = grads_of(chunked, &b, 1, &n3);
        CHECK(n1 == n2 && n1 == n3 && n1 > 0 && memcmp(g1, g2, n1 * sizeof(float)) == 0);
        double d = 0, nrm = 0;
        for (size_t i = 0; i < n1 && n1 == n3; i++) {
            d += (double)(g1[i] - g3[i]) * (g1[i] - g3[i]);
            nrm += (double)g1[i] * g1[i];
        }
        CHECK(nrm > 0 && sqrt(d / nrm) < 1e-5);
        if (!kinds[k].dora)
            check_fd(plain);
        free(g1), free(g2), free(g3);
        ft_model_free(plain), ft_model_free(ckpt), ft_model_free(chunked);
    }
}

/* Two sequences packed into one row (positions restart) give the logits of the two
 * sequences run as separate rows. */
static void test_packed_rows(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    ft_model *m = load(dir, FT_TRAIN_NONE, 0, 0);
    ft_err err;
    int32_t packed_ids[T] = {1, 5, 9, 3, 30, 2}, pos[T] = {0, 1, 2, 0, 1, 2};
    int32_t sep_ids[2 * 3] = {1, 5, 9, 3, 30, 2};
    ft_batch packed = {1, T, packed_ids, NULL, pos, NULL}, sep = {2, 3, sep_ids, NULL, NULL, NULL};
    CHECK(ft_model_forward(m, &packed, NULL, NULL, &err) == 0);
    float *a = malloc((size_t)T * V * sizeof(float));
    memcpy(a, ft_model_logits(m), (size_t)T * V * sizeof(float));
    CHECK(ft_model_forward(m, &sep, NULL, NULL, &err) == 0);
    const float *bl = ft_model_logits(m);
    double diff = 0;
    for (int i = 0; i < T * V; i++)
        diff = fmax(diff, fabs(a[i] - bl[i]));
    CHECK(diff < 1e-5);
    free(a);
    ft_model_free(m);
}

static void test_adapter_round_trip(void)
{
    char dir[300], adir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    snprintf(adir, sizeof adir, "%s/adapter", root);
    ft_err err;
    ft_model *a = load(dir, FT_TRAIN_LORA, 0, 0), *b = load(dir, FT_TRAIN_LORA, 0, 0);
    /* b starts from other LoRA weights */
    size_t n;
    float *wb = ft_model_trainable(b, &n);
    for (size_t i = 0; i < n; i++)
        wb[i] += 1.0f;
    CHECK(ft_model_save_adapter(a, adir, "tiny", &err) == 0);
    CHECK(ft_model_load_adapter(b, adir, &err) == 0);
    size_t na;
    float *wa = ft_model_trainable(a, &na);
    CHECK(na == n && memcmp(wa, wb, n * sizeof(float)) == 0);
    ft_lora_config cfg;
    CHECK(ft_lora_config_load(&cfg, adir, &err) == 0);
    /* all-linear is written out as the block's module names, as PEFT does */
    CHECK(cfg.r == 2 && cfg.alpha == 4 &&
          cfg.targets == ft_block_projections(ft_model_cfg(a)) &&
          cfg.targets == (FT_LORA_ALL_LINEAR & ~((1u << FT_PROJ_QKV) | (1u << FT_PROJ_GATE_UP) |
                                                 (1u << FT_PROJ_SHGATE))));
    ft_model_free(a);
    ft_model_free(b);
}

static void expect_load_error(const char *dir, const char *needle)
{
    ft_model_options opt = {.mode = FT_TRAIN_FULL};
    ft_model *m = NULL;
    ft_err err = {0};
    CHECK(ft_model_load(&m, dir, &opt, &err) != 0);
    CHECK(m == NULL);
    if (!strstr(err.msg, needle)) {
        fprintf(stderr, "  message '%s' lacks '%s'\n", err.msg, needle);
        CHECK(0);
    }
}

static void test_load_errors(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/missing", root);
    write_model(dir, 0, "model.layers.1.mlp.up_proj.weight", NULL, NULL);
    expect_load_error(dir, "model.layers.1.mlp.up_proj.weight");
    snprintf(dir, sizeof dir, "%s/extra", root);
    write_model(dir, 0, NULL, "model.layers.0.self_attn.q_norm.weight", NULL);
    expect_load_error(dir, "model.layers.0.self_attn.q_norm.weight");
    snprintf(dir, sizeof dir, "%s/shape", root);
    write_model(dir, 0, NULL, NULL, "model.layers.0.self_attn.k_proj.weight");
    expect_load_error(dir, "model.layers.0.self_attn.k_proj.weight");
    snprintf(dir, sizeof dir, "%s/nothing", root);
    ft_err err;
    CHECK(ft_mkdir_p(dir, &err) == 0);
    expect_load_error(dir, "config.json");
}

/* Rewrites the safetensors file `file` with tensor `name` stored as dtype `as` (F32, BF16
 * or F16) and its element `elem` set to v; the other tensors are kept as they are. */
static void poison(const char *file, const char *name, ft_st_dtype as, size_t elem, float v)
{
    ft_st_file *f = NULL;
    ft_err err = {0};
    CHECK(ft_st_open(&f, file, &err) == 0);
    if (!f)
        return;
    ft_st_writer *w = ft_st_writer_new();
    void *buf = NULL;
    for (size_t i = 0; i < ft_st_count(f); i++) {
        const ft_st_tensor *t = ft_st_at(f, i);
        if (strcmp(t->name, name) != 0) {
            CHECK(ft_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err) == 0);
            continue;
        }
        float *vals = malloc(t->numel * sizeof *vals);
        CHECK(ft_st_to_f32(t, vals, t->numel, &err) == 0);
        vals[elem] = v;
        uint16_t *half = malloc(t->numel * sizeof *half);
        for (size_t j = 0; j < t->numel; j++)
            half[j] = as == FT_ST_BF16 ? ft_f32_to_bf16(vals[j]) : ft_f32_to_f16(vals[j]);
        buf = as == FT_ST_F32 ? (void *)vals : (void *)half;
        free(as == FT_ST_F32 ? (void *)half : (void *)vals);
        CHECK(ft_st_writer_add(w, t->name, as, t->ndim, t->shape, buf, &err) == 0);
    }
    CHECK(buf != NULL);
    CHECK(ft_st_writer_save(w, file, &err) == 0);
    ft_st_writer_free(w);
    free(buf);
    ft_st_close(f);
}

/* A weight holding a NaN or an infinity is an error at load naming the file, the tensor
 * and the element (ft-eval printed "loss nan" and exited 0), in every stored dtype, for
 * the base and for an adapter. */
static void test_nonfinite_weights(void)
{
    char dir[300], file[400], want[200];
    snprintf(dir, sizeof dir, "%s/nan", root);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    static const struct {
        const char *tensor;
        ft_st_dtype as;
        size_t elem;
        float v;
        const char *want;
    } cases[] = {
        {"model.layers.1.self_attn.q_proj.weight", FT_ST_F32, 3 * C + 5, NAN, "element [3, 5] is NaN"},
        {"model.layers.0.input_layernorm.weight", FT_ST_BF16, 7, INFINITY, "element [7] is inf"},
        {"model.embed_tokens.weight", FT_ST_F16, V * C - 1, -INFINITY, "element [31, 15] is -inf"},
        {"lm_head.weight", FT_ST_F16, 0, 1e6f /* past fp16's 65504: inf */, "element [0, 0] is inf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_model(dir, 0, NULL, NULL, NULL);
        poison(file, cases[i].tensor, cases[i].as, cases[i].elem, cases[i].v);
        snprintf(want, sizeof want, "tensor '%s'", cases[i].tensor);
        expect_load_error(dir, file);
        expect_load_error(dir, want);
        expect_load_error(dir, cases[i].want);
    }
    /* a finite value as large as it gets loads */
    write_model(dir, 0, NULL, NULL, NULL);
    poison(file, "model.norm.weight", FT_ST_F32, 2, 3.4e38f);
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    CHECK(m != NULL);
    ft_model_free(m);

    /* an adapter weight */
    char adir[300], afile[400];
    snprintf(adir, sizeof adir, "%s/nan-adapter", root);
    snprintf(afile, sizeof afile, "%s/adapter_model.safetensors", adir);
    m = load(dir, FT_TRAIN_LORA, 0, 0);
    ft_err err = {0};
    CHECK(m && ft_model_save_adapter(m, adir, "tiny", &err) == 0);
    const char *lb = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight";
    poison(afile, lb, FT_ST_F32, 5, NAN);
    CHECK(m && ft_model_load_adapter(m, adir, &err) == -1);
    CHECK(strstr(err.msg, afile) && strstr(err.msg, lb) && strstr(err.msg, "NaN"));
    ft_model_free(m);
}

static void test_bad_tokens(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/full", root);
    ft_model *m = load(dir, FT_TRAIN_FULL, 0, 0);
    ft_err err = {0};
    int32_t bad_ids[3] = {1, V, 2}, bad_labels[3] = {1, 2, -5};
    ft_batch b1 = {1, 3, bad_ids, NULL, NULL, NULL};
    CHECK(ft_model_forward(m, &b1, NULL, NULL, &err) != 0);
    CHECK(strstr(err.msg, "input_ids[0][1]") != NULL);
    int32_t ok_ids[3] = {1, 2, 3};
    ft_batch b2 = {1, 3, ok_ids, bad_labels, NULL, NULL};
    CHECK(ft_model_forward(m, &b2, NULL, NULL, &err) != 0);
    CHECK(strstr(err.msg, "labels[0][2]") != NULL);
    CHECK(ft_model_backward(m, 1.0f, &err) != 0);
    /* an attention_mask other than right padding of 0 / 1 */
    int32_t left[3] = {0, 1, 1}, two[3] = {1, 2, 0}, right[3] = {1, 1, 0};
    ft_batch b3 = {1, 3, ok_ids, NULL, NULL, left};
    CHECK(ft_model_forward(m, &b3, NULL, NULL, &err) != 0);
    CHECK(strstr(err.msg, "attention_mask[0][1] = 1 follows a 0") != NULL);
    b3.attention_mask = two;
    CHECK(ft_model_forward(m, &b3, NULL, NULL, &err) != 0);
    CHECK(strstr(err.msg, "attention_mask[0][1] = 2 is neither 0 nor 1") != NULL);
    b3.attention_mask = right;
    CHECK(ft_model_forward(m, &b3, NULL, NULL, &err) == 0);
    ft_model_free(m);
}

/* A quantized base (QLoRA) read through the accessors: a quantized weight reads as its
 * dequantized values (any layer, whichever the window holds), cannot be set, goes to a
 * writer dequantized; the window and its absmax temporary are the workspace; after
 * ft_model_dequantize_base the same values are dense for good and the quantized arrays
 * and the window are gone from the counts. */
static void test_quantized_base_access(void)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/qbase", root);
    tiny_model_opts to = {0};
    write_tiny_model(dir, &to);
    ft_quant_options nf4 = {FT_QUANT_NF4, 32, true};
    ft_model_options dense_opt = {.mode = FT_TRAIN_NONE};
    ft_model_options q_opt = {.mode = FT_TRAIN_NONE, .quant = nf4};
    ft_model *d = NULL, *m = NULL;
    ft_err err = {0};
    CHECK(ft_model_load(&d, dir, &dense_opt, &err) == 0);
    CHECK(ft_model_load(&m, dir, &q_opt, &err) == 0);
    if (!d || !m) {
        ft_model_free(d);
        ft_model_free(m);
        return;
    }
    ft_mem *mem = ft_model_mem(m);
    size_t ws0 = mem->live[FT_MEM_WORKSPACE], wt0 = mem->live[FT_MEM_WEIGHTS];
    size_t n = ft_model_param_count(m), n_quant = 0, quant_bytes = 0, quant_elems = 0;
    size_t unit_elems[L + 2] = {0}, absmax = 0;
    float **want = calloc(n, sizeof *want);
    /* last to first: each read materializes another layer than the window holds */
    for (size_t i = n; i-- > 0;) {
        ft_param *p = ft_model_param(m, i);
        if (!p->quantized)
            continue;
        n_quant++;
        quant_elems += p->numel;
        unit_elems[p->unit] += p->numel;
        size_t a = ft_quant_absmax_tmp(&nf4, p->shape[0], p->shape[1]);
        absmax = a > absmax ? a : absmax;
        float *dense = malloc(p->numel * sizeof *dense), *got = malloc(p->numel * sizeof *got);
        want[i] = malloc(p->numel * sizeof *want[i]);
        ft_qtensor q;
        CHECK(ft_model_param_get(d, ft_model_find_param(d, p->name), dense, &err) == 0);
        CHECK(ft_quantize(dense, p->shape[0], p->shape[1], &nf4, &q, &err) == 0);
        quant_bytes += ft_qtensor_bytes(&q);
        CHECK(ft_dequantize(&q, want[i]) == 0);
        ft_qtensor_free(&q);
        CHECK(ft_model_param_get(m, p, got, &err) == 0);
        CHECK(memcmp(got, want[i], p->numel * sizeof *got) == 0);
        CHECK(ft_model_param_set(m, p, dense, &err) == -1 && strstr(err.msg, "quantized"));
        ft_st_writer *w = ft_st_writer_new();
        CHECK(ft_model_param_to_writer(m, p, w, &err) == 0);
        ft_st_writer_free(w);
        free(dense);
        free(got);
    }
    CHECK(n_quant == 7 * L);
    size_t win = 0;
    for (int u = 0; u < L + 2; u++)
        win = unit_elems[u] > win ? unit_elems[u] : win;
    CHECK(mem->live[FT_MEM_WORKSPACE] == ws0 + 4 * (win + absmax));
    CHECK(mem->live[FT_MEM_WEIGHTS] == wt0);

    CHECK(ft_model_dequantize_base(m, &err) == 0);
    CHECK(mem->live[FT_MEM_WORKSPACE] == ws0);
    CHECK(mem->live[FT_MEM_WEIGHTS] == wt0 - quant_bytes + 4 * quant_elems);
    for (size_t i = 0; i < n; i++) {
        ft_param *p = ft_model_param(m, i);
        if (!want[i])
            continue;
        float *got = malloc(p->numel * sizeof *got);
        CHECK(!p->quantized && ft_model_param_get(m, p, got, &err) == 0);
        CHECK(memcmp(got, want[i], p->numel * sizeof *got) == 0);
        free(got);
        free(want[i]);
    }
    free(want);
    ft_batch b = {B, T, ids, labels, NULL, NULL};
    CHECK(isfinite(mean_loss(m, &b)));
    ft_model_free(d);
    ft_model_free(m);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/ft-test-model-XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_full_gradients);
    RUN(test_qwen2_bias_gradients);
    RUN(test_lora_gradients);
    RUN(test_olmo2_gradients);
    RUN(test_qwen3_gradients);
    RUN(test_ckpt_full);
    RUN(test_ckpt_lora_dropout);
    RUN(test_adapter_kinds);
    RUN(test_phi3_smollm3_gradients);
    RUN(test_grad_accumulation);
    RUN(test_packed_rows);
    RUN(test_chunked_head);
    RUN(test_loss_chunk_rows);
    RUN(test_gemma2);
    RUN(test_gemma3);
    RUN(test_adapter_round_trip);
    RUN(test_load_errors);
    RUN(test_nonfinite_weights);
    RUN(test_bad_tokens);
    RUN(test_quantized_base_access);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return check_summary("model");
}
