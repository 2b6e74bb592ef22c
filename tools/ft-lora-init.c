/* ft-lora-init: create a fresh PEFT-format LoRA adapter for a Hugging Face model.
 *
 * Thin main: parses the options, calls ft_lora_init_adapter (lib/model/lora_init.c) and
 * prints the adapter dir on stdout. */
#include "core/cli.h"
#include "core/numparse.h"
#include "model/lora_init.h"
#include "formats/model_path.h"

#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: ft-lora-init --model DIR --out DIR [options]\n"
    "\n"
    "Reads a Hugging Face model directory and writes a new LoRA adapter in PEFT format\n"
    "(adapter_config.json, adapter_model.safetensors) into --out: A initialised as PEFT\n"
    "does (kaiming-uniform, |A| <= 1/sqrt(in)) from a seeded RNG, B zero, so the adapted\n"
    "model starts equal to the base. Prints the adapter dir on stdout.\n"
    "\n"
    "  --model DIR        base model dir (config.json + safetensors)\n"
    "  --out DIR          adapter dir to write (created if needed)\n"
    "  --r N              LoRA rank (default 16)\n"
    "  --alpha X          lora_alpha (default 32)\n"
    "  --dropout X        lora_dropout, in [0, 1) (default 0.05)\n"
    "  --target LIST      modules, comma-separated (q_proj,k_proj,v_proj,o_proj,gate_proj,\n"
    "                     up_proj,down_proj; phi3: qkv_proj,o_proj,gate_up_proj,down_proj)\n"
    "                     or all-linear (default all-linear); also embed_tokens and lm_head\n"
    "                     (tied embeddings: each its own pair, ensure_weight_tying false)\n"
    "  --rank-pattern JSON  per-module ranks, as PEFT's rank_pattern: a JSON object of\n"
    "                     module patterns to ranks, e.g. '{\"q_proj\": 8,\n"
    "                     \"model.layers.0.mlp.down_proj\": 2}'; a module takes the first key\n"
    "                     whose regex matches its name or a dotted suffix of it, others r\n"
    "  --alpha-pattern JSON  per-module alphas, as PEFT's alpha_pattern (the same form)\n"
    "  --rslora           rank-stabilised scaling alpha/sqrt(r) instead of alpha/r\n"
    "  --dora             DoRA (PEFT's use_dora): a magnitude per output row, starting at\n"
    "                     the row norms of the base weight\n"
    "  --modules-to-save LIST  embed_tokens and/or lm_head, comma-separated: trained in\n"
    "                     full beside the pairs (PEFT's modules_to_save; the adapter holds\n"
    "                     the base's weights for them; tied embeddings: the one\n"
    "                     embedding, shared by the head, ensure_weight_tying true)\n"
    "  --ensure-weight-tying true|false  PEFT's ensure_weight_tying, on a model with tied\n"
    "                     embeddings (default: true with --modules-to-save, false with\n"
    "                     embed_tokens / lm_head targets): true keeps the embedding and\n"
    "                     lm_head tied (one copy; the head's pair the embedding's), false\n"
    "                     apart (a copy of each listed module; a pair each)\n"
    "  --seed N           seed of A's init (default 42)\n"
    "  --help             print this help\n";

static int usage_error(const char *fmt, const char *arg)
{
    return ft_cli_usage_error("ft-lora-init", usage, fmt, arg);
}

enum {
    OPT_HELP, OPT_RSLORA, OPT_MODEL, OPT_OUT, OPT_R, OPT_ALPHA, OPT_DROPOUT, OPT_TARGET,
    OPT_SEED, OPT_MTS, OPT_DORA, OPT_TYING, OPT_RANK_PATTERN, OPT_ALPHA_PATTERN
};

static const ft_cli_option options[] = {
    {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
    {"--rslora", 0, FT_CLI_FLAG, OPT_RSLORA},
    {"--model", 0, FT_CLI_VALUE, OPT_MODEL},
    {"--out", 0, FT_CLI_VALUE, OPT_OUT},
    {"--r", 0, FT_CLI_VALUE, OPT_R},
    {"--alpha", 0, FT_CLI_VALUE, OPT_ALPHA},
    {"--dropout", 0, FT_CLI_VALUE, OPT_DROPOUT},
    {"--target", 0, FT_CLI_VALUE, OPT_TARGET},
    {"--seed", 0, FT_CLI_VALUE, OPT_SEED},
    {"--modules-to-save", 0, FT_CLI_VALUE, OPT_MTS},
    {"--dora", 0, FT_CLI_FLAG, OPT_DORA},
    {"--ensure-weight-tying", 0, FT_CLI_VALUE, OPT_TYING},
    {"--rank-pattern", 0, FT_CLI_VALUE, OPT_RANK_PATTERN},
    {"--alpha-pattern", 0, FT_CLI_VALUE, OPT_ALPHA_PATTERN},
    {NULL, 0, 0, 0},
};

int main(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *targets = "all-linear", *saved = "";
    const char *rank_pattern = "", *alpha_pattern = "";
    ft_lora_config c = {.r = 16, .alpha = 32.0f, .dropout = 0.05f};
    uint64_t seed = 42;
    ft_cli_parser cli;
    ft_cli_init(&cli, argc, argv, options, 0);
    for (int opt; (opt = ft_cli_next(&cli)) != FT_CLI_END;) {
        const char *val = cli.value;
        long v;
        double x;
        switch (opt) {
        case OPT_HELP:
            fputs(usage, stdout);
            return 0;
        case OPT_RSLORA:
            c.rslora = true;
            break;
        case OPT_MODEL:
            model = val;
            break;
        case OPT_OUT:
            out = val;
            break;
        case OPT_R:
            if (ft_parse_long(val, 1, 1 << 20, &v))
                return usage_error("--r: '%s' is not a positive integer", val);
            c.r = (int)v;
            break;
        case OPT_ALPHA:
            /* alpha is a float: a larger value would become infinite */
            if (ft_parse_double(val, -FLT_MAX, FLT_MAX, 0, &x))
                return usage_error("--alpha: '%s' is not a number", val);
            c.alpha = (float)x;
            break;
        case OPT_DROPOUT:
            /* checked as the float it becomes too: 0.999999999 rounds to 1 */
            if (ft_parse_double(val, 0, 1, FT_PARSE_OPEN_MAX, &x) || (float)x >= 1.0f)
                return usage_error("--dropout: '%s' is not a number in [0, 1)", val);
            c.dropout = (float)x;
            break;
        case OPT_TARGET:
            targets = val;
            break;
        case OPT_DORA:
            c.dora = true;
            break;
        case OPT_MTS:
            saved = val;
            break;
        case OPT_TYING:
            if (strcmp(val, "true") != 0 && strcmp(val, "false") != 0)
                return usage_error("--ensure-weight-tying: '%s' is not true or false", val);
            c.weight_tying_set = true;
            c.ensure_weight_tying = strcmp(val, "true") == 0;
            break;
        case OPT_RANK_PATTERN:
            rank_pattern = val;
            break;
        case OPT_ALPHA_PATTERN:
            alpha_pattern = val;
            break;
        case OPT_SEED:
            if (ft_parse_u64(val, 0, UINT64_MAX, &seed))
                return usage_error("--seed: '%s' is not a non-negative integer", val);
            break;
        default:
            return ft_cli_error(&cli, opt, "ft-lora-init", usage);
        }
    }
    if (!model)
        return usage_error("%s", "--model is required");
    if (!out)
        return usage_error("%s", "--out is required");
    ft_err err;
    if (ft_lora_targets_parse(targets, &c.targets, &err)) {
        fprintf(stderr, "ft-lora-init: error: --target: %s\n", err.msg);
        return 2;
    }
    if (ft_lora_modules_to_save_parse(saved, &c.modules_to_save, &err)) {
        fprintf(stderr, "ft-lora-init: error: --modules-to-save: %s\n", err.msg);
        return 2;
    }
    if (ft_lora_patterns_parse(rank_pattern, true, "--rank-pattern", &c.rank_pattern, &err) ||
        ft_lora_patterns_parse(alpha_pattern, false, "--alpha-pattern", &c.alpha_pattern,
                               &err)) {
        fprintf(stderr, "ft-lora-init: error: %s\n", err.msg);
        return 2;
    }
    char model_dir[4096];
    if (ft_resolve_model_dir(model, model_dir, sizeof model_dir, &err) ||
        ft_lora_init_adapter(model_dir, out, &c, seed, &err)) {
        fprintf(stderr, "ft-lora-init: error: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", out);
    if (fflush(stdout) != 0) {
        perror("ft-lora-init: error: writing the output");
        return 1;
    }
    return 0;
}
