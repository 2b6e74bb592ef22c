/* The tensor-core attention of flash_attention.cu, which attention.cu's entry points
 * call when it applies (see ft_cuda_attention_kernel in cuda_ops.h). Not a public
 * header. */
#ifndef FT_FLASH_ATTENTION_CUH
#define FT_FLASH_ATTENTION_CUH

#include "../ops.h"

/* Whether the flash kernels take head dim D with these operands: D a multiple of 16 up
 * to 128, and every operand given bf16. */
bool ft_cuda_flash_attention_fits(int D, const ft_tensor *bf16_operands, int n);

void ft_cuda_flash_attention_forward(ft_tensor out, ft_tensor lse, ft_tensor q, ft_tensor k,
                                     ft_tensor v, ft_tensor seg, int B, int T, int Hq,
                                     int Hkv, int D, float scale, int window);
void ft_cuda_flash_attention_backward(ft_tensor dq, ft_tensor dk, ft_tensor dv,
                                      ft_tensor dout, ft_tensor q, ft_tensor k, ft_tensor v,
                                      ft_tensor out, ft_tensor lse, ft_tensor seg, int B,
                                      int T, int Hq, int Hkv, int D, float scale, int window);

#endif
