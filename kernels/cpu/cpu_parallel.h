/* When a CPU kernel's pass is worth an OpenMP parallel region.
 *
 * Starting a region wakes the pool's threads, which wait asleep between regions
 * (OMP_WAIT_POLICY=passive, lib/core/cpu_env.c): on a 2-vCPU VM that cost 58 us of CPU
 * time and 70 us of wall clock a region (tests of an empty region; waking a thread whose
 * vCPU has halted takes the hypervisor), while a memory-bound pass over a million floats
 * takes 150 to 300 us on one thread. A SmolLM-shaped training step opened about 2,400
 * regions, most of them around passes of a few hundred thousand elements. So a pass runs
 * on the calling thread unless it has at least as many elements as below: then the
 * region's cost is a small part of the work it splits. (Where the split decides the
 * result's bits, the kernels cut the work into fixed blocks that do not depend on the
 * thread count, so these thresholds change no value.) */
#ifndef FT_CPU_PARALLEL_H
#define FT_CPU_PARALLEL_H

/* element-wise passes of loads, stores, adds and multiplies (add, copy, RMSNorm, RoPE) */
#define FT_PAR_MIN_PASS (1L << 20)
/* passes with an exp, a division or a square root per element (SwiGLU, AdamW, the
 * cross-entropy rows) */
#define FT_PAR_MIN_MATH (1L << 17)

#endif
