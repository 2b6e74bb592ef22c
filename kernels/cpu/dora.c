/* DoRA's three helpers (ops.h), CPU reference: the row norms of W + s B A and the
 * magnitude's factors, a column-scaled copy or accumulation, and the magnitude's
 * gradient as a scaled column dot product. Norms and column sums accumulate in double. */
#include <math.h>

#include "cpu_ops.h"

void ft_cpu_dora_norm(float *g, float *inv, const float *mag, const float *w, int R, int C)
{
#pragma omp parallel for schedule(static) if ((long)R * C >= 65536)
    for (int r = 0; r < R; r++) {
        const float *row = w + (size_t)r * C;
        double acc = 0.0;
        for (int c = 0; c < C; c++)
            acc += (double)row[c] * row[c];
        float n = (float)sqrt(acc);
        g[r] = mag[r] / n;
        inv[r] = 1.0f / n;
    }
}

void ft_cpu_col_scale(float *y, const float *x, const float *g, float alpha, float beta, int N,
                      int C, int accumulate)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= 65536)
    for (int n = 0; n < N; n++) {
        float *yr = y + (size_t)n * C;
        const float *xr = x + (size_t)n * C;
        for (int c = 0; c < C; c++) {
            float v = (alpha * g[c] + beta) * xr[c];
            yr[c] = accumulate ? yr[c] + v : v;
        }
    }
}

void ft_cpu_col_dot(float *d, const float *a, const float *b, const float *s, int N, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= 65536)
    for (int c = 0; c < C; c++) {
        double acc = 0.0;
        for (int n = 0; n < N; n++)
            acc += (double)a[(size_t)n * C + c] * b[(size_t)n * C + c];
        d[c] += s[c] * (float)acc;
    }
}
