/*
 * kernels/wgmma_check.h — a device self-test of the wgmma primitives (kernels/wgmma.cuh): one
 * warpgroup computes C[64×128] = A[64×64] · B[64×128] through each operand layout the attention
 * kernels use, so a wrong descriptor or swizzle shows up as a failing GEMM in tests/gpu/test_wgmma.c
 * rather than as a subtly wrong attention kernel.
 */
#ifndef KERNELS_WGMMA_CHECK_H
#define KERNELS_WGMMA_CHECK_H

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    WGMMA_CHECK_SS_KK = 0,   /* A smem K-major (a = [m][k]), B smem K-major (b = [n][k]), one m64n128k16 per k16 */
    WGMMA_CHECK_RS_MN128,    /* A registers (a = [m][k]), B MN-major (b = [k][n]) through LBO, N = 128 */
    WGMMA_CHECK_RS_MN64,     /* as above, two m64n64k16 per k16, one per 64-column panel */
    WGMMA_CHECK_SS_MM,       /* A smem M-major (a = [k][m]), B MN-major (b = [k][n]), N = 128 */
    WGMMA_CHECK_MODES
};

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* c[64][128] fp32 row-major = A · B with a, b bf16 in device memory laid out as the mode says
 * (a: 64×64 elements, b: 64×128). Asynchronous on stream; 0 or -1 with kernels_error(). */
int wgmma_check_gemm(int mode, const bf16 *d_a, const bf16 *d_b, float *d_c, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif
