/*
 * kernels/rope.cu — rotate-half RoPE forward and backward, in place (kernels/rope.h).
 *
 * One thread rotates 8 pairs (i, i+HD/2) of one head of one token: two 16-byte loads, fp32 math,
 * two 16-byte stores. The angle is the fp32 product float(pos)·inv_freq[i] and sincosf is the
 * accurate one (no fast-math), so it matches the reference to an ulp of sin/cos. q heads and k
 * heads are one flat index space so one launch covers both.
 */
#include "kernels/rope.h"
#include "kernels/vec.cuh"

/* ---------------------------------------------------------------- kernels */

template <bool BACKWARD>
__global__ void rope_forward_kernel(bf16 *q, bf16 *k, const int32_t *pos, const float *inv_freq,
                                    int T, int NH, int NKV, int HD) {
    int groups = HD / 16, heads = NH + (k ? NKV : 0), h2 = HD / 2;
    size_t n = (size_t)T * heads * groups;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int g = (int)(i % groups);
        size_t th = i / groups;
        int h = (int)(th % heads), t = (int)(th / heads);
        bf16 *row = h < NH ? q + ((size_t)t * NH + h) * HD : k + ((size_t)t * NKV + (h - NH)) * HD;
        float p = (float)__ldg(pos + t);
        float x0[8], x1[8];
        vec_unpack8(*(const uint4 *)(row + g * 8), x0);
        vec_unpack8(*(const uint4 *)(row + h2 + g * 8), x1);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float s, c;
            sincosf(p * __ldg(inv_freq + g * 8 + j), &s, &c);
            if (BACKWARD) s = -s;
            float a = x0[j], b = x1[j];
            x0[j] = a * c - b * s;
            x1[j] = b * c + a * s;
        }
        *(uint4 *)(row + g * 8) = vec_pack8(x0);
        *(uint4 *)(row + h2 + g * 8) = vec_pack8(x1);
    }
}

/* ---------------------------------------------------------------- launchers */

template <bool BACKWARD>
static int rope_launch(const char *name, bf16 *q, bf16 *k, const int32_t *pos, const float *inv_freq,
                       int T, int NH, int NKV, int HD, cudaStream_t stream) {
    if (T < 0 || NH <= 0 || (k && NKV <= 0))
        return kernels_fail("%s: bad sizes T=%d NH=%d NKV=%d", name, T, NH, NKV);
    if (HD <= 0 || HD % 16 || HD > 256) return kernels_fail("%s: HD=%d must be a multiple of 16 and <= 256", name, HD);
    if (!vec_aligned16(q) || (k && !vec_aligned16(k))) return kernels_fail("%s: q and k must be 16-byte aligned", name);
    if (T == 0) return 0;
    size_t n = (size_t)T * (NH + (k ? NKV : 0)) * (HD / 16);
    rope_forward_kernel<BACKWARD><<<vec_blocks(n, 256), 256, 0, stream>>>(q, k, pos, inv_freq, T, NH, NKV, HD);
    KERNELS_CHECK_LAUNCH(name);
    return 0;
}

extern "C" int rope_forward(bf16 *q, bf16 *k, const int32_t *pos, const float *inv_freq, int T, int NH, int NKV,
                            int HD, cudaStream_t stream) {
    return rope_launch<false>("rope_forward", q, k, pos, inv_freq, T, NH, NKV, HD, stream);
}

extern "C" int rope_backward(bf16 *dq, bf16 *dk, const int32_t *pos, const float *inv_freq, int T, int NH,
                             int NKV, int HD, cudaStream_t stream) {
    return rope_launch<true>("rope_backward", dq, dk, pos, inv_freq, T, NH, NKV, HD, stream);
}
