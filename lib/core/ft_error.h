/* core/: the ground every other folder stands on.
 *
 * Owns: the error convention (ft_error.h), files and directories (fsutil.h: atomic
 * writes, run dirs, output checks), the tools' command-line helpers (cli.h), the seeded
 * counter-based RNG (rng.h), CRC-32C (crc32c.h) and JSON-lines reading (jsonl.h).
 * May call: nothing.
 * (libc, and the Debian libraries of mk/config.mk, only.)
 * (This is the folder's main header.) */

/* Error convention of libft.
 *
 * Every library function that can fail takes an `ft_err *` last and returns 0 on
 * success, -1 on failure with err->msg saying what went wrong and where (file, key,
 * line, tensor name). err may be NULL when the caller does not want the message.
 * Programmer errors (a shape mismatch between two internal buffers) abort through
 * FT_CHECK; user input never reaches it. */
#ifndef FT_ERROR_H
#define FT_ERROR_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ft_err {
    char msg[1024];
    /* The failure is an out-of-memory of the tracked allocator (ft_fail_oom): the run
     * may fit with other settings, so ft-train adds the memory plan and the overrides
     * that fit (lib/memory/oom_advice.h). */
    bool oom;
} ft_err;

/* Formats the message into err (if not NULL) and returns -1, so callers can write
 * `return ft_fail(err, "%s: bad key", path);`. */
int ft_fail(ft_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ft_fail for a tracked allocation that did not fit (sets err->oom; ft_fail clears it,
 * ft_fail_prefix keeps it). */
int ft_fail_oom(ft_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes an existing message: "context: old message". Returns -1. */
int ft_fail_prefix(ft_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Internal invariant check: prints file:line and the condition, then aborts. */
#define FT_CHECK(cond)                                                              \
    do {                                                                            \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: internal error: check failed: %s\n", __FILE__,  \
                    __LINE__, #cond);                                               \
            abort();                                                                \
        }                                                                           \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
