/* AdamW step over one flat fp32 range, CPU reference.
 *
 * param, grad, m (exp_avg), v (exp_avg_sq): [n]. step counts from 1 (the value of the
 * step counter after this update). With g = grad * grad_scale (clipping and loss-scale
 * folded into grad_scale), per element:
 *   param = param * (1 - lr wd)
 *   m     = m b1 + (1 - b1) g
 *   v     = v b2 + ((1 - b2) g) g
 *   denom = sqrt(v) / sqrt(1 - b2^step) + eps
 *   param = param + (-(lr / (1 - b1^step)) m) / denom
 *
 * This is torch.optim.AdamW's single-tensor path (_single_tensor_adamw, torch 1.13 and
 * 2.x, amsgrad = maximize = capturable = False), op for op in the same fp32 order, so
 * the conformance suite can compare at 1e-5 after several steps:
 *   param.mul_(1 - lr * weight_decay)
 *   exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
 *   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
 *   bias_correction1 = 1 - beta1 ** step;  bias_correction2 = 1 - beta2 ** step
 *   step_size = lr / bias_correction1;  bias_correction2_sqrt = math.sqrt(bias_correction2)
 *   denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-step_size)
 * The scalar expressions are Python floats (double), computed here in double from the
 * fp32 hyper-parameters and rounded to float where torch casts a scalar to the tensor's
 * dtype. torch's CPU kernels (on any AVX2 machine) compute add_ as fma(alpha, b, a) and
 * addcmul_ as fma(value*b, c, a), addcdiv_ as a + (value*b)/c, and a division by a
 * scalar as a true division. The two fused steps are done here in double: a product of
 * two floats is exact in double, so (float)((double)x*y + z) is the fused result (bar a
 * double rounding, about once in 2^29) without a per-element fmaf() call on a target
 * without FMA. Checked against torch 1.13: bitwise equal after 5 steps on 1e5 elements.
 * (torch >= 2.0 writes the m update as exp_avg.lerp_(grad, 1 - beta1), the same value
 * up to rounding.) */
#include <math.h>

#include "cpu_ops.h"
#include "cpu_parallel.h"
#include "simd_clones.h"

/* Elements per span: the unit of the OpenMP loop and of one call of update_span. */
#define SPAN 4096

/* The update of one span, cloned per vector width (simd_clones.h): an element-wise map,
 * the same bits at any width. */
FT_SIMD_CLONES
static void update_span(float *param, const float *grad, float *m, float *v, long len,
                        float grad_scale, float decay, float beta1, float beta2,
                        float one_minus_b1, float one_minus_b2, float bc2_sqrt, float eps,
                        float neg_step_size)
{
#pragma omp simd
    for (long i = 0; i < len; i++) {
        float g = grad[i] * grad_scale;
        float p = param[i] * decay;
        float mi = (float)((double)(m[i] * beta1) + (double)one_minus_b1 * g);
        float vi = (float)((double)(v[i] * beta2) + (double)(one_minus_b2 * g) * g);
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        m[i] = mi;
        v[i] = vi;
        param[i] = p + (neg_step_size * mi) / denom;
    }
}

void ft_cpu_adamw_step(float *param, const float *grad, float *m, float *v, size_t n,
                       ft_adamw_hparams hp, int step, float grad_scale)
{
    double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2;
    double bias_correction1 = 1.0 - pow(b1, step);
    double bias_correction2 = 1.0 - pow(b2, step);
    double step_size = lr / bias_correction1;
    double bias_correction2_sqrt = sqrt(bias_correction2);

    const float decay = (float)(1.0 - lr * (double)hp.weight_decay);
    const float one_minus_b1 = (float)(1.0 - b1), one_minus_b2 = (float)(1.0 - b2);
    const float bc2_sqrt = (float)bias_correction2_sqrt;
    const float neg_step_size = (float)-step_size;

    long len = (long)n, nspan = (len + SPAN - 1) / SPAN;
#pragma omp parallel for schedule(static) if (len >= FT_PAR_MIN_MATH)
    for (long k = 0; k < nspan; k++) {
        long i0 = k * SPAN;
        update_span(param + i0, grad + i0, m + i0, v + i0, len - i0 < SPAN ? len - i0 : SPAN,
                    grad_scale, decay, hp.beta1, hp.beta2, one_minus_b1, one_minus_b2,
                    bc2_sqrt, hp.eps, neg_step_size);
    }
}
