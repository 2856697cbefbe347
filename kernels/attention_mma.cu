/*
 * kernels/attention_mma.cu — causal varlen GQA attention forward with mma.sync m16n8k16 (bf16 in, fp32
 * accumulate; sm_80+), for the head dims the wgmma kernel of kernels/attention.cu does not take:
 * HD 16 and 32 (small demo models) and 256 (Qwen3.5/3.6 gated full-attention layers).
 * attention_forward picks it by shape alone (kernels/attention.h); nothing is timed.
 *
 * The kernel is the library's former default (bench variants 1-7, kernels/bench/attention_variants.cuh,
 * validated on the H200 at HD 64 and 128), with its fast exponent, kept as a library kernel for these head
 * dims. One block = one head × one tile of BR = 16·NW query rows of one document (NW warps of 16 rows). It
 * walks the document's key/value tiles (BC keys) from the diagonal tile down to tile 0, double-buffered in
 * shared memory with cp.async (rows past the document zero-filled). Per tile each warp computes S = Q·Kᵀ
 * (Q fragments from registers for HD <= 128, from shared memory per k-chunk at HD 256, where registers go to
 * the 128 fp32 of O), masks keys above the diagonal on tiles that cross it, runs the fp32 online softmax
 * (scores unscaled through the mask and the max; the running max compares scaled maxima so large logits
 * cannot overflow exp2), packs P to bf16 A fragments in registers and accumulates O += P·V with
 * ldmatrix.trans V fragments. Shared rows are padded by 8 elements (16-byte rows, conflict-free ldmatrix).
 * Invariants: HD % 16 == 0; a row with every key masked so far subtracts 0, so exp2 gives 0, not NaN.
 */
#include "kernels/attention_mma.h"
#include "kernels/mma.cuh"

#include <math.h>

namespace {

/* ---------------------------------------------------------------- kernel */

template <int HD, int NW, int BC, bool QREG>
__global__ void __launch_bounds__(NW * 32)
attention_mma_forward_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu,
                             int T, int NH, int NKV, float scale_log2) {
    constexpr int BR = 16 * NW, LD = HD + 8, CH = HD / 8, NT = NW * 32;
    static_assert(HD % 16 == 0 && BC % 16 == 0, "attention_mma: HD and BC must be multiples of 16");
    extern __shared__ __align__(16) unsigned char attm_smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)attm_smem;   /* [BR][LD] */
    __nv_bfloat16 *sK = sQ + BR * LD;                  /* [2][BC][LD] */
    __nv_bfloat16 *sV = sK + 2 * BC * LD;              /* [2][BC][LD] */
    const __nv_bfloat16 *qb = (const __nv_bfloat16 *)q, *kb = (const __nv_bfloat16 *)k, *vb = (const __nv_bfloat16 *)v;

    const int h = blockIdx.x, d = blockIdx.y;
    const int s0 = cu[d], len = cu[d + 1] - s0;
    const int qt = (len + BR - 1) / BR - 1 - (int)blockIdx.z;
    if (qt < 0) return;
    const int kh = h / (NH / NKV);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

    for (int i = tid; i < BR * CH; i += NT) {
        const int r = i / CH, c = i % CH, qi = qt * BR + r;
        mma_cp_async16(sQ + r * LD + c * 8, qb + ((size_t)(s0 + min(qi, len - 1)) * NH + h) * HD + c * 8,
                       qi < len ? 16 : 0);
    }
    auto load_kv = [&](int j, int buf) {
        for (int i = tid; i < BC * CH; i += NT) {
            const int r = i / CH, c = i % CH, kj = j * BC + r;
            const size_t off = ((size_t)(s0 + min(kj, len - 1)) * NKV + kh) * HD + c * 8;
            const int sz = kj < len ? 16 : 0;
            mma_cp_async16(sK + (buf * BC + r) * LD + c * 8, kb + off, sz);
            mma_cp_async16(sV + (buf * BC + r) * LD + c * 8, vb + off, sz);
        }
    };
    const int last_row = min(qt * BR + BR - 1, len - 1);
    const int jlast = last_row / BC;   /* the key tile of the block's last row */
    load_kv(jlast, 0);
    mma_commit();
    mma_wait<0>();
    __syncthreads();

    const __nv_bfloat16 *qbase = sQ + (warp * 16 + (lane % 16)) * LD + (lane / 16) * 8;
    uint32_t qf[QREG ? HD / 16 : 1][4];
    if constexpr (QREG) {
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) mma_ldsm_x4(qf[kc], qbase + kc * 16);
    }

    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int row0 = qt * BR + warp * 16 + lane / 4;   /* this thread's rows: row0 and row0 + 8 */
    const int qmin = qt * BR;

    int buf = 0;
    for (int j = jlast; j >= 0; j--) {
        if (j > 0) load_kv(j - 1, buf ^ 1);
        mma_commit();
        mma_wait<1>();
        __syncthreads();

        const __nv_bfloat16 *Kb = sK + buf * BC * LD, *Vb = sV + buf * BC * LD;
        float s[BC / 8][4];
#pragma unroll
        for (int i = 0; i < BC / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
            uint32_t a[4];
            if constexpr (QREG) {
                a[0] = qf[kc][0]; a[1] = qf[kc][1]; a[2] = qf[kc][2]; a[3] = qf[kc][3];
            } else {
                mma_ldsm_x4(a, qbase + kc * 16);
            }
#pragma unroll
            for (int np = 0; np < BC / 16; np++) {
                uint32_t b[4];
                mma_ldsm_x4(b, Kb + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kc * 16 + ((lane / 8) % 2) * 8);
                mma_m16n8k16(s[2 * np], a, b[0], b[1]);
                mma_m16n8k16(s[2 * np + 1], a, b[2], b[3]);
            }
        }
        if (j * BC + BC - 1 > qmin) {   /* the tile crosses the diagonal of some row of the block */
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = j * BC + nt * 8 + (lane % 4) * 2 + (e & 1), row = row0 + (e >= 2 ? 8 : 0);
                    if (key > row) s[nt][e] = -INFINITY;
                }
        }
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        mx0 = fmaxf(m0, mx0 * scale_log2);   /* scaled maxima only (see the file comment) */
        mx1 = fmaxf(m1, mx1 * scale_log2);
        const float ms0 = mx0 == -INFINITY ? 0.0f : mx0, ms1 = mx1 == -INFINITY ? 0.0f : mx1;
        const float c0 = mma_ex2_ftz(m0 - ms0), c1 = mma_ex2_ftz(m1 - ms1);
        m0 = mx0;
        m1 = mx1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {   /* one FFMA + MUFU per probability; -inf stays -inf -> 0 */
            s[nt][0] = mma_ex2_ftz(fmaf(s[nt][0], scale_log2, -ms0));
            s[nt][1] = mma_ex2_ftz(fmaf(s[nt][1], scale_log2, -ms0));
            s[nt][2] = mma_ex2_ftz(fmaf(s[nt][2], scale_log2, -ms1));
            s[nt][3] = mma_ex2_ftz(fmaf(s[nt][3], scale_log2, -ms1));
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
        for (int kc = 0; kc < BC / 16; kc++) {
            uint32_t a[4];
            a[0] = mma_pack_bf16x2(s[2 * kc][0], s[2 * kc][1]);
            a[1] = mma_pack_bf16x2(s[2 * kc][2], s[2 * kc][3]);
            a[2] = mma_pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            a[3] = mma_pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                mma_ldsm_x4_t(b, Vb + (kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 + (lane / 16) * 8);
                mma_m16n8k16(o[2 * dp], a, b[0], b[1]);
                mma_m16n8k16(o[2 * dp + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();   /* every warp is done with buf before the next iteration refills it */
        buf ^= 1;
    }

    const int col = (lane % 4) * 2;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        float lv = half ? l1 : l0;
        lv += __shfl_xor_sync(0xffffffffu, lv, 1);
        lv += __shfl_xor_sync(0xffffffffu, lv, 2);
        const float inv = lv > 0.0f ? 1.0f / lv : 0.0f;
        const int row = row0 + half * 8;
        if (row < len) {
            __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + ((size_t)(s0 + row) * NH + h) * HD + col);
#pragma unroll
            for (int nt = 0; nt < HD / 8; nt++)
                dst[nt * 4] = __floats2bfloat162_rn(o[nt][2 * half] * inv, o[nt][2 * half + 1] * inv);
            if (lse && lane % 4 == 0)
                lse[(size_t)h * T + s0 + row] = ((half ? m1 : m0) + log2f(lv)) * 0.69314718055994531f;
        }
    }
}

/* ---------------------------------------------------------------- launcher */

template <int HD, int NW, int BC, bool QREG>
int launch(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND,
           int max_seqlen, int T, int NH, int NKV, float scale, cudaStream_t stream) {
    constexpr int BR = 16 * NW, LD = HD + 8;
    constexpr size_t smem = (size_t)(BR + 4 * BC) * LD * sizeof(bf16);
    static int configured;   /* benign race: every caller sets the same attribute */
    if (!configured) {
        cudaError_t e = cudaFuncSetAttribute(attention_mma_forward_kernel<HD, NW, BC, QREG>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return kernels_fail("attention_forward (mma, HD %d): cudaFuncSetAttribute: %s", HD,
                                                  cudaGetErrorString(e));
        configured = 1;
    }
    dim3 grid(NH, ND, (max_seqlen + BR - 1) / BR);
    attention_mma_forward_kernel<HD, NW, BC, QREG><<<grid, NW * 32, smem, stream>>>(out, lse, q, k, v, cu, T, NH, NKV,
                                                                                  scale * 1.4426950408889634f);
    KERNELS_CHECK_LAUNCH("attention_forward (mma)");
    return 0;
}

}  // namespace

/* Tiles: 4 warps × 16 query rows; 64-key tiles (HD <= 32: 15-30 KB of shared memory), 32-key tiles at HD 256
 * (101 KB: two blocks per SM; O's 128 fp32 per thread leave no registers for Q fragments or 64-key scores). */
extern "C" int attention_mma_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                     const int32_t *cu_seqlens, int ND, int max_seqlen, int T, int NH, int NKV, int HD,
                                     float scale, cudaStream_t stream) {
    switch (HD) {
    case 16: return launch<16, 4, 64, true>(out, lse, q, k, v, cu_seqlens, ND, max_seqlen, T, NH, NKV, scale, stream);
    case 32: return launch<32, 4, 64, true>(out, lse, q, k, v, cu_seqlens, ND, max_seqlen, T, NH, NKV, scale, stream);
    case 256: return launch<256, 4, 32, false>(out, lse, q, k, v, cu_seqlens, ND, max_seqlen, T, NH, NKV, scale, stream);
    default: return kernels_fail("attention_mma_forward: HD=%d has no mma.sync kernel (16, 32, 256)", HD);
    }
}
