/*
 * stages/model/target.cu — the target forward's two glue kernels (target.h): splitting the fused
 * QKV GEMM output into the dense q, k, v the kernels/ ops take, and seeded random weight fill
 * for benchmark models that never exist as files.
 *
 * Both are pure data movement / generation: no math the CPU path would have to match. The split
 * moves 16-byte vectors (HD % 8 == 0); the fill uses a counter-based splitmix64 keyed by
 * (seed, index), so the values do not depend on the launch configuration.
 */
#include "model/target.h"
#include "kernels/common.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* ---------------------------------------------------------------- kernels */

/* One thread per 8-element vector of a qkv row. */
__global__ void target_qkv_split_kernel(uint4 *q, uint4 *k, uint4 *v, const uint4 *qkv, int T, int nq8, int nk8) {
    int row8 = nq8 + 2 * nk8;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * row8) return;
    int t = (int)(i / row8), c = (int)(i % row8);
    uint4 val = qkv[i];
    if (c < nq8) q[(long long)t * nq8 + c] = val;
    else if (c < nq8 + nk8) k[(long long)t * nk8 + (c - nq8)] = val;
    else v[(long long)t * nk8 + (c - nq8 - nk8)] = val;
}

__device__ __forceinline__ float target_uniform(uint64_t seed, uint64_t i) {
    uint64_t z = kernels_mix64(seed + (i + 1) * KERNELS_RNG_GAMMA);   /* counter-based splitmix64 */
    return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;   /* U(-1, 1) */
}

__global__ void target_fill_bf16_kernel(__nv_bfloat16 *p, size_t n, uint64_t seed, float mean, float a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(mean + a * target_uniform(seed, i));
}

__global__ void target_fill_f32_kernel(float *p, size_t n, uint64_t seed, float mean, float a) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = mean + a * target_uniform(seed, i);
}

/* ---------------------------------------------------------------- launchers */

extern "C" int target_qkv_split(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, int T, int NH, int NKV, int HD,
                                cudaStream_t stream) {
    if (T < 1 || NH < 1 || NKV < 1 || HD % 8)
        return kernels_fail("target_qkv_split: need T, NH, NKV >= 1 and HD %% 8 == 0 (T=%d NH=%d NKV=%d HD=%d)",
                            T, NH, NKV, HD);
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)qkv) & 15)
        return kernels_fail("target_qkv_split: pointers must be 16-byte aligned");
    int nq8 = NH * HD / 8, nk8 = NKV * HD / 8;
    long long n = (long long)T * (nq8 + 2 * nk8);
    int threads = 256;
    unsigned blocks = (unsigned)((n + threads - 1) / threads);
    target_qkv_split_kernel<<<blocks, threads, 0, stream>>>((uint4 *)q, (uint4 *)k, (uint4 *)v, (const uint4 *)qkv,
                                                            T, nq8, nk8);
    KERNELS_CHECK_LAUNCH("target_qkv_split");
    return 0;
}

extern "C" int target_fill_random_bf16(bf16 *p, size_t n, uint64_t seed, float mean, float std, cudaStream_t stream) {
    if (n == 0) return 0;
    target_fill_bf16_kernel<<<1024, 256, 0, stream>>>((__nv_bfloat16 *)p, n, seed, mean, std * 1.7320508f);
    KERNELS_CHECK_LAUNCH("target_fill_random_bf16");
    return 0;
}

extern "C" int target_fill_random_f32(float *p, size_t n, uint64_t seed, float mean, float std, cudaStream_t stream) {
    if (n == 0) return 0;
    target_fill_f32_kernel<<<256, 256, 0, stream>>>(p, n, seed, mean, std * 1.7320508f);
    KERNELS_CHECK_LAUNCH("target_fill_random_f32");
    return 0;
}
