/* JSONL line reader: one record a line, from a file or stdin ("-").
 *
 * Lines are numbered from 1 as in the file (blank lines count, so an error's line number
 * is the one an editor shows). A line may be of any length. Blank lines (empty, or only
 * spaces, tabs and CR) are skipped: JSONL writers often end files with an empty line, and
 * a blank line holds no record. A CR before the LF (CRLF files) is removed, and a UTF-8
 * byte-order mark at the start of the first line is skipped. Every returned line is
 * checked to be valid UTF-8 (no overlong forms, surrogates or code points above
 * U+10FFFF); an invalid line is an error "FILE:LINE: invalid UTF-8" that the caller may
 * skip (ft_jsonl_bad_line), since the reader can go on past it. */
#ifndef FT_JSONL_H
#define FT_JSONL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/ft_error.h"

typedef struct ft_jsonl ft_jsonl;

/* Opens path for reading ("-" = stdin, which is not closed by ft_jsonl_close). */
int ft_jsonl_open(ft_jsonl **out, const char *path, ft_err *err);
void ft_jsonl_close(ft_jsonl *r);

/* Reads the next non-blank line. Returns 1 with *line (NUL-terminated, without the line
 * ending; owned by the reader and valid until the next call), *len and *lineno set; 0 at
 * end of file; -1 on error (a read error, or the line is not valid UTF-8: then *lineno is
 * set and ft_jsonl_bad_line(r) is true, and reading may continue). */
int ft_jsonl_next(ft_jsonl *r, const char **line, size_t *len, long *lineno, ft_err *err);

/* Whether the last -1 of ft_jsonl_next was a bad line (recoverable) rather than I/O. */
bool ft_jsonl_bad_line(const ft_jsonl *r);

/* The path as given to ft_jsonl_open ("-" shows as "<stdin>"). */
const char *ft_jsonl_path(const ft_jsonl *r);

/* Whether len bytes of s are valid UTF-8 (as above). */
bool ft_utf8_valid(const char *s, size_t len);

#endif
