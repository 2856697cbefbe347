/*
 * stages/export/drafter_cache.h — the drafter's block proposal with a per-sequence context K/V cache, on the CPU
 * (issue 30 item 3; dflash-reference.md §4.2 and §6).
 *
 * DESIGN
 * - What the proposal computes is drafter_step's forward (train = 0) on one block anchored at the last committed
 *   token a = n - 1: the B block rows (the anchor token, then the mask token, positions a + j) attend to the
 *   context rows p of the block attention rule (p < a, and p >= a - W on sliding layers) and to the block's own
 *   keys (causal or not as the layer says). A context row's key and value on layer l are
 *   RoPE_p(k_norm(W_k·ctx_p)) and W_v·ctx_p with ctx_p = hidden_norm(fc(features of token p)): a function of that
 *   token's features and its position only. So they are kept per sequence and per layer, and each proposal
 *   projects only the rows committed since the previous one (about τ rows a round), then runs the B block rows
 *   through the layers against the cache. The uncached proposal re-runs the whole context every round.
 * - Slots: the caller (eval_generate) runs up to n_slots sequences; each has its own cache. A sequence is named by
 *   (slot, seq): a seq that differs from the one cached in the slot, or fewer committed rows than are cached,
 *   starts the slot over. Within one seq the committed features of a row never change.
 * - Cache layout, per (slot, layer): K and V as (n_kv, max_len + B, d_h), head-major, so the keys one block sees on
 *   a kv head (the visible context rows lo..a-1, then the block's B rows written at rows a..a+B-1) are one strided
 *   matrix: the scores and P·V are two SGEMMs without a gather, as cpu_ops' block attention computes them after
 *   its gather. Rows a.. are overwritten by the next proposal's context rows.
 * - Numerics: fp32, the fast CPU step's ops (stages/train/cpu_ops.h: OpenBLAS SGEMMs, the row references) and the
 *   same softmax arithmetic as cpu_ops_block_attn_forward. The GEMMs run over other row counts than the uncached
 *   step's, so results agree with it to fp32 rounding (not bit for bit); the drafts (argmaxes) agree unless two
 *   logits tie within that rounding.
 * - Memory: everything is allocated by drafter_cache_init (the caches: n_slots · L · 2 · (max_len + B) · n_kv·d_h
 *   floats, plus scratch for one block and a chunk of 64 context rows); a proposal allocates nothing.
 *
 * Library code: 0/-1 with one sentence in err. A struct drafter_cache is not thread-safe; it reads the drafter's
 * weights, which must stay in place (and unchanged) while it is used.
 */
#ifndef STAGES_EXPORT_DRAFTER_CACHE_H
#define STAGES_EXPORT_DRAFTER_CACHE_H

#include <stdint.h>
#include <stdio.h>

#include "train/drafter.h"

#ifdef __cplusplus
extern "C" {
#endif

struct drafter_cache;

/* Counters since drafter_cache_init (tests and benchmarks: whether the cache is hit). */
struct drafter_cache_stats {
    int64_t proposals;     /* drafter_cache_propose calls that succeeded */
    int64_t ctx_rows;      /* context rows projected (fc, K, V) in all */
    int64_t resets;        /* slots started over (a new sequence, or fewer rows than cached) */
};

/* Plan the caches of drafter d for n_slots sequences of up to max_len tokens (committed context + the block must
 * fit: n - 1 + B <= max_len + B). d must outlive the cache. NULL with a sentence in err (bad sizes, out of
 * memory). */
struct drafter_cache *drafter_cache_init(struct drafter *d, int n_slots, int max_len, char *err, int err_len);
void drafter_cache_free(struct drafter_cache *dc);

/* The draft of sequence (slot, seq) with committed tokens c[0..n) (n >= 1): draft[0..B-2] = the drafter's argmax
 * tokens for positions n..n+B-2 (mapped through d2t when the draft vocabulary is pruned). states holds the
 * target's captured features of the committed tokens as k blocks of `rows` rows of H (row t = token t, rows
 * 0..n-2 at least; the anchor's row is not read). Projects the context rows not yet cached, then the block.
 * Blocks; allocates nothing. 0/-1 with a sentence (slot or length outside the plan, too few feature rows, a
 * token outside the embedding). */
int drafter_cache_propose(struct drafter_cache *dc, int slot, int64_t seq, const int32_t *c, int n,
                          const float *states, int rows, int32_t *draft, char *err, int err_len);

/* The last proposal's final normed block states (B, H) (row j: the state predicting position a + j), valid until
 * the next call; for comparisons with drafter_last_step's xn. */
const float *drafter_cache_xn(const struct drafter_cache *dc);
void drafter_cache_get_stats(const struct drafter_cache *dc, struct drafter_cache_stats *s);

/* ---------------------------------------------------------------- the same on a GPU (drafter_cache_gpu.c)
 *
 * The proposal of drafter_cache_propose on the device of a struct drafter_gpu, from its bf16 weight copies and fp32
 * norm weights (read in place: the drafter_gpu must outlive the cache and keep its weights), the ops of
 * drafter_step_gpu's forward (cuBLASLt GEMMs, rmsnorm, rope, swiglu, embedding), the decode step's attention over
 * per-slot caches (kernels/decode_attn.h: the context rows at positions 0..a-1, the block's keys appended at
 * a..a+B-1, every block row's query at position a+B-1, or a+j on a causal layer; a sliding layer whose window
 * starts at row lo > 0 reads the slot's cache from row lo on, positions less lo) and the device argmax
 * (kernels/argmax.h), so B-1 ids cross to the host per proposal and the context features only of the rows committed
 * since the last one. Caches [L][n_slots, max_len + B, n_kv, d_h] bf16; one cudaMalloc at init, printed with its
 * regions when plan != NULL; a proposal allocates nothing and synchronises once (its ids), plus once per further
 * pass of DCACHE_GPU_CHUNK context rows (a prompt longer than one pass reuses the pinned upload buffer).
 * Numerics: bf16 storage, fp32 accumulation and softmax, as drafter_step_gpu; the drafts agree with the uncached
 * GPU proposal's except where two logits tie within bf16 rounding.
 * Shapes the kernels cannot take are refused at init with a sentence (the caller keeps the uncached proposal):
 * d_h > 256 or not a multiple of 16 (decode attention, rope), a draft vocabulary, hidden or MLP size not a multiple
 * of 8 (cuBLASLt's leading dimensions). */
#ifdef DFLASH_CUDA
struct drafter_gpu;
struct drafter_cache_gpu;
#define DCACHE_GPU_CHUNK 256
struct drafter_cache_gpu *drafter_cache_gpu_init(struct drafter *d, struct drafter_gpu *g, int n_slots, int max_len,
                                                 FILE *plan, char *err, int err_len);
void drafter_cache_gpu_free(struct drafter_cache_gpu *dc);
/* drafter_cache_propose's contract, on the GPU (states: fp32 host rows, as there). */
int drafter_cache_gpu_propose(struct drafter_cache_gpu *dc, int slot, int64_t seq, const int32_t *c, int n,
                              const float *states, int rows, int32_t *draft, char *err, int err_len);
/* The last proposal's final normed block states (B, H), downloaded and widened to fp32 into xn. 0/-1. */
int drafter_cache_gpu_xn(const struct drafter_cache_gpu *dc, float *xn, char *err, int err_len);
void drafter_cache_gpu_get_stats(const struct drafter_cache_gpu *dc, struct drafter_cache_stats *s);
size_t drafter_cache_gpu_planned_bytes(const struct drafter_cache_gpu *dc);
#endif

#ifdef __cplusplus
}
#endif
#endif /* STAGES_EXPORT_DRAFTER_CACHE_H */
