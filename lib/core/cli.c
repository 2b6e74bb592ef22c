#include "core/cli.h"

#include <stdio.h>
#include <string.h>

void ft_cli_init(ft_cli_parser *p, int argc, char **argv, const ft_cli_option *options,
                 int max_positional)
{
    *p = (ft_cli_parser){.argc = argc, .argv = argv, .options = options,
                         .max_positional = max_positional, .next = 1};
}

/* The option that a names ("-h", "--out" or "--out=DIR"), with *inline_value the text
 * after '=' (NULL without one); NULL when it names none. */
static const ft_cli_option *find(const ft_cli_option *o, const char *a,
                                 const char **inline_value)
{
    *inline_value = NULL;
    for (; o->name; o++) {
        if (a[1] != '-') {
            if (o->short_name && a[1] == o->short_name && !a[2])
                return o;
            continue;
        }
        size_t n = strlen(o->name);
        if (strncmp(a, o->name, n) != 0)
            continue;
        if (!a[n])
            return o;
        if (a[n] == '=' && o->arg != FT_CLI_FLAG) {
            *inline_value = a + n + 1;
            return o;
        }
    }
    return NULL;
}

int ft_cli_next(ft_cli_parser *p)
{
    p->arg = p->value = NULL;
    if (p->next >= p->argc)
        return FT_CLI_END;
    const char *a = p->arg = p->argv[p->next++];
    if (a[0] != '-' || !a[1]) {
        if (p->positional == p->max_positional)
            return FT_CLI_UNEXPECTED;
        p->positional++;
        p->value = a;
        return FT_CLI_POSITIONAL;
    }
    const ft_cli_option *o = find(p->options, a, &p->value);
    if (!o)
        return FT_CLI_UNKNOWN;
    if (p->value)
        return o->id;
    const char *next = p->next < p->argc ? p->argv[p->next] : NULL;
    if (o->arg == FT_CLI_VALUE) {
        if (!next)
            return FT_CLI_NO_VALUE;
        p->value = next;
        p->next++;
    } else if (o->arg == FT_CLI_COUNT && next && next[0] >= '1' && next[0] <= '9') {
        p->value = next;
        p->next++;
    }
    return o->id;
}

int ft_cli_error(const ft_cli_parser *p, int result, const char *tool, const char *usage)
{
    const char *fmt = result == FT_CLI_NO_VALUE     ? "option '%s' needs a value"
                      : result == FT_CLI_UNEXPECTED ? "unexpected argument '%s'"
                                                    : "unknown option '%s'";
    return ft_cli_usage_error(tool, usage, fmt, p->arg);
}

int ft_cli_usage_error(const char *tool, const char *usage, const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: error: ", tool);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}
