/*
 * kernels/block_attn.cu — DFlash anchored block attention on the device (kernels/block_attn.h).
 *
 * One CTA of 4 warps per (block b, kv head g). Its 64 query rows are the G = n_h/n_kv query heads of
 * kv head g times the B slots of the block (row r -> head g·G + r/B, slot r%B; rows >= G·B are idle),
 * so every key tile loaded to shared memory serves all heads of the group (GQA for free). Key tiles
 * of 64: first the context range [max(0, a-W), a) of the anchor (empty when doc_ids[a] == -1), then one
 * tile with the block's own B keys. A context tile with no key of the anchor's document is skipped
 * without loading K/V (the "invisible tiles are skipped" rule); inside a visited tile the per-key
 * document test and the causal in-block test mask scores to -inf.
 * Matmuls use WMMA bf16 16x16x16 tensor-core fragments with fp32 accumulation; S and the output
 * accumulator live in shared memory in fp32, the online softmax (max, sum) in fp32 registers, P is
 * rounded to bf16 for P·V (the reference's round_p mode emulates this).
 * Backward: same tiling; recompute P from the saved lse, dS = P ⊙ (dP - rowsum(dO ⊙ O)); dQ stays in
 * shared memory (exclusive to the CTA), dK/dV tiles are added to fp32 global buffers with atomics
 * because context keys are shared by many blocks.
 * This is the straightforward correct version; see kernels/bench/block_attn_bench.cu for its speed.
 */
#include "kernels/block_attn.h"

#include <cuda_bf16.h>
#include <mma.h>

using namespace nvcuda;

namespace {

constexpr int BA_ROWS = 64;      /* query rows per CTA */
constexpr int BA_KT = 64;        /* keys per tile */
constexpr int BA_THREADS = 128;  /* 4 warps, 16 query rows each */
constexpr int BA_SLD = BA_KT + 4;   /* fp32 score row stride (WMMA: multiple of 4) */
constexpr int BA_PLD = BA_KT + 8;   /* bf16 P row stride (WMMA: multiple of 8) */

template <int D> struct ba_smem {
    static constexpr int QLD = D + 8;   /* bf16 rows of Q, K, V, dO */
    static constexpr int OLD = D + 4;   /* fp32 rows of O, dQ, dK/dV scratch */
    static constexpr size_t bf_tile = (size_t)BA_ROWS * QLD * 2;
    static constexpr size_t s_tile = (size_t)BA_ROWS * BA_SLD * 4;
    static constexpr size_t p_tile = (size_t)BA_ROWS * BA_PLD * 2;
    static constexpr size_t o_tile = (size_t)BA_ROWS * OLD * 4;
    static constexpr size_t fwd = 3 * bf_tile + s_tile + p_tile + o_tile + 64 * 4;
    static constexpr size_t bwd = 4 * bf_tile + 2 * s_tile + 2 * p_tile + o_tile + 3 * 64 * 4;
    static_assert(2 * s_tile >= o_tile, "the dK/dV scratch reuses the two score tiles");
};

/* Copies one row of D bf16 (16-byte vectors) from global to shared, or zeros it. */
template <int D>
__device__ __forceinline__ void ba_load_row_part(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int c8, bool ok) {
    uint4 val = ok ? *reinterpret_cast<const uint4 *>(src + c8 * 8) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4 *>(dst + c8 * 8) = val;
}

/* Key tile t of block b: fills vis[64] and keyrow[64]; returns whether any key is visible. */
__device__ __forceinline__ int ba_tile_keys(int t, int n_ctx_tiles, int ctx_lo, int ctx_hi, int d,
                                            const int32_t *doc_ids, int T, int b, int B, int *vis, int *keyrow) {
    int tid = threadIdx.x;
    int v = 0;
    if (tid < BA_KT) {
        if (t < n_ctx_tiles) {
            int p = ctx_lo + t * BA_KT + tid;
            v = p < ctx_hi && doc_ids[p] == d;
            keyrow[tid] = p;
        } else {
            v = tid < B;
            keyrow[tid] = T + b * B + tid;
        }
        vis[tid] = v;
    }
    return __syncthreads_or(v);
}

/* ---------------------------------------------------------------- kernels */

template <int D>
__global__ void __launch_bounds__(BA_THREADS)
block_attn_forward_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                          const int32_t *anchors, const int32_t *doc_ids, __nv_bfloat16 *out, float *lse,
                          int T, int N, int B, int n_h, int n_kv, int window, int causal, float scale) {
    using S = ba_smem<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *sK = sQ + BA_ROWS * S::QLD;
    __nv_bfloat16 *sV = sK + BA_ROWS * S::QLD;
    float *sS = (float *)(sV + BA_ROWS * S::QLD);
    __nv_bfloat16 *sP = (__nv_bfloat16 *)(sS + BA_ROWS * BA_SLD);
    float *sO = (float *)(sP + BA_ROWS * BA_PLD);
    int *sVis = (int *)(sO + BA_ROWS * S::OLD);
    __shared__ int sKeyRow[BA_KT];

    const int b = blockIdx.x, g = blockIdx.y, tid = threadIdx.x, warp = tid >> 5;
    const int G = n_h / n_kv, R = N * B, used = G * B;
    const int a = anchors[b], d = doc_ids[a];

    for (int i = tid; i < BA_ROWS * (D / 8); i += BA_THREADS) {
        int r = i / (D / 8), c8 = i % (D / 8);
        bool ok = r < used;
        size_t qrow = ok ? ((size_t)(b * B + r % B) * n_h + g * G + r / B) * D : 0;
        ba_load_row_part<D>(sQ + r * S::QLD, q + qrow, c8, ok);
    }
    for (int i = tid; i < BA_ROWS * S::OLD; i += BA_THREADS) sO[i] = 0.f;

    const int ctx_lo = window > 0 ? max(0, a - window) : 0;
    const int ctx_hi = d == -1 ? ctx_lo : a;
    const int n_ctx_tiles = (ctx_hi - ctx_lo + BA_KT - 1) / BA_KT;

    /* thread -> (row, half of the 64 tile columns) for the softmax; its partner is tid ^ 1 */
    const int my_r = tid >> 1, half = tid & 1, my_j = my_r % B;
    const bool row_ok = my_r < used;
    float m_run = -INFINITY, l_run = 0.f;

    for (int t = 0; t <= n_ctx_tiles; t++) {
        const bool block_tile = t == n_ctx_tiles;
        __syncthreads();   /* the previous tile's readers of sK/sV/sVis are done */
        if (!ba_tile_keys(t, n_ctx_tiles, ctx_lo, ctx_hi, d, doc_ids, T, b, B, sVis, sKeyRow)) continue;
        for (int i = tid; i < BA_KT * (D / 8); i += BA_THREADS) {
            int c = i / (D / 8), c8 = i % (D / 8);
            bool ok = sVis[c];
            size_t off = ok ? ((size_t)sKeyRow[c] * n_kv + g) * D : 0;
            ba_load_row_part<D>(sK + c * S::QLD, k + off, c8, ok);
            ba_load_row_part<D>(sV + c * S::QLD, v + off, c8, ok);
        }
        __syncthreads();
        {   /* S = Q·Kᵀ for this warp's 16 rows */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
            for (int n = 0; n < 4; n++) wmma::fill_fragment(acc[n], 0.f);
            for (int kk = 0; kk < D / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                wmma::load_matrix_sync(fa, sQ + warp * 16 * S::QLD + kk * 16, S::QLD);
                for (int n = 0; n < 4; n++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
                    wmma::load_matrix_sync(fb, sK + n * 16 * S::QLD + kk * 16, S::QLD);
                    wmma::mma_sync(acc[n], fa, fb, acc[n]);
                }
            }
            for (int n = 0; n < 4; n++)
                wmma::store_matrix_sync(sS + warp * 16 * BA_SLD + n * 16, acc[n], BA_SLD, wmma::mem_row_major);
        }
        __syncthreads();
        {   /* online softmax of this thread's 32 columns */
            float sv[32];
            float tmax = -INFINITY;
            for (int i = 0; i < 32; i++) {
                int c = half * 32 + i;
                bool ok = row_ok && sVis[c] && !(block_tile && causal && c > my_j);
                sv[i] = ok ? sS[my_r * BA_SLD + c] * scale : -INFINITY;
                tmax = fmaxf(tmax, sv[i]);
            }
            tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
            float m_new = fmaxf(m_run, tmax);
            float corr = m_new == -INFINITY ? 1.f : __expf(m_run - m_new);
            float psum = 0.f;
            for (int i = 0; i < 32; i++) {
                float p = sv[i] == -INFINITY ? 0.f : __expf(sv[i] - m_new);
                psum += p;
                sP[my_r * BA_PLD + half * 32 + i] = __float2bfloat16_rn(p);
            }
            psum += __shfl_xor_sync(0xffffffffu, psum, 1);
            l_run = l_run * corr + psum;
            m_run = m_new;
            for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) sO[my_r * S::OLD + c] *= corr;
        }
        __syncthreads();
        for (int n = 0; n < D / 16; n++) {   /* O += P·V */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, sO + warp * 16 * S::OLD + n * 16, S::OLD, wmma::mem_row_major);
            for (int kk = 0; kk < BA_KT / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, sP + warp * 16 * BA_PLD + kk * 16, BA_PLD);
                wmma::load_matrix_sync(fb, sV + kk * 16 * S::QLD + n * 16, S::QLD);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(sO + warp * 16 * S::OLD + n * 16, acc, S::OLD, wmma::mem_row_major);
        }
    }
    __syncthreads();
    if (row_ok) {
        size_t row = (size_t)b * B + my_j;
        int h = g * G + my_r / B;
        float inv = 1.f / l_run;
        __nv_bfloat16 *o = out + (row * n_h + h) * D;
        for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) o[c] = __float2bfloat16_rn(sO[my_r * S::OLD + c] * inv);
        if (half == 0) lse[(size_t)h * R + row] = m_run + logf(l_run);
    }
}

/* dst (fp32 global rows keyrow[c]) += scratch rows c of a 64 x D tile, for visible keys only. */
template <int D>
__device__ __forceinline__ void ba_atomic_tile(float *dst, const float *scratch, const int *vis, const int *keyrow,
                                               int n_kv, int g) {
    for (int i = threadIdx.x; i < BA_KT * D; i += BA_THREADS) {
        int c = i / D, e = i % D;
        if (vis[c]) atomicAdd(dst + ((size_t)keyrow[c] * n_kv + g) * D + e, scratch[c * ba_smem<D>::OLD + e]);
    }
}

/* scratch (64 x D fp32) = Xᵀ·Y where X is a 64 x 64 bf16 tile (rows = query rows, cols = keys) and Y a
 * 64 x D bf16 tile (rows = query rows): the per-key sums over the CTA's query rows. */
template <int D>
__device__ __forceinline__ void ba_tn_tile(float *scratch, const __nv_bfloat16 *X, const __nv_bfloat16 *Y) {
    using S = ba_smem<D>;
    int warp = threadIdx.x >> 5;
    for (int n = 0; n < D / 16; n++) {
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.f);
        for (int kk = 0; kk < BA_ROWS / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major> fa;   /* Xᵀ */
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, X + kk * 16 * BA_PLD + warp * 16, BA_PLD);
            wmma::load_matrix_sync(fb, Y + kk * 16 * S::QLD + n * 16, S::QLD);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(scratch + warp * 16 * S::OLD + n * 16, acc, S::OLD, wmma::mem_row_major);
    }
}

template <int D>
__global__ void __launch_bounds__(BA_THREADS)
block_attn_backward_kernel(const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                           const int32_t *anchors, const int32_t *doc_ids, const __nv_bfloat16 *out,
                           const __nv_bfloat16 *dout, const float *lse, float *dq, float *dk, float *dv,
                           int T, int N, int B, int n_h, int n_kv, int window, int causal, float scale) {
    using S = ba_smem<D>;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16 *sQ = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *sdO = sQ + BA_ROWS * S::QLD;
    __nv_bfloat16 *sK = sdO + BA_ROWS * S::QLD;
    __nv_bfloat16 *sV = sK + BA_ROWS * S::QLD;
    float *sS = (float *)(sV + BA_ROWS * S::QLD);
    float *sdP = sS + BA_ROWS * BA_SLD;
    float *scratch = sS;   /* reused after P and dS are formed */
    __nv_bfloat16 *sP = (__nv_bfloat16 *)(sdP + BA_ROWS * BA_SLD);
    __nv_bfloat16 *sdS = sP + BA_ROWS * BA_PLD;
    float *sdQ = (float *)(sdS + BA_ROWS * BA_PLD);
    int *sVis = (int *)(sdQ + BA_ROWS * S::OLD);
    float *sLse = (float *)(sVis + 64);
    float *sDi = sLse + 64;
    __shared__ int sKeyRow[BA_KT];

    const int b = blockIdx.x, g = blockIdx.y, tid = threadIdx.x, warp = tid >> 5;
    const int G = n_h / n_kv, R = N * B, used = G * B;
    const int a = anchors[b], d = doc_ids[a];

    for (int i = tid; i < BA_ROWS * (D / 8); i += BA_THREADS) {
        int r = i / (D / 8), c8 = i % (D / 8);
        bool ok = r < used;
        size_t qrow = ok ? ((size_t)(b * B + r % B) * n_h + g * G + r / B) * D : 0;
        ba_load_row_part<D>(sQ + r * S::QLD, q + qrow, c8, ok);
        ba_load_row_part<D>(sdO + r * S::QLD, dout + qrow, c8, ok);
    }
    for (int i = tid; i < BA_ROWS * S::OLD; i += BA_THREADS) sdQ[i] = 0.f;
    const int my_r = tid >> 1, half = tid & 1, my_j = my_r % B;
    const bool row_ok = my_r < used;
    {   /* Di = rowsum(dO ⊙ O), lse of the row */
        float s = 0.f;
        if (row_ok) {
            size_t qrow = ((size_t)(b * B + my_j) * n_h + g * G + my_r / B) * D;
            for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++)
                s += __bfloat162float(dout[qrow + c]) * __bfloat162float(out[qrow + c]);
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        if (half == 0) {
            sDi[my_r] = s;
            sLse[my_r] = row_ok ? lse[(size_t)(g * G + my_r / B) * R + b * B + my_j] : 0.f;
        }
    }

    const int ctx_lo = window > 0 ? max(0, a - window) : 0;
    const int ctx_hi = d == -1 ? ctx_lo : a;
    const int n_ctx_tiles = (ctx_hi - ctx_lo + BA_KT - 1) / BA_KT;

    for (int t = 0; t <= n_ctx_tiles; t++) {
        const bool block_tile = t == n_ctx_tiles;
        __syncthreads();
        if (!ba_tile_keys(t, n_ctx_tiles, ctx_lo, ctx_hi, d, doc_ids, T, b, B, sVis, sKeyRow)) continue;
        for (int i = tid; i < BA_KT * (D / 8); i += BA_THREADS) {
            int c = i / (D / 8), c8 = i % (D / 8);
            bool ok = sVis[c];
            size_t off = ok ? ((size_t)sKeyRow[c] * n_kv + g) * D : 0;
            ba_load_row_part<D>(sK + c * S::QLD, k + off, c8, ok);
            ba_load_row_part<D>(sV + c * S::QLD, v + off, c8, ok);
        }
        __syncthreads();
        {   /* S = Q·Kᵀ, dP = dO·Vᵀ */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4];
            for (int pass = 0; pass < 2; pass++) {
                const __nv_bfloat16 *A = pass ? sdO : sQ, *Bm = pass ? sV : sK;
                float *dst = pass ? sdP : sS;
                for (int n = 0; n < 4; n++) wmma::fill_fragment(acc[n], 0.f);
                for (int kk = 0; kk < D / 16; kk++) {
                    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                    wmma::load_matrix_sync(fa, A + warp * 16 * S::QLD + kk * 16, S::QLD);
                    for (int n = 0; n < 4; n++) {
                        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
                        wmma::load_matrix_sync(fb, Bm + n * 16 * S::QLD + kk * 16, S::QLD);
                        wmma::mma_sync(acc[n], fa, fb, acc[n]);
                    }
                }
                for (int n = 0; n < 4; n++)
                    wmma::store_matrix_sync(dst + warp * 16 * BA_SLD + n * 16, acc[n], BA_SLD, wmma::mem_row_major);
            }
        }
        __syncthreads();
        {   /* P and dS (scaled) in bf16 */
            float lse_r = sLse[my_r], di = sDi[my_r];
            for (int i = 0; i < 32; i++) {
                int c = half * 32 + i;
                bool ok = row_ok && sVis[c] && !(block_tile && causal && c > my_j);
                float p = ok ? __expf(sS[my_r * BA_SLD + c] * scale - lse_r) : 0.f;
                float ds = ok ? p * (sdP[my_r * BA_SLD + c] - di) * scale : 0.f;
                sP[my_r * BA_PLD + c] = __float2bfloat16_rn(p);
                sdS[my_r * BA_PLD + c] = __float2bfloat16_rn(ds);
            }
        }
        __syncthreads();
        for (int n = 0; n < D / 16; n++) {   /* dQ += dS·K */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, sdQ + warp * 16 * S::OLD + n * 16, S::OLD, wmma::mem_row_major);
            for (int kk = 0; kk < BA_KT / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, sdS + warp * 16 * BA_PLD + kk * 16, BA_PLD);
                wmma::load_matrix_sync(fb, sK + kk * 16 * S::QLD + n * 16, S::QLD);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(sdQ + warp * 16 * S::OLD + n * 16, acc, S::OLD, wmma::mem_row_major);
        }
        ba_tn_tile<D>(scratch, sP, sdO);   /* dV tile = Pᵀ·dO */
        __syncthreads();
        ba_atomic_tile<D>(dv, scratch, sVis, sKeyRow, n_kv, g);
        __syncthreads();
        ba_tn_tile<D>(scratch, sdS, sQ);   /* dK tile = dSᵀ·Q */
        __syncthreads();
        ba_atomic_tile<D>(dk, scratch, sVis, sKeyRow, n_kv, g);
    }
    __syncthreads();
    if (row_ok) {
        size_t qrow = ((size_t)(b * B + my_j) * n_h + g * G + my_r / B) * D;
        for (int c = half * (D / 2); c < (half + 1) * (D / 2); c++) dq[qrow + c] = sdQ[my_r * S::OLD + c];
    }
}

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

template <int D>
int ba_forward_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                      const int32_t *doc_ids, bf16 *out, float *lse, cudaStream_t stream) {
    size_t smem = ba_smem<D>::fwd;
    cudaError_t e = cudaFuncSetAttribute(block_attn_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kernels_fail("block_attn_forward: cudaFuncSetAttribute: %s", cudaGetErrorString(e));
    dim3 grid(c->N, c->n_kv);
    block_attn_forward_kernel<D><<<grid, BA_THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (__nv_bfloat16 *)out, lse, c->T, c->N, c->B, c->n_h, c->n_kv, c->window, c->causal, c->scale);
    KERNELS_CHECK_LAUNCH("block_attn_forward_kernel");
    return 0;
}

template <int D>
int ba_backward_launch(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *anchors,
                       const int32_t *doc_ids, const bf16 *out, const bf16 *dout, const float *lse, float *dq,
                       float *dk, float *dv, cudaStream_t stream) {
    size_t smem = ba_smem<D>::bwd;
    cudaError_t e = cudaFuncSetAttribute(block_attn_backward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return kernels_fail("block_attn_backward: cudaFuncSetAttribute: %s", cudaGetErrorString(e));
    size_t nk = ((size_t)c->T + (size_t)c->N * c->B) * c->n_kv * c->d_h;
    if ((e = cudaMemsetAsync(dk, 0, nk * sizeof(float), stream)) != cudaSuccess ||
        (e = cudaMemsetAsync(dv, 0, nk * sizeof(float), stream)) != cudaSuccess)
        return kernels_fail("block_attn_backward: cudaMemsetAsync: %s", cudaGetErrorString(e));
    dim3 grid(c->N, c->n_kv);
    block_attn_backward_kernel<D><<<grid, BA_THREADS, smem, stream>>>(
        (const __nv_bfloat16 *)q, (const __nv_bfloat16 *)k, (const __nv_bfloat16 *)v, anchors, doc_ids,
        (const __nv_bfloat16 *)out, (const __nv_bfloat16 *)dout, lse, dq, dk, dv, c->T, c->N, c->B, c->n_h, c->n_kv,
        c->window, c->causal, c->scale);
    KERNELS_CHECK_LAUNCH("block_attn_backward_kernel");
    return 0;
}

}  // namespace

/* ---------------------------------------------------------------- launchers */

extern "C" int block_attn_forward(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                                  const int32_t *d_anchors, const int32_t *d_doc_ids, bf16 *d_out, float *d_lse,
                                  cudaStream_t stream) {
    const void *ptrs[] = {d_q, d_k, d_v, d_out};
    if (ba_check_device(c, ptrs, 4, "block_attn_forward")) return -1;
    return c->d_h == 128 ? ba_forward_launch<128>(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_lse, stream)
                         : ba_forward_launch<64>(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_lse, stream);
}

extern "C" int block_attn_backward(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                                   const int32_t *d_anchors, const int32_t *d_doc_ids, const bf16 *d_out,
                                   const bf16 *d_dout, const float *d_lse, float *d_dq, float *d_dk, float *d_dv,
                                   cudaStream_t stream) {
    const void *ptrs[] = {d_q, d_k, d_v, d_out, d_dout};
    if (ba_check_device(c, ptrs, 5, "block_attn_backward")) return -1;
    return c->d_h == 128
               ? ba_backward_launch<128>(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_dout, d_lse, d_dq, d_dk, d_dv, stream)
               : ba_backward_launch<64>(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_dout, d_lse, d_dq, d_dk, d_dv, stream);
}
