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

template <int HD, int NWG, bool FAST>
__global__ void __launch_bounds__(NWG * 128, 1)
ba_wg_forward_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v, const int32_t *anchors,
                     const int32_t *doc_ids, __nv_bfloat16 *out, float *lse, int T, int N, int B, int n_h, int n_kv,
                     int window, int causal, float sl2) {
    using C = wf_cfg<HD, NWG>;
    constexpr int CH = HD / 8, THREADS = C::THREADS, TILE = C::TILE, NST = C::NST, QTILE = C::QTILE;
    constexpr int KPANEL = C::KPANEL, KT = C::KT;
    extern __shared__ unsigned char wf_raw[];
    __shared__ int sDoc[NST][KT];   /* doc id of each key of a context tile's stage */
    __shared__ int sPart[NWG * 4][NWG][3]; /* per warp and block: first, last key of the document, count */
    __shared__ int sLo[NWG], sHi[NWG];    /* narrowed context range of each block: [lo, hi) */
    __shared__ int sSeg[NWG][3];          /* merged segments: first key, end key, first tile */
    __shared__ int sNSeg, sNCtx, sCont;

    const uint32_t sbase = (wg_smem_u32(wf_raw) + 1023u) & ~1023u;
    const uint32_t sQ = sbase;                    /* NWG tiles, one per warpgroup */
    const uint32_t sKV = sbase + NWG * QTILE;     /* stage st: K at sKV + 2·st·TILE, V right after */
    const int tid = threadIdx.x, wg = tid >> 7, wtid = tid & 127, warp = wtid >> 5, lane = tid & 31;
    const int b0 = blockIdx.x * NWG, nb = min(NWG, N - b0), g = blockIdx.y, G = n_h / n_kv, used = G * B;
    const bool live = wg < nb;

    /* this warpgroup's query tile */
    for (int i = wtid; i < WF_KT * CH; i += 128) {
        const int r = i / CH, c = i % CH;
        const bool ok = live && r < used;
        const size_t row = ok ? ((size_t)((b0 + wg) * B + r % B) * n_h + g * G + r / B) : 0;
        wf_cp16(sQ + wg * QTILE + (c / 8) * WF_PANEL + wg_sw128(r, c % 8), q + row * HD + c * 8, ok);
    }
    mma_commit();

    const int d = wf_setup<NWG>(anchors, doc_ids, b0, nb, window, sPart, sLo, sHi, sSeg, sNSeg, sNCtx, sCont);
    const int my_lo = sLo[wg], my_hi = sHi[wg];   /* [lo, hi), empty when hi <= lo */
    const int n_seg = sNSeg, n_ctx = sNCtx;
    /* FAST: a context key is visible iff it lies in [my_lo, my_hi) (every block's document contiguous) */
    const bool by_range = FAST && sCont != 0;
    const int BP = B <= 16 ? 16 : B <= 32 ? 32 : 64, per = KT / BP;   /* block keys: rows per block, blocks per tile */
    const int n_tiles = n_ctx + (nb + per - 1) / per;

    /* first key of context tile t (< n_ctx) and its segment's end */
    auto ctx_tile = [&](int t, int *kb, int *ke) {
        int s = 0;
        while (s + 1 < n_seg && t >= sSeg[s + 1][2]) s++;
        *kb = sSeg[s][0] + (t - sSeg[s][2]) * KT;
        *ke = sSeg[s][1];
    };
    auto load = [&](int t, int st) {
        const uint32_t dK = sKV + 2 * st * TILE, dV = dK + TILE;
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
    const uint32_t myQ = sQ + wg * QTILE;

    {   /* the tile walk: context tiles, then the blocks' own keys */
#pragma unroll
        for (int s = 0; s < NST - 2; s++) {
            if (s < n_tiles) load(s, s);
            mma_commit();
        }
        for (int t = 0; t < n_tiles; t++) {
            mma_wait<NST - 3>();   /* Q and tile t have landed */
            wg_fence_async_smem();
            __syncthreads();          /* ... for everyone; and stage (t - 2) % NST is no longer read */
            if (t + NST - 2 < n_tiles) load(t + NST - 2, (t + NST - 2) % NST);
            mma_commit();
            const int st = t % NST;
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
        }
    }
    wg_wait<0>();
    wg_acc_fence<HD / 2>(o);
    mma_wait<0>();   /* no cp.async in flight at exit */

    if (!live) return;
    const int R = N * B, t4 = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? r1 : r0;
        float lv = l[half];
        lv += __shfl_xor_sync(0xffffffffu, lv, 1);
        lv += __shfl_xor_sync(0xffffffffu, lv, 2);
        if (r < used) {   /* every live row sees its own block's first key, so lv > 0 */
            const int h = g * G + r / B;
            const size_t row = (size_t)(b0 + wg) * B + r % B;
            __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + (row * n_h + h) * HD) + t4;
            const float inv = 1.f / lv;
#pragma unroll
            for (int i = 0; i < HD / 8; i++)
                dst[4 * i] = __floats2bfloat162_rn(o[4 * i + 2 * half] * inv, o[4 * i + 2 * half + 1] * inv);
            if (t4 == 0) lse[(size_t)h * R + row] = (m[half] + log2f(lv)) / WF_LOG2E;
        }
    }
}

template <int HD, int NWG, bool FAST>
int wf_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
              const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream) {
    using C = wf_cfg<HD, NWG>;
    cudaError_t e = cudaFuncSetAttribute(ba_wg_forward_kernel<HD, NWG, FAST>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::smem);
    if (e != cudaSuccess) return kernels_fail("ba_wg_forward: cudaFuncSetAttribute: %s", cudaGetErrorString(e));
    ba_wg_forward_kernel<HD, NWG, FAST><<<dim3((c->N + NWG - 1) / NWG, c->n_kv), C::THREADS, C::smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (__nv_bfloat16 *)out, lse, c->T, c->N, c->B, c->n_h, c->n_kv, c->window, c->causal, c->scale * WF_LOG2E);
    KERNELS_CHECK_LAUNCH("ba_wg_forward_kernel");
    return 0;
}

template <int HD>
int wf_select(bool fast, const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
              const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream) {
    if (fast) return wf_launch<HD, 3, true>(c, q, k, v, anchors, doc_ids, out, lse, stream);
    return wf_launch<HD, 3, false>(c, q, k, v, anchors, doc_ids, out, lse, stream);
}

}  // namespace

/* DFLASH_BLOCK_ATTN_WG_FWD (read per call): unset or empty = "3x", the default (3 blocks per CTA, context
 * masks from the key range where every block's document is contiguous, FAST); "3" = the previous default
 * (doc-id ballots on every context tile), kept as the one revert switch. Any other value fails with
 * kernels_fail naming the accepted values, before any launch. */
extern "C" int ba_wg_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                             const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse,
                             cudaStream_t stream) {
    const char *e = getenv("DFLASH_BLOCK_ATTN_WG_FWD");
    bool fast = true;   /* "3x", H200 2026-11-29: 231.7 TFLOP/s ("3" 228.9), tested */
    if (e && e[0]) {
        if (strcmp(e, "3"))
            return kernels_fail("ba_wg_forward: DFLASH_BLOCK_ATTN_WG_FWD=%s, expected 3 (the previous default) "
                                "or unset (the default, 3x)", e);
        fast = false;
    }
    if (c->d_h == 128) return wf_select<128>(fast, c, q, k, v, anchors, doc_ids, out, lse, stream);
    if (c->d_h == 64) return wf_select<64>(fast, c, q, k, v, anchors, doc_ids, out, lse, stream);
    return kernels_fail("ba_wg_forward: d_h=%d, expected 64 or 128", c->d_h);
}
