/* The CPU engine's run-time environment: one pool of threads, libgomp's, that sleeps
 * while it waits, and OpenBLAS's GEMM kernels for the CPU it runs on.
 *
 * Wait policy. BLAS is OpenBLAS's OpenMP build (mk/config.mk links it by its path), so a
 * GEMM and our own `omp parallel` loops run on the same libgomp threads and never compete
 * for a core (the pthreads build keeps a second pool whose idle threads spin and
 * sched_yield while ours work, and ours spin while it works: issue 25's profile, half the
 * time). What is left is how a thread waits between two parallel regions: libgomp's
 * default spins for a while (GOMP_SPINCOUNT) before sleeping; where the cores are all
 * busy (as many threads as cores, or another job on the machine) a spinning waiter takes
 * the core from the thread it waits for. OMP_WAIT_POLICY=passive sleeps at once.
 *
 * Kernel choice. OpenBLAS's DYNAMIC_ARCH build (Debian's) picks its kernels from the CPU's
 * family and model numbers, before main. A model newer than the library (0.3.21 knows no
 * Xeon after Sapphire Rapids: an Emerald Rapids, family 6 model 207, comes out as
 * "Prescott") gets the SSE3 kernels: sgemm at 29 GFLOP/s a core where the AVX-512 ones
 * give 149 (measured on that Xeon), five times the time of a training step's GEMMs. So
 * where the detected core has no AVX2 kernels but the CPU (and the OS, which libgcc's
 * __builtin_cpu_supports checks through XGETBV) supports AVX2 and FMA, we name the core
 * OpenBLAS should use: SkylakeX with AVX-512 (F, CD, BW, DQ, VL: what its kernels use),
 * else Haswell. OPENBLAS_CORETYPE, read by OpenBLAS's initializer, is the library's own
 * switch for this; a value the environment already gives is kept.
 *
 * Both settings are read by the libraries' initializers, before main (and before any
 * constructor of the program); setting them later changes nothing, and a .preinit_array
 * entry runs before libc has its environment (glibc sets environ again after it). So a
 * tool calls ft_cpu_env_reexec(argv) first thing in main: when the environment lacks
 * either setting, it sets it and executes the same program again (same pid, same
 * arguments and descriptors; nothing has run yet), whose libraries then read it. Where the
 * exec fails (no /proc), it carries on with the libraries' defaults. Under gdb or valgrind
 * (which follow no exec by default) set OMP_WAIT_POLICY and OPENBLAS_CORETYPE so that
 * nothing is run again. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cpu_env.h"

char *openblas_get_corename(void);

/* OpenBLAS's x86-64 cores (driver/others/dynamic.c's names) whose sgemm uses AVX2 and FMA
 * or AVX-512. */
static bool core_has_avx2_kernels(const char *core)
{
    static const char *const avx2[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                       "SapphireRapids"};
    for (size_t i = 0; i < sizeof avx2 / sizeof avx2[0]; i++)
        if (!strcmp(core, avx2[i]))
            return true;
    return false;
}

const char *ft_cpu_blas_core_for(const char *detected, ft_cpu_simd simd)
{
    if (!detected || simd == FT_CPU_SIMD_OLDER || core_has_avx2_kernels(detected))
        return NULL;
    return simd == FT_CPU_SIMD_AVX512 ? "SkylakeX" : "Haswell";
}

ft_cpu_simd ft_cpu_simd_level(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return FT_CPU_SIMD_OLDER;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return FT_CPU_SIMD_AVX512;
    return FT_CPU_SIMD_AVX2;
#else
    return FT_CPU_SIMD_OLDER; /* (other architectures: OpenBLAS's detection stands) */
#endif
}

void ft_cpu_env_reexec(char **argv)
{
    bool again = false;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT") &&
        !setenv("OMP_WAIT_POLICY", "passive", 1))
        again = true;
    const char *core = getenv("OPENBLAS_CORETYPE")
                           ? NULL
                           : ft_cpu_blas_core_for(openblas_get_corename(), ft_cpu_simd_level());
    if (core && !setenv("OPENBLAS_CORETYPE", core, 1))
        again = true;
    if (!again)
        return;
    execv("/proc/self/exe", argv);
    /* not executed again: the libraries keep their defaults */
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("OPENBLAS_CORETYPE");
}
