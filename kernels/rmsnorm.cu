/*
 * kernels/rmsnorm.cu — RMSNorm forward (plain and fused residual) and backward (kernels/rmsnorm.h).
 *
 * Forward and dx: a group of G lanes (8, 16 or 32, chosen so short rows such as HD = 128 of the
 * q/k norm do not idle a warp) owns one row; pass 1 reduces the row's statistic with 16-byte loads
 * and shuffles, pass 2 re-reads the row (an L1/L2 hit: DRAM sees one read and one write) and
 * writes. Groups past the last row still run the shuffles, so every full-warp shuffle is legal.
 * dw: a column reduction, deterministic — each block sums a fixed chunk of rows for 64 columns in
 * a fixed order into scratch [chunks, C], and a second kernel adds the chunks in order into dw.
 */
#include "kernels/rmsnorm.h"
#include "kernels/vec.cuh"

#define RMS_THREADS 256

/* ---------------------------------------------------------------- kernels */

template <int G>
static __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* RESID: h = x + resid is formed, stored to resid (bf16) and normalised. */
template <int G, bool RESID>
__global__ void rmsnorm_forward_kernel(bf16 *y, bf16 *resid, float *rstd, const bf16 *x, const float *w,
                                       int N, int C, float eps) {
    int row = blockIdx.x * (RMS_THREADS / G) + threadIdx.x / G, lane = threadIdx.x % G, C8 = C / 8;
    bool live = row < N;
    const uint4 *xr = (const uint4 *)(x + (size_t)row * C);
    uint4 *hr = (uint4 *)((RESID ? resid : (bf16 *)x) + (size_t)row * C);
    float ss = 0.0f;
    if (live)
#pragma unroll 4
        for (int c = lane; c < C8; c += G) {
            float v[8];
            vec_unpack8(xr[c], v);
            if (RESID) {
                float r[8];
                vec_unpack8(hr[c], r);
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] += r[j];
                uint4 h = vec_pack8(v);
                hr[c] = h;
                vec_unpack8(h, v);   /* normalise the rounded h that is stored (the backward sees it) */
            }
#pragma unroll
            for (int j = 0; j < 8; j++) ss += v[j] * v[j];
        }
    ss = group_sum<G>(ss);
    if (!live) return;
    float rs = rsqrtf(ss / (float)C + eps);
    if (rstd && lane == 0) rstd[row] = rs;
    const uint4 *src = RESID ? (const uint4 *)hr : xr;
    uint4 *yr = (uint4 *)(y + (size_t)row * C);
#pragma unroll 4
    for (int c = lane; c < C8; c += G) {
        float v[8];
        vec_unpack8(src[c], v);
        float4 w0 = __ldg((const float4 *)w + 2 * c), w1 = __ldg((const float4 *)w + 2 * c + 1);
        float ww[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = ww[j] * (v[j] * rs);
        yr[c] = vec_pack8(v);
    }
}

template <int G>
__global__ void rmsnorm_backward_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                                        int N, int C, int accumulate) {
    int row = blockIdx.x * (RMS_THREADS / G) + threadIdx.x / G, lane = threadIdx.x % G, C8 = C / 8;
    bool live = row < N;
    const uint4 *xr = (const uint4 *)(x + (size_t)row * C), *dyr = (const uint4 *)(dy + (size_t)row * C);
    float rs = live ? rstd[row] : 0.0f, m = 0.0f;
    if (live)
#pragma unroll 4
        for (int c = lane; c < C8; c += G) {
            float xv[8], g[8];
            vec_unpack8(xr[c], xv);
            vec_unpack8(dyr[c], g);
            float4 w0 = __ldg((const float4 *)w + 2 * c), w1 = __ldg((const float4 *)w + 2 * c + 1);
            float ww[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
            for (int j = 0; j < 8; j++) m += ww[j] * g[j] * xv[j];
        }
    m = group_sum<G>(m) * rs / (float)C;   /* mean_c(w·dy·x̂) */
    if (!live) return;
    uint4 *dxr = (uint4 *)(dx + (size_t)row * C);
#pragma unroll 4
    for (int c = lane; c < C8; c += G) {
        float xv[8], g[8], o[8];
        vec_unpack8(xr[c], xv);
        vec_unpack8(dyr[c], g);
        float4 w0 = __ldg((const float4 *)w + 2 * c), w1 = __ldg((const float4 *)w + 2 * c + 1);
        float ww[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        if (accumulate) vec_unpack8(dxr[c], o);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float v = rs * (ww[j] * g[j] - xv[j] * rs * m);
            o[j] = accumulate ? o[j] + v : v;
        }
        dxr[c] = vec_pack8(o);
    }
}

/* Block (cx, g): columns 64·cx .. +63, rows of chunk g; partial[g, c] = Σ_rows dy·x·rstd. */
__global__ void rmsnorm_backward_dw_kernel(float *partial, const bf16 *dy, const bf16 *x, const float *rstd,
                                           int N, int C, int rows_per_chunk) {
    __shared__ float red[32][65];
    int tx = threadIdx.x % 8, ty = threadIdx.x / 8, c8 = blockIdx.x * 8 + tx, C8 = C / 8;
    int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c8 < C8)
        for (int r = r0 + ty; r < r1; r += 32) {
            float xv[8], g[8], rs = __ldg(rstd + r);
            vec_unpack8(__ldg((const uint4 *)(x + (size_t)r * C) + c8), xv);
            vec_unpack8(__ldg((const uint4 *)(dy + (size_t)r * C) + c8), g);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += g[j] * (xv[j] * rs);
        }
#pragma unroll
    for (int j = 0; j < 8; j++) red[ty][tx * 8 + j] = acc[j];
    __syncthreads();
    if (threadIdx.x < 64) {
        int c = blockIdx.x * 64 + threadIdx.x;
        float s = 0.0f;
        for (int k = 0; k < 32; k++) s += red[k][threadIdx.x];   /* fixed order: deterministic */
        if (c < C) partial[(size_t)blockIdx.y * C + c] = s;
    }
}

__global__ void rmsnorm_backward_dw_reduce_kernel(float *dw, const float *partial, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int g = 0; g < chunks; g++) s += partial[(size_t)g * C + c];
    dw[c] += s;
}

/* ---------------------------------------------------------------- launchers */

static int check_args(const char *name, const void *a, const void *b, const void *c, int N, int C) {
    if (N < 0 || C <= 0 || C % 8 || C > 16384)
        return kernels_fail("%s: C=%d must be a positive multiple of 8 and <= 16384 (N=%d)", name, C, N);
    if (!vec_aligned16(a) || !vec_aligned16(b) || (c && !vec_aligned16(c)))
        return kernels_fail("%s: tensors and the weight must be 16-byte aligned", name);
    return 0;
}

template <bool RESID>
static int forward_launch(const char *name, bf16 *y, bf16 *resid, float *rstd, const bf16 *x, const float *w,
                          int N, int C, float eps, cudaStream_t stream) {
    if (check_args(name, y, x, resid, N, C)) return -1;
    if (!vec_aligned16(w)) return kernels_fail("%s: w must be 16-byte aligned", name);
    if (N == 0) return 0;
    int C8 = C / 8;
    if (C8 >= 32)
        rmsnorm_forward_kernel<32, RESID><<<(N + 7) / 8, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps);
    else if (C8 >= 16)
        rmsnorm_forward_kernel<16, RESID><<<(N + 15) / 16, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps);
    else
        rmsnorm_forward_kernel<8, RESID><<<(N + 31) / 32, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps);
    KERNELS_CHECK_LAUNCH(name);
    return 0;
}

extern "C" int rmsnorm_forward(bf16 *y, float *rstd, const bf16 *x, const float *w, int N, int C, float eps,
                               cudaStream_t stream) {
    return forward_launch<false>("rmsnorm_forward", y, NULL, rstd, x, w, N, C, eps, stream);
}

extern "C" int rmsnorm_residual_forward(bf16 *y, bf16 *resid, float *rstd, const bf16 *x, const float *w,
                                        int N, int C, float eps, cudaStream_t stream) {
    if (!resid) return kernels_fail("rmsnorm_residual_forward: resid must not be NULL");
    return forward_launch<true>("rmsnorm_residual_forward", y, resid, rstd, x, w, N, C, eps, stream);
}

static int dw_chunks(int N) {
    int c = (N + 31) / 32;
    return c < 1 ? 1 : c > 256 ? 256 : c;
}

extern "C" size_t rmsnorm_backward_scratch_floats(int N, int C) { return (size_t)dw_chunks(N) * (C > 0 ? C : 0); }

extern "C" int rmsnorm_backward(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w,
                                const float *rstd, float *scratch, int N, int C, int accumulate_dx,
                                cudaStream_t stream) {
    if (check_args("rmsnorm_backward", dx, dy, x, N, C)) return -1;
    if (!vec_aligned16(w)) return kernels_fail("rmsnorm_backward: w must be 16-byte aligned");
    if (dx == dy || dx == x) return kernels_fail("rmsnorm_backward: dx may not alias dy or x");
    if (dw && !scratch) return kernels_fail("rmsnorm_backward: dw needs a scratch of rmsnorm_backward_scratch_floats() floats");
    if (N == 0) return 0;
    int C8 = C / 8;
    if (C8 >= 32)
        rmsnorm_backward_kernel<32><<<(N + 7) / 8, RMS_THREADS, 0, stream>>>(dx, dy, x, w, rstd, N, C, accumulate_dx);
    else if (C8 >= 16)
        rmsnorm_backward_kernel<16><<<(N + 15) / 16, RMS_THREADS, 0, stream>>>(dx, dy, x, w, rstd, N, C, accumulate_dx);
    else
        rmsnorm_backward_kernel<8><<<(N + 31) / 32, RMS_THREADS, 0, stream>>>(dx, dy, x, w, rstd, N, C, accumulate_dx);
    KERNELS_CHECK_LAUNCH("rmsnorm_backward");
    if (dw) {
        int chunks = dw_chunks(N), rows = (N + chunks - 1) / chunks;
        dim3 grid((C8 + 7) / 8, chunks);
        rmsnorm_backward_dw_kernel<<<grid, 256, 0, stream>>>(scratch, dy, x, rstd, N, C, rows);
        KERNELS_CHECK_LAUNCH("rmsnorm_backward (dw partials)");
        rmsnorm_backward_dw_reduce_kernel<<<(C + 255) / 256, 256, 0, stream>>>(dw, scratch, chunks, C);
        KERNELS_CHECK_LAUNCH("rmsnorm_backward (dw reduce)");
    }
    return 0;
}
