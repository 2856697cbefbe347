/*
 * kernels/attention.h — causal self-attention over packed variable-length documents (the target's
 * attention; forward only, the target is frozen), GQA, flash-attention style.
 *
 * The packed sequence of T tokens holds ND documents; document d is rows cu_seqlens[d] ..
 * cu_seqlens[d+1]-1 (cu_seqlens [ND+1], cu_seqlens[0] = 0, cu_seqlens[ND] = T, non-decreasing;
 * empty documents are allowed). A query at document-local index i attends to keys 0..i of its own
 * document only:
 *     out[t,h,:] = Σ_j softmax_j(scale · q[t,h,:]·k[j,h/G,:]) · v[j,h/G,:],   G = NH / NKV
 * q [T,NH,HD], k and v [T,NKV,HD], out [T,NH,HD]; lse [NH,T] (optional) is the natural-log
 * log-sum-exp of the scaled scores per query, for a later backward. The GPU kernel never
 * materialises the scores: it streams 128-key tiles through shared memory, multiplies with Hopper
 * wgmma bf16 tensor-core instructions (sm_90a), keeps an online softmax in fp32 registers and
 * skips every tile above the causal diagonal. HD ∈ {64, 128} on the GPU; any HD in the reference.
 * Other head dims: HD ∈ {16, 32, 256} run a plainer mma.sync m16n8k16 kernel (kernels/attention_mma.cu:
 * 64-row query tiles of four warps, 64-key tiles, 32 at HD 256). The choice is a fixed function of HD:
 *     HD 64, 128       -> the wgmma kernel (kernels/attention.cu)
 *     HD 16, 32, 256   -> the mma.sync kernel
 *     any other HD     -> refused (attention_shape_supported says so before anything runs).
 */
#ifndef KERNELS_ATTENTION_H
#define KERNELS_ATTENTION_H

#include <stdint.h>
#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Validate cu_seqlens [ND+1] (host) against T; 0, or -1 with kernels_error() saying what is wrong.
 * Also returns the longest document in *max_seqlen when non-NULL. */
int attention_check_cu_seqlens(const int32_t *cu_seqlens, int ND, int T, int *max_seqlen);

/* Reference (fp32 data, double accumulation): out [T,NH,HD], lse [NH,T] (nullable), q [T,NH,HD],
 * k/v [T,NKV,HD], cu_seqlens [ND+1] host. Returns 0, or -1 on invalid cu_seqlens or NH % NKV != 0. */
int attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v,
                          const int32_t *cu_seqlens, int ND, int T, int NH, int NKV, int HD, float scale);

/* Whether attention_forward takes the shape (host only, no CUDA call; callable from CPU builds so a planner
 * or a stage refuses a config at start-up): 0, or -1 with one line in err naming the shape and listing the
 * shapes the GPU kernels take (HD 16, 32, 64, 128 or 256; NH a positive multiple of NKV). */
int attention_shape_supported(int NH, int NKV, int HD, char *err, int err_len);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* GPU: out [T,NH,HD] bf16, lse [NH,T] fp32 or NULL, q/k/v bf16, cu_seqlens [ND+1] int32 in device
 * memory, max_seqlen = the longest document (host value: it sizes the grid; a smaller value leaves
 * rows unwritten). HD 16, 32, 64, 128 or 256 (attention_shape_supported), NH % NKV == 0, 16-byte
 * aligned pointers; checked. scale is usually
 * 1/sqrt(HD). Asynchronous; 0 or -1 with kernels_error(). Rows with no document (T beyond
 * cu_seqlens[ND]) are not written. Kernel: the wgmma kernel (two warpgroups ×
 * 64 query rows with a ping-pong issue order, 128-key tiles, staged output stores, lazy rescaling,
 * longest-first tile order) at HD 64 and 128; kernels/attention_mma.cu at HD 16, 32, 256. */
int attention_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                      const int32_t *cu_seqlens, int ND, int max_seqlen, int T, int NH, int NKV,
                      int HD, float scale, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_ATTENTION_H */
