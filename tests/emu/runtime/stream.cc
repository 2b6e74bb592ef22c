/* Streams and events of the emulated device.
 *
 * By default every call runs synchronously when it is issued, so work on any stream is
 * complete when the call returns: a stream or event is always ready and a wait is a check
 * of its handles. That is one schedule CUDA's stream order allows (the most serial one),
 * so code that is correct under CUDA's ordering is correct here, but a missing
 * synchronization does not show.
 *
 * With FT_EMU_ASYNC=1 the work of a stream is queued (queue.cc) and runs when the host
 * waits for it, as CUDA defines the waits:
 *   cudaStreamSynchronize   the stream's work (and what it follows: the legacy default
 *                           stream's implicit synchronization, cudaStreamWaitEvent);
 *   cudaEventSynchronize    the work before the event's record;
 *   cudaDeviceSynchronize   all the device's work (device.cc);
 *   cudaStreamQuery,        cudaErrorNotReady while work is queued (not recorded as the
 *   cudaEventQuery          last error, as CUDA does not), and that work is started, so a
 *                           polling loop ends: the device makes progress between polls;
 *   cudaStreamWaitEvent     queues nothing but an order: the stream's later work follows
 *                           the event's record;
 *   cudaEventElapsedTime    cudaErrorNotReady while either record is queued; an event's
 *                           time is the host's clock when its record runs.
 * The blocking copies, cudaFree and cuBLAS, in memory.cc and cublas.cc.
 *
 * Handles are checked: a stream or event used after cudaStreamDestroy / cudaEventDestroy,
 * or never created, is cudaErrorInvalidResourceHandle (the handles are never reused, so a
 * stale one is always caught). Work queued on a destroyed stream still runs when forced,
 * as CUDA finishes it. */
#include <time.h>

#include <mutex>
#include <set>

#include "cuda_runtime_api.h"
#include "emu_internal.h"

struct ft_emu_stream {
    unsigned flags;
    int device;
};
struct ft_emu_event {
    unsigned flags;
    int device;
    bool recorded;
    double when;      /* host seconds when the record ran: the emulation has no device time */
    ft_emu::op_ref op; /* the last record, while queued */
    unsigned gen;     /* records so far: an older record that runs late changes nothing */
};

namespace ft_emu {
namespace {
std::mutex mu;
std::set<const void *> live_streams, live_events;

bool live_event(cudaEvent_t e)
{
    std::lock_guard<std::mutex> lk(mu);
    return e && live_events.count(e);
}

double now()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
} // namespace

cudaError_t check_stream(cudaStream_t s)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread)
        return cudaSuccess;
    std::lock_guard<std::mutex> lk(mu);
    return live_streams.count(s) ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

lane lane_of(cudaStream_t s)
{
    if (s && s != cudaStreamLegacy && s != cudaStreamPerThread)
        return {s, s->device, false, !(s->flags & cudaStreamNonBlocking)};
    cudaError_t err;
    int dev = current_device(&err);
    if (dev < 0) /* no device: the caller's own checks report it */
        dev = 0;
    if (s == cudaStreamPerThread) /* one lane for all host threads: a serial choice */
        return {cudaStreamPerThread, dev, false, true};
    return {cudaStreamLegacy, dev, true, true};
}

} // namespace ft_emu

using namespace ft_emu;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!stream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return fail(cudaErrorInvalidValue);
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0)
        return fail(err);
    cudaStream_t s = new ft_emu_stream{flags, dev};
    std::lock_guard<std::mutex> lk(ft_emu::mu);
    live_streams.insert(s);
    *stream = s;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *stream)
{
    return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    std::lock_guard<std::mutex> lk(ft_emu::mu);
    if (!live_streams.erase(stream)) /* the default streams cannot be destroyed either */
        return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess; /* the handle is never freed, so never reused */
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    call_scope cs("cudaStreamSynchronize");
    if (cudaError_t s = sticky())
        return fail(s);
    if (cudaError_t s = check_stream(stream))
        return fail(s);
    finish_lane(lane_of(stream));
    return fail(sticky()); /* a kernel of it trapped */
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    call_scope cs("cudaStreamQuery");
    if (cudaError_t s = sticky())
        return fail(s);
    if (cudaError_t s = check_stream(stream))
        return fail(s);
    if (op_ref t = lane_tail(lane_of(stream))) {
        finish(t);
        return cudaErrorNotReady;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (cudaError_t s = check_stream(stream))
        return fail(s);
    if (!live_event(event))
        return fail(cudaErrorInvalidResourceHandle);
    if (flags & ~1u) /* cudaEventWaitDefault, cudaEventWaitExternal */
        return fail(cudaErrorInvalidValue);
    if (!done(event->op))
        issue(lane_of(stream), "cudaStreamWaitEvent", [] {}, event->op);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!event || (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming | 0x4)))
        return fail(cudaErrorInvalidValue);
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0)
        return fail(err);
    cudaEvent_t e = new ft_emu_event{flags, dev, false, 0, nullptr, 0};
    std::lock_guard<std::mutex> lk(ft_emu::mu);
    live_events.insert(e);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!live_event(event))
        return fail(cudaErrorInvalidResourceHandle);
    if (cudaError_t s = check_stream(stream))
        return fail(s);
    event->recorded = true;
    unsigned gen = ++event->gen;
    event->op = issue(lane_of(stream), "cudaEventRecord", [event, gen] {
        if (event->gen == gen)
            event->when = now();
    }, nullptr, true);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    call_scope cs("cudaEventQuery");
    if (cudaError_t s = sticky())
        return fail(s);
    if (!live_event(event))
        return fail(cudaErrorInvalidResourceHandle);
    if (!done(event->op)) {
        finish(event->op);
        return cudaErrorNotReady;
    }
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    call_scope cs("cudaEventSynchronize");
    if (cudaError_t s = sticky())
        return fail(s);
    if (!live_event(event))
        return fail(cudaErrorInvalidResourceHandle);
    finish(event->op);
    return fail(sticky());
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!ms)
        return fail(cudaErrorInvalidValue);
    if (!live_event(start) || !live_event(end))
        return fail(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming || !start->recorded ||
        !end->recorded)
        return fail(cudaErrorInvalidResourceHandle);
    if (!done(start->op) || !done(end->op))
        return cudaErrorNotReady; /* not an error: as cudaEventQuery's */
    *ms = (float)((end->when - start->when) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    std::lock_guard<std::mutex> lk(ft_emu::mu);
    if (!live_events.erase(event))
        return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

} /* extern "C" */
