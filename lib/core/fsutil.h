/* Small file-system helpers shared by the writers of lib/. */
#ifndef FT_FSUTIL_H
#define FT_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/ft_error.h"

/* Writes data to path atomically: <path>.tmp, fsync, rename. */
int ft_write_file_atomic(const char *path, const void *data, size_t n, ft_err *err);

/* Opens path to read it whole or map it; anything but a regular file (a FIFO, a device, a
 * directory, ...) is refused without waiting on it (a FIFO is opened non-blocking, then
 * checked with fstat). Returns the descriptor (blocking, close-on-exec; the caller closes
 * it), or -1 with err naming the path: "cannot open: <reason>" (errno kept: ENOENT for a
 * missing file) or "not a regular file (a FIFO)" (errno EINVAL). */
int ft_open_regular(const char *path, ft_err *err);

/* Copies the regular file src to dst atomically (dst.tmp + rename). */
int ft_copy_file(const char *src, const char *dst, ft_err *err);

/* rm -r path, not following symbolic links; a missing path is fine. */
int ft_remove_tree(const char *path);

/* fsync of a directory, so that renames into it are durable. */
int ft_fsync_dir(const char *dir, ft_err *err);

/* mkdir -p; an existing directory is fine. */
int ft_mkdir_p(const char *path, ft_err *err);

/* Whether a and b name the same existing file system object. */
bool ft_same_path(const char *a, const char *b);

/* ---- output dirs that appear atomically (ft-merge, ft-quantize): check the target,
 * write everything into a temporary dir next to it, rename at the end. */

/* Copies path without trailing slashes into out (size bytes) and checks it: an existing
 * path is an error unless force, and it must not be one of inputs[0..n) (the dirs the
 * output is made from). */
int ft_out_dir_check(const char *path, bool force, const char *const *inputs, size_t n,
                     char *out, size_t size, ft_err *err);

/* Creates out's parent dirs and then "<out>.tmp-<pid>-<k>" (same parent, so that the
 * final rename is atomic); tmp receives its path. */
int ft_make_temp_dir(const char *out, char *tmp, size_t size, ft_err *err);

/* Moves the finished dir tmp to out. With force an existing out is replaced: moved
 * aside first, removed once the new one is in place (when that removal fails, a
 * "<tool>: warning: ..." line on stderr says where the old output is). Without force an
 * existing out is an error. tmp is left for the caller to remove on error. */
int ft_publish_dir(const char *tmp, const char *out, bool force, const char *tool,
                   ft_err *err);

#endif
