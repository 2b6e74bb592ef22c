/* Command-line helpers shared by the tools' thin mains. */
#ifndef FT_CLI_H
#define FT_CLI_H

#include <stddef.h>

/* Matches argv[*i] against the options in names[0..n) that take a value, written as
 * "--opt value" or "--opt=value". Returns 1 with *opt (the matched name) and *val set
 * (advancing *i past a separate value), 0 when argv[*i] is none of them, and -1 when the
 * value of a matched option is missing. */
int ft_cli_value_option(int argc, char **argv, int *i, const char *const *names, size_t n,
                        const char **opt, const char **val);

/* Prints "<tool>: error: " + fmt (with one %s argument) + a newline and the usage text to
 * stderr; returns 2, the exit code of a usage error. */
int ft_cli_usage_error(const char *tool, const char *usage, const char *fmt, const char *arg);

/* Parses a whole decimal number in [min, max] into *out; -1 when val is anything else. */
int ft_cli_parse_long(const char *val, long min, long max, long *out);

/* Parses a positive whole number of bytes (decimal, no sign, no unit) into *out;
 * -1 when val is anything else. */
int ft_cli_parse_bytes(const char *val, size_t *out);

#endif
