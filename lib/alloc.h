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

/* Counts (add) or uncounts bytes held by a buffer allocated elsewhere (e.g. a quantized
 * weight's arrays). */
void ft_mem_account(ft_mem *mem, ft_mem_cat cat, size_t bytes, bool add);

const char *ft_mem_cat_name(ft_mem_cat cat);

#endif
