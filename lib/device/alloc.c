#include "device/alloc.h"

#include "core/ft_error.h"
#include "ops.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each buffer is preceded by a 64-byte header holding its size and category, so
 * ft_free can update the counters without a lookup table. */
typedef struct alloc_header {
    size_t bytes;
    int cat;
} alloc_header;

enum { HEADER_BYTES = 64 };

void ft_mem_account(ft_mem *mem, ft_mem_cat cat, size_t bytes, bool add)
{
    if (!mem)
        return;
    if (!add) {
        mem->live[cat] -= bytes;
        mem->live_total -= bytes;
        return;
    }
    mem->live[cat] += bytes;
    mem->live_total += bytes;
    if (mem->live[cat] > mem->peak[cat])
        mem->peak[cat] = mem->live[cat];
    if (mem->live_total > mem->peak_total)
        mem->peak_total = mem->live_total;
}

/* Whether bytes more fit under mem's limit; records the failure when not (or when the
 * allocation itself failed: fits = false). */
static bool admit(ft_mem *mem, ft_mem_cat cat, size_t bytes, bool fits)
{
    if (!mem)
        return fits;
    if (fits && mem->limit && (bytes > mem->limit || mem->live_total > mem->limit - bytes))
        fits = false;
    if (!fits) {
        mem->failed_bytes = bytes;
        mem->failed_live = mem->live_total;
        mem->failed_cat = cat;
    }
    return fits;
}

void *ft_alloc(ft_mem *mem, ft_mem_cat cat, size_t bytes)
{
    if (bytes == 0 || bytes > SIZE_MAX - 2 * HEADER_BYTES)
        return NULL;
    if (!admit(mem, cat, bytes, true))
        return NULL;
    size_t total = (bytes + HEADER_BYTES + 63) / 64 * 64;
    unsigned char *base = aligned_alloc(64, total);
    if (!admit(mem, cat, bytes, base != NULL))
        return NULL;
    memset(base, 0, total);
    alloc_header *h = (alloc_header *)base;
    h->bytes = bytes;
    h->cat = (int)cat;
    ft_mem_account(mem, cat, bytes, true);
    return base + HEADER_BYTES;
}

void ft_free(ft_mem *mem, void *p)
{
    if (!p)
        return;
    unsigned char *base = (unsigned char *)p - HEADER_BYTES;
    alloc_header *h = (alloc_header *)base;
    ft_mem_account(mem, (ft_mem_cat)h->cat, h->bytes, false);
    free(base);
}

#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"

/* A device buffer is preceded by a 256-byte header on the device holding the same
 * alloc_header; it is written once on allocation and read back on free (one small copy
 * each way: allocations are few and large). */
enum { DEVICE_HEADER_BYTES = 256 };

static void *alloc_device(ft_mem *mem, ft_mem_cat cat, size_t bytes)
{
    if (bytes == 0 || bytes > SIZE_MAX - 2 * DEVICE_HEADER_BYTES)
        return NULL;
    if (!admit(mem, cat, bytes, true))
        return NULL;
    unsigned char *base = ft_cuda_malloc(bytes + DEVICE_HEADER_BYTES);
    if (!admit(mem, cat, bytes, base != NULL))
        return NULL;
    alloc_header h = {bytes, (int)cat};
    if (ft_cuda_memset0(base + DEVICE_HEADER_BYTES, bytes, NULL) ||
        ft_cuda_memcpy_h2d(base, &h, sizeof h, NULL)) {
        ft_cuda_free(base);
        return NULL;
    }
    ft_mem_account(mem, cat, bytes, true);
    return base + DEVICE_HEADER_BYTES;
}

static void free_device(ft_mem *mem, void *p)
{
    unsigned char *base = (unsigned char *)p - DEVICE_HEADER_BYTES;
    alloc_header h;
    if (ft_cuda_memcpy_d2h(&h, base, sizeof h, NULL) == 0)
        ft_mem_account(mem, (ft_mem_cat)h.cat, h.bytes, false);
    ft_cuda_free(base);
}
#endif

void *ft_alloc_on(ft_mem *mem, int device, ft_mem_cat cat, size_t bytes)
{
    if (device == FT_DEV_CPU)
        return ft_alloc(mem, cat, bytes);
#ifdef FT_HAVE_CUDA
    if (device == FT_DEV_CUDA)
        return alloc_device(mem, cat, bytes);
#endif
    return NULL;
}

void ft_free_on(ft_mem *mem, int device, void *p)
{
    if (!p)
        return;
    if (device == FT_DEV_CPU) {
        ft_free(mem, p);
        return;
    }
#ifdef FT_HAVE_CUDA
    free_device(mem, p);
#endif
}

int ft_copy_bytes(void *dst, int dst_device, const void *src, int src_device, size_t bytes,
                  ft_err *err)
{
    if (bytes == 0)
        return 0;
    if (dst_device == FT_DEV_CPU && src_device == FT_DEV_CPU) {
        memmove(dst, src, bytes);
        return 0;
    }
#ifdef FT_HAVE_CUDA
    if (dst_device == FT_DEV_CPU)
        return ft_cuda_memcpy_d2h(dst, src, bytes, err);
    if (src_device == FT_DEV_CPU)
        return ft_cuda_memcpy_h2d(dst, src, bytes, err);
    return ft_cuda_memcpy_d2d(dst, src, bytes, err);
#else
    return ft_fail(err, "a copy to or from GPU memory in a build without CUDA");
#endif
}

int ft_mem_fail(ft_err *err, const ft_mem *mem, int device, const char *what_fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, what_fmt);
    vsnprintf(what, sizeof what, what_fmt, ap);
    va_end(ap);
    const char *where = device == FT_DEV_CPU ? "" : "GPU ";
    if (!mem || !mem->failed_bytes)
        return ft_fail_oom(err, "out of %smemory allocating %s", where, what);
    char limit[64] = "";
    if (mem->limit)
        snprintf(limit, sizeof limit, " (limit %.1f MiB)", ft_mib(mem->limit));
    return ft_fail_oom(err, "out of %smemory allocating %s: %.1f MiB of %s did not fit beside "
                            "%.1f MiB live%s",
                       where, what, ft_mib(mem->failed_bytes), ft_mem_cat_name(mem->failed_cat),
                       ft_mib(mem->failed_live), limit);
}

const char *ft_mem_cat_name(ft_mem_cat cat)
{
    static const char *names[FT_MEM_NCAT] = {"weights", "gradients", "optimizer",
                                             "activations", "workspace"};
    return (unsigned)cat < FT_MEM_NCAT ? names[cat] : "?";
}
