/* Reading a JSON file we were given (see json_file.h). */
#include "formats/json_file.h"

#include <errno.h>
#include <unistd.h>

#include "core/fsutil.h"

json_t *ft_json_read_file(const char *path, size_t flags, ft_err *err)
{
    int fd = ft_open_regular(path, err);
    if (fd < 0)
        return NULL;
    json_error_t je;
    json_t *root = json_loadfd(fd, flags | JSON_REJECT_DUPLICATES, &je);
    close(fd);
    if (!root) {
        ft_fail(err, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
        errno = EINVAL;
    }
    return root;
}
