/* NCCL backend of dist.h, and the CUDA helpers the other backends need for device
 * buffers (see dist_nccl.h). Compiles to nothing without CUDA.
 *
 * NCCL's reduce-scatter and allgather take one count for every rank; the v forms with
 * uneven counts are a group of per-block calls instead: block r is reduced onto rank r
 * (ncclReduce, root r), or broadcast from rank r (ncclBroadcast, root r). NCCL runs the
 * group as one launch; with equal counts the native collective is used. */
#include "dist/dist_nccl.h"

#ifdef FT_HAVE_CUDA

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "device/run_device.h"

int ft_dist_on_device(const void *p)
{
    if (!p)
        return 0;
    struct cudaPointerAttributes a;
    cudaError_t rc = cudaPointerGetAttributes(&a, p);
    if (rc != cudaSuccess) {
        /* before CUDA 11 a plain host pointer was an error; also no device or driver */
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}

int ft_dist_device_copy(void *dst, const void *src, size_t bytes, ft_err *err)
{
    cudaError_t rc = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return ft_fail(err, "cudaMemcpy of %zu bytes: %s", bytes, cudaGetErrorString(rc));
    }
    return 0;
}

#ifdef FT_DIST_NCCL

#include <mpi.h>
#include <nccl.h>

struct ft_nccl {
    ncclComm_t comm;
    cudaStream_t stream; /* every NCCL call goes here */
    cudaEvent_t ready;   /* recorded on the legacy default stream; the comm stream waits */
    int rank, size, device;
};

struct ft_nccl_event {
    cudaEvent_t ev;
};

#define CUDA_OK(call, err)                                                              \
    do {                                                                                \
        cudaError_t cu_rc_ = (call);                                                    \
        if (cu_rc_ != cudaSuccess) {                                                    \
            (void)cudaGetLastError();                                                   \
            return ft_fail((err), "%s: %s", #call, cudaGetErrorString(cu_rc_));         \
        }                                                                               \
    } while (0)

static int nccl_fail(ft_nccl *g, ft_err *err, const char *call, ncclResult_t rc)
{
    const char *last = g && g->comm ? ncclGetLastError(g->comm) : NULL;
    return ft_fail(err, "%s: %s%s%s", call, ncclGetErrorString(rc),
                   last && *last ? ": " : "", last && *last ? last : "");
}

static ncclDataType_t nccl_type(ft_comm_dtype dt)
{
    switch (dt) {
    case FT_COMM_F32:
        return ncclFloat32;
    case FT_COMM_F64:
        return ncclFloat64;
    case FT_COMM_I64:
        return ncclInt64;
    case FT_COMM_BF16:
        return ncclBfloat16;
    case FT_COMM_BYTE:
        break;
    }
    return ncclUint8;
}

static ncclRedOp_t nccl_op(ft_comm_op op)
{
    switch (op) {
    case FT_COMM_AVG:
        return ncclAvg;
    case FT_COMM_MAX:
        return ncclMax;
    case FT_COMM_SUM:
        break;
    }
    return ncclSum;
}

static size_t type_size(ft_comm_dtype dt)
{
    return dt == FT_COMM_F32 ? 4 : dt == FT_COMM_BYTE ? 1 : dt == FT_COMM_BF16 ? 2 : 8;
}

/* Agrees on a flag over all ranks: the minimum of ok (one process: ok, without MPI). */
static int all_agree(int size, int ok, int *all, ft_err *err)
{
    if (size == 1) {
        *all = ok;
        return 0;
    }
    int rc = MPI_Allreduce(&ok, all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS)
        return ft_fail(err, "MPI_Allreduce while starting NCCL failed (error %d)", rc);
    return 0;
}

void ft_nccl_finalize(ft_nccl *g)
{
    if (!g)
        return;
    if (g->comm)
        ncclCommDestroy(g->comm);
    if (g->ready)
        cudaEventDestroy(g->ready);
    if (g->stream)
        cudaStreamDestroy(g->stream);
    free(g);
}

/* This rank's half of the setup before the collective ncclCommInitRank: the device
 * (already chosen), the comm stream and (rank 0) the unique id. */
static int setup_local(ft_nccl *g, ncclUniqueId *id, ft_err *err)
{
    CUDA_OK(cudaSetDevice(g->device), err);
    CUDA_OK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), err);
    CUDA_OK(cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming), err);
    if (g->rank == 0) {
        ncclResult_t rc = ncclGetUniqueId(id);
        if (rc != ncclSuccess)
            return nccl_fail(NULL, err, "ncclGetUniqueId", rc);
    }
    return 0;
}

/* NCCL refuses two ranks on one GPU. Which GPU a rank's ordinal is depends on what it
 * sees: ranks that all see the node's GPUs take one each, a rank given one GPU of its own
 * (Slurm's --gpus-per-task=1) sees it as device 0. So the ranks of a node compare the PCI
 * bus ids of the GPUs they took. *shared (on every rank of the node) is the node-local
 * rank another local rank shares this rank's GPU with, or -1; bus gets this rank's id. */
static int shared_gpu(int device, int *shared, char *bus, size_t bus_len, ft_err *err)
{
    enum { ID = 32 };
    *shared = -1;
    if (cudaDeviceGetPCIBusId(bus, (int)bus_len, device) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(bus, bus_len, "ordinal %d", device); /* compared as such: no better */
    }
    MPI_Comm node;
    int rc = MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS)
        return ft_fail(err, "MPI_Comm_split_type while starting NCCL failed (error %d)", rc);
    int n = 0, me = 0;
    MPI_Comm_size(node, &n);
    MPI_Comm_rank(node, &me);
    char mine[ID] = {0}, *all = calloc((size_t)n, ID);
    if (!all) {
        MPI_Comm_free(&node);
        return ft_fail(err, "out of memory");
    }
    snprintf(mine, sizeof mine, "%s", bus);
    rc = MPI_Allgather(mine, ID, MPI_CHAR, all, ID, MPI_CHAR, node);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS) {
        free(all);
        return ft_fail(err, "MPI_Allgather of the GPUs' bus ids failed (error %d)", rc);
    }
    for (int r = 0; r < n && *shared < 0; r++)
        if (r != me && !strncmp(all + (size_t)r * ID, mine, ID))
            *shared = r;
    free(all);
    return 0;
}

int ft_nccl_init(ft_nccl **out, int rank, int size, int local_rank, int local_size,
                 bool required, ft_err *err)
{
    *out = NULL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) { /* no driver or no device */
        (void)cudaGetLastError();
        count = 0;
    }
    (void)local_size;
    int all = 0;
    if (all_agree(size, count > 0, &all, err))
        return -1;
    if (!all) {
        if (!required)
            return 0;
        if (count == 0)
            return ft_fail(err, "FT_DIST_BACKEND=nccl, but rank %d sees no CUDA device", rank);
        return ft_fail(err, "FT_DIST_BACKEND=nccl, but another rank sees no CUDA device");
    }
    /* every rank a GPU of its own (the GPU the trainer will take too) */
    int device = ft_gpu_for_rank(local_rank, count), shared = -1;
    char bus[32];
    if (size > 1 && shared_gpu(device, &shared, bus, sizeof bus, err))
        return -1;
    if (all_agree(size, shared < 0, &all, err))
        return -1;
    if (!all) {
        if (!required)
            return 0;
        if (shared >= 0)
            return ft_fail(err, "FT_DIST_BACKEND=nccl, but rank %d (local rank %d) and local "
                                "rank %d share GPU %s (%d visible to each): NCCL needs one GPU "
                                "per rank (fewer ranks per node, or CUDA_VISIBLE_DEVICES)",
                           rank, local_rank, shared, bus, count);
        return ft_fail(err, "FT_DIST_BACKEND=nccl, but ranks on another node share a GPU");
    }

    ft_nccl *g = calloc(1, sizeof *g);
    if (!g)
        return ft_fail(err, "out of memory");
    g->rank = rank;
    g->size = size;
    g->device = device;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ft_err local;
    int ok = setup_local(g, &id, &local) == 0;
    /* agree before ncclCommInitRank, which would wait forever for a rank that failed */
    if (all_agree(size, ok, &all, err))
        goto fail;
    if (!all) {
        if (ok)
            snprintf(local.msg, sizeof local.msg, "another rank failed to set up its GPU");
        ft_fail(err, "starting NCCL on rank %d: %s", rank, local.msg);
        goto fail;
    }
    int rc = size == 1 ? MPI_SUCCESS : MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        ft_fail(err, "MPI_Bcast of the NCCL unique id failed (error %d)", rc);
        goto fail;
    }
    ncclResult_t nrc = ncclCommInitRank(&g->comm, size, id, rank);
    if (nrc != ncclSuccess) {
        g->comm = NULL;
        nccl_fail(NULL, &local, "ncclCommInitRank", nrc);
    }
    /* every rank leaves with NCCL up, or none does */
    if (all_agree(size, nrc == ncclSuccess, &all, err))
        goto fail;
    if (!all) {
        if (nrc == ncclSuccess)
            snprintf(local.msg, sizeof local.msg, "ncclCommInitRank failed on another rank");
        ft_fail(err, "starting NCCL on rank %d: %s", rank, local.msg);
        goto fail;
    }
    *out = g;
    return 0;
fail:
    ft_nccl_finalize(g);
    return -1;
}

int ft_nccl_device(const ft_nccl *g) { return g->device; }

/* Orders the comm stream after the work already queued on the legacy default stream
 * (and through it every blocking stream), which produced the buffers. */
static int begin(ft_nccl *g, ft_err *err)
{
    CUDA_OK(cudaEventRecord(g->ready, cudaStreamLegacy), err);
    CUDA_OK(cudaStreamWaitEvent(g->stream, g->ready, 0), err);
    return 0;
}

static int finish(ft_nccl *g, ft_nccl_event **out, ft_err *err)
{
    ft_nccl_event *e = calloc(1, sizeof *e);
    if (!e)
        return ft_fail(err, "out of memory");
    cudaError_t rc = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(e->ev, g->stream);
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        ft_nccl_event_free(e);
        return ft_fail(err, "recording the completion event: %s", cudaGetErrorString(rc));
    }
    *out = e;
    return 0;
}

#define NCCL_OK(g, call, err)                                                           \
    do {                                                                                \
        ncclResult_t nc_rc_ = (call);                                                   \
        if (nc_rc_ != ncclSuccess && nc_rc_ != ncclInProgress)                          \
            return nccl_fail((g), (err), #call, nc_rc_);                                \
    } while (0)

int ft_nccl_allreduce(ft_nccl *g, void *buf, size_t n, ft_comm_dtype dt, ft_comm_op op,
                      ft_nccl_event **ev, ft_err *err)
{
    if (begin(g, err))
        return -1;
    NCCL_OK(g, ncclAllReduce(buf, buf, n, nccl_type(dt), nccl_op(op), g->comm, g->stream), err);
    return finish(g, ev, err);
}

static bool equal_counts(const size_t *counts, int size)
{
    for (int r = 1; r < size; r++)
        if (counts[r] != counts[0])
            return false;
    return true;
}

/* The per-block group of the uneven reduce-scatter; ncclGroupEnd runs even after a
 * failed call so that the group is closed. */
static ncclResult_t reduce_blocks(ft_nccl *g, const char *send, void *recv, const size_t *counts,
                                  ft_comm_dtype dt, ft_comm_op op)
{
    size_t es = type_size(dt), off = 0;
    ncclResult_t rc = ncclGroupStart(), end;
    for (int r = 0; r < g->size && (rc == ncclSuccess || rc == ncclInProgress); off += counts[r++])
        if (counts[r])
            rc = ncclReduce(send + off * es, recv, counts[r], nccl_type(dt), nccl_op(op), r,
                            g->comm, g->stream);
    end = ncclGroupEnd();
    return rc != ncclSuccess && rc != ncclInProgress ? rc : end;
}

int ft_nccl_reduce_scatter_v(ft_nccl *g, const void *send, void *recv, const size_t *counts,
                             ft_comm_dtype dt, ft_comm_op op, ft_nccl_event **ev, ft_err *err)
{
    if (begin(g, err))
        return -1;
    if (equal_counts(counts, g->size))
        NCCL_OK(g, ncclReduceScatter(send, recv, counts[0], nccl_type(dt), nccl_op(op), g->comm,
                                     g->stream), err);
    else
        NCCL_OK(g, reduce_blocks(g, send, recv, counts, dt, op), err);
    return finish(g, ev, err);
}

static ncclResult_t broadcast_blocks(ft_nccl *g, const void *send, char *recv,
                                     const size_t *counts, ft_comm_dtype dt)
{
    size_t es = type_size(dt), off = 0;
    ncclResult_t rc = ncclGroupStart(), end;
    for (int r = 0; r < g->size && (rc == ncclSuccess || rc == ncclInProgress); off += counts[r++])
        if (counts[r])
            rc = ncclBroadcast(r == g->rank ? send : recv + off * es, recv + off * es, counts[r],
                               nccl_type(dt), r, g->comm, g->stream);
    end = ncclGroupEnd();
    return rc != ncclSuccess && rc != ncclInProgress ? rc : end;
}

int ft_nccl_allgather_v(ft_nccl *g, const void *send, void *recv, const size_t *counts,
                        ft_comm_dtype dt, ft_nccl_event **ev, ft_err *err)
{
    if (begin(g, err))
        return -1;
    /* in place (send is this rank's block of recv) is what both forms expect */
    if (equal_counts(counts, g->size))
        NCCL_OK(g, ncclAllGather(send, recv, counts[0], nccl_type(dt), g->comm, g->stream), err);
    else
        NCCL_OK(g, broadcast_blocks(g, send, recv, counts, dt), err);
    return finish(g, ev, err);
}

int ft_nccl_broadcast(ft_nccl *g, void *buf, size_t n, ft_comm_dtype dt, int root,
                      ft_nccl_event **ev, ft_err *err)
{
    if (begin(g, err))
        return -1;
    NCCL_OK(g, ncclBroadcast(buf, buf, n, nccl_type(dt), root, g->comm, g->stream), err);
    return finish(g, ev, err);
}

int ft_nccl_send(ft_nccl *g, const void *buf, size_t n, ft_comm_dtype dt, int peer,
                 ft_nccl_event **ev, ft_err *err)
{
    if (begin(g, err))
        return -1;
    NCCL_OK(g, ncclSend(buf, n, nccl_type(dt), peer, g->comm, g->stream), err);
    return finish(g, ev, err);
}

int ft_nccl_recv(ft_nccl *g, void *buf, size_t n, ft_comm_dtype dt, int peer,
                 ft_nccl_event **ev, ft_err *err)
{
    if (begin(g, err))
        return -1;
    NCCL_OK(g, ncclRecv(buf, n, nccl_type(dt), peer, g->comm, g->stream), err);
    return finish(g, ev, err);
}

int ft_nccl_test(ft_nccl *g, ft_nccl_event *ev, ft_err *err)
{
    cudaError_t rc = cudaEventQuery(ev->ev);
    if (rc == cudaSuccess)
        return 1;
    if (rc != cudaErrorNotReady) {
        (void)cudaGetLastError();
        return ft_fail(err, "cudaEventQuery: %s", cudaGetErrorString(rc));
    }
    /* "not ready" is not an error: keep it from a later check of cudaGetLastError */
    if (cudaPeekAtLastError() == cudaErrorNotReady)
        (void)cudaGetLastError();
    /* a peer's failure shows up here, not in the event */
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(g->comm, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress)
        return nccl_fail(g, err, "NCCL", async);
    return 0;
}

void ft_nccl_event_free(ft_nccl_event *ev)
{
    if (!ev)
        return;
    if (ev->ev)
        cudaEventDestroy(ev->ev);
    free(ev);
}

void ft_nccl_abort(ft_nccl *g)
{
    if (g && g->comm) {
        ncclCommAbort(g->comm);
        g->comm = NULL;
    }
}

#endif /* FT_DIST_NCCL */
#endif /* FT_HAVE_CUDA */
