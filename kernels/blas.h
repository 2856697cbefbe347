/*
 * kernels/blas.h — the one cuBLASLt wrapper of the process: bf16 GEMMs with fp32 accumulation.
 *
 * Row-major everywhere (kernels/shapes.md). The general call is
 *     D[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · D        (+ bias[N] broadcast over rows)
 * with op(A) = A stored [M,K] (trans_a = 0) or A stored [K,M] read transposed (trans_a = 1), and
 * op(B) = B stored [K,N] (trans_b = 0) or B stored [N,K] read transposed (trans_b = 1). The three
 * calls of a linear layer y = x·Wᵀ with W [out,in] = [N,K] are spelled out below (blas_linear_*).
 * Internally the row-major problem is the column-major problem Dᵀ = op(B)ᵀ·op(A)ᵀ, so a forward
 * linear runs as cuBLAS "TN", the layout Hopper kernels are fastest at.
 *
 * One handle and one workspace per process, created by blas_init() and freed by blas_free().
 * The algorithm for a shape is chosen by cuBLASLt's heuristic on first use and cached (design.md §7:
 * nothing is tuned mid-run beyond that query); call the GEMMs once at start-up with each shape to
 * front-load the queries. The workspace is shared: two GEMMs on different streams must not run
 * concurrently (use one compute stream per process, or order them with events).
 *
 * Alignment: every pointer 16-byte aligned and every leading dimension a multiple of 8 elements;
 * the wrapper checks and fails with a sentence rather than falling back silently.
 */
#ifndef KERNELS_BLAS_H
#define KERNELS_BLAS_H

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Output / C dtypes. A and B are always bf16. */
typedef enum { BLAS_BF16 = 0, BLAS_F32 = 1 } blas_dtype;

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

/* Create the process's cuBLASLt handle and a workspace of workspace_bytes (0: 64 MiB) on the
 * current device. Idempotent (a second call is a no-op returning 0); thread-safe. Returns 0, or
 * -1 with kernels_error() set. Every GEMM below calls it lazily, so calling it is optional. */
int blas_init(size_t workspace_bytes);

/* Free the handle, the workspace and the cached algorithms. Not thread-safe with running GEMMs. */
void blas_free(void);

/* General GEMM, row-major (see the top of this file).
 *   d      [M, ldd]      output, dtype d_type; with beta != 0 it is read first (C = D, in place)
 *   a      op(A) [M,K]:  stored [M, lda] (trans_a 0) or [K, lda] (trans_a 1), bf16
 *   b      op(B) [K,N]:  stored [K, ldb] (trans_b 0) or [N, ldb] (trans_b 1), bf16
 *   bias   [N] of d_type, or NULL (fused epilogue); only with beta == 0
 *   lda/ldb/ldd are row strides in elements; 0 means dense (the stored row length).
 * Asynchronous on stream; returns 0, or -1 with kernels_error() naming the violated precondition
 * or the cuBLASLt status. Thread-safe (the algorithm cache is locked), but see the workspace note. */
/* Plans in the shape cache and how many were evicted so far (least recently used first, once the
 * cache holds its maximum; packed batches meet a new token count almost every step). Thread-safe. */
void blas_cache_stats(int *plans, uint64_t *evictions);

int blas_matmul(void *d, blas_dtype d_type, const bf16 *a, int trans_a, const bf16 *b, int trans_b,
                const void *bias, int M, int N, int K, int lda, int ldb, int ldd,
                float alpha, float beta, cudaStream_t stream);

/* Strided-batched GEMM: for i in [0, batch)
 *     D_i = alpha · op(A_i) · op(B_i) + beta · C_i,   X_i = x + i · stride_x (elements)
 * with the shapes, transposes and leading dimensions of blas_matmul (no bias). c is the C operand with D's layout
 * and stride: NULL (or c == d) means in place as blas_matmul; a distinct c must not overlap d (it saves the copy of
 * C into D). stride_d must be at least M · ldd (batches never overlap); every stride is a multiple of 8 elements.
 * One cuBLASLt call (batch count and strided batch offsets in the matrix layouts), planned and cached as
 * blas_matmul's plans. Asynchronous; 0, or -1 with kernels_error(). */
int blas_matmul_batched(void *d, const void *c, blas_dtype d_type, const bf16 *a, int trans_a, const bf16 *b,
                        int trans_b, int M, int N, int K, int lda, int ldb, int ldd, long long stride_a,
                        long long stride_b, long long stride_d, int batch, float alpha, float beta,
                        cudaStream_t stream);

/* Linear forward: y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[N]). y has dtype y_type. */
int blas_linear_forward(void *y, blas_dtype y_type, const bf16 *x, const bf16 *w, const void *bias,
                        int M, int N, int K, cudaStream_t stream);

/* Linear backward to the input: dx[M,K] = dy[M,N] · w[N,K]  (+ dx when accumulate != 0). */
int blas_linear_backward_dx(void *dx, blas_dtype dx_type, const bf16 *dy, const bf16 *w,
                            int M, int N, int K, int accumulate, cudaStream_t stream);

/* Linear backward to the weight: dw[N,K] = dy[M,N]ᵀ · x[M,K]  (+ dw when accumulate != 0).
 * dw is normally fp32 (BLAS_F32) so gradients accumulate across micro-steps without rounding. */
int blas_linear_backward_dw(void *dw, blas_dtype dw_type, const bf16 *dy, const bf16 *x,
                            int M, int N, int K, int accumulate, cudaStream_t stream);
#endif /* DFLASH_CUDA */

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_BLAS_H */
