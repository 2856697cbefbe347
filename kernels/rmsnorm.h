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
 * C % 8 == 0 and C <= 16384, 16-byte aligned pointers; checked. Asynchronous; 0 or -1.
 * DFLASH_RMSNORM_KERNEL in the environment (read per call, every function here) reverts: 1 selects
 * the first, two-pass kernels, 2 K1b's register-resident kernels without K1c's two-row forward and
 * PDL dw sum, 3 K1c's kernels; unset or 4 (the default) is 3 with K1e's backward (shared-memory dw
 * sums, balanced grid, in-kernel dw sum for C <= 256); 5-8 are candidates for 4's backward with dw
 * (5: clusters of 4 CTAs add their dw sums in distributed shared memory, one partial per cluster;
 * 6: clusters of 8; 7: the cross-block dw sum after a grid barrier of a cooperative launch instead
 * of a second kernel or the last block; 8: 5 and 7), same results up to summation order, still
 * deterministic (5/6 size the grid by the clusters the device can hold at once, so the order is
 * fixed per (N, C, device)); 9 (round 3) is 4 with a many-slice dw sum kernel for C > 256 (its own fixed
 * order: deterministic, not bitwise 4's dw) and a forward whose two-row choice uses the kernels' queried
 * occupancy (y, rstd, h bitwise 4's); kernels/rmsnorm.cu. DFLASH_RMSNORM_DW_PIECE, DFLASH_RMSNORM_CARVEOUT
 * and DFLASH_RMSNORM_FIN_NQ are bench-only switches (rmsnorm.cu); pieces 1-3 give a wrong dw. */
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
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_RMSNORM_H */
