/* Strict number parsing: the one way the tools' options, the environment lookups and the
 * run config turn text into numbers.
 *
 * Each parser takes the whole text as one decimal number and returns 0 with *out set,
 * or -1 with *out untouched when the text is NULL or empty, has anything before or
 * after the number (leading or trailing spaces, "3x", "12 MiB"), does not fit the type
 * (errno ERANGE from strtol and friends), or lies outside the bounds. A leading '+' is
 * part of a number. errno is as it was before the call. Plain C, libc only. */
#ifndef FT_NUMPARSE_H
#define FT_NUMPARSE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A whole number in [min, max] (both ends included), e.g. ft_parse_long(s, 1, INT_MAX, &v)
 * for a count that goes into an int. */
int ft_parse_long(const char *text, long min, long max, long *out);

/* A whole number in [min, max] (both ends included) with no sign but an optional '+':
 * "-1" is rejected, never wrapped around as strtoull would. For seeds (0..UINT64_MAX)
 * and byte counts (1..SIZE_MAX). */
int ft_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* The open ends of a range for ft_parse_double (0: both ends closed). */
enum {
    FT_PARSE_OPEN_MIN = 1, /* min itself is out of range */
    FT_PARSE_OPEN_MAX = 2, /* max itself is out of range */
};

/* A finite floating-point number (as strtod reads it: "0.05", "1e-4", ".5") in the
 * range from min to max, each end closed unless open (FT_PARSE_OPEN_MIN and/or
 * FT_PARSE_OPEN_MAX) says otherwise: ft_parse_double(s, 0, 1, FT_PARSE_OPEN_MAX, &d) is
 * [0, 1). -HUGE_VAL and HUGE_VAL leave an end unbounded; a value of float goes in
 * [-FLT_MAX, FLT_MAX]. NaN and infinities are rejected, and so is a value too large or
 * too small in magnitude for a double (ERANGE). */
int ft_parse_double(const char *text, double min, double max, int open, double *out);

#ifdef __cplusplus
}
#endif

#endif
