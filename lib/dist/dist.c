/* The single and MPI backends of dist.h, and what every backend shares: argument checks,
 * requests, the timed wait, FT_DIST_DEBUG logging and the byte count. The NCCL calls
 * live in dist_nccl.c; a collective goes there when NCCL is up and its buffer is on
 * the GPU.
 *
 * MPI counts are ints. Allreduce, broadcast and send/recv split a larger buffer into
 * chunks of at most INT_MAX elements (every rank splits the same n the same way, and
 * MPI matches the chunks in order). The v collectives take int counts and offsets per
 * rank, so a block or offset past INT_MAX elements is an error.
 *
 * Environment: FT_DIST_TIMEOUT (seconds; else NCCL_TIMEOUT), FT_DIST_DEBUG=1,
 * FT_DIST_BACKEND (auto, mpi or nccl), and for tests FT_DIST_CHUNK (elements per MPI
 * call, to exercise the chunking without 8 GiB buffers). */
#include "dist/dist.h"
#include "dist/dist_nccl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/numparse.h"

#ifdef FT_HAVE_MPI
#include <mpi.h>
#endif

#define DEFAULT_TIMEOUT_S 600.0

struct ft_comm {
    int rank, size, local_rank, local_size;
    bool mpi;      /* collectives go through MPI */
    bool owns_mpi; /* we called MPI_Init, so we call MPI_Finalize */
    bool debug;    /* FT_DIST_DEBUG */
    double timeout;
    size_t chunk;  /* most elements in one MPI call */
    unsigned long seq_coll, seq_p2p;
    ft_comm_stats stats; /* bytes, wait time and calls (dist.h) */
#ifdef FT_HAVE_MPI
    MPI_Op byte_sum; /* see mpi_op */
#endif
#ifdef FT_DIST_NCCL
    ft_nccl *nccl; /* NULL: device buffers are refused */
#endif
};

enum req_kind { REQ_DONE, REQ_MPI, REQ_NCCL };

struct ft_comm_req {
    const char *coll;
    unsigned long seq;
    size_t n;          /* elements (sum of the counts for the v collectives) */
    int peer, tag;     /* point to point; peer -1 for collectives */
    double t0;         /* start, for the debug log */
    enum req_kind kind;
    /* AVG over MPI: after completion divide avg_n elements of avg_buf by the size */
    void *avg_buf;
    size_t avg_n;
    ft_comm_dtype avg_dt;
#ifdef FT_HAVE_MPI
    int nmpi;
    MPI_Request *mpi;
    int *ints; /* counts and offsets MPI reads until the request completes */
#endif
#ifdef FT_DIST_NCCL
    ft_nccl_event *ev;
#endif
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static size_t dtype_size(ft_comm_dtype dt)
{
    switch (dt) {
    case FT_COMM_F32:
        return 4;
    case FT_COMM_F64:
    case FT_COMM_I64:
        return 8;
    case FT_COMM_BYTE:
        return 1;
    case FT_COMM_BF16:
        return 2;
    }
    return 0;
}

static const char *dtype_name(ft_comm_dtype dt)
{
    static const char *const names[] = {"f32", "f64", "i64", "byte", "bf16"};
    return (unsigned)dt < sizeof names / sizeof *names ? names[dt] : "?";
}

/* ---- launch detection and environment ---------------------------------------------- */

#ifdef FT_HAVE_MPI
/* Whether a launcher started this process as a rank. Slurm sets SLURM_NTASKS in the
 * whole allocation (an sbatch script too), but SLURM_PROCID is srun's per task. */
static bool launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK",
                                        "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

static int env_int(const char *name, int fallback)
{
    long x;
    return ft_parse_long(getenv(name), 0, INT_MAX, &x) ? fallback : (int)x;
}
#endif

/* The timeout: FT_DIST_TIMEOUT, else NCCL_TIMEOUT (seconds: the variable NCCL
 * troubleshooting advice exports, e.g. NCCL_TIMEOUT=1800), else the default. */
static int read_timeout(ft_comm *c, ft_err *err)
{
    static const char *const vars[] = {"FT_DIST_TIMEOUT", "NCCL_TIMEOUT"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        if (!v || !*v)
            continue;
        if (ft_parse_double(v, 0, HUGE_VAL, FT_PARSE_OPEN_MIN, &c->timeout))
            return ft_fail(err, "%s=%s: not a positive number of seconds", vars[i], v);
        return 0;
    }
    return 0;
}

static int read_env(ft_comm *c, ft_err *err)
{
    if (read_timeout(c, err))
        return -1;
    const char *v = getenv("FT_DIST_DEBUG");
    c->debug = v && *v && strcmp(v, "0") != 0;
    v = getenv("FT_DIST_CHUNK");
    if (v && *v) {
        long x;
        if (ft_parse_long(v, 1, INT_MAX, &x))
            return ft_fail(err, "FT_DIST_CHUNK=%s: not a count of elements in 1..%d", v,
                           INT_MAX);
        c->chunk = (size_t)x;
    }
    v = getenv("FT_DIST_BACKEND");
    if (v && *v && strcmp(v, "auto") && strcmp(v, "mpi") && strcmp(v, "nccl"))
        return ft_fail(err, "FT_DIST_BACKEND=%s: expected auto, mpi or nccl", v);
    return 0;
}

/* ---- MPI plumbing ------------------------------------------------------------------- */

#ifdef FT_HAVE_MPI
static int mpi_fail(ft_err *err, const char *call, int rc)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", rc);
    return ft_fail(err, "%s failed: %s", call, text);
}

/* MPI_BYTE takes no reductions; unsigned char is the same bytes and takes MAX and SUM. */
static MPI_Datatype mpi_type(ft_comm_dtype dt)
{
    switch (dt) {
    case FT_COMM_F32:
        return MPI_FLOAT;
    case FT_COMM_F64:
        return MPI_DOUBLE;
    case FT_COMM_I64:
        return MPI_INT64_T;
    case FT_COMM_BF16:
        return MPI_UINT16_T; /* the bits, moved as they are */
    case FT_COMM_BYTE:
        break;
    }
    return MPI_UNSIGNED_CHAR;
}

/* Open MPI 4.1's AVX reductions saturate 8-bit sums at 255 (open-mpi/ompi#8045, closed
 * as won't fix), so a byte SUM goes through an op of our own that wraps modulo 256, as
 * NCCL's does. */
static void byte_sum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    const unsigned char *a = in;
    unsigned char *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = (unsigned char)(a[i] + b[i]);
}

static MPI_Op mpi_op(const ft_comm *c, ft_comm_op op, ft_comm_dtype dt)
{
    if (op == FT_COMM_MAX)
        return MPI_MAX;
    return dt == FT_COMM_BYTE ? c->byte_sum : MPI_SUM;
}

static int mpi_start(ft_comm *c, ft_err *err)
{
    /* OpenMP threads compute, but only the thread that called init calls MPI */
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS)
        return ft_fail(err, "MPI_Init failed (error %d)", rc);
    c->mpi = c->owns_mpi = true;
    /* errors come back to us, to be reported with the collective's name */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    MPI_Comm node;
    rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, "MPI_Comm_split_type", rc);
    int node_rank = 0;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_size(node, &c->local_size);
    MPI_Comm_free(&node);
    rc = MPI_Op_create(byte_sum, 1, &c->byte_sum);
    if (rc != MPI_SUCCESS)
        return mpi_fail(err, "MPI_Op_create", rc);
    c->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("SLURM_LOCALID", node_rank));
    return 0;
}

/* Makes room for n MPI requests (and ints ints) in r; r->nmpi counts those started. */
static int mpi_reqs(ft_comm_req *r, size_t n, size_t ints, ft_err *err)
{
    r->mpi = malloc((n ? n : 1) * sizeof *r->mpi);
    r->ints = ints ? malloc(ints * sizeof *r->ints) : NULL;
    if (!r->mpi || (ints && !r->ints))
        return ft_fail(err, "out of memory");
    r->nmpi = 0;
    r->kind = REQ_MPI;
    return 0;
}

static size_t n_chunks(const ft_comm *c, size_t n) { return (n + c->chunk - 1) / c->chunk; }

/* The int counts (and offsets) of a v collective, or an error naming the block too big. */
static int mpi_counts(const ft_comm *c, const char *coll, const size_t *counts, int *out_counts,
                      int *out_offsets, ft_err *err)
{
    size_t off = 0;
    for (int r = 0; r < c->size; off += counts[r++]) {
        if (counts[r] > INT_MAX || off > INT_MAX)
            return ft_fail(err, "%s: rank %d's block (%zu elements at offset %zu) is past "
                                "MPI's int count limit of %d elements",
                           coll, r, counts[r], off, INT_MAX);
        out_counts[r] = (int)counts[r];
        if (out_offsets)
            out_offsets[r] = (int)off;
    }
    return 0;
}
#endif

/* ---- init and properties ------------------------------------------------------------ */

int ft_comm_init(ft_comm **out, ft_err *err)
{
    *out = NULL;
    ft_comm *c = calloc(1, sizeof *c);
    if (!c)
        return ft_fail(err, "out of memory");
    c->size = c->local_size = 1;
    c->timeout = DEFAULT_TIMEOUT_S;
    c->chunk = INT_MAX;
    const char *backend = getenv("FT_DIST_BACKEND");
    if (read_env(c, err)) {
        free(c);
        return -1;
    }
#ifdef FT_HAVE_MPI
    if (launched()) {
        /* after a failure here MPI may be up with no way back: the caller exits, and the
         * launcher takes the other ranks down */
        if (mpi_start(c, err)) {
            free(c);
            return -1;
        }
#ifdef FT_DIST_NCCL
        bool want = !backend || strcmp(backend, "mpi") != 0;
        bool required = backend && strcmp(backend, "nccl") == 0;
        if (want && ft_nccl_init(&c->nccl, c->rank, c->size, c->local_rank, c->local_size,
                                 required, err)) {
            free(c);
            return -1;
        }
        if (c->debug && c->nccl)
            fprintf(stderr, "ft: rank %d: NCCL up on GPU %d\n", c->rank,
                    ft_nccl_device(c->nccl));
#endif
    }
#ifdef FT_DIST_NCCL
    /* one process, not launched: NCCL only when asked for (a one-rank communicator, so
     * collectives on GPU buffers run through NCCL as they would on many ranks) */
    if (!c->mpi && backend && strcmp(backend, "nccl") == 0 &&
        ft_nccl_init(&c->nccl, 0, 1, 0, 1, true, err)) {
        free(c);
        return -1;
    }
#endif
#else
    const char *n = getenv("OMPI_COMM_WORLD_SIZE");
    if (!n)
        n = getenv("PMI_SIZE");
    long ranks;
    if (n && ft_parse_long(n, 2, LONG_MAX, &ranks) == 0) {
        free(c);
        return ft_fail(err, "started as one of %s ranks, but this build has no MPI (install "
                            "libopenmpi-dev and rebuild)",
                       n);
    }
#endif
    if (backend && strcmp(backend, "nccl") == 0 && strcmp(ft_comm_backend(c), "nccl") != 0) {
        free(c);
        return ft_fail(err, "FT_DIST_BACKEND=nccl, but this build has no NCCL");
    }
    *out = c;
    return 0;
}

void ft_comm_finalize(ft_comm *c)
{
    if (!c)
        return;
#ifdef FT_DIST_NCCL
    ft_nccl_finalize(c->nccl);
#endif
#ifdef FT_HAVE_MPI
    if (c->mpi)
        MPI_Op_free(&c->byte_sum);
    if (c->owns_mpi)
        MPI_Finalize();
#endif
    free(c);
}

int ft_comm_rank(const ft_comm *c) { return c->rank; }
int ft_comm_size(const ft_comm *c) { return c->size; }
int ft_comm_local_rank(const ft_comm *c) { return c->local_rank; }

const char *ft_comm_backend(const ft_comm *c)
{
#ifdef FT_DIST_NCCL
    if (c->nccl)
        return "nccl";
#endif
    return c->mpi ? "mpi" : "single";
}

void ft_comm_set_timeout(ft_comm *c, double seconds)
{
    FT_CHECK(seconds > 0);
    c->timeout = seconds;
}

double ft_comm_timeout(const ft_comm *c) { return c->timeout; }
double ft_comm_bytes_sent(const ft_comm *c) { return c->stats.bytes_sent; }

void ft_comm_stats_get(const ft_comm *c, ft_comm_stats *out) { *out = c->stats; }

/* One request of kind k started, sending bytes (by the model of ft_comm_bytes_sent). */
static void count_call(ft_comm *c, ft_comm_kind k, double bytes)
{
    c->stats.bytes_sent += bytes;
    c->stats.bytes[k] += bytes;
    c->stats.calls[k]++;
}

void ft_comm_stats_diff(const ft_comm_stats *now, const ft_comm_stats *before,
                        ft_comm_stats *out)
{
    ft_comm_stats d;
    d.bytes_sent = now->bytes_sent - before->bytes_sent;
    d.wait_s = now->wait_s - before->wait_s;
    for (int k = 0; k < FT_COMM_NKINDS; k++) {
        d.calls[k] = now->calls[k] - before->calls[k];
        d.bytes[k] = now->bytes[k] - before->bytes[k];
    }
    *out = d;
}

const char *ft_comm_kind_name(ft_comm_kind k)
{
    static const char *const names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                        "send",      "recv",           "barrier"};
    return (unsigned)k < FT_COMM_NKINDS ? names[k] : "?";
}

/* ---- requests ----------------------------------------------------------------------- */

static ft_comm_req *req_new(ft_comm *c, const char *coll, size_t n, int peer, int tag,
                            ft_err *err)
{
    ft_comm_req *r = calloc(1, sizeof *r);
    if (!r) {
        ft_fail(err, "%s: out of memory", coll);
        return NULL;
    }
    r->coll = coll;
    r->seq = peer < 0 ? ++c->seq_coll : ++c->seq_p2p;
    r->n = n;
    r->peer = peer;
    r->tag = tag;
    r->t0 = now_s();
    r->kind = REQ_DONE;
    if (c->debug) {
        if (peer < 0)
            fprintf(stderr, "ft: rank %d: start %s #%lu n=%zu\n", c->rank, coll, r->seq, n);
        else
            fprintf(stderr, "ft: rank %d: start %s #%lu n=%zu peer=%d tag=%d\n", c->rank, coll,
                    r->seq, n, peer, tag);
    }
    return r;
}

static void req_free(ft_comm_req *r)
{
#ifdef FT_HAVE_MPI
    free(r->mpi);
    free(r->ints);
#endif
#ifdef FT_DIST_NCCL
    ft_nccl_event_free(r->ev);
#endif
    free(r);
}

/* A start that failed: the message names the collective. Requests MPI or NCCL already
 * took are not freed (they cannot be cancelled); the run is expected to stop. */
static int start_fail(ft_comm_req *r, ft_err *err)
{
    ft_fail_prefix(err, "%s #%lu", r->coll, r->seq);
#ifdef FT_HAVE_MPI
    if (r->nmpi > 0) /* MPI may still use the requests and counts: leave them be */
        return -1;
#endif
    req_free(r);
    return -1;
}

/* 1 done, 0 pending, -1 failed. */
static int req_test(ft_comm *c, ft_comm_req *r, ft_err *err)
{
    (void)c;
    switch (r->kind) {
    case REQ_DONE:
        return 1;
    case REQ_MPI: {
#ifdef FT_HAVE_MPI
        int flag = 0;
        int rc = MPI_Testall(r->nmpi, r->mpi, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, "MPI_Testall", rc);
        return flag;
#else
        break;
#endif
    }
    case REQ_NCCL:
#ifdef FT_DIST_NCCL
        return ft_nccl_test(c->nccl, r->ev, err);
#else
        break;
#endif
    }
    return ft_fail(err, "request of an unknown kind");
}

static void timeout_abort(ft_comm *c, const ft_comm_req *r) __attribute__((noreturn));
static void timeout_abort(ft_comm *c, const ft_comm_req *r)
{
    fprintf(stderr,
            "ft: rank %d: %s #%lu (%zu elements) did not complete within %g s: a rank died or "
            "hangs. Rerun with FT_DIST_DEBUG=1 (and NCCL_DEBUG=INFO on GPUs) to see which rank "
            "stopped where.\n",
            c->rank, r->coll, r->seq, r->n, c->timeout);
    fflush(stderr);
#ifdef FT_DIST_NCCL
    ft_nccl_abort(c->nccl);
#endif
#ifdef FT_HAVE_MPI
    if (c->mpi)
        MPI_Abort(MPI_COMM_WORLD, 124);
#endif
    exit(124);
}

static void divide(void *buf, size_t n, ft_comm_dtype dt, int size)
{
    if (dt == FT_COMM_F32) {
        float *x = buf, d = (float)size;
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
    } else {
        double *x = buf, d = (double)size;
        for (size_t i = 0; i < n; i++)
            x[i] /= d;
    }
}

int ft_comm_wait(ft_comm *c, ft_comm_req *r, ft_err *err)
{
    if (!r)
        return 0;
    /* poll: a few tries at once (most collectives are short), then sleep 50 us doubling
     * up to 1 ms; MPI's nonblocking collectives progress inside MPI_Test */
    double start = now_s();
    long nap = 0;
    int rc;
    for (int tries = 0;; tries++) {
        rc = req_test(c, r, err);
        if (rc)
            break;
        if (now_s() - start > c->timeout)
            timeout_abort(c, r);
        if (tries >= 16) {
            nap = nap ? (nap * 2 > 1000 ? 1000 : nap * 2) : 50;
            sleep_us(nap);
        }
    }
    if (rc < 0) {
        ft_fail_prefix(err, "%s #%lu", r->coll, r->seq);
        req_free(r);
        return -1;
    }
    if (r->avg_buf)
        divide(r->avg_buf, r->avg_n, r->avg_dt, c->size);
    c->stats.wait_s += now_s() - start;
    if (c->debug)
        fprintf(stderr, "ft: rank %d: done %s #%lu n=%zu in %.3f ms\n", c->rank, r->coll, r->seq,
                r->n, 1e3 * (now_s() - r->t0));
    req_free(r);
    return 0;
}

/* ---- argument checks ---------------------------------------------------------------- */

static int check_dtype(const char *coll, ft_comm_dtype dt, ft_err *err)
{
    if (!dtype_size(dt))
        return ft_fail(err, "%s: unknown dtype %d", coll, (int)dt);
    return 0;
}

static int check_op(const char *coll, ft_comm_dtype dt, ft_comm_op op, ft_err *err)
{
    if (check_dtype(coll, dt, err))
        return -1;
    if (op != FT_COMM_SUM && op != FT_COMM_AVG && op != FT_COMM_MAX)
        return ft_fail(err, "%s: unknown op %d", coll, (int)op);
    if (dt == FT_COMM_BF16)
        return ft_fail(err, "%s: bf16 values are moved, not reduced (reduce in f32)", coll);
    if (op == FT_COMM_AVG && dt != FT_COMM_F32 && dt != FT_COMM_F64)
        return ft_fail(err, "%s: AVG takes f32 or f64, not %s", coll, dtype_name(dt));
    return 0;
}

static int check_buf(const char *coll, const char *what, const void *p, size_t n, ft_err *err)
{
    if (n && !p)
        return ft_fail(err, "%s: %s is NULL for %zu elements", coll, what, n);
    return 0;
}

/* Sum of the counts, or an error when it does not fit a size_t of bytes. */
static int sum_counts(const ft_comm *c, const char *coll, const size_t *counts,
                      ft_comm_dtype dt, size_t *total, ft_err *err)
{
    if (!counts)
        return ft_fail(err, "%s: counts is NULL", coll);
    size_t s = 0;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > SIZE_MAX / dtype_size(dt) - s)
            return ft_fail(err, "%s: the counts add up past the address space", coll);
        s += counts[r];
    }
    *total = s;
    return 0;
}

/* Where a buffer's collective runs: 1 NCCL, 0 here (MPI or single), -1 error (a GPU
 * buffer with no NCCL to take it, or send and recv on different sides). */
static int on_nccl(ft_comm *c, const char *coll, const void *a, size_t na, const void *b,
                   size_t nb, ft_err *err)
{
#ifdef FT_HAVE_CUDA
    int da = na ? ft_dist_on_device(a) : -1, db = nb ? ft_dist_on_device(b) : -1;
    if (da >= 0 && db >= 0 && da != db)
        return ft_fail(err, "%s: one buffer is on the GPU and the other in host memory", coll);
    int dev = da >= 0 ? da : db > 0;
#ifdef FT_DIST_NCCL
    if (dev && c->nccl)
        return 1;
#endif
    /* one process copies device buffers itself (see below); MPI cannot read them */
    if (dev && c->mpi)
        return ft_fail(err, "%s: the buffer is in GPU memory, but NCCL is not running "
                            "(FT_DIST_BACKEND=mpi, no NCCL in this build, or not one GPU "
                            "per rank)",
                       coll);
    return 0;
#else
    (void)c, (void)coll, (void)a, (void)na, (void)b, (void)nb, (void)err;
    return 0;
#endif
}

/* The single backend's copies: memmove, or cudaMemcpy when either side is on the GPU. */
static int copy_bytes(void *dst, const void *src, size_t bytes, ft_err *err)
{
    if (!bytes || dst == src)
        return 0;
#ifdef FT_HAVE_CUDA
    if (ft_dist_on_device(dst) || ft_dist_on_device(src))
        return ft_dist_device_copy(dst, src, bytes, err);
#else
    (void)err;
#endif
    memmove(dst, src, bytes);
    return 0;
}

/* ---- collectives -------------------------------------------------------------------- */

int ft_comm_iallreduce(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, ft_comm_op op,
                       ft_comm_req **req, ft_err *err)
{
    const char *coll = "allreduce";
    if (check_op(coll, dt, op, err) || check_buf(coll, "buf", buf, n, err))
        return -1;
    int nccl = on_nccl(c, coll, buf, n, NULL, 0, err);
    if (nccl < 0)
        return -1;
    ft_comm_req *r = req_new(c, coll, n, -1, 0, err);
    if (!r)
        return -1;
    size_t es = dtype_size(dt);
    if (nccl) {
#ifdef FT_DIST_NCCL
        if (ft_nccl_allreduce(c->nccl, buf, n, dt, op, &r->ev, err))
            return start_fail(r, err);
        r->kind = REQ_NCCL;
#endif
    } else if (c->mpi && n) {
#ifdef FT_HAVE_MPI
        size_t k = n_chunks(c, n);
        if (mpi_reqs(r, k, 0, err))
            return start_fail(r, err);
        for (size_t i = 0, off = 0; i < k; i++, off += c->chunk) {
            size_t m = n - off < c->chunk ? n - off : c->chunk;
            int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * es, (int)m, mpi_type(dt),
                                    mpi_op(c, op, dt), MPI_COMM_WORLD, &r->mpi[i]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, "MPI_Iallreduce", rc), start_fail(r, err);
            r->nmpi++;
        }
        if (op == FT_COMM_AVG) {
            r->avg_buf = buf;
            r->avg_n = n;
            r->avg_dt = dt;
        }
#endif
    }
    /* single: the sum, max and average over one rank are the buffer itself */
    count_call(c, FT_COMM_KIND_ALLREDUCE, 2.0 * (c->size - 1) / c->size * (double)(n * es));
    *req = r;
    return 0;
}

int ft_comm_ireduce_scatter_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                              ft_comm_dtype dt, ft_comm_op op, ft_comm_req **req, ft_err *err)
{
    const char *coll = "reduce_scatter_v";
    size_t total = 0;
    if (check_op(coll, dt, op, err) || sum_counts(c, coll, counts, dt, &total, err) ||
        check_buf(coll, "send", send, total, err) ||
        check_buf(coll, "recv", recv, counts[c->rank], err))
        return -1;
    size_t es = dtype_size(dt), mine = counts[c->rank], off = 0;
    for (int q = 0; q < c->rank; q++)
        off += counts[q];
    if (mine && total && (char *)recv < (const char *)send + total * es &&
        (const char *)send < (char *)recv + mine * es)
        return ft_fail(err, "%s: send and recv overlap", coll);
    int nccl = on_nccl(c, coll, send, total, recv, mine, err);
    if (nccl < 0)
        return -1;
    ft_comm_req *r = req_new(c, coll, total, -1, 0, err);
    if (!r)
        return -1;
    if (nccl) {
#ifdef FT_DIST_NCCL
        if (ft_nccl_reduce_scatter_v(c->nccl, send, recv, counts, dt, op, &r->ev, err))
            return start_fail(r, err);
        r->kind = REQ_NCCL;
#endif
    } else if (c->mpi && total) {
#ifdef FT_HAVE_MPI
        if (mpi_reqs(r, 1, (size_t)c->size, err) ||
            mpi_counts(c, coll, counts, r->ints, NULL, err))
            return start_fail(r, err);
        int rc = MPI_Ireduce_scatter(send, recv, r->ints, mpi_type(dt), mpi_op(c, op, dt),
                                     MPI_COMM_WORLD, &r->mpi[0]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, "MPI_Ireduce_scatter", rc), start_fail(r, err);
        r->nmpi = 1;
        if (op == FT_COMM_AVG) {
            r->avg_buf = recv;
            r->avg_n = mine;
            r->avg_dt = dt;
        }
#endif
    } else if (!c->mpi && copy_bytes(recv, (const char *)send + off * es, mine * es, err)) {
        return start_fail(r, err);
    }
    count_call(c, FT_COMM_KIND_REDUCE_SCATTER, (double)(c->size - 1) / c->size * (double)(total * es));
    *req = r;
    return 0;
}

int ft_comm_iallgather_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                         ft_comm_dtype dt, ft_comm_req **req, ft_err *err)
{
    const char *coll = "allgather_v";
    size_t total = 0;
    if (check_dtype(coll, dt, err) || sum_counts(c, coll, counts, dt, &total, err) ||
        check_buf(coll, "send", send, counts[c->rank], err) ||
        check_buf(coll, "recv", recv, total, err))
        return -1;
    size_t es = dtype_size(dt), mine = counts[c->rank], off = 0;
    for (int q = 0; q < c->rank; q++)
        off += counts[q];
    char *block = (char *)recv + off * es;
    int nccl = on_nccl(c, coll, recv, total, send, mine, err);
    if (nccl < 0)
        return -1;
    ft_comm_req *r = req_new(c, coll, total, -1, 0, err);
    if (!r)
        return -1;
    if (nccl) {
#ifdef FT_DIST_NCCL
        if (ft_nccl_allgather_v(c->nccl, send, recv, counts, dt, &r->ev, err))
            return start_fail(r, err);
        r->kind = REQ_NCCL;
#endif
    } else if (c->mpi && total) {
#ifdef FT_HAVE_MPI
        if (mpi_reqs(r, 1, 2 * (size_t)c->size, err) ||
            mpi_counts(c, coll, counts, r->ints, r->ints + c->size, err))
            return start_fail(r, err);
        const void *sb = (const void *)block == send ? MPI_IN_PLACE : send;
        int rc = MPI_Iallgatherv(sb, (int)mine, mpi_type(dt), recv, r->ints, r->ints + c->size,
                                 mpi_type(dt), MPI_COMM_WORLD, &r->mpi[0]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, "MPI_Iallgatherv", rc), start_fail(r, err);
        r->nmpi = 1;
#endif
    } else if (!c->mpi && copy_bytes(block, send, mine * es, err)) {
        return start_fail(r, err);
    }
    count_call(c, FT_COMM_KIND_ALLGATHER, (double)(c->size - 1) / c->size * (double)(total * es));
    *req = r;
    return 0;
}

int ft_comm_ibroadcast(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int root,
                       ft_comm_req **req, ft_err *err)
{
    const char *coll = "broadcast";
    if (check_dtype(coll, dt, err) || check_buf(coll, "buf", buf, n, err))
        return -1;
    if (root < 0 || root >= c->size)
        return ft_fail(err, "%s: root %d is not a rank of %d", coll, root, c->size);
    int nccl = on_nccl(c, coll, buf, n, NULL, 0, err);
    if (nccl < 0)
        return -1;
    ft_comm_req *r = req_new(c, coll, n, -1, 0, err);
    if (!r)
        return -1;
    size_t es = dtype_size(dt);
    if (nccl) {
#ifdef FT_DIST_NCCL
        if (ft_nccl_broadcast(c->nccl, buf, n, dt, root, &r->ev, err))
            return start_fail(r, err);
        r->kind = REQ_NCCL;
#endif
    } else if (c->mpi && n) {
#ifdef FT_HAVE_MPI
        size_t k = n_chunks(c, n);
        if (mpi_reqs(r, k, 0, err))
            return start_fail(r, err);
        for (size_t i = 0, off = 0; i < k; i++, off += c->chunk) {
            size_t m = n - off < c->chunk ? n - off : c->chunk;
            int rc = MPI_Ibcast((char *)buf + off * es, (int)m, mpi_type(dt), root,
                                MPI_COMM_WORLD, &r->mpi[i]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, "MPI_Ibcast", rc), start_fail(r, err);
            r->nmpi++;
        }
#endif
    }
    /* a ring (pipelined chain) broadcast forwards all n through every rank; alone, no one */
    count_call(c, FT_COMM_KIND_BROADCAST, c->size > 1 ? (double)(n * es) : 0);
    *req = r;
    return 0;
}

/* Point to point: send (is_send) or receive n elements. A message of zero elements is
 * not sent at all (both sides know n). */
static int p2p(ft_comm *c, bool is_send, void *buf, size_t n, ft_comm_dtype dt, int peer,
               int tag, ft_comm_req **req, ft_err *err)
{
    const char *coll = is_send ? "send" : "recv";
    if (check_dtype(coll, dt, err) || check_buf(coll, "buf", buf, n, err))
        return -1;
    if (!c->mpi)
        return ft_fail(err, "%s: a single process has no peer to %s", coll,
                       is_send ? "send to" : "receive from");
    if (peer < 0 || peer >= c->size)
        return ft_fail(err, "%s: peer %d is not a rank of %d", coll, peer, c->size);
    if (tag < 0)
        return ft_fail(err, "%s: tag %d is negative", coll, tag);
    int nccl = on_nccl(c, coll, buf, n, NULL, 0, err);
    if (nccl < 0)
        return -1;
    ft_comm_req *r = req_new(c, coll, n, peer, tag, err);
    if (!r)
        return -1;
    size_t es = dtype_size(dt);
    if (nccl) {
#ifdef FT_DIST_NCCL
        int rc = is_send ? ft_nccl_send(c->nccl, buf, n, dt, peer, &r->ev, err)
                         : ft_nccl_recv(c->nccl, buf, n, dt, peer, &r->ev, err);
        if (rc)
            return start_fail(r, err);
        r->kind = REQ_NCCL;
#endif
    } else if (n) {
#ifdef FT_HAVE_MPI
        size_t k = n_chunks(c, n);
        if (mpi_reqs(r, k, 0, err))
            return start_fail(r, err);
        for (size_t i = 0, off = 0; i < k; i++, off += c->chunk) {
            size_t m = n - off < c->chunk ? n - off : c->chunk;
            char *p = (char *)buf + off * es;
            int rc = is_send ? MPI_Isend(p, (int)m, mpi_type(dt), peer, tag, MPI_COMM_WORLD,
                                         &r->mpi[i])
                             : MPI_Irecv(p, (int)m, mpi_type(dt), peer, tag, MPI_COMM_WORLD,
                                         &r->mpi[i]);
            if (rc != MPI_SUCCESS)
                return mpi_fail(err, is_send ? "MPI_Isend" : "MPI_Irecv", rc),
                       start_fail(r, err);
            r->nmpi++;
        }
#endif
    }
    count_call(c, is_send ? FT_COMM_KIND_SEND : FT_COMM_KIND_RECV, is_send ? (double)(n * es) : 0);
    *req = r;
    return 0;
}

int ft_comm_isend(ft_comm *c, const void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                  ft_comm_req **req, ft_err *err)
{
    /* p2p never writes a buffer it sends */
    return p2p(c, true, (void *)buf, n, dt, peer, tag, req, err);
}

int ft_comm_irecv(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                  ft_comm_req **req, ft_err *err)
{
    return p2p(c, false, buf, n, dt, peer, tag, req, err);
}

/* ---- blocking forms ----------------------------------------------------------------- */

int ft_comm_allreduce(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, ft_comm_op op,
                      ft_err *err)
{
    ft_comm_req *r = NULL;
    return ft_comm_iallreduce(c, buf, n, dt, op, &r, err) ? -1 : ft_comm_wait(c, r, err);
}

int ft_comm_reduce_scatter_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                             ft_comm_dtype dt, ft_comm_op op, ft_err *err)
{
    ft_comm_req *r = NULL;
    return ft_comm_ireduce_scatter_v(c, send, recv, counts, dt, op, &r, err)
               ? -1
               : ft_comm_wait(c, r, err);
}

int ft_comm_allgather_v(ft_comm *c, const void *send, void *recv, const size_t *counts,
                        ft_comm_dtype dt, ft_err *err)
{
    ft_comm_req *r = NULL;
    return ft_comm_iallgather_v(c, send, recv, counts, dt, &r, err) ? -1
                                                                     : ft_comm_wait(c, r, err);
}

int ft_comm_broadcast(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int root, ft_err *err)
{
    ft_comm_req *r = NULL;
    return ft_comm_ibroadcast(c, buf, n, dt, root, &r, err) ? -1 : ft_comm_wait(c, r, err);
}

int ft_comm_send(ft_comm *c, const void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                 ft_err *err)
{
    ft_comm_req *r = NULL;
    return ft_comm_isend(c, buf, n, dt, peer, tag, &r, err) ? -1 : ft_comm_wait(c, r, err);
}

int ft_comm_recv(ft_comm *c, void *buf, size_t n, ft_comm_dtype dt, int peer, int tag,
                 ft_err *err)
{
    ft_comm_req *r = NULL;
    return ft_comm_irecv(c, buf, n, dt, peer, tag, &r, err) ? -1 : ft_comm_wait(c, r, err);
}

int ft_comm_barrier(ft_comm *c, ft_err *err)
{
    ft_comm_req *r = req_new(c, "barrier", 0, -1, 0, err);
    if (!r)
        return -1;
#ifdef FT_HAVE_MPI
    if (c->mpi) {
        if (mpi_reqs(r, 1, 0, err))
            return start_fail(r, err);
        int rc = MPI_Ibarrier(MPI_COMM_WORLD, &r->mpi[0]);
        if (rc != MPI_SUCCESS)
            return mpi_fail(err, "MPI_Ibarrier", rc), start_fail(r, err);
        r->nmpi = 1;
    }
#endif
    c->stats.calls[FT_COMM_KIND_BARRIER]++;
    return ft_comm_wait(c, r, err);
}

int ft_comm_allreduce_sum(ft_comm *c, double *buf, size_t n, ft_err *err)
{
    return ft_comm_allreduce(c, buf, n, FT_COMM_F64, FT_COMM_SUM, err);
}

void ft_comm_abort(ft_comm *c, int rc, const char *msg)
{
    if (msg && *msg)
        fprintf(stderr, "%s%s", msg, msg[strlen(msg) - 1] == '\n' ? "" : "\n");
    fflush(stderr);
#ifdef FT_DIST_NCCL
    if (c)
        ft_nccl_abort(c->nccl);
#endif
#ifdef FT_HAVE_MPI
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down)
        MPI_Abort(MPI_COMM_WORLD, rc);
#endif
    (void)c;
    exit(rc);
}
