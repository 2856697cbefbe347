/*
 * kernels/swiglu.cu — SwiGLU forward and backward (kernels/swiglu.h): one thread per 8 elements of
 * a row, 16-byte loads of gate and up at the row stride, fp32 math, one bf16 rounding per output.
 */
#include "kernels/swiglu.h"
#include "kernels/vec.cuh"

/* ---------------------------------------------------------------- kernels */

__global__ void swiglu_forward_kernel(uint4 *out, const bf16 *gate, const bf16 *up, int T, int I8, int stride) {
    size_t n = (size_t)T * I8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / I8, c = i % I8, o = t * stride + c * 8;
        float g[8], u[8], y[8];
        vec_unpack8(__ldg((const uint4 *)(gate + o)), g);
        vec_unpack8(__ldg((const uint4 *)(up + o)), u);
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        out[i] = vec_pack8(y);
    }
}

__global__ void swiglu_backward_kernel(bf16 *dgate, bf16 *dup, const uint4 *dout, const bf16 *gate, const bf16 *up,
                                       int T, int I8, int stride) {
    size_t n = (size_t)T * I8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = i / I8, c = i % I8, o = t * stride + c * 8;
        float g[8], u[8], d[8], dg[8], du[8];
        /* plain loads: dgate/dup may alias gate/up, so no read-only cache path */
        vec_unpack8(*(const uint4 *)(gate + o), g);
        vec_unpack8(*(const uint4 *)(up + o), u);
        vec_unpack8(dout[i], d);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float s = 1.0f / (1.0f + expf(-g[j]));
            dg[j] = d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
            du[j] = d[j] * g[j] * s;
        }
        *(uint4 *)(dgate + o) = vec_pack8(dg);
        *(uint4 *)(dup + o) = vec_pack8(du);
    }
}

/* ---------------------------------------------------------------- launchers */

static int check_args(const char *name, const void *a, const void *b, const void *c, const void *d, const void *e,
                      int T, int I, int stride) {
    if (T < 0 || I <= 0 || stride < I)
        return kernels_fail("%s: bad sizes T=%d I=%d in_stride=%d (need in_stride >= I)", name, T, I, stride);
    if (I % 8 || stride % 8) return kernels_fail("%s: I=%d and in_stride=%d must be multiples of 8", name, I, stride);
    if (!vec_aligned16(a) || !vec_aligned16(b) || !vec_aligned16(c) || (d && !vec_aligned16(d)) || (e && !vec_aligned16(e)))
        return kernels_fail("%s: pointers must be 16-byte aligned", name);
    return 0;
}

extern "C" int swiglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, int T, int I, int in_stride,
                              cudaStream_t stream) {
    if (check_args("swiglu_forward", out, gate, up, NULL, NULL, T, I, in_stride)) return -1;
    if (T == 0) return 0;
    size_t n = (size_t)T * (I / 8);
    swiglu_forward_kernel<<<vec_blocks(n, 256), 256, 0, stream>>>((uint4 *)out, gate, up, T, I / 8, in_stride);
    KERNELS_CHECK_LAUNCH("swiglu_forward");
    return 0;
}

extern "C" int swiglu_backward(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                               int T, int I, int in_stride, cudaStream_t stream) {
    if (check_args("swiglu_backward", dgate, dup, dout, gate, up, T, I, in_stride)) return -1;
    if (T == 0) return 0;
    size_t n = (size_t)T * (I / 8);
    swiglu_backward_kernel<<<vec_blocks(n, 256), 256, 0, stream>>>(dgate, dup, (const uint4 *)dout, gate, up, T, I / 8,
                                                                  in_stride);
    KERNELS_CHECK_LAUNCH("swiglu_backward");
    return 0;
}
