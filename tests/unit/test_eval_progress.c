/* An evaluation's progress meter (lib/eval/eval_progress.h) on a fake clock, its output
 * captured in memory: off a terminal a run of any length prints one line when its phase
 * ends and a progress line only each every_s seconds; on a terminal a bar redrawn in
 * place (at most every 0.1 s, and when the phase completes), erased by the phase's line
 * and by notices; a meter with no stream prints nothing. The bar and lines as people see
 * them, through ft-eval, are in tests/conformance/test_eval_output.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "eval/eval_progress.h"

static double fake_now;
static double fake_clock(void) { return fake_now; }

typedef struct capture {
    FILE *f;
    char *buf;
    size_t len;
} capture;

static void cap_open(capture *c)
{
    *c = (capture){0};
    c->f = open_memstream(&c->buf, &c->len);
    CHECK(c->f != NULL);
}

/* What was written so far (the stream stays open). */
static const char *cap_text(capture *c)
{
    fflush(c->f);
    return c->buf ? c->buf : "";
}

static void cap_close(capture *c)
{
    fclose(c->f);
    free(c->buf);
}

static size_t count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

static void meter_on(ft_eval_meter *m, capture *c, bool tty)
{
    cap_open(c);
    ft_eval_meter_init(m, "ft-eval", c->f, tty);
    m->clock = fake_clock;
    fake_now = 100;
}

static void test_pipe_one_line_per_phase(void)
{
    ft_eval_meter m;
    capture c;
    meter_on(&m, &c, false);
    ft_eval_meter_line(&m, "data: %s: %d samples", "q.jsonl", 1000);
    ft_eval_progress p = ft_eval_meter_begin(&m, "loss", "samples");
    for (size_t i = 1; i <= 1000; i++) {
        fake_now = 100 + 0.01 * (double)i; /* 10 s in all: less than every_s */
        p.update(p.ctx, i, 1000);
    }
    CHECK(strcmp(cap_text(&c), "ft-eval: data: q.jsonl: 1000 samples\n") == 0);
    ft_eval_meter_end(&m, "%d samples", 1000);
    CHECK(strcmp(cap_text(&c), "ft-eval: data: q.jsonl: 1000 samples\n"
                               "ft-eval: loss: 1000 samples, 10.0 s\n") == 0);
    CHECK(!strchr(cap_text(&c), '\r'));
    cap_close(&c);
}

static void test_pipe_progress_lines_every_s(void)
{
    ft_eval_meter m;
    capture c;
    meter_on(&m, &c, false);
    ft_eval_progress p = ft_eval_meter_begin(&m, "generation", "samples");
    static const double at[] = {10, 30, 61, 90, 125, 130, 200};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        fake_now = 100 + at[i];
        p.update(p.ctx, i + 1, 7);
    }
    /* lines at 61 s and 125 s (64 s after the last); none at 200 s: the phase is done */
    CHECK(strcmp(cap_text(&c), "ft-eval: generation: 3/7 samples, 61 s\n"
                               "ft-eval: generation: 5/7 samples, 125 s\n") == 0);
    m.every_s = 0; /* none at all */
    p = ft_eval_meter_begin(&m, "loss", "samples");
    fake_now += 1000;
    p.update(p.ctx, 1, 2);
    CHECK(count(cap_text(&c), "\n") == 2);
    cap_close(&c);
}

static void test_terminal_bar(void)
{
    ft_eval_meter m;
    capture c;
    meter_on(&m, &c, true);
    ft_eval_progress p = ft_eval_meter_begin(&m, "loss", "samples");
    p.update(p.ctx, 1, 4); /* the first report draws */
    CHECK(strcmp(cap_text(&c),
                 "\r\033[K[#######.......................] loss 1/4 samples 0.0 s") == 0);
    fake_now += 0.05;
    p.update(p.ctx, 2, 4); /* within 0.1 s of the last draw: not redrawn */
    CHECK(count(cap_text(&c), "\r\033[K") == 1);
    fake_now += 0.1;
    p.update(p.ctx, 3, 4);
    CHECK(count(cap_text(&c), "\r\033[K") == 2 && strstr(cap_text(&c), "] loss 3/4 samples"));
    fake_now += 0.01;
    p.update(p.ctx, 4, 4); /* complete: drawn whatever the time */
    CHECK(strstr(cap_text(&c), "[##############################] loss 4/4 samples 0.2 s"));
    size_t before = strlen(cap_text(&c));
    ft_eval_meter_end(&m, "%d samples", 4);
    /* the bar erased, then the phase's line */
    CHECK(strcmp(cap_text(&c) + before, "\r\033[Kft-eval: loss: 4 samples, 0.2 s\n") == 0);
    CHECK(!strstr(cap_text(&c), "\n\r")); /* nothing left to erase after it */
    cap_close(&c);
}

static void test_terminal_notice_erases_the_bar(void)
{
    ft_eval_meter m;
    capture c;
    meter_on(&m, &c, true);
    ft_eval_progress p = ft_eval_meter_begin(&m, "generation", "samples");
    p.update(p.ctx, 1, 2);
    size_t before = strlen(cap_text(&c));
    ft_eval_meter_line(&m, "a notice");
    CHECK(strcmp(cap_text(&c) + before, "\r\033[Kft-eval: a notice\n") == 0);
    p.update(p.ctx, 1, 2); /* the bar comes back under it at once */
    CHECK(strstr(cap_text(&c) + before, "\n\r\033[K[###############...............]"));
    before = strlen(cap_text(&c));
    ft_eval_meter_clear(&m); /* before an error message */
    CHECK(strcmp(cap_text(&c) + before, "\r\033[K") == 0);
    before = strlen(cap_text(&c));
    ft_eval_meter_clear(&m); /* no bar: nothing */
    CHECK(strlen(cap_text(&c)) == before);
    cap_close(&c);
}

static void test_silent_without_a_stream(void)
{
    ft_eval_meter m;
    ft_eval_meter_init(&m, "ft-eval", NULL, true);
    CHECK(!m.tty);
    ft_eval_progress p = ft_eval_meter_begin(&m, "loss", "samples");
    p.update(p.ctx, 1, 1);
    ft_eval_meter_line(&m, "x");
    ft_eval_meter_end(&m, "y");
    ft_eval_meter_clear(&m);
    CHECK(!m.bar_shown);
}

int main(void)
{
    RUN(test_pipe_one_line_per_phase);
    RUN(test_pipe_progress_lines_every_s);
    RUN(test_terminal_bar);
    RUN(test_terminal_notice_erases_the_bar);
    RUN(test_silent_without_a_stream);
    return check_summary("eval_progress");
}
