/*
 * kernels/conv1d.h — the causal depthwise conv1d of Gated DeltaNet (Qwen3.5 / Qwen3.6) with its SiLU,
 * over packed documents:
 *     y[t, c] = silu( Σ_{j<K} w[c, j] · x[t − (K−1) + j, c] )
 * where rows before the token's document start count as zero (the conv window restarts at every
 * document, as transformers' causal_conv1d over one sequence with zero left padding). w [D, K] is
 * transformers' conv1d.weight [D, 1, K]. The input is the first D channels of the fused projection
 * rows (stride x_stride); the output is dense fp32 [T, D] (the gated delta rule reads fp32).
 * GPU: bf16 x, fp32 weights and accumulation, fp32 y. Reference: double accumulation.
 */
#ifndef KERNELS_CONV1D_H
#define KERNELS_CONV1D_H

#include <stdint.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y [T, D] from x rows at stride x_stride (>= D), w [D, K], cu_seqlens [ND+1] host (cu[ND] = T). */
void conv1d_forward_ref(float *y, const float *x, int x_stride, const float *w, const int32_t *cu_seqlens,
                        int n_docs, int T, int D, int K);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* y fp32 [T, D] dense; x bf16 rows at stride x_stride; w fp32 [D, K]; cu_seqlens device [ND+1].
 * 1 <= K <= 16. Asynchronous; 0 or -1 with kernels_error(). */
int conv1d_forward(float *y, const bf16 *x, int x_stride, const float *w, const int32_t *cu_seqlens, int n_docs,
                   int T, int D, int K, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_CONV1D_H */
