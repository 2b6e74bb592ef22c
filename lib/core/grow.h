/* Growable arrays: room for one more element before appending.
 *
 *   T *q = ft_grow(a->items, a->n, &cap, sizeof *q);
 *   if (!q) -> out of memory (a->items unchanged, still owned by the caller)
 *   a->items = q; a->items[a->n++] = value;
 */
#ifndef FT_CORE_GROW_H
#define FT_CORE_GROW_H

#include <stdlib.h>

/* items holds n elements of elem bytes in *cap allocated ones: returns items when there is
 * room for one more, else items reallocated to twice the capacity (64 the first time) with
 * *cap updated, or NULL when out of memory (*cap unchanged, items not freed). */
static inline void *ft_grow(void *items, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return items;
    size_t nc = *cap ? 2 * *cap : 64;
    void *q = realloc(items, nc * elem);
    if (q)
        *cap = nc;
    return q;
}

#endif
