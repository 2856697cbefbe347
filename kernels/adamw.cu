/*
 * kernels/adamw.cu — AdamW step and global grad sum of squares on the device (kernels/adamw.h).
 *
 * Both are bandwidth-bound streams: the step reads grad, master, m, v (16 B) and writes master, m, v,
 * copy (14 B) per element, with float4 loads where the pointers allow. The clip factor is computed
 * per block from the device sumsq, so nothing waits for the host.
 */
#include "kernels/adamw.h"

#include <cuda_bf16.h>

/* ---------------------------------------------------------------- kernels */

__global__ void adamw_grad_sumsq_kernel(const float *grad, size_t n, float *sumsq) {
    float s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += grad[i] * grad[i];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __shared__ float part[32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0;
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) atomicAdd(sumsq, s);
    }
}

__device__ __forceinline__ float adamw_one(float &w, float &m, float &v, float g, float clip, float decay,
                                           float b1, float b2, float step_size, float bc2_sqrt, float eps) {
    g *= clip;
    float ww = w * decay;
    float mi = b1 * m + (1.0f - b1) * g;
    float vi = b2 * v + (1.0f - b2) * g * g;
    ww -= step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    w = ww; m = mi; v = vi;
    return ww;
}

__global__ void adamw_step_kernel(float *master, float *m, float *v, const float *grad, __nv_bfloat16 *copy,
                                  size_t n, float b1, float b2, float eps, float step_size, float bc2_sqrt,
                                  float decay, float max_norm, const float *sumsq, int vec4) {
    float clip = 1.0f;
    if (sumsq && max_norm > 0) {
        /* same formula as adamw_clip_factor, in double like the reference */
        double c = (double)max_norm / (sqrt((double)*sumsq) + 1e-6);
        clip = c < 1.0 ? (float)c : 1.0f;
    }
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (vec4) {
        size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 w = ((float4 *)master)[i], mm = ((float4 *)m)[i], vv = ((float4 *)v)[i];
            float4 g = ((const float4 *)grad)[i];
            adamw_one(w.x, mm.x, vv.x, g.x, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            adamw_one(w.y, mm.y, vv.y, g.y, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            adamw_one(w.z, mm.z, vv.z, g.z, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            adamw_one(w.w, mm.w, vv.w, g.w, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            ((float4 *)master)[i] = w; ((float4 *)m)[i] = mm; ((float4 *)v)[i] = vv;
            if (copy) {
                __nv_bfloat162 lo = __floats2bfloat162_rn(w.x, w.y), hi = __floats2bfloat162_rn(w.z, w.w);
                ((__nv_bfloat162 *)copy)[2 * i] = lo;
                ((__nv_bfloat162 *)copy)[2 * i + 1] = hi;
            }
        }
        if (blockIdx.x != 0) return;
        stride = blockDim.x;
        i0 = n4 * 4 + threadIdx.x;
    }
    for (size_t i = i0; i < n; i += stride) {
        float w = master[i];
        adamw_one(w, m[i], v[i], grad[i], clip, decay, b1, b2, step_size, bc2_sqrt, eps);
        master[i] = w;
        if (copy) copy[i] = __float2bfloat16_rn(w);
    }
}

/* ---------------------------------------------------------------- launchers */

static int adamw_grid(size_t work) {
    size_t g = (work + 255) / 256;
    return (int)(g < 1 ? 1 : g > 132 * 16 ? 132 * 16 : g);
}

extern "C" int adamw_grad_sumsq(const float *d_grad, size_t n, float *d_sumsq, cudaStream_t stream) {
    if (!d_grad || !d_sumsq) return kernels_fail("adamw_grad_sumsq: NULL device pointer");
    if (n == 0) return 0;
    adamw_grad_sumsq_kernel<<<adamw_grid(n), 256, 0, stream>>>(d_grad, n, d_sumsq);
    KERNELS_CHECK_LAUNCH("adamw_grad_sumsq_kernel");
    return 0;
}

extern "C" int adamw_step(float *d_master, float *d_m, float *d_v, const float *d_grad, bf16 *d_copy, size_t n,
                          const adamw_params *p, const float *d_sumsq, cudaStream_t stream) {
    if (p->step < 1 || !(p->lr >= 0))
        return kernels_fail("adamw_step: need step >= 1 and lr >= 0, got step=%d lr=%g", p->step, p->lr);
    if (!d_master || !d_m || !d_v || !d_grad) return kernels_fail("adamw_step: NULL device pointer");
    if (n == 0) return 0;
    /* host-side constants in float, exactly as adamw_step_ref computes them */
    float bc1 = 1.0f - powf(p->beta1, (float)p->step);
    float bc2_sqrt = sqrtf(1.0f - powf(p->beta2, (float)p->step));
    float step_size = p->lr / bc1;
    float decay = 1.0f - p->lr * p->weight_decay;
    uintptr_t a = (uintptr_t)d_master | (uintptr_t)d_m | (uintptr_t)d_v | (uintptr_t)d_grad;
    int vec4 = (a % 16) == 0 && (!d_copy || ((uintptr_t)d_copy % 8) == 0);
    adamw_step_kernel<<<adamw_grid(vec4 ? n / 4 : n), 256, 0, stream>>>(
        d_master, d_m, d_v, d_grad, (__nv_bfloat16 *)d_copy, n, p->beta1, p->beta2, p->eps, step_size, bc2_sqrt,
        decay, p->max_norm, d_sumsq, vec4);
    KERNELS_CHECK_LAUNCH("adamw_step_kernel");
    return 0;
}
