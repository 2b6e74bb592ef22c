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

#include <stdbool.h>
#include <stddef.h>
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

/* ---- HParams: the hyperparameters and metrics of a run, in the format of TensorBoard's
 * HParams plugin (tensorboard/plugins/hparams: summary.py, plugin_data.proto, api.proto),
 * so that runs compare side by side in its table. Each record is a Summary.Value with
 * plugin_data{plugin_name "hparams", content HParamsPluginData} and an empty float
 * tensor, at step 0. */

/* The types of api.proto's DataType. */
typedef enum ft_tb_hparam_type {
    FT_TB_HPARAM_STRING = 1,
    FT_TB_HPARAM_BOOL = 2,
    FT_TB_HPARAM_NUMBER = 3 /* float64 */
} ft_tb_hparam_type;

/* One hyperparameter: its name and value (the field of its type). */
typedef struct ft_tb_hparam {
    const char *name;
    ft_tb_hparam_type type;
    const char *str;
    bool b;
    double num;
} ft_tb_hparam;

/* Writes "_hparams_/experiment" (an Experiment: hparam_infos with each name and type,
 * metric_infos with the scalar tags in metric_tags, which the table shows the last value
 * of) and "_hparams_/session_start_info" (the values of the n hparams, start time now). */
int ft_tb_hparams_start(ft_tb_writer *w, const ft_tb_hparam *hp, size_t n,
                        const char *const *metric_tags, size_t n_metrics, ft_err *err);

/* The status values of api.proto's Status. */
typedef enum ft_tb_session_status {
    FT_TB_SESSION_SUCCESS = 1,
    FT_TB_SESSION_FAILURE = 2,
    FT_TB_SESSION_RUNNING = 3
} ft_tb_session_status;

/* Writes "_hparams_/session_end_info": the session's status, end time now. */
int ft_tb_hparams_end(ft_tb_writer *w, ft_tb_session_status status, ft_err *err);

#ifdef __cplusplus
}
#endif

#endif
