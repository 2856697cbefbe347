/*
 * kernels/block_attn_bwd_wg.cu — the Hopper wgmma (sm_90a) backward of DFlash anchored block attention,
 * kernel set 7 (DFLASH_BLOCK_ATTN_KERNEL=7; contract in kernels/block_attn.h, entry in kernels/block_attn_wg.h).
 * Set 5's mma.sync backward (kernels/block_attn.cu) stays reachable with DFLASH_BLOCK_ATTN_KERNEL=5.
 *
 * Same deterministic three-kernel structure as set 5, every GEMM a wgmma (kernels/wgmma.cuh):
 *   1. Di = rowsum(dO ⊙ O) per (head, row) into the first n_h·R floats of dq (scratch);
 *   2. per (128 context keys, kv head): a CTA of two warpgroups, warpgroup w owns keys 64w..64w+63 (M = 64).
 *      The CTA scans the anchors for the blocks that see one of its keys (in block order, so the sums are
 *      deterministic) and, per visiting block, loads its 64 query rows (Q, dO, lse, Di; cp.async, a 3-stage
 *      pipeline) shared by both warpgroups, then per warpgroup (skipped when none of its keys is seen):
 *        Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ            (wg_mma_ss<64,0,0>, both operands K-major panels)
 *        Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) masked, dSᵀ = Pᵀ ⊙ (dPᵀ − Di)   (registers, per column)
 *        dV += Pᵀ·dO, dK += dSᵀ·Q          (wg_mma_rs<HD,1>: A = bf16 registers, B = MN-major panels)
 *      as four commit groups, so Pᵀ is computed while dPᵀ runs and dSᵀ while dV runs. dK is scaled by the
 *      softmax scale once, at the store. Load balance: a plan kernel first counts each tile's visits (into
 *      dq's scratch after Di) and kernel 2's CTAs take the tiles longest first (tiles near a document's
 *      start are seen by every later block of it). DFLASH_BA_WG_KV=1 (read per call) runs kernel 2 with
 *      one warpgroup (64 keys) per CTA and two CTAs per SM instead: a measurement knob.
 *   3. per (block, kv head), one warpgroup: dQ = scale · Σ dS·K over the block's key tiles (context tiles of
 *      its narrowed range, then the block tile; S = Q·Kᵀ and dP = dO·Vᵀ recomputed with wg_mma_ss, dQ with
 *      wg_mma_rs and K as an MN-major operand), then dK, dV of the block's own keys (only this CTA sees
 *      them) with kernel 2's visit on the block tile. Di is recomputed here from O and dO, because other
 *      CTAs overwrite the dq scratch. K/V tiles double buffered by cp.async (one barrier per tile); the
 *      block tile's S, dP, dQ products use N = 16 or 32 keys when B fits (wb_dq_tile<HD, NKEY>).
 * Row mapping of a 64-row query tile (as set 5): row r -> head g·G + r/B, slot r % B; rows >= G·B are
 * zero-filled and masked. Tiles are 64 rows × HD bf16 stored as HD/64 128B-swizzled panels of 8 KB.
 * P and dS are rounded to bf16 for the products (the reference's tolerance assumes it).
 * Written without a GPU at hand (2026-11-29): the GPU test runs every case on set 7, including a
 * bitwise-repeat check, and the benchmark validates before timing.
 */
#include "kernels/block_attn.h"
#include "kernels/block_attn_wg.h"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

#include <cstdlib>

#include <cuda_bf16.h>

namespace {

constexpr int WB_ROWS = 64;            /* query rows per tile (one wgmma M) */
constexpr int WB_KT = 64;              /* keys per warpgroup tile */
constexpr int WB_PANEL = 64 * 128;     /* bytes of one 64-row panel */
constexpr float WB_LOG2E = 1.4426950408889634f;
constexpr int WB_Q_THREADS = 128;      /* kernel 3: one warpgroup */
constexpr int WB_PLAN_MAX = 1024;      /* kernel 2 reorders its tiles (longest first) up to this many */
/* kernel 2's query-tile pipeline depth: 3 with one CTA per SM (2 warpgroups), 2 with two (1 warpgroup) */
__host__ __device__ constexpr int wb_stages(int nwg) { return nwg == 2 ? 3 : 2; }

template <int HD> struct wb_tile {
    static constexpr int bytes = 64 * HD * 2;   /* HD/64 panels */
};

/* shared byte offset of 16-byte chunk c (8 columns) of row r in a 64-row tile of panels */
__device__ __forceinline__ uint32_t wb_off(int r, int c) { return (uint32_t)((c >> 3) * WB_PANEL) + wg_sw128(r, c & 7); }

/* 4 bytes gmem -> smem asynchronously (zero-filled when !ok), in the current cp.async group */
__device__ __forceinline__ void wb_cp_async4(void *smem, const void *gmem, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(wg_smem_u32(smem)), "l"(gmem), "r"(ok ? 4 : 0));
}

__device__ __forceinline__ unsigned char *wb_align1024(unsigned char *p) {
    uint32_t s = wg_smem_u32(p);
    return p + ((1024u - (s & 1023u)) & 1023u);
}

/* 64 query rows of (b, g) from src (q or dout) into a panel tile; rows >= used zero-filled. NT threads. */
template <int HD, int NT>
__device__ __forceinline__ void wb_load_qrows(unsigned char *dst, const __nv_bfloat16 *src, int b, int g, int B, int G,
                                              int n_h, int used) {
    constexpr int CH = HD / 8;
    for (int i = threadIdx.x; i < WB_ROWS * CH; i += NT) {
        int r = i / CH, c = i % CH;
        bool ok = r < used;
        size_t row = ok ? ((size_t)(b * B + r % B) * n_h + g * G + r / B) : 0;
        mma_cp_async16(dst + wb_off(r, c), src + row * HD + c * 8, ok ? 16 : 0);
    }
}

/* Kernel 1: Di[h·R + row] = Σ dO·O over the head dim (a copy of set 5's). */
template <int HD>
__global__ void wb_di_kernel(const __nv_bfloat16 *out, const __nv_bfloat16 *dout, float *di, int R, int n_h) {
    constexpr int CH = HD / 8;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t pair = i / CH;
    float s = 0.f;
    if (pair < (size_t)R * n_h) {
        uint4 a = *reinterpret_cast<const uint4 *>(out + i * 8), c = *reinterpret_cast<const uint4 *>(dout + i * 8);
        const __nv_bfloat162 *pa = (const __nv_bfloat162 *)&a, *pc = (const __nv_bfloat162 *)&c;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 x = __bfloat1622float2(pa[e]), y = __bfloat1622float2(pc[e]);
            s += x.x * y.x + x.y * y.y;
        }
    }
#pragma unroll
    for (int o = CH / 2; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (pair < (size_t)R * n_h && i % CH == 0) {
        size_t row = pair / n_h, h = pair % n_h;
        di[h * R + row] = s;
    }
}

/* One visit of a 64-row query tile (uQ, udO) by a warpgroup's 64 keys (uK, uV): dV += Pᵀ·dO, dK += dSᵀ·Q
 * (dK unscaled). All 128 threads of the warpgroup call it. kok0 / kok1: this thread's keys (tile rows
 * 16w + g and + 8) are visible to the block at all; causal >= 0: block keys, key k invisible to the
 * query slot j when k > j. sLse (natural log) and sDi per query row. The caller has fenced the
 * shared tiles (wg_fence_async_smem + barrier). Returns with no wgmma in flight. */
template <int HD>
__device__ __forceinline__ void wb_kv_visit(uint32_t uK, uint32_t uV, uint32_t uQ, uint32_t udO, const float *sLse,
                                            const float *sDi, bool kok0, bool kok1, int causal, int used, int B,
                                            float scale_log2, float *dk, float *dv) {
    const int lane = threadIdx.x & 31, wl = (threadIdx.x >> 5) & 3, t4 = lane & 3;
    float s[32], dp[32];   /* overwritten by the first k-step (scale-d 0) */
    wg_acc_fence<HD / 2>(dk);   /* materialise the accumulators before the fence (no injected arrive) */
    wg_acc_fence<HD / 2>(dv);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t off = (uint32_t)((kk >> 2) * WB_PANEL + (kk & 3) * 32);
        wg_mma_ss<64, 0, 0>(s, wg_desc_kmajor(uK + off), wg_desc_kmajor(uQ + off), kk > 0);
    }
    wg_commit();   /* group 1: Sᵀ */
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t off = (uint32_t)((kk >> 2) * WB_PANEL + (kk & 3) * 32);
        wg_mma_ss<64, 0, 0>(dp, wg_desc_kmajor(uV + off), wg_desc_kmajor(udO + off), kk > 0);
    }
    wg_commit();   /* group 2: dPᵀ */
    wg_wait<1>();  /* Sᵀ done; dPᵀ may still run while Pᵀ is computed */
    wg_acc_fence<32>(s);
    const int key0 = wl * 16 + (lane >> 2);
    uint32_t pa[4][4], da[4][4];
#pragma unroll
    for (int i = 0; i < 8; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = 8 * i + 2 * t4 + (e & 1);   /* query row of the tile */
            const int key = key0 + 8 * (e >> 1);
            const bool vis = (e >= 2 ? kok1 : kok0) && col < used && !(causal >= 0 && key > col % B);
            s[4 * i + e] = vis ? exp2f(s[4 * i + e] * scale_log2 - sLse[col] * WB_LOG2E) : 0.f;
        }
    }
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++) pa[kk][j] = mma_pack_bf16x2(s[8 * kk + 2 * j], s[8 * kk + 2 * j + 1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma_rs<HD, 1>(dv, pa[kk], wg_desc_mnmajor(udO + kk * 2048, WB_PANEL), 1);
    wg_commit();   /* group 3: dV += Pᵀ·dO */
    wg_wait<1>();  /* dPᵀ done; dV may still run while dSᵀ is computed */
    wg_acc_fence<32>(dp);
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = 8 * i + 2 * t4 + (e & 1);
            dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - sDi[col]);
        }
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++) da[kk][j] = mma_pack_bf16x2(dp[8 * kk + 2 * j], dp[8 * kk + 2 * j + 1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma_rs<HD, 1>(dk, da[kk], wg_desc_mnmajor(uQ + kk * 2048, WB_PANEL), 1);
    wg_commit();   /* group 4: dK += dSᵀ·Q */
    wg_wait<0>();
    wg_acc_fence<HD / 2>(dk);
    wg_acc_fence<HD / 2>(dv);
    wg_reg_fence<16>(&pa[0][0]);
    wg_reg_fence<16>(&da[0][0]);
}

/* fp32 rows (row, n_kv, HD) · mul from a warpgroup accumulator; thread rows r0 (d[4i], d[4i+1]) and r1
 * (d[4i+2], d[4i+3]), columns 8i + 2t. */
template <int HD>
__device__ __forceinline__ void wb_store_acc(float *dst, const float *acc, float mul, size_t row0, bool ok0, size_t row1,
                                             bool ok1, int n_heads, int h) {
    const int col = (threadIdx.x & 3) * 2;
#pragma unroll
    for (int i = 0; i < HD / 8; i++) {
        if (ok0) *(float2 *)(dst + (row0 * n_heads + h) * HD + 8 * i + col) = make_float2(acc[4 * i] * mul, acc[4 * i + 1] * mul);
        if (ok1)
            *(float2 *)(dst + (row1 * n_heads + h) * HD + 8 * i + col) = make_float2(acc[4 * i + 2] * mul, acc[4 * i + 3] * mul);
    }
}

/* Which warpgroups of a CTA owning context keys [p0, p0 + np_keys) (sDoc: their doc ids) block b visits:
 * bit w set when a key of warpgroup w's 64 is visible to b (exact: the per-key test of the mask). */
__device__ __forceinline__ int wb_visit_flags(const int32_t *anchors, const int32_t *doc_ids, const int *sDoc, int b,
                                              int p0, int np_keys, int window) {
    const int a = anchors[b], d = doc_ids[a];
    const int lo = window > 0 ? max(0, a - window) : 0;
    const int x0 = max(lo, p0), x1 = min(a, p0 + np_keys);
    int flag = 0;
    if (d != -1) {
        const int m = min(x1, p0 + WB_KT);
        for (int p = x0; p < m; p++)
            if (sDoc[p - p0] == d) { flag = 1; break; }
        for (int p = max(x0, p0 + WB_KT); p < x1; p++)
            if (sDoc[p - p0] == d) { flag |= 2; break; }
    }
    return flag;
}

/* Plan of kernel 2 (its load balance): plan[tile] = Σ over blocks of the number of the tile's warpgroups
 * they visit, the tile's cost. One CTA of 128 threads per tile of NK keys. Integer sums, deterministic. */
template <int NK>
__global__ void __launch_bounds__(128) wb_plan_kernel(const int32_t *anchors, const int32_t *doc_ids, int T, int N,
                                                      int window, int *plan) {
    __shared__ int sDoc[NK], sSum[4];
    const int p0 = blockIdx.x * NK, np_keys = min(NK, T - p0), tid = threadIdx.x;
    for (int i = tid; i < NK; i += 128) sDoc[i] = i < np_keys ? doc_ids[p0 + i] : -1;
    __syncthreads();
    int c = 0;
    for (int b = tid; b < N; b += 128) c += __popc(wb_visit_flags(anchors, doc_ids, sDoc, b, p0, np_keys, window));
    for (int o = 16; o; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    if ((tid & 31) == 0) sSum[tid >> 5] = c;
    __syncthreads();
    if (tid == 0) plan[blockIdx.x] = sSum[0] + sSum[1] + sSum[2] + sSum[3];
}

/* Kernel 2: dK, dV of the context keys [NWG·64·tile, +NWG·64) for kv head g; NWG warpgroups (2: one CTA
 * per SM sharing each visit's Q/dO tile; 1: two independent CTAs per SM). (tile, g) = (blockIdx.x,
 * blockIdx.y), or with a plan the tiles longest first, all kv heads of a tile together. */
template <int HD, int NWG>
__global__ void __launch_bounds__(NWG * 128, NWG == 1 ? 2 : 1)
wb_kv_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
             const int32_t *doc_ids, const __nv_bfloat16 *dout, const float *lse, const float *di, float *dk, float *dv,
             const int *plan, int T, int N, int B, int n_h, int n_kv, int window, float scale_log2, float scale) {
    constexpr int CH = HD / 8, TB = wb_tile<HD>::bytes, NK = NWG * WB_KT, NT = NWG * 128, ST = wb_stages(NWG);
    extern __shared__ unsigned char wb_smem_raw[];
    unsigned char *sm = wb_align1024(wb_smem_raw);
    unsigned char *sK = sm;              /* [NWG warpgroups][tile] */
    unsigned char *sV = sK + NWG * TB;   /* [NWG][tile] */
    unsigned char *sQ = sV + NWG * TB;   /* [ST buffers][tile] */
    unsigned char *sdO = sQ + ST * TB;   /* [ST buffers][tile] */
    __shared__ float sLse[ST][WB_ROWS], sDi[ST][WB_ROWS];
    __shared__ int sDoc[NK], sList[NT], sWarpN[NT / 32];

    __shared__ int sTile, sPlan[WB_PLAN_MAX];
    const int G = n_h / n_kv, used = G * B, R = N * B;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = tid >> 7;
    int tile = blockIdx.x, g = blockIdx.y;
    if (plan) {   /* longest first: CTA number L takes the tile of rank L / n_kv in the plan's order */
        const int n_tiles = gridDim.x, L = blockIdx.x + gridDim.x * blockIdx.y, want = L / n_kv;
        g = L % n_kv;
        for (int j = tid; j < n_tiles; j += NT) sPlan[j] = plan[j];
        __syncthreads();
        for (int j = tid; j < n_tiles; j += NT) {
            const int cj = sPlan[j];
            int rank = 0;
            for (int i = 0; i < n_tiles; i++) {
                const int ci = sPlan[i];
                rank += ci > cj || (ci == cj && i < j);
            }
            if (rank == want) sTile = j;
        }
        __syncthreads();
        tile = sTile;
    }
    const int p0 = tile * NK, np_keys = min(NK, T - p0);
    for (int i = tid; i < NK * CH; i += NT) {
        int r = i / CH, c = i % CH;
        bool ok = r < np_keys;
        size_t off = ((size_t)(ok ? p0 + r : 0) * n_kv + g) * HD + c * 8;
        uint32_t o = (uint32_t)((r >> 6) * TB) + wb_off(r & 63, c);
        mma_cp_async16(sK + o, k + off, ok ? 16 : 0);
        mma_cp_async16(sV + o, v + off, ok ? 16 : 0);
    }
    mma_commit();
    if (tid < NK) sDoc[tid] = tid < np_keys ? doc_ids[p0 + tid] : -1;

    float dka[HD / 2], dva[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dka[i] = dva[i] = 0.f;
    const int kr0 = wg * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2), kr1 = kr0 + 8;   /* key rows in the 128 */
    const uint32_t uK = wg_smem_u32(sK + wg * TB), uV = wg_smem_u32(sV + wg * TB);

    auto load_visit = [&](int b, int buf) {
        wb_load_qrows<HD, NT>(sQ + buf * TB, q, b, g, B, G, n_h, used);
        wb_load_qrows<HD, NT>(sdO + buf * TB, dout, b, g, B, G, n_h, used);
        if (tid < WB_ROWS) {
            int r = tid;
            bool ok = r < used;
            size_t idx = ok ? (size_t)(g * G + r / B) * R + (size_t)b * B + r % B : 0;
            wb_cp_async4(&sLse[buf][r], lse + idx, ok);   /* no register stall before the visit's wgmma */
            wb_cp_async4(&sDi[buf][r], di + idx, ok);
        }
    };

    for (int base = 0; base < N; base += NT) {
        __syncthreads();   /* sDoc is written; the previous chunk's readers of sList are done */
        const int flag = base + tid < N ? wb_visit_flags(anchors, doc_ids, sDoc, base + tid, p0, np_keys, window) : 0;
        unsigned bal = __ballot_sync(0xffffffffu, flag != 0);
        if (lane == 0) sWarpN[warp] = __popc(bal);
        __syncthreads();
        int before = 0, nvis = 0;
#pragma unroll
        for (int w = 0; w < NT / 32; w++) {
            before += w < warp ? sWarpN[w] : 0;
            nvis += sWarpN[w];
        }
        if (flag) sList[before + __popc(bal & ((1u << lane) - 1))] = (base + tid) | (flag << 28);
        __syncthreads();
        if (nvis == 0) continue;
#pragma unroll
        for (int j = 0; j < ST - 1; j++) {   /* ST-stage pipeline: visits i .. i + ST - 2 in flight */
            if (j < nvis) load_visit(sList[j] & 0x0FFFFFFF, j);
            mma_commit();
        }
        int buf = 0;
        for (int i = 0; i < nvis; i++) {
            mma_wait<ST - 2>();   /* visit i (and the K/V tile) landed */
            wg_fence_async_smem();
            __syncthreads();      /* visible to both warpgroups; everyone is done with visit i - 1's buffer */
            const int nxt = i + ST - 1;
            if (nxt < nvis) load_visit(sList[nxt] & 0x0FFFFFFF, nxt % ST);   /* into visit i - 1's buffer */
            mma_commit();
            const int e = sList[i], b = e & 0x0FFFFFFF, a = anchors[b], d = doc_ids[a];
            if ((e >> (28 + wg)) & 1) {   /* uniform per warpgroup: skip when none of its keys is seen */
                const int lo = window > 0 ? max(0, a - window) : 0;
                const bool kok0 = kr0 < np_keys && sDoc[kr0] == d && p0 + kr0 < a && p0 + kr0 >= lo;
                const bool kok1 = kr1 < np_keys && sDoc[kr1] == d && p0 + kr1 < a && p0 + kr1 >= lo;
                wb_kv_visit<HD>(uK, uV, wg_smem_u32(sQ + buf * TB), wg_smem_u32(sdO + buf * TB), sLse[buf], sDi[buf],
                                kok0, kok1, -1, used, B, scale_log2, dka, dva);
            }
            buf = buf + 1 == ST ? 0 : buf + 1;
        }
    }
    mma_wait<0>();   /* the K/V group when no block visited; the trailing empty groups */
    wb_store_acc<HD>(dk, dka, scale, (size_t)(p0 + kr0), kr0 < np_keys, (size_t)(p0 + kr1), kr1 < np_keys, n_kv, g);
    wb_store_acc<HD>(dv, dva, 1.f, (size_t)(p0 + kr0), kr0 < np_keys, (size_t)(p0 + kr1), kr1 < np_keys, n_kv, g);
}

/* The visible context range of block b narrowed to [first, last + 1] key of its document (a copy of set
 * 5's ba_ctx_range for WB_Q_THREADS threads; all threads call it). Empty for padding documents. */
__device__ __forceinline__ void wb_ctx_range(const int32_t *doc_ids, int a, int d, int window, int *lo_out, int *hi_out,
                                             int *sLo, int *sHi) {
    const int lo = window > 0 ? max(0, a - window) : 0, hi = d == -1 ? lo : a;
    if (threadIdx.x == 0) { *sLo = hi; *sHi = lo - 1; }
    __syncthreads();
    int mn = hi, mx = lo - 1;
#pragma unroll 4
    for (int p = lo + threadIdx.x; p < hi; p += WB_Q_THREADS)
        if (doc_ids[p] == d) { mn = min(mn, p); mx = max(mx, p); }
    for (int o = 16; o; o >>= 1) {
        mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    if ((threadIdx.x & 31) == 0) { atomicMin(sLo, mn); atomicMax(sHi, mx); }
    __syncthreads();
    *lo_out = *sLo;
    *hi_out = max(*sLo, *sHi + 1);
}

/* One key tile of kernel 3 for the warpgroup's 64 query rows: S = Q·Kᵀ, dP = dO·Vᵀ over the tile's first
 * NKEY keys (rows of uK/uV), P from lse, dS = P ⊙ (dP − Di), dqa += dS·K (unscaled). Visibility: key < nk,
 * and for a context tile its doc id (sDocTb) == d, for the block tile the causal test against the query
 * slots j0 / j1; rows !ok0 / !ok1 are idle. l2x = lse·log2(e), dix = Di of the thread's two rows. All 128
 * threads call it; returns with no wgmma in flight. */
template <int HD, int NKEY>
__device__ __forceinline__ void wb_dq_tile(float *dqa, uint32_t uQ, uint32_t udO, uint32_t uK, uint32_t uV,
                                           const int *sDocTb, int d, bool block_tile, int nk, bool ok0, bool ok1,
                                           int j0, int j1, int causal, float l20, float l21, float di0, float di1,
                                           float scale_log2) {
    const int lane = threadIdx.x & 31;
    float s[NKEY / 2], dp[NKEY / 2];   /* overwritten by the first k-step (scale-d 0) */
    wg_acc_fence<HD / 2>(dqa);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t off = (uint32_t)((kk >> 2) * WB_PANEL + (kk & 3) * 32);
        wg_mma_ss<NKEY, 0, 0>(s, wg_desc_kmajor(uQ + off), wg_desc_kmajor(uK + off), kk > 0);
    }
    wg_commit();   /* group 1: S */
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint32_t off = (uint32_t)((kk >> 2) * WB_PANEL + (kk & 3) * 32);
        wg_mma_ss<NKEY, 0, 0>(dp, wg_desc_kmajor(udO + off), wg_desc_kmajor(uV + off), kk > 0);
    }
    wg_commit();   /* group 2: dP */
    wg_wait<1>();  /* S done; P is computed while dP runs */
    wg_acc_fence<NKEY / 2>(s);
#pragma unroll
    for (int i = 0; i < NKEY / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = 8 * i + 2 * (lane & 3) + (e & 1);
            const bool second = e >= 2;
            const bool vis = key < nk && (block_tile || sDocTb[key] == d) && (second ? ok1 : ok0) &&
                             !(block_tile && causal && key > (second ? j1 : j0));
            s[4 * i + e] = vis ? exp2f(s[4 * i + e] * scale_log2 - (second ? l21 : l20)) : 0.f;
        }
    wg_wait<0>();
    wg_acc_fence<NKEY / 2>(dp);
    uint32_t da[NKEY / 16][4];
#pragma unroll
    for (int i = 0; i < NKEY / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - (e >= 2 ? di1 : di0));
#pragma unroll
    for (int kk = 0; kk < NKEY / 16; kk++)
#pragma unroll
        for (int j = 0; j < 4; j++) da[kk][j] = mma_pack_bf16x2(dp[8 * kk + 2 * j], dp[8 * kk + 2 * j + 1]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < NKEY / 16; kk++) wg_mma_rs<HD, 1>(dqa, da[kk], wg_desc_mnmajor(uK + kk * 2048, WB_PANEL), 1);
    wg_commit();   /* group 3: dQ += dS·K */
    wg_wait<0>();
    wg_acc_fence<HD / 2>(dqa);
    wg_reg_fence<NKEY / 4>(&da[0][0]);
}

/* Kernel 3: dQ of (block b, kv head g) and dK, dV of the block's own keys. */
template <int HD>
__global__ void __launch_bounds__(WB_Q_THREADS, 2)
wb_q_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
            const int32_t *doc_ids, const __nv_bfloat16 *out, const __nv_bfloat16 *dout, const float *lse, float *dq,
            float *dk, float *dv, int T, int N, int B, int n_h, int n_kv, int window, int causal, float scale_log2,
            float scale) {
    constexpr int CH = HD / 8, TB = wb_tile<HD>::bytes;
    extern __shared__ unsigned char wb_smem_raw[];
    unsigned char *sm = wb_align1024(wb_smem_raw);
    unsigned char *sQ = sm, *sdO = sm + TB;
    unsigned char *sK = sm + 2 * TB;   /* [2 buffers][tile] */
    unsigned char *sV = sm + 4 * TB;   /* [2 buffers][tile] */
    __shared__ int sDocT[2][WB_KT];   /* doc ids of a context tile's keys (cp.async, zero past its keys) */
    __shared__ float sLse[WB_ROWS], sDi[WB_ROWS];
    __shared__ int sLo, sHi;

    const int b = blockIdx.x, g = blockIdx.y, G = n_h / n_kv, used = G * B, R = N * B;
    const int tid = threadIdx.x, lane = tid & 31, wl = tid >> 5;
    const int a = anchors[b], d = doc_ids[a];
    wb_load_qrows<HD, WB_Q_THREADS>(sQ, q, b, g, B, G, n_h, used);
    wb_load_qrows<HD, WB_Q_THREADS>(sdO, dout, b, g, B, G, n_h, used);
    mma_commit();
    {   /* lse and Di = rowsum(dO ⊙ O) of the 64 rows: two threads per row */
        int r = tid >> 1, half = tid & 1;
        float s = 0.f;
        size_t row = (size_t)b * B + r % B;
        int h = g * G + r / B;
        if (r < used) {
            const __nv_bfloat16 *po = out + (row * n_h + h) * HD + half * (HD / 2);
            const __nv_bfloat16 *pd = dout + (row * n_h + h) * HD + half * (HD / 2);
            for (int c = 0; c < HD / 2; c += 8) {
                uint4 x = *reinterpret_cast<const uint4 *>(po + c), y = *reinterpret_cast<const uint4 *>(pd + c);
                const __nv_bfloat162 *px = (const __nv_bfloat162 *)&x, *py = (const __nv_bfloat162 *)&y;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float2 fx = __bfloat1622float2(px[e]), fy = __bfloat1622float2(py[e]);
                    s += fx.x * fy.x + fx.y * fy.y;
                }
            }
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (half == 0) {
            sDi[r] = r < used ? s : 0.f;
            sLse[r] = r < used ? lse[(size_t)h * R + row] : 0.f;
        }
    }
    int c_lo, c_hi;
    wb_ctx_range(doc_ids, a, d, window, &c_lo, &c_hi, &sLo, &sHi);
    const int n_ctx = (c_hi - c_lo + WB_KT - 1) / WB_KT, n_tiles = n_ctx + 1;

    /* K/V tile t (context tiles, then the block tile) into buffer buf, rows past its keys zero-filled;
     * and the context keys' doc ids into sDocT[buf], all in the current cp.async group */
    auto load_tile = [&](int t, int buf) {
        const int nk = t < n_ctx ? min(WB_KT, c_hi - c_lo - t * WB_KT) : B;
        for (int i = tid; i < WB_KT * CH; i += WB_Q_THREADS) {
            int r = i / CH, c = i % CH;
            bool ok = r < nk;
            size_t row = !ok ? 0 : t < n_ctx ? (size_t)(c_lo + t * WB_KT + r) : (size_t)T + (size_t)b * B + r;
            size_t off = (row * n_kv + g) * HD + c * 8;
            uint32_t o = (uint32_t)(buf * TB) + wb_off(r, c);
            mma_cp_async16(sK + o, k + off, ok ? 16 : 0);
            mma_cp_async16(sV + o, v + off, ok ? 16 : 0);
        }
        if (tid < WB_KT && t < n_ctx) {
            const int r = tid;
            wb_cp_async4(&sDocT[buf][r], doc_ids + (r < nk ? c_lo + t * WB_KT + r : 0), r < nk);
        }
    };
    load_tile(0, 0);
    mma_commit();

    float dqa[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dqa[i] = 0.f;
    const int r0 = wl * 16 + (lane >> 2), r1 = r0 + 8;   /* this thread's query rows */
    const int j0 = r0 % B, j1 = r1 % B;
    const bool ok0 = r0 < used, ok1 = r1 < used;
    const uint32_t uQ = wg_smem_u32(sQ), udO = wg_smem_u32(sdO);
    int buf = 0;
    for (int t = 0; t < n_tiles; t++) {
        mma_wait<0>();   /* tile t (and Q, dO) landed */
        wg_fence_async_smem();
        __syncthreads();   /* visible to the warpgroup; everyone is done with tile t - 1's buffer */
        if (t + 1 < n_tiles) load_tile(t + 1, buf ^ 1);
        mma_commit();
        const bool block_tile = t == n_ctx;
        const uint32_t uK = wg_smem_u32(sK + buf * TB), uV = wg_smem_u32(sV + buf * TB);
        const float l20 = sLse[r0] * WB_LOG2E, l21 = sLse[r1] * WB_LOG2E, di0 = sDi[r0], di1 = sDi[r1];
        const int nk = block_tile ? B : min(WB_KT, c_hi - c_lo - t * WB_KT);
        /* the block tile multiplies only the 16 or 32 keys that hold its B keys when B allows */
        if (!block_tile || B > 32)
            wb_dq_tile<HD, 64>(dqa, uQ, udO, uK, uV, sDocT[buf], d, block_tile, nk, ok0, ok1, j0, j1, causal, l20, l21,
                               di0, di1, scale_log2);
        else if (B > 16)
            wb_dq_tile<HD, 32>(dqa, uQ, udO, uK, uV, sDocT[buf], d, block_tile, nk, ok0, ok1, j0, j1, causal, l20, l21,
                               di0, di1, scale_log2);
        else
            wb_dq_tile<HD, 16>(dqa, uQ, udO, uK, uV, sDocT[buf], d, block_tile, nk, ok0, ok1, j0, j1, causal, l20, l21,
                               di0, di1, scale_log2);
        buf ^= 1;   /* the last (block) tile stays in buf ^ 1 for the dK/dV pass */
    }
    {
        float *q0 = dq + (((size_t)b * B + j0) * n_h + g * G + r0 / B) * HD + (lane & 3) * 2;
        float *q1 = dq + (((size_t)b * B + j1) * n_h + g * G + r1 / B) * HD + (lane & 3) * 2;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            if (ok0) *(float2 *)(q0 + 8 * i) = make_float2(dqa[4 * i] * scale, dqa[4 * i + 1] * scale);
            if (ok1) *(float2 *)(q1 + 8 * i) = make_float2(dqa[4 * i + 2] * scale, dqa[4 * i + 3] * scale);
        }
    }
    {   /* dK, dV of the block's own keys (tile rows 0..B-1 of the last buffer) */
        const int last = buf ^ 1;
        float dka[HD / 2], dva[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) dka[i] = dva[i] = 0.f;
        const int kr0 = r0, kr1 = r1;
        wb_kv_visit<HD>(wg_smem_u32(sK + last * TB), wg_smem_u32(sV + last * TB), uQ, udO, sLse, sDi, kr0 < B, kr1 < B,
                        causal ? 0 : -1, used, B, scale_log2, dka, dva);
        const size_t row0 = (size_t)T + (size_t)b * B + kr0, row1 = (size_t)T + (size_t)b * B + kr1;
        wb_store_acc<HD>(dk, dka, scale, row0, kr0 < B, row1, kr1 < B, n_kv, g);
        wb_store_acc<HD>(dv, dva, 1.f, row0, kr0 < B, row1, kr1 < B, n_kv, g);
    }
}

template <typename K>
int wb_smem_attr(K kernel, size_t smem) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return e == cudaSuccess ? 0 : kernels_fail("ba_wg_backward: cudaFuncSetAttribute: %s", cudaGetErrorString(e));
}

template <int HD, int NWG>
int wb_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
              const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse, float *dq, float *dk,
              float *dv, cudaStream_t stream) {
    const size_t smem_kv = (2 * NWG + 2 * wb_stages(NWG)) * (size_t)wb_tile<HD>::bytes + 1024;
    const size_t smem_q = 6 * (size_t)wb_tile<HD>::bytes + 1024;
    if (wb_smem_attr(wb_kv_kernel<HD, NWG>, smem_kv) || wb_smem_attr(wb_q_kernel<HD>, smem_q)) return -1;
    const int R = c->N * c->B;
    const float scale_log2 = c->scale * WB_LOG2E;
    const size_t di_threads = (size_t)R * c->n_h * (HD / 8);
    float *di = dq;   /* scratch: n_h·R floats, overwritten by kernel 3 */
    wb_di_kernel<HD><<<(unsigned)((di_threads + 255) / 256), 256, 0, stream>>>(
        (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, di, R, c->n_h);
    KERNELS_CHECK_LAUNCH("ba_wg_backward di");
    /* the plan (kernel 2's per-tile costs) lives in dq's scratch after Di, when it fits */
    const int n_tiles = (c->T + NWG * WB_KT - 1) / (NWG * WB_KT);
    int *plan = NULL;
    if (n_tiles <= WB_PLAN_MAX && (size_t)n_tiles <= (size_t)c->n_h * R * (HD - 1)) {
        plan = (int *)(dq + (size_t)c->n_h * R);
        wb_plan_kernel<NWG * WB_KT><<<n_tiles, 128, 0, stream>>>(anchors, doc_ids, c->T, c->N, c->window, plan);
        KERNELS_CHECK_LAUNCH("ba_wg_backward plan");
    }
    wb_kv_kernel<HD, NWG><<<dim3(n_tiles, c->n_kv), NWG * 128, smem_kv, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (const __nv_bfloat16 *)dout, lse, di, dk, dv, plan, c->T, c->N, c->B, c->n_h, c->n_kv, c->window, scale_log2,
        c->scale);
    KERNELS_CHECK_LAUNCH("ba_wg_backward kv");
    wb_q_kernel<HD><<<dim3(c->N, c->n_kv), WB_Q_THREADS, smem_q, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, lse, dq, dk, dv, c->T, c->N, c->B, c->n_h, c->n_kv,
        c->window, c->causal, scale_log2, c->scale);
    KERNELS_CHECK_LAUNCH("ba_wg_backward q");
    return 0;
}

}  // namespace

extern "C" int ba_wg_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                              const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                              const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    /* DFLASH_BA_WG_KV (read per call): warpgroups per dK/dV CTA, 2 (default) or 1 — a measurement knob */
    const char *e = getenv("DFLASH_BA_WG_KV");
    int nwg = 2;
    if (e && e[0]) {
        if ((e[0] != '1' && e[0] != '2') || e[1]) return kernels_fail("ba_wg_backward: DFLASH_BA_WG_KV=%s, expected 1 or 2", e);
        nwg = e[0] - '0';
    }
    if (c->d_h == 128)
        return nwg == 2 ? wb_launch<128, 2>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream)
                        : wb_launch<128, 1>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    if (c->d_h == 64)
        return nwg == 2 ? wb_launch<64, 2>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream)
                        : wb_launch<64, 1>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    return kernels_fail("ba_wg_backward: d_h=%d, expected 64 or 128", c->d_h);
}
