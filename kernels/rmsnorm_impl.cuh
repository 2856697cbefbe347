/*
 * kernels/rmsnorm_impl.cuh — the RMSNorm kernels, their device helpers and the launch helpers shared by
 * kernels/rmsnorm.cu (the library's entry points, kernels/rmsnorm.h) and kernels/bench/rmsnorm_bench.cu (with
 * its variants, kernels/bench/rmsnorm_variants.cuh). Defines no external symbol (templates, static functions and
 * kernels only), so the bench links the library's archive member for the entry points and no symbol is defined
 * twice. The paths, the scratch layout and why each is built this way: kernels/rmsnorm.cu's header comment.
 */
#ifndef KERNELS_RMSNORM_IMPL_CUH
#define KERNELS_RMSNORM_IMPL_CUH

#include "kernels/rmsnorm.h"
#include "kernels/vec.cuh"

#include <stdlib.h>
#include <string.h>

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
__global__ void rmsnorm_forward_twopass_kernel(bf16 *y, bf16 *resid, float *rstd, const bf16 *x, const float *w,
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
__global__ void rmsnorm_backward_twopass_kernel(bf16 *dx, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
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
static __global__ void rmsnorm_backward_dw_kernel(float *partial, const bf16 *dy, const bf16 *x, const float *rstd,
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

static __global__ void rmsnorm_backward_dw_reduce_kernel(float *dw, const float *partial, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int g = 0; g < chunks; g++) s += partial[(size_t)g * C + c];
    dw[c] += s;
}

/* ---------------------------------------------------------------- register-resident kernels (C <= 8192)
 *
 * A group of G threads (8..256, a power of two) owns a row and holds it in registers: lane l keeps
 * the 16-byte vectors c = l + k·G, k < V, so the row is read from DRAM once with V independent
 * 16-byte loads in flight per thread and never re-read. Groups wider than a warp finish their sum
 * through shared memory. The backward walks the rows with a fixed grid (block b takes row steps
 * b, b + grid, ...; the next step's x/dy are loaded before the current one is reduced) and, for dw,
 * keeps per-thread column sums in fp32, reduces the block's row groups in a fixed order into
 * partial [grid, C], and a second kernel adds the grid's partials in a fixed order: deterministic. */

/* Sum of v over the G lanes of a row group (all 256 threads of the block must call it; red holds
 * RMS_THREADS/32 floats and must not be rewritten before every thread has read it back). */
template <int G>
static __device__ __forceinline__ float rms_group_sum(float v, float *red) {
    if (G <= 32) return group_sum<G>(v);
    v = group_sum<32>(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    const float *g = red + (threadIdx.x / G) * (G / 32);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < G / 32; i++) s += g[i];   /* fixed order */
    return s;
}

static __device__ __forceinline__ void rms_load_w8(const float *w, int c, float *ww) {
    float4 w0 = __ldg((const float4 *)w + 2 * c), w1 = __ldg((const float4 *)w + 2 * c + 1);
    ww[0] = w0.x; ww[1] = w0.y; ww[2] = w0.z; ww[3] = w0.w;
    ww[4] = w1.x; ww[5] = w1.y; ww[6] = w1.z; ww[7] = w1.w;
}

template <int G, int V, bool RESID>
__global__ void __launch_bounds__(RMS_THREADS) rmsnorm_forward_kernel(bf16 *y, bf16 *resid, float *rstd, const bf16 *x,
                                                                     const float *w, int N, int C, float eps) {
    __shared__ float red[RMS_THREADS / 32];
    int row = blockIdx.x * (RMS_THREADS / G) + threadIdx.x / G, lane = threadIdx.x % G, C8 = C / 8;
    bool live = row < N;
    const uint4 *xr = (const uint4 *)(x + (size_t)row * C);
    uint4 *hr = (uint4 *)((RESID ? resid : (bf16 *)x) + (size_t)row * C);
    uint4 v[V], r[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        int c = lane + k * G;
        v[k] = r[k] = make_uint4(0, 0, 0, 0);
        if (live && c < C8) {
            v[k] = xr[c];
            if (RESID) r[k] = hr[c];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        float f[8];
        vec_unpack8(v[k], f);
        if (RESID) {
            float g[8];
            vec_unpack8(r[k], g);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] += g[j];
            v[k] = vec_pack8(f);
            if (live && lane + k * G < C8) hr[lane + k * G] = v[k];
            vec_unpack8(v[k], f);   /* normalise the rounded h that is stored (the backward sees it) */
        }
#pragma unroll
        for (int j = 0; j < 8; j++) ss += f[j] * f[j];
    }
    ss = rms_group_sum<G>(ss, red);
    if (!live) return;
    float rs = rsqrtf(ss / (float)C + eps);
    if (rstd && lane == 0) rstd[row] = rs;
    uint4 *yr = (uint4 *)(y + (size_t)row * C);
#pragma unroll
    for (int k = 0; k < V; k++) {
        int c = lane + k * G;
        if (c < C8) {
            float f[8], ww[8];
            vec_unpack8(v[k], f);
            rms_load_w8(w, c, ww);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = ww[j] * (f[j] * rs);
            yr[c] = vec_pack8(f);
        }
    }
}

/* K1c forward for row groups of G <= 32 lanes: block b owns rows b·RR·R .. +RR·R−1 (R = 256/G row
 * groups), group g the rows b·RR·R + g + i·R, i < RR (neighbouring groups read neighbouring rows);
 * every load of the RR rows is issued before the first reduction. y may alias x: a thread reads
 * every element it writes before writing it, and no other thread touches that element. */
template <int G, int V, bool RESID, int RR>
static __device__ __forceinline__ void rms_forward_rows(int blk, bf16 *y, bf16 *resid, float *rstd, const bf16 *x,
                                                        const float *w, int N, int C, float eps) {
    static_assert(G <= 32, "row groups of at most a warp: the group sum is shuffles only");
    constexpr int R = RMS_THREADS / G;
    const int grp = threadIdx.x / G, lane = threadIdx.x % G, C8 = C / 8;
    const int row0 = blk * (R * RR) + grp;
    uint4 v[RR][V], r[RR][V];
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const int row = row0 + i * R;
        const uint4 *xr = (const uint4 *)(x + (size_t)row * C);
        const uint4 *hr = (const uint4 *)((RESID ? resid : (bf16 *)x) + (size_t)row * C);
#pragma unroll
        for (int k = 0; k < V; k++) {
            int c = lane + k * G;
            v[i][k] = r[i][k] = make_uint4(0, 0, 0, 0);
            if (row < N && c < C8) {
                v[i][k] = xr[c];
                if (RESID) r[i][k] = hr[c];
            }
        }
    }
    float ww[V][8];
#pragma unroll
    for (int k = 0; k < V; k++) {
        int c = lane + k * G;
        if (c < C8) rms_load_w8(w, c, ww[k]);
        else
#pragma unroll
            for (int j = 0; j < 8; j++) ww[k][j] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < RR; i++) {
        const int row = row0 + i * R;
        const bool live = row < N;
        uint4 *hr = (uint4 *)((RESID ? resid : (bf16 *)x) + (size_t)row * C);
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++) {
            float f[8];
            vec_unpack8(v[i][k], f);
            if (RESID) {
                float g[8];
                vec_unpack8(r[i][k], g);
#pragma unroll
                for (int j = 0; j < 8; j++) f[j] += g[j];
                v[i][k] = vec_pack8(f);
                if (live && lane + k * G < C8) hr[lane + k * G] = v[i][k];
                vec_unpack8(v[i][k], f);   /* normalise the rounded h that is stored */
            }
#pragma unroll
            for (int j = 0; j < 8; j++) ss += f[j] * f[j];
        }
        ss = group_sum<G>(ss);   /* every lane of the warp takes part, live or not */
        if (!live) continue;
        const float rs = rsqrtf(ss / (float)C + eps);
        if (rstd && lane == 0) rstd[row] = rs;
        uint4 *yr = (uint4 *)(y + (size_t)row * C);
#pragma unroll
        for (int k = 0; k < V; k++) {
            int c = lane + k * G;
            if (c < C8) {
                float f[8];
                vec_unpack8(v[i][k], f);
#pragma unroll
                for (int j = 0; j < 8; j++) f[j] = ww[k][j] * (f[j] * rs);
                yr[c] = vec_pack8(f);
            }
        }
    }
}
template <int G, int V, bool RESID, int RR>
__global__ void __launch_bounds__(RMS_THREADS) rmsnorm_forward_rows_kernel(bf16 *y, bf16 *resid, float *rstd,
                                                                          const bf16 *x, const float *w, int N,
                                                                          int C, float eps) {
    rms_forward_rows<G, V, RESID, RR>(blockIdx.x, y, resid, rstd, x, w, N, C, eps);
}

/* The q/k norm's two tensors in one launch (rmsnorm_qk_forward): blocks [0, nb[0]) normalise tensor 0
 * (q) as a grid of nb[0] blocks of rmsnorm_forward_rows_kernel would, the rest tensor 1 (k). */
#define RMS_SEL(f) (t ? a.f[1] : a.f[0])   /* field f of tensor t of a two-tensor launch's arguments */
struct rms_qk_fwd_args {
    bf16 *y[2];
    float *rstd[2];
    const bf16 *x[2];
    const float *w[2];
    int N[2], nb[2];
};
template <int G, int V, int RR>
__global__ void __launch_bounds__(RMS_THREADS) rmsnorm_qk_forward_kernel(const rms_qk_fwd_args a, int C, float eps) {
    const bool t = (int)blockIdx.x >= a.nb[0];
    rms_forward_rows<G, V, false, RR>((int)blockIdx.x - (t ? a.nb[0] : 0), RMS_SEL(y), NULL, RMS_SEL(rstd), RMS_SEL(x),
                                      RMS_SEL(w), RMS_SEL(N), C, eps);
}

/* ---------------------------------------------------------------- the backward's dw sums across CTAs
 *
 * A row walk leaves one partial row of column sums per CTA in the scratch (partials [nb, C] after
 * RMS_SCR_HDR); they are added across CTAs by
 * - C <= RMS_LAST_MAX_C (q/k norm): the last CTA to finish, in the same kernel — every CTA writes its
 *   partial, fences, and takes a ticket from the counter in scratch[0]; the CTA holding the last
 *   ticket sums the partials (rms_dw_final) and resets the counter to 0 (so one zeroing at
 *   allocation lasts: rmsnorm.h);
 * - larger C: the many-slice kernel rmsnorm_backward_dw_sum_kernel, launched with PDL behind the
 *   row walk (the launch overlaps the walk's tail).
 * Both orders are fixed by (N, C), never by which CTA finished last: dw is bitwise repeatable. */

#define RMS_SCR_HDR 32          /* floats of scratch before the partials: [0] is the ticket counter */
#define RMS_LAST_MAX_C 256      /* dw summed by the last block up to this C, by a PDL kernel above */
#define RMS_SMS 132             /* SMs the grid is sized for (fixed: the summation order depends on N, C only) */

/* dw [4q .. 4q+3] = d + Σ_b partial [b, 4q ..] for the float4 columns q0 <= q < q0 + nq (nq <= THREADS),
 * by THREADS threads of a 1-D block, with red (THREADS float4 of shared memory); d is dw's old value
 * at q0 + t, loaded by the caller with rms_dw_old (ahead of time: one round trip off the tail).
 * All threads call. */
static __device__ __forceinline__ float4 rms_dw_old(const float *dw, int q0, int nq) {
    const int t = threadIdx.x;
    if (t >= nq) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float *d = dw + 4 * (size_t)(q0 + t);
    return make_float4(d[0], d[1], d[2], d[3]);
}
template <int THREADS>
static __device__ __forceinline__ void rms_dw_final(float *dw, float4 d, const float *partial, int nb, int C, int q0,
                                                    int nq, float4 *red) {
    const int t = threadIdx.x, S = THREADS / nq, j = t / nq, q = q0 + t % nq;
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (j < S) {
        const int b0 = (int)((long long)j * nb / S), b1 = (int)((long long)(j + 1) * nb / S);
        const float4 *p = (const float4 *)partial + q;
        const size_t stride = (size_t)C / 4;
        for (int b = b0; b < b1; b += 16) {
            float4 v[16];
#pragma unroll
            for (int u = 0; u < 16; u++)   /* all loads issued before the first add */
                v[u] = b + u < b1 ? __ldcg(p + (size_t)(b + u) * stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < 16; u++)
                if (b + u < b1) {
                    s.x += v[u].x; s.y += v[u].y; s.z += v[u].z; s.w += v[u].w;
                }
        }
    }
    red[t] = s;
    __syncthreads();
    /* the S slices: runs of 8 in order (thread (q, r) reads only its run's slots and writes the
     * first), then the runs in order */
    const int runs = (S + 7) / 8;
    if (t < nq * runs) {
        const int r = t / nq, c = t % nq, j0 = 8 * r, j1 = min(S, j0 + 8);
        float4 a = red[j0 * nq + c];
        for (int i = j0 + 1; i < j1; i++) {
            float4 v = red[i * nq + c];
            a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
        }
        red[j0 * nq + c] = a;
    }
    __syncthreads();
    if (t < nq) {
        float4 a = red[t];
        for (int r = 1; r < runs; r++) {
            float4 v = red[8 * r * nq + t];
            a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
        }
        float *o = dw + 4 * (size_t)q;
        o[0] = d.x + a.x; o[1] = d.y + a.y; o[2] = d.z + a.z; o[3] = d.w + a.w;
    }
}

/* The many-slice cross-block dw sum (the backward launches <4, 256> for C > RMS_LAST_MAX_C): many threads per
 * column and no shared-memory runs. CTA b owns the NQ float4 columns q0 = NQ·b .. +NQ−1 with S slices each (NQ·S
 * threads; thread t: column t % NQ, slice j = t / NQ). Slice j adds the partials of blocks j, j + S, j + 2S, ... in
 * that order, 4 loads in flight per round (nb <= 396, S = 128 or 256: 1 to 4 loads per thread, all issued before the
 * first add; C = 4096 with NQ = 4: 256 CTAs of 1024 threads, 2 per SM at <= 32 registers: the whole GPU's threads in
 * flight, not one CTA per SM). Then a fixed tree: butterfly shuffles over the 32/NQ slices a warp holds of each
 * column (xor NQ, 2NQ, .., 16), one float4 per (warp, column) to shared memory, one barrier, and warp c < NQ adds
 * column c's per-warp sums with a 32-lane butterfly (no shared-memory runs, two barriers fewer).
 * The order is a function of (nb, C) only: bitwise repeatable. dw's old value is read before
 * griddepcontrol.wait (the grid waited for never writes dw; a no-op when launched without PDL). */
template <int NQ, int S>
__global__ void __launch_bounds__(NQ * S, 2048 / (NQ * S))
    rmsnorm_backward_dw_sum_kernel(float *dw, const float *partial, int nb, int C) {
    static_assert(NQ * S <= 1024 && NQ * S >= 32 * NQ && 32 % NQ == 0, "NQ·S threads, at least NQ warps");
    constexpr int NW = NQ * S / 32;
    __shared__ float4 red[NW][NQ];
    const int t = threadIdx.x, col = t % NQ, j = t / NQ, warp = t / 32, lane = t % 32, C4 = C / 4;
    const int q = blockIdx.x * NQ + col;
    /* dw's old value: read before the wait (the grid waited for never writes dw) */
    const int qo = blockIdx.x * NQ + warp;   /* warp c < NQ writes column q0 + c */
    float4 d = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (warp < NQ && lane == 0 && qo < C4) {   /* scalar: dw need only be 4-byte aligned */
        const float *o = dw + 4 * (size_t)qo;
        d = make_float4(o[0], o[1], o[2], o[3]);
    }
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (q < C4) {
        const float4 *p = (const float4 *)partial + q;
        const size_t stride = (size_t)C4;
        for (int b = j; b < nb; b += 4 * S) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++)   /* all loads issued before the first add */
                v[u] = b + u * S < nb ? __ldcg(p + (size_t)(b + u * S) * stride) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (b + u * S < nb) {
                    s.x += v[u].x; s.y += v[u].y; s.z += v[u].z; s.w += v[u].w;
                }
        }
    }
#pragma unroll
    for (int o = NQ; o < 32; o <<= 1) {   /* the warp's slices of this column: fixed butterfly */
        s.x += __shfl_xor_sync(0xffffffffu, s.x, o);
        s.y += __shfl_xor_sync(0xffffffffu, s.y, o);
        s.z += __shfl_xor_sync(0xffffffffu, s.z, o);
        s.w += __shfl_xor_sync(0xffffffffu, s.w, o);
    }
    if (lane < NQ) red[warp][lane] = s;   /* lane = col here */
    __syncthreads();
    if (warp < NQ) {
        float4 a = lane < NW ? red[lane][warp] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            a.x += __shfl_xor_sync(0xffffffffu, a.x, o);
            a.y += __shfl_xor_sync(0xffffffffu, a.y, o);
            a.z += __shfl_xor_sync(0xffffffffu, a.z, o);
            a.w += __shfl_xor_sync(0xffffffffu, a.w, o);
        }
        if (lane == 0 && qo < C4) {
            float *o = dw + 4 * (size_t)qo;
            o[0] = d.x + a.x; o[1] = d.y + a.y; o[2] = d.z + a.z; o[3] = d.w + a.w;
        }
    }
}

/* How a row walk ends when DW (the fin argument). */
#define RMS_FIN_PDL 0    /* write the partials; the PDL kernel rmsnorm_backward_dw_sum_kernel sums them */
#define RMS_FIN_LAST 1   /* write the partials; the last block to finish (ticket) sums them */

/* ---------------------------------------------------------------- the register-resident backward (C <= 8192)
 *
 * Why: summing dw's columns in shared memory inside the row loop and storing one partial row per small row step
 * made dw cost ~14 µs over dx alone at 8192 × 4096 on the H200 (kernels/bench/RESULTS.md: the shared-memory
 * variant, v4 in kernels/bench/rmsnorm_variants.cuh). Here dw is nearly free in the loop and the partials are few:
 * - each thread owns fixed columns (row groups of G threads, lane l the 16-byte vectors c = l + k·G, k < V, from
 *   reg_shape(C/8, 2)) for every row its CTA walks, and keeps Σ dy·x̂ of those columns in fp32 registers
 *   (8·V floats); the weight is re-read from L1 (kept in registers too, the V = 2 kernels spilled at 128
 *   registers);
 * - a CTA of T threads holds NG = T/G row groups and takes R rows per group per row step (RS = NG·R rows:
 *   row = s·RS + i·NG + g), every load of the step issued before the first reduction; the R row sums are
 *   reduced together (shuffles for G <= 32; G > 32: one barrier per step for all R rows); the next step's
 *   loads are issued before this step is reduced;
 * - ~1-2 CTAs per SM, a balanced grid (every CTA the same number of steps ±1): one partial row per CTA
 *   (C = 4096: 264 or 132 partials, 4.3 or 2.1 MB); the CTA's NG row groups are summed once at the end through
 *   shared memory in a fixed order (a two-level fixed tree when C < T);
 * - the cross-CTA sum: C <= RMS_LAST_MAX_C the last CTA to finish (ticket, rms_dw_final); larger C the many-slice
 *   kernel rmsnorm_backward_dw_sum_kernel<4, 256>, launched with PDL.
 * dx: per-thread products in a fixed order (k, then j), a fixed shuffle tree and, for G > 32, an in-order sum of
 * the group's warp sums, with the shared-memory variant's expression: dx (and dx +=) is bitwise that variant's
 * (kernels/bench/rmsnorm_bench.cu compares them bit for bit).
 * dw: Σ over the thread's rows in row order, then the row groups in order, then the CTAs in the sum kernel's
 * order — a function of (N, C) only: bitwise repeatable.
 * Shape (rms_rows_shape; chosen by the measurements in kernels/bench/RESULTS.md): with dw T 512, 1 CTA/SM, R 2;
 * dx alone (dw NULL, no dw registers) T 256, 2/SM, R 2; V = 4 (C > 4096) always T 512, 1/SM, R 1 (its
 * 32 dw floats per thread leave no room for more rows; ptxas: 128 registers, 44 bytes of spill). ptxas (sm_90a):
 * the V <= 2 shapes use <= 128 registers, no spill.
 * The grid depends on (N, C, shape) only, never on the device: nb <= min(steps, 132 × CTAs/SM), within the
 * partial rows rmsnorm_backward_scratch_floats provides (RS >= 256/G).
 * rms_backward_rows is the body: CTA blk of nblk walking one tensor (the single kernel passes
 * blockIdx/gridDim, the q/k kernel its share of the grid). */
template <int G, int V, int R, int T, bool DW>
static __device__ __forceinline__ void rms_backward_rows(int blk, int nblk, bf16 *dx, float *dw, float *partial,
                                                      unsigned *ticket, const bf16 *dy, const bf16 *x, const float *w,
                                                      const float *rstd, int N, int C, int accumulate, int fin) {
    static_assert(T % G == 0 && T % 32 == 0 && (G <= 32 || G % 32 == 0), "whole row groups; groups > 32 lanes are whole warps");
    constexpr int NG = T / G, RS = NG * R, NW = T / 32;
    extern __shared__ float rms_rows_sacc[];   /* DW and NG > 1: [NG][C], the row groups' column sums */
    __shared__ float red[2][R][NW];
    if constexpr (DW)
        if (fin == RMS_FIN_PDL) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int grp = threadIdx.x / G, lane = threadIdx.x % G, C8 = C / 8, steps = (N + RS - 1) / RS;
    float acc[DW ? V : 1][8];
#pragma unroll
    for (int k = 0; k < (DW ? V : 1); k++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[k][j] = 0.0f;
    uint4 xv[R][V], gv[R][V];
    float rs[R];
    /* the loads of row step s (zeros past the end) */
    auto load = [&](int s, uint4 (&xo)[R][V], uint4 (&go)[R][V], float (&ro)[R]) {
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int row = s * RS + i * NG + grp;
            const bool live = s < steps && row < N;
            const uint4 *xr = (const uint4 *)(x + (size_t)row * C), *dyr = (const uint4 *)(dy + (size_t)row * C);
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int c = lane + k * G;
                xo[i][k] = go[i][k] = make_uint4(0, 0, 0, 0);
                if (live && c < C8) {
                    xo[i][k] = __ldg(xr + c);
                    go[i][k] = __ldg(dyr + c);
                }
            }
            ro[i] = live ? __ldg(rstd + row) : 0.0f;
        }
    };
    /* row i, chunk k (column chunk c) of the current step as floats: x, dy, and w (from L1) */
    auto unpack = [&](int i, int k, int c, float *xf, float *g, float *wl) {
        vec_unpack8(xv[i][k], xf);
        vec_unpack8(gv[i][k], g);
        rms_load_w8(w, c, wl);
    };
    load(blk, xv, gv, rs);
    int p = 0;
    for (int s = blk; s < steps; s += nblk) {   /* uniform trip count across the CTA */
        uint4 xn[R][V], gn[R][V];
        float rn[R];
        load(s + nblk, xn, gn, rn);   /* the next step's loads, in flight while this step is reduced */
        uint4 old[R][V];
#pragma unroll
        for (int i = 0; i < R; i++) {   /* dx +=: in flight while the statistics are reduced */
            const int row = s * RS + i * NG + grp;
            const uint4 *dxr = (const uint4 *)(dx + (size_t)row * C);
#pragma unroll
            for (int k = 0; k < V; k++) {
                old[i][k] = make_uint4(0, 0, 0, 0);
                if (accumulate && row < N && lane + k * G < C8) old[i][k] = dxr[lane + k * G];
            }
        }
        float m[R];
#pragma unroll
        for (int i = 0; i < R; i++) {
            m[i] = 0.0f;
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int c = lane + k * G;
                if (c < C8) {
                    float xf[8], g[8], wl[8];
                    unpack(i, k, c, xf, g, wl);
#pragma unroll
                    for (int j = 0; j < 8; j++) m[i] += wl[j] * g[j] * xf[j];   /* the shared-memory variant's order */
                }
            }
        }
        /* mean_c(w·dy·x̂) of the R rows: rms_group_sum's tree, one barrier for all R rows */
        if constexpr (G <= 32) {
#pragma unroll
            for (int i = 0; i < R; i++) m[i] = group_sum<G>(m[i]);
        } else {
#pragma unroll
            for (int i = 0; i < R; i++) m[i] = group_sum<32>(m[i]);
            if (threadIdx.x % 32 == 0)
#pragma unroll
                for (int i = 0; i < R; i++) red[p][i][threadIdx.x / 32] = m[i];
            __syncthreads();
#pragma unroll
            for (int i = 0; i < R; i++) {
                const float *gs = red[p][i] + grp * (G / 32);
                float t = 0.0f;
#pragma unroll
                for (int u = 0; u < G / 32; u++) t += gs[u];   /* fixed order, as rms_group_sum */
                m[i] = t;
            }
            p ^= 1;   /* red[p] is rewritten two steps on: the barrier between guards the readers */
        }
#pragma unroll
        for (int i = 0; i < R; i++) {
            const int row = s * RS + i * NG + grp;
            const bool live = row < N;
            const float mi = m[i] * rs[i] / (float)C, ri = rs[i];
            uint4 *dxr = (uint4 *)(dx + (size_t)row * C);
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int c = lane + k * G;
                if (c < C8 && live) {
                    float xf[8], g[8], wl[8], o[8];
                    unpack(i, k, c, xf, g, wl);
                    vec_unpack8(old[i][k], o);   /* zeros unless accumulating */
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        xf[j] *= ri;   /* x̂ */
                        o[j] += ri * wl[j] * g[j] - xf[j] * ri * mi;   /* the shared-memory variant's expression */
                    }
                    dxr[c] = vec_pack8(o);
                    if constexpr (DW)
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[DW ? k : 0][j] += g[j] * xf[j];   /* registers, row order */
                }
            }
        }
        {
#pragma unroll
            for (int i = 0; i < R; i++) {
#pragma unroll
                for (int k = 0; k < V; k++) {
                    xv[i][k] = xn[i][k];
                    gv[i][k] = gn[i][k];
                }
                rs[i] = rn[i];
            }
        }
    }
    if constexpr (DW) {
        __shared__ float4 fred[T];
        __shared__ unsigned last;
        float *out = partial + (size_t)blk * C;
        if constexpr (NG == 1) {   /* the thread's columns are the CTA's: straight to the partial row */
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int c = lane + k * G;
                if (c < C8) {
                    float4 *o = (float4 *)(out + 8 * (size_t)c);
                    o[0] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
                    o[1] = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
                }
            }
        } else {
            float *sg = rms_rows_sacc + (size_t)grp * C;
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int c = lane + k * G;
                if (c < C8) {
                    float4 *o = (float4 *)(sg + 8 * c);
                    o[0] = make_float4(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
                    o[1] = make_float4(acc[k][4], acc[k][5], acc[k][6], acc[k][7]);
                }
            }
            __syncthreads();
            if (C < T) {
                /* two levels, fixed order: thread (col, part) adds groups part, part + P, ... into group
                 * part's slot (only it reads those slots), then thread col adds the P slots in order */
                const int P = min(T / C, NG), col = threadIdx.x % C, part = threadIdx.x / C;
                if (part < P) {
                    float t = 0.0f;
                    for (int g = part; g < NG; g += P) t += rms_rows_sacc[(size_t)g * C + col];
                    rms_rows_sacc[(size_t)part * C + col] = t;
                }
                __syncthreads();
                if ((int)threadIdx.x < C) {
                    float t = 0.0f;
                    for (int q = 0; q < P; q++) t += rms_rows_sacc[(size_t)q * C + threadIdx.x];
                    out[threadIdx.x] = t;
                }
            } else
                for (int c = threadIdx.x; c < C; c += T) {
                    float t = 0.0f;
                    for (int g = 0; g < NG; g++) t += rms_rows_sacc[(size_t)g * C + c];   /* groups in order */
                    out[c] = t;
                }
        }
        if (fin != RMS_FIN_LAST) return;   /* RMS_FIN_PDL: rmsnorm_backward_dw_sum_kernel sums them */
        const float4 d = rms_dw_old(dw, 0, C / 4);   /* in flight during the ticket; used by the last CTA */
        __threadfence();   /* this CTA's partial is visible device-wide before its ticket is taken */
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == nblk - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        rms_dw_final<T>(dw, d, partial, nblk, C, 0, C / 4, fred);
        if (threadIdx.x == 0) *ticket = 0u;   /* ready for the next call */
    }
}

/* The single-tensor kernel: CTA b of the grid walks the tensor's rows. */
template <int G, int V, int R, int T, int MINB, bool DW>
__global__ void __launch_bounds__(T, MINB)
    rmsnorm_backward_rows_kernel(bf16 *dx, float *dw, float *partial, unsigned *ticket, const bf16 *dy, const bf16 *x,
                              const float *w, const float *rstd, int N, int C, int accumulate, int fin) {
    rms_backward_rows<G, V, R, T, DW>(blockIdx.x, gridDim.x, dx, dw, partial, ticket, dy, x, w, rstd, N, C,
                                             accumulate, fin);
}

/* The q/k norm's two tensors in one launch (rmsnorm_qk_backward): CTAs [0, nb[0]) walk tensor 0 (q) as
 * a grid of nb[0] CTAs would, CTAs [nb[0], nb[0] + nb[1]) tensor 1 (k); no CTA straddles, each tensor has
 * its own partials, ticket and last CTA (fin = RMS_FIN_LAST only: C <= RMS_LAST_MAX_C). The pointers
 * are picked before the one inlined body, so the registers are the single kernel's. */
struct rms_qk_bwd_args {
    bf16 *dx[2];
    float *dw[2], *partial[2];
    unsigned *ticket[2];
    const bf16 *dy[2], *x[2];
    const float *w[2], *rstd[2];
    int N[2], nb[2];
};
template <int G, int V, int R, int T, int MINB, bool DW>
__global__ void __launch_bounds__(T, MINB) rmsnorm_qk_backward_rows_kernel(const rms_qk_bwd_args a, int C,
                                                                        int accumulate) {
    const bool t = (int)blockIdx.x >= a.nb[0];
    rms_backward_rows<G, V, R, T, DW>((int)blockIdx.x - (t ? a.nb[0] : 0), RMS_SEL(nb), RMS_SEL(dx), RMS_SEL(dw),
                                              RMS_SEL(partial), RMS_SEL(ticket), RMS_SEL(dy), RMS_SEL(x), RMS_SEL(w),
                                              RMS_SEL(rstd), RMS_SEL(N), C, accumulate, RMS_FIN_LAST);
}

/* ---------------------------------------------------------------- launch helpers
 * (the library's launchers in kernels/rmsnorm.cu; the bench's in kernels/bench/rmsnorm_variants.cuh) */

#define RMS_REG_MAX_C 8192

/* Row group width G and vectors per lane V for C8 = C/8 16-byte vectors: the narrowest power-of-two
 * group (8..256) with at most vmax vectors per lane, then V rounded up to 1, 2 or 4 (G·V >= C8).
 * The forward takes vmax 4; the backward vmax 2. */
static void reg_shape(int C8, int vmax, int *G, int *V) {
    int g = 8;
    while (g < 256 && g * vmax < C8) g *= 2;
    int v = (C8 + g - 1) / g;
    *G = g;
    *V = v <= 1 ? 1 : v <= 2 ? 2 : 4;
}

#define RMS_DISPATCH(G_, V_, CALL)                                          \
    switch (G_ * 8 + V_) {                                                  \
    case 8 * 8 + 1: CALL(8, 1); break;     case 8 * 8 + 2: CALL(8, 2); break;     case 8 * 8 + 4: CALL(8, 4); break; \
    case 16 * 8 + 1: CALL(16, 1); break;   case 16 * 8 + 2: CALL(16, 2); break;   case 16 * 8 + 4: CALL(16, 4); break; \
    case 32 * 8 + 1: CALL(32, 1); break;   case 32 * 8 + 2: CALL(32, 2); break;   case 32 * 8 + 4: CALL(32, 4); break; \
    case 64 * 8 + 1: CALL(64, 1); break;   case 64 * 8 + 2: CALL(64, 2); break;   case 64 * 8 + 4: CALL(64, 4); break; \
    case 128 * 8 + 1: CALL(128, 1); break; case 128 * 8 + 2: CALL(128, 2); break; case 128 * 8 + 4: CALL(128, 4); break; \
    case 256 * 8 + 1: CALL(256, 1); break; case 256 * 8 + 2: CALL(256, 2); break; case 256 * 8 + 4: CALL(256, 4); break; \
    default: return kernels_fail("rmsnorm: no kernel for G=%d V=%d", G_, V_);                                   \
    }

static int check_args(const char *name, const void *a, const void *b, const void *c, int N, int C) {
    if (N < 0 || C <= 0 || C % 8 || C > 16384)
        return kernels_fail("%s: C=%d must be a positive multiple of 8 and <= 16384 (N=%d)", name, C, N);
    if (!vec_aligned16(a) || !vec_aligned16(b) || (c && !vec_aligned16(c)))
        return kernels_fail("%s: tensors and the weight must be 16-byte aligned", name);
    return 0;
}

static int dw_chunks(int N) {
    int c = (N + 31) / 32;
    return c < 1 ? 1 : c > 256 ? 256 : c;
}

/* Partial rows [P, C] the scratch of (N, C) holds: enough for every path, and for the bench's shared-memory
 * variant, which shares this scratch (kernels/bench/rmsnorm_variants.cuh): the two-pass dw chunks; one partial per
 * 256/G-row step up to 132 × 3 (V <= 2) or × 2 CTAs; the register-resident backward's nb <= min(its steps, 132 ×
 * CTAs per SM) <= that (its row step is >= 256/G rows, its cap <= 264); the q/k launch's per-tensor grids are
 * smaller still. Monotone in N. */
static size_t rms_partial_rows(int N, int C) {
    int a = dw_chunks(N), b = 0;
    if (C <= RMS_REG_MAX_C) {
        int G, V;
        reg_shape(C / 8, 2, &G, &V);
        int steps = (N + RMS_THREADS / G - 1) / (RMS_THREADS / G), cap = RMS_SMS * (V <= 2 ? 3 : 2);
        b = steps < 1 ? 1 : steps < cap ? steps : cap;
    }
    return (size_t)(a > b ? a : b);
}

/* The sum kernel for C > RMS_LAST_MAX_C, launched with PDL behind the row walk when pdl (the library
 * always; kernels/bench also times it without). */
static int rms_launch_sum(void (*kern)(float *, const float *, int, int), int grid, int threads, int pdl, cudaStream_t stream,
                          float *dw, const float *part, int nb, int C) {
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3((unsigned)grid);
    lc.blockDim = dim3((unsigned)threads);
    lc.dynamicSmemBytes = 0;
    lc.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = at;
    lc.numAttrs = pdl ? 1 : 0;   /* without: a plain launch (griddepcontrol.wait returns at once) */
    cudaError_t e = cudaLaunchKernelEx(&lc, kern, dw, part, nb, C);
    if (e != cudaSuccess) return kernels_fail("rmsnorm_backward (dw sum): %s", cudaGetErrorString(e));
    KERNELS_CHECK_LAUNCH("rmsnorm_backward (dw sum)");
    return 0;
}

/* dw's dynamic shared memory above the kernel's default limit, set once per kernel. The default is
 * 48 KB minus the kernel's static shared memory (fred[T] etc.: about 8 KB at T 512), not 48 KB: at
 * C = 5120 (V = 4, T 512, NG 2) the 40 KB of rms_rows_sacc fit 48 KB but not 48 KB - 8 KB, and the launch
 * failed with "invalid argument" (the 27B drafter). So the limit is asked of the kernel. */
template <auto kern>
static int rms_smem_optin(size_t smem) {
    static size_t done;
    if (smem == 0 || smem <= done) return 0;
    cudaFuncAttributes fa;
    cudaError_t e = cudaFuncGetAttributes(&fa, (const void *)kern);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kernels_fail("rmsnorm_backward: kernel attributes: %s", cudaGetErrorString(e));
    }
    if (smem <= (size_t)fa.maxDynamicSharedSizeBytes) {
        done = (size_t)fa.maxDynamicSharedSizeBytes;
        return 0;
    }
    e = cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kernels_fail("rmsnorm_backward: %zu bytes of shared memory refused: %s", smem, cudaGetErrorString(e));
    }
    done = smem;
    return 0;
}

/* The row walk's shape for (C, dw, dw_threads): threads T, rows per group per step R, CTAs per SM. With dw and
 * V <= 2 the CTA has dw_threads threads (the library: 512, 1 CTA per SM; kernels/bench also times 256, 2 per SM);
 * dx alone 256 threads, 2 per SM; V = 4 always 512, 1 per SM. */
static void rms_rows_shape(int C, bool dw, int dw_threads, int *G, int *V, int *T, int *R, int *per_sm) {
    reg_shape(C / 8, 2, G, V);
    *T = *V == 4 ? 512 : dw ? dw_threads : 256;
    *R = *V == 4 ? 1 : 2;
    *per_sm = *T == 512 ? 1 : 2;
}

static int check_bwd(const char *name, bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w, float *scratch,
                     int N, int C) {
    if (check_args(name, dx, dy, x, N, C)) return -1;
    if (!vec_aligned16(w)) return kernels_fail("%s: w must be 16-byte aligned", name);
    if (dx == dy || dx == x) return kernels_fail("%s: dx may not alias dy or x", name);
    if (dw && !scratch) return kernels_fail("%s: dw needs a scratch (rmsnorm.h)", name);
    if (dw && !vec_aligned16(scratch)) return kernels_fail("%s: scratch must be 16-byte aligned", name);
    return 0;
}

#endif /* KERNELS_RMSNORM_IMPL_CUH */
