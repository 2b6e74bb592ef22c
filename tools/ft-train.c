/* ft-train: fine-tune a model (LoRA, QLoRA or full) from a YAML config.
 *
 * A placeholder until the tool is written: --help describes what it will do, any
 * other invocation says it is not implemented and exits 2. */
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: ft-train [options] CONFIG.yaml [--set key=value ...]\n"
    "\n"
    "Will train a LoRA adapter, a QLoRA adapter over a quantized base, or the full model,\n"
    "as a YAML run config (with --set overrides and DeepSpeed-style JSON) describes, on\n"
    "the CPU, one GPU, or many GPUs and nodes under mpirun or srun (DDP, ZeRO-1/2/3,\n"
    "FSDP, CPU offload), writing checkpoints, the trained adapter or model and\n"
    "TensorBoard event files to the run directory. Not implemented yet.\n";

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    fprintf(stderr,
            "ft-train: error: not implemented yet (see the project's open issues)\n");
    return 2;
}
