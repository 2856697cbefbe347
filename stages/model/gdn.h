/*
 * stages/model/gdn.h — plain-C fp32 reference of the Qwen3.5 / Qwen3.6 token mixers that are not in
 * kernels/: the Gated DeltaNet (linear attention) pieces, the gated output of the full-attention
 * layer and its partial rotary embedding. Written from a reading of transformers 5.24
 * models/qwen3_5/modeling_qwen3_5.py (Qwen3_5GatedDeltaNet, torch_recurrent_gated_delta_rule,
 * Qwen3_5RMSNormGated, Qwen3_5Attention, apply_rotary_pos_emb).
 *
 * DESIGN
 * One Gated DeltaNet layer over ONE document of len tokens (the caller loops over documents, so
 * every per-document state, the conv window and the recurrent state, starts from zero at each
 * document boundary; documents packed in one batch never see each other):
 *     [qkv | z | b | a] = h · W_inᵀ                      (one fused GEMM, by the caller)
 *     u   = silu(causal depthwise conv1d_K(qkv))         (zero left padding at the document start)
 *     q, k, v = split(u);  q, k = l2norm(q), l2norm(k)   (x · rsqrt(Σx² + 1e-6), per head)
 *     q  /= sqrt(d_k);  beta = sigmoid(b);  g = -exp(A_log) · softplus(a + dt_bias)
 *     per token t, per value head j (key head j / (n_v / n_k)), state S [d_k, d_v] from 0:
 *         S = S · exp(g_t);  m = Sᵀ k_t;  S += k_t ⊗ (v_t - m) · beta_t;  o_t = Sᵀ q_t
 *     y = RMSNorm(o) · w ⊙ silu(z)                        (per value head over d_v; plain weight)
 * The recurrence is the per-token form (torch_recurrent_gated_delta_rule); the state is fp32 as
 * in transformers, the d_k-long reductions accumulate in double. transformers' forward without a
 * cache runs the chunked form (torch_chunk_gated_delta_rule), equal up to fp32 round-off.
 *
 * Nothing here allocates or fails; pure functions over caller buffers. Thread-compatible.
 */
#ifndef STAGES_MODEL_GDN_H
#define STAGES_MODEL_GDN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes of one Gated DeltaNet layer. */
struct gdn_shape {
    int n_k, n_v;      /* key / value heads; n_k divides n_v */
    int d_k, d_v;      /* head dims */
    int K;             /* conv kernel width */
};

/* Columns of the fused input projection row: [q (n_k·d_k) | k (n_k·d_k) | v (n_v·d_v) | z (n_v·d_v)
 * | b (n_v) | a (n_v)]; conv channels are the first 2·n_k·d_k + n_v·d_v. */
int gdn_conv_dim(const struct gdn_shape *s);
int gdn_in_dim(const struct gdn_shape *s);

/* One document: in [len, in_stride] rows laid out as above (the GEMM output), conv_w [conv_dim, K]
 * (transformers' conv1d.weight [conv_dim, 1, K]), a_neg [n_v] = -exp(A_log) in fp32, dt_bias [n_v],
 * norm_w [d_v], eps the model's rms_norm_eps. Writes y [len, n_v·d_v] (the input of out_proj).
 * Scratch: conv [len, conv_dim], state [n_v · d_k · d_v] floats (overwritten; zeroed here). */
void gdn_forward_doc(float *y, const float *in, int in_stride, int len, const struct gdn_shape *s,
                     const float *conv_w, const float *a_neg, const float *dt_bias, const float *norm_w,
                     float eps, float *conv, float *state);

/* The two halves of gdn_forward_doc, for the decode step (model/decode.c), which carries the conv input rows and
 * the state of a sequence between steps. gdn_conv_rows: conv rows t0..t1-1 of a document whose input rows 0..t1-1
 * are at in + src·in_stride (rows before 0 are the zero padding), written at conv + (t - t0)·conv_dim.
 * gdn_recur_rows: n tokens of the recurrence from the given state (updated in place): conv rows [n, conv_dim],
 * in rows [n, in_stride] (their z, b, a columns), y [n, n_v·d_v]. gdn_forward_doc = conv_rows(0, len), a zero
 * state, recur_rows(len): split anywhere, the results are bitwise the same. */
void gdn_conv_rows(float *conv, const float *in, int in_stride, int t0, int t1, const struct gdn_shape *s,
                   const float *conv_w);
void gdn_recur_rows(float *y, const float *conv, const float *in, int in_stride, int n, const struct gdn_shape *s,
                    const float *a_neg, const float *dt_bias, const float *norm_w, float eps, float *state);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_MODEL_GDN_H */
