/*
 * stages/train/cpu_ops.h — the fast CPU building blocks of the drafter's training step (drafter_step_fast in
 * stages/train/drafter.c; issue 28 item 7): a fixed-chunk thread fan-out, the linear layers on a Debian BLAS
 * (OpenBLAS, statically linked, one BLAS thread per call) and the LM head + DFlash loss fused into one pass over
 * the vocabulary per row chunk.
 *
 * DESIGN
 * - The readable specification stays kernels/<op>_ref.c (double accumulators, never optimised); these functions
 *   compute the same quantities in fp32 with BLAS and are tested against those references (tests/test_cpu_ops.c,
 *   tests/test_drafter.c).
 * - Determinism: every parallel loop is cut into chunks whose boundaries depend only on the shapes, never on the
 *   thread count; each chunk writes its own outputs, per-thread scratch carries nothing between chunks, and every
 *   reduction across chunks runs afterwards in a fixed order. So the bits of a result depend on the shapes and the
 *   inputs only: the same on 1, 2 or 8 threads (resume on another thread count is still bit-exact). They may
 *   differ between CPU models (OpenBLAS picks its kernel by cpuid, not by timing).
 * - OpenBLAS is the pthread build with its own threading set to 1 (cpu_ops_blas_init): our chunks run
 *   concurrently, and the serial Debian build is not safe to call from several threads at once.
 * - Threads are started per call (pthread_create/join); a call blocks until every chunk is done. Functions are
 *   thread-safe for distinct output and scratch buffers.
 */
#ifndef STAGES_TRAIN_CPU_OPS_H
#define STAGES_TRAIN_CPU_OPS_H

#include <stdint.h>

#include "kernels/block_attn.h"
#include "kernels/lmhead_loss.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

#define CPU_OPS_MAX_THREADS 8

/* The default thread count: online CPUs, at most CPU_OPS_MAX_THREADS (results do not depend on it). */
int cpu_ops_default_threads(void);
/* Set OpenBLAS's own thread count to 1 (idempotent, process-wide; called by drafter_init). */
void cpu_ops_blas_init(void);

/* Run fn(ctx, chunk, thread) for chunk = 0..n_chunks-1 on n_threads threads (the caller is thread 0; chunks are
 * taken in order from a shared counter). Returns when all are done. If a thread cannot be started its chunks run
 * on the others. */
void cpu_ops_parallel(int n_threads, int n_chunks, void (*fn)(void *ctx, int chunk, int thread), void *ctx);
/* One attention row of n scores of which the first nv are visible: row[i] = exp(row[i] - max) for i < nv, 0 after;
 * *max_out = that max; returns the sum of the exps (double). The block attention's softmax (cpu_ops_block_attn_forward
 * and the eval drafter cache's, export/drafter_cache.c), unnormalised: the caller scales P·V by 1 / sum. */
double cpu_ops_softmax_prefix(float *row, int nv, int n, float *max_out);

/* y (M, N) = x (M, K) · w (N, K)ᵀ. */
void cpu_ops_linear_forward(int n_threads, float *y, const float *x, const float *w, int M, int N, int K);
/* dx (M, K) (=, or += when accumulate) dy (M, N) · w (N, K). */
void cpu_ops_linear_backward_dx(int n_threads, float *dx, const float *dy, const float *w, int M, int N, int K,
                                int accumulate);
/* dw (N, K) += dy (M, N)ᵀ · x (M, K). */
void cpu_ops_linear_backward_dw(int n_threads, float *dw, const float *dy, const float *x, int M, int N, int K);

/* The row-wise references on row chunks in parallel: each chunk calls the kernels/<op>_ref.c function on its rows,
 * so the results are bitwise those of one call on all rows. rmsnorm backward: dx by row chunks (the reference with
 * dw = NULL), then dw (+=) by column chunks, each walking the rows in order with the reference's arithmetic, so dw
 * is bitwise the reference's too. Arguments as the references (rope: k = NULL form, rows T of NH heads). */
void cpu_ops_rmsnorm_forward(int n_threads, float *y, float *rstd, const float *x, const float *w, int N, int C,
                             float eps);
void cpu_ops_rmsnorm_backward(int n_threads, float *dx, float *dw, const float *dy, const float *x, const float *w,
                              const float *rstd, int N, int C, int accumulate_dx);
void cpu_ops_swiglu_forward(int n_threads, float *out, const float *gate, const float *up, int T, int width);
void cpu_ops_swiglu_backward(int n_threads, float *dgate, float *dup, const float *dout, const float *gate,
                             const float *up, int T, int width);
void cpu_ops_rope_forward(int n_threads, float *q, const int32_t *pos, const float *inv_freq, int T, int NH, int HD);
void cpu_ops_rope_backward(int n_threads, float *dq, const int32_t *pos, const float *inv_freq, int T, int NH, int HD);

/* Anchored block attention (kernels/block_attn.h semantics, round_p = 0) in fp32: per (block, kv head) the visible
 * keys and values and the block's queries are gathered, and scores, P·V and the backward's five products are SGEMMs.
 * Forward: one chunk per block. Backward: one chunk per kv head (the dk/dv rows of a kv head are written by that
 * chunk only, summed block by block in order), so n_kv threads at most. Scratch is allocated per call:
 * O(threads·(T + B)·(4·d_h + 2·G·B)) floats, G = n_h / n_kv. 0/-1 with a sentence (bad config or anchors,
 * G·B > 1024, out of memory). */
int cpu_ops_block_attn_forward(int n_threads, const block_attn_config *c, const float *q, const float *k,
                               const float *v, const int32_t *anchors, const int32_t *doc_ids, float *out, float *lse,
                               char *err, int err_len);
int cpu_ops_block_attn_backward(int n_threads, const block_attn_config *c, const float *q, const float *k,
                                const float *v, const int32_t *anchors, const int32_t *doc_ids, const float *out,
                                const float *dout, const float *lse, float *dq, float *dk, float *dv, char *err,
                                int err_len);

/* The fused LM head + loss (kernels/lmhead_loss.h semantics, round_bf16 = 0) over chunks of whole blocks: per
 * chunk the draft and target logits come from two SGEMMs, each row's argmaxes, log-sum-exps, loss and the
 * block weights are taken in one pass, and with dxn != NULL dz = coef·(softmax(z) − p) is formed in place and
 * multiplied back (dxn = dz · lm_head) while the chunk is still in cache. Outputs as lmhead_loss_forward_mode_ref
 * (loss, row_loss, row_weight, correct, total), lmhead_argmax_ref (pred, tgt, row_mask) and, when dxn is given,
 * lmhead_loss_backward_mode_ref (dxn). The workspace is cpu_ops_lmhead_ws_floats(c, n_threads) floats. 0/-1
 * with a sentence (bad config or anchors, as the references check). */
int64_t cpu_ops_lmhead_ws_floats(const lmhead_loss_config *c, int n_threads);
int cpu_ops_lmhead_loss(int n_threads, const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn,
                        const float *lm_head, const float *vlm_head, const float *vnorm_w, const float *last,
                        const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask, float *ws,
                        float *loss, float *row_loss, float *row_weight, int32_t *correct, int32_t *total,
                        int32_t *pred, int32_t *tgt, uint8_t *row_mask, float *dxn, char *err, int err_len);

#endif
