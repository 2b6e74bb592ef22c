/* Kernel launches on the emulated device (FT_LAUNCH in the emulated build): the checks CUDA
 * makes before it runs a kernel, the checks compute-sanitizer makes of its pointers, then
 * the engine (exec.cc), then the guard bytes of every allocation the kernel was handed.
 *
 * A launch CUDA would refuse is refused the same way, with the error left for
 * cudaGetLastError (the kernel does not run): no device (cudaErrorNoDevice), a bad stream
 * (cudaErrorInvalidResourceHandle), a grid or block outside the device's limits
 * (cudaErrorInvalidConfiguration), more dynamic shared memory than the kernel's
 * MaxDynamicSharedMemorySize (48 KiB unless cudaFuncSetAttribute raised it, at most the
 * device's sharedMemPerBlockOptin; cudaErrorInvalidValue). A pointer among the arguments
 * (or inside a struct argument) that is not device memory of the launch's device, or is
 * freed, stops the run with a message naming the kernel, the argument and what the
 * pointer is. A kernel that calls __trap ends the launch and leaves the sticky
 * cudaErrorLaunchFailure. */
#include <stdio.h>
#include <string.h>

#include <map>
#include <functional> /* before cuda_runtime.h, which defines __noinline__ */
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_runtime.h"
#include "emu_internal.h"

namespace ft_emu {

struct launch {
    launch_site site;
    int device;
    char name[256];
    std::vector<const alloc *> touched;
};

namespace {
std::mutex mu;
std::map<const void *, int> max_dynamic_smem; /* cudaFuncSetAttribute's, per kernel */

/* "att_forward_kernel<2>" from the kernel's symbol (no namespace noise, no parameters),
 * else the launch's text. */
void kernel_name(const launch_site &s, char *buf, size_t n)
{
    char sym[512];
    symbolize(s.kernel, sym, sizeof sym);
    char *p = sym;
    static const char *const noise[] = {"(anonymous namespace)::"};
    for (const char *z : noise) {
        size_t len = strlen(z);
        char *q;
        while ((q = strstr(p, z)))
            memmove(q, q + len, strlen(q + len) + 1);
    }
    int depth = 0;
    for (char *q = p; *q; q++) { /* cut the parameter list */
        if (*q == '<')
            depth++;
        else if (*q == '>')
            depth--;
        else if (*q == '(' && depth == 0 && q != p) {
            *q = '\0';
            break;
        }
    }
    const char *name = sym[0] == '0' && sym[1] == 'x' ? s.text : sym;
    size_t len = strlen(name) < n - 1 ? strlen(name) : n - 1;
    memcpy(buf, name, len);
    buf[len] = '\0';
}

bool fits(const dim3 &g, const dim3 &b, const cudaDeviceProp &p)
{
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    return g.x >= 1 && g.y >= 1 && g.z >= 1 && b.x >= 1 && b.y >= 1 && b.z >= 1 &&
           g.x <= (unsigned)p.maxGridSize[0] && g.y <= (unsigned)p.maxGridSize[1] &&
           g.z <= (unsigned)p.maxGridSize[2] && b.x <= (unsigned)p.maxThreadsDim[0] &&
           b.y <= (unsigned)p.maxThreadsDim[1] && b.z <= (unsigned)p.maxThreadsDim[2] &&
           threads <= (unsigned long long)p.maxThreadsPerBlock;
}
} // namespace

launch *launch_begin(const launch_site &site)
{
    static thread_local launch l;
    if (cudaError_t s = sticky()) {
        fail(s);
        return nullptr;
    }
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0) {
        fail(err);
        return nullptr;
    }
    if (cudaError_t s = check_stream((cudaStream_t)site.stream)) {
        fail(s);
        return nullptr;
    }
    const cudaDeviceProp &p = props(dev);
    if (!fits(site.grid, site.block, p)) {
        fail(cudaErrorInvalidConfiguration);
        return nullptr;
    }
    size_t limit = p.sharedMemPerBlock;
    {
        std::lock_guard<std::mutex> lk(mu);
        auto it = max_dynamic_smem.find(site.kernel);
        if (it != max_dynamic_smem.end())
            limit = (size_t)it->second;
    }
    if (site.smem > limit) {
        fail(cudaErrorInvalidValue);
        return nullptr;
    }
    l.site = site;
    l.device = dev;
    l.touched.clear();
    kernel_name(site, l.name, sizeof l.name);
    return &l;
}

const char *launch_name(launch *l) { return l->name; }

/* "a float*" for a pointer argument; "att_args field 3, a const float*" for a field */
static void describe_arg(char *buf, size_t n, const char *path, const char *type)
{
    if (strcmp(path, type))
        snprintf(buf, n, "%s, a %s", path, type);
    else
        snprintf(buf, n, "a %s", type);
}

void check_pointer(launch &l, int arg, const char *path, const char *type, const void *p)
{
    if (!p)
        return;
    bool freed;
    const alloc *a = find_alloc(p, &freed);
    char call[320], argd[256];
    snprintf(call, sizeof call, "kernel %s (launched at %s:%d)", l.name, l.site.file, l.site.line);
    describe_arg(argd, sizeof argd, path, type);
    if (a) {
        int d = alloc_device(a);
        if (d != l.device && !peer_enabled(l.device, d))
            ft_emu_abort(call, "argument %d (%s) points to memory of device %d, but the kernel "
                               "runs on device %d (no peer access enabled)",
                         arg, argd, d, l.device);
        for (const alloc *x : l.touched)
            if (x == a)
                return;
        l.touched.push_back(a);
        return;
    }
    char what[1024];
    if (!(describe_device_address && describe_device_address(p, what, sizeof what)))
        snprintf(what, sizeof what, "not device memory: a host pointer handed to a kernel");
    ft_emu_abort(call, "argument %d (%s) is %p: %s", arg, argd, p, what);
}

static void run_launch(const launch &l, void (*body)(void *), void *arg)
{
    grid_run run = {l.site.grid, l.site.block, l.site.smem, l.name, body, arg};
    if (!run_grid(run)) { /* a trap: the context is lost, as on the GPU */
        set_sticky(cudaErrorLaunchFailure);
        return;
    }
    char after[320];
    snprintf(after, sizeof after, "kernel %s", l.name);
    for (const alloc *a : l.touched)
        check_guards(a, after);
}

void launch_run(launch *l, void (*body)(void *), void *arg, void (*drop)(void *))
{
    std::shared_ptr<void> args(arg, drop);
    if (!deferred()) {
        run_launch(*l, body, arg);
        return;
    }
    auto queued = std::make_shared<launch>(*l); /* l is the thread's, reused by the next */
    char call[320];
    snprintf(call, sizeof call, "kernel %s (launched at %s:%d)", l->name, l->site.file, l->site.line);
    issue(lane_of((cudaStream_t)l->site.stream), call,
          [queued, body, args] { run_launch(*queued, body, args.get()); });
}

} // namespace ft_emu

using namespace ft_emu;

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr,
                                            int value)
{
    if (cudaError_t s = sticky())
        return fail(s);
    if (!func)
        return fail(cudaErrorInvalidDeviceFunction);
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0)
        return fail(err);
    switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
        /* the device's opt-in limit (less the kernel's static shared memory, which the
         * emulation does not know: taken as 0) */
        if (value < 0 || (size_t)value > props(dev).sharedMemPerBlockOptin)
            return fail(cudaErrorInvalidValue);
        {
            std::lock_guard<std::mutex> lk(ft_emu::mu);
            max_dynamic_smem[func] = value;
        }
        return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
        return value < -1 || value > 100 ? fail(cudaErrorInvalidValue) : cudaSuccess;
    }
    return fail(cudaErrorInvalidValue);
}
