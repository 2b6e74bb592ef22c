/* TEST STAND-IN, not the emulated runtime: the few CUDA runtime declarations that
 * tests/emu/include/nccl.h and tests/emu/test_nccl_emu.c need, for building and testing
 * the NCCL emulation (make test-nccl-emu) before the emulated runtime
 * (tests/emu/runtime/, make CUDA=emu) exists. Names and signatures are CUDA's; the
 * definitions are in ft_emu_standin.c. tests/emu/include/cuda_runtime_api.h, once it
 * exists, comes first on the include path and this file is no longer read. */
#ifndef FT_EMU_STANDIN_CUDA_RUNTIME_API_H
#define FT_EMU_STANDIN_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *cudaStream_t;

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2
} cudaError_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind);

#ifdef __cplusplus
}
#endif

#endif
