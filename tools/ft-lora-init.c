/* ft-lora-init: create a fresh PEFT-format LoRA adapter for a Hugging Face model.
 *
 * A placeholder until the tool is written: --help describes what it will do, any
 * other invocation says it is not implemented and exits 2. */
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: ft-lora-init [options] MODEL_DIR OUT_DIR\n"
    "\n"
    "Will read a Hugging Face model directory and write a new LoRA adapter in PEFT format\n"
    "(adapter_config.json, adapter_model.safetensors) for the chosen target modules, rank\n"
    "and alpha: A initialised from a seeded RNG, B zero, so the adapted model starts\n"
    "equal to the base. Not implemented yet.\n";

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    fprintf(stderr,
            "ft-lora-init: error: not implemented yet (see the project's open issues)\n");
    return 2;
}
