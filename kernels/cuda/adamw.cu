/* AdamW over one flat fp32 range on the GPU (kernels/cpu/adamw.c's twin, which derives
 * the torch.optim.AdamW order of operations). Per element, g = grad * grad_scale:
 *   p = param * (1 - lr wd);  m = fma(1 - b1, g, m b1);  v = fma((1 - b2) g, g, v b2)
 *   param = p + (-(lr / (1 - b1^step)) m) / (sqrt(v) / sqrt(1 - b2^step) + eps)
 * The two fused steps are single-rounding FMAs (the CPU computes them in double and
 * rounds once: the same value but for a rare double rounding); every other operation is
 * written with explicit round-to-nearest intrinsics so the compiler cannot contract it
 * into an FMA the CPU does not do. The scalars are computed on the host in double, as
 * on the CPU. param, grad, m, v are fp32: the master weights and their state. */
#include <math.h>

#include "cuda_common.cuh"

struct adamw_consts {
    float decay, beta1, beta2, one_minus_b1, one_minus_b2, bc2_sqrt, eps, neg_step_size,
        grad_scale;
};

__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n,
                             adamw_consts k)
{
    GRID_STRIDE(i, n)
    {
        float g = __fmul_rn(grad[i], k.grad_scale);
        float p = __fmul_rn(param[i], k.decay);
        float mi = __fmaf_rn(k.one_minus_b1, g, __fmul_rn(m[i], k.beta1));
        float vi = __fmaf_rn(__fmul_rn(k.one_minus_b2, g), g, __fmul_rn(v[i], k.beta2));
        float denom = __fadd_rn(__fdiv_rn(sqrtf(vi), k.bc2_sqrt), k.eps);
        m[i] = mi;
        v[i] = vi;
        param[i] = __fadd_rn(p, __fdiv_rn(__fmul_rn(k.neg_step_size, mi), denom));
    }
}

extern "C" void ft_cuda_adamw_step(ft_tensor param, ft_tensor grad, ft_tensor m, ft_tensor v,
                                   size_t n, ft_adamw_hparams hp, int step, float grad_scale)
{
    if (n == 0)
        return;
    double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2;
    adamw_consts k;
    k.decay = (float)(1.0 - lr * (double)hp.weight_decay);
    k.beta1 = hp.beta1;
    k.beta2 = hp.beta2;
    k.one_minus_b1 = (float)(1.0 - b1);
    k.one_minus_b2 = (float)(1.0 - b2);
    k.bc2_sqrt = (float)sqrt(1.0 - pow(b2, step));
    k.eps = hp.eps;
    k.neg_step_size = (float)-(lr / (1.0 - pow(b1, step)));
    k.grad_scale = grad_scale;
    FT_LAUNCH(adamw_kernel, grid_for(n, 256), 256, 0, ft_cuda_stream())(
        (float *)param.data, (const float *)grad.data, (float *)m.data, (float *)v.data, n, k);
    LAUNCH_CHECK();
}
