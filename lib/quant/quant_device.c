/* A quantized weight's arrays on a GPU (see quant.h): the device copy a GPU model keeps
 * of its quantized base, made once after the weights are read, so the host holds none
 * of it while the model trains.
 *
 * Every array moves as it is (the same bytes), plus the 16 code values of a 4-bit
 * format, which the host reads from a static table but the dequantization op needs on
 * the device. The arrays are allocated with the tracked allocator in the weights
 * category: on a GPU model the device copies are what its memory counts. */
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"
#endif

#ifdef FT_HAVE_CUDA
/* A device copy of bytes bytes at src, counted in mem's weights category; NULL when bytes
 * is 0 (an array the format has not), or after a failure (*rc -1, with err). */
static void *upload(ft_mem *mem, ft_device device, const void *src, size_t bytes, int *rc,
                    ft_err *err)
{
    if (*rc || !bytes)
        return NULL;
    void *p = ft_alloc_on(mem, device, FT_MEM_WEIGHTS, bytes);
    if (!p) {
        *rc = ft_fail(err, "out of GPU memory for a quantized weight (%zu bytes)", bytes);
        return NULL;
    }
    if (ft_cuda_memcpy_h2d(p, src, bytes, err)) {
        ft_free_on(mem, device, p);
        *rc = ft_fail_prefix(err, "copying a quantized weight to the GPU");
        return NULL;
    }
    return p;
}
#endif

int ft_qtensor_to_device(ft_qtensor *q, ft_mem *mem, ft_device device, ft_err *err)
{
    if (q->device != FT_DEV_CPU || device == FT_DEV_CPU)
        return ft_fail(err, "a quantized weight moves from the host to a GPU only");
#ifndef FT_HAVE_CUDA
    (void)mem;
    return ft_fail(err, "this build has no CUDA backend");
#else
    size_t n = (size_t)q->rows * (size_t)q->cols, nb = q->n_blocks, f = sizeof(float);
    bool four = q->type == FT_QUANT_NF4 || q->type == FT_QUANT_FP4;
    bool int8 = q->type == FT_QUANT_INT8, nested = four && q->nested;
    size_t n2 = nested ? (nb + (size_t)q->nested_blocksize - 1) / (size_t)q->nested_blocksize : 0;
    /* d: the device copy, built beside q so that a failure leaves q as it was */
    ft_qtensor d = *q;
    d.device = device;
    int rc = 0;
    d.packed = upload(mem, device, q->packed, four ? (n + 1) / 2 : 0, &rc, err);
    d.absmax = upload(mem, device, q->absmax, four && !nested ? nb * f : 0, &rc, err);
    d.absmax_q = upload(mem, device, q->absmax_q, nested ? nb : 0, &rc, err);
    d.nested_absmax = upload(mem, device, q->nested_absmax, n2 * f, &rc, err);
    d.nested_map = upload(mem, device, q->nested_map, nested ? 256 * f : 0, &rc, err);
    d.q = upload(mem, device, q->q, int8 ? n : 0, &rc, err);
    d.scb = upload(mem, device, q->scb, int8 ? (size_t)q->rows * f : 0, &rc, err);
    /* the host reads the code values from a static table, the device from a copy */
    d.code = upload(mem, device, ft_quant_code(q->type), four ? 16 * f : 0, &rc, err);
    if (rc) {
        ft_qtensor_free_on(&d, mem);
        return -1;
    }
    ft_qtensor_free(q);
    *q = d;
    return 0;
#endif
}

void ft_qtensor_free_on(ft_qtensor *q, ft_mem *mem)
{
    if (q->device == FT_DEV_CPU) {
        ft_qtensor_free(q);
        return;
    }
    void *arrays[] = {q->packed,     q->absmax, q->absmax_q, q->nested_absmax,
                      q->nested_map, q->q,      q->scb,      q->code};
    for (size_t i = 0; i < sizeof arrays / sizeof *arrays; i++)
        ft_free_on(mem, q->device, arrays[i]);
    memset(q, 0, sizeof *q);
}
