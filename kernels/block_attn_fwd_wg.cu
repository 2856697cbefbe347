/*
 * kernels/block_attn_fwd_wg.cu — the Hopper wgmma (sm_90a) anchored block attention forward, kernel
 * set 7 of block_attn_forward (kernels/block_attn_wg.h; contract and masks in kernels/block_attn.h,
 * dflash-reference.md §6). The GPU tests run it on every case next to sets 5 and 6
 * (DFLASH_BLOCK_ATTN_KERNEL=6 keeps the verified mma.sync kernel reachable).
 *
 * One CTA of NWG = 3 warpgroups per (3 consecutive blocks b0.., kv head g). Warpgroup w owns block
 * b0 + w's 64 query rows (row r -> head g·G + r/B, slot r%B; rows >= G·B and blocks past N compute on
 * zero Q and are never stored), kept in shared memory as 128B-swizzled K-major panels
 * (kernels/wgmma.cuh). Sorted anchors are ~16 tokens apart, so the blocks' context ranges (each
 * narrowed to the first..last key of its document inside [max(0, a-W), a)) nearly coincide: the CTA
 * merges them into at most NWG segments (ranges closer than one tile merge), walks them in 64-key
 * tiles, then walks the blocks' own keys packed BP = B rounded up to 16/32/64 rows per block (64/BP
 * blocks per tile). Each K/V tile is loaded once (cp.async, NST = 4 stages, prefetch distance 2, rows
 * past the segment zero-filled) and serves every warpgroup whose keys it holds; the others skip it.
 *
 * Per tile and warpgroup: S = Q·Kᵀ with d_h/16 × wgmma m64nNKk16 (NK = 64, or BP on block tiles),
 * both operands from shared memory; masks only where the tile is not fully visible; online softmax in
 * fp32, base 2 with the scale folded into one FMA before ex2.approx (as set 6); P rounded to bf16
 * (cvt.rn.bf16x2) straight from the accumulator into A fragments; O += P·V with NK/16 × wgmma
 * m64n(d_h)k16, A from registers, V MN-major (the V tile is stored like K, [key][d] panels, LBO =
 * panel bytes). The P·V group is left in flight across the next tile's barrier and waited by the next
 * S (or by a skip), which is why stage t-2, not t-1, is the one refilled at tile t. lse is saved in
 * natural log; out in bf16.
 *
 * Context masks. Default ("3x", template FAST): the set-up also counts the document's keys in each
 * block's window; when every block of the CTA has them as one contiguous run [lo, hi) (packed
 * documents, the normal case; CTA-uniform flag sCont) a context tile needs no doc ids (not even
 * loaded), no ballots, and on an edge tile two integer compares per element; full tiles none.
 * Interleaved documents fall back to the doc-id ballots per tile, which is what the previous default
 * ("3", DFLASH_BLOCK_ATTN_WG_FWD=3, the one revert switch, see ba_wg_forward) does on every tile.
 *
 * History: the losing variants of the H200 rounds (2 warpgroups per CTA; the FlashAttention-3 style
 * pipeline inside a warpgroup; ordered S issue by named barriers; the lazy rescale; the shorter
 * set-up; 5 stages; 128-key tiles; a quarter of the exponentials by polynomial) and the timing probes
 * (softmax or products skipped) were deleted from this file: their code is in git commit b94183e
 * (this file and the variant loop of tests/gpu/test_block_attn.c), their numbers in
 * kernels/bench/RESULTS.md.
 *
 * Set-up per CTA: one scan of the union of the blocks' windows by all threads (doc ids), per-warp
 * partial first/last keys and counts, then warp 0 reduces, sorts (NWG <= 3, compile-time indices)
 * and merges. The tile walk, the loads and the masks were checked against the reference visibility
 * by a host emulation (every visible (row, key) pair multiplied exactly once, no masked-in zero row)
 * before any GPU run.
 *
 * Invariants: every wgmma / fence / commit / wait is executed by all 128 threads of a warpgroup
 * (every branch around them is warpgroup-uniform); accumulator arrays have compile-time indices
 * (ptxas, d_h 128: no spills, no serialized-wgmma notes; registers 159 ("3x"), 158 ("3"); the cap is
 * 168 at 3 warpgroups).
 * Shared memory: 3 Q tiles of 64 × d_h + 2·NST K/V tiles of 64 × d_h bf16 + 1 KB: 177 KB at d_h 128
 * — one CTA per SM, which registers impose anyway.
 *
 * Session 3 candidates (helper BF; template flags, selected by DFLASH_BLOCK_ATTN_WG_FWD = 10 .. 18, see
 * ba_wg_forward; none is the default yet; notes in .helpers/notes-bf.md). All keep the per-row arithmetic and
 * its order, so out and lse are bitwise equal to the default's (the bench's BA_FWD_TRACE=1 report checks it
 * at full size and on 11 small shapes):
 *   EPI:  the epilogue staged in the warpgroup's own Q tile (free once its last wgmma is waited; same
 *         swizzled layout, conflict-free 4-byte writes), a named barrier per warpgroup, then 16-byte stores
 *         (16 threads per 256-byte output row) instead of 4-byte stores in half-sector pieces.
 *   MBAR: per-stage mbarriers instead of the CTA-wide __syncthreads per tile, so warpgroups drift up to a
 *         tile apart and their S / softmax / P·V phases interleave. empty[s] (12 arrivals: lane 0 of each warp
 *         after the wait that retires its P·V of the stage's tile) gates the refill of tile u = t + 2 (it
 *         waits the release of tile u - 4, parity (u/4 - 1) & 1); full[s] (384 arrivals) gates the read of
 *         tile t (parity (t/4) & 1). MBAR 1: cp.async.mbarrier.arrive.noinc right after the loads, consumer-
 *         side fence.proxy.async after the wait (relies on the proxy fence being cumulative over the acquire);
 *         MBAR 2: each thread waits its own part of tile t + 1 at step t, fences (writer side, the verified
 *         wgmma.cuh protocol) and arrives plainly: one step less prefetch slack. Both protocols were emulated
 *         on the host (random interleavings, asynchronous completion, 1..100 tiles): no deadlock, no read
 *         before a tile landed, no refill while any warp may still read the stage.
 *   H2:   one CTA walks the same 3 blocks for 2 kv heads (grid y = ceil(n_kv / 2)): set-up once, both heads'
 *         Q loaded at entry (the second Q set takes 48 KB more: 225 KB + 1.6 KB static <= 227 KB at d_h 128),
 *         one stream of 2·n_tiles tiles, so the second head's first K/V tiles are prefetched under the first
 *         head's last ones; at the switch each warpgroup waits its P·V, writes out / lse of the first head and
 *         resets o, m, l.
 *   TRACE (bench only, ba_wg_forward_traced): %globaltimer / clock64 stamps per CTA (layout in block_attn_wg.h).
 * ptxas, d_h 128: default 159 registers, "3" 158 (unchanged); candidates 162-168, no spills, no C7510/C7511.
 */
#include "kernels/block_attn_wg.h"
#include "kernels/mma.cuh"
#include "kernels/wgmma.cuh"

#include <climits>
#include <cstdlib>
#include <cstring>

#include <cuda_bf16.h>

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
    static constexpr int NST = 4;                      /* K/V stages (prefetch distance NST - 2) */
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

/* mbarrier helpers (candidate MBAR, DFLASH_BLOCK_ATTN_WG_FWD=11/12) and the trace clock */
__device__ __forceinline__ void wf_mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* the executing thread's earlier cp.async ops arrive on bar when they complete (count pre-set, no increment) */
__device__ __forceinline__ void wf_mbar_cp_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void wf_mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
/* blocks until the phase of parity `parity` of bar has completed (acquire, CTA scope) */
__device__ __forceinline__ void wf_mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile("{\n.reg .pred p;\nWF_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WF_WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ unsigned long long wf_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned wf_smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %smid;" : "=r"(s));
    return s;
}
constexpr int WF_TRACE_SLOTS = 16;   /* u64 per CTA in the trace buffer (layout at ba_wg_forward_traced) */

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
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++) {
        p[kk][0] = mma_pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
        p[kk][1] = mma_pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
        p[kk][2] = mma_pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
        p[kk][3] = mma_pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
    }
}

/* Issues O += P·V over NK keys (v_s: the tile's first key row), A = p from registers (the caller commits). */
template <int HD, int NK, int KPANEL = WF_PANEL>
__device__ __forceinline__ void wf_issue_pv(float *o, uint32_t (*p)[4], uint32_t v_s) {
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < NK / 16; kk++)
        wg_mma_rs<HD, 1>(o, p[kk], wg_desc_mnmajor(v_s + kk * 16 * 128, KPANEL), 1);
}

/* One tile step of one warpgroup: S, wait (S and the previous P·V), softmax, P·V in flight. */
template <int HD, int NK, typename Vis>
__device__ __forceinline__ void wf_step(float *o, float *m, float *l, uint32_t q_s, uint32_t k_s, uint32_t v_s,
                                        float sl2, bool need_mask, Vis vis) {
    float s[NK / 2];
    wf_issue_s<HD, NK>(s, q_s, k_s);
    wg_commit();
    wg_wait<0>();
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
template <int NWG>
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
        for (int p0 = ulo + tid; p0 < uhi; p0 += 8 * THREADS) {   /* 8 independent loads in flight */
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
            if (lane == 0) {
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

template <int HD, int NWG, bool FAST, bool EPI, int MBAR, bool H2, bool TRACE>
__global__ void __launch_bounds__(NWG * 128, 1)
ba_wg_forward_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
                     const int32_t *doc_ids, __nv_bfloat16 *out, float *lse, int T, int N, int B, int n_h, int n_kv,
                     int window, int causal, float sl2, unsigned long long *trace) {
    using C = wf_cfg<HD, NWG>;
    constexpr int CH = HD / 8, THREADS = C::THREADS, TILE = C::TILE, NST = C::NST, QTILE = C::QTILE;
    constexpr int KPANEL = C::KPANEL, KT = C::KT;
    extern __shared__ unsigned char wf_raw[];
    __shared__ int sDoc[NST][KT];   /* doc id of each key of a context tile's stage */
    __shared__ int sPart[NWG * 4][NWG][3]; /* per warp and block: first, last key of the document, count */
    __shared__ int sLo[NWG], sHi[NWG];    /* narrowed context range of each block: [lo, hi) */
    __shared__ int sSeg[NWG][3];          /* merged segments: first key, end key, first tile */
    __shared__ int sNSeg, sNCtx, sCont;
    __shared__ __align__(8) unsigned long long sFull[NST], sEmpty[NST];   /* MBAR only */
    unsigned long long tr_t0 = 0, tr_c0 = 0, tr_t1 = 0, tr_wait = 0;
    if (TRACE) {
        tr_t0 = wf_gtime();
        tr_c0 = clock64();
    }

    const uint32_t sbase = (wg_smem_u32(wf_raw) + 1023u) & ~1023u;
    const uint32_t sQ = sbase;                    /* NWG tiles, one per warpgroup (H2: then the second head's) */
    const uint32_t sKV = sbase + (H2 ? 2 : 1) * NWG * QTILE;   /* stage st: K at sKV + 2·st·TILE, V right after */
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
    const int b0 = blockIdx.x * NWG, nb = min(NWG, N - b0), G = n_h / n_kv, used = G * B;
    const int g0 = blockIdx.y * (H2 ? 2 : 1), nh = H2 ? min(2, n_kv - g0) : 1;   /* kv heads g0 .. g0 + nh - 1 */
    const bool live = wg < nb;
    if (MBAR && tid == 0) {
        /* full[st]: every thread's part of the tile in stage st (MBAR 1: async arrive, no increment; 2: plain
         * arrive after its own cp.async wait and proxy fence);
         * empty[st]: every warp once the stage's last reader (its P·V) is done */
        for (int s = 0; s < NST; s++) {
            wf_mbar_init(wg_smem_u32(&sFull[s]), THREADS);
            wf_mbar_init(wg_smem_u32(&sEmpty[s]), THREADS / 32);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }   /* visible to all after wf_setup's barriers */

    /* this warpgroup's query tile (H2: both heads') */
    for (int hh = 0; hh < nh; hh++)
        for (int i = wtid; i < WF_KT * CH; i += 128) {
            const int r = i / CH, c = i % CH;
            const bool ok = live && r < used;
            const size_t row = ok ? ((size_t)((b0 + wg) * B + r % B) * n_h + (g0 + hh) * G + r / B) : 0;
            wf_cp16(sQ + (hh * NWG + wg) * QTILE + (c / 8) * WF_PANEL + wg_sw128(r, c % 8), q + row * HD + c * 8, ok);
        }
    mma_commit();

    const int d = wf_setup<NWG>(anchors, doc_ids, b0, nb, window, sPart, sLo, sHi, sSeg, sNSeg, sNCtx, sCont);
    const int my_lo = sLo[wg], my_hi = sHi[wg];   /* [lo, hi), empty when hi <= lo */
    const int n_seg = sNSeg, n_ctx = sNCtx;
    /* FAST: a context key is visible iff it lies in [my_lo, my_hi) (every block's document contiguous) */
    const bool by_range = FAST && sCont != 0;
    const int BP = B <= 16 ? 16 : B <= 32 ? 32 : 64, per = KT / BP;   /* block keys: rows per block, blocks per tile */
    const int n_tiles = n_ctx + (nb + per - 1) / per;   /* per head */
    const int n_all = n_tiles * nh;                      /* H2: head g0's tiles, then head g0 + 1's */

    /* first key of context tile t (< n_ctx) and its segment's end */
    auto ctx_tile = [&](int t, int *kb, int *ke) {
        int s = 0;
        while (s + 1 < n_seg && t >= sSeg[s + 1][2]) s++;
        *kb = sSeg[s][0] + (t - sSeg[s][2]) * KT;
        *ke = sSeg[s][1];
    };
    auto load = [&](int t, int st) {
        const uint32_t dK = sKV + 2 * st * TILE, dV = dK + TILE;
        int g = g0;
        if (H2 && t >= n_tiles) {
            t -= n_tiles;
            g++;
        }
        if (t < n_ctx) {
            int kb, ke;
            ctx_tile(t, &kb, &ke);
            const int nk = min(KT, ke - kb);
            for (int i = tid; i < KT * CH; i += THREADS) {
                const int r = i / CH, c = i % CH;
                const bool ok = r < nk;
                const size_t off = ((size_t)(ok ? kb + r : 0) * n_kv + g) * HD + c * 8;
                const uint32_t dst = (c / 8) * KPANEL + wg_sw128(r, c % 8);
                wf_cp16(dK + dst, k + off, ok);
                wf_cp16(dV + dst, v + off, ok);
            }
            static_assert(THREADS >= KT, "one thread per key's doc id");
            if (!by_range && tid < KT) wf_cp4(wg_smem_u32(&sDoc[st][tid]), doc_ids + (tid < nk ? kb + tid : 0), tid < nk);
        } else {
            const int j = t - n_ctx;
            for (int i = tid; i < KT * CH; i += THREADS) {
                const int r = i / CH, c = i % CH, w2 = j * per + r / BP, kk = r % BP;
                const bool ok = w2 < nb && kk < B;
                const size_t row = ok ? (size_t)T + (size_t)(b0 + w2) * B + kk : 0;
                const size_t off = (row * n_kv + g) * HD + c * 8;
                const uint32_t dst = (c / 8) * KPANEL + wg_sw128(r, c % 8);
                wf_cp16(dK + dst, k + off, ok);
                wf_cp16(dV + dst, v + off, ok);
            }
        }
    };

    float o[HD / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;   /* this thread's rows in its warpgroup's tile */
    const int j0 = r0 % B, j1 = r1 % B;
    uint32_t myQ = sQ + wg * QTILE;
    /* out and lse of head gh (the warpgroup's accumulators, all its wgmma done); EPI stages in buf, a Q tile
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
            if (EPI) {   /* stage the bf16 row in this warpgroup's Q tile (its wgmma reads are done), same layout */
    #pragma unroll
                for (int i = 0; i < HD / 8; i++) {
                    const __nv_bfloat162 x = __floats2bfloat162_rn(o[4 * i + 2 * half] * inv, o[4 * i + 2 * half + 1] * inv);
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(buf + (i / 8) * WF_PANEL + wg_sw128(r, i % 8) + 4 * t4),
                                 "r"(*(const uint32_t *)&x)
                                 : "memory");
                }
            }
            if (r < used) {   /* every live row sees its own block's first key, so lv > 0 */
                const int h = gh * G + r / B;
                const size_t row = (size_t)(b0 + wg) * B + r % B;
                if (!EPI) {
                    __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + (row * n_h + h) * HD) + t4;
    #pragma unroll
                    for (int i = 0; i < HD / 8; i++)
                        dst[4 * i] = __floats2bfloat162_rn(o[4 * i + 2 * half] * inv, o[4 * i + 2 * half + 1] * inv);
                }
                if (t4 == 0) lse[(size_t)h * R + row] = (m[half] + log2f(lv)) / WF_LOG2E;
            }
        }
        if (EPI) {   /* 16-byte stores, 16 (d_h 128) consecutive threads per 256-byte output row */
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
        }
    };

    {   /* the tile walk: context tiles, then the blocks' own keys */
        if (MBAR == 1) {
#pragma unroll
            for (int s = 0; s < NST - 2; s++)
                if (s < n_all) {
                    load(s, s);
                    wf_mbar_cp_arrive(wg_smem_u32(&sFull[s]));
                }
            mma_wait<0>();   /* the Q group only (the tiles' cp.async are not committed: the mbarriers track them) */
            wg_fence_async_smem();
            asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");   /* this warpgroup's Q, its own loads */
        } else if (MBAR == 2) {
#pragma unroll
            for (int s = 0; s < NST - 2; s++) {
                if (s < n_all) load(s, s);
                mma_commit();
            }
            mma_wait<NST - 3>();   /* Q and tile 0 (this thread's part) */
            wg_fence_async_smem();
            wf_mbar_arrive(wg_smem_u32(&sFull[0]));   /* release: every thread's Q and tile 0 part, fenced */
        } else {
#pragma unroll
            for (int s = 0; s < NST - 2; s++) {
                if (s < n_all) load(s, s);
                mma_commit();
            }
        }
        if (TRACE && tid == 0) trace[((size_t)blockIdx.y * gridDim.x + blockIdx.x) * WF_TRACE_SLOTS + 2] = wf_gtime();
        for (int ta = 0; ta < n_all; ta++) {
            int t = ta;   /* H2: the tile within its head */
            if (H2 && ta >= n_tiles) {
                t = ta - n_tiles;
                if (t == 0) {   /* head g0 done (its last P·V waited here): out, lse, then start head g0 + 1 */
                    wg_wait<0>();
                    wg_acc_fence<HD / 2>(o);
                    epilogue(g0, myQ);
#pragma unroll
                    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;
                    m[0] = m[1] = -INFINITY;
                    l[0] = l[1] = 0.f;
                    myQ += NWG * QTILE;
                }
            }
            const long long tw0 = TRACE ? clock64() : 0;
            if (MBAR == 2) {   /* writer-side fence: the verified wgmma.cuh protocol, a barrier split in two */
                const int u = ta + NST - 2;
                if (u < n_all) {
                    if (u >= NST) wf_mbar_wait(wg_smem_u32(&sEmpty[u % NST]), (uint32_t)((u / NST - 1) & 1));
                    load(u, u % NST);
                }
                mma_commit();
                if (ta + 1 < n_all) {   /* this thread's part of tile ta + 1 (issued one step ago): landed, fenced */
                    mma_wait<NST - 3>();
                    wg_fence_async_smem();
                    wf_mbar_arrive(wg_smem_u32(&sFull[(ta + 1) % NST]));
                }
                wf_mbar_wait(wg_smem_u32(&sFull[ta % NST]), (uint32_t)((ta / NST) & 1));   /* everyone's part of tile ta */
            } else if (MBAR) {
                const int u = ta + NST - 2;   /* the tile this thread loads now, into the stage of tile u - NST */
                if (u < n_all) {
                    if (u >= NST) wf_mbar_wait(wg_smem_u32(&sEmpty[u % NST]), (uint32_t)((u / NST - 1) & 1));
                    load(u, u % NST);
                    wf_mbar_cp_arrive(wg_smem_u32(&sFull[u % NST]));
                }
                wf_mbar_wait(wg_smem_u32(&sFull[ta % NST]), (uint32_t)((ta / NST) & 1));   /* tile ta has landed */
                wg_fence_async_smem();   /* the cp.async (generic proxy) writes, before wgmma reads them */
            } else {
                mma_wait<NST - 3>();   /* Q and tile t have landed */
                wg_fence_async_smem();
                __syncthreads();          /* ... for everyone; and stage (t - 2) % NST is no longer read */
                if (ta + NST - 2 < n_all) load(ta + NST - 2, (ta + NST - 2) % NST);
                mma_commit();
            }
            if (TRACE) tr_wait += clock64() - tw0;
            const int st = ta % NST;
            const uint32_t tK = sKV + 2 * st * TILE, tV = tK + TILE;
            bool ran = false;
            if (t < n_ctx) {
                int kb, ke;
                ctx_tile(t, &kb, &ke);
                if (by_range) {   /* CTA-uniform: at most two compares per element */
                    const int lo = my_lo - kb, hi = my_hi - kb;   /* this tile's visible keys: [lo, hi) */
                    if (lo < KT && hi > 0 && hi > lo) {
                        const int t2 = 2 * (lane & 3), lo2 = lo - t2, hi2 = hi - t2;   /* key = 8i + e1 + t2 */
                        wf_step<HD, KT>(o, m, l, myQ, tK, tV, sl2, lo > 0 || hi < KT,
                                        [&](int key, int) { return key - t2 >= lo2 && key - t2 < hi2; });
                        ran = true;
                    }
                } else {
                    const int p0 = kb + lane, p1 = p0 + 32;
                    const bool v0 = p0 >= my_lo && p0 < my_hi && sDoc[st][lane] == d;
                    const bool v1 = p1 >= my_lo && p1 < my_hi && sDoc[st][lane + 32] == d;
                    const uint32_t mlo = __ballot_sync(0xffffffffu, v0), mhi = __ballot_sync(0xffffffffu, v1);
                    if (mlo | mhi) {   /* identical in every warp of the warpgroup */
                        wf_step<HD, KT>(
                            o, m, l, myQ, tK, tV, sl2, (mlo & mhi) != 0xffffffffu,
                            [&](int key, int) { return ((key < 32 ? mlo >> key : mhi >> (key - 32)) & 1u) != 0; });
                        ran = true;
                    }
                }
            } else if (live && wg / per == t - n_ctx) {
                const uint32_t koff = (uint32_t)((wg % per) * BP) * 128u;
                auto vis = [&](int key, int half) { return key < B && !(causal && key > (half ? j1 : j0)); };
                if (BP == 16) wf_step<HD, 16>(o, m, l, myQ, tK + koff, tV + koff, sl2, true, vis);
                else if (BP == 32) wf_step<HD, 32>(o, m, l, myQ, tK + koff, tV + koff, sl2, true, vis);
                else wf_step<HD, 64>(o, m, l, myQ, tK + koff, tV + koff, sl2, true, vis);
                ran = true;
            }
            if (!ran) wg_wait<0>();   /* the last P·V read stage (t - 1) % NST or older: done before it is refilled */
            /* MBAR: this warpgroup's reads of tile t - 1 (its P·V, waited just above or inside wf_step) are
             * done: release the stage, one arrival per warp (wgmma.wait_group is warp-synchronous) */
            if (MBAR && ta > 0 && lane == 0) wf_mbar_arrive(wg_smem_u32(&sEmpty[(ta - 1) % NST]));
        }
    }
    wg_wait<0>();
    wg_acc_fence<HD / 2>(o);
    if (MBAR == 1) asm volatile("cp.async.wait_all;\n" ::: "memory");   /* no cp.async in flight at exit */
    else mma_wait<0>();
    if (TRACE) tr_t1 = wf_gtime();
    if (TRACE && wtid == 0) {
        unsigned long long *tr = trace + ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * WF_TRACE_SLOTS;
        tr[8 + wg] = tr_wait;
        if (wg == 0) {
            tr[0] = wf_smid();
            tr[1] = tr_t0;
            tr[3] = tr_t1;
            tr[5] = tr_c0;
            tr[7] = (unsigned long long)n_all;
        }
    }

    if (!live) return;
    epilogue(g0 + nh - 1, myQ);
    if (TRACE && wtid == 0)
        trace[((size_t)blockIdx.y * gridDim.x + blockIdx.x) * WF_TRACE_SLOTS + (wg == 0 ? 4 : 11 + wg)] = wf_gtime();
    if (TRACE && tid == 0) trace[((size_t)blockIdx.y * gridDim.x + blockIdx.x) * WF_TRACE_SLOTS + 6] = clock64();
}

/* kernel options picked by DFLASH_BLOCK_ATTN_WG_FWD (see ba_wg_forward) */
struct wf_opt {
    bool fast, epi;
    int mbar;   /* 0: __syncthreads per tile; 1: async-arrive mbarriers; 2: writer-fenced mbarriers */
    bool h2;
};

template <int HD, int NWG, bool FAST, bool EPI, int MBAR, bool H2, bool TRACE>
int wf_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
              const int32_t *doc_ids, bf16 *out, float *lse, unsigned long long *trace, cudaStream_t stream) {
    using C = wf_cfg<HD, NWG>;
    const size_t smem = C::smem + (H2 ? (size_t)NWG * C::QTILE : 0);   /* H2: the second head's Q tiles */
    auto kern = ba_wg_forward_kernel<HD, NWG, FAST, EPI, MBAR, H2, TRACE>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kernels_fail("ba_wg_forward: cudaFuncSetAttribute(%zu bytes): %s", smem, cudaGetErrorString(e));
    kern<<<dim3((c->N + NWG - 1) / NWG, H2 ? (c->n_kv + 1) / 2 : c->n_kv), C::THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (__nv_bfloat16 *)out, lse, c->T, c->N, c->B, c->n_h, c->n_kv, c->window, c->causal, c->scale * WF_LOG2E, trace);
    KERNELS_CHECK_LAUNCH("ba_wg_forward_kernel");
    return 0;
}

template <int HD, bool TRACE>
int wf_select(wf_opt op, const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
              const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, unsigned long long *trace,
              cudaStream_t stream) {
#define WF_GO(F, E, M, H) wf_launch<HD, 3, F, E, M, H, TRACE>(c, q, k, v, anchors, doc_ids, out, lse, trace, stream)
    if (!op.fast) return WF_GO(false, false, 0, false);
    if (op.h2) {
        if (op.epi && op.mbar == 1) return WF_GO(true, true, 1, true);
        if (op.epi && op.mbar == 2) return WF_GO(true, true, 2, true);
        if (op.epi) return WF_GO(true, true, 0, true);
        return WF_GO(true, false, 0, true);
    }
    if (op.epi && op.mbar == 1) return WF_GO(true, true, 1, false);
    if (op.epi && op.mbar == 2) return WF_GO(true, true, 2, false);
    if (op.epi) return WF_GO(true, true, 0, false);
    if (op.mbar == 1) return WF_GO(true, false, 1, false);
    if (op.mbar == 2) return WF_GO(true, false, 2, false);
    return WF_GO(true, false, 0, false);
#undef WF_GO
}

/* DFLASH_BLOCK_ATTN_WG_FWD -> options; -1 with kernels_fail on an unknown value */
int wf_parse(wf_opt *op) {
    const char *e = getenv("DFLASH_BLOCK_ATTN_WG_FWD");
    *op = {true, false, 0, false};   /* "3x", H200 2026-11-29: 231.7 TFLOP/s ("3" 228.9), tested */
    if (!e || !e[0]) return 0;
    if (!strcmp(e, "3")) op->fast = false;
    else if (!strcmp(e, "10")) op->epi = true;
    else if (!strcmp(e, "11")) op->mbar = 1;
    else if (!strcmp(e, "12")) op->epi = true, op->mbar = 1;
    else if (!strcmp(e, "13")) op->h2 = true;
    else if (!strcmp(e, "14")) op->h2 = op->epi = true;
    else if (!strcmp(e, "15")) op->h2 = op->epi = true, op->mbar = 1;
    else if (!strcmp(e, "16")) op->mbar = 2;
    else if (!strcmp(e, "17")) op->epi = true, op->mbar = 2;
    else if (!strcmp(e, "18")) op->h2 = op->epi = true, op->mbar = 2;
    else
        return kernels_fail("ba_wg_forward: DFLASH_BLOCK_ATTN_WG_FWD=%s, expected 3 (the previous default), "
                            "10 .. 18 (candidates) or unset (the default, 3x)", e);
    return 0;
}

int wf_n_cta(const block_attn_config *c) {
    wf_opt op;
    const bool h2 = !wf_parse(&op) && op.h2;
    return (c->N + 2) / 3 * (h2 ? (c->n_kv + 1) / 2 : c->n_kv);
}

}  // namespace

/* DFLASH_BLOCK_ATTN_WG_FWD (read per call): unset or empty = "3x", the default (3 blocks per CTA, context
 * masks from the key range where every block's document is contiguous, FAST); "3" = the previous default
 * (doc-id ballots on every context tile), kept as the one revert switch. Candidates of session 3 (all "3x"
 * plus): "10" = epilogue staged through shared memory, 16-byte stores; "11" = per-stage mbarriers instead
 * of the per-tile __syncthreads; "12" = both; "13" = two kv heads per CTA (set-up once, one tile stream);
 * "14" = 13 + 10; "15" = 13 + 10 + 11; "16" = 11 with the writer-side proxy fence (each thread waits its own
 * part of tile t + 1 at step t, fences, arrives: the verified protocol, one step less prefetch slack);
 * "17" = 16 + 10; "18" = 16 + 10 + 13. Any other value fails with kernels_fail naming the accepted
 * values, before any launch. */
extern "C" int ba_wg_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                             const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse,
                             cudaStream_t stream) {
    wf_opt op;
    if (wf_parse(&op)) return -1;
    if (c->d_h == 128) return wf_select<128, false>(op, c, q, k, v, anchors, doc_ids, out, lse, NULL, stream);
    if (c->d_h == 64) return wf_select<64, false>(op, c, q, k, v, anchors, doc_ids, out, lse, NULL, stream);
    return kernels_fail("ba_wg_forward: d_h=%d, expected 64 or 128", c->d_h);
}

/* Bench-only (kernels/bench/ba_fwd_trace.cuh): ba_wg_forward with the per-CTA phase trace, d_h 128 only. */
extern "C" int ba_wg_forward_traced(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                    const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse,
                                    unsigned long long *trace, int *n_cta, cudaStream_t stream) {
    *n_cta = wf_n_cta(c);
    if (!trace) return 0;
    wf_opt op;
    if (wf_parse(&op)) return -1;
    if (c->d_h == 128) return wf_select<128, true>(op, c, q, k, v, anchors, doc_ids, out, lse, trace, stream);
    return kernels_fail("ba_wg_forward_traced: d_h=%d, only 128 is traced", c->d_h);
}
