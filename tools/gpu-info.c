/* gpu-info: what hardware this machine offers ftkit: GPUs (memory, compute capability,
 * SM count, peer access), the CUDA driver, NCCL and the CPU backend (OpenMP, BLAS).
 *
 * Works in every build and on machines without a GPU or driver: "no GPUs" is a valid
 * answer and exits 0. The probing lives in lib/device/gpu_probe.c. */
#include "core/cli.h"
#include "core/cpu_env.h"
#include "device/gpu_probe.h"

#include <stdio.h>
#include <stdlib.h>

static const char usage[] =
    "usage: gpu-info [--json | --count] [--help]\n"
    "\n"
    "Reports the GPUs (memory, compute capability, multiprocessors, peer access), the\n"
    "CUDA driver and NCCL versions, and the CPU backend (OpenMP threads, BLAS, CPU model).\n"
    "The driver and NCCL are loaded at run time, so this works with no GPU or driver\n"
    "installed; it then reports 0 GPUs and why. Exits 0 whenever the probe ran.\n"
    "\n"
    "  --json    print one JSON object instead of text\n"
    "  --count   print only the number of visible GPUs (0 when none; CUDA_VISIBLE_DEVICES\n"
    "            applies), for scripts: make's distributed targets start that many ranks\n"
    "  --help    print this help\n";

enum { OPT_HELP, OPT_JSON, OPT_COUNT };

static const ft_cli_option options[] = {
    {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
    {"--json", 0, FT_CLI_FLAG, OPT_JSON},
    {"--count", 0, FT_CLI_FLAG, OPT_COUNT},
    {NULL, 0, 0, 0},
};

int main(int argc, char **argv)
{
    ft_cpu_env_reexec(argv); /* report the BLAS kernels the training tools run */
    int json = 0, count = 0;
    ft_cli_parser cli;
    ft_cli_init(&cli, argc, argv, options, 0);
    for (int opt; (opt = ft_cli_next(&cli)) != FT_CLI_END;) {
        switch (opt) {
        case OPT_HELP:
            fputs(usage, stdout);
            return 0;
        case OPT_JSON:
            json = 1;
            break;
        case OPT_COUNT:
            count = 1;
            break;
        default:
            return ft_cli_error(&cli, opt, "gpu-info", usage);
        }
    }
    if (json && count) {
        fprintf(stderr, "gpu-info: error: --json and --count exclude each other\n");
        fputs(usage, stderr);
        return 2;
    }

    ft_gpu_probe *p = malloc(sizeof *p);
    if (!p) {
        fprintf(stderr, "gpu-info: error: out of memory\n");
        return 1;
    }
    ft_gpu_probe_run(p);
    int rc = 0;
    if (count) {
        printf("%d\n", p->num_gpus);
    } else if (json) {
        json_t *o = ft_gpu_probe_json(p);
        char *s = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
        if (s)
            printf("%s\n", s);
        else {
            fprintf(stderr, "gpu-info: error: out of memory building the JSON output\n");
            rc = 1;
        }
        free(s);
        json_decref(o);
    } else {
        ft_gpu_probe_print(p, stdout);
    }
    free(p);
    if (fflush(stdout) != 0) {
        perror("gpu-info: error: writing the output");
        rc = 1;
    }
    return rc;
}
