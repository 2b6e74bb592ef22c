/* ft-quantize: quantize a Hugging Face checkpoint to 4-bit (NF4/FP4) or 8-bit.
 *
 * A placeholder until the tool is written: --help describes what it will do, any
 * other invocation says it is not implemented and exits 2. */
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: ft-quantize [options] MODEL_DIR OUT_DIR\n"
    "\n"
    "Will read a Hugging Face model directory (config.json, *.safetensors) and write a\n"
    "checkpoint whose linear-layer weights are quantized to 4-bit NF4 or FP4 (with\n"
    "per-block scales) or to 8-bit, the frozen base of QLoRA training. Not implemented yet.\n";

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    fprintf(stderr,
            "ft-quantize: error: not implemented yet (see the project's open issues)\n");
    return 2;
}
