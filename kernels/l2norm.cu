/*
 * kernels/l2norm.cu — per-head L2 normalisation in place (kernels/l2norm.h): one warp per
 * (row, head), fp32 sum of squares reduced by shuffles, rsqrt in double as the reference.
 */
#include "kernels/l2norm.h"

#include <cuda_runtime.h>

/* ---------------------------------------------------------------- kernels */

__global__ void l2norm_forward_kernel(float *x, int N, int row_stride, int n_heads, int d, float scale) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (w >= (long long)N * n_heads) return;   /* whole warps leave together (w is uniform in a warp) */
    float *v = x + (size_t)(w / n_heads) * row_stride + (size_t)(w % n_heads) * d;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) ss += v[i] * v[i];
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    float rn = (float)(1.0 / sqrt((double)ss + L2NORM_EPS));
    for (int i = lane; i < d; i += 32) {
        float y = v[i] * rn;
        v[i] = scale != 1.0f ? y * scale : y;
    }
}

/* ---------------------------------------------------------------- launcher */

extern "C" int l2norm_forward(float *x, int N, int row_stride, int n_heads, int d, float scale, cudaStream_t stream) {
    if (N < 0 || n_heads < 1 || d < 1 || row_stride < n_heads * d)
        return kernels_fail("l2norm_forward: bad sizes N=%d n_heads=%d d=%d row_stride=%d", N, n_heads, d, row_stride);
    if (N == 0) return 0;
    long long threads = (long long)N * n_heads * 32;
    l2norm_forward_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, stream>>>(x, N, row_stride, n_heads, d, scale);
    KERNELS_CHECK_LAUNCH("l2norm_forward");
    return 0;
}
