/* Small file-system helpers shared by the writers of lib/. */
#ifndef FT_FSUTIL_H
#define FT_FSUTIL_H

#include <stddef.h>

#include "ft_error.h"

/* Writes data to path atomically: <path>.tmp, fsync, rename. */
int ft_write_file_atomic(const char *path, const void *data, size_t n, ft_err *err);

/* Copies src to dst atomically (dst.tmp + rename). */
int ft_copy_file(const char *src, const char *dst, ft_err *err);

/* mkdir -p; an existing directory is fine. */
int ft_mkdir_p(const char *path, ft_err *err);

#endif
