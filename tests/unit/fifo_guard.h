/* For tests that a reader refuses a FIFO instead of waiting on it: make_fifo creates one,
 * and fifo_guard(true) ... fifo_guard(false) wraps the call under test with an alarm, so
 * a reader that blocks in open() (the bug) ends the test binary with a message instead
 * of hanging the run. */
#ifndef FT_FIFO_GUARD_H
#define FT_FIFO_GUARD_H

#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

static void fifo_guard_fired(int sig)
{
    (void)sig;
    static const char msg[] = "FAIL: a reader blocked on a FIFO (10 s alarm)\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(1);
    _exit(1);
}

static inline void fifo_guard(bool on)
{
    if (on)
        signal(SIGALRM, fifo_guard_fired);
    alarm(on ? 10 : 0);
}

/* A FIFO at path (replacing whatever is there); false if it cannot be made. */
static inline bool make_fifo(const char *path)
{
    unlink(path);
    return mkfifo(path, 0600) == 0;
}

#endif
