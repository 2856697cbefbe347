/*
 * kernels/adamw.cu — AdamW step and global grad sum of squares on the device (kernels/adamw.h).
 *
 * Both are bandwidth-bound streams: the step reads grad, master, m, v (16 B) and writes master, m, v,
 * copy (14 B) per element, with float4 loads where the pointers allow; the sum of squares reads 4 B
 * per element with float4 loads after a scalar head up to the first 16-byte boundary. The clip factor
 * is computed per block from the device sumsq, so nothing waits for the host.
 */
#include "kernels/adamw.h"

#include <cuda_bf16.h>

/* ---------------------------------------------------------------- kernels */

/* Sum of squares: 16-byte loads, four independent loads in flight per thread (the stream is latency
 * bound with one scalar load per iteration: 61% of bandwidth), the unaligned head (< 4 elements) and
 * the tail (< 4) done by the first threads; one atomic per block. */
__global__ void adamw_grad_sumsq_kernel(const float *grad, size_t n, float *sumsq) {
    size_t head = ((16 - ((uintptr_t)grad & 15)) & 15) / 4;   /* floats before the first 16-byte boundary */
    if (head > n) head = n;
    const float4 *g4 = reinterpret_cast<const float4 *>(grad + head);
    const size_t n4 = (n - head) / 4, stride = (size_t)gridDim.x * blockDim.x;
    const size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
    size_t i = t;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        float4 a = __ldcs(g4 + i), b = __ldcs(g4 + i + stride), c = __ldcs(g4 + i + 2 * stride),
               d = __ldcs(g4 + i + 3 * stride);
        s0 += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
        s1 += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
        s2 += c.x * c.x + c.y * c.y + c.z * c.z + c.w * c.w;
        s3 += d.x * d.x + d.y * d.y + d.z * d.z + d.w * d.w;
    }
    for (; i < n4; i += stride) {
        float4 a = __ldcs(g4 + i);
        s0 += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
    const size_t tail0 = head + n4 * 4;
    if (t < head) s1 += grad[t] * grad[t];
    if (t < n - tail0) s2 += grad[tail0 + t] * grad[tail0 + t];
    float s = (s0 + s1) + (s2 + s3);
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

/* The multi-tensor step: block b runs chunk b of the table (see adamw.h). */
__global__ void adamw_step_multi_kernel(const adamw_tensor *tensors, const adamw_chunk *chunks, float b1, float b2,
                                        float eps, float step_size, float bc2_sqrt, float decay, float max_norm,
                                        const double *sumsq) {
    float clip = 1.0f;
    if (sumsq && max_norm > 0) {
        double c = (double)max_norm / (sqrt(*sumsq) + 1e-6);
        clip = c < 1.0 ? (float)c : 1.0f;
    }
    const adamw_chunk ch = chunks[blockIdx.x];
    const adamw_tensor t = tensors[ch.tensor];
    float *master = t.master + ch.start, *m = t.m + ch.start, *v = t.v + ch.start;
    const float *grad = t.grad + ch.start;
    __nv_bfloat16 *copy = t.copy ? (__nv_bfloat16 *)t.copy + ch.start : NULL;
    int i0 = 0;
    if (t.vec4) {
        const int n4 = ch.len / 4;
        for (int i = threadIdx.x; i < n4; i += blockDim.x) {
            float4 w = ((float4 *)master)[i], mm = ((float4 *)m)[i], vv = ((float4 *)v)[i];
            float4 g = __ldcs((const float4 *)grad + i);
            adamw_one(w.x, mm.x, vv.x, g.x, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            adamw_one(w.y, mm.y, vv.y, g.y, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            adamw_one(w.z, mm.z, vv.z, g.z, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            adamw_one(w.w, mm.w, vv.w, g.w, clip, decay, b1, b2, step_size, bc2_sqrt, eps);
            ((float4 *)master)[i] = w; ((float4 *)m)[i] = mm; ((float4 *)v)[i] = vv;
            if (copy) {
                ((__nv_bfloat162 *)copy)[2 * i] = __floats2bfloat162_rn(w.x, w.y);
                ((__nv_bfloat162 *)copy)[2 * i + 1] = __floats2bfloat162_rn(w.z, w.w);
            }
        }
        i0 = n4 * 4;
    }
    for (int i = i0 + (int)threadIdx.x; i < ch.len; i += blockDim.x) {
        float w = master[i];
        adamw_one(w, m[i], v[i], grad[i], clip, decay, b1, b2, step_size, bc2_sqrt, eps);
        master[i] = w;
        if (copy) copy[i] = __float2bfloat16_rn(w);
    }
}

/* ---------------------------------------------------------------- launchers */

extern "C" int64_t adamw_multi_chunks(const adamw_tensor *t, int n) {
    int64_t c = 0;
    for (int i = 0; i < n; i++) c += (t[i].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
    return c;
}

extern "C" int64_t adamw_multi_plan(adamw_tensor *t, int n, adamw_chunk *chunks, int64_t cap) {
    int64_t c = 0;
    for (int i = 0; i < n; i++) {
        if (!t[i].master || !t[i].m || !t[i].v || !t[i].grad)
            return kernels_fail("adamw_multi_plan: tensor %d has a NULL device pointer", i);
        if (t[i].n < 0) return kernels_fail("adamw_multi_plan: tensor %d has %lld elements", i, (long long)t[i].n);
        uintptr_t a = (uintptr_t)t[i].master | (uintptr_t)t[i].m | (uintptr_t)t[i].v | (uintptr_t)t[i].grad;
        t[i].vec4 = (a % 16) == 0 && (!t[i].copy || ((uintptr_t)t[i].copy % 8) == 0);
        for (int64_t s = 0; s < t[i].n; s += ADAMW_CHUNK) {
            if (c >= cap) return kernels_fail("adamw_multi_plan: more than %lld chunks", (long long)cap);
            int64_t len = t[i].n - s < ADAMW_CHUNK ? t[i].n - s : ADAMW_CHUNK;
            chunks[c++] = adamw_chunk{i, (int32_t)len, s};
        }
    }
    return c;
}

extern "C" int adamw_step_multi(const adamw_tensor *d_tensors, const adamw_chunk *d_chunks, int64_t n_chunks,
                                const adamw_params *p, const double *d_sumsq, cudaStream_t stream) {
    if (p->step < 1 || !(p->lr >= 0))
        return kernels_fail("adamw_step_multi: need step >= 1 and lr >= 0, got step=%d lr=%g", p->step, p->lr);
    if (n_chunks == 0) return 0;
    if (!d_tensors || !d_chunks || n_chunks < 0 || n_chunks > 0x7fffffff)
        return kernels_fail("adamw_step_multi: bad table (%lld chunks)", (long long)n_chunks);
    /* host-side constants in float, exactly as adamw_step_ref computes them */
    float bc1 = 1.0f - powf(p->beta1, (float)p->step);
    float bc2_sqrt = sqrtf(1.0f - powf(p->beta2, (float)p->step));
    float step_size = p->lr / bc1;
    float decay = 1.0f - p->lr * p->weight_decay;
    adamw_step_multi_kernel<<<(unsigned)n_chunks, 256, 0, stream>>>(d_tensors, d_chunks, p->beta1, p->beta2, p->eps,
                                                                    step_size, bc2_sqrt, decay, p->max_norm, d_sumsq);
    KERNELS_CHECK_LAUNCH("adamw_step_multi_kernel");
    return 0;
}


static int adamw_grid(size_t work) {
    size_t g = (work + 255) / 256;
    return (int)(g < 1 ? 1 : g > 132 * 16 ? 132 * 16 : g);
}

extern "C" int adamw_grad_sumsq(const float *d_grad, size_t n, float *d_sumsq, cudaStream_t stream) {
    if (!d_grad || !d_sumsq) return kernels_fail("adamw_grad_sumsq: NULL device pointer");
    if (n == 0) return 0;
    /* 8 blocks of 256 per SM are enough loads in flight; at least 1 block for the head/tail */
    size_t blocks = (n / 4 + 1023) / 1024;
    blocks = blocks < 1 ? 1 : blocks > 132 * 8 ? 132 * 8 : blocks;
    adamw_grad_sumsq_kernel<<<(unsigned)blocks, 256, 0, stream>>>(d_grad, n, d_sumsq);
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
