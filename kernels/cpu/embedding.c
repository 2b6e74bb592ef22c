/* Token embedding, fp32 CPU reference.
 *
 * Forward:   out[n,:] = table[ids[n],:]          table [V,C], ids [N] int32, out [N,C]
 * Backward:  dtable[ids[n],:] += dout[n,:]       for every n, in order of n
 *
 * ids must lie in [0, V); the data layer validates them, so they are not checked here.
 *
 * The backward is a scatter-add: two rows n with the same id add into the same table
 * row, so splitting the rows n across threads would race. Instead the columns are
 * split into blocks of EMB_BLOCK floats; a thread owns a column block of every table
 * row and walks all n in order. No two threads touch the same element (or the same
 * cache line: 64 floats = 4 lines), and the sum order per element is n = 0, 1, ...,
 * whatever the thread count, so the result is deterministic. */
#include <string.h>

#include "cpu_ops.h"

#define EMB_BLOCK 64

void ft_cpu_embedding_forward(float *out, const int32_t *ids, const float *table, int N,
                              int V, int C)
{
    (void)V;
    if (N <= 0 || C <= 0)
        return;
#pragma omp parallel for schedule(static) if ((long)N * C >= 65536)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * C, table + (size_t)ids[n] * C, (size_t)C * sizeof(float));
}

void ft_cpu_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int N,
                               int V, int C, int pad)
{
    (void)V;
    if (N <= 0 || C <= 0)
        return;
    int nblocks = (C + EMB_BLOCK - 1) / EMB_BLOCK;
#pragma omp parallel for schedule(static) if ((long)N * C >= 65536)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * EMB_BLOCK;
        int len = C - c0 < EMB_BLOCK ? C - c0 : EMB_BLOCK;
        for (int n = 0; n < N; n++) {
            if (ids[n] == pad) /* nn.Embedding's padding_idx: no gradient */
                continue;
            float *dst = dtable + (size_t)ids[n] * C + c0;
            const float *src = dout + (size_t)n * C + c0;
#pragma omp simd
            for (int j = 0; j < len; j++)
                dst[j] += src[j];
        }
    }
}

/* The transposed table [C, V] (LoRA's lora_embedding_A): out[n,c] = table[c, ids[n]];
 * backward dtable[c, ids[n]] += dout[n,c]. A thread owns rows c of dtable and walks every
 * n in order: deterministic as above. */
void ft_cpu_embedding_t_forward(float *out, const int32_t *ids, const float *table, int N,
                                int V, int C)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= 65536)
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            out[(size_t)n * C + c] = table[(size_t)c * V + ids[n]];
}

void ft_cpu_embedding_t_backward(float *dtable, const float *dout, const int32_t *ids, int N,
                                 int V, int C, int pad)
{
#pragma omp parallel for schedule(static) if ((long)N * C >= 65536)
    for (int c = 0; c < C; c++)
        for (int n = 0; n < N; n++)
            if (ids[n] != pad) /* nn.Embedding's padding_idx: no gradient */
                dtable[(size_t)c * V + ids[n]] += dout[(size_t)n * C + c];
}
