/* Error checks for CUDA runtime and cuBLAS calls (after llm.c's cudaCheck).
 *
 * CUDA_CHECK(call) and CUBLAS_CHECK(call) evaluate the call once; on failure they print
 * file, line, the call's text and the library's error name and string to stderr, then
 * abort. They are for calls whose failure means the device or the program is broken
 * (a kernel launch, a stream sync): user input never reaches them.
 *
 * CUDA_TRY(call, err) is the recoverable form for library functions that follow
 * ft_error.h: on failure it fills err (with file and line) and returns -1 from the
 * enclosing function. The .cu file must include ft_error.h inside extern "C" { }. */
#ifndef FT_CUDA_CHECK_H
#define FT_CUDA_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t cuda_check_rc_ = (call);                                          \
        if (cuda_check_rc_ != cudaSuccess) {                                          \
            fprintf(stderr, "%s:%d: CUDA error %s: %s\n  in %s\n", __FILE__, __LINE__, \
                    cudaGetErrorName(cuda_check_rc_),                                 \
                    cudaGetErrorString(cuda_check_rc_), #call);                       \
            abort();                                                                  \
        }                                                                             \
    } while (0)

#define CUBLAS_CHECK(call)                                                            \
    do {                                                                              \
        cublasStatus_t cublas_check_rc_ = (call);                                     \
        if (cublas_check_rc_ != CUBLAS_STATUS_SUCCESS) {                              \
            fprintf(stderr, "%s:%d: cuBLAS error %s: %s\n  in %s\n", __FILE__,        \
                    __LINE__, cublasGetStatusName(cublas_check_rc_),                  \
                    cublasGetStatusString(cublas_check_rc_), #call);                  \
            abort();                                                                  \
        }                                                                             \
    } while (0)

#define CUDA_TRY(call, err)                                                           \
    do {                                                                              \
        cudaError_t cuda_try_rc_ = (call);                                            \
        if (cuda_try_rc_ != cudaSuccess) {                                            \
            (void)cudaGetLastError(); /* clear it: the next CUDA_CHECK is not about this */ \
            return ft_fail((err), "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,    \
                           cudaGetErrorString(cuda_try_rc_),                          \
                           cudaGetErrorName(cuda_try_rc_));                           \
        }                                                                             \
    } while (0)

#endif
