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
 * - Devices: this is the CPU path (fp32, the kernels' plain-C references, the target's own weights through
 *   target_cpu_layer). A GPU path keeps the same API and buffers (bf16 caches, the launchers of kernels/, a decode
 *   attention over the cache) and is not written yet: decode_init refuses a GPU target with a sentence.
 *   Qwen3.5 / 3.6 hybrids need a recurrent-state cache for their Gated DeltaNet layers (conv window + state per
 *   slot, model/gdn.h) and are refused with a sentence; callers fall back to recomputing the context.
 * - Memory is planned at decode_init (caches + work buffers for max_step_tokens rows); decode_extend allocates
 *   nothing. One thread owns a struct decode. Library code: 0/-1 with a sentence in err, never exits.
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

/* Plan caches for n_slots sequences of up to max_len tokens and work buffers for up to max_step_tokens new tokens
 * per decode_extend. t stays owned by the caller and must outlive the decode. Returns NULL with a sentence (GPU or
 * hybrid target, out of memory). */
struct decode *decode_init(struct target *t, int n_slots, int max_len, int max_step_tokens, char *err, int err_len);
void decode_free(struct decode *d);   /* NULL is fine */

/* Tokens cached in slot (0 after init). */
int decode_len(const struct decode *d, int slot);
/* Forget everything after the first len tokens of slot (0 <= len <= decode_len). 0/-1. */
int decode_truncate(struct decode *d, int slot, int len, char *err, int err_len);

/* Append tokens to n_seq distinct slots: sequence i puts ids[cu[i] .. cu[i+1]) into slots[i] at positions
 * decode_len(slots[i]) onwards (cu[0] = 0, T = cu[n_seq] <= max_step_tokens, each slot's new length <= max_len).
 * Writes, for the T new tokens in that order, states (k, T, C) = the captured layers in the target's capture order
 * (may be NULL) and last (T, C) = the last decoder layer's output before the final norm. 0/-1 (bad ids, overflow,
 * a slot twice). */
int decode_extend(struct decode *d, int n_seq, const int *slots, const int32_t *ids, const int32_t *cu,
                  float *states, float *last, char *err, int err_len);

size_t decode_cache_bytes(const struct decode *d);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_MODEL_DECODE_H */
