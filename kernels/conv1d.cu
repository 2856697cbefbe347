/*
 * kernels/conv1d.cu — causal depthwise conv1d + SiLU with per-document reset (kernels/conv1d.h).
 * One thread per (token, channel): a binary search of cu_seqlens finds the document start, then
 * K taps in fp32 (K is 4 in every published config; the reads of neighbouring rows hit L2). The decode
 * step's pair (append into the slots' rings, then the conv of the step's rows) uses the same mapping.
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

/* The decode step: one thread per (row, channel); the ring row of position p is p % W. */
__global__ void conv1d_decode_append_kernel(__nv_bfloat16 *hist, const __nv_bfloat16 *x, int x_stride,
                                            const int32_t *slot, const int32_t *pos, int T, int W, int D) {
    size_t n = (size_t)T * D;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(idx / D), c = (int)(idx % D);
        hist[((size_t)slot[r] * W + (size_t)(pos[r] % W)) * D + c] = x[(size_t)r * x_stride + c];
    }
}

__global__ void conv1d_decode_kernel(float *y, const __nv_bfloat16 *hist, const int32_t *slot, const int32_t *pos,
                                     int T, int W, const float *w, int D, int K) {
    size_t n = (size_t)T * D;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        int r = (int)(idx / D), c = (int)(idx % D), p = pos[r];
        const __nv_bfloat16 *h = hist + (size_t)slot[r] * W * D + c;
        float acc = 0.0f;
        for (int j = 0; j < K; j++) {
            int src = p - (K - 1) + j;
            if (src >= 0) acc += w[(size_t)c * K + j] * __bfloat162float(h[(size_t)(src % W) * D]);
        }
        y[idx] = acc / (1.0f + expf(-acc));
    }
}

/* ---------------------------------------------------------------- launchers */

static unsigned conv1d_blocks(size_t n) {
    size_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 132u * 32u ? 132u * 32u : blocks);
}

extern "C" int conv1d_decode_append(bf16 *hist, const bf16 *x, int x_stride, const int32_t *slot, const int32_t *pos,
                                    int T, int W, int D, cudaStream_t stream) {
    if (T < 1 || W < 1 || D < 1 || x_stride < D)
        return kernels_fail("conv1d_decode_append: bad sizes T=%d W=%d D=%d x_stride=%d", T, W, D, x_stride);
    conv1d_decode_append_kernel<<<conv1d_blocks((size_t)T * D), 256, 0, stream>>>(
        (__nv_bfloat16 *)hist, (const __nv_bfloat16 *)x, x_stride, slot, pos, T, W, D);
    KERNELS_CHECK_LAUNCH("conv1d_decode_append");
    return 0;
}

extern "C" int conv1d_decode(float *y, const bf16 *hist, const int32_t *slot, const int32_t *pos, int T, int W,
                             const float *w, int D, int K, cudaStream_t stream) {
    if (T < 1 || W < 1 || D < 1 || K < 1 || K > 16)
        return kernels_fail("conv1d_decode: bad sizes T=%d W=%d D=%d K=%d (need K in [1, 16])", T, W, D, K);
    conv1d_decode_kernel<<<conv1d_blocks((size_t)T * D), 256, 0, stream>>>(y, (const __nv_bfloat16 *)hist, slot, pos,
                                                                          T, W, w, D, K);
    KERNELS_CHECK_LAUNCH("conv1d_decode");
    return 0;
}

extern "C" int conv1d_forward(float *y, const bf16 *x, int x_stride, const float *w, const int32_t *cu_seqlens,
                              int n_docs, int T, int D, int K, cudaStream_t stream) {
    if (T < 0 || D < 1 || K < 1 || K > 16 || x_stride < D || n_docs < 1)
        return kernels_fail("conv1d_forward: bad sizes T=%d D=%d K=%d x_stride=%d n_docs=%d (need K in [1, 16], "
                            "x_stride >= D)", T, D, K, x_stride, n_docs);
    if (T == 0) return 0;
    conv1d_forward_kernel<<<conv1d_blocks((size_t)T * D), 256, 0, stream>>>(y, (const __nv_bfloat16 *)x, x_stride, w,
                                                                           cu_seqlens, n_docs, T, D, K);
    KERNELS_CHECK_LAUNCH("conv1d_forward");
    return 0;
}
