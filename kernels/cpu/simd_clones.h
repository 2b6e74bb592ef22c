/* FT_SIMD_CLONES: a hot loop's function compiled once per x86-64 level, the widest the
 * CPU runs picked when the program loads.
 *
 * The build targets x86-64-v2 (SSE4.2: binaries that run on any x86-64 of the last 15
 * years), so the CPU kernels' vectorized loops (fast_exp.h's exp, the softmax and gating
 * passes) are 4 floats wide. On an AVX-512 Xeon the same loops at 16 floats took a
 * SmolLM-shaped LoRA step's cross-entropy from 3.9 % to 1.5 % of its CPU time, SwiGLU
 * from 3.3 % to 1.6 %, the attention's own passes from 4.1 % to 2.8 % (perf, the whole
 * library rebuilt with -march=x86-64-v4). GCC's target_clones builds the function for
 * x86-64-v4 (AVX-512), x86-64-v3 (AVX2, FMA) and the build's default, and an ifunc
 * resolver picks one by the CPU's features at load time.
 *
 * What it changes in the results: nothing in an element-wise map (the build compiles ISO
 * C with -ffp-contract=off, so no clone fuses a multiply and an add into an FMA, and
 * every lane computes the same expression), and the rounding of vectorized sums only
 * (a reduction keeps one partial sum per lane, so a wider vector adds in another order).
 * A machine always takes the same clone, so a run and its resume agree bit for bit.
 *
 * Put it on a function that an OpenMP loop calls per row or per span, not on one that
 * holds the `omp parallel` itself: GCC outlines a parallel region's body into its own
 * function, which is not cloned. Such a function is called through the ifunc, so it is
 * not inlined: give it enough work per call (a row of a vocabulary, a span of thousands
 * of elements). The helpers it calls are inlined into each clone (flatten): one left out
 * of line would be the build's baseline code. */
#ifndef FT_CPU_SIMD_CLONES_H
#define FT_CPU_SIMD_CLONES_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FT_SIMD_CLONES                                                                   \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), flatten))
#else
#define FT_SIMD_CLONES
#endif

#endif
