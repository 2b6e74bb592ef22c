/* An evaluation's progress for people (see eval_progress.h).
 *
 * On a terminal the bar is "\r\033[K[####......] loss 45/90 samples 2.1 s": carriage
 * return and erase-line redraw it in place, at most every BAR_EVERY_S seconds (and at the
 * end) so that a fast phase does not spend its time writing to the terminal; lines of
 * their own erase it first. Elsewhere (a pipe, a file, a batch job's log) there is no
 * bar: the phase's end is one line, and a phase running longer than every_s adds a line
 * "<prefix>: <what>: 45/90 samples, 60 s" each every_s, so that a log shows a long
 * evaluation alive without a line per sample. */
#include "eval/eval_progress.h"

#include <stdarg.h>
#include <time.h>

enum { BAR_WIDTH = 30 };
static const double BAR_EVERY_S = 0.1;

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ft_eval_meter_init(ft_eval_meter *m, const char *prefix, FILE *out, bool tty)
{
    *m = (ft_eval_meter){.prefix = prefix, .out = out, .tty = out && tty, .every_s = 60,
                         .clock = monotonic_s};
}

void ft_eval_meter_clear(ft_eval_meter *m)
{
    if (m->out && m->bar_shown) {
        fputs("\r\033[K", m->out);
        fflush(m->out);
    }
    m->bar_shown = false;
}

static void draw_bar(ft_eval_meter *m, size_t done, size_t total, double now)
{
    char bar[BAR_WIDTH + 1];
    size_t fill = total ? BAR_WIDTH * (done < total ? done : total) / total : BAR_WIDTH;
    for (size_t i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    fprintf(m->out, "\r\033[K[%s] %s %zu/%zu %s %.1f s", bar, m->what, done, total, m->unit,
            now - m->t_begin);
    fflush(m->out);
    m->bar_shown = true;
}

static void on_progress(void *ctx, size_t done, size_t total)
{
    ft_eval_meter *m = ctx;
    if (!m->out)
        return;
    double now = m->clock();
    if (m->tty) {
        if (!m->bar_shown || done >= total || now - m->t_last >= BAR_EVERY_S) {
            draw_bar(m, done, total, now);
            m->t_last = now;
        }
    } else if (m->every_s > 0 && done < total && now - m->t_last >= m->every_s) {
        fprintf(m->out, "%s: %s: %zu/%zu %s, %.0f s\n", m->prefix, m->what, done, total,
                m->unit, now - m->t_begin);
        fflush(m->out);
        m->t_last = now;
    }
}

ft_eval_progress ft_eval_meter_begin(ft_eval_meter *m, const char *what, const char *unit)
{
    m->what = what;
    m->unit = unit;
    m->t_begin = m->t_last = m->clock();
    m->bar_shown = false;
    return (ft_eval_progress){.update = on_progress, .ctx = m};
}

void ft_eval_meter_end(ft_eval_meter *m, const char *fmt, ...)
{
    if (!m->out)
        return;
    ft_eval_meter_clear(m);
    fprintf(m->out, "%s: %s: ", m->prefix, m->what);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(m->out, fmt, ap);
    va_end(ap);
    fprintf(m->out, ", %.1f s\n", m->clock() - m->t_begin);
    fflush(m->out);
}

void ft_eval_meter_line(ft_eval_meter *m, const char *fmt, ...)
{
    if (!m->out)
        return;
    ft_eval_meter_clear(m);
    fprintf(m->out, "%s: ", m->prefix);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(m->out, fmt, ap);
    va_end(ap);
    fputc('\n', m->out);
    fflush(m->out);
}
