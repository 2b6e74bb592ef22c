/* ft-lora-init's library side: the model loader already creates PEFT's default LoRA
 * init in LoRA mode, and ft_model_save_adapter writes it in PEFT's format. */
#include "model/lora_init.h"

#include "model/model.h"

int ft_lora_init_adapter(const char *model_dir, const char *out_dir, const ft_lora_config *c,
                         uint64_t seed, ft_err *err)
{
    ft_model_options opt = {.mode = FT_TRAIN_LORA, .lora = *c, .seed = seed};
    ft_model *m;
    if (ft_model_load(&m, model_dir, &opt, err))
        return -1;
    int rc = ft_model_save_adapter(m, out_dir, model_dir, err);
    ft_model_free(m);
    return rc;
}
