#include "alloc.h"

#include <stdint.h>
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

void *ft_alloc(ft_mem *mem, ft_mem_cat cat, size_t bytes)
{
    if (bytes == 0 || bytes > SIZE_MAX - 2 * HEADER_BYTES)
        return NULL;
    size_t total = (bytes + HEADER_BYTES + 63) / 64 * 64;
    unsigned char *base = aligned_alloc(64, total);
    if (!base)
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

const char *ft_mem_cat_name(ft_mem_cat cat)
{
    static const char *names[FT_MEM_NCAT] = {"weights", "gradients", "optimizer",
                                             "activations", "workspace"};
    return (unsigned)cat < FT_MEM_NCAT ? names[cat] : "?";
}
