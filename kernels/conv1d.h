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

/* The decode step's form (stages/model/decode.c): each of S sequences ("slots") keeps its conv input rows in a
 * ring hist [S, W, D] (the row of position p at p % W); row r of a step belongs to slot slot[r] at position pos[r].
 * conv1d_decode_append_ref writes the step's rows x [T, x_stride] there (D channels); conv1d_decode_ref then gives
 * y [T, D] = silu(Σ_j w[c, j] · hist row pos[r] − (K−1) + j of slot[r]), positions below 0 counting as zero: the
 * rows conv1d_forward gives for positions pos[r] of the slot's whole sequence, when the ring still holds the K − 1
 * positions before each row (W >= the rows a slot gets in one step + K − 1). */
void conv1d_decode_append_ref(float *hist, const float *x, int x_stride, const int32_t *slot, const int32_t *pos,
                              int T, int W, int D);
void conv1d_decode_ref(float *y, const float *hist, const int32_t *slot, const int32_t *pos, int T, int W,
                       const float *w, int D, int K);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* The decode step on the device: hist bf16 [S, W, D], x bf16 rows at x_stride, slot/pos int32 device [T], w fp32
 * [D, K], y fp32 [T, D]. 1 <= K <= 16. Asynchronous; 0 or -1 with kernels_error(). */
int conv1d_decode_append(bf16 *hist, const bf16 *x, int x_stride, const int32_t *slot, const int32_t *pos, int T,
                         int W, int D, cudaStream_t stream);
int conv1d_decode(float *y, const bf16 *hist, const int32_t *slot, const int32_t *pos, int T, int W, const float *w,
                  int D, int K, cudaStream_t stream);
/* y fp32 [T, D] dense; x bf16 rows at stride x_stride; w fp32 [D, K]; cu_seqlens device [ND+1].
 * 1 <= K <= 16. Asynchronous; 0 or -1 with kernels_error(). */
int conv1d_forward(float *y, const bf16 *x, int x_stride, const float *w, const int32_t *cu_seqlens, int n_docs,
                   int T, int D, int K, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_CONV1D_H */
