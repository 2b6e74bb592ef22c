/* The stream queues of the emulated device: where the work of a stream waits until
 * something forces it (FT_EMU_ASYNC=1), so that host code that reads the result of
 * asynchronous work before a synchronization sees what was there before, as it may on a
 * GPU. Without FT_EMU_ASYNC every operation runs when it is issued (the most serial of the
 * schedules CUDA allows), and nothing here holds state.
 *
 * An operation (a copy, a set, a kernel, a GEMM, an event's record or a stream's wait) is
 * queued with the operations it must follow: the previous one of its stream; for an
 * operation on the legacy default stream, the last one of every blocking stream of the
 * device (created without cudaStreamNonBlocking, or the per-thread default stream); for
 * one on a blocking stream, the last one of the device's legacy default stream; for a
 * cudaStreamWaitEvent, the event's record. Those are CUDA's rules of stream order
 * (the legacy default stream's implicit synchronization included). Forcing an operation
 * (finish) runs it and what it transitively follows, nothing else, in the order they were
 * issued (a topological order, since an operation only follows earlier ones): so a
 * cudaStreamSynchronize of one stream leaves another stream's unrelated work queued, and
 * a missing cudaStreamWaitEvent shows as a kernel reading what another stream has not
 * written yet.
 *
 * After a kernel traps (the sticky error), queued operations are dropped unrun, as a lost
 * context runs nothing more. Work still queued when the process exits runs then (atexit),
 * so its checks still stop a run that never waited for it (copies into host memory are
 * skipped then: their destination may be a stack frame that is gone). One lock (recursive: an operation may finish others through
 * the calls it makes) serializes the queues; the work runs on the host thread that forced
 * it. */
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "emu_internal.h"
#include "ft_emu.h"

namespace ft_emu {

struct op {
    unsigned long long seq;
    int device;
    std::string call;           /* for the stop messages while it runs */
    std::function<void()> run;  /* emptied once run */
    std::vector<op_ref> deps;   /* the operations it follows (cleared once run) */
    bool done;
    unsigned mark;              /* finish's visit mark */
};

namespace {
struct lane_state {
    op_ref tail;
    bool legacy, blocking;
};

std::recursive_mutex mu;
unsigned long long next_seq;
unsigned next_mark;
std::map<std::pair<int, const void *>, lane_state> lanes;
std::deque<op_ref> queued; /* issue order; done operations leave at the next finish */

void follow(op &o, const op_ref &d)
{
    if (d && !d->done)
        o.deps.push_back(d);
}

void run_one(op &o)
{
    if (!sticky()) {
        call_scope cs(o.call.c_str());
        o.run();
    }
    o.run = nullptr;
    o.deps.clear();
    o.done = true;
}

/* A process that ends with work queued: the work runs (and is checked) as the device
 * would finish it, so a kernel the host never waited for is still checked. */
bool exiting;

void run_at_exit()
{
    std::unique_lock<std::recursive_mutex> lk(mu, std::try_to_lock);
    if (!lk.owns_lock()) /* exit() while another thread runs work: leave it */
        return;
    exiting = true;
    std::vector<op_ref> all(queued.begin(), queued.end());
    for (const op_ref &o : all)
        finish(o);
}

void prune()
{
    queued.erase(std::remove_if(queued.begin(), queued.end(), [](const op_ref &o) { return o->done; }),
                 queued.end());
}
} // namespace

bool deferred()
{
    static const bool on = [] {
        const char *v = getenv("FT_EMU_ASYNC");
        return v && *v && strcmp(v, "0") != 0;
    }();
    return on;
}

op_ref issue(const lane &l, const char *call, std::function<void()> run, const op_ref &after,
             bool idle_now)
{
    if (!deferred()) {
        run();
        return nullptr;
    }
    std::lock_guard<std::recursive_mutex> lk(mu);
    op_ref o = std::make_shared<op>();
    o->seq = ++next_seq;
    o->device = l.device;
    o->call = call;
    o->run = std::move(run);
    o->done = false;
    o->mark = 0;
    lane_state &me = lanes[{l.device, l.key}];
    me.legacy = l.legacy;
    me.blocking = l.blocking;
    follow(*o, me.tail);
    follow(*o, after);
    if (l.legacy) {
        for (auto &kv : lanes)
            if (kv.first.first == l.device && !kv.second.legacy && kv.second.blocking)
                follow(*o, kv.second.tail);
    } else if (l.blocking) {
        auto it = lanes.find({l.device, (const void *)cudaStreamLegacy});
        if (it != lanes.end())
            follow(*o, it->second.tail);
    }
    if (idle_now && o->deps.empty()) { /* nothing before it: complete at once */
        run_one(*o);
        return nullptr;
    }
    me.tail = o;
    queued.push_back(o);
    static bool registered = atexit(run_at_exit) == 0;
    (void)registered;
    return o;
}

bool at_exit() { return exiting; }

bool done(const op_ref &o)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    return !o || o->done;
}

void finish(const op_ref &target)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (!target || target->done)
        return;
    /* what target transitively follows, still queued */
    unsigned m = ++next_mark;
    std::vector<op *> need, stack{target.get()};
    target->mark = m;
    while (!stack.empty()) {
        op *o = stack.back();
        stack.pop_back();
        need.push_back(o);
        for (const op_ref &d : o->deps)
            if (!d->done && d->mark != m) {
                d->mark = m;
                stack.push_back(d.get());
            }
    }
    std::sort(need.begin(), need.end(), [](const op *a, const op *b) { return a->seq < b->seq; });
    for (op *o : need)
        if (!o->done) /* an operation's calls may have finished others meanwhile */
            run_one(*o);
    prune();
}

op_ref lane_tail(const lane &l)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    auto it = lanes.find({l.device, l.key});
    return it == lanes.end() || !it->second.tail || it->second.tail->done ? nullptr
                                                                           : it->second.tail;
}

void finish_lane(const lane &l) { finish(lane_tail(l)); }

void finish_device(int device)
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    std::vector<op_ref> mine;
    for (const op_ref &o : queued)
        if (device < 0 || o->device == device)
            mine.push_back(o);
    for (const op_ref &o : mine)
        finish(o);
}

size_t pending()
{
    std::lock_guard<std::recursive_mutex> lk(mu);
    size_t n = 0;
    for (const op_ref &o : queued)
        n += !o->done;
    return n;
}

} // namespace ft_emu

extern "C" size_t ft_emu_pending(void) { return ft_emu::pending(); }

extern "C" void ft_emu_stream_flush(cudaStream_t stream)
{
    ft_emu::finish_lane(ft_emu::lane_of(stream));
}
