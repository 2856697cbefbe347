/*
 * kernels/bench/block_attn_mma.cuh — the retired mma.sync kernel sets 3, 5 and 6 of DFlash anchored block
 * attention, for kernels/bench/block_attn_bench.cu only (style.md: variants that lost live in benchmark
 * files). They were kernels/block_attn.cu's run-time alternatives (DFLASH_BLOCK_ATTN_KERNEL=3/5/6) until
 * issue 13; the library now runs only the wgmma kernels (set 7). The bench includes this file inside
 * namespaces (v4: other compile-time knobs, v3k: these), after kernels/block_attn_common.cuh at global scope.
 *
 * All matmuls are mma.sync m16n8k16 (bf16 in, fp32 accumulate) on register fragments loaded with
 * ldmatrix; tiles arrive by cp.async, double buffered. Query tiles are the 64 rows of one (block b,
 * kv head g): row r -> head g·G + r/B, slot r%B (rows >= G·B idle, zero-filled), so each K/V tile serves
 * the whole GQA group. Key tiles hold 64 keys: the context range of the anchor narrowed to the first and
 * last key of its document inside [max(0, a-W), a), then one tile with the block's own B keys. Inside
 * a tile a per-key document test and the causal in-block test mask scores.
 *
 * Kernel sets (ba_forward_select / ba_backward_select):
 *   6: forward kernel 6 below (two consecutive blocks per CTA, 128 query rows), backward of 5;
 *   5: the one-block forward and the backward multiplying every key tile in full (zero-filled rows);
 *   3: as 5 but only the 16-key groups that hold keys are multiplied (K2b's kernels; template SKIP);
 *   7: the wgmma kernels: the library's forward (ba_wg_forward_ws) and the backward through
 *      kernels/bench/block_attn_wg_bench.cuh (the library's, or the bench's BA_BENCH_WG_M=0 alternative).
 * Set 5 beat set 3 on the H200 (2026-11-29: forward 143 vs 123, backward 71.5 vs 66 TFLOP/s): the
 * per-group branches inside the unrolled mma loops cost more than the skipped multiplies.
 *
 * Forward, sets 3 and 5 (one CTA of 4 warps per (b, g), 16 query rows per warp): online softmax in base
 * 2 in registers, P rounded to bf16 for P·V (the reference's round_p mode), lse saved in natural log.
 * Q is staged through the second K buffer (read once into registers), so a CTA needs 4 K/V tiles of smem.
 * Forward, set 6: see block_attn_forward_pair_kernel.
 *
 * Backward, deterministic (no atomics), three kernels in stream order:
 *   1. Di = rowsum(dO ⊙ O) per (head, row), written to the first n_h·R floats of dq as scratch;
 *   2. per (context key tile of 64, kv head): dK, dV of those keys. The CTA keeps its K/V tile, finds
 *      the blocks that see any of its keys (in block order, 128 anchors at a time) and, per visiting
 *      block, loads its 64 query rows (Q, dO, lse, Di; double buffered) and accumulates
 *      dV += Pᵀ·dO, dK += dSᵀ·Q in registers (each warp owns 16 keys);
 *   3. per (block, kv head), like the forward: dQ = Σ dS·K over its key tiles (recomputing S and dP),
 *      then dK, dV of the block's own keys (only this CTA sees them) the same way as kernel 2.
 * Kernel 3 overwrites dq (including the scratch) after kernel 2 has read it.
 * dS = P ⊙ (dP - Di) · scale with P recomputed from lse; P and dS are rounded to bf16 for the matmuls.
 * Measured on the H200 at the standard shape (RESULTS.md, 2026-11-29): set 3 forward 123 TFLOP/s,
 * backward 66; set 5 143 and 71.5; set 6 forward 164; set 7 (the wgmma default) forward 230, backward
 * 158 (visible pairs).
 * The compile-time knobs BA_FWD_MIN_CTAS and BA_VQ exist so the benchmark can measure alternatives
 * from this same source.
 */
#include "kernels/block_attn.h"
#include "kernels/block_attn_common.cuh"
#include "kernels/block_attn_wg.h"
#include "kernels/mma.cuh"

#include <cuda_bf16.h>

namespace {

constexpr int BA_ROWS = 64;     /* query rows per tile */
constexpr int BA_KT = 64;       /* keys per tile */
constexpr int BA_THREADS = 128; /* 4 warps */
constexpr float BA_LOG2E = 1.4426950408889634f;
#ifndef BA_VQ
#define BA_VQ 16   /* query rows per step of a dK/dV visit (16 or 32): 16 keeps kernel 2 unspilled */
#endif
#ifndef BA_FWD_MIN_CTAS
#define BA_FWD_MIN_CTAS 3   /* 3 CTAs of 70 KB smem per SM; registers capped at 168 */
#endif

template <int HD> struct ba_smem {
    static constexpr int LD = HD + 8;   /* bf16 row stride: 16-byte rows, conflict-free ldmatrix */
    static constexpr size_t tile = (size_t)BA_ROWS * LD * sizeof(__nv_bfloat16);
    static constexpr size_t fwd = 4 * tile;   /* K, V double buffered (Q staged in K buffer 1) */
    static constexpr size_t bwd = 6 * tile;   /* 2 resident + 2 x 2 double buffered */
};

/* ---------------------------------------------------------------- fragments */

__device__ __forceinline__ void ba_cp16(void *smem, const void *gmem, bool ok) { mma_cp_async16(smem, gmem, ok ? 16 : 0); }
/* A fragment (16 rows x 16 k) of a row-major [rows][LD] tile at row0, k0. */
__device__ __forceinline__ void ba_frag_a(uint32_t *r, const __nv_bfloat16 *t, int LD, int row0, int k0) {
    int lane = threadIdx.x & 31;
    mma_ldsm_x4(r, t + (row0 + (lane & 15)) * LD + k0 + (lane >> 4) * 8);
}
/* B fragments of two n-tiles (n0..n0+15) x 16 k from a tile stored [n][LD] (rows = n): r[0..1] n-tile 0,
 * r[2..3] n-tile 1. */
__device__ __forceinline__ void ba_frag_b_nk(uint32_t *r, const __nv_bfloat16 *t, int LD, int n0, int k0) {
    int lane = threadIdx.x & 31;
    mma_ldsm_x4(r, t + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + k0 + ((lane >> 3) & 1) * 8);
}
/* B fragments of two n-tiles (n0..n0+15) x 16 k from a tile stored [k][LD] (rows = k). */
__device__ __forceinline__ void ba_frag_b_kn(uint32_t *r, const __nv_bfloat16 *t, int LD, int k0, int n0) {
    int lane = threadIdx.x & 31;
    mma_ldsm_x4_t(r, t + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}
/* A fragment (16 x 16 k) from the C fragments c0 (k 0..7) and c1 (k 8..15) of a 16 x 8 tile pair. */
__device__ __forceinline__ void ba_c2a(uint32_t *a, const float *c0, const float *c1) {
    a[0] = mma_pack_bf16x2(c0[0], c0[1]);
    a[1] = mma_pack_bf16x2(c0[2], c0[3]);
    a[2] = mma_pack_bf16x2(c1[0], c1[1]);
    a[3] = mma_pack_bf16x2(c1[2], c1[3]);
}

/* Query tile of (b, g): cp.async the 64 rows of src (q or dout), zero rows >= used. */
template <int HD>
__device__ __forceinline__ void ba_load_qrows(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int b, int g, int B, int G,
                                              int n_h, int used) {
    constexpr int LD = HD + 8, CH = HD / 8;
    for (int i = threadIdx.x; i < BA_ROWS * CH; i += BA_THREADS) {
        int r = i / CH, c = i % CH;
        bool ok = r < used;
        size_t row = ok ? ((size_t)(b * B + r % B) * n_h + g * G + r / B) : 0;
        ba_cp16(dst + r * LD + c * 8, src + row * HD + c * 8, ok);
    }
}

/* The visible context range of block b narrowed to [first, last + 1] key of its document (block-wide;
 * all threads must call it). Empty (lo == hi) for padding documents. */
__device__ __forceinline__ void ba_ctx_range(const int32_t *doc_ids, int a, int d, int window, int *lo_out,
                                             int *hi_out, int *sLo, int *sHi) {
    const int lo = window > 0 ? max(0, a - window) : 0, hi = d == -1 ? lo : a;
    if (threadIdx.x == 0) { *sLo = hi; *sHi = lo - 1; }
    __syncthreads();
    ba_doc_span<BA_THREADS, false>(doc_ids, lo, hi, d, threadIdx.x, (threadIdx.x & 31) == 0, sLo, sHi, nullptr);   /* block_attn_common.cuh */
    __syncthreads();
    *lo_out = *sLo;
    *hi_out = max(*sLo, *sHi + 1);
}

/* K/V tile t of block b into buffers: context tiles first, then the block tile. Sets vis[64] (plain
 * stores, visible after the next __syncthreads) and returns the number of keys to multiply, rounded
 * up to 16 (rows beyond it are not loaded and never read). */
template <int HD, bool SKIP>
__device__ __forceinline__ int ba_load_kv_tile(__nv_bfloat16 *sK, __nv_bfloat16 *sV, int *vis, const __nv_bfloat16 *k,
                                               const __nv_bfloat16 *v, const int32_t *doc_ids, int t, int n_ctx,
                                               int c_lo, int c_hi, int d, int T, int b, int B, int g, int n_kv) {
    constexpr int LD = HD + 8, CH = HD / 8;
    int nk = t < n_ctx ? min(BA_KT, c_hi - c_lo - t * BA_KT) : B;
    int nk16 = SKIP ? (nk + 15) & ~15 : BA_KT;
    for (int i = threadIdx.x; i < nk16 * CH; i += BA_THREADS) {
        int r = i / CH, c = i % CH;
        bool ok = r < nk;
        size_t row = !ok ? 0 : t < n_ctx ? (size_t)(c_lo + t * BA_KT + r) : (size_t)T + (size_t)b * B + r;
        size_t off = (row * n_kv + g) * HD + c * 8;
        ba_cp16(sK + r * LD + c * 8, k + off, ok);
        ba_cp16(sV + r * LD + c * 8, v + off, ok);
    }
    if (threadIdx.x < BA_KT) {
        int r = threadIdx.x, x;
        if (t < n_ctx) x = r < nk && doc_ids[c_lo + t * BA_KT + r] == d;
        else x = r < B;
        vis[r] = x;
    }
    return nk16;
}

/* ---------------------------------------------------------------- forward */

template <int HD, bool SKIP>
__global__ void __launch_bounds__(BA_THREADS, BA_FWD_MIN_CTAS)
block_attn_forward_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                          const int32_t *anchors, const int32_t *doc_ids, __nv_bfloat16 *out, float *lse, int T,
                          int N, int B, int n_h, int n_kv, int window, int causal, float scale_log2) {
    constexpr int LD = HD + 8;
    extern __shared__ __align__(16) unsigned char ba_smem_raw[];
    __nv_bfloat16 *sK = (__nv_bfloat16 *)ba_smem_raw;   /* [2][64][LD] */
    __nv_bfloat16 *sV = sK + 2 * BA_KT * LD;            /* [2][64][LD] */
    __nv_bfloat16 *sQ = sK + BA_KT * LD;                /* staged in K buffer 1 */
    __shared__ int sVis[2][BA_KT];
    __shared__ int sLo, sHi;

    const int b = blockIdx.x, g = blockIdx.y, G = n_h / n_kv, used = G * B, R = N * B;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int a = anchors[b], d = doc_ids[a];
    ba_load_qrows<HD>(sQ, q, b, g, B, G, n_h, used);
    mma_commit();
    int c_lo, c_hi;
    ba_ctx_range(doc_ids, a, d, window, &c_lo, &c_hi, &sLo, &sHi);
    const int n_ctx = (c_hi - c_lo + BA_KT - 1) / BA_KT, n_tiles = n_ctx + 1;
    int kn_cur = ba_load_kv_tile<HD, SKIP>(sK, sV, sVis[0], k, v, doc_ids, 0, n_ctx, c_lo, c_hi, d, T, b, B, g, n_kv);
    mma_commit();
    mma_wait<1>();   /* Q has landed */
    __syncthreads();
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++) ba_frag_a(qf[kc], sQ, LD, warp * 16, kc * 16);
    __syncthreads();   /* K buffer 1 is free for tile 1 */

    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;   /* this thread's rows */
    const int j0 = r0 % B, j1 = r1 % B;
    const bool ok0 = r0 < used, ok1 = r1 < used;
    int buf = 0;
    for (int t = 0; t < n_tiles; t++) {
        int kn_next = 0;
        if (t + 1 < n_tiles)
            kn_next = ba_load_kv_tile<HD, SKIP>(sK + (buf ^ 1) * BA_KT * LD, sV + (buf ^ 1) * BA_KT * LD, sVis[buf ^ 1], k, v,
                                          doc_ids, t + 1, n_ctx, c_lo, c_hi, d, T, b, B, g, n_kv);
        mma_commit();
        mma_wait<1>();
        __syncthreads();
        const bool block_tile = t == n_ctx;
        const int kn = kn_cur;
        const __nv_bfloat16 *Kb = sK + buf * BA_KT * LD, *Vb = sV + buf * BA_KT * LD;
        float s[BA_KT / 8][4];
#pragma unroll
        for (int i = 0; i < BA_KT / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++)
#pragma unroll
            for (int np = 0; np < BA_KT / 16; np++)
                if (!SKIP || np * 16 < kn) {
                    uint32_t bb[4];
                    ba_frag_b_nk(bb, Kb, LD, np * 16, kc * 16);
                    mma_m16n8k16(s[2 * np], qf[kc], bb[0], bb[1]);
                    mma_m16n8k16(s[2 * np + 1], qf[kc], bb[2], bb[3]);
                }
#pragma unroll
        for (int nt = 0; nt < BA_KT / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = nt * 8 + (lane & 3) * 2 + (e & 1);
                bool second = e >= 2;
                bool vis = sVis[buf][key] && (second ? ok1 : ok0) && !(block_tile && causal && key > (second ? j1 : j0));
                s[nt][e] = vis ? s[nt][e] * scale_log2 : -INFINITY;
            }
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int nt = 0; nt < BA_KT / 8; nt++) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        /* a row with nothing visible yet keeps m = -inf; subtract 0 then so exp2 gives 0, not NaN */
        const float ms0 = mx0 == -INFINITY ? 0.f : mx0, ms1 = mx1 == -INFINITY ? 0.f : mx1;
        const float c0 = exp2f(m0 - ms0), c1 = exp2f(m1 - ms1);
        m0 = mx0;
        m1 = mx1;
        float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
        for (int nt = 0; nt < BA_KT / 8; nt++) {
            s[nt][0] = exp2f(s[nt][0] - ms0);
            s[nt][1] = exp2f(s[nt][1] - ms0);
            s[nt][2] = exp2f(s[nt][2] - ms1);
            s[nt][3] = exp2f(s[nt][3] - ms1);
            sum0 += s[nt][0] + s[nt][1];
            sum1 += s[nt][2] + s[nt][3];
        }
        l0 = l0 * c0 + sum0;
        l1 = l1 * c1 + sum1;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            o[i][0] *= c0; o[i][1] *= c0;
            o[i][2] *= c1; o[i][3] *= c1;
        }
#pragma unroll
        for (int kc = 0; kc < BA_KT / 16; kc++)
            if (!SKIP || kc * 16 < kn) {
                uint32_t aa[4];
                ba_c2a(aa, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
                for (int dp = 0; dp < HD / 16; dp++) {
                    uint32_t bb[4];
                    ba_frag_b_kn(bb, Vb, LD, kc * 16, dp * 16);
                    mma_m16n8k16(o[2 * dp], aa, bb[0], bb[1]);
                    mma_m16n8k16(o[2 * dp + 1], aa, bb[2], bb[3]);
                }
            }
        __syncthreads();   /* this buffer is refilled by the next iteration's prefetch */
        buf ^= 1;
        kn_cur = kn_next;
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int col = (lane & 3) * 2;
    if (ok0) {   /* every live row sees its own block's first key, so l > 0 */
        int h = g * G + r0 / B;
        size_t row = (size_t)b * B + j0;
        __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + (row * n_h + h) * HD + col);
        float inv = 1.f / l0;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) dst[nt * 4] = __floats2bfloat162_rn(o[nt][0] * inv, o[nt][1] * inv);
        if ((lane & 3) == 0) lse[(size_t)h * R + row] = (m0 + log2f(l0)) / BA_LOG2E;
    }
    if (ok1) {
        int h = g * G + r1 / B;
        size_t row = (size_t)b * B + j1;
        __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + (row * n_h + h) * HD + col);
        float inv = 1.f / l1;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) dst[nt * 4] = __floats2bfloat162_rn(o[nt][2] * inv, o[nt][3] * inv);
        if ((lane & 3) == 0) lse[(size_t)h * R + row] = (m1 + log2f(l1)) / BA_LOG2E;
    }
}

/* ---------------------------------------------------------------- forward, two blocks per CTA
 * Kernel 6 (the default): one CTA of 4 warps per (pair of consecutive blocks b0 = 2·blockIdx.x, b0 + 1;
 * kv head g). Query tile of 128 rows: rows 0..63 are block b0's 64-row tile (row r -> head g·G + r/B,
 * slot r%B), rows 64..127 block b0 + 1's; warp w owns m-tile 0 = rows 16w.. and m-tile 1 = rows
 * 64 + 16w.., so every K/V fragment read from shared memory feeds both blocks (K1's attention layout,
 * 4 warps x 2 m-tiles, Q re-read from shared memory per k-chunk). Sorted anchors ~16 tokens apart have
 * nearly equal context ranges: the CTA walks the union of the two (one merged range when they overlap
 * or nearly touch, else both), then the 2·B block keys (block-major, so the two blocks' keys are
 * contiguous), and masks per row: context key p is visible to block h iff bit h of sVis (doc test
 * inside its narrowed range); block key kk is visible to block h's slot j iff h·B <= kk < h·B + B and
 * (causal ? kk - h·B <= j : true). A context tile that both blocks see in full skips the mask. Idle rows
 * (>= G·B, or block b0 + 1 past N) compute on zero-filled Q and are never stored. The softmax scale is
 * folded into one FMA before ex2.approx (K1's FX path). */


template <int HD> struct ba_pair_smem {
    static constexpr size_t bytes = (size_t)(2 * BA_ROWS + 4 * BA_KT) * (HD + 8) * sizeof(__nv_bfloat16);
};

template <int HD>
__global__ void __launch_bounds__(BA_THREADS, 2)
block_attn_forward_pair_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                               const int32_t *anchors, const int32_t *doc_ids, __nv_bfloat16 *out, float *lse,
                               int T, int N, int B, int n_h, int n_kv, int window, int causal, float scale_log2) {
    constexpr int LD = HD + 8, CH = HD / 8, MT = 2, QR = MT * BA_ROWS;
    extern __shared__ __align__(16) unsigned char ba_smem_raw[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)ba_smem_raw;   /* [128][LD] */
    __nv_bfloat16 *sK = sQ + QR * LD;                   /* [2][64][LD] */
    __nv_bfloat16 *sV = sK + 2 * BA_KT * LD;            /* [2][64][LD] */
    __shared__ int sVis[2][BA_KT];    /* context keys: bit h = visible to block b0 + h */
    __shared__ int sFull[2][2];       /* per buffer and loader warp: its 32 keys need no mask */
    __shared__ int sLo[2], sHi[2];

    const int b0 = 2 * blockIdx.x, g = blockIdx.y, G = n_h / n_kv, used = G * B, R = N * B;
    const bool two = b0 + 1 < N;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int a0 = anchors[b0], d0 = doc_ids[a0];
    const int a1 = two ? anchors[b0 + 1] : 0, d1 = two ? doc_ids[a1] : -1;   /* d1 = -1: no context */
    for (int i = threadIdx.x; i < QR * CH; i += BA_THREADS) {
        int rr = i / CH, c = i % CH, h = rr / BA_ROWS, r = rr % BA_ROWS;
        bool ok = r < used && (h == 0 || two);
        size_t row = ok ? ((size_t)((b0 + h) * B + r % B) * n_h + g * G + r / B) : 0;
        ba_cp16(sQ + rr * LD + c * 8, q + row * HD + c * 8, ok);
    }
    mma_commit();
    int lo0, hi0, lo1, hi1;
    ba_ctx_range(doc_ids, a0, d0, window, &lo0, &hi0, &sLo[0], &sHi[0]);
    ba_ctx_range(doc_ids, a1, d1, window, &lo1, &hi1, &sLo[1], &sHi[1]);
    /* key segments: [s0, e0) and [s1, e1) of context, then the nbk block keys */
    int s0 = lo0, e0 = hi0, s1 = lo1, e1 = hi1;
    if (e0 > s0 && e1 > s1 && max(s0, s1) <= min(e0, e1) + BA_KT) {
        s0 = min(s0, s1);
        e0 = max(e0, e1);
        s1 = e1 = 0;
    }
    const int nt0 = (max(e0 - s0, 0) + BA_KT - 1) / BA_KT, nt1 = (max(e1 - s1, 0) + BA_KT - 1) / BA_KT;
    const int nbk = two ? 2 * B : B, n_ctx = nt0 + nt1, n_tiles = n_ctx + (nbk + BA_KT - 1) / BA_KT;

    /* tile t: keys base .. base + nk - 1 of its segment (context positions, or block keys from T + b0·B) */
    auto tile_keys = [&](int t, int *base, int *nk) {
        *base = t < nt0 ? s0 + t * BA_KT : t < n_ctx ? s1 + (t - nt0) * BA_KT : (t - n_ctx) * BA_KT;
        *nk = min(BA_KT, (t < nt0 ? e0 : t < n_ctx ? e1 : nbk) - *base);
    };
    /* The doc id of key threadIdx.x (threads 0..63) is loaded with the tile's cp.async and used only
     * after the current tile's math (set_vis), so warps 0 and 1 do not stall on it at the barrier. */
    int pdoc = -1;
    auto load_tile = [&](int t, int buf) {
        const bool blk = t >= n_ctx;
        int base, nk;
        tile_keys(t, &base, &nk);
        __nv_bfloat16 *dK = sK + buf * BA_KT * LD, *dV = sV + buf * BA_KT * LD;
        for (int i = threadIdx.x; i < BA_KT * CH; i += BA_THREADS) {
            int r = i / CH, c = i % CH;
            bool ok = r < nk;
            size_t row = !ok ? 0 : blk ? (size_t)T + (size_t)b0 * B + base + r : (size_t)(base + r);
            size_t off = (row * n_kv + g) * HD + c * 8;
            ba_cp16(dK + r * LD + c * 8, k + off, ok);
            ba_cp16(dV + r * LD + c * 8, v + off, ok);
        }
        if (threadIdx.x < BA_KT && !blk && (int)threadIdx.x < nk) pdoc = doc_ids[base + threadIdx.x];
    };
    /* sVis and sFull of tile t (loaded by load_tile(t, buf) before); visible after the next barrier */
    auto set_vis = [&](int t, int buf) {
        if (threadIdx.x < BA_KT) {   /* warps 0 and 1, whole */
            const bool blk = t >= n_ctx;
            int base, nk;
            tile_keys(t, &base, &nk);
            int r = threadIdx.x, x = 0;
            if (!blk && r < nk) {
                int p = base + r;
                x = (pdoc == d0 && p >= lo0 && p < hi0 ? 1 : 0) | (pdoc == d1 && p >= lo1 && p < hi1 ? 2 : 0);
            }
            sVis[buf][r] = x;
            bool full = !blk && (two ? x == 3 : (x & 1) != 0);
            unsigned bal = __ballot_sync(0xffffffffu, full);
            if (lane == 0) sFull[buf][warp] = bal == 0xffffffffu;
        }
    };
    load_tile(0, 0);
    mma_commit();
    set_vis(0, 0);

    float o[MT][HD / 8][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < HD / 8; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.f;
    }
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;   /* this thread's rows inside each block's tile */
    const int j0 = r0 % B, j1 = r1 % B;
    int buf = 0;
    for (int t = 0; t < n_tiles; t++) {
        if (t + 1 < n_tiles) load_tile(t + 1, buf ^ 1);
        mma_commit();
        mma_wait<1>();   /* Q (first group) and tile t have landed */
        __syncthreads();
        const __nv_bfloat16 *Kb = sK + buf * BA_KT * LD, *Vb = sV + buf * BA_KT * LD;
        float s[MT][BA_KT / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int i = 0; i < BA_KT / 8; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
            uint32_t a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) ba_frag_a(a[mt], sQ, LD, mt * BA_ROWS + warp * 16, kc * 16);
#pragma unroll
            for (int np = 0; np < BA_KT / 16; np++) {
                uint32_t bb[4];
                ba_frag_b_nk(bb, Kb, LD, np * 16, kc * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_m16n8k16(s[mt][2 * np], a[mt], bb[0], bb[1]);
                    mma_m16n8k16(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
                }
            }
        }
        if (!(sFull[buf][0] && sFull[buf][1])) {
            const bool blk = t >= n_ctx;
            const int kk0 = (t - n_ctx) * BA_KT;   /* block tiles: index of the tile's first block key */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < BA_KT / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int key = nt * 8 + (lane & 3) * 2 + (e & 1);
                        bool vis;
                        if (blk) {
                            const int kk = kk0 + key - mt * B;
                            vis = kk >= 0 && kk < B && !(causal && kk > (e >= 2 ? j1 : j0));
                        } else {
                            vis = (sVis[buf][key] >> mt) & 1;
                        }
                        if (!vis) s[mt][nt][e] = -INFINITY;
                    }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            float mx0 = m[mt][0], mx1 = m[mt][1];   /* scaled running maxima; raw maxima scale below */
            float rx0 = -INFINITY, rx1 = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < BA_KT / 8; nt++) {
                rx0 = fmaxf(rx0, fmaxf(s[mt][nt][0], s[mt][nt][1]));
                rx1 = fmaxf(rx1, fmaxf(s[mt][nt][2], s[mt][nt][3]));
            }
            rx0 = fmaxf(rx0, __shfl_xor_sync(0xffffffffu, rx0, 1));
            rx0 = fmaxf(rx0, __shfl_xor_sync(0xffffffffu, rx0, 2));
            rx1 = fmaxf(rx1, __shfl_xor_sync(0xffffffffu, rx1, 1));
            rx1 = fmaxf(rx1, __shfl_xor_sync(0xffffffffu, rx1, 2));
            mx0 = fmaxf(mx0, rx0 * scale_log2);   /* scale > 0: -inf stays -inf */
            mx1 = fmaxf(mx1, rx1 * scale_log2);
            /* a row with nothing visible yet keeps m = -inf; subtract 0 then so ex2 gives 0, not NaN */
            const float ms0 = mx0 == -INFINITY ? 0.f : mx0, ms1 = mx1 == -INFINITY ? 0.f : mx1;
            const float c0 = mma_ex2_ftz(m[mt][0] - ms0), c1 = mma_ex2_ftz(m[mt][1] - ms1);
            m[mt][0] = mx0;
            m[mt][1] = mx1;
            float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < BA_KT / 8; nt++) {
                s[mt][nt][0] = mma_ex2_ftz(fmaf(s[mt][nt][0], scale_log2, -ms0));
                s[mt][nt][1] = mma_ex2_ftz(fmaf(s[mt][nt][1], scale_log2, -ms0));
                s[mt][nt][2] = mma_ex2_ftz(fmaf(s[mt][nt][2], scale_log2, -ms1));
                s[mt][nt][3] = mma_ex2_ftz(fmaf(s[mt][nt][3], scale_log2, -ms1));
                sum0 += s[mt][nt][0] + s[mt][nt][1];
                sum1 += s[mt][nt][2] + s[mt][nt][3];
            }
            l[mt][0] = l[mt][0] * c0 + sum0;
            l[mt][1] = l[mt][1] * c1 + sum1;
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                o[mt][i][0] *= c0; o[mt][i][1] *= c0;
                o[mt][i][2] *= c1; o[mt][i][3] *= c1;
            }
        }
#pragma unroll
        for (int kc = 0; kc < BA_KT / 16; kc++) {
            uint32_t aa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) ba_c2a(aa[mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t bb[4];
                ba_frag_b_kn(bb, Vb, LD, kc * 16, dp * 16);
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_m16n8k16(o[mt][2 * dp], aa[mt], bb[0], bb[1]);
                    mma_m16n8k16(o[mt][2 * dp + 1], aa[mt], bb[2], bb[3]);
                }
            }
        }
        if (t + 1 < n_tiles) set_vis(t + 1, buf ^ 1);   /* buffer buf ^ 1's flags were last read in t - 1 */
        __syncthreads();   /* this buffer is refilled by the next iteration's prefetch */
        buf ^= 1;
    }
    mma_wait<0>();   /* nothing in flight at exit */
    const int col = (lane & 3) * 2;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        if (mt == 1 && !two) break;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = half ? r1 : r0;
            float lv = l[mt][half];
            lv += __shfl_xor_sync(0xffffffffu, lv, 1);
            lv += __shfl_xor_sync(0xffffffffu, lv, 2);
            if (r < used) {   /* every live row sees its own block's first key, so lv > 0 */
                const int h = g * G + r / B;
                const size_t row = (size_t)(b0 + mt) * B + r % B;
                __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + (row * n_h + h) * HD + col);
                const float inv = 1.f / lv;
#pragma unroll
                for (int nt = 0; nt < HD / 8; nt++)
                    dst[nt * 4] = __floats2bfloat162_rn(o[mt][nt][2 * half] * inv, o[mt][nt][2 * half + 1] * inv);
                if ((lane & 3) == 0) lse[(size_t)h * R + row] = (m[mt][half] + log2f(lv)) / BA_LOG2E;
            }
        }
    }
}

/* ---------------------------------------------------------------- backward */

/* Di: ba_di_kernel (kernels/block_attn_common.cuh, shared with set 7) */

/* One visit of a 64-row query tile by the warp's 16 keys (rows key_row0.. of sK/sV): dV += Pᵀ·dO,
 * dK += dSᵀ·Q. kok0/kok1: this thread's two keys (lane/4, lane/4 + 8) are visible to the block at all;
 * causal_key0 >= 0: block keys, key index causal_key0 + row must not exceed the query slot (causal).
 * sLse2 = lse·log2(e) and sDi per query row (0 for idle rows). Query rows are taken BA_VQ at a time. */
template <int HD>
__device__ __forceinline__ void ba_kv_visit(const __nv_bfloat16 *sK, const __nv_bfloat16 *sV, int key_row0,
                                            const __nv_bfloat16 *sQ, const __nv_bfloat16 *sdO, const float *sLse2,
                                            const float *sDi, bool kok0, bool kok1, int causal_key0, int used, int B,
                                            float scale_log2, float scale, float (&dk)[HD / 8][4],
                                            float (&dv)[HD / 8][4]) {
    constexpr int LD = HD + 8;
    const int lane = threadIdx.x & 31;
#pragma unroll 1
    for (int hq = 0; hq < BA_ROWS / BA_VQ; hq++) {
        float s[BA_VQ / 8][4], dp[BA_VQ / 8][4];
#pragma unroll
        for (int i = 0; i < BA_VQ / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
            uint32_t ka[4], va[4];
            ba_frag_a(ka, sK, LD, key_row0, kc * 16);
            ba_frag_a(va, sV, LD, key_row0, kc * 16);
#pragma unroll
            for (int np = 0; np < BA_VQ / 16; np++) {
                uint32_t bq[4], bo[4];
                ba_frag_b_nk(bq, sQ, LD, hq * BA_VQ + np * 16, kc * 16);
                ba_frag_b_nk(bo, sdO, LD, hq * BA_VQ + np * 16, kc * 16);
                mma_m16n8k16(s[2 * np], ka, bq[0], bq[1]);
                mma_m16n8k16(s[2 * np + 1], ka, bq[2], bq[3]);
                mma_m16n8k16(dp[2 * np], va, bo[0], bo[1]);
                mma_m16n8k16(dp[2 * np + 1], va, bo[2], bo[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < BA_VQ / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = hq * BA_VQ + nt * 8 + (lane & 3) * 2 + (e & 1);   /* query row of the tile */
                int key = (lane >> 2) + (e >= 2 ? 8 : 0);
                bool vis = (e >= 2 ? kok1 : kok0) && col < used &&
                           !(causal_key0 >= 0 && causal_key0 + key > col % B);
                float p = vis ? exp2f(s[nt][e] * scale_log2 - sLse2[col]) : 0.f;
                s[nt][e] = p;
                dp[nt][e] = p * (dp[nt][e] - sDi[col]) * scale;
            }
#pragma unroll
        for (int kc = 0; kc < BA_VQ / 16; kc++) {
            uint32_t pa[4], da[4];
            ba_c2a(pa, s[2 * kc], s[2 * kc + 1]);
            ba_c2a(da, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
            for (int dd = 0; dd < HD / 16; dd++) {
                uint32_t bb[4];
                ba_frag_b_kn(bb, sdO, LD, hq * BA_VQ + kc * 16, dd * 16);
                mma_m16n8k16(dv[2 * dd], pa, bb[0], bb[1]);
                mma_m16n8k16(dv[2 * dd + 1], pa, bb[2], bb[3]);
                ba_frag_b_kn(bb, sQ, LD, hq * BA_VQ + kc * 16, dd * 16);
                mma_m16n8k16(dk[2 * dd], da, bb[0], bb[1]);
                mma_m16n8k16(dk[2 * dd + 1], da, bb[2], bb[3]);
            }
        }
    }
}

/* fp32 rows (row, n_kv, HD) from a warp's 16-row C fragments; rows with !ok are skipped. */
template <int HD>
__device__ __forceinline__ void ba_store_rows(float *dst, const float (&acc)[HD / 8][4], size_t row0, bool ok0,
                                              size_t row1, bool ok1, int n_kv, int g) {
    const int col = (threadIdx.x & 3) * 2;
#pragma unroll
    for (int nt = 0; nt < HD / 8; nt++) {
        if (ok0) *(float2 *)(dst + (row0 * n_kv + g) * HD + nt * 8 + col) = make_float2(acc[nt][0], acc[nt][1]);
        if (ok1) *(float2 *)(dst + (row1 * n_kv + g) * HD + nt * 8 + col) = make_float2(acc[nt][2], acc[nt][3]);
    }
}

/* Kernel 2: dK, dV of context keys [64·blockIdx.x, +64) for kv head blockIdx.y. */
template <int HD>
__global__ void __launch_bounds__(BA_THREADS, 2)
block_attn_backward_kv_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                              const int32_t *anchors, const int32_t *doc_ids, const __nv_bfloat16 *dout,
                              const float *lse, const float *di, float *dk, float *dv, int T, int N, int B, int n_h,
                              int n_kv, int window, float scale_log2, float scale) {
    constexpr int LD = HD + 8, CH = HD / 8;
    extern __shared__ __align__(16) unsigned char ba_smem_raw[];
    __nv_bfloat16 *sK = (__nv_bfloat16 *)ba_smem_raw;   /* [64][LD] */
    __nv_bfloat16 *sV = sK + BA_KT * LD;                /* [64][LD] */
    __nv_bfloat16 *sQ = sV + BA_KT * LD;                /* [2][64][LD] */
    __nv_bfloat16 *sdO = sQ + 2 * BA_ROWS * LD;         /* [2][64][LD] */
    __shared__ float sLse2[2][BA_ROWS], sDi[2][BA_ROWS];
    __shared__ int sDoc[BA_KT], sList[BA_THREADS], sWarpN[BA_THREADS / 32];

    const int g = blockIdx.y, G = n_h / n_kv, used = G * B, R = N * B;
    const int p0 = blockIdx.x * BA_KT, np_keys = min(BA_KT, T - p0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int i = threadIdx.x; i < BA_KT * CH; i += BA_THREADS) {
        int r = i / CH, c = i % CH;
        bool ok = r < np_keys;
        size_t off = ((size_t)(ok ? p0 + r : 0) * n_kv + g) * HD + c * 8;
        ba_cp16(sK + r * LD + c * 8, k + off, ok);
        ba_cp16(sV + r * LD + c * 8, v + off, ok);
    }
    mma_commit();
    if (threadIdx.x < BA_KT) sDoc[threadIdx.x] = threadIdx.x < np_keys ? doc_ids[p0 + threadIdx.x] : -1;

    float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
    const int kr0 = warp * 16 + (lane >> 2), kr1 = kr0 + 8;   /* this thread's key rows in the tile */

    auto load_visit = [&](int b, int buf) {
        ba_load_qrows<HD>(sQ + buf * BA_ROWS * LD, q, b, g, B, G, n_h, used);
        ba_load_qrows<HD>(sdO + buf * BA_ROWS * LD, dout, b, g, B, G, n_h, used);
        if (threadIdx.x < BA_ROWS) {
            int r = threadIdx.x;
            bool ok = r < used;
            size_t idx = ok ? (size_t)(g * G + r / B) * R + (size_t)b * B + r % B : 0;
            sLse2[buf][r] = ok ? lse[idx] * BA_LOG2E : 0.f;
            sDi[buf][r] = ok ? di[idx] : 0.f;
        }
    };

    for (int base = 0; base < N; base += BA_THREADS) {
        __syncthreads();   /* sDoc is written; the previous chunk's readers of sList are done */
        /* does block base + tid see any key of this tile? (conservative-exact: the per-key test below) */
        int flag = 0;
        {
            int b = base + threadIdx.x;
            if (b < N) {
                int a = anchors[b], d = doc_ids[a];
                int lo = window > 0 ? max(0, a - window) : 0;
                int x0 = max(lo, p0), x1 = min(a, p0 + np_keys);
                if (d != -1)
                    for (int p = x0; p < x1 && !flag; p++) flag = sDoc[p - p0] == d;
            }
        }
        unsigned bal = __ballot_sync(0xffffffffu, flag);
        if (lane == 0) sWarpN[warp] = __popc(bal);
        __syncthreads();
        int before = 0, nvis = 0;
        for (int w = 0; w < BA_THREADS / 32; w++) {
            before += w < warp ? sWarpN[w] : 0;
            nvis += sWarpN[w];
        }
        if (flag) sList[before + __popc(bal & ((1u << lane) - 1))] = base + threadIdx.x;
        __syncthreads();
        if (nvis == 0) continue;
        load_visit(sList[0], 0);
        mma_commit();
        int buf = 0;
        for (int i = 0; i < nvis; i++) {
            if (i + 1 < nvis) load_visit(sList[i + 1], buf ^ 1);
            mma_commit();
            mma_wait<1>();
            __syncthreads();
            const int b = sList[i], a = anchors[b], d = doc_ids[a];
            const int lo = window > 0 ? max(0, a - window) : 0;
            const bool kok0 = kr0 < np_keys && sDoc[kr0] == d && p0 + kr0 < a && p0 + kr0 >= lo;
            const bool kok1 = kr1 < np_keys && sDoc[kr1] == d && p0 + kr1 < a && p0 + kr1 >= lo;
            ba_kv_visit<HD>(sK, sV, warp * 16, sQ + buf * BA_ROWS * LD, sdO + buf * BA_ROWS * LD, sLse2[buf], sDi[buf],
                            kok0, kok1, -1, used, B, scale_log2, scale, dka, dva);
            __syncthreads();
            buf ^= 1;
        }
    }
    mma_wait<0>();   /* the K/V group when no block visited */
    ba_store_rows<HD>(dk, dka, (size_t)(p0 + kr0), kr0 < np_keys, (size_t)(p0 + kr1), kr1 < np_keys, n_kv, g);
    ba_store_rows<HD>(dv, dva, (size_t)(p0 + kr0), kr0 < np_keys, (size_t)(p0 + kr1), kr1 < np_keys, n_kv, g);
}

/* Kernel 3: dQ of (block b, kv head g) and dK, dV of the block's own keys. */
template <int HD, bool SKIP>
__global__ void __launch_bounds__(BA_THREADS, 2)
block_attn_backward_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                           const int32_t *anchors, const int32_t *doc_ids, const __nv_bfloat16 *out,
                           const __nv_bfloat16 *dout, const float *lse, float *dq, float *dk, float *dv, int T, int N,
                           int B, int n_h, int n_kv, int window, int causal, float scale_log2, float scale) {
    constexpr int LD = HD + 8;
    extern __shared__ __align__(16) unsigned char ba_smem_raw[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)ba_smem_raw;   /* [64][LD] */
    __nv_bfloat16 *sdO = sQ + BA_ROWS * LD;             /* [64][LD] */
    __nv_bfloat16 *sK = sdO + BA_ROWS * LD;             /* [2][64][LD] */
    __nv_bfloat16 *sV = sK + 2 * BA_KT * LD;            /* [2][64][LD] */
    __shared__ int sVis[2][BA_KT];
    __shared__ float sLse2[BA_ROWS], sDi[BA_ROWS];
    __shared__ int sLo, sHi;

    const int b = blockIdx.x, g = blockIdx.y, G = n_h / n_kv, used = G * B, R = N * B;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int a = anchors[b], d = doc_ids[a];
    ba_load_qrows<HD>(sQ, q, b, g, B, G, n_h, used);
    ba_load_qrows<HD>(sdO, dout, b, g, B, G, n_h, used);
    mma_commit();
    {   /* lse and Di = rowsum(dO ⊙ O) of the 64 rows: two threads per row */
        int r = threadIdx.x >> 1, half = threadIdx.x & 1;
        float s = 0.f;
        size_t row = (size_t)b * B + r % B;
        int h = g * G + r / B;
        if (r < used)   /* block_attn_common.cuh */
            s = ba_di_half<HD>(out + (row * n_h + h) * HD + half * (HD / 2), dout + (row * n_h + h) * HD + half * (HD / 2));
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (half == 0) {
            sDi[r] = r < used ? s : 0.f;
            sLse2[r] = r < used ? lse[(size_t)h * R + row] * BA_LOG2E : 0.f;
        }
    }
    int c_lo, c_hi;
    ba_ctx_range(doc_ids, a, d, window, &c_lo, &c_hi, &sLo, &sHi);
    const int n_ctx = (c_hi - c_lo + BA_KT - 1) / BA_KT, n_tiles = n_ctx + 1;
    int kn_cur = ba_load_kv_tile<HD, SKIP>(sK, sV, sVis[0], k, v, doc_ids, 0, n_ctx, c_lo, c_hi, d, T, b, B, g, n_kv);
    mma_commit();

    float dqa[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.f;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    const int j0 = r0 % B, j1 = r1 % B;
    const bool ok0 = r0 < used, ok1 = r1 < used;
    int buf = 0;
    for (int t = 0; t < n_tiles; t++) {
        int kn_next = 0;
        if (t + 1 < n_tiles)
            kn_next = ba_load_kv_tile<HD, SKIP>(sK + (buf ^ 1) * BA_KT * LD, sV + (buf ^ 1) * BA_KT * LD, sVis[buf ^ 1], k, v,
                                          doc_ids, t + 1, n_ctx, c_lo, c_hi, d, T, b, B, g, n_kv);
        mma_commit();
        mma_wait<1>();
        __syncthreads();
        const bool block_tile = t == n_ctx;
        const int kn = kn_cur;
        const __nv_bfloat16 *Kb = sK + buf * BA_KT * LD, *Vb = sV + buf * BA_KT * LD;
        float s[BA_KT / 8][4], dp[BA_KT / 8][4];
#pragma unroll
        for (int i = 0; i < BA_KT / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
            uint32_t qa[4], oa[4];
            ba_frag_a(qa, sQ, LD, warp * 16, kc * 16);
            ba_frag_a(oa, sdO, LD, warp * 16, kc * 16);
#pragma unroll
            for (int np = 0; np < BA_KT / 16; np++)
                if (!SKIP || np * 16 < kn) {
                    uint32_t bb[4];
                    ba_frag_b_nk(bb, Kb, LD, np * 16, kc * 16);
                    mma_m16n8k16(s[2 * np], qa, bb[0], bb[1]);
                    mma_m16n8k16(s[2 * np + 1], qa, bb[2], bb[3]);
                    ba_frag_b_nk(bb, Vb, LD, np * 16, kc * 16);
                    mma_m16n8k16(dp[2 * np], oa, bb[0], bb[1]);
                    mma_m16n8k16(dp[2 * np + 1], oa, bb[2], bb[3]);
                }
        }
        const float l20 = sLse2[r0], l21 = sLse2[r1], di0 = sDi[r0], di1 = sDi[r1];
#pragma unroll
        for (int nt = 0; nt < BA_KT / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = nt * 8 + (lane & 3) * 2 + (e & 1);
                bool second = e >= 2;
                bool vis = sVis[buf][key] && (second ? ok1 : ok0) && !(block_tile && causal && key > (second ? j1 : j0));
                float p = vis ? exp2f(s[nt][e] * scale_log2 - (second ? l21 : l20)) : 0.f;
                dp[nt][e] = p * (dp[nt][e] - (second ? di1 : di0)) * scale;
            }
#pragma unroll
        for (int kc = 0; kc < BA_KT / 16; kc++)
            if (!SKIP || kc * 16 < kn) {
                uint32_t aa[4];
                ba_c2a(aa, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
                for (int dd = 0; dd < HD / 16; dd++) {
                    uint32_t bb[4];
                    ba_frag_b_kn(bb, Kb, LD, kc * 16, dd * 16);
                    mma_m16n8k16(dqa[2 * dd], aa, bb[0], bb[1]);
                    mma_m16n8k16(dqa[2 * dd + 1], aa, bb[2], bb[3]);
                }
            }
        if (t + 1 < n_tiles) __syncthreads();   /* the last (block) tile stays for the dK/dV pass */
        buf ^= 1;
        kn_cur = kn_next;
    }
    {   /* dq rows: (row, head) of this thread's two tile rows */
        const int col = (lane & 3) * 2;
        float *q0 = dq + (((size_t)b * B + j0) * n_h + g * G + r0 / B) * HD + col;
        float *q1 = dq + (((size_t)b * B + j1) * n_h + g * G + r1 / B) * HD + col;
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) {
            if (ok0) *(float2 *)(q0 + nt * 8) = make_float2(dqa[nt][0], dqa[nt][1]);
            if (ok1) *(float2 *)(q1 + nt * 8) = make_float2(dqa[nt][2], dqa[nt][3]);
        }
    }
    /* dK, dV of the block's own keys: warp w owns keys 16w .. 16w+15 of the block tile */
    if (warp * 16 < B) {
        const int last = buf ^ 1;
        float dka[HD / 8][4], dva[HD / 8][4];
#pragma unroll
        for (int i = 0; i < HD / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;
        const int kr0 = warp * 16 + (lane >> 2), kr1 = kr0 + 8;
        ba_kv_visit<HD>(sK + last * BA_KT * LD, sV + last * BA_KT * LD, warp * 16, sQ, sdO, sLse2, sDi, kr0 < B,
                        kr1 < B, causal ? warp * 16 : -1, used, B, scale_log2, scale, dka, dva);
        size_t row0 = (size_t)T + (size_t)b * B + kr0, row1 = (size_t)T + (size_t)b * B + kr1;
        ba_store_rows<HD>(dk, dka, row0, kr0 < B, row1, kr1 < B, n_kv, g);
        ba_store_rows<HD>(dv, dva, row0, kr0 < B, row1, kr1 < B, n_kv, g);
    }
}

/* ---------------------------------------------------------------- launch helpers */

int ba_check_device(const block_attn_config *c, const void *const *ptrs, int nptr, const char *who) {
    char err[256];
    if (block_attn_check(c, err, sizeof err)) return kernels_fail("%s: %s", who, err);
    if (c->d_h != 64 && c->d_h != 128) return kernels_fail("%s: d_h=%d, the device kernel supports 64 and 128", who, c->d_h);
    if ((c->n_h / c->n_kv) * c->B > BA_ROWS)
        return kernels_fail("%s: (n_h/n_kv)·B = %d·%d exceeds the %d query rows of a CTA", who, c->n_h / c->n_kv, c->B,
                            BA_ROWS);
    for (int i = 0; i < nptr; i++)
        if ((uintptr_t)ptrs[i] % 16) return kernels_fail("%s: pointer argument %d is not 16-byte aligned", who, i);
    return 0;
}

template <typename K>
int ba_smem_attr(K kernel, size_t smem, const char *who) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return e == cudaSuccess ? 0 : kernels_fail("%s: cudaFuncSetAttribute: %s", who, cudaGetErrorString(e));
}

template <int HD, bool SKIP>
int ba_forward_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                      const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream) {
    const size_t smem = ba_smem<HD>::fwd;
    if (ba_smem_attr(block_attn_forward_kernel<HD, SKIP>, smem, "block_attn_forward")) return -1;
    block_attn_forward_kernel<HD, SKIP><<<dim3(c->N, c->n_kv), BA_THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (__nv_bfloat16 *)out, lse, c->T, c->N, c->B, c->n_h, c->n_kv, c->window, c->causal, c->scale * BA_LOG2E);
    KERNELS_CHECK_LAUNCH("block_attn_forward_kernel");
    return 0;
}

template <int HD, bool SKIP>
int ba_backward_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                       const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse, float *dq,
                       float *dk, float *dv, cudaStream_t stream) {
    const size_t smem = ba_smem<HD>::bwd;
    if (ba_smem_attr(block_attn_backward_kv_kernel<HD>, smem, "block_attn_backward") ||
        ba_smem_attr(block_attn_backward_kernel<HD, SKIP>, smem, "block_attn_backward"))
        return -1;
    const int R = c->N * c->B;
    const size_t di_threads = (size_t)R * c->n_h * (HD / 8);
    float *di = dq;   /* scratch: n_h·R floats, overwritten by kernel 3 */
    ba_di_kernel<HD><<<(unsigned)((di_threads + 255) / 256), 256, 0, stream>>>(
        (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, di, R, c->n_h);
    KERNELS_CHECK_LAUNCH("ba_di_kernel");
    block_attn_backward_kv_kernel<HD><<<dim3((c->T + BA_KT - 1) / BA_KT, c->n_kv), BA_THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (const __nv_bfloat16 *)dout, lse, di, dk, dv, c->T, c->N, c->B, c->n_h, c->n_kv, c->window,
        c->scale * BA_LOG2E, c->scale);
    KERNELS_CHECK_LAUNCH("block_attn_backward_kv_kernel");
    block_attn_backward_kernel<HD, SKIP><<<dim3(c->N, c->n_kv), BA_THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, lse, dq, dk, dv, c->T, c->N, c->B, c->n_h, c->n_kv,
        c->window, c->causal, c->scale * BA_LOG2E, c->scale);
    KERNELS_CHECK_LAUNCH("block_attn_backward_kernel");
    return 0;
}

template <int HD>
int ba_forward_pair_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                           const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream) {
    const size_t smem = ba_pair_smem<HD>::bytes;
    if (ba_smem_attr(block_attn_forward_pair_kernel<HD>, smem, "block_attn_forward")) return -1;
    block_attn_forward_pair_kernel<HD><<<dim3((c->N + 1) / 2, c->n_kv), BA_THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (__nv_bfloat16 *)out, lse, c->T, c->N, c->B, c->n_h, c->n_kv, c->window, c->causal, c->scale * BA_LOG2E);
    KERNELS_CHECK_LAUNCH("block_attn_forward_pair_kernel");
    return 0;
}

/* The kernel set (the bench's variant numbers pick it): 7 the library's wgmma kernels
 * (kernels/block_attn_{fwd,bwd}_wg.cu, through their C entries), 6 forward kernel 6 (two blocks per CTA)
 * with set 5's backward, 5 every key tile multiplied in full, 3 empty 16-key groups skipped. */
template <int HD>
int ba_forward_select(int kernel, const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                      const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream,
                      void *ws = nullptr) {   /* ws: set 7's plan workspace (block_attn_forward_ws), or NULL */
    if (kernel == 7) return ba_wg_forward_ws(c, q, k, v, anchors, doc_ids, out, lse, ws, stream);
    if (kernel == 6) return ba_forward_pair_launch<HD>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    if (kernel == 5) return ba_forward_launch<HD, false>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    return ba_forward_launch<HD, true>(c, q, k, v, anchors, doc_ids, out, lse, stream);
}

template <int HD>
int ba_backward_select(int kernel, const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                       const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                       const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    if (kernel == 7) return ba_bench_wg_backward(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    if (kernel == 3)
        return ba_backward_launch<HD, true>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    return ba_backward_launch<HD, false>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
}

}  // namespace
