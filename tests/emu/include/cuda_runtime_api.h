/* The emulated CUDA device (make CUDA=emu): the runtime API that lib/, kernels/cuda and the
 * GPU tier call, C and C++ alike, in place of the toolkit's cuda_runtime_api.h. The
 * numbers of the enums are the toolkit's (so an error printed as a number means the same);
 * the structs hold the fields the emulation fills, not the toolkit's whole layout.
 *
 * The calls run synchronously, in the order they are issued, on whatever stream they are
 * given: a schedule CUDA's stream order allows (the most serial one), so it is a correct
 * emulation of stream order; it shows no race between streams. The implementation is in
 * tests/emu/runtime/; see docs/gpu.md (The emulated device). */
#ifndef FT_EMU_CUDA_RUNTIME_API_H
#define FT_EMU_CUDA_RUNTIME_API_H

#include <stddef.h>

#include "ft_emu.h"

/* The runtime version the emulation answers with (cudaRuntimeGetVersion). */
#define CUDART_VERSION 12040

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorCudartUnloading = 4,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidPitchValue = 12,
    cudaErrorInvalidSymbol = 13,
    cudaErrorInvalidHostPointer = 16,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorPeerAccessAlreadyEnabled = 704,
    cudaErrorPeerAccessNotEnabled = 705,
    cudaErrorAssert = 710,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
} cudaMemcpyKind;

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};

/* Where a pointer lives (cudaPointerGetAttributes): device memory of `device`, or
 * cudaMemoryTypeUnregistered for any other pointer (CUDA 11 and later). */
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrPciBusId = 33,
    cudaDevAttrPciDeviceId = 34,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};

/* The fields of cudaDeviceProp the emulated devices fill (FT_EMU_ARCH picks them). */
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;       /* 48 KiB: the default limit of one block */
    size_t sharedMemPerBlockOptin;  /* what cudaFuncSetAttribute may raise it to */
    size_t sharedMemPerMultiprocessor;
    int regsPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
    int maxThreadsPerMultiProcessor;
    int l2CacheSize;
    int pciBusID, pciDeviceID, pciDomainID;
    int unifiedAddressing;
};

typedef struct ft_emu_stream *cudaStream_t;
typedef struct ft_emu_event *cudaEvent_t;

/* The legacy default stream and the per-thread one, as handles (CUDA's values). */
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02

/* ---- errors ---------------------------------------------------------------------------- */
/* The last error of this host thread, cleared (cudaGetLastError) or not (Peek). A sticky
 * error (a kernel that trapped: cudaErrorLaunchFailure) is never cleared, and every later
 * call returns it, as on a GPU whose context is lost. */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorName(cudaError_t error);
const char *cudaGetErrorString(cudaError_t error);

/* ---- devices --------------------------------------------------------------------------- */
/* FT_EMU_DEVICES devices (default 1), of them those CUDA_VISIBLE_DEVICES leaves. */
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device);
cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device);
cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice);
cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
/* Waits for every call issued so far (they all ran already), then checks the guard
 * bytes of every live allocation. */
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDriverGetVersion(int *driverVersion);
cudaError_t cudaRuntimeGetVersion(int *runtimeVersion);

/* ---- memory ---------------------------------------------------------------------------- */
/* At most FT_EMU_MEM bytes in all per device (cudaErrorMemoryAllocation beyond); fresh
 * memory holds 0xFF bytes (the "never written" pattern). */
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMemGetInfo(size_t *free, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemset(void *devPtr, int value, size_t count);
cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr);
/* Page-locks host memory [ptr, ptr + size) (nothing changes for the emulated copies): NULL
 * or 0 bytes is cudaErrorInvalidValue, device memory too; a range that overlaps one still
 * registered is cudaErrorHostMemoryAlreadyRegistered. Unregister takes the pointer that
 * was registered (else cudaErrorHostMemoryNotRegistered). With FT_EMU_PIN_LOG=file each
 * registration appends "ft-emu: pinned: pid P rank R bytes B" to file. */
#define cudaHostRegisterDefault 0u
cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);

/* ---- streams and events ------------------------------------------------------------------ */
cudaError_t cudaStreamCreate(cudaStream_t *stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);

/* ---- kernels --------------------------------------------------------------------------- */
/* MaxDynamicSharedMemorySize: at most the device's sharedMemPerBlockOptin (else
 * cudaErrorInvalidValue); a launch with more dynamic shared memory than the kernel's value
 * (48 KiB unless raised) fails with cudaErrorInvalidValue. */
cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value);

#ifdef __cplusplus
}
#endif

#endif
