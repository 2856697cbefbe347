/*
 * kernels/gated_delta.h — the gated delta rule (Gated DeltaNet's token mixer, Qwen3.5 / Qwen3.6),
 * forward only (prefill: the target is frozen), over packed documents without padding.
 *
 * Per document, per value head j (key head j / (n_v / n_k)), state S [d_k, d_v] from ZERO at the
 * document start (documents never see each other), per token t:
 *     beta_t = sigmoid(b_t);  g_t = a_neg_j · softplus(a_t + dt_bias_j)       (g_t <= 0)
 *     S = S · exp(g_t);  S += k_t ⊗ beta_t (v_t − Sᵀ k_t);  o_t = Sᵀ q_t
 * q and k arrive l2-normalised (q also scaled by 1/sqrt(d_k): kernels/l2norm.h), as transformers'
 * Qwen3_5GatedDeltaNet feeds torch_recurrent_gated_delta_rule.
 *
 * The GPU form is chunked (64 tokens, restarted at every document start; a chunk never crosses a
 * document), the WY / UT organisation of flash-linear-attention's chunk_gated_delta_rule written
 * for one CTA per (document, value head, 64 value columns). With G_t the cumulative g inside the
 * chunk (G_t = Σ_{s<=t} g_s) and S0 the state at the chunk start:
 *     A[t,s]  = beta_t exp(G_t − G_s) k_t·k_s              (s < t; strictly lower)
 *     U       = (I + A)⁻¹ · beta ⊙ (V − exp(G) ⊙ K S0)      (forward substitution, the "new values")
 *     o_t     = exp(G_t) q_t S0 + Σ_{s<=t} exp(G_t − G_s) (q_t·k_s) U_s
 *     S_end   = exp(G_last) S0 + Σ_s exp(G_last − G_s) k_s ⊗ U_s
 * Every exponent is <= 0 (g <= 0), so nothing overflows. The value columns of S evolve
 * independently, which is what lets 64-column tiles run in separate CTAs.
 *
 * Precision: fp32 everywhere (state, inputs, outputs); b and a are read from the bf16 fused
 * projection row on the GPU. References: the per-token recurrence with double accumulators (the
 * specification) and the same chunked algorithm in fp32 (the kernel's precision, for the 2× rule).
 */
#ifndef KERNELS_GATED_DELTA_H
#define KERNELS_GATED_DELTA_H

#include <stdint.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GATED_DELTA_CHUNK 64      /* tokens per chunk (GPU and the chunked reference) */
#define GATED_DELTA_MAX_DK 128    /* the GPU kernel's largest key head dim (shared-memory plan) */

/* Sizes and strides of one call. Rows are tokens; every stride is in elements. */
struct gated_delta_shape {
    int T;                  /* tokens = cu_seqlens[n_docs] */
    int n_docs;             /* ND >= 1 */
    int n_k, n_v;           /* key / value heads; n_k divides n_v */
    int d_k, d_v;           /* head dims */
    int qk_stride;          /* row stride of q and k (head h at h·d_k) */
    int v_stride;           /* row stride of v (head j at j·d_v) */
    int ba_stride;          /* row stride of b and a (head j at j) */
};

/* o [T, n_v·d_v] (dense) from q, k [T, .. n_k·d_k], v [T, .. n_v·d_v], b, a [T, .. n_v] at their
 * strides, a_neg [n_v] = −exp(A_log), dt_bias [n_v], cu_seqlens [ND+1] (host). The per-token
 * recurrence, d_k / d_v reductions in double. Scratch: state [n_v·d_k·d_v] floats. */
void gated_delta_forward_ref(float *o, const float *q, const float *k, const float *v, const float *b,
                             const float *a, const float *a_neg, const float *dt_bias, const int32_t *cu_seqlens,
                             const struct gated_delta_shape *s, float *state);

/* The GPU kernel's chunked algorithm in plain fp32 (same chunking, same formulas): the "reference
 * in the kernel's precision" of style.md's 2× rule. Same arguments; scratch `state` as above. */
void gated_delta_forward_chunked_ref(float *o, const float *q, const float *k, const float *v, const float *b,
                                     const float *a, const float *a_neg, const float *dt_bias,
                                     const int32_t *cu_seqlens, const struct gated_delta_shape *s, float *state);

/* The split form's algorithm in plain fp32 (gated_delta_forward_split below; the 2× rule's baseline for it): per
 * chunk first the chunk-local solves W = (I + A)⁻¹ (beta e^G ⊙ K) and U0 = (I + A)⁻¹ (beta ⊙ V), then against the
 * state S at the chunk start U = U0 − W·S (= the chunked form's U: (I + A)⁻¹ is linear), o = e^G ⊙ Q·S + P·U and
 * S_end as above. Same arguments and scratch as gated_delta_forward_chunked_ref. */
void gated_delta_forward_split_ref(float *o, const float *q, const float *k, const float *v, const float *b,
                                   const float *a, const float *a_neg, const float *dt_bias,
                                   const int32_t *cu_seqlens, const struct gated_delta_shape *s, float *state);

/* Bytes of gated_delta_forward_split's workspace for T tokens in n_docs documents of layout s (its fields other
 * than the head counts and dims are not read): the chunk table of T/64 + n_docs slots, then G [T, n_v],
 * W [T, n_v, d_k] and U [T, n_v, d_v] fp32, each 256-byte aligned. 0 for T < 0 or n_docs < 1. A host function in
 * every build, so memory plans (target_plan_bytes) count it without CUDA; the launcher checks its own layout
 * against it. */
size_t gated_delta_split_workspace_bytes(int T, int n_docs, const struct gated_delta_shape *s);

/* One sentence if the GPU kernel does not cover the head layout (d_k > GATED_DELTA_MAX_DK, n_k not
 * dividing n_v, a size < 1), else 0. Pure; for start-up checks (a config refused before loading). */
int gated_delta_check_shape(int n_k, int n_v, int d_k, int d_v, char *err, int err_len);

/* The decode step (stages/model/decode.c): sequence i of n_seq = s->n_docs is the rows cu[i]..cu[i+1]-1 of slot
 * seq_slot[i], its first row at position seq_pos[i]. Each runs the per-token recurrence from its slot's state
 * (state [S, n_v, d_k, d_v] fp32, updated in place), so its rows are the ones gated_delta_forward gives for those
 * positions of the slot's whole sequence; after each of a sequence's last n_snap rows (position p) the state is
 * also copied to snap [S, n_snap, n_v, d_k, d_v] at [slot][p % n_snap] (n_snap 0: no snapshots; decode_truncate
 * restores one). The reference is the per-token code of gated_delta_forward_ref (double reductions); cu,
 * seq_slot, seq_pos are host arrays there. */
void gated_delta_decode_ref(float *o, const float *q, const float *k, const float *v, const float *b, const float *a,
                            const float *a_neg, const float *dt_bias, const int32_t *cu, const int32_t *seq_slot,
                            const int32_t *seq_pos, const struct gated_delta_shape *s, float *state, float *snap,
                            int n_snap);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* The decode step on the device: one CTA per (value head, sequence), a thread per value column holding that
 * column of S in registers (d_k <= GATED_DELTA_MAX_DK, d_v <= 256), the sequence's rows in order. q, k, v fp32,
 * b, a bf16 rows at the shape's strides; cu, seq_slot, seq_pos int32 device. Asynchronous; 0 or -1 with
 * kernels_error(). */
int gated_delta_decode(float *o, const float *q, const float *k, const float *v, const bf16 *b, const bf16 *a,
                       const float *a_neg, const float *dt_bias, const int32_t *cu, const int32_t *seq_slot,
                       const int32_t *seq_pos, const struct gated_delta_shape *s, float *state, float *snap, int n_snap,
                       cudaStream_t stream);
/* o fp32 [T, n_v·d_v] dense; q, k, v fp32 device rows at their strides; b, a bf16 device rows at
 * ba_stride; a_neg, dt_bias fp32 device [n_v]; cu_seqlens int32 device [ND+1]. Allocates nothing.
 * Asynchronous on stream; 0 or -1 with kernels_error() (shape outside gated_delta_check_shape). */
int gated_delta_forward(float *o, const float *q, const float *k, const float *v, const bf16 *b, const bf16 *a,
                        const float *a_neg, const float *dt_bias, const int32_t *cu_seqlens,
                        const struct gated_delta_shape *s, cudaStream_t stream);

/* The split form (kernels/gated_delta_split.cu), written to move the chunk-local work out of the sequential walk
 * over a document's chunks: (1) a table of the batch's chunks (one thread), (2) per (chunk, value head), in
 * parallel over the whole batch, the solves W and U0 (one thread per column, the 64-row substitution in
 * registers), (3) per (document, value head, 64 value columns), in chunk order, U = U0 − W·S, the inter-chunk output
 * e^G ⊙ Q·S into o and the state update, (4) per (chunk, value head, 64 columns), in parallel, o += P·U. The walk of
 * (3) does ~1.5 of the ~6 MFLOP a chunk costs the one-kernel form and no substitution. Same inputs and output as
 * gated_delta_forward, plus a workspace of gated_delta_split_workspace_bytes(T, n_docs, s) bytes (256-byte aligned;
 * the caller plans it: W, U0/U and G of every token row, 4·T·n_v·(d_k + d_v + 1) bytes, and the chunk table). Not yet what the target runs: it replaces
 * gated_delta_forward once tests/gpu/test_gdn_kernels and gated_delta_bench have run it on a GPU. */
int gated_delta_forward_split(float *o, const float *q, const float *k, const float *v, const bf16 *b,
                              const bf16 *a, const float *a_neg, const float *dt_bias, const int32_t *cu_seqlens,
                              const struct gated_delta_shape *s, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_GATED_DELTA_H */
