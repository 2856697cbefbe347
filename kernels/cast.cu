/*
 * kernels/cast.cu — fp32 <-> bf16 casts (kernels/cast.h).
 * fp32 -> bf16: with 16-byte aligned pointers each thread moves 8 elements per step (two float4 ->
 * one uint4); the last n % 8 elements, and everything when unaligned, go element by element.
 * bf16 -> fp32: each thread reads 4 bf16 (8 bytes) and writes one float4, so a warp's loads and
 * stores are both contiguous (an 8-element form would stride its stores by 32 bytes per lane),
 * with CAST_UNROLL loads in flight per thread and streaming cache hints (each byte is touched
 * once); the last n % 4 elements, and everything when unaligned, element by element.
 */
#include "kernels/cast.h"
#include "kernels/vec.cuh"

#define CAST_UNROLL 4

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

/* 4 elements per item: item i is src bf16 [4i, 4i+4) (8 bytes) -> dst float4 i. vec: src 8-byte and
 * dst 16-byte aligned; the last n % 4 elements (or all when !vec) element by element. */
__global__ void cast_bf16_to_f32_x4_kernel(float *dst, const bf16 *src, size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 4 : 0;
    const uint2 *s2 = (const uint2 *)src;
    float4 *d4 = (float4 *)dst;
    for (size_t i = i0; i < nv; i += CAST_UNROLL * stride) {
        uint2 a[CAST_UNROLL];
#pragma unroll
        for (int u = 0; u < CAST_UNROLL; u++) {
            size_t j = i + u * stride;
            a[u] = make_uint2(0, 0);
            if (j < nv) a[u] = __ldcs(s2 + j);
        }
#pragma unroll
        for (int u = 0; u < CAST_UNROLL; u++) {
            size_t j = i + u * stride;
            if (j < nv) {
                /* bf16 -> fp32 is the 16 bits shifted up: exact */
                float4 f = make_float4(__uint_as_float(a[u].x << 16), __uint_as_float(a[u].x & 0xffff0000u),
                                       __uint_as_float(a[u].y << 16), __uint_as_float(a[u].y & 0xffff0000u));
                __stcs(d4 + j, f);
            }
        }
    }
    const __nv_bfloat16 *s = (const __nv_bfloat16 *)src;
    for (size_t i = nv * 4 + i0; i < n; i += stride) dst[i] = __bfloat162float(s[i]);
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
    int vec = vec_aligned16(dst) && ((uintptr_t)src & 7u) == 0;
    cast_bf16_to_f32_x4_kernel<<<vec_blocks(vec ? n / 4 + 4 : n, 256), 256, 0, stream>>>(dst, src, n, vec);
    KERNELS_CHECK_LAUNCH("cast_bf16_to_f32");
    return 0;
}
