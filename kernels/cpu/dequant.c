/* Dequantization of bitsandbytes' weight formats (kernels/ops.h), the CPU reference.
 *
 * 4-bit: element i is the nibble i of the packed bytes (byte i/2, high nibble for even
 * i), looked up in the 16-value code table and scaled by its block's absmax:
 *   out[i] = code[nibble(i)] * absmax[i / blocksize]
 * 8-bit blockwise (double quantization's absmax): out[i] = map[q[i]] * absmax[i / bs] +
 * offset. int8 rows: out[r, c] = (q[r, c] * scb[r]) * (1/127 as fp32), the order of
 * bitsandbytes' int8_vectorwise_dequant. One fp32 rounding per product, as theirs. */
#include "cpu_ops.h"

void ft_cpu_dequant_4bit(float *out, const uint8_t *packed, const float *absmax,
                         const float *code, size_t n, size_t blocksize)
{
    size_t nb = (n + blocksize - 1) / blocksize;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t b = 0; b < nb; b++) {
        float amax = absmax[b];
        size_t i1 = (b + 1) * blocksize < n ? (b + 1) * blocksize : n;
        for (size_t i = b * blocksize; i < i1; i++) {
            uint8_t byte = packed[i / 2];
            out[i] = code[i % 2 ? byte & 0x0f : byte >> 4] * amax;
        }
    }
}

void ft_cpu_dequant_8bit_blockwise(float *out, const uint8_t *q, const float *absmax,
                                   const float *map, size_t n, size_t blocksize, float offset)
{
    for (size_t i = 0; i < n; i++)
        out[i] = map[q[i]] * absmax[i / blocksize] + offset;
}

void ft_cpu_dequant_int8_rows(float *out, const int8_t *q, const float *scb, int rows,
                              int cols)
{
#pragma omp parallel for schedule(static) if ((size_t)rows * (size_t)cols > 65536)
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * (size_t)cols + (size_t)c;
            out[i] = ((float)q[i] * scb[r]) * 7.874015718698502e-3f;
        }
}
