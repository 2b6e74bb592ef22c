/* Streams and events of the emulated device. Every call runs synchronously when it is
 * issued, so work on any stream is complete when the call returns: a stream or event is
 * always ready (cudaStreamQuery, cudaEventQuery say cudaSuccess) and a wait is a check of
 * its handles. That is one schedule CUDA's stream order allows (the most serial one), so
 * code that is correct under CUDA's ordering is correct here; a missing wait between two
 * streams does not show.
 *
 * Handles are checked: a stream or event used after cudaStreamDestroy / cudaEventDestroy,
 * or never created, is cudaErrorInvalidResourceHandle (the handles are never reused, so a
 * stale one is always caught). */
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
    double when; /* host seconds at the record: the emulation has no device time */
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
    if (cudaError_t s = sticky())
        return fail(s);
    return fail(check_stream(stream));
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    if (cudaError_t s = sticky())
        return fail(s);
    return fail(check_stream(stream));
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
    cudaEvent_t e = new ft_emu_event{flags, dev, false, 0};
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
    event->when = now();
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!live_event(event))
        return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess; /* the work before it is done: it ran when it was issued */
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    return cudaEventQuery(event);
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
