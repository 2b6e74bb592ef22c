/* What a run config must pass before any rank starts: everything a rank of ft-train
 * would reject from the config alone, checked in one place, so that the launcher's side
 * (`ft-train --check N`, which the make targets run once before mpirun / srun) and every
 * rank at start (ft-train itself, for a direct mpirun) say the same thing once instead
 * of every rank failing on its own.
 *
 * The checks, in order; the first that fails is the error:
 *   - model.name is set and names a local model dir (or a Hub id in the local cache)
 *     whose config.json reads as a supported model; model.tokenizer, when set, exists;
 *   - data.train_path is set and a readable file ("-" is stdin), data.eval_path too
 *     when set; tuning.lora.init_adapter, when set for LoRA, is a dir;
 *   - train.memory_budget is auto or a size;
 *   - the global batch rule at the world size (ft_run_config_global_batch:
 *     global_batch_size = batch_size x grad_accum x world size when it is set), and
 *     grad_accum (as given or derived by that rule) at most 64;
 *   - train.generation_num_beams is 1 (only greedy decoding exists);
 *   - dist.strategy at the world size: none only on one rank; model_parallel neither
 *     with train.predict_with_generate nor with dist.offload_optimizer cpu, and at most
 *     one rank per unit (embeddings, each layer, head);
 *   - train.device: cuda needs a build with CUDA, and train.fp16 is refused on it.
 *     Whether a GPU is visible is left to the ranks (the launching host may have none).
 *
 * Nothing is loaded but config.json, and nothing is written. */
#ifndef FT_RUN_CHECK_H
#define FT_RUN_CHECK_H

#include "config/run_config.h"
#include "core/ft_error.h"

/* Checks cfg for a run on world_size (>= 1) ranks as above. Returns 0, or -1 with err
 * naming the key (and the file) that fails. */
int ft_run_check(const ft_run_config *cfg, int world_size, ft_err *err);

#endif
