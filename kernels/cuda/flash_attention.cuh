/* The tensor-core attention of flash_attention.cu, which attention.cu's entry points
 * call when it applies (see ft_cuda_attention_kernel in cuda_ops.h). Not a public
 * header. */
#ifndef FT_FLASH_ATTENTION_CUH
#define FT_FLASH_ATTENTION_CUH

#include "../ops.h"
#include "cuda_common.cuh"
#include "attention_args.cuh"

/* Whether the flash kernels take head dim D with these operands: D a multiple of 16 up
 * to 128, every operand given bf16 with its data 16-byte aligned (the kernels copy rows 16
 * bytes at a time), and the kernels' shared memory within what a block of the current
 * device may opt in to (not so for D = 128 on sm_86 / sm_89: 99 KiB). */
bool ft_cuda_flash_attention_fits(int D, const ft_tensor *bf16_operands, int n);

/* The launches, with the arguments attention.cu's entry points prepared. */
void ft_cuda_flash_attention_forward(const att_args &a);
void ft_cuda_flash_attention_backward(const att_args &a);

#endif
