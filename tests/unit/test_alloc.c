/* The tracked allocator's limit and out-of-memory reports (lib/device/alloc.h), host copies
 * through ft_copy_bytes, and train.device resolution (lib/device/run_device.h) on this machine. */
#include <string.h>

#include "device/alloc.h"
#include "check.h"
#include "config/config.h"
#include "core/ft_error.h"
#include "ops.h"
#include "device/run_device.h"

static void test_limit_refuses_and_records(void)
{
    ft_mem mem = {0};
    mem.limit = 1000;
    void *a = ft_alloc(&mem, FT_MEM_WEIGHTS, 600);
    CHECK(a != NULL);
    CHECK(ft_alloc(&mem, FT_MEM_ACTIVATIONS, 500) == NULL); /* 1100 > 1000 */
    CHECK(mem.failed_bytes == 500 && mem.failed_live == 600);
    CHECK(mem.failed_cat == FT_MEM_ACTIVATIONS);
    CHECK(mem.live_total == 600 && mem.peak_total == 600);
    void *b = ft_alloc(&mem, FT_MEM_ACTIVATIONS, 400); /* exactly the limit */
    CHECK(b != NULL);
    ft_free(&mem, a);
    ft_free(&mem, b);
    CHECK(mem.live_total == 0);
    /* no limit: a failure is still recorded (bytes beyond any address space) */
    ft_mem open = {0};
    CHECK(ft_alloc(&open, FT_MEM_GRADS, (size_t)-1 / 2) == NULL);
    CHECK(open.failed_bytes == (size_t)-1 / 2 && open.failed_cat == FT_MEM_GRADS);
}

static void test_oom_error_flag_and_message(void)
{
    ft_mem mem = {0};
    mem.limit = 3 << 20;
    void *a = ft_alloc(&mem, FT_MEM_WEIGHTS, 2 << 20);
    CHECK(ft_alloc(&mem, FT_MEM_OPTIM, 2 << 20) == NULL);
    ft_err err = {0};
    CHECK(ft_mem_fail(&err, &mem, FT_DEV_CUDA, "AdamW state for %d parameters", 7) == -1);
    CHECK(err.oom);
    CHECK(strstr(err.msg, "out of GPU memory allocating AdamW state for 7 parameters") != NULL);
    CHECK(strstr(err.msg, "2.0 MiB of optimizer did not fit beside 2.0 MiB live") != NULL);
    CHECK(strstr(err.msg, "limit 3.0 MiB") != NULL);
    ft_fail_prefix(&err, "model.name 'x'"); /* context keeps the kind */
    CHECK(err.oom && strncmp(err.msg, "model.name 'x': out of GPU memory", 33) == 0);
    ft_fail(&err, "some other error");
    CHECK(!err.oom);
    ft_free(&mem, a);
}

static void test_copy_bytes_on_host(void)
{
    float src[5] = {1, 2, 3, 4, 5}, dst[5] = {0};
    ft_err err;
    CHECK(ft_copy_bytes(dst, FT_DEV_CPU, src, FT_DEV_CPU, sizeof src, &err) == 0);
    CHECK(memcmp(dst, src, sizeof src) == 0);
    CHECK(ft_copy_bytes(NULL, FT_DEV_CPU, NULL, FT_DEV_CPU, 0, &err) == 0);
}

static void test_train_device_resolution(void)
{
    ft_config *c = ft_config_new();
    ft_err err;
    ft_run_device_choice d;
    CHECK(ft_config_set_key(c, "train.device", "cpu", "test", NULL, &err) == 0);
    CHECK(ft_run_device_resolve(&ft_config_values(c)->train, &d, &err) == 0);
    CHECK(d.device == FT_DEV_CPU && d.dtype == FT_F32);
    int gpu = 0;
    CHECK(ft_run_device_select(&d, 3, &gpu, &err) == 0 && gpu == -1);
    /* auto: the GPU exactly when one is usable; cuda without one names the key */
    CHECK(ft_config_set_key(c, "train.device", "auto", "test", NULL, &err) == 0);
    CHECK(ft_run_device_resolve(&ft_config_values(c)->train, &d, &err) == 0);
    bool have_gpu = d.device == FT_DEV_CUDA;
    CHECK(ft_config_set_key(c, "train.device", "cuda", "test", NULL, &err) == 0);
    int rc = ft_run_device_resolve(&ft_config_values(c)->train, &d, &err);
    if (have_gpu) {
        CHECK(rc == 0 && d.device == FT_DEV_CUDA && d.dtype == FT_BF16);
        CHECK(ft_config_set_key(c, "train.fp16", "true", "test", NULL, &err) == 0);
        CHECK(ft_run_device_resolve(&ft_config_values(c)->train, &d, &err) == -1 && strstr(err.msg, "train.fp16"));
    } else {
        CHECK(rc == -1 && strstr(err.msg, "train.device") != NULL);
    }
    CHECK(ft_config_set_key(c, "train.device", "gpu", "test", NULL, &err) == -1);
    ft_config_free(c);
}

int main(void)
{
    RUN(test_limit_refuses_and_records);
    RUN(test_oom_error_flag_and_message);
    RUN(test_copy_bytes_on_host);
    RUN(test_train_device_resolution);
    return check_summary("alloc");
}
