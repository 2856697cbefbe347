/*
 * kernels/gated_rmsnorm.h — Gated DeltaNet's output norm (Qwen3_5RMSNormGated), per value head:
 *     y = w ⊙ (o · rsqrt(mean(o²) + eps)) ⊙ silu(z)
 * over each head of d values; w [d] is the plain weight (not 1 + w). o is the gated delta rule's
 * dense fp32 output [T, n_heads·d]; z the fused projection's z columns at stride z_stride; y dense
 * [T, n_heads·d], the input of out_proj. GPU: fp32 o and statistics, bf16 z and y (one rounding).
 */
#ifndef KERNELS_GATED_RMSNORM_H
#define KERNELS_GATED_RMSNORM_H

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

void gated_rmsnorm_forward_ref(float *y, const float *o, const float *z, int z_stride, const float *w, int T,
                               int n_heads, int d, float eps);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* y bf16 [T, n_heads·d]; o fp32 dense; z bf16 at z_stride (>= n_heads·d); w fp32 [d]. One warp per
 * (token, head). Asynchronous; 0 or -1 with kernels_error(). */
int gated_rmsnorm_forward(bf16 *y, const float *o, const bf16 *z, int z_stride, const float *w, int T, int n_heads,
                          int d, float eps, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_GATED_RMSNORM_H */
