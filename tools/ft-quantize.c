/* ft-quantize: quantize a Hugging Face checkpoint to 4-bit (NF4/FP4) or 8-bit.
 *
 * Thin main: parses the options, calls ft_quantize_model (lib/model/quantize_model.c) with a
 * progress callback (a bar on a terminal, one line per tensor otherwise, on stderr),
 * prints a summary on stderr and the output dir on stdout. */
#include "core/cli.h"
#include "core/numparse.h"
#include "formats/model_path.h"
#include "model/quantize_model.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: ft-quantize --model DIR --out DIR [options]\n"
    "       ft-quantize [options] MODEL_DIR OUT_DIR\n"
    "\n"
    "Quantizes the linear weights of a Hugging Face model's transformer blocks (q/k/v/o and\n"
    "gate/up/down projections) to 4-bit NF4 or FP4 (per-block absmax, optionally double-\n"
    "quantized) or to 8-bit LLM.int8, in the layout transformers + bitsandbytes save: the\n"
    "frozen base of QLoRA training (tuning.mode qlora), read as it is by ft-train and\n"
    "ft-eval. Embeddings, norms, biases and lm_head stay dense in their dtype. The output\n"
    "(safetensors, sharded with an index past the shard size; config.json with\n"
    "quantization_config; the tokenizer and generation files) appears atomically: it is\n"
    "written to a temporary dir next to --out and renamed at the end. One weight at a time\n"
    "is held in fp32. Progress goes to stderr, the output dir to stdout.\n"
    "\n"
    "  --model DIR                source model dir (config.json + safetensors, 16 or 32 bit)\n"
    "  --out DIR                  output dir; must not exist unless --force\n"
    "  --type nf4|fp4|int8        quantization (default nf4)\n"
    "  --blocksize N              4-bit: values per absmax block, a power of two in\n"
    "                             32..4096 (default 64)\n"
    "  --double-quant             4-bit: quantize the block absmax to 8 bits too (default)\n"
    "  --no-double-quant          4-bit: keep the block absmax in fp32\n"
    "  --skip LIST                module-name substrings to leave dense, comma-separated,\n"
    "                             added to lm_head (e.g. down_proj or layers.0.)\n"
    "  --dtype keep|bf16|f16|f32  dtype of the dense tensors (default keep: the source's);\n"
    "                             converting also rounds the weights to it before quantizing\n"
    "  --max-shard-size BYTES     largest shard (default 5000000000, as transformers)\n"
    "  --force                    replace an existing --out\n"
    "  --help                     print this help\n";

static int usage_error(const char *fmt, const char *arg)
{
    return ft_cli_usage_error("ft-quantize", usage, fmt, arg);
}

/* ---- progress on stderr -------------------------------------------------------------- */

typedef struct progress_state {
    bool tty;
    bool open_line;   /* tty: the bar is on the current line */
    const char *type; /* "nf4", ... */
} progress_state;

static void human(char *buf, size_t cap, size_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, cap, "%zu B", bytes);
    else
        snprintf(buf, cap, "%.1f %s", v, units[u]);
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

static void on_tensor(const ft_quantize_progress *p, void *ctx)
{
    progress_state *s = ctx;
    if (s->tty) {
        enum { WIDTH = 30 };
        int done = (int)(WIDTH * p->index / p->count);
        char bar[WIDTH + 1];
        for (int i = 0; i < WIDTH; i++)
            bar[i] = i < done ? '#' : '.';
        bar[WIDTH] = '\0';
        fprintf(stderr, "\r\033[K[%s] %zu/%zu %s", bar, p->index, p->count, p->name);
        if (p->index == p->count)
            fputc('\n', stderr);
        fflush(stderr);
        s->open_line = p->index < p->count;
        return;
    }
    char shape[96], in[32], out[32], what[32];
    shape_str(shape, sizeof shape, p->ndim, p->shape);
    human(in, sizeof in, p->bytes_in);
    human(out, sizeof out, p->bytes_out);
    if (p->quantized)
        snprintf(what, sizeof what, "%s", s->type);
    else if (p->out_dtype != p->src_dtype)
        snprintf(what, sizeof what, "%s->%s", ft_st_dtype_name(p->src_dtype),
                 ft_st_dtype_name(p->out_dtype));
    else
        snprintf(what, sizeof what, "%s", ft_st_dtype_name(p->src_dtype));
    if (p->bytes_in == p->bytes_out)
        fprintf(stderr, "[%zu/%zu] %s  %s  %s  %s\n", p->index, p->count, p->name, what, shape,
                in);
    else
        fprintf(stderr, "[%zu/%zu] %s  %s  %s  %s -> %s\n", p->index, p->count, p->name, what,
                shape, in, out);
}

/* ---- options ------------------------------------------------------------------------- */

enum {
    OPT_HELP, OPT_FORCE, OPT_DOUBLE_QUANT, OPT_NO_DOUBLE_QUANT, OPT_MODEL, OPT_OUT, OPT_TYPE,
    OPT_BLOCKSIZE, OPT_SKIP, OPT_DTYPE, OPT_MAX_SHARD_SIZE
};

static const ft_cli_option options[] = {
    {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
    {"--force", 0, FT_CLI_FLAG, OPT_FORCE},
    {"--double-quant", 0, FT_CLI_FLAG, OPT_DOUBLE_QUANT},
    {"--no-double-quant", 0, FT_CLI_FLAG, OPT_NO_DOUBLE_QUANT},
    {"--model", 0, FT_CLI_VALUE, OPT_MODEL},
    {"--out", 0, FT_CLI_VALUE, OPT_OUT},
    {"--type", 0, FT_CLI_VALUE, OPT_TYPE},
    {"--blocksize", 0, FT_CLI_VALUE, OPT_BLOCKSIZE},
    {"--skip", 0, FT_CLI_VALUE, OPT_SKIP},
    {"--dtype", 0, FT_CLI_VALUE, OPT_DTYPE},
    {"--max-shard-size", 0, FT_CLI_VALUE, OPT_MAX_SHARD_SIZE},
    {NULL, 0, 0, 0},
};

int main(int argc, char **argv)
{
    ft_quantize_model_options o = {.quant = {.type = FT_QUANT_NF4, .blocksize = 64,
                                             .double_quant = true}};
    const char *positional[2] = {NULL, NULL};
    int n_pos = 0;
    bool set_blocksize = false, set_dq = false;
    ft_cli_parser cli;
    ft_cli_init(&cli, argc, argv, options, 2);
    for (int opt; (opt = ft_cli_next(&cli)) != FT_CLI_END;) {
        const char *val = cli.value;
        long v;
        uint64_t bytes;
        switch (opt) {
        case OPT_HELP:
            fputs(usage, stdout);
            return 0;
        case OPT_FORCE:
            o.force = true;
            break;
        case OPT_DOUBLE_QUANT:
        case OPT_NO_DOUBLE_QUANT:
            o.quant.double_quant = opt == OPT_DOUBLE_QUANT;
            set_dq = true;
            break;
        case FT_CLI_POSITIONAL: /* MODEL_DIR OUT_DIR: the parser stops a third */
            positional[n_pos++] = val;
            break;
        case OPT_MODEL:
            o.model_dir = val;
            break;
        case OPT_OUT:
            o.out_dir = val;
            break;
        case OPT_TYPE:
            if (strcmp(val, "nf4") == 0)
                o.quant.type = FT_QUANT_NF4;
            else if (strcmp(val, "fp4") == 0)
                o.quant.type = FT_QUANT_FP4;
            else if (strcmp(val, "int8") == 0)
                o.quant.type = FT_QUANT_INT8;
            else
                return usage_error("--type: '%s' is not nf4, fp4 or int8", val);
            break;
        case OPT_BLOCKSIZE:
            if (ft_parse_long(val, 32, 4096, &v) || (v & (v - 1)))
                return usage_error("--blocksize: '%s' is not a power of two in 32..4096", val);
            o.quant.blocksize = (int)v;
            set_blocksize = true;
            break;
        case OPT_SKIP:
            o.skip = val;
            break;
        case OPT_DTYPE:
            if (strcmp(val, "keep") && strcmp(val, "bf16") && strcmp(val, "f16") &&
                strcmp(val, "f32"))
                return usage_error("--dtype: '%s' is not keep, bf16, f16 or f32", val);
            o.dtype = val;
            break;
        case OPT_MAX_SHARD_SIZE:
            if (ft_parse_u64(val, 1, SIZE_MAX, &bytes))
                return usage_error("--max-shard-size: '%s' is not a positive number of bytes",
                                   val);
            o.max_shard_bytes = (size_t)bytes;
            break;
        default:
            return ft_cli_error(&cli, opt, "ft-quantize", usage);
        }
    }
    if (n_pos > 0 && (o.model_dir || o.out_dir))
        return usage_error("%s", "give the dirs either as --model/--out or as MODEL_DIR OUT_DIR");
    if (n_pos == 1)
        return usage_error("%s", "OUT_DIR is missing (usage: ft-quantize MODEL_DIR OUT_DIR)");
    if (n_pos == 2) {
        o.model_dir = positional[0];
        o.out_dir = positional[1];
    }
    if (!o.model_dir)
        return usage_error("%s", "--model is required");
    if (!o.out_dir || !o.out_dir[0])
        return usage_error("%s", "--out is required");
    if (o.quant.type == FT_QUANT_INT8 && (set_blocksize || (set_dq && o.quant.double_quant)))
        return usage_error("%s", set_blocksize ? "--blocksize applies to nf4 and fp4 only"
                                               : "--double-quant applies to nf4 and fp4 only");

    ft_err err;
    char model_dir[4096];
    if (ft_resolve_model_dir(o.model_dir, model_dir, sizeof model_dir, &err)) {
        fprintf(stderr, "ft-quantize: error: %s\n", err.msg);
        return 1;
    }
    o.model_dir = model_dir;
    const char *type = ft_quant_name(o.quant.type);
    if (o.quant.type == FT_QUANT_INT8)
        fprintf(stderr, "ft-quantize: %s -> %s: int8 (row-wise absmax)\n", o.model_dir,
                o.out_dir);
    else
        fprintf(stderr, "ft-quantize: %s -> %s: %s, blocksize %d, %s\n", o.model_dir, o.out_dir,
                type, o.quant.blocksize,
                o.quant.double_quant ? "double quant" : "no double quant");
    progress_state ps = {.tty = isatty(STDERR_FILENO) == 1, .type = type};
    o.progress = on_tensor;
    o.progress_ctx = &ps;
    ft_quantize_summary sum;
    if (ft_quantize_model(&o, &sum, &err)) {
        if (ps.open_line)
            fputc('\n', stderr);
        fprintf(stderr, "ft-quantize: error: %s\n", err.msg);
        return 1;
    }
    char before[32], after[32];
    human(before, sizeof before, sum.bytes_in);
    human(after, sizeof after, sum.bytes_out);
    fprintf(stderr,
            "ft-quantize: %zu of %zu tensors quantized to %s; %s -> %s (%zu -> %zu bytes, "
            "ratio %.2fx)\n",
            sum.n_quantized, sum.n_tensors, type, before, after, sum.bytes_in, sum.bytes_out,
            sum.bytes_out ? (double)sum.bytes_in / (double)sum.bytes_out : 0.0);
    printf("%s\n", o.out_dir);
    if (fflush(stdout) != 0) {
        perror("ft-quantize: error: writing the output");
        return 1;
    }
    return 0;
}
