/* Dequantization of bitsandbytes weights on the GPU (kernels/cpu/dequant.c's twin), one
 * thread per output element:
 *   4-bit:      out[i] = code[nibble(i)] * absmax[i / blocksize]   (high nibble first)
 *   8-bit:      out[i] = map[q[i]] * absmax[i / blocksize] + offset
 *   int8 rows:  out[r, c] = (q[r, c] * scb[r]) * (1/127 in fp32)
 * Products and sums use explicit round-to-nearest intrinsics (no FMA contraction), so an
 * fp32 output equals the CPU op's bit for bit; a bf16 output is that value rounded.
 * The 4-bit kernel has an 8-wide twin (vec_io.cuh) for whole blocks of 8: a thread reads
 * the 4 bytes of 8 codes at once, finds their block's absmax with one division instead of
 * 8, and stores them in one 16-byte bf16 access; the same values. */
#include "cuda_common.cuh"
#include "vec_io.cuh"

__global__ void dequant_4bit_kernel(fview out, const uint8_t *packed, const float *absmax,
                                    const float *code, size_t n, size_t blocksize)
{
    GRID_STRIDE(i, n)
    {
        uint8_t byte = packed[i / 2];
        int q = i % 2 ? byte & 0x0f : byte >> 4;
        st(out, i, __fmul_rn(code[q], absmax[i / blocksize]));
    }
}

/* 8 elements a thread: n and blocksize multiples of 8 (so the 8 share one block), packed
 * 4-byte aligned (byte k of the word is packed[i / 2 + k]: little-endian) */
__global__ void dequant_4bit_vec8_kernel(fview out, const uint8_t *packed, const float *absmax,
                                         const float *code, size_t n, size_t blocksize)
{
    GRID_STRIDE(j, n / VEC8)
    {
        size_t i = j * VEC8;
        uint32_t word = *(const uint32_t *)(packed + i / 2);
        float a = absmax[i / blocksize], o[VEC8];
#pragma unroll
        for (int k = 0; k < VEC8 / 2; k++) {
            uint32_t byte = (word >> (8 * k)) & 0xffu;
            o[2 * k] = __fmul_rn(code[byte >> 4], a);
            o[2 * k + 1] = __fmul_rn(code[byte & 0x0fu], a);
        }
        st8(out, i, o);
    }
}

__global__ void dequant_8bit_kernel(fview out, const uint8_t *q, const float *absmax,
                                    const float *map, size_t n, size_t blocksize, float offset)
{
    GRID_STRIDE(i, n)
    st(out, i, __fadd_rn(__fmul_rn(map[q[i]], absmax[i / blocksize]), offset));
}

__global__ void dequant_int8_rows_kernel(fview out, const int8_t *q, const float *scb, size_t n,
                                         size_t cols)
{
    GRID_STRIDE(i, n)
    st(out, i, __fmul_rn(__fmul_rn((float)q[i], scb[i / cols]), 7.874015718698502e-3f));
}

extern "C" void ft_cuda_dequant_4bit(ft_tensor out, ft_tensor packed, ft_tensor absmax,
                                     ft_tensor code, size_t n, int blocksize)
{
    if (n == 0)
        return;
    if (blocksize % VEC8 == 0 && vec8_ok(n, out.data) && ((uintptr_t)packed.data & 3u) == 0)
        FT_LAUNCH(dequant_4bit_vec8_kernel, grid_for(n / VEC8, 256), 256, 0, ft_cuda_stream())(
            fv(out), (const uint8_t *)packed.data, (const float *)absmax.data,
            (const float *)code.data, n, (size_t)blocksize);
    else
        FT_LAUNCH(dequant_4bit_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
            fv(out), (const uint8_t *)packed.data, (const float *)absmax.data,
            (const float *)code.data, n, (size_t)blocksize);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_dequant_8bit_blockwise(ft_tensor out, ft_tensor q, ft_tensor absmax,
                                               ft_tensor map, size_t n, int blocksize,
                                               float offset)
{
    if (n == 0)
        return;
    FT_LAUNCH(dequant_8bit_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(out), (const uint8_t *)q.data, (const float *)absmax.data, (const float *)map.data,
        n, (size_t)blocksize, offset);
    LAUNCH_CHECK();
}

extern "C" void ft_cuda_dequant_int8_rows(ft_tensor out, ft_tensor q, ft_tensor scb, int rows,
                                          int cols)
{
    size_t n = (size_t)rows * (size_t)cols;
    if (n == 0)
        return;
    FT_LAUNCH(dequant_int8_rows_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        fv(out), (const int8_t *)q.data, (const float *)scb.data, n, (size_t)cols);
    LAUNCH_CHECK();
}
