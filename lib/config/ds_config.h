/* DeepSpeed-style JSON configs (the files in deepspeed_like/), read onto a run config
 * under construction (config.h).
 *
 * A DeepSpeed JSON is read onto the run config in DeepSpeed's own key names
 * (train_micro_batch_size_per_gpu, zero_optimization.stage, offload_optimizer, bf16,
 * optimizer, scheduler, ...); deepspeed_like/README.md lists every key and what becomes
 * of it. Each key is honoured (mapped onto one of our keys), accepted with a one-line
 * notice saying why it has no effect here, or rejected with an error naming the file and
 * the key's JSON path. The string "auto" (the Hugging Face Trainer convention) anywhere
 * means "keep the run config's value". */
#ifndef FT_DS_CONFIG_H
#define FT_DS_CONFIG_H

#include <stdio.h>

#include "config/config.h"
#include "core/ft_error.h"

/* Reads the DeepSpeed JSON at json_path onto c. A concrete JSON value replaces our default;
 * a key the user set explicitly (config file, --set) that differs from the JSON's concrete
 * value is an error naming both ("mismatch: train.batch_size = 4 in the config but
 * train_micro_batch_size_per_gpu = 2 in ds.json"), as are two JSON keys that set one of
 * ours differently. When train_batch_size is concrete, a micro-batch size or accumulation
 * count that neither the JSON nor the user gave becomes auto, to be derived by
 * ft_run_config_global_batch (run_config.h; DeepSpeed derives the missing one). Notices go
 * to `notes` (may be NULL). Unknown keys, wrong types and unsupported features (NVMe offload, parameter
 * offload, optimizers other than Adam/AdamW) are errors; c may then be partly updated. */
int ft_config_apply_deepspeed(ft_config *c, const char *json_path, FILE *notes, ft_err *err);

#endif
