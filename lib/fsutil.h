/* Small file-system helpers shared by the writers of lib/. */
#ifndef FT_FSUTIL_H
#define FT_FSUTIL_H

#include <stddef.h>

#include "ft_error.h"

/* Writes data to path atomically: <path>.tmp, fsync, rename. */
int ft_write_file_atomic(const char *path, const void *data, size_t n, ft_err *err);

/* Copies src to dst atomically (dst.tmp + rename). */
int ft_copy_file(const char *src, const char *dst, ft_err *err);

/* rm -r path, not following symbolic links; a missing path is fine. */
int ft_remove_tree(const char *path);

/* fsync of a directory, so that renames into it are durable. */
int ft_fsync_dir(const char *dir, ft_err *err);

/* mkdir -p; an existing directory is fine. */
int ft_mkdir_p(const char *path, ft_err *err);

#endif
