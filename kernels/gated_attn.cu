/*
 * kernels/gated_attn.cu — split, partial rotary and output gate of the gated attention layer
 * (kernels/gated_attn.h). Element-wise, one thread per element or rotated pair (any HD, including
 * the tiny models' 16): memory-bound glue around the GEMMs and the attention kernel.
 */
#include "kernels/gated_attn.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

static inline unsigned ga_blocks(long long n) {
    long long b = (n + 255) / 256;
    if (b > 132 * 64) b = 132 * 64;
    return b ? (unsigned)b : 1u;
}

/* ---------------------------------------------------------------- kernels */

__global__ void gated_attn_split_forward_kernel(__nv_bfloat16 *q, __nv_bfloat16 *gate, __nv_bfloat16 *k,
                                                __nv_bfloat16 *v, const __nv_bfloat16 *qkv, int T, int NH, int NKV,
                                                int HD) {
    long long nq = (long long)NH * HD, nk = (long long)NKV * HD, row = 2 * nq + 2 * nk, n = (long long)T * row;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long t = i / row, c = i % row;
        __nv_bfloat16 x = qkv[i];
        if (c < 2 * nq) {
            long long h = c / (2 * HD), r = c % (2 * HD);
            if (r < HD) q[t * nq + h * HD + r] = x;
            else gate[t * nq + h * HD + r - HD] = x;
        } else if (c < 2 * nq + nk) {
            k[t * nk + c - 2 * nq] = x;
        } else {
            v[t * nk + c - 2 * nq - nk] = x;
        }
    }
}

/* One thread per rotated pair of a q or k head. */
__global__ void gated_attn_rope_forward_kernel(__nv_bfloat16 *q, __nv_bfloat16 *k, const int32_t *pos,
                                               const float *inv_freq, int T, int NH, int NKV, int HD, int R) {
    int h2 = R / 2, heads = NH + NKV;
    long long n = (long long)T * heads * h2;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x) {
        int i = (int)(idx % h2);
        long long th = idx / h2;
        int t = (int)(th / heads), h = (int)(th % heads);
        __nv_bfloat16 *x = h < NH ? q + ((size_t)t * NH + h) * HD : k + ((size_t)t * NKV + (h - NH)) * HD;
        float a = (float)pos[t] * inv_freq[i];
        float c = cosf(a), s = sinf(a);
        float x0 = __bfloat162float(x[i]), x1 = __bfloat162float(x[i + h2]);
        x[i] = __float2bfloat16(x0 * c - x1 * s);
        x[i + h2] = __float2bfloat16(x1 * c + x0 * s);
    }
}

__global__ void gated_attn_gate_forward_kernel(__nv_bfloat16 *att, const __nv_bfloat16 *gate, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float g = __bfloat162float(gate[i]);
        att[i] = __float2bfloat16(__bfloat162float(att[i]) * (1.0f / (1.0f + expf(-g))));
    }
}

/* ---------------------------------------------------------------- launchers */

extern "C" int gated_attn_split_forward(bf16 *q, bf16 *gate, bf16 *k, bf16 *v, const bf16 *qkv, int T, int NH,
                                        int NKV, int HD, cudaStream_t stream) {
    if (T < 0 || NH < 1 || NKV < 1 || HD < 1)
        return kernels_fail("gated_attn_split_forward: bad sizes T=%d NH=%d NKV=%d HD=%d", T, NH, NKV, HD);
    if (T == 0) return 0;
    long long n = (long long)T * (2LL * NH * HD + 2LL * NKV * HD);
    gated_attn_split_forward_kernel<<<ga_blocks(n), 256, 0, stream>>>(
        (__nv_bfloat16 *)q, (__nv_bfloat16 *)gate, (__nv_bfloat16 *)k, (__nv_bfloat16 *)v,
        (const __nv_bfloat16 *)qkv, T, NH, NKV, HD);
    KERNELS_CHECK_LAUNCH("gated_attn_split_forward");
    return 0;
}

extern "C" int gated_attn_rope_forward(bf16 *q, bf16 *k, const int32_t *pos, const float *inv_freq, int T, int NH,
                                       int NKV, int HD, int R, cudaStream_t stream) {
    if (T < 0 || NH < 1 || NKV < 1 || R < 2 || R % 2 || R > HD)
        return kernels_fail("gated_attn_rope_forward: bad sizes T=%d NH=%d NKV=%d HD=%d R=%d (need R even, 2 <= R <= HD)",
                            T, NH, NKV, HD, R);
    if (T == 0) return 0;
    long long n = (long long)T * (NH + NKV) * (R / 2);
    gated_attn_rope_forward_kernel<<<ga_blocks(n), 256, 0, stream>>>((__nv_bfloat16 *)q, (__nv_bfloat16 *)k, pos,
                                                                     inv_freq, T, NH, NKV, HD, R);
    KERNELS_CHECK_LAUNCH("gated_attn_rope_forward");
    return 0;
}

extern "C" int gated_attn_gate_forward(bf16 *att, const bf16 *gate, int64_t n, cudaStream_t stream) {
    if (n < 0) return kernels_fail("gated_attn_gate_forward: n=%lld is negative", (long long)n);
    if (n == 0) return 0;
    gated_attn_gate_forward_kernel<<<ga_blocks(n), 256, 0, stream>>>((__nv_bfloat16 *)att,
                                                                     (const __nv_bfloat16 *)gate, (long long)n);
    KERNELS_CHECK_LAUNCH("gated_attn_gate_forward");
    return 0;
}
