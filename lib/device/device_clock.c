#include "device/device_clock.h"

#include <time.h>

#ifdef FT_HAVE_CUDA
#include "cuda/cuda_ops.h"
#endif

double ft_device_clock(ft_device device)
{
#ifdef FT_HAVE_CUDA
    if (device == FT_DEV_CUDA)
        ft_cuda_synchronize(); /* the span's work, not just its issue */
#else
    (void)device;
#endif
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
