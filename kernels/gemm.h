/*
 * kernels/gemm.h — CPU reference GEMMs (fp32), the readable specification of kernels/blas.h.
 *
 * Same row-major conventions as blas_matmul: d[M,N] = alpha·op(a)·op(b) + beta·d. Blocked over
 * rows and columns and split across up to 8 pthreads when the problem is large, so CPU tests and
 * the --device cpu path stay fast; each output element is still one dot product summed in order
 * of k with a float accumulator per 64-element chunk added into a double (exactness does not
 * depend on the thread count). No CUDA; never exits.
 */
#ifndef KERNELS_GEMM_H
#define KERNELS_GEMM_H

#ifdef __cplusplus
extern "C" {
#endif

/* d [M,N] (row stride N) = alpha · op(a)[M,K] · op(b)[K,N] + beta · d.
 * a: [M,K] (trans_a 0) or [K,M] (trans_a 1); b: [K,N] (trans_b 0) or [N,K] (trans_b 1); dense.
 * With beta == 0, d is not read (may hold NaN). Blocks; spawns threads internally and joins them
 * before returning; thread-safe (no shared state). */
void gemm_forward_ref(float *d, const float *a, int trans_a, const float *b, int trans_b,
                      int M, int N, int K, float alpha, float beta);

/* Linear forward: y[M,N] = x[M,K] · w[N,K]ᵀ + bias[N] (bias may be NULL). */
void gemm_linear_forward_ref(float *y, const float *x, const float *w, const float *bias,
                             int M, int N, int K);

/* Linear backward: dx[M,K] (+)= dy[M,N]·w[N,K]; dw[N,K] (+)= dy[M,N]ᵀ·x[M,K];
 * dbias[N] (+)= column sums of dy. Any output pointer may be NULL (not computed). With
 * accumulate != 0 the results are added to the outputs' contents. */
void gemm_linear_backward_ref(float *dx, float *dw, float *dbias, const float *dy, const float *x,
                              const float *w, int M, int N, int K, int accumulate);

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_GEMM_H */
