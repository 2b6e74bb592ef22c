/* The NCCL emulation (tests/emu/runtime/nccl_emu.cc) against expectations computed here:
 * run alone (a one-rank communicator, no MPI) and under mpirun -np 1, 2, 3 by
 * tests/emu/run-nccl-emu.sh (make test-nccl-emu). Every rank's inputs reach every rank
 * through plain MPI on MPI_COMM_WORLD (host buffers), and each rank computes the result
 * NCCL's definitions give (nccl_emu.cc's comment: rank order, one rounding per operation
 * in the datatype, ncclAvg scaling first) with code of its own: _Float16 arithmetic for
 * fp16, rounding through double for bf16, wide integers for the wrapping sums. Moves
 * (allgather, broadcast, send/recv) must be bit for bit, over every datatype; so must
 * reductions, over every datatype NCCL reduces and every op, in place and not.
 *
 * Buffers come from cudaMalloc (the emulated runtime's, make CUDA=emu).
 * `test_nccl_emu --fail=CASE` runs one misuse that must stop the process with a message
 * (the runner checks the exit and the message): see fail_case below. */
#include <mpi.h>
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, world = 1, with_mpi;
static ncclComm_t comm;
static int passed, failed, current_failed;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "  rank %d: %s:%d: CHECK failed: %s\n", rank, __FILE__, __LINE__, \
                    #cond);                                                                \
            current_failed = 1;                                                            \
        }                                                                                  \
    } while (0)

/* A test passes when it passed on every rank. */
#define RUN(fn)                                                                            \
    do {                                                                                   \
        current_failed = 0;                                                                \
        fn();                                                                              \
        int any_ = current_failed;                                                         \
        if (with_mpi)                                                                      \
            MPI_Allreduce(&current_failed, &any_, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);    \
        if (any_) {                                                                        \
            failed++;                                                                      \
            if (rank == 0)                                                                 \
                fprintf(stderr, "FAIL %s (%d rank%s)\n", #fn, world, world == 1 ? "" : "s"); \
        } else {                                                                           \
            passed++;                                                                      \
        }                                                                                  \
    } while (0)

#define NCCL_CHECK(call)                                                                   \
    do {                                                                                   \
        ncclResult_t r_ = (call);                                                          \
        if (r_ != ncclSuccess) {                                                           \
            fprintf(stderr, "  rank %d: %s:%d: %s: %s (%s)\n", rank, __FILE__, __LINE__, #call, \
                    ncclGetErrorString(r_), ncclGetLastError(comm));                       \
            current_failed = 1;                                                            \
        }                                                                                  \
    } while (0)

/* ---- device buffers ------------------------------------------------------------------ */

static void *dmalloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        fprintf(stderr, "cudaMalloc of %zu bytes failed\n", bytes);
        exit(2);
    }
    return p;
}

static void h2d(void *d, const void *h, size_t bytes)
{
    if (bytes && cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy to the device failed\n");
        exit(2);
    }
}

static void d2h(void *h, const void *d, size_t bytes)
{
    if (bytes && cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        fprintf(stderr, "cudaMemcpy from the device failed\n");
        exit(2);
    }
}

static void *hmalloc(size_t bytes)
{
    void *p = calloc(bytes ? bytes : 1, 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* Every rank's `bytes` of host data, rank after rank, through MPI on MPI_COMM_WORLD. */
static void gather_all(const void *mine, size_t bytes, void *all)
{
    if (world == 1) {
        memcpy(all, mine, bytes);
        return;
    }
    if (bytes > INT_MAX) {
        fprintf(stderr, "gather_all: %zu bytes\n", bytes);
        exit(2);
    }
    MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
}

/* ---- datatypes and values ------------------------------------------------------------ */

typedef struct {
    ncclDataType_t t;
    size_t size;
    const char *name;
    int floating, reducible;
} tinfo;

static const tinfo types[] = {
    {ncclInt8, 1, "int8", 0, 1},          {ncclUint8, 1, "uint8", 0, 1},
    {ncclInt32, 4, "int32", 0, 1},        {ncclUint32, 4, "uint32", 0, 1},
    {ncclInt64, 8, "int64", 0, 1},        {ncclUint64, 8, "uint64", 0, 1},
    {ncclFloat16, 2, "fp16", 1, 1},       {ncclFloat32, 4, "fp32", 1, 1},
    {ncclFloat64, 8, "fp64", 1, 1},       {ncclBfloat16, 2, "bf16", 1, 1},
    {ncclFloat8e4m3, 1, "fp8e4m3", 1, 0}, {ncclFloat8e5m2, 1, "fp8e5m2", 1, 0},
};
#define NTYPES (sizeof types / sizeof types[0])

static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
static const char *op_names[] = {"sum", "prod", "max", "min", "avg"};

static uint64_t mix(uint64_t x) /* splitmix64 */
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* bf16 by rounding a double (normal range, round to nearest even): independent of the
 * emulation's bit trick. */
static float bf16_round(double x)
{
    if (x == 0 || !isfinite(x))
        return (float)x;
    int e;
    double m = frexp(x, &e); /* 0.5 <= |m| < 1 */
    return (float)ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

static uint16_t bf16_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact: f is a bf16 value */
}

static float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Element i of rank r's input (salt picks the test): integers are random bits (the sums
 * wrap), floating types a nonzero value in [-8, 8) rounded to the type. */
static void make_value(const tinfo *ti, int r, uint64_t salt, size_t i, void *out)
{
    uint64_t h = mix(salt * 1000003u + (uint64_t)r * 7919u + i * 104729u + 17);
    if (!ti->floating || !ti->reducible) {
        memcpy(out, &h, ti->size);
        return;
    }
    double v = ((double)(h >> 11) * 0x1.0p-53) * 16.0 - 8.0;
    if (v == 0)
        v = 1;
    if (ti->t == ncclFloat32) {
        float f = (float)v;
        memcpy(out, &f, 4);
    } else if (ti->t == ncclFloat64) {
        memcpy(out, &v, 8);
    } else if (ti->t == ncclFloat16) {
        _Float16 f = (_Float16)v;
        if ((float)f == 0)
            f = (_Float16)1.0f;
        memcpy(out, &f, 2);
    } else {
        uint16_t b = bf16_bits(bf16_round(v));
        memcpy(out, &b, 2);
    }
}

static void make_values(const tinfo *ti, int r, uint64_t salt, size_t count, void *out)
{
    for (size_t i = 0; i < count; i++)
        make_value(ti, r, salt, i, (char *)out + i * ti->size);
}

/* Random bits for moves, never the all-ones poison of a floating element. */
static void make_bits(const tinfo *ti, int r, uint64_t salt, size_t count, void *out)
{
    unsigned char *p = out;
    for (size_t i = 0; i < count; i++) {
        uint64_t h = mix(salt * 31u + (uint64_t)r * 1000033u + i);
        memcpy(p + i * ti->size, &h, ti->size);
        if (ti->size >= 2)
            p[i * ti->size] &= 0xFE; /* the low byte is never 0xFF, so no element is poison */
    }
}

/* ---- the reference reductions -------------------------------------------------------- */

static uint64_t load_bits(const char *p, size_t es)
{
    uint64_t v = 0;
    memcpy(&v, p, es); /* little endian: zero-extended */
    return v;
}

static int64_t sign_extend(uint64_t v, size_t es)
{
    if (es == 8)
        return (int64_t)v;
    uint64_t sign = 1ull << (8 * es - 1);
    return (int64_t)((v ^ sign) - sign);
}

static int is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

/* out[i] = NCCL's op over the n contributions in (rank r's at in + r * stride), in rank
 * order, as nccl_emu.cc defines it. */
static void ref_reduce(const tinfo *ti, ncclRedOp_t op, int n, const char *in, size_t stride,
                       size_t count, char *out)
{
    size_t es = ti->size;
    for (size_t i = 0; i < count; i++) {
        const char *x0 = in + i * es;
        char *o = out + i * es;
        if (!ti->floating) {
            uint64_t acc = load_bits(x0, es), mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
            for (int r = 1; r < n; r++) {
                uint64_t x = load_bits(x0 + r * stride, es);
                int64_t sa = sign_extend(acc, es), sx = sign_extend(x, es);
                int take_x;
                switch (op) {
                case ncclProd:
                    acc = (acc * x) & mask;
                    break;
                case ncclMax:
                case ncclMin:
                    take_x = is_signed(ti->t) ? (op == ncclMax ? sx > sa : sx < sa)
                                              : (op == ncclMax ? x > acc : x < acc);
                    acc = take_x ? x : acc;
                    break;
                default:
                    acc = (acc + x) & mask;
                    break;
                }
            }
            if (op == ncclAvg)
                acc = is_signed(ti->t) ? (uint64_t)(sign_extend(acc, es) / n) & mask : acc / (uint64_t)n;
            memcpy(o, &acc, es);
        } else if (ti->t == ncclFloat32) {
            volatile float s = (float)(1.0 / n), acc, t;
            float x;
            memcpy(&x, x0, 4);
            acc = op == ncclAvg ? x * s : x;
            for (int r = 1; r < n; r++) {
                memcpy(&x, x0 + r * stride, 4);
                switch (op) {
                case ncclProd:
                    acc = acc * x;
                    break;
                case ncclMax:
                    acc = fmaxf(acc, x);
                    break;
                case ncclMin:
                    acc = fminf(acc, x);
                    break;
                case ncclAvg:
                    t = x * s;
                    acc = acc + t;
                    break;
                default:
                    acc = acc + x;
                    break;
                }
            }
            float a = acc;
            memcpy(o, &a, 4);
        } else if (ti->t == ncclFloat64) {
            volatile double s = 1.0 / n, acc, t;
            double x;
            memcpy(&x, x0, 8);
            acc = op == ncclAvg ? x * s : x;
            for (int r = 1; r < n; r++) {
                memcpy(&x, x0 + r * stride, 8);
                switch (op) {
                case ncclProd:
                    acc = acc * x;
                    break;
                case ncclMax:
                    acc = fmax(acc, x);
                    break;
                case ncclMin:
                    acc = fmin(acc, x);
                    break;
                case ncclAvg:
                    t = x * s;
                    acc = acc + t;
                    break;
                default:
                    acc = acc + x;
                    break;
                }
            }
            double a = acc;
            memcpy(o, &a, 8);
        } else if (ti->t == ncclFloat16) {
            volatile _Float16 s = (_Float16)(float)(1.0 / n), acc, t;
            _Float16 x;
            memcpy(&x, x0, 2);
            acc = op == ncclAvg ? x * s : x;
            for (int r = 1; r < n; r++) {
                memcpy(&x, x0 + r * stride, 2);
                switch (op) {
                case ncclProd:
                    acc = acc * x;
                    break;
                case ncclMax:
                    acc = (_Float16)fmaxf((float)acc, (float)x);
                    break;
                case ncclMin:
                    acc = (_Float16)fminf((float)acc, (float)x);
                    break;
                case ncclAvg:
                    t = x * s;
                    acc = acc + t;
                    break;
                default:
                    acc = acc + x;
                    break;
                }
            }
            _Float16 a = acc;
            memcpy(o, &a, 2);
        } else { /* bf16: each operation exact in double, then rounded once */
            uint16_t h;
            memcpy(&h, x0, 2);
            double s = bf16_round((float)(1.0 / n));
            double acc = bf16_value(h);
            if (op == ncclAvg)
                acc = bf16_round(acc * s);
            for (int r = 1; r < n; r++) {
                memcpy(&h, x0 + r * stride, 2);
                double x = bf16_value(h);
                switch (op) {
                case ncclProd:
                    acc = bf16_round(acc * x);
                    break;
                case ncclMax:
                    acc = fmax(acc, x);
                    break;
                case ncclMin:
                    acc = fmin(acc, x);
                    break;
                case ncclAvg:
                    acc = bf16_round(acc + bf16_round(x * s));
                    break;
                default:
                    acc = bf16_round(acc + x);
                    break;
                }
            }
            h = bf16_bits((float)acc);
            memcpy(o, &h, 2);
        }
    }
}

/* The first element where got and want differ (bit for bit), reported; 1 when equal. */
static int same_bits(const char *what, const tinfo *ti, const void *got, const void *want,
                     size_t count)
{
    for (size_t i = 0; i < count; i++) {
        const char *g = (const char *)got + i * ti->size, *w = (const char *)want + i * ti->size;
        if (memcmp(g, w, ti->size) != 0) {
            fprintf(stderr, "  rank %d: %s %s: element %zu of %zu: got 0x%llx, want 0x%llx\n", rank,
                    what, ti->name, i, count, (unsigned long long)load_bits(g, ti->size),
                    (unsigned long long)load_bits(w, ti->size));
            return 0;
        }
    }
    return 1;
}

/* ---- collectives ---------------------------------------------------------------------- */

static const size_t counts[] = {0, 1, 1001};

static void test_version_and_errors(void)
{
    int v = 0;
    NCCL_CHECK(ncclGetVersion(&v));
    CHECK(v == NCCL_VERSION_CODE && v == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
    CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
    CHECK(strstr(ncclGetErrorString(ncclInvalidArgument), "invalid argument") != NULL);
    CHECK(strstr(ncclGetErrorString(ncclInProgress), "in progress") != NULL);
    CHECK(strstr(ncclGetErrorString((ncclResult_t)99), "unknown") != NULL);
    int n = 0, me = -1;
    NCCL_CHECK(ncclCommCount(comm, &n));
    NCCL_CHECK(ncclCommUserRank(comm, &me));
    CHECK(n == world && me == rank);
    ncclResult_t async = ncclInternalError;
    NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
    CHECK(async == ncclSuccess);
    CHECK(ncclCommDestroy(NULL) == ncclSuccess);
}

/* Bad arguments return NCCL's codes with the reason in ncclGetLastError; every rank makes
 * the same mistakes, and nothing runs. */
static void test_bad_arguments(void)
{
    float *d = dmalloc(16 * sizeof(float));
    float h[16] = {0};
    h2d(d, h, sizeof h);
    CHECK(ncclBroadcast(d, d, 16, ncclFloat32, world, comm, 0) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(comm), "ncclBroadcast") && strstr(ncclGetLastError(comm), "root"));
    CHECK(ncclReduce(d, d, 16, ncclFloat32, ncclSum, -1, comm, 0) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 16, (ncclDataType_t)42, ncclSum, comm, 0) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(comm), "type"));
    CHECK(ncclAllReduce(d, d, 16, ncclFloat32, (ncclRedOp_t)9, comm, 0) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 16, ncclFloat8e4m3, ncclSum, comm, 0) == ncclInvalidArgument);
    CHECK(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, NULL, 0) == ncclInvalidArgument);
    CHECK(strstr(ncclGetLastError(NULL), "comm"));
    CHECK(ncclSend(d, 16, ncclFloat32, world, comm, 0) == ncclInvalidArgument);
    CHECK(ncclRecv(d, 16, ncclFloat32, -1, comm, 0) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    /* a failed call in a group: ncclGroupEnd returns its error and runs nothing */
    CHECK(ncclGroupStart() == ncclSuccess);
    NCCL_CHECK(ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, comm, 0));
    CHECK(ncclBroadcast(d, d, 16, ncclFloat32, -5, comm, 0) == ncclInvalidArgument);
    CHECK(ncclGroupEnd() == ncclInvalidArgument);
    /* a zeroed id is not one of ncclGetUniqueId's */
    ncclUniqueId zero;
    memset(&zero, 0, sizeof zero);
    ncclComm_t other = NULL;
    CHECK(ncclCommInitRank(&other, world, zero, rank) == ncclInvalidArgument && !other);
    CHECK(ncclCommInitRank(&other, world, zero, world) == ncclInvalidArgument);
    /* the communicator still works */
    for (int i = 0; i < 16; i++)
        h[i] = (float)(i + rank);
    h2d(d, h, sizeof h);
    NCCL_CHECK(ncclAllReduce(d, d, 16, ncclFloat32, ncclMax, comm, 0));
    d2h(h, d, sizeof h);
    for (int i = 0; i < 16; i++)
        CHECK(h[i] == (float)(i + world - 1));
    cudaFree(d);
}

/* ncclAllReduce: every datatype NCCL reduces, every op, counts 0, 1 (fewer elements than
 * ranks) and 1001, out of place and in place. */
static void test_allreduce(void)
{
    for (size_t t = 0; t < NTYPES; t++) {
        const tinfo *ti = &types[t];
        if (!ti->reducible)
            continue;
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    size_t n = counts[c], bytes = n * ti->size;
                    uint64_t salt = t * 100 + o * 10 + c;
                    char *mine = hmalloc(bytes), *all = hmalloc(bytes * world);
                    char *want = hmalloc(bytes), *got = hmalloc(bytes);
                    make_values(ti, rank, salt, n, mine);
                    gather_all(mine, bytes, all);
                    ref_reduce(ti, ops[o], world, all, bytes, n, want);
                    char *send = dmalloc(bytes), *recv = in_place ? send : dmalloc(bytes);
                    h2d(send, mine, bytes);
                    NCCL_CHECK(ncclAllReduce(send, recv, n, ti->t, ops[o], comm, 0));
                    d2h(got, recv, bytes);
                    char what[64];
                    snprintf(what, sizeof what, "allreduce %s n=%zu%s", op_names[o], n,
                             in_place ? " in place" : "");
                    CHECK(same_bits(what, ti, got, want, n));
                    if (!in_place) { /* the send buffer is untouched */
                        d2h(got, send, bytes);
                        CHECK(memcmp(got, mine, bytes) == 0);
                        cudaFree(recv);
                    }
                    cudaFree(send);
                    free(mine), free(all), free(want), free(got);
                }
    }
}

/* A large fp32 allreduce: more than one MPI fragment, blocks of unequal size. */
static void test_allreduce_large(void)
{
    const tinfo *ti = &types[7];
    const size_t n = (1u << 18) + 3;
    for (int k = 0; k < 2; k++) {
        ncclRedOp_t op = k ? ncclAvg : ncclSum;
        float *mine = hmalloc(n * 4), *all = hmalloc(n * 4 * world), *want = hmalloc(n * 4);
        make_values(ti, rank, 900 + k, n, mine);
        gather_all(mine, n * 4, all);
        ref_reduce(ti, op, world, (char *)all, n * 4, n, (char *)want);
        float *d = dmalloc(n * 4);
        h2d(d, mine, n * 4);
        NCCL_CHECK(ncclAllReduce(d, d, n, ncclFloat32, op, comm, 0));
        d2h(mine, d, n * 4);
        CHECK(same_bits(k ? "large allreduce avg" : "large allreduce sum", ti, mine, want, n));
        cudaFree(d);
        free(mine), free(all), free(want);
    }
}

/* ncclAvg scales first (NCCL's PreMulSum): with 3 ranks 1/3 and every product are rounded,
 * so some elements differ from the sum divided by 3 (the old check in test_dist_nccl.c),
 * and all lie within the bound the definition gives. With 1 or 2 ranks (a power of two)
 * the scale is exact. */
static void test_avg_is_scaled_first(void)
{
    const size_t n = 1001;
    float *mine = hmalloc(n * 4), *all = hmalloc(n * 4 * world), *got = hmalloc(n * 4);
    make_values(&types[7], rank, 4242, n, mine);
    gather_all(mine, n * 4, all);
    float *d = dmalloc(n * 4);
    h2d(d, mine, n * 4);
    NCCL_CHECK(ncclAllReduce(d, d, n, ncclFloat32, ncclAvg, comm, 0));
    d2h(got, d, n * 4);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) {
        double s = 0, sabs = 0;
        for (int r = 0; r < world; r++)
            s += all[(size_t)r * n + i], sabs += fabs(all[(size_t)r * n + i]);
        float by_division = (float)(s / world);
        differ += got[i] != by_division;
        CHECK(fabs(got[i] - s / world) <= (world + 2) * 0x1.0p-24 * sabs / world);
    }
    if ((world & (world - 1)) == 0)
        CHECK(differ == 0);
    if (world == 3)
        CHECK(differ > 0);
    cudaFree(d);
    free(mine), free(all), free(got);
}

/* bf16 sums round after every addition (partial sums travel between GPUs as bf16): with
 * rank 0 giving 1 and the others 2^-8, rank order gives 1 + 2^-8 = 1 (a tie, to even),
 * then 1 again; one rounding of the exact sum would give 1 + 2^-7 on 3 ranks. With 2
 * ranks the two definitions agree, on any data. */
static void test_bf16_rounding(void)
{
    uint16_t x = bf16_bits(rank == 0 ? 1.0f : 0x1.0p-8f), *d = dmalloc(2);
    h2d(d, &x, 2);
    NCCL_CHECK(ncclAllReduce(d, d, 1, ncclBfloat16, ncclSum, comm, 0));
    d2h(&x, d, 2);
    CHECK(bf16_value(x) == 1.0f);
    cudaFree(d);
    if (world == 2) {
        const size_t n = 513;
        uint16_t *mine = hmalloc(n * 2), *all = hmalloc(n * 2 * world), *got = hmalloc(n * 2);
        make_values(&types[9], rank, 77, n, mine);
        gather_all(mine, n * 2, all);
        uint16_t *dd = dmalloc(n * 2);
        h2d(dd, mine, n * 2);
        NCCL_CHECK(ncclAllReduce(dd, dd, n, ncclBfloat16, ncclSum, comm, 0));
        d2h(got, dd, n * 2);
        for (size_t i = 0; i < n; i++)
            CHECK(got[i] == bf16_bits(bf16_round((double)bf16_value(all[i]) +
                                                 (double)bf16_value(all[n + i]))));
        cudaFree(dd);
        free(mine), free(all), free(got);
    }
}

/* ncclReduceScatter: each rank gets the op over ranks of its recvcount block; in place
 * when recvbuff is sendbuff + rank * recvcount. */
static void test_reduce_scatter(void)
{
    static const size_t rcounts[] = {0, 1, 333};
    for (size_t t = 0; t < NTYPES; t++) {
        const tinfo *ti = &types[t];
        if (!ti->reducible)
            continue;
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
            for (size_t c = 0; c < 3; c++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    size_t n = rcounts[c], bytes = n * ti->size, total = bytes * world;
                    char *mine = hmalloc(total), *all = hmalloc(total * world);
                    char *want = hmalloc(bytes), *got = hmalloc(bytes);
                    make_values(ti, rank, 5000 + t * 100 + o * 10 + c, n * world, mine);
                    gather_all(mine, total, all);
                    /* this rank's block of every rank's send */
                    ref_reduce(ti, ops[o], world, all + (size_t)rank * bytes, total, n, want);
                    char *send = dmalloc(total);
                    char *recv = in_place ? send + (size_t)rank * bytes : dmalloc(bytes);
                    h2d(send, mine, total);
                    NCCL_CHECK(ncclReduceScatter(send, recv, n, ti->t, ops[o], comm, 0));
                    d2h(got, recv, bytes);
                    char what[64];
                    snprintf(what, sizeof what, "reduce-scatter %s n=%zu%s", op_names[o], n,
                             in_place ? " in place" : "");
                    CHECK(same_bits(what, ti, got, want, n));
                    if (!in_place)
                        cudaFree(recv);
                    cudaFree(send);
                    free(mine), free(all), free(want), free(got);
                }
    }
}

/* ncclAllGather: bit for bit, every datatype (fp8 too); in place when sendbuff is
 * recvbuff + rank * sendcount. */
static void test_allgather(void)
{
    for (size_t t = 0; t < NTYPES; t++)
        for (size_t c = 0; c < 3; c++)
            for (int in_place = 0; in_place < 2; in_place++) {
                const tinfo *ti = &types[t];
                size_t n = counts[c], bytes = n * ti->size, total = bytes * world;
                char *mine = hmalloc(bytes), *want = hmalloc(total), *got = hmalloc(total);
                make_bits(ti, rank, 7000 + t * 10 + c, n, mine);
                gather_all(mine, bytes, want);
                char *recv = dmalloc(total);
                char *send = in_place ? recv + (size_t)rank * bytes : dmalloc(bytes);
                h2d(send, mine, bytes);
                NCCL_CHECK(ncclAllGather(send, recv, n, ti->t, comm, 0));
                d2h(got, recv, total);
                CHECK(same_bits(in_place ? "allgather in place" : "allgather", ti, got, want,
                                n * world));
                if (!in_place)
                    cudaFree(send);
                cudaFree(recv);
                free(mine), free(want), free(got);
            }
}

/* ncclBroadcast from every root, bit for bit, in place and not; a non-root's sendbuff is
 * not read (NULL here). */
static void test_broadcast(void)
{
    for (size_t t = 0; t < NTYPES; t++)
        for (int root = 0; root < world; root++)
            for (int in_place = 0; in_place < 2; in_place++) {
                const tinfo *ti = &types[t];
                size_t n = 1001, bytes = n * ti->size;
                char *mine = hmalloc(bytes), *want = hmalloc(bytes), *got = hmalloc(bytes);
                make_bits(ti, rank, 8000 + t * 10 + (size_t)root, n, mine);
                make_bits(ti, root, 8000 + t * 10 + (size_t)root, n, want);
                char *recv = dmalloc(bytes), *send = NULL;
                if (rank == root) {
                    send = in_place ? recv : dmalloc(bytes);
                    h2d(send, mine, bytes);
                } else {
                    h2d(recv, mine, bytes); /* overwritten */
                }
                NCCL_CHECK(ncclBroadcast(send, recv, n, ti->t, root, comm, 0));
                d2h(got, recv, bytes);
                CHECK(same_bits(in_place ? "broadcast in place" : "broadcast", ti, got, want, n));
                if (rank == root && !in_place)
                    cudaFree(send);
                cudaFree(recv);
                free(mine), free(want), free(got);
            }
}

/* ncclReduce to every root: the root gets the op over ranks; a non-root's recvbuff is not
 * used (NULL here); in place on the root. */
static void test_reduce(void)
{
    static const size_t tsel[] = {1, 4, 6, 7, 8, 9};
    static const size_t osel[] = {0, 2, 4};
    for (size_t a = 0; a < sizeof tsel / sizeof tsel[0]; a++)
        for (size_t b = 0; b < sizeof osel / sizeof osel[0]; b++)
            for (int root = 0; root < world; root++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    const tinfo *ti = &types[tsel[a]];
                    ncclRedOp_t op = ops[osel[b]];
                    size_t n = 517, bytes = n * ti->size;
                    char *mine = hmalloc(bytes), *all = hmalloc(bytes * world);
                    char *want = hmalloc(bytes), *got = hmalloc(bytes);
                    make_values(ti, rank, 9000 + a * 100 + b * 10 + (size_t)root, n, mine);
                    gather_all(mine, bytes, all);
                    ref_reduce(ti, op, world, all, bytes, n, want);
                    char *send = dmalloc(bytes), *recv = NULL;
                    h2d(send, mine, bytes);
                    if (rank == root)
                        recv = in_place ? send : dmalloc(bytes);
                    NCCL_CHECK(ncclReduce(send, recv, n, ti->t, op, root, comm, 0));
                    if (rank == root) {
                        d2h(got, recv, bytes);
                        CHECK(same_bits(in_place ? "reduce in place" : "reduce", ti, got, want, n));
                        if (!in_place)
                            cudaFree(recv);
                    }
                    cudaFree(send);
                    free(mine), free(all), free(want), free(got);
                }
}

/* dist_nccl.c's uneven reduce-scatter and allgather: a group of ncclReduce (block r to
 * root r) and a group of ncclBroadcast (block r from rank r, in place). */
static void test_dist_nccl_groups(void)
{
    const tinfo *ti = &types[7];
    size_t *cnt = hmalloc(sizeof(size_t) * world), total = 0, off_me = 0;
    for (int r = 0; r < world; r++) {
        cnt[r] = 100 + 37 * (size_t)r + (r == 0 && world % 2);
        if (r < rank)
            off_me += cnt[r];
        total += cnt[r];
    }
    float *mine = hmalloc(total * 4), *all = hmalloc(total * 4 * world), *want = hmalloc(total * 4);
    float *got = hmalloc(total * 4);
    make_values(ti, rank, 31337, total, mine);
    gather_all(mine, total * 4, all);
    float *send = dmalloc(total * 4), *recv = dmalloc(total * 4);
    h2d(send, mine, total * 4);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0, off = 0; r < world; off += (int)cnt[r++])
        NCCL_CHECK(ncclReduce(send + off, recv, cnt[r], ncclFloat32, ncclSum, r, comm, 0));
    NCCL_CHECK(ncclGroupEnd());
    ref_reduce(ti, ncclSum, world, (char *)(all + off_me), total * 4, cnt[rank], (char *)want);
    d2h(got, recv, cnt[rank] * 4);
    CHECK(same_bits("grouped reduce", ti, got, want, cnt[rank]));
    /* allgather_v: this rank's block sits in place in recv */
    h2d(recv + off_me, mine, cnt[rank] * 4);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0, off = 0; r < world; off += (int)cnt[r++])
        NCCL_CHECK(ncclBroadcast(recv + off, recv + off, cnt[r], ncclFloat32, r, comm, 0));
    NCCL_CHECK(ncclGroupEnd());
    d2h(got, recv, total * 4);
    for (int r = 0, off = 0; r < world; off += (int)cnt[r++])
        CHECK(memcmp(got + off, all + (size_t)r * total, cnt[r] * 4) == 0);
    cudaFree(send), cudaFree(recv);
    free(cnt), free(mine), free(all), free(want), free(got);
}

/* ---- send and receive ----------------------------------------------------------------- */

/* A ring in one group (1 MiB, past Open MPI's eager limit), then both directions at once:
 * to next and to prev, from prev and from next (2 ranks: two messages to the same peer,
 * matched in order; 1 rank: all to itself). */
static void test_send_recv_ring(void)
{
    const size_t n = 1u << 18;
    const tinfo *ti = &types[7];
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    float *a = hmalloc(n * 4), *b = hmalloc(n * 4), *want = hmalloc(n * 4), *got = hmalloc(n * 4);
    make_bits(ti, rank, 1, n, a);
    make_bits(ti, rank, 2, n, b);
    float *da = dmalloc(n * 4), *db = dmalloc(n * 4), *r1 = dmalloc(n * 4), *r2 = dmalloc(n * 4);
    h2d(da, a, n * 4);
    h2d(db, b, n * 4);
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(da, n, ncclFloat32, next, comm, 0));
    NCCL_CHECK(ncclRecv(r1, n, ncclFloat32, prev, comm, 0));
    NCCL_CHECK(ncclGroupEnd());
    make_bits(ti, prev, 1, n, want);
    d2h(got, r1, n * 4);
    CHECK(same_bits("ring", ti, got, want, n));

    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclRecv(r1, n, ncclFloat32, prev, comm, 0)); /* receives first: no matter */
    NCCL_CHECK(ncclRecv(r2, n / 2, ncclFloat32, next, comm, 0));
    NCCL_CHECK(ncclSend(da, n, ncclFloat32, next, comm, 0));
    NCCL_CHECK(ncclSend(db, n / 2, ncclFloat32, prev, comm, 0));
    NCCL_CHECK(ncclGroupEnd());
    make_bits(ti, prev, 1, n, want);
    d2h(got, r1, n * 4);
    CHECK(same_bits("from prev", ti, got, want, n));
    make_bits(ti, next, 2, n / 2, want);
    d2h(got, r2, n / 2 * 4);
    CHECK(same_bits("from next", ti, got, want, n / 2));
    cudaFree(da), cudaFree(db), cudaFree(r1), cudaFree(r2);
    free(a), free(b), free(want), free(got);
}

/* Several messages of several datatypes to every peer (itself included) in one group,
 * nested groups, and a collective in the same group as sends and receives. */
static void test_send_recv_many(void)
{
    const int per = 3;
    size_t slots = (size_t)world * per;
    char **sbuf = hmalloc(slots * sizeof *sbuf), **rbuf = hmalloc(slots * sizeof *rbuf);
    NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < world; p++)
        for (int k = 0; k < per; k++) {
            const tinfo *ti = &types[(size_t)(k * 4 + 1) % NTYPES];
            size_t n = 10 + (size_t)k * 7, bytes = n * ti->size, s = (size_t)p * per + (size_t)k;
            char *h = hmalloc(bytes);
            make_bits(ti, rank * 100 + p, (uint64_t)k, n, h); /* from rank to p */
            sbuf[s] = dmalloc(bytes);
            rbuf[s] = dmalloc(bytes);
            h2d(sbuf[s], h, bytes);
            free(h);
            NCCL_CHECK(ncclGroupStart()); /* nested: runs at the outer end */
            NCCL_CHECK(ncclSend(sbuf[s], n, ti->t, p, comm, 0));
            NCCL_CHECK(ncclGroupEnd());
            NCCL_CHECK(ncclRecv(rbuf[s], n, ti->t, p, comm, 0));
        }
    double x = rank + 1, *dx = dmalloc(8);
    h2d(dx, &x, 8);
    NCCL_CHECK(ncclAllReduce(dx, dx, 1, ncclFloat64, ncclSum, comm, 0));
    NCCL_CHECK(ncclGroupEnd());
    d2h(&x, dx, 8);
    CHECK(x == world * (world + 1) / 2.0);
    for (int p = 0; p < world; p++)
        for (int k = 0; k < per; k++) {
            const tinfo *ti = &types[(size_t)(k * 4 + 1) % NTYPES];
            size_t n = 10 + (size_t)k * 7, bytes = n * ti->size, s = (size_t)p * per + (size_t)k;
            char *want = hmalloc(bytes), *got = hmalloc(bytes);
            make_bits(ti, p * 100 + rank, (uint64_t)k, n, want); /* from p to rank */
            d2h(got, rbuf[s], bytes);
            CHECK(same_bits("many", ti, got, want, n));
            free(want), free(got);
            cudaFree(sbuf[s]), cudaFree(rbuf[s]);
        }
    cudaFree(dx);
    free(sbuf), free(rbuf);
}

/* Outside a group, as dist_nccl.c sends: pairs (0, 1), (2, 3), ...: the even rank sends
 * then receives, the odd one receives then sends; an odd rank out sends to itself. Then
 * a bf16 send, moved bit for bit. */
static void test_send_recv_pairs(void)
{
    const size_t n = 50000;
    const tinfo *ti = &types[9];
    int peer = rank % 2 ? rank - 1 : rank + 1 < world ? rank + 1 : rank;
    uint16_t *h = hmalloc(n * 2), *want = hmalloc(n * 2);
    make_bits(ti, rank, 3, n, h);
    make_bits(ti, peer, 3, n, want);
    uint16_t *s = dmalloc(n * 2), *r = dmalloc(n * 2);
    h2d(s, h, n * 2);
    if (rank % 2 == 0) {
        NCCL_CHECK(ncclSend(s, n, ncclBfloat16, peer, comm, 0));
        NCCL_CHECK(ncclRecv(r, n, ncclBfloat16, peer, comm, 0));
    } else {
        NCCL_CHECK(ncclRecv(r, n, ncclBfloat16, peer, comm, 0));
        NCCL_CHECK(ncclSend(s, n, ncclBfloat16, peer, comm, 0));
    }
    d2h(h, r, n * 2);
    CHECK(same_bits("pair", ti, h, want, n));
    /* zero elements: no message */
    NCCL_CHECK(ncclSend(s, 0, ncclBfloat16, peer, comm, 0));
    NCCL_CHECK(ncclRecv(r, 0, ncclBfloat16, peer, comm, 0));
    cudaFree(s), cudaFree(r);
    free(h), free(want);
}

/* A second communicator (its own id) beside the first: calls on the two interleave
 * without mixing; destroyed again. */
static void test_two_communicators(void)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0)
        NCCL_CHECK(ncclGetUniqueId(&id));
    if (world > 1)
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t c2 = NULL;
    NCCL_CHECK(ncclCommInitRank(&c2, world, id, rank));
    if (!c2)
        return;
    int64_t a = rank + 1, b = 10 * (rank + 1), *da = dmalloc(8), *db = dmalloc(8);
    h2d(da, &a, 8);
    h2d(db, &b, 8);
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    NCCL_CHECK(ncclGroupStart());
    NCCL_CHECK(ncclSend(db, 1, ncclInt64, next, c2, 0));
    NCCL_CHECK(ncclSend(da, 1, ncclInt64, next, comm, 0));
    NCCL_CHECK(ncclRecv(da, 1, ncclInt64, prev, comm, 0));
    NCCL_CHECK(ncclRecv(db, 1, ncclInt64, prev, c2, 0));
    NCCL_CHECK(ncclGroupEnd());
    d2h(&a, da, 8);
    d2h(&b, db, 8);
    CHECK(a == prev + 1 && b == 10 * (prev + 1));
    NCCL_CHECK(ncclAllReduce(da, da, 1, ncclInt64, ncclSum, c2, 0));
    NCCL_CHECK(ncclAllReduce(db, db, 1, ncclInt64, ncclMax, comm, 0));
    d2h(&a, da, 8);
    d2h(&b, db, 8);
    CHECK(a == (int64_t)world * (world + 1) / 2 && b == 10 * world);
    NCCL_CHECK(ncclCommDestroy(c2));
    CHECK(ncclAllReduce(da, da, 1, ncclInt64, ncclSum, c2, 0) == ncclInvalidArgument);
    cudaFree(da), cudaFree(db);
}

/* ncclCommInitRank refuses, on every rank alike (no rank left waiting): another clique
 * size than MPI's world (or no MPI at all), ids that differ, two ranks asking for one
 * rank. */
static void test_init_errors(void)
{
    ncclUniqueId id;
    ncclComm_t c = NULL;
    NCCL_CHECK(ncclGetUniqueId(&id)); /* every rank its own */
    CHECK(ncclCommInitRank(&c, world + 1, id, rank) == ncclInvalidUsage && !c);
    CHECK(strstr(ncclGetLastError(NULL), with_mpi ? "MPI_COMM_WORLD" : "needs MPI"));
    if (world == 1)
        return;
    CHECK(ncclCommInitRank(&c, world, id, rank) == ncclInvalidUsage && !c);
    CHECK(strstr(ncclGetLastError(NULL), "passed another ncclUniqueId"));
    MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    CHECK(ncclCommInitRank(&c, world, id, 0) == ncclInvalidUsage && !c);
    CHECK(strstr(ncclGetLastError(NULL), "asked for the same rank as MPI process 0"));
    /* the ranks in another order: NCCL rank r is MPI rank world - 1 - r */
    NCCL_CHECK(ncclCommInitRank(&c, world, id, world - 1 - rank));
    if (!c)
        return;
    int64_t v = rank, *d = dmalloc(8 * (size_t)world);
    h2d(d + (world - 1 - rank), &v, 8);
    NCCL_CHECK(ncclAllGather(d + (world - 1 - rank), d, 1, ncclInt64, c, 0));
    int64_t *got = hmalloc(8 * (size_t)world);
    d2h(got, d, 8 * (size_t)world);
    for (int r = 0; r < world; r++)
        CHECK(got[r] == world - 1 - r);
    NCCL_CHECK(ncclCommDestroy(c));
    cudaFree(d);
    free(got);
}

/* ---- misuse that must stop the process ------------------------------------------------ */

static int fail_case(const char *name)
{
    float host[64] = {0};
    float *d = dmalloc(sizeof host), *e = dmalloc(sizeof host);
    h2d(d, host, sizeof host);
    h2d(e, host, sizeof host);
    ncclResult_t rc = ncclSuccess;
    if (!strcmp(name, "host-pointer")) /* ft-emu: ncclAllReduce: sendbuff ... */
        rc = ncclAllReduce(host, d, 64, ncclFloat32, ncclSum, comm, 0);
    else if (!strcmp(name, "host-recvbuff"))
        rc = ncclAllGather(d, host, 1, ncclFloat32, comm, 0);
    else if (!strcmp(name, "short-buffer")) { /* recvbuff one element short of 64 x world */
        float *r = dmalloc(sizeof(float) * (64 * (size_t)world - 1));
        rc = ncclAllGather(d, r, 64, ncclFloat32, comm, 0);
    } else if (!strcmp(name, "unwritten")) {
        float *fresh = dmalloc(sizeof host);
        rc = ncclAllReduce(fresh, d, 64, ncclFloat32, ncclSum, comm, 0);
    } else if (!strcmp(name, "freed")) {
        cudaFree(e);
        rc = ncclBroadcast(e, e, 64, ncclFloat32, 0, comm, 0);
    } else if (!strcmp(name, "overlap")) /* neither in place nor disjoint */
        rc = ncclAllReduce(d, d + 1, 32, ncclFloat32, ncclSum, comm, 0);
    else if (!strcmp(name, "count-mismatch"))
        rc = ncclAllReduce(d, d, 10 + (size_t)rank, ncclFloat32, ncclSum, comm, 0);
    else if (!strcmp(name, "call-mismatch"))
        rc = rank == 0 ? ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm, 0)
                       : ncclBroadcast(d, d, 8, ncclFloat32, 0, comm, 0);
    else if (!strcmp(name, "recv-longer") || !strcmp(name, "recv-shorter")) {
        /* the receive expects more (less) than was sent; the send (buffered) returns, and
         * its rank waits for the receiver, which stops */
        int longer = !strcmp(name, "recv-longer");
        if (rank == 0) {
            rc = ncclSend(d, longer ? 10 : 12, ncclFloat32, 1, comm, 0);
            MPI_Barrier(MPI_COMM_WORLD);
        } else {
            rc = ncclRecv(d, longer ? 12 : 10, ncclFloat32, 0, comm, 0);
        }
    }
    else if (!strcmp(name, "recv-self")) /* nothing was sent to itself */
        rc = ncclRecv(d, 4, ncclFloat32, rank, comm, 0);
    else if (!strcmp(name, "hang")) { /* rank 1 never joins; FT_EMU_NCCL_TIMEOUT is short */
        if (rank == 0)
            rc = ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm, 0);
        else
            MPI_Barrier(MPI_COMM_WORLD);
    } else {
        fprintf(stderr, "unknown failure case %s\n", name);
        return 2;
    }
    /* reaching here is the failure: the call should have stopped the process */
    fprintf(stderr, "test_nccl_emu --fail=%s: rank %d returned from the call (%s)\n", name, rank,
            ncclGetErrorString(rc));
    ncclCommDestroy(comm);
    if (with_mpi)
        MPI_Finalize();
    return 1;
}

/* ---- main ----------------------------------------------------------------------------- */

static int launched(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int main(int argc, char **argv)
{
    const char *fail = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--fail=", 7)) {
            fail = argv[i] + 7;
        } else {
            fprintf(stderr, "usage: test_nccl_emu [--fail=CASE]\n");
            return 2;
        }
    }
    if (launched()) {
        MPI_Init(&argc, &argv);
        with_mpi = 1;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
    }
    /* dist_nccl.c's bootstrap: rank 0 makes the id, MPI broadcasts it */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        return 1;
    if (world > 1)
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclResult_t rc = ncclCommInitRank(&comm, world, id, rank);
    if (rc != ncclSuccess) {
        fprintf(stderr, "ncclCommInitRank: %s: %s\n", ncclGetErrorString(rc), ncclGetLastError(NULL));
        printf("nccl-emu: 0 passed, 1 failed\n");
        return 1;
    }
    if (fail)
        return fail_case(fail);

    RUN(test_version_and_errors);
    RUN(test_bad_arguments);
    RUN(test_allreduce);
    RUN(test_allreduce_large);
    RUN(test_avg_is_scaled_first);
    RUN(test_bf16_rounding);
    RUN(test_reduce_scatter);
    RUN(test_allgather);
    RUN(test_broadcast);
    RUN(test_reduce);
    RUN(test_dist_nccl_groups);
    RUN(test_send_recv_ring);
    RUN(test_send_recv_many);
    RUN(test_send_recv_pairs);
    RUN(test_two_communicators);
    RUN(test_init_errors);

    CHECK(ncclCommDestroy(comm) == ncclSuccess);
    if (rank == 0)
        printf("nccl-emu (%d rank%s%s): %d passed, %d failed\n", world, world == 1 ? "" : "s",
               with_mpi ? "" : ", no MPI", passed, failed);
    if (with_mpi)
        MPI_Finalize();
    return failed ? 1 : 0;
}
