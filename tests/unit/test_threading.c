/* The CPU engine's threading model and BLAS kernels (lib/core/cpu_env.c, mk/config.mk):
 *  - the OpenBLAS linked is its OpenMP build, so GEMMs share libgomp's threads;
 *  - ft_cpu_env_reexec gives libgomp the wait policy passive unless the environment
 *    chose one: checked in children of this test, in their environment and in libgomp
 *    itself (omp_display_env);
 *  - after it, OpenBLAS runs kernels that use the CPU's AVX2 / AVX-512 where it has them
 *    (its own detection takes an unknown newer Xeon for a Prescott), unless the
 *    environment named a core; ft_cpu_blas_core_for's choices on a table;
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
#include "core/cpu_env.h"
#include "cpu/cpu_ops.h"

int openblas_get_parallel(void);
char *openblas_get_corename(void);

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

/* Runs this binary as "--child EXPECTED PID CORE" with OMP_WAIT_POLICY set to value and
 * OPENBLAS_CORETYPE to core (NULL: unset); the child calls ft_cpu_env_reexec and exits 0
 * when its environment and libgomp both hold the policy EXPECTED, its pid did not
 * change, and OpenBLAS runs the core CORE given, or without one a core that
 * ft_cpu_blas_core_for leaves as it is. */
static int run_child(const char *value, const char *expected, const char *core)
{
    pid_t pid = fork();
    if (pid == 0) {
        unsetenv("GOMP_SPINCOUNT");
        if (value)
            setenv("OMP_WAIT_POLICY", value, 1);
        else
            unsetenv("OMP_WAIT_POLICY");
        if (core)
            setenv("OPENBLAS_CORETYPE", core, 1);
        else
            unsetenv("OPENBLAS_CORETYPE");
        char pidbuf[32];
        snprintf(pidbuf, sizeof pidbuf, "%d", (int)getpid());
        execl(self_path, self_path, "--child", expected, pidbuf, core ? core : "-",
              (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid <= 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int child(char **argv)
{
    ft_cpu_env_reexec(argv);
    char pol[32];
    libgomp_wait_policy(pol, sizeof pol);
    const char *env = getenv("OMP_WAIT_POLICY"), *core = openblas_get_corename();
    int core_ok = strcmp(argv[4], "-") ? !strcasecmp(core, argv[4])
                                       : !ft_cpu_blas_core_for(core, ft_cpu_simd_level());
    int ok = env && !strcmp(env, argv[2]) && !strcasecmp(pol, argv[2]) &&
             atoi(argv[3]) == (int)getpid() && core_ok;
    if (!ok)
        fprintf(stderr, "  child: OMP_WAIT_POLICY=%s, libgomp %s, pid %d (from %s), "
                        "OpenBLAS core %s (wanted %s)\n",
                env ? env : "(unset)", pol, (int)getpid(), argv[3], core, argv[4]);
    return !ok;
}

/* no policy in the environment: passive, read by libgomp (the program ran again); the
 * BLAS core is one with the CPU's widest kernels */
static void test_passive_by_default(void)
{
    CHECK(run_child(NULL, "passive", NULL) == 0);
}

/* a policy the environment gives is kept; so is a BLAS core it names (the only ones
 * this test may name: one every x86-64 runs, and one that needs AVX2 where the CPU has
 * it), and the program still runs again for the policy */
static void test_environment_kept(void)
{
    CHECK(run_child("active", "active", NULL) == 0);
    CHECK(run_child("passive", "passive", "Prescott") == 0);
    CHECK(run_child(NULL, "passive", "Prescott") == 0);
    if (ft_cpu_simd_level() != FT_CPU_SIMD_OLDER)
        CHECK(run_child(NULL, "passive", "Haswell") == 0);
}

/* The core asked for: only where OpenBLAS chose one without AVX2 kernels on a CPU that
 * has AVX2 (and FMA), the AVX-512 one where the CPU has that too. */
static void test_blas_core_choice(void)
{
    CHECK(!strcmp(ft_cpu_blas_core_for("Prescott", FT_CPU_SIMD_AVX512), "SkylakeX"));
    CHECK(!strcmp(ft_cpu_blas_core_for("Nehalem", FT_CPU_SIMD_AVX2), "Haswell"));
    CHECK(!strcmp(ft_cpu_blas_core_for("Sandybridge", FT_CPU_SIMD_AVX512), "SkylakeX"));
    CHECK(ft_cpu_blas_core_for("Prescott", FT_CPU_SIMD_OLDER) == NULL);
    CHECK(ft_cpu_blas_core_for("Haswell", FT_CPU_SIMD_AVX512) == NULL);
    CHECK(ft_cpu_blas_core_for("SkylakeX", FT_CPU_SIMD_AVX512) == NULL);
    CHECK(ft_cpu_blas_core_for("Zen", FT_CPU_SIMD_AVX2) == NULL);
    CHECK(ft_cpu_blas_core_for("Cooperlake", FT_CPU_SIMD_AVX512) == NULL);
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
    if (argc == 5 && !strcmp(argv[1], "--child"))
        return child(argv);
    /* as the tools run: on a CPU OpenBLAS misdetects, its fallback kernels give other
     * bits on 1 and 2 threads (Prescott's and Haswell's did on a 2-core Xeon, for the
     * shape below) */
    ft_cpu_env_reexec(argv);
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    self_path[n > 0 ? n : 0] = '\0';
    RUN(test_openblas_is_openmp);
    RUN(test_passive_by_default);
    RUN(test_environment_kept);
    RUN(test_blas_core_choice);
    RUN(test_gemm_same_bits_any_threads);
    return check_summary("threading");
}
