/*
 * kernels/decode_attn.cu — GPU append and attention over per-slot KV caches (kernels/decode_attn.h).
 *
 * Attention: one block of DA_WARPS warps per (row, query head). Warp w scores keys w, w + DA_WARPS, ... of the
 * row's slot; lane l holds head-dimension elements l, l + 32, ... (NE = ceil(HD/32) of them, a template
 * parameter), so a key or value row is read by the warp in 64-byte coalesced pieces; the dot product is a warp
 * shuffle reduction. Each warp keeps (max, sum, output) of an online softmax in fp32; the warps' partials are
 * merged through shared memory at the end and the row is rounded once to bf16.
 */
#include "kernels/decode_attn.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>

#define DA_WARPS 8

/* ---------------------------------------------------------------- kernels */

__global__ void decode_attn_append_kernel(uint4 *kc, uint4 *vc, const uint4 *k, const uint4 *v, const int32_t *slot,
                                          const int32_t *pos, int T, int max_len, int row8) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * row8) return;
    int r = (int)(i / row8), c = (int)(i % row8);
    long long at = ((long long)slot[r] * max_len + pos[r]) * row8 + c;
    kc[at] = k[i];
    vc[at] = v[i];
}

template <int NE>
__global__ void __launch_bounds__(DA_WARPS * 32)
decode_attn_forward_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *q, const __nv_bfloat16 *kc,
                           const __nv_bfloat16 *vc, const int32_t *slot, const int32_t *pos, int max_len, int NH,
                           int NKV, int HD, float scale) {
    __shared__ float sm_m[DA_WARPS], sm_l[DA_WARPS];
    __shared__ float sm_o[DA_WARPS][NE * 32];
    int r = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int kh = h / (NH / NKV), n = pos[r] + 1;
    size_t row = (size_t)NKV * HD;
    const __nv_bfloat16 *kbase = kc + (size_t)slot[r] * max_len * row + (size_t)kh * HD;
    const __nv_bfloat16 *vbase = vc + (size_t)slot[r] * max_len * row + (size_t)kh * HD;
    const __nv_bfloat16 *qi = q + ((size_t)r * NH + h) * HD;
    float qv[NE], o[NE];
#pragma unroll
    for (int i = 0; i < NE; i++) {
        int e = lane + 32 * i;
        qv[i] = e < HD ? __bfloat162float(qi[e]) : 0.0f;
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = warp; j < n; j += DA_WARPS) {
        const __nv_bfloat16 *kj = kbase + (size_t)j * row, *vj = vbase + (size_t)j * row;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < NE; i++) {
            int e = lane + 32 * i;
            if (e < HD) s += qv[i] * __bfloat162float(kj[e]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        s *= scale;
        float mn = fmaxf(m, s), corr = expf(m - mn), w = expf(s - mn);   /* m = -inf at first: corr = 0 */
        l = l * corr + w;
#pragma unroll
        for (int i = 0; i < NE; i++) {
            int e = lane + 32 * i;
            o[i] = o[i] * corr + (e < HD ? w * __bfloat162float(vj[e]) : 0.0f);
        }
        m = mn;
    }
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < NE; i++) sm_o[warp][lane + 32 * i] = o[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < DA_WARPS; w++) M = fmaxf(M, sm_m[w]);   /* finite: key 0 always exists (warp 0) */
    float L = 0.0f;
    for (int w = 0; w < DA_WARPS; w++) L += sm_m[w] == -INFINITY ? 0.0f : sm_l[w] * expf(sm_m[w] - M);
    for (int e = threadIdx.x; e < HD; e += blockDim.x) {
        float acc = 0.0f;
        for (int w = 0; w < DA_WARPS; w++)
            if (sm_m[w] != -INFINITY) acc += sm_o[w][e] * expf(sm_m[w] - M);
        out[((size_t)r * NH + h) * HD + e] = __float2bfloat16(acc / L);
    }
}

/* ---------------------------------------------------------------- launchers */

extern "C" int decode_attn_append(bf16 *kc, bf16 *vc, const bf16 *k, const bf16 *v, const int32_t *slot,
                                  const int32_t *pos, int T, int max_len, int NKV, int HD, cudaStream_t stream) {
    if (T < 1 || max_len < 1 || NKV < 1 || HD < 8 || HD % 8)
        return kernels_fail("decode_attn_append: need T, max_len, NKV >= 1 and HD a multiple of 8 (T=%d max_len=%d "
                            "NKV=%d HD=%d)", T, max_len, NKV, HD);
    if (((uintptr_t)kc | (uintptr_t)vc | (uintptr_t)k | (uintptr_t)v) & 15)
        return kernels_fail("decode_attn_append: pointers must be 16-byte aligned");
    int row8 = NKV * HD / 8, threads = 256;
    long long n = (long long)T * row8;
    decode_attn_append_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(
        (uint4 *)kc, (uint4 *)vc, (const uint4 *)k, (const uint4 *)v, slot, pos, T, max_len, row8);
    KERNELS_CHECK_LAUNCH("decode_attn_append");
    return 0;
}

extern "C" int decode_attn_forward(bf16 *out, const bf16 *q, const bf16 *kc, const bf16 *vc, const int32_t *slot,
                                   const int32_t *pos, int T, int max_len, int NH, int NKV, int HD, float scale,
                                   cudaStream_t stream) {
    if (T < 1 || max_len < 1 || NKV < 1 || NH % NKV || HD < 1 || HD > 256)
        return kernels_fail("decode_attn_forward: need T, max_len >= 1, NH a multiple of NKV and 1 <= HD <= 256 "
                            "(T=%d max_len=%d NH=%d NKV=%d HD=%d)", T, max_len, NH, NKV, HD);
    if (NH > 65535) return kernels_fail("decode_attn_forward: NH=%d exceeds the grid's 65535", NH);
    dim3 grid((unsigned)T, (unsigned)NH), block(DA_WARPS * 32);
    const __nv_bfloat16 *qq = (const __nv_bfloat16 *)q, *kk = (const __nv_bfloat16 *)kc,
                        *vv = (const __nv_bfloat16 *)vc;
    __nv_bfloat16 *oo = (__nv_bfloat16 *)out;
    if (HD <= 32)
        decode_attn_forward_kernel<1><<<grid, block, 0, stream>>>(oo, qq, kk, vv, slot, pos, max_len, NH, NKV, HD, scale);
    else if (HD <= 64)
        decode_attn_forward_kernel<2><<<grid, block, 0, stream>>>(oo, qq, kk, vv, slot, pos, max_len, NH, NKV, HD, scale);
    else if (HD <= 128)
        decode_attn_forward_kernel<4><<<grid, block, 0, stream>>>(oo, qq, kk, vv, slot, pos, max_len, NH, NKV, HD, scale);
    else
        decode_attn_forward_kernel<8><<<grid, block, 0, stream>>>(oo, qq, kk, vv, slot, pos, max_len, NH, NKV, HD, scale);
    KERNELS_CHECK_LAUNCH("decode_attn_forward");
    return 0;
}
