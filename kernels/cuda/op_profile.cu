/* FT_CUDA_PROFILE=1: the time the GPU spends in each op that kernels/ops.c dispatches to
 * the CUDA backend, measured with a pair of CUDA events around each call on the backend's
 * stream, summed per key (the op's name; a GEMM's with its shape and dtype) and printed
 * to stderr as one table when the process exits, largest first. Off by default, when it
 * costs one cached getenv per op.
 *
 * The events' pairs are kept in a pool; a full pool is synchronized and summed, so a long
 * run costs one device synchronize every POOL ops. The table's last line compares the
 * ops' sum with the GPU time from the first op's start to the last op's end: the
 * difference is time the GPU waited on the host (launch gaps, copies, host work). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"

namespace {
constexpr int POOL = 4096, MAX_KEYS = 512, KEY_LEN = 96;

struct key_total {
    char key[KEY_LEN];
    long calls;
    double ms;
};

struct profile {
    int enabled = -1; /* -1 unread, 0 off, 1 on */
    cudaEvent_t ev[2 * POOL];
    int key_of[POOL]; /* each pending pair's key */
    int pending, open_key;
    bool have_first;
    cudaEvent_t first, last; /* the span: the first op's start, the last op's end */
    key_total keys[MAX_KEYS];
    int n_keys;
};
profile prof;

int key_index(const char *key)
{
    for (int i = 0; i < prof.n_keys; i++)
        if (strcmp(prof.keys[i].key, key) == 0)
            return i;
    if (prof.n_keys == MAX_KEYS)
        return MAX_KEYS - 1; /* the last key takes the overflow */
    key_total *k = &prof.keys[prof.n_keys];
    snprintf(k->key, sizeof k->key, "%s", key);
    return prof.n_keys++;
}

/* the pending pairs, summed into their keys */
void drain(void)
{
    if (prof.pending == 0)
        return;
    cudaEventSynchronize(prof.ev[2 * prof.pending - 1]);
    for (int i = 0; i < prof.pending; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, prof.ev[2 * i], prof.ev[2 * i + 1]) == cudaSuccess) {
            prof.keys[prof.key_of[i]].ms += ms;
            prof.keys[prof.key_of[i]].calls++;
        }
    }
    (void)cudaGetLastError();
    prof.pending = 0;
}

int by_time(const void *a, const void *b)
{
    double x = ((const key_total *)a)->ms, y = ((const key_total *)b)->ms;
    return (x < y) - (x > y);
}

/* the table, largest first (keeps the totals: a later report adds the ops since) */
void write_report(FILE *f)
{
    drain();
    if (prof.n_keys == 0)
        return;
    double sum = 0, span = 0;
    for (int i = 0; i < prof.n_keys; i++)
        sum += prof.keys[i].ms;
    float span_ms = 0;
    if (cudaEventElapsedTime(&span_ms, prof.first, prof.last) == cudaSuccess)
        span = span_ms;
    /* sorted in a copy: the open pairs' key indices point into prof.keys */
    static key_total sorted[MAX_KEYS];
    memcpy(sorted, prof.keys, (size_t)prof.n_keys * sizeof sorted[0]);
    qsort(sorted, (size_t)prof.n_keys, sizeof sorted[0], by_time);
    fprintf(f, "FT_CUDA_PROFILE: GPU time per op (ms, all calls of the process)\n");
    fprintf(f, "%-72s %8s %11s %9s %6s\n", "op", "calls", "total ms", "mean us", "%");
    for (int i = 0; i < prof.n_keys; i++) {
        const key_total *k = &sorted[i];
        fprintf(f, "%-72s %8ld %11.2f %9.1f %6.2f\n", k->key, k->calls, k->ms,
                k->calls ? 1e3 * k->ms / (double)k->calls : 0.0, sum > 0 ? 100 * k->ms / sum : 0);
    }
    fprintf(f, "FT_CUDA_PROFILE: ops %.2f ms of a %.2f ms span from the first op to the "
                    "last (%.1f%% of the span waited on the host)\n",
            sum, span, span > 0 ? 100 * (span - sum) / span : 0.0);
}

void report_at_exit(void) { write_report(stderr); }
} // namespace

extern "C" void ft_cuda_profile_write(FILE *f) { write_report(f); }

extern "C" int ft_cuda_profile_enabled(void)
{
    if (prof.enabled < 0) {
        const char *v = getenv("FT_CUDA_PROFILE");
        prof.enabled = v && *v && strcmp(v, "0") != 0;
    }
    return prof.enabled;
}

extern "C" int ft_cuda_profile_begin(const char *key)
{
    if (!ft_cuda_profile_enabled())
        return 0;
    cudaStream_t s = ft_cuda_stream();
    if (!prof.have_first) {
        for (int i = 0; i < 2 * POOL; i++)
            CUDA_CHECK(cudaEventCreate(&prof.ev[i]));
        CUDA_CHECK(cudaEventCreate(&prof.first));
        CUDA_CHECK(cudaEventCreate(&prof.last));
        CUDA_CHECK(cudaEventRecord(prof.first, s));
        prof.have_first = true;
        atexit(report_at_exit);
    }
    if (prof.pending == POOL)
        drain();
    prof.open_key = key_index(key);
    CUDA_CHECK(cudaEventRecord(prof.ev[2 * prof.pending], s));
    return 1;
}

extern "C" void ft_cuda_profile_end(void)
{
    cudaStream_t s = ft_cuda_stream();
    CUDA_CHECK(cudaEventRecord(prof.ev[2 * prof.pending + 1], s));
    CUDA_CHECK(cudaEventRecord(prof.last, s));
    prof.key_of[prof.pending++] = prof.open_key;
}
