/* Cross-entropy over a vocabulary, fp32 CPU reference.
 *
 * logits [N,V], targets [N] int32 (-100 = ignored row, else in [0, V)).
 * For a counted row n with target t, m = max_j logits[n,j]:
 *   S       = sum_j exp(logits[n,j] - m)                  (the terms in fp32, S in double)
 * exp is fast_exp.h's (vectorized, within 2 ulp); S is summed in the lanes' order.
 *   lse     = m + log S
 *   loss_n  = lse - logits[n,t] = -log softmax(logits[n])[t]
 *   p_j     = exp(logits[n,j] - m) / S
 * Returns sum over counted rows of loss_n, in double (0 when no row counts).
 * When dlogits != NULL, writes (overwrites)
 *   dlogits[n,j] = grad_scale * (p_j - [j == t])   for counted rows,
 *   dlogits[n,j] = 0                               for ignored rows.
 * Subtracting the row max keeps every exp in (0, 1]: no overflow for any finite logits.
 * With softcap c > 0 the logits are capped values z = c tanh(x / c) and the gradient is
 * w.r.t. x: dlogits[n,j] is also multiplied by 1 - (z_j / c)^2 (tanh' = 1 - tanh^2);
 * then the first pass only sums and the second recomputes e_j from z_j, which it reads
 * just before it overwrites it.
 *
 * In place: dlogits may equal logits. Each row reads logits[n,t] first, then the first
 * pass stores e_j = exp(logits[n,j] - m) over element j (read, then write of the same
 * element) and the second pass turns e_j into the gradient, so no logit is read after it
 * was overwritten. Without dlogits the row is only read.
 *
 * Parallelism: over rows. For a loss that is bitwise the same whatever the thread
 * count (a resumed run must reproduce its losses), the rows are cut into CE_BLOCKS
 * fixed contiguous ranges, each summed in order; the range sums are added in order. */
#include <math.h>

#include "cpu_ops.h"
#include "cpu_parallel.h"
#include "fast_exp.h"
#include "simd_clones.h"

#define CE_BLOCKS 256
#define CE_IGNORE (-100)

/* -log softmax(row)[t]; with d != NULL also writes scale * (softmax - onehot(t)) to d
 * (d may equal row). */
FT_SIMD_CLONES
static double ce_row(float *d, const float *row, int t, int V, float scale, float cap)
{
    float xt = row[t];
    float m = row[0];
#pragma omp simd reduction(max : m)
    for (int j = 1; j < V; j++)
        m = row[j] > m ? row[j] : m;
    double S = 0.0;
    if (d && cap > 0.0f) {
#pragma omp simd reduction(+ : S)
        for (int j = 0; j < V; j++)
            S += ft_exp(row[j] - m);
        float k = (float)(scale / S);
#pragma omp simd
        for (int j = 0; j < V; j++) {
            float z = row[j], u = z / cap;
            float g = ft_exp(z - m) * k;
            d[j] = g * (1.0f - u * u);
        }
        float u = xt / cap;
        d[t] -= scale * (1.0f - u * u);
    } else if (d) {
#pragma omp simd reduction(+ : S)
        for (int j = 0; j < V; j++) {
            float e = ft_exp(row[j] - m);
            d[j] = e;
            S += e;
        }
        float k = (float)(scale / S);
#pragma omp simd
        for (int j = 0; j < V; j++)
            d[j] *= k;
        d[t] -= scale;
    } else {
#pragma omp simd reduction(+ : S)
        for (int j = 0; j < V; j++)
            S += ft_exp(row[j] - m);
    }
    return ((double)m - (double)xt) + log(S);
}

double ft_cpu_cross_entropy(float *dlogits, const float *logits, const int32_t *targets,
                            int N, int V, float grad_scale, float softcap)
{
    if (N <= 0 || V <= 0)
        return 0.0;
    int nblocks = N < CE_BLOCKS ? N : CE_BLOCKS;
    double partial[CE_BLOCKS];
#pragma omp parallel for schedule(static) if ((long)N * V >= FT_PAR_MIN_MATH)
    for (int b = 0; b < nblocks; b++) {
        int n0 = (int)((long)N * b / nblocks), n1 = (int)((long)N * (b + 1) / nblocks);
        double acc = 0.0;
        for (int n = n0; n < n1; n++) {
            const float *row = logits + (size_t)n * V;
            float *d = dlogits ? dlogits + (size_t)n * V : NULL;
            int t = targets[n];
            if (t == CE_IGNORE) {
                if (d)
                    for (int j = 0; j < V; j++)
                        d[j] = 0.0f;
                continue;
            }
            acc += ce_row(d, row, t, V, grad_scale, softcap);
        }
        partial[b] = acc;
    }
    double loss = 0.0;
    for (int b = 0; b < nblocks; b++)
        loss += partial[b];
    return loss;
}
