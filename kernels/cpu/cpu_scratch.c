/* Per-thread, grow-only scratch buffers of the CPU kernels (cpu_scratch.h). */
#include "cpu_scratch.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct scratch_set {
    void *buf[FT_SCRATCH_NSLOTS];
    size_t cap[FT_SCRATCH_NSLOTS];
} scratch_set;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    scratch_set *s = p;
    for (int i = 0; i < FT_SCRATCH_NSLOTS; i++) {
        free(s->buf[i]);
    }
    free(s);
}

static void scratch_key_init(void)
{
    if (pthread_key_create(&scratch_key, scratch_free)) {
        fprintf(stderr, "cpu scratch: pthread_key_create failed\n");
        abort();
    }
}

static void *scratch_or_die(void *p, const char *op, size_t bytes)
{
    if (!p) {
        fprintf(stderr, "%s: out of memory (%zu bytes of scratch)\n", op, bytes);
        abort();
    }
    return p;
}

void *ft_cpu_scratch(ft_cpu_scratch_slot slot, size_t bytes, const char *op)
{
    pthread_once(&scratch_once, scratch_key_init);
    scratch_set *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = scratch_or_die(calloc(1, sizeof *s), op, sizeof *s);
        pthread_setspecific(scratch_key, s);
    }
    if (bytes > s->cap[slot] || !s->buf[slot]) {
        const size_t cap = bytes ? (bytes + 63) / 64 * 64 : 64; /* whole 64-byte lines */
        free(s->buf[slot]);
        s->buf[slot] = NULL;
        void *p = NULL;
        if (posix_memalign(&p, 64, cap)) {
            p = NULL;
        }
        s->buf[slot] = scratch_or_die(p, op, bytes);
        s->cap[slot] = cap;
    }
    return s->buf[slot];
}
