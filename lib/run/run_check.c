/* The checks before launch (see run_check.h). Each message names the config key, as the
 * rank that would otherwise fail on it later does. */
#include "run/run_check.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "formats/hf_config.h"
#include "formats/lora.h"
#include "formats/model_path.h"
#include "memory/auto_batch.h"

/* The most micro-batches one optimizer step gathers (the trainer's limit). */

/* The model dir and its config.json; *layers gets the model's layer count. */
static int check_model(const ft_model_section *m, int *layers, ft_err *err)
{
    char dir[4096], path[4200];
    if (!m->name[0])
        return ft_fail(err, "config: key 'model.name' is required (a Hugging Face model dir)");
    if (ft_resolve_model_dir(m->name, dir, sizeof dir, err))
        return ft_fail_prefix(err, "config: key 'model.name'");
    snprintf(path, sizeof path, "%s/config.json", dir);
    ft_model_config mc;
    if (ft_model_config_load(&mc, path, err))
        return ft_fail_prefix(err, "config: key 'model.name' = '%s'", m->name);
    *layers = mc.num_layers;
    if (m->tokenizer[0] && access(m->tokenizer, R_OK) != 0)
        return ft_fail(err, "config: key 'model.tokenizer': '%s': %s", m->tokenizer,
                       strerror(errno));
    return 0;
}

/* A data file the run reads: readable, and not a directory. */
static int check_file(const char *key, const char *path, ft_err *err)
{
    struct stat st;
    if (strcmp(path, "-") == 0)
        return 0; /* stdin */
    if (stat(path, &st) != 0 || access(path, R_OK) != 0)
        return ft_fail(err, "config: key '%s': '%s': %s", key, path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return ft_fail(err, "config: key '%s': '%s' is a directory, not a JSONL file", key,
                       path);
    return 0;
}

static int check_data(const ft_run_config *c, ft_err *err)
{
    if (!c->data.train_path[0])
        return ft_fail(err, "config: key 'data.train_path' is required (a JSONL file or -)");
    if (check_file("data.train_path", c->data.train_path, err) ||
        (c->data.eval_path[0] && check_file("data.eval_path", c->data.eval_path, err)))
        return -1;
    struct stat st;
    const char *adapter = c->tuning.lora.init_adapter;
    if (c->tuning.mode != FT_TUNING_FULL && adapter[0] &&
        (stat(adapter, &st) != 0 || !S_ISDIR(st.st_mode)))
        return ft_fail(err, "config: key 'tuning.lora.init_adapter': '%s' is not a directory "
                            "(a PEFT adapter dir)",
                       adapter);
    return 0;
}

static int check_tuning(const ft_tuning_section *tu, ft_err *err)
{
    if (tu->mode == FT_TUNING_FULL)
        return 0;
    unsigned targets;
    if (ft_lora_targets_parse(tu->lora.target_modules, &targets, err))
        return ft_fail_prefix(err, "config: key 'tuning.lora.target_modules'");
    if (ft_lora_modules_to_save_parse(tu->lora.modules_to_save, &targets, err))
        return ft_fail_prefix(err, "config: key 'tuning.lora.modules_to_save'");
    ft_lora_config params = {0};
    if (ft_lora_target_parameters_parse(tu->lora.target_parameters, &params, err))
        return ft_fail_prefix(err, "config: key 'tuning.lora.target_parameters'");
    if (ft_lora_patterns_parse(tu->lora.rank_pattern, true, "tuning.lora.rank_pattern",
                               &params.rank_pattern, err) ||
        ft_lora_patterns_parse(tu->lora.alpha_pattern, false, "tuning.lora.alpha_pattern",
                               &params.alpha_pattern, err))
        return ft_fail_prefix(err, "config");
    if (tu->mode == FT_TUNING_QLORA && (tu->quant.blocksize & (tu->quant.blocksize - 1)))
        return ft_fail(err, "config: key 'tuning.quant.blocksize': %ld is not a power of two "
                            "(32, 64, ..., 4096)",
                       tu->quant.blocksize);
    return 0;
}

/* The batch at world_size ranks: the global batch rule. */
static int check_batch(const ft_train_section *t, int world_size, ft_err *err)
{
    if (ft_memory_budget_check(t, err))
        return -1;
    ft_train_section resolved = *t; /* the rule derives auto values: on a copy */
    if (ft_run_config_global_batch(&resolved, world_size, err))
        return ft_fail_prefix(err, "config: the global batch on %d rank%s", world_size,
                              world_size == 1 ? "" : "s");
    if (t->generation_num_beams != 1)
        return ft_fail(err, "config: key 'train.generation_num_beams' = %ld: only greedy "
                            "decoding is implemented (1); beam search is not",
                       t->generation_num_beams);
    return 0;
}

static int check_strategy(const ft_run_config *c, int world_size, int layers, ft_err *err)
{
    const ft_dist_section *d = &c->dist;
    if (d->strategy == FT_CFG_STRATEGY_NONE && world_size > 1)
        return ft_fail(err, "config: dist.strategy none with %d ranks: each would train alone "
                            "(use ddp, zero1-3, fsdp or model_parallel)",
                       world_size);
    int stage = ft_run_config_zero_stage(d);
    if (stage < 0 || stage > 3)
        return ft_fail(err, "config: dist.zero_stage = %d: stages are 0-3", stage);
    bool shards_params = d->strategy == FT_CFG_STRATEGY_FSDP ||
                         ((d->strategy == FT_CFG_STRATEGY_ZERO3 ||
                           d->strategy == FT_CFG_STRATEGY_ZERO) && stage == 3);
    if (d->offload_params == FT_CFG_OFFLOAD_CPU && !shards_params)
        return ft_fail(err, "config: dist.offload_params cpu works with dist.strategy zero3 "
                            "(or zero with dist.zero_stage 3) and fsdp, the strategies that "
                            "shard the frozen base");
    if (d->strategy != FT_CFG_STRATEGY_MODEL_PARALLEL)
        return 0;
    if (c->train.predict_with_generate)
        return ft_fail(err, "config: train.predict_with_generate does not work with "
                            "dist.strategy model_parallel yet (set it to false, and evaluate "
                            "the saved adapter with ft-eval --generate)");
    if (d->offload_optimizer == FT_CFG_OFFLOAD_CPU)
        return ft_fail(err, "config: dist.offload_optimizer cpu works with ddp, zero1-3 and "
                            "fsdp, not with dist.strategy model_parallel");
    int units = layers + 2; /* embeddings, the layers, the head */
    if (world_size > units)
        return ft_fail(err, "config: dist.strategy model_parallel: %d ranks for %d units "
                            "(embeddings, %d layers, head): at most one rank per unit",
                       world_size, units, layers);
    return 0;
}

/* train.device as far as this build decides it (a GPU's visibility is the ranks'). */
static int check_device(const ft_train_section *t, ft_err *err)
{
    if (t->device != FT_CFG_DEVICE_CUDA)
        return 0;
#ifndef FT_HAVE_CUDA
    return ft_fail(err, "config: key 'train.device' is cuda, but this build has no CUDA "
                        "backend (rebuild with nvcc on the PATH or CUDA_HOME set; CUDA=0 "
                        "turns it off)");
#else
    if (t->fp16)
        return ft_fail(err, "config: key 'train.fp16': the CUDA backend computes in bf16 "
                            "(train.bf16, the default) or fp32, not fp16");
    return 0;
#endif
}

int ft_run_check(const ft_run_config *cfg, int world_size, ft_err *err)
{
    if (world_size < 1)
        return ft_fail(err, "world size must be >= 1, got %d", world_size);
    int layers = 0;
    if (check_model(&cfg->model, &layers, err) || check_data(cfg, err) ||
        check_tuning(&cfg->tuning, err) || check_batch(&cfg->train, world_size, err) ||
        check_strategy(cfg, world_size, layers, err) || check_device(&cfg->train, err))
        return -1;
    return 0;
}
