/* The strict number parsers (lib/core/numparse.h): whole text only, no spaces, range and
 * overflow checked, NaN and infinities refused, *out and errno untouched on failure. */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"
#include "core/numparse.h"

/* Whether text parses as a long in [min, max], and to want when it does. */
static int long_ok(const char *text, long min, long max, long want)
{
    long v = -12345;
    return ft_parse_long(text, min, max, &v) == 0 && v == want;
}

static int long_bad(const char *text, long min, long max)
{
    long v = -12345;
    return ft_parse_long(text, min, max, &v) == -1 && v == -12345;
}

static int u64_ok(const char *text, uint64_t min, uint64_t max, uint64_t want)
{
    uint64_t v = 777;
    return ft_parse_u64(text, min, max, &v) == 0 && v == want;
}

static int u64_bad(const char *text, uint64_t min, uint64_t max)
{
    uint64_t v = 777;
    return ft_parse_u64(text, min, max, &v) == -1 && v == 777;
}

static int dbl_ok(const char *text, double min, double max, int open, double want)
{
    double v = -99.0;
    return ft_parse_double(text, min, max, open, &v) == 0 && v == want;
}

static int dbl_bad(const char *text, double min, double max, int open)
{
    double v = -99.0;
    return ft_parse_double(text, min, max, open, &v) == -1 && v == -99.0;
}

static void test_long_accepts(void)
{
    CHECK(long_ok("42", LONG_MIN, LONG_MAX, 42));
    CHECK(long_ok("-7", LONG_MIN, LONG_MAX, -7));
    CHECK(long_ok("+5", LONG_MIN, LONG_MAX, 5));
    CHECK(long_ok("007", 0, 10, 7));
    CHECK(long_ok("0", 0, 0, 0));
    char text[32];
    snprintf(text, sizeof text, "%ld", LONG_MAX);
    CHECK(long_ok(text, LONG_MIN, LONG_MAX, LONG_MAX));
    snprintf(text, sizeof text, "%ld", LONG_MIN);
    CHECK(long_ok(text, LONG_MIN, LONG_MAX, LONG_MIN));
}

static void test_long_rejects_junk(void)
{
    CHECK(long_bad(NULL, LONG_MIN, LONG_MAX));
    CHECK(long_bad("", LONG_MIN, LONG_MAX));
    CHECK(long_bad("3x", LONG_MIN, LONG_MAX));
    CHECK(long_bad("5 ", LONG_MIN, LONG_MAX));
    CHECK(long_bad(" 5", LONG_MIN, LONG_MAX));
    CHECK(long_bad("\t5", LONG_MIN, LONG_MAX));
    CHECK(long_bad("x5", LONG_MIN, LONG_MAX));
    CHECK(long_bad("-", LONG_MIN, LONG_MAX));
    CHECK(long_bad("+", LONG_MIN, LONG_MAX));
    CHECK(long_bad("1.5", LONG_MIN, LONG_MAX));
    CHECK(long_bad("1e3", LONG_MIN, LONG_MAX));
    CHECK(long_bad("0x10", LONG_MIN, LONG_MAX));
}

static void test_long_range(void)
{
    /* both ends are in range, one past either is not */
    CHECK(long_ok("32", 32, 4096, 32));
    CHECK(long_ok("4096", 32, 4096, 4096));
    CHECK(long_bad("31", 32, 4096));
    CHECK(long_bad("4097", 32, 4096));
    CHECK(long_bad("0", 1, INT_MAX));
    CHECK(long_bad("-1", 1, INT_MAX));
    CHECK(long_bad("2147483648", 1, INT_MAX));
    /* past long itself: ERANGE, even with the widest bounds */
    CHECK(long_bad("99999999999999999999", LONG_MIN, LONG_MAX));
    CHECK(long_bad("-99999999999999999999", LONG_MIN, LONG_MAX));
}

static void test_u64(void)
{
    CHECK(u64_ok("0", 0, UINT64_MAX, 0));
    CHECK(u64_ok("42", 0, UINT64_MAX, 42));
    CHECK(u64_ok("+7", 0, UINT64_MAX, 7));
    CHECK(u64_ok("18446744073709551615", 0, UINT64_MAX, UINT64_MAX));
    CHECK(u64_bad("18446744073709551616", 0, UINT64_MAX));
    CHECK(u64_bad("99999999999999999999999", 0, UINT64_MAX));
    /* a sign is never wrapped around */
    CHECK(u64_bad("-1", 0, UINT64_MAX));
    CHECK(u64_bad("-0", 0, UINT64_MAX));
    CHECK(u64_bad(" -1", 0, UINT64_MAX));
    CHECK(u64_bad(NULL, 0, UINT64_MAX));
    CHECK(u64_bad("", 0, UINT64_MAX));
    CHECK(u64_bad("12x", 0, UINT64_MAX));
    CHECK(u64_bad("12 ", 0, UINT64_MAX));
    CHECK(u64_bad(" 12", 0, UINT64_MAX));
    /* a byte count: 1..SIZE_MAX */
    CHECK(u64_bad("0", 1, SIZE_MAX));
    CHECK(u64_ok("1", 1, SIZE_MAX, 1));
    CHECK(u64_ok("5000000000", 1, SIZE_MAX, 5000000000u));
    CHECK(u64_bad("11", 1, 10));
    CHECK(u64_ok("10", 1, 10, 10));
}

static void test_double_accepts(void)
{
    CHECK(dbl_ok("0.05", -HUGE_VAL, HUGE_VAL, 0, 0.05));
    CHECK(dbl_ok("1e-4", -HUGE_VAL, HUGE_VAL, 0, 1e-4));
    CHECK(dbl_ok(".5", -HUGE_VAL, HUGE_VAL, 0, 0.5));
    CHECK(dbl_ok("-2.5", -HUGE_VAL, HUGE_VAL, 0, -2.5));
    CHECK(dbl_ok("+3", -HUGE_VAL, HUGE_VAL, 0, 3.0));
    CHECK(dbl_ok("1e308", -HUGE_VAL, HUGE_VAL, 0, 1e308));
}

static void test_double_rejects(void)
{
    const char *bad[] = {NULL,  "",          "0.1x", "0.1 ", " 0.1", "x",      ".",
                         "nan", "NaN",       "-nan", "inf",  "-inf", "Infinity",
                         "1e999" /* overflow */, "-1e999", "1e-400" /* underflow */, "1e"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (!dbl_bad(bad[i], -HUGE_VAL, HUGE_VAL, 0))
            fprintf(stderr, "  accepted '%s'\n", bad[i] ? bad[i] : "(null)");
        CHECK(dbl_bad(bad[i], -HUGE_VAL, HUGE_VAL, 0));
    }
}

static void test_double_range(void)
{
    /* [0, 1): a dropout probability */
    CHECK(dbl_ok("0", 0, 1, FT_PARSE_OPEN_MAX, 0.0));
    CHECK(dbl_ok("0.999", 0, 1, FT_PARSE_OPEN_MAX, 0.999));
    CHECK(dbl_bad("1", 0, 1, FT_PARSE_OPEN_MAX));
    CHECK(dbl_bad("1.0", 0, 1, FT_PARSE_OPEN_MAX));
    CHECK(dbl_bad("-0.1", 0, 1, FT_PARSE_OPEN_MAX));
    /* (0, 1] */
    CHECK(dbl_bad("0", 0, 1, FT_PARSE_OPEN_MIN));
    CHECK(dbl_ok("1", 0, 1, FT_PARSE_OPEN_MIN, 1.0));
    CHECK(dbl_ok("1e-9", 0, 1, FT_PARSE_OPEN_MIN, 1e-9));
    /* (0, 1) and [0, 1] */
    CHECK(dbl_bad("0", 0, 1, FT_PARSE_OPEN_MIN | FT_PARSE_OPEN_MAX));
    CHECK(dbl_bad("1", 0, 1, FT_PARSE_OPEN_MIN | FT_PARSE_OPEN_MAX));
    CHECK(dbl_ok("0.5", 0, 1, FT_PARSE_OPEN_MIN | FT_PARSE_OPEN_MAX, 0.5));
    CHECK(dbl_ok("0", 0, 1, 0, 0.0));
    CHECK(dbl_ok("1", 0, 1, 0, 1.0));
    CHECK(dbl_bad("1.0000001", 0, 1, 0));
    /* what fits a float */
    CHECK(dbl_bad("1e39", -FLT_MAX, FLT_MAX, 0));
    CHECK(dbl_bad("-1e39", -FLT_MAX, FLT_MAX, 0));
    CHECK(dbl_ok("1e38", -FLT_MAX, FLT_MAX, 0, 1e38));
}

static void test_errno_kept(void)
{
    long l;
    uint64_t u;
    double d;
    errno = EINTR;
    CHECK(ft_parse_long("99999999999999999999", LONG_MIN, LONG_MAX, &l) == -1);
    CHECK(errno == EINTR);
    CHECK(ft_parse_u64("18446744073709551616", 0, UINT64_MAX, &u) == -1);
    CHECK(errno == EINTR);
    CHECK(ft_parse_double("1e999", -HUGE_VAL, HUGE_VAL, 0, &d) == -1);
    CHECK(errno == EINTR);
    CHECK(ft_parse_long("12", 0, 100, &l) == 0 && l == 12);
    CHECK(errno == EINTR);
}

int main(void)
{
    RUN(test_long_accepts);
    RUN(test_long_rejects_junk);
    RUN(test_long_range);
    RUN(test_u64);
    RUN(test_double_accepts);
    RUN(test_double_rejects);
    RUN(test_double_range);
    RUN(test_errno_kept);
    return check_summary("numparse");
}
