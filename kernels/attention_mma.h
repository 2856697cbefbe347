/*
 * kernels/attention_mma.h — internal to kernels/attention*.cu: the mma.sync (sm_80+) causal varlen GQA
 * attention forward that attention_forward (kernels/attention.h) runs for the head dims its wgmma kernel
 * does not take (HD 16, 32, 256; see attention_shape_supported for the rule).
 * Same contract as attention_forward (layouts, lse, rows past cu_seqlens[ND] not written); the caller
 * has validated the sizes and the alignment. Asynchronous on stream, no allocation; 0 or -1 with
 * kernels_error(). C linkage so the bench (kernels/bench/attention_bench.cu) can time it.
 */
#ifndef KERNELS_ATTENTION_MMA_H
#define KERNELS_ATTENTION_MMA_H

#include "kernels/attention.h"

#ifdef DFLASH_CUDA
#ifdef __cplusplus
extern "C" {
#endif
int attention_mma_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu_seqlens,
                          int ND, int max_seqlen, int T, int NH, int NKV, int HD, float scale, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif

#endif /* KERNELS_ATTENTION_MMA_H */
