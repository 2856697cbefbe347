/*
 * kernels/rmsnorm.h — RMSNorm, its fused-residual form, the per-head q/k norm, and backward.
 *
 *   y[r,:] = w ⊙ x[r,:] · rstd[r],   rstd[r] = 1 / sqrt(mean_c x[r,c]² + eps)
 *
 * One function set covers all three uses:
 * - plain:          rows = T, C = hidden.
 * - q/k norm:       rows = T·NH (or T·NKV), C = HD: a [T, NH, HD] tensor is [T·NH, HD] in memory
 *                   and the weight [HD] is shared by every head (dflash-reference.md §4.2 item 8).
 * - fused residual: h = x + r is formed first, r is overwritten with h (the residual stream moves
 *                   on), and y = norm(h). Its backward is the plain backward of norm(h) *added* to
 *                   the gradient the residual stream already carries into h (accumulate_dx = 1),
 *                   since dL/dx = dL/dr = dL/dh.
 * Precision: statistics in fp32 (double in the reference), weights fp32 [C] (tiny; the trainer owns
 * fp32 masters, the target converts its bf16 norms once at load), activations bf16 on the GPU.
 * rstd [rows] is saved in fp32 for the backward; pass NULL when not training.
 * Backward: dx = rstd·(w⊙dy − x̂·mean_c(w⊙dy⊙x̂)) with x̂ = x·rstd; dw += Σ_r dy⊙x̂.
 */
#ifndef KERNELS_RMSNORM_H
#define KERNELS_RMSNORM_H

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- reference (fp32, CPU) */

/* y [N,C], rstd [N] (nullable), x [N,C], w [C]. y may alias x. */
void rmsnorm_forward_ref(float *y, float *rstd, const float *x, const float *w, int N, int C, float eps);

/* Fused residual: resid [N,C] <- x + resid, then y [N,C] = norm(resid). y may alias x. */
void rmsnorm_residual_forward_ref(float *y, float *resid, float *rstd, const float *x, const float *w,
                                  int N, int C, float eps);

/* dx [N,C] (= or += when accumulate_dx), dw [C] (always +=, nullable), from dy [N,C], the forward
 * input x [N,C] (for the fused form: the updated residual h), w [C], rstd [N]. dx may not alias dy or x. */
void rmsnorm_backward_ref(float *dx, float *dw, const float *dy, const float *x, const float *w,
                          const float *rstd, int N, int C, int accumulate_dx);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* ---------------------------------------------------------------- GPU (bf16 activations) */

/* y [N,C] bf16 (may alias x), rstd [N] fp32 or NULL, x [N,C] bf16, w [C] fp32.
 * C % 8 == 0 and C <= 16384, 16-byte aligned pointers; checked. Asynchronous; 0 or -1. */
int rmsnorm_forward(bf16 *y, float *rstd, const bf16 *x, const float *w, int N, int C, float eps,
                    cudaStream_t stream);

/* Fused residual add: resid [N,C] bf16 <- bf16(x + resid) (sum in fp32), y = norm(that). Same
 * preconditions as rmsnorm_forward. */
int rmsnorm_residual_forward(bf16 *y, bf16 *resid, float *rstd, const bf16 *x, const float *w,
                             int N, int C, float eps, cudaStream_t stream);

/* Floats of scratch rmsnorm_backward needs for (N, C) (deterministic dw: per-block partial sums
 * reduced in a fixed order). A scratch sized for (N, C) also serves every smaller N at that C.
 * The first 32 floats are a header (a ticket counter the last block to finish uses): the caller
 * zeroes the scratch once after allocating it (cudaMemset); every call leaves the header zero
 * again, so nothing else may write the scratch between calls, and calls sharing one scratch must
 * be ordered (one stream). */
size_t rmsnorm_backward_scratch_floats(int N, int C);

/* dx [N,C] bf16 (= or += when accumulate_dx; may not alias dy or x), dw [C] fp32 (+=, nullable),
 * dy [N,C] bf16, x [N,C] bf16 (forward input, or h for the fused form), w [C] fp32, rstd [N]
 * fp32 from the forward, scratch of rmsnorm_backward_scratch_floats(N, C) floats (device, 16-byte
 * aligned, zeroed once at allocation; only used when dw != NULL). Allocates nothing.
 * Asynchronous; 0 or -1. Deterministic: dw is bitwise repeatable for given inputs and (N, C). */
int rmsnorm_backward(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w,
                     const float *rstd, float *scratch, int N, int C, int accumulate_dx,
                     cudaStream_t stream);

/* The per-head q/k norm of both tensors in one launch: q [Nq, C] (Nq = T·NH) and k [Nk, C] (Nk = T·NKV),
 * each with its own weight [C] and rstd; same arguments and preconditions, per tensor, as
 * rmsnorm_forward. y, rstd are bitwise those of two rmsnorm_forward calls. One launch for C <= 1024,
 * else two. Asynchronous; 0 or -1. */
int rmsnorm_qk_forward(bf16 *yq, float *rstdq, const bf16 *xq, const float *wq, int Nq, bf16 *yk, float *rstdk,
                       const bf16 *xk, const float *wk, int Nk, int C, float eps, cudaStream_t stream);

/* Floats of scratch rmsnorm_qk_backward needs for (Nq, Nk, C); serves every smaller Nq and Nk at that C.
 * Zeroed once after allocation, as rmsnorm_backward's (its header holds both tensors' tickets). */
size_t rmsnorm_qk_backward_scratch_floats(int Nq, int Nk, int C);

/* Both tensors' backward in one launch (C <= 256; else two rmsnorm_backward launches on the same
 * scratch): per tensor the arguments
 * of rmsnorm_backward; dwq and dwk (+=) both given or both NULL; one scratch of
 * rmsnorm_qk_backward_scratch_floats(Nq, Nk, C) floats. dx is bitwise that of two rmsnorm_backward
 * calls; dw is deterministic (a function of Nq, Nk, C), not bitwise the separate calls' (the CTAs
 * are shared out differently). Asynchronous; 0 or -1; calls sharing a scratch must be ordered. */
int rmsnorm_qk_backward(bf16 *dxq, float *dwq, const bf16 *dyq, const bf16 *xq, const float *wq, const float *rstdq,
                        int Nq, bf16 *dxk, float *dwk, const bf16 *dyk, const bf16 *xk, const float *wk,
                        const float *rstdk, int Nk, float *scratch, int C, int accumulate_dx, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_RMSNORM_H */
