#include "device/gpu_monitor.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"
#endif

/* The few NVML types and calls used (nvml.h, ABI-stable since NVML 4). */
typedef int nvml_return;
typedef void *nvml_device;
typedef struct nvml_utilization {
    unsigned int gpu, memory;
} nvml_utilization;
typedef struct nvml_memory {
    unsigned long long total, free, used;
} nvml_memory;

struct ft_gpu_monitor {
    void *lib;
    nvml_device dev;
    nvml_return (*shutdown)(void);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
    nvml_return (*memory)(nvml_device, nvml_memory *);
};

static void note(char *why, size_t len, const char *msg)
{
    if (why && len)
        snprintf(why, len, "%s", msg);
}

ft_gpu_monitor *ft_gpu_monitor_open(int cuda_device, char *why, size_t why_len)
{
#ifndef FT_HAVE_CUDA
    (void)cuda_device;
    note(why, why_len, "this build has no CUDA");
    return NULL;
#elif defined(FT_CUDA_EMU)
    (void)cuda_device;
    note(why, why_len, "the GPU is emulated (make CUDA=emu): it has no NVML");
    return NULL;
#else
    char bus[64];
    if (ft_cuda_pci_bus_id(cuda_device, bus, (int)sizeof bus)) {
        note(why, why_len, "the GPU's PCI bus id is unknown");
        return NULL;
    }
    ft_gpu_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!m->lib) {
        note(why, why_len, "libnvidia-ml.so.1 (NVML) not found");
        free(m);
        return NULL;
    }
    /* function pointers from dlsym: POSIX guarantees the conversion */
    nvml_return (*init)(void) = (nvml_return(*)(void))dlsym(m->lib, "nvmlInit_v2");
    nvml_return (*by_bus)(const char *, nvml_device *) =
        (nvml_return(*)(const char *, nvml_device *))dlsym(m->lib,
                                                           "nvmlDeviceGetHandleByPciBusId_v2");
    m->shutdown = (nvml_return(*)(void))dlsym(m->lib, "nvmlShutdown");
    m->utilization = (nvml_return(*)(nvml_device, nvml_utilization *))dlsym(
        m->lib, "nvmlDeviceGetUtilizationRates");
    m->memory = (nvml_return(*)(nvml_device, nvml_memory *))dlsym(m->lib,
                                                                  "nvmlDeviceGetMemoryInfo");
    if (!init || !by_bus || !m->shutdown || !m->utilization || !m->memory) {
        note(why, why_len, "NVML lacks a function it needs");
    } else if (init() != 0) {
        note(why, why_len, "nvmlInit failed");
        m->shutdown = NULL;
    } else if (by_bus(bus, &m->dev) != 0) {
        note(why, why_len, "NVML does not know the GPU's PCI bus id");
    } else {
        return m;
    }
    ft_gpu_monitor_close(m);
    return NULL;
#endif
}

void ft_gpu_monitor_close(ft_gpu_monitor *m)
{
    if (!m)
        return;
    if (m->shutdown)
        m->shutdown();
    dlclose(m->lib);
    free(m);
}

void ft_gpu_monitor_sample(ft_gpu_monitor *m, double *util_pct, double *mem_used)
{
    *util_pct = *mem_used = -1;
    if (!m)
        return;
    nvml_utilization u;
    nvml_memory mem;
    if (m->utilization(m->dev, &u) == 0)
        *util_pct = u.gpu;
    if (m->memory(m->dev, &mem) == 0)
        *mem_used = (double)mem.used;
}
