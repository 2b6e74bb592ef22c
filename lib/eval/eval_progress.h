/* An evaluation's progress for people, on one stream (ft-eval's stderr): on a terminal a
 * bar redrawn in place on the last line; otherwise one line per event (a phase done, a
 * notice) and, while a phase runs longer, one progress line every every_s seconds, never
 * a line per batch or sample. A meter with no stream (the ranks other than 0) is silent.
 *
 *   ft_eval_meter m;
 *   ft_eval_meter_init(&m, "ft-eval", stderr, isatty(2));
 *   ft_eval_progress p = ft_eval_meter_begin(&m, "loss", "samples");
 *   ft_eval_loss_run(..., &p, ...);          // the bar: [#####.....] loss 45/90 samples
 *   ft_eval_meter_end(&m, "%zu samples", n); // "ft-eval: loss: 90 samples, 2.3 s"
 */
#ifndef FT_EVAL_PROGRESS_H
#define FT_EVAL_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "eval/evaluate.h"

typedef struct ft_eval_meter {
    const char *prefix; /* of every line: "ft-eval" */
    FILE *out;          /* NULL: silent */
    bool tty;           /* out is a terminal: a bar instead of progress lines */
    double every_s;     /* not a terminal: a progress line at most this often (<= 0: none) */
    double (*clock)(void); /* monotonic seconds (a test may set its own) */
    /* the phase running */
    const char *what, *unit;
    double t_begin, t_last; /* when it began; the last bar or progress line */
    bool bar_shown;         /* a bar is on the terminal's last line */
} ft_eval_meter;

/* A meter on out (NULL: silent); tty says whether out is a terminal. every_s starts at
 * 60 and clock at CLOCK_MONOTONIC; a caller may change both before the first phase. */
void ft_eval_meter_init(ft_eval_meter *m, const char *prefix, FILE *out, bool tty);

/* Starts a phase called what (as "loss"), counted in unit (as "samples"), and returns the
 * progress callback for the run's reports; the meter must outlive the run. */
ft_eval_progress ft_eval_meter_begin(ft_eval_meter *m, const char *what, const char *unit);

/* Ends the phase with one line "<prefix>: <what>: <fmt...>, <seconds> s", replacing the
 * bar on a terminal. */
void ft_eval_meter_end(ft_eval_meter *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* One line "<prefix>: <fmt...>" of its own (a notice, before an error message); a bar
 * shown is erased first and redrawn by the next report. */
void ft_eval_meter_line(ft_eval_meter *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Erases a bar that is shown (before the caller prints an error), else nothing. */
void ft_eval_meter_clear(ft_eval_meter *m);

#endif
