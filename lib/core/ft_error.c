#include "core/ft_error.h"

#include <stdarg.h>
#include <string.h>

static void format(ft_err *err, bool oom, const char *fmt, va_list ap)
{
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    err->oom = oom;
}

int ft_fail(ft_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        format(err, false, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int ft_fail_oom(ft_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        format(err, true, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int ft_fail_prefix(ft_err *err, const char *fmt, ...)
{
    if (err) {
        char old[sizeof err->msg];
        memcpy(old, err->msg, sizeof old);
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        /* append ": old", truncating at the buffer's end */
        size_t used = n < 0 ? 0 : (size_t)n;
        const char sep[] = ": ";
        size_t cap = sizeof err->msg - 1;
        for (size_t i = 0; i < 2 && used < cap; i++)
            err->msg[used++] = sep[i];
        for (size_t i = 0; old[i] && used < cap; i++)
            err->msg[used++] = old[i];
        if (used <= cap)
            err->msg[used] = '\0';
    }
    return -1;
}
