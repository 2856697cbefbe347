/*
 * kernels/mma.cuh — the Ampere/Hopper warp-level primitives the attention kernels share (device code
 * only; include from .cu files): 16-byte cp.async with zero-fill, ldmatrix x4 (plain and
 * transposed), the bf16 m16n8k16 tensor-core MMA with fp32 accumulate, bf16x2 packing, and the
 * flush-to-zero base-2 exponent. Each is one PTX instruction behind a typed wrapper.
 */
#ifndef KERNELS_MMA_CUH
#define KERNELS_MMA_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* 16 bytes gmem -> smem, asynchronously; bytes past src_bytes (0 or 16) are zero-filled. */
static __device__ __forceinline__ void mma_cp_async16(void *smem, const void *gmem, int src_bytes) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
static __device__ __forceinline__ void mma_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* Wait until at most N committed cp.async groups are still in flight. */
template <int N>
static __device__ __forceinline__ void mma_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Four 8x8 b16 matrices from shared memory into the fragment layout of mma (trans: transposed). */
static __device__ __forceinline__ void mma_ldsm_x4(uint32_t *r, const void *smem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
static __device__ __forceinline__ void mma_ldsm_x4_t(uint32_t *r, const void *smem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* d[16x8 f32] += a[16x16 bf16, row] · b[16x8 bf16, col] */
static __device__ __forceinline__ void mma_m16n8k16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t mma_pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* An fp32 accumulator over K16·16 columns (mma.sync or wgmma layout: acc[8kk + ...] is k16 chunk kk) as bf16 A
 * fragments of the next product: a[4kk + j] = pack(acc[8kk + 2j], acc[8kk + 2j + 1]) (P from S, dS from dP).
 * Compile-time indices only, so both arrays stay in registers. */
template <int K16>
static __device__ __forceinline__ void mma_pack_frags(const float *acc, uint32_t *a) {
#pragma unroll
    for (int kk = 0; kk < K16; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++) a[4 * kk + j] = mma_pack_bf16x2(acc[8 * kk + 2 * j], acc[8 * kk + 2 * j + 1]);
}

/* 2^x, flush-to-zero (MUFU.EX2 alone); 2^-inf = +0. */
static __device__ __forceinline__ float mma_ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif /* KERNELS_MMA_CUH */
