/* The CPU engine's threading model and BLAS kernels (lib/core/cpu_env.c, mk/config.mk):
 *  - the OpenBLAS linked is its OpenMP build, so GEMMs share libgomp's threads;
 *  - ft_cpu_env_reexec gives libgomp the wait policy passive unless the environment
 *    chose one: checked in children of this test, in their environment and in libgomp
 *    itself (omp_display_env);
 *  - after it, OpenBLAS runs kernels that use the CPU's AVX2 / AVX-512 where it has them
 *    (its own detection takes an unknown newer Xeon for a Prescott), unless the
 *    environment named a core; ft_cpu_blas_core_for's choices on a table;
 *  - a GEMM gives the same bits on 1 thread and on all of them, and inside a parallel
 *    region (where OpenBLAS's OpenMP build runs it on the calling thread); so do the
 *    linear layer's GEMMs, which ft_cpu_sgemm cuts into a block a thread. */
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

/* p[i] = ((i mul mod m) - m / 2) / div: fixed values of both signs, no two runs alike */
static void pattern(float *p, size_t n, unsigned mul, unsigned m, float div)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((int)((unsigned)i * mul % m) - (int)(m / 2)) / div;
}

static void test_gemm_same_bits_any_threads(void)
{
    enum { N = 96, IN = 200, OUT = 130 };
    float *x = malloc(sizeof(float) * N * IN), *w = malloc(sizeof(float) * OUT * IN);
    float *y[3];
    pattern(x, (size_t)N * IN, 7919u, 1000u, 317.0f);
    pattern(w, (size_t)OUT * IN, 104729u, 997u, 411.0f);
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

/* y = x w^T, dx = dy w and dw = dy^T x (ft_cpu_linear_*, cut into one block a thread by
 * ft_cpu_sgemm) with the same bits on 1, 2 and 3 threads: the model's shapes (SmolLM's
 * projections and its LoRA products at rank 16, 512 token rows) and odd ones. */
static void linear_all(float *y, float *dx, float *dw, const float *x, const float *w,
                       const float *dy, int N, int in, int out, int threads)
{
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    memset(y, 0, sizeof(float) * (size_t)N * out);
    memset(dx, 0, sizeof(float) * (size_t)N * in);
    memset(dw, 0, sizeof(float) * (size_t)out * in);
    ft_cpu_linear_forward(y, x, w, NULL, N, in, out, 1.0f, 0);
    ft_cpu_linear_backward(dx, dw, NULL, dy, x, w, N, in, out, 0.5f);
    omp_set_num_threads(saved);
}

/* out[t][k] (k < count, n[k] floats) from 1, 2 and 3 threads (t = 0, 1, 2): 2 and 3
 * threads must give 1 thread's bits in every output; the outputs are freed. */
static void check_same_outputs(const char *what, float *out[][6], const size_t *n, int count)
{
    for (int t = 1; t < 3; t++) {
        int same = 1;
        for (int k = 0; k < count; k++)
            same &= !memcmp(out[0][k], out[t][k], sizeof(float) * n[k]);
        if (!same)
            fprintf(stderr, "  %s: %d threads differ from 1\n", what, t + 1);
        CHECK(same);
    }
    for (int t = 0; t < 3; t++)
        for (int k = 0; k < count; k++)
            free(out[t][k]);
}

static void test_linear_same_bits_any_threads(void)
{
    static const int shapes[][3] = {{512, 576, 1536}, {512, 1536, 576}, {512, 576, 192},
                                    {512, 576, 16},   {512, 1536, 16},  {512, 16, 1536},
                                    {512, 16, 576},   {333, 517, 1029}, {2048, 16, 40}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        size_t nx = (size_t)N * in, nw = (size_t)out * in, ny = (size_t)N * out;
        float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw);
        float *dy = malloc(sizeof(float) * ny), *r[3][6];
        pattern(x, nx, 7919u, 1000u, 317.0f);
        pattern(w, nw, 104729u, 997u, 411.0f);
        pattern(dy, ny, 2654435761u, 1009u, 523.0f);
        for (int t = 0; t < 3; t++) {
            r[t][0] = malloc(sizeof(float) * ny);
            r[t][1] = malloc(sizeof(float) * nx);
            r[t][2] = malloc(sizeof(float) * nw);
            linear_all(r[t][0], r[t][1], r[t][2], x, w, dy, N, in, out, t + 1);
        }
        size_t n[3] = {ny, nx, nw};
        char what[64];
        snprintf(what, sizeof what, "N=%d in=%d out=%d", N, in, out);
        check_same_outputs(what, r, n, 3);
        free(x);
        free(w);
        free(dy);
    }
}

/* The LoRA linear's passes (ft_cpu_lora_linear_*: the base GEMM cut by the threads, the
 * rank-16 products by their shape, all in one region) with the same bits on 1, 2 and 3
 * threads, on SmolLM's projection shapes and an odd one. */
static void lora_all(float *const *o, const float *x, const float *w, const float *a,
                     const float *bl, const float *dy, int N, int in, int out, int r,
                     int threads)
{
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    memset(o[2], 0, sizeof(float) * (size_t)N * in);
    memset(o[3], 0, sizeof(float) * (size_t)r * in);
    memset(o[4], 0, sizeof(float) * (size_t)out * r);
    ft_cpu_lora_linear_forward(o[0], o[1], x, x, w, NULL, a, bl, N, in, out, r, 2.0f, 1);
    ft_cpu_lora_linear_backward(o[2], o[2], o[3], o[4], o[5], dy, x, o[1], w, a, bl, N, in,
                                out, r, 2.0f);
    omp_set_num_threads(saved);
}

static void test_lora_linear_same_bits_any_threads(void)
{
    static const int shapes[][4] = {
        {512, 576, 576, 16}, {512, 576, 1536, 16}, {512, 1536, 576, 16}, {512, 576, 192, 16},
        {333, 517, 1029, 8}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int N = shapes[s][0], in = shapes[s][1], out = shapes[s][2], r = shapes[s][3];
        size_t n[6] = {(size_t)N * out, (size_t)N * r, (size_t)N * in, (size_t)r * in,
                       (size_t)out * r, (size_t)N * r};
        float *x = malloc(sizeof(float) * N * in), *w = malloc(sizeof(float) * out * in);
        float *a = malloc(sizeof(float) * r * in), *bl = malloc(sizeof(float) * out * r);
        float *dy = malloc(sizeof(float) * N * out), *o[3][6];
        pattern(x, (size_t)N * in, 7919u, 1000u, 317.0f);
        pattern(w, (size_t)out * in, 104729u, 997u, 411.0f);
        pattern(a, (size_t)r * in, 31337u, 991u, 877.0f);
        pattern(bl, (size_t)out * r, 6151u, 983u, 733.0f);
        pattern(dy, (size_t)N * out, 2654435761u, 1009u, 523.0f);
        for (int t = 0; t < 3; t++) {
            for (int k = 0; k < 6; k++)
                o[t][k] = malloc(sizeof(float) * n[k]);
            lora_all(o[t], x, w, a, bl, dy, N, in, out, r, t + 1);
        }
        char what[64];
        snprintf(what, sizeof what, "N=%d in=%d out=%d r=%d", N, in, out, r);
        check_same_outputs(what, o, n, 6);
        free(x);
        free(w);
        free(a);
        free(bl);
        free(dy);
    }
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
    RUN(test_linear_same_bits_any_threads);
    RUN(test_lora_linear_same_bits_any_threads);
    return check_summary("threading");
}
