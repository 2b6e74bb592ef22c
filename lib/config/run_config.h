/* config/: the run config, typed. This is the folder's main header.
 *
 * Owns: the schema of every key (config_schema.c: key, type, default, bounds, doc and
 * the struct field it lands in), the YAML reader, the --set / --set-var overrides, the
 * DeepSpeed-style JSON (ds_config.h), the resolved config written back as YAML, the
 * config reference (configs/README.md) and the global batch rule. Only this folder knows
 * key strings: every other module reads the fields of ft_run_config below.
 * May call: core.
 * Any other folder may include this one.
 *
 * A run config is filled once, in this order, onto the schema's defaults:
 *
 *   YAML file -> --set-var NAME=value -> --set key=value -> dist.deepspeed_config JSON
 *   (ft_run_config_load), then the "auto" values that need the model and the machine
 *   (train.batch_size / grad_accum: memory/auto_batch.h, which writes the chosen numbers
 *   into the struct).
 *
 * Field types follow the schema's: int keys are long, float keys double, bool keys bool,
 * enum keys the enums below (their order is the order of the schema's choices), string
 * keys NUL-terminated char arrays ("" = not set), JSON keys the text of a JSON object.
 * An int key that allows "auto" holds FT_CFG_AUTO while it is auto; the one string key
 * that does (train.memory_budget) holds the text "auto". Keys accepted without effect
 * (moot) have fields too, so the resolved config shows what was given. */
#ifndef FT_RUN_CONFIG_H
#define FT_RUN_CONFIG_H

#include <stdbool.h>
#include <stdio.h>

#include "core/ft_error.h"

/* An int key that allows auto and is auto (every such key has a minimum >= 0). */
#define FT_CFG_AUTO (-1L)

/* Sizes of the string fields, NUL included; a longer value is an error naming the key. */
#define FT_CFG_PATH_MAX 4096
#define FT_CFG_LIST_MAX 1024
#define FT_CFG_JSON_MAX 4096 /* no longer than a path: ft-train --get prints either */

/* tuning.mode */
typedef enum ft_tuning_mode { FT_TUNING_LORA = 0, FT_TUNING_QLORA, FT_TUNING_FULL } ft_tuning_mode;

/* tuning.backend */
typedef enum ft_quant_backend { FT_QBACKEND_BNB = 0, FT_QBACKEND_NATIVE } ft_quant_backend;

/* tuning.quant.type (quant/quant.h's ft_quant_type has a "none" besides) */
typedef enum ft_cfg_quant_type {
    FT_CFG_QUANT_NF4 = 0,
    FT_CFG_QUANT_FP4,
    FT_CFG_QUANT_INT8
} ft_cfg_quant_type;

/* train.lr_scheduler */
typedef enum ft_cfg_lr_scheduler {
    FT_CFG_LR_CONSTANT = 0,
    FT_CFG_LR_LINEAR,
    FT_CFG_LR_COSINE
} ft_cfg_lr_scheduler;

/* train.device */
typedef enum ft_cfg_device {
    FT_CFG_DEVICE_AUTO = 0,
    FT_CFG_DEVICE_CPU,
    FT_CFG_DEVICE_CUDA
} ft_cfg_device;

/* tuning.lora.ensure_weight_tying */
typedef enum ft_cfg_tying {
    FT_CFG_TYING_AUTO = 0,
    FT_CFG_TYING_TRUE,
    FT_CFG_TYING_FALSE
} ft_cfg_tying;

/* train.eval_strategy */
typedef enum ft_eval_strategy { FT_EVAL_NO = 0, FT_EVAL_STEPS, FT_EVAL_EPOCH } ft_eval_strategy;

/* train.objective */
typedef enum ft_cfg_objective {
    FT_CFG_OBJECTIVE_SFT = 0,
    FT_CFG_OBJECTIVE_DPO,
    FT_CFG_OBJECTIVE_ORPO
} ft_cfg_objective;

/* train.pref.loss_type (TRL's DPOConfig.loss_type) */
typedef enum ft_cfg_pref_loss {
    FT_CFG_PREF_SIGMOID = 0,
    FT_CFG_PREF_IPO,
    FT_CFG_PREF_ROBUST
} ft_cfg_pref_loss;

/* data.format */
typedef enum ft_cfg_data_format {
    FT_CFG_FORMAT_AUTO = 0,
    FT_CFG_FORMAT_TEXT,
    FT_CFG_FORMAT_PROMPT_COMPLETION,
    FT_CFG_FORMAT_ALPACA,
    FT_CFG_FORMAT_CHAT,
    FT_CFG_FORMAT_SHAREGPT,
    FT_CFG_FORMAT_TOKENS
} ft_cfg_data_format;

/* data.chat_template */
typedef enum ft_cfg_chat_template {
    FT_CFG_TMPL_AUTO = 0,
    FT_CFG_TMPL_CHATML,
    FT_CFG_TMPL_PLAIN,
    FT_CFG_TMPL_ALPACA
} ft_cfg_chat_template;

/* dist.strategy */
typedef enum ft_cfg_strategy {
    FT_CFG_STRATEGY_AUTO = 0,
    FT_CFG_STRATEGY_NONE,
    FT_CFG_STRATEGY_DDP,
    FT_CFG_STRATEGY_ZERO, /* the stage is dist.zero_stage */
    FT_CFG_STRATEGY_ZERO1,
    FT_CFG_STRATEGY_ZERO2,
    FT_CFG_STRATEGY_ZERO3,
    FT_CFG_STRATEGY_FSDP,
    FT_CFG_STRATEGY_MODEL_PARALLEL
} ft_cfg_strategy;

/* dist.offload_optimizer */
typedef enum ft_cfg_offload { FT_CFG_OFFLOAD_NONE = 0, FT_CFG_OFFLOAD_CPU } ft_cfg_offload;

typedef struct ft_model_section {
    char name[FT_CFG_PATH_MAX];      /* required where a model is loaded */
    long max_seq_len;
    char tokenizer[FT_CFG_PATH_MAX];
    char add_special_tokens[FT_CFG_JSON_MAX]; /* a JSON array of strings; "[]" = none */
    long resize_to_multiple_of;      /* 0: none */
    bool trust_remote_code;          /* moot */
} ft_model_section;

typedef struct ft_tuning_section {
    ft_tuning_mode mode;
    ft_quant_backend backend;
    struct {
        ft_cfg_quant_type type;
        long blocksize;
        bool double_quant;
        char skip_modules[FT_CFG_LIST_MAX];
    } quant;
    struct {
        long r;
        double alpha;
        double dropout;
        char target_modules[FT_CFG_LIST_MAX];
        char target_parameters[FT_CFG_LIST_MAX];
        char rank_pattern[FT_CFG_JSON_MAX];  /* a JSON object's text: pattern -> rank */
        char alpha_pattern[FT_CFG_JSON_MAX]; /* pattern -> alpha */
        bool rslora;
        bool use_dora;
        char modules_to_save[FT_CFG_LIST_MAX];
        ft_cfg_tying ensure_weight_tying;
        char init_adapter[FT_CFG_PATH_MAX];
    } lora;
} ft_tuning_section;

typedef struct ft_train_section {
    long batch_size;                 /* FT_CFG_AUTO until resolved */
    long grad_accum;                 /* FT_CFG_AUTO until resolved */
    char memory_budget[64];          /* a size ("6GiB"), or "auto" */
    long global_batch_size;          /* FT_CFG_AUTO: not fixed */
    double epochs;
    long max_steps;
    double learning_rate;
    ft_cfg_lr_scheduler lr_scheduler;
    long warmup_steps;
    double warmup_ratio;
    double weight_decay;
    double adam_beta1, adam_beta2, adam_epsilon;
    double max_grad_norm;
    bool skip_nonfinite_steps;       /* else a non-finite loss or grad norm stops the run */
    ft_cfg_device device;
    bool bf16, fp16;
    bool gradient_checkpointing;
    long loss_chunk_tokens;          /* FT_CFG_AUTO: the model's own choice */
    long seed;
    char output_dir[FT_CFG_PATH_MAX];
    bool overwrite_output_dir;       /* a new run may clear an earlier run's outputs */
    long logging_steps;
    ft_eval_strategy eval_strategy;
    long eval_steps, save_steps, save_total_limit;
    bool predict_with_generate;
    long generation_num_beams, generation_max_new_tokens;
    long ddp_bucket_cap_mb;
    /* moot */
    bool ddp_find_unused_parameters, ddp_broadcast_buffers;
    long dataloader_num_workers;
    bool dataloader_pin_memory, eval_do_concat_batches;
    long eval_accumulation_steps;
    ft_cfg_objective objective;      /* sft, or a preference objective on pair data */
    struct {
        double beta;                 /* DPO's beta (IPO's tau), ORPO's lambda */
        ft_cfg_pref_loss loss_type;
        double label_smoothing;      /* robust: the probability a label is flipped */
    } pref;
} ft_train_section;

typedef struct ft_data_section {
    char train_path[FT_CFG_PATH_MAX]; /* required for training; "-" is stdin */
    char eval_path[FT_CFG_PATH_MAX];
    double eval_fraction;
    ft_cfg_data_format format;
    ft_cfg_chat_template chat_template;
    char chat_template_name[256];             /* "" = transformers' choice */
    char chat_template_kwargs[FT_CFG_JSON_MAX]; /* a JSON object's text */
    bool train_on_all, add_eos, packing, shuffle, skip_bad_lines;
} ft_data_section;

typedef struct ft_dist_section {
    ft_cfg_strategy strategy;
    long zero_stage;
    ft_cfg_offload offload_optimizer;
    ft_cfg_offload offload_params; /* dist.offload_params */
    bool overlap_comm, prefetch;
    long pipeline_micro_batches;
    double timeout_s;
    bool timeout_given; /* dist.timeout_s was set (file, override), not the default: the
                         * environment's timeout (lib/dist/dist.h) does not replace it */
    char deepspeed_config[FT_CFG_PATH_MAX];
} ft_dist_section;

typedef struct ft_run_config {
    ft_model_section model;
    ft_tuning_section tuning;
    ft_train_section train;
    ft_data_section data;
    ft_dist_section dist;
} ft_run_config;

/* Where a run config comes from; each part is optional (NULL / 0). */
typedef struct ft_config_sources {
    const char *yaml_path;                 /* the run config file */
    const char *const *vars;               /* --set-var NAME=value, applied in order */
    size_t n_vars;
    const char *const *sets;               /* --set key=value, then these, in order */
    size_t n_sets;
    FILE *notes;                           /* notices of moot keys */
    FILE *deepspeed_notes;                 /* notices of the DeepSpeed JSON */
} ft_config_sources;

/* Fills *out with the schema's defaults, then the sources in the order above, then the
 * DeepSpeed JSON that dist.deepspeed_config names. Errors name the file and line, the
 * option or the JSON key, and the config key; *out is then unspecified. */
int ft_run_config_load(ft_run_config *out, const ft_config_sources *src, ft_err *err);

/* The schema's defaults alone. */
void ft_run_config_defaults(ft_run_config *out);

/* Writes the config as YAML, every key in schema order (defaults as the schema spells
 * them, a string key that is unset and required as null): the run dir keeps it, and
 * --print-config shows it. */
int ft_run_config_write_yaml(const ft_run_config *rc, FILE *out, ft_err *err);

/* One value as text, as YAML spells it ("auto" while auto, "" for an unset string),
 * into out (n bytes): ft-train --get. Errors: an unknown key ("unknown key (see
 * configs/README.md)"), and a required key that is not set. */
int ft_run_config_key_text(const ft_run_config *rc, const char *key, char *out, size_t n,
                           ft_err *err);

/* The reference of every key as a Markdown table (configs/README.md is this output). */
void ft_run_config_write_reference(FILE *out);

/* The names data.chat_template_kwargs may not set, NULL-terminated: the template
 * variables and the parameters of apply_chat_template that transformers sets itself
 * (messages, tools, documents, add_generation_prompt, the special token names, ...). */
extern const char *const ft_chat_template_reserved[];

/* The Make-style variable of a key: "train.batch_size" -> "TRAIN_BATCH_SIZE". */
void ft_config_var_name(const char *key, char *out, size_t n);

/* Enforces train.global_batch_size = train.batch_size x train.grad_accum x world_size
 * when the global size is set (not auto). An auto grad_accum is derived from a concrete
 * batch_size, an auto batch_size from a concrete grad_accum (an error when the global
 * size does not divide); two concrete values that do not multiply out are an error giving
 * the numbers and the formula. When both are auto nothing changes: the memory plan
 * chooses batch_size first, then call again. With the global size auto nothing changes
 * either. */
int ft_run_config_global_batch(ft_train_section *t, int world_size, ft_err *err);

/* The ZeRO stage dist asks for: 1-3 for zero1-zero3, dist.zero_stage for zero, 0 for
 * every other strategy. */
int ft_run_config_zero_stage(const ft_dist_section *d);

/* Names of enum values, as the schema spells them ("lora", "zero3", "cosine", ...). */
const char *ft_tuning_mode_name(ft_tuning_mode m);
const char *ft_cfg_strategy_name(ft_cfg_strategy s);

#endif
