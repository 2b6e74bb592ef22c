#include "ft_error.h"

#include <stdarg.h>
#include <string.h>

int ft_fail(ft_err *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
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
        size_t used = n < 0 ? 0 : (size_t)n;
        if (used < sizeof err->msg)
            snprintf(err->msg + used, sizeof err->msg - used, ": %s", old);
    }
    return -1;
}
