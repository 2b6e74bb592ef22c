/* Tests of the hardware probe (lib/device/gpu_probe.c), the library side of gpu-info.
 *
 * The real probe is checked for consistency on whatever machine runs the tests (with
 * or without a GPU or driver). The no-driver and stub-driver paths are forced by
 * loading a library that does not exist, or the toolkit's stub libcuda.so when it is
 * installed, so they are tested on GPU machines too. */
#include "check.h"
#include "device/gpu_probe.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static ft_gpu_probe *probe_new(void)
{
    ft_gpu_probe *p = malloc(sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* Does this machine have the NVIDIA driver at all? */
static int driver_present(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    dlclose(lib);
    return 1;
}

static void test_real_probe(void)
{
    ft_gpu_probe *p = probe_new();
    ft_gpu_probe_run(p);
    CHECK(p->num_gpus >= 0);
    if (!driver_present()) {
        CHECK(p->num_gpus == 0);
        CHECK(strstr(p->reason, "NVIDIA driver not found (") != NULL);
        CHECK(strstr(p->reason, "libcuda.so.1") != NULL);
        CHECK(p->driver_version == 0);
    }
    if (p->num_gpus == 0) {
        CHECK(p->reason[0] != '\0');
    } else {
        CHECK(p->reason[0] == '\0');
        CHECK(p->driver_version > 0);
        int listed = p->num_gpus < FT_GPU_MAX ? p->num_gpus : FT_GPU_MAX;
        for (int i = 0; i < listed; i++) {
            CHECK(p->gpus[i].index == i);
            CHECK(p->gpus[i].name[0] != '\0');
            CHECK(p->gpus[i].mem_total > 0);
            CHECK(!p->gpus[i].mem_free_known || p->gpus[i].mem_free <= p->gpus[i].mem_total);
            CHECK(p->gpus[i].cc_major >= 3);
            CHECK(p->gpus[i].multiprocessors > 0);
            CHECK(p->peer[i][i] == -1);
        }
    }
    CHECK(p->nccl_version > 0 || p->nccl_reason[0] != '\0');
    CHECK(p->cpu_threads >= 1);
    CHECK(p->cpu_logical >= 1);
    CHECK(p->cpu_model[0] != '\0');
    CHECK(strcmp(p->blas, "OpenBLAS") == 0);
    CHECK(p->blas_threads >= 1);
#ifdef FT_HAVE_CUDA
    CHECK(p->cuda_build == 1 && p->cuda_build_version > 0);
#else
    CHECK(p->cuda_build == 0);
#endif
    free(p);
}

static void test_missing_libraries(void)
{
    ft_gpu_probe *p = probe_new();
    ft_gpu_probe_run_libs(p, "libft-no-such-driver.so.1", "libft-no-such-nccl.so.2");
    CHECK(p->num_gpus == 0);
    CHECK(strncmp(p->reason, "NVIDIA driver not found (", 25) == 0);
    CHECK(strstr(p->reason, "libft-no-such-driver.so.1") != NULL);
    CHECK(p->driver_version == 0 && p->driver_path[0] == '\0');
    CHECK(p->nccl_version == 0);
    CHECK(strstr(p->nccl_reason, "libft-no-such-nccl.so.2") != NULL);
    CHECK(p->cpu_threads >= 1);
    free(p);
}

/* The toolkit's stub driver loads and answers cuInit with CUDA_ERROR_STUB_LIBRARY. */
static void test_stub_driver(void)
{
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (access(stub, R_OK) != 0)
        return;
    ft_gpu_probe *p = probe_new();
    ft_gpu_probe_run_libs(p, stub, "libft-no-such-nccl.so.2");
    CHECK(p->num_gpus == 0);
    CHECK(strncmp(p->reason, "cuInit failed: ", 15) == 0);
    CHECK(strstr(p->reason, "CUDA_ERROR_STUB_LIBRARY") != NULL);
    CHECK(p->driver_path[0] != '\0');
    free(p);
}

static void test_json(void)
{
    ft_gpu_probe *p = probe_new();
    ft_gpu_probe_run(p);
    json_t *o = ft_gpu_probe_json(p);
    CHECK(o != NULL);
    char *s = o ? json_dumps(o, JSON_INDENT(2)) : NULL;
    CHECK(s != NULL);
    json_error_t jerr;
    json_t *r = s ? json_loads(s, 0, &jerr) : NULL;
    CHECK(r != NULL);
    if (r) {
        static const char *const keys[] = {
            "num_gpus",    "reason",       "gpus",        "peer_access",
            "driver_version", "nccl_version", "cuda_build", "cpu"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            CHECK(json_object_get(r, keys[i]) != NULL);
        CHECK(json_integer_value(json_object_get(r, "num_gpus")) == p->num_gpus);
        json_t *gpus = json_object_get(r, "gpus");
        json_t *peer = json_object_get(r, "peer_access");
        CHECK(json_is_array(gpus) && json_is_array(peer));
        CHECK((int)json_array_size(gpus) == (p->num_gpus < FT_GPU_MAX ? p->num_gpus
                                                                       : FT_GPU_MAX));
        CHECK(json_array_size(peer) == json_array_size(gpus));
        for (size_t i = 0; i < json_array_size(gpus); i++) {
            json_t *g = json_array_get(gpus, i);
            CHECK(json_is_string(json_object_get(g, "name")));
            CHECK(json_is_integer(json_object_get(g, "memory_total_bytes")));
            CHECK(json_is_string(json_object_get(g, "compute_capability")));
            CHECK(json_is_integer(json_object_get(g, "multiprocessors")));
            CHECK(json_is_null(json_array_get(json_array_get(peer, i), i)));
        }
        if (p->num_gpus == 0)
            CHECK(json_string_length(json_object_get(r, "reason")) > 0);
        else
            CHECK(json_is_null(json_object_get(r, "reason")));
        CHECK(json_is_boolean(json_object_get(r, "cuda_build")));
        json_t *cpu = json_object_get(r, "cpu");
        CHECK(json_is_object(cpu));
        CHECK(json_integer_value(json_object_get(cpu, "threads")) >= 1);
        CHECK(json_is_string(json_object_get(cpu, "blas")));
        CHECK(json_is_string(json_object_get(cpu, "model")));
    }
    json_decref(r);
    free(s);
    json_decref(o);
    free(p);
}

static void test_text(void)
{
    ft_gpu_probe *p = probe_new();
    ft_gpu_probe_run_libs(p, "libft-no-such-driver.so.1", "libft-no-such-nccl.so.2");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CHECK(f != NULL);
    if (f) {
        ft_gpu_probe_print(p, f);
        fclose(f);
        CHECK(strncmp(text, "Number of GPUs: 0\nreason: NVIDIA driver not found (", 51) == 0);
        CHECK(strstr(text, "\nCUDA driver: not found\n") != NULL);
        CHECK(strstr(text, "\nNCCL: not found (") != NULL);
        CHECK(strstr(text, "OpenMP threads: ") != NULL);
        CHECK(strstr(text, "BLAS: OpenBLAS") != NULL);
        CHECK(strstr(text, "Built with CUDA: ") != NULL);
    }
    free(text);
    free(p);
}

static void test_formatting(void)
{
    char b[64];
    CHECK(strcmp(ft_gpu_cu_result_name(100, b, sizeof b), "CUDA_ERROR_NO_DEVICE") == 0);
    CHECK(strcmp(ft_gpu_cu_result_name(3, b, sizeof b), "CUDA_ERROR_NOT_INITIALIZED") == 0);
    CHECK(strcmp(ft_gpu_cu_result_name(999, b, sizeof b), "CUDA_ERROR_UNKNOWN") == 0);
    CHECK(strcmp(ft_gpu_cu_result_name(12345, b, sizeof b), "CUresult 12345") == 0);
    CHECK(strcmp(ft_gpu_driver_version_str(12040, b, sizeof b), "12.4") == 0);
    CHECK(strcmp(ft_gpu_driver_version_str(13000, b, sizeof b), "13.0") == 0);
    CHECK(strcmp(ft_gpu_driver_version_str(11080, b, sizeof b), "11.8") == 0);
    CHECK(strcmp(ft_gpu_nccl_version_str(22105, b, sizeof b), "2.21.5") == 0);
    CHECK(strcmp(ft_gpu_nccl_version_str(20900, b, sizeof b), "2.9.0") == 0);
    CHECK(strcmp(ft_gpu_nccl_version_str(2708, b, sizeof b), "2.7.8") == 0);
}

int main(void)
{
    RUN(test_real_probe);
    RUN(test_missing_libraries);
    RUN(test_stub_driver);
    RUN(test_json);
    RUN(test_text);
    RUN(test_formatting);
    return check_summary("gpu_info");
}
