/* The CPU engine's run-time environment: libgomp's wait policy and OpenBLAS's kernel
 * choice (cpu_env.c says why each matters). */
#ifndef FT_CPU_ENV_H
#define FT_CPU_ENV_H

/* First thing in a tool's main: where the environment chooses no OpenMP wait policy
 * (OMP_WAIT_POLICY, GOMP_SPINCOUNT), set OMP_WAIT_POLICY=passive; where it names no
 * OpenBLAS core (OPENBLAS_CORETYPE) and OpenBLAS took one without the AVX2 kernels the
 * CPU could run, set OPENBLAS_CORETYPE (ft_cpu_blas_core_for). If either was set, execute
 * the program again. Returns only when it does not (nothing to set, or the exec failed:
 * then the environment is as it was). */
void ft_cpu_env_reexec(char **argv);

/* The widest vector instructions this CPU and OS support, as OpenBLAS's kernels need
 * them: AVX2 with FMA, and AVX-512 F, CD, BW, DQ and VL. */
typedef enum { FT_CPU_SIMD_OLDER, FT_CPU_SIMD_AVX2, FT_CPU_SIMD_AVX512 } ft_cpu_simd;
ft_cpu_simd ft_cpu_simd_level(void);

/* The OPENBLAS_CORETYPE to ask for when OpenBLAS detected the core `detected`
 * (openblas_get_corename()) on a CPU supporting `simd`: "SkylakeX" or "Haswell" where the
 * detected core's kernels use neither AVX2 nor AVX-512 but the CPU has them; NULL where
 * the detection stands. */
const char *ft_cpu_blas_core_for(const char *detected, ft_cpu_simd simd);

#endif
