/*
 * kernels/vec.cuh — device helpers shared by the bf16 kernels of the kernels/ .cu files (CUDA only, header-only):
 * 16-byte vectors of 8 bf16 unpacked to and packed from fp32, and the launch-shape helpers.
 * Packing rounds to nearest even (__float22bfloat162_rn), like float_to_bf16 on the host.
 */
#ifndef KERNELS_VEC_CUH
#define KERNELS_VEC_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* 8 bf16 in one 16-byte register group <-> 8 floats. */
static __device__ __forceinline__ void vec_unpack8(uint4 v, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}
static __device__ __forceinline__ uint4 vec_pack8(const float *f) {
    uint4 v;
    __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __float22bfloat162_rn(make_float2(f[2 * i], f[2 * i + 1]));
    return v;
}

/* Blocks for a grid-stride loop over n items with `threads` per block (capped; at least 1). */
static inline unsigned vec_blocks(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 132u * 64u) b = 132u * 64u;   /* enough waves for an H200; the loop covers the rest */
    return b ? (unsigned)b : 1u;
}

static inline int vec_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#endif /* KERNELS_VEC_CUH */
