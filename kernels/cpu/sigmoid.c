/* The logistic sigmoid of a gate, fp32 CPU reference (ops.h's ft_sigmoid_forward):
 *   s = 1 / (1 + exp(-z));  backward dz += ds s (1 - s).
 * qwen2_moe's shared expert is weighted per token by sigmoid(shared_expert_gate(x)); the
 * weighting itself is ft_moe_combine with one slot a row. */
#include <math.h>

#include "cpu_ops.h"

void ft_cpu_sigmoid_forward(float *s, const float *z, size_t n)
{
    for (size_t i = 0; i < n; i++)
        s[i] = 1.0f / (1.0f + expf(-z[i]));
}

void ft_cpu_sigmoid_backward(float *dz, const float *ds, const float *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dz[i] += ds[i] * (s[i] * (1.0f - s[i]));
}
