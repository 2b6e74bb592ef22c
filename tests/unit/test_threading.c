/* The CPU engine's threading model (kernels/cpu/omp_policy.c, mk/config.mk):
 *  - the OpenBLAS linked is its OpenMP build, so GEMMs share libgomp's threads;
 *  - ft_cpu_omp_policy_reexec gives libgomp the wait policy passive unless the
 *    environment chose one: checked in children of this test, in their environment and
 *    in libgomp itself (omp_display_env);
 *  - a GEMM gives the same bits on 1 thread and on all of them, and inside a parallel
 *    region (where OpenBLAS's OpenMP build runs it on the calling thread). */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/wait.h>

#include "check.h"
#include "core/omp_policy.h"
#include "cpu/cpu_ops.h"

int openblas_get_parallel(void);

static char self_path[4096];

/* libgomp's own view of OMP_WAIT_POLICY, "ACTIVE" or "PASSIVE" (from omp_display_env) */
static void libgomp_wait_policy(char *out, size_t n)
{
    out[0] = '\0';
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    if (!tmp || saved < 0)
        return;
    dup2(fileno(tmp), 2);
    omp_display_env(0);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    char line[512];
    while (fgets(line, sizeof line, tmp)) {
        const char *p = strstr(line, "OMP_WAIT_POLICY = '");
        if (p) {
            snprintf(out, n, "%s", p + strlen("OMP_WAIT_POLICY = '"));
            out[strcspn(out, "'")] = '\0';
        }
    }
    fclose(tmp);
}

static void test_openblas_is_openmp(void)
{
    CHECK(openblas_get_parallel() == 2); /* 0 sequential, 1 pthreads, 2 OpenMP */
}

/* Runs this binary as "--child EXPECTED" with OMP_WAIT_POLICY set to value (NULL:
 * unset); the child calls ft_cpu_omp_policy_reexec and exits 0 when its environment and
 * libgomp both hold EXPECTED and its pid did not change. */
static int run_child(const char *value, const char *expected)
{
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("GOMP_SPINCOUNT");
        if (value)
            setenv("OMP_WAIT_POLICY", value, 1);
        else
            unsetenv("OMP_WAIT_POLICY");
        char pidbuf[32];
        snprintf(pidbuf, sizeof pidbuf, "%d", (int)getpid());
        execl(self_path, self_path, "--child", expected, pidbuf, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid <= 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int child(char **argv)
{
    ft_cpu_omp_policy_reexec(argv);
    char pol[32];
    libgomp_wait_policy(pol, sizeof pol);
    const char *env = getenv("OMP_WAIT_POLICY");
    int ok = env && !strcmp(env, argv[2]) && !strcasecmp(pol, argv[2]) &&
             atoi(argv[3]) == (int)getpid();
    if (!ok)
        fprintf(stderr, "  child: OMP_WAIT_POLICY=%s, libgomp %s, pid %d (from %s)\n",
                env ? env : "(unset)", pol, (int)getpid(), argv[3]);
    return !ok;
}

/* no policy in the environment: passive, read by libgomp (the program ran again) */
static void test_passive_by_default(void)
{
    CHECK(run_child(NULL, "passive") == 0);
}

/* a policy the environment gives is kept */
static void test_environment_kept(void)
{
    CHECK(run_child("active", "active") == 0);
}

static void test_gemm_same_bits_any_threads(void)
{
    enum { N = 96, IN = 200, OUT = 130 };
    float *x = malloc(sizeof(float) * N * IN), *w = malloc(sizeof(float) * OUT * IN);
    float *y[3];
    for (int i = 0; i < N * IN; i++)
        x[i] = (float)((int)((unsigned)i * 7919u % 1000u) - 500) / 317.0f;
    for (int i = 0; i < OUT * IN; i++)
        w[i] = (float)((int)((unsigned)i * 104729u % 997u) - 498) / 411.0f;
    for (int k = 0; k < 3; k++)
        y[k] = calloc((size_t)N * OUT, sizeof(float));
    int threads = omp_get_max_threads();
    ft_cpu_linear_forward(y[0], x, w, NULL, N, IN, OUT, 1.0f, 0);
    omp_set_num_threads(1);
    ft_cpu_linear_forward(y[1], x, w, NULL, N, IN, OUT, 1.0f, 0);
    omp_set_num_threads(threads);
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        ft_cpu_linear_forward(y[2], x, w, NULL, N, IN, OUT, 1.0f, 0);
    }
    CHECK(!memcmp(y[0], y[1], sizeof(float) * N * OUT));
    CHECK(!memcmp(y[0], y[2], sizeof(float) * N * OUT));
    free(x);
    free(w);
    for (int k = 0; k < 3; k++)
        free(y[k]);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--child"))
        return child(argv);
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    self_path[n > 0 ? n : 0] = '\0';
    RUN(test_openblas_is_openmp);
    RUN(test_passive_by_default);
    RUN(test_environment_kept);
    RUN(test_gemm_same_bits_any_threads);
    return check_summary("threading");
}
