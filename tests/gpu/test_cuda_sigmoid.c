/* The CUDA sigmoid op (kernels/cuda/sigmoid.cu) against the CPU reference
 * (kernels/cpu/sigmoid.c, checked against finite differences in
 * tests/unit/test_sigmoid_gate.c), with z and dz in fp32 and bf16 storage (s and ds stay
 * fp32 on both devices): within TOL_F32 / TOL_BF16 normwise (gpu_check.h); the backward
 * accumulates onto nonzero dz and runs twice to check it repeats bit for bit. Sizes
 * ragged against the kernel's 256-thread blocks. */
#include "gpu_check.h"

static const ft_dtype DTYPES[2] = {FT_F32, FT_BF16};

static void sigmoid_case(size_t n, ft_dtype d)
{
    char what[96];
    float *z = host_random(n, 16.0f), *s = host_alloc(n);
    host_round(z, n, d);
    ft_tensor gz = dev_upload(z, n, d), gs = dev_upload(s, n, FT_F32);
    ft_sigmoid_forward(ft_f32(s, n), ft_f32(z, n), n);
    ft_sigmoid_forward(gs, gz, n);
    snprintf(what, sizeof what, "sigmoid fwd n=%zu %s", n, dtype_name(d));
    check_dev(what, gs, s, TOL_F32); /* (s fp32: only z's storage differs, and both read it) */

    float *ds = host_random(n, 1.0f), *dz = host_random(n, 0.5f);
    host_round(dz, n, d);
    ft_tensor gds = dev_upload(ds, n, FT_F32), gs2 = dev_upload(s, n, FT_F32);
    ft_tensor gdz = dev_upload(dz, n, d), gdz2 = dev_upload(dz, n, d);
    ft_sigmoid_backward(ft_f32(dz, n), ft_f32(ds, n), ft_f32(s, n), n);
    ft_sigmoid_backward(gdz, gds, gs2, n);
    ft_sigmoid_backward(gdz2, gds, gs2, n);
    snprintf(what, sizeof what, "sigmoid bwd n=%zu %s", n, dtype_name(d));
    check_dev(what, gdz, dz, tol_for(d));
    CHECK(dev_equal(gdz, gdz2));
    free(z), free(s), free(ds), free(dz);
    dev_free(gz), dev_free(gs), dev_free(gds), dev_free(gs2), dev_free(gdz), dev_free(gdz2);
}

static void test_sigmoid(void)
{
    static const size_t sizes[] = {1, 255, 257, 4099};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int di = 0; di < 2; di++)
            sigmoid_case(sizes[i], DTYPES[di]);
}

int main(void)
{
    gpu_seed(23);
    RUN(test_sigmoid);
    return check_summary("cuda_sigmoid");
}
