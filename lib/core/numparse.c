#include "core/numparse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>

/* strtol and friends skip leading white space, so " 5" would pass the end check: the
 * text must start with the number itself. */
static int starts_number(const char *text)
{
    return text && *text && !isspace((unsigned char)*text);
}

int ft_parse_long(const char *text, long min, long max, long *out)
{
    if (!starts_number(text))
        return -1;
    int saved = errno;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    int bad = errno || end == text || *end || v < min || v > max;
    errno = saved;
    if (bad)
        return -1;
    *out = v;
    return 0;
}

int ft_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out)
{
    /* strtoull negates "-1" into ULLONG_MAX instead of failing */
    if (!starts_number(text) || text[0] == '-')
        return -1;
    int saved = errno;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    int bad = errno || end == text || *end || v < min || v > max;
    errno = saved;
    if (bad)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

int ft_parse_double(const char *text, double min, double max, int open, double *out)
{
    if (!starts_number(text))
        return -1;
    int saved = errno;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    int bad = errno || end == text || *end || !isfinite(v) || v < min || v > max ||
              ((open & FT_PARSE_OPEN_MIN) && v == min) ||
              ((open & FT_PARSE_OPEN_MAX) && v == max);
    errno = saved;
    if (bad)
        return -1;
    *out = v;
    return 0;
}
