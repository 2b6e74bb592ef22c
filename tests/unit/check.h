/* A minimal unit-test harness: each tests/unit/test_*.c defines test functions,
 * lists them in main with RUN(name), and ends with `return check_summary("name");`,
 * which prints "name: N passed, N failed" (the line the runner adds up). */
#ifndef FT_CHECK_H
#define FT_CHECK_H

#include <math.h>
#include <stdio.h>

static int check_passed, check_failed, check_current_failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            check_current_failed = 1;                                                \
        }                                                                            \
    } while (0)

/* |a - b| <= tol * max(1, |b|) */
#define CHECK_CLOSE(a, b, tol)                                                       \
    do {                                                                             \
        double ca_ = (a), cb_ = (b);                                                 \
        if (!(fabs(ca_ - cb_) <= (tol) * fmax(1.0, fabs(cb_)))) {                    \
            fprintf(stderr, "  %s:%d: CHECK_CLOSE failed: %s = %.9g, %s = %.9g\n",   \
                    __FILE__, __LINE__, #a, ca_, #b, cb_);                           \
            check_current_failed = 1;                                                \
        }                                                                            \
    } while (0)

#define RUN(fn)                                                                      \
    do {                                                                             \
        check_current_failed = 0;                                                    \
        fn();                                                                        \
        if (check_current_failed) {                                                  \
            check_failed++;                                                          \
            fprintf(stderr, "FAIL %s\n", #fn);                                       \
        } else {                                                                     \
            check_passed++;                                                          \
        }                                                                            \
    } while (0)

static inline int check_summary(const char *suite)
{
    printf("%s: %d passed, %d failed\n", suite, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif
