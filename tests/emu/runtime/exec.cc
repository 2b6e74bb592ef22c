/* The kernel engine of the emulated device: a grid's blocks one after another on the
 * calling host thread, a block's threads as cooperative coroutines (ft_emu_kernel.h).
 *
 * A block's threads take turns in index order, round robin: each runs until it waits (at
 * __syncthreads, __syncwarp, a shuffle) or ends, then it switches straight to the next
 * thread that can run. A thread that ends hands its stack to the next thread not yet
 * started, so a kernel without barriers (the grid-stride loops) runs its whole block on
 * one stack with no switch between threads. The barriers are exact: __syncthreads waits for every thread of the block
 * that has not exited, and stops the run when threads wait at different __syncthreads;
 * __syncwarp and the shuffles wait for the lanes of their mask, and stop the run when one
 * of those lanes has exited (a hang on the hardware), when the calling lane is not in the
 * mask, or when a shuffle reads a lane outside it. A wait with no thread left that can run
 * is a deadlock, which stops the run too.
 *
 * The blocks of a launch are shared out between the launching host thread and workers
 * (FT_EMU_THREADS host threads in all; default the CPUs the process may use, at most 8):
 * each host thread runs whole blocks, with its own shared memory and stacks.
 *
 * The switch is a few instructions of x86-64 (callee-saved registers and the stack
 * pointer); other architectures use ucontext. Each thread stack ends in a guard page,
 * and so does the block's dynamic shared memory (filled with 0xFF bytes, the "never
 * written" pattern, when each block starts). No CUDA API symbol here. */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional> /* before cuda_runtime.h, which defines __noinline__ */
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

/* FT_EMU_UCONTEXT: the portable switch on x86-64 too (to test it there). */
#if defined(__x86_64__) && !defined(FT_EMU_UCONTEXT)
#define FT_EMU_X86_SWITCH 1
#else
#include <ucontext.h>
#endif

#include "cuda_runtime.h"
#include "emu_internal.h"

__thread uint3 threadIdx, blockIdx;
__thread dim3 blockDim, gridDim;

namespace ft_emu {
namespace {

constexpr size_t page = 4096;
constexpr size_t stack_bytes = 256 << 10;

/* ---- the switch ------------------------------------------------------------------------- */
#if defined(FT_EMU_X86_SWITCH)
struct coro {
    void *sp;
};
extern "C" void ft_emu_swap(void **save_sp, void *to_sp);
asm(R"(
    .text
    .globl ft_emu_swap
    .type ft_emu_swap, @function
ft_emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size ft_emu_swap, .-ft_emu_swap
)");

/* A stack whose first switch "returns" into entry, entered as a function is (the stack
 * 16-byte aligned before the pushed return address, which is 0: the end of a backtrace). */
void coro_init(coro &c, char *lo, char *hi, void (*entry)())
{
    (void)lo;
    uintptr_t top = (uintptr_t)hi & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = NULL;            /* entry's return address */
    *--sp = (void *)entry;   /* popped by ret */
    for (int i = 0; i < 6; i++)
        *--sp = NULL;        /* rbp rbx r12 r13 r14 r15 */
    c.sp = sp;
}
inline void coro_switch(coro &from, coro &to) { ft_emu_swap(&from.sp, to.sp); }
#else
struct coro {
    ucontext_t uc;
};
void coro_init(coro &c, char *lo, char *hi, void (*entry)())
{
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = lo;
    c.uc.uc_stack.ss_size = (size_t)(hi - lo);
    c.uc.uc_link = NULL;
    makecontext(&c.uc, entry, 0);
}
inline void coro_switch(coro &from, coro &to) { swapcontext(&from.uc, &to.uc); }
#endif

/* ---- a block's state ------------------------------------------------------------------- */
enum thread_state : uint8_t { NEW, READY, RUNNING, WAIT_BLOCK, WAIT_WARP, DONE };
enum warp_op : uint8_t { OP_NONE, OP_SYNC, OP_SHUFFLE };

struct thread {
    coro c;
    int stack; /* index into the engine's stacks, -1 when it holds none */
    uint3 idx;
    unsigned lane, warp;
    thread_state st;
    unsigned need; /* the lanes a warp wait waits for */
};

struct warp {
    unsigned exist;   /* the lanes the block has in this warp */
    unsigned exited;  /* lanes that have ended */
    unsigned arrived; /* lanes waiting at the current warp barrier */
    warp_op op;
    uint64_t val[32], res[32];
    int src[32];
};

struct stack {
    char *map, *lo, *hi; /* [map, lo): the guard page */
};

/* One host thread's engine: the block running there and what it reuses across launches. */
struct engine {
    const grid_run *run = nullptr;
    std::vector<thread> t;
    std::vector<warp> w;
    int n = 0, done = 0, next_new = 0, cur = 0;
    int bar_count = 0, bar_first = 0;
    const char *bar_file = nullptr; /* where the threads waiting at __syncthreads called it */
    int bar_line = 0;
    bool trapped = false;
    coro sched;
    std::vector<stack> stacks;
    std::vector<int> free_stacks;
    char *smem_map = nullptr; /* [smem_map, smem_guard): buffer; then one guard page */
    char *smem_guard = nullptr, *smem = nullptr;
    size_t smem_cap = 0, smem_size = 0;
};

__thread engine *E;  /* this host thread's engine */
__thread bool in_kernel;

int get_stack(engine &e)
{
    if (!e.free_stacks.empty()) {
        int i = e.free_stacks.back();
        e.free_stacks.pop_back();
        return i;
    }
    char *m = (char *)mmap(NULL, stack_bytes + page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        ft_emu_abort("kernel launch", "out of host memory for kernel thread stacks (%zu so far)",
                     e.stacks.size());
    mprotect(m, page, PROT_NONE);
    e.stacks.push_back({m, m + page, m + page + stack_bytes});
    return (int)e.stacks.size() - 1;
}

void put_stack(engine &e, int &i)
{
    if (i >= 0)
        e.free_stacks.push_back(i);
    i = -1;
}

[[noreturn]] void stop(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
[[noreturn]] void stop(const char *what, const char *fmt, ...)
{
    char call[256];
    snprintf(call, sizeof call, "%s in kernel %s", what, E && E->run ? E->run->name : "?");
    va_list ap;
    va_start(ap, fmt);
    vabort(call, fmt, ap);
}

inline void enter(engine &e, int i)
{
    e.cur = i;
    threadIdx = e.t[(size_t)i].idx;
}

/* The next thread after `from` that can run (round robin), or -1. */
inline int next_runnable(const engine &e, int from)
{
    for (int k = 1; k <= e.n; k++) {
        int i = from + k < e.n ? from + k : from + k - e.n;
        thread_state st = e.t[(size_t)i].st;
        if (st == READY || st == NEW)
            return i;
    }
    return -1;
}

void thread_main();
[[noreturn]] void deadlock(engine &e);

/* Runs thread i, switching away from `from` (saved there): a thread not started yet gets a
 * stack and starts in thread_main. Returns when something switches back to `from`. */
void resume(engine &e, int i, coro &from)
{
    thread &u = e.t[(size_t)i];
    if (u.st == NEW) {
        e.next_new = i + 1; /* threads start in index order: the ones not started are a suffix */
        u.stack = get_stack(e);
        const stack &s = e.stacks[(size_t)u.stack];
        coro_init(u.c, s.lo, s.hi, thread_main);
    }
    u.st = RUNNING;
    enter(e, i);
    coro_switch(from, u.c);
}

/* The running thread t waits: the next thread that can run runs; returns when t is run
 * again. No thread that can run (t waits too) is a deadlock. */
void suspend(engine &e, thread &t)
{
    int j = next_runnable(e, e.cur);
    if (j < 0)
        deadlock(e);
    resume(e, j, t.c);
}

void release_block(engine &e)
{
    for (thread &t : e.t)
        if (t.st == WAIT_BLOCK)
            t.st = READY;
    e.bar_count = 0;
}

/* A thread ended: a block barrier the others wait at may be complete now; a warp barrier
 * that waits for it never will be. */
void on_exit(engine &e, thread &t)
{
    if (e.bar_count > 0 && e.bar_count == e.n - e.done)
        release_block(e);
    warp &w = e.w[t.warp];
    w.exited |= 1u << t.lane;
    for (unsigned waiting = w.arrived; waiting; waiting &= waiting - 1) {
        unsigned l = (unsigned)__builtin_ctz(waiting);
        thread &o = e.t[(size_t)t.warp * 32 + l];
        if (o.need >> t.lane & 1)
            stop(w.op == OP_SYNC ? "__syncwarp" : "a shuffle",
                 "lane %u of warp %u exited while lane %u waits for it (mask 0x%08x): a "
                 "hang on the GPU",
                 t.lane, t.warp, l, o.need);
    }
}

void thread_main()
{
    for (;;) {
        engine &e = *E;
        e.run->body(e.run->arg);
        thread &t = e.t[(size_t)e.cur];
        t.st = DONE;
        e.done++;
        on_exit(e, t);
        if (e.next_new < e.n) { /* the next thread not started takes over this stack */
            thread &u = e.t[(size_t)e.next_new];
            u.stack = t.stack;
            t.stack = -1;
            u.st = RUNNING;
            enter(e, e.next_new++);
            continue;
        }
        /* every thread has started: the stack goes back (no thread to start can take it
         * before the switch below leaves it) */
        put_stack(e, t.stack);
        coro dead;
        int j = next_runnable(e, e.cur);
        if (j >= 0)
            resume(e, j, dead); /* never back */
        coro_switch(dead, e.sched); /* all done, or all waiting: the scheduler says which */
    }
}

[[noreturn]] void deadlock(engine &e)
{
    char buf[512];
    size_t at = 0;
    for (int i = 0; i < e.n && at < sizeof buf - 64; i++) {
        const thread &t = e.t[(size_t)i];
        if (t.st == WAIT_BLOCK || t.st == WAIT_WARP)
            at += (size_t)snprintf(buf + at, sizeof buf - at, "%sthread %d at %s", at ? ", " : "",
                                   i, t.st == WAIT_BLOCK ? "__syncthreads" : "a warp barrier");
    }
    stop("deadlock", "no thread of the block can go on: %s", buf);
}

/* The dynamic shared memory of a launch: smem bytes ending 128-byte aligned just before
 * a guard page, the slack after it (under 128 bytes) checked after each block. */
void smem_prepare(engine &e, size_t smem)
{
    size_t need = (smem + 127) / 128 * 128;
    if (need > e.smem_cap || !e.smem_map) {
        if (e.smem_map)
            munmap(e.smem_map, e.smem_cap + page);
        size_t cap = (need + page - 1) / page * page;
        if (cap == 0)
            cap = page;
        e.smem_map = (char *)mmap(NULL, cap + page, PROT_READ | PROT_WRITE,
                                  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (e.smem_map == MAP_FAILED)
            ft_emu_abort("kernel launch", "out of host memory for %zu bytes of shared memory", smem);
        e.smem_cap = cap;
        e.smem_guard = e.smem_map + cap;
        mprotect(e.smem_guard, page, PROT_NONE);
    }
    e.smem = e.smem_guard - need;
    e.smem_size = smem;
}

void run_block(engine &e)
{
    e.done = e.next_new = 0;
    e.bar_count = 0;
    e.trapped = false;
    for (thread &t : e.t) {
        t.st = NEW;
        t.stack = -1;
    }
    for (warp &w : e.w) {
        w.arrived = w.exited = 0;
        w.op = OP_NONE;
    }
    memset(e.smem, 0xff, (size_t)(e.smem_guard - e.smem));
    resume(e, 0, e.sched); /* back when no thread can run any more */
    if (e.done < e.n && !e.trapped)
        deadlock(e);
    for (thread &t : e.t) /* a trap leaves threads where they were */
        put_stack(e, t.stack);
    for (char *p = e.smem + e.smem_size; p < e.smem_guard; p++)
        if ((unsigned char)*p != 0xff)
            stop("shared memory", "a write %zu bytes past the end of the %zu bytes of dynamic "
                                  "shared memory of the launch",
                 (size_t)(p - e.smem - e.smem_size), e.smem_size);
}

inline thread &current(const char *what)
{
    engine *e = E;
    if (__builtin_expect(!e || !in_kernel, 0))
        ft_emu_abort(what, "called outside a kernel");
    return e->t[(size_t)e->cur];
}

/* A lane arrives at a warp barrier of mask `need` (the lanes that exist); returns when
 * every lane of it has arrived. The last to arrive completes a shuffle's exchange. */
void warp_arrive(engine &e, thread &t, unsigned mask, warp_op op)
{
    const char *what = op == OP_SYNC ? "__syncwarp" : "a shuffle";
    warp &w = e.w[t.warp];
    if (!(mask >> t.lane & 1))
        stop(what, "lane %u of warp %u calls it with mask 0x%08x, which leaves it out", t.lane,
             t.warp, mask);
    unsigned need = mask & w.exist;
    if (w.arrived && w.op != op)
        stop(what, "lanes of warp %u wait at a __syncwarp and at a shuffle at once (mask "
                   "0x%08x)",
             t.warp, need);
    if (need & w.exited)
        stop(what, "lane %u of warp %u waits for lane %d (mask 0x%08x), which has exited: a "
                   "hang on the GPU",
             t.lane, t.warp, __builtin_ctz(need & w.exited), need);
    w.arrived |= 1u << t.lane;
    w.op = op;
    t.need = need;
    if ((w.arrived & need) != need) {
        t.st = WAIT_WARP;
        suspend(e, t);
        return;
    }
    for (unsigned lanes = need; lanes; lanes &= lanes - 1) {
        unsigned l = (unsigned)__builtin_ctz(lanes);
        if (op == OP_SHUFFLE) {
            int s = w.src[l];
            if (s < 0 || s > 31 || !(need >> s & 1))
                stop("a shuffle", "lane %u of warp %u reads lane %d, which is not in the mask "
                                  "0x%08x (undefined on the GPU)",
                     l, t.warp, s, need);
            w.res[l] = w.val[s];
        }
        thread &o = e.t[(size_t)t.warp * 32 + l];
        if (o.st == WAIT_WARP)
            o.st = READY;
    }
    w.arrived &= ~need;
    if (!w.arrived)
        w.op = OP_NONE;
}

} // namespace

void syncthreads(const char *file, int line)
{
    thread &t = current("__syncthreads");
    engine &e = *E;
    if (e.bar_count == 0) {
        e.bar_file = file;
        e.bar_line = line;
        e.bar_first = e.cur;
    } else if (line != e.bar_line || (file != e.bar_file && strcmp(file, e.bar_file))) {
        stop("__syncthreads", "divergent barrier: thread %d waits at the __syncthreads of %s:%d, "
                              "thread %d arrives at the one of %s:%d",
             e.bar_first, e.bar_file, e.bar_line, e.cur, file, line);
    }
    if (++e.bar_count == e.n - e.done) {
        release_block(e);
        return;
    }
    t.st = WAIT_BLOCK;
    suspend(e, t);
}

void syncwarp(unsigned mask)
{
    thread &t = current("__syncwarp");
    warp_arrive(*E, t, mask, OP_SYNC);
}

uint64_t shuffle(unsigned mask, uint64_t bits, int src_lane)
{
    thread &t = current("__shfl_sync");
    engine &e = *E;
    warp &w = e.w[t.warp];
    w.val[t.lane] = bits;
    w.src[t.lane] = src_lane;
    warp_arrive(e, t, mask, OP_SHUFFLE);
    return w.res[t.lane];
}

uint64_t shuffle_xor(unsigned mask, uint64_t bits, int lane_mask, int width)
{
    thread &t = current("__shfl_xor_sync");
    engine &e = *E;
    int lane = (int)t.lane, src = lane ^ lane_mask;
    if (src >= (lane & ~(width - 1)) + width) /* outside the segment: the lane's own */
        src = lane;
    warp &w = e.w[t.warp];
    w.val[lane] = bits;
    w.src[lane] = src;
    warp_arrive(e, t, mask, OP_SHUFFLE);
    return w.res[lane];
}

unsigned lane_id() { return current("a lane's index").lane; }

void *dynamic_shared(size_t *bytes)
{
    current("dynamic shared memory");
    if (bytes)
        *bytes = E->smem_size;
    return E->smem;
}

void trap()
{
    thread &t = current("__trap");
    engine &e = *E;
    e.trapped = true;
    t.st = DONE;
    coro dead;
    coro_switch(dead, e.sched); /* never back: the scheduler ends the launch */
    abort();
}

void unwritten_load(const void *p, int bytes)
{
    char what[768];
    if (!(describe_device_address && describe_device_address(p, what, sizeof what)))
        snprintf(what, sizeof what, "not device memory");
    char call[256];
    snprintf(call, sizeof call, "ld() in kernel %s", running_kernel() ? running_kernel() : "?");
    ft_emu_abort(call, "read of device memory never written: the %d-byte value at %p holds "
                       "the all-ones pattern fresh device memory is filled with (%s)",
                 bytes, p, what);
}

namespace {

/* This host thread's engine made ready for a launch (its thread and warp tables, shared
 * memory, coordinates). */
engine &engine_for(const grid_run &run)
{
    if (!E)
        E = new engine;
    engine &e = *E;
    install_fault_handler();
    const unsigned nthreads = run.block.x * run.block.y * run.block.z;
    e.run = &run;
    e.n = (int)nthreads;
    e.t.resize(nthreads);
    e.w.resize((nthreads + 31) / 32);
    for (unsigned i = 0; i < nthreads; i++) {
        thread &t = e.t[i];
        t.idx = uint3{i % run.block.x, i / run.block.x % run.block.y,
                      i / (run.block.x * run.block.y)};
        t.lane = i % 32;
        t.warp = i / 32;
    }
    for (unsigned k = 0; k < e.w.size(); k++) {
        unsigned lanes = nthreads - 32 * k < 32 ? nthreads - 32 * k : 32;
        e.w[k].exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    }
    smem_prepare(e, run.smem);
    blockDim = run.block;
    gridDim = run.grid;
    return e;
}

/* The blocks of a launch, shared out between the calling thread and the workers: each
 * takes the next block number until none is left or a thread trapped. */
struct grid_job {
    const grid_run *run;
    unsigned long nblocks;
    std::atomic<unsigned long> next{0};
    std::atomic<bool> trapped{false};
};

void run_blocks(grid_job &job)
{
    engine &e = engine_for(*job.run);
    const dim3 g = job.run->grid;
    in_kernel = true;
    for (;;) {
        unsigned long b = job.next.fetch_add(1);
        if (b >= job.nblocks || job.trapped.load(std::memory_order_relaxed))
            break;
        blockIdx = uint3{(unsigned)(b % g.x), (unsigned)(b / g.x % g.y),
                         (unsigned)(b / ((unsigned long)g.x * g.y))};
        run_block(e);
        if (e.trapped)
            job.trapped = true;
    }
    in_kernel = false;
    e.run = nullptr;
}

/* Host threads that run blocks beside the launching one (FT_EMU_THREADS in all, default
 * the CPUs this process may use, at most 8): blocks are independent in CUDA, so any of
 * them may run anywhere, in any order. */
struct pool {
    std::mutex use; /* one launch at a time uses the workers */
    std::mutex mu;
    std::condition_variable wake, idle;
    grid_job *job = nullptr;
    unsigned long generation = 0;
    int busy = 0;
    std::vector<std::thread> workers;

    void work()
    {
        unsigned long seen = 0;
        for (;;) {
            grid_job *j;
            {
                std::unique_lock<std::mutex> lk(mu);
                wake.wait(lk, [&] { return generation != seen; });
                seen = generation;
                j = job;
            }
            run_blocks(*j);
            std::lock_guard<std::mutex> lk(mu);
            if (--busy == 0)
                idle.notify_all();
        }
    }
};

int host_threads()
{
    static const int n = [] {
        const char *v = getenv("FT_EMU_THREADS");
        if (v && *v) {
            int k = atoi(v);
            return k < 1 ? 1 : k > 64 ? 64 : k;
        }
        cpu_set_t set;
        int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        return cpus < 1 ? 1 : cpus > 8 ? 8 : cpus;
    }();
    return n;
}

pool &the_pool()
{
    static pool *p = [] {
        pool *q = new pool; /* never destroyed: its threads live as long as the process */
        for (int i = 1; i < host_threads(); i++) {
            q->workers.emplace_back([q] { q->work(); });
            q->workers.back().detach();
        }
        return q;
    }();
    return *p;
}

} // namespace

bool run_grid(const grid_run &run)
{
    grid_job job;
    job.run = &run;
    job.nblocks = (unsigned long)run.grid.x * run.grid.y * run.grid.z;
    /* one block (or one host thread): here, in order */
    int helpers = job.nblocks > 1 ? host_threads() - 1 : 0;
    if (helpers > (int)job.nblocks - 1)
        helpers = (int)job.nblocks - 1;
    if (helpers <= 0) {
        run_blocks(job);
        return !job.trapped;
    }
    pool &p = the_pool();
    std::unique_lock<std::mutex> mine(p.use, std::try_to_lock);
    if (!mine) { /* another host thread's launch has the workers: this one runs alone */
        run_blocks(job);
        return !job.trapped;
    }
    {
        std::lock_guard<std::mutex> lk(p.mu);
        p.job = &job;
        p.busy = (int)p.workers.size();
        p.generation++;
    }
    p.wake.notify_all();
    run_blocks(job);
    std::unique_lock<std::mutex> lk(p.mu);
    p.idle.wait(lk, [&] { return p.busy == 0; });
    return !job.trapped;
}

bool describe_kernel(char *buf, size_t n)
{
    engine *e = E;
    if (!e || !in_kernel || !e->run)
        return false;
    const thread &t = e->t[(size_t)e->cur];
    snprintf(buf, n, "kernel %s, block (%u,%u,%u) of (%u,%u,%u), thread (%u,%u,%u) of (%u,%u,%u)",
             e->run->name, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z,
             t.idx.x, t.idx.y, t.idx.z, blockDim.x, blockDim.y, blockDim.z);
    return true;
}

const char *running_kernel()
{
    engine *e = E;
    return e && in_kernel && e->run ? e->run->name : NULL;
}

bool describe_exec_address(const void *p, const void *sp, char *buf, size_t n)
{
    engine *e = E;
    if (!e)
        return false;
    const char *a = (const char *)p, *top = (const char *)sp;
    /* the running thread's stack pointer below its stack: a frame too big for it, whatever
     * address the first touch hit */
    if (in_kernel && e->t[(size_t)e->cur].stack >= 0) {
        const stack &s = e->stacks[(size_t)e->t[(size_t)e->cur].stack];
        if (top < s.lo && top + ((size_t)64 << 20) > s.lo) {
            snprintf(buf, n, "the kernel thread's stack pointer is %zu bytes below its %zu KiB "
                             "stack: a stack overflow (large local arrays?)",
                     (size_t)(s.lo - top), stack_bytes >> 10);
            return true;
        }
    }
    for (const stack &s : e->stacks)
        if (a >= s.map && a < s.lo) {
            snprintf(buf, n, "the guard page below a kernel thread's stack (%zu KiB): a stack "
                             "overflow (large local arrays?)",
                     stack_bytes >> 10);
            return true;
        }
    if (e->smem_guard && a >= e->smem_guard && a < e->smem_guard + page) {
        snprintf(buf, n, "%zu bytes past the end of the launch's %zu bytes of dynamic shared "
                         "memory",
                 (size_t)(a - (e->smem + e->smem_size)), e->smem_size);
        return true;
    }
    return false;
}

} // namespace ft_emu
