#include "core/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int ft_write_file_atomic(const char *path, const void *data, size_t n, ft_err *err)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return ft_fail(err, "%s: path too long", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return ft_fail(err, "%s: %s", tmp, strerror(errno));
    const char *p = data;
    size_t left = n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            unlink(tmp);
            return ft_fail(err, "%s: write: %s", tmp, strerror(e));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return ft_fail(err, "%s: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return ft_fail(err, "%s: rename: %s", path, strerror(e));
    }
    return 0;
}

int ft_mkdir_p(const char *path, ft_err *err)
{
    char buf[4096];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
        return ft_fail(err, "%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return ft_fail(err, "%s: mkdir: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return ft_fail(err, "%s: mkdir: %s", buf, strerror(errno));
    return 0;
}

/* What a file that is not a regular one is, for messages. */
static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISCHR(mode) || S_ISBLK(mode))
        return "a device";
    return "not a plain file";
}

int ft_open_regular(const char *path, ft_err *err)
{
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC), e = errno;
    struct stat st;
    const char *what = "cannot open", *why = NULL;
    if (fd >= 0 && fstat(fd, &st) != 0) {
        e = errno;
        what = "cannot stat";
    } else if (fd >= 0 && !S_ISREG(st.st_mode)) {
        e = EINVAL;
        why = file_kind(st.st_mode);
    } else if (fd >= 0) {
        int flags = fcntl(fd, F_GETFL);
        if (flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0)
            return fd;
        e = errno;
    }
    if (fd >= 0)
        close(fd);
    if (why)
        ft_fail(err, "%s: not a regular file (%s)", path, why);
    else
        ft_fail(err, "%s: %s: %s", path, what, strerror(e));
    errno = e; /* for callers that tell a missing file from others */
    return -1;
}

int ft_copy_file(const char *src, const char *dst, ft_err *err)
{
    int fd = ft_open_regular(src, err);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return ft_fail(err, "%s: %s", src, strerror(e));
    }
    char *data = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            char *grown = realloc(data, cap);
            if (!grown) {
                free(data);
                fclose(f);
                return ft_fail(err, "%s: out of memory", src);
            }
            data = grown;
        }
        size_t got = fread(data + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    int rc = bad ? ft_fail(err, "%s: read error", src) : ft_write_file_atomic(dst, data, n, err);
    free(data);
    return rc;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int ft_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int ft_fsync_dir(const char *dir, ft_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return ft_fail(err, "%s: fsync: %s", dir, strerror(e));
    }
    close(fd);
    return 0;
}

bool ft_same_path(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int ft_out_dir_check(const char *path, bool force, const char *const *inputs, size_t n,
                     char *out, size_t size, ft_err *err)
{
    if (!path || !path[0])
        return ft_fail(err, "the output dir is empty");
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    /* room for the ".tmp-<pid>-<k>.old" suffixes of the temporary names */
    if (len + 64 >= size)
        return ft_fail(err, "%s: path too long", path);
    snprintf(out, size, "%.*s", (int)len, path);
    struct stat st;
    if (lstat(out, &st) != 0)
        return 0;
    if (!force)
        return ft_fail(err, "%s: already exists (use --force to replace it)", out);
    for (size_t i = 0; i < n; i++)
        if (inputs[i] && ft_same_path(out, inputs[i]))
            return ft_fail(err, "%s: the output dir must not be an input dir (%s)", out,
                           inputs[i]);
    return 0;
}

int ft_make_temp_dir(const char *out, char *tmp, size_t size, ft_err *err)
{
    char parent[4096];
    if ((size_t)snprintf(parent, sizeof parent, "%s", out) >= sizeof parent)
        return ft_fail(err, "%s: path too long", out);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if (ft_mkdir_p(parent, err))
            return -1;
    }
    for (int k = 0; k < 1000; k++) {
        if ((size_t)snprintf(tmp, size, "%s.tmp-%ld-%d", out, (long)getpid(), k) >= size)
            return ft_fail(err, "%s: path too long", out);
        if (mkdir(tmp, 0777) == 0)
            return 0;
        if (errno != EEXIST)
            return ft_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
    }
    return ft_fail(err, "%s: cannot create a temporary dir next to it", out);
}

int ft_publish_dir(const char *tmp, const char *out, bool force, const char *tool,
                   ft_err *err)
{
    struct stat st;
    if (lstat(out, &st) != 0) {
        if (rename(tmp, out) != 0)
            return ft_fail(err, "%s: cannot rename %s to it: %s", out, tmp, strerror(errno));
        return 0;
    }
    if (!force)
        return ft_fail(err, "%s: already exists (use --force to replace it)", out);
    char aside[4400];
    if ((size_t)snprintf(aside, sizeof aside, "%s.old", tmp) >= sizeof aside)
        return ft_fail(err, "%s: path too long", tmp);
    if (rename(out, aside) != 0)
        return ft_fail(err, "%s: cannot move the existing output aside: %s", out,
                       strerror(errno));
    if (rename(tmp, out) != 0) {
        int e = errno;
        if (rename(aside, out) != 0)
            return ft_fail(err, "%s: cannot rename %s to it (%s); the old output is now %s",
                           out, tmp, strerror(e), aside);
        return ft_fail(err, "%s: cannot rename %s to it: %s", out, tmp, strerror(e));
    }
    if (ft_remove_tree(aside) != 0)
        fprintf(stderr, "%s: warning: could not remove the old output %s\n", tool, aside);
    return 0;
}
