/* TensorBoard event-file writer: training logs that TensorBoard reads as they grow.
 *
 * One writer is one file, <logdir>/events.out.tfevents.<10-digit unix time>.<hostname>.
 * <pid>.<uid> (the name TensorBoard's own EventFileWriter gives; uid counts the writers
 * this process has opened, from 0). The file is a sequence of TFRecords, each an Event
 * protocol buffer; the first says file_version "brain.Event:2". See FORMATS.md,
 * "TensorBoard event files".
 *
 * Each record goes to the OS as it is written (fflush), so a running TensorBoard sees it;
 * ft_tb_flush also fsyncs. Write errors (disk full) come back from the call that hit
 * them, with the file's path in err. A writer is not thread-safe. */
#ifndef FT_TB_WRITER_H
#define FT_TB_WRITER_H

#include <stdint.h>

#include "core/ft_error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ft_tb_writer ft_tb_writer;

/* Creates logdir (mkdir -p) and a new event file in it, and writes the file_version
 * record. *out is owned by the caller (ft_tb_close); NULL on failure. */
int ft_tb_open(ft_tb_writer **out, const char *logdir, ft_err *err);

/* As ft_tb_open, but writes to exactly `path` (created or truncated); no directory is
 * made. For callers that choose their own name, and for tests. */
int ft_tb_open_path(ft_tb_writer **out, const char *path, ft_err *err);

/* The path of the event file; valid until ft_tb_close. */
const char *ft_tb_path(const ft_tb_writer *w);

/* A scalar: Event{wall_time, step, summary{value{tag, simple_value}}}. value is stored
 * as float32, as TensorBoard stores scalars. */
int ft_tb_scalar(ft_tb_writer *w, const char *tag, int64_t step, double value, ft_err *err);

/* A text summary for TensorBoard's text plugin (rendered as Markdown): a scalar DT_STRING
 * tensor holding the NUL-terminated text, with plugin_data{plugin_name "text"}. */
int ft_tb_text(ft_tb_writer *w, const char *tag, int64_t step, const char *text, ft_err *err);

/* fflush + fsync. */
int ft_tb_flush(ft_tb_writer *w, ft_err *err);

/* Closes the file and frees w (NULL is fine). Errors are not reported: call ft_tb_flush
 * first to learn of them. */
void ft_tb_close(ft_tb_writer *w);

#ifdef __cplusplus
}
#endif

#endif
