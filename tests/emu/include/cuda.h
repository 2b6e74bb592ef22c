/* The emulated CUDA device (make CUDA=emu): the few names of the driver API's cuda.h that
 * lib/device/gpu_probe.c checks its hand-made declarations against (the toolkit's
 * numbers). The emulated build's probe asks the emulated runtime, not the driver. */
#ifndef FT_EMU_CUDA_H
#define FT_EMU_CUDA_H

#include "cuda_runtime_api.h"

#define CUDA_VERSION CUDART_VERSION

typedef int CUdevice;
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100
} CUresult;
typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
} CUdevice_attribute;

#endif
