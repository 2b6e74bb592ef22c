/* The run's hyperparameters for TensorBoard's HParams table (run_internal.h). Every key
 * of the schema goes in by its name and type, so a key added to the schema shows up
 * without a change here. */
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "run/run_internal.h"

int run_hparams_start(ft_tb_writer *tb, const ft_run_config *cfg, int world,
                      const char *const *metric_tags, size_t n_metrics, ft_err *err)
{
    const ft_cfg_key *schema = ft_config_schema();
    size_t n = 0;
    while (schema[n].name)
        n++;
    ft_tb_hparam *hp = calloc(n + 1, sizeof *hp);
    char (*text)[FT_CFG_PATH_MAX] = calloc(n, sizeof *text);
    if (!hp || !text) {
        free(hp);
        free(text);
        return ft_fail(err, "out of memory");
    }
    size_t k = 0;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const ft_cfg_key *key = &schema[i];
        if (key->moot)
            continue;
        if (ft_run_config_key_text(cfg, key->name, text[k], sizeof text[k], err)) {
            if (!key->dflt) /* a required key that this run leaves unset: not a hparam */
                continue;
            rc = -1;
            break;
        }
        ft_tb_hparam *h = &hp[k];
        h->name = key->name;
        char *end;
        double v = strtod(text[k], &end);
        if (key->type == FT_CFG_BOOL) {
            h->type = FT_TB_HPARAM_BOOL;
            h->b = strcmp(text[k], "true") == 0;
        } else if ((key->type == FT_CFG_INT || key->type == FT_CFG_FLOAT) && *text[k] &&
                   *end == '\0') {
            h->type = FT_TB_HPARAM_NUMBER;
            h->num = v;
        } else { /* strings, choices, and "auto" */
            h->type = FT_TB_HPARAM_STRING;
            h->str = text[k];
        }
        k++;
    }
    if (rc == 0) {
        hp[k++] = (ft_tb_hparam){.name = "world_size", .type = FT_TB_HPARAM_NUMBER,
                                 .num = (double)world};
        rc = ft_tb_hparams_start(tb, hp, k, metric_tags, n_metrics, err);
    }
    free(hp);
    free(text);
    return rc;
}
