/* Causal GQA attention on the tensor cores, flash-attention style: the launches of the
 * kernels in flash_attention_kernels.cuh (see there for the algorithm). */
#include "flash_attention.cuh"
#include "flash_attention_kernels.cuh"

using namespace fa;

namespace {

/* The kernel instances and their shared memory, by D / 16 - 1 (D = 16 .. 128). */
typedef void (*fa_kernel)(att_args);
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

/* Beyond 48 KiB of shared memory a kernel must opt in, once per kernel (per process:
 * one GPU a process). */
void fa_opt_in(fa_kernel k, size_t smem)
{
    static fa_kernel done[3 * 8];
    static int n_done;
    for (int i = 0; i < n_done; i++)
        if (done[i] == k)
            return;
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    done[n_done++] = k;
}

void fa_launch(fa_kernel k, size_t smem, const att_args &a, int heads)
{
    fa_opt_in(k, smem);
    dim3 grid((unsigned)((a.T + FA_ROWS - 1) / FA_ROWS), (unsigned)(a.B * heads));
    FT_LAUNCH(k, grid, FA_THREADS, smem, ft_cuda_stream())(a);
    LAUNCH_CHECK();
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

void ft_cuda_flash_attention_forward(const att_args &a)
{
    const fa_variant &f = fa_variants[a.D / 16 - 1];
    fa_launch(f.forward, f.forward_smem, a, a.Hq);
}

void ft_cuda_flash_attention_backward(const att_args &a)
{
    const fa_variant &f = fa_variants[a.D / 16 - 1];
    if (a.dq.p)
        fa_launch(f.dq, f.dq_smem, a, a.Hq);
    if (a.dk.p || a.dv.p)
        fa_launch(f.dkdv, f.dkdv_smem, a, a.Hkv);
}
