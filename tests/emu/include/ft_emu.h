/* The emulated CUDA device (make CUDA=emu): the calls its parts share. The runtime
 * (tests/emu/runtime/) owns the device memory and implements these; the NCCL emulation
 * and the emulated cuBLAS use them to check the pointers and data they are handed.
 * C and C++ alike. */
#ifndef FT_EMU_H
#define FT_EMU_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Stops the process with "ft-emu: <call>: <message>" on stderr (and the kernel or call
 * running, when there is one): what compute-sanitizer would report on a real GPU. */
__attribute__((noreturn, format(printf, 2, 3))) void ft_emu_abort(const char *call,
                                                                    const char *fmt, ...);

/* Whether [p, p + bytes) lies inside one live allocation of the emulated device. */
int ft_emu_is_device(const void *p, size_t bytes);

/* Stops (ft_emu_abort naming call and what, e.g. "ncclAllReduce", "sendbuff") unless
 * [p, p + bytes) lies inside one live device allocation: a host pointer, freed memory or a
 * range past the end of its allocation are all reported, with the allocation's size and
 * where it was freed when that is known. */
void ft_emu_check_device(const void *p, size_t bytes, const char *call, const char *what);

/* Stops unless no element of the device range [p, p + bytes) still holds the poison that
 * fresh device memory is filled with (elem_size 2: bf16 0xFFFF, 4: fp32 0xFFFFFFFF, 8:
 * fp64): a read of memory never written. */
void ft_emu_check_written(const void *p, size_t bytes, int elem_size, const char *call,
                          const char *what);

/* The emulated devices: how many this process sees, and the current one. */
int ft_emu_device_count(void);
int ft_emu_current_device(void);

/* Whether this process has opened a context on visible device `device`: the first call
 * that needs one there (cudaMalloc, cudaMemGetInfo, a stream or event, a launch,
 * cublasCreate) opens it; cudaSetDevice and the property queries do not. With
 * FT_EMU_CONTEXT_LOG=file each context opened appends "ft-emu: context: pid P rank R
 * device D (ordinal O)" to file (D: the emulated machine's device, O: its ordinal here;
 * R: OMPI_COMM_WORLD_RANK or -): how a test sees which devices each rank touched. */
int ft_emu_context_open(int device);

/* With FT_EMU_ASYNC=1 the work issued on a stream (kernel launches, cudaMemcpyAsync,
 * cudaMemsetAsync, the device-side cudaMemcpy and cudaMemset, cuBLAS calls, event records
 * and stream waits) is queued and runs only when something forces it (docs/gpu.md, The
 * emulated device). ft_emu_pending: how many such operations are queued and not run yet
 * in this process (always 0 without FT_EMU_ASYNC): how a test sees that a function that
 * must wait for the device did. */
size_t ft_emu_pending(void);

/* Runs what is queued on `stream` (NULL: the legacy default stream of the current device)
 * and what that waits for, as cudaStreamSynchronize would, but without its checks: the
 * NCCL emulation runs a collective when it is called, after the work of its stream. */
struct ft_emu_stream;
void ft_emu_stream_flush(struct ft_emu_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
