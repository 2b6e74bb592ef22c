/* Every key ftkit's run config accepts: its type, default, bounds and meaning, and the
 * field of ft_run_config it fills (KEY(train.batch_size) is both the key's name and
 * that field, so the two cannot drift apart). This table is the source of the config
 * reference (configs/README.md). Sections: model, tuning, train, data, dist. Keys from
 * the Hugging Face world that our design makes moot are accepted with a notice (moot =
 * why). */
#include <math.h>
#include <stddef.h>

#include "config/config.h"

#define NONE NAN
#define KEY(field) #field, offsetof(ft_run_config, field), sizeof(((ft_run_config *)0)->field)
#define CHOICES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* apply_chat_template's own parameters and the template variables it sets (render's
 * messages, tools, documents, add_generation_prompt; special_tokens_map's names): a
 * template kwarg of one of these names would be taken by transformers as that parameter,
 * be refused by it, or replace a special token. */
const char *const ft_chat_template_reserved[] = {
    "messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
    "conversation", "chat_template", "tokenize", "sanitize_control_tokens", "padding",
    "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "bos_token", "eos_token",
    "unk_token", "sep_token", "pad_token", "cls_token", "mask_token", NULL};

static const ft_cfg_key schema[] = {
    /* model */
    {KEY(model.name), FT_CFG_STRING, NULL, NULL, false, NONE, NONE,
     "Hugging Face model dir (config.json, safetensors, tokenizer.json)", NULL},
    {KEY(model.max_seq_len), FT_CFG_INT, "2048", NULL, false, 1, NONE,
     "tokens per sample after truncation (and per packed row)", NULL},
    {KEY(model.tokenizer), FT_CFG_STRING, "", NULL, false, NONE, NONE,
     "tokenizer dir or tokenizer.json when not the model dir", NULL},
    {KEY(model.add_special_tokens), FT_CFG_JSON, "[]", NULL, false, NONE, NONE,
     "tokens added to the tokenizer as special tokens, as tokenizer.add_special_tokens("
     "{\"additional_special_tokens\": [...]}) (matched whole, never split; one already "
     "in the vocabulary keeps its id), e.g. [\"<|im_start|>\", \"<|im_end|>\"]; the "
     "embedding and the head grow to the tokenizer's size as resize_token_embeddings("
     "len(tokenizer)) does (new rows: the mean of the old rows) and, in LoRA modes, are "
     "trained in full (tuning.lora.modules_to_save, unless it or target_modules names "
     "them); the run saves the grown tokenizer with its weights",
     NULL},
    {KEY(model.resize_to_multiple_of), FT_CFG_INT, "0", NULL, false, 0, NONE,
     "with add_special_tokens growing the vocabulary: its size rounded up to a multiple of "
     "this, as resize_token_embeddings(len(tokenizer), pad_to_multiple_of=N) (TRL's "
     "resize_to_multiple_of); the padding rows are the mean too; 0: none",
     NULL},
    {KEY(model.trust_remote_code), FT_CFG_BOOL, "false", NULL, false, NONE, NONE, "",
     "no Python runs: models are read from config.json and safetensors"},

    /* tuning */
    {KEY(tuning.mode), FT_CFG_ENUM, "lora", CHOICES("lora", "qlora", "full"), false, NONE, NONE,
     "what is trained: LoRA adapters, LoRA on a 4-bit base, or every weight", NULL},
    {KEY(tuning.backend), FT_CFG_ENUM, "bnb", CHOICES("bnb", "native"), false, NONE, NONE,
     "quantization format of qlora (bnb: bitsandbytes NF4/FP4 layout)", NULL},
    {KEY(tuning.quant.type), FT_CFG_ENUM, "nf4", CHOICES("nf4", "fp4", "int8"), false, NONE, NONE,
     "qlora: how a 16/32-bit base is quantized on load (a checkpoint quantized already, by "
     "ft-quantize or bitsandbytes, is used as it is)",
     NULL},
    {KEY(tuning.quant.blocksize), FT_CFG_INT, "64", NULL, false, 32, 4096,
     "qlora, 4-bit: elements per absmax block (a power of two)", NULL},
    {KEY(tuning.quant.double_quant), FT_CFG_BOOL, "true", NULL, false, NONE, NONE,
     "qlora, 4-bit: quantize the block absmax to 8 bits too (QLoRA's double quantization)", NULL},
    {KEY(tuning.quant.skip_modules), FT_CFG_STRING, "lm_head", NULL, false, NONE, NONE,
     "qlora: comma-separated module-name parts left dense (embeddings, norms and lm_head "
     "always are)",
     NULL},
    {KEY(tuning.lora.r), FT_CFG_INT, "16", NULL, false, 1, NONE, "LoRA rank", NULL},
    {KEY(tuning.lora.alpha), FT_CFG_FLOAT, "32", NULL, false, NONE, NONE,
     "LoRA alpha (scaling alpha/r, or alpha/sqrt(r) with rslora)", NULL},
    {KEY(tuning.lora.dropout), FT_CFG_FLOAT, "0.05", NULL, false, 0, NONE,
     "dropout on the LoRA input", NULL},
    {KEY(tuning.lora.target_modules), FT_CFG_STRING, "all-linear", NULL, false, NONE, NONE,
     "comma-separated q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj (phi3: "
     "qkv_proj,o_proj,gate_up_proj,down_proj; mixtral: q_proj,k_proj,v_proj,o_proj, gate "
     "(the router), w1 with w3, w2 (the experts), as PEFT's target_parameters, with dropout "
     "0), or all-linear; also embed_tokens and lm_head "
     "(LoRA on the embedding and the head, as PEFT's; tied embeddings: each its own pair, "
     "as PEFT without ensure_weight_tying)",
     NULL},
    {KEY(tuning.lora.target_parameters), FT_CFG_STRING, "", NULL, false, NONE, NONE,
     "a MoE's parameters given LoRA as PEFT's explicit LoraConfig(target_parameters=[...]): "
     "comma-separated gate.weight (the router), gate_up_proj, down_proj (the fused experts; "
     "gate_up_proj with rank r and alpha, as PEFT without a rank pattern), with dropout 0; "
     "for qwen2_moe, whose MLP names PEFT does not convert (mixtral, qwen3_moe: the "
     "target_modules names)",
     NULL},
    {KEY(tuning.lora.rank_pattern), FT_CFG_JSON, "{}", NULL, false, NONE, NONE,
     "per-module ranks, as PEFT's rank_pattern: a mapping of module patterns to ranks, e.g. "
     "{q_proj: 8, model.layers.0.mlp.down_proj: 2}; a module takes the first key (in the "
     "order given) whose regex matches its name or a dotted suffix of it (PEFT's names: "
     "model.layers.N.self_attn.q_proj, model.embed_tokens, lm_head; a MoE's "
     "model.layers.N.mlp.gate.weight, model.layers.N.mlp.experts.gate_up_proj and down_proj), "
     "others keep r; a key matching no targeted module is an error; saved in the adapter "
     "in this order",
     NULL},
    {KEY(tuning.lora.alpha_pattern), FT_CFG_JSON, "{}", NULL, false, NONE, NONE,
     "per-module alphas, as PEFT's alpha_pattern: the same mapping to alphas (scaling "
     "alpha / r with the module's own rank)",
     NULL},
    {KEY(tuning.lora.rslora), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "rank-stabilised scaling", NULL},
    {KEY(tuning.lora.use_dora), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "DoRA (PEFT's use_dora): a trainable magnitude per output row of each LoRA layer, "
     "y = b + m / ||W + s B A||_row * (x W^T + s x A^T B^T)",
     NULL},
    {KEY(tuning.lora.modules_to_save), FT_CFG_STRING, "", NULL, false, NONE, NONE,
     "modules trained in full beside the LoRA pairs and saved in the adapter, as PEFT's "
     "modules_to_save: embed_tokens, lm_head or both, comma-separated (tied embeddings: the "
     "one embedding, shared by the head, as PEFT's ensure_weight_tying)",
     NULL},
    {KEY(tuning.lora.ensure_weight_tying), FT_CFG_ENUM, "auto", CHOICES("auto", "true", "false"),
     false, NONE, NONE,
     "PEFT's ensure_weight_tying, on a model with tied word embeddings: true keeps the "
     "embedding and lm_head tied in the adapter (modules_to_save: one trained copy shared by "
     "both; LoRA (and DoRA) on embed_tokens / lm_head: the head's pair is the embedding's, "
     "transposed; LoRA on one beside modules_to_save naming the other is refused, as PEFT "
     "refuses it), false trains them apart (modules_to_save: a copy of each listed module, "
     "which unties the model; LoRA: a pair of each module's own); auto: true with "
     "modules_to_save, false with LoRA on them",
     NULL},
    {KEY(tuning.lora.init_adapter), FT_CFG_STRING, "", NULL, false, NONE, NONE,
     "PEFT adapter dir to start from (e.g. made by ft-lora-init); r, alpha, targets and "
     "each module's rank and alpha (rank_pattern, alpha_pattern) must match",
     NULL},

    /* train */
    {KEY(train.batch_size), FT_CFG_INT, "1", NULL, true, 1, NONE,
     "samples (or packed rows) per device per micro-batch; auto: the largest (up to 1024 and "
     "the training file's records per rank) whose planned per-rank peak (ft-train --plan) "
     "fits train.memory_budget, dividing global_batch_size / world size when that is set",
     NULL},
    {KEY(train.grad_accum), FT_CFG_INT, "1", NULL, true, 1, NONE,
     "micro-batches per optimizer step; auto: global_batch_size / (batch_size x world size) "
     "when that is set, else 1",
     NULL},
    {KEY(train.memory_budget), FT_CFG_STRING, "auto", NULL, true, NONE, NONE,
     "memory per rank that batch_size auto may plan for: a size (512MiB, 6GiB, 8GB; a bare "
     "number is bytes); auto: a GPU's free memory x 0.9, on CPU ranks MemAvailable x 0.8 / "
     "ranks on the node",
     NULL},
    {KEY(train.global_batch_size), FT_CFG_INT, "auto", NULL, true, 1, NONE,
     "samples per optimizer step over all ranks = batch_size x grad_accum x world size; "
     "checked when set",
     NULL},
    {KEY(train.epochs), FT_CFG_FLOAT, "1", NULL, false, 0, NONE, "passes over the training data",
     NULL},
    {KEY(train.max_steps), FT_CFG_INT, "-1", NULL, false, -1, NONE,
     "optimizer steps; overrides epochs when > 0", NULL},
    {KEY(train.learning_rate), FT_CFG_FLOAT, "2e-4", NULL, false, 0, NONE, "peak learning rate",
     NULL},
    {KEY(train.lr_scheduler), FT_CFG_ENUM, "cosine", CHOICES("constant", "linear", "cosine"), false,
     NONE, NONE, "schedule after warmup", NULL},
    {KEY(train.warmup_steps), FT_CFG_INT, "0", NULL, false, 0, NONE, "linear warmup steps", NULL},
    {KEY(train.warmup_ratio), FT_CFG_FLOAT, "0", NULL, false, 0, NONE,
     "warmup as a fraction of all steps (when warmup_steps is 0)", NULL},
    {KEY(train.weight_decay), FT_CFG_FLOAT, "0", NULL, false, 0, NONE,
     "AdamW decoupled weight decay", NULL},
    {KEY(train.adam_beta1), FT_CFG_FLOAT, "0.9", NULL, false, 0, NONE, "AdamW beta1", NULL},
    {KEY(train.adam_beta2), FT_CFG_FLOAT, "0.999", NULL, false, 0, NONE, "AdamW beta2", NULL},
    {KEY(train.adam_epsilon), FT_CFG_FLOAT, "1e-8", NULL, false, 0, NONE, "AdamW epsilon", NULL},
    {KEY(train.max_grad_norm), FT_CFG_FLOAT, "1.0", NULL, false, 0, NONE,
     "global-norm gradient clipping (0 = off)", NULL},
    {KEY(train.skip_nonfinite_steps), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "a step whose loss or gradient norm is not finite (inf, nan) is skipped (not applied; "
     "counted in the log, TensorBoard and run_summary.json) instead of stopping the run with "
     "an error",
     NULL},
    {KEY(train.device), FT_CFG_ENUM, "auto", CHOICES("auto", "cpu", "cuda"), false, NONE, NONE,
     "where the run computes: auto takes the GPU when this build has CUDA and one is visible "
     "(each rank the GPU of its node-local rank), else the CPU (fp32)",
     NULL},
    {KEY(train.bf16), FT_CFG_BOOL, "true", NULL, false, NONE, NONE,
     "GPU: bf16 weights and activations with fp32 master weights, gradients and reductions "
     "(false: fp32 throughout); the CPU computes in fp32",
     NULL},
    {KEY(train.fp16), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "fp16 compute: refused on the GPU (no loss scaling; use bf16), ignored on the CPU", NULL},
    {KEY(train.gradient_checkpointing), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "recompute each layer in backward instead of keeping its activations", NULL},
    {KEY(train.loss_chunk_tokens), FT_CFG_INT, "auto", NULL, true, 0, NONE,
     "tokens whose logits lm_head + cross-entropy compute at once, so the [tokens, vocab] "
     "logits are never held whole (backward recomputes them a chunk at a time); 0: the whole "
     "micro-batch at once; auto: at most 64M logits a chunk, rounded down to a multiple of 64 "
     "tokens for fast GEMMs (512 tokens of a 128256 vocabulary); a number is taken as given",
     NULL},
    {KEY(train.seed), FT_CFG_INT, "42", NULL, false, NONE, NONE,
     "seed of init, dropout and shuffling", NULL},
    {KEY(train.output_dir), FT_CFG_STRING, "runs/default", NULL, false, NONE, NONE,
     "run dir: checkpoints, TensorBoard events, resolved config; a dir holding another run's "
     "outputs is refused (resume it, or see overwrite_output_dir)",
     NULL},
    {KEY(train.overwrite_output_dir), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "a new run in a dir holding an earlier run's outputs removes them first (checkpoint-*, "
     "final, events, metrics.jsonl, config.yaml, run_summary.json; other files stay); a "
     "resumed run removes nothing",
     NULL},
    {KEY(train.logging_steps), FT_CFG_INT, "10", NULL, false, 1, NONE, "log every N steps", NULL},
    {KEY(train.objective), FT_CFG_ENUM, "sft", CHOICES("sft", "dpo", "orpo"), false, NONE, NONE,
     "what the loss is: sft (next-token loss on the data's labels), dpo (Direct Preference "
     "Optimization on prompt/chosen/rejected pairs, TRL's DPOTrainer; the reference model is "
     "the base with the adapter off under lora/qlora (an embedding / head trained in full: "
     "their original values; from tuning.lora.init_adapter: that adapter as it starts), a "
     "frozen copy of the base under full) "
     "or orpo (Odds Ratio Preference Optimization, TRL's ORPOTrainer: no reference model)",
     NULL},
    {KEY(train.pref.beta), FT_CFG_FLOAT, "0.1", NULL, false, 0, NONE,
     "dpo: beta, how far the policy may move from the reference (ipo: its tau); orpo: the "
     "weight of the odds-ratio term (TRL's beta, the paper's lambda)",
     NULL},
    {KEY(train.pref.loss_type), FT_CFG_ENUM, "sigmoid", CHOICES("sigmoid", "ipo", "robust"), false,
     NONE, NONE,
     "dpo: the loss of the reward margin, as TRL's loss_type: sigmoid -logsigmoid(beta m); "
     "ipo (m per completion token - 1/(2 beta))^2; robust, sigmoid with label_smoothing as "
     "the probability that a pair's labels are flipped",
     NULL},
    {KEY(train.pref.label_smoothing), FT_CFG_FLOAT, "0", NULL, false, 0, NONE,
     "dpo, loss_type robust: the probability a preference label is flipped, in [0, 0.5) "
     "(TRL applies it to robust only: with sigmoid or ipo a nonzero value is refused)",
     NULL},
    {KEY(train.eval_strategy), FT_CFG_ENUM, "no", CHOICES("no", "steps", "epoch"), false, NONE,
     NONE, "when to evaluate", NULL},
    {KEY(train.eval_steps), FT_CFG_INT, "200", NULL, false, 1, NONE, "evaluate every N steps",
     NULL},
    {KEY(train.save_steps), FT_CFG_INT, "500", NULL, false, 1, NONE, "checkpoint every N steps",
     NULL},
    {KEY(train.save_total_limit), FT_CFG_INT, "2", NULL, false, 0, NONE,
     "checkpoints kept (0 = all)", NULL},
    {KEY(train.predict_with_generate), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "evaluation also generates and scores ROUGE-L / exact match", NULL},
    {KEY(train.generation_num_beams), FT_CFG_INT, "1", NULL, false, 1, NONE,
     "beams for evaluation generation (greedy: 1)", NULL},
    {KEY(train.generation_max_new_tokens), FT_CFG_INT, "64", NULL, false, 1, NONE,
     "generation length limit in evaluation", NULL},
    {KEY(train.ddp_bucket_cap_mb), FT_CFG_INT, "25", NULL, false, 1, NONE,
     "gradient all-reduce bucket size in MiB", NULL},
    {KEY(train.ddp_find_unused_parameters), FT_CFG_BOOL, "false", NULL, false, NONE, NONE, "",
     "the explicit backward always knows which parameters are used"},
    {KEY(train.ddp_broadcast_buffers), FT_CFG_BOOL, "false", NULL, false, NONE, NONE, "",
     "Llama-family models have no buffers to broadcast"},
    {KEY(train.dataloader_num_workers), FT_CFG_INT, "0", NULL, false, 0, NONE, "",
     "data is tokenized once up front in C; there are no loader workers"},
    {KEY(train.dataloader_pin_memory), FT_CFG_BOOL, "false", NULL, false, NONE, NONE, "",
     "batches are copied from pinned buffers whenever a GPU is used"},
    {KEY(train.eval_do_concat_batches), FT_CFG_BOOL, "false", NULL, false, NONE, NONE, "",
     "evaluation metrics are reduced on the fly; predictions are never concatenated"},
    {KEY(train.eval_accumulation_steps), FT_CFG_INT, "1", NULL, false, 1, NONE, "",
     "evaluation metrics are reduced on the fly"},

    /* data */
    {KEY(data.train_path), FT_CFG_STRING, NULL, NULL, false, NONE, NONE,
     "training JSONL file, or - for stdin", NULL},
    {KEY(data.eval_path), FT_CFG_STRING, "", NULL, false, NONE, NONE, "evaluation JSONL file",
     NULL},
    {KEY(data.eval_fraction), FT_CFG_FLOAT, "0", NULL, false, 0, NONE,
     "held-out fraction of the training data when there is no eval_path", NULL},
    {KEY(data.format), FT_CFG_ENUM, "auto",
     CHOICES("auto", "text", "prompt_completion", "alpaca", "chat", "sharegpt", "tokens"), false,
     NONE, NONE,
     "record format (auto: from the keys of the first record; sharegpt: conversations of "
     "from/value, human/gpt/system mapped to user/assistant/system)", NULL},
    {KEY(data.chat_template), FT_CFG_ENUM, "auto",
     CHOICES("auto", "chatml", "plain", "alpaca"), false, NONE, NONE,
     "chat template (auto: the model's own Jinja template from tokenizer_config.json or "
     "chat_template.jinja, rendered as transformers renders it; chatml, plain, alpaca: "
     "ours, for models that ship none)", NULL},
    {KEY(data.chat_template_name), FT_CFG_STRING, "", NULL, false, NONE, NONE,
     "with chat_template auto: which of the model's named templates renders every chat, as "
     "apply_chat_template(chat_template=NAME) (default, tool_use, rag, ...: the names of "
     "tokenizer_config.json's list form and additional_chat_templates/NAME.jinja); empty: "
     "transformers' choice (tool_use for a record with tools when the model has it, else "
     "default)", NULL},
    {KEY(data.chat_template_kwargs), FT_CFG_JSON, "{}", ft_chat_template_reserved, false, NONE,
     NONE,
     "more variables for the chat template, as apply_chat_template(**kwargs): a mapping of "
     "names to values of any JSON type, e.g. {\"enable_thinking\": false}; names "
     "transformers sets itself (messages, tools, documents, add_generation_prompt, the "
     "special tokens, ...) are refused", NULL},
    {KEY(data.train_on_all), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "count prompt and user tokens in the loss too", NULL},
    {KEY(data.add_eos), FT_CFG_BOOL, "true", NULL, false, NONE, NONE, "text format: append EOS",
     NULL},
    {KEY(data.packing), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "pack samples into rows of max_seq_len (attention kept inside each sample)", NULL},
    {KEY(data.shuffle), FT_CFG_BOOL, "true", NULL, false, NONE, NONE, "shuffle by seed and epoch",
     NULL},
    {KEY(data.skip_bad_lines), FT_CFG_BOOL, "false", NULL, false, NONE, NONE,
     "skip (and count) malformed records instead of stopping", NULL},

    /* dist */
    {KEY(dist.strategy), FT_CFG_ENUM, "auto",
     CHOICES("auto", "none", "ddp", "zero", "zero1", "zero2", "zero3", "fsdp", "model_parallel"),
     false, NONE, NONE,
     "how ranks share the work (auto: none for one rank, ddp for several; zero1-3: ZeRO stage; "
     "zero uses dist.zero_stage; model_parallel: layers split across ranks)",
     NULL},
    {KEY(dist.zero_stage), FT_CFG_INT, "0", NULL, false, 0, 3,
     "ZeRO stage 0-3 when dist.strategy is zero", NULL},
    {KEY(dist.offload_optimizer), FT_CFG_ENUM, "none", CHOICES("none", "cpu"), false, NONE, NONE,
     "ZeRO-Offload: optimizer state and update on the CPU", NULL},
    {KEY(dist.offload_params), FT_CFG_ENUM, "none", CHOICES("none", "cpu"), false, NONE, NONE,
     "zero3/fsdp: each rank's shard of the frozen base (a QLoRA base's quantized blocks too) "
     "in host memory, copied in per layer (DeepSpeed offload_param, FSDP cpu_offload)", NULL},
    {KEY(dist.overlap_comm), FT_CFG_BOOL, "true", NULL, false, NONE, NONE,
     "overlap gradient communication with backward", NULL},
    {KEY(dist.prefetch), FT_CFG_BOOL, "true", NULL, false, NONE, NONE,
     "zero3/fsdp: gather the next layer's parameters while computing this one", NULL},
    {KEY(dist.pipeline_micro_batches), FT_CFG_INT, "1", NULL, false, 1, NONE,
     "model_parallel: micro-batches per batch (GPipe); 1 = naive pipeline", NULL},
    {KEY(dist.timeout_s), FT_CFG_FLOAT, "600", NULL, false, 0.001, NONE,
     "seconds (> 0): abort every rank when a collective waits longer; not set: FT_DIST_TIMEOUT, "
     "else NCCL_TIMEOUT from the environment, else 600", NULL},
    {KEY(dist.deepspeed_config), FT_CFG_STRING, "", NULL, false, NONE, NONE,
     "DeepSpeed-style JSON applied over this config (deepspeed_like/README.md)", NULL},

    {NULL, 0, 0, 0, NULL, NULL, false, NONE, NONE, NULL, NULL},
};

const ft_cfg_key *ft_config_schema(void) { return schema; }
