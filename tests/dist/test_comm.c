/* Every collective of dist.h between real ranks, checked against values each rank works
 * out alone: rank r's element i is a known function of (r, i), so the sum, maximum or
 * gathered blocks over the ranks follow without communication.
 *
 * Run it alone (the single backend) or under mpirun -np N. Rank 0 prints "ok <test>" or
 * "FAIL <test>" for each test (a test fails when it failed on any rank; the mismatches
 * are on stderr, with the rank) and ends with "test_comm np=N <backend>: N passed,
 * N failed". FT_DIST_CHUNK (see lib/dist/dist.c) makes the MPI calls split into chunks. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "dist/dist.h"

static ft_comm *comm;
static int rank, size;
static bool single; /* the single backend: no peers */

static const ft_comm_dtype DTYPES[] = {FT_COMM_F32, FT_COMM_F64, FT_COMM_I64, FT_COMM_BYTE};
static const char *const DT_NAMES[] = {"f32", "f64", "i64", "byte"};
/* the collectives that only move data take bf16 too */
static const ft_comm_dtype MOVED[] = {FT_COMM_F32, FT_COMM_F64, FT_COMM_I64, FT_COMM_BYTE,
                                      FT_COMM_BF16};
enum { N_MOVED = sizeof MOVED / sizeof *MOVED };
static const char *const OP_NAMES[] = {"sum", "avg", "max"};

static size_t esize(ft_comm_dtype dt)
{
    return dt == FT_COMM_F32 ? 4 : dt == FT_COMM_BYTE ? 1 : dt == FT_COMM_BF16 ? 2 : 8;
}

/* ---- the data: element i of rank r --------------------------------------------------
 * Floats are small integers (sums stay exact in f32), i64 needs all 64 bits, bytes wrap
 * when summed. All grow with r except the bytes, whose maximum is found by a loop. */
static double fval(int r, size_t i) { return (double)((r + 1) * (int)(i % 7 + 1) + (int)(i % 3)); }
static int64_t ival(int r, size_t i)
{
    return (int64_t)(r + 1) * 1000000007LL * (int64_t)(i % 5 + 1) - (int64_t)i;
}
static uint8_t bval(int r, size_t i) { return (uint8_t)(r * 37 + i * 11 + 5); }
/* bf16 bit patterns, NaN and infinity ones included: they must arrive as sent */
static uint16_t hval(int r, size_t i) { return (uint16_t)(r * 7919 + i * 31 + 3); }

/* buf[k] = rank r's element first + k */
static void fill(void *buf, ft_comm_dtype dt, int r, size_t first, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        size_t i = first + k;
        switch (dt) {
        case FT_COMM_F32:
            ((float *)buf)[k] = (float)fval(r, i);
            break;
        case FT_COMM_F64:
            ((double *)buf)[k] = fval(r, i);
            break;
        case FT_COMM_I64:
            ((int64_t *)buf)[k] = ival(r, i);
            break;
        case FT_COMM_BYTE:
            ((uint8_t *)buf)[k] = bval(r, i);
            break;
        case FT_COMM_BF16:
            ((uint16_t *)buf)[k] = hval(r, i);
            break;
        }
    }
}

/* What op over all ranks gives for elements first..first+n-1. The float sums are the
 * closed form sum_r ((r+1) a + b) = a N(N+1)/2 + N b. */
static void *expected(ft_comm_dtype dt, ft_comm_op op, size_t first, size_t n)
{
    void *out = malloc(n * esize(dt) + 1);
    double N = size;
    for (size_t k = 0; k < n; k++) {
        size_t i = first + k;
        double a = (double)(i % 7 + 1), b = (double)(i % 3);
        double fsum = a * N * (N + 1) / 2 + N * b, fmax = fval(size - 1, i);
        int64_t isum = 0;
        unsigned bsum = 0, bmax = 0;
        for (int r = 0; r < size; r++) {
            isum += ival(r, i);
            bsum += bval(r, i);
            bmax = bval(r, i) > bmax ? bval(r, i) : bmax;
        }
        switch (dt) {
        case FT_COMM_F32: {
            /* the sum is exact in f32; AVG divides it in f32 */
            float s = (float)fsum;
            ((float *)out)[k] = op == FT_COMM_MAX   ? (float)fmax
                                : op == FT_COMM_AVG ? s / (float)size
                                                    : s;
            break;
        }
        case FT_COMM_F64:
            ((double *)out)[k] = op == FT_COMM_MAX ? fmax : op == FT_COMM_AVG ? fsum / N : fsum;
            break;
        case FT_COMM_I64:
            ((int64_t *)out)[k] = op == FT_COMM_MAX ? ival(size - 1, i) : isum;
            break;
        case FT_COMM_BYTE:
            ((uint8_t *)out)[k] = (uint8_t)(op == FT_COMM_MAX ? bmax : bsum);
            break;
        case FT_COMM_BF16: /* never reduced */
            break;
        }
    }
    return out;
}

static void print_elem(char *s, size_t cap, const void *buf, ft_comm_dtype dt, size_t k)
{
    switch (dt) {
    case FT_COMM_F32:
        snprintf(s, cap, "%.9g", (double)((const float *)buf)[k]);
        break;
    case FT_COMM_F64:
        snprintf(s, cap, "%.17g", ((const double *)buf)[k]);
        break;
    case FT_COMM_I64:
        snprintf(s, cap, "%" PRId64, ((const int64_t *)buf)[k]);
        break;
    case FT_COMM_BYTE:
        snprintf(s, cap, "%u", ((const uint8_t *)buf)[k]);
        break;
    case FT_COMM_BF16:
        snprintf(s, cap, "0x%04x", ((const uint16_t *)buf)[k]);
        break;
    }
}

/* got must equal want bit for bit (every value above is exact). */
static void expect_same(const char *what, const void *got, const void *want, ft_comm_dtype dt,
                        size_t n)
{
    size_t es = esize(dt);
    for (size_t k = 0; k < n; k++)
        if (memcmp((const char *)got + k * es, (const char *)want + k * es, es)) {
            char g[64], w[64];
            print_elem(g, sizeof g, got, dt, k);
            print_elem(w, sizeof w, want, dt, k);
            fprintf(stderr, "  rank %d: %s (%s): element %zu of %zu is %s, want %s\n", rank,
                    what, DT_NAMES[dt], k, n, g, w);
            check_current_failed = 1;
            return;
        }
}

static void expect_ok(const char *what, int rc, const ft_err *err)
{
    if (rc) {
        fprintf(stderr, "  rank %d: %s failed: %s\n", rank, what, err->msg);
        check_current_failed = 1;
    }
}

static void expect_error(const char *what, int rc, const ft_err *err, const char *needle)
{
    if (rc == 0) {
        fprintf(stderr, "  rank %d: %s succeeded, want an error\n", rank, what);
        check_current_failed = 1;
    } else if (!strstr(err->msg, needle)) {
        fprintf(stderr, "  rank %d: %s: error \"%s\" does not say \"%s\"\n", rank, what,
                err->msg, needle);
        check_current_failed = 1;
    }
}

/* ---- count patterns for the v collectives ------------------------------------------ */

enum { PATTERNS = 4 };

/* 0: equal blocks; 1: uneven with zeros (odd ranks get none); 2: only the last rank has
 * data; 3: nothing at all. */
static void counts_of(int pattern, size_t *counts)
{
    for (int r = 0; r < size; r++) {
        switch (pattern) {
        case 0:
            counts[r] = 5;
            break;
        case 1:
            counts[r] = r % 2 ? 0 : (size_t)(3 * r + 2);
            break;
        case 2:
            counts[r] = r == size - 1 ? 9 : 0;
            break;
        default:
            counts[r] = 0;
        }
    }
}

static size_t offset_of(const size_t *counts, int r)
{
    size_t off = 0;
    for (int q = 0; q < r; q++)
        off += counts[q];
    return off;
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_properties(void)
{
    const char *ws = getenv("OMPI_COMM_WORLD_SIZE"), *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    CHECK(rank >= 0 && rank < size);
    CHECK(size == (ws ? atoi(ws) : 1));
    CHECK(ft_comm_local_rank(comm) == (lr ? atoi(lr) : 0));
    const char *b = ft_comm_backend(comm);
    CHECK(ws ? strcmp(b, "mpi") == 0 || strcmp(b, "nccl") == 0 : strcmp(b, "single") == 0);
    /* FT_DIST_TIMEOUT, else NCCL_TIMEOUT, else 600 s */
    const char *t = getenv("FT_DIST_TIMEOUT");
    if (!t || !*t)
        t = getenv("NCCL_TIMEOUT");
    CHECK_CLOSE(ft_comm_timeout(comm), t && *t ? atof(t) : 600.0, 1e-12);
    double old = ft_comm_timeout(comm);
    ft_comm_set_timeout(comm, 5.5);
    CHECK_CLOSE(ft_comm_timeout(comm), 5.5, 1e-12);
    ft_comm_set_timeout(comm, old);
}

static const size_t SIZES[] = {0, 1, 1000, 1 << 18};

static void allreduce_case(ft_comm_dtype dt, ft_comm_op op, size_t n)
{
    char what[96];
    snprintf(what, sizeof what, "allreduce %s n=%zu", OP_NAMES[op], n);
    void *buf = malloc(n * esize(dt) + 1), *want = expected(dt, op, 0, n);
    fill(buf, dt, rank, 0, n);
    ft_err err;
    expect_ok(what, ft_comm_allreduce(comm, n ? buf : NULL, n, dt, op, &err), &err);
    expect_same(what, buf, want, dt, n);
    free(buf);
    free(want);
}

static void test_allreduce_sum(void)
{
    for (int d = 0; d < 4; d++)
        for (size_t s = 0; s < sizeof SIZES / sizeof *SIZES; s++)
            allreduce_case(DTYPES[d], FT_COMM_SUM, SIZES[s]);
}

static void test_allreduce_avg(void)
{
    for (size_t s = 0; s < sizeof SIZES / sizeof *SIZES; s++) {
        allreduce_case(FT_COMM_F32, FT_COMM_AVG, SIZES[s]);
        allreduce_case(FT_COMM_F64, FT_COMM_AVG, SIZES[s]);
    }
    int64_t x = 1;
    uint8_t y = 1;
    ft_err err;
    expect_error("allreduce avg i64",
                 ft_comm_allreduce(comm, &x, 1, FT_COMM_I64, FT_COMM_AVG, &err), &err, "AVG");
    expect_error("allreduce avg byte",
                 ft_comm_allreduce(comm, &y, 1, FT_COMM_BYTE, FT_COMM_AVG, &err), &err, "AVG");
}

static void test_allreduce_max(void)
{
    for (int d = 0; d < 4; d++)
        for (size_t s = 0; s < sizeof SIZES / sizeof *SIZES; s++)
            allreduce_case(DTYPES[d], FT_COMM_MAX, SIZES[s]);
}

static void test_allreduce_sum_doubles(void)
{
    /* the metric reduction of ft-eval */
    double v[7];
    for (int i = 0; i < 7; i++)
        v[i] = rank + 0.5 * i;
    ft_err err;
    expect_ok("ft_comm_allreduce_sum", ft_comm_allreduce_sum(comm, v, 7, &err), &err);
    for (int i = 0; i < 7; i++)
        CHECK_CLOSE(v[i], size * (size - 1) / 2.0 + size * 0.5 * i, 0);
}

static void test_reduce_scatter_v(void)
{
    size_t *counts = calloc((size_t)size, sizeof *counts);
    for (int p = 0; p < PATTERNS; p++) {
        counts_of(p, counts);
        size_t total = offset_of(counts, size), mine = counts[rank], off = offset_of(counts, rank);
        for (int d = 0; d < 4; d++)
            for (int op = 0; op < 3; op++) {
                ft_comm_dtype dt = DTYPES[d];
                if (op == FT_COMM_AVG && (dt == FT_COMM_I64 || dt == FT_COMM_BYTE))
                    continue;
                char what[96];
                snprintf(what, sizeof what, "reduce_scatter_v %s pattern %d", OP_NAMES[op], p);
                void *send = malloc(total * esize(dt) + 1), *recv = malloc(mine * esize(dt) + 1);
                void *want = expected(dt, (ft_comm_op)op, off, mine);
                fill(send, dt, rank, 0, total);
                ft_err err;
                expect_ok(what, ft_comm_reduce_scatter_v(comm, send, recv, counts, dt,
                                                         (ft_comm_op)op, &err), &err);
                expect_same(what, recv, want, dt, mine);
                free(send);
                free(recv);
                free(want);
            }
    }
    free(counts);
}

static void test_allgather_v(void)
{
    size_t *counts = calloc((size_t)size, sizeof *counts);
    for (int p = 0; p < PATTERNS; p++) {
        counts_of(p, counts);
        size_t total = offset_of(counts, size), mine = counts[rank], off = offset_of(counts, rank);
        for (int d = 0; d < N_MOVED; d++)
            for (int in_place = 0; in_place < 2; in_place++) {
                ft_comm_dtype dt = MOVED[d];
                size_t es = esize(dt);
                char what[96];
                snprintf(what, sizeof what, "allgather_v%s pattern %d",
                         in_place ? " in place" : "", p);
                /* rank r's block holds r's elements 100.. (gathered block r = r's data) */
                char *recv = malloc(total * es + 1), *want = malloc(total * es + 1);
                char *own = malloc(mine * es + 1);
                for (int r = 0; r < size; r++)
                    fill(want + offset_of(counts, r) * es, dt, r, 100, counts[r]);
                memset(recv, 0xA5, total * es);
                fill(own, dt, rank, 100, mine);
                const void *send = own;
                if (in_place) {
                    memcpy(recv + off * es, own, mine * es);
                    send = recv + off * es;
                }
                ft_err err;
                expect_ok(what, ft_comm_allgather_v(comm, send, recv, counts, dt, &err), &err);
                expect_same(what, recv, want, dt, total);
                free(recv);
                free(want);
                free(own);
            }
    }
    free(counts);
}

static void test_broadcast(void)
{
    static const size_t ns[] = {0, 1, 1000, 100003};
    for (int root = 0; root < size; root++)
        for (int d = 0; d < N_MOVED; d++)
            for (size_t s = 0; s < sizeof ns / sizeof *ns; s++) {
                ft_comm_dtype dt = MOVED[d];
                size_t n = ns[s], es = esize(dt);
                char what[96];
                snprintf(what, sizeof what, "broadcast root %d n=%zu", root, n);
                char *buf = malloc(n * es + 1), *want = malloc(n * es + 1);
                fill(want, dt, root, 7, n);
                if (rank == root)
                    memcpy(buf, want, n * es);
                else
                    memset(buf, 0x5A, n * es);
                ft_err err;
                expect_ok(what, ft_comm_broadcast(comm, buf, n, dt, root, &err), &err);
                expect_same(what, buf, want, dt, n);
                free(buf);
                free(want);
            }
}

/* Each rank sends to the right and receives from the left; then two messages with other
 * tags, received in the opposite order of the sends (tags must tell them apart). */
static void test_send_recv_ring(void)
{
    ft_err err;
    if (single) {
        double x = 1;
        expect_error("send alone", ft_comm_send(comm, &x, 1, FT_COMM_F64, 0, 0, &err), &err,
                     "send");
        expect_error("recv alone", ft_comm_recv(comm, &x, 1, FT_COMM_F64, 0, 0, &err), &err,
                     "recv");
        return;
    }
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    enum { N = 50001 };
    double *out = malloc(N * sizeof *out), *in = malloc(N * sizeof *in);
    double *want = malloc(N * sizeof *want);
    fill(out, FT_COMM_F64, rank, 0, N);
    fill(want, FT_COMM_F64, left, 0, N);
    ft_comm_req *rs, *rr;
    expect_ok("irecv", ft_comm_irecv(comm, in, N, FT_COMM_F64, left, 7, &rr, &err), &err);
    expect_ok("isend", ft_comm_isend(comm, out, N, FT_COMM_F64, right, 7, &rs, &err), &err);
    expect_ok("wait send", ft_comm_wait(comm, rs, &err), &err);
    expect_ok("wait recv", ft_comm_wait(comm, rr, &err), &err);
    expect_same("ring", in, want, FT_COMM_F64, N);

    int64_t a = 1000 + rank, b = 2000 + rank, ga = 0, gb = 0;
    ft_comm_req *s1, *s2, *r1, *r2;
    expect_ok("isend a", ft_comm_isend(comm, &a, 1, FT_COMM_I64, right, 1, &s1, &err), &err);
    expect_ok("isend b", ft_comm_isend(comm, &b, 1, FT_COMM_I64, right, 2, &s2, &err), &err);
    expect_ok("irecv b", ft_comm_irecv(comm, &gb, 1, FT_COMM_I64, left, 2, &r2, &err), &err);
    expect_ok("irecv a", ft_comm_irecv(comm, &ga, 1, FT_COMM_I64, left, 1, &r1, &err), &err);
    expect_ok("wait r1", ft_comm_wait(comm, r1, &err), &err);
    expect_ok("wait r2", ft_comm_wait(comm, r2, &err), &err);
    expect_ok("wait s2", ft_comm_wait(comm, s2, &err), &err);
    expect_ok("wait s1", ft_comm_wait(comm, s1, &err), &err);
    CHECK(ga == 1000 + left && gb == 2000 + left);

    /* bf16 (a pipeline stage's residual stream): the bits as sent */
    uint16_t hs[33], hr[33], hw[33];
    fill(hs, FT_COMM_BF16, rank, 0, 33);
    fill(hw, FT_COMM_BF16, left, 0, 33);
    expect_ok("irecv bf16", ft_comm_irecv(comm, hr, 33, FT_COMM_BF16, left, 3, &r1, &err), &err);
    expect_ok("isend bf16", ft_comm_isend(comm, hs, 33, FT_COMM_BF16, right, 3, &s1, &err), &err);
    expect_ok("wait bf16 recv", ft_comm_wait(comm, r1, &err), &err);
    expect_ok("wait bf16 send", ft_comm_wait(comm, s1, &err), &err);
    expect_same("ring bf16", hr, hw, FT_COMM_BF16, 33);
    free(out);
    free(in);
    free(want);
}

/* Several collectives in flight at once, waited in another order than started. */
static void test_async_overlap(void)
{
    enum { NA = 5000, NB = 7, NC = 3001 };
    size_t *counts = calloc((size_t)size, sizeof *counts);
    for (int r = 0; r < size; r++)
        counts[r] = NB + (size_t)r;
    size_t total = offset_of(counts, size), off = offset_of(counts, rank);
    double *a = malloc(NA * sizeof *a);
    float *gather = malloc(total * sizeof *gather), *own = malloc(counts[rank] * sizeof *own);
    int64_t *c = malloc(NC * sizeof *c);
    double *rs_send = malloc(total * sizeof *rs_send);
    double *rs_recv = malloc(counts[rank] * sizeof *rs_recv);
    fill(a, FT_COMM_F64, rank, 0, NA);
    fill(own, FT_COMM_F32, rank, off, counts[rank]);
    fill(c, FT_COMM_I64, size - 1, 0, NC);
    if (rank != size - 1)
        memset(c, 0, NC * sizeof *c);
    fill(rs_send, FT_COMM_F64, rank, 0, total);

    ft_err err;
    ft_comm_req *ra = NULL, *rb = NULL, *rc = NULL, *rd = NULL;
    int rc_a = ft_comm_iallreduce(comm, a, NA, FT_COMM_F64, FT_COMM_SUM, &ra, &err);
    expect_ok("iallreduce", rc_a, &err);
    int rc_b = ft_comm_iallgather_v(comm, own, gather, counts, FT_COMM_F32, &rb, &err);
    expect_ok("iallgather_v", rc_b, &err);
    int rc_c = ft_comm_ibroadcast(comm, c, NC, FT_COMM_I64, size - 1, &rc, &err);
    expect_ok("ibroadcast", rc_c, &err);
    int rc_d = ft_comm_ireduce_scatter_v(comm, rs_send, rs_recv, counts, FT_COMM_F64,
                                         FT_COMM_AVG, &rd, &err);
    expect_ok("ireduce_scatter_v", rc_d, &err);
    CHECK(ra && rb && rc && rd);
    expect_ok("wait broadcast", ft_comm_wait(comm, rc, &err), &err);
    expect_ok("wait allreduce", ft_comm_wait(comm, ra, &err), &err);
    expect_ok("wait reduce_scatter", ft_comm_wait(comm, rd, &err), &err);
    expect_ok("wait allgather", ft_comm_wait(comm, rb, &err), &err);

    void *wa = expected(FT_COMM_F64, FT_COMM_SUM, 0, NA);
    expect_same("overlapped allreduce", a, wa, FT_COMM_F64, NA);
    float *wb = malloc(total * sizeof *wb);
    for (int r = 0; r < size; r++)
        fill(wb + offset_of(counts, r), FT_COMM_F32, r, offset_of(counts, r), counts[r]);
    expect_same("overlapped allgather_v", gather, wb, FT_COMM_F32, total);
    int64_t *wc = malloc(NC * sizeof *wc);
    fill(wc, FT_COMM_I64, size - 1, 0, NC);
    expect_same("overlapped broadcast", c, wc, FT_COMM_I64, NC);
    void *wd = expected(FT_COMM_F64, FT_COMM_AVG, off, counts[rank]);
    expect_same("overlapped reduce_scatter_v", rs_recv, wd, FT_COMM_F64, counts[rank]);
    free(wa), free(wb), free(wc), free(wd);
    free(a), free(gather), free(own), free(c), free(rs_send), free(rs_recv), free(counts);
}

/* ft_comm_bytes_sent grows by the ring volume of each call (dist.h). */
static void test_bytes_sent(void)
{
    double N = size, before, n = 1000;
    ft_err err;
    float *buf = calloc(4000, sizeof *buf);
    size_t *counts = calloc((size_t)size, sizeof *counts);
    for (int r = 0; r < size; r++)
        counts[r] = 100 + (size_t)r;
    double total = (double)offset_of(counts, size);

    before = ft_comm_bytes_sent(comm);
    expect_ok("allreduce", ft_comm_allreduce(comm, buf, 1000, FT_COMM_F32, FT_COMM_SUM, &err),
              &err);
    CHECK_CLOSE(ft_comm_bytes_sent(comm) - before, 2 * (N - 1) / N * n * 4, 1e-12);

    before = ft_comm_bytes_sent(comm);
    expect_ok("reduce_scatter_v", ft_comm_reduce_scatter_v(comm, buf, buf + 2000, counts,
                                                           FT_COMM_F64, FT_COMM_SUM, &err), &err);
    CHECK_CLOSE(ft_comm_bytes_sent(comm) - before, (N - 1) / N * total * 8, 1e-12);

    before = ft_comm_bytes_sent(comm);
    expect_ok("allgather_v", ft_comm_allgather_v(comm, buf + 3000, buf, counts, FT_COMM_BYTE,
                                                 &err), &err);
    CHECK_CLOSE(ft_comm_bytes_sent(comm) - before, (N - 1) / N * total * 1, 1e-12);

    before = ft_comm_bytes_sent(comm);
    expect_ok("broadcast", ft_comm_broadcast(comm, buf, 1000, FT_COMM_I64, 0, &err), &err);
    CHECK_CLOSE(ft_comm_bytes_sent(comm) - before, size > 1 ? n * 8 : 0, 1e-12);

    before = ft_comm_bytes_sent(comm);
    expect_ok("barrier", ft_comm_barrier(comm, &err), &err);
    CHECK_CLOSE(ft_comm_bytes_sent(comm) - before, 0, 1e-12);

    if (!single) {
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        ft_comm_req *rr, *rs;
        before = ft_comm_bytes_sent(comm);
        expect_ok("irecv", ft_comm_irecv(comm, buf, 300, FT_COMM_F32, left, 3, &rr, &err), &err);
        CHECK_CLOSE(ft_comm_bytes_sent(comm) - before, 0, 1e-12);
        expect_ok("isend", ft_comm_isend(comm, buf + 1000, 300, FT_COMM_F32, right, 3, &rs, &err),
                  &err);
        CHECK_CLOSE(ft_comm_bytes_sent(comm) - before, 300 * 4, 1e-12);
        expect_ok("wait", ft_comm_wait(comm, rs, &err), &err);
        expect_ok("wait", ft_comm_wait(comm, rr, &err), &err);
    }
    free(buf);
    free(counts);
}

/* ft_comm_stats_get counts the calls by kind, the bytes as ft_comm_bytes_sent and the
 * time spent in waits; ft_comm_stats_diff gives one stretch of them (dist.h). */
static void test_stats(void)
{
    ft_err err;
    float *buf = calloc(4000, sizeof *buf);
    size_t *counts = calloc((size_t)size, sizeof *counts);
    for (int r = 0; r < size; r++)
        counts[r] = 10;
    ft_comm_stats a, b, d;
    ft_comm_stats_get(comm, &a);
    double bytes0 = ft_comm_bytes_sent(comm);
    expect_ok("allreduce", ft_comm_allreduce(comm, buf, 100, FT_COMM_F32, FT_COMM_SUM, &err),
              &err);
    ft_comm_req *r1, *r2;
    expect_ok("iallreduce", ft_comm_iallreduce(comm, buf + 100, 100, FT_COMM_F32, FT_COMM_MAX,
                                               &r1, &err), &err);
    expect_ok("ireduce_scatter_v", ft_comm_ireduce_scatter_v(comm, buf + 1000, buf + 3000, counts,
                                                             FT_COMM_F32, FT_COMM_SUM, &r2, &err),
              &err);
    expect_ok("wait", ft_comm_wait(comm, r2, &err), &err);
    expect_ok("wait", ft_comm_wait(comm, r1, &err), &err);
    expect_ok("allgather_v", ft_comm_allgather_v(comm, buf + 3000, buf + 1000, counts, FT_COMM_F32,
                                                 &err), &err);
    expect_ok("broadcast", ft_comm_broadcast(comm, buf, 10, FT_COMM_F32, 0, &err), &err);
    expect_ok("barrier", ft_comm_barrier(comm, &err), &err);
    if (!single) {
        int right = (rank + 1) % size, left = (rank + size - 1) % size;
        ft_comm_req *rr, *rs;
        expect_ok("irecv", ft_comm_irecv(comm, buf, 30, FT_COMM_F32, left, 5, &rr, &err), &err);
        expect_ok("isend", ft_comm_isend(comm, buf + 500, 30, FT_COMM_F32, right, 5, &rs, &err),
                  &err);
        expect_ok("wait", ft_comm_wait(comm, rs, &err), &err);
        expect_ok("wait", ft_comm_wait(comm, rr, &err), &err);
    }
    ft_comm_stats_get(comm, &b);
    ft_comm_stats_diff(&b, &a, &d);
    CHECK(d.calls[FT_COMM_KIND_ALLREDUCE] == 2);
    CHECK(d.calls[FT_COMM_KIND_REDUCE_SCATTER] == 1);
    CHECK(d.calls[FT_COMM_KIND_ALLGATHER] == 1);
    CHECK(d.calls[FT_COMM_KIND_BROADCAST] == 1);
    CHECK(d.calls[FT_COMM_KIND_BARRIER] == 1);
    CHECK(d.calls[FT_COMM_KIND_SEND] == (single ? 0 : 1));
    CHECK(d.calls[FT_COMM_KIND_RECV] == (single ? 0 : 1));
    CHECK_CLOSE(d.bytes_sent, ft_comm_bytes_sent(comm) - bytes0, 1e-12);
    CHECK_CLOSE(b.bytes_sent, ft_comm_bytes_sent(comm), 1e-12);
    CHECK(d.wait_s >= 0 && d.wait_s <= b.wait_s && d.wait_s < 60);
    ft_comm_stats_diff(&b, &b, &d); /* in place: all zero */
    CHECK(d.bytes_sent == 0 && d.wait_s == 0 && d.calls[FT_COMM_KIND_ALLREDUCE] == 0);
    CHECK(strcmp(ft_comm_kind_name(FT_COMM_KIND_REDUCE_SCATTER), "reduce_scatter") == 0);
    CHECK(strcmp(ft_comm_kind_name(FT_COMM_KIND_BARRIER), "barrier") == 0);
    CHECK(strcmp(ft_comm_kind_name(FT_COMM_NKINDS), "?") == 0);
    free(buf);
    free(counts);
}

/* Calls that every rank makes alike and that fail before any communication. */
static void test_errors(void)
{
    ft_err err;
    double x[4] = {0};
    ft_comm_req *r = NULL;
    expect_error("broadcast root", ft_comm_broadcast(comm, x, 4, FT_COMM_F64, size, &err), &err,
                 "broadcast: root");
    expect_error("broadcast root", ft_comm_broadcast(comm, x, 4, FT_COMM_F64, -1, &err), &err,
                 "root -1");
    expect_error("null buffer", ft_comm_allreduce(comm, NULL, 4, FT_COMM_F64, FT_COMM_SUM, &err),
                 &err, "allreduce");
    expect_error("bad dtype", ft_comm_allreduce(comm, x, 4, (ft_comm_dtype)99, FT_COMM_SUM, &err),
                 &err, "dtype");
    expect_error("bad op", ft_comm_allreduce(comm, x, 4, FT_COMM_F64, (ft_comm_op)9, &err), &err,
                 "op");
    expect_error("bf16 sum", ft_comm_allreduce(comm, x, 4, FT_COMM_BF16, FT_COMM_SUM, &err),
                 &err, "bf16 values are moved, not reduced");
    expect_error("null counts", ft_comm_allgather_v(comm, x, x, NULL, FT_COMM_F64, &err), &err,
                 "counts");
    expect_error("isend peer", ft_comm_isend(comm, x, 1, FT_COMM_F64, size, 0, &r, &err), &err,
                 "send");
    expect_error("irecv peer", ft_comm_irecv(comm, x, 1, FT_COMM_F64, -2, 0, &r, &err), &err,
                 "recv");
    if (!single)
        expect_error("negative tag", ft_comm_isend(comm, x, 1, FT_COMM_F64, 0, -1, &r, &err),
                     &err, "tag");
    size_t *counts = calloc((size_t)size, sizeof *counts);
    for (int q = 0; q < size; q++)
        counts[q] = 2;
    double *big = calloc(2 * (size_t)size, sizeof *big);
    expect_error("overlap", ft_comm_reduce_scatter_v(comm, big, big, counts, FT_COMM_F64,
                                                     FT_COMM_SUM, &err), &err, "overlap");
    free(big);
    free(counts);
    expect_ok("wait NULL", ft_comm_wait(comm, NULL, &err), &err);
    /* the run still works after refused calls */
    double y = 1;
    expect_ok("allreduce after errors", ft_comm_allreduce(comm, &y, 1, FT_COMM_F64, FT_COMM_SUM,
                                                          &err), &err);
    CHECK(y == size);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Nobody leaves the barrier before the last rank enters it. */
static void test_barrier(void)
{
    ft_err err;
    expect_ok("barrier", ft_comm_barrier(comm, &err), &err);
    double t0 = now_s();
    if (rank == 0) {
        struct timespec ts = {0, 300 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    expect_ok("barrier", ft_comm_barrier(comm, &err), &err);
    if (size > 1)
        CHECK(now_s() - t0 >= 0.25);
}

/* The single backend: a run of one with no launcher. */
static void test_single(void)
{
    if (!single)
        return;
    ft_err err;
    CHECK(size == 1 && rank == 0);
    float v[3] = {1, 2, 3};
    size_t one = 3;
    float out[3] = {0};
    expect_ok("avg", ft_comm_allreduce(comm, v, 3, FT_COMM_F32, FT_COMM_AVG, &err), &err);
    CHECK(v[0] == 1 && v[1] == 2 && v[2] == 3);
    expect_ok("reduce_scatter_v copies", ft_comm_reduce_scatter_v(comm, v, out, &one, FT_COMM_F32,
                                                                  FT_COMM_SUM, &err), &err);
    CHECK(out[0] == 1 && out[1] == 2 && out[2] == 3);
    memset(out, 0, sizeof out);
    expect_ok("allgather_v copies", ft_comm_allgather_v(comm, v, out, &one, FT_COMM_F32, &err),
              &err);
    CHECK(out[0] == 1 && out[1] == 2 && out[2] == 3);
    CHECK(ft_comm_bytes_sent(comm) == 0);
}

/* A test passes when it passed on every rank. */
static void run_test(const char *name, void (*fn)(void))
{
    check_current_failed = 0;
    fn();
    int64_t failed = check_current_failed;
    ft_err err;
    if (ft_comm_allreduce(comm, &failed, 1, FT_COMM_I64, FT_COMM_MAX, &err)) {
        fprintf(stderr, "rank %d: agreeing on %s: %s\n", rank, name, err.msg);
        failed = 1;
    }
    if (failed)
        check_failed++;
    else
        check_passed++;
    if (rank == 0) {
        printf("%s %s\n", failed ? "FAIL" : "ok", name);
        fflush(stdout);
    }
}

#define TEST(fn) run_test(#fn, fn)

int main(void)
{
    ft_err err;
    if (ft_comm_init(&comm, &err)) {
        fprintf(stderr, "ft_comm_init: %s\n", err.msg);
        return 1;
    }
    rank = ft_comm_rank(comm);
    size = ft_comm_size(comm);
    single = strcmp(ft_comm_backend(comm), "single") == 0;

    TEST(test_properties);
    TEST(test_allreduce_sum);
    TEST(test_allreduce_avg);
    TEST(test_allreduce_max);
    TEST(test_allreduce_sum_doubles);
    TEST(test_reduce_scatter_v);
    TEST(test_allgather_v);
    TEST(test_broadcast);
    TEST(test_send_recv_ring);
    TEST(test_async_overlap);
    TEST(test_bytes_sent);
    TEST(test_stats);
    TEST(test_errors);
    TEST(test_barrier);
    TEST(test_single);

    char suite[64];
    snprintf(suite, sizeof suite, "test_comm np=%d %s", size, ft_comm_backend(comm));
    int rc = check_failed ? 1 : 0;
    if (rank == 0)
        check_summary(suite);
    ft_comm_finalize(comm);
    return rc;
}
