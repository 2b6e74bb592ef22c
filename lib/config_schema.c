/* Every key ftkit's run config accepts, its type, default and meaning. This table is the
 * source of the config reference (configs/README.md). Sections: model, tuning, train,
 * data, dist. Keys from the Hugging Face world that our design makes moot are accepted
 * with a notice (moot = why). */
#include <math.h>

#include "config.h"

#define NONE NAN

static const ft_cfg_key schema[] = {
    /* model */
    {"model.name", FT_CFG_STRING, NULL, NULL, false, NONE,
     "Hugging Face model dir (config.json, safetensors, tokenizer.json)", NULL},
    {"model.max_seq_len", FT_CFG_INT, "2048", NULL, false, 1,
     "tokens per sample after truncation (and per packed row)", NULL},
    {"model.tokenizer", FT_CFG_STRING, "", NULL, false, NONE,
     "tokenizer dir or tokenizer.json when not the model dir", NULL},
    {"model.trust_remote_code", FT_CFG_BOOL, "false", NULL, false, NONE, "",
     "no Python runs: models are read from config.json and safetensors"},

    /* tuning */
    {"tuning.mode", FT_CFG_ENUM, "lora", "lora|qlora|full", false, NONE,
     "what is trained: LoRA adapters, LoRA on a 4-bit base, or every weight", NULL},
    {"tuning.backend", FT_CFG_ENUM, "bnb", "bnb|native", false, NONE,
     "quantization format of qlora (bnb: bitsandbytes NF4/FP4 layout)", NULL},
    {"tuning.lora.r", FT_CFG_INT, "16", NULL, false, 1, "LoRA rank", NULL},
    {"tuning.lora.alpha", FT_CFG_FLOAT, "32", NULL, false, NONE,
     "LoRA alpha (scaling alpha/r, or alpha/sqrt(r) with rslora)", NULL},
    {"tuning.lora.dropout", FT_CFG_FLOAT, "0.05", NULL, false, 0, "dropout on the LoRA input",
     NULL},
    {"tuning.lora.target_modules", FT_CFG_STRING, "all-linear", NULL, false, NONE,
     "comma-separated q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj, or all-linear",
     NULL},
    {"tuning.lora.rslora", FT_CFG_BOOL, "false", NULL, false, NONE, "rank-stabilised scaling",
     NULL},

    /* train */
    {"train.batch_size", FT_CFG_INT, "1", NULL, true, 1, "samples (or packed rows) per device per micro-batch", NULL},
    {"train.grad_accum", FT_CFG_INT, "1", NULL, true, 1, "micro-batches per optimizer step", NULL},
    {"train.epochs", FT_CFG_FLOAT, "1", NULL, false, 0, "passes over the training data", NULL},
    {"train.max_steps", FT_CFG_INT, "-1", NULL, false, -1,
     "optimizer steps; overrides epochs when > 0", NULL},
    {"train.learning_rate", FT_CFG_FLOAT, "2e-4", NULL, false, 0, "peak learning rate", NULL},
    {"train.lr_scheduler", FT_CFG_ENUM, "cosine", "constant|linear|cosine", false, NONE,
     "schedule after warmup", NULL},
    {"train.warmup_steps", FT_CFG_INT, "0", NULL, false, 0, "linear warmup steps", NULL},
    {"train.warmup_ratio", FT_CFG_FLOAT, "0", NULL, false, 0,
     "warmup as a fraction of all steps (when warmup_steps is 0)", NULL},
    {"train.weight_decay", FT_CFG_FLOAT, "0", NULL, false, 0, "AdamW decoupled weight decay", NULL},
    {"train.adam_beta1", FT_CFG_FLOAT, "0.9", NULL, false, 0, "AdamW beta1", NULL},
    {"train.adam_beta2", FT_CFG_FLOAT, "0.999", NULL, false, 0, "AdamW beta2", NULL},
    {"train.adam_epsilon", FT_CFG_FLOAT, "1e-8", NULL, false, 0, "AdamW epsilon", NULL},
    {"train.max_grad_norm", FT_CFG_FLOAT, "1.0", NULL, false, 0,
     "global-norm gradient clipping (0 = off)", NULL},
    {"train.bf16", FT_CFG_BOOL, "true", NULL, false, NONE, "bf16 compute on GPUs", NULL},
    {"train.fp16", FT_CFG_BOOL, "false", NULL, false, NONE, "fp16 compute on GPUs", NULL},
    {"train.gradient_checkpointing", FT_CFG_BOOL, "false", NULL, false, NONE,
     "recompute each layer in backward instead of keeping its activations", NULL},
    {"train.seed", FT_CFG_INT, "42", NULL, false, NONE, "seed of init, dropout and shuffling", NULL},
    {"train.output_dir", FT_CFG_STRING, "runs/default", NULL, false, NONE,
     "run dir: checkpoints, TensorBoard events, resolved config", NULL},
    {"train.logging_steps", FT_CFG_INT, "10", NULL, false, 1, "log every N steps", NULL},
    {"train.eval_strategy", FT_CFG_ENUM, "no", "no|steps|epoch", false, NONE, "when to evaluate", NULL},
    {"train.eval_steps", FT_CFG_INT, "200", NULL, false, 1, "evaluate every N steps", NULL},
    {"train.save_steps", FT_CFG_INT, "500", NULL, false, 1, "checkpoint every N steps", NULL},
    {"train.save_total_limit", FT_CFG_INT, "2", NULL, false, 0,
     "checkpoints kept (0 = all)", NULL},
    {"train.predict_with_generate", FT_CFG_BOOL, "false", NULL, false, NONE,
     "evaluation also generates and scores ROUGE-L / exact match", NULL},
    {"train.generation_num_beams", FT_CFG_INT, "1", NULL, false, 1,
     "beams for evaluation generation (greedy: 1)", NULL},
    {"train.generation_max_new_tokens", FT_CFG_INT, "64", NULL, false, 1,
     "generation length limit in evaluation", NULL},
    {"train.ddp_bucket_cap_mb", FT_CFG_INT, "25", NULL, false, 1,
     "gradient all-reduce bucket size in MiB", NULL},
    {"train.ddp_find_unused_parameters", FT_CFG_BOOL, "false", NULL, false, NONE, "",
     "the explicit backward always knows which parameters are used"},
    {"train.ddp_broadcast_buffers", FT_CFG_BOOL, "false", NULL, false, NONE, "",
     "Llama-family models have no buffers to broadcast"},
    {"train.dataloader_num_workers", FT_CFG_INT, "0", NULL, false, 0, "",
     "data is tokenized once up front in C; there are no loader workers"},
    {"train.dataloader_pin_memory", FT_CFG_BOOL, "false", NULL, false, NONE, "",
     "batches are copied from pinned buffers whenever a GPU is used"},
    {"train.eval_do_concat_batches", FT_CFG_BOOL, "false", NULL, false, NONE, "",
     "evaluation metrics are reduced on the fly; predictions are never concatenated"},
    {"train.eval_accumulation_steps", FT_CFG_INT, "1", NULL, false, 1, "",
     "evaluation metrics are reduced on the fly"},

    /* data */
    {"data.train_path", FT_CFG_STRING, NULL, NULL, false, NONE,
     "training JSONL file, or - for stdin", NULL},
    {"data.eval_path", FT_CFG_STRING, "", NULL, false, NONE, "evaluation JSONL file", NULL},
    {"data.eval_fraction", FT_CFG_FLOAT, "0", NULL, false, 0,
     "held-out fraction of the training data when there is no eval_path", NULL},
    {"data.format", FT_CFG_ENUM, "auto", "auto|text|prompt_completion|alpaca|chat|tokens", false,
     NONE, "record format (auto: from the keys of the first record)", NULL},
    {"data.chat_template", FT_CFG_ENUM, "auto", "auto|chatml|llama3|llama2|mistral|plain|alpaca",
     false, NONE, "chat template (auto: detected from tokenizer_config.json)", NULL},
    {"data.train_on_all", FT_CFG_BOOL, "false", NULL, false, NONE,
     "count prompt and user tokens in the loss too", NULL},
    {"data.add_eos", FT_CFG_BOOL, "true", NULL, false, NONE, "text format: append EOS", NULL},
    {"data.packing", FT_CFG_BOOL, "false", NULL, false, NONE,
     "pack samples into rows of max_seq_len (attention kept inside each sample)", NULL},
    {"data.shuffle", FT_CFG_BOOL, "true", NULL, false, NONE, "shuffle by seed and epoch", NULL},
    {"data.skip_bad_lines", FT_CFG_BOOL, "false", NULL, false, NONE,
     "skip (and count) malformed records instead of stopping", NULL},

    /* dist */
    {"dist.strategy", FT_CFG_ENUM, "auto", "auto|none|ddp|zero|fsdp", false, NONE,
     "how ranks share the work (auto: none for one rank, ddp for several)", NULL},
    {"dist.zero_stage", FT_CFG_INT, "0", NULL, false, 0, "ZeRO stage 0-3", NULL},
    {"dist.deepspeed_config", FT_CFG_STRING, "", NULL, false, NONE,
     "DeepSpeed-style JSON (deepspeed_like/)", NULL},

    {NULL, 0, NULL, NULL, false, NONE, NULL, NULL},
};

const ft_cfg_key *ft_config_schema(void) { return schema; }
