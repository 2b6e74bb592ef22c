#include "core/cli.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ft_cli_value_option(int argc, char **argv, int *i, const char *const *names, size_t n,
                        const char **opt, const char **val)
{
    const char *a = argv[*i];
    for (size_t k = 0; k < n; k++) {
        size_t len = strlen(names[k]);
        if (strcmp(a, names[k]) == 0) {
            if (*i + 1 >= argc)
                return -1;
            *opt = names[k];
            *val = argv[++*i];
            return 1;
        }
        if (strncmp(a, names[k], len) == 0 && a[len] == '=') {
            *opt = names[k];
            *val = a + len + 1;
            return 1;
        }
    }
    return 0;
}

int ft_cli_usage_error(const char *tool, const char *usage, const char *fmt, const char *arg)
{
    fprintf(stderr, "%s: error: ", tool);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", usage);
    return 2;
}

int ft_cli_parse_long(const char *val, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(val, &end, 10);
    if (errno || end == val || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int ft_cli_parse_bytes(const char *val, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno || end == val || *end || val[0] == '-' || v == 0 || v > SIZE_MAX)
        return -1;
    *out = (size_t)v;
    return 0;
}
