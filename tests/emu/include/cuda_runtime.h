/* The emulated CUDA device (make CUDA=emu): cuda_runtime.h. The runtime API (C and C++,
 * cuda_runtime_api.h) and, in C++, what kernels see (ft_emu_kernel.h): the qualifiers,
 * threadIdx and the other coordinates, barriers, shuffles, intrinsics, and the launch
 * that FT_LAUNCH expands to. */
#ifndef FT_EMU_CUDA_RUNTIME_H
#define FT_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include "ft_emu_kernel.h"

/* The C++ forms of cuda_runtime.h: a typed pointer to cudaMalloc, the kernel itself to
 * cudaFuncSetAttribute. */
template <class T> cudaError_t cudaMalloc(T **devPtr, size_t size)
{
    return cudaMalloc(reinterpret_cast<void **>(devPtr), size);
}

template <class T>
cudaError_t cudaFuncSetAttribute(T *func, enum cudaFuncAttribute attr, int value)
{
    return cudaFuncSetAttribute(reinterpret_cast<const void *>(func), attr, value);
}
#endif

#endif
