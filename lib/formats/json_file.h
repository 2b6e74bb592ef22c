/* The JSON files of a model or adapter dir that we read whole (config.json,
 * adapter_config.json, model.safetensors.index.json): opened as regular files only
 * (a FIFO or a device would hang the reader), with duplicate keys refused (Python's json
 * keeps the last one silently; a file that says two things about one key is not one to
 * guess about). */
#ifndef FT_JSON_FILE_H
#define FT_JSON_FILE_H

#include <jansson.h>

#include "core/ft_error.h"

/* Parses the file at path with jansson's flags plus JSON_REJECT_DUPLICATES. Returns the
 * root (the caller json_decref's it), or NULL with err naming the file: "cannot open:
 * <reason>" (errno ENOENT for a missing file), "not a regular file (a FIFO)", or
 * "path:line:column: invalid JSON: <jansson's text>" ("duplicate object key near '"k"'"). */
json_t *ft_json_read_file(const char *path, size_t flags, ft_err *err);

#endif
