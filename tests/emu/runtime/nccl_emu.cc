/* NCCL on the emulated CUDA device (make CUDA=emu), over MPI: tests/emu/include/nccl.h's
 * calls, for lib/dist/dist_nccl.c and the GPU tier's tests run without a GPU.
 *
 * Ranks and communicators. Each process is one rank. A communicator of one rank needs no
 * MPI (a single process, launched or not, as dist_nccl.c makes it). A communicator of
 * N > 1 ranks is bootstrapped as dist_nccl.c does it: rank 0 calls ncclGetUniqueId, MPI
 * broadcasts the id, every rank calls ncclCommInitRank(N, id, rank). N must be the size
 * of MPI_COMM_WORLD (the emulation cannot see which processes would form a smaller
 * clique); ncclCommInitRank duplicates MPI_COMM_WORLD for the communicator (ordered by
 * the NCCL rank), so its traffic never mixes with the MPI backend's or another
 * communicator's, checks that every rank passed the same id and a distinct rank, and
 * fails (ncclInvalidUsage, ncclGetLastError says why) on every rank alike otherwise.
 *
 * Streams and groups. Each call runs when it is called (a group: at its outermost
 * ncclGroupEnd) and has completed when it returns. With FT_EMU_ASYNC=1, where the
 * runtime queues the work of a stream (tests/emu/runtime/queue.cc), the work queued on
 * the call's stream (and what it follows) runs first (ft_emu_stream_flush), so the
 * collective sees what precedes it in stream order; the collective itself is not queued
 * (its MPI traffic cannot wait for a later host call of this rank while the peers wait
 * for it), so a missing wait for a collective's result does not show here. Calls between ncclGroupStart and ncclGroupEnd are queued and
 * run at the outermost ncclGroupEnd, as NCCL launches a group: first every send of the
 * group is posted, then the receives, then the group's collectives in the order they
 * were called, then the receives are waited for; so any set of sends and receives in one
 * group completes without deadlock (a ring, both directions at once, several messages to
 * one peer, to itself). Sends are buffered: the data is copied when the send runs and
 * leaves in the background, so a send never blocks (on a GPU it would block the stream
 * until the peer receives; two ranks that both send first outside a group wait for ever
 * there, not here). A receive outside a group blocks until its message arrives, which
 * on a GPU would block only the stream: a receive must not wait on host work that the
 * sending rank does after its own later calls. Messages between two ranks match in the
 * order they were posted (NCCL has no tags). A call waiting longer than
 * FT_EMU_NCCL_TIMEOUT seconds (default 600) stops the process, naming the call.
 *
 * Collectives map onto MPI as follows (T: a type of the element's size; the data is moved
 * as bits and reduced here, never by MPI, so that every rank gets the same bits):
 *   ncclAllReduce      MPI_Ialltoallv of N balanced blocks (rank r receives block r from
 *                      every rank), rank r reduces its block, MPI_Iallgatherv of the
 *                      reduced blocks: a ring's reduce-scatter then allgather;
 *   ncclReduceScatter  MPI_Ialltoall of the recvcount blocks, each rank reduces its own;
 *   ncclReduce         MPI_Igather to the root, which reduces;
 *   ncclAllGather      MPI_Iallgather (MPI_IN_PLACE in place);
 *   ncclBroadcast      MPI_Ibcast from the root's recvbuff (its sendbuff copied first);
 *   ncclSend/ncclRecv  MPI_Isend of a copy / MPI_Irecv into the buffer, on one tag.
 * Before each collective the ranks exchange (MPI_Iallgather) what they called: the call,
 * count, datatype, op and root. NCCL leaves a difference undefined (on a GPU: a hang or
 * wrong data); here every rank stops with both calls in the message.
 *
 * Reductions, as NCCL defines them per element:
 *   ncclSum, ncclProd  in the datatype's own arithmetic, one rounding per operation; the
 *                      emulation adds in rank order, ((x0 + x1) + x2) + ... (NCCL promises
 *                      no order: a ring starts each chunk at another rank, a tree or NVLS
 *                      groups otherwise; any order is one NCCL may use). Integers wrap.
 *   ncclMax, ncclMin   fmax/fmin for floating types (a NaN loses to a number), integers
 *                      by value.
 *   ncclAvg            NCCL's ncclDevPreMulSum for floating types: each rank's value is
 *                      multiplied by s = 1/N rounded to the datatype (fp32:
 *                      (float)(1.0 / N); fp16 and bf16: that float rounded again; fp64:
 *                      1.0 / N), the product rounded to the datatype, and the products
 *                      are summed as ncclSum sums. So it scales first: for N = 3, s and
 *                      every product are rounded and the result may differ from sum / N
 *                      in the last bits (by at most about (N + 1) units of roundoff of the
 *                      sum of |x_r| / N); for N a power of two s is exact. Integer types:
 *                      ncclDevSumPostDiv, the (wrapping) sum divided by N, rounded toward
 *                      zero.
 *   fp16, bf16         every operation on the values converted to fp32, its result rounded
 *                      to the datatype (round to nearest even), as NCCL's __hadd/__hmul or
 *                      their fp32 fallbacks do; partial sums travel between GPUs in the
 *                      datatype, so a sum of N > 2 values is rounded N - 1 times, not once.
 *                      (fp32 holds the exact result of one such operation well enough that
 *                      rounding it again to 8 or 11 bits is the correctly rounded result.)
 *   fp8 types          moved only: a reduction of them is refused (ncclInvalidArgument).
 *
 * Checks (the emulated device's contract, tests/emu/include/ft_emu.h): every buffer a call
 * uses must lie in live device memory for its whole count x element size
 * (ft_emu_check_device; recvbuff of ncclReduce and sendbuff of ncclBroadcast only on the
 * root, where NCCL uses them), and the data a call reads must not hold the never-written
 * poison (ft_emu_check_written; floating types only: for integers all-ones bits are a
 * value). sendbuff and recvbuff may be equal (in place; for ncclAllGather sendbuff may be
 * recvbuff + rank * sendcount, for ncclReduceScatter recvbuff may be sendbuff + rank *
 * recvcount, the in-place forms NCCL defines) or disjoint; any other overlap stops the
 * process. Bad arguments (NULL or destroyed comm, root or peer out of range, unknown
 * datatype or op) return ncclInvalidArgument with ncclGetLastError saying why, as NCCL
 * does. NCCL_DEBUG=WARN prints those errors, NCCL_DEBUG=INFO every call as it runs.
 *
 * One MPI call moves at most INT_MAX elements; larger calls stop the process. */
/* MPI's C API only (no C++ bindings, no libmpi_cxx) */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include "ft_emu.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <strings.h>
#include <time.h>
#include <unistd.h>

namespace {

/* ---- errors and logging ----------------------------------------------------------- */

thread_local char last_error[1024];

int debug_level(void) /* 0 none, 1 WARN, 2 INFO (or TRACE) */
{
    static int level = -1;
    if (level < 0) {
        const char *v = getenv("NCCL_DEBUG");
        level = !v || !*v                                             ? 0
                : !strcasecmp(v, "INFO") || !strcasecmp(v, "TRACE") ? 2
                : !strcasecmp(v, "WARN")                            ? 1
                                                                    : 0;
    }
    return level;
}

__attribute__((format(printf, 2, 3))) ncclResult_t fail(ncclResult_t rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    if (debug_level() >= 1)
        fprintf(stderr, "NCCL WARN (ft-emu) %s\n", last_error);
    return rc;
}

double timeout_s(void)
{
    static double t = -1;
    if (t < 0) {
        const char *v = getenv("FT_EMU_NCCL_TIMEOUT");
        char *end = NULL;
        double x = v && *v ? strtod(v, &end) : 0;
        t = v && *v && end && !*end && x > 0 ? x : 600;
    }
    return t;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string mpi_text(int rc)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    return text;
}

bool mpi_up(void)
{
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    return up && !down;
}

/* ---- datatypes and ops ------------------------------------------------------------ */

const char *type_name(int t)
{
    static const char *names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",      "ncclUint32",
                                  "ncclInt64",   "ncclUint64",  "ncclFloat16",    "ncclFloat32",
                                  "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
    return t >= 0 && t < (int)ncclNumTypes ? names[t] : "(bad datatype)";
}

const char *op_name(int op)
{
    static const char *names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
    return op >= 0 && op < (int)ncclNumOps ? names[op] : op == -1 ? "(no op)" : "(bad op)";
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* The element size ft_emu_check_written takes for this type, or 0: no check (integers
 * and fp8, whose all-ones bits are values). */
int poison_size(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclFloat32:
        return 4;
    case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

MPI_Datatype mpi_elem(size_t es)
{
    return es == 1 ? MPI_BYTE : es == 2 ? MPI_UINT16_T : es == 4 ? MPI_UINT32_T : MPI_UINT64_T;
}

/* fp16 and bf16: bits <-> float, round to nearest even. */
float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it one, quiet */
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in fp32 */
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    u = e == 31 ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf, NaN (quiet) */
        return (uint16_t)(sign | 0x7c00 | (a > 0x7f800000u ? 0x200 | ((a >> 13) & 0x3ff) : 0));
    if (a >= 0x477ff000u) /* >= 65520: rounds to inf */
        return (uint16_t)(sign | 0x7c00);
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half, in units of 2^-24 (exact
                            * scaling; nearbyint rounds to even) */
        float v = ldexpf(fabsf(f), 24);
        return (uint16_t)(sign | (uint16_t)nearbyintf(v));
    }
    uint32_t r = a - (112u << 23); /* rebias the exponent, round 23 -> 10 bits */
    r += 0xfffu + ((r >> 13) & 1);
    return (uint16_t)(sign | (r >> 13));
}

/* A value the compiler must materialize, so that x * s + acc is never fused into one
 * rounding (an FMA): NCCL rounds the product, then the sum. */
template <class V> inline V opaque(V v)
{
    __asm__ volatile("" : "+m"(v));
    return v;
}

/* Element access and arithmetic per datatype: V is the type values are computed in,
 * round() brings a V back to what the datatype can hold. */
template <class T> struct IntType {
    using V = T;
    using U = typename std::make_unsigned<T>::type;
    static const bool floating = false;
    static V get(const char *p, size_t i)
    {
        T v;
        memcpy(&v, p + i * sizeof(T), sizeof(T));
        return v;
    }
    static void put(char *p, size_t i, V v) { memcpy(p + i * sizeof(T), &v, sizeof(T)); }
    static V add(V a, V b) { return (V)(U)((U)a + (U)b); }
    static V mul(V a, V b) { return (V)(U)((U)a * (U)b); }
    static V max(V a, V b) { return a > b ? a : b; }
    static V min(V a, V b) { return a < b ? a : b; }
    static V scale(int n) { return (V)n; }
};

template <class T> struct FloatType {
    using V = T;
    static const bool floating = true;
    static V get(const char *p, size_t i)
    {
        T v;
        memcpy(&v, p + i * sizeof(T), sizeof(T));
        return v;
    }
    static void put(char *p, size_t i, V v) { memcpy(p + i * sizeof(T), &v, sizeof(T)); }
    static V round(V v) { return v; }
    static V add(V a, V b) { return opaque<V>(a + b); }
    static V mul(V a, V b) { return opaque<V>(a * b); }
    static V max(V a, V b) { return std::fmax(a, b); }
    static V min(V a, V b) { return std::fmin(a, b); }
    /* 1/N as NCCL's hostToDevRedOp makes it: float(1.0/N) for fp32, 1.0/N for fp64 */
    static V scale(int n) { return (V)(1.0 / n); }
};

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)> struct Half16 {
    using V = float;
    static const bool floating = true;
    static V get(const char *p, size_t i)
    {
        uint16_t h;
        memcpy(&h, p + i * 2, 2);
        return ToF(h);
    }
    static void put(char *p, size_t i, V v)
    {
        uint16_t h = FromF(v);
        memcpy(p + i * 2, &h, 2);
    }
    static V round(V v) { return ToF(FromF(v)); }
    static V add(V a, V b) { return round(opaque<V>(a + b)); }
    static V mul(V a, V b) { return round(opaque<V>(a * b)); }
    static V max(V a, V b) { return std::fmax(a, b); }
    static V min(V a, V b) { return std::fmin(a, b); }
    static V scale(int n) { return round((float)(1.0 / n)); }
};

using Fp16 = Half16<f16_to_f32, f32_to_f16>;
using Bf16 = Half16<bf16_to_f32, f32_to_bf16>;

/* out[i] = op over r = 0..n-1 (in that order) of the element i of contribution r, which
 * starts at in + r * stride; out may be in (n == 1, in place). */
template <class Ty>
void reduce_typed(ncclRedOp_t op, int n, const char *in, size_t stride, size_t count, char *out)
{
    using V = typename Ty::V;
    if (op == ncclAvg && Ty::floating) { /* ncclDevPreMulSum: scale each value, then sum */
        const V s = Ty::scale(n);
        for (size_t i = 0; i < count; i++) {
            V acc = Ty::mul(Ty::get(in, i), s);
            for (int r = 1; r < n; r++)
                acc = Ty::add(acc, Ty::mul(Ty::get(in + r * stride, i), s));
            Ty::put(out, i, acc);
        }
        return;
    }
    for (size_t i = 0; i < count; i++) {
        V acc = Ty::get(in, i);
        for (int r = 1; r < n; r++) {
            V x = Ty::get(in + r * stride, i);
            switch (op) {
            case ncclProd:
                acc = Ty::mul(acc, x);
                break;
            case ncclMax:
                acc = Ty::max(acc, x);
                break;
            case ncclMin:
                acc = Ty::min(acc, x);
                break;
            default: /* ncclSum, and the integer ncclAvg's sum */
                acc = Ty::add(acc, x);
                break;
            }
        }
        if (op == ncclAvg) /* integers: ncclDevSumPostDiv, C's division (toward zero) */
            acc = (V)(acc / Ty::scale(n));
        Ty::put(out, i, acc);
    }
}

void reduce(ncclDataType_t t, ncclRedOp_t op, int n, const void *in, size_t stride,
            size_t count, void *out)
{
    const char *i = (const char *)in;
    char *o = (char *)out;
    switch (t) {
    case ncclInt8:
        return reduce_typed<IntType<int8_t>>(op, n, i, stride, count, o);
    case ncclUint8:
        return reduce_typed<IntType<uint8_t>>(op, n, i, stride, count, o);
    case ncclInt32:
        return reduce_typed<IntType<int32_t>>(op, n, i, stride, count, o);
    case ncclUint32:
        return reduce_typed<IntType<uint32_t>>(op, n, i, stride, count, o);
    case ncclInt64:
        return reduce_typed<IntType<int64_t>>(op, n, i, stride, count, o);
    case ncclUint64:
        return reduce_typed<IntType<uint64_t>>(op, n, i, stride, count, o);
    case ncclFloat16:
        return reduce_typed<Fp16>(op, n, i, stride, count, o);
    case ncclFloat32:
        return reduce_typed<FloatType<float>>(op, n, i, stride, count, o);
    case ncclFloat64:
        return reduce_typed<FloatType<double>>(op, n, i, stride, count, o);
    case ncclBfloat16:
        return reduce_typed<Bf16>(op, n, i, stride, count, o);
    default: /* fp8: refused when the call was made */
        ft_emu_abort("nccl", "internal error: a reduction of %s", type_name(t));
    }
}

} /* namespace */

/* ---- communicators ---------------------------------------------------------------- */

struct ncclComm {
    int rank, nranks, device;
    MPI_Comm mpi; /* MPI_COMM_NULL for one rank */
    unsigned long seq; /* collectives run so far (for messages) */
    std::deque<std::vector<char>> to_self; /* sends to this rank not yet received */
    struct Send {
        MPI_Request req;
        std::vector<char> data;
    };
    std::deque<Send> sends; /* buffered sends still leaving */
};

namespace {

const int P2P_TAG = 7;
const char ID_MAGIC[16] = "ft-emu-nccl-id";

std::set<ncclComm *> &live_comms(void)
{
    static std::set<ncclComm *> s;
    return s;
}

ncclResult_t check_comm(const char *call, ncclComm_t comm)
{
    if (!comm)
        return fail(ncclInvalidArgument, "%s : comm argument is NULL", call);
    if (!live_comms().count(comm))
        return fail(ncclInvalidArgument,
                    "%s : comm %p is not a live communicator (destroyed, aborted or never "
                    "initialized)",
                    call, (void *)comm);
    return ncclSuccess;
}

/* Waits for req, polling, so that a wait that never ends stops the process with the call
 * named (a peer that died, hangs or made another call); returns MPI's code (an error of
 * the request itself, e.g. a message longer than the receive). */
int wait_req(MPI_Request *req, MPI_Status *st, const char *call, const ncclComm *c,
             const char *what)
{
    double start = 0;
    for (long spins = 0;; spins++) {
        int done = 0;
        int rc = MPI_Test(req, &done, st);
        if (rc != MPI_SUCCESS || done)
            return rc;
        if (spins == 1000)
            start = now_s();
        if (spins > 1000) {
            if (now_s() - start > timeout_s())
                ft_emu_abort(call,
                             "rank %d: %s did not complete within %g s (FT_EMU_NCCL_TIMEOUT): "
                             "a peer died, hangs, or made another call",
                             c->rank, what, timeout_s());
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
}

void wait_ok(MPI_Request *req, MPI_Status *st, const char *call, const ncclComm *c,
             const char *what)
{
    int rc = wait_req(req, st, call, c, what);
    if (rc != MPI_SUCCESS)
        ft_emu_abort(call, "rank %d: %s failed: %s", c->rank, what, mpi_text(rc).c_str());
}

void mpi_ok(int rc, const char *call, const ncclComm *c, const char *what)
{
    if (rc != MPI_SUCCESS)
        ft_emu_abort(call, "rank %d: %s failed: %s", c->rank, what, mpi_text(rc).c_str());
}

/* Buffered sends that have left are dropped. */
void progress_sends(ncclComm *c)
{
    while (!c->sends.empty()) {
        int done = 0;
        mpi_ok(MPI_Test(&c->sends.front().req, &done, MPI_STATUS_IGNORE), "ncclSend", c,
               "MPI_Test of a send");
        if (!done)
            return;
        c->sends.pop_front();
    }
}

int fits_int(size_t n) { return n <= (size_t)INT_MAX; }

/* ---- calls and their checks ------------------------------------------------------- */

enum Kind { ALLREDUCE, REDUCESCATTER, ALLGATHER, BROADCAST, REDUCE, SEND, RECV };
const char *kind_name(int k)
{
    static const char *names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather",
                                  "ncclBroadcast", "ncclReduce",        "ncclSend",
                                  "ncclRecv"};
    return k >= 0 && k <= RECV ? names[k] : "(unknown call)";
}

struct Call {
    Kind kind;
    const void *send;
    void *recv;
    size_t count; /* per NCCL's argument: recvcount, sendcount, count */
    ncclDataType_t type;
    ncclRedOp_t op; /* -1 for moves */
    int root;       /* root or peer; -1 when none */
    ncclComm *comm;
    cudaStream_t stream;
};

struct Group {
    int depth = 0;
    ncclResult_t error = ncclSuccess;
    std::vector<Call> calls;
};
thread_local Group group;

bool overlap(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

/* NCCL's argument checks (ncclInvalidArgument, as NCCL returns them), then the emulated
 * device's checks of the buffers (which stop the process, as compute-sanitizer would). */
ncclResult_t check_call(const Call &k)
{
    const char *call = kind_name(k.kind);
    ncclResult_t rc = check_comm(call, k.comm);
    if (rc != ncclSuccess)
        return rc;
    const ncclComm *c = k.comm;
    if ((int)k.type < 0 || (int)k.type >= (int)ncclNumTypes)
        return fail(ncclInvalidArgument, "%s : invalid type %d", call, (int)k.type);
    bool reducing = k.kind == ALLREDUCE || k.kind == REDUCESCATTER || k.kind == REDUCE;
    if (reducing) {
        if ((int)k.op < 0 || (int)k.op >= (int)ncclNumOps)
            return fail(ncclInvalidArgument, "%s : invalid reduction operation %d", call,
                        (int)k.op);
        if (k.type == ncclFloat8e4m3 || k.type == ncclFloat8e5m2)
            return fail(ncclInvalidArgument, "%s : reductions of %s are not emulated (only moves)",
                        call, type_name(k.type));
    }
    if ((k.kind == BROADCAST || k.kind == REDUCE) && (k.root < 0 || k.root >= c->nranks))
        return fail(ncclInvalidArgument, "%s : invalid root %d (root should be in the 0..%d range)",
                    call, k.root, c->nranks - 1);
    if ((k.kind == SEND || k.kind == RECV) && (k.root < 0 || k.root >= c->nranks))
        return fail(ncclInvalidArgument, "%s : invalid peer %d (peer should be in the 0..%d range)",
                    call, k.root, c->nranks - 1);
    size_t es = type_size(k.type), n = (size_t)c->nranks;
    if (k.count > SIZE_MAX / es / n)
        return fail(ncclInvalidArgument, "%s : count %zu is too large", call, k.count);
    if (k.count == 0)
        return ncclSuccess;

    size_t bytes = k.count * es;
    size_t sbytes = k.kind == REDUCESCATTER ? bytes * n : bytes;
    size_t rbytes = k.kind == ALLGATHER ? bytes * n : bytes;
    bool is_root = c->rank == k.root;
    bool reads = k.kind != RECV && !(k.kind == BROADCAST && !is_root);
    bool writes = k.kind != SEND && !(k.kind == REDUCE && !is_root);
    if (reads)
        ft_emu_check_device(k.send, sbytes, call, "sendbuff");
    if (writes)
        ft_emu_check_device(k.recv, rbytes, call, "recvbuff");
    if (reads && writes && k.send != k.recv) {
        const char *form = "sendbuff == recvbuff";
        bool in_place = false;
        if (k.kind == ALLGATHER) {
            form = "sendbuff == recvbuff + rank * sendcount";
            in_place = (const char *)k.send == (const char *)k.recv + (size_t)c->rank * bytes;
        } else if (k.kind == REDUCESCATTER) {
            form = "recvbuff == sendbuff + rank * recvcount";
            in_place = (const char *)k.recv == (const char *)k.send + (size_t)c->rank * bytes;
        }
        if (!in_place && overlap(k.send, sbytes, k.recv, rbytes))
            ft_emu_abort(call,
                         "rank %d: sendbuff %p (%zu bytes) and recvbuff %p (%zu bytes) overlap, "
                         "but not in the in-place form NCCL defines (%s)",
                         c->rank, k.send, sbytes, k.recv, rbytes, form);
    }
    return ncclSuccess;
}

void describe(char *out, size_t cap, const int64_t *d)
{
    int kind = (int)d[0];
    int n = snprintf(out, cap, "%s(count %lld, %s", kind_name(kind), (long long)d[1],
                     type_name((int)d[2]));
    if (d[3] >= 0 && n > 0 && (size_t)n < cap)
        n += snprintf(out + n, cap - n, ", %s", op_name((int)d[3]));
    if (d[4] >= 0 && n > 0 && (size_t)n < cap)
        n += snprintf(out + n, cap - n, ", root %lld", (long long)d[4]);
    if (n > 0 && (size_t)n < cap)
        snprintf(out + n, cap - n, ")");
}

/* Every rank tells the others what it called; any difference stops every rank. */
void agree(const Call &k)
{
    const char *call = kind_name(k.kind);
    ncclComm *c = k.comm;
    bool reducing = k.kind == ALLREDUCE || k.kind == REDUCESCATTER || k.kind == REDUCE;
    bool rooted = k.kind == BROADCAST || k.kind == REDUCE;
    int64_t mine[5] = {(int64_t)k.kind, (int64_t)k.count, (int64_t)k.type,
                       reducing ? (int64_t)k.op : -1, rooted ? (int64_t)k.root : -1};
    std::vector<int64_t> all(5 * (size_t)c->nranks);
    MPI_Request req;
    mpi_ok(MPI_Iallgather(mine, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, c->mpi, &req), call,
           c, "MPI_Iallgather of the call's arguments");
    wait_ok(&req, MPI_STATUS_IGNORE, call, c, "the exchange of the call's arguments");
    for (int r = 0; r < c->nranks; r++) {
        if (memcmp(&all[5 * (size_t)r], mine, sizeof mine) == 0)
            continue;
        char a[160], b[160];
        describe(a, sizeof a, mine);
        describe(b, sizeof b, &all[5 * (size_t)r]);
        ft_emu_abort(call,
                     "collective #%lu of this communicator differs between ranks: rank %d "
                     "called %s, rank %d called %s (NCCL leaves this undefined: on a GPU a hang "
                     "or wrong data)",
                     c->seq, c->rank, a, r, b);
    }
}

void log_call(const Call &k)
{
    if (debug_level() < 2)
        return;
    fprintf(stderr,
            "NCCL INFO (ft-emu) rank %d: %s #%lu count %zu %s %s root/peer %d sendbuff %p "
            "recvbuff %p\n",
            k.comm->rank, kind_name(k.kind), k.comm->seq, k.count, type_name(k.type),
            k.kind == ALLREDUCE || k.kind == REDUCESCATTER || k.kind == REDUCE ? op_name(k.op)
                                                                               : "-",
            k.root, k.send, (void *)k.recv);
}

/* Balanced blocks of an allreduce: block b of count over n. */
size_t block_start(size_t count, size_t n, size_t b) { return count / n * b + std::min(b, count % n); }
size_t block_len(size_t count, size_t n, size_t b) { return count / n + (b < count % n); }

void run_collective(const Call &k)
{
    const char *call = kind_name(k.kind);
    ncclComm *c = k.comm;
    size_t es = type_size(k.type), n = (size_t)c->nranks, bytes = k.count * es;
    bool is_root = c->rank == k.root;
    c->seq++;
    log_call(k);
    int ps = poison_size(k.type);
    if (ps && k.count && (k.kind != BROADCAST || is_root))
        ft_emu_check_written(k.send, k.kind == REDUCESCATTER ? bytes * n : bytes, ps, call,
                             "sendbuff");
    if (n > 1) {
        agree(k);
        progress_sends(c);
    }
    if (!k.count)
        return;
    bool scaled = k.kind == ALLGATHER || k.kind == REDUCESCATTER || k.kind == REDUCE;
    if (n > 1 && !fits_int(scaled ? k.count * n : k.count))
        ft_emu_abort(call,
                     "%zu elements (x %zu ranks): more than one MPI call of the emulation moves "
                     "(INT_MAX elements)",
                     k.count, scaled ? n : (size_t)1);
    MPI_Datatype T = mpi_elem(es);
    MPI_Request req;
    char *recv = (char *)k.recv;
    switch (k.kind) {
    case ALLREDUCE: {
        if (n == 1) {
            reduce(k.type, k.op, 1, k.send, 0, k.count, recv);
            break;
        }
        /* reduce-scatter (block r to rank r, reduced there in rank order), then allgather */
        size_t me = (size_t)c->rank, lm = block_len(k.count, n, me);
        std::vector<int> sc(n), sd(n), rc(n), rd(n);
        for (size_t b = 0; b < n; b++) {
            sc[b] = (int)block_len(k.count, n, b);
            sd[b] = (int)block_start(k.count, n, b);
            rc[b] = (int)lm;
            rd[b] = (int)(b * lm);
        }
        std::vector<char> tmp(n * lm * es + 1);
        mpi_ok(MPI_Ialltoallv(k.send, sc.data(), sd.data(), T, tmp.data(), rc.data(), rd.data(), T,
                              c->mpi, &req),
               call, c, "MPI_Ialltoallv");
        wait_ok(&req, MPI_STATUS_IGNORE, call, c, "MPI_Ialltoallv (the reduce-scatter half)");
        reduce(k.type, k.op, (int)n, tmp.data(), lm * es, lm, recv + sd[me] * es);
        mpi_ok(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, sc.data(), sd.data(), T,
                               c->mpi, &req),
               call, c, "MPI_Iallgatherv");
        wait_ok(&req, MPI_STATUS_IGNORE, call, c, "MPI_Iallgatherv (the allgather half)");
        break;
    }
    case REDUCESCATTER: {
        if (n == 1) {
            reduce(k.type, k.op, 1, k.send, 0, k.count, recv);
            break;
        }
        std::vector<char> tmp(n * bytes);
        mpi_ok(MPI_Ialltoall(k.send, (int)k.count, T, tmp.data(), (int)k.count, T, c->mpi, &req),
               call, c, "MPI_Ialltoall");
        wait_ok(&req, MPI_STATUS_IGNORE, call, c, "MPI_Ialltoall");
        reduce(k.type, k.op, (int)n, tmp.data(), bytes, k.count, recv);
        break;
    }
    case REDUCE: {
        if (n == 1) {
            reduce(k.type, k.op, 1, k.send, 0, k.count, recv);
            break;
        }
        std::vector<char> tmp(is_root ? n * bytes : 1);
        mpi_ok(MPI_Igather(k.send, (int)k.count, T, tmp.data(), (int)k.count, T, k.root, c->mpi,
                           &req),
               call, c, "MPI_Igather");
        wait_ok(&req, MPI_STATUS_IGNORE, call, c, "MPI_Igather");
        if (is_root)
            reduce(k.type, k.op, (int)n, tmp.data(), bytes, k.count, recv);
        break;
    }
    case ALLGATHER: {
        const char *mine = recv + (size_t)c->rank * bytes;
        if (n == 1) {
            if (k.send != mine)
                memmove(recv, k.send, bytes);
            break;
        }
        bool in_place = k.send == mine;
        mpi_ok(MPI_Iallgather(in_place ? MPI_IN_PLACE : k.send, (int)k.count, T, recv,
                              (int)k.count, T, c->mpi, &req),
               call, c, "MPI_Iallgather");
        wait_ok(&req, MPI_STATUS_IGNORE, call, c, "MPI_Iallgather");
        break;
    }
    case BROADCAST:
        if (is_root && k.send != recv)
            memmove(recv, k.send, bytes);
        if (n > 1) {
            mpi_ok(MPI_Ibcast(recv, (int)k.count, T, k.root, c->mpi, &req), call, c, "MPI_Ibcast");
            wait_ok(&req, MPI_STATUS_IGNORE, call, c, "MPI_Ibcast");
        }
        break;
    default:
        ft_emu_abort(call, "internal error: not a collective");
    }
}

/* A send: the data is copied and leaves in the background (to itself: queued). */
void post_send(const Call &k)
{
    ncclComm *c = k.comm;
    size_t bytes = k.count * type_size(k.type);
    log_call(k);
    int ps = poison_size(k.type);
    if (ps && k.count)
        ft_emu_check_written(k.send, bytes, ps, "ncclSend", "sendbuff");
    if (!k.count)
        return;
    const char *p = (const char *)k.send;
    if (k.root == c->rank) {
        c->to_self.emplace_back(p, p + bytes);
        return;
    }
    if (!fits_int(bytes))
        ft_emu_abort("ncclSend", "%zu bytes: more than one MPI message of the emulation moves "
                                 "(INT_MAX bytes)",
                     bytes);
    c->sends.emplace_back();
    ncclComm::Send &s = c->sends.back();
    s.data.assign(p, p + bytes);
    mpi_ok(MPI_Isend(s.data.data(), (int)bytes, MPI_BYTE, k.root, P2P_TAG, c->mpi, &s.req),
           "ncclSend", c, "MPI_Isend");
}

void recv_from_self(const Call &k)
{
    ncclComm *c = k.comm;
    size_t bytes = k.count * type_size(k.type);
    log_call(k);
    if (!k.count)
        return;
    if (c->to_self.empty())
        ft_emu_abort("ncclRecv",
                     "rank %d receives %zu bytes from itself, but sent itself nothing before "
                     "(on a GPU: a wait for ever)",
                     c->rank, bytes);
    std::vector<char> &m = c->to_self.front();
    if (m.size() != bytes)
        ft_emu_abort("ncclRecv",
                     "rank %d receives %zu bytes (%zu x %s) from itself, but its send to itself "
                     "was %zu bytes: the counts or datatypes differ",
                     c->rank, bytes, k.count, type_name(k.type), m.size());
    memcpy(k.recv, m.data(), bytes);
    c->to_self.pop_front();
}

void post_recv(const Call &k, MPI_Request *req)
{
    ncclComm *c = k.comm;
    size_t bytes = k.count * type_size(k.type);
    log_call(k);
    if (!fits_int(bytes))
        ft_emu_abort("ncclRecv", "%zu bytes: more than one MPI message of the emulation moves "
                                 "(INT_MAX bytes)",
                     bytes);
    mpi_ok(MPI_Irecv(k.recv, (int)bytes, MPI_BYTE, k.root, P2P_TAG, c->mpi, req), "ncclRecv", c,
           "MPI_Irecv");
}

void finish_recv(const Call &k, MPI_Request *req)
{
    ncclComm *c = k.comm;
    size_t bytes = k.count * type_size(k.type);
    MPI_Status st;
    int rc = wait_req(req, &st, "ncclRecv", c, "the receive");
    if (rc != MPI_SUCCESS)
        ft_emu_abort("ncclRecv",
                     "rank %d receives %zu bytes (%zu x %s) from rank %d, which sent more: the "
                     "counts or datatypes of the send and the receive differ (MPI: %s)",
                     c->rank, bytes, k.count, type_name(k.type), k.root, mpi_text(rc).c_str());
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    if ((size_t)got != bytes)
        ft_emu_abort("ncclRecv",
                     "rank %d receives %zu bytes (%zu x %s) from rank %d, which sent %d: the "
                     "counts or datatypes of the send and the receive differ",
                     c->rank, bytes, k.count, type_name(k.type), k.root, got);
}

void run_now(const Call &k)
{
    if (k.kind == SEND) {
        post_send(k);
        progress_sends(k.comm);
    } else if (k.kind == RECV) {
        if (k.root == k.comm->rank) {
            recv_from_self(k);
        } else if (k.count) {
            MPI_Request req;
            post_recv(k, &req);
            finish_recv(k, &req);
        }
    } else {
        run_collective(k);
    }
}

/* A group: the sends, the receives, the collectives in call order, then the waits. */
void run_group(const std::vector<Call> &calls)
{
    for (const Call &k : calls)
        if (k.kind == SEND)
            post_send(k);
    for (const Call &k : calls)
        if (k.kind == RECV && k.root == k.comm->rank)
            recv_from_self(k);
    std::vector<MPI_Request> reqs(calls.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < calls.size(); i++)
        if (calls[i].kind == RECV && calls[i].root != calls[i].comm->rank && calls[i].count)
            post_recv(calls[i], &reqs[i]);
    for (const Call &k : calls)
        if (k.kind != SEND && k.kind != RECV)
            run_collective(k);
    for (size_t i = 0; i < calls.size(); i++)
        if (reqs[i] != MPI_REQUEST_NULL)
            finish_recv(calls[i], &reqs[i]);
    for (const Call &k : calls)
        if (live_comms().count(k.comm))
            progress_sends(k.comm);
}

ncclResult_t submit(const Call &k)
{
    ncclResult_t rc = check_call(k);
    if (rc != ncclSuccess) {
        if (group.depth)
            group.error = rc;
        return rc;
    }
    if (group.depth) {
        group.calls.push_back(k);
    } else {
        ft_emu_stream_flush(k.stream);
        run_now(k);
    }
    return ncclSuccess;
}

} /* namespace */

/* ---- the API ---------------------------------------------------------------------- */

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "ncclGetVersion : version argument is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess:
        return "no error";
    case ncclUnhandledCudaError:
        return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
        return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
        return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
        return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
        return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
        return "remote process exited or there was a network error";
    case ncclInProgress:
        return "NCCL operation in progress";
    default:
        return "unknown result code";
    }
}

/* As in NCCL, the last error of this thread; comm is not used. */
const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        return fail(ncclInvalidArgument, "ncclGetUniqueId : uniqueId argument is NULL");
    static uint64_t made;
    memset(id, 0, sizeof *id);
    memcpy(id->internal, ID_MAGIC, sizeof ID_MAGIC);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t fields[4] = {(uint64_t)getpid(), (uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, ++made};
    memcpy(id->internal + sizeof ID_MAGIC, fields, sizeof fields);
    gethostname(id->internal + sizeof ID_MAGIC + sizeof fields,
                NCCL_UNIQUE_ID_BYTES - sizeof ID_MAGIC - sizeof fields - 1);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    if (!out)
        return fail(ncclInvalidArgument, "ncclCommInitRank : comm argument is NULL");
    *out = NULL;
    if (nranks < 1)
        return fail(ncclInvalidArgument, "ncclCommInitRank : invalid nranks %d", nranks);
    if (rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument, "ncclCommInitRank : invalid rank requested : %d/%d",
                    rank, nranks);
    if (memcmp(id.internal, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return fail(ncclInvalidArgument,
                    "ncclCommInitRank : commId was not made by ncclGetUniqueId (of the NCCL "
                    "emulation)");
    MPI_Comm mpi = MPI_COMM_NULL;
    if (nranks > 1) {
        if (!mpi_up())
            return fail(ncclInvalidUsage,
                        "ncclCommInitRank : the NCCL emulation runs over MPI: a communicator of "
                        "%d ranks needs MPI up (one process per rank, under mpirun)",
                        nranks);
        int world = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        if (world != nranks)
            return fail(ncclInvalidUsage,
                        "ncclCommInitRank : nranks %d is not the size of MPI_COMM_WORLD (%d): "
                        "the emulation's communicators span every MPI process",
                        nranks, world);
        MPI_Comm dup;
        int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
        if (rc != MPI_SUCCESS)
            return fail(ncclSystemError, "ncclCommInitRank : MPI_Comm_dup failed: %s",
                        mpi_text(rc).c_str());
        MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
        struct Joined {
            int rank;
            char id[NCCL_UNIQUE_ID_BYTES];
        } mine, *all = new Joined[(size_t)nranks];
        mine.rank = rank;
        memcpy(mine.id, id.internal, sizeof mine.id);
        rc = MPI_Allgather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, dup);
        if (rc != MPI_SUCCESS) {
            delete[] all;
            MPI_Comm_free(&dup);
            return fail(ncclSystemError, "ncclCommInitRank : MPI_Allgather failed: %s",
                        mpi_text(rc).c_str());
        }
        std::vector<int> seen((size_t)nranks, -1);
        const char *why = NULL;
        int who = 0, other = -1;
        for (int p = 0; p < nranks && !why; p++) {
            if (memcmp(all[p].id, mine.id, sizeof mine.id) != 0)
                why = "passed another ncclUniqueId", who = p;
            else if (seen[(size_t)all[p].rank] >= 0)
                why = "asked for the same rank", who = p, other = seen[(size_t)all[p].rank];
            else
                seen[(size_t)all[p].rank] = p;
        }
        delete[] all;
        if (why) {
            MPI_Comm_free(&dup);
            return fail(ncclInvalidUsage,
                        "ncclCommInitRank : MPI process %d %s%s%s (every process of the "
                        "communicator joins with rank 0's id and a rank of its own)",
                        who, why, other >= 0 ? " as MPI process " : "",
                        other >= 0 ? std::to_string(other).c_str() : "");
        }
        rc = MPI_Comm_split(dup, 0, rank, &mpi); /* MPI rank = NCCL rank */
        MPI_Comm_free(&dup);
        if (rc != MPI_SUCCESS)
            return fail(ncclSystemError, "ncclCommInitRank : MPI_Comm_split failed: %s",
                        mpi_text(rc).c_str());
        MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    }
    ncclComm *c = new ncclComm();
    c->rank = rank;
    c->nranks = nranks;
    c->device = ft_emu_current_device();
    c->mpi = mpi;
    c->seq = 0;
    live_comms().insert(c);
    *out = c;
    return ncclSuccess;
}

/* Waits for the sends still leaving (NCCL's finalize flushes them too), then frees. */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t rc = check_comm("ncclCommDestroy", comm);
    if (rc != ncclSuccess)
        return rc;
    bool up = mpi_up();
    while (up && !comm->sends.empty()) {
        wait_ok(&comm->sends.front().req, MPI_STATUS_IGNORE, "ncclCommDestroy", comm,
                "a send made before (the peer never received it)");
        comm->sends.pop_front();
    }
    if (up && comm->mpi != MPI_COMM_NULL)
        MPI_Comm_free(&comm->mpi);
    live_comms().erase(comm);
    delete comm;
    return ncclSuccess;
}

/* Frees this rank from the communicator without waiting for anything: no MPI call (the
 * peers may be dead). The object is left allocated on purpose, as MPI may still read the
 * data of sends that have not left. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    ncclResult_t rc = check_comm("ncclCommAbort", comm);
    if (rc != ncclSuccess)
        return rc;
    live_comms().erase(comm);
    return ncclSuccess;
}

/* Calls complete (or stop the process) before they return, so nothing fails later. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    ncclResult_t rc = check_comm("ncclCommGetAsyncError", comm);
    if (rc != ncclSuccess)
        return rc;
    if (!asyncError)
        return fail(ncclInvalidArgument, "ncclCommGetAsyncError : asyncError argument is NULL");
    if (mpi_up())
        progress_sends(comm);
    *asyncError = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    ncclResult_t rc = check_comm("ncclCommCount", comm);
    if (rc != ncclSuccess)
        return rc;
    if (!count)
        return fail(ncclInvalidArgument, "ncclCommCount : count argument is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    ncclResult_t rc = check_comm("ncclCommUserRank", comm);
    if (rc != ncclSuccess)
        return rc;
    if (!rank)
        return fail(ncclInvalidArgument, "ncclCommUserRank : rank argument is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return submit({ALLREDUCE, sendbuff, recvbuff, count, datatype, op, -1, comm, stream});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return submit({REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, -1, comm, stream});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return submit({ALLGATHER, sendbuff, recvbuff, sendcount, datatype, (ncclRedOp_t)-1, -1, comm, stream});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return submit({BROADCAST, sendbuff, recvbuff, count, datatype, (ncclRedOp_t)-1, root, comm, stream});
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream)
{
    return submit({REDUCE, sendbuff, recvbuff, count, datatype, op, root, comm, stream});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return submit({SEND, sendbuff, NULL, count, datatype, (ncclRedOp_t)-1, peer, comm, stream});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return submit({RECV, NULL, recvbuff, count, datatype, (ncclRedOp_t)-1, peer, comm, stream});
}

ncclResult_t ncclGroupStart(void)
{
    group.depth++;
    return ncclSuccess;
}

/* The outermost ncclGroupEnd runs the group; after a failed call in it, nothing of the
 * group runs and that call's error is returned (the group is closed either way). */
ncclResult_t ncclGroupEnd(void)
{
    if (group.depth == 0)
        return fail(ncclInvalidUsage, "ncclGroupEnd: not in a group");
    if (--group.depth > 0)
        return ncclSuccess;
    std::vector<Call> calls;
    calls.swap(group.calls);
    ncclResult_t rc = group.error;
    group.error = ncclSuccess;
    if (rc != ncclSuccess)
        return rc;
    for (const Call &k : calls) /* NCCL enqueues the group's work on its streams here */
        ft_emu_stream_flush(k.stream);
    run_group(calls);
    return ncclSuccess;
}

} /* extern "C" */
