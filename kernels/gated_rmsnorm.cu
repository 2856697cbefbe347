/*
 * kernels/gated_rmsnorm.cu — gated RMSNorm (kernels/gated_rmsnorm.h): one warp per (token, head),
 * fp32 sum of squares by shuffles, one bf16 rounding per output.
 */
#include "kernels/gated_rmsnorm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* ---------------------------------------------------------------- kernels */

__global__ void gated_rmsnorm_forward_kernel(__nv_bfloat16 *y, const float *o, const __nv_bfloat16 *z, int z_stride,
                                             const float *w, int T, int n_heads, int d, float eps) {
    long long wi = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (wi >= (long long)T * n_heads) return;   /* uniform per warp */
    int t = (int)(wi / n_heads), h = (int)(wi % n_heads);
    const float *ov = o + (size_t)wi * d;
    const __nv_bfloat16 *zv = z + (size_t)t * z_stride + (size_t)h * d;
    float ss = 0.0f;
    for (int e = lane; e < d; e += 32) ss += ov[e] * ov[e];
    for (int s = 16; s; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
    float rs = (float)(1.0 / sqrt((double)ss / d + eps));
    for (int e = lane; e < d; e += 32) {
        float zz = __bfloat162float(zv[e]);
        y[(size_t)wi * d + e] = __float2bfloat16(w[e] * (ov[e] * rs) * (zz / (1.0f + expf(-zz))));
    }
}

/* ---------------------------------------------------------------- launcher */

extern "C" int gated_rmsnorm_forward(bf16 *y, const float *o, const bf16 *z, int z_stride, const float *w, int T,
                                     int n_heads, int d, float eps, cudaStream_t stream) {
    if (T < 0 || n_heads < 1 || d < 1 || z_stride < n_heads * d)
        return kernels_fail("gated_rmsnorm_forward: bad sizes T=%d n_heads=%d d=%d z_stride=%d", T, n_heads, d, z_stride);
    if (T == 0) return 0;
    long long threads = (long long)T * n_heads * 32;
    gated_rmsnorm_forward_kernel<<<(unsigned)((threads + 255) / 256), 256, 0, stream>>>(
        (__nv_bfloat16 *)y, o, (const __nv_bfloat16 *)z, z_stride, w, T, n_heads, d, eps);
    KERNELS_CHECK_LAUNCH("gated_rmsnorm_forward");
    return 0;
}
