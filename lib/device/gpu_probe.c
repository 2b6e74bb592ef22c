/* Hardware probe: the CUDA driver API and NCCL through dlopen, the CPU backend through
 * OpenMP, OpenBLAS and /proc.
 *
 * Why dlopen: a binary linked against libcuda.so.1 does not even start on a machine
 * without the NVIDIA driver, and the CPU-only build has no CUDA headers at all. So the
 * few driver entry points used here are declared by hand below, with the ABI of
 * cuda.h: CUresult and CUdevice are ints, CUcontext is a pointer, attributes are the
 * enum numbers of CUdevice_attribute. A CUDA build includes cuda.h and checks those
 * numbers at compile time.
 *
 * JSON keys (ft_gpu_probe_json); a value that is unknown or does not apply is null:
 *   num_gpus            int
 *   reason              string: why num_gpus is 0
 *   gpus                [{index, name, memory_total_bytes, memory_free_bytes,
 *                         compute_capability ("9.0"), multiprocessors}]
 *   peer_access         [[bool]]: [i][j] = GPU i can access GPU j's memory; null on the
 *                       diagonal
 *   driver_version      "12.4"      driver_path   file libcuda.so.1 was loaded from
 *   nccl_version        "2.21.5"    nccl_reason   why NCCL is not usable   nccl_path
 *   cuda_build          bool        cuda_build_version  toolkit it was built with, "13.0"
 *   emulated            bool: the emulated build (make CUDA=emu), whose GPUs, driver
 *                       and NCCL are tests/emu's emulations
 *   cpu                 {threads, logical_cpus, model, blas, blas_config,
 *                        blas_threading, blas_threads} */
#include "device/gpu_probe.h"

#include <dlfcn.h>
#include <link.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef FT_HAVE_CUDA
#include <cuda.h>
#endif
#ifdef FT_CUDA_EMU
#include <cuda_runtime_api.h>
#ifdef FT_HAVE_NCCL
#include <nccl.h>
#endif
#endif

/* OpenBLAS's own entry points (cblas.h declares them, but only OpenBLAS's cblas.h). */
char *openblas_get_config(void);
int openblas_get_num_threads(void);
int openblas_get_parallel(void);

/* ---- CUDA driver API, declared by hand ---------------------------------------- */

typedef int drv_result;   /* CUresult; 0 = CUDA_SUCCESS */
typedef int drv_device;   /* CUdevice */
typedef void *drv_context; /* CUcontext */

enum {
    DRV_ATTR_MULTIPROCESSOR_COUNT = 16,
    DRV_ATTR_COMPUTE_CAPABILITY_MAJOR = 75,
    DRV_ATTR_COMPUTE_CAPABILITY_MINOR = 76,
};

#ifdef FT_HAVE_CUDA
_Static_assert((int)DRV_ATTR_MULTIPROCESSOR_COUNT ==
                   (int)CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
               "CUdevice_attribute numbering changed");
_Static_assert((int)DRV_ATTR_COMPUTE_CAPABILITY_MAJOR ==
                   (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
               "CUdevice_attribute numbering changed");
_Static_assert((int)DRV_ATTR_COMPUTE_CAPABILITY_MINOR ==
                   (int)CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
               "CUdevice_attribute numbering changed");
_Static_assert(CUDA_ERROR_NO_DEVICE == 100 && CUDA_ERROR_STUB_LIBRARY == 34,
               "CUresult numbering changed");
_Static_assert(sizeof(CUdevice) == sizeof(drv_device), "CUdevice is not an int");
_Static_assert(sizeof(CUresult) == sizeof(drv_result), "CUresult is not an int");
#endif

typedef struct drv_api {
    void *lib;
    drv_result (*init)(unsigned flags);
    drv_result (*driver_get_version)(int *version);
    drv_result (*device_get_count)(int *count);
    drv_result (*device_get)(drv_device *dev, int ordinal);
    drv_result (*device_get_name)(char *name, int len, drv_device dev);
    drv_result (*device_total_mem)(size_t *bytes, drv_device dev);
    drv_result (*device_get_attribute)(int *value, int attrib, drv_device dev);
    /* optional: missing ones leave the matching field unknown */
    drv_result (*device_can_access_peer)(int *can, drv_device dev, drv_device peer);
    drv_result (*primary_ctx_retain)(drv_context *ctx, drv_device dev);
    drv_result (*primary_ctx_release)(drv_device dev);
    drv_result (*ctx_push_current)(drv_context ctx);
    drv_result (*ctx_pop_current)(drv_context *ctx);
    drv_result (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
    drv_result (*get_error_name)(drv_result code, const char **name);
    drv_result (*get_error_string)(drv_result code, const char **text);
} drv_api;

/* The codes a probe meets in practice. The driver's cuGetErrorName is preferred when
 * the library is loaded; this table covers the rest. (35, "insufficient driver", is a
 * runtime-API code, cudaErrorInsufficientDriver; the driver API has no code 35.) */
static const struct {
    int code;
    const char *name;
} drv_error_names[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

const char *ft_gpu_cu_result_name(int code, char *buf, size_t n)
{
    for (size_t i = 0; i < sizeof drv_error_names / sizeof drv_error_names[0]; i++)
        if (drv_error_names[i].code == code) {
            snprintf(buf, n, "%s", drv_error_names[i].name);
            return buf;
        }
    snprintf(buf, n, "CUresult %d", code);
    return buf;
}

const char *ft_gpu_driver_version_str(int code, char *buf, size_t n)
{
    snprintf(buf, n, "%d.%d", code / 1000, code % 1000 / 10);
    return buf;
}

/* NCCL >= 2.9 encodes X.Y.Z as X*10000 + Y*100 + Z, older ones as X*1000 + Y*100 + Z
 * (nccl.h, NCCL_VERSION). The first 2.9 code is 20900; the last old one is 2899. */
const char *ft_gpu_nccl_version_str(int code, char *buf, size_t n)
{
    if (code >= 10000)
        snprintf(buf, n, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
    else
        snprintf(buf, n, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
    return buf;
}

/* The driver, loaded by hand (the emulated build has none to load). */
#ifndef FT_CUDA_EMU
/* "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)" */
static void drv_describe(const drv_api *api, drv_result rc, char *buf, size_t n)
{
    const char *name = NULL, *text = NULL;
    char fallback[64];
    if (!api->get_error_name || api->get_error_name(rc, &name) != 0 || !name)
        name = ft_gpu_cu_result_name(rc, fallback, sizeof fallback);
    if (api->get_error_string && api->get_error_string(rc, &text) == 0 && text)
        snprintf(buf, n, "%s (%s)", name, text);
    else
        snprintf(buf, n, "%s", name);
}

static void lib_path(void *lib, char *buf, size_t n)
{
    struct link_map *lm = NULL;
    if (dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name)
        snprintf(buf, n, "%s", lm->l_name);
}

/* dlsym, noting the first required symbol that is missing (missing != NULL). */
static void *drv_sym(void *lib, const char *sym, const char **missing)
{
    void *f = dlsym(lib, sym);
    if (!f && missing && !*missing)
        *missing = sym;
    return f;
}

/* Loads the driver and resolves the entry points; on failure writes p->reason. */
static int drv_load(drv_api *api, const char *cuda_lib, ft_gpu_probe *p)
{
    memset(api, 0, sizeof *api);
    api->lib = dlopen(cuda_lib, RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        const char *e = dlerror();
        snprintf(p->reason, sizeof p->reason, "NVIDIA driver not found (%s)",
                 e ? e : cuda_lib);
        return -1;
    }
    lib_path(api->lib, p->driver_path, sizeof p->driver_path);

    /* Function pointers from dlsym: POSIX guarantees the conversion. */
    const char *missing = NULL;
#define DRV_NEED(field, sym) \
    api->field = (__typeof__(api->field))drv_sym(api->lib, sym, &missing)
#define DRV_WANT(field, sym) api->field = (__typeof__(api->field))drv_sym(api->lib, sym, NULL)
    DRV_NEED(init, "cuInit");
    DRV_NEED(driver_get_version, "cuDriverGetVersion");
    DRV_NEED(device_get_count, "cuDeviceGetCount");
    DRV_NEED(device_get, "cuDeviceGet");
    DRV_NEED(device_get_name, "cuDeviceGetName");
    DRV_NEED(device_total_mem, "cuDeviceTotalMem_v2");
    DRV_NEED(device_get_attribute, "cuDeviceGetAttribute");
    DRV_WANT(device_can_access_peer, "cuDeviceCanAccessPeer");
    DRV_WANT(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    /* _v2 since CUDA 11; the unversioned symbol has the same signature. */
    DRV_WANT(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
    if (!api->primary_ctx_release)
        DRV_WANT(primary_ctx_release, "cuDevicePrimaryCtxRelease");
    DRV_WANT(ctx_push_current, "cuCtxPushCurrent_v2");
    DRV_WANT(ctx_pop_current, "cuCtxPopCurrent_v2");
    DRV_WANT(mem_get_info, "cuMemGetInfo_v2");
    DRV_WANT(get_error_name, "cuGetErrorName");
    DRV_WANT(get_error_string, "cuGetErrorString");
#undef DRV_NEED
#undef DRV_WANT
    if (missing) {
        snprintf(p->reason, sizeof p->reason, "NVIDIA driver too old: %s has no %s",
                 p->driver_path[0] ? p->driver_path : cuda_lib, missing);
        return -1;
    }
    return 0;
}

/* Free memory needs a context: the device's primary context (the one the runtime
 * shares), pushed and popped so the caller's current context is untouched. */
static void drv_free_memory(const drv_api *api, drv_device dev, ft_gpu_dev *g)
{
    if (!api->primary_ctx_retain || !api->primary_ctx_release || !api->ctx_push_current ||
        !api->ctx_pop_current || !api->mem_get_info)
        return;
    drv_context ctx = NULL;
    if (api->primary_ctx_retain(&ctx, dev) != 0)
        return;
    if (api->ctx_push_current(ctx) == 0) {
        size_t free_bytes = 0, total_bytes = 0;
        if (api->mem_get_info(&free_bytes, &total_bytes) == 0) {
            g->mem_free = free_bytes;
            g->mem_free_known = 1;
        }
        drv_context popped = NULL;
        api->ctx_pop_current(&popped);
    }
    api->primary_ctx_release(dev);
}

#endif

/* An empty or wrong CUDA_VISIBLE_DEVICES is the usual cause of "no device" on a GPU
 * machine, so the reason names it. */
static void note_visible_devices(ft_gpu_probe *p)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    size_t len = strlen(p->reason);
    if (v && len < sizeof p->reason)
        snprintf(p->reason + len, sizeof p->reason - len, "; CUDA_VISIBLE_DEVICES='%s'", v);
}

#ifdef FT_CUDA_EMU
/* The emulated build (make CUDA=emu) has no driver to load: its GPUs are the emulated
 * runtime's (tests/emu; FT_EMU_DEVICES, FT_EMU_ARCH, FT_EMU_MEM, CUDA_VISIBLE_DEVICES),
 * their names ending in "(emulated)". */
static void probe_gpus(ft_gpu_probe *p, const char *cuda_lib, int only)
{
    (void)cuda_lib;
    p->emulated = 1;
    snprintf(p->driver_path, sizeof p->driver_path, "tests/emu, make CUDA=emu");
    int version = 0, count = 0, current = 0;
    if (cudaDriverGetVersion(&version) == cudaSuccess)
        p->driver_version = version;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        snprintf(p->reason, sizeof p->reason, "the emulated device shows no GPU (FT_EMU_DEVICES=%s)",
                 getenv("FT_EMU_DEVICES") ? getenv("FT_EMU_DEVICES") : "1");
        note_visible_devices(p);
        return;
    }
    p->num_gpus = count;
    int listed = count < FT_GPU_MAX ? count : FT_GPU_MAX;
    (void)cudaGetDevice(&current);
    for (int i = 0; i < listed; i++) {
        ft_gpu_dev *g = &p->gpus[i];
        struct cudaDeviceProp prop;
        size_t free_bytes = 0, total = 0;
        g->index = i;
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess)
            continue;
        snprintf(g->name, sizeof g->name, "%s", prop.name);
        g->mem_total = prop.totalGlobalMem;
        g->cc_major = prop.major;
        g->cc_minor = prop.minor;
        g->multiprocessors = prop.multiProcessorCount;
        if ((only < 0 || only == i) && cudaSetDevice(i) == cudaSuccess &&
            cudaMemGetInfo(&free_bytes, &total) == cudaSuccess) {
            g->mem_free = free_bytes;
            g->mem_free_known = 1;
        }
        for (int j = 0; j < listed; j++) {
            int can = 0;
            if (j != i && cudaDeviceCanAccessPeer(&can, i, j) == cudaSuccess)
                p->peer[i][j] = can ? 1 : 0;
        }
    }
    (void)cudaSetDevice(current);
    (void)cudaGetLastError();
}
#else
static void probe_gpus(ft_gpu_probe *p, const char *cuda_lib, int only)
{
    drv_api api;
    if (drv_load(&api, cuda_lib, p) != 0) {
        if (api.lib)
            dlclose(api.lib);
        return;
    }
    int version = 0;
    if (api.driver_get_version(&version) == 0)
        p->driver_version = version;

    char what[384];
    drv_result rc = api.init(0);
    if (rc != 0) {
        drv_describe(&api, rc, what, sizeof what);
        snprintf(p->reason, sizeof p->reason, "cuInit failed: %s", what);
        note_visible_devices(p);
        dlclose(api.lib);
        return;
    }
    /* From here on the driver may have started threads of its own, so the library
     * stays loaded for the life of the process (as it would under the runtime). */
    int count = 0;
    rc = api.device_get_count(&count);
    if (rc != 0) {
        drv_describe(&api, rc, what, sizeof what);
        snprintf(p->reason, sizeof p->reason, "cuDeviceGetCount failed: %s", what);
        return;
    }
    if (count <= 0) {
        snprintf(p->reason, sizeof p->reason, "the driver reports no CUDA devices");
        note_visible_devices(p);
        return;
    }
    p->num_gpus = count;
    int listed = count < FT_GPU_MAX ? count : FT_GPU_MAX;
    drv_device devs[FT_GPU_MAX];
    for (int i = 0; i < listed; i++) {
        ft_gpu_dev *g = &p->gpus[i];
        g->index = i;
        snprintf(g->name, sizeof g->name, "unknown");
        if (api.device_get(&devs[i], i) != 0) {
            devs[i] = -1;
            continue;
        }
        char name[256] = {0};
        if (api.device_get_name(name, (int)sizeof name - 1, devs[i]) == 0 && name[0])
            snprintf(g->name, sizeof g->name, "%s", name);
        size_t total = 0;
        if (api.device_total_mem(&total, devs[i]) == 0)
            g->mem_total = total;
        api.device_get_attribute(&g->cc_major, DRV_ATTR_COMPUTE_CAPABILITY_MAJOR, devs[i]);
        api.device_get_attribute(&g->cc_minor, DRV_ATTR_COMPUTE_CAPABILITY_MINOR, devs[i]);
        api.device_get_attribute(&g->multiprocessors, DRV_ATTR_MULTIPROCESSOR_COUNT, devs[i]);
        if (only < 0 || only == i)
            drv_free_memory(&api, devs[i], g);
    }
    for (int i = 0; i < listed; i++)
        for (int j = 0; j < listed; j++) {
            int can = 0;
            if (i != j && devs[i] >= 0 && devs[j] >= 0 && api.device_can_access_peer &&
                api.device_can_access_peer(&can, devs[i], devs[j]) == 0)
                p->peer[i][j] = can ? 1 : 0;
        }
}

#endif

#ifdef FT_CUDA_EMU
/* The emulated build's NCCL is the NCCL emulation linked in (when it has one). */
static void probe_nccl(ft_gpu_probe *p, const char *nccl_lib)
{
    (void)nccl_lib;
#ifdef FT_HAVE_NCCL
    int code = 0;
    if (ncclGetVersion(&code) == ncclSuccess && code > 0) {
        p->nccl_version = code;
        snprintf(p->nccl_path, sizeof p->nccl_path, "emulated: tests/emu, make CUDA=emu");
    } else {
        snprintf(p->nccl_reason, sizeof p->nccl_reason, "the NCCL emulation gives no version");
    }
#else
    snprintf(p->nccl_reason, sizeof p->nccl_reason,
             "this emulated build has no NCCL (tests/emu has no NCCL emulation, or NCCL=0)");
#endif
}
#else
static void probe_nccl(ft_gpu_probe *p, const char *nccl_lib)
{
    void *lib = dlopen(nccl_lib, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(p->nccl_reason, sizeof p->nccl_reason, "%s", e ? e : nccl_lib);
        return;
    }
    lib_path(lib, p->nccl_path, sizeof p->nccl_path);
    int (*get_version)(int *) = (int (*)(int *))dlsym(lib, "ncclGetVersion");
    int code = 0;
    int rc = get_version ? get_version(&code) : -1;
    if (!get_version)
        snprintf(p->nccl_reason, sizeof p->nccl_reason, "%s has no ncclGetVersion", nccl_lib);
    else if (rc != 0 || code <= 0)
        snprintf(p->nccl_reason, sizeof p->nccl_reason,
                 "ncclGetVersion failed (ncclResult %d)", rc);
    else
        p->nccl_version = code;
    dlclose(lib);
}

#endif

static void probe_cpu(ft_gpu_probe *p)
{
    p->cpu_threads = omp_get_max_threads();
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    p->cpu_logical = online > 0 ? (int)online : 0;

    snprintf(p->cpu_model, sizeof p->cpu_model, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0)
                continue;
            char *v = strchr(line, ':');
            if (!v)
                continue;
            v++;
            while (*v == ' ' || *v == '\t')
                v++;
            v[strcspn(v, "\n")] = '\0';
            if (*v)
                snprintf(p->cpu_model, sizeof p->cpu_model, "%s", v);
            break;
        }
        fclose(f);
    }

    snprintf(p->blas, sizeof p->blas, "OpenBLAS");
    const char *config = openblas_get_config();
    snprintf(p->blas_config, sizeof p->blas_config, "%s", config ? config : "");
    p->blas_config[strcspn(p->blas_config, "\n")] = '\0';
    /* A pthreads OpenBLAS called from inside OpenMP regions oversubscribes the cores;
     * the threading model is shown so that is easy to spot. */
    static const char *const models[] = {"sequential", "pthreads", "openmp"};
    int par = openblas_get_parallel();
    snprintf(p->blas_threading, sizeof p->blas_threading, "%s",
             par >= 0 && par <= 2 ? models[par] : "unknown");
    p->blas_threads = openblas_get_num_threads();
}

void ft_gpu_probe_run_libs(ft_gpu_probe *p, const char *cuda_lib, const char *nccl_lib)
{
    memset(p, 0, sizeof *p);
    memset(p->peer, -1, sizeof p->peer);
#ifdef FT_HAVE_CUDA
    p->cuda_build = 1;
    p->cuda_build_version = CUDA_VERSION;
#endif
    probe_gpus(p, cuda_lib, -1);
    probe_nccl(p, nccl_lib);
    probe_cpu(p);
}

void ft_gpu_probe_run_device(ft_gpu_probe *p, int device)
{
    memset(p, 0, sizeof *p);
    memset(p->peer, -1, sizeof p->peer);
#ifdef FT_HAVE_CUDA
    p->cuda_build = 1;
    p->cuda_build_version = CUDA_VERSION;
#endif
    probe_gpus(p, "libcuda.so.1", device < 0 ? FT_GPU_MAX : device);
}

void ft_gpu_probe_run(ft_gpu_probe *p)
{
    ft_gpu_probe_run_libs(p, "libcuda.so.1", "libnccl.so.2");
}

static int listed_gpus(const ft_gpu_probe *p)
{
    return p->num_gpus < FT_GPU_MAX ? p->num_gpus : FT_GPU_MAX;
}

static double gib(size_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0 * 1024.0);
}

void ft_gpu_probe_print(const ft_gpu_probe *p, FILE *out)
{
    char buf[64];
    int listed = listed_gpus(p);
    fprintf(out, "Number of GPUs: %d\n", p->num_gpus);
    if (p->num_gpus == 0)
        fprintf(out, "reason: %s\n", p->reason);
    for (int i = 0; i < listed; i++) {
        const ft_gpu_dev *g = &p->gpus[i];
        fprintf(out, "GPU %d: %s\n", g->index, g->name);
        if (g->mem_free_known)
            fprintf(out, "  memory: %.2f GiB total, %.2f GiB free\n", gib(g->mem_total),
                    gib(g->mem_free));
        else
            fprintf(out, "  memory: %.2f GiB total, free unknown\n", gib(g->mem_total));
        fprintf(out, "  compute capability: %d.%d\n", g->cc_major, g->cc_minor);
        fprintf(out, "  multiprocessors: %d\n", g->multiprocessors);
    }
    if (listed < p->num_gpus)
        fprintf(out, "(only the first %d GPUs are listed)\n", listed);
    if (listed > 0) {
        fprintf(out, "Peer access (row GPU can access column GPU's memory):\n    ");
        for (int j = 0; j < listed; j++)
            fprintf(out, " %3d", j);
        fputc('\n', out);
        for (int i = 0; i < listed; i++) {
            fprintf(out, "%4d", i);
            for (int j = 0; j < listed; j++)
                fprintf(out, "   %c", i == j ? '-' : p->peer[i][j] == 1 ? 'Y'
                                                 : p->peer[i][j] == 0 ? 'N'
                                                                       : '?');
            fputc('\n', out);
        }
    }
    if (p->emulated)
        fprintf(out, "CUDA driver: none: the GPUs are emulated (%s)\n", p->driver_path);
    else if (p->driver_version)
        fprintf(out, "CUDA driver: %s (%s)\n",
                ft_gpu_driver_version_str(p->driver_version, buf, sizeof buf), p->driver_path);
    else if (p->driver_path[0])
        fprintf(out, "CUDA driver: version unknown (%s)\n", p->driver_path);
    else
        fprintf(out, "CUDA driver: not found\n");
    if (p->nccl_version)
        fprintf(out, "NCCL: %s (%s)\n",
                ft_gpu_nccl_version_str(p->nccl_version, buf, sizeof buf), p->nccl_path);
    else
        fprintf(out, "NCCL: not found (%s)\n", p->nccl_reason);
    fprintf(out, "CPU backend:\n");
    fprintf(out, "  CPU: %s, %d logical CPUs\n", p->cpu_model, p->cpu_logical);
    fprintf(out, "  OpenMP threads: %d\n", p->cpu_threads);
    fprintf(out, "  BLAS: %s, %s, %d threads (%s)\n", p->blas, p->blas_threading,
            p->blas_threads, p->blas_config);
    if (p->emulated)
        fprintf(out, "Built with CUDA: emulated (make CUDA=emu: kernels/cuda run on the host, "
                     "checked; no GPU code)\n");
    else if (p->cuda_build)
        fprintf(out, "Built with CUDA: yes (toolkit %s)\n",
                ft_gpu_driver_version_str(p->cuda_build_version, buf, sizeof buf));
    else
        fprintf(out, "Built with CUDA: no (CPU-only build)\n");
}

/* json_string refuses invalid UTF-8 (a dlerror path could hold any bytes): such a
 * string is kept with its non-ASCII bytes replaced by '?'. Empty -> null. */
static json_t *jstr(const char *s)
{
    if (!s || !s[0])
        return json_null();
    json_t *v = json_string(s);
    if (v)
        return v;
    char clean[1024];
    snprintf(clean, sizeof clean, "%s", s);
    for (char *c = clean; *c; c++)
        if ((unsigned char)*c >= 0x80)
            *c = '?';
    return json_string(clean);
}

json_t *ft_gpu_probe_json(const ft_gpu_probe *p)
{
    char buf[64];
    int listed = listed_gpus(p);
    int bad = 0;
    json_t *o = json_object();
    if (!o)
        return NULL;
    /* json_object_set_new / json_array_append_new take NULL as a failure and free the
     * value on any failure, so one flag collects every out-of-memory. */
    bad |= json_object_set_new(o, "num_gpus", json_integer(p->num_gpus));
    bad |= json_object_set_new(o, "reason", p->num_gpus ? json_null() : jstr(p->reason));

    json_t *gpus = json_array();
    json_t *peer = json_array();
    for (int i = 0; i < listed && gpus && peer; i++) {
        const ft_gpu_dev *g = &p->gpus[i];
        json_t *d = json_object();
        if (d) {
            snprintf(buf, sizeof buf, "%d.%d", g->cc_major, g->cc_minor);
            bad |= json_object_set_new(d, "index", json_integer(g->index));
            bad |= json_object_set_new(d, "name", jstr(g->name));
            bad |= json_object_set_new(d, "memory_total_bytes",
                                       json_integer((json_int_t)g->mem_total));
            bad |= json_object_set_new(d, "memory_free_bytes",
                                       g->mem_free_known
                                           ? json_integer((json_int_t)g->mem_free)
                                           : json_null());
            bad |= json_object_set_new(d, "compute_capability", json_string(buf));
            bad |= json_object_set_new(d, "multiprocessors", json_integer(g->multiprocessors));
        }
        bad |= json_array_append_new(gpus, d);
        json_t *row = json_array();
        for (int j = 0; j < listed && row; j++)
            bad |= json_array_append_new(row, i == j || p->peer[i][j] < 0
                                                  ? json_null()
                                                  : json_boolean(p->peer[i][j] == 1));
        bad |= json_array_append_new(peer, row);
    }
    bad |= json_object_set_new(o, "gpus", gpus);
    bad |= json_object_set_new(o, "peer_access", peer);

    bad |= json_object_set_new(
        o, "driver_version",
        p->driver_version
            ? json_string(ft_gpu_driver_version_str(p->driver_version, buf, sizeof buf))
            : json_null());
    bad |= json_object_set_new(o, "driver_path", jstr(p->driver_path));
    bad |= json_object_set_new(
        o, "nccl_version",
        p->nccl_version
            ? json_string(ft_gpu_nccl_version_str(p->nccl_version, buf, sizeof buf))
            : json_null());
    bad |= json_object_set_new(o, "nccl_reason", p->nccl_version ? json_null()
                                                                 : jstr(p->nccl_reason));
    bad |= json_object_set_new(o, "nccl_path", jstr(p->nccl_path));
    bad |= json_object_set_new(o, "cuda_build", json_boolean(p->cuda_build));
    bad |= json_object_set_new(o, "emulated", json_boolean(p->emulated));
    bad |= json_object_set_new(
        o, "cuda_build_version",
        p->cuda_build
            ? json_string(ft_gpu_driver_version_str(p->cuda_build_version, buf, sizeof buf))
            : json_null());

    json_t *cpu = json_object();
    if (cpu) {
        bad |= json_object_set_new(cpu, "threads", json_integer(p->cpu_threads));
        bad |= json_object_set_new(cpu, "logical_cpus", json_integer(p->cpu_logical));
        bad |= json_object_set_new(cpu, "model", jstr(p->cpu_model));
        bad |= json_object_set_new(cpu, "blas", jstr(p->blas));
        bad |= json_object_set_new(cpu, "blas_config", jstr(p->blas_config));
        bad |= json_object_set_new(cpu, "blas_threading", jstr(p->blas_threading));
        bad |= json_object_set_new(cpu, "blas_threads", json_integer(p->blas_threads));
    }
    bad |= json_object_set_new(o, "cpu", cpu);

    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}
