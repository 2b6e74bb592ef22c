/* Tests for lib/formats/hf_config.c: real-model config.json files (TinyLlama, Llama 3.1 with llama3
 * rope scaling, Qwen2.5, SmolLM, Mistral, Mistral-Nemo's explicit head_dim) are written to a
 * temporary directory and loaded; RoPE inverse frequencies are compared with torch; every
 * rejected input checks that the message names the file and the key. */
#include "formats/hf_config.h"

#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/fsutil.h"
#include "fifo_guard.h"

/* |a - b| <= rel * |b|: CHECK_CLOSE is absolute below 1, too loose for 1e-7 frequencies. */
#define CHECK_REL(a, b, rel)                                                         \
    do {                                                                             \
        double ra_ = (a), rb_ = (b);                                                 \
        if (!(fabs(ra_ - rb_) <= (rel) * fabs(rb_))) {                               \
            fprintf(stderr, "  %s:%d: CHECK_REL failed: %s = %.9g, %s = %.9g\n",     \
                    __FILE__, __LINE__, #a, ra_, #b, rb_);                           \
            check_current_failed = 1;                                                \
        }                                                                            \
    } while (0)

static char tmp_dir[64];
static char cfg_path[128];

/* Writes json to <tmp_dir>/config.json and returns that path. */
static const char *write_config(const char *json)
{
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", tmp_dir);
    FILE *f = fopen(cfg_path, "w");
    if (!f) {
        perror(cfg_path);
        exit(2);
    }
    fputs(json, f);
    fclose(f);
    return cfg_path;
}

static int load(const char *json, ft_model_config *cfg, ft_err *err)
{
    return ft_model_config_load(cfg, write_config(json), err);
}

/* Loading must fail with a message naming the file and containing `key`. */
#define EXPECT_ERROR(json, key)                                                      \
    do {                                                                             \
        ft_model_config c_;                                                          \
        ft_err e_ = {0};                                                           \
        CHECK(load(json, &c_, &e_) == -1);                                           \
        CHECK(strstr(e_.msg, cfg_path) != NULL);                                     \
        CHECK(strstr(e_.msg, key) != NULL);                                          \
        if (strstr(e_.msg, key) == NULL)                                             \
            fprintf(stderr, "  message was: %s\n", e_.msg);                          \
    } while (0)

/* TinyLlama/TinyLlama-1.1B-Chat-v1.0 */
static const char *TINYLLAMA =
    "{\n"
    "  \"architectures\": [\"LlamaForCausalLM\"],\n"
    "  \"attention_bias\": false,\n"
    "  \"bos_token_id\": 1,\n"
    "  \"eos_token_id\": 2,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"hidden_size\": 2048,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"intermediate_size\": 5632,\n"
    "  \"max_position_embeddings\": 2048,\n"
    "  \"model_type\": \"llama\",\n"
    "  \"num_attention_heads\": 32,\n"
    "  \"num_hidden_layers\": 22,\n"
    "  \"num_key_value_heads\": 4,\n"
    "  \"pretraining_tp\": 1,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"rope_scaling\": null,\n"
    "  \"rope_theta\": 10000.0,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"torch_dtype\": \"bfloat16\",\n"
    "  \"transformers_version\": \"4.35.0\",\n"
    "  \"use_cache\": true,\n"
    "  \"vocab_size\": 32000\n"
    "}\n";

/* The fields every llama-shaped error case shares. */
#define REQ                                                                          \
    "\"vocab_size\": 1000, \"hidden_size\": 256, \"intermediate_size\": 512, "      \
    "\"num_hidden_layers\": 2, \"num_attention_heads\": 8"

/* meta-llama/Llama-3.1-8B; the rope dict is spliced in so the same model can be written
 * the transformers-4 way (rope_scaling) and the transformers-5 way (rope_parameters). */
#define LLAMA31(rope)                                                                \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"        \
    " \"attention_dropout\": 0.0, \"bos_token_id\": 128000,"                         \
    " \"eos_token_id\": [128001, 128008, 128009], \"hidden_act\": \"silu\","         \
    " \"hidden_size\": 4096, \"intermediate_size\": 14336,"                          \
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false,"                     \
    " \"model_type\": \"llama\", \"num_attention_heads\": 32,"                       \
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"pretraining_tp\": 1," \
    " \"rms_norm_eps\": 1e-05, " rope ", \"tie_word_embeddings\": false,"           \
    " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 128256}"

static void test_tinyllama(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load(TINYLLAMA, &c, &e) == 0);
    CHECK(strcmp(c.model_type, "llama") == 0);
    CHECK(c.vocab_size == 32000 && c.hidden_size == 2048 && c.intermediate_size == 5632);
    CHECK(c.num_layers == 22 && c.num_heads == 32 && c.num_kv_heads == 4);
    CHECK(c.head_dim == 64);
    CHECK(c.max_position_embeddings == 2048);
    CHECK(c.rms_norm_eps == 1e-5f);
    CHECK(c.rope_theta == 10000.0 && c.rope_kind == FT_ROPE_DEFAULT);
    CHECK(!c.tie_word_embeddings && !c.qkv_bias && !c.o_bias && !c.mlp_bias);
    CHECK(c.sliding_window == 0);
    CHECK(c.bos_token_id == 1 && c.n_eos == 1 && c.eos_token_ids[0] == 2);
    CHECK(c.pad_token_id == -1);
    CHECK(strcmp(c.torch_dtype, "bfloat16") == 0);

    /* transformers' _compute_default_rope_parameters on torch 1.13 (tests' reference
     * script: the same tensor ops), theta 10000, d 64, at i = 0, 1, 5, 17, 31. */
    float inv[32];
    ft_rope_inv_freq(&c, inv);
    CHECK(inv[0] == 1.0f);
    CHECK_REL(inv[1], 0.7498942017555237, 1e-6);
    CHECK_REL(inv[5], 0.23713736236095428, 1e-6);
    CHECK_REL(inv[17], 0.007498942315578461, 1e-6);
    CHECK_REL(inv[31], 0.0001333521504420787, 1e-6);
}

/* torch 1.13 run of transformers' _compute_llama3_parameters (the function transcribed
 * op for op): theta 500000, d 128, factor 8, low 1, high 4, original 8192. Indices 29..34
 * are the blended band (wavelength between 2048 and 8192); from 35 on, divided by 8. */
/* A reference RoPE frequency: inv_freq[i] == v (to 1e-6) */
typedef struct inv_ref {
    int i;
    double v;
} inv_ref;

/* c's frequencies against the n references of ref */
static void check_inv_freq(const ft_model_config *c, const inv_ref *ref, size_t n)
{
    float inv[FT_MAX_ROPE_FREQS];
    CHECK(c->rotary_dim / 2 <= FT_MAX_ROPE_FREQS);
    ft_rope_inv_freq(c, inv);
    for (size_t k = 0; k < n; k++)
        CHECK_REL(inv[ref[k].i], ref[k].v, 1e-6);
}

static const inv_ref LLAMA31_INV[] = {
    {0, 1.0},
    {1, 0.8146172165870667},
    {20, 0.016560440883040428},
    {28, 0.0032114461064338684},
    {29, 0.0021665706299245358},
    {30, 0.0013718936825171113},
    {31, 0.0008567514596506953},
    {32, 0.0005248460220173001},
    {33, 0.0003126936499029398},
    {34, 0.0001785077911335975},
    {35, 9.556212171446532e-05},
    {50, 4.411534519022098e-06},
    {63, 3.068925877869333e-07},
};

static void check_llama31_inv_freq(const ft_model_config *c)
{
    check_inv_freq(c, LLAMA31_INV, sizeof LLAMA31_INV / sizeof LLAMA31_INV[0]);
}

static void test_llama31(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load(LLAMA31("\"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
                       " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
                       " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0"),
               &c, &e) == 0);
    CHECK(c.num_heads == 32 && c.num_kv_heads == 8 && c.head_dim == 128);
    CHECK(c.max_position_embeddings == 131072 && c.vocab_size == 128256);
    CHECK(c.rope_kind == FT_ROPE_LLAMA3 && c.rope_theta == 500000.0);
    CHECK(c.rope_factor == 8.0f && c.rope_low_freq_factor == 1.0f);
    CHECK(c.rope_high_freq_factor == 4.0f && c.rope_original_max_position == 8192);
    CHECK(c.bos_token_id == 128000 && c.n_eos == 3);
    CHECK(c.eos_token_ids[0] == 128001 && c.eos_token_ids[1] == 128008 &&
          c.eos_token_ids[2] == 128009);
    check_llama31_inv_freq(&c);

    /* The legacy "type" key, and integers where floats are usual. */
    CHECK(load(LLAMA31("\"rope_scaling\": {\"factor\": 8, \"low_freq_factor\": 1,"
                       " \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192,"
                       " \"type\": \"llama3\"}, \"rope_theta\": 500000"),
               &c, &e) == 0);
    check_llama31_inv_freq(&c);

    /* transformers 5: rope_parameters carries the theta, which wins over a top-level one. */
    CHECK(load(LLAMA31("\"rope_parameters\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
                       " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
                       " \"rope_type\": \"llama3\", \"rope_theta\": 500000.0},"
                       " \"rope_theta\": 10000.0"),
               &c, &e) == 0);
    CHECK(c.rope_kind == FT_ROPE_LLAMA3 && c.rope_theta == 500000.0);
    check_llama31_inv_freq(&c);
}

/* transformers 5.24's _compute_yarn_parameters (torch 2.15) on Llama 3.1's shape (theta
 * 500000, d 128) with YaRN factor 4 over 32768 original positions. Defaults (beta 32 / 1,
 * truncated): dims up to 16 keep their frequency, from 26 on divided by 4, a ramp
 * between; attention factor 0.1 ln 4 + 1. */
static const inv_ref YARN_INV[] = {
    {0, 1.0},
    {1, 0.8146172165870667},
    {10, 0.12868738174438477},
    {15, 0.046164050698280334},
    {16, 0.03760603070259094},
    {17, 0.030634520575404167},
    {20, 0.016560440883040428},
    {24, 0.00729266507551074},
    {25, 0.005693200044333935},
    {26, 0.004436136223375797},
    {40, 9.141606278717518e-05},
    {63, 6.137851755738666e-07},
};

/* The same, untruncated, beta_fast 16, beta_slow 2, mscale 1 / mscale_all_dim 0.707: the
 * ramp runs between fractional dims (24.4 .. 38.4). */
static const inv_ref YARN_INV_MSCALE[] = {
    {0, 1.0},
    {24, 0.00729266507551074},
    {25, 0.005940730683505535},
    {29, 0.002465762896463275},
    {33, 0.0007450587581843138},
    {38, 0.00011446460121078417},
    {39, 8.416473428951576e-05},
    {63, 6.137851755738666e-07},
};

#define YARN(extra)                                                                       \
    LLAMA31("\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 500000.0," extra \
            " \"original_max_position_embeddings\": 32768}")

static void test_yarn(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load(YARN(" \"factor\": 4.0,"), &c, &e) == 0);
    CHECK(c.rope_kind == FT_ROPE_YARN && c.rope_factor == 4.0f);
    CHECK(c.rope_original_max_position == 32768);
    CHECK(c.rope_attention_factor == (float)1.138629436111989);
    check_inv_freq(&c, YARN_INV, sizeof YARN_INV / sizeof YARN_INV[0]);

    CHECK(load(YARN(" \"factor\": 4, \"truncate\": false, \"beta_fast\": 16, \"beta_slow\": 2,"
                    " \"mscale\": 1.0, \"mscale_all_dim\": 0.707,"),
               &c, &e) == 0);
    CHECK(c.rope_attention_factor == (float)1.036992729910394);
    check_inv_freq(&c, YARN_INV_MSCALE, sizeof YARN_INV_MSCALE / sizeof YARN_INV_MSCALE[0]);

    /* factor null: max_position_embeddings / original (131072 / 32768); an explicit
     * attention_factor; beta 0 reads as the default (`or 32`); the legacy rope_scaling
     * spelling with "type" */
    CHECK(load(YARN(" \"factor\": null, \"attention_factor\": 1.25, \"beta_fast\": 0,"), &c,
               &e) == 0);
    CHECK(c.rope_factor == 4.0f && c.rope_attention_factor == 1.25f);
    check_inv_freq(&c, YARN_INV, sizeof YARN_INV / sizeof YARN_INV[0]); /* the same YaRN */
    CHECK(load(LLAMA31("\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0,"
                       " \"original_max_position_embeddings\": 32768}, \"rope_theta\": 500000.0"),
               &c, &e) == 0);
    CHECK(c.rope_kind == FT_ROPE_YARN);
    check_inv_freq(&c, YARN_INV, sizeof YARN_INV / sizeof YARN_INV[0]); /* the same YaRN */

    /* a top-level original_max_position_embeddings wins over the dict's
     * (standardize_rope_params); without either, max_position_embeddings (factor 1: no
     * scaling, attention factor 1) */
    CHECK(load(LLAMA31("\"original_max_position_embeddings\": 8192, \"rope_parameters\":"
                       " {\"rope_type\": \"yarn\", \"rope_theta\": 500000.0, \"factor\": 4.0,"
                       " \"original_max_position_embeddings\": 32768}"),
               &c, &e) == 0);
    CHECK(c.rope_original_max_position == 8192);
    CHECK(load(LLAMA31("\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 500000.0,"
                       " \"factor\": null}"),
               &c, &e) == 0);
    CHECK(c.rope_original_max_position == 131072 && c.rope_factor == 1.0f);
    CHECK(c.rope_attention_factor == 1.0f);

    EXPECT_ERROR(YARN(""), "rope_parameters.factor' is required for rope type 'yarn'");
    EXPECT_ERROR(YARN(" \"factor\": 4.0, \"beta_fast\": -3,"), "rope_parameters.beta_fast");
    EXPECT_ERROR(YARN(" \"factor\": 4.0, \"truncate\": 1,"), "rope_parameters.truncate");
    EXPECT_ERROR(YARN(" \"factor\": \"4\","), "rope_parameters.factor");
    EXPECT_ERROR(LLAMA31("\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1,"
                         " \"factor\": 4.0}"),
                 "rope_theta > 1");
}

static void test_linear_rope(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"model_type\": \"llama\", \"vocab_size\": 32000, \"hidden_size\": 1024,"
               " \"intermediate_size\": 2048, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 8, \"rope_scaling\": {\"type\": \"linear\","
               " \"factor\": 4.0}}",
               &c, &e) == 0);
    CHECK(c.rope_kind == FT_ROPE_LINEAR && c.rope_factor == 4.0f && c.head_dim == 128);
    /* torch 1.13: default inv_freq (theta 10000, d 128) / 4.0, at i = 0, 7, 63. */
    float inv[64];
    ft_rope_inv_freq(&c, inv);
    CHECK(inv[0] == 0.25f);
    CHECK_REL(inv[7], 0.09129353612661362, 1e-6);
    CHECK_REL(inv[63], 2.8869548259535804e-05, 1e-6);
}

/* Qwen/Qwen2.5-0.5B */
static void test_qwen2(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0,"
               " \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"hidden_act\": \"silu\","
               " \"hidden_size\": 896, \"initializer_range\": 0.02, \"intermediate_size\": 4864,"
               " \"max_position_embeddings\": 32768, \"max_window_layers\": 24,"
               " \"model_type\": \"qwen2\", \"num_attention_heads\": 14,"
               " \"num_hidden_layers\": 24, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06,"
               " \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
               " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
               " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "qwen2") == 0);
    CHECK(c.num_heads == 14 && c.num_kv_heads == 2 && c.head_dim == 64);
    CHECK(c.qkv_bias && !c.o_bias && !c.mlp_bias);
    CHECK(c.tie_word_embeddings);
    CHECK(c.sliding_window == 0);
    CHECK(c.rms_norm_eps == 1e-6f && c.rope_theta == 1e6);
    /* torch 1.13, theta 1e6, d 64, at i = 1, 10, 31. */
    float inv[32];
    ft_rope_inv_freq(&c, inv);
    CHECK_REL(inv[1], 0.6493816375732422, 1e-6);
    CHECK_REL(inv[10], 0.01333521492779255, 1e-6);
    CHECK_REL(inv[31], 1.5399265294036013e-06, 1e-6);

    /* transformers 5 writes layer_types; all full attention is fine. */
    CHECK(load("{\"model_type\": \"qwen2\", " REQ ", \"num_key_value_heads\": 2,"
               " \"layer_types\": [\"full_attention\", \"full_attention\"]}",
               &c, &e) == 0);
    CHECK(c.max_position_embeddings == 32768);
}

/* HuggingFaceTB/SmolLM-135M */
static void test_smollm(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false,"
               " \"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 0,"
               " \"hidden_act\": \"silu\", \"hidden_size\": 576, \"initializer_range\": 0.02,"
               " \"intermediate_size\": 1536, \"max_position_embeddings\": 2048,"
               " \"model_type\": \"llama\", \"num_attention_heads\": 9,"
               " \"num_hidden_layers\": 30, \"num_key_value_heads\": 3, \"pretraining_tp\": 1,"
               " \"rms_norm_eps\": 1e-05, \"rope_scaling\": null, \"rope_theta\": 10000.0,"
               " \"tie_word_embeddings\": true, \"torch_dtype\": \"float32\","
               " \"use_cache\": true, \"vocab_size\": 49152}",
               &c, &e) == 0);
    CHECK(c.head_dim == 64 && c.num_heads == 9 && c.num_kv_heads == 3);
    CHECK(c.tie_word_embeddings);
    CHECK(c.bos_token_id == 0 && c.n_eos == 1 && c.eos_token_ids[0] == 0);
    CHECK(strcmp(c.torch_dtype, "float32") == 0);
}

/* mistralai/Mistral-7B-v0.1, then the same with the window switched off / left out. */
#define MISTRAL(extra)                                                               \
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1,"            \
    " \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"         \
    " \"initializer_range\": 0.02, \"intermediate_size\": 14336,"                    \
    " \"max_position_embeddings\": 32768, \"model_type\": \"mistral\","              \
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"rms_norm_eps\": 1e-05," \
    " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"                      \
    " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 32000" extra "}"

static void test_mistral(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load(MISTRAL(", \"num_key_value_heads\": 8, \"sliding_window\": 4096"), &c, &e) == 0);
    CHECK(strcmp(c.model_type, "mistral") == 0);
    CHECK(c.sliding_window == 4096 && c.num_kv_heads == 8 && c.head_dim == 128);
    CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias);

    CHECK(load(MISTRAL(", \"num_key_value_heads\": 8, \"sliding_window\": null"), &c, &e) == 0);
    CHECK(c.sliding_window == 0);

    /* MistralConfig defaults when absent: 8 kv heads, a 4096 window, 4096 * 32 positions.
     * An explicit null kv count means num_attention_heads. */
    CHECK(load("{\"model_type\": \"mistral\", " REQ "}", &c, &e) == 0);
    CHECK(c.num_kv_heads == 8 && c.sliding_window == 4096);
    CHECK(c.max_position_embeddings == 131072);
    CHECK(load("{\"model_type\": \"mistral\", " REQ ", \"num_key_value_heads\": null}", &c, &e) ==
          0);
    CHECK(c.num_kv_heads == 8);
    CHECK(load("{\"model_type\": \"mistral\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": null}",
               &c, &e) == 0);
    CHECK(c.num_kv_heads == 4);
}

/* mistralai/Mistral-Nemo-Base-2407: head_dim 128 although hidden / heads = 160. */
static void test_explicit_head_dim(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"MistralForCausalLM\"], \"attention_dropout\": 0.0,"
               " \"bos_token_id\": 1, \"eos_token_id\": 2, \"head_dim\": 128,"
               " \"hidden_act\": \"silu\", \"hidden_size\": 5120, \"initializer_range\": 0.02,"
               " \"intermediate_size\": 14336, \"max_position_embeddings\": 1024000,"
               " \"model_type\": \"mistral\", \"num_attention_heads\": 32,"
               " \"num_hidden_layers\": 40, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
               " \"rope_theta\": 1000000.0, \"sliding_window\": null,"
               " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
               " \"use_cache\": true, \"vocab_size\": 131072}",
               &c, &e) == 0);
    CHECK(c.head_dim == 128 && c.hidden_size == 5120 && c.num_heads == 32);
    CHECK(c.sliding_window == 0 && c.max_position_embeddings == 1024000);

    /* head_dim may be explicit even when hidden_size does not divide by heads. */
    CHECK(load("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 250,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 8, \"head_dim\": 32}",
               &c, &e) == 0);
    CHECK(c.head_dim == 32);
}

/* The embedding's padding_idx (no gradient for that row): config.json's pad_token_id, or
 * when the key is absent the default of the family's config class, as transformers builds
 * nn.Embedding(..., padding_idx=config.pad_token_id); none for null or a default outside
 * the vocabulary (transformers could not build that embedding). */
static void test_embed_padding_idx(void)
{
    static const struct {
        const char *type, *pad; /* pad: the key's JSON text, NULL: absent */
        int vocab, want;
    } cases[] = {
        {"llama", NULL, 1000, -1},     {"llama", "7", 1000, 7},      {"llama", "null", 1000, -1},
        {"gemma", NULL, 1000, 0},      {"gemma", "null", 1000, -1},  {"gemma2", NULL, 1000, 0},
        {"gemma3_text", NULL, 1000, 0}, {"olmo2", NULL, 1000, 1},     {"olmo2", "3", 1000, 3},
        {"phi3", NULL, 1000, -1},      {"phi3", NULL, 32064, 32000}, {"smollm3", NULL, 1000, -1},
        {"smollm3", NULL, 128256, 128004}, {"granite", NULL, 1000, -1}, {"mistral", NULL, 1000, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"model_type\": \"%s\", \"vocab_size\": %d, \"hidden_size\": 256,"
                 " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 8, \"num_key_value_heads\": 8%s%s}",
                 cases[i].type, cases[i].vocab, cases[i].pad ? ", \"pad_token_id\": " : "",
                 cases[i].pad ? cases[i].pad : "");
        ft_model_config c;
        ft_err e = {0};
        CHECK(load(json, &c, &e) == 0);
        if (c.embed_padding_idx != cases[i].want)
            fprintf(stderr, "  %s pad %s vocab %d: padding_idx %d, want %d (%s)\n",
                    cases[i].type, cases[i].pad ? cases[i].pad : "absent", cases[i].vocab,
                    c.embed_padding_idx, cases[i].want, e.msg);
        CHECK(c.embed_padding_idx == cases[i].want);
    }
}

static void test_llama_defaults_and_bias(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"model_type\": \"llama\", " REQ "}", &c, &e) == 0);
    CHECK(c.num_kv_heads == 8 && c.head_dim == 32);
    CHECK(c.max_position_embeddings == 2048 && c.rms_norm_eps == 1e-6f);
    CHECK(c.rope_theta == 10000.0 && c.rope_kind == FT_ROPE_DEFAULT);
    CHECK(!c.tie_word_embeddings && c.sliding_window == 0);
    CHECK(c.bos_token_id == -1 && c.n_eos == 0 && c.pad_token_id == -1);
    CHECK(c.torch_dtype[0] == '\0');

    CHECK(load("{\"model_type\": \"llama\", " REQ ", \"attention_bias\": true,"
               " \"mlp_bias\": true, \"hidden_act\": \"swish\", \"dtype\": \"float16\","
               " \"bos_token_id\": null, \"eos_token_id\": null, \"pad_token_id\": 0,"
               " \"partial_rotary_factor\": 1.0, \"attn_logit_softcapping\": null,"
               " \"rope_scaling\": {\"rope_type\": \"default\"}}",
               &c, &e) == 0);
    CHECK(c.qkv_bias && c.o_bias && c.mlp_bias);
    CHECK(strcmp(c.torch_dtype, "float16") == 0);
    CHECK(c.bos_token_id == -1 && c.n_eos == 0 && c.pad_token_id == 0);
    CHECK(c.rope_kind == FT_ROPE_DEFAULT);

    /* a bitsandbytes checkpoint: the quantized weights are quant_io's business */
    CHECK(load("{\"model_type\": \"llama\", " REQ ", \"quantization_config\": "
               "{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}}",
               &c, &e) == 0);
}

/* ibm-granite/granite-3.0-2b-instruct's multipliers; the llama rules otherwise. */
static void test_granite(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"model_type\": \"granite\", \"architectures\": [\"GraniteForCausalLM\"], "
               REQ ", \"num_key_value_heads\": 2, \"attention_multiplier\": 0.015625,"
               " \"embedding_multiplier\": 12.0, \"residual_multiplier\": 0.22,"
               " \"logits_scaling\": 8.0, \"tie_word_embeddings\": true,"
               " \"attention_bias\": false, \"mlp_bias\": false, \"hidden_act\": \"silu\"}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "granite") == 0 && c.head_dim == 32 && c.num_kv_heads == 2);
    CHECK(c.attention_scale == 0.015625f && c.embed_scale == 12.0 && !c.embed_scale_round);
    CHECK(c.residual_scale == 0.22f && c.logits_scale == 8.0f);
    CHECK(c.norm_w_offset == 0.0f && c.mlp_act == FT_ACT_SILU && c.tie_word_embeddings);
    /* absent multipliers are 1, the attention scale 1/sqrt(head_dim) */
    CHECK(load("{\"model_type\": \"granite\", " REQ "}", &c, &e) == 0);
    CHECK(c.attention_scale == 1.0f && c.embed_scale == 1.0 && c.residual_scale == 1.0f &&
          c.logits_scale == 1.0f);
    CHECK(load("{\"model_type\": \"llama\", " REQ "}", &c, &e) == 0);
    CHECK(c.attention_scale == 1.0f / sqrtf(32.0f) && c.logits_scale == 1.0f);
    EXPECT_ERROR("{\"model_type\": \"granite\", " REQ ", \"logits_scaling\": 0}",
                 "logits_scaling");
    EXPECT_ERROR("{\"model_type\": \"granite\", " REQ ", \"residual_multiplier\": \"x\"}",
                 "residual_multiplier");
    EXPECT_ERROR("{\"model_type\": \"granite\", " REQ ", \"head_dim\": 64}", "head_dim");
    EXPECT_ERROR("{\"model_type\": \"granite\", " REQ ", \"hidden_act\": \"gelu\"}",
                 "hidden_act");
    EXPECT_ERROR("{\"model_type\": \"granite\", " REQ ", \"num_local_experts\": 8}",
                 "num_local_experts");
    /* granite's keys stay foreign to the other families */
    EXPECT_ERROR("{\"model_type\": \"mistral\", " REQ ", \"logits_scaling\": 8.0}",
                 "logits_scaling");
}

/* google/gemma-2b's config.json */
static void test_gemma(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"GemmaForCausalLM\"], \"attention_bias\": false,"
               " \"attention_dropout\": 0.0, \"bos_token_id\": 2, \"eos_token_id\": 1,"
               " \"head_dim\": 256, \"hidden_act\": \"gelu\","
               " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 2048,"
               " \"initializer_range\": 0.02, \"intermediate_size\": 16384,"
               " \"max_position_embeddings\": 8192, \"model_type\": \"gemma\","
               " \"num_attention_heads\": 8, \"num_hidden_layers\": 18,"
               " \"num_key_value_heads\": 1, \"pad_token_id\": 0, \"rms_norm_eps\": 1e-06,"
               " \"rope_scaling\": null, \"rope_theta\": 10000.0, \"torch_dtype\": \"bfloat16\","
               " \"use_cache\": true, \"vocab_size\": 256000}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "gemma") == 0 && c.head_dim == 256 && c.num_kv_heads == 1);
    CHECK(c.mlp_act == FT_ACT_GELU_TANH && c.norm_w_offset == 1.0f);
    CHECK(c.tie_word_embeddings && c.embed_scale_round);
    CHECK(fabs(c.embed_scale - sqrt(2048.0)) < 1e-12);
    CHECK(c.attention_scale == 1.0f / sqrtf(256.0f) && c.logits_scale == 1.0f);
    CHECK(!c.qkv_bias && !c.mlp_bias && c.max_position_embeddings == 8192);
    /* GemmaConfig's defaults: head_dim 256, 16 kv heads, tied */
    CHECK(load("{\"model_type\": \"gemma\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 16}", &c, &e) == 0);
    CHECK(c.head_dim == 256 && c.num_kv_heads == 16 && c.tie_word_embeddings);
    CHECK(c.mlp_act == FT_ACT_GELU_TANH);
    /* the activation: hidden_activation wins; hidden_act only when that is null */
    EXPECT_ERROR("{\"model_type\": \"gemma\", " REQ ", \"num_key_value_heads\": 8,"
                 " \"hidden_activation\": \"gelu\"}", "hidden_activation");
    EXPECT_ERROR("{\"model_type\": \"gemma\", " REQ ", \"num_key_value_heads\": 8,"
                 " \"hidden_act\": \"gelu\"}", "hidden_act");
    EXPECT_ERROR("{\"model_type\": \"gemma\", " REQ ", \"num_key_value_heads\": 8,"
                 " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}",
                 "rope_scaling");
    EXPECT_ERROR("{\"model_type\": \"gemma\", " REQ ", \"num_key_value_heads\": 8,"
                 " \"mlp_bias\": true}", "mlp_bias");
    /* Gemma 2's keys are refused by gemma */
    EXPECT_ERROR("{\"model_type\": \"gemma\", " REQ ", \"num_key_value_heads\": 8,"
                 " \"final_logit_softcapping\": 30.0}", "final_logit_softcapping");
    EXPECT_ERROR("{\"model_type\": \"gemma\", " REQ ", \"num_key_value_heads\": 8,"
                 " \"attention_multiplier\": 0.1}", "attention_multiplier");
}

/* A Phi-3.5 / Phi-4-mini-like config: fused projections, partial rotary 0.75 (head_dim 64:
 * rotary_dim 48, 24 factors), longrope with the attention factor from 131072 / 4096;
 * frequencies from transformers 5.24 (_compute_longrope_parameters; short: seq_len
 * None, long: 4097). Then what phi3 refuses. */
/* 16 factors: rotary_dim / 2 for REQ's head_dim 32 */
#define F16_1 "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1"
#define F16_2 "2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2"

static void test_phi3(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"model_type\": \"phi3\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
               " \"max_position_embeddings\": 131072,"
               " \"original_max_position_embeddings\": 4096, \"partial_rotary_factor\": 0.75,"
               " \"resid_pdrop\": 0.0, \"embd_pdrop\": 0.0, \"sliding_window\": 262144,"
               " \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": "
               "[1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5, 1.55, 1.6, 1.65, 1.7, 1.75, 1.8, 1.85, 1.9, 1.95, 2.0, 2.05, 2.1, 2.15],"
               " \"long_factor\": "
               "[1.0, 1.9, 2.8, 3.7, 4.6, 5.5, 6.4, 7.3, 8.2, 9.1, 10.0, 10.9, 11.8, 12.7, 13.6, 14.5, 15.4, 16.3, 17.2, 18.1, 19.0, 19.9, 20.8, 21.7]}}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "phi3") == 0 && c.fused_proj);
    CHECK(c.head_dim == 64 && c.rotary_dim == 48 && c.rope_kind == FT_ROPE_LONGROPE);
    CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.tie_word_embeddings);
    CHECK(c.rms_norm_eps == 1e-5f); /* Phi3Config's default */
    CHECK(c.sliding_window == 262144 && c.rope_original_max_position == 4096);
    CHECK(c.rope_attention_factor == (float)1.1902380714238083);
    float s[24], l[24];
    ft_rope_inv_freq(&c, s);
    ft_rope_inv_freq_long(&c, l);
    CHECK(s[0] == 1.0f && l[0] == 1.0f);
    CHECK_REL(s[5], 0.11742394417524338, 1e-6);
    CHECK_REL(l[5], 0.02668726071715355, 1e-6);
    CHECK_REL(s[23], 6.826974276918918e-05, 1e-6);
    CHECK_REL(l[23], 6.764052614016691e-06, 1e-6);
    /* transformers' dynamic update: long once max(position_ids) + 1 > 4096 */
    CHECK(!ft_rope_uses_long(&c, 4095) && ft_rope_uses_long(&c, 4096));
    CHECK(ft_block_projections(&c) == ((1u << FT_PROJ_QKV) | (1u << FT_PROJ_O) |
                                       (1u << FT_PROJ_GATE_UP) | (1u << FT_PROJ_DOWN)));
    int in, out, row0;
    ft_proj_dims(&c, FT_PROJ_QKV, &in, &out);
    CHECK(in == 256 && out == 4 * 64 + 2 * 2 * 64);
    CHECK(ft_proj_module(&c, FT_PROJ_V, &row0) == FT_PROJ_QKV && row0 == 4 * 64 + 2 * 64);
    CHECK(ft_proj_module(&c, FT_PROJ_UP, &row0) == FT_PROJ_GATE_UP && row0 == 512);

    /* plain phi3: default rope on every dim; the dict's partial_rotary_factor wins over
     * the top level (transformers' setdefault), explicit factor and attention_factor */
    CHECK(load("{\"model_type\": \"phi3\", " REQ ", \"partial_rotary_factor\": 0.5}", &c,
               &e) == 0);
    CHECK(c.rotary_dim == c.head_dim / 2 && c.rope_kind == FT_ROPE_DEFAULT);
    CHECK(c.rope_attention_factor == 1.0f && c.max_position_embeddings == 4096);
    CHECK(load("{\"model_type\": \"phi3\", " REQ ", \"partial_rotary_factor\": 0.5,"
               " \"rope_parameters\": {\"rope_type\": \"longrope\", \"partial_rotary_factor\": 1.0,"
               " \"short_factor\": [" F16_1 "], \"long_factor\": [" F16_2 "],"
               " \"factor\": 2.0, \"attention_factor\": 0.9}}", &c, &e) == 0);
    CHECK(c.rotary_dim == c.head_dim && c.rope_attention_factor == 0.9f);
    CHECK(c.rope_original_max_position == 4096); /* Phi3Config's default */

    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"resid_pdrop\": 0.1}", "resid_pdrop");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"embd_pdrop\": 0.1}", "embd_pdrop");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"attention_bias\": true}",
                 "attention_bias");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"hidden_act\": \"gelu\"}", "hidden_act");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"rope_scaling\": {\"type\": \"linear\","
                 " \"factor\": 2.0}}", "rope_scaling.type");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"rope_scaling\": {\"type\": \"longrope\","
                 " \"short_factor\": [1, 1, 1], \"long_factor\": [2, 2, 2, 2]}}",
                 "rope_scaling.short_factor");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"rope_scaling\": {\"type\": \"su\","
                 " \"short_factor\": [" F16_1 "]}}", "rope_scaling.long_factor");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"partial_rotary_factor\": 0.3}",
                 "partial_rotary_factor");
    EXPECT_ERROR("{\"model_type\": \"phi3\", " REQ ", \"partial_rotary_factor\": 1.5}",
                 "partial_rotary_factor");
    /* other families: partial rotary stays refused */
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"partial_rotary_factor\": 0.5}",
                 "partial_rotary_factor");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_scaling\": {\"type\": \"longrope\","
                 " \"short_factor\": [1], \"long_factor\": [1]}}", "rope_scaling.type");
}

/* SmolLM3 (HuggingFaceTB/SmolLM3-3B's keys, fewer layers): the per-layer RoPE list, the
 * interval rule when it is absent or null, SmolLM3Config's defaults; what it refuses. */
static void test_smollm3(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"SmolLM3ForCausalLM\"], \"model_type\": \"smollm3\","
               " \"vocab_size\": 128256, \"hidden_size\": 2048, \"intermediate_size\": 11008,"
               " \"num_hidden_layers\": 4, \"num_attention_heads\": 16,"
               " \"num_key_value_heads\": 4, \"no_rope_layers\": [1, 1, 1, 0],"
               " \"no_rope_layer_interval\": 4, \"rope_theta\": 5000000.0,"
               " \"use_sliding_window\": false, \"sliding_window\": null,"
               " \"layer_types\": [\"full_attention\", \"full_attention\", \"full_attention\","
               " \"full_attention\"], \"attention_bias\": false, \"mlp_bias\": false,"
               " \"max_position_embeddings\": 65536, \"rms_norm_eps\": 1e-06,"
               " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\"}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "smollm3") == 0 && !c.fused_proj && c.tie_word_embeddings);
    CHECK(c.head_dim == 128 && c.rotary_dim == 128 && c.num_kv_heads == 4);
    CHECK(ft_layer_uses_rope(&c, 0) && ft_layer_uses_rope(&c, 2) && !ft_layer_uses_rope(&c, 3));
    /* absent (or null): every interval-th layer is NoPE; defaults of SmolLM3Config */
    CHECK(load("{\"model_type\": \"smollm3\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 8,"
               " \"num_attention_heads\": 8}", &c, &e) == 0);
    for (int l = 0; l < 8; l++)
        CHECK(ft_layer_uses_rope(&c, l) == (l != 3 && l != 7));
    CHECK(c.num_kv_heads == 4 && c.tie_word_embeddings && c.max_position_embeddings == 32768);
    CHECK(load("{\"model_type\": \"smollm3\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 5,"
               " \"num_attention_heads\": 8, \"no_rope_layers\": null,"
               " \"no_rope_layer_interval\": 2}", &c, &e) == 0);
    for (int l = 0; l < 5; l++)
        CHECK(ft_layer_uses_rope(&c, l) == (l % 2 == 0));
    /* other families rotate every layer */
    CHECK(load("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 8,"
               " \"num_attention_heads\": 8}", &c, &e) == 0);
    CHECK(ft_layer_uses_rope(&c, 3) && ft_layer_uses_rope(&c, 7));

    EXPECT_ERROR("{\"model_type\": \"smollm3\", " REQ ", \"no_rope_layers\": [1]}",
                 "no_rope_layers");
    EXPECT_ERROR("{\"model_type\": \"smollm3\", " REQ ", \"no_rope_layers\": [1, 2]}",
                 "no_rope_layers[1]");
    EXPECT_ERROR("{\"model_type\": \"smollm3\", " REQ ", \"no_rope_layer_interval\": 0}",
                 "no_rope_layer_interval");
    EXPECT_ERROR("{\"model_type\": \"smollm3\", " REQ ", \"use_sliding_window\": true,"
                 " \"sliding_window\": 4096}", "use_sliding_window");
    EXPECT_ERROR("{\"model_type\": \"smollm3\", " REQ ", \"layer_types\": [\"full_attention\","
                 " \"sliding_attention\"]}", "layer_types");
    EXPECT_ERROR("{\"model_type\": \"smollm3\", " REQ ", \"hidden_act\": \"gelu\"}",
                 "hidden_act");
}

/* google/gemma-2-2b's config.json (transformers 4.42), and gemma-2-27b's attention scale */
static void test_gemma2(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"Gemma2ForCausalLM\"], \"attention_bias\": false,"
               " \"attention_dropout\": 0.0, \"attn_logit_softcapping\": 50.0,"
               " \"bos_token_id\": 2, \"cache_implementation\": \"hybrid\","
               " \"eos_token_id\": [1, 107], \"final_logit_softcapping\": 30.0,"
               " \"head_dim\": 256, \"hidden_act\": \"gelu_pytorch_tanh\","
               " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 2304,"
               " \"initializer_range\": 0.02, \"intermediate_size\": 9216,"
               " \"max_position_embeddings\": 8192, \"model_type\": \"gemma2\","
               " \"num_attention_heads\": 8, \"num_hidden_layers\": 26,"
               " \"num_key_value_heads\": 4, \"pad_token_id\": 0,"
               " \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06,"
               " \"rope_theta\": 10000.0, \"sliding_window\": 4096,"
               " \"torch_dtype\": \"float32\", \"transformers_version\": \"4.42.4\","
               " \"use_cache\": true, \"vocab_size\": 256000}",
               &c, &e) == 0);
    if (e.msg[0])
        fprintf(stderr, "  %s\n", e.msg);
    CHECK(strcmp(c.model_type, "gemma2") == 0 && c.head_dim == 256 && c.num_kv_heads == 4);
    CHECK(c.mlp_act == FT_ACT_GELU_TANH && c.norm_w_offset == 1.0f);
    CHECK(c.tie_word_embeddings && c.embed_scale_round);
    CHECK(fabs(c.embed_scale - sqrt(2304.0)) < 1e-12);
    CHECK(c.attention_scale == 1.0f / 16.0f && c.logits_scale == 1.0f);
    CHECK(c.attn_softcap == 50.0f && c.final_softcap == 30.0f);
    CHECK(c.sliding_window == 4096 && c.num_layers == 26);
    /* sliding on the even layers, full attention on the odd ones */
    for (int l = 0; l < 26; l++)
        CHECK(ft_layer_window(&c, l) == (l % 2 ? 0 : 4096));
    /* Gemma2Config's defaults; gemma-2-27b's query_pre_attn_scalar 144 with head_dim 128;
     * transformers 5's layer_types spelled out */
    CHECK(load("{\"model_type\": \"gemma2\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 3,"
               " \"num_attention_heads\": 8, \"head_dim\": 128,"
               " \"query_pre_attn_scalar\": 144, \"layer_types\": [\"sliding_attention\","
               " \"full_attention\", \"sliding_attention\"]}", &c, &e) == 0);
    CHECK(c.num_kv_heads == 4 && c.tie_word_embeddings && c.sliding_window == 4096);
    CHECK(c.attention_scale == (float)(1.0 / 12.0) && c.head_dim == 128);
    CHECK(c.attn_softcap == 50.0f && c.final_softcap == 30.0f);
    CHECK(ft_layer_window(&c, 0) == 4096 && ft_layer_window(&c, 1) == 0 &&
          ft_layer_window(&c, 2) == 4096);
    /* null soft-caps: none */
    CHECK(load("{\"model_type\": \"gemma2\", " REQ ", \"attn_logit_softcapping\": null,"
               " \"final_logit_softcapping\": null}", &c, &e) == 0);
    CHECK(c.attn_softcap == 0.0f && c.final_softcap == 0.0f);
    /* other families' sliding layers are not per layer */
    CHECK(load(MISTRAL(", \"num_key_value_heads\": 8, \"sliding_window\": 4096"), &c, &e) == 0);
    CHECK(ft_layer_window(&c, 0) == 4096 && ft_layer_window(&c, 1) == 4096);

    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"sliding_window\": null}",
                 "sliding_window");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"layer_types\": [\"full_attention\","
                 " \"full_attention\"]}", "layer_types");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ","
                 " \"layer_types\": [\"sliding_attention\"]}", "layer_types");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"attn_logit_softcapping\": 0}",
                 "attn_logit_softcapping");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"final_logit_softcapping\": -1.0}",
                 "final_logit_softcapping");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"query_pre_attn_scalar\": 0}",
                 "query_pre_attn_scalar");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"use_bidirectional_attention\": true}",
                 "use_bidirectional_attention");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"hidden_activation\": \"gelu\"}",
                 "hidden_activation");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ", \"mlp_bias\": true}", "mlp_bias");
    EXPECT_ERROR("{\"model_type\": \"gemma2\", " REQ ","
                 " \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}",
                 "rope_scaling");
    /* Gemma 2's keys stay foreign to the others */
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"query_pre_attn_scalar\": 256}",
                 "query_pre_attn_scalar");
}

/* google/gemma-3-1b-it's config.json (transformers 4.50: sliding_window_pattern, the two
 * RoPE bases), transformers 5's spelling (layer_types, rope_parameters per layer type),
 * Gemma3TextConfig's defaults, and what is refused */
static void test_gemma3_text(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"Gemma3ForCausalLM\"], \"attention_bias\": false,"
               " \"attention_dropout\": 0.0, \"attn_logit_softcapping\": null,"
               " \"bos_token_id\": 2, \"cache_implementation\": \"hybrid\","
               " \"eos_token_id\": [1, 106], \"final_logit_softcapping\": null,"
               " \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\","
               " \"hidden_size\": 1152, \"initializer_range\": 0.02,"
               " \"intermediate_size\": 6912, \"max_position_embeddings\": 32768,"
               " \"model_type\": \"gemma3_text\", \"num_attention_heads\": 4,"
               " \"num_hidden_layers\": 26, \"num_key_value_heads\": 1, \"pad_token_id\": 0,"
               " \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06,"
               " \"rope_local_base_freq\": 10000, \"rope_scaling\": null,"
               " \"rope_theta\": 1000000, \"sliding_window\": 512,"
               " \"sliding_window_pattern\": 6, \"torch_dtype\": \"bfloat16\","
               " \"transformers_version\": \"4.50.0.dev0\", \"use_cache\": true,"
               " \"vocab_size\": 262144}", &c, &e) == 0);
    if (e.msg[0])
        fprintf(stderr, "  %s\n", e.msg);
    CHECK(strcmp(c.model_type, "gemma3_text") == 0 && c.head_dim == 256 && c.num_kv_heads == 1);
    CHECK(c.mlp_act == FT_ACT_GELU_TANH && c.norm_w_offset == 1.0f && c.tie_word_embeddings);
    CHECK(c.qk_norm == FT_QK_NORM_HEAD && c.embed_scale_round);
    CHECK(strcmp(c.norm_name[FT_NORM_MLP_POST], "post_feedforward_layernorm") == 0);
    CHECK(fabs(c.embed_scale - sqrt(1152.0)) < 1e-12);
    CHECK(c.attention_scale == 1.0f / 16.0f && c.attn_softcap == 0.0f && c.final_softcap == 0.0f);
    CHECK(c.rope_theta == 1e6 && c.rope_local_theta == 1e4 && c.rope_kind == FT_ROPE_DEFAULT);
    /* every sixth layer global (5, 11, ...), the others sliding with the local base */
    for (int l = 0; l < 26; l++) {
        bool global = (l + 1) % 6 == 0;
        CHECK(ft_layer_window(&c, l) == (global ? 0 : 512));
        CHECK(ft_layer_rope_local(&c, l) == !global);
    }
    float g[128], loc[128];
    ft_rope_inv_freq(&c, g);
    ft_rope_inv_freq_local(&c, loc);
    /* torch: 1 / base ** (arange(0, 256, 2) / 256) in fp32, i = 1 and 64 */
    CHECK_REL(g[1], 1.0f / powf(1e6f, 2.0f / 256.0f), 1e-7);
    CHECK_REL(loc[64], 1.0f / powf(1e4f, 128.0f / 256.0f), 1e-7);
    CHECK(g[0] == 1.0f && loc[0] == 1.0f && g[1] < loc[1]);

    /* transformers 5: layer_types and per-type rope_parameters, linear scaling on the
     * global layers (gemma-3-4b and larger); defaults for what is absent */
    CHECK(load("{\"model_type\": \"gemma3_text\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 3,"
               " \"num_attention_heads\": 8, \"head_dim\": 128, \"query_pre_attn_scalar\": 144,"
               " \"final_logit_softcapping\": 30.0,"
               " \"layer_types\": [\"full_attention\", \"sliding_attention\","
               " \"full_attention\"], \"rope_parameters\": {\"full_attention\":"
               " {\"rope_type\": \"linear\", \"factor\": 8.0, \"rope_theta\": 1000000.0},"
               " \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 5000.0}}}",
               &c, &e) == 0);
    if (e.msg[0])
        fprintf(stderr, "  %s\n", e.msg);
    CHECK(c.num_kv_heads == 4 && c.sliding_window == 4096 && c.max_position_embeddings == 131072);
    CHECK(c.attention_scale == (float)(1.0 / 12.0) && c.final_softcap == 30.0f);
    CHECK(c.rope_kind == FT_ROPE_LINEAR && c.rope_factor == 8.0f && c.rope_theta == 1e6);
    CHECK(c.rope_local_theta == 5000.0);
    CHECK(ft_layer_window(&c, 0) == 0 && ft_layer_window(&c, 1) == 4096 &&
          ft_layer_window(&c, 2) == 0);
    CHECK(!ft_layer_rope_local(&c, 0) && ft_layer_rope_local(&c, 1));
    ft_rope_inv_freq(&c, g);
    CHECK_REL(g[3], 1.0f / powf(1e6f, 6.0f / 128.0f) / 8.0f, 1e-7);
    /* the legacy rope_scaling applies to the global layers; theta defaults 1e6 and 1e4;
     * without layer_types or a pattern, every sixth layer is global */
    CHECK(load("{\"model_type\": \"gemma3_text\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 7,"
               " \"num_attention_heads\": 8, \"rope_scaling\": {\"rope_type\": \"linear\","
               " \"factor\": 2.0}}", &c, &e) == 0);
    CHECK(c.rope_kind == FT_ROPE_LINEAR && c.rope_factor == 2.0f && c.rope_theta == 1e6 &&
          c.rope_local_theta == 1e4);
    for (int l = 0; l < 7; l++)
        CHECK(ft_layer_window(&c, l) == (l == 5 ? 0 : 4096));
    /* other families keep one RoPE */
    CHECK(load("{\"model_type\": \"gemma2\", " REQ "}", &c, &e) == 0);
    CHECK(c.rope_local_theta == 0 && !ft_layer_rope_local(&c, 0));

    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"attn_logit_softcapping\": 50.0}",
                 "attn_logit_softcapping");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"sliding_window\": null}",
                 "sliding_window");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"layer_types\": [\"full_attention\","
                 " \"chunked_attention\"]}", "layer_types");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"layer_types\": [\"full_attention\"]}",
                 "layer_types");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"use_bidirectional_attention\": true}",
                 "use_bidirectional_attention");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"hidden_activation\": \"silu\"}",
                 "hidden_activation");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"mlp_bias\": true}", "mlp_bias");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"rope_scaling\": {\"rope_type\":"
                 " \"yarn\", \"factor\": 2.0}}", "rope_scaling.rope_type");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"rope_parameters\":"
                 " {\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0}}}",
                 "rope_parameters.sliding_attention.rope_type");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"rope_parameters\":"
                 " {\"rope_type\": \"linear\", \"factor\": 2.0}}", "rope_parameters");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"rope_scaling\":"
                 " {\"rope_type\": \"linear\"}}", "rope_scaling.factor");
    EXPECT_ERROR("{\"model_type\": \"gemma3_text\", " REQ ", \"sliding_window_pattern\": 0}",
                 "sliding_window_pattern");
    /* and its keys stay foreign to the others */
    EXPECT_ERROR("{\"model_type\": \"qwen3\", " REQ ", \"final_logit_softcapping\": 30.0}",
                 "final_logit_softcapping");
}

/* google/gemma-3-27b-it's config.json (transformers 4.50): a multimodal Gemma3Config whose
 * text_config is read as gemma3_text, with Gemma3TextConfig's defaults for what it leaves
 * out and the top level's tie, dtype and eos */
static const char *GEMMA3_27B =
    "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"boi_token_index\": 255999,"
    " \"eoi_token_index\": 256000, \"eos_token_id\": [1, 106], \"image_token_index\": 262144,"
    " \"initializer_range\": 0.02, \"mm_tokens_per_image\": 256, \"model_type\": \"gemma3\","
    " \"text_config\": {\"head_dim\": 128, \"hidden_size\": 5376, \"intermediate_size\": 21504,"
    " \"model_type\": \"gemma3_text\", \"num_attention_heads\": 32, \"num_hidden_layers\": 62,"
    " \"num_key_value_heads\": 16, \"query_pre_attn_scalar\": 168, \"rope_scaling\":"
    " {\"factor\": 8.0, \"rope_type\": \"linear\"}, \"sliding_window\": 1024%s},"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.50.0.dev0\","
    " \"vision_config\": {\"hidden_size\": 1152, \"image_size\": 896,"
    " \"intermediate_size\": 4304, \"model_type\": \"siglip_vision_model\","
    " \"num_attention_heads\": 16, \"num_hidden_layers\": 27, \"patch_size\": 14,"
    " \"vision_use_head\": false}%s}";

static const char *gemma3_27b(const char *text_extra, const char *top_extra)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, GEMMA3_27B, text_extra, top_extra);
    return buf;
}

static void test_gemma3_multimodal(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load(gemma3_27b("", ""), &c, &e) == 0);
    if (e.msg[0])
        fprintf(stderr, "  %s\n", e.msg);
    CHECK(strcmp(c.model_type, "gemma3") == 0 && c.multimodal);
    CHECK(strcmp(c.ckpt_prefix, "language_model.") == 0 &&
          strcmp(c.module_prefix, "model.language_model.") == 0);
    CHECK(c.vocab_size == 262208 && c.hidden_size == 5376 && c.num_layers == 62);
    CHECK(c.num_heads == 32 && c.num_kv_heads == 16 && c.head_dim == 128);
    CHECK(c.attention_scale == (float)pow(168.0, -0.5) && c.final_softcap == 0.0f);
    CHECK(c.rope_kind == FT_ROPE_LINEAR && c.rope_factor == 8.0f && c.rope_theta == 1e6 &&
          c.rope_local_theta == 1e4);
    CHECK(ft_layer_window(&c, 0) == 1024 && ft_layer_window(&c, 5) == 0 &&
          ft_layer_window(&c, 61) == 1024 && ft_layer_window(&c, 59) == 0);
    CHECK(c.tie_word_embeddings && strcmp(c.torch_dtype, "bfloat16") == 0);
    CHECK(c.n_eos == 2 && c.eos_token_ids[1] == 106);
    /* the top level's tie_word_embeddings, not text_config's */
    CHECK(load(gemma3_27b(", \"tie_word_embeddings\": true", ", \"tie_word_embeddings\": false"),
               &c, &e) == 0);
    CHECK(!c.tie_word_embeddings);
    /* a causal LM keeps the plain names */
    CHECK(load("{\"model_type\": \"gemma3_text\", " REQ "}", &c, &e) == 0);
    CHECK(!c.multimodal && c.ckpt_prefix[0] == '\0' && strcmp(c.module_prefix, "model.") == 0);

    EXPECT_ERROR(gemma3_27b(", \"final_logit_softcapping\": 30.0", ""),
                 "text_config.final_logit_softcapping");
    EXPECT_ERROR(gemma3_27b(", \"attn_logit_softcapping\": 50.0", ""), "attn_logit_softcapping");
    EXPECT_ERROR(gemma3_27b(", \"mlp_bias\": true", ""), "mlp_bias");
    EXPECT_ERROR("{\"model_type\": \"gemma3\", \"text_config\": [1]}", "text_config");
    EXPECT_ERROR("{\"model_type\": \"gemma3\", \"text_config\": {\"model_type\": \"llama\"}}",
                 "text_config.model_type");
    EXPECT_ERROR("{\"model_type\": \"gemma3\", \"architectures\": [\"LlavaForConditionalGeneration\"]}",
                 "architectures");
}

/* Qwen/Qwen3-0.6B's config.json (transformers 4.51), and Qwen3-8B's with layer_types as
 * transformers 5 writes it */
static void test_qwen3(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false,"
               " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
               " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024,"
               " \"initializer_range\": 0.02, \"intermediate_size\": 3072,"
               " \"max_position_embeddings\": 40960, \"max_window_layers\": 28,"
               " \"model_type\": \"qwen3\", \"num_attention_heads\": 16,"
               " \"num_hidden_layers\": 28, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06,"
               " \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null,"
               " \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
               " \"transformers_version\": \"4.51.0\", \"use_cache\": true,"
               " \"use_sliding_window\": false, \"vocab_size\": 151936}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "qwen3") == 0);
    /* head_dim 128 != 1024 / 16 */
    CHECK(c.num_heads == 16 && c.num_kv_heads == 8 && c.head_dim == 128);
    CHECK(c.qk_norm == FT_QK_NORM_HEAD);
    CHECK(strcmp(c.norm_name[FT_NORM_ATTN_PRE], "input_layernorm") == 0);
    CHECK(strcmp(c.norm_name[FT_NORM_MLP_PRE], "post_attention_layernorm") == 0);
    CHECK(!ft_has_branch_norm(&c, FT_NORM_ATTN_POST) && !ft_has_branch_norm(&c, FT_NORM_MLP_POST));
    CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias && c.sliding_window == 0);
    CHECK(c.tie_word_embeddings && c.rope_theta == 1e6 && c.max_position_embeddings == 40960);
    CHECK(c.attention_scale == 1.0f / sqrtf(128.0f) && c.norm_w_offset == 0.0f);
    CHECK(load("{\"model_type\": \"qwen3\", \"architectures\": [\"Qwen3ForCausalLM\"], " REQ
               ", \"num_key_value_heads\": 8, \"head_dim\": 128, \"tie_word_embeddings\": false,"
               " \"use_sliding_window\": false, \"sliding_window\": null,"
               " \"max_window_layers\": 36, \"layer_types\": [\"full_attention\","
               " \"full_attention\"], \"rope_parameters\": {\"rope_theta\": 1000000,"
               " \"rope_type\": \"default\"}}", &c, &e) == 0);
    CHECK(!c.tie_word_embeddings && c.sliding_window == 0 && c.rope_theta == 1e6);
    /* Qwen3Config's defaults: head_dim 128, 32 kv heads (so 8 heads need the key) */
    CHECK(load("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4}", &c, &e) == 0);
    CHECK(c.head_dim == 128 && c.max_position_embeddings == 32768 && c.rms_norm_eps == 1e-6f);
    CHECK(!c.tie_word_embeddings && !c.qkv_bias);
    EXPECT_ERROR("{\"model_type\": \"qwen3\", " REQ "}", "num_key_value_heads");
    /* attention_bias: on q, k, v and o, as Qwen3Attention has it */
    CHECK(load("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4,"
               " \"attention_bias\": true}", &c, &e) == 0);
    CHECK(c.qkv_bias && c.o_bias && !c.mlp_bias);
    EXPECT_ERROR("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4,"
                 " \"mlp_bias\": true}", "mlp_bias");
    /* sliding windows: accepted when off, refused when on */
    EXPECT_ERROR("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4,"
                 " \"use_sliding_window\": true, \"sliding_window\": 4096,"
                 " \"max_window_layers\": 1}", "use_sliding_window");
    EXPECT_ERROR("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4,"
                 " \"use_sliding_window\": true, \"sliding_window\": 4096}", "qwen3");
    EXPECT_ERROR("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4,"
                 " \"layer_types\": [\"full_attention\", \"sliding_attention\"]}",
                 "layer_types");
    /* YaRN as Qwen3's model cards enable it for 131072 tokens */
    CHECK(load("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4,"
               " \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0,"
               " \"original_max_position_embeddings\": 32768}}", &c, &e) == 0);
    CHECK(c.rope_kind == FT_ROPE_YARN && c.rope_factor == 4.0f &&
          c.rope_original_max_position == 32768);
    EXPECT_ERROR("{\"model_type\": \"qwen3\", " REQ ", \"num_key_value_heads\": 4,"
                 " \"head_dim\": 127}", "head_dim");
}

/* mistralai/Mixtral-8x7B-v0.1's config.json, MixtralConfig's defaults, and the MoE keys'
 * errors. */
static void test_mixtral(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"MixtralForCausalLM\"], \"attention_dropout\": 0.0,"
               " \"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\","
               " \"hidden_size\": 4096, \"initializer_range\": 0.02,"
               " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
               " \"model_type\": \"mixtral\", \"num_attention_heads\": 32,"
               " \"num_experts_per_tok\": 2, \"num_hidden_layers\": 32,"
               " \"num_key_value_heads\": 8, \"num_local_experts\": 8,"
               " \"output_router_logits\": false, \"rms_norm_eps\": 1e-05,"
               " \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.02,"
               " \"sliding_window\": null, \"tie_word_embeddings\": false,"
               " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.36.0.dev0\","
               " \"use_cache\": true, \"vocab_size\": 32000}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "mixtral") == 0);
    CHECK(c.num_experts == 8 && c.experts_per_tok == 2 && c.norm_topk_prob);
    CHECK(!c.output_router_logits && c.router_aux_loss_coef == 0.02f);
    CHECK(c.num_kv_heads == 8 && c.head_dim == 128 && c.sliding_window == 0);
    CHECK(c.rope_theta == 1e6 && c.rms_norm_eps == 1e-5f && !c.tie_word_embeddings);
    CHECK(strcmp(c.moe_name, "block_sparse_moe") == 0 && strcmp(c.expert_proj[0], "w1") == 0 &&
          strcmp(c.expert_proj[1], "w3") == 0 && strcmp(c.expert_proj[2], "w2") == 0);
    /* the MLP is the MoE block: the block's linear modules are attention's */
    CHECK(ft_block_projections(&c) == ((1u << FT_PROJ_Q) | (1u << FT_PROJ_K) |
                                       (1u << FT_PROJ_V) | (1u << FT_PROJ_O)));
    /* MixtralConfig's defaults: 8 experts, top 2, coef 0.001, rope_theta 1e6 */
    CHECK(load("{\"model_type\": \"mixtral\", " REQ ", \"num_key_value_heads\": 2,"
               " \"sliding_window\": 7, \"output_router_logits\": true}", &c, &e) == 0);
    CHECK(c.num_experts == 8 && c.experts_per_tok == 2 && c.router_aux_loss_coef == 0.001f);
    CHECK(c.output_router_logits && c.rope_theta == 1e6 && c.sliding_window == 7);
    CHECK(c.max_position_embeddings == 4096 * 32 && c.rms_norm_eps == 1e-5f);
    /* num_experts: MixtralConfig's alias of num_local_experts */
    CHECK(load("{\"model_type\": \"mixtral\", " REQ ", \"num_experts\": 3,"
               " \"num_experts_per_tok\": 3}", &c, &e) == 0);
    CHECK(c.num_experts == 3 && c.experts_per_tok == 3);
    EXPECT_ERROR("{\"model_type\": \"mixtral\", " REQ ", \"num_experts\": 3,"
                 " \"num_local_experts\": 4}", "num_experts");
    EXPECT_ERROR("{\"model_type\": \"mixtral\", " REQ ", \"num_local_experts\": 4,"
                 " \"num_experts_per_tok\": 5}", "num_experts_per_tok");
    EXPECT_ERROR("{\"model_type\": \"mixtral\", " REQ ", \"num_experts_per_tok\": 0}",
                 "num_experts_per_tok");
    EXPECT_ERROR("{\"model_type\": \"mixtral\", " REQ ", \"router_jitter_noise\": 0.01}",
                 "router_jitter_noise");
    EXPECT_ERROR("{\"model_type\": \"mixtral\", " REQ ", \"output_router_logits\": 1}",
                 "output_router_logits");
    EXPECT_ERROR("{\"model_type\": \"mixtral\", " REQ ", \"router_aux_loss_coef\": \"x\"}",
                 "router_aux_loss_coef");
    EXPECT_ERROR("{\"model_type\": \"mixtral\", " REQ ", \"attention_bias\": true}",
                 "attention_bias");
    /* the experts stay foreign to the dense families */
    EXPECT_ERROR("{\"model_type\": \"mistral\", " REQ ", \"num_local_experts\": 8}",
                 "num_local_experts");
    CHECK(load("{\"model_type\": \"llama\", " REQ "}", &c, &e) == 0);
    CHECK(c.num_experts == 0 && c.rope_theta == 10000.0);
}

/* Qwen/Qwen3-30B-A3B's config.json, Qwen3MoeConfig's defaults, dense layers, and the
 * refusals. */
static void test_qwen3_moe(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false,"
               " \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
               " \"decoder_sparse_step\": 1, \"eos_token_id\": 151645, \"head_dim\": 128,"
               " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02,"
               " \"intermediate_size\": 6144, \"max_position_embeddings\": 40960,"
               " \"max_window_layers\": 48, \"mlp_only_layers\": [],"
               " \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768,"
               " \"norm_topk_prob\": true, \"num_attention_heads\": 32, \"num_experts\": 128,"
               " \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"
               " \"num_key_value_heads\": 4, \"output_router_logits\": false,"
               " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000.0,"
               " \"router_aux_loss_coef\": 0.001, \"sliding_window\": null,"
               " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
               " \"transformers_version\": \"4.51.0\", \"use_cache\": true,"
               " \"use_sliding_window\": false, \"vocab_size\": 151936}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "qwen3_moe") == 0);
    CHECK(c.num_experts == 128 && c.experts_per_tok == 8 && c.norm_topk_prob);
    CHECK(!c.output_router_logits && c.router_aux_loss_coef == 0.001f);
    /* every layer sparse: the width the experts use */
    CHECK(c.intermediate_size == 768);
    CHECK(c.num_kv_heads == 4 && c.head_dim == 128 && c.sliding_window == 0);
    CHECK(c.qk_norm == FT_QK_NORM_HEAD && !c.qkv_bias && !c.o_bias);
    CHECK(c.rope_theta == 1e6 && c.rms_norm_eps == 1e-6f && !c.tie_word_embeddings);
    CHECK(strcmp(c.moe_name, "mlp") == 0 && strcmp(c.expert_proj[0], "gate_proj") == 0 &&
          strcmp(c.expert_proj[1], "up_proj") == 0 &&
          strcmp(c.expert_proj[2], "down_proj") == 0);
    CHECK(ft_block_projections(&c) == ((1u << FT_PROJ_Q) | (1u << FT_PROJ_K) |
                                       (1u << FT_PROJ_V) | (1u << FT_PROJ_O)));
    /* Qwen3MoeConfig's defaults: 128 experts, top 8, no renormalisation, width 768,
     * head_dim hidden / heads (not qwen3's 128), 4 kv heads */
    CHECK(load("{\"model_type\": \"qwen3_moe\", " REQ ", \"attention_bias\": true}", &c,
               &e) == 0);
    CHECK(c.num_experts == 128 && c.experts_per_tok == 8 && !c.norm_topk_prob);
    CHECK(c.intermediate_size == 768 && c.head_dim == 32 && c.num_kv_heads == 4);
    CHECK(c.qkv_bias && c.o_bias && c.router_aux_loss_coef == 0.001f);
    CHECK(c.rope_theta == 10000.0 && c.max_position_embeddings == 32768);
    CHECK(ft_layer_sparse(&c, 0) && ft_layer_sparse(&c, 1) && c.dense_intermediate_size == 0);
    CHECK(ft_layer_mlp_width(&c, 0) == 0 && c.shared_expert_size == 0 && !c.moe_lora_plain);
    /* layers past the model in mlp_only_layers change nothing */
    CHECK(load("{\"model_type\": \"qwen3_moe\", " REQ ", \"mlp_only_layers\": [2, 5],"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2}", &c, &e) == 0);
    CHECK(c.num_experts == 4 && c.experts_per_tok == 2);
    CHECK(ft_layer_sparse(&c, 0) && ft_layer_sparse(&c, 1) && c.dense_intermediate_size == 0);
    /* dense layers: mlp_only_layers, or (l + 1) % decoder_sparse_step != 0; their MLP has
     * the config's intermediate_size, the experts moe_intermediate_size */
    CHECK(load("{\"model_type\": \"qwen3_moe\", " REQ ", \"mlp_only_layers\": [1]}", &c,
               &e) == 0);
    CHECK(ft_layer_sparse(&c, 0) && !ft_layer_sparse(&c, 1));
    CHECK(c.intermediate_size == 768 && c.dense_intermediate_size == 512);
    CHECK(ft_layer_mlp_width(&c, 0) == 0 && ft_layer_mlp_width(&c, 1) == 512);
    CHECK(ft_layer_projections(&c, 1) == ((1u << FT_PROJ_Q) | (1u << FT_PROJ_K) |
                                          (1u << FT_PROJ_V) | (1u << FT_PROJ_O) |
                                          (1u << FT_PROJ_GATE) | (1u << FT_PROJ_UP) |
                                          (1u << FT_PROJ_DOWN)));
    CHECK(strcmp(ft_layer_proj_path(&c, 1, FT_PROJ_DOWN), "mlp.down_proj") == 0);
    /* (PEFT maps qwen3_moe's MLP names to the experts: no LoRA on a dense layer's MLP) */
    CHECK(ft_layer_lora_projections(&c, 1) == ft_block_projections(&c));
    CHECK(load("{\"model_type\": \"qwen3_moe\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 4,"
               " \"num_attention_heads\": 8, \"decoder_sparse_step\": 2,"
               " \"mlp_only_layers\": [3]}", &c, &e) == 0);
    CHECK(!ft_layer_sparse(&c, 0) && ft_layer_sparse(&c, 1) && !ft_layer_sparse(&c, 2) &&
          !ft_layer_sparse(&c, 3));
    CHECK(ft_max_mlp_width(&c, 0, 4) == 512 && ft_max_mlp_width(&c, 1, 2) == 0);
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"mlp_only_layers\": 1}",
                 "mlp_only_layers");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"mlp_only_layers\": [-1]}",
                 "mlp_only_layers");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"mlp_only_layers\": [\"1\"]}",
                 "mlp_only_layers");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"decoder_sparse_step\": 0}",
                 "decoder_sparse_step");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"decoder_sparse_step\": 1.5}",
                 "decoder_sparse_step");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"use_sliding_window\": true}",
                 "use_sliding_window");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"num_experts\": 4,"
                 " \"num_experts_per_tok\": 5}", "num_experts_per_tok");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"moe_intermediate_size\": 0}",
                 "moe_intermediate_size");
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"norm_topk_prob\": 1}",
                 "norm_topk_prob");
    /* num_local_experts: the name transformers 5 writes (Qwen3MoeConfig's attribute_map) */
    CHECK(load("{\"model_type\": \"qwen3_moe\", " REQ ", \"num_local_experts\": 6}", &c,
               &e) == 0);
    CHECK(c.num_experts == 6);
    EXPECT_ERROR("{\"model_type\": \"qwen3_moe\", " REQ ", \"num_local_experts\": 6,"
                 " \"num_experts\": 5}", "num_local_experts");
}

/* Qwen/Qwen1.5-MoE-A2.7B's config.json, Qwen2MoeConfig's defaults, the shared expert,
 * dense layers and the refusals by key. */
#define Q2REQ REQ ", \"num_key_value_heads\": 8"
static void test_qwen2_moe(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"attention_dropout\": 0.0,"
               " \"bos_token_id\": 151643, \"decoder_sparse_step\": 1,"
               " \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
               " \"initializer_range\": 0.02, \"intermediate_size\": 5632,"
               " \"max_position_embeddings\": 8192, \"max_window_layers\": 21,"
               " \"model_type\": \"qwen2_moe\", \"moe_intermediate_size\": 1408,"
               " \"norm_topk_prob\": false, \"num_attention_heads\": 16,"
               " \"num_experts\": 60, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24,"
               " \"num_key_value_heads\": 16, \"output_router_logits\": false,"
               " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
               " \"router_aux_loss_coef\": 0.001, \"shared_expert_intermediate_size\": 5632,"
               " \"sliding_window\": 32768, \"tie_word_embeddings\": false,"
               " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.40.0.dev0\","
               " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "qwen2_moe") == 0);
    CHECK(c.num_experts == 60 && c.experts_per_tok == 4 && !c.norm_topk_prob);
    CHECK(c.intermediate_size == 1408 && c.shared_expert_size == 5632);
    CHECK(c.dense_intermediate_size == 0 && c.moe_lora_plain);
    CHECK(c.qkv_bias && !c.o_bias && !c.mlp_bias && c.qk_norm == FT_QK_NORM_NONE);
    CHECK(c.sliding_window == 0 && c.rope_theta == 1e6);
    CHECK(strcmp(c.moe_name, "mlp") == 0 && strcmp(c.expert_proj[2], "down_proj") == 0);
    /* a sparse layer: the shared expert's gate, up, down (width 5632) and its gate */
    CHECK(ft_layer_sparse(&c, 23) && ft_layer_mlp_width(&c, 5) == 5632);
    unsigned attn = (1u << FT_PROJ_Q) | (1u << FT_PROJ_K) | (1u << FT_PROJ_V) | (1u << FT_PROJ_O);
    unsigned mlp = (1u << FT_PROJ_GATE) | (1u << FT_PROJ_UP) | (1u << FT_PROJ_DOWN);
    CHECK(ft_block_projections(&c) == attn);
    CHECK(ft_layer_projections(&c, 0) == (attn | mlp | (1u << FT_PROJ_SHGATE)));
    CHECK(ft_layer_lora_projections(&c, 0) == ft_layer_projections(&c, 0));
    CHECK(strcmp(ft_layer_proj_path(&c, 0, FT_PROJ_UP), "mlp.shared_expert.up_proj") == 0);
    CHECK(strcmp(ft_layer_proj_path(&c, 0, FT_PROJ_SHGATE), "mlp.shared_expert_gate") == 0);
    int in, out;
    ft_layer_proj_dims(&c, 0, FT_PROJ_DOWN, &in, &out);
    CHECK(in == 5632 && out == 2048);
    ft_layer_proj_dims(&c, 0, FT_PROJ_SHGATE, &in, &out);
    CHECK(in == 2048 && out == 1);
    /* Qwen2MoeConfig's defaults: 60 experts, top 4, widths 1408 and 5632, q/k/v bias, 16
     * kv heads */
    CHECK(load("{\"model_type\": \"qwen2_moe\", \"vocab_size\": 1000, \"hidden_size\": 256,"
               " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
               " \"num_attention_heads\": 16}", &c, &e) == 0);
    CHECK(c.num_experts == 60 && c.experts_per_tok == 4 && c.intermediate_size == 1408);
    CHECK(c.shared_expert_size == 5632 && c.qkv_bias && c.num_kv_heads == 16);
    CHECK(c.router_aux_loss_coef == 0.001f && !c.output_router_logits);
    /* dense layers: a plain MLP of intermediate_size (mlp.gate_proj), no shared expert */
    CHECK(load("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"decoder_sparse_step\": 2,"
               " \"qkv_bias\": false, \"shared_expert_intermediate_size\": 64,"
               " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"norm_topk_prob\": true}",
               &c, &e) == 0);
    CHECK(!ft_layer_sparse(&c, 0) && ft_layer_sparse(&c, 1) && !c.qkv_bias && c.norm_topk_prob);
    CHECK(ft_layer_mlp_width(&c, 0) == 512 && ft_layer_mlp_width(&c, 1) == 64);
    CHECK(ft_layer_projections(&c, 0) == (attn | mlp));
    CHECK(strcmp(ft_layer_proj_path(&c, 0, FT_PROJ_UP), "mlp.up_proj") == 0);
    CHECK(ft_max_mlp_width(&c, 0, 2) == 512);
    /* refused by key */
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"qkv_bias\": \"yes\"}", "qkv_bias");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"attention_bias\": true}",
                 "attention_bias");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"num_experts\": 0}", "num_experts");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"num_local_experts\": 4}",
                 "num_local_experts");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"num_experts\": 4,"
                 " \"num_experts_per_tok\": 5}", "num_experts_per_tok");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ","
                 " \"shared_expert_intermediate_size\": 0}", "shared_expert_intermediate_size");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"moe_intermediate_size\": -3}",
                 "moe_intermediate_size");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"router_aux_loss_coef\": \"x\"}",
                 "router_aux_loss_coef");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"output_router_logits\": 1}",
                 "output_router_logits");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"use_sliding_window\": true}",
                 "use_sliding_window");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"hidden_act\": \"gelu\"}",
                 "hidden_act");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"mlp_only_layers\": {}}",
                 "mlp_only_layers");
    EXPECT_ERROR("{\"model_type\": \"qwen2_moe\", " Q2REQ ", \"decoder_sparse_step\": -2}",
                 "decoder_sparse_step");
}
#undef Q2REQ

/* allenai/OLMo-2-1124-7B's config.json */
static void test_olmo2(void)
{
    ft_model_config c;
    ft_err e = {0};
    CHECK(load("{\"architectures\": [\"Olmo2ForCausalLM\"], \"attention_bias\": false,"
               " \"attention_dropout\": 0.0, \"eos_token_id\": 100257, \"hidden_act\": \"silu\","
               " \"hidden_size\": 4096, \"initializer_range\": 0.02,"
               " \"intermediate_size\": 11008, \"max_position_embeddings\": 4096,"
               " \"model_type\": \"olmo2\", \"num_attention_heads\": 32,"
               " \"num_hidden_layers\": 32, \"num_key_value_heads\": 32,"
               " \"pad_token_id\": 100277, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null,"
               " \"rope_theta\": 500000, \"tie_word_embeddings\": false,"
               " \"torch_dtype\": \"float32\", \"transformers_version\": \"4.47.0.dev0\","
               " \"use_cache\": true, \"vocab_size\": 100352}",
               &c, &e) == 0);
    CHECK(strcmp(c.model_type, "olmo2") == 0);
    CHECK(c.num_heads == 32 && c.num_kv_heads == 32 && c.head_dim == 128);
    CHECK(c.qk_norm == FT_QK_NORM_PROJ);
    /* norms after each branch, under the names llama gives its pre-norms */
    CHECK(!ft_has_branch_norm(&c, FT_NORM_ATTN_PRE) && !ft_has_branch_norm(&c, FT_NORM_MLP_PRE));
    CHECK(strcmp(c.norm_name[FT_NORM_ATTN_POST], "post_attention_layernorm") == 0);
    CHECK(strcmp(c.norm_name[FT_NORM_MLP_POST], "post_feedforward_layernorm") == 0);
    CHECK(!c.qkv_bias && !c.o_bias && !c.mlp_bias && !c.tie_word_embeddings);
    CHECK(c.rms_norm_eps == 1e-6f && c.rope_theta == 5e5 && c.pad_token_id == 100277);
    /* Olmo2Config's defaults: rms_norm_eps 1e-5 (not llama's 1e-6), kv heads = heads */
    CHECK(load("{\"model_type\": \"olmo2\", " REQ "}", &c, &e) == 0);
    CHECK(c.rms_norm_eps == 1e-5f && c.num_kv_heads == 8 && c.head_dim == 32);
    CHECK(c.max_position_embeddings == 2048 && !c.tie_word_embeddings);
    CHECK(load("{\"model_type\": \"olmo2\", " REQ ", \"attention_bias\": true}", &c, &e) == 0);
    CHECK(c.qkv_bias && c.o_bias && !c.mlp_bias);
    EXPECT_ERROR("{\"model_type\": \"olmo2\", " REQ ", \"mlp_bias\": true}", "mlp_bias");
    EXPECT_ERROR("{\"model_type\": \"olmo2\", " REQ ", \"hidden_act\": \"gelu\"}", "hidden_act");
    EXPECT_ERROR("{\"model_type\": \"olmo2\", " REQ ", \"layer_types\": [\"sliding_attention\","
                 " \"full_attention\"]}", "layer_types");
}

static void test_file_errors(void)
{
    ft_model_config c;
    ft_err e = {0};
    char missing[160];
    snprintf(missing, sizeof missing, "%s/no-such-config.json", tmp_dir);
    CHECK(ft_model_config_load(&c, missing, &e) == -1);
    CHECK(strstr(e.msg, missing) != NULL && strstr(e.msg, "cannot open") != NULL);

    /* The message names the file and the line of the error: file:3:col. */
    CHECK(load("{\n  \"model_type\": \"llama\",\n  \"vocab_size\": 32000,,\n}\n", &c, &e) == -1);
    char where[160];
    snprintf(where, sizeof where, "%s:3:", cfg_path);
    CHECK(strstr(e.msg, where) != NULL);

    CHECK(load("", &c, &e) == -1);
    CHECK(strstr(e.msg, cfg_path) != NULL);
    EXPECT_ERROR("[1, 2]", "top level");
    EXPECT_ERROR("{\"model_type\": \"llama\", \"model_type\": \"llama\", " REQ "}", "duplicate");

    /* A FIFO (or a directory) is no config.json: refused, not waited on. */
    char fifo[160];
    snprintf(fifo, sizeof fifo, "%s/fifo", tmp_dir);
    CHECK(ft_mkdir_p(fifo, &e) == 0);
    snprintf(fifo, sizeof fifo, "%s/fifo/config.json", tmp_dir);
    CHECK(make_fifo(fifo));
    fifo_guard(true);
    CHECK(ft_model_config_load(&c, fifo, &e) == -1);
    CHECK(strstr(e.msg, fifo) && strstr(e.msg, "not a regular file (a FIFO)"));
    /* ... nor for the copy ft-merge and ft-quantize make of it */
    json_t *root = NULL;
    snprintf(fifo, sizeof fifo, "%s/fifo", tmp_dir);
    CHECK(ft_read_model_config_json(fifo, &root, &e) == -1 && root == NULL);
    CHECK(strstr(e.msg, "config.json") && strstr(e.msg, "FIFO"));
    fifo_guard(false);
    CHECK(ft_model_config_load(&c, tmp_dir, &e) == -1 && strstr(e.msg, "a directory"));

    /* The copy is read with duplicate keys refused as well; a missing file gets the hint. */
    char dir[160], path[200];
    snprintf(dir, sizeof dir, "%s/dup", tmp_dir);
    CHECK(ft_mkdir_p(dir, &e) == 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\": \"llama\",\n \"torch_dtype\": \"float32\",\n"
          " \"torch_dtype\": \"bfloat16\"}", f);
    fclose(f);
    CHECK(ft_read_model_config_json(dir, &root, &e) == -1 && root == NULL);
    CHECK(strstr(e.msg, path) && strstr(e.msg, "duplicate") && strstr(e.msg, "torch_dtype"));
    snprintf(dir, sizeof dir, "%s/none", tmp_dir);
    CHECK(ft_read_model_config_json(dir, &root, &e) == -1 &&
          strstr(e.msg, "a Hugging Face model dir?"));

    /* err may be NULL. */
    CHECK(ft_model_config_load(&c, missing, NULL) == -1);
}

static void test_key_errors(void)
{
    EXPECT_ERROR("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 256,"
                 " \"num_hidden_layers\": 2, \"num_attention_heads\": 8}",
                 "intermediate_size");
    EXPECT_ERROR("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": \"big\","
                 " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 8}",
                 "hidden_size");
    EXPECT_ERROR("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 256,"
                 " \"intermediate_size\": 512, \"num_hidden_layers\": 2.0,"
                 " \"num_attention_heads\": 8}",
                 "num_hidden_layers");
    EXPECT_ERROR("{\"model_type\": \"llama\", \"vocab_size\": 0, \"hidden_size\": 256,"
                 " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 8}",
                 "vocab_size");
    EXPECT_ERROR("{\"model_type\": \"llama\", \"vocab_size\": 99999999999, \"hidden_size\": 256,"
                 " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 8}",
                 "vocab_size");
    EXPECT_ERROR("{" REQ "}", "model_type");
    EXPECT_ERROR("{\"model_type\": \"deepseek_v3\", " REQ "}", "model_type");
    EXPECT_ERROR("{\"model_type\": \"deepseek_v3\", " REQ "}", "deepseek_v3");
    EXPECT_ERROR("{\"model_type\": \"falcon\", " REQ "}", "falcon");
    EXPECT_ERROR("{\"model_type\": \"olmo\", " REQ "}", "olmo");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"hidden_act\": \"gelu\"}", "hidden_act");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"num_key_value_heads\": 3}",
                 "num_key_value_heads");
    /* Qwen2Config's default of 32 kv heads when the key is absent does not divide 14. */
    EXPECT_ERROR("{\"model_type\": \"qwen2\", \"vocab_size\": 1000, \"hidden_size\": 896,"
                 " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 14}",
                 "num_key_value_heads");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"head_dim\": 31}", "head_dim");
    EXPECT_ERROR("{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 250,"
                 " \"intermediate_size\": 512, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 8}",
                 "head_dim");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"tie_word_embeddings\": 1}",
                 "tie_word_embeddings");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rms_norm_eps\": -1e-5}", "rms_norm_eps");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_theta\": \"1e4\"}", "rope_theta");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"eos_token_id\": [1, 2000]}",
                 "eos_token_id");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"eos_token_id\": [1,2,3,4,5,6,7,8,9]}",
                 "eos_token_id");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"bos_token_id\": \"<s>\"}",
                 "bos_token_id");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"torch_dtype\": \"int8\"}",
                 "torch_dtype");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ","
                 " \"architectures\": [\"LlamaForSequenceClassification\"]}",
                 "architectures");
}

static void test_math_errors(void)
{
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_scaling\": {\"type\": \"dynamic\","
                 " \"factor\": 2.0}}",
                 "rope_scaling type 'dynamic' is not supported");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_parameters\": {\"rope_type\":"
                 " \"longrope\", \"rope_theta\": 10000.0}}",
                 "rope_parameters type 'longrope' is not supported");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_scaling\": {\"rope_type\":"
                 " \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 4.0,"
                 " \"original_max_position_embeddings\": 8192}}",
                 "low_freq_factor");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_scaling\": {\"rope_type\":"
                 " \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
                 " \"high_freq_factor\": 4.0}}",
                 "original_max_position_embeddings");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_scaling\": {\"rope_type\":"
                 " \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0,"
                 " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
                 "high_freq_factor");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_scaling\": {\"rope_type\":"
                 " \"linear\"}}",
                 "factor");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_scaling\": \"linear\"}",
                 "rope_scaling");
    EXPECT_ERROR("{\"model_type\": \"qwen2\", " REQ ", \"num_key_value_heads\": 2,"
                 " \"use_sliding_window\": true, \"sliding_window\": 4096}",
                 "use_sliding_window");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"attention_dropout\": 0.1}",
                 "attention_dropout");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"partial_rotary_factor\": 0.5}",
                 "partial_rotary_factor");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_parameters\": {\"rope_type\":"
                 " \"default\", \"partial_rotary_factor\": 0.5}}",
                 "partial_rotary_factor");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"final_logit_softcapping\": 30.0}",
                 "final_logit_softcapping");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"attention_multiplier\": 0.0078125}",
                 "attention_multiplier");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"quantization_config\": {\"bits\": 4}}",
                 "quantization_config");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"quantization_config\": "
                 "{\"quant_method\": \"gptq\", \"bits\": 4}}",
                 "'gptq' is not supported");
    EXPECT_ERROR("{\"model_type\": \"mistral\", " REQ ", \"attention_bias\": true}",
                 "attention_bias");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ","
                 " \"layer_types\": [\"full_attention\", \"sliding_attention\"]}",
                 "layer_types");
    EXPECT_ERROR("{\"model_type\": \"llama\", " REQ ", \"rope_parameters\": {\"full_attention\":"
                 " {\"rope_type\": \"default\"}, \"sliding_attention\": {\"rope_type\":"
                 " \"default\"}}}",
                 "rope_parameters");
}

/* Random byte edits of a valid config: every outcome is a config or an error that names the
 * file; nothing crashes or leaks (run under valgrind / ASan). Deterministic LCG. */
static void test_fuzz(void)
{
    static const char alphabet[] = "{}[],:\"\\ -.0123456789eEtruefalsnl\n";
    const size_t n = strlen(TINYLLAMA);
    char *buf = malloc(n + 1);
    CHECK(buf != NULL);
    if (!buf)
        return;
    unsigned long long rng = 0x9E3779B97F4A7C15ull;
    int accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, TINYLLAMA, n + 1);
        int edits = 1 + iter % 3;
        for (int k = 0; k < edits; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(rng >> 33) % n;
            char ch = alphabet[(rng >> 17) % (sizeof alphabet - 1)];
            if (iter % 7 == 0)
                buf[pos] = '\0'; /* truncation */
            else
                buf[pos] = ch;
        }
        ft_model_config c;
        ft_err e = {0};
        int rc = load(buf, &c, &e);
        CHECK(rc == 0 || (rc == -1 && strstr(e.msg, cfg_path) != NULL));
        if (rc == 0) {
            accepted++;
            CHECK(c.head_dim > 0 && c.head_dim % 2 == 0);
            CHECK(c.num_heads % c.num_kv_heads == 0);
        }
    }
    CHECK(accepted > 0 && accepted < 3000);
    free(buf);
}

int main(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ft_hf_config_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 2;
    }
    RUN(test_tinyllama);
    RUN(test_llama31);
    RUN(test_yarn);
    RUN(test_linear_rope);
    RUN(test_qwen2);
    RUN(test_smollm);
    RUN(test_mistral);
    RUN(test_explicit_head_dim);
    RUN(test_llama_defaults_and_bias);
    RUN(test_embed_padding_idx);
    RUN(test_granite);
    RUN(test_gemma);
    RUN(test_phi3);
    RUN(test_smollm3);
    RUN(test_gemma2);
    RUN(test_gemma3_text);
    RUN(test_gemma3_multimodal);
    RUN(test_qwen3);
    RUN(test_olmo2);
    RUN(test_mixtral);
    RUN(test_qwen3_moe);
    RUN(test_qwen2_moe);
    RUN(test_file_errors);
    RUN(test_key_errors);
    RUN(test_math_errors);
    RUN(test_fuzz);
    unlink(cfg_path);
    rmdir(tmp_dir);
    return check_summary("hf_config");
}
