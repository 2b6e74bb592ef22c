/* Hardware probe: what GPUs, driver, NCCL and CPU backend this process can use.
 *
 * The CUDA driver (libcuda.so.1) and NCCL (libnccl.so.2) are loaded at run time with
 * dlopen, so the probe works in every build (CUDA=0 or 1) and on machines with no GPU
 * or no driver: a missing GPU is an answer (num_gpus = 0 and a reason), not an error.
 * The emulated build (make CUDA=emu) asks the emulated runtime instead and says so: its
 * GPUs are named "... (emulated)" and `emulated` is set.
 * gpu-info prints the result; ft-train reuses it to check a config against the
 * hardware before it allocates anything. */
#ifndef FT_GPU_PROBE_H
#define FT_GPU_PROBE_H

#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

/* Devices beyond this many are counted in num_gpus but not described. */
#define FT_GPU_MAX 64

typedef struct ft_gpu_dev {
    int index;                 /* CUDA device ordinal (after CUDA_VISIBLE_DEVICES) */
    char name[256];
    size_t mem_total;          /* bytes */
    size_t mem_free;           /* bytes; valid only when mem_free_known */
    int mem_free_known;        /* 0 when no context could be made on the device */
    int cc_major, cc_minor;    /* compute capability */
    int multiprocessors;       /* SM count */
} ft_gpu_dev;

typedef struct ft_gpu_probe {
    /* GPUs */
    int num_gpus;              /* as the driver counts them; 0 when unusable */
    char reason[512];          /* why num_gpus is 0; empty when GPUs were found */
    ft_gpu_dev gpus[FT_GPU_MAX];           /* the first min(num_gpus, FT_GPU_MAX) */
    signed char peer[FT_GPU_MAX][FT_GPU_MAX]; /* peer[i][j]: 1 i can access j's memory,
                                               * 0 no, -1 unknown or i == j */
    int driver_version;        /* cuDriverGetVersion code (12040 = 12.4); 0 unknown */
    char driver_path[256];     /* file libcuda was loaded from; empty if not loaded */

    /* NCCL */
    int nccl_version;          /* ncclGetVersion code; 0 when NCCL is not usable */
    char nccl_reason[512];     /* why nccl_version is 0 */
    char nccl_path[256];

    /* This binary */
    int cuda_build;            /* built with FT_HAVE_CUDA */
    int emulated;              /* the emulated build (make CUDA=emu): the GPUs are tests/emu's
                                * emulated devices, the driver and NCCL its emulations */
    int cuda_build_version;    /* CUDA_VERSION of the toolkit it was built with, or 0 */

    /* CPU backend */
    int cpu_threads;           /* omp_get_max_threads() */
    int cpu_logical;           /* online logical CPUs */
    char cpu_model[256];       /* /proc/cpuinfo "model name", or "unknown" */
    char blas[32];             /* "OpenBLAS" */
    char blas_config[256];     /* openblas_get_config() */
    char blas_threading[16];   /* "sequential", "pthreads" or "openmp" */
    int blas_threads;          /* openblas_get_num_threads() */
} ft_gpu_probe;

/* Fills p from the system. Never fails: whatever cannot be probed is recorded as a
 * reason (reason, nccl_reason) or an "unknown" value. Creates and releases the primary
 * context of each GPU to read its free memory; the calling thread's current context is
 * left as it was. */
void ft_gpu_probe_run(ft_gpu_probe *p);

/* The GPUs only (no NCCL, no CPU), with the free memory (a context) of GPU `device` alone:
 * the others' mem_free_known stays 0. A rank's memory budget needs its own GPU, and a
 * context on each GPU from each rank costs every GPU ~500 MiB per rank of the node. */
void ft_gpu_probe_run_device(ft_gpu_probe *p, int device);

/* As ft_gpu_probe_run, loading the driver and NCCL from the given library names (a
 * bare soname is searched as dlopen does). For tests: a missing or stub library shows
 * the no-GPU paths on any machine. */
void ft_gpu_probe_run_libs(ft_gpu_probe *p, const char *cuda_lib, const char *nccl_lib);

/* Human-readable report (the text of `gpu-info`). */
void ft_gpu_probe_print(const ft_gpu_probe *p, FILE *out);

/* The same as one JSON object (the output of `gpu-info --json`); see gpu_probe.c for
 * the keys. Returns a new reference the caller json_decref()s, or NULL when out of
 * memory. */
json_t *ft_gpu_probe_json(const ft_gpu_probe *p);

/* Formatting helpers, exposed for the tests. Each writes a NUL-terminated string of at
 * most n bytes into buf and returns buf. */
/* CUresult code -> "CUDA_ERROR_NO_DEVICE"; an unlisted code -> "CUresult 123". */
const char *ft_gpu_cu_result_name(int code, char *buf, size_t n);
/* cuDriverGetVersion code -> "12.4". */
const char *ft_gpu_driver_version_str(int code, char *buf, size_t n);
/* ncclGetVersion code -> "2.21.5" (both the >= 2.9 and the older encoding). */
const char *ft_gpu_nccl_version_str(int code, char *buf, size_t n);

#endif
