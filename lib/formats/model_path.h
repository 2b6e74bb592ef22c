/* Where a model lives: model.name is a local Hugging Face model dir, or a Hub id
 * ("Org/Name") found in the local Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else
 * ~/.cache/huggingface/hub; layout models--Org--Name/snapshots/<rev>/, the revision named
 * by refs/main, else the only snapshot). Nothing is downloaded: when the model is absent
 * the error says how to get it. */
#ifndef FT_MODEL_PATH_H
#define FT_MODEL_PATH_H

#include <stdbool.h>
#include <stddef.h>

#include "core/ft_error.h"

int ft_resolve_model_dir(const char *name, char *out, size_t out_len, ft_err *err);

#endif
