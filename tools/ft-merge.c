/* ft-merge: merge a LoRA adapter into its base model.
 *
 * A placeholder until the tool is written: --help describes what it will do, any
 * other invocation says it is not implemented and exits 2. */
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: ft-merge [options] MODEL_DIR ADAPTER_DIR OUT_DIR\n"
    "\n"
    "Will fold a PEFT LoRA adapter into its base model (W += scale * B A for each adapted\n"
    "layer, dequantizing a quantized base first) and write a plain Hugging Face\n"
    "checkpoint that loads without PEFT. Not implemented yet.\n";

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    fprintf(stderr,
            "ft-merge: error: not implemented yet (see the project's open issues)\n");
    return 2;
}
