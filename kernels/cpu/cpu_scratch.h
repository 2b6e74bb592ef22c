/* Scratch memory of the CPU kernels, kept between calls so that a training step after
 * the first allocates nothing.
 *
 * Each thread that calls a kernel (the one that issues the op, outside the kernel's
 * OpenMP region) has its own set of buffers, one per slot; a slot grows when a call
 * needs more than it holds (the old contents are dropped) and never shrinks, so after
 * the first step of a run every later step of the same shape finds its buffers in
 * place. The buffers are freed when the thread exits (for the main thread, with the
 * process). They are not the tracked allocator's (lib/memory/alloc.h): like a GEMM
 * library's own buffers, they sit outside the memory plan. A failed allocation aborts
 * with a message naming the op, like the ops' other misuse checks. */
#ifndef FT_CPU_SCRATCH_H
#define FT_CPU_SCRATCH_H

#include <stddef.h>

typedef enum ft_cpu_scratch_slot {
    FT_SCRATCH_ATT_TILES, /* attention: the score tiles, one set per OpenMP thread */
    FT_SCRATCH_ATT_DK,    /* attention backward (GQA): per-head dk sums */
    FT_SCRATCH_ATT_DV,    /* attention backward (GQA): per-head dv sums */
    FT_SCRATCH_ROPE,      /* RoPE: the cos / sin table of the positions (rope.c) */
    FT_SCRATCH_NSLOTS
} ft_cpu_scratch_slot;

/* At least `bytes` bytes (64-byte aligned, contents undefined) in the calling thread's
 * buffer of `slot`; op names the kernel in the out-of-memory message. */
void *ft_cpu_scratch(ft_cpu_scratch_slot slot, size_t bytes, const char *op);

#endif
