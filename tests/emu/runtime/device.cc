/* The emulated devices and the runtime's errors: device count, selection and properties
 * (FT_EMU_ARCH's), PCI bus ids, peer access, versions, the last error of each host thread
 * and the sticky error, and the names and texts of the error codes (the toolkit's). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "cuda_runtime_api.h"
#include "emu_internal.h"

namespace ft_emu {

namespace {
thread_local cudaError_t last_error = cudaSuccess;
thread_local int current = 0;
std::atomic<int> sticky_error{cudaSuccess};
std::mutex peer_mu;
bool peers[max_devices][max_devices];
std::atomic<bool> context_open[max_devices];

/* The device bus ids follow the emulated machine's numbering, so two processes that see
 * one emulated device under different ordinals still agree on which it is. */
int bus_of(int ordinal) { return 0x10 + cfg().visible[ordinal]; }

bool valid(int device) { return device >= 0 && device < cfg().nvisible; }
} // namespace

cudaError_t fail(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

cudaError_t sticky() { return (cudaError_t)sticky_error.load(); }

void set_sticky(cudaError_t e)
{
    int none = cudaSuccess;
    sticky_error.compare_exchange_strong(none, (int)e);
    last_error = e;
}

int current_device(cudaError_t *err)
{
    if (cfg().nvisible == 0) {
        *err = cudaErrorNoDevice;
        return -1;
    }
    return current;
}

/* A real GPU's context costs ~500 MiB of its memory, so which devices a process opens one
 * on matters (a rank should touch its own GPU only). The log line names the emulated
 * machine's device, so the lines of ranks that see different devices compare. */
int context_device(cudaError_t *err)
{
    int d = current_device(err);
    if (d >= 0 && !context_open[d].exchange(true)) {
        const char *log = getenv("FT_EMU_CONTEXT_LOG");
        if (log && *log) {
            char line[160];
            const char *rank = getenv("OMPI_COMM_WORLD_RANK");
            int n = snprintf(line, sizeof line, "ft-emu: context: pid %d rank %s device %d (ordinal %d)\n",
                             (int)getpid(), rank ? rank : "-", cfg().visible[d], d);
            int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
            if (fd >= 0) {
                if (write(fd, line, (size_t)n) != n) { /* a test sees the line missing */
                }
                close(fd);
            }
        }
    }
    return d;
}

const cudaDeviceProp &props(int device)
{
    static cudaDeviceProp p[max_devices];
    static std::once_flag once;
    std::call_once(once, [] {
        const config &c = cfg();
        for (int d = 0; d < c.nvisible; d++) {
            cudaDeviceProp &q = p[d];
            memset(&q, 0, sizeof q);
            snprintf(q.name, sizeof q.name, "%s (emulated)", c.a->name);
            q.totalGlobalMem = c.mem;
            q.sharedMemPerBlock = 48 << 10;
            q.sharedMemPerBlockOptin = c.a->smem_optin;
            q.sharedMemPerMultiprocessor = c.a->smem_per_sm;
            q.regsPerBlock = 65536;
            q.warpSize = 32;
            q.maxThreadsPerBlock = 1024;
            q.maxThreadsDim[0] = q.maxThreadsDim[1] = 1024;
            q.maxThreadsDim[2] = 64;
            q.maxGridSize[0] = 2147483647;
            q.maxGridSize[1] = q.maxGridSize[2] = 65535;
            q.major = c.a->major;
            q.minor = c.a->minor;
            q.multiProcessorCount = c.a->sms;
            q.maxThreadsPerMultiProcessor = c.a->minor == 0 ? 2048 : 1536;
            q.l2CacheSize = c.a->l2;
            q.pciBusID = bus_of(d);
            q.unifiedAddressing = 1;
        }
    });
    return p[device];
}

bool peer_enabled(int device, int peer)
{
    std::lock_guard<std::mutex> lk(peer_mu);
    return device == peer || peers[device][peer];
}

} // namespace ft_emu

using namespace ft_emu;

extern "C" {

int ft_emu_current_device(void) { return cfg().nvisible ? current : -1; }

int ft_emu_context_open(int device)
{
    return device >= 0 && device < cfg().nvisible && context_open[device].load();
}

cudaError_t cudaGetLastError(void)
{
    if (cudaError_t s = sticky())
        return s;
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    if (cudaError_t s = sticky())
        return s;
    return last_error;
}

static const struct {
    cudaError_t e;
    const char *name, *text;
} errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
     "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled",
     "peer access has not been enabled"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t error)
{
    for (const auto &x : errors)
        if (x.e == error)
            return x.name;
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t error)
{
    for (const auto &x : errors)
        if (x.e == error)
            return x.text;
    return "unrecognized error code";
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return fail(cudaErrorInvalidValue);
    *count = cfg().nvisible;
    return *count ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    if (cfg().nvisible == 0)
        return fail(cudaErrorNoDevice);
    if (!valid(device))
        return fail(cudaErrorInvalidDevice);
    current = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return fail(cudaErrorInvalidValue);
    cudaError_t err;
    int d = current_device(&err);
    if (d < 0)
        return fail(err);
    *device = d;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        return fail(cudaErrorInvalidValue);
    if (!valid(device))
        return fail(cfg().nvisible ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    *prop = props(device);
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return fail(cudaErrorInvalidValue);
    if (!valid(device))
        return fail(cfg().nvisible ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    const cudaDeviceProp &p = props(device);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrPciBusId: *value = p.pciBusID; break;
    case cudaDevAttrPciDeviceId: *value = p.pciDeviceID; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    if (!pciBusId || len <= 0)
        return fail(cudaErrorInvalidValue);
    if (!valid(device))
        return fail(cfg().nvisible ? cudaErrorInvalidDevice : cudaErrorNoDevice);
    if (snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", bus_of(device)) >= len)
        return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    if (!canAccessPeer)
        return fail(cudaErrorInvalidValue);
    if (!valid(device) || !valid(peerDevice))
        return fail(cudaErrorInvalidDevice);
    *canAccessPeer = device != peerDevice; /* one host memory under them all */
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    if (flags)
        return fail(cudaErrorInvalidValue);
    cudaError_t err;
    int d = context_device(&err);
    if (d < 0)
        return fail(err);
    if (!valid(peerDevice) || peerDevice == d)
        return fail(cudaErrorInvalidDevice);
    std::lock_guard<std::mutex> lk(peer_mu);
    if (peers[d][peerDevice])
        return fail(cudaErrorPeerAccessAlreadyEnabled);
    peers[d][peerDevice] = true;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (cudaError_t s = sticky())
        return fail(s);
    cudaError_t err;
    int dev = context_device(&err);
    if (dev < 0)
        return fail(err);
    {
        call_scope cs("cudaDeviceSynchronize");
        finish_device(dev); /* FT_EMU_ASYNC: everything queued on the device */
    }
    check_all_guards("cudaDeviceSynchronize");
    return fail(sticky());
}

cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return fail(cudaErrorInvalidValue);
    *driverVersion = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return fail(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

} /* extern "C" */
