/* The CPU engine's threading model: one pool of threads, libgomp's, that sleeps while it
 * waits.
 *
 * BLAS is OpenBLAS's OpenMP build (mk/config.mk links it by its path), so a GEMM and our
 * own `omp parallel` loops run on the same libgomp threads and never compete for a core
 * (the pthreads build keeps a second pool whose idle threads spin and sched_yield while
 * ours work, and ours spin while it works: issue 25's profile, half the time).
 * What is left is how a thread waits between two parallel regions: libgomp's default
 * spins for a while (GOMP_SPINCOUNT) before sleeping; where the cores are all busy (as
 * many threads as cores, or another job on the machine) a spinning waiter takes the
 * core from the thread it waits for. OMP_WAIT_POLICY=passive sleeps at once.
 *
 * libgomp reads OMP_WAIT_POLICY once, in its initializer, before main (and before any
 * constructor of the program); setting it later changes nothing, and a .preinit_array
 * entry runs before libc has its environment (glibc sets environ again after it). So a
 * tool that wants the policy calls ft_cpu_omp_policy_reexec(argv) first thing in main:
 * when the environment chooses no policy (neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT),
 * it sets OMP_WAIT_POLICY=passive and executes the same program again (same pid, same
 * arguments and descriptors; nothing has run yet), whose libgomp then reads it. Where the
 * exec fails (no /proc), it carries on with libgomp's default. Under gdb or valgrind
 * (which follow no exec by default) set OMP_WAIT_POLICY so that nothing is run again. */
#include <stdlib.h>
#include <unistd.h>

#include "core/omp_policy.h"

void ft_cpu_omp_policy_reexec(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1))
        return;
    execv("/proc/self/exe", argv);
    unsetenv("OMP_WAIT_POLICY"); /* not executed again: libgomp keeps its default */
}
