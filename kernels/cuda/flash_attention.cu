/* Causal GQA attention on the tensor cores, flash-attention style: the launches of the
 * kernels in flash_attention_kernels.cuh (see there for the algorithm). */
#include "flash_attention.cuh"
#include "flash_attention_kernels.cuh"

using namespace fa;

namespace {

/* The kernel instances (delta: the backward's Dlt pre-kernel) and their shared memory, by
 * D / 16 - 1 (D = 16 .. 128). */
typedef void (*fa_kernel)(att_args);
typedef void (*fa_bwd_kernel)(fa_bwd_args);
struct fa_variant {
    fa_kernel forward;
    fa_bwd_kernel dq, dkdv, delta;
    size_t forward_smem, dq_smem, dkdv_smem;
};
#define FA_VARIANT(D)                                                                        \
    {fa_forward_kernel<D>, fa_dq_kernel<D>, fa_dkdv_kernel<D>, fa_delta_kernel<D>,           \
     fa_forward_smem<D>(), fa_dq_smem<D>(), fa_dkdv_smem<D>()}
const fa_variant fa_variants[8] = {FA_VARIANT(16), FA_VARIANT(32), FA_VARIANT(48),
                                   FA_VARIANT(64), FA_VARIANT(80), FA_VARIANT(96),
                                   FA_VARIANT(112), FA_VARIANT(128)};

/* Devices the caches below keep apart (ordinals past it are asked on every call). */
#define FA_MAX_DEVICES 64

/* The dynamic shared memory a block of the current device may opt in to
 * (cudaDevAttrMaxSharedMemoryPerBlockOptin): 227 KiB on sm_90, 163 KiB on sm_80, only
 * 99 KiB (101,376 B) on sm_86 and sm_89 (A10, A6000, L4, L40S, RTX 4090). Asked once a
 * device. */
size_t fa_device_smem_optin(int *device)
{
    static size_t cached[FA_MAX_DEVICES]; /* 0: not asked yet */
    int dev;
    CUDA_CHECK(cudaGetDevice(&dev));
    *device = dev;
    bool cache = dev >= 0 && dev < FA_MAX_DEVICES;
    if (cache && cached[dev])
        return cached[dev];
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (cache)
        cached[dev] = (size_t)optin;
    return (size_t)optin;
}

/* The most shared memory any of head dim D's three kernels takes. */
size_t fa_smem_need(const fa_variant &f)
{
    size_t m = f.forward_smem > f.dq_smem ? f.forward_smem : f.dq_smem;
    return m > f.dkdv_smem ? m : f.dkdv_smem;
}

/* Beyond 48 KiB of shared memory a kernel must opt in, once per kernel and device (the
 * attribute is the device's). ft_cuda_flash_attention_fits has made sure the device
 * allows smem. */
void fa_opt_in(const void *k, size_t smem)
{
    static const void *done[FA_MAX_DEVICES][3 * 8];
    static int n_done[FA_MAX_DEVICES];
    int dev;
    CUDA_CHECK(cudaGetDevice(&dev));
    bool cache = dev >= 0 && dev < FA_MAX_DEVICES;
    for (int i = 0; cache && i < n_done[dev]; i++)
        if (done[dev][i] == k)
            return;
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (cache)
        done[dev][n_done[dev]++] = k;
}

/* grid (ceil(T / 64), batches * heads) */
template <class A> void fa_launch(void (*k)(A), size_t smem, const A &args, int T, int bh)
{
    fa_opt_in((const void *)k, smem);
    dim3 grid((unsigned)((T + FA_ROWS - 1) / FA_ROWS), (unsigned)bh);
    FT_LAUNCH(k, grid, FA_THREADS, smem, ft_cuda_stream())(args);
    LAUNCH_CHECK();
}

} // namespace

size_t ft_cuda_flash_attention_smem(int D)
{
    if (D < 16 || D > 128 || D % 16)
        return 0;
    return fa_smem_need(fa_variants[D / 16 - 1]);
}

bool ft_cuda_flash_attention_fits(int D, const ft_tensor *bf16_operands, int n)
{
    if (D < 16 || D > 128 || D % 16)
        return false;
    for (int i = 0; i < n; i++)
        if (bf16_operands[i].dtype != FT_BF16)
            return false;
    for (int i = 0; i < n; i++) /* the kernels copy rows 16 bytes at a time */
        if ((uintptr_t)bf16_operands[i].data % 16) {
            static bool said_align;
            if (!said_align) {
                said_align = true;
                fprintf(stderr, "ftkit: note: an attention operand is not 16-byte aligned: "
                                "the reference attention kernel runs instead of flash\n");
            }
            return false;
        }
    /* All three kernels of D within the device's opt-in limit, or the reference kernels
     * for the whole op (forward and backward alike), said once a head dim: asking for
     * more would fail in cudaFuncSetAttribute, or the launch. */
    int dev;
    size_t need = ft_cuda_flash_attention_smem(D), optin = fa_device_smem_optin(&dev);
    if (need <= optin)
        return true;
    static bool said[8];
    if (!said[D / 16 - 1]) {
        said[D / 16 - 1] = true;
        fprintf(stderr,
                "ftkit: note: flash attention for head dim %d needs %zu bytes of shared "
                "memory a block, GPU %d allows %zu: the reference attention kernel runs "
                "instead\n",
                D, need, dev, optin);
    }
    return false;
}

void ft_cuda_flash_attention_forward(const att_args &a)
{
    const fa_variant &f = fa_variants[a.D / 16 - 1];
    fa_launch(f.forward, f.forward_smem, a, a.T, a.B * a.Hq);
}

/* Dlt for the dk/dv kernel goes to the backend's scratch, as many batches at a time as fit
 * there (the launches repeat per slice of batches); where not even one batch's Hq * T
 * floats fit, the dk/dv kernel computes it for each query tile it visits. */
void ft_cuda_flash_attention_backward(const att_args &a)
{
    const fa_variant &f = fa_variants[a.D / 16 - 1];
    const bool dkdv = a.dk.p || a.dv.p;
    const size_t cap = FT_CUDA_SCRATCH_DOUBLES * sizeof(double) / sizeof(float);
    const size_t per_batch = (size_t)a.Hq * a.T;
    const int nb = per_batch <= cap ? (int)(cap / per_batch < (size_t)a.B ? cap / per_batch : a.B)
                                    : a.B;
    for (int b0 = 0; b0 < a.B; b0 += nb) {
        fa_bwd_args p = {a, NULL, b0, nb < a.B - b0 ? nb : a.B - b0};
        if (dkdv && per_batch <= cap) {
            p.delta = (float *)ft_cuda_scratch();
            const size_t rows = (size_t)p.nb * per_batch;
            FT_LAUNCH(f.delta, (unsigned)((rows + FA_WARPS - 1) / FA_WARPS), FA_THREADS, 0,
                      ft_cuda_stream())(p);
            LAUNCH_CHECK();
        }
        if (a.dq.p)
            fa_launch(f.dq, f.dq_smem, p, a.T, p.nb * a.Hq);
        if (dkdv)
            fa_launch(f.dkdv, f.dkdv_smem, p, a.T, p.nb * a.Hkv);
    }
}
