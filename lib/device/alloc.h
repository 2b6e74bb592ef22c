/* The tracked allocator: every large buffer of a run (weights, gradients, optimizer
 * state, activations, workspace) is allocated through one ft_mem context, which counts
 * the bytes live and the peak per category. The memory planner predicts the same
 * categories; `make memory-check` and the logs show both.
 *
 * Buffers are 64-byte aligned and zero-filled. ft_alloc returns NULL when the system
 * is out of memory; callers turn that into an ft_err naming what they were allocating. */
#ifndef FT_ALLOC_H
#define FT_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

struct ft_err;

typedef enum ft_mem_cat {
    FT_MEM_WEIGHTS = 0,
    FT_MEM_GRADS,
    FT_MEM_OPTIM,
    FT_MEM_ACTIVATIONS,
    FT_MEM_WORKSPACE,
    FT_MEM_NCAT
} ft_mem_cat;

typedef struct ft_mem {
    size_t live[FT_MEM_NCAT];
    size_t peak[FT_MEM_NCAT];
    size_t live_total, peak_total;
    /* 0, or the most bytes that may be live at once: an allocation beyond it fails as if
     * the device were full (ft-train's FT_MEM_LIMIT rehearses an out-of-memory with it) */
    size_t limit;
    /* the last allocation that failed (bytes 0: none yet), and the bytes live then */
    size_t failed_bytes, failed_live;
    ft_mem_cat failed_cat;
} ft_mem;

/* Zero-filled, 64-byte aligned; NULL on out-of-memory (or bytes == 0). */
void *ft_alloc(ft_mem *mem, ft_mem_cat cat, size_t bytes);
/* Frees a buffer from ft_alloc (NULL is a no-op) and updates the counters. */
void ft_free(ft_mem *mem, void *p);

/* The same on a device: FT_DEV_CPU is ft_alloc/ft_free; FT_DEV_CUDA allocates GPU memory
 * (zero-filled, 256-byte aligned; NULL when the GPU is out of memory, when there is no
 * GPU, or in a build without CUDA), counted in the same categories. The device is an
 * int (an ft_device of kernels/ops.h) so this header stays free of the ops. */
void *ft_alloc_on(ft_mem *mem, int device, ft_mem_cat cat, size_t bytes);
void ft_free_on(ft_mem *mem, int device, void *p);

/* Copies bytes between any two of host (FT_DEV_CPU) and device memory; synchronous.
 * 0, or -1 with err naming the CUDA error (or a device this build lacks). */
int ft_copy_bytes(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                  struct ft_err *err);

/* The error for a tracked allocation on device that failed: "out of [GPU ]memory
 * allocating <what>: <MiB> of <category> did not fit beside <MiB> live [(limit ...)]",
 * with err->oom set (ft_fail_oom). Returns -1. */
int ft_mem_fail(struct ft_err *err, const ft_mem *mem, int device, const char *what_fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Counts (add) or uncounts bytes held by a buffer allocated elsewhere (e.g. a quantized
 * weight's arrays). */
void ft_mem_account(ft_mem *mem, ft_mem_cat cat, size_t bytes, bool add);

const char *ft_mem_cat_name(ft_mem_cat cat);

/* bytes in MiB, as the plans, the budgets and the out-of-memory errors print them. */
static inline double ft_mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

#endif
