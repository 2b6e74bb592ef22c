/* Mixture-of-experts routing and token grouping on the GPU (kernels/cpu/moe.c's twin;
 * ops.h's mixture-of-experts section has the definitions).
 *   router forward/backward  one thread per token row: E and k are small (8..128 experts,
 *                            top 1..8), the row's softmax sum in double as on the CPU,
 *                            the same selection rule (descending, lower index on ties)
 *   gather                   one thread per element; its backward one thread per
 *                            element of dx, adding the row's k grouped rows in j order
 *   combine                  one thread per element of out, the k terms in ascending
 *                            expert order; backward: dye one thread per grouped element
 *                            (each has one writer), dw one warp per (row, j) pair
 *   aux_stats                one thread per expert, rows in order
 *   lora_b_split/merge_add   one thread per element (a permutation: each has one writer)
 * No atomics: a run repeats bit for bit. */
#include "cuda_common.cuh"

__global__ void moe_router_forward_kernel(float *probs, int32_t *idx, float *w, fview logits,
                                          int N, int E, int k, int renorm)
{
    GRID_STRIDE(n, (size_t)N)
    {
        size_t base = n * (size_t)E;
        float *p = probs + base;
        float mx = ld(logits, base);
        for (int e = 1; e < E; e++)
            mx = fmaxf(mx, ld(logits, base + e));
        double sum = 0.0;
        for (int e = 0; e < E; e++) {
            p[e] = expf(ld(logits, base + e) - mx);
            sum += p[e];
        }
        float inv = (float)(1.0 / sum);
        for (int e = 0; e < E; e++)
            p[e] *= inv;
        int32_t *ix = idx + n * (size_t)k;
        float *wn = w + n * (size_t)k;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int m = 0; m < j; m++)
                    taken |= ix[m] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            ix[j] = best;
            wn[j] = p[best];
        }
        if (renorm) {
            float s = 0.0f;
            for (int j = 0; j < k; j++)
                s += wn[j];
            for (int j = 0; j < k; j++)
                wn[j] /= s;
        }
    }
}

__global__ void moe_router_backward_kernel(fview dlogits, const float *dw, const float *aux_dp,
                                           const float *probs, const int32_t *idx,
                                           const float *w, int N, int E, int k, int renorm)
{
    GRID_STRIDE(n, (size_t)N)
    {
        const float *p = probs + n * (size_t)E;
        const int32_t *ix = idx + n * (size_t)k;
        const float *dwn = dw ? dw + n * (size_t)k : NULL;
        const float *wn = w + n * (size_t)k;
        float s = 0.0f, dot_w = 0.0f;
        if (renorm && dwn) {
            for (int j = 0; j < k; j++) {
                s += p[ix[j]];
                dot_w += dwn[j] * wn[j];
            }
        }
        double pdp = 0.0;
        for (int e = 0; e < E; e++)
            pdp += (double)p[e] * (aux_dp ? aux_dp[e] : 0.0f);
        for (int j = 0; j < k; j++) {
            float g = !dwn ? 0.0f : renorm ? (dwn[j] - dot_w) / s : dwn[j];
            pdp += (double)p[ix[j]] * g;
        }
        float c = (float)pdp;
        for (int e = 0; e < E; e++) {
            float d = aux_dp ? aux_dp[e] : 0.0f;
            for (int j = 0; j < k; j++)
                if (ix[j] == e)
                    d += !dwn ? 0.0f : renorm ? (dwn[j] - dot_w) / s : dwn[j];
            size_t i = n * (size_t)E + e;
            st(dlogits, i, ld(dlogits, i) + p[e] * (d - c));
        }
    }
}

__global__ void moe_gather_forward_kernel(fview xe, fview x, const int32_t *rows, size_t M,
                                          int C)
{
    GRID_STRIDE(i, M * (size_t)C)
    {
        size_t m = i / (size_t)C, c = i % (size_t)C;
        st(xe, i, ld(x, (size_t)rows[m] * C + c));
    }
}

__global__ void moe_gather_backward_kernel(fview dx, fview dxe, const int32_t *slot, size_t N,
                                           int k, int C)
{
    GRID_STRIDE(i, N * (size_t)C)
    {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        float acc = ld(dx, i);
        for (int j = 0; j < k; j++)
            acc += ld(dxe, (size_t)slot[n * k + j] * C + c);
        st(dx, i, acc);
    }
}

__global__ void moe_combine_forward_kernel(fview out, fview ye, const float *w,
                                           const int32_t *slot, size_t N, int k, int C,
                                           int accumulate)
{
    GRID_STRIDE(i, N * (size_t)C)
    {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        const int32_t *sl = slot + n * k;
        float acc = accumulate ? ld(out, i) : 0.0f;
        /* the k slots in ascending grouped position: repeatedly the next larger one */
        int prev = -1;
        for (int a = 0; a < k; a++) {
            int jmin = -1;
            for (int j = 0; j < k; j++)
                if (sl[j] > prev && (jmin < 0 || sl[j] < sl[jmin]))
                    jmin = j;
            prev = sl[jmin];
            acc += w[n * k + jmin] * ld(ye, (size_t)prev * C + c);
        }
        st(out, i, acc);
    }
}

__global__ void moe_combine_dye_kernel(fview dye, fview dout, const float *w,
                                       const int32_t *slot, size_t N, int k, int C)
{
    GRID_STRIDE(i, N * (size_t)k * C)
    {
        size_t nj = i / (size_t)C, c = i % (size_t)C, n = nj / k;
        size_t dst = (size_t)slot[nj] * C + c;
        st(dye, dst, ld(dye, dst) + w[nj] * ld(dout, n * C + c));
    }
}

/* one warp per (n, j): dw[n, j] += dout[n] . ye[slot[n, j]] */
__global__ void moe_combine_dw_kernel(float *dw, fview dout, fview ye, const int32_t *slot,
                                      size_t NK, int k, int C)
{
    size_t nj = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (nj >= NK)
        return;
    size_t n = nj / k, m = (size_t)slot[nj];
    float acc = 0.0f;
    for (int c = lane; c < C; c += 32)
        acc += ld(dout, n * C + c) * ld(ye, m * C + c);
    acc = warp_sum(acc);
    if (lane == 0)
        dw[nj] += acc;
}

__global__ void moe_aux_stats_kernel(float *counts, float *psum, const float *probs,
                                     const int32_t *idx, int N, int E, int k)
{
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E)
        return;
    float cnt = counts[e]; /* one add per pair, as the CPU's */
    for (size_t i = 0; i < (size_t)N * k; i++)
        if (idx[i] == e)
            cnt += 1.0f;
    double s = 0.0;
    for (int n = 0; n < N; n++)
        s += probs[(size_t)n * E + e];
    counts[e] = cnt;
    psum[e] += (float)s;
}

/* one thread per element of the [out, r E] layout: dst[e, o, j] <-> src[o, j E + e] */
__global__ void moe_lora_b_split_kernel(fview dst, fview src, int out, int r, int E)
{
    GRID_STRIDE(i, (size_t)out * r * E)
    {
        size_t rE = (size_t)r * E, o = i / rE, c = i % rE, j = c / E, e = c % E;
        st(dst, (e * out + o) * r + j, ld(src, i));
    }
}

__global__ void moe_lora_b_merge_add_kernel(float *dst, fview src, int out, int r, int E)
{
    GRID_STRIDE(i, (size_t)out * r * E)
    {
        size_t rE = (size_t)r * E, o = i / rE, c = i % rE, j = c / E, e = c % E;
        dst[i] += ld(src, (e * out + o) * r + j);
    }
}

extern "C" void ft_cuda_moe_lora_b_split(ft_tensor dst, ft_tensor src, int out, int r, int E)
{
    size_t n = (size_t)out * r * E;
    if (n == 0)
        return;
    FT_LAUNCH(moe_lora_b_split_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(dst), fv(src), out, r, E);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_moe_lora_b_merge_add(ft_tensor dst, ft_tensor src, int out, int r,
                                             int E)
{
    size_t n = (size_t)out * r * E;
    if (n == 0)
        return;
    FT_LAUNCH(moe_lora_b_merge_add_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        (float *)dst.data, fv(src), out, r, E);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_moe_router_forward(ft_tensor probs, ft_tensor idx, ft_tensor w,
                                           ft_tensor logits, int N, int E, int k, int renorm)
{
    if (N <= 0)
        return;
    FT_LAUNCH(moe_router_forward_kernel, grid_for((size_t)N, 128), 128, 0, ft_cuda_stream())(
        (float *)probs.data, (int32_t *)idx.data, (float *)w.data, fv(logits), N, E, k,
        renorm);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_moe_router_backward(ft_tensor dlogits, ft_tensor dw, ft_tensor aux_dp,
                                            ft_tensor probs, ft_tensor idx, ft_tensor w, int N,
                                            int E, int k, int renorm)
{
    if (N <= 0 || (!dw.data && !aux_dp.data))
        return;
    FT_LAUNCH(moe_router_backward_kernel, grid_for((size_t)N, 128), 128, 0, ft_cuda_stream())(
        fv(dlogits), (const float *)dw.data, (const float *)aux_dp.data,
        (const float *)probs.data, (const int32_t *)idx.data, (const float *)w.data, N, E, k,
        renorm);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_moe_gather_forward(ft_tensor xe, ft_tensor x, ft_tensor rows, int N,
                                           int k, int C)
{
    size_t M = (size_t)N * k;
    if (M == 0 || C <= 0)
        return;
    FT_LAUNCH(moe_gather_forward_kernel, grid_for(M * C, 256), 256, 0, ft_cuda_stream())(
        fv(xe), fv(x), (const int32_t *)rows.data, M, C);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_moe_gather_backward(ft_tensor dx, ft_tensor dxe, ft_tensor slot, int N,
                                            int k, int C)
{
    if (N <= 0 || C <= 0)
        return;
    FT_LAUNCH(moe_gather_backward_kernel, grid_for((size_t)N * C, 256), 256, 0,
              ft_cuda_stream())(fv(dx), fv(dxe), (const int32_t *)slot.data, (size_t)N, k, C);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_moe_combine_forward(ft_tensor out, ft_tensor ye, ft_tensor w,
                                            ft_tensor slot, int N, int k, int C,
                                            int accumulate)
{
    if (N <= 0 || C <= 0)
        return;
    FT_LAUNCH(moe_combine_forward_kernel, grid_for((size_t)N * C, 256), 256, 0,
              ft_cuda_stream())(fv(out), fv(ye), (const float *)w.data,
                                (const int32_t *)slot.data, (size_t)N, k, C, accumulate);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_moe_combine_backward(ft_tensor dye, ft_tensor dw, ft_tensor dout,
                                             ft_tensor ye, ft_tensor w, ft_tensor slot, int N,
                                             int k, int C)
{
    size_t NK = (size_t)N * k;
    if (NK == 0 || C <= 0)
        return;
    if (dye.data) {
        FT_LAUNCH(moe_combine_dye_kernel, grid_for(NK * C, 256), 256, 0, ft_cuda_stream())(
            fv(dye), fv(dout), (const float *)w.data, (const int32_t *)slot.data, (size_t)N,
            k, C);
        LAUNCH_CHECK();
    }
    if (dw.data) {
        unsigned blocks = (unsigned)((NK + 7) / 8);
        FT_LAUNCH(moe_combine_dw_kernel, blocks, 256, 0, ft_cuda_stream())(
            (float *)dw.data, fv(dout), fv(ye), (const int32_t *)slot.data, NK, k, C);
        LAUNCH_CHECK();
    }
}

extern "C" void ft_cuda_moe_aux_stats(ft_tensor counts, ft_tensor psum, ft_tensor probs,
                                      ft_tensor idx, int N, int E, int k)
{
    if (N <= 0)
        return;
    FT_LAUNCH(moe_aux_stats_kernel, (E + 127) / 128, 128, 0, ft_cuda_stream())(
        (float *)counts.data, (float *)psum.data, (const float *)probs.data,
        (const int32_t *)idx.data, N, E, k);
    LAUNCH_CHECK();
}
