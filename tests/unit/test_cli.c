/* The tools' option parser (lib/core/cli.h): flags, values as "--opt v" and "--opt=v",
 * short names, the optional count of ft-train's --plan, positional arguments, and the
 * errors (unknown option, missing value, unexpected argument) with their messages. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "core/cli.h"

enum { OPT_HELP, OPT_FORCE, OPT_MODEL, OPT_OUT, OPT_PLAN, OPT_SET, OPT_SET_VAR };

static const ft_cli_option options[] = {
    {"--help", 'h', FT_CLI_FLAG, OPT_HELP},
    {"--force", 0, FT_CLI_FLAG, OPT_FORCE},
    {"--model", 'm', FT_CLI_VALUE, OPT_MODEL},
    {"--out", 0, FT_CLI_VALUE, OPT_OUT},
    {"--plan", 0, FT_CLI_COUNT, OPT_PLAN},
    {"--set", 0, FT_CLI_VALUE, OPT_SET},
    {"--set-var", 0, FT_CLI_VALUE, OPT_SET_VAR},
    {NULL, 0, 0, 0},
};

#define ARGV(...) ((char *[]){"prog", __VA_ARGS__})
#define ARGC(...) ((int)(sizeof ARGV(__VA_ARGS__) / sizeof(char *)))
#define START(p, max_pos, ...) \
    ft_cli_init(p, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), options, max_pos)

/* Whether the next result is want with value val (NULL: none). */
static int next_is(ft_cli_parser *p, int want, const char *val)
{
    int got = ft_cli_next(p);
    if (got != want) {
        fprintf(stderr, "  got %d, want %d (arg '%s')\n", got, want, p->arg ? p->arg : "");
        return 0;
    }
    return val ? p->value && strcmp(p->value, val) == 0 : p->value == NULL;
}

static void test_values(void)
{
    ft_cli_parser p;
    START(&p, 0, "--model", "m1", "--out=o1", "--out=", "--model", "--force", "-m", "m2",
          "--force");
    CHECK(next_is(&p, OPT_MODEL, "m1"));
    CHECK(next_is(&p, OPT_OUT, "o1"));
    CHECK(next_is(&p, OPT_OUT, ""));
    /* the argument after a value option is its value, whatever it looks like */
    CHECK(next_is(&p, OPT_MODEL, "--force"));
    CHECK(next_is(&p, OPT_MODEL, "m2"));
    CHECK(next_is(&p, OPT_FORCE, NULL));
    CHECK(next_is(&p, FT_CLI_END, NULL));
    CHECK(next_is(&p, FT_CLI_END, NULL));
}

static void test_flags_and_prefixes(void)
{
    ft_cli_parser p;
    START(&p, 0, "-h", "--help", "--set", "a=b", "--set-var", "X=1", "--set=c=d");
    CHECK(next_is(&p, OPT_HELP, NULL));
    CHECK(next_is(&p, OPT_HELP, NULL));
    CHECK(next_is(&p, OPT_SET, "a=b"));
    CHECK(next_is(&p, OPT_SET_VAR, "X=1"));
    CHECK(next_is(&p, OPT_SET, "c=d"));
    CHECK(next_is(&p, FT_CLI_END, NULL));
}

static void test_unknown(void)
{
    /* no abbreviations, no value on a flag, no clustered short names, no "--" marker */
    const char *unknown[] = {"--bogus", "--mod", "--modelx", "--force=1", "--help=x",
                             "-x",      "-hm",   "--",       "-5",        "---model"};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        ft_cli_parser p;
        char *argv[] = {"prog", (char *)unknown[i], "more"};
        ft_cli_init(&p, 3, argv, options, 1);
        CHECK(ft_cli_next(&p) == FT_CLI_UNKNOWN);
        CHECK(p.arg && strcmp(p.arg, unknown[i]) == 0);
    }
}

static void test_missing_value(void)
{
    ft_cli_parser p;
    START(&p, 0, "--force", "--model");
    CHECK(next_is(&p, OPT_FORCE, NULL));
    CHECK(ft_cli_next(&p) == FT_CLI_NO_VALUE);
    CHECK(strcmp(p.arg, "--model") == 0);
    START(&p, 0, "-m");
    CHECK(ft_cli_next(&p) == FT_CLI_NO_VALUE);
    CHECK(strcmp(p.arg, "-m") == 0);
}

static void test_positional(void)
{
    ft_cli_parser p;
    START(&p, 2, "a", "--force", "-", "c");
    CHECK(next_is(&p, FT_CLI_POSITIONAL, "a"));
    CHECK(next_is(&p, OPT_FORCE, NULL));
    CHECK(next_is(&p, FT_CLI_POSITIONAL, "-"));
    CHECK(ft_cli_next(&p) == FT_CLI_UNEXPECTED);
    CHECK(strcmp(p.arg, "c") == 0);
    START(&p, 0, "--force", "x");
    CHECK(next_is(&p, OPT_FORCE, NULL));
    CHECK(ft_cli_next(&p) == FT_CLI_UNEXPECTED);
    CHECK(strcmp(p.arg, "x") == 0);
    START(&p, 0, "-");
    CHECK(ft_cli_next(&p) == FT_CLI_UNEXPECTED);
}

static void test_count(void)
{
    ft_cli_parser p;
    /* the next argument is the count only when it starts with 1-9 */
    START(&p, 1, "--plan", "3", "--plan", "--force", "--plan=12", "--plan", "3x", "--plan",
          "0", "--plan");
    CHECK(next_is(&p, OPT_PLAN, "3"));
    CHECK(next_is(&p, OPT_PLAN, NULL));
    CHECK(next_is(&p, OPT_FORCE, NULL));
    CHECK(next_is(&p, OPT_PLAN, "12"));
    CHECK(next_is(&p, OPT_PLAN, "3x")); /* taken: the tool rejects it with its name */
    CHECK(next_is(&p, OPT_PLAN, NULL));
    CHECK(next_is(&p, FT_CLI_POSITIONAL, "0"));
    CHECK(next_is(&p, OPT_PLAN, NULL));
    CHECK(next_is(&p, FT_CLI_END, NULL));
}

/* What ft_cli_error prints to stderr for the first result of argv; its return in *rc. */
static void error_text(int argc, char **argv, int max_pos, char *buf, size_t size, int *rc)
{
    ft_cli_parser p;
    ft_cli_init(&p, argc, argv, options, max_pos);
    int r = ft_cli_next(&p);
    FILE *tmp = tmpfile();
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    *rc = ft_cli_error(&p, r, "ft-x", "usage: ft-x\n");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, size - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
}

static void test_error_messages(void)
{
    char buf[256];
    int rc = 0;
    error_text(2, ARGV("--bogus"), 0, buf, sizeof buf, &rc);
    CHECK(rc == 2 && strcmp(buf, "ft-x: error: unknown option '--bogus'\nusage: ft-x\n") == 0);
    error_text(2, ARGV("--out"), 0, buf, sizeof buf, &rc);
    CHECK(rc == 2 && strcmp(buf, "ft-x: error: option '--out' needs a value\nusage: ft-x\n") == 0);
    error_text(2, ARGV("extra"), 0, buf, sizeof buf, &rc);
    CHECK(rc == 2 && strcmp(buf, "ft-x: error: unexpected argument 'extra'\nusage: ft-x\n") == 0);
}

int main(void)
{
    RUN(test_values);
    RUN(test_flags_and_prefixes);
    RUN(test_unknown);
    RUN(test_missing_value);
    RUN(test_positional);
    RUN(test_count);
    RUN(test_error_messages);
    return check_summary("cli");
}
