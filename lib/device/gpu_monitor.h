/* How busy this rank's GPU is, for the training logs: NVML's utilization (the percent of
 * the last sample period in which a kernel ran) and the device memory in use (all
 * processes, the CUDA context and library workspaces included, which the tracked
 * allocator does not see).
 *
 * NVML (libnvidia-ml.so.1, installed with the driver) is loaded with dlopen, as
 * gpu_probe.h loads the driver, so a machine without it still runs: the monitor is then
 * absent and its figures unknown. The CUDA device is matched to NVML's by PCI bus id, so
 * CUDA_VISIBLE_DEVICES reordering does not confuse them. */
#ifndef FT_GPU_MONITOR_H
#define FT_GPU_MONITOR_H

#include <stddef.h>

typedef struct ft_gpu_monitor ft_gpu_monitor;

/* The monitor of CUDA device cuda_device; NULL when NVML or the device cannot be
 * reached, with the reason in why (may be NULL). */
ft_gpu_monitor *ft_gpu_monitor_open(int cuda_device, char *why, size_t why_len);
void ft_gpu_monitor_close(ft_gpu_monitor *m);

/* The utilization in percent and the device memory used in bytes, each -1 when unknown
 * (m NULL included). */
void ft_gpu_monitor_sample(ft_gpu_monitor *m, double *util_pct, double *mem_used);

#endif
