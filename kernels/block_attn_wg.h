/*
 * kernels/block_attn_wg.h — internal to kernels/block_attn*.cu: the Hopper wgmma (sm_90a) anchored block
 * attention, kernel set 7 of block_attn_forward / block_attn_backward (DFLASH_BLOCK_ATTN_KERNEL=7).
 * Same contract as the public launchers in kernels/block_attn.h (layouts, masks, lse, the deterministic
 * backward that overwrites dq, dk, dv); the caller (block_attn.cu) has already validated the config
 * (ba_check_device: d_h 64 or 128, (n_h/n_kv)·B <= 64, 16-byte aligned pointers). Asynchronous on
 * stream, no allocation; 0 or -1 with kernels_error(). C linkage, so the benchmark can include
 * block_attn.cu inside a namespace and still reach these.
 *   forward:  kernels/block_attn_fwd_wg.cu
 *   backward: kernels/block_attn_bwd_wg.cu
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
/* Benchmark-only entry (kernels/bench/block_attn_bench.cu; no library code calls it): ba_wg_backward as the
 * same environment picks it (DFLASH_BA_WG_M), with ev[0..4] recorded on stream before Di, the plan, dK/dV, dQ
 * and after dQ (the per-kernel split). probe 0: the real backward; 1 skips every product (loads, scans and
 * barriers only), 2 the softmax math: the results are then garbage, timing only (d_h 128 only). */
int ba_wg_backward_timed(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                         const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                         const float *lse, float *dq, float *dk, float *dv, int probe, cudaEvent_t ev[5],
                         cudaStream_t stream);
/* Benchmark-only entry (kernels/bench/ba_fwd_trace.cuh; no library code calls it): ba_wg_forward_ws (ws NULL:
 * the in-kernel set-up; else the plan path) as DFLASH_BLOCK_ATTN_WG_FWD picks it, built with the per-CTA phase
 * trace (d_h 128 only). *n_cta gets the grid
 * size; trace (device, n_cta × 32 u64, or NULL to ask only n_cta) gets per CTA: [0] smid, [1] entry, [2] Q and
 * set-up done, [3] loop end, [4] warpgroup 0's epilogue end (%globaltimer ns), [5] / [6] clock64 at entry / end
 * (thread 0), [7] tiles walked, [8 + w] clock cycles warpgroup w's thread 0 spent at the per-tile wait
 * (+ barrier + the next tile's load issue), [12], [13] warpgroups 1, 2's epilogue end (0 when not live);
 * [16 + w], [19 + w] the cycles of [8 + w] at the cp.async wait and at the barrier (free-running warpgroups, the
 * default where B is 16, 32 or 64: at the stage's full mbarrier, and in the stage releases); [22 + w] cycles waiting for S
 * (and the previous P·V) inside the tile steps. 32 u64 per CTA. Asynchronous on stream. */
int ba_wg_forward_traced(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                         const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, void *ws,
                         unsigned long long *trace, int *n_cta, cudaStream_t stream);
#ifdef __cplusplus
}
#endif
#endif

#endif /* KERNELS_BLOCK_ATTN_WG_H */
