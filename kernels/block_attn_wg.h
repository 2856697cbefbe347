/*
 * kernels/block_attn_wg.h — internal to kernels/block_attn*.cu: the Hopper wgmma (sm_90a) anchored block
 * attention that the public launchers of kernels/block_attn.h run.
 * Same contract as those launchers (layouts, masks, lse, the deterministic backward that overwrites dq, dk,
 * dv); the caller (block_attn.cu) has already validated the config (ba_check_device: d_h 64 or 128,
 * (n_h/n_kv)·B <= 64, 16-byte aligned pointers). Asynchronous on stream, no allocation; 0 or -1 with
 * kernels_error(). C linkage.
 *   forward:  kernels/block_attn_fwd_wg.cu (kernel templates and launch code in kernels/block_attn_fwd_wg.cuh)
 *   backward: kernels/block_attn_bwd_wg.cu (kernel templates and launch code in kernels/block_attn_bwd_wg.cuh)
 * kernels/bench/block_attn_bench.cu includes the two .cuh files (no external symbol) to instantiate other knobs.
 */
#ifndef KERNELS_BLOCK_ATTN_WG_H
#define KERNELS_BLOCK_ATTN_WG_H

#include "kernels/block_attn.h"

#ifdef DFLASH_CUDA
#ifdef __cplusplus
extern "C" {
#endif
int ba_wg_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                  const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream);
/* ba_wg_forward with the plan path when ws != NULL (block_attn_forward_ws's contract, kernels/block_attn.h:
 * block_attn_forward_workspace_bytes(c) bytes of device memory, 16-byte aligned, owned by the caller); ws NULL
 * is ba_wg_forward. */
int ba_wg_forward_ws(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                     const int32_t *doc_ids, bf16 *out, float *lse, void *ws, cudaStream_t stream);
int ba_wg_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                   const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse, float *dq, float *dk,
                   float *dv, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif

#endif /* KERNELS_BLOCK_ATTN_WG_H */
