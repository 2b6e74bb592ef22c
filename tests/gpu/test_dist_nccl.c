/* The NCCL backend of lib/dist/dist.h on GPU buffers. Run plainly it asks for a one-process
 * NCCL communicator (FT_DIST_BACKEND=nccl, world size 1: what ft-train on one GPU gets
 * with that variable); under `mpirun -np N` (one GPU per rank) the same checks run over N
 * ranks. Every collective moves device memory through NCCL and is checked on the host
 * against the values every rank can compute for itself: allreduce (sum, avg, max; fp32,
 * fp64, int64), reduce-scatter and allgather with uneven counts, broadcast from the
 * first and the last rank, and the asynchronous forms waited later. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "device/alloc.h"
#include "check.h"
#include "dist/dist.h"
#include "ops.h"

#include <cuda_runtime.h>

static ft_comm *comm;
static int rank, world;

/* The value rank r contributes at element i (exact in fp32: small integers / 4). */
static double value(int r, size_t i) { return (double)((int)(i % 97) - 48 + 3 * r) / 4.0; }

/* The sum over ranks of value(r, i) (exact in fp32 too); the max is value(world - 1, i):
 * value grows with the rank. */
static double rank_sum(size_t i)
{
    double s = 0;
    for (int r = 0; r < world; r++)
        s += value(r, i);
    return s;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc of %zu bytes failed\n", bytes);
        exit(2);
    }
    return p;
}

static void put(void *dev, const void *host, size_t bytes)
{
    CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
}

static void get(void *host, const void *dev, size_t bytes)
{
    CHECK(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
}

static void test_backend_is_nccl(void)
{
    printf("dist_nccl: backend %s, %d rank%s\n", ft_comm_backend(comm), world,
           world == 1 ? "" : "s");
    CHECK(strcmp(ft_comm_backend(comm), "nccl") == 0);
}

/* How far NCCL's fp32 average of element i may lie from sum / world. NCCL does not divide
 * the sum: ncclAvg is a pre-multiplied sum (ncclDevPreMulSum), each rank's value times
 * s = (float)(1.0 / world), the products rounded, then summed in fp32 in an order NCCL
 * does not promise. So s, each product and each of the world - 1 additions round once:
 * the result is within gamma_(world+1) * sum_r |value(r, i)| / world of the exact
 * average, gamma_k = k u / (1 - k u), u = 2^-24 (one more u for the double division
 * here, negligible but counted). With world a power of two s is exact, and these values
 * (quarters) times s and their sums are exact too: the bound is then 0, bit for bit. With
 * 3 ranks the last bit may differ from (float)(sum / 3), which an exact comparison
 * wrongly failed. */
static double avg_tolerance(size_t i)
{
    if ((world & (world - 1)) == 0)
        return 0;
    double abs_sum = 0;
    for (int r = 0; r < world; r++)
        abs_sum += fabs(value(r, i));
    return (world + 2) * 0x1.0p-24 * abs_sum / world;
}

static void test_allreduce_f32(void)
{
    const size_t n = 1000003; /* odd, and more than one NCCL chunk */
    float *h = malloc(n * sizeof *h), *want = malloc(n * sizeof *want);
    float *d = dev_alloc(n * sizeof *d);
    ft_comm_op ops[] = {FT_COMM_SUM, FT_COMM_AVG, FT_COMM_MAX};
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++) {
            h[i] = (float)value(rank, i);
            double s = rank_sum(i);
            want[i] = (float)(ops[k] == FT_COMM_SUM ? s : value(world - 1, i));
        }
        put(d, h, n * sizeof *h);
        ft_err err;
        int rc = ft_comm_allreduce(comm, d, n, FT_COMM_F32, ops[k], &err);
        if (rc)
            fprintf(stderr, "  %s\n", err.msg);
        CHECK(rc == 0);
        get(h, d, n * sizeof *h);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += ops[k] == FT_COMM_AVG ? !(fabs(h[i] - rank_sum(i) / world) <= avg_tolerance(i))
                                         : h[i] != want[i];
        CHECK(bad == 0);
    }
    cudaFree(d);
    free(h);
    free(want);
}

static void test_allreduce_f64_i64(void)
{
    const size_t n = 4099;
    double *h = malloc(n * sizeof *h);
    int64_t *hi = malloc(n * sizeof *hi);
    double *d = dev_alloc(n * sizeof *d);
    int64_t *di = dev_alloc(n * sizeof *di);
    for (size_t i = 0; i < n; i++) {
        h[i] = value(rank, i);
        hi[i] = (int64_t)i * (rank + 1);
    }
    put(d, h, n * sizeof *h);
    put(di, hi, n * sizeof *hi);
    ft_err err;
    CHECK(ft_comm_allreduce(comm, d, n, FT_COMM_F64, FT_COMM_SUM, &err) == 0);
    CHECK(ft_comm_allreduce(comm, di, n, FT_COMM_I64, FT_COMM_SUM, &err) == 0);
    get(h, d, n * sizeof *h);
    get(hi, di, n * sizeof *hi);
    int64_t ranks = (int64_t)world * (world + 1) / 2;
    for (size_t i = 0; i < n; i++) {
        CHECK(h[i] == rank_sum(i));
        CHECK(hi[i] == (int64_t)i * ranks);
    }
    cudaFree(d);
    cudaFree(di);
    free(h);
    free(hi);
}

/* counts[r] = 1000 + 37 r, rank 0 of an odd world gets one element more: uneven. */
static void uneven_counts(size_t *counts, size_t *total)
{
    *total = 0;
    for (int r = 0; r < world; r++) {
        counts[r] = 1000 + 37 * (size_t)r + (r == 0 && world % 2);
        *total += counts[r];
    }
}

static void test_reduce_scatter_and_allgather(void)
{
    size_t *counts = calloc((size_t)world, sizeof *counts), total, off = 0;
    uneven_counts(counts, &total);
    for (int r = 0; r < rank; r++)
        off += counts[r];
    float *h = malloc(total * sizeof *h);
    float *send = dev_alloc(total * sizeof *h), *recv = dev_alloc(total * sizeof *h);
    for (size_t i = 0; i < total; i++)
        h[i] = (float)value(rank, i);
    put(send, h, total * sizeof *h);
    ft_err err;
    CHECK(ft_comm_reduce_scatter_v(comm, send, recv, counts, FT_COMM_F32, FT_COMM_SUM, &err) ==
          0);
    get(h, recv, counts[rank] * sizeof *h);
    for (size_t i = 0; i < counts[rank]; i++)
        CHECK(h[i] == (float)rank_sum(off + i));
    /* allgather: each rank's block is value(rank, i) for its own i; in place too */
    for (size_t i = 0; i < counts[rank]; i++)
        h[i] = (float)value(rank, i);
    put(send, h, counts[rank] * sizeof *h);
    CHECK(ft_comm_allgather_v(comm, send, recv, counts, FT_COMM_F32, &err) == 0);
    get(h, recv, total * sizeof *h);
    size_t o = 0;
    for (int r = 0; r < world; r++) {
        for (size_t i = 0; i < counts[r]; i++)
            CHECK(h[o + i] == (float)value(r, i));
        o += counts[r];
    }
    cudaFree(send);
    cudaFree(recv);
    free(h);
    free(counts);
}

static void test_broadcast_and_async(void)
{
    const size_t n = 70001;
    float *h = malloc(n * sizeof *h);
    float *a = dev_alloc(n * sizeof *h), *b = dev_alloc(n * sizeof *h);
    for (int root = 0; root < world; root += world > 1 ? world - 1 : 1) {
        for (size_t i = 0; i < n; i++)
            h[i] = (float)value(rank, i);
        put(a, h, n * sizeof *h);
        ft_err err;
        CHECK(ft_comm_broadcast(comm, a, n, FT_COMM_F32, root, &err) == 0);
        get(h, a, n * sizeof *h);
        for (size_t i = 0; i < n; i++)
            CHECK(h[i] == (float)value(root, i));
    }
    /* two collectives in flight, waited in reverse order */
    for (size_t i = 0; i < n; i++)
        h[i] = (float)value(rank, i);
    put(a, h, n * sizeof *h);
    put(b, h, n * sizeof *h);
    ft_comm_req *ra, *rb;
    ft_err err;
    CHECK(ft_comm_iallreduce(comm, a, n, FT_COMM_F32, FT_COMM_SUM, &ra, &err) == 0);
    CHECK(ft_comm_iallreduce(comm, b, n, FT_COMM_F32, FT_COMM_MAX, &rb, &err) == 0);
    CHECK(ft_comm_wait(comm, rb, &err) == 0);
    CHECK(ft_comm_wait(comm, ra, &err) == 0);
    get(h, a, n * sizeof *h);
    for (size_t i = 0; i < n; i += 101)
        CHECK(h[i] == (float)rank_sum(i));
    get(h, b, n * sizeof *h);
    for (size_t i = 0; i < n; i += 101)
        CHECK(h[i] == (float)value(world - 1, i));
    cudaFree(a);
    cudaFree(b);
    free(h);
}

/* The tracked allocator's GPU buffers (the engine's) go through NCCL as well. */
static void test_tracked_device_buffers(void)
{
    ft_mem mem = {0};
    const size_t n = 513;
    float *d = ft_alloc_on(&mem, FT_DEV_CUDA, FT_MEM_GRADS, n * sizeof(float));
    CHECK(d != NULL);
    if (!d)
        return;
    float h[513];
    for (size_t i = 0; i < n; i++)
        h[i] = (float)value(rank, i);
    ft_err err;
    CHECK(ft_copy_bytes(d, FT_DEV_CUDA, h, FT_DEV_CPU, sizeof h, &err) == 0);
    CHECK(ft_comm_allreduce(comm, d, n, FT_COMM_F32, FT_COMM_SUM, &err) == 0);
    CHECK(ft_copy_bytes(h, FT_DEV_CPU, d, FT_DEV_CUDA, sizeof h, &err) == 0);
    for (size_t i = 0; i < n; i++)
        CHECK(h[i] == (float)rank_sum(i));
    ft_free_on(&mem, FT_DEV_CUDA, d);
    CHECK(mem.live_total == 0);
}

int main(void)
{
    if (!getenv("FT_DIST_BACKEND"))
        setenv("FT_DIST_BACKEND", "nccl", 1);
    ft_err err;
    if (ft_comm_init(&comm, &err)) {
        fprintf(stderr, "dist_nccl: %s\n", err.msg);
        printf("dist_nccl: 0 passed, 1 failed\n");
        return 1;
    }
    rank = ft_comm_rank(comm);
    world = ft_comm_size(comm);
    ft_comm_set_timeout(comm, 120);
    RUN(test_backend_is_nccl);
    RUN(test_allreduce_f32);
    RUN(test_allreduce_f64_i64);
    RUN(test_reduce_scatter_and_allgather);
    RUN(test_broadcast_and_async);
    RUN(test_tracked_device_buffers);
    int rc = check_summary("dist_nccl");
    ft_comm_finalize(comm);
    return rc;
}
