/*
 * stages/model/decode.h — KV-cached incremental forward of the target (issue 30 items 2-3): the decode step that
 * dflash-eval (speculative decoding, plain greedy decoding) and dflash-sample (regeneration) share.
 *
 * DESIGN
 * - A struct decode holds, for n_slots sequences of up to max_len tokens, every attention layer's K (after its norm
 *   and RoPE) and V, per layer (n_slots, max_len, NKV·HD). One call, decode_extend, appends a few tokens to
 *   several slots at once: prefill (a whole prompt), one token per sequence (plain decoding) or a block (the
 *   verification of a draft) are the same call. Each new token attends to its slot's cached tokens and to the new
 *   tokens before it. decode_truncate rolls a slot back (a rejected draft's K/V are simply overwritten later).
 * - Every new token's computation depends only on its own row and its slot's cache, in a fixed order (row-wise
 *   GEMMs, RMSNorm and RoPE; the attention loop of kernels/attention_ref.c over cached keys in position order):
 *   so the result for a token is bitwise the same whether it came alone, in a block or in a batch of sequences,
 *   and bitwise the full-context target_forward's. Speculative decoding built on it therefore emits exactly plain
 *   greedy decoding's tokens.
 * - Devices: one interface, two implementations (as target.c has forward_cpu / forward_gpu), chosen by the target's
 *   device. CPU: fp32, the kernels' plain-C references (kernels/decode_attn_ref.c for the cache), the target's own
 *   weights through target_cpu_layer. GPU: bf16 caches and activations, fp32 accumulation, the launchers of
 *   kernels/ (blas, rmsnorm, rope, swiglu, embedding, decode_attn) on the target's stream, the weights through
 *   target_gpu_layer; decode_extend returns when its outputs are on the host. The GPU's bf16 rounding differs
 *   from the CPU's fp32, so the two agree token for token except at near-ties of the logits (tests/gpu/).
 * - Qwen3.5 / 3.6 hybrids (CPU): the full-attention layers keep a KV cache as above; each Gated DeltaNet layer keeps,
 *   per slot, its conv input rows by position (the conv window of any position) and its live recurrent state, plus
 *   a snapshot of the state after each of the last DECODE_STATE_SNAPS tokens of the slot's last step. A recurrent
 *   state cannot be rewound, so decode_truncate of a hybrid restores the snapshot after position len - 1 (the
 *   last step's, e.g. a rejected speculative block, or an older one not yet overwritten) or restarts at 0, and
 *   refuses anything else with a sentence. Per token the result is
 *   bitwise the full forward's (forward_cpu_hybrid), as for Qwen3. On a GPU (forward_gpu_hybrid's layers): the conv
 *   input rows in a per-slot ring of the positions a step and a rollback reach (kernels/conv1d.h's decode pair),
 *   the states and snapshots on the device (kernels/gated_delta.h's gated_delta_decode; tests/gpu/test_decode_gpu.c
 *   and test_gdn_kernels.cu check it against the CPU step on the H200, RESULTS.md run 52).
 * - The final norm and LM head (decode_set_head) turn chosen rows of the last step into logits (decode_logits):
 *   on the GPU only those (T, V) logits cross to the host, so the host's sampling code (stages/export/eval.c) is
 *   the same for both devices, and a draw depends only on the logits it is given.
 * - Memory is planned at decode_init (caches + work buffers for max_step_tokens rows; on a GPU the whole plan is
 *   checked against the device's free memory first and refused with one line naming the sizes); decode_extend
 *   and decode_logits allocate nothing. One thread owns a struct decode. Library code: 0/-1 with a sentence in err, never exits.
 */
#ifndef STAGES_MODEL_DECODE_H
#define STAGES_MODEL_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "model/target.h"

#ifdef __cplusplus
extern "C" {
#endif

struct decode;

/* A hybrid slot can be truncated back into the last DECODE_STATE_SNAPS tokens of its last step (>= the largest
 * speculative block, DRAFTER_MAX_B, + 1). */
#define DECODE_STATE_SNAPS 17

/* Plan caches for n_slots sequences of up to max_len tokens and work buffers for up to max_step_tokens new tokens
 * per decode_extend, on the target's device. t stays owned by the caller and must outlive the decode. Returns NULL
 * with a sentence (hybrid target, a shape the GPU kernels do not take, out of memory). */
struct decode *decode_init(struct target *t, int n_slots, int max_len, int max_step_tokens, char *err, int err_len);
void decode_free(struct decode *d);   /* NULL is fine */

/* Tokens cached in slot (0 after init). */
int decode_len(const struct decode *d, int slot);
/* Forget everything after the first len tokens of slot (0 <= len <= decode_len; a hybrid: len 0, or len - 1 among
 * the positions whose state snapshot is held: always the last DECODE_STATE_SNAPS tokens of the slot's last step).
 * 0/-1. */
int decode_truncate(struct decode *d, int slot, int len, char *err, int err_len);

/* Append tokens to n_seq distinct slots: sequence i puts ids[cu[i] .. cu[i+1]) into slots[i] at positions
 * decode_len(slots[i]) onwards (cu[0] = 0, T = cu[n_seq] <= max_step_tokens, each slot's new length <= max_len).
 * Writes, for the T new tokens in that order, states (k, T, C) = the captured layers in the target's capture order
 * (may be NULL) and last (T, C) = the last decoder layer's output before the final norm (may be NULL), host fp32
 * on both devices. 0/-1 (bad ids, overflow, a slot twice). */
int decode_extend(struct decode *d, int n_seq, const int *slots, const int32_t *ids, const int32_t *cu,
                  float *states, float *last, char *err, int err_len);

/* Bytes of the KV caches, and of everything decode_init allocated on the device (0 on the CPU). */
size_t decode_cache_bytes(const struct decode *d);
size_t decode_device_bytes(const struct decode *d);

/* The final norm (C) and LM head (V, C), host fp32 (model.norm.weight and lm_head.weight, or the embedding when
 * tied), for decode_logits of up to max_rows rows per call. CPU: kept by pointer (they must outlive d). GPU:
 * copied to the device as bf16 (norm fp32). 0/-1 (out of memory, V not a multiple of 8 on a GPU). */
int decode_set_head(struct decode *d, const float *norm, const float *lm_head, int max_rows, char *err, int err_len);
/* logits (n_rows, V), host fp32: lm_head · RMSNorm_final(x) for x = row rows[i] of the last decode_extend's `last`
 * output (rows in [0, T)). CPU: the arithmetic of eval_target_logits (double sum of squares, fp32 dot products).
 * GPU: bf16 norm output, fp32 GEMM output. 0/-1. */
int decode_logits(struct decode *d, int n_rows, const int32_t *rows, float *logits, char *err, int err_len);
/* ids[i] = the argmax of decode_logits' row i (the first maximum; kernels/argmax.h): greedy decoding's pick. GPU:
 * the logits stay on the device and only the n_rows ids cross (kernels/argmax.h); the same logits as
 * decode_logits', so the same picks. 0/-1. */
int decode_argmax(struct decode *d, int n_rows, const int32_t *rows, int32_t *ids, char *err, int err_len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_MODEL_DECODE_H */
