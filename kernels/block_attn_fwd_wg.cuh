/*
 * kernels/block_attn_fwd_wg.cuh — the wgmma block attention forward: kernel templates, the plan kernels and the
 * launch code (kernels/block_attn_fwd_wg.cu describes the kernel and why the library fixes each knob). Included by
 * kernels/block_attn_fwd_wg.cu, which holds the entry points (kernels/block_attn_wg.h), and by
 * kernels/bench/block_attn_bench.cu; everything is in an anonymous namespace: it defines no external symbol.
 */
#ifndef KERNELS_BLOCK_ATTN_FWD_WG_CUH
#define KERNELS_BLOCK_ATTN_FWD_WG_CUH

#include "kernels/block_attn_wg.h"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

#include <climits>
#include <cstdlib>
#include <cstring>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cudaTypedefs.h>

namespace {

constexpr int WF_KT = 64;               /* keys per context tile, query rows per warpgroup */
constexpr int WF_PANEL = 64 * 128;      /* bytes of a 64-row × 64-column bf16 panel */
constexpr float WF_LOG2E = 1.4426950408889634f;

template <int HD, int NWG> struct wf_cfg {
    static constexpr int KT = WF_KT;                   /* keys per K/V tile */
    static constexpr int NP = HD / 64;                 /* panels per tile */
    static constexpr int QTILE = NP * WF_PANEL;        /* bytes of one 64-row Q tile */
    static constexpr int KPANEL = KT * 128;            /* bytes of a KT-row × 64-column K or V panel */
    static constexpr int TILE = NP * KPANEL;           /* bytes of one KT-row tile of K or V */
    static constexpr int THREADS = NWG * 128;
    static constexpr int NST = 4;                      /* K/V stages (prefetch distance NST - 2; FREE: NST) */
    static constexpr size_t smem = (size_t)NWG * QTILE + (size_t)2 * NST * TILE + 1024;   /* + alignment slack */
};

__device__ __forceinline__ void wf_cp16(uint32_t saddr, const void *g, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(g), "r"(ok ? 16 : 0)
                 : "memory");
}
__device__ __forceinline__ void wf_cp4(uint32_t saddr, const void *g, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(saddr), "l"(g), "r"(ok ? 4 : 0)
                 : "memory");
}

/* K/V by TMA: the K and V tensor maps, a __grid_constant__ kernel parameter. */
struct wf_tmaps {
    CUtensorMap k, v;
};

__device__ __forceinline__ void wf_bar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* one arrival (the barrier's count is 1) that also expects bytes of TMA data before the phase completes */
__device__ __forceinline__ void wf_bar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* Waits until the phase of parity `parity` of the barrier has completed. SLEEP (the free-running walk's waits):
 * with a suspend-time hint (1 ms), so a waiting thread sleeps until the phase completes instead of spinning and
 * takes no issue slots from the warpgroups it waits for (no measured difference on the H200: kernels/bench/RESULTS.md);
 * without it, the barrier walk's plain try_wait. */
template <bool SLEEP = false>
__device__ __forceinline__ void wf_bar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        if (SLEEP)
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done)
                         : "r"(bar), "r"(parity), "r"(1000000u)
                         : "memory");
        else
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done)
                         : "r"(bar), "r"(parity)
                         : "memory");
    } while (!done);
}
/* one box {64 elements, 1, 64 rows} of a rank-3 tensor map (128B swizzle) into the panel at dst; completes
 * its bytes on bar */
__device__ __forceinline__ void wf_tma3(uint32_t dst, const CUtensorMap *map, int x, int y, int z, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(x), "r"(y), "r"(z), "r"(bar)
                 : "memory");
}

/* Issues S = Q·Kᵀ over NK keys (k_s: the tile's first key row) into s (the caller commits). */
template <int HD, int NK, int KPANEL = WF_PANEL>
__device__ __forceinline__ void wf_issue_s(float *s, uint32_t q_s, uint32_t k_s) {
#pragma unroll
    for (int i = 0; i < NK / 2; i++) s[i] = 0.f;
    wg_fence();
    wg_mma_ss_kk<NK, HD>(s, q_s, WF_PANEL, k_s, KPANEL, true);
}

/* Online softmax of a completed S (s, NK keys): masks by vis(key, half) when need_mask, updates the
 * scaled running maxima m and sums l of this thread's two rows, leaves P (fp32) in s and returns the
 * factors c0, c1 that rescale the rows' O. */
template <int NK, typename Vis>
__device__ __forceinline__ void wf_softmax(float *m, float *l, float *s, float sl2, bool need_mask, Vis vis, float *c0,
                                           float *c1) {
    const int t4 = threadIdx.x & 3;
    if (need_mask) {
#pragma unroll
        for (int i = 0; i < NK / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (!vis(8 * i + 2 * t4 + (e & 1), e >> 1)) s[4 * i + e] = -INFINITY;
    }
    float rx0 = -INFINITY, rx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < NK / 8; i++) {
        rx0 = fmaxf(rx0, fmaxf(s[4 * i], s[4 * i + 1]));
        rx1 = fmaxf(rx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    rx0 = fmaxf(rx0, __shfl_xor_sync(0xffffffffu, rx0, 1));
    rx0 = fmaxf(rx0, __shfl_xor_sync(0xffffffffu, rx0, 2));
    rx1 = fmaxf(rx1, __shfl_xor_sync(0xffffffffu, rx1, 1));
    rx1 = fmaxf(rx1, __shfl_xor_sync(0xffffffffu, rx1, 2));
    const float mx0 = fmaxf(m[0], rx0 * sl2), mx1 = fmaxf(m[1], rx1 * sl2);   /* sl2 > 0: -inf stays -inf */
    /* a row with nothing visible yet keeps m = -inf; subtract 0 then so ex2 gives 0, not NaN */
    const float ms0 = mx0 == -INFINITY ? 0.f : mx0, ms1 = mx1 == -INFINITY ? 0.f : mx1;
    *c0 = mma_ex2_ftz(m[0] - ms0);
    *c1 = mma_ex2_ftz(m[1] - ms1);
    m[0] = mx0;
    m[1] = mx1;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int i = 0; i < NK / 8; i++) {
        s[4 * i + 0] = mma_ex2_ftz(fmaf(s[4 * i + 0], sl2, -ms0));
        s[4 * i + 1] = mma_ex2_ftz(fmaf(s[4 * i + 1], sl2, -ms0));
        s[4 * i + 2] = mma_ex2_ftz(fmaf(s[4 * i + 2], sl2, -ms1));
        s[4 * i + 3] = mma_ex2_ftz(fmaf(s[4 * i + 3], sl2, -ms1));
        sum0 += s[4 * i + 0] + s[4 * i + 1];
        sum1 += s[4 * i + 2] + s[4 * i + 3];
    }
    l[0] = l[0] * *c0 + sum0;
    l[1] = l[1] * *c1 + sum1;
}

/* O rows *= c0 / c1; P (fp32 in s) -> bf16 A fragments p (one per k16 chunk). */
template <int HD, int NK>
__device__ __forceinline__ void wf_rescale_pack(float *o, const float *s, float c0, float c1, uint32_t (*p)[4]) {
#pragma unroll
    for (int i = 0; i < HD / 8; i++) {
        o[4 * i + 0] *= c0;
        o[4 * i + 1] *= c0;
        o[4 * i + 2] *= c1;
        o[4 * i + 3] *= c1;
    }
    mma_pack_frags<NK / 16>(s, &p[0][0]);
}

/* Issues O += P·V over NK keys (v_s: the tile's first key row), A = p from registers (the caller commits). */
template <int HD, int NK, int KPANEL = WF_PANEL>
__device__ __forceinline__ void wf_issue_pv(float *o, uint32_t (*p)[4], uint32_t v_s) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++)
        wg_mma_rs<HD, 1>(o, p[kk], wg_desc_mnmajor(v_s + kk * 16 * 128, KPANEL), 1);
}

/* One tile step of one warpgroup: S, wait (S and the previous P·V), then after_wait() (FREE: the release
 * of the previous tile's stage; a no-op for the barrier walk), softmax, P·V in flight. */
template <int HD, int NK, typename Vis, typename Hook>
__device__ __forceinline__ void wf_step(float *o, float *m, float *l, uint32_t q_s, uint32_t k_s, uint32_t v_s,
                                        float sl2, bool need_mask, Vis vis, Hook after_wait) {
    float s[NK / 2];
    wf_issue_s<HD, NK>(s, q_s, k_s);
    wg_commit();
    wg_wait<0>();
    after_wait();   /* FREE: every read of the previous tile's stage is retired here */
    wg_acc_fence<NK / 2>(s);
    wg_acc_fence<HD / 2>(o);
    uint32_t p[NK / 16][4];
    float c0, c1;
    wf_softmax<NK>(m, l, s, sl2, need_mask, vis, &c0, &c1);
    wf_rescale_pack<HD, NK>(o, s, c0, c1, p);
    wf_issue_pv<HD, NK>(o, p, v_s);
    wg_commit();
}

/* Set-up of the CTA's blocks b0 .. b0 + nb - 1 (nb <= NWG live): the context range of every block,
 * narrowed to its document's first and last key (one scan of the union of the blocks' windows by the
 * whole CTA, per-warp partial minima / maxima in sPart), then warp 0 merges them into segments. Called
 * by every thread; ends with a barrier, after which sLo, sHi, sSeg, sNSeg and sNCtx hold the result.
 * Returns the doc id of block b0 + wg (-1 when not live). */
template <int NWG, bool PRODG = false>   /* PRODG: a producer warpgroup (FREE) beyond the NWG takes part in the barriers only */
__device__ __forceinline__ int wf_setup(const int32_t *anchors, const int32_t *doc_ids, int b0, int nb, int window,
                                        int (*sPart)[NWG][3], int *sLo, int *sHi, int (*sSeg)[3], int &sNSeg,
                                        int &sNCtx, int &sCont) {
    constexpr int THREADS = NWG * 128, KT = WF_KT;
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    /* Context range of every block, narrowed to its document's first and last key: one scan of the
     * union of the blocks' windows by the whole CTA, per-warp partial minima / maxima in sPart. */
    int wlo[NWG], whi[NWG], dw[NWG];
    int ulo = INT_MAX, uhi = 0;
#pragma unroll
    for (int w = 0; w < NWG; w++) {
        const int aw = w < nb ? anchors[b0 + w] : 0;
        dw[w] = w < nb ? doc_ids[aw] : -1;
        wlo[w] = window > 0 ? max(0, aw - window) : 0;
        whi[w] = dw[w] == -1 ? wlo[w] : aw;
        if (whi[w] > wlo[w]) {
            ulo = min(ulo, wlo[w]);
            uhi = max(uhi, whi[w]);
        }
    }
    if (uhi <= ulo) ulo = uhi = 0;   /* no block has context */
    int d = -1;   /* dw[wg], without dynamic indexing */
#pragma unroll
    for (int w = 0; w < NWG; w++)
        if (w == wg) d = dw[w];
    {
        int mn[NWG], mx[NWG], cn[NWG];   /* cn: keys of the document in the window (contiguity test) */
#pragma unroll
        for (int w = 0; w < NWG; w++) {
            mn[w] = INT_MAX;
            mx[w] = -1;
            cn[w] = 0;
        }
        for (int p0 = ulo + tid; p0 < uhi && (!PRODG || tid < THREADS); p0 += 8 * THREADS) {   /* 8 loads in flight;
                                                                                                 * PRODG: not the producer */
            int dp[8];
#pragma unroll
            for (int i = 0; i < 8; i++) dp[i] = p0 + i * THREADS < uhi ? doc_ids[p0 + i * THREADS] : -2;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                const int p = p0 + i * THREADS;
#pragma unroll
                for (int w = 0; w < NWG; w++)
                    if (dp[i] == dw[w] && p >= wlo[w] && p < whi[w]) {
                        mn[w] = min(mn[w], p);
                        mx[w] = max(mx[w], p);
                        cn[w]++;
                    }
            }
        }
#pragma unroll
        for (int w = 0; w < NWG; w++) {
            for (int o = 16; o; o >>= 1) {
                mn[w] = min(mn[w], __shfl_xor_sync(0xffffffffu, mn[w], o));
                mx[w] = max(mx[w], __shfl_xor_sync(0xffffffffu, mx[w], o));
                cn[w] += __shfl_xor_sync(0xffffffffu, cn[w], o);
            }
            if (lane == 0 && (!PRODG || tid < THREADS)) {
                sPart[tid >> 5][w][0] = mn[w];
                sPart[tid >> 5][w][1] = mx[w];
                sPart[tid >> 5][w][2] = cn[w];
            }
        }
    }
    __syncthreads();
    if (tid < 32) {   /* warp 0: reduce the partials, sort the non-empty ranges by start, merge close ones */
        int L[NWG], H[NWG];
        bool cont = true;   /* every block's visible context keys are exactly [lo, hi) */
#pragma unroll
        for (int w = 0; w < NWG; w++) {
            int l0 = lane < THREADS / 32 ? sPart[lane][w][0] : INT_MAX;
            int h0 = lane < THREADS / 32 ? sPart[lane][w][1] : -1;
            int n0 = lane < THREADS / 32 ? sPart[lane][w][2] : 0;
            for (int o = 16; o; o >>= 1) {
                l0 = min(l0, __shfl_xor_sync(0xffffffffu, l0, o));
                h0 = max(h0, __shfl_xor_sync(0xffffffffu, h0, o));
                n0 += __shfl_xor_sync(0xffffffffu, n0, o);
            }
            h0 += 1;
            cont = cont && (h0 <= l0 || n0 == h0 - l0);
            if (h0 <= l0) {   /* nothing visible: an empty range, sorted last */
                l0 = INT_MAX;
                h0 = INT_MAX;
            }
            L[w] = l0;
            H[w] = h0;
        }
        if (lane == 0) {
#pragma unroll
            for (int w = 0; w < NWG; w++) {
                sLo[w] = L[w] == INT_MAX ? 0 : L[w];
                sHi[w] = L[w] == INT_MAX ? 0 : H[w];
            }
#pragma unroll
            for (int i = 0; i < NWG; i++)   /* bubble sort, compile-time indices (NWG <= 3) */
#pragma unroll
                for (int j = 0; j + 1 < NWG - i; j++)
                    if (L[j] > L[j + 1]) {
                        const int tl = L[j], th = H[j];
                        L[j] = L[j + 1];
                        H[j] = H[j + 1];
                        L[j + 1] = tl;
                        H[j + 1] = th;
                    }
            int ns = 0, tiles = 0, cs = L[0], ce = H[0];
#pragma unroll
            for (int i = 1; i <= NWG; i++) {
                if (cs == INT_MAX) break;
                if (i < NWG && L[i] != INT_MAX && L[i] <= ce + WF_KT) {
                    ce = max(ce, H[i]);
                    continue;
                }
                sSeg[ns][0] = cs;
                sSeg[ns][1] = ce;
                sSeg[ns][2] = tiles;
                tiles += (ce - cs + KT - 1) / KT;
                ns++;
                if (i < NWG) {
                    cs = L[i];
                    ce = H[i];
                }
            }
            sNSeg = ns;
            sNCtx = tiles;
            sCont = cont;
        }
    }
    __syncthreads();
    return d;
}

/* The plan record of one block group (the CTA's NWG = 3 blocks), as wf_setup leaves it in shared memory,
 * plus the group's tile count and index: ints, WF_REC per group (96 bytes, 16-byte aligned: int4 copies). */
constexpr int WR_LO = 0, WR_HI = 3, WR_SEG = 6, WR_NSEG = 15, WR_NCTX = 16, WR_CONT = 17, WR_D = 18, WR_NT = 21,
              WR_GRP = 22;
constexpr int WF_REC = 24;
constexpr int WF_GROUP = 3;   /* blocks per CTA (NWG of every launch) */

/* Workspace layout (block_attn_forward_workspace_bytes), ints: the records by group (n_grp × WF_REC, pass 1),
 * the groups' tile counts (n_grp, rounded up to 4), the records by rank, longest group first (n_grp × WF_REC,
 * pass 2; what the main kernel reads). */
inline size_t wf_ws_ints(int n_grp) { return 2 * (size_t)n_grp * WF_REC + (((size_t)n_grp + 3) & ~(size_t)3); }

/* Plan, pass 1: one CTA of NWG·128 threads per block group runs wf_setup (the same function, the same
 * thread count as the main kernel's in-kernel set-up, so the record is what the main kernel would compute)
 * and writes its record and its tile count (context tiles + block tiles: the CTA's work). */
template <int NWG>
__global__ void __launch_bounds__(NWG * 128)
wf_plan_kernel(const int32_t *anchors, const int32_t *doc_ids, int N, int B, int window, int *rec, int *ntiles) {
    __shared__ int sPart[NWG * 4][NWG][3];
    __shared__ __align__(16) int sRec[WF_REC];
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");   /* the order kernel waits for our end */
    const int tid = threadIdx.x, grp = blockIdx.x;
    const int b0 = grp * NWG, nb = min(NWG, N - b0);
    if (tid < WF_REC) sRec[tid] = 0;   /* ordered before warp 0's writes by wf_setup's first barrier */
    const int d = wf_setup<NWG>(anchors, doc_ids, b0, nb, window, sPart, sRec + WR_LO, sRec + WR_HI,
                                (int(*)[3])(sRec + WR_SEG), sRec[WR_NSEG], sRec[WR_NCTX], sRec[WR_CONT]);
    if ((tid & 127) == 0) sRec[WR_D + (tid >> 7)] = d;
    if (tid == 0) {
        const int BP = B <= 16 ? 16 : B <= 32 ? 32 : 64, per = WF_KT / BP;   /* as the main kernel */
        sRec[WR_NT] = sRec[WR_NCTX] + (nb + per - 1) / per;
        sRec[WR_GRP] = grp;
        ntiles[grp] = sRec[WR_NT];
    }
    __syncthreads();
    if (tid < WF_REC / 4) ((int4 *)(rec + (size_t)grp * WF_REC))[tid] = ((const int4 *)sRec)[tid];
}

/* Plan, pass 2 (one CTA, launched with PDL behind pass 1): the rank of every group by decreasing tile count,
 * ties by group index (a strict total order, so the ranks are a permutation; deterministic), and its record
 * copied to srec[rank]. */
constexpr int WF_ORD_THREADS = 1024, WF_ORD_CHUNK = 4096;
__global__ void __launch_bounds__(WF_ORD_THREADS)
wf_order_kernel(const int *rec, const int *ntiles, int n, int *srec) {
    __shared__ int sK[WF_ORD_CHUNK];
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");   /* the main kernel waits for our end */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");               /* pass 1 complete, its writes visible */
    for (int gb = 0; gb < n; gb += WF_ORD_THREADS) {
        const int g = gb + (int)threadIdx.x;
        const int key = g < n ? __ldcg(ntiles + g) : 0;   /* L2 (.cg): written by pass 1 */
        int rank = 0;
        for (int c0 = 0; c0 < n; c0 += WF_ORD_CHUNK) {
            const int cn = min(WF_ORD_CHUNK, n - c0);
            __syncthreads();
            for (int i = threadIdx.x; i < cn; i += WF_ORD_THREADS) sK[i] = __ldcg(ntiles + c0 + i);
            __syncthreads();
            if (g < n)
                for (int j = 0; j < cn; j++) {
                    const int kj = sK[j];
                    rank += kj > key || (kj == key && c0 + j < g);
                }
        }
        if (g < n)
#pragma unroll
            for (int i = 0; i < WF_REC / 4; i++)
                ((int4 *)(srec + (size_t)rank * WF_REC))[i] = __ldcg((const int4 *)(rec + (size_t)g * WF_REC) + i);
    }
}

/* One work item of the main kernel: a block group's set-up (in shared memory) for one kv head. */
struct wf_item {
    int b0, nb, g0, n_ctx, n_seg;
    bool by_range;        /* every block's document contiguous: no doc ids loaded */
    const int (*seg)[3];  /* merged segments (shared memory): first key, end key, first tile */
};

/* The main kernel. Without PLAN: grid (groups, n_kv), wf_setup in the kernel. PLAN: launched with PDL behind
 * the plan (plan = the records by rank); blockIdx.x = rank · n_kv + kv head, so the CTAs start longest
 * group first; the set-up is one 96-byte record load. Same per-row arithmetic in both modes. */
/* FREE: false = the walk with a barrier per tile; true = free-running warpgroups fed by a producer warpgroup
 * (NWG + 1 warpgroups; taken where B is 16, 32 or 64) */
template <int HD, bool PLAN, bool FREE>
__global__ void __launch_bounds__(WF_GROUP * 128 + (FREE ? 128 : 0), 1)
ba_wg_forward_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
                     const int32_t *doc_ids, __nv_bfloat16 *out, float *lse, int T, int N, int B, int n_h, int n_kv,
                     int window, int causal, float sl2, const int *plan, const __grid_constant__ wf_tmaps tm) {
    constexpr int NWG = WF_GROUP;
    using C = wf_cfg<HD, NWG>;
    constexpr int CH = HD / 8, THREADS = C::THREADS, TILE = C::TILE, NST = C::NST, QTILE = C::QTILE;
    constexpr int KPANEL = C::KPANEL, KT = C::KT;
    extern __shared__ unsigned char wf_raw[];
    __shared__ int sDoc[FREE ? 1 : NST][KT];   /* doc id of each key of a context tile's stage (not FREE) */
    __shared__ int sPart[PLAN ? 1 : NWG * 4][NWG][3]; /* per warp and block: first, last key of the document, count */
    /* the set-up's result (the plan record's layout): narrowed context range of each block [lo, hi), merged
     * segments (first key, end key, first tile), their count, the context tile count, the contiguity flag,
     * the blocks' doc ids (PLAN) */
    __shared__ __align__(16) int sRec[WF_REC];
    __shared__ __align__(8) unsigned long long sBar[NST];   /* one mbarrier per K/V stage (TMA) */
    /* FREE: the producer warpgroup (warpgroup NWG) issues every K/V tile; the warpgroups release a stage by one
     * mbarrier arrival each (count NWG): no atomic round trip, no TMA issue on their path */
    __shared__ __align__(8) unsigned long long sEmpty[FREE ? NST : 1];

    const uint32_t sbase = (wg_smem_u32(wf_raw) + 1023u) & ~1023u;
    const uint32_t sQ = sbase;                  /* NWG tiles, one per warpgroup */
    const uint32_t sKV = sbase + NWG * QTILE;   /* stage st: K at sKV + 2·st·TILE, V right after */
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
    if (tid == 0) {   /* the stages' mbarriers, before the first barrier (wf_setup's, or the PLAN record's) */
#pragma unroll
        for (int s = 0; s < NST; s++) wf_bar_init(wg_smem_u32(&sBar[s]), 1);
        if (FREE)
#pragma unroll
            for (int s = 0; s < NST; s++) wf_bar_init(wg_smem_u32(&sEmpty[s]), NWG);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        wg_fence_async_smem();
    }
    const int G = n_h / n_kv, used = G * B;
    const int BP = B <= 16 ? 16 : B <= 32 ? 32 : 64, per = KT / BP;   /* block keys: rows per block, blocks per tile */
    const int item = blockIdx.x;   /* PLAN: rank · n_kv + kv head */
    int4 recv = make_int4(0, 0, 0, 0);
    if (PLAN) {
        asm volatile("griddepcontrol.wait;\n" ::: "memory");   /* the plan is complete and visible */
        if (tid < WF_REC / 4) recv = __ldcg((const int4 *)(plan + (size_t)(item / n_kv) * WF_REC) + tid);
    }

    /* this item's Q tile of warpgroup wg, into the NWG Q tiles at qset */
    auto load_q = [&](const wf_item &it, uint32_t qset) {
        const bool lv = wg < it.nb;
        for (int i = wtid; i < WF_KT * CH; i += 128) {
            const int r = i / CH, c = i % CH;
            const bool ok = lv && r < used;
            const size_t row = ok ? ((size_t)((it.b0 + wg) * B + r % B) * n_h + it.g0 * G + r / B) : 0;
            wf_cp16(qset + wg * QTILE + (c / 8) * WF_PANEL + wg_sw128(r, c % 8), q + row * HD + c * 8, ok);
        }
    };
    /* first key of context tile t (< n_ctx) and its segment's end */
    auto ctx_tile = [&](const wf_item &it, int t, int *kb, int *ke) {
        int s = 0;
        while (s + 1 < it.n_seg && t >= it.seg[s + 1][2]) s++;
        *kb = it.seg[s][0] + (t - it.seg[s][2]) * KT;
        *ke = it.seg[s][1];
    };
    /* K/V tile t of item it into stage st (rows past the segment or the blocks zero-filled) */
    auto load = [&](const wf_item &it, int t, int st) {
        const uint32_t dK = sKV + 2 * st * TILE, dV = dK + TILE;
        const int g = it.g0;
        if (t < it.n_ctx) {
            int kb, ke;
            ctx_tile(it, t, &kb, &ke);
            const int nk = min(KT, ke - kb);
            if (FREE || tid == 0) {   /* 64 rows from kb by TMA (rows past the segment: other keys, masked, or zeros);
                                       * FREE: only the producer's thread calls load */
                const uint32_t bar = wg_smem_u32(&sBar[st]);
                wf_bar_expect(bar, 2 * TILE);
#pragma unroll
                for (int p = 0; p < HD / 64; p++) {
                    wf_tma3(dK + p * KPANEL, &tm.k, 64 * p, g, kb, bar);
                    wf_tma3(dV + p * KPANEL, &tm.v, 64 * p, g, kb, bar);
                }
            }
            static_assert(THREADS >= KT, "one thread per key's doc id");
            if (!FREE && !it.by_range && tid < KT)   /* FREE reads the doc ids from global memory */
                wf_cp4(wg_smem_u32(&sDoc[st][tid]), doc_ids + (tid < nk ? kb + tid : 0), tid < nk);
        } else {
            const int j = t - it.n_ctx;
            bool tma_done = false;
            if (FREE || B == BP) {   /* B == BP: the tile's blocks are 64 consecutive rows (past nb: never read);
                                      * FREE: the host guarantees B == BP */
                if (FREE || tid == 0) {
                    const uint32_t bar = wg_smem_u32(&sBar[st]);
                    const int row0 = T + (it.b0 + j * per) * B;
                    wf_bar_expect(bar, 2 * TILE);
#pragma unroll
                    for (int p = 0; p < HD / 64; p++) {
                        wf_tma3(dK + p * KPANEL, &tm.k, 64 * p, g, row0, bar);
                        wf_tma3(dV + p * KPANEL, &tm.v, 64 * p, g, row0, bar);
                    }
                }
                tma_done = true;
            }
            if (!tma_done) {
                for (int i = tid; i < KT * CH; i += THREADS) {
                    const int r = i / CH, c = i % CH, w2 = j * per + r / BP, kk = r % BP;
                    const bool ok = w2 < it.nb && kk < B;
                    const size_t row = ok ? (size_t)T + (size_t)(it.b0 + w2) * B + kk : 0;
                    const size_t off = (row * n_kv + g) * HD + c * 8;
                    const uint32_t dst = (c / 8) * KPANEL + wg_sw128(r, c % 8);
                    wf_cp16(dK + dst, k + off, ok);
                    wf_cp16(dV + dst, v + off, ok);
                }
            }
        }
    };
    /* the item whose set-up is in rec (PLAN: the record; else grp = blockIdx.x, kv head blockIdx.y) */
    auto make_item = [&](const int *rec, int it_index) {
        wf_item it;
        const int grp = PLAN ? rec[WR_GRP] : (int)blockIdx.x;
        it.b0 = grp * NWG;
        it.nb = min(NWG, N - it.b0);
        it.g0 = PLAN ? it_index % n_kv : (int)blockIdx.y;
        it.n_ctx = rec[WR_NCTX];
        it.n_seg = rec[WR_NSEG];
        it.by_range = rec[WR_CONT] != 0;
        it.seg = (const int(*)[3])(rec + WR_SEG);
        return it;
    };
    /* Q, then the first NST - 2 K/V tiles, one cp.async group each (the tile walk's group accounting) */
    auto prologue = [&](const wf_item &it, uint32_t qset) {
        load_q(it, qset);
        mma_commit();
        const int nt = it.n_ctx + (it.nb + per - 1) / per;
        if constexpr (!FREE) {   /* FREE: the producer loads every tile */
#pragma unroll
            for (int s = 0; s < NST - 2; s++) {
                if (s < nt) load(it, s, s);
                mma_commit();
            }
        }
    };

    /* FREE: the producer warpgroup, after the set-up's last barrier: 24 registers; its thread 0 issues tile u once
     * tile u - NST is released (the stage's empty mbarrier) */
    auto producer = [&](const wf_item &it) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (tid == NWG * 128) {
            const int nt = it.n_ctx + (it.nb + per - 1) / per;
            for (int u = 0; u < nt; u++) {
                if (u >= NST) wf_bar_wait<true>(wg_smem_u32(&sEmpty[u % NST]), (uint32_t)(u / NST - 1) & 1u);
                load(it, u, u % NST);
            }
        }
    };
    int d;
    wf_item cur;
    if (PLAN) {
        if (tid < WF_REC / 4) ((int4 *)sRec)[tid] = recv;
        __syncthreads();
        cur = make_item(sRec, item);
        if (FREE && tid >= NWG * 128) {
            producer(cur);
            return;
        }
        if (FREE) asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");   /* 3 x 128 x 160 + 128 x 24 */
        prologue(cur, sQ);
        d = sRec[WR_D + wg];
    } else {
        const int b0 = blockIdx.x * NWG, nb = min(NWG, N - b0);
        wf_item q0;   /* only b0, nb, g0 for the Q load, issued before the set-up */
        q0.b0 = b0;
        q0.nb = nb;
        q0.g0 = blockIdx.y;
        if (!FREE || tid < NWG * 128) load_q(q0, sQ);
        mma_commit();
        d = wf_setup<NWG, FREE>(anchors, doc_ids, b0, nb, window, sPart, sRec + WR_LO, sRec + WR_HI,
                                (int(*)[3])(sRec + WR_SEG), sRec[WR_NSEG], sRec[WR_NCTX], sRec[WR_CONT]);
        cur = make_item(sRec, item);
        if (FREE && tid >= NWG * 128) {
            producer(cur);
            return;
        }
        if (FREE) asm volatile("setmaxnreg.inc.sync.aligned.u32 160;\n" ::: "memory");   /* 3 x 128 x 160 + 128 x 24 */
        const int nt = cur.n_ctx + (cur.nb + per - 1) / per;
        if (!FREE) {
#pragma unroll
            for (int s = 0; s < NST - 2; s++) {
                if (s < nt) load(cur, s, s);
                mma_commit();
            }
        }
    }
    const bool live = wg < cur.nb;
    const int b0 = cur.b0, g0 = cur.g0, n_ctx = cur.n_ctx;
    const int my_lo = sRec[WR_LO + wg], my_hi = sRec[WR_HI + wg];   /* [lo, hi), empty when hi <= lo */
    /* by_range: a context key is visible iff it lies in [my_lo, my_hi) (every block's document contiguous) */
    const bool by_range = cur.by_range;
    const int n_tiles = n_ctx + (cur.nb + per - 1) / per;

    float o[HD / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;   /* this thread's rows in its warpgroup's tile */
    const int j0 = r0 % B, j1 = r1 % B;
    const uint32_t myQ = sQ + wg * QTILE;
    /* out and lse of head gh (the warpgroup's accumulators, all its wgmma done); out is staged in buf, a Q tile
     * of this warpgroup that no wgmma reads any more */
    auto epilogue = [&](int gh, uint32_t buf) {
        if (!live) return;
        const int R = N * B, t4 = lane & 3;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = half ? r1 : r0;
            float lv = l[half];
            lv += __shfl_xor_sync(0xffffffffu, lv, 1);
            lv += __shfl_xor_sync(0xffffffffu, lv, 2);
            const float inv = 1.f / lv;
            /* stage the bf16 row in this warpgroup's Q tile (its wgmma reads are done), same layout */
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                const __nv_bfloat162 x = __floats2bfloat162_rn(o[4 * i + 2 * half] * inv, o[4 * i + 2 * half + 1] * inv);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(buf + (i / 8) * WF_PANEL + wg_sw128(r, i % 8) + 4 * t4),
                             "r"(*(const uint32_t *)&x)
                             : "memory");
            }
            if (r < used) {   /* every live row sees its own block's first key, so lv > 0 */
                const int h = gh * G + r / B;
                const size_t row = (size_t)(b0 + wg) * B + r % B;
                if (t4 == 0) lse[(size_t)h * R + row] = (m[half] + log2f(lv)) / WF_LOG2E;
            }
        }
        /* 16-byte stores, 16 (d_h 128) consecutive threads per 256-byte output row */
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
#pragma unroll
        for (int it = 0; it < WF_KT * CH / 128; it++) {
            const int idx = it * 128 + wtid, r = idx / CH, c = idx % CH;
            if (r < used) {
                uint32_t x0, x1, x2, x3;
                asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(x0), "=r"(x1), "=r"(x2), "=r"(x3)
                             : "r"(buf + (c / 8) * WF_PANEL + wg_sw128(r, c % 8))
                             : "memory");
                const size_t row = (size_t)(b0 + wg) * B + r % B;
                uint4 *dst = (uint4 *)(out + (row * n_h + gh * G + r / B) * HD + c * 8);
                *dst = make_uint4(x0, x1, x2, x3);
            }
        }
    };

    /* FREE: this warpgroup reads tile u's stage no more (its last wgmma on it is retired): one arrival on the
     * stage's empty mbarrier; the producer refills the stage with tile u + NST once all NWG have arrived. Every
     * warpgroup waits every tile's full barrier, skipped or not, so a stage's phases never run ahead of a
     * waiter and no TMA is in flight at exit. */
    auto release = [&](int u) {
        if (u >= 0 && wtid == 0)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(wg_smem_u32(&sEmpty[u % NST])) : "memory");
    };
    if (FREE) {   /* this warpgroup's Q tile (its own cp.async group) has landed */
        mma_wait<0>();
        wg_fence_async_smem();
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
    }

    {   /* the tile walk: context tiles, then the blocks' own keys (tiles 0 .. NST - 3 issued above) */
        for (int t = 0; t < n_tiles; t++) {
            if constexpr (FREE) {   /* no CTA barrier, only this tile's full barrier */
                wf_bar_wait<true>(wg_smem_u32(&sBar[t % NST]), (uint32_t)(t / NST) & 1u);
            } else {
                mma_wait<NST - 3>();   /* Q and tile t have landed */
                wg_fence_async_smem();
                /* TMA tiles: the stage's phase (t / NST) & 1 (every stage use before was TMA) */
                if (t < n_ctx || B == BP) wf_bar_wait(wg_smem_u32(&sBar[t % NST]), (uint32_t)(t / NST) & 1u);
                __syncthreads();          /* ... for everyone; and stage (t - 2) % NST is no longer read */
                if (t + NST - 2 < n_tiles) load(cur, t + NST - 2, (t + NST - 2) % NST);
                mma_commit();
            }
            auto rel = [&] {   /* FREE: called once this warpgroup's reads of tile t - 1 are retired */
                if constexpr (FREE) release(t - 1);
            };
            const int st = t % NST;
            const uint32_t tK = sKV + 2 * st * TILE, tV = tK + TILE;
            bool ran = false;
            if (t < n_ctx) {
                int kb, ke;
                ctx_tile(cur, t, &kb, &ke);
                if (by_range) {   /* CTA-uniform: at most two compares per element */
                    const int lo = my_lo - kb, hi = my_hi - kb;   /* this tile's visible keys: [lo, hi) */
                    if (lo < KT && hi > 0 && hi > lo) {
                        const int t2 = 2 * (lane & 3), lo2 = lo - t2, hi2 = hi - t2;   /* key = 8i + e1 + t2 */
                        wf_step<HD, KT>(o, m, l, myQ, tK, tV, sl2, lo > 0 || hi < KT,
                                        [&](int key, int) { return key - t2 >= lo2 && key - t2 < hi2; }, rel);
                        ran = true;
                    }
                } else {
                    const int p0 = kb + lane, p1 = p0 + 32;
                    /* FREE: the doc ids from global memory (no cp.async group per tile) */
                    const bool v0 = p0 >= my_lo && p0 < my_hi && (FREE ? __ldg(doc_ids + p0) : sDoc[st][lane]) == d;
                    const bool v1 = p1 >= my_lo && p1 < my_hi && (FREE ? __ldg(doc_ids + p1) : sDoc[st][lane + 32]) == d;
                    const uint32_t mlo = __ballot_sync(0xffffffffu, v0), mhi = __ballot_sync(0xffffffffu, v1);
                    if (mlo | mhi) {   /* identical in every warp of the warpgroup */
                        wf_step<HD, KT>(
                            o, m, l, myQ, tK, tV, sl2, (mlo & mhi) != 0xffffffffu,
                            [&](int key, int) { return ((key < 32 ? mlo >> key : mhi >> (key - 32)) & 1u) != 0; }, rel);
                        ran = true;
                    }
                }
            } else if (live && wg / per == t - n_ctx) {
                const uint32_t koff = (uint32_t)((wg % per) * BP) * 128u;
                auto vis = [&](int key, int half) { return key < B && !(causal && key > (half ? j1 : j0)); };
                if (BP == 16) wf_step<HD, 16>(o, m, l, myQ, tK + koff, tV + koff, sl2, true, vis, rel);
                else if (BP == 32) wf_step<HD, 32>(o, m, l, myQ, tK + koff, tV + koff, sl2, true, vis, rel);
                else wf_step<HD, 64>(o, m, l, myQ, tK + koff, tV + koff, sl2, true, vis, rel);
                ran = true;
            }
            if (!ran) {
                wg_wait<0>();   /* the last P·V read stage (t - 1) % NST or older: done before it is refilled */
                rel();
            }
        }
    }
    wg_wait<0>();
    wg_acc_fence<HD / 2>(o);
    mma_wait<0>();

    epilogue(g0, myQ);   /* nothing when !live */
}

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda); cached after the first call */
static PFN_cuTensorMapEncodeTiled_v12000 wf_encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (fn) return fn;
    void *p = nullptr;
    cudaDriverEntryPointQueryResult qres = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &qres);
    if (e != cudaSuccess || qres != cudaDriverEntryPointSuccess || !p) {
        kernels_fail("ba_wg_forward: cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled): %s (query result %d)",
                     cudaGetErrorString(e), (int)qres);
        return nullptr;
    }
    fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    return fn;
}

/* tensor map of K or V ([T + N·B][n_kv][d_h] bf16): boxes of {64 elements, 1 head, 64 rows} = one 128B-swizzled
 * 64-row panel (the layout of wg_sw128); rows past the end read as zeros. 0, or -1 with kernels_fail. */
static int wf_tmap(CUtensorMap *m, const void *base, const block_attn_config *c, const char *what) {
    PFN_cuTensorMapEncodeTiled_v12000 fn = wf_encode_fn();
    if (!fn) return -1;
    if ((uintptr_t)base % 16) return kernels_fail("ba_wg_forward (T): %s is not 16-byte aligned", what);
    const cuuint64_t dims[3] = {(cuuint64_t)c->d_h, (cuuint64_t)c->n_kv, (cuuint64_t)c->T + (cuuint64_t)c->N * c->B};
    const cuuint64_t strides[2] = {(cuuint64_t)c->d_h * 2, (cuuint64_t)c->n_kv * c->d_h * 2};
    const cuuint32_t box[3] = {64, 1, 64}, estr[3] = {1, 1, 1};
    const CUresult r = fn(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, estr,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return kernels_fail("ba_wg_forward (T): cuTensorMapEncodeTiled(%s) failed: CUresult %d", what, (int)r);
    return 0;
}

/* PDL launch (cudaLaunchAttributeProgrammaticStreamSerialization) of kern on stream: it may start before
 * the previous kernel on the stream ends and must griddepcontrol.wait before reading that kernel's output. */
template <typename... Exp, typename... Act>
cudaError_t wf_launch_pdl(void (*kern)(Exp...), dim3 grid, int threads, size_t smem, cudaStream_t stream, Act... args) {
    cudaLaunchConfig_t lc = {};
    lc.gridDim = grid;
    lc.blockDim = dim3((unsigned)threads);
    lc.dynamicSmemBytes = smem;
    lc.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = at;
    lc.numAttrs = 1;
    return cudaLaunchKernelEx(&lc, kern, args...);
}

template <int HD, bool PLAN, bool FREE>
int wf_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
              const int32_t *doc_ids, bf16 *out, float *lse, void *ws, cudaStream_t stream) {
    constexpr int NWG = WF_GROUP;
    using C = wf_cfg<HD, NWG>;
    const size_t smem = C::smem;
    auto kern = ba_wg_forward_kernel<HD, PLAN, FREE>;
    wf_tmaps tm{};
    if (wf_tmap(&tm.k, k, c, "k") || wf_tmap(&tm.v, v, c, "v")) return -1;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kernels_fail("ba_wg_forward: cudaFuncSetAttribute(%zu bytes): %s", smem, cudaGetErrorString(e));
    const int n_grp = (c->N + NWG - 1) / NWG;
    const __nv_bfloat16 *Q = (const __nv_bfloat16 *)q, *K = (const __nv_bfloat16 *)k, *V = (const __nv_bfloat16 *)v;
    __nv_bfloat16 *O = (__nv_bfloat16 *)out;
    const float sl2 = c->scale * WF_LOG2E;
    if (!PLAN) {
        kern<<<dim3(n_grp, c->n_kv), C::THREADS + (FREE ? 128 : 0), smem, stream>>>(Q, K, V, anchors, doc_ids, O, lse, c->T, c->N, c->B,
                                                                  c->n_h, c->n_kv, c->window, c->causal, sl2, nullptr,
                                                                  tm);
        KERNELS_CHECK_LAUNCH("ba_wg_forward_kernel");
        return 0;
    }
    /* the plan (two small kernels), then the main kernel with PDL; workspace layout at wf_ws_ints */
    int *rec = (int *)ws, *ntiles = rec + (size_t)n_grp * WF_REC, *srec = ntiles + ((n_grp + 3) & ~3);
    wf_plan_kernel<NWG><<<n_grp, C::THREADS, 0, stream>>>(anchors, doc_ids, c->N, c->B, c->window, rec, ntiles);
    KERNELS_CHECK_LAUNCH("ba_wg_forward (plan)");
    e = wf_launch_pdl(wf_order_kernel, dim3(1), WF_ORD_THREADS, 0, stream, (const int *)rec, (const int *)ntiles,
                      n_grp, srec);
    if (e != cudaSuccess) return kernels_fail("ba_wg_forward (order): %s", cudaGetErrorString(e));
    KERNELS_CHECK_LAUNCH("ba_wg_forward (order)");
    const int grid = n_grp * c->n_kv;
    e = wf_launch_pdl(kern, dim3((unsigned)grid), C::THREADS + (FREE ? 128 : 0), smem, stream, Q, K, V, anchors, doc_ids, O, lse, c->T, c->N,
                      c->B, c->n_h, c->n_kv, c->window, c->causal, sl2, (const int *)srec, tm);
    if (e != cudaSuccess) return kernels_fail("ba_wg_forward (main, PDL): %s", cudaGetErrorString(e));
    KERNELS_CHECK_LAUNCH("ba_wg_forward_kernel (plan)");
    return 0;
}

/* The kernel for the call: free-running warpgroups fed by a producer warpgroup where B is 16, 32 or 64
 * (block tiles by TMA need B = BP), else the walk with a barrier per tile; the plan path when ws != NULL. */
template <int HD>
int wf_select(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
              const int32_t *doc_ids, bf16 *out, float *lse, void *ws, cudaStream_t stream) {
#define WF_GO(P, M) wf_launch<HD, P, M>(c, q, k, v, anchors, doc_ids, out, lse, ws, stream)
    if (c->B == 16 || c->B == 32 || c->B == 64)
        return ws ? WF_GO(true, true) : WF_GO(false, true);
    return ws ? WF_GO(true, false) : WF_GO(false, false);
#undef WF_GO
}

}  // namespace

#endif /* KERNELS_BLOCK_ATTN_FWD_WG_CUH */
