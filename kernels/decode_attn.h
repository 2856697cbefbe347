/*
 * kernels/decode_attn.h — attention of a few new query rows over per-slot KV caches (the decode step of the
 * target, stages/model/decode.h: prefill, one token per sequence, or a speculative block).
 *
 * Caches kc, vc [S, max_len, NKV, HD] hold S sequences ("slots"); row r of a step (T rows) belongs to slot
 * slot[r] at position pos[r]. decode_attn_append writes the step's k, v [T, NKV, HD] into the caches at
 * (slot[r], pos[r]); decode_attn_forward then lets each query row attend to keys 0..pos[r] of its slot:
 *     out[r,h,:] = Σ_{j<=pos[r]} softmax_j(scale · q[r,h,:]·kc[slot[r],j,h/G,:]) · vc[slot[r],j,h/G,:],  G = NH/NKV
 * so a row sees the cached context and the rows of its own step before it (appended first). Rows of one slot in
 * one step must have distinct positions; rows of distinct slots are independent.
 *
 * The reference is the loop of kernels/attention_ref.c (keys in position order, double accumulation), so a CPU
 * decode over the cache gives, per row, bitwise the full causal forward's value. The GPU kernel is a plain
 * split-K-over-warps decoder: one block of 8 warps per (row, query head); warp w takes keys w, w+8, ...; lanes
 * split the head dimension; each warp keeps an online softmax in fp32 registers, and the 8 partial results are
 * merged through shared memory. Memory-bound on the cache reads; the G heads of a group re-read their keys from
 * L2. No tensor cores: decoding is bandwidth-bound and this is the readable first version (TODO: one block per
 * KV head for G > 1 and a split over blocks for long caches, when a benchmark shows the need).
 */
#ifndef KERNELS_DECODE_ATTN_H
#define KERNELS_DECODE_ATTN_H

#include <stdint.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reference append: kc/vc [S, max_len, NKV, HD] fp32 get k/v [T, NKV, HD] at (slot[r], pos[r]). Host arrays.
 * Returns 0, or -1 with kernels_error() when a slot or position is out of range. */
int decode_attn_append_ref(float *kc, float *vc, const float *k, const float *v, const int32_t *slot,
                           const int32_t *pos, int T, int S, int max_len, int NKV, int HD);
/* Reference attention: out [T, NH, HD] from q [T, NH, HD] over the caches (after the append). scratch holds
 * max_len + HD doubles (the caller plans it; nothing is allocated). 0, or -1 with kernels_error() (bad slot or
 * position, NH % NKV != 0). */
int decode_attn_forward_ref(float *out, const float *q, const float *kc, const float *vc, const int32_t *slot,
                            const int32_t *pos, int T, int S, int max_len, int NH, int NKV, int HD, float scale,
                            double *scratch);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* GPU append, bf16: kc/vc [S, max_len, NKV, HD], k/v [T, NKV, HD], slot/pos [T] int32 in device memory (not
 * range-checked on the device: the caller checks them on the host). HD % 8 == 0, 16-byte aligned pointers.
 * Asynchronous; 0 or -1 with kernels_error(). */
int decode_attn_append(bf16 *kc, bf16 *vc, const bf16 *k, const bf16 *v, const int32_t *slot, const int32_t *pos,
                       int T, int max_len, int NKV, int HD, cudaStream_t stream);
/* GPU attention, bf16 in and out, fp32 softmax and accumulation: out [T, NH, HD], q [T, NH, HD]; slot/pos device.
 * HD <= 256, NH % NKV == 0; checked. Asynchronous; 0 or -1 with kernels_error(). */
int decode_attn_forward(bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *slot,
                        const int32_t *pos, int T, int max_len, int NH, int NKV, int HD, float scale,
                        cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_DECODE_ATTN_H */
