/*
 * kernels/cast.cu — fp32 <-> bf16 casts (kernels/cast.h). With 16-byte aligned pointers each thread
 * moves 8 elements per step (two float4 <-> one uint4); the last n % 8 elements, and everything
 * when unaligned, go element by element.
 */
#include "kernels/cast.h"
#include "kernels/vec.cuh"

/* ---------------------------------------------------------------- kernels */

__global__ void cast_f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = i0; i < nv; i += stride) {
        float4 a = __ldg((const float4 *)src + 2 * i), b = __ldg((const float4 *)src + 2 * i + 1);
        float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        ((uint4 *)dst)[i] = vec_pack8(f);
    }
    __nv_bfloat16 *d = (__nv_bfloat16 *)dst;
    for (size_t i = nv * 8 + i0; i < n; i += stride) d[i] = __float2bfloat16_rn(src[i]);
}

__global__ void cast_bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = i0; i < nv; i += stride) {
        float f[8];
        vec_unpack8(__ldg((const uint4 *)src + i), f);
        ((float4 *)dst)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
        ((float4 *)dst)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    const __nv_bfloat16 *s = (const __nv_bfloat16 *)src;
    for (size_t i = nv * 8 + i0; i < n; i += stride) dst[i] = __bfloat162float(s[i]);
}

/* ---------------------------------------------------------------- launchers */

extern "C" int cast_f32_to_bf16(bf16 *dst, const float *src, size_t n, cudaStream_t stream) {
    if (n == 0) return 0;
    int vec = vec_aligned16(dst) && vec_aligned16(src);
    cast_f32_to_bf16_kernel<<<vec_blocks(vec ? n / 8 + 8 : n, 256), 256, 0, stream>>>(dst, src, n, vec);
    KERNELS_CHECK_LAUNCH("cast_f32_to_bf16");
    return 0;
}

extern "C" int cast_bf16_to_f32(float *dst, const bf16 *src, size_t n, cudaStream_t stream) {
    if (n == 0) return 0;
    int vec = vec_aligned16(dst) && vec_aligned16(src);
    cast_bf16_to_f32_kernel<<<vec_blocks(vec ? n / 8 + 8 : n, 256), 256, 0, stream>>>(dst, src, n, vec);
    KERNELS_CHECK_LAUNCH("cast_bf16_to_f32");
    return 0;
}
