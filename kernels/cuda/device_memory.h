/* Device memory helpers of the CUDA backend: device count, allocation and host<->device
 * copies, with C linkage so lib/ and tools/ (C11) can call them.
 *
 * Exists only in CUDA builds (FT_HAVE_CUDA); callers guard their use with it. None of
 * these aborts: a machine without a GPU or driver is an answer, not a crash. */
#ifndef FT_DEVICE_MEMORY_H
#define FT_DEVICE_MEMORY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ft_err;

/* Number of CUDA devices the runtime sees; 0 when there is no device or no driver. */
int ft_cuda_device_count(void);

/* The PCI bus id of device ordinal index ("0000:3b:00.0") into buf. 0, or -1. */
int ft_cuda_pci_bus_id(int index, char *buf, int len);

/* Makes device ordinal index the calling thread's current device. 0, or -1 with err. */
int ft_cuda_select_device(int index, struct ft_err *err);

/* Opens the CUDA backend's context on the current device (the cuBLAS handle, cuBLAS's
 * workspace and the ops' scratch), which the first op would otherwise open and could only
 * abort on failure. 0, or -1 with err (err->oom when the device memory has no room for
 * them). Opened once per process; later calls return 0. */
int ft_cuda_context_open(struct ft_err *err);

/* Device buffer of `bytes` bytes on the current device (uninitialised). NULL when out
 * of device memory, when there is no device, or when bytes == 0; callers turn that into
 * an ft_err naming what they were allocating, as with ft_alloc. */
void *ft_cuda_malloc(size_t bytes);

/* 1 when p points into device memory (cudaPointerGetAttributes), 0 for host memory and
 * NULL. */
int ft_cuda_is_device(const void *p);

/* Frees a buffer from ft_cuda_malloc; NULL is a no-op. */
void ft_cuda_free(void *p);

/* Page-locks (pins) host memory [p, p + bytes) so that copies to and from the device run
 * at full bandwidth (cudaHostRegister); unpin takes the same p. 0, or -1 with err. */
int ft_cuda_host_pin(void *p, size_t bytes, struct ft_err *err);
void ft_cuda_host_unpin(void *p);

/* Sets `bytes` bytes at a device pointer to zero (synchronous). 0, or -1 with err. */
int ft_cuda_memset0(void *dst_device, size_t bytes, struct ft_err *err);

/* Synchronous copies of `bytes` bytes (0 is a no-op). Return 0, or -1 with err (may be
 * NULL) naming the CUDA error. memcpy_any: either side may be host or device memory, the
 * direction comes from the pointers (unified addressing, every 64-bit CUDA platform). */
int ft_cuda_memcpy_any(void *dst, const void *src, size_t bytes, struct ft_err *err);
int ft_cuda_memcpy_h2d(void *dst_device, const void *src_host, size_t bytes,
                       struct ft_err *err);
int ft_cuda_memcpy_d2h(void *dst_host, const void *src_device, size_t bytes,
                       struct ft_err *err);
int ft_cuda_memcpy_d2d(void *dst_device, const void *src_device, size_t bytes,
                       struct ft_err *err);

#ifdef __cplusplus
}
#endif

#endif
