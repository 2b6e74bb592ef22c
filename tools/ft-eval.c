/* ft-eval: evaluate a model (with an optional adapter) on a data set.
 *
 * A placeholder until the tool is written: --help describes what it will do, any
 * other invocation says it is not implemented and exits 2. */
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: ft-eval [options] MODEL_DIR [ADAPTER_DIR] DATA.jsonl\n"
    "\n"
    "Will run a model, with an optional LoRA adapter, over a JSONL data set and print the\n"
    "loss, the perplexity and generation metrics as one JSON object on stdout.\n"
    "Not implemented yet.\n";

int main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(usage, stdout);
        return 0;
    }
    fprintf(stderr,
            "ft-eval: error: not implemented yet (see the project's open issues)\n");
    return 2;
}
