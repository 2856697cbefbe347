/*
 * kernels/block_attn_common.cuh — internal to kernels/block_attn_bwd_wg.cuh and kernels/bench/block_attn_mma.cuh
 * (and kernels/block_attn_simt.cu, which uses ba_di_kernel and ba_doc_span)
 * (the bench's retired mma.sync sets): the one copy of the device code both backward kernel families share.
 *   ba_dot8 / ba_di_half  the Di = rowsum(dO ⊙ O) sums (16-byte words; half a row, two threads per row);
 *   ba_di_kernel     the backward's first pass, Di per (head, row), optionally lse·log2(e);
 *   ba_doc_span      the scan of a block's anchor window for the first / last key of its document.
 * Header only (templates and force-inlined device functions, internal linkage per translation unit); CUDA
 * only. It has an include guard and sits in an anonymous namespace: the benchmark includes block_attn_mma.cuh
 * inside namespaces, so it includes this header once at global scope first (kernels/bench/block_attn_bench.cu).
 * Invariant: the code is the former copies' code verbatim (the default kernels' machine code is unchanged).
 */
#ifndef KERNELS_BLOCK_ATTN_COMMON_CUH
#define KERNELS_BLOCK_ATTN_COMMON_CUH

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>

namespace {

/* s + Σ a·c over the 8 bf16 pairs of two 16-byte words, in the order every Di sum here uses. */
__device__ __forceinline__ float ba_dot8(uint4 a, uint4 c, float s) {
    const __nv_bfloat162 *pa = (const __nv_bfloat162 *)&a, *pc = (const __nv_bfloat162 *)&c;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float2 x = __bfloat1622float2(pa[e]), y = __bfloat1622float2(pc[e]);
        s += x.x * y.x + x.y * y.y;
    }
    return s;
}

/* Σ dO·O over HD/2 elements from po / pd (one half of a (row, head) vector: the kernels' two threads per row
 * each sum a half, then add the halves with one shuffle). */
template <int HD>
__device__ __forceinline__ float ba_di_half(const __nv_bfloat16 *po, const __nv_bfloat16 *pd) {
    float s = 0.f;
    for (int c = 0; c < HD / 2; c += 8)
        s = ba_dot8(*reinterpret_cast<const uint4 *>(po + c), *reinterpret_cast<const uint4 *>(pd + c), s);
    return s;
}

/* Di[h·R + row] = Σ_e dO·O over the head dim; one thread per 8 elements, HD/8 lanes per (row, head) of
 * out's (R, n_h) layout. LSE2 (set 7): also lse2[h·R + row] = lse·log2(e) when lse2 is not NULL. */
template <int HD, bool LSE2 = false>
__global__ void ba_di_kernel(const __nv_bfloat16 *out, const __nv_bfloat16 *dout, float *di, int R, int n_h,
                             const float *lse = nullptr, float *lse2 = nullptr) {
    constexpr int CH = HD / 8;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t pair = i / CH;   /* (row, head) in the (R, n_h) layout of out */
    float s = 0.f;
    if (pair < (size_t)R * n_h)
        s = ba_dot8(*reinterpret_cast<const uint4 *>(out + i * 8), *reinterpret_cast<const uint4 *>(dout + i * 8), s);
#pragma unroll
    for (int o = CH / 2; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (pair < (size_t)R * n_h && i % CH == 0) {
        size_t row = pair / n_h, h = pair % n_h;
        di[h * R + row] = s;
        if (LSE2 && lse2) lse2[h * R + row] = lse[h * R + row] * 1.4426950408889634f;   /* lse·log2(e) */
    }
}

/* The first and last key of document d in [lo, hi) (a block's anchor window), merged into *sLo (atomicMin)
 * and *sHi (atomicMax) by lane 0 of each warp (lane0: this thread is one); CNT: the number of its keys added to *sCnt. NT threads scan,
 * t = 0..NT-1 this thread's index among them (whole warps; TI: int, or unsigned for threadIdx.x as set 5's
 * copy had it; INC: count in the loop even when !CNT, as set 7's copy did: both keep their machine code). The caller initialises the three (*sLo = hi,
 * *sHi = lo - 1, *sCnt = 0) and puts the barriers around it. */
template <int NT, bool CNT, typename TI, bool INC = CNT>
__device__ __forceinline__ void ba_doc_span(const int32_t *doc_ids, int lo, int hi, int d, TI t, bool lane0, int *sLo,
                                            int *sHi, int *sCnt) {
    int mn = hi, mx = lo - 1, cnt = 0;
#pragma unroll 4   /* independent loads in flight: the scan sits before the first K/V tile load */
    for (int p = lo + t; p < hi; p += NT)
        if (doc_ids[p] == d) { mn = min(mn, p); mx = max(mx, p); if (INC) cnt++; }
    for (int o = 16; o; o >>= 1) {
        mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        if (CNT) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
    }
    if (lane0) { atomicMin(sLo, mn); atomicMax(sHi, mx); if (CNT) atomicAdd(sCnt, cnt); }
}

}  // namespace

#endif /* KERNELS_BLOCK_ATTN_COMMON_CUH */
