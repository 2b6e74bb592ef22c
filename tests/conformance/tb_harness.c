/* ft-tb: the conformance suite's window on lib/formats/tb_writer.c.
 *
 *   ft-tb LOGDIR < commands
 *       opens a new event file in LOGDIR and writes one record per input line:
 *         scalar TAG STEP VALUE
 *         text TAG STEP TEXT...    (TEXT: the rest of the line; \n, \t and \\ are
 *                                   unescaped, so a line can carry Markdown tables)
 *         flush
 *       blank lines are skipped. At the end it flushes, closes and prints the event
 *       file's path on stdout.
 * Exit status 1 with "ft-tb: error: ..." on stderr for a bad line or a failed write;
 * 2 for usage. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/tb_writer.h"

static int fail(const char *msg, long line)
{
    if (line > 0)
        fprintf(stderr, "ft-tb: error: stdin:%ld: %s\n", line, msg);
    else
        fprintf(stderr, "ft-tb: error: %s\n", msg);
    return 1;
}

/* Splits off the next space-delimited word of *s. */
static char *word(char **s)
{
    char *p = *s;
    while (*p == ' ')
        p++;
    if (!*p)
        return NULL;
    char *end = strchr(p, ' ');
    if (end) {
        *end = '\0';
        *s = end + 1;
    } else {
        *s = p + strlen(p);
    }
    return p;
}

static int parse_step(const char *s, long long *step)
{
    char *end;
    errno = 0;
    *step = strtoll(s, &end, 10);
    return errno || end == s || *end ? -1 : 0;
}

static void unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p == '\\' && (p[1] == 'n' || p[1] == 't' || p[1] == '\\')) {
            p++;
            *o++ = *p == 'n' ? '\n' : *p == 't' ? '\t' : '\\';
        } else {
            *o++ = *p;
        }
    }
    *o = '\0';
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: ft-tb LOGDIR < commands\n");
        return 2;
    }
    ft_err err;
    ft_tb_writer *w;
    if (ft_tb_open(&w, argv[1], &err))
        return fail(err.msg, 0);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            line[--len] = '\0';
        char *rest = line, *cmd = word(&rest);
        if (!cmd)
            continue;
        if (strcmp(cmd, "flush") == 0) {
            if (ft_tb_flush(w, &err))
                rc = fail(err.msg, lineno);
            continue;
        }
        int is_scalar = strcmp(cmd, "scalar") == 0;
        if (!is_scalar && strcmp(cmd, "text") != 0) {
            rc = fail("unknown command (scalar, text, flush)", lineno);
            break;
        }
        char *tag = word(&rest), *step_s = word(&rest);
        long long step;
        if (!tag || !step_s || parse_step(step_s, &step)) {
            rc = fail("expected: scalar|text TAG STEP ...", lineno);
            break;
        }
        if (is_scalar) {
            char *value_s = word(&rest), *end;
            double value = value_s ? strtod(value_s, &end) : 0;
            if (!value_s || end == value_s || *end || word(&rest)) {
                rc = fail("expected: scalar TAG STEP VALUE", lineno);
                break;
            }
            if (ft_tb_scalar(w, tag, step, value, &err))
                rc = fail(err.msg, lineno);
        } else {
            unescape(rest);
            if (ft_tb_text(w, tag, step, rest, &err))
                rc = fail(err.msg, lineno);
        }
    }
    free(line);
    if (rc == 0 && ft_tb_flush(w, &err))
        rc = fail(err.msg, 0);
    if (rc == 0)
        printf("%s\n", ft_tb_path(w));
    ft_tb_close(w);
    return rc;
}
