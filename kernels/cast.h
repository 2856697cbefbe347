/*
 * kernels/cast.h — element casts between fp32 and bf16 on the GPU (round to nearest even, NaN kept),
 * e.g. fp32 master weights -> bf16 compute copies, bf16 checkpoints -> fp32. The CPU side is
 * bf16_from_floats / floats_from_bf16 in kernels/common.h, which round identically; cast_ref.c
 * only wraps them under the reference names.
 */
#ifndef KERNELS_CAST_H
#define KERNELS_CAST_H

#include <stddef.h>
#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

void cast_f32_to_bf16_ref(bf16 *dst, const float *src, size_t n);
void cast_bf16_to_f32_ref(float *dst, const bf16 *src, size_t n);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* dst [n] bf16 <- src [n] fp32. Any n and alignment (vectorised when both are 16-byte aligned).
 * Asynchronous; 0 or -1 with kernels_error(). */
int cast_f32_to_bf16(bf16 *dst, const float *src, size_t n, cudaStream_t stream);
/* dst [n] fp32 <- src [n] bf16 (exact). Any n and alignment (vectorised when dst is 16-byte and src
 * 8-byte aligned). Asynchronous; 0 or -1 with kernels_error(). */
int cast_bf16_to_f32(float *dst, const bf16 *src, size_t n, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_CAST_H */
