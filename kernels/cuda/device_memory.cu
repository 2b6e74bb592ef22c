/* Device memory helpers (see device_memory.h): thin, non-aborting wrappers over the
 * CUDA runtime. A failed call's error is cleared from the runtime (cudaGetLastError)
 * so that a later CUDA_CHECK(cudaGetLastError()) after a kernel launch does not report
 * a stale out-of-memory from here. */
#include <stdio.h>
#include <stdlib.h>

#include "core/ft_error.h"

#include "cuda_check.h"
#include "device_memory.h"

extern "C" int ft_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" void *ft_cuda_malloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0)
        return NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

extern "C" int ft_cuda_pci_bus_id(int index, char *buf, int len)
{
    if (cudaDeviceGetPCIBusId(buf, len, index) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

extern "C" int ft_cuda_select_device(int index, ft_err *err)
{
    CUDA_TRY(cudaSetDevice(index), err);
    return 0;
}

extern "C" int ft_cuda_is_device(const void *p)
{
    if (!p)
        return 0;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* before CUDA 11 a host pointer was an error */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}

extern "C" void ft_cuda_free(void *p)
{
    if (p && cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError();
}

extern "C" int ft_cuda_host_pin(void *p, size_t bytes, ft_err *err)
{
    if (!p || !bytes)
        return 0;
    CUDA_TRY(cudaHostRegister(p, bytes, cudaHostRegisterDefault), err);
    return 0;
}

extern "C" void ft_cuda_host_unpin(void *p)
{
    if (p && cudaHostUnregister(p) != cudaSuccess)
        (void)cudaGetLastError();
}

static int copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                const char *what, ft_err *err)
{
    if (bytes == 0)
        return 0;
    if (!dst || !src)
        return ft_fail(err, "%s of %zu bytes: NULL %s pointer", what, bytes,
                       dst ? "source" : "destination");
    CUDA_TRY(cudaMemcpy(dst, src, bytes, kind), err);
    return 0;
}

extern "C" int ft_cuda_memcpy_h2d(void *dst_device, const void *src_host, size_t bytes,
                                  ft_err *err)
{
    return copy(dst_device, src_host, bytes, cudaMemcpyHostToDevice, "host-to-device copy",
                err);
}

extern "C" int ft_cuda_memcpy_d2h(void *dst_host, const void *src_device, size_t bytes,
                                  ft_err *err)
{
    return copy(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, "device-to-host copy",
                err);
}

extern "C" int ft_cuda_memcpy_d2d(void *dst_device, const void *src_device, size_t bytes,
                                  ft_err *err)
{
    return copy(dst_device, src_device, bytes, cudaMemcpyDeviceToDevice, "device-to-device copy",
                err);
}

extern "C" int ft_cuda_memcpy_any(void *dst, const void *src, size_t bytes, ft_err *err)
{
    return copy(dst, src, bytes, cudaMemcpyDefault, "copy", err);
}

extern "C" int ft_cuda_memset0(void *dst_device, size_t bytes, ft_err *err)
{
    if (bytes == 0)
        return 0;
    CUDA_TRY(cudaMemset(dst_device, 0, bytes), err);
    return 0;
}
