/* ft-merge: merge a LoRA adapter into its base model.
 *
 * Thin main: parses the options, calls ft_merge (lib/model/merge.c) and prints the output dir
 * on stdout. */
#include "core/cli.h"
#include "core/cpu_env.h"
#include "core/numparse.h"
#include "model/merge.h"
#include "formats/model_path.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ft-merge --model DIR --adapter DIR --out DIR [options]\n"
    "\n"
    "Folds a PEFT LoRA adapter into its base model (W += scaling * B @ A for every adapted\n"
    "layer, in fp32) and writes a plain Hugging Face checkpoint that loads without PEFT:\n"
    "safetensors (sharded with an index when over the shard size), config.json, and the\n"
    "base's tokenizer and generation files. The output appears atomically: it is written\n"
    "to a temporary dir next to --out and renamed at the end. Prints the output dir.\n"
    "A quantized base (bitsandbytes 4/8-bit, e.g. from ft-quantize) is dequantized, the\n"
    "adapter added, and the result written dense in 16 bits (bf16; f16 when that is its\n"
    "compute dtype) without quantization_config.\n"
    "\n"
    "  --model DIR               base model dir (config.json + safetensors)\n"
    "  --adapter DIR             PEFT adapter dir (adapter_config.json +\n"
    "                            adapter_model.safetensors)\n"
    "  --out DIR                 output dir; must not exist unless --force\n"
    "  --dtype bf16|f16|f32      dtype of every written tensor (default: the base's\n"
    "                            torch_dtype in config.json, f32 when absent;\n"
    "                            a quantized base: bf16)\n"
    "  --max-shard-size BYTES    largest shard (default 5000000000, as transformers)\n"
    "  --force                   replace an existing --out\n"
    "  --help                    print this help\n";

static int usage_error(const char *fmt, const char *arg)
{
    return ft_cli_usage_error("ft-merge", usage, fmt, arg);
}

enum { OPT_HELP, OPT_FORCE, OPT_MODEL, OPT_ADAPTER, OPT_OUT, OPT_DTYPE, OPT_MAX_SHARD_SIZE };

static const ft_cli_option options[] = {
    {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
    {"--force", 0, FT_CLI_FLAG, OPT_FORCE},
    {"--model", 0, FT_CLI_VALUE, OPT_MODEL},
    {"--adapter", 0, FT_CLI_VALUE, OPT_ADAPTER},
    {"--out", 0, FT_CLI_VALUE, OPT_OUT},
    {"--dtype", 0, FT_CLI_VALUE, OPT_DTYPE},
    {"--max-shard-size", 0, FT_CLI_VALUE, OPT_MAX_SHARD_SIZE},
    {NULL, 0, 0, 0},
};

int main(int argc, char **argv)
{
    ft_cpu_env_reexec(argv); /* a pool that sleeps while it waits; BLAS kernels for this CPU */
    ft_merge_options o = {0};
    ft_cli_parser cli;
    ft_cli_init(&cli, argc, argv, options, 0);
    for (int opt; (opt = ft_cli_next(&cli)) != FT_CLI_END;) {
        const char *val = cli.value;
        uint64_t bytes;
        switch (opt) {
        case OPT_HELP:
            fputs(usage, stdout);
            return 0;
        case OPT_FORCE:
            o.force = true;
            break;
        case OPT_MODEL:
            o.model_dir = val;
            break;
        case OPT_ADAPTER:
            o.adapter_dir = val;
            break;
        case OPT_OUT:
            o.out_dir = val;
            break;
        case OPT_DTYPE:
            if (strcmp(val, "bf16") && strcmp(val, "f16") && strcmp(val, "f32"))
                return usage_error("--dtype: '%s' is not bf16, f16 or f32", val);
            o.dtype = val;
            break;
        case OPT_MAX_SHARD_SIZE:
            if (ft_parse_u64(val, 1, SIZE_MAX, &bytes))
                return usage_error("--max-shard-size: '%s' is not a positive number of bytes",
                                   val);
            o.max_shard_bytes = (size_t)bytes;
            break;
        default:
            return ft_cli_error(&cli, opt, "ft-merge", usage);
        }
    }
    if (!o.model_dir)
        return usage_error("%s", "--model is required");
    if (!o.adapter_dir)
        return usage_error("%s", "--adapter is required");
    if (!o.out_dir || !o.out_dir[0])
        return usage_error("%s", "--out is required");
    ft_err err;
    char model_dir[4096];
    if (ft_resolve_model_dir(o.model_dir, model_dir, sizeof model_dir, &err)) {
        fprintf(stderr, "ft-merge: error: %s\n", err.msg);
        return 1;
    }
    o.model_dir = model_dir;
    if (ft_merge(&o, &err)) {
        fprintf(stderr, "ft-merge: error: %s\n", err.msg);
        return 1;
    }
    printf("%s\n", o.out_dir);
    if (fflush(stdout) != 0) {
        perror("ft-merge: error: writing the output");
        return 1;
    }
    return 0;
}
