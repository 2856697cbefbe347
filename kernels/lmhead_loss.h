/*
 * kernels/lmhead_loss.h — fused LM head + DFlash distillation loss over the N·B block rows
 * (dflash-reference.md §3.2, §5, §7, §8; pitfalls in §13).
 *
 * Row s = (b, j) of the R = N·B block rows, anchor a = anchors[b], position p = a + j:
 *   draft logits  z_s = xn_s · lm_headᵀ                                  (V,)  xn = the drafter's final-normed state
 *   target logits t_s = (vnorm_w ⊙ rmsnorm(last[p-1])) · vlm_headᵀ      (V,)  p-1 = -1 wraps to T-1 (always masked)
 *   mask          m_s = loss_mask[p] · valid[b] · [j != 0]                (sample_from_anchor = false)
 *   loss          KL: Σ_v P_v (log P_v - log Q_v), P = softmax(t), Q = softmax(z);   CE: lse(z) - z[argmax t]
 *   weight        NONE 1; EXP_DECAY w_j = exp(-(j-1)/γ) (w_0 = 0); DPACE (CE only): c_j = exp(-ℓ_j),
 *                 s_j = m_j ? (1-α)c_j + α : 1, P_j = Π_{i<=j} s_i, w_j = m_j Σ_{k>=j} m_k P_k (per block)
 *   L = Σ_s w_s m_s ℓ_s / (Σ_s m_s + 1e-5)
 *   metrics       over m_s = 1: correct[j] += (argmax z == argmax t), total[j] += 1 (ties: first index)
 * Backward: dL/dz_s = w_s m_s / (Σ m + 1e-5) · (Q - P) (KL) or (Q - onehot(argmax t)) (CE); dxn = dz · lm_head.
 * No gradient reaches the targets or the weights. The caller owns the final RMSNorm of the drafter
 * (K1's rmsnorm_forward / rmsnorm_backward): this op starts from its output xn and returns dL/dxn.
 *
 * Vocabulary subsets (§1.6): lm_head and vlm_head are the pruned [V_d, D] rows; lmhead_prune builds
 * them from the full [V_t, D] head with d2t (draft d -> target id d + d2t[d]). The softmax is over V_d.
 *
 * Device path: vocabulary chunks of the logits are produced by cuBLASLt GEMMs (kernels/blas.h) into
 * bf16 chunk buffers (logits are bf16, §9), then folded into per-row online-softmax statistics in
 * fp32; the backward multiplies dz chunks back. Nothing [R, V] is stored in fp32: with one chunk (the
 * default when it fits, see LMHEAD_SINGLE_CHUNK_MAX_BYTES) the bf16 logits stay in the workspace from
 * the forward to the backward; with several the backward recomputes each chunk.
 */
#ifndef KERNELS_LMHEAD_LOSS_H
#define KERNELS_LMHEAD_LOSS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { LMHEAD_LOSS_KL = 0, LMHEAD_LOSS_CE = 1 };
enum { LMHEAD_WEIGHT_NONE = 0, LMHEAD_WEIGHT_EXP_DECAY = 1, LMHEAD_WEIGHT_DPACE = 2 };

typedef struct {
    int T;          /* packed length (rows of last, loss_mask) */
    int N;          /* anchors (blocks), padding included */
    int B;          /* block size; R = N·B rows */
    int D;          /* hidden size */
    int V;          /* (draft) vocabulary = rows of lm_head and vlm_head */
    int loss;       /* LMHEAD_LOSS_* */
    int weighting;  /* LMHEAD_WEIGHT_* */
    float gamma;    /* exp-decay γ (4.0) */
    float alpha;    /* D-PACE α in (0, 1] (0.5) */
    float eps;      /* verifier_norm eps (1e-6) */
} lmhead_loss_config;

/* The trainer's modes (issue 16), beside the config so existing callers are unchanged; all-zero (or a NULL
 * pointer) is the plain semantics above. On the device, sample_from_anchor is lmhead_loss_forward_mode's argument and
 * the budget mode is the caller's padding (see lmhead_loss_forward_mode). */
typedef struct {
    int budget;             /* > 0: the padded length the anchors were drawn against (speculators pads every
                             * batch to the token budget): anchors may lie anywhere in [0, T) with
                             * a + B <= max(T, budget); rows whose predicted position is >= T are masked, and
                             * nothing past T is read */
    int sample_from_anchor; /* 1: row (b, j) at p = a + j predicts the token at p + 1: target from last[p],
                             * mask m_s = loss_mask[p + 1] · valid[b] (slot 0 included, p + 1 >= T masked; the
                             * mask index is inferred, §5), exp-decay w_j = exp(-j/γ) */
} lmhead_loss_mode;

/* Checks a config (sizes, enums, DPACE needs CE, α in (0,1], γ > 0); 0 or -1 with a sentence. */
int lmhead_loss_check(const lmhead_loss_config *c, char *err, int err_len);

/* EAL = Σ_{j=1}^{B-1} Π_{i=1}^{j} correct[i] / max(total[i], 1) (§8). Pure. */
double lmhead_eal(const int32_t *correct, const int32_t *total, int B);

/* Validate a vocabulary mapping: t2d (V_t) bool with popcount V_d, and d2t (V_d) such that d + d2t[d]
 * is the d-th set entry of t2d in ascending order. 0, or -1 with a sentence in err. */
int lmhead_vocab_check(const uint8_t *t2d, int V_t, const int64_t *d2t, int V_d, char *err, int err_len);
/* out (V_d, D) = rows d + d2t[d] of full (V_t, D). Returns 0, or -1 when an id is outside [0, V_t). */
int lmhead_prune_ref(const float *full, int V_t, int D, const int64_t *d2t, int V_d, float *out,
                     char *err, int err_len);

/* Reference forward (fp32 data; double accumulation of dot products and sums).
 * xn (R, D); lm_head, vlm_head (V, D) (may alias); vnorm_w (D); last (T, D); anchors (N) int32 in
 * [0, T - B) or 0 for padding; valid (N); loss_mask (T). round_bf16 != 0 emulates the device's
 * precision (the normed target state and both logits rounded to bf16) for the error baseline.
 * Writes *loss, row_loss (R) ℓ_s (0 where m_s = 0), row_weight (R) w_s·m_s, correct and total (B).
 * Returns 0 or -1 with a sentence in err. Thread-safe; allocates O(V + D). */
int lmhead_loss_forward_ref(const lmhead_loss_config *c, const float *xn, const float *lm_head,
                            const float *vlm_head, const float *vnorm_w, const float *last,
                            const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                            int round_bf16, float *loss, float *row_loss, float *row_weight,
                            int32_t *correct, int32_t *total, char *err, int err_len);
/* lmhead_loss_forward_ref / lmhead_loss_backward_ref under a mode (md may be NULL: the zero mode). */
int lmhead_loss_forward_mode_ref(const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn,
                                 const float *lm_head, const float *vlm_head, const float *vnorm_w, const float *last,
                                 const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                                 int round_bf16, float *loss, float *row_loss, float *row_weight,
                                 int32_t *correct, int32_t *total, char *err, int err_len);
int lmhead_loss_backward_mode_ref(const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn,
                                  const float *lm_head, const float *vlm_head, const float *vnorm_w, const float *last,
                                  const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                                  int round_bf16, const float *row_weight, float *dxn, char *err, int err_len);
/* Per-row argmaxes and mask for the metrics and the dumps: pred (R) = argmax z_s for every row, tgt (R) =
 * argmax t_s where the target row lies in [0, T) (else -1), mask (R) = m_s. Ties go to the first index.
 * Same inputs and errors as lmhead_loss_forward_mode_ref. Thread-safe; allocates O(V + D). */
int lmhead_argmax_ref(const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn, const float *lm_head, const float *vlm_head,
                      const float *vnorm_w, const float *last, const int32_t *anchors, const uint8_t *valid,
                      const uint8_t *loss_mask, int round_bf16, int32_t *pred, int32_t *tgt, uint8_t *mask,
                      char *err, int err_len);
/* Accepted-length EAL of speculators 0.9 (§8): over the N blocks of B rows that have at least one row with
 * mask = 1, the accepted length is the number of leading slots j = first, first + 1, ... with mask = 1 and
 * pred == tgt, plus 1 (the bonus token); adds the lengths to *sum and the blocks to *count. first is 1, or 0
 * with sample_from_anchor. Pure. */
void lmhead_eal_blocks(const uint8_t *mask, const int32_t *pred, const int32_t *tgt, int N, int B, int first,
                       double *sum, int64_t *count);
/* Reference backward: dxn (R, D) = dL/dxn, given the forward's row_weight (R). Same inputs. */
int lmhead_loss_backward_ref(const lmhead_loss_config *c, const float *xn, const float *lm_head,
                             const float *vlm_head, const float *vnorm_w, const float *last,
                             const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                             int round_bf16, const float *row_weight, float *dxn, char *err, int err_len);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
typedef struct lmhead_loss_ws lmhead_loss_ws;   /* device workspace; opaque */

/* Default plan of lmhead_loss_ws_init (vocab_chunk 0): one chunk (logits kept, no recompute) when the
 * two (N·B, V) bf16 logit buffers take at most LMHEAD_SINGLE_CHUNK_MAX_BYTES, else LMHEAD_VOCAB_CHUNK. */
#define LMHEAD_SINGLE_CHUNK_MAX_BYTES ((size_t)2 << 30)
#define LMHEAD_VOCAB_CHUNK 8192

/* Allocate the device workspace for config c with vocabulary chunks of vocab_chunk rows (a multiple
 * of 8, or >= V for one chunk; 0: the default plan above; negative: an error). Sized once from the largest shape (design.md §7): 2·N·B·chunk
 * bf16 plus O(N·B·D). Returns 0 or -1 (kernels_error()). Not thread-safe with respect to the same ws. */
int lmhead_loss_ws_init(lmhead_loss_ws **ws, const lmhead_loss_config *c, int vocab_chunk);
/* The vocabulary chunk ws was planned with (>= V: one chunk); 0 for NULL. */
int lmhead_loss_ws_chunk(const lmhead_loss_ws *ws);
void lmhead_loss_ws_free(lmhead_loss_ws *ws);

/* Device forward. Inputs as the reference, bf16 for xn, lm_head, vlm_head, last; fp32 vnorm_w.
 * Outputs in device memory: loss (1), row_loss (R), row_weight (R), correct and total (B) int32.
 * Keeps per-row statistics in ws for lmhead_loss_backward. D % 8 == 0 (cuBLASLt alignment). Anchors are
 * not range-checked on the device (that would need a host sync): the caller guarantees a + B <= T.
 * Asynchronous on stream; no allocation. Returns 0 or -1 (kernels_error()). */
int lmhead_loss_forward(lmhead_loss_ws *ws, const lmhead_loss_config *c, const bf16 *d_xn,
                        const bf16 *d_lm_head, const bf16 *d_vlm_head, const float *d_vnorm_w,
                        const bf16 *d_last, const int32_t *d_anchors, const uint8_t *d_valid,
                        const uint8_t *d_loss_mask, float *d_loss, float *d_row_loss, float *d_row_weight,
                        int32_t *d_correct, int32_t *d_total, cudaStream_t stream);
/* lmhead_loss_forward with the trainer's sample_from_anchor mode (lmhead_loss_mode.sample_from_anchor): row (b, j)
 * at p = a + j takes its target from last[p], its mask from loss_mask[p + 1] · valid[b] (slot 0 included, p + 1 >= T
 * masked), exp-decay w_j = exp(-j/γ). The budget mode needs no device code: pad last and loss_mask with zero rows
 * to the budget and pass T = budget (rows predicting past the batch are then masked by the zero mask, and their
 * target rows are zeros). lmhead_loss_backward is the same for both modes. */
int lmhead_loss_forward_mode(lmhead_loss_ws *ws, const lmhead_loss_config *c, int sample_from_anchor,
                             const bf16 *d_xn, const bf16 *d_lm_head, const bf16 *d_vlm_head, const float *d_vnorm_w,
                             const bf16 *d_last, const int32_t *d_anchors, const uint8_t *d_valid,
                             const uint8_t *d_loss_mask, float *d_loss, float *d_row_loss, float *d_row_weight,
                             int32_t *d_correct, int32_t *d_total, cudaStream_t stream);
/* Per-row results of the last lmhead_loss_forward on ws (device pointers into ws, valid until the next forward):
 * d_arg (R, 2) int32 = (argmax z_s, argmax t_s) of every supervised row (m_s = 1; ties: the first index; the other
 * rows hold INT32_MAX, as the forward skips them), or of every row after lmhead_loss_ws_set_all_rows(ws, 1) (a
 * row whose target lies past the batch has a meaningless argmax t_s), d_mask (R) = m_s. For the trainer's
 * accepted-length EAL (lmhead_eal_blocks), the dumps and the drafter's proposals (dflash-eval on a GPU). */
void lmhead_loss_ws_set_all_rows(lmhead_loss_ws *ws, int on);   /* 0 (default): supervised rows only; the loss,
                                                                 * its gradient and the counts never change */
void lmhead_loss_ws_rows(const lmhead_loss_ws *ws, const int32_t **d_arg, const uint8_t **d_mask);
/* Device backward after lmhead_loss_forward on the same ws and inputs: d_dxn (R, D) fp32 = dL/dxn
 * (overwritten). Asynchronous. Returns 0 or -1 (kernels_error()). */
int lmhead_loss_backward(lmhead_loss_ws *ws, const lmhead_loss_config *c, const bf16 *d_xn,
                         const bf16 *d_lm_head, const bf16 *d_vlm_head, const float *d_row_weight,
                         float *d_dxn, cudaStream_t stream);
/* Device pruning: d_out (V_d, D) = rows d + d2t[d] of d_full (V_t, D), d2t (V_d) int64 on the device.
 * Ids are not range-checked here (check the mapping on the host with lmhead_vocab_check). */
int lmhead_prune(const bf16 *d_full, int V_t, int D, const int64_t *d_d2t, int V_d, bf16 *d_out,
                 cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_LMHEAD_LOSS_H */
