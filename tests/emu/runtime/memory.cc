/* The emulated device memory and the checks on it: cudaMalloc and friends, the copies and
 * sets, and ft_emu.h's calls for the other parts (the NCCL emulation, cuBLAS, launches).
 *
 * An allocation is a mapping of its own, Electric-Fence style:
 *
 *   [guard page][lead slack][data: size bytes][tail slack][guard page]
 *
 * The data starts 256-byte aligned (as cudaMalloc's) and ends as close to the second guard
 * page as that allows (the tail slack is under 256 bytes); the slack holds 0xFF bytes and
 * is checked after each kernel that was handed the allocation, after cuBLAS writes it, at
 * cudaDeviceSynchronize and at cudaFree: a write there is an out-of-bounds write. An
 * access further out hits a guard page (SIGSEGV, turned into a message by context.cc's
 * handler). Fresh data holds 0xFF bytes too: fp32 0xFFFFFFFF and bf16 0xFFFF are NaNs
 * that arithmetic never produces, so a load of one (ld() in the kernels, the GEMM's
 * operands, ft_emu_check_written) is a read of memory never written.
 *
 * Freed memory stays mapped without access (a quarantine of the last 16384 frees), so a
 * use after free faults, and the message names where it was freed. Every allocation
 * remembers the call stack that made it (and freed it) for the messages.
 *
 * Device memory lives in host memory: host code that reads a device pointer directly is
 * not caught (the GPU would fault); the copies and kernels check their pointers.
 *
 * With FT_EMU_ASYNC=1 the copies and sets are stream work (queue.cc), queued as CUDA's
 * "API synchronization behavior" allows at the most (all host memory here is pageable:
 * the emulation has no pinned memory):
 *   cudaMemcpyAsync, cudaMemsetAsync  queued on their stream; a host source is read and a
 *                      host destination written when the copy runs (CUDA: "might be
 *                      synchronous" for pageable memory, so code must not count on it);
 *                      host to host runs now;
 *   cudaMemcpy         on the legacy default stream: host to device waits for the
 *                      stream's earlier work, takes the source then and queues the rest
 *                      (the DMA "may not have completed" on return); device to host
 *                      returns once the copy is done (so it waits for the stream, and
 *                      through the legacy stream for every blocking stream); device to
 *                      device is queued ("no host-side synchronization"); host to host
 *                      runs now;
 *   cudaMemset         queued on the legacy default stream (asynchronous to the host for
 *                      device memory);
 *   cudaFree           runs all queued work first (it synchronizes the device), so no
 *                      queued operation touches freed memory.
 * The pointers are checked when a call is issued; the guard bytes when the work runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_runtime_api.h"
#include "emu_internal.h"

namespace ft_emu {

constexpr size_t page = 4096;
constexpr size_t align = 256;
constexpr size_t quarantine_max = 16384;
constexpr int frames_max = 12;

struct alloc {
    char *region;      /* the mapping: guard, area, guard */
    size_t region_len;
    char *area;        /* [area, area + area_len): lead slack, data, tail slack */
    size_t area_len;
    char *data;
    size_t size, charged; /* bytes asked for; bytes counted against FT_EMU_MEM */
    int device;
    bool freed;
    void *made_by[frames_max], *freed_by[frames_max];
    int made_n, freed_n;
};

namespace {
std::mutex mu;
std::map<uintptr_t, alloc *> regions; /* by region start: live and quarantined */
std::deque<alloc *> quarantine;
size_t used[max_devices];

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The allocation whose region holds p (guards included), live or freed; mu held. */
alloc *region_of(const void *p)
{
    auto it = regions.upper_bound((uintptr_t)p);
    if (it == regions.begin())
        return NULL;
    --it;
    alloc *a = it->second;
    return (const char *)p < a->region + a->region_len ? a : NULL;
}

/* region_of for a signal handler: gives up rather than wait for a lock held around it. */
alloc *region_of_unlocked(const void *p, bool *locked)
{
    *locked = false;
    for (int i = 0; i < 1000 && !*locked; i++)
        *locked = mu.try_lock();
    return *locked ? region_of(p) : NULL;
}

void frames_text(void *const *f, int n, char *buf, size_t len)
{
    format_frames(f, n, buf, len);
    if (!buf[0])
        snprintf(buf, len, "?");
}

/* What the address is, relative to allocation a ("byte 40 of a device allocation ..."). */
void describe(const alloc *a, const void *p, char *buf, size_t n)
{
    const char *c = (const char *)p;
    char made[512], freed[512];
    frames_text(a->made_by, a->made_n, made, sizeof made);
    if (a->freed) {
        frames_text(a->freed_by, a->freed_n, freed, sizeof freed);
        if (c >= a->data && c < a->data + a->size)
            snprintf(buf, n, "byte %zu of a device allocation of %zu bytes that was freed: a use "
                             "after free (freed by %s; allocated by %s)",
                     (size_t)(c - a->data), a->size, freed, made);
        else
            snprintf(buf, n, "beside a device allocation of %zu bytes that was freed (freed by "
                             "%s; allocated by %s)",
                     a->size, freed, made);
        return;
    }
    if (c < a->data)
        snprintf(buf, n, "byte %zu before the start of a device allocation of %zu bytes on "
                         "device %d: out of bounds (allocated by %s)",
                 (size_t)(a->data - c), a->size, a->device, made);
    else if (c >= a->data + a->size && c != a->data + a->size)
        snprintf(buf, n, "byte %zu past the end of a device allocation of %zu bytes on device "
                         "%d: out of bounds (allocated by %s)",
                 (size_t)(c - (a->data + a->size)) + 1, a->size, a->device, made);
    else if (c == a->data + a->size)
        snprintf(buf, n, "the end of a device allocation of %zu bytes on device %d (allocated "
                         "by %s)",
                 a->size, a->device, made);
    else
        snprintf(buf, n, "byte %zu of a device allocation of %zu bytes on device %d (allocated "
                         "by %s)",
                 (size_t)(c - a->data), a->size, a->device, made);
}

void describe_any(const void *p, char *buf, size_t n)
{
    std::unique_lock<std::mutex> lk(mu);
    alloc *a = region_of(p);
    if (!a) {
        snprintf(buf, n, "not device memory (a host pointer?)");
        return;
    }
    alloc copy = *a;
    lk.unlock();
    describe(&copy, p, buf, n);
}

/* The first byte of [from, to) that is not 0xFF, or NULL. */
const char *first_changed(const char *from, const char *to)
{
    for (const char *q = from; q < to; q++)
        if ((unsigned char)*q != 0xff)
            return q;
    return NULL;
}

enum side { HOST, DEVICE };

/* Checks one side of a copy or set: a device range must lie in one live allocation, a
 * host pointer must not be device memory. `call` names the API call, `what` the operand,
 * `kind_text` why that side must be what it is. */
void check_side(const void *p, size_t bytes, side want, const char *call, const char *what,
                const char *kind_text)
{
    std::unique_lock<std::mutex> lk(mu);
    alloc *a = region_of(p);
    alloc copy;
    if (a)
        copy = *a;
    lk.unlock();
    char d[1024];
    if (want == HOST) {
        if (!a)
            return;
        describe(&copy, p, d, sizeof d);
        ft_emu_abort(call, "%s %p is device memory, but %s (%s)", what, p, kind_text, d);
    }
    if (!a)
        ft_emu_abort(call, "%s %p is not device memory, but %s: a host pointer where a device "
                           "pointer belongs",
                     what, p, kind_text);
    const char *c = (const char *)p;
    describe(&copy, p, d, sizeof d);
    if (copy.freed || c < copy.data || c > copy.data + copy.size)
        ft_emu_abort(call, "%s %p: %s", what, p, d);
    if (bytes > (size_t)(copy.data + copy.size - c))
        ft_emu_abort(call, "%s: %zu bytes from %p run %zu bytes past the end of its allocation "
                           "(%s)",
                     what, bytes, p, bytes - (size_t)(copy.data + copy.size - c), d);
}

bool is_device(const void *p)
{
    std::lock_guard<std::mutex> lk(mu);
    alloc *a = region_of(p);
    return a != NULL;
}
} // namespace

alloc *find_alloc(const void *p, bool *freed)
{
    std::lock_guard<std::mutex> lk(mu);
    alloc *a = region_of(p);
    *freed = a && a->freed;
    const char *c = (const char *)p;
    if (!a || a->freed || c < a->data || c > a->data + a->size)
        return NULL;
    return a;
}

int alloc_device(const alloc *a) { return a->device; }

void check_guards(const alloc *a, const char *after)
{
    const char *lead = first_changed(a->area, a->data);
    const char *end = a->data + a->size, *tail = first_changed(end, a->area + a->area_len);
    if (!lead && !tail)
        return;
    char made[512];
    frames_text(a->made_by, a->made_n, made, sizeof made);
    if (tail)
        ft_emu_abort(after, "out-of-bounds write: byte %zu past the end of a device allocation "
                            "of %zu bytes at %p was written (found after %s; allocated by %s)",
                     (size_t)(tail - end) + 1, a->size, (void *)a->data, after, made);
    ft_emu_abort(after, "out-of-bounds write: byte %zu before the start of a device allocation "
                        "of %zu bytes at %p was written (found after %s; allocated by %s)",
                 (size_t)(a->data - lead), a->size, (void *)a->data, after, made);
}

void check_all_guards(const char *after)
{
    std::vector<alloc *> live;
    {
        std::lock_guard<std::mutex> lk(mu);
        for (auto &kv : regions)
            if (!kv.second->freed)
                live.push_back(kv.second);
    }
    for (alloc *a : live)
        check_guards(a, after);
}

bool describe_device_address(const void *p, char *buf, size_t n)
{
    bool locked;
    alloc *a = region_of_unlocked(p, &locked);
    if (!a) {
        if (locked)
            mu.unlock();
        return false;
    }
    alloc copy = *a;
    mu.unlock();
    describe(&copy, p, buf, n);
    return true;
}

/* ---- the copies, shared by the synchronous and the stream forms ------------------------- */
static const char *kind_name(cudaMemcpyKind k)
{
    static const char *const n[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice",
                                    "cudaMemcpyDeviceToHost", "cudaMemcpyDeviceToDevice",
                                    "cudaMemcpyDefault"};
    return (unsigned)k < 5 ? n[k] : "an invalid kind";
}

/* blocking: cudaMemcpy (on the legacy default stream); else cudaMemcpyAsync on stream */
static cudaError_t copy(const char *call, void *dst, const void *src, size_t count, cudaMemcpyKind kind,
                 cudaStream_t stream, bool blocking)
{
    call_scope cs(call);
    if (cudaError_t s = sticky())
        return fail(s);
    if (cudaError_t s = check_stream(stream))
        return fail(s);
    if ((unsigned)kind > 4)
        return fail(cudaErrorInvalidMemcpyDirection);
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return fail(cudaErrorInvalidValue);
    char why[128];
    if (kind == cudaMemcpyDefault) { /* the direction from the pointers (unified addressing) */
        bool dd = is_device(dst), sd = is_device(src);
        snprintf(why, sizeof why, "the copy's kind is cudaMemcpyDefault");
        check_side(dst, count, dd ? DEVICE : HOST, call, "dst", why);
        check_side(src, count, sd ? DEVICE : HOST, call, "src", why);
    } else {
        snprintf(why, sizeof why, "the copy's kind is %s", kind_name(kind));
        bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        check_side(dst, count, dd ? DEVICE : HOST, call, "dst", why);
        check_side(src, count, sd ? DEVICE : HOST, call, "src", why);
    }
    bool dd = kind == cudaMemcpyDefault ? is_device(dst)
                                        : kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool sd = kind == cudaMemcpyDefault ? is_device(src)
                                        : kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    lane l = lane_of(stream);
    if (!dd && !sd) { /* host to host: fully synchronous */
        memmove(dst, src, count);
        return cudaSuccess;
    }
    if (!blocking) {
        issue(l, call, [dst, src, count, dd] {
            if (dd || !at_exit())
                memmove(dst, src, count);
        });
        return cudaSuccess;
    }
    if (!sd) { /* the blocking host-to-device copy: the stream first, the source now */
        finish_lane(l);
        if (cudaError_t s = sticky())
            return fail(s);
        auto staged = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + count);
        issue(l, call, [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
        return cudaSuccess;
    }
    op_ref o = issue(l, call, [dst, src, count] { memmove(dst, src, count); });
    if (!dd) /* to the host: done when the call returns */
        finish(o);
    return fail(sticky());
}

static cudaError_t set(const char *call, void *p, int value, size_t count, cudaStream_t stream)
{
    call_scope cs(call);
    if (cudaError_t s = sticky())
        return fail(s);
    if (cudaError_t s = check_stream(stream))
        return fail(s);
    if (count == 0)
        return cudaSuccess;
    if (!p)
        return fail(cudaErrorInvalidValue);
    check_side(p, count, DEVICE, call, "devPtr", "it is what cudaMemset sets");
    issue(lane_of(stream), call, [p, value, count] { memset(p, value, count); });
    return cudaSuccess;
}

} // namespace ft_emu

using namespace ft_emu;

extern "C" {

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    call_scope cs("cudaMalloc");
    install_fault_handler();
    if (cudaError_t s = sticky())
        return fail(s);
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0)
        return fail(err);
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    if (size > ((size_t)1 << 48))
        return fail(cudaErrorMemoryAllocation);
    size_t charged = round_up(size, align);
    {
        std::lock_guard<std::mutex> lk(mu);
        if (used[dev] + charged > cfg().mem)
            return fail(cudaErrorMemoryAllocation);
        used[dev] += charged;
    }
    size_t area_len = round_up(charged, page), region_len = area_len + 2 * page;
    char *region = (char *)mmap(NULL, region_len, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) {
        std::lock_guard<std::mutex> lk(mu);
        used[dev] -= charged;
        return fail(cudaErrorMemoryAllocation);
    }
    mprotect(region, page, PROT_NONE);
    mprotect(region + page + area_len, page, PROT_NONE);
    alloc *a = new alloc();
    a->region = region;
    a->region_len = region_len;
    a->area = region + page;
    a->area_len = area_len;
    a->data = a->area + (area_len - charged);
    a->size = size;
    a->charged = charged;
    a->device = dev;
    a->made_n = capture(a->made_by, frames_max, 2);
    memset(a->area, 0xff, area_len); /* the "never written" pattern */
    {
        std::lock_guard<std::mutex> lk(mu);
        regions[(uintptr_t)region] = a;
    }
    *devPtr = a->data;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    call_scope cs("cudaFree");
    if (!devPtr)
        return cudaSuccess;
    finish_device(-1); /* cudaFree synchronizes: no queued work may touch it afterwards */
    std::unique_lock<std::mutex> lk(mu);
    alloc *a = region_of(devPtr);
    if (!a || a->freed || (char *)devPtr != a->data) {
        char d[1024];
        if (a) {
            alloc copy = *a;
            lk.unlock();
            describe(&copy, devPtr, d, sizeof d);
        } else {
            lk.unlock();
            snprintf(d, sizeof d, "not device memory (a host pointer?)");
        }
        ft_emu_abort("cudaFree", "%p is not the start of a live device allocation: %s%s", devPtr,
                     d, a && a->freed ? " (a double free)" : "");
    }
    lk.unlock();
    check_guards(a, "cudaFree");
    a->freed_n = capture(a->freed_by, frames_max, 2);
    /* no access from now on, and no memory behind it */
    mprotect(a->region, a->region_len, PROT_NONE);
    madvise(a->region, a->region_len, MADV_DONTNEED);
    lk.lock();
    a->freed = true;
    used[a->device] -= a->charged;
    quarantine.push_back(a);
    while (quarantine.size() > quarantine_max) {
        alloc *old = quarantine.front();
        quarantine.pop_front();
        regions.erase((uintptr_t)old->region);
        munmap(old->region, old->region_len);
        delete old;
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!free_bytes || !total)
        return fail(cudaErrorInvalidValue);
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0)
        return fail(err);
    std::lock_guard<std::mutex> lk(mu);
    *total = cfg().mem;
    *free_bytes = cfg().mem - used[dev];
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return copy("cudaMemcpy", dst, src, count, kind, 0, true);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    return copy("cudaMemcpyAsync", dst, src, count, kind, stream, false);
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    return set("cudaMemset", devPtr, value, count, 0);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return set("cudaMemsetAsync", devPtr, value, count, stream);
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!attr)
        return fail(cudaErrorInvalidValue);
    bool freed;
    alloc *a = find_alloc(ptr, &freed);
    memset(attr, 0, sizeof *attr);
    if (a) {
        attr->type = cudaMemoryTypeDevice;
        attr->device = alloc_device(a);
        attr->devicePointer = (void *)ptr;
    } else {
        attr->type = cudaMemoryTypeUnregistered;
        attr->device = -2; /* cudaInvalidDeviceId */
    }
    return cudaSuccess;
}

/* ---- ft_emu.h ----------------------------------------------------------------------------- */

int ft_emu_is_device(const void *p, size_t bytes)
{
    bool freed;
    alloc *a = find_alloc(p, &freed);
    return a && bytes <= (size_t)(a->data + a->size - (const char *)p);
}

void ft_emu_check_device(const void *p, size_t bytes, const char *call, const char *what)
{
    if (!p)
        ft_emu_abort(call, "%s is NULL", what);
    check_side(p, bytes, DEVICE, call, what, "it must be device memory");
}

void ft_emu_check_written(const void *p, size_t bytes, int elem_size, const char *call,
                          const char *what)
{
    ft_emu_check_device(p, bytes, call, what);
    if (elem_size != 2 && elem_size != 4 && elem_size != 8)
        ft_emu_abort(call, "ft_emu_check_written: element size %d (2, 4 or 8)", elem_size);
    const unsigned char *c = (const unsigned char *)p;
    size_t n = bytes / (size_t)elem_size, bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *e = c + i * (size_t)elem_size;
        bool ones = true;
        for (int b = 0; b < elem_size && ones; b++)
            ones = e[b] == 0xff;
        if (ones && !bad++)
            first = i;
    }
    if (bad) {
        char d[1024];
        describe_any(c + first * (size_t)elem_size, d, sizeof d);
        ft_emu_abort(call, "%s holds %zu element(s) never written (all-ones, the pattern of fresh "
                           "device memory), the first at index %zu of %zu: %s",
                     what, bad, first, n, d);
    }
}


/* Page-locked host ranges (cudaHostRegister): base -> bytes. */
static std::map<uintptr_t, size_t> &pinned()
{
    static std::map<uintptr_t, size_t> m;
    return m;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    (void)flags;
    if (cudaError_t s = sticky())
        return fail(s);
    bool freed;
    if (!ptr || !size || find_alloc(ptr, &freed))
        return fail(cudaErrorInvalidValue);
    uintptr_t lo = (uintptr_t)ptr, hi = lo + size;
    {
        std::lock_guard<std::mutex> lk(mu);
        auto &m = pinned();
        auto it = m.upper_bound(lo);
        if (it != m.end() && it->first < hi)
            return fail(cudaErrorHostMemoryAlreadyRegistered);
        if (it != m.begin() && std::prev(it)->first + std::prev(it)->second > lo)
            return fail(cudaErrorHostMemoryAlreadyRegistered);
        m[lo] = size;
    }
    const char *log = getenv("FT_EMU_PIN_LOG");
    if (log && *log) {
        char line[160];
        const char *rank = getenv("OMPI_COMM_WORLD_RANK");
        int n = snprintf(line, sizeof line, "ft-emu: pinned: pid %d rank %s bytes %zu\n",
                         (int)getpid(), rank ? rank : "-", size);
        FILE *f = fopen(log, "a");
        if (f) {
            fwrite(line, 1, (size_t)n, f);
            fclose(f);
        }
    }
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *ptr)
{
    std::lock_guard<std::mutex> lk(mu);
    auto &m = pinned();
    auto it = m.find((uintptr_t)ptr);
    if (!ptr || it == m.end())
        return fail(cudaErrorHostMemoryNotRegistered);
    m.erase(it);
    return cudaSuccess;
}

} /* extern "C" */
