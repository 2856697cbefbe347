/*
 * kernels/bench/block_attn_bench.cu — anchored block attention forward and backward at the standard
 * configuration (design.md §10): T = 8192, 512 anchors x 16, window 2048 (causal in-block, the
 * sliding layers), documents of 600..1800 tokens (~1200) with a padded tail, 32 q heads / 8 kv heads,
 * d_h 128.
 *
 *   build: make bench (-> $(BUILD)/bench/block_attn_bench); run on the GPU machine.
 *   variant 1: kernels/block_attn.cu (WMMA 16x16x16, one CTA per (block, kv head), fp32 S/O in smem,
 *              dK/dV by fp32 atomics) — the current kernel, forward and backward.
 *   variant 2: forward only, mma.sync m16n8k16 with scores and O in registers, cp.async double
 *              buffering (below; the candidate to replace variant 1's forward).
 *
 * Napkin math: FLOPs count visible (query, key) pairs only, per query head: forward 4·d_h per pair
 * (Q·Kᵀ and P·V), backward 10·d_h per pair (recompute Q·Kᵀ, dO·Vᵀ, dV, dQ, dK: 2.5x forward, the
 * flash-attention convention). Validation: the same kernel against block_attn_forward_ref /
 * backward_ref on the first 32 anchors of the same sequence (the full CPU reference takes minutes).
 */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/anchors.h"
#include "kernels/block_attn.h"
#include "kernels/common.h"

#include <cuda_bf16.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKK(x) do { if ((x) != 0) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, kernels_error()); exit(1); } } while (0)


/* ---------------------------------------------------------------- variant 2: mma.sync, scores in registers
 * The structure of kernels/attention.cu (K1's causal varlen forward) applied to anchored blocks: one CTA
 * per (block, kv head), 4 warps x 16 of the G·B = 64 query rows; Q fragments in registers; key tiles of
 * 64 double-buffered with cp.async (rows outside the visible range zero-filled); S = Q·Kᵀ and O += P·V
 * with mma.sync m16n8k16, online softmax in base 2 in registers. The context range is narrowed first
 * to [first, last] key of the anchor's document inside [a-W, a) (a block-wide min/max), then walked in
 * 64-key tiles with a per-key document test; the block's own keys come last as one tile. */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
static __device__ __forceinline__ void ldsm_x4(uint32_t *r, const void *smem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t *r, const void *smem) {
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
static __device__ __forceinline__ void mma_bf16(float *d, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
static __device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int HD>
__global__ void __launch_bounds__(128)
block_attn_forward_kernel2(const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors, const int32_t *doc_ids,
                           bf16 *out, float *lse, int T, int N, int B, int NH, int NKV, int window, int causal,
                           float scale_log2) {
    constexpr int BR = 64, BC = 64, LD = HD + 8, CH = HD / 8, NT = 128;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *sQ = (bf16 *)att_smem;    /* [BR][LD] */
    bf16 *sK = sQ + BR * LD;        /* [2][BC][LD] */
    bf16 *sV = sK + 2 * BC * LD;    /* [2][BC][LD] */
    __shared__ int sDoc[2][BC];
    __shared__ int sLo, sHi;

    const int b = blockIdx.x, g = blockIdx.y, G = NH / NKV, used = G * B, R = N * B;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int a = anchors[b], d = doc_ids[a];
    const int lo = window > 0 ? max(0, a - window) : 0, hi = d == -1 ? lo : a;
    if (tid == 0) { sLo = hi; sHi = lo - 1; }
    __syncthreads();
    {   /* first and last key of the anchor's document in [lo, hi) */
        int mn = hi, mx = lo - 1;
        for (int p = lo + tid; p < hi; p += NT)
            if (doc_ids[p] == d) { mn = min(mn, p); mx = max(mx, p); }
        atomicMin(&sLo, mn);
        atomicMax(&sHi, mx);
    }
    for (int i = tid; i < BR * CH; i += NT) {
        int r = i / CH, c = i % CH;
        const bf16 *src = q + ((size_t)(b * B + (r < used ? r % B : 0)) * NH + g * G + (r < used ? r / B : 0)) * HD + c * 8;
        cp_async16(sQ + r * LD + c * 8, src, r < used ? 16 : 0);
    }
    __syncthreads();
    const int c_lo = sLo, c_hi = sHi + 1;   /* visible context keys lie in [c_lo, c_hi) */
    const int n_ctx = c_hi > c_lo ? (c_hi - c_lo + BC - 1) / BC : 0, n_tiles = n_ctx + 1;
    auto load_kv = [&](int t, int buf) {
        for (int i = tid; i < BC * CH; i += NT) {
            int r = i / CH, c = i % CH, ok;
            size_t row;
            if (t < n_ctx) { int p = c_lo + t * BC + r; ok = p < c_hi; row = ok ? p : 0; }
            else { ok = r < B; row = ok ? (size_t)T + (size_t)b * B + r : 0; }
            size_t off = (row * NKV + g) * HD + c * 8;
            cp_async16(sK + (buf * BC + r) * LD + c * 8, k + off, ok ? 16 : 0);
            cp_async16(sV + (buf * BC + r) * LD + c * 8, v + off, ok ? 16 : 0);
        }
        if (tid < BC) {
            int vis;
            if (t < n_ctx) { int p = c_lo + t * BC + tid; vis = p < c_hi && doc_ids[p] == d; }
            else vis = tid < B;
            sDoc[buf][tid] = vis;
        }
    };
    load_kv(0, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kc = 0; kc < HD / 16; kc++) ldsm_x4(qf[kc], sQ + (warp * 16 + (lane % 16)) * LD + kc * 16 + (lane / 16) * 8);
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    const int r0 = warp * 16 + lane / 4, r1 = r0 + 8;   /* this thread's rows */
    const int j0 = r0 % B, j1 = r1 % B;
    const bool ok0 = r0 < used, ok1 = r1 < used;
    int buf = 0;
    for (int t = 0; t < n_tiles; t++) {
        if (t + 1 < n_tiles) load_kv(t + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bool block_tile = t == n_ctx;
        const bf16 *Kb = sK + buf * BC * LD, *Vb = sV + buf * BC * LD;
        float s[BC / 8][4];
#pragma unroll
        for (int i = 0; i < BC / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < HD / 16; kc++) {
#pragma unroll
            for (int np = 0; np < BC / 16; np++) {
                uint32_t bb[4];
                ldsm_x4(bb, Kb + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kc * 16 + ((lane / 8) % 2) * 8);
                mma_bf16(s[2 * np], qf[kc], bb[0], bb[1]);
                mma_bf16(s[2 * np + 1], qf[kc], bb[2], bb[3]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = nt * 8 + (lane % 4) * 2 + (e & 1);
                bool second = e >= 2;
                bool vis = sDoc[buf][key] && (second ? ok1 : ok0) &&
                           !(block_tile && causal && key > (second ? j1 : j0));
                s[nt][e] = vis ? s[nt][e] * scale_log2 : -INFINITY;
            }
        float mx0 = m0, mx1 = m1;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float ms0 = mx0 == -INFINITY ? 0.0f : mx0, ms1 = mx1 == -INFINITY ? 0.0f : mx1;
        const float c0 = exp2f(m0 - ms0), c1 = exp2f(m1 - ms1);
        m0 = mx0;
        m1 = mx1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
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
        for (int kc = 0; kc < BC / 16; kc++) {
            uint32_t aa[4] = {pack_bf16x2(s[2 * kc][0], s[2 * kc][1]), pack_bf16x2(s[2 * kc][2], s[2 * kc][3]),
                              pack_bf16x2(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                              pack_bf16x2(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t bb[4];
                ldsm_x4_t(bb, Vb + (kc * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 + (lane / 16) * 8);
                mma_bf16(o[2 * dp], aa, bb[0], bb[1]);
                mma_bf16(o[2 * dp + 1], aa, bb[2], bb[3]);
            }
        }
        __syncthreads();
        buf ^= 1;
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const int col = (lane % 4) * 2;
    if (ok0) {
        int h = g * G + r0 / B;
        size_t row = (size_t)b * B + j0;
        __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + (row * NH + h) * HD + col);
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) dst[nt * 4] = __floats2bfloat162_rn(o[nt][0] / l0, o[nt][1] / l0);
        if (lane % 4 == 0) lse[(size_t)h * R + row] = (m0 + log2f(l0)) * 0.69314718055994531f;
    }
    if (ok1) {
        int h = g * G + r1 / B;
        size_t row = (size_t)b * B + j1;
        __nv_bfloat162 *dst = (__nv_bfloat162 *)(out + (row * NH + h) * HD + col);
#pragma unroll
        for (int nt = 0; nt < HD / 8; nt++) dst[nt * 4] = __floats2bfloat162_rn(o[nt][2] / l1, o[nt][3] / l1);
        if (lane % 4 == 0) lse[(size_t)h * R + row] = (m1 + log2f(l1)) * 0.69314718055994531f;
    }
}

static int forward2(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                    const int32_t *doc, bf16 *out, float *lse) {
    const size_t smem = (size_t)(64 + 4 * 64) * (128 + 8) * sizeof(bf16);
    static int configured;
    if (!configured) {
        CK(cudaFuncSetAttribute(block_attn_forward_kernel2<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = 1;
    }
    if (c->d_h != 128 || (c->n_h / c->n_kv) * c->B > 64) return kernels_fail("forward2: d_h 128 and G·B <= 64 only");
    block_attn_forward_kernel2<128><<<dim3(c->N, c->n_kv), 128, smem>>>(q, k, v, anchors, doc, out, lse, c->T, c->N, c->B,
                                                                       c->n_h, c->n_kv, c->window, c->causal,
                                                                       c->scale * 1.4426950408889634f);
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? 0 : kernels_fail("forward2: %s", cudaGetErrorString(e));
}

static bool variant2_ok;

static double validate(const block_attn_config &c, const std::vector<bf16> &q, const std::vector<bf16> &k,
                       const std::vector<bf16> &v, const std::vector<int32_t> &anchors, const std::vector<int32_t> &doc) {
    block_attn_config s = c;
    s.N = 32;
    int R = s.N * s.B;
    size_t nq = (size_t)R * c.n_h * c.d_h, nk = ((size_t)c.T + R) * c.n_kv * c.d_h;
    /* K/V rows of the small problem: context rows as they are, then the first 32 blocks' rows */
    std::vector<float> qf(nq), kf(nk), vf(nk), go(nq);
    for (size_t i = 0; i < nq; i++) qf[i] = bf16_to_float(q[i]);
    for (size_t i = 0; i < nk; i++) { kf[i] = bf16_to_float(k[i]); vf[i] = bf16_to_float(v[i]); }
    uint64_t rng = 5;
    std::vector<bf16> gb(nq);
    for (size_t i = 0; i < nq; i++) { gb[i] = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 16777216.0 - 0.5)); go[i] = bf16_to_float(gb[i]); }
    std::vector<float> o(nq), l((size_t)R * c.n_h), lb((size_t)R * c.n_h), ob(nq), dq(nq), dk(nk), dv(nk);
    char err[256];
    if (block_attn_forward_ref(&s, qf.data(), kf.data(), vf.data(), anchors.data(), doc.data(), 0, o.data(), l.data(), err, sizeof err) ||
        block_attn_forward_ref(&s, qf.data(), kf.data(), vf.data(), anchors.data(), doc.data(), 1, ob.data(), lb.data(), err, sizeof err) ||
        block_attn_backward_ref(&s, qf.data(), kf.data(), vf.data(), anchors.data(), doc.data(), o.data(), go.data(), l.data(), dq.data(), dk.data(), dv.data(), err, sizeof err)) {
        fprintf(stderr, "reference: %s\n", err);
        exit(1);
    }
    bf16 *d_q, *d_k, *d_v, *d_o, *d_go;
    float *d_l, *d_dq, *d_dk, *d_dv;
    int32_t *d_a, *d_doc;
    CK(cudaMalloc(&d_q, nq * 2)); CK(cudaMalloc(&d_k, nk * 2)); CK(cudaMalloc(&d_v, nk * 2)); CK(cudaMalloc(&d_o, nq * 2));
    CK(cudaMalloc(&d_go, nq * 2)); CK(cudaMalloc(&d_l, (size_t)R * c.n_h * 4)); CK(cudaMalloc(&d_dq, nq * 4));
    CK(cudaMalloc(&d_dk, nk * 4)); CK(cudaMalloc(&d_dv, nk * 4)); CK(cudaMalloc(&d_a, 4 * 32)); CK(cudaMalloc(&d_doc, 4 * (size_t)c.T));
    CK(cudaMemcpy(d_q, q.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_k, k.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_v, v.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_go, gb.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_a, anchors.data(), 4 * 32, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_doc, doc.data(), 4 * (size_t)c.T, cudaMemcpyHostToDevice));
    CKK(block_attn_forward(&s, d_q, d_k, d_v, d_a, d_doc, d_o, d_l, 0));
    CKK(block_attn_backward(&s, d_q, d_k, d_v, d_a, d_doc, d_o, d_go, d_l, d_dq, d_dk, d_dv, 0));
    CK(cudaDeviceSynchronize());
    std::vector<bf16> og(nq);
    std::vector<float> ogf(nq), dqg(nq), dkg(nk);
    CK(cudaMemcpy(og.data(), d_o, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dqg.data(), d_dq, nq * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dkg.data(), d_dk, nk * 4, cudaMemcpyDeviceToHost));
    double eo = 0, bo = 0, edq = 0, mdq = 0, edk = 0, mdk = 0;
    for (size_t i = 0; i < nq; i++) {
        eo = std::max(eo, (double)fabsf(bf16_to_float(og[i]) - o[i]));
        bo = std::max(bo, (double)fabsf(ob[i] - o[i]));
        edq = std::max(edq, (double)fabsf(dqg[i] - dq[i]));
        mdq = std::max(mdq, (double)fabsf(dq[i]));
    }
    for (size_t i = 0; i < nk; i++) { edk = std::max(edk, (double)fabsf(dkg[i] - dk[i])); mdk = std::max(mdk, (double)fabsf(dk[i])); }
    printf("validate variant 1 (32 anchors): out max err %.3g (bf16 reference %.3g), dq err %.3g of max %.3g, dk err %.3g of max %.3g: %s\n",
           eo, bo, edq, mdq, edk, mdk, (eo <= 2 * bo + 1e-6 && edq <= 0.03 * mdq + 1e-6 && edk <= 0.03 * mdk + 1e-6) ? "OK" : "FAIL");
    CK(cudaMemset(d_o, 0xff, nq * 2));
    CK(cudaMemset(d_l, 0xff, (size_t)R * c.n_h * 4));
    CKK(forward2(&s, d_q, d_k, d_v, d_a, d_doc, d_o, d_l));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(og.data(), d_o, nq * 2, cudaMemcpyDeviceToHost));
    std::vector<float> lg((size_t)R * c.n_h);
    CK(cudaMemcpy(lg.data(), d_l, lg.size() * 4, cudaMemcpyDeviceToHost));
    double eo2 = 0, el2 = 0;
    for (size_t i = 0; i < nq; i++) eo2 = std::max(eo2, (double)fabsf(bf16_to_float(og[i]) - o[i]));
    for (size_t i = 0; i < lg.size(); i++) el2 = std::max(el2, (double)fabsf(lg[i] - l[i]));
    variant2_ok = eo2 <= 2 * bo + 1e-6 && el2 <= 1e-3;
    printf("validate variant 2 (32 anchors): out max err %.3g (bf16 reference %.3g), lse err %.3g: %s\n", eo2, bo, el2,
           variant2_ok ? "OK" : "FAIL");
    cudaFree(d_q); cudaFree(d_k); cudaFree(d_v); cudaFree(d_o); cudaFree(d_go); cudaFree(d_l); cudaFree(d_dq);
    cudaFree(d_dk); cudaFree(d_dv); cudaFree(d_a); cudaFree(d_doc);
    return eo;
}

int main(void) {
    block_attn_config c = {8192, 512, 16, 32, 8, 128, 2048, 1, 1.0f / sqrtf(128.0f)};
    int R = c.N * c.B;
    uint64_t rng = 42;
    std::vector<int32_t> doc(c.T);
    std::vector<uint8_t> mask(c.T);
    int id = 0, left = 0, pad_from = c.T - 300;
    for (int p = 0; p < c.T; p++) {
        if (left == 0) { left = 600 + (int)(kernels_rng_next(&rng) % 1200); id++; }
        left--;
        doc[p] = p >= pad_from ? -1 : id - 1;
        mask[p] = doc[p] != -1 && kernels_rng_next(&rng) % 10 < 7;
    }
    std::vector<int32_t> anchors(c.N);
    std::vector<uint8_t> valid(c.N);
    char err[256];
    int K = anchors_forward_ref(mask.data(), c.T, c.B, c.N, 42, 0, anchors.data(), valid.data(), err, sizeof err);
    /* visible pairs per query head */
    double pairs = 0;
    for (int b = 0; b < c.N; b++) {
        int a = anchors[b], d = doc[a], ctx = 0;
        for (int p = std::max(0, a - c.window); p < a && d != -1; p++) ctx += doc[p] == d;
        for (int j = 0; j < c.B; j++) pairs += ctx + (c.causal ? j + 1 : c.B);
    }
    pairs *= c.n_h;
    size_t nq = (size_t)R * c.n_h * c.d_h, nk = ((size_t)c.T + R) * c.n_kv * c.d_h;
    std::vector<bf16> q(nq), k(nk), v(nk), go(nq);
    for (auto &x : q) x = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 8388608.0 - 1.0));
    for (auto &x : k) x = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 8388608.0 - 1.0));
    for (auto &x : v) x = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 8388608.0 - 1.0));
    for (auto &x : go) x = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 8388608.0 - 1.0));
    printf("block_attn: T=%d N=%d (valid %d) B=%d heads %d/%d d_h=%d window=%d causal=%d; visible pairs %.4g (%.1f%% of dense)\n",
           c.T, c.N, K, c.B, c.n_h, c.n_kv, c.d_h, c.window, c.causal, pairs,
           100.0 * pairs / ((double)R * (c.T + R) * c.n_h));
    validate(c, q, k, v, anchors, doc);

    bf16 *d_q, *d_k, *d_v, *d_o, *d_go;
    float *d_l, *d_dq, *d_dk, *d_dv;
    int32_t *d_a, *d_doc;
    void *flush;
    CK(cudaMalloc(&d_q, nq * 2)); CK(cudaMalloc(&d_k, nk * 2)); CK(cudaMalloc(&d_v, nk * 2)); CK(cudaMalloc(&d_o, nq * 2));
    CK(cudaMalloc(&d_go, nq * 2)); CK(cudaMalloc(&d_l, (size_t)R * c.n_h * 4)); CK(cudaMalloc(&d_dq, nq * 4));
    CK(cudaMalloc(&d_dk, nk * 4)); CK(cudaMalloc(&d_dv, nk * 4)); CK(cudaMalloc(&d_a, 4 * (size_t)c.N));
    CK(cudaMalloc(&d_doc, 4 * (size_t)c.T)); CK(cudaMalloc(&flush, 256 << 20));
    CK(cudaMemcpy(d_q, q.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_k, k.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_v, v.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_go, go.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_a, anchors.data(), 4 * (size_t)c.N, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_doc, doc.data(), 4 * (size_t)c.T, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int pass = 0; pass < 3; pass++) {
        std::vector<float> ms;
        if (pass == 2 && !variant2_ok) break;
        for (int it = 0; it < 13; it++) {
            CK(cudaMemset(flush, it, 256 << 20));   /* flush L2 */
            CK(cudaEventRecord(e0));
            if (pass == 0) CKK(block_attn_forward(&c, d_q, d_k, d_v, d_a, d_doc, d_o, d_l, 0));
            else if (pass == 1) CKK(block_attn_backward(&c, d_q, d_k, d_v, d_a, d_doc, d_o, d_go, d_l, d_dq, d_dk, d_dv, 0));
            else CKK(forward2(&c, d_q, d_k, d_v, d_a, d_doc, d_o, d_l));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            if (it >= 3) ms.push_back(t);   /* 3 warm-up runs */
        }
        std::sort(ms.begin(), ms.end());
        double med = ms[ms.size() / 2], flops = pairs * c.d_h * (pass == 1 ? 10.0 : 4.0);
        printf("variant %d %-8s median %.3f ms  %.1f TFLOP/s (visible pairs)  target %s\n", pass == 2 ? 2 : 1,
               pass == 1 ? "backward" : "forward", med, flops / med / 1e9, pass == 1 ? ">= 200" : ">= 300");
    }
    return 0;
}
