/* bench-train: training throughput of the library on one model dir.
 *
 *   bench-train MODEL_DIR [--mode lora|qlora|full] [--batch B] [--seq T] [--steps N]
 *               [--ckpt] [--device cpu|cuda] [--fp32] [--loss-chunk N|auto]
 *
 * Runs N optimizer steps (AdamW, constant lr) on seeded random tokens after one warm-up
 * step and prints one JSON line: tokens/s, ms per step, CPU ms per step (user + system
 * time of all threads: on a loaded machine steadier than the wall clock), the tracked
 * allocator's peak bytes per category and the process's peak RSS (VmHWM). LoRA is r=16, alpha=32 on all linear layers; qlora puts it on a
 * base quantized on load to NF4 with double quantization (blocks of 64). On the GPU the
 * compute is bf16 (--fp32: fp32); the clock is read after a device synchronize at both
 * ends (ft_device_clock), so the timing covers the work the GPU did (a step's own
 * read-backs, the loss and the gradient norm, do not wait for its optimizer update). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "device/device_clock.h"
#include "model/model.h"
#include "train/optim.h"
#include "core/cpu_env.h"
#include "core/rng.h"
#include "train/schedule.h"
#include "train/train_step.h"

/* the process's peak resident set (VmHWM; 0 where /proc is missing) */
static size_t peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %zu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* CPU seconds (user + system, all threads) this process has used so far: on a loaded
 * machine a steadier measure of the work than the wall clock. */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru))
        return 0.0;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

int main(int argc, char **argv)
{
    ft_cpu_env_reexec(argv); /* a pool that sleeps while it waits; BLAS kernels for this CPU */
    if (argc < 2) {
        fprintf(stderr, "usage: bench-train MODEL_DIR [--mode lora|qlora|full] [--batch B] "
                        "[--seq T] [--steps N] [--ckpt] [--device cpu|cuda] [--fp32] "
                        "[--loss-chunk N|auto]\n");
        return 2;
    }
    const char *dir = argv[1], *mode = "lora";
    int B = 1, T = 256, steps = 3;
    bool fp32 = false;
    ft_model_options opt = {.mode = FT_TRAIN_LORA, .seed = 1, .loss_chunk_rows = -1};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ckpt")) {
            opt.grad_ckpt = true;
        } else if (!strcmp(a, "--fp32")) {
            fp32 = true;
        } else if (v && !strcmp(a, "--mode") && (!strcmp(v, "lora") || !strcmp(v, "qlora") ||
                                                 !strcmp(v, "full"))) {
            mode = argv[++i];
        } else if (v && !strcmp(a, "--device") && (!strcmp(v, "cpu") || !strcmp(v, "cuda"))) {
            opt.device = !strcmp(argv[++i], "cuda") ? FT_DEV_CUDA : FT_DEV_CPU;
        } else if (v && !strcmp(a, "--loss-chunk")) {
            opt.loss_chunk_rows = !strcmp(v, "auto") ? -1 : atoi(v);
            i++;
        } else if (v && !strcmp(a, "--batch")) {
            B = atoi(argv[++i]);
        } else if (v && !strcmp(a, "--seq")) {
            T = atoi(argv[++i]);
        } else if (v && !strcmp(a, "--steps")) {
            steps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "bench-train: error: bad argument '%s'\n", a);
            return 2;
        }
    }
    if (B < 1 || T < 2 || steps < 1) {
        fprintf(stderr, "bench-train: error: --batch, --seq and --steps must be positive\n");
        return 2;
    }
    opt.mode = !strcmp(mode, "full") ? FT_TRAIN_FULL : FT_TRAIN_LORA;
    if (!strcmp(mode, "qlora"))
        opt.quant = (ft_quant_options){FT_QUANT_NF4, 64, true};
    opt.dtype = opt.device == FT_DEV_CUDA && !fp32 ? FT_BF16 : FT_F32;
    opt.lora = (ft_lora_config){.r = 16, .alpha = 32, .targets = FT_LORA_ALL_LINEAR};
    ft_err err;
    ft_model *m;
    if (ft_model_load(&m, dir, &opt, &err)) {
        fprintf(stderr, "bench-train: error: %s\n", err.msg);
        return 1;
    }
    int V = ft_model_cfg(m)->vocab_size;
    int32_t *ids = malloc((size_t)B * T * sizeof *ids);
    for (size_t i = 0; i < (size_t)B * T; i++)
        ids[i] = (int32_t)(ft_uniform(42, i) * V);
    ft_batch batch = {B, T, ids, NULL, NULL, NULL};
    size_t n;
    ft_model_trainable(m, &n);
    ft_optimizer o;
    ft_adamw_hparams hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    ft_lr_schedule sched = {.kind = FT_LR_CONSTANT, .base_lr = 1e-4, .total_steps = steps + 1};
    if (ft_optimizer_init_on(&o, ft_model_mem(m), opt.device, n, hp, &err)) {
        fprintf(stderr, "bench-train: error: %s\n", err.msg);
        return 1;
    }
    ft_step_stats st;
    double t0 = 0, c0 = 0;
    for (int s = 0; s <= steps; s++) {
        if (s == 1) {
            t0 = ft_device_clock(opt.device);
            c0 = cpu_seconds();
        }
        if (ft_train_step(m, &o, &sched, &batch, 1, 1.0, &st, &err)) {
            fprintf(stderr, "bench-train: error: %s\n", err.msg);
            return 1;
        }
    }
    double dt = ft_device_clock(opt.device) - t0; /* both ends wait for the device */
    double cpu = cpu_seconds() - c0;
    const ft_mem *mem = ft_model_mem(m);
    printf("{\"mode\": \"%s\", \"device\": \"%s\", \"dtype\": \"%s\", \"batch\": %d, "
           "\"seq\": %d, \"steps\": %d, \"ckpt\": %s, \"loss_chunk\": %zu, "
           "\"tokens_per_s\": %.1f, \"ms_per_step\": %.1f, \"cpu_ms_per_step\": %.1f, \"loss\": %.4f, \"trainable\": %zu, "
           "\"peak_bytes\": {",
           mode, opt.device == FT_DEV_CUDA ? "cuda" : "cpu", opt.dtype == FT_BF16 ? "bf16" : "fp32",
           B, T, steps, opt.grad_ckpt ? "true" : "false",
           ft_loss_chunk_rows(opt.loss_chunk_rows, (size_t)V, (size_t)B * T),
           (double)B * T * steps / dt, dt * 1e3 / steps, cpu * 1e3 / steps, st.loss, n);
    for (int c = 0; c < FT_MEM_NCAT; c++)
        printf("%s\"%s\": %zu", c ? ", " : "", ft_mem_cat_name((ft_mem_cat)c), mem->peak[c]);
    printf(", \"total\": %zu}, \"peak_rss_bytes\": %zu}\n", mem->peak_total, peak_rss());
    ft_optimizer_free(&o);
    free(ids);
    ft_model_free(m);
    return 0;
}
