/* Command-line helpers shared by the tools' thin mains: the one option parser every tool
 * uses and its usage errors. Numbers in option values go through core/numparse.h.
 *
 * A tool lists its options in a table and reads (option, value) pairs in order:
 *
 *     static const ft_cli_option options[] = {
 *         {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
 *         {"--out", 0, FT_CLI_VALUE, OPT_OUT},
 *         {NULL, 0, 0, 0},
 *     };
 *     ft_cli_parser cli;
 *     ft_cli_init(&cli, argc, argv, options, 0);
 *     for (int opt; (opt = ft_cli_next(&cli)) != FT_CLI_END;)
 *         switch (opt) {
 *         case OPT_OUT: out = cli.value; break;
 *         ...
 *         default: return ft_cli_error(&cli, opt, "ft-x", usage);
 *         }
 *
 * Unlike getopt_long it leaves argv in its order, keeps no global state, prints nothing
 * itself, and does not take abbreviations of long names. */
#ifndef FT_CLI_H
#define FT_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

/* How an option takes a value. */
typedef enum ft_cli_arg {
    FT_CLI_FLAG,  /* none: "--force"; "--force=x" is an unknown option */
    FT_CLI_VALUE, /* one: "--out DIR" or "--out=DIR" ("-o DIR" by a short name); the next
                   * argument is the value whatever it looks like */
    FT_CLI_COUNT, /* an optional positive count: "--plan=N", "--plan N" when the next
                   * argument starts with a digit 1-9, else bare "--plan" (value NULL) */
} ft_cli_arg;

/* One option of a tool; its table ends with an entry whose name is NULL. */
typedef struct ft_cli_option {
    const char *name; /* the long name with its dashes: "--model" */
    char short_name;  /* 'h' for "-h"; 0 when it has none */
    ft_cli_arg arg;
    int id;           /* what ft_cli_next returns for it; >= 0 */
} ft_cli_option;

/* What ft_cli_next returns besides an option's id. */
enum {
    FT_CLI_END = -1,        /* every argument has been read */
    FT_CLI_POSITIONAL = -2, /* a positional argument (value); "-" alone is one */
    FT_CLI_UNKNOWN = -3,    /* error: arg starts with '-' and is no option of the table */
    FT_CLI_NO_VALUE = -4,   /* error: arg takes a value and is the last argument */
    FT_CLI_UNEXPECTED = -5, /* error: arg is one positional argument more than the tool
                             * takes */
};

/* One pass over a command line; set up by ft_cli_init. */
typedef struct ft_cli_parser {
    int argc;
    char **argv;
    const ft_cli_option *options;
    int max_positional; /* positional arguments the tool takes */
    int next;           /* argv index of the next argument */
    int positional;     /* positional arguments read so far */
    const char *arg;    /* the argument read last, as written: what messages name */
    const char *value;  /* the option's value (NULL for a flag or a count left out), or the
                         * positional argument */
} ft_cli_parser;

/* Starts a pass over argv[1..argc) for a tool with the options of the table options (it
 * must outlive the pass) that takes up to max_positional positional arguments. */
void ft_cli_init(ft_cli_parser *p, int argc, char **argv, const ft_cli_option *options,
                 int max_positional);

/* Reads the next argument: the id of the option it names (with p->value), or
 * FT_CLI_POSITIONAL, FT_CLI_END, or an error (FT_CLI_UNKNOWN, FT_CLI_NO_VALUE,
 * FT_CLI_UNEXPECTED, naming p->arg) for ft_cli_error. Options and positional arguments
 * may come in any order; "--" is no end of the options but an unknown option, as it
 * always was for the tools. */
int ft_cli_next(ft_cli_parser *p);

/* For an error result of ft_cli_next: prints "<tool>: error: unknown option 'ARG'",
 * "... option 'ARG' needs a value" or "... unexpected argument 'ARG'" and the usage text
 * to stderr, as ft_cli_usage_error does; returns 2. */
int ft_cli_error(const ft_cli_parser *p, int result, const char *tool, const char *usage);

/* Prints "<tool>: error: " + fmt (with one %s argument) + a newline and the usage text to
 * stderr; returns 2, the exit code of a usage error. */
int ft_cli_usage_error(const char *tool, const char *usage, const char *fmt, const char *arg);

#ifdef __cplusplus
}
#endif

#endif
