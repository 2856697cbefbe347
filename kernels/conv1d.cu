/*
 * kernels/conv1d.cu — causal depthwise conv1d + SiLU with per-document reset (kernels/conv1d.h).
 * One thread per (token, channel): a binary search of cu_seqlens finds the document start, then
 * K taps in fp32 (K is 4 in every published config; the reads of neighbouring rows hit L2).
 */
#include "kernels/conv1d.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* ---------------------------------------------------------------- kernels */

__global__ void conv1d_forward_kernel(float *y, const __nv_bfloat16 *x, int x_stride, const float *w,
                                      const int32_t *cu, int n_docs, int T, int D, int K) {
    size_t n = (size_t)T * D;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(idx / D), c = (int)(idx % D);
        int lo = 0, hi = n_docs - 1;   /* the last document whose start is <= t */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (cu[mid] <= t) lo = mid; else hi = mid - 1;
        }
        int start = cu[lo];
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int src = t - (K - 1) + j;
            if (src >= start) acc += w[(size_t)c * K + j] * __bfloat162float(x[(size_t)src * x_stride + c]);
        }
        y[idx] = acc / (1.0f + expf(-acc));
    }
}

/* ---------------------------------------------------------------- launcher */

extern "C" int conv1d_forward(float *y, const bf16 *x, int x_stride, const float *w, const int32_t *cu_seqlens,
                              int n_docs, int T, int D, int K, cudaStream_t stream) {
    if (T < 0 || D < 1 || K < 1 || K > 16 || x_stride < D || n_docs < 1)
        return kernels_fail("conv1d_forward: bad sizes T=%d D=%d K=%d x_stride=%d n_docs=%d (need K in [1, 16], "
                            "x_stride >= D)", T, D, K, x_stride, n_docs);
    if (T == 0) return 0;
    size_t n = (size_t)T * D;
    size_t blocks = (n + 255) / 256;
    if (blocks > 132u * 32u) blocks = 132u * 32u;
    conv1d_forward_kernel<<<(unsigned)blocks, 256, 0, stream>>>(y, (const __nv_bfloat16 *)x, x_stride, w, cu_seqlens,
                                                                n_docs, T, D, K);
    KERNELS_CHECK_LAUNCH("conv1d_forward");
    return 0;
}
