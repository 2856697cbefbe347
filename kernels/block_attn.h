/*
 * kernels/block_attn.h — DFlash anchored block attention, forward and backward
 * (dflash-reference.md §4.2 step 6 and §6).
 *
 * Queries: N·B rows in blocks of B (block b belongs to anchor a_b), n_h heads of d_h. Keys and values:
 * T + N·B rows, n_kv heads: the packed context 0..T-1 first, then the block tokens block-major.
 * Query (b, j) with anchor a = anchors[b] and d = doc_ids[a] sees
 *   - context key p  iff  d != -1, doc_ids[p] == d, p < a, and (window > 0 ? p >= a - window : true);
 *   - block key (b', j')  iff  b' == b and (causal ? j' <= j : true).
 * Padding anchors (anchor 0) therefore see their own block only. Scores are q·k·scale, softmax in fp32.
 * GQA: query head h uses kv head h / (n_h / n_kv).
 *
 * The dense mask is never built: the device kernels visit, per block, only the key tiles between the
 * first and last key of the anchor's document in [max(0, a-window), a), plus the block's own keys; the
 * backward's dK/dV pass visits, per context key tile, only the blocks that see one of its keys. The forward
 * saves lse = log-sum-exp of the scaled scores per (row, head) for the backward, which recomputes P.
 * Layouts (row-major): q, out, dq (N·B, n_h, d_h); k, v, dk, dv (T + N·B, n_kv, d_h); lse (n_h, N·B)
 * (kernels/shapes.md: saved per-row statistics are [NH, T]).
 */
#ifndef KERNELS_BLOCK_ATTN_H
#define KERNELS_BLOCK_ATTN_H

#include <stdint.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int T;        /* packed context length */
    int N;        /* blocks (anchors), padding included */
    int B;        /* block size */
    int n_h;      /* query heads */
    int n_kv;     /* kv heads; n_h % n_kv == 0 */
    int d_h;      /* head dim */
    int window;   /* sliding window W; 0 = full attention */
    int causal;   /* 1: j' <= j inside the block (sliding layers, sliding_window_non_causal=false) */
    float scale;  /* softmax scale, d_h^-0.5 */
} block_attn_config;

/* Checks a config (positive sizes, n_h % n_kv == 0, window >= 0); 0 or -1 with a sentence in err. */
int block_attn_check(const block_attn_config *c, char *err, int err_len);

/* Whether the device launchers take config c (host only, no CUDA call; callable from CPU builds so a planner
 * or a stage refuses a config at start-up): block_attn_check, and d_h in {16, 32, 64, 128, 256} with at most
 * 65535 kv heads; any (n_h/n_kv)·B. 0, or -1 with one line in err naming the shape and the shapes taken. */
int block_attn_shape_supported(const block_attn_config *c, char *err, int err_len);

/* CPU reference, fp32 data with double accumulation. anchors (N) int32 in [0, T); doc_ids (T) int32
 * (-1 = padding). round_p != 0 emulates the device's precision (P rounded to bf16 before P·V, output
 * rounded to bf16) for the low-precision error baseline. Returns 0 or -1 with err. Thread-safe. */
int block_attn_forward_ref(const block_attn_config *c, const float *q, const float *k, const float *v,
                           const int32_t *anchors, const int32_t *doc_ids, int round_p,
                           float *out, float *lse, char *err, int err_len);
/* Reference backward: given dout and the forward's out and lse, writes dq, dk, dv (overwritten, not
 * accumulated). Returns 0 or -1 with err. */
int block_attn_backward_ref(const block_attn_config *c, const float *q, const float *k, const float *v,
                            const int32_t *anchors, const int32_t *doc_ids, const float *out,
                            const float *dout, const float *lse, float *dq, float *dk, float *dv,
                            char *err, int err_len);
/* block_attn_backward_ref with round_p != 0 emulating the device's precision (P and dS = P ⊙ (dP - Di)
 * rounded to bf16 before the dV, dQ, dK products; the scale applied after): the baseline of the GPU test's
 * 3x rule for gradients (style.md). round_p 0 is block_attn_backward_ref. */
int block_attn_backward_ref_prec(const block_attn_config *c, const float *q, const float *k, const float *v,
                                 const int32_t *anchors, const int32_t *doc_ids, const float *out,
                                 const float *dout, const float *lse, int round_p, float *dq, float *dk, float *dv,
                                 char *err, int err_len);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* Device forward: q, k, v bf16; out bf16; lse fp32. Preconditions: block_attn_shape_supported(c).
 * Asynchronous on stream; no allocation. Returns 0 or -1 (kernels_error()).
 * Kernels, a fixed function of the shape (no timing):
 *   d_h 64 or 128 and (n_h/n_kv)·B <= 64  -> Hopper wgmma (sm_90a), kernels/block_attn_{fwd,bwd}_wg.cu;
 *   otherwise (d_h 16, 32, 256; or groups up to 8 and more at B = 16)
 *                                         -> plain fp32 SIMT kernels, kernels/block_attn_simt.cu (correct,
 *                                            several times slower than the tensor cores). */
int block_attn_forward(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                       const int32_t *d_anchors, const int32_t *d_doc_ids, bf16 *d_out, float *d_lse,
                       cudaStream_t stream);
/* Bytes of the workspace block_attn_forward_ws takes for config c (a function of c->N only: ~65 bytes per
 * block, 16-byte multiple); 0 when c is NULL or c->N <= 0. Host only, no CUDA call. */
size_t block_attn_forward_workspace_bytes(const block_attn_config *c);
/* block_attn_forward with a workspace: d_ws = block_attn_forward_workspace_bytes(c) bytes of device memory,
 * 16-byte aligned, owned by the caller (planned memory; nothing is allocated) and not initialised. The call
 * then plans the call on the GPU first (each block group's key ranges once for all kv heads, the groups
 * ordered longest first; the wgmma shapes only: the SIMT kernels leave it unused) and runs the main kernel on that plan: out and lse are bitwise equal to
 * block_attn_forward's. The workspace is scratch of this one call: it may be reused by the next call on the
 * same stream (calls on one stream are ordered) but not by calls in flight on other streams at the same
 * time. d_ws NULL is block_attn_forward. Same preconditions, asynchrony and
 * errors as block_attn_forward (plus d_ws alignment). */
int block_attn_forward_ws(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                          const int32_t *d_anchors, const int32_t *d_doc_ids, bf16 *d_out, float *d_lse, void *d_ws,
                          cudaStream_t stream);
/* Device backward: writes fp32 dq
 * (N·B, n_h, d_h), dk and dv (T + N·B, n_kv, d_h), every element (overwritten, not accumulated). Deterministic: no atomics, dK/dV of a key are summed over the blocks
 * that see it in block order. dq doubles as scratch during the call (its first n_h·N·B floats hold
 * rowsum(dO ⊙ O) until the last kernel overwrites them), so it must not alias an input. Same
 * preconditions as the forward, all pointers 16-byte aligned. Asynchronous on stream; no allocation.
 * Returns 0 or -1 (kernels_error()). */
int block_attn_backward(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                        const int32_t *d_anchors, const int32_t *d_doc_ids, const bf16 *d_out,
                        const bf16 *d_dout, const float *d_lse, float *d_dq, float *d_dk, float *d_dv,
                        cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_BLOCK_ATTN_H */
