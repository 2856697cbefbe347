/*
 * kernels/wgmma_check.cu — see kernels/wgmma_check.h. One CTA of one warpgroup; operands are
 * stored into 128B-swizzled panels with plain shared stores (the fence.proxy.async path), the
 * register-A mode loads its fragments straight from global memory.
 */
#include "kernels/wgmma_check.h"
#include "kernels/wgmma.cuh"

#include <cuda_bf16.h>

namespace {

constexpr int WC_M = 64, WC_K = 64, WC_N = 128;

/* rows × 64 bf16 from a row-major [rows][ld] global matrix (columns col0..col0+63) into one panel */
__device__ void wc_store_panel(unsigned char *panel, const bf16 *g, int rows, int ld, int col0) {
    for (int i = threadIdx.x; i < rows * 8; i += blockDim.x) {
        int r = i / 8, c = i % 8;
        *(uint4 *)(panel + wg_sw128(r, c)) = *(const uint4 *)(g + (size_t)r * ld + col0 + c * 8);
    }
}

__global__ void __launch_bounds__(128) wgmma_check_kernel(int mode, const bf16 *a, const bf16 *b, float *c) {
    __shared__ __align__(1024) unsigned char sa[WC_M * WC_K * 2];
    __shared__ __align__(1024) unsigned char sb[WC_K * WC_N * 2];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    /* A: K-major = one panel [64 m][64 k]; M-major = one panel [64 k][64 m] */
    wc_store_panel(sa, a, 64, 64, 0);
    if (mode == WGMMA_CHECK_SS_KK) {
        wc_store_panel(sb, b, WC_N, WC_K, 0);   /* B K-major: one panel [128 n][64 k] */
    } else {
        wc_store_panel(sb, b, WC_K, WC_N, 0);   /* B MN-major: two panels [64 k][64 n] */
        wc_store_panel(sb + WC_K * 128, b, WC_K, WC_N, 64);
    }
    wg_fence_async_smem();
    __syncthreads();

    float d[WC_N / 2];
#pragma unroll
    for (int i = 0; i < WC_N / 2; i++) d[i] = 0.0f;
    const uint32_t ua = wg_smem_u32(sa), ub = wg_smem_u32(sb);
    uint32_t af[WC_K / 16][4];
    if (mode == WGMMA_CHECK_RS_MN128 || mode == WGMMA_CHECK_RS_MN64) {
        const int g = lane / 4, t = lane % 4, r = warp * 16 + g;
#pragma unroll
        for (int s = 0; s < WC_K / 16; s++) {
            const uint32_t *row0 = (const uint32_t *)(a + (size_t)r * WC_K + s * 16);
            const uint32_t *row8 = (const uint32_t *)(a + (size_t)(r + 8) * WC_K + s * 16);
            af[s][0] = row0[t];
            af[s][1] = row8[t];
            af[s][2] = row0[4 + t];
            af[s][3] = row8[4 + t];
        }
    }
    wg_fence();
#pragma unroll
    for (int s = 0; s < WC_K / 16; s++) {
        switch (mode) {
        case WGMMA_CHECK_SS_KK:
            wg_mma_ss<WC_N, 0, 0>(d, wg_desc_kmajor(ua + s * 32), wg_desc_kmajor(ub + s * 32), 1);
            break;
        case WGMMA_CHECK_RS_MN128:
            wg_mma_rs<WC_N, 1>(d, af[s], wg_desc_mnmajor(ub + s * 16 * 128, WC_K * 128), 1);
            break;
        case WGMMA_CHECK_RS_MN64:
            wg_mma_rs<64, 1>(d, af[s], wg_desc_mnmajor(ub + s * 16 * 128, WC_K * 128), 1);
            wg_mma_rs<64, 1>(d + 32, af[s], wg_desc_mnmajor(ub + WC_K * 128 + s * 16 * 128, WC_K * 128), 1);
            break;
        default:
            wg_mma_ss<WC_N, 1, 1>(d, wg_desc_mnmajor(ua + s * 16 * 128, WC_K * 128),
                                  wg_desc_mnmajor(ub + s * 16 * 128, WC_K * 128), 1);
            break;
        }
    }
    wg_commit();
    wg_wait<0>();
    wg_acc_fence<WC_N / 2>(d);
    /* RS_MN64 holds columns 0..63 in d[0..31] and 64..127 in d[32..63]: the same mapping as N = 128 */
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int i = 0; i < WC_N / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = warp * 16 + g + 8 * (e / 2), col = 8 * i + 2 * t + (e % 2);
            c[row * WC_N + col] = d[4 * i + e];
        }
}

}  // namespace

extern "C" int wgmma_check_gemm(int mode, const bf16 *d_a, const bf16 *d_b, float *d_c, cudaStream_t stream) {
    if (mode < 0 || mode >= WGMMA_CHECK_MODES) return kernels_fail("wgmma_check_gemm: mode %d out of range", mode);
    if (!d_a || !d_b || !d_c) return kernels_fail("wgmma_check_gemm: null pointer");
    wgmma_check_kernel<<<1, 128, 0, stream>>>(mode, d_a, d_b, d_c);
    KERNELS_CHECK_LAUNCH("wgmma_check_gemm");
    return 0;
}
