/*
 * kernels/l2norm.h — per-head L2 normalisation of Gated DeltaNet's q and k, in place, fp32:
 *     x_h ← x_h · rsqrt(Σ x_h² + 1e-6), then x_h ← x_h · scale
 * over each head of d values of each row (transformers' l2norm with FLA's eps; the query call
 * passes scale = 1/sqrt(d_k), the key call 1). The two multiplications are kept separate, as the
 * reference (and stages/model/gdn.c) rounds them. Reference: double sum of squares.
 */
#ifndef KERNELS_L2NORM_H
#define KERNELS_L2NORM_H

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define L2NORM_EPS 1e-6

/* x: N rows at row_stride, heads [n_heads, d] at the row start. In place. */
void l2norm_forward_ref(float *x, int N, int row_stride, int n_heads, int d, float scale);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* Same on device fp32 rows. One warp per (row, head). Asynchronous; 0 or -1 with kernels_error(). */
int l2norm_forward(float *x, int N, int row_stride, int n_heads, int d, float scale, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_L2NORM_H */
