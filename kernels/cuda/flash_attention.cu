/* Causal GQA attention on the tensor cores, flash-attention style: the launches of the
 * kernels in flash_attention_kernels.cuh (see there for the algorithm). */
#include "flash_attention.cuh"
#include "flash_attention_kernels.cuh"

using namespace fa;

namespace {

/* The kernel instances and their shared memory, by D / 16 - 1 (D = 16 .. 128). */
typedef void (*fa_kernel)(fa_args);
struct fa_variant {
    fa_kernel forward, dq, dkdv;
    size_t forward_smem, dq_smem, dkdv_smem;
};
#define FA_VARIANT(D)                                                                        \
    {fa_forward_kernel<D>, fa_dq_kernel<D>, fa_dkdv_kernel<D>, fa_forward_smem<D>(),         \
     fa_dq_smem<D>(), fa_dkdv_smem<D>()}
const fa_variant fa_variants[8] = {FA_VARIANT(16), FA_VARIANT(32), FA_VARIANT(48),
                                   FA_VARIANT(64), FA_VARIANT(80), FA_VARIANT(96),
                                   FA_VARIANT(112), FA_VARIANT(128)};

void fa_launch(fa_kernel k, size_t smem, const fa_args &a, int heads)
{
    /* beyond 48 KiB a kernel must opt in; once per kernel is enough, but cheap */
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)((a.T + FA_ROWS - 1) / FA_ROWS), (unsigned)(a.B * heads));
    k<<<grid, FA_THREADS, smem, ft_cuda_stream()>>>(a);
    LAUNCH_CHECK();
}

fa_args fa_setup(ft_tensor seg, int B, int T, int Hq, int Hkv, float scale, int window)
{
    fa_args a = {};
    a.seg = (const int32_t *)seg.data;
    a.B = B;
    a.T = T;
    a.Hq = Hq;
    a.Hkv = Hkv;
    a.G = Hq / Hkv;
    a.scale = scale;
    a.window = window;
    return a;
}

} // namespace

bool ft_cuda_flash_attention_fits(int D, const ft_tensor *bf16_operands, int n)
{
    if (D < 16 || D > 128 || D % 16)
        return false;
    for (int i = 0; i < n; i++)
        if (bf16_operands[i].dtype != FT_BF16)
            return false;
    return true;
}

void ft_cuda_flash_attention_forward(ft_tensor out, ft_tensor lse, ft_tensor q, ft_tensor k,
                                     ft_tensor v, ft_tensor seg, int B, int T, int Hq,
                                     int Hkv, int D, float scale, int window)
{
    fa_args a = fa_setup(seg, B, T, Hq, Hkv, scale, window);
    a.q = fv(q);
    a.k = fv(k);
    a.v = fv(v);
    a.out = fv(out);
    a.lse_out = (float *)lse.data;
    const fa_variant &f = fa_variants[D / 16 - 1];
    fa_launch(f.forward, f.forward_smem, a, Hq);
}

void ft_cuda_flash_attention_backward(ft_tensor dq, ft_tensor dk, ft_tensor dv,
                                      ft_tensor dout, ft_tensor q, ft_tensor k, ft_tensor v,
                                      ft_tensor out, ft_tensor lse, ft_tensor seg, int B,
                                      int T, int Hq, int Hkv, int D, float scale, int window)
{
    fa_args a = fa_setup(seg, B, T, Hq, Hkv, scale, window);
    a.q = fv(q);
    a.k = fv(k);
    a.v = fv(v);
    a.out = fv(out);
    a.dout = fv(dout);
    a.dq = fv(dq);
    a.dk = fv(dk);
    a.dv = fv(dv);
    a.lse_in = (const float *)lse.data;
    const fa_variant &f = fa_variants[D / 16 - 1];
    if (dq.data)
        fa_launch(f.dq, f.dq_smem, a, Hq);
    if (dk.data || dv.data)
        fa_launch(f.dkdv, f.dkdv_smem, a, Hkv);
}
