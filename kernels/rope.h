/*
 * kernels/rope.h — rotary position embedding, NeoX / rotate-half style (dflash-reference.md §4.2).
 *
 * For a head vector x [HD] at position p, with i < HD/2 and angle a_i = float(p) · inv_freq[i]
 * (an fp32 product, as Hugging Face computes it):
 *     y[i]        = x[i]·cos a_i − x[i+HD/2]·sin a_i
 *     y[i+HD/2]   = x[i+HD/2]·cos a_i + x[i]·sin a_i
 * The backward is the inverse rotation (sin negated), applied to the incoming gradient.
 * inv_freq [HD/2] comes from rope_inv_freq(): θ^(−2i/HD) (computed in fp32 like HF), optionally
 * reshaped by Llama-3 scaling (factor, low/high frequency factors, original max positions).
 * Every token carries its own position id (positions restart per packed document, and drafter
 * block slots continue their anchor's position). Applied in place to q [T,NH,HD] and k [T,NKV,HD].
 */
#ifndef KERNELS_ROPE_H
#define KERNELS_ROPE_H

#include <stdint.h>
#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ROPE_SCALING_NONE = 0, ROPE_SCALING_LLAMA3 = 1 } rope_scaling;

struct rope_config {
    double theta;                 /* rope_theta (1e6 for Qwen3, 5e5 for Llama-3) */
    int head_dim;                 /* HD, even */
    rope_scaling scaling;         /* rope_scaling.rope_type: none/default or "llama3" */
    double factor;                /* llama3: factor (e.g. 8) */
    double low_freq_factor;       /* llama3: low_freq_factor (e.g. 1) */
    double high_freq_factor;      /* llama3: high_freq_factor (e.g. 4) */
    int original_max_positions;   /* llama3: original_max_position_embeddings (e.g. 8192) */
};

/* inv_freq [HD/2] on the host, from cfg (the HF "default" and "llama3" rope init functions).
 * Returns 0, or -1 with kernels_error() when cfg is invalid (odd head_dim, theta <= 0, llama3
 * factors inconsistent). Pure; thread-safe. */
int rope_inv_freq(float *inv_freq, const struct rope_config *cfg);

/* Reference, in place: q [T,NH,HD], k [T,NKV,HD] (k may be NULL), pos [T], inv_freq [HD/2]. */
void rope_forward_ref(float *q, float *k, const int32_t *pos, const float *inv_freq,
                      int T, int NH, int NKV, int HD);
/* Reference backward, in place on the gradients dq [T,NH,HD], dk [T,NKV,HD] (dk may be NULL). */
void rope_backward_ref(float *dq, float *dk, const int32_t *pos, const float *inv_freq,
                       int T, int NH, int NKV, int HD);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* GPU, in place, bf16 q [T,NH,HD] and k [T,NKV,HD] (k may be NULL), pos [T] int32 and inv_freq
 * [HD/2] fp32 in device memory. Rotation in fp32 with accurate sincosf, rounded once to bf16.
 * HD % 16 == 0 and HD <= 256; checked. Asynchronous; 0 or -1 with kernels_error(). */
int rope_forward(bf16 *q, bf16 *k, const int32_t *pos, const float *inv_freq, int T, int NH, int NKV,
                 int HD, cudaStream_t stream);
/* GPU backward: the inverse rotation applied in place to dq, dk (dk may be NULL). */
int rope_backward(bf16 *dq, bf16 *dk, const int32_t *pos, const float *inv_freq, int T, int NH,
                  int NKV, int HD, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_ROPE_H */
