#include "device/run_device.h"

#include <stdio.h>
#include <string.h>

#ifdef FT_HAVE_CUDA
#include "cuda/device_memory.h"
#endif

const char *ft_device_name(ft_device d) { return d == FT_DEV_CUDA ? "cuda" : "cpu"; }

const char *ft_dtype_name(ft_dtype d)
{
    switch (d) {
    case FT_BF16: return "bf16";
    case FT_F16: return "fp16";
    default: return "fp32";
    }
}

bool ft_run_device_known(const char *name)
{
    return !strcmp(name, "auto") || !strcmp(name, "cpu") || !strcmp(name, "cuda");
}

int ft_run_device_choose(const char *want, bool bf16, const char *key,
                         ft_run_device_choice *out, ft_err *err)
{
    memset(out, 0, sizeof *out);
    if (!ft_run_device_known(want))
        return ft_fail(err, "%s: '%s' is not auto, cpu or cuda", key, want);
    int gpus = 0;
    if (strcmp(want, "cpu") != 0) {
#ifdef FT_HAVE_CUDA
        gpus = ft_cuda_device_count();
        if (gpus == 0 && strcmp(want, "cuda") == 0)
            return ft_fail(err, "%s is cuda, but no CUDA GPU is visible (bin/gpu-info says "
                                "why; CUDA_VISIBLE_DEVICES?); use cpu or auto",
                           key);
#else
        if (strcmp(want, "cuda") == 0)
            return ft_fail(err, "%s is cuda, but this build has no CUDA backend (rebuild with "
                                "nvcc on the PATH or CUDA_HOME set; CUDA=0 turns it off)",
                           key);
#endif
    }
    out->device = gpus > 0 ? FT_DEV_CUDA : FT_DEV_CPU;
    out->dtype = out->device == FT_DEV_CUDA && bf16 ? FT_BF16 : FT_F32;
#ifdef FT_CUDA_EMU
    /* the emulated build (make CUDA=emu) says so wherever it names its GPUs */
    const char *kind = "emulated CUDA GPU", *note = " (make CUDA=emu: no real GPU)";
#else
    const char *kind = "CUDA GPU", *note = "";
#endif
    if (out->device == FT_DEV_CUDA)
        snprintf(out->why, sizeof out->why, "device %s: %d %s%s visible%s, %s", want, gpus, kind,
                 gpus == 1 ? "" : "s", note, ft_dtype_name(out->dtype));
    else
        snprintf(out->why, sizeof out->why, "device %s: CPU, fp32%s", want,
                 strcmp(want, "auto") == 0 ? " (no CUDA GPU)" : "");
    return 0;
}

int ft_run_device_resolve(const ft_train_section *t, ft_run_device_choice *out, ft_err *err)
{
    static const char *const names[] = {[FT_CFG_DEVICE_AUTO] = "auto",
                                        [FT_CFG_DEVICE_CPU] = "cpu",
                                        [FT_CFG_DEVICE_CUDA] = "cuda"};
    if (ft_run_device_choose(names[t->device], t->bf16, "config: key 'train.device'", out, err))
        return -1;
    if (out->device == FT_DEV_CUDA && t->fp16)
        return ft_fail(err, "config: key 'train.fp16': the CUDA backend computes in bf16 "
                            "(train.bf16, the default) or fp32, not fp16");
    return 0;
}

int ft_gpu_for_rank(int local_rank, int visible)
{
    if (visible <= 0)
        return -1;
    return (local_rank < 0 ? 0 : local_rank) % visible;
}

int ft_rank_gpu(int local_rank)
{
#ifdef FT_HAVE_CUDA
    return ft_gpu_for_rank(local_rank, ft_cuda_device_count());
#else
    (void)local_rank;
    return -1;
#endif
}

int ft_run_device_select(const ft_run_device_choice *c, int local_rank, int *out, ft_err *err)
{
    *out = -1;
    if (c->device != FT_DEV_CUDA)
        return 0;
#ifdef FT_HAVE_CUDA
    int gpu = ft_rank_gpu(local_rank);
    if (gpu < 0)
        return ft_fail(err, "no CUDA GPU is visible");
    *out = gpu;
    /* the backend's context now, where running out of device memory for cuBLAS's
     * workspace or the scratch is an error the run explains, not an abort in an op */
    if (ft_cuda_select_device(gpu, err) || ft_cuda_context_open(err))
        return -1;
    return 0;
#else
    (void)local_rank;
    return ft_fail(err, "a GPU run in a build without CUDA");
#endif
}
