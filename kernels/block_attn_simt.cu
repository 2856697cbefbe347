/*
 * kernels/block_attn_simt.cu — DFlash anchored block attention, forward and backward, in plain fp32 SIMT code
 * (no tensor cores): the kernels kernels/block_attn.cu runs for the shapes the wgmma kernels do not take
 * (d_h 16, 32, 256, or (n_h/n_kv)·B > 64). Correctness over speed: simple loops that follow
 * kernels/block_attn_ref.c, fp32 arithmetic on bf16 inputs (more precise than the wgmma kernels, which round
 * P and dS to bf16), deterministic (no atomics).
 *
 * Thread layout (all kernels, 256 threads): TPR lanes own one query row (or one key) — TPR = 4, or d_h/32 for
 * d_h >= 128 — and lane u of the group holds dims 4·(u + TPR·c) .. +3 for c < d_h/(4·TPR) in registers; a dot
 * product is TPR partial sums added by an xor butterfly (every lane of the group gets the same bits: fp32
 * addition commutes). Shared tiles are fp32 [rows][d_h]; the group's float4 reads are contiguous and the
 * groups of a warp read the same addresses (broadcast), so they are free of bank conflicts.
 *
 * Forward (grid N × n_kv × row tiles): rows r of one (block b, kv head g): head g·G + r/B, slot r % B (the
 * wgmma kernels' layout), RT = 256/TPR rows per CTA. The CTA scans the anchor's window for the first and last
 * key of its document (ba_doc_span), then streams K/V tiles of 32 keys through shared memory: context keys
 * of that span (masked per key by doc id), then the block's own B keys (causal: slot j' <= j). Online
 * softmax in base 2 in fp32 registers (exp2f), lse stored in natural log.
 * Backward, three kernels in stream order:
 *   1. Di = rowsum(dO ⊙ O) per (head, row) into the first n_h·N·B floats of dq (ba_di_kernel);
 *   2. dK, dV (grid (context tiles + block tiles) × n_kv): the CTA holds 256/TPR keys in registers — a tile
 *      of context keys, or of one block's own keys — and visits, in block order, every block that sees one
 *      of them (a range test, then __syncthreads_or on the per-key test), streaming that block's G·B query
 *      rows (q, dO, lse, Di) through shared memory 16 at a time: dV += P·dO, dK += dS·q·scale;
 *   3. dQ (the forward's grid and tiles): Di recomputed per row from out and dout, dQ = Σ dS·K·scale;
 *      it overwrites dq (the scratch of kernel 1, no longer read) after kernel 2 has finished.
 * dS = P ⊙ (dP − Di), P = exp2(s·scale·log2 e − lse·log2 e) recomputed from the forward's lse.
 */
#include "kernels/block_attn_simt.h"
#include "kernels/block_attn_common.cuh"
#include "kernels/vec.cuh"

#include <cuda_bf16.h>
#include <math.h>

namespace {

constexpr int BS_NT = 256;   /* threads per CTA */
constexpr int BS_KT = 32;    /* keys per shared K/V tile (forward, dQ) */
constexpr int BS_RC = 16;    /* query rows per staged chunk (dK/dV) */
constexpr float BS_LOG2E = 1.4426950408889634f;

template <int D> struct bs_shape {
    static constexpr int TPR = D >= 128 ? D / 32 : 4;   /* lanes per row or key */
    static constexpr int DPT = D / TPR;                 /* dims per lane */
    static constexpr int NC = DPT / 4;                  /* float4 chunks per lane */
    static constexpr int RT = BS_NT / TPR;              /* rows (keys) per CTA */
    static_assert(D % (4 * TPR) == 0 && 32 % TPR == 0, "block_attn_simt: unsupported d_h");
};

/* the column of lane u's chunk c */
template <int D>
__device__ __forceinline__ int bs_col(int u, int c) { return 4 * (u + bs_shape<D>::TPR * c); }

/* lane u's dims of one bf16 row into fp32 registers (8-byte loads) */
template <int D>
__device__ __forceinline__ void bs_load_row(float *x, const __nv_bfloat16 *src, int u) {
#pragma unroll
    for (int c = 0; c < bs_shape<D>::NC; c++) {
        const uint2 w = *reinterpret_cast<const uint2 *>(src + bs_col<D>(u, c));
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w.x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w.y));
        x[4 * c] = a.x; x[4 * c + 1] = a.y; x[4 * c + 2] = b.x; x[4 * c + 3] = b.y;
    }
}

/* Σ over the TPR lanes of a group (xor butterfly: the same bits in every lane) */
template <int TPR>
__device__ __forceinline__ float bs_sum(float x) {
#pragma unroll
    for (int o = TPR / 2; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* lane u's partial dot of registers x with the fp32 shared row s */
template <int D>
__device__ __forceinline__ float bs_dot(const float *x, const float *s, int u) {
    float acc = 0.f;
#pragma unroll
    for (int c = 0; c < bs_shape<D>::NC; c++) {
        const float4 y = *reinterpret_cast<const float4 *>(s + bs_col<D>(u, c));
        acc = fmaf(x[4 * c], y.x, acc);
        acc = fmaf(x[4 * c + 1], y.y, acc);
        acc = fmaf(x[4 * c + 2], y.z, acc);
        acc = fmaf(x[4 * c + 3], y.w, acc);
    }
    return acc;
}

/* acc += w · (lane u's dims of the fp32 shared row s) */
template <int D>
__device__ __forceinline__ void bs_axpy(float *acc, float w, const float *s, int u) {
#pragma unroll
    for (int c = 0; c < bs_shape<D>::NC; c++) {
        const float4 y = *reinterpret_cast<const float4 *>(s + bs_col<D>(u, c));
        acc[4 * c] = fmaf(w, y.x, acc[4 * c]);
        acc[4 * c + 1] = fmaf(w, y.y, acc[4 * c + 1]);
        acc[4 * c + 2] = fmaf(w, y.z, acc[4 * c + 2]);
        acc[4 * c + 3] = fmaf(w, y.w, acc[4 * c + 3]);
    }
}

/* 8 bf16 at src (or zeros when !ok) -> 8 fp32 at dst (shared) */
__device__ __forceinline__ void bs_stage8(float *dst, const __nv_bfloat16 *src, bool ok) {
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (ok) vec_unpack8(*reinterpret_cast<const uint4 *>(src), f);
    reinterpret_cast<float4 *>(dst)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4 *>(dst)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

/* The keys one (block b, kv head g) CTA visits: context keys [*lo, *hi] of the anchor's document inside its
 * window (empty when *hi < *lo), found by a scan of the window by all threads; returns the anchor's doc id. */
__device__ __forceinline__ int bs_span(const block_attn_config &c, const int32_t *anchors, const int32_t *doc_ids, int b,
                                       int *lo, int *hi) {
    __shared__ int sLo, sHi, sCnt;
    const int a = anchors[b], dd = doc_ids[a];
    const int wlo = c.window > 0 ? max(0, a - c.window) : 0;
    if (threadIdx.x == 0) { sLo = a; sHi = wlo - 1; sCnt = 0; }
    __syncthreads();
    if (dd != -1) ba_doc_span<BS_NT, false, int>(doc_ids, wlo, a, dd, (int)threadIdx.x, threadIdx.x % 32 == 0, &sLo,
                                                 &sHi, &sCnt);
    __syncthreads();
    *lo = sLo;
    *hi = sHi;
    return dd;
}

/* K and V tile t of the CTA's key walk into shared fp32 sK/sV [BS_KT][D]: context tiles from clo (keys <= chi)
 * first, then the block's own keys; sValid[i] = key i exists (context: and belongs to document dd), sSlot[i] =
 * its slot in the block (block tiles) or -1. Between two __syncthreads, by all threads. */
template <int D>
__device__ __forceinline__ void bs_load_kv(float *sK, float *sV, int *sValid, int *sSlot, const block_attn_config &c,
                                           const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *doc_ids,
                                           int b, int g, int t, int nctx, int clo, int chi, int dd) {
    const bool blk = t >= nctx;
    const int base = blk ? (t - nctx) * BS_KT : clo + t * BS_KT;
    for (int i = threadIdx.x; i < BS_KT * (D / 8); i += BS_NT) {
        const int kr = i / (D / 8), cc = i % (D / 8);
        bool ok;
        size_t row;
        if (!blk) { ok = base + kr <= chi; row = (size_t)min(base + kr, chi); }
        else { ok = base + kr < c.B; row = (size_t)c.T + (size_t)b * c.B + min(base + kr, c.B - 1); }
        const size_t off = (row * c.n_kv + g) * D + cc * 8;
        bs_stage8(sK + kr * D + cc * 8, k + off, ok);
        bs_stage8(sV + kr * D + cc * 8, v + off, ok);
    }
    if (threadIdx.x < BS_KT) {
        const int kr = threadIdx.x;
        if (!blk) {
            sValid[kr] = base + kr <= chi && doc_ids[base + kr] == dd;
            sSlot[kr] = -1;
        } else {
            sValid[kr] = base + kr < c.B;
            sSlot[kr] = base + kr;
        }
    }
}

/* ---------------------------------------------------------------- kernels */

template <int D>
__global__ void __launch_bounds__(BS_NT)
bs_forward_kernel(block_attn_config c, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                  const int32_t *anchors, const int32_t *doc_ids, __nv_bfloat16 *out, float *lse) {
    using S = bs_shape<D>;
    extern __shared__ __align__(16) float bs_smem[];
    float *sK = bs_smem, *sV = bs_smem + BS_KT * D;
    __shared__ int sValid[BS_KT], sSlot[BS_KT];
    const int b = blockIdx.x, g = blockIdx.y, G = c.n_h / c.n_kv, R = G * c.B;
    const int u = threadIdx.x % S::TPR, r = blockIdx.z * S::RT + threadIdx.x / S::TPR;
    const bool active = r < R;
    const int rr = active ? r : 0;   /* idle rows compute on row 0 (every lane meets the shuffles) */
    const int h = g * G + rr / c.B, j = rr % c.B;
    const size_t qrow = (size_t)b * c.B + j;
    float qv[S::DPT], o[S::DPT];
    bs_load_row<D>(qv, q + (qrow * c.n_h + h) * D, u);
    const float sl2 = c.scale * BS_LOG2E;   /* scores in log2 units */
#pragma unroll
    for (int i = 0; i < S::DPT; i++) { qv[i] *= sl2; o[i] = 0.f; }
    int clo, chi;
    const int dd = bs_span(c, anchors, doc_ids, b, &clo, &chi);
    const int nctx = chi >= clo ? (chi - clo + BS_KT) / BS_KT : 0, ntiles = nctx + (c.B + BS_KT - 1) / BS_KT;
    float m = -INFINITY, l = 0.f;
    for (int t = 0; t < ntiles; t++) {
        __syncthreads();   /* the previous tile is consumed */
        bs_load_kv<D>(sK, sV, sValid, sSlot, c, k, v, doc_ids, b, g, t, nctx, clo, chi, dd);
        __syncthreads();
        float s[BS_KT], tmax = -INFINITY;
#pragma unroll
        for (int kk = 0; kk < BS_KT; kk++) {
            const float sc = bs_sum<S::TPR>(bs_dot<D>(qv, sK + kk * D, u));
            const bool vis = sValid[kk] && (sSlot[kk] < 0 || !c.causal || sSlot[kk] <= j);
            s[kk] = vis ? sc : -INFINITY;
            tmax = fmaxf(tmax, s[kk]);
        }
        if (tmax == -INFINITY) continue;   /* nothing visible in this tile for this row */
        const float mn = fmaxf(m, tmax), cf = exp2f(m - mn);   /* m = -inf: cf = 0 */
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < S::DPT; i++) o[i] *= cf;
#pragma unroll
        for (int kk = 0; kk < BS_KT; kk++) {
            const float p = exp2f(s[kk] - mn);
            sum += p;
            if (p != 0.f) bs_axpy<D>(o, p, sV + kk * D, u);
        }
        l = l * cf + sum;
        m = mn;
    }
    if (!active) return;
    const float inv = 1.f / l;   /* l > 0: slot j always sees its own key */
    __nv_bfloat16 *dst = out + (qrow * c.n_h + h) * D;
#pragma unroll
    for (int cc = 0; cc < S::NC; cc++) {
        uint2 w;
        *reinterpret_cast<__nv_bfloat162 *>(&w.x) = __floats2bfloat162_rn(o[4 * cc] * inv, o[4 * cc + 1] * inv);
        *reinterpret_cast<__nv_bfloat162 *>(&w.y) = __floats2bfloat162_rn(o[4 * cc + 2] * inv, o[4 * cc + 3] * inv);
        *reinterpret_cast<uint2 *>(dst + bs_col<D>(u, cc)) = w;
    }
    if (u == 0) lse[(size_t)h * c.N * c.B + qrow] = (m + log2f(l)) * 0.69314718055994531f;
}

/* Kernel 2: dK, dV of one tile of RT keys for kv head blockIdx.y: x < nctx_tiles, context keys
 * [RT·x, RT·x + RT) ∩ [0, T); else block (x - nctx_tiles) / nbt's own keys, slots from RT·((x - nctx_tiles) % nbt). */
template <int D>
__global__ void __launch_bounds__(BS_NT)
bs_dkdv_kernel(block_attn_config c, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
               const int32_t *anchors, const int32_t *doc_ids, const __nv_bfloat16 *dout, const float *lse,
               const float *di, float *dk, float *dv, int nctx_tiles, int nbt) {
    using S = bs_shape<D>;
    extern __shared__ __align__(16) float bs_smem[];
    float *sQ = bs_smem, *sdO = bs_smem + BS_RC * D;
    __shared__ float sL2[BS_RC], sDi[BS_RC];
    __shared__ int sJ[BS_RC];
    const int g = blockIdx.y, x = blockIdx.x, G = c.n_h / c.n_kv, R = G * c.B;
    const size_t NB = (size_t)c.N * c.B;
    const int u = threadIdx.x % S::TPR, kk = threadIdx.x / S::TPR;
    const bool blk = x >= nctx_tiles;
    int p = 0, b0 = 0, jj = 0;
    bool kvalid;
    size_t krow;
    if (!blk) {
        p = x * S::RT + kk;
        kvalid = p < c.T;
        krow = (size_t)min(p, c.T - 1);
    } else {
        const int y = x - nctx_tiles;
        b0 = y / nbt;
        jj = (y % nbt) * S::RT + kk;
        kvalid = jj < c.B;
        krow = (size_t)c.T + (size_t)b0 * c.B + min(jj, c.B - 1);
    }
    float kr[S::DPT], vr[S::DPT], dka[S::DPT], dva[S::DPT];
    bs_load_row<D>(kr, k + (krow * c.n_kv + g) * D, u);
    bs_load_row<D>(vr, v + (krow * c.n_kv + g) * D, u);
    const float sl2 = c.scale * BS_LOG2E;
#pragma unroll
    for (int i = 0; i < S::DPT; i++) { kr[i] *= sl2; dka[i] = 0.f; dva[i] = 0.f; }
    const int kdoc = !blk && kvalid ? doc_ids[p] : -2;
    const int p0 = x * S::RT, p1 = min(p0 + S::RT, c.T);
    const int bfirst = blk ? b0 : 0, bend = blk ? b0 + 1 : c.N;
    for (int b = bfirst; b < bend; b++) {
        bool see;
        if (!blk) {
            const int a = anchors[b], dd = doc_ids[a];
            const int wlo = c.window > 0 ? max(0, a - c.window) : 0;
            if (dd == -1 || max(wlo, p0) >= min(a, p1)) continue;   /* uniform: the tile is outside the window */
            see = kvalid && p >= wlo && p < a && kdoc == dd;
            if (!__syncthreads_or(see)) continue;
        } else {
            see = kvalid;
        }
        for (int r0 = 0; r0 < R; r0 += BS_RC) {
            const int nr = min(BS_RC, R - r0);
            __syncthreads();   /* the previous chunk is consumed */
            for (int i = threadIdx.x; i < BS_RC * (D / 8); i += BS_NT) {
                const int rr = i / (D / 8), cc = i % (D / 8), r = r0 + min(rr, nr - 1);
                const size_t qrow = (size_t)b * c.B + r % c.B, off = (qrow * c.n_h + g * G + r / c.B) * D + cc * 8;
                bs_stage8(sQ + rr * D + cc * 8, q + off, rr < nr);
                bs_stage8(sdO + rr * D + cc * 8, dout + off, rr < nr);
            }
            if (threadIdx.x < BS_RC) {
                const int rr = threadIdx.x, r = r0 + min(rr, nr - 1);
                const size_t qrow = (size_t)b * c.B + r % c.B, li = (size_t)(g * G + r / c.B) * NB + qrow;
                sL2[rr] = lse[li] * BS_LOG2E;
                sDi[rr] = di[li];
                sJ[rr] = r % c.B;
            }
            __syncthreads();
            for (int rr = 0; rr < nr; rr++) {
                const float s = bs_sum<S::TPR>(bs_dot<D>(kr, sQ + rr * D, u));
                const float dp = bs_sum<S::TPR>(bs_dot<D>(vr, sdO + rr * D, u));
                const bool vis = see && (!blk || !c.causal || jj <= sJ[rr]);
                const float pr = vis ? exp2f(s - sL2[rr]) : 0.f;
                if (pr != 0.f) {
                    bs_axpy<D>(dva, pr, sdO + rr * D, u);
                    bs_axpy<D>(dka, pr * (dp - sDi[rr]) * c.scale, sQ + rr * D, u);
                }
            }
        }
    }
    if (!kvalid) return;
    float *pk = dk + (krow * c.n_kv + g) * D, *pv = dv + (krow * c.n_kv + g) * D;
#pragma unroll
    for (int cc = 0; cc < S::NC; cc++) {
        *reinterpret_cast<float4 *>(pk + bs_col<D>(u, cc)) = make_float4(dka[4 * cc], dka[4 * cc + 1], dka[4 * cc + 2],
                                                                        dka[4 * cc + 3]);
        *reinterpret_cast<float4 *>(pv + bs_col<D>(u, cc)) = make_float4(dva[4 * cc], dva[4 * cc + 1], dva[4 * cc + 2],
                                                                        dva[4 * cc + 3]);
    }
}

/* Kernel 3: dQ of the forward's rows (same grid); overwrites dq, the scratch of kernel 1. */
template <int D>
__global__ void __launch_bounds__(BS_NT)
bs_dq_kernel(block_attn_config c, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
             const int32_t *anchors, const int32_t *doc_ids, const __nv_bfloat16 *out, const __nv_bfloat16 *dout,
             const float *lse, float *dq) {
    using S = bs_shape<D>;
    extern __shared__ __align__(16) float bs_smem[];
    float *sK = bs_smem, *sV = bs_smem + BS_KT * D;
    __shared__ int sValid[BS_KT], sSlot[BS_KT];
    const int b = blockIdx.x, g = blockIdx.y, G = c.n_h / c.n_kv, R = G * c.B;
    const int u = threadIdx.x % S::TPR, r = blockIdx.z * S::RT + threadIdx.x / S::TPR;
    const bool active = r < R;
    const int rr = active ? r : 0;
    const int h = g * G + rr / c.B, j = rr % c.B;
    const size_t qrow = (size_t)b * c.B + j, qoff = (qrow * c.n_h + h) * D;
    float qv[S::DPT], dov[S::DPT], dqa[S::DPT];
    bs_load_row<D>(qv, q + qoff, u);
    bs_load_row<D>(dov, dout + qoff, u);
    float di = 0.f;
    {
        float ov[S::DPT];
        bs_load_row<D>(ov, out + qoff, u);
#pragma unroll
        for (int i = 0; i < S::DPT; i++) di = fmaf(ov[i], dov[i], di);
        di = bs_sum<S::TPR>(di);
    }
    const float sl2 = c.scale * BS_LOG2E, lse2 = lse[(size_t)h * c.N * c.B + qrow] * BS_LOG2E;
#pragma unroll
    for (int i = 0; i < S::DPT; i++) { qv[i] *= sl2; dqa[i] = 0.f; }
    int clo, chi;
    const int dd = bs_span(c, anchors, doc_ids, b, &clo, &chi);
    const int nctx = chi >= clo ? (chi - clo + BS_KT) / BS_KT : 0, ntiles = nctx + (c.B + BS_KT - 1) / BS_KT;
    for (int t = 0; t < ntiles; t++) {
        __syncthreads();
        bs_load_kv<D>(sK, sV, sValid, sSlot, c, k, v, doc_ids, b, g, t, nctx, clo, chi, dd);
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < BS_KT; kk++) {
            const float s = bs_sum<S::TPR>(bs_dot<D>(qv, sK + kk * D, u));
            const float dp = bs_sum<S::TPR>(bs_dot<D>(dov, sV + kk * D, u));
            const bool vis = sValid[kk] && (sSlot[kk] < 0 || !c.causal || sSlot[kk] <= j);
            const float pr = vis ? exp2f(s - lse2) : 0.f;
            if (pr != 0.f) bs_axpy<D>(dqa, pr * (dp - di) * c.scale, sK + kk * D, u);
        }
    }
    if (!active) return;
    float *dst = dq + qoff;
#pragma unroll
    for (int cc = 0; cc < S::NC; cc++)
        *reinterpret_cast<float4 *>(dst + bs_col<D>(u, cc)) = make_float4(dqa[4 * cc], dqa[4 * cc + 1], dqa[4 * cc + 2],
                                                                         dqa[4 * cc + 3]);
}

/* ---------------------------------------------------------------- launchers */

template <typename K>
int bs_smem_optin(K kernel, size_t smem, int *configured, const char *who) {
    if (*configured) return 0;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kernels_fail("%s: cudaFuncSetAttribute(%zu bytes): %s", who, smem, cudaGetErrorString(e));
    *configured = 1;   /* benign race: every caller sets the same attribute */
    return 0;
}

template <int D>
int bs_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
               const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream) {
    using S = bs_shape<D>;
    constexpr size_t smem = 2 * (size_t)BS_KT * D * sizeof(float);
    static int configured;
    if (bs_smem_optin(bs_forward_kernel<D>, smem, &configured, "block_attn_forward (simt)")) return -1;
    const int R = (c->n_h / c->n_kv) * c->B;
    dim3 grid((unsigned)c->N, (unsigned)c->n_kv, (unsigned)((R + S::RT - 1) / S::RT));
    bs_forward_kernel<D><<<grid, BS_NT, smem, stream>>>(*c, (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k,
                                                        (const __nv_bfloat16 *)v, anchors, doc_ids,
                                                        (__nv_bfloat16 *)out, lse);
    KERNELS_CHECK_LAUNCH("block_attn_forward (simt)");
    return 0;
}

template <int D>
int bs_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse, float *dq, float *dk,
                float *dv, cudaStream_t stream) {
    using S = bs_shape<D>;
    const __nv_bfloat16 *qb = (const __nv_bfloat16 *)q, *kb = (const __nv_bfloat16 *)k, *vb = (const __nv_bfloat16 *)v,
                        *ob = (const __nv_bfloat16 *)out, *gb = (const __nv_bfloat16 *)dout;
    const int NB = c->N * c->B, R = (c->n_h / c->n_kv) * c->B;
    /* 1. Di into dq's first n_h·N·B floats */
    const size_t di_threads = (size_t)NB * c->n_h * (D / 8);
    ba_di_kernel<D, false><<<(unsigned)((di_threads + 255) / 256), 256, 0, stream>>>(ob, gb, dq, NB, c->n_h);
    KERNELS_CHECK_LAUNCH("block_attn_backward (simt) di");
    /* 2. dK, dV */
    constexpr size_t smem_kv = 2 * (size_t)BS_RC * D * sizeof(float);
    static int configured_kv;
    if (bs_smem_optin(bs_dkdv_kernel<D>, smem_kv, &configured_kv, "block_attn_backward (simt) dkdv")) return -1;
    const int nctx_tiles = (c->T + S::RT - 1) / S::RT, nbt = (c->B + S::RT - 1) / S::RT;
    dim3 gkv((unsigned)(nctx_tiles + (size_t)c->N * nbt), (unsigned)c->n_kv);
    bs_dkdv_kernel<D><<<gkv, BS_NT, smem_kv, stream>>>(*c, qb, kb, vb, anchors, doc_ids, gb, lse, dq, dk, dv, nctx_tiles,
                                                       nbt);
    KERNELS_CHECK_LAUNCH("block_attn_backward (simt) dkdv");
    /* 3. dQ */
    constexpr size_t smem_q = 2 * (size_t)BS_KT * D * sizeof(float);
    static int configured_q;
    if (bs_smem_optin(bs_dq_kernel<D>, smem_q, &configured_q, "block_attn_backward (simt) dq")) return -1;
    dim3 gq((unsigned)c->N, (unsigned)c->n_kv, (unsigned)((R + S::RT - 1) / S::RT));
    bs_dq_kernel<D><<<gq, BS_NT, smem_q, stream>>>(*c, qb, kb, vb, anchors, doc_ids, ob, gb, lse, dq);
    KERNELS_CHECK_LAUNCH("block_attn_backward (simt) dq");
    return 0;
}

}  // namespace

extern "C" int ba_simt_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                               const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse,
                               cudaStream_t stream) {
    switch (c->d_h) {
    case 16: return bs_forward<16>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    case 32: return bs_forward<32>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    case 64: return bs_forward<64>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    case 128: return bs_forward<128>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    case 256: return bs_forward<256>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    default: return kernels_fail("ba_simt_forward: d_h=%d, expected 16, 32, 64, 128 or 256", c->d_h);
    }
}

extern "C" int ba_simt_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                                const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    switch (c->d_h) {
    case 16: return bs_backward<16>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    case 32: return bs_backward<32>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    case 64: return bs_backward<64>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    case 128: return bs_backward<128>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    case 256: return bs_backward<256>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    default: return kernels_fail("ba_simt_backward: d_h=%d, expected 16, 32, 64, 128 or 256", c->d_h);
    }
}
