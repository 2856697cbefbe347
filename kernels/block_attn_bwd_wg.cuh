/*
 * kernels/block_attn_bwd_wg.cuh — the wgmma block attention backward: kernel templates and the launch code
 * (kernels/block_attn_bwd_wg.cu describes the kernels and why the library fixes each knob). Included by
 * kernels/block_attn_bwd_wg.cu, which holds the entry point (kernels/block_attn_wg.h), and by
 * kernels/bench/block_attn_bench.cu; everything is in an anonymous namespace: it defines no external symbol.
 */
#ifndef KERNELS_BLOCK_ATTN_BWD_WG_CUH
#define KERNELS_BLOCK_ATTN_BWD_WG_CUH

#include "kernels/block_attn.h"
#include "kernels/block_attn_common.cuh"
#include "kernels/block_attn_wg.h"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

#include <cstdlib>
#include <cstring>

#include <cuda_bf16.h>

namespace {

constexpr int WB_ROWS = 64;            /* query rows per tile (one wgmma M) */
constexpr int WB_KT = 64;              /* keys per warpgroup tile */
constexpr int WB_PANEL = 64 * 128;     /* bytes of one 64-row panel */
constexpr float WB_LOG2E = 1.4426950408889634f;
constexpr int WB_Q_THREADS = 128;      /* kernel 3: one warpgroup */
constexpr int WB_PLAN_MAX = 1024;      /* kernel 2 reorders its tiles (longest first) up to this many */
constexpr int WB_KV_NWG = 2;           /* kernel 2: warpgroups per CTA (one CTA per SM shares each visit's Q/dO tile) */
/* kernel 2's query-tile stages: 4, loads 2 visits ahead (a buffer is refilled two visits after its visit, once
 * every warpgroup's dK reading it has retired) */
constexpr int WB_KV_ST = 4;

template <int HD> struct wb_tile {
    static constexpr int bytes = 64 * HD * 2;   /* HD/64 panels */
};

/* shared byte offset of 16-byte chunk c (8 columns) of row r in a 64-row tile of panels */
__device__ __forceinline__ uint32_t wb_off(int r, int c) { return (uint32_t)((c >> 3) * WB_PANEL) + wg_sw128(r, c & 7); }

/* 4 bytes gmem -> smem asynchronously (zero-filled when !ok), in the current cp.async group */
__device__ __forceinline__ void wb_cp_async4(void *smem, const void *gmem, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(wg_smem_u32(smem)), "l"(gmem), "r"(ok ? 4 : 0));
}

/* 2^x, one MUFU.EX2 (flushes results below 2^-126 to 0; exp2f adds a range test and two FMULs per call) */
__device__ __forceinline__ float wb_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned char *wb_align1024(unsigned char *p) {
    uint32_t s = wg_smem_u32(p);
    return p + ((1024u - (s & 1023u)) & 1023u);
}

/* 64 query rows of (b, g) from src (q or dout) into a panel tile; rows >= used zero-filled. NT threads. */
template <int HD, int NT>
__device__ __forceinline__ void wb_load_qrows(unsigned char *dst, const __nv_bfloat16 *src, int b, int g, int B, int G,
                                              int n_h, int used, int tid = threadIdx.x) {
    constexpr int CH = HD / 8;
    for (int i = tid; i < WB_ROWS * CH; i += NT) {
        int r = i / CH, c = i % CH;
        bool ok = r < used;
        size_t row = ok ? ((size_t)(b * B + r % B) * n_h + g * G + r / B) : 0;
        mma_cp_async16(dst + wb_off(r, c), src + row * HD + c * 8, ok ? 16 : 0);
    }
}

/* Kernel 1: ba_di_kernel<HD, true> (kernels/block_attn_common.cuh): Di and lse·log2(e). */

/* dSᵀ = P ⊙ (dPᵀ - Di) in place of dp (64 keys × 16 of this thread's columns), Di per column from shared
 * memory: the one copy both dK/dV visits use. */
__device__ __forceinline__ void wb_ds(float *dp, const float *s, const float *sDi, int t4) {
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = 8 * i + 2 * t4 + (e & 1);
            dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - sDi[col]);
        }
}

/* One visit of a 64-row query tile (uQ, udO) by a warpgroup's 64 keys (uK, uV): dV += Pᵀ·dO, dK += dSᵀ·Q
 * (dK unscaled). All 128 threads of the warpgroup call it. kok0 / kok1: this thread's keys (tile rows
 * 16w + g and + 8) are visible to the block at all; causal >= 0: block keys, key k invisible to the
 * query slot j when k > j. sLse (natural log) and sDi per query row. The caller has fenced the
 * shared tiles (wg_fence_async_smem + barrier). Returns with no wgmma in flight. */
template <int HD, bool FM = false>
__device__ __forceinline__ void wb_kv_visit(uint32_t uK, uint32_t uV, uint32_t uQ, uint32_t udO, const float *sLse,
                                            const float *sDi, bool kok0, bool kok1, int causal, int used, int B,
                                            float scale_log2, float *dk, float *dv, const int *sSlot = nullptr) {
    const int lane = threadIdx.x & 31, wl = (threadIdx.x >> 5) & 3, t4 = lane & 3;
    float s[32], dp[32];   /* overwritten by the first k-step (scale-d 0) */
    wg_acc_fence<HD / 2>(dk);   /* materialise the accumulators before the fence (no injected arrive) */
    wg_acc_fence<HD / 2>(dv);
    wg_fence();
    wg_mma_ss_kk<64, HD>(s, uK, WB_PANEL, uQ, WB_PANEL, false);
    wg_commit();   /* group 1: Sᵀ */
    wg_mma_ss_kk<64, HD>(dp, uV, WB_PANEL, udO, WB_PANEL, false);
    wg_commit();   /* group 2: dPᵀ */
    wg_wait<1>();  /* Sᵀ done; dPᵀ may still run while Pᵀ is computed */
    wg_acc_fence<32>(s);
    const int key0 = wl * 16 + (lane >> 2);
    uint32_t pa[4][4], da[4][4];
    if (FM) {
        /* FM (the library's), the block keys of kernel 3: sSlot[col] = col % B (a table, no modulo per
         * element), the exponent's lse·log2(e) once per column (+inf past the used rows), branch-free */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int c0 = 8 * i + 2 * t4;
            const float2 L = *reinterpret_cast<const float2 *>(sLse + c0);
            const int2 J = *reinterpret_cast<const int2 *>(sSlot + c0);
            const float l2a = c0 < used ? L.x * WB_LOG2E : __int_as_float(0x7f800000);
            const float l2b = c0 + 1 < used ? L.y * WB_LOG2E : __int_as_float(0x7f800000);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = key0 + 8 * (e >> 1), j = (e & 1) ? J.y : J.x;
                const float p = wb_ex2(fmaf(s[4 * i + e], scale_log2, -((e & 1) ? l2b : l2a)));
                s[4 * i + e] = (e >= 2 ? kok1 : kok0) && !(causal >= 0 && key > j) ? p : 0.f;
            }
        }
    } else {
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
    }
    mma_pack_frags<4>(s, &pa[0][0]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma_rs<HD, 1>(dv, pa[kk], wg_desc_mnmajor(udO + kk * 2048, WB_PANEL), 1);
    wg_commit();   /* group 3: dV += Pᵀ·dO */
    wg_wait<1>();  /* dPᵀ done; dV may still run while dSᵀ is computed */
    wg_acc_fence<32>(dp);
    wb_ds(dp, s, sDi, t4);
    mma_pack_frags<4>(dp, &da[0][0]);
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

/* wb_kv_visit for kernel 2's pipelined walk: returns with this visit's dK
 * product still in flight (one commit group), so the tensor core is not drained at every visit's
 * barrier; the next visit's Sᵀ and dPᵀ queue behind it. da (16 registers: the dSᵀ A-fragments) must
 * stay untouched until the product completes: it lives in the caller and is fenced after the next
 * visit's wg_wait<1> (which retires the previous dK and this Sᵀ), or after wb_kv_drain. The caller
 * must not refill a Q buffer until every warpgroup has passed the wait that retires the dK reading it.
 * Context keys only (no causal test). */
struct wb_nohook {   /* wb_kv_visit_p's default hook: nothing */
    __device__ __forceinline__ void operator()() const {}
};

template <int HD, bool FM = false, typename F = wb_nohook>
__device__ __forceinline__ void wb_kv_visit_p(uint32_t uK, uint32_t uV, uint32_t uQ, uint32_t udO, const float *sLse,
                                              const float *sDi, bool kok0, bool kok1, int used, float scale_log2,
                                              float *dk, float *dv, uint32_t *da, F after_issue = F()) {
    const int lane = threadIdx.x & 31, t4 = lane & 3;
    float s[32], dp[32];
    wg_fence();
    wg_mma_ss_kk<64, HD>(s, uK, WB_PANEL, uQ, WB_PANEL, false);
    wg_commit();   /* Sᵀ */
    wg_mma_ss_kk<64, HD>(dp, uV, WB_PANEL, udO, WB_PANEL, false);
    wg_commit();   /* dPᵀ */
    after_issue();   /* LA (with FM): the loads of a later visit, while Sᵀ and dPᵀ run; else nothing */
    wg_wait<1>();  /* the previous visit's dK and this Sᵀ done */
    wg_acc_fence<32>(s);
    wg_reg_fence<16>(da);
    uint32_t pa[4][4];
    if (FM) {
        /* FM (the library's): sLse holds lse·log2(e) (the Di kernel's lse2). Branch-free: the thread's 16
         * query columns' exponents once per visit (+inf past the used rows: exp2 gives 0), then per element
         * one FFMA, one MUFU.EX2 and one select on the key row's visibility. Same values as below. */
        float l2c[16];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int c0 = 8 * i + 2 * t4;
            const float2 L = *reinterpret_cast<const float2 *>(sLse + c0);
            l2c[2 * i] = c0 < used ? L.x : __int_as_float(0x7f800000);
            l2c[2 * i + 1] = c0 + 1 < used ? L.y : __int_as_float(0x7f800000);
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = wb_ex2(fmaf(s[4 * i + e], scale_log2, -l2c[2 * i + (e & 1)]));
                s[4 * i + e] = (e >= 2 ? kok1 : kok0) ? p : 0.f;
            }
    } else {
#pragma unroll
    for (int i = 0; i < 8; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int col = 8 * i + 2 * t4 + (e & 1);
            const bool vis = (e >= 2 ? kok1 : kok0) && col < used;
            s[4 * i + e] = vis ? exp2f(s[4 * i + e] * scale_log2 - sLse[col] * WB_LOG2E) : 0.f;
        }
    }
    }
    mma_pack_frags<4>(s, &pa[0][0]);
    wg_acc_fence<HD / 2>(dv);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma_rs<HD, 1>(dv, pa[kk], wg_desc_mnmajor(udO + kk * 2048, WB_PANEL), 1);
    wg_commit();   /* dV += Pᵀ·dO */
    wg_wait<1>();  /* dPᵀ done */
    wg_acc_fence<32>(dp);
    if (FM) {   /* Di of the thread's 16 columns, 8 paired loads */
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float2 D = *reinterpret_cast<const float2 *>(sDi + 8 * i + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++) dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - ((e & 1) ? D.y : D.x));
        }
    } else {
        wb_ds(dp, s, sDi, t4);
    }
    mma_pack_frags<4>(dp, da);
    wg_acc_fence<HD / 2>(dk);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_mma_rs<HD, 1>(dk, da + 4 * kk, wg_desc_mnmajor(uQ + kk * 2048, WB_PANEL), 1);
    wg_commit();   /* dK += dSᵀ·Q */
    wg_wait<1>();  /* dV done (pa free); dK stays in flight */
    wg_acc_fence<HD / 2>(dv);
    wg_reg_fence<16>(&pa[0][0]);
}

/* retire every wgmma of the warpgroup (the pipelined visit's dK) and fence its registers */
template <int HD>
__device__ __forceinline__ void wb_kv_drain(float *dk, float *dv, uint32_t *da) {
    wg_wait<0>();
    wg_acc_fence<HD / 2>(dk);
    wg_acc_fence<HD / 2>(dv);
    wg_reg_fence<16>(da);
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
                                              int p0, int np_keys, int window, int *a_out = nullptr,
                                              int *d_out = nullptr) {
    const int a = anchors[b], d = doc_ids[a];
    if (a_out) { *a_out = a; *d_out = d; }
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

/* Kernel 2: dK, dV of the context keys [NWG·64·tile, +NWG·64) for kv head g; NWG = 2 warpgroups, one CTA
 * per SM sharing each visit's Q/dO tile. (tile, g) = (blockIdx.x, blockIdx.y), or with a plan the tiles
 * longest first, all kv heads of a tile together. FM: the fast elementwise (lse holds lse·log2(e)); LA: the
 * loads of a later visit issued after a visit's Sᵀ, dPᵀ products (wb_launch passes both, or neither when dq
 * cannot hold lse·log2(e)). */
template <int HD, bool FM = false, bool LA = false>
__global__ void __launch_bounds__(WB_KV_NWG * 128, 1)
wb_kv_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
             const int32_t *doc_ids, const __nv_bfloat16 *dout, const float *lse, const float *di, float *dk, float *dv,
             const int *plan, int T, int N, int B, int n_h, int n_kv, int window, float scale_log2, float scale) {
    constexpr int NWG = WB_KV_NWG, CH = HD / 8, TB = wb_tile<HD>::bytes, NK = NWG * WB_KT, NT = NWG * 128,
                  ST = WB_KV_ST, PD = ST - 2;   /* PD: load distance in visits */
    extern __shared__ unsigned char wb_smem_raw[];
    unsigned char *sm = wb_align1024(wb_smem_raw);
    unsigned char *sK = sm;              /* [NWG warpgroups][tile] */
    unsigned char *sV = sK + NWG * TB;   /* [NWG][tile] */
    unsigned char *sQ = sV + NWG * TB;   /* [ST buffers][tile] */
    unsigned char *sdO = sQ + ST * TB;   /* [ST buffers][tile] */
    __shared__ __align__(16) float sLse[ST][WB_ROWS];   /* FM: lse·log2(e) (the caller passes lse2) */
    __shared__ __align__(16) float sDi[ST][WB_ROWS];
    __shared__ int sDoc[NK], sList[NT], sWarpN[NT / 32], sVA[NT], sVD[NT];   /* sVA, sVD: anchor, doc */

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
    uint32_t da[16];   /* the dSᵀ fragments of the dK product in flight */
#pragma unroll
    for (int i = 0; i < 16; i++) da[i] = 0;
    const int kr0 = wg * 64 + ((tid >> 5) & 3) * 16 + (lane >> 2), kr1 = kr0 + 8;   /* key rows in the 128 */
    const uint32_t uK = wg_smem_u32(sK + wg * TB), uV = wg_smem_u32(sV + wg * TB);

    /* LA: the thread's query rows' gmem offsets without the block's part (b·B·n_h·HD), computed once (no
     * division by B at each visit); -1: a row past the used ones (zero-filled); roff[NJ]: the lse / Di index
     * without b·B (threads tid < 64). Not initialised without LA (unused there). */
    constexpr int NJ = LA ? WB_ROWS * CH / NT : 0;
    int roff[NJ + 1];
    if constexpr (LA) {
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            const int i = tid + j * NT, r = i / CH, c = i % CH;
            roff[j] = r < used ? ((r % B) * n_h + g * G + r / B) * HD + c * 8 : -1;
        }
        roff[NJ] = tid < WB_ROWS ? (g * G + tid / B) * R + tid % B : 0;
    }
    auto load_visit = [&](int b, int buf) {
        if constexpr (LA) {
            const size_t boff = (size_t)b * B * n_h * HD;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                const int i = tid + j * NT, r = i / CH, c = i % CH;   /* compile-time shifts (CH, NT powers of 2) */
                const bool ok = roff[j] >= 0;
                const size_t off = ok ? boff + (size_t)roff[j] : 0;
                mma_cp_async16(sQ + buf * TB + wb_off(r, c), q + off, ok ? 16 : 0);
                mma_cp_async16(sdO + buf * TB + wb_off(r, c), dout + off, ok ? 16 : 0);
            }
            if (tid < WB_ROWS) {
                const bool ok = tid < used;
                const size_t idx = ok ? (size_t)b * B + (size_t)roff[NJ] : 0;
                wb_cp_async4(&sLse[buf][tid], lse + idx, ok);
                wb_cp_async4(&sDi[buf][tid], di + idx, ok);
            }
            return;
        }
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
        int va = 0, vd = 0;
        const int flag =
            base + tid < N ? wb_visit_flags(anchors, doc_ids, sDoc, base + tid, p0, np_keys, window, &va, &vd) : 0;
        unsigned bal = __ballot_sync(0xffffffffu, flag != 0);
        if (lane == 0) sWarpN[warp] = __popc(bal);
        __syncthreads();
        int before = 0, nvis = 0;
#pragma unroll
        for (int w = 0; w < NT / 32; w++) {
            before += w < warp ? sWarpN[w] : 0;
            nvis += sWarpN[w];
        }
        if (flag) {
            const int pos = before + __popc(bal & ((1u << lane) - 1));
            sList[pos] = (base + tid) | (flag << 28);
            sVA[pos] = va;
            sVD[pos] = vd;
        }
        __syncthreads();
        if (nvis == 0) continue;
#pragma unroll
        for (int j = 0; j < PD; j++) {   /* ST-stage pipeline: visits i .. i + PD - 1 in flight */
            if (j < nvis) load_visit(sList[j] & 0x0FFFFFFF, j);
            mma_commit();
        }
        int buf = 0;
        for (int i = 0; i < nvis; i++) {
            mma_wait<PD - 1>();   /* visit i (and the K/V tile) landed */
            wg_fence_async_smem();
            __syncthreads();      /* visible to both warpgroups; everyone is done with visit i - 1's buffer */
            const int nxt = i + PD;
            /* into visit i + PD - ST's buffer; LA: issued after this visit's Sᵀ, dPᵀ (or at once when the
             * warpgroup skips the visit), still before any of this visit's waits on older products */
            auto issue_loads = [&]() {
                if (nxt < nvis) load_visit(sList[nxt] & 0x0FFFFFFF, nxt % ST);
                mma_commit();
            };
            if constexpr (!LA) {   /* without LA: the loads at once (not through the lambda) */
                if (nxt < nvis) load_visit(sList[nxt] & 0x0FFFFFFF, nxt % ST);
                mma_commit();
            }
            const int e = sList[i], a = sVA[i], d = sVD[i];   /* anchor and doc read at the scan */
            if ((e >> (28 + wg)) & 1) {   /* uniform per warpgroup: skip when none of its keys is seen */
                const int lo = window > 0 ? max(0, a - window) : 0;
                const bool kok0 = kr0 < np_keys && sDoc[kr0] == d && p0 + kr0 < a && p0 + kr0 >= lo;
                const bool kok1 = kr1 < np_keys && sDoc[kr1] == d && p0 + kr1 < a && p0 + kr1 >= lo;
                if (LA)
                    wb_kv_visit_p<HD, FM>(uK, uV, wg_smem_u32(sQ + buf * TB), wg_smem_u32(sdO + buf * TB), sLse[buf],
                                          sDi[buf], kok0, kok1, used, scale_log2, dka, dva, da, issue_loads);
                else
                    wb_kv_visit_p<HD, FM>(uK, uV, wg_smem_u32(sQ + buf * TB), wg_smem_u32(sdO + buf * TB), sLse[buf],
                                          sDi[buf], kok0, kok1, used, scale_log2, dka, dva, da);
            } else {
                if constexpr (LA) issue_loads();
                wb_kv_drain<HD>(dka, dva, da);   /* its last dK may read a buffer refilled next visit */
            }
            buf = buf + 1 == ST ? 0 : buf + 1;
        }
        wb_kv_drain<HD>(dka, dva, da);   /* before the next chunk's loads reuse the buffers */
    }
    mma_wait<0>();   /* the K/V group when no block visited; the trailing empty groups */
    wb_store_acc<HD>(dk, dka, scale, (size_t)(p0 + kr0), kr0 < np_keys, (size_t)(p0 + kr1), kr1 < np_keys, n_kv, g);
    wb_store_acc<HD>(dv, dva, 1.f, (size_t)(p0 + kr0), kr0 < np_keys, (size_t)(p0 + kr1), kr1 < np_keys, n_kv, g);
}

/* Kernel 3's products around a key tile's elementwise step (wb_dq_tile, wb_dq_tile_f). wb_dq_sdp issues
 * S = Q·Kᵀ (group 1) and dP = dO·Vᵀ (group 2) over NKEY keys and returns once S is done (dP in flight: P is
 * computed meanwhile). wb_dq_ds waits for dP, forms dS = P ⊙ (dP − Di) from P in s, rounds it to bf16 A
 * fragments and adds dqa += dS·K (group 3); it returns with no wgmma in flight. All 128 threads call both. */
template <int HD, int NKEY>
__device__ __forceinline__ void wb_dq_sdp(float *dqa, float *s, float *dp, uint32_t uQ, uint32_t udO, uint32_t uK,
                                          uint32_t uV) {
    wg_acc_fence<HD / 2>(dqa);
    wg_fence();
    wg_mma_ss_kk<NKEY, HD>(s, uQ, WB_PANEL, uK, WB_PANEL, false);   /* overwritten by the first k-step */
    wg_commit();   /* group 1: S */
    wg_mma_ss_kk<NKEY, HD>(dp, udO, WB_PANEL, uV, WB_PANEL, false);
    wg_commit();   /* group 2: dP */
    wg_wait<1>();
    wg_acc_fence<NKEY / 2>(s);
}
template <int HD, int NKEY>
__device__ __forceinline__ void wb_dq_ds(float *dqa, const float *s, float *dp, float di0, float di1, uint32_t uK) {
    wg_wait<0>();
    wg_acc_fence<NKEY / 2>(dp);
    uint32_t da[NKEY / 16][4];
#pragma unroll
    for (int i = 0; i < NKEY / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dp[4 * i + e] = s[4 * i + e] * (dp[4 * i + e] - (e >= 2 ? di1 : di0));
    mma_pack_frags<NKEY / 16>(dp, &da[0][0]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < NKEY / 16; kk++) wg_mma_rs<HD, 1>(dqa, da[kk], wg_desc_mnmajor(uK + kk * 2048, WB_PANEL), 1);
    wg_commit();   /* group 3: dQ += dS·K */
    wg_wait<0>();
    wg_acc_fence<HD / 2>(dqa);
    wg_reg_fence<NKEY / 4>(&da[0][0]);
}

/* One key tile of kernel 3 for the warpgroup's 64 query rows: S = Q·Kᵀ, dP = dO·Vᵀ over the tile's first
 * NKEY keys (rows of uK/uV), P from lse, dS = P ⊙ (dP − Di), dqa += dS·K (unscaled). Visibility: klo <= key < nk,
 * and for a context tile its doc id (sDocTb) == d, for the block tile the causal test against the query
 * slots j0 / j1; rows !ok0 / !ok1 are idle. l2x = lse·log2(e), dix = Di of the thread's two rows. All 128
 * threads call it; returns with no wgmma in flight. */
template <int HD, int NKEY>
__device__ __forceinline__ void wb_dq_tile(float *dqa, uint32_t uQ, uint32_t udO, uint32_t uK, uint32_t uV,
                                           const int *sDocTb, int d, bool block_tile, int nk, int klo, bool ok0, bool ok1,
                                           int j0, int j1, int causal, float l20, float l21, float di0, float di1,
                                           float scale_log2) {
    const int lane = threadIdx.x & 31;
    float s[NKEY / 2], dp[NKEY / 2];
    wb_dq_sdp<HD, NKEY>(dqa, s, dp, uQ, udO, uK, uV);
#pragma unroll
    for (int i = 0; i < NKEY / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = 8 * i + 2 * (lane & 3) + (e & 1);
            const bool second = e >= 2;
            const bool vis = key < nk && key >= klo && (block_tile || sDocTb[key] == d) && (second ? ok1 : ok0) &&
                             !(block_tile && causal && key > (second ? j1 : j0));
            s[4 * i + e] = vis ? exp2f(s[4 * i + e] * scale_log2 - (second ? l21 : l20)) : 0.f;
        }
    wb_dq_ds<HD, NKEY>(dqa, s, dp, di0, di1, uK);
}

/* wb_dq_tile's fast elementwise (FM, the library's): the same products and values, branch-free. KM picks
 * the key test, decided per tile by the caller (uniform per warpgroup): 0 a full context tile (every key
 * visible: no test), 1 a context tile cut by the row-independent visible range [klo, nk) (the block's keys
 * of its document are contiguous: two compares per key, no doc id), 2 as 1 plus the doc id (documents not
 * contiguous: the general mask), 3 the block tile (key < nk, causal: key <= the row's slot). Rows past the
 * used ones come with l20 / l21 = +inf (exp2 gives 0), so no row test. Per element: one FFMA, one
 * MUFU.EX2, at most one select; dS = P·(dP − Di) with Di in registers. Returns with no wgmma in flight. */
template <int HD, int NKEY, int KM>
__device__ __forceinline__ void wb_dq_tile_f(float *dqa, uint32_t uQ, uint32_t udO, uint32_t uK, uint32_t uV,
                                             const int *sDocTb, int d, int nk, int klo, int j0, int j1, int causal,
                                             float l20, float l21, float di0, float di1, float scale_log2) {
    const int lane = threadIdx.x & 31;
    float s[NKEY / 2], dp[NKEY / 2];
    wb_dq_sdp<HD, NKEY>(dqa, s, dp, uQ, udO, uK, uV);
#pragma unroll
    for (int i = 0; i < NKEY / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = 8 * i + 2 * (lane & 3) + (e & 1);
            const float p = wb_ex2(fmaf(s[4 * i + e], scale_log2, -(e >= 2 ? l21 : l20)));
            bool vis = true;
            if (KM == 1) vis = key >= klo && key < nk;
            if (KM == 2) vis = key >= klo && key < nk && sDocTb[key] == d;
            if (KM == 3) vis = key < nk && !(causal && key > (e >= 2 ? j1 : j0));
            s[4 * i + e] = KM == 0 ? p : vis ? p : 0.f;
        }
    wb_dq_ds<HD, NKEY>(dqa, s, dp, di0, di1, uK);
}

/* Kernel 3's plan (QR, the library's), launched between kernels 2 and 3: per block b (one CTA of 128
 * threads) the range scan kernel 3 does otherwise (the same ba_doc_span, so the same values), once per block
 * instead of once per (block, kv head), written as one int4 record {lo, hi, cnt, d} (the document's visible
 * context keys [lo, hi), how many of them are of the document, its doc id) into the first 16 bytes of the
 * block's own dq rows for each kv head g: dq[((b·B)·n_h + g·G)·HD ..]. That spot is written only by kernel 3's
 * CTA of (b, g), at its end, after its threads read the record at its start (ordered by the CTA's first
 * barrier): no other CTA can overwrite a record before it is read. Dq's earlier scratch (Di, kernel 2's plan,
 * lse2) is dead once kernel 2 has finished, hence the launch after it. */
__global__ void __launch_bounds__(128) wb_qplan_kernel(const int32_t *anchors, const int32_t *doc_ids, int B, int n_h,
                                                       int n_kv, int HD, int window, float *dq) {
    __shared__ int sLo, sHi, sCnt;
    const int b = blockIdx.x, tid = threadIdx.x;
    const int a = anchors[b], d = doc_ids[a];
    const int lo = window > 0 ? max(0, a - window) : 0, hi = d == -1 ? lo : a;
    if (tid == 0) { sLo = hi; sHi = lo - 1; sCnt = 0; }
    __syncthreads();
    ba_doc_span<WB_Q_THREADS, true, int, true>(doc_ids, lo, hi, d, tid, (tid & 31) == 0, &sLo, &sHi, &sCnt);
    __syncthreads();
    const int G = n_h / n_kv;
    const int4 rec = make_int4(sLo, max(sLo, sHi + 1), sCnt, d);
    for (int g = tid; g < n_kv; g += 128)
        *reinterpret_cast<int4 *>(dq + ((size_t)b * B * n_h + (size_t)g * G) * HD) = rec;
}

/* Kernel 3, two blocks per CTA (each context K/V tile serves two blocks):
 * warpgroup w handles block 2·blockIdx.x + w, the context K/V tiles are loaded once for both over the
 * union of their narrowed ranges (anchors are sorted, so consecutive blocks' ranges mostly coincide) and
 * a warpgroup skips the tiles outside its own range; then each warpgroup's own block tile (buffer 2 for
 * warpgroup 0, the free context buffer for warpgroup 1). One CTA (256 threads) per SM. Deterministic.
 * QR (the library's) reads the two blocks' ranges from
 * wb_qplan_kernel's records instead of the anchor -> doc id -> window scan (two dependent loads, a scan, two
 * barriers); !QR (the plain elementwise, FM false: kernels/bench's, and wb_launch's codegen anchor) scans. */
/* One work item of kernel 3: blocks 2·bx, 2·bx + 1 and kv head g (the kernel's blockIdx.x, blockIdx.y).
 * All 256 threads call it. K/V tiles double buffered: tile t + 1 loaded while tile t is used (a
 * distance-2 pipeline lost: kernels/bench/RESULTS.md). */
template <int HD, bool FM, bool QR>
__device__ __forceinline__ void
wb_q2_item(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
           const int32_t *doc_ids, const __nv_bfloat16 *out, const __nv_bfloat16 *dout, const float *lse, float *dq,
           float *dk, float *dv, int T, int N, int B, int n_h, int n_kv, int window, int causal, float scale_log2,
           float scale, const unsigned bx, const int g) {
    constexpr int CH = HD / 8, TB = wb_tile<HD>::bytes, NT = 2 * WB_Q_THREADS;
    constexpr int NB = 3;   /* K/V buffers: 2 rotating context buffers + warpgroup 0's block tile (buffer 2) */
    extern __shared__ unsigned char wb_smem_raw[];
    unsigned char *sm = wb_align1024(wb_smem_raw);
    unsigned char *sQ = sm;             /* [2 warpgroups][tile] */
    unsigned char *sdO = sm + 2 * TB;   /* [2 warpgroups][tile] */
    unsigned char *sK = sm + 4 * TB;    /* [NB buffers][tile] */
    unsigned char *sV = sm + (4 + NB) * TB;   /* [NB buffers][tile] */
    __shared__ int sDocT[2][WB_KT];
    __shared__ __align__(16) float sLse[2][WB_ROWS];   /* FM: read as float2 */
    __shared__ float sDi[2][WB_ROWS];
    __shared__ int sLo[2], sHi[2], sCnt[2];
    __shared__ __align__(16) int sSlot[WB_ROWS];   /* FM: r % B of a tile row r */

    const int G = n_h / n_kv, R = N * B;
    const int tid = threadIdx.x, wg = tid >> 7, ltid = tid & 127, lane = tid & 31, wl = (tid >> 5) & 3;
    const int b = 2 * bx + wg;
    const bool bok = b < N;   /* uniform per warpgroup */
    const int used = bok ? G * B : 0;
    /* QR: both blocks' records (wb_qplan_kernel; {0, 0, 0, -1}, an empty range, for a block past N), read
     * before any barrier, so before this CTA's own dq stores overwrite them */
    int4 rec0 = make_int4(0, 0, 0, -1), rec1 = make_int4(0, 0, 0, -1);
    if constexpr (QR) {
        const size_t roff = (size_t)g * G * HD;
        rec0 = *reinterpret_cast<const int4 *>(dq + (size_t)(2 * bx) * B * n_h * HD + roff);
        if (2 * bx + 1 < N) rec1 = *reinterpret_cast<const int4 *>(dq + (size_t)(2 * bx + 1) * B * n_h * HD + roff);
    }
    const int a = QR || !bok ? 0 : anchors[b], d = QR ? (wg ? rec1.w : rec0.w) : bok ? doc_ids[a] : -1;
    if (FM && tid < WB_ROWS) sSlot[tid] = tid % B;   /* read after the loop's first barrier */
    wb_load_qrows<HD, WB_Q_THREADS>(sQ + wg * TB, q, bok ? b : 0, g, B, G, n_h, used, ltid);
    wb_load_qrows<HD, WB_Q_THREADS>(sdO + wg * TB, dout, bok ? b : 0, g, B, G, n_h, used, ltid);
    mma_commit();
    {   /* lse and Di of the warpgroup's 64 rows: two threads per row */
        int r = ltid >> 1, half = ltid & 1;
        float s = 0.f;
        size_t row = (size_t)b * B + r % B;
        int h = g * G + r / B;
        if (r < used)   /* block_attn_common.cuh */
            s = ba_di_half<HD>(out + (row * n_h + h) * HD + half * (HD / 2), dout + (row * n_h + h) * HD + half * (HD / 2));
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (half == 0) {
            sDi[wg][r] = r < used ? s : 0.f;
            sLse[wg][r] = r < used ? lse[(size_t)h * R + row] : 0.f;
        }
    }
    int lo0, hi0, lo1, hi1, cnt;
    if constexpr (QR) {
        lo0 = rec0.x, hi0 = rec0.y, lo1 = rec1.x, hi1 = rec1.y, cnt = wg ? rec1.z : rec0.z;
    } else {   /* each warpgroup's narrowed context range */
        const int lo = window > 0 ? max(0, a - window) : 0, hi = d == -1 ? lo : a;
        if (ltid == 0) { sLo[wg] = hi; sHi[wg] = lo - 1; sCnt[wg] = 0; }
        __syncthreads();
        /* sCnt (FM): keys of the document (is the range all of it?); block_attn_common.cuh */
        ba_doc_span<WB_Q_THREADS, FM, int, true>(doc_ids, lo, hi, d, ltid, lane == 0, &sLo[wg], &sHi[wg], &sCnt[wg]);
        __syncthreads();
        lo0 = sLo[0], hi0 = max(sLo[0], sHi[0] + 1), lo1 = sLo[1], hi1 = max(sLo[1], sHi[1] + 1), cnt = sCnt[wg];
    }
    const int c_lo = wg ? lo1 : lo0, c_hi = wg ? hi1 : hi0;   /* this warpgroup's range */
    /* FM: every key of [c_lo, c_hi) is of the document (contiguous documents): no doc id test needed */
    const bool contig = FM && cnt == c_hi - c_lo;
    int u_lo = 0, u_hi = 0;                                    /* the union of the non-empty ones */
    if (hi0 > lo0 && hi1 > lo1) { u_lo = min(lo0, lo1); u_hi = max(hi0, hi1); }
    else if (hi0 > lo0) { u_lo = lo0; u_hi = hi0; }
    else if (hi1 > lo1) { u_lo = lo1; u_hi = hi1; }
    const int n_ctx = (u_hi - u_lo + WB_KT - 1) / WB_KT;
    const int bbuf = wg ? (n_ctx & 1) : 2;   /* this warpgroup's block tile buffer */

    auto load_tile = [&](int t, int buf) {   /* union context tile t, and its doc ids */
        const int nk = min(WB_KT, u_hi - u_lo - t * WB_KT);
        for (int i = tid; i < WB_KT * CH; i += NT) {
            int r = i / CH, c = i % CH;
            bool ok = r < nk;
            size_t off = ((size_t)(ok ? u_lo + t * WB_KT + r : 0) * n_kv + g) * HD + c * 8;
            uint32_t o = (uint32_t)(buf * TB) + wb_off(r, c);
            mma_cp_async16(sK + o, k + off, ok ? 16 : 0);
            mma_cp_async16(sV + o, v + off, ok ? 16 : 0);
        }
        if (tid < WB_KT) wb_cp_async4(&sDocT[buf][tid], doc_ids + (tid < nk ? u_lo + t * WB_KT + tid : 0), tid < nk);
    };
    auto load_blocks = [&]() {   /* both warpgroups' block tiles: B keys each, rows past them zero-filled */
        for (int i = tid; i < 2 * WB_KT * CH; i += NT) {
            int w = i / (WB_KT * CH), r = (i / CH) % WB_KT, c = i % CH;
            const int bw = 2 * bx + w;
            bool ok = r < B && bw < N;
            size_t off = ((ok ? (size_t)T + (size_t)bw * B + r : 0) * n_kv + g) * HD + c * 8;
            uint32_t o = (uint32_t)((w ? (n_ctx & 1) : 2) * TB) + wb_off(r, c);
            mma_cp_async16(sK + o, k + off, ok ? 16 : 0);
            mma_cp_async16(sV + o, v + off, ok ? 16 : 0);
        }
    };
    if (n_ctx > 0) load_tile(0, 0);
    else load_blocks();
    mma_commit();

    float dqa[HD / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) dqa[i] = 0.f;
    const int r0 = wl * 16 + (lane >> 2), r1 = r0 + 8;
    const int j0 = r0 % B, j1 = r1 % B;
    const bool ok0 = r0 < used, ok1 = r1 < used;
    const uint32_t uQ = wg_smem_u32(sQ + wg * TB), udO = wg_smem_u32(sdO + wg * TB);
    const float *lseW = sLse[wg], *diW = sDi[wg];
    for (int t = 0; t <= n_ctx; t++) {   /* t == n_ctx: the block tiles */
        mma_wait<0>();   /* tile t's group done */
        wg_fence_async_smem();
        __syncthreads();   /* tile t visible; everyone is done with tile t - 1's buffer */
        /* the loads of tile t + 1, into tile t - 1's buffer */
        if (t + 1 < n_ctx) load_tile(t + 1, (t + 1) & 1);
        else if (t + 1 == n_ctx) load_blocks();
        mma_commit();
        const float l20 = lseW[r0] * WB_LOG2E, l21 = lseW[r1] * WB_LOG2E, di0 = diW[r0], di1 = diW[r1];
        if (FM) {   /* the fast elementwise; rows past used: exponent −inf */
            const float f20 = ok0 ? l20 : __int_as_float(0x7f800000), f21 = ok1 ? l21 : __int_as_float(0x7f800000);
            if (t < n_ctx) {
                const int buf = t & 1, key0 = u_lo + t * WB_KT;
                const int nk = min(WB_KT, c_hi - key0), klo = max(0, c_lo - key0);
                const uint32_t uK = wg_smem_u32(sK + buf * TB), uV = wg_smem_u32(sV + buf * TB);
                if (nk <= klo) {
                    /* the tile misses this warpgroup's range */
                } else if (contig && klo == 0 && nk == WB_KT) {
                    wb_dq_tile_f<HD, 64, 0>(dqa, uQ, udO, uK, uV, sDocT[buf], d, nk, klo, j0, j1, causal, f20, f21, di0,
                                            di1, scale_log2);
                } else if (contig) {
                    wb_dq_tile_f<HD, 64, 1>(dqa, uQ, udO, uK, uV, sDocT[buf], d, nk, klo, j0, j1, causal, f20, f21, di0,
                                            di1, scale_log2);
                } else {
                    wb_dq_tile_f<HD, 64, 2>(dqa, uQ, udO, uK, uV, sDocT[buf], d, nk, klo, j0, j1, causal, f20, f21, di0,
                                            di1, scale_log2);
                }
            } else {
                if (bok) {
                    const uint32_t uK = wg_smem_u32(sK + bbuf * TB), uV = wg_smem_u32(sV + bbuf * TB);
                    if (B > 32)
                        wb_dq_tile_f<HD, 64, 3>(dqa, uQ, udO, uK, uV, sDocT[0], d, B, 0, j0, j1, causal, f20, f21, di0, di1,
                                                scale_log2);
                    else if (B > 16)
                        wb_dq_tile_f<HD, 32, 3>(dqa, uQ, udO, uK, uV, sDocT[0], d, B, 0, j0, j1, causal, f20, f21, di0, di1,
                                                scale_log2);
                    else
                        wb_dq_tile_f<HD, 16, 3>(dqa, uQ, udO, uK, uV, sDocT[0], d, B, 0, j0, j1, causal, f20, f21, di0, di1,
                                                scale_log2);
                }
            }
            continue;
        }
        if (t < n_ctx) {
            const int buf = t & 1, key0 = u_lo + t * WB_KT;
            const int nk = min(WB_KT, c_hi - key0), klo = max(0, c_lo - key0);
            if (nk > klo)   /* uniform per warpgroup: the tile meets its range */
                wb_dq_tile<HD, 64>(dqa, uQ, udO, wg_smem_u32(sK + buf * TB), wg_smem_u32(sV + buf * TB), sDocT[buf], d,
                                   false, nk, klo, ok0, ok1, j0, j1, causal, l20, l21, di0, di1, scale_log2);
        } else if (bok) {
            const uint32_t uK = wg_smem_u32(sK + bbuf * TB), uV = wg_smem_u32(sV + bbuf * TB);
            if (B > 32)
                wb_dq_tile<HD, 64>(dqa, uQ, udO, uK, uV, sDocT[0], d, true, B, 0, ok0, ok1, j0, j1, causal, l20, l21,
                                   di0, di1, scale_log2);
            else if (B > 16)
                wb_dq_tile<HD, 32>(dqa, uQ, udO, uK, uV, sDocT[0], d, true, B, 0, ok0, ok1, j0, j1, causal, l20, l21,
                                   di0, di1, scale_log2);
            else
                wb_dq_tile<HD, 16>(dqa, uQ, udO, uK, uV, sDocT[0], d, true, B, 0, ok0, ok1, j0, j1, causal, l20, l21,
                                   di0, di1, scale_log2);
        }
    }
    if (!bok) return;   /* no barrier follows */
    {
        float *q0 = dq + (((size_t)b * B + j0) * n_h + g * G + r0 / B) * HD + (lane & 3) * 2;
        float *q1 = dq + (((size_t)b * B + j1) * n_h + g * G + r1 / B) * HD + (lane & 3) * 2;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) {
            if (ok0) *(float2 *)(q0 + 8 * i) = make_float2(dqa[4 * i] * scale, dqa[4 * i + 1] * scale);
            if (ok1) *(float2 *)(q1 + 8 * i) = make_float2(dqa[4 * i + 2] * scale, dqa[4 * i + 3] * scale);
        }
    }
    {   /* dK, dV of the block's own keys */
        float dka[HD / 2], dva[HD / 2];
#pragma unroll
        for (int i = 0; i < HD / 2; i++) dka[i] = dva[i] = 0.f;
        const int kr0 = r0, kr1 = r1;
        wb_kv_visit<HD, FM>(wg_smem_u32(sK + bbuf * TB), wg_smem_u32(sV + bbuf * TB), uQ, udO, lseW, diW, kr0 < B,
                            kr1 < B, causal ? 0 : -1, used, B, scale_log2, dka, dva, sSlot);
        const size_t row0 = (size_t)T + (size_t)b * B + kr0, row1 = (size_t)T + (size_t)b * B + kr1;
        wb_store_acc<HD>(dk, dka, scale, row0, kr0 < B, row1, kr1 < B, n_kv, g);
        wb_store_acc<HD>(dv, dva, 1.f, row0, kr0 < B, row1, kr1 < B, n_kv, g);
    }
}

template <int HD, bool FM = false, bool QR = false>
__global__ void __launch_bounds__(2 * WB_Q_THREADS, 1)
wb_q2_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
             const int32_t *doc_ids, const __nv_bfloat16 *out, const __nv_bfloat16 *dout, const float *lse, float *dq,
             float *dk, float *dv, int T, int N, int B, int n_h, int n_kv, int window, int causal, float scale_log2,
             float scale) {
    wb_q2_item<HD, FM, QR>(q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, T, N, B, n_h, n_kv, window,
                                  causal, scale_log2, scale, blockIdx.x, blockIdx.y);
}

template <typename K>
int wb_smem_attr(K kernel, size_t smem) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    return e == cudaSuccess ? 0 : kernels_fail("ba_wg_backward: cudaFuncSetAttribute: %s", cudaGetErrorString(e));
}

/* the backward's options: the bench's timing events */
struct wb_opts {
    cudaEvent_t *ev;    /* kernels/bench only: 5 events around Di, plan, dK/dV, dQ; NULL from ba_wg_backward */
};

/* kernel 2: two warpgroups per CTA, pipelined across visits */
template <int HD, bool FM = false, bool LA = false>
int wb_run_kv(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
              const int32_t *doc_ids, const bf16 *dout, const float *lse, const float *di, float *dk, float *dv,
              const int *plan, int n_tiles, cudaStream_t stream) {
    constexpr int NWG = WB_KV_NWG;
    const size_t smem = (2 * NWG + 2 * WB_KV_ST) * (size_t)wb_tile<HD>::bytes + 1024;
    if (wb_smem_attr(wb_kv_kernel<HD, FM, LA>, smem)) return -1;
    wb_kv_kernel<HD, FM, LA><<<dim3(n_tiles, c->n_kv), NWG * 128, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (const __nv_bfloat16 *)dout, lse, di, dk, dv, plan, c->T, c->N, c->B, c->n_h, c->n_kv, c->window,
        c->scale * WB_LOG2E, c->scale);
    KERNELS_CHECK_LAUNCH("ba_wg_backward kv");
    return 0;
}

/* kernel 3: two blocks per CTA (wb_q2_kernel); QR (the library's): wb_qplan_kernel
 * first */
template <int HD, bool FM = false, bool QR = false>
int wb_run_q(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
             const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse, float *dq, float *dk,
             float *dv, cudaStream_t stream) {
    constexpr int QB = 2;
    const size_t smem = 10 * (size_t)wb_tile<HD>::bytes + 1024;
    auto kern = wb_q2_kernel<HD, FM, QR>;
    if (wb_smem_attr(kern, smem)) return -1;
    if (QR && c->N > 0) {
        wb_qplan_kernel<<<c->N, WB_Q_THREADS, 0, stream>>>(anchors, doc_ids, c->B, c->n_h, c->n_kv, HD, c->window, dq);
        KERNELS_CHECK_LAUNCH("ba_wg_backward q plan");
    }
    kern<<<dim3((c->N + QB - 1) / QB, c->n_kv), QB * WB_Q_THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, lse, dq, dk, dv, c->T, c->N, c->B, c->n_h, c->n_kv,
        c->window, c->causal, c->scale * WB_LOG2E, c->scale);
    KERNELS_CHECK_LAUNCH("ba_wg_backward q");
    return 0;
}

static int wb_record(const wb_opts &o, int i, cudaStream_t stream) {
    if (!o.ev) return 0;
    cudaError_t e = cudaEventRecord(o.ev[i], stream);
    return e == cudaSuccess ? 0 : kernels_fail("ba_wg_backward: cudaEventRecord: %s", cudaGetErrorString(e));
}

/* The backward's kernels in stream order. FM: the fast elementwise (the library's; false is the plain
 * elementwise of kernels/bench only). */
template <int HD, bool FM = true>
int wb_launch(const wb_opts &o, const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
              const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse,
              float *dq, float *dk, float *dv, cudaStream_t stream) {
    const int R = c->N * c->B;
    const size_t di_threads = (size_t)R * c->n_h * (HD / 8);
    float *di = dq;   /* scratch: n_h·R floats, overwritten by kernel 3 */
    /* FM: lse·log2(e) for kernel 2 after Di and the plan's WB_PLAN_MAX ints, when dq holds it (otherwise
     * kernel 2 runs the plain elementwise) */
    const size_t nhr = (size_t)c->n_h * R;
    float *lse2 = FM && 2 * nhr + WB_PLAN_MAX <= nhr * HD ? dq + nhr + WB_PLAN_MAX : NULL;
    if (wb_record(o, 0, stream)) return -1;
    ba_di_kernel<HD, true><<<(unsigned)((di_threads + 255) / 256), 256, 0, stream>>>(
        (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, di, R, c->n_h, lse, lse2);
    KERNELS_CHECK_LAUNCH("ba_wg_backward di");
    if (wb_record(o, 1, stream)) return -1;
    /* the plan (kernel 2's per-tile costs) lives in dq's scratch after Di, when it fits */
    const int nk = 2 * WB_KT, n_tiles = (c->T + nk - 1) / nk;
    int *plan = NULL;
    if (n_tiles <= WB_PLAN_MAX && (size_t)n_tiles <= (size_t)c->n_h * R * (HD - 1)) {
        plan = (int *)(dq + (size_t)c->n_h * R);
        wb_plan_kernel<2 * WB_KT><<<n_tiles, 128, 0, stream>>>(anchors, doc_ids, c->T, c->N, c->window, plan);
        KERNELS_CHECK_LAUNCH("ba_wg_backward plan");
    }
    if (wb_record(o, 2, stream)) return -1;
    /* the fast elementwise with the loads after each visit's products (LA) needs lse2; without it (FM false,
     * or dq too small to hold lse2) kernel 2 runs the plain elementwise with the loads before the products */
    const int rc = lse2 ? wb_run_kv<HD, true, true>(c, q, k, v, anchors, doc_ids, dout, lse2, di, dk, dv, plan, n_tiles,
                                                    stream)
                        : wb_run_kv<HD>(c, q, k, v, anchors, doc_ids, dout, lse, di, dk, dv, plan, n_tiles, stream);
    if (rc || wb_record(o, 3, stream)) return -1;
    int rq;
    if constexpr (FM) rq = wb_run_q<HD, true, true>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    else rq = wb_run_q<HD>(c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    /* Codegen anchor, never launched: with the plain-elementwise kernel 3 of d_h 64 in the same module,
     * ptxas assigns the d_h 64 default (wb_q2_kernel<64, true, true>) the registers it had when it was
     * measured; without it the machine code differs (same source and arithmetic, other register numbers). */
    if constexpr (FM && HD == 64) (void)&wb_q2_kernel<64, false, false>;
    if (rq || wb_record(o, 4, stream)) return -1;
    return 0;
}

}  // namespace

#endif /* KERNELS_BLOCK_ATTN_BWD_WG_CUH */
