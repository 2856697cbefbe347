/*
 * kernels/gated_attn.h — the pieces of Qwen3.5 / Qwen3.6's gated full-attention layer that are not
 * plain attention (transformers' Qwen3_5Attention):
 *   split   q_proj's output holds per head [query (HD) | gate (HD)]; with k and v in the same fused
 *           GEMM row (width 2·NH·HD + 2·NKV·HD) it splits into dense q, gate [T, NH·HD], k, v
 *           [T, NKV·HD].
 *   rope    partial rotary embedding in place on q [T, NH, HD] and k [T, NKV, HD]: the first R dims
 *           of each head rotate in the half-split form (pairs i, i + R/2, angle float(pos)·inv_freq[i],
 *           fp32 cos / sin), the other HD − R dims pass through.
 *   gate    att ⊙ sigmoid(gate), the attention output's gate (before o_proj).
 * The zero-centred (1 + w) q/k RMSNorm between split and rope is kernels/rmsnorm.h with the
 * effective weight 1 + w stored at load. GPU: bf16 in and out, fp32 math, one rounding per output.
 */
#ifndef KERNELS_GATED_ATTN_H
#define KERNELS_GATED_ATTN_H

#include <stdint.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

void gated_attn_split_forward_ref(float *q, float *gate, float *k, float *v, const float *qkv, int T, int NH, int NKV,
                                  int HD);
/* x [T, n_heads, HD] in place; inv_freq [R/2]; R even, 2 <= R <= HD. */
void gated_attn_rope_forward_ref(float *x, const int32_t *pos, const float *inv_freq, int T, int n_heads, int HD,
                                 int R);
void gated_attn_gate_forward_ref(float *att, const float *gate, int64_t n);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* Device bf16 tensors as above. Asynchronous; 0 or -1 with kernels_error(). */
int gated_attn_split_forward(bf16 *q, bf16 *gate, bf16 *k, bf16 *v, const bf16 *qkv, int T, int NH, int NKV, int HD,
                             cudaStream_t stream);
/* q [T, NH, HD] and k [T, NKV, HD] in one launch; pos int32 device [T], inv_freq fp32 device [R/2]. */
int gated_attn_rope_forward(bf16 *q, bf16 *k, const int32_t *pos, const float *inv_freq, int T, int NH, int NKV,
                            int HD, int R, cudaStream_t stream);
int gated_attn_gate_forward(bf16 *att, const bf16 *gate, int64_t n, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_GATED_ATTN_H */
