/*
 * kernels/block_attn_simt.h — internal to kernels/block_attn*.cu: the plain fp32 (SIMT, no tensor cores)
 * anchored block attention that the public launchers of kernels/block_attn.h run for the shapes the wgmma
 * kernels do not take: d_h 16, 32 or 256, or (n_h/n_kv)·B > 64 (GQA groups up to 8 at B = 16 and beyond).
 * Same contract as those launchers (layouts, masks, lse in natural log, the deterministic backward that
 * overwrites dq, dk, dv and uses dq as scratch for Di); the caller (block_attn.cu) has validated the config
 * and the pointers. d_h in {16, 32, 64, 128, 256}; any (n_h/n_kv)·B. Asynchronous on stream, no allocation;
 * 0 or -1 with kernels_error(). C linkage so the bench can time it.
 */
#ifndef KERNELS_BLOCK_ATTN_SIMT_H
#define KERNELS_BLOCK_ATTN_SIMT_H

#include "kernels/block_attn.h"

#ifdef DFLASH_CUDA
#ifdef __cplusplus
extern "C" {
#endif
int ba_simt_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                    const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream);
int ba_simt_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                     const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse, float *dq, float *dk,
                     float *dv, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif

#endif /* KERNELS_BLOCK_ATTN_SIMT_H */
