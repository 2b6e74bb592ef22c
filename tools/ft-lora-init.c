/* ft-lora-init: create a fresh PEFT-format LoRA adapter for a Hugging Face model.
 *
 * Thin main: parses the options, calls ft_lora_init_adapter (lib/model/lora_init.c) and
 * prints the adapter dir on stdout. */
#include "core/cli.h"
#include "model/lora_init.h"
#include "formats/model_path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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
    "                     up_proj,down_proj) or all-linear (default all-linear)\n"
    "  --rslora           rank-stabilised scaling alpha/sqrt(r) instead of alpha/r\n"
    "  --seed N           seed of A's init (default 42)\n"
    "  --help             print this help\n";

static int usage_error(const char *fmt, const char *arg)
{
    return ft_cli_usage_error("ft-lora-init", usage, fmt, arg);
}

static int parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v != v)
        return -1;
    *out = (float)v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *out = NULL, *targets = "all-linear";
    ft_lora_config c = {.r = 16, .alpha = 32.0f, .dropout = 0.05f};
    unsigned long long seed = 42;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            return 0;
        }
        if (strcmp(a, "--rslora") == 0) {
            c.rslora = true;
            continue;
        }
        static const char *const with_value[] = {"--model", "--out",    "--r",   "--alpha",
                                                 "--dropout", "--target", "--seed"};
        const char *opt = NULL, *val = NULL;
        int found = ft_cli_value_option(argc, argv, &i, with_value,
                                        sizeof with_value / sizeof with_value[0], &opt, &val);
        if (found < 0)
            return usage_error("option '%s' needs a value", a);
        if (!opt)
            return usage_error(a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'",
                               a);
        long v;
        if (strcmp(opt, "--model") == 0) {
            model = val;
        } else if (strcmp(opt, "--out") == 0) {
            out = val;
        } else if (strcmp(opt, "--r") == 0) {
            if (ft_cli_parse_long(val, 1, 1 << 20, &v))
                return usage_error("--r: '%s' is not a positive integer", val);
            c.r = (int)v;
        } else if (strcmp(opt, "--alpha") == 0) {
            if (parse_float(val, &c.alpha))
                return usage_error("--alpha: '%s' is not a number", val);
        } else if (strcmp(opt, "--dropout") == 0) {
            if (parse_float(val, &c.dropout) || c.dropout < 0 || c.dropout >= 1)
                return usage_error("--dropout: '%s' is not a number in [0, 1)", val);
        } else if (strcmp(opt, "--target") == 0) {
            targets = val;
        } else if (strcmp(opt, "--seed") == 0) {
            char *end;
            errno = 0;
            seed = strtoull(val, &end, 10);
            if (errno || end == val || *end || val[0] == '-')
                return usage_error("--seed: '%s' is not a non-negative integer", val);
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
    char model_dir[4096];
    if (ft_resolve_model_dir(model, model_dir, sizeof model_dir, &err) ||
        ft_lora_init_adapter(model_dir, out, &c, (uint64_t)seed, &err)) {
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
