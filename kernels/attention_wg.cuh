/*
 * kernels/attention_wg.cuh — the wgmma attention kernel template and its launcher (kernels/attention.cu describes
 * the kernel and why the library fixes each knob). Included by kernels/attention.cu, which instantiates the
 * library's knob values, and by kernels/bench/attention_bench.cu, which instantiates the others; it defines no
 * external symbol.
 */
#ifndef KERNELS_ATTENTION_WG_CUH
#define KERNELS_ATTENTION_WG_CUH

#include "kernels/attention.h"
#include "kernels/attention_mma.h"
#include "kernels/mma.cuh"
#include "kernels/vec.cuh"
#include "kernels/wgmma.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

/* ---------------------------------------------------------------- wgmma kernel (sm_90a: HD 64 and 128) */

/* Tiles of the wgmma kernel (the library's configuration): BR = 128 query rows per block (two
 * consumer warpgroups of 64 rows), BC = 128 keys per K/V tile; every tile is stored as HD/64
 * 128B-swizzled panels (kernels/wgmma.cuh). kernels/bench/attention_bench.cu instantiates the same
 * kernel with other knobs (one warpgroup, 64-key tiles, other issue orders, staged stores, lazy
 * rescaling or LPT alone; see attention_wg_kernel). */
constexpr int WGA_BR = 128, WGA_BC = 128, WGA_NT = 256;

template <int HD, int BR = WGA_BR, int BC = WGA_BC>
constexpr size_t wga_smem_bytes() {   /* Q + 2 K + 2 V tiles, plus slack to align the base to 1024 */
    return (size_t)(BR + 4 * BC) * HD * 2 + 1024;
}

/* R rows × HD bf16 of global rows row0.. (row stride `stride` elements; rows >= len zero-filled)
 * into R-row panels at dst, by all NT threads with 16-byte cp.async (not committed here); LEAN: a
 * rolled loop, for the producer warpgroup of attention_ws_kernel, which runs on few registers */
template <int HD, int R, int NT = WGA_NT, bool LEAN = false>
static __device__ __forceinline__ void wga_load(unsigned char *dst, const bf16 *src, size_t stride, int row0, int len,
                                                int tid) {
    constexpr int CH = HD / 8;
    static_assert(R * CH % NT == 0, "wga_load: tile not a multiple of the thread count");
#pragma unroll(LEAN ? 1 : R * CH / NT)
    for (int it = 0; it < R * CH / NT; it++) {
        const int i = it * NT + tid, r = i / CH, c = i % CH, gr = row0 + r;
        mma_cp_async16(dst + (c / 8) * (R * 128) + wg_sw128(r, c % 8), src + (size_t)min(gr, len - 1) * stride + c * 8,
                       gr < len ? 16 : 0);
    }
}

/* S[64×N] = Q·Kᵀ for the warpgroup: dq = K-major descriptor of its Q rows (panel 0), dk = of the K
 * tile (panel 0); panels BR·128 (Q) and BC·128 (K) bytes apart, k-step 32 bytes */
template <int HD, int N, int BR = WGA_BR, int BC = WGA_BC>
static __device__ __forceinline__ void wga_issue_s(float *s, uint64_t dq, uint64_t dk) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint64_t oq = (uint64_t)(((kk / 4) * BR * 128 + (kk % 4) * 32) >> 4);
        const uint64_t ok = (uint64_t)(((kk / 4) * BC * 128 + (kk % 4) * 32) >> 4);
        wg_mma_ss<N, 0, 0>(s, dq + oq, dk + ok, kk > 0);
    }
}

/* O[64×HD] += P·V over the first KS 16-key chunks: p = A fragments, dv = MN-major descriptor of the V
 * tile (panel 0, LBO = panel bytes), k-step 16 rows = 2048 bytes */
template <int HD, int KS>
static __device__ __forceinline__ void wga_issue_pv(float *o, const uint32_t (*p)[4], uint64_t dv) {
#pragma unroll
    for (int kk = 0; kk < KS; kk++) wg_mma_rs<HD, 1>(o, p[kk], dv + (uint64_t)((kk * 2048) >> 4), 1);
}

/* named barriers (id 1..15; 0 is __syncthreads) over n threads, whole warps */
static __device__ __forceinline__ void wga_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
static __device__ __forceinline__ void wga_bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

/* Online softmax on the first NC columns of one S accumulator (raw scores; column 8i + 2t + e%2 of
 * rows ra (e < 2) and rb (e >= 2), document-local key index key0 + column). MASK: keys above the
 * row become -inf. m = scaled running maxima (log2 units), l = this thread's partial row sums; c gets
 * the factors O must be rescaled by; s becomes the (unnormalised) probabilities. As the FX path of
 * attention_forward_kernel: the tile's raw max is scaled before it meets m, and a row with every key
 * masked so far subtracts 0 so ex2 gives 0, not NaN. LAZY (FA4's trick; measured in
 * kernels/bench/RESULTS.md): m moves only when a row's tile max exceeds it by more than 8, so most
 * tiles leave c = 1 exactly and the caller skips the O rescale; probabilities stay <= 2^8, which
 * bf16 P and the fp32 sums hold exactly as well. */
template <int NC, bool MASK, bool LAZY = false>
static __device__ __forceinline__ void wga_softmax(float *s, float *m, float *l, float *c, float scale_log2, int key0,
                                                   int ra, int rb, int t) {
    if (MASK) {
#pragma unroll
        for (int i = 0; i < NC / 8; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + 8 * i + 2 * t + (e & 1) > (e < 2 ? ra : rb)) s[4 * i + e] = -INFINITY;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < NC / 8; i++) {
        mx0 = fmaxf(mx0, fmaxf(s[4 * i], s[4 * i + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * i + 2], s[4 * i + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    if (LAZY) {   /* keep the running max unless the tile's exceeds it by more than 8 (log2 units) */
        mx0 *= scale_log2;
        mx1 *= scale_log2;
        mx0 = mx0 > m[0] + 8.0f ? mx0 : m[0];
        mx1 = mx1 > m[1] + 8.0f ? mx1 : m[1];
    } else {
        mx0 = fmaxf(m[0], mx0 * scale_log2);
        mx1 = fmaxf(m[1], mx1 * scale_log2);
    }
    const float ms0 = mx0 == -INFINITY ? 0.0f : mx0, ms1 = mx1 == -INFINITY ? 0.0f : mx1;
    c[0] = LAZY && mx0 == m[0] ? 1.0f : mma_ex2_ftz(m[0] - ms0);
    c[1] = LAZY && mx1 == m[1] ? 1.0f : mma_ex2_ftz(m[1] - ms1);
    m[0] = mx0;
    m[1] = mx1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int i = 0; i < NC / 8; i++) {
        s[4 * i + 0] = mma_ex2_ftz(fmaf(s[4 * i + 0], scale_log2, -ms0));
        s[4 * i + 1] = mma_ex2_ftz(fmaf(s[4 * i + 1], scale_log2, -ms0));
        s[4 * i + 2] = mma_ex2_ftz(fmaf(s[4 * i + 2], scale_log2, -ms1));
        s[4 * i + 3] = mma_ex2_ftz(fmaf(s[4 * i + 3], scale_log2, -ms1));
        sum0 += s[4 * i + 0] + s[4 * i + 1];
        sum1 += s[4 * i + 2] + s[4 * i + 3];
    }
    l[0] = l[0] * c[0] + sum0;
    l[1] = l[1] * c[1] + sum1;
}

/* The epilogue of the wgmma kernels: normalise the warpgroup's O rows (this thread: ra, rb), write
 * them (rows >= len skipped) and the log-sum-exp. OST: each warp stages its 16 rows in its own
 * warpgroup's Q rows (every S wgmma that read them has completed; no other warp touches them) —
 * row r, columns 8i + 2t, 2t+1 at panel i/8, chunk i%8, byte 4t, 32 distinct banks per store — and
 * writes them back in coalesced 16-byte stores (two rows of 256 bytes per warp instruction). */
template <int HD, int BR, bool OST>
static __device__ __forceinline__ void wga_store(bf16 *out, float *lse, const float *o, const float *m, const float *l,
                                                 unsigned char *sQ, int s0, int len, int h, int T, int NH, int wg,
                                                 int warp, int lane, int ra, int rb, int wrow0) {
    const int t = lane % 4;
    float inv[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float lv = l[hf];
        lv += __shfl_xor_sync(0xffffffffu, lv, 1);
        lv += __shfl_xor_sync(0xffffffffu, lv, 2);
        inv[hf] = lv > 0.0f ? 1.0f / lv : 0.0f;
        const int row = hf ? rb : ra;
        if (row < len && lse && t == 0) lse[(size_t)h * T + s0 + row] = (m[hf] + log2f(lv)) * 0.69314718055994531f;
    }
    if constexpr (OST) {
        const int lr0 = wg * 64 + warp * 16;   /* the warp's first row in the Q tile */
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int r = lr0 + lane / 4 + 8 * hf;
#pragma unroll
            for (int i = 0; i < HD / 8; i++) {
                __nv_bfloat162 x = __floats2bfloat162_rn(o[4 * i + 2 * hf] * inv[hf], o[4 * i + 2 * hf + 1] * inv[hf]);
                *(__nv_bfloat162 *)(sQ + (i / 8) * (BR * 128) + wg_sw128(r, i % 8) + 4 * t) = x;
            }
        }
        __syncwarp();
        constexpr int CH = HD / 8;   /* 16-byte chunks per row */
#pragma unroll
        for (int it = 0; it < 16 * CH / 32; it++) {
            const int idx = it * 32 + lane, rr = idx / CH, cc = idx % CH, row = wrow0 + warp * 16 + rr;
            const uint4 x = *(const uint4 *)(sQ + (cc / 8) * (BR * 128) + wg_sw128(lr0 + rr, cc % 8));
            if (row < len) *(uint4 *)(out + ((size_t)(s0 + row) * NH + h) * HD + cc * 8) = x;
        }
    } else {
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int row = hf ? rb : ra;
            if (row < len) {
                __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + ((size_t)(s0 + row) * NH + h) * HD + 2 * t);
#pragma unroll
                for (int i = 0; i < HD / 8; i++)
                    dst[i * 4] = __floats2bfloat162_rn(o[4 * i + 2 * hf] * inv[hf], o[4 * i + 2 * hf + 1] * inv[hf]);
            }
        }
    }
}

/* One block = one head × one BR-row query tile of one document (BR = 64·NWG); warpgroup wg owns
 * rows 64·wg..+63. Key tiles n = 0, 1, … are the document's tiles jlast, jlast-1, … 0 (diagonal
 * first). K_n sits in K buffer n%2, V_n in V buffer n%2. Iteration n (n >= 1), one barrier each:
 *     cp.async wait (K_n, V_{n-1} landed) → fence.proxy.async → __syncthreads →
 *     issue S_n = Q·K_nᵀ, issue O += P_{n-1}·V_{n-1} → cp.async K_{n+1}, V_n (their buffers held
 *     K_{n-1} and V_{n-2}, whose wgmmas every warpgroup waited for before the barrier) →
 *     wait S_n → softmax(S_n) while the P·V runs → wait P·V → O *= rescale → P_n = bf16(S_n).
 * SKIP: a key tile whose second half lies above every row of the warpgroup (the diagonal tile of
 * warpgroup 0) runs P·V on its first BC/2 keys only; a warpgroup whose rows all lie past the
 * document (the last tile of a document) issues no MMAs but still loads and meets the barriers.
 * Knobs (the library runs NWG 2, BC 128, MINB 1, PP 1, OST, LAZY and LPT on; the other combinations
 * are instantiated only by kernels/bench/attention_bench.cu, which measured them):
 *   NWG 1: one warpgroup, BR 64 (with BC 64 and MINB 2: two blocks per SM, so one block's start-up
 *     — Q and first K load, the unoverlapped first S and softmax — hides under the other's MMAs);
 *   PP (NWG 2, ping-pong issue order through named barriers 1-3, 256 threads each, every warpgroup
 *     meets each barrier once per issue point, active or not): 1 = warpgroup 1 issues its S and P·V
 *     after warpgroup 0 issued both (S0 PV0 S1 PV1); 2 = S0 S1 PV0 PV1;
 *   LAZY: wga_softmax's lazy rescaling;
 *   LPT: grid z counts query tiles down from the longest document's last one (absolute tile index),
 *     so the tiles with the most keys in the whole batch start first and short documents' light
 *     tiles fill the tail (without it, tiles count from each document's own end);
 *   OST: the output goes through shared memory (each warp stages its 16 rows in its warpgroup's own
 *     Q rows, which no MMA reads any more) and leaves in coalesced 16-byte stores. */
template <int HD, bool SKIP, int NWG = 2, int BC = WGA_BC, int MINB = 1, int PP = 0, bool OST = false,
          bool LAZY = false, bool LPT = false>
__global__ void __launch_bounds__(128 * NWG, MINB)
attention_wg_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int T,
                    int NH, int NKV, float scale_log2) {
    constexpr int BR = 64 * NWG, NT = 128 * NWG, QB = BR * HD * 2, KB = BC * HD * 2, PS = BC / 16;
    static_assert(PP == 0 || NWG == 2, "ping-pong needs two warpgroups");
    extern __shared__ unsigned char wga_smem_raw[];
    unsigned char *smem = wga_smem_raw + ((1024u - (wg_smem_u32(wga_smem_raw) & 1023u)) & 1023u);
    unsigned char *sQ = smem, *sK = smem + QB, *sV = smem + QB + 2 * KB;

    const int h = blockIdx.x, d = blockIdx.y;
    const int s0 = cu[d], len = cu[d + 1] - s0;
    const int nqt = (len + BR - 1) / BR;
    const int qt = LPT ? (int)gridDim.z - 1 - (int)blockIdx.z : nqt - 1 - (int)blockIdx.z;
    if (qt < 0 || qt >= nqt) return;
    const int kh = h / (NH / NKV);
    const int tid = threadIdx.x, warp = (tid / 32) % 4, lane = tid % 32, t = lane % 4;
    /* the warpgroup index through a shuffle, so ptxas knows it is warp-uniform: the branches on it
     * below would otherwise count as divergent and serialize the wgmmas (C7520) */
    const int wg = NWG == 1 ? 0 : __shfl_sync(0xffffffffu, tid / 128, 0);
    const size_t qstride = (size_t)NH * HD, kstride = (size_t)NKV * HD;
    const bf16 *qg = q + ((size_t)s0 * NH + h) * HD;
    const bf16 *kg = k + ((size_t)s0 * NKV + kh) * HD, *vg = v + ((size_t)s0 * NKV + kh) * HD;

    const int jlast = min(qt * BR + BR - 1, len - 1) / BC;   /* the tile of the block's last row */
    const int ntiles = jlast + 1;
    const int wrow0 = qt * BR + wg * 64;                     /* the warpgroup's first row */
    const int wlast = min(wrow0 + 63, len - 1);              /* and last real row (< wrow0: none) */
    const bool active = wrow0 < len;
    const int ra = wrow0 + warp * 16 + lane / 4, rb = ra + 8;   /* this thread's rows */

    wga_load<HD, BR, NT>(sQ, qg, qstride, qt * BR, len, tid);
    wga_load<HD, BC, NT>(sK, kg, kstride, jlast * BC, len, tid);
    mma_commit();
    mma_wait<0>();
    wg_fence_async_smem();
    __syncthreads();
    wga_load<HD, BC, NT>(sV, vg, kstride, jlast * BC, len, tid);
    if (ntiles > 1) wga_load<HD, BC, NT>(sK + KB, kg, kstride, (jlast - 1) * BC, len, tid);
    mma_commit();

    const uint64_t dq = wg_desc_kmajor(wg_smem_u32(sQ) + wg * 64 * 128);
    const uint32_t uK = wg_smem_u32(sK), uV = wg_smem_u32(sV);
    float o[HD / 2], s[BC / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, c[2];
    uint32_t p[PS][4];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.0f;
    bool half_prev = false;

    /* S and softmax of tile n (key tile j): the body shared by the prologue and the loop */
    /* S always runs on all BC keys: a second S shape (N = BC/2 on half tiles) makes ptxas serialize
     * every wgmma of the kernel (C7511); half tiles save their softmax and P·V halves only */
    auto s_issue = [&](int buf) {
        wga_issue_s<HD, BC, BR, BC>(s, dq, wg_desc_kmajor(uK + buf * KB));
        wg_commit();
    };
    /* (a softmax on the first BC/2 columns only for half tiles also makes ptxas serialize the wgmmas) */
    auto softmax = [&](int j) {
        if (j * BC + BC - 1 > wrow0) wga_softmax<BC, true, LAZY>(s, m, l, c, scale_log2, j * BC, ra, rb, t);
        else wga_softmax<BC, false, LAZY>(s, m, l, c, scale_log2, j * BC, ra, rb, t);
    };
    auto pack_p = [&]() {
        mma_pack_frags<PS>(s, &p[0][0]);
    };
    auto pv_issue = [&](int buf, bool half) {
        const uint64_t dv = wg_desc_mnmajor(uV + buf * KB, BC * 128);
        wga_issue_pv<HD, PS / 2>(o, p, dv);
        if (!half) wga_issue_pv<HD, PS / 2>(o, p + PS / 2, dv + (uint64_t)((PS / 2 * 2048) >> 4));
        wg_commit();
    };
    /* ping-pong: warpgroup 1 waits for warpgroup 0's issue (PP 1: both its S and P·V; PP 2: its S,
     * then warpgroup 0 waits for warpgroup 1's S before its P·V, and warpgroup 1 for that P·V) */
    auto pp_before_s = [&]() { if (PP && wg == 1) wga_bar_sync(1, 256); };
    auto pp_after_s = [&]() {
        if (PP == 2) {
            if (wg == 0) { wga_bar_arrive(1, 256); wga_bar_sync(2, 256); }
            else wga_bar_arrive(2, 256);
        }
    };
    auto pp_after_pv = [&]() {
        if (PP == 1 && wg == 0) wga_bar_arrive(1, 256);
        if (PP == 2) {
            if (wg == 0) wga_bar_arrive(3, 256);
            else wga_bar_sync(3, 256);
        }
    };
    /* an inactive warpgroup (always warpgroup 1) meets the same barriers without issuing */
    auto pp_idle = [&]() {
        if (PP == 1) wga_bar_sync(1, 256);
        if (PP == 2) { wga_bar_sync(1, 256); wga_bar_arrive(2, 256); wga_bar_sync(3, 256); }
    };

    if (active) {   /* tile 0 (the diagonal one): S, softmax (O is still 0: no rescale), P */
        const bool half = SKIP && jlast * BC + BC / 2 > wlast;
        wg_fence();
        pp_before_s();
        s_issue(0);
        pp_after_s();
        pp_after_pv();
        wg_wait<0>();
        wg_acc_fence<BC / 2>(s);
        softmax(jlast);
        pack_p();
        half_prev = half;
    } else {
        pp_idle();
    }
    for (int n = 1; n < ntiles; n++) {
        const int j = jlast - n;
        mma_wait<0>();
        wg_fence_async_smem();
        __syncthreads();
        /* the next loads go out while the tensor cores work: V_n and K_{n+1} fill the buffers of
         * V_{n-2} and K_{n-1}, which no MMA in flight reads (written out in both branches: code
         * between two `if (active)` blocks made ptxas serialize the wgmmas, C7514) */
        auto loads = [&]() {
            wga_load<HD, BC, NT>(sV + (n % 2) * KB, vg, kstride, j * BC, len, tid);
            if (n + 1 < ntiles) wga_load<HD, BC, NT>(sK + ((n + 1) % 2) * KB, kg, kstride, (j - 1) * BC, len, tid);
            mma_commit();
        };
        if (!active) {
            pp_idle();
            loads();
        } else {
            const bool half = SKIP && j * BC + BC / 2 > wlast;
            wg_acc_fence<HD / 2>(o);   /* pin the rescaled O and the packed P before the fence */
            wg_reg_fence<PS * 4>(&p[0][0]);
            wg_fence();
            pp_before_s();
            s_issue(n % 2);
            pp_after_s();
            pv_issue((n - 1) % 2, half_prev);
            pp_after_pv();
            loads();
            wg_wait<1>();
            wg_acc_fence<BC / 2>(s);
            softmax(j);
            wg_wait<0>();
            wg_acc_fence<HD / 2>(o);
            wg_reg_fence<PS * 4>(&p[0][0]);
            if (!LAZY || __any_sync(0xffffffffu, c[0] != 1.0f || c[1] != 1.0f)) {
#pragma unroll
                for (int i = 0; i < HD / 8; i++) {
                    o[4 * i + 0] *= c[0]; o[4 * i + 1] *= c[0];
                    o[4 * i + 2] *= c[1]; o[4 * i + 3] *= c[1];
                }
            }
            pack_p();
            half_prev = half;
        }
    }
    mma_wait<0>();
    wg_fence_async_smem();
    __syncthreads();
    if (!active) return;
    wg_acc_fence<HD / 2>(o);
    wg_reg_fence<PS * 4>(&p[0][0]);
    wg_fence();
    pv_issue((ntiles - 1) % 2, half_prev);
    wg_wait<0>();
    wg_acc_fence<HD / 2>(o);

    wga_store<HD, BR, OST>(out, lse, o, m, l, sQ, s0, len, h, T, NH, wg, warp, lane, ra, rb, wrow0);
}

/* ---------------------------------------------------------------- launcher */

/* the wgmma kernel with the given knobs (attention_forward's are below; kernels/bench/attention_bench.cu
 * launches the others) */
template <int HD, bool SKIP = true, int NWG = 2, int BC = WGA_BC, int MINB = 1, int PP = 0, bool OST = false,
          bool LAZY = false, bool LPT = false>
static int launch_wg(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND,
                     int max_seqlen, int T, int NH, int NKV, float scale, cudaStream_t stream) {
    constexpr int BR = 64 * NWG;
    constexpr size_t smem = wga_smem_bytes<HD, BR, BC>();
    static int configured;   /* benign race: every caller sets the same attribute */
    if (!configured) {
        cudaError_t e = cudaFuncSetAttribute(attention_wg_kernel<HD, SKIP, NWG, BC, MINB, PP, OST, LAZY, LPT>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return kernels_fail("attention_forward: cudaFuncSetAttribute: %s", cudaGetErrorString(e));
        configured = 1;
    }
    dim3 grid(NH, ND, (max_seqlen + BR - 1) / BR);
    attention_wg_kernel<HD, SKIP, NWG, BC, MINB, PP, OST, LAZY, LPT><<<grid, 128 * NWG, smem, stream>>>(
        out, lse, q, k, v, cu, T, NH, NKV, scale * 1.4426950408889634f);
    KERNELS_CHECK_LAUNCH("attention_forward");
    return 0;
}

#endif /* KERNELS_ATTENTION_WG_CUH */
