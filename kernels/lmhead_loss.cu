/*
 * kernels/lmhead_loss.cu — fused LM head + DFlash loss on the device (kernels/lmhead_loss.h).
 *
 * Forward: (1) gather + verifier-norm the target states of the R = N·B rows into th (R, D) bf16 and
 * form the aligned mask; (2) per vocabulary chunk of Vc rows, two cuBLASLt GEMMs (kernels/blas.h)
 * write the chunk's draft and target logits as bf16 (R, Vc), and a row kernel folds them into
 * per-row online statistics in fp32: max and sum of exp of z and of t, A = Σ e^{t-m_t}(t - z) (the KL
 * cross term), the first-index argmax of z and of t and z at the t-argmax; (3) per row the loss
 * (CE = lse_z - z[argmax t]; KL = A/s_t - lse_t + lse_z), then one small kernel forms the weights
 * block by block (exp-decay or D-PACE), the normalised loss and the agreement counts.
 * Backward: per chunk dz = coef_s (softmax(z) - P) in bf16 (written over the z chunk) and one GEMM
 * dxn += dz · lm_head[chunk] in fp32. The row kernels read 8 logits per 16-byte load and take one exp
 * per logit and stream (the first version loaded 2 bytes at a time and merged a full stat per logit).
 * With a single chunk (vocab_chunk >= V) the forward's logits are
 * reused, so the op costs its three GEMMs plus a few memory passes; with several chunks the backward
 * recomputes the chunk logits (one or two extra GEMMs) and never holds more than (R, Vc) bf16.
 * The default plan (vocab_chunk 0) is one chunk whenever the two (R, V) bf16 logit buffers fit in
 * LMHEAD_SINGLE_CHUNK_MAX_BYTES (1.05 GB at R = 8192, V = 32000: 1.26x the GEMMs, against 2.14x in
 * chunks of 8192 on the H200), else chunks of LMHEAD_VOCAB_CHUNK; a caller may give any chunk.
 */
#include "kernels/lmhead_loss.h"
#include "kernels/blas.h"

#include <stdlib.h>

#include <cuda_bf16.h>

struct lmhead_loss_ws {
    int R, D, V, Vc;
    __nv_bfloat16 *th;   /* (R, D) normed target states */
    __nv_bfloat16 *zc;   /* (R, Vc) draft logits of the current chunk; dz in the backward */
    __nv_bfloat16 *tc;   /* (R, Vc) target logits of the current chunk */
    float *st;           /* (R, 6) running stats: mz, sz, mt, st, A, zt */
    int *arg;            /* (R, 2) zarg, targ */
    float *lse;          /* (R, 2) lse_z, lse_t */
    uint8_t *mask;       /* (R) */
    float *msum;         /* (1) Σ m */
    int all_rows;        /* lmhead_loss_ws_set_all_rows: fold every row, not only the supervised ones */
};

namespace {

struct lmh_stat {
    float mz, sz, mt, st, A, zt;
    int zarg, targ;
};

__device__ __forceinline__ void lmh_identity(lmh_stat &s) {
    s.mz = s.mt = -INFINITY;
    s.sz = s.st = s.A = 0.f;
    s.zt = 0.f;
    s.zarg = s.targ = 0x7fffffff;
}

/* Merge b into a. Ties in the maxima go to the smaller index (first index, as torch.argmax). */
__device__ __forceinline__ void lmh_merge(lmh_stat &a, const lmh_stat &b) {
    if (b.mz != -INFINITY) {
        if (a.mz == -INFINITY) { a.mz = b.mz; a.sz = b.sz; a.zarg = b.zarg; }
        else {
            float m = fmaxf(a.mz, b.mz);
            a.sz = a.sz * __expf(a.mz - m) + b.sz * __expf(b.mz - m);
            if (b.mz > a.mz || (b.mz == a.mz && b.zarg < a.zarg)) a.zarg = b.zarg;
            a.mz = m;
        }
    }
    if (b.mt != -INFINITY) {
        if (a.mt == -INFINITY) { a.mt = b.mt; a.st = b.st; a.A = b.A; a.targ = b.targ; a.zt = b.zt; }
        else {
            float m = fmaxf(a.mt, b.mt);
            float ea = __expf(a.mt - m), eb = __expf(b.mt - m);
            a.st = a.st * ea + b.st * eb;
            a.A = a.A * ea + b.A * eb;
            if (b.mt > a.mt || (b.mt == a.mt && b.targ < a.targ)) { a.targ = b.targ; a.zt = b.zt; }
            a.mt = m;
        }
    }
}

__device__ __forceinline__ lmh_stat lmh_shfl(const lmh_stat &s, int o) {
    lmh_stat r;
    r.mz = __shfl_xor_sync(0xffffffffu, s.mz, o);
    r.sz = __shfl_xor_sync(0xffffffffu, s.sz, o);
    r.mt = __shfl_xor_sync(0xffffffffu, s.mt, o);
    r.st = __shfl_xor_sync(0xffffffffu, s.st, o);
    r.A = __shfl_xor_sync(0xffffffffu, s.A, o);
    r.zt = __shfl_xor_sync(0xffffffffu, s.zt, o);
    r.zarg = __shfl_xor_sync(0xffffffffu, s.zarg, o);
    r.targ = __shfl_xor_sync(0xffffffffu, s.targ, o);
    return r;
}

__device__ float lmh_block_sum(float v, float *red) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float s = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += red[w];
    return s;
}

/* ---------------------------------------------------------------- kernels */

/* One block per row: th = bf16(bf16(y·rstd)·w) with y = last[a + j - 1] (wrapping; last[a + j] with
 * sample_from_anchor), the mask, fresh stats. */
__global__ void lmhead_gather_kernel(const __nv_bfloat16 *last, const float *w, const int32_t *anchors,
                                     const uint8_t *valid, const uint8_t *loss_mask, int T, int B, int D, float eps,
                                     int sfa, __nv_bfloat16 *th, uint8_t *mask, float *st, int *arg) {
    __shared__ float red[32];
    int s = blockIdx.x, b = s / B, j = s % B, a = anchors[b];
    int src = a + j - (sfa ? 0 : 1);
    if (src < 0) src += T;
    if (src >= T) src = T - 1;   /* sample_from_anchor past the batch: the row is masked below */
    const __nv_bfloat16 *y = last + (size_t)src * D;
    float ss = 0.f;
    for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float x = __bfloat162float(y[e]);
        ss += x * x;
    }
    float rstd = rsqrtf(lmh_block_sum(ss, red) / D + eps);
    for (int e = threadIdx.x; e < D; e += blockDim.x) {
        float n = __bfloat162float(__float2bfloat16_rn(__bfloat162float(y[e]) * rstd));
        th[(size_t)s * D + e] = __float2bfloat16_rn(n * w[e]);
    }
    if (threadIdx.x == 0) {
        int p = a + j + (sfa ? 1 : 0);   /* the position whose token the row predicts */
        mask[s] = (sfa || j != 0) && valid[b] && p < T && loss_mask[p];
        float *r = st + (size_t)s * 6;
        r[0] = r[2] = -INFINITY;
        r[1] = r[3] = r[4] = r[5] = 0.f;
        arg[2 * s] = arg[2 * s + 1] = 0x7fffffff;
    }
}

/* Folds column idx (z, t) into a thread's running stats with one exp per stream: a new maximum rescales
 * the sums, otherwise the term is added at the current maximum. Columns arrive in increasing idx, so a
 * tie keeps the earlier (first) index. */
__device__ __forceinline__ void lmh_fold(lmh_stat &a, float z, float t, int idx) {
    if (z > a.mz) { a.sz = a.sz * __expf(a.mz - z) + 1.f; a.mz = z; a.zarg = idx; }
    else a.sz += __expf(z - a.mz);
    if (t > a.mt) {
        float c = __expf(a.mt - t);
        a.st = a.st * c + 1.f;
        a.A = a.A * c + (t - z);
        a.mt = t; a.targ = idx; a.zt = z;
    } else {
        float e = __expf(t - a.mt);
        a.st += e;
        a.A += e * (t - z);
    }
}

/* One block per supervised row (every row with all): fold the chunk's nv columns (global ids v0 + c) into the
 * row's stats.
 * 16-byte loads (8 logits) per thread and step; rows are 16-byte aligned (Vc % 8 == 0); the nv % 8 tail
 * is scalar. */
__global__ void lmhead_loss_forward_kernel(const __nv_bfloat16 *zc, const __nv_bfloat16 *tc, int Vc, int nv, int v0,
                                           const uint8_t *mask, int all, float *st, int *arg) {
    int s = blockIdx.x;
    if (!all && !mask[s]) return;
    lmh_stat acc;
    lmh_identity(acc);
    const __nv_bfloat16 *zr = zc + (size_t)s * Vc, *tr = tc + (size_t)s * Vc;
    const int n8 = nv / 8;
    /* the next step's two vectors are loaded before this step's fold (software pipelining: two loads
     * per stream in flight per thread instead of one; the fold order, hence every bit, is unchanged) */
    uint4 zv = make_uint4(0, 0, 0, 0), tv = make_uint4(0, 0, 0, 0);
    if ((int)threadIdx.x < n8) {
        zv = *reinterpret_cast<const uint4 *>(zr + threadIdx.x * 8);
        tv = *reinterpret_cast<const uint4 *>(tr + threadIdx.x * 8);
    }
    for (int c8 = threadIdx.x; c8 < n8; c8 += blockDim.x) {
        uint4 zn = make_uint4(0, 0, 0, 0), tn = make_uint4(0, 0, 0, 0);
        if (c8 + (int)blockDim.x < n8) {
            zn = *reinterpret_cast<const uint4 *>(zr + (c8 + blockDim.x) * 8);
            tn = *reinterpret_cast<const uint4 *>(tr + (c8 + blockDim.x) * 8);
        }
        const __nv_bfloat162 *z2 = (const __nv_bfloat162 *)&zv, *t2 = (const __nv_bfloat162 *)&tv;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 z = __bfloat1622float2(z2[e]), t = __bfloat1622float2(t2[e]);
            lmh_fold(acc, z.x, t.x, v0 + c8 * 8 + 2 * e);
            lmh_fold(acc, z.y, t.y, v0 + c8 * 8 + 2 * e + 1);
        }
        zv = zn;
        tv = tn;
    }
    /* the tail comes after every vector column of this thread, so indices still increase per thread */
    for (int c = n8 * 8 + threadIdx.x; c < nv; c += blockDim.x)
        lmh_fold(acc, __bfloat162float(zr[c]), __bfloat162float(tr[c]), v0 + c);
    for (int o = 16; o; o >>= 1) lmh_merge(acc, lmh_shfl(acc, o));
    __shared__ lmh_stat part[32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        float *r = st + (size_t)s * 6;
        lmh_stat run = {r[0], r[1], r[2], r[3], r[4], r[5], arg[2 * s], arg[2 * s + 1]};
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) lmh_merge(run, part[w]);
        r[0] = run.mz; r[1] = run.sz; r[2] = run.mt; r[3] = run.st; r[4] = run.A; r[5] = run.zt;
        arg[2 * s] = run.zarg;
        arg[2 * s + 1] = run.targ;
    }
}

/* Per row: lse_z, lse_t, the loss. */
__global__ void lmhead_finalize_kernel(int R, int loss_kind, const uint8_t *mask, const float *st, float *lse,
                                       float *row_loss) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= R) return;
    float l = 0.f;
    if (mask[s]) {
        const float *r = st + (size_t)s * 6;
        float lz = r[0] + logf(r[1]), lt = r[2] + logf(r[3]);
        lse[2 * s] = lz;
        lse[2 * s + 1] = lt;
        l = loss_kind == LMHEAD_LOSS_CE ? lz - r[5] : r[4] / r[3] - lt + lz;
    }
    row_loss[s] = l;
}

/* One block: weights block by block, L = Σ w m ℓ / (Σ m + 1e-5), agreement counts. The counts are
 * summed in shared memory (2·B ints of dynamic smem) and each written once, overwriting correct and
 * total (until K2c: two global atomics per supervised row, all from this one block, on 2·B addresses,
 * after two memsets). */
__global__ void lmhead_weights_kernel(int N, int B, int weighting, float gamma, float alpha, int sfa, const uint8_t *mask,
                                      const float *row_loss, const int *arg, float *row_weight, float *loss,
                                      float *msum_out, int32_t *correct, int32_t *total) {
    extern __shared__ int lmh_counts[];   /* [0, B): correct, [B, 2B): total */
    for (int j = threadIdx.x; j < 2 * B; j += blockDim.x) lmh_counts[j] = 0;
    __syncthreads();
    double lsum = 0, msum = 0;
    for (int b = threadIdx.x; b < N; b += blockDim.x) {
        double all = 0, before = 0, P = 1;
        if (weighting == LMHEAD_WEIGHT_DPACE)
            for (int j = 0; j < B; j++) {
                int s = b * B + j;
                if (mask[s]) {
                    P *= (1.0 - alpha) * exp(-(double)row_loss[s]) + alpha;
                    all += P;
                }
            }
        P = 1;
        for (int j = 0; j < B; j++) {
            int s = b * B + j;
            int m = mask[s];
            double w = 0;
            if (m) {
                if (weighting == LMHEAD_WEIGHT_NONE) w = 1;
                else if (weighting == LMHEAD_WEIGHT_EXP_DECAY && sfa) w = exp(-(double)j / gamma);
                else if (weighting == LMHEAD_WEIGHT_EXP_DECAY) w = j == 0 ? 0 : exp(-(double)(j - 1) / gamma);
                else {
                    w = all - before;   /* Σ_{k>=j} m_k P_k */
                    P *= (1.0 - alpha) * exp(-(double)row_loss[s]) + alpha;
                    before += P;
                }
                msum += 1;
                lsum += (double)(float)w * row_loss[s];
                atomicAdd(&lmh_counts[j], arg[2 * s] == arg[2 * s + 1]);
                atomicAdd(&lmh_counts[B + j], 1);
            }
            row_weight[s] = (float)w;
        }
    }
    __shared__ double r1[32], r2[32];
    for (int o = 16; o; o >>= 1) {
        lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
        msum += __shfl_xor_sync(0xffffffffu, msum, o);
    }
    if ((threadIdx.x & 31) == 0) { r1[threadIdx.x >> 5] = lsum; r2[threadIdx.x >> 5] = msum; }
    __syncthreads();   /* also orders every shared count update before the writes below */
    for (int j = threadIdx.x; j < B; j += blockDim.x) {
        correct[j] = lmh_counts[j];
        total[j] = lmh_counts[B + j];
    }
    if (threadIdx.x == 0) {
        double L = 0, M = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) { L += r1[w]; M += r2[w]; }
        *loss = (float)(L / (M + 1e-5));
        *msum_out = (float)M;
    }
}

/* One block per row: dz = coef (softmax(z) - P) over the chunk, written over z (bf16); 8 logits per
 * 16-byte load and store, scalar nv % 8 tail. */
__global__ void lmhead_loss_backward_kernel(__nv_bfloat16 *zc, const __nv_bfloat16 *tc, int Vc, int nv, int v0,
                                            int loss_kind, const uint8_t *mask, const float *row_weight,
                                            const float *msum, const float *lse, const int *arg) {
    int s = blockIdx.x;
    float coef = mask[s] ? row_weight[s] / (*msum + 1e-5f) : 0.f;
    __nv_bfloat16 *zr = zc + (size_t)s * Vc;
    const int n8 = nv / 8;
    if (coef == 0.f) {
        for (int c8 = threadIdx.x; c8 < n8; c8 += blockDim.x) *reinterpret_cast<uint4 *>(zr + c8 * 8) = make_uint4(0, 0, 0, 0);
        for (int c = n8 * 8 + threadIdx.x; c < nv; c += blockDim.x) zr[c] = __float2bfloat16_rn(0.f);
        return;
    }
    const float lz = lse[2 * s], lt = lse[2 * s + 1];
    const int tgt = arg[2 * s + 1];
    const bool kl = loss_kind == LMHEAD_LOSS_KL;
    const __nv_bfloat16 *tr = tc + (size_t)s * Vc;
    /* as the forward: the next step's vectors are loaded before this step's store (each thread reads
     * only the logits it overwrites, so the early load never sees another step's dz) */
    uint4 zn = make_uint4(0, 0, 0, 0), tn = make_uint4(0, 0, 0, 0);
    if ((int)threadIdx.x < n8) {
        zn = *reinterpret_cast<const uint4 *>(zr + threadIdx.x * 8);
        if (kl) tn = *reinterpret_cast<const uint4 *>(tr + threadIdx.x * 8);
    }
    for (int c8 = threadIdx.x; c8 < n8; c8 += blockDim.x) {
        uint4 zv = zn, tv = tn;
        if (c8 + (int)blockDim.x < n8) {
            zn = *reinterpret_cast<const uint4 *>(zr + (c8 + blockDim.x) * 8);
            if (kl) tn = *reinterpret_cast<const uint4 *>(tr + (c8 + blockDim.x) * 8);
        }
        __nv_bfloat162 *z2 = (__nv_bfloat162 *)&zv;
        const __nv_bfloat162 *t2 = (const __nv_bfloat162 *)&tv;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 z = __bfloat1622float2(z2[e]), t = __bfloat1622float2(t2[e]);
            int id = v0 + c8 * 8 + 2 * e;
            float p0 = kl ? __expf(t.x - lt) : (float)(id == tgt), p1 = kl ? __expf(t.y - lt) : (float)(id + 1 == tgt);
            z2[e] = __floats2bfloat162_rn(coef * (__expf(z.x - lz) - p0), coef * (__expf(z.y - lz) - p1));
        }
        *reinterpret_cast<uint4 *>(zr + c8 * 8) = zv;
    }
    for (int c = n8 * 8 + threadIdx.x; c < nv; c += blockDim.x) {
        float q = __expf(__bfloat162float(zr[c]) - lz);
        float p = kl ? __expf(__bfloat162float(tr[c]) - lt) : (float)(v0 + c == tgt);
        zr[c] = __float2bfloat16_rn(coef * (q - p));
    }
}

__global__ void lmhead_prune_kernel(const __nv_bfloat16 *full, int D, const int64_t *d2t, __nv_bfloat16 *out) {
    int d = blockIdx.x;
    const __nv_bfloat16 *src = full + (size_t)(d + d2t[d]) * D;
    for (int e = threadIdx.x; e < D; e += blockDim.x) out[(size_t)d * D + e] = src[e];
}

}  // namespace

/* ---------------------------------------------------------------- launchers */

extern "C" int lmhead_loss_ws_init(lmhead_loss_ws **out, const lmhead_loss_config *c, int vocab_chunk) {
    char err[256];
    *out = NULL;
    if (lmhead_loss_check(c, err, sizeof err)) return kernels_fail("lmhead_loss_ws_init: %s", err);
    int Vc = vocab_chunk;
    if (Vc < 0) return kernels_fail("lmhead_loss_ws_init: vocab_chunk=%d, expected 0 (the default plan) or > 0", Vc);
    if (Vc == 0) {   /* the default plan */
        const size_t single = 2 * (size_t)c->N * c->B * (size_t)((c->V + 7) / 8 * 8) * 2;   /* z and t, bf16 */
        Vc = single <= LMHEAD_SINGLE_CHUNK_MAX_BYTES ? c->V : LMHEAD_VOCAB_CHUNK;
    }
    if (Vc >= c->V) Vc = (c->V + 7) / 8 * 8;
    if (Vc % 8) return kernels_fail("lmhead_loss_ws_init: vocab_chunk=%d must be a multiple of 8", Vc);
    lmhead_loss_ws *ws = (lmhead_loss_ws *)calloc(1, sizeof *ws);
    if (!ws) return kernels_fail("lmhead_loss_ws_init: calloc failed");
    ws->R = c->N * c->B; ws->D = c->D; ws->V = c->V; ws->Vc = Vc;
    size_t R = (size_t)ws->R;
    struct { void **p; size_t bytes; } allocs[] = {
        {(void **)&ws->th, R * c->D * 2}, {(void **)&ws->zc, R * Vc * 2}, {(void **)&ws->tc, R * Vc * 2},
        {(void **)&ws->st, R * 6 * 4}, {(void **)&ws->arg, R * 2 * 4}, {(void **)&ws->lse, R * 2 * 4},
        {(void **)&ws->mask, R}, {(void **)&ws->msum, 4}};
    for (size_t i = 0; i < sizeof allocs / sizeof *allocs; i++) {
        cudaError_t e = cudaMalloc(allocs[i].p, allocs[i].bytes);
        if (e != cudaSuccess) {
            lmhead_loss_ws_free(ws);
            return kernels_fail("lmhead_loss_ws_init: cudaMalloc(%zu bytes): %s", allocs[i].bytes, cudaGetErrorString(e));
        }
    }
    *out = ws;
    return 0;
}

extern "C" int lmhead_loss_ws_chunk(const lmhead_loss_ws *ws) { return ws ? ws->Vc : 0; }

extern "C" void lmhead_loss_ws_free(lmhead_loss_ws *ws) {
    if (!ws) return;
    cudaFree(ws->th); cudaFree(ws->zc); cudaFree(ws->tc); cudaFree(ws->st); cudaFree(ws->arg);
    cudaFree(ws->lse); cudaFree(ws->mask); cudaFree(ws->msum);
    free(ws);
}

extern "C" void lmhead_loss_ws_set_all_rows(lmhead_loss_ws *ws, int on) {
    if (ws) ws->all_rows = on != 0;
}

extern "C" void lmhead_loss_ws_rows(const lmhead_loss_ws *ws, const int32_t **d_arg, const uint8_t **d_mask) {
    *d_arg = ws ? (const int32_t *)ws->arg : NULL;
    *d_mask = ws ? ws->mask : NULL;
}

static int lmh_check(lmhead_loss_ws *ws, const lmhead_loss_config *c, const char *who) {
    char err[256];
    if (lmhead_loss_check(c, err, sizeof err)) return kernels_fail("%s: %s", who, err);
    if (!ws || ws->R != c->N * c->B || ws->D != c->D || ws->V != c->V)
        return kernels_fail("%s: workspace was sized for another config (R=%d D=%d V=%d)", who, ws ? ws->R : -1,
                            ws ? ws->D : -1, ws ? ws->V : -1);
    if (c->D % 8) return kernels_fail("%s: D=%d must be a multiple of 8 (cuBLASLt alignment)", who, c->D);
    return 0;
}

extern "C" int lmhead_loss_forward(lmhead_loss_ws *ws, const lmhead_loss_config *c, const bf16 *d_xn,
                                   const bf16 *d_lm_head, const bf16 *d_vlm_head, const float *d_vnorm_w,
                                   const bf16 *d_last, const int32_t *d_anchors, const uint8_t *d_valid,
                                   const uint8_t *d_loss_mask, float *d_loss, float *d_row_loss, float *d_row_weight,
                                   int32_t *d_correct, int32_t *d_total, cudaStream_t stream) {
    return lmhead_loss_forward_mode(ws, c, 0, d_xn, d_lm_head, d_vlm_head, d_vnorm_w, d_last, d_anchors, d_valid,
                                    d_loss_mask, d_loss, d_row_loss, d_row_weight, d_correct, d_total, stream);
}

extern "C" int lmhead_loss_forward_mode(lmhead_loss_ws *ws, const lmhead_loss_config *c, int sample_from_anchor,
                                        const bf16 *d_xn, const bf16 *d_lm_head, const bf16 *d_vlm_head,
                                        const float *d_vnorm_w, const bf16 *d_last, const int32_t *d_anchors,
                                        const uint8_t *d_valid, const uint8_t *d_loss_mask, float *d_loss,
                                        float *d_row_loss, float *d_row_weight, int32_t *d_correct, int32_t *d_total,
                                        cudaStream_t stream) {
    if (lmh_check(ws, c, "lmhead_loss_forward")) return -1;
    const int sfa = sample_from_anchor != 0;
    int R = ws->R, D = c->D, Vc = ws->Vc;
    if ((size_t)c->B * 2 * sizeof(int) > 48 * 1024)
        return kernels_fail("lmhead_loss_forward: B=%d exceeds the weights kernel's shared counters", c->B);
    lmhead_gather_kernel<<<R, 256, 0, stream>>>((const __nv_bfloat16 *)d_last, d_vnorm_w, d_anchors, d_valid,
                                                 d_loss_mask, c->T, c->B, D, c->eps, sfa, ws->th, ws->mask, ws->st,
                                                 ws->arg);
    KERNELS_CHECK_LAUNCH("lmhead_gather_kernel");
    for (int v0 = 0; v0 < c->V; v0 += Vc) {
        int nv = c->V - v0 < Vc ? c->V - v0 : Vc;
        if (blas_matmul(ws->zc, BLAS_BF16, d_xn, 0, d_lm_head + (size_t)v0 * D, 1, NULL, R, nv, D, D, D, Vc, 1.f, 0.f,
                        stream) ||
            blas_matmul(ws->tc, BLAS_BF16, (const bf16 *)ws->th, 0, d_vlm_head + (size_t)v0 * D, 1, NULL, R, nv, D, D,
                        D, Vc, 1.f, 0.f, stream))
            return kernels_fail("lmhead_loss_forward: chunk GEMM at v0=%d: %s", v0, kernels_error());
        lmhead_loss_forward_kernel<<<R, 256, 0, stream>>>(ws->zc, ws->tc, Vc, nv, v0, ws->mask, ws->all_rows, ws->st,
                                                          ws->arg);
        KERNELS_CHECK_LAUNCH("lmhead_loss_forward_kernel");
    }
    lmhead_finalize_kernel<<<(R + 255) / 256, 256, 0, stream>>>(R, c->loss, ws->mask, ws->st, ws->lse, d_row_loss);
    KERNELS_CHECK_LAUNCH("lmhead_finalize_kernel");
    lmhead_weights_kernel<<<1, 256, (size_t)c->B * 2 * sizeof(int), stream>>>(c->N, c->B, c->weighting, c->gamma, c->alpha, sfa, ws->mask, d_row_loss,
                                                 ws->arg, d_row_weight, d_loss, ws->msum, d_correct, d_total);
    KERNELS_CHECK_LAUNCH("lmhead_weights_kernel");
    return 0;
}

extern "C" int lmhead_loss_backward(lmhead_loss_ws *ws, const lmhead_loss_config *c, const bf16 *d_xn,
                                    const bf16 *d_lm_head, const bf16 *d_vlm_head, const float *d_row_weight,
                                    float *d_dxn, cudaStream_t stream) {
    if (lmh_check(ws, c, "lmhead_loss_backward")) return -1;
    int R = ws->R, D = c->D, Vc = ws->Vc;
    int single = Vc >= c->V;   /* the forward's chunk buffers still hold every logit */
    for (int v0 = 0; v0 < c->V; v0 += Vc) {
        int nv = c->V - v0 < Vc ? c->V - v0 : Vc;
        if (!single) {
            if (blas_matmul(ws->zc, BLAS_BF16, d_xn, 0, d_lm_head + (size_t)v0 * D, 1, NULL, R, nv, D, D, D, Vc, 1.f,
                            0.f, stream))
                return kernels_fail("lmhead_loss_backward: z GEMM at v0=%d: %s", v0, kernels_error());
            if (c->loss == LMHEAD_LOSS_KL &&
                blas_matmul(ws->tc, BLAS_BF16, (const bf16 *)ws->th, 0, d_vlm_head + (size_t)v0 * D, 1, NULL, R, nv, D,
                            D, D, Vc, 1.f, 0.f, stream))
                return kernels_fail("lmhead_loss_backward: t GEMM at v0=%d: %s", v0, kernels_error());
        }
        lmhead_loss_backward_kernel<<<R, 256, 0, stream>>>(ws->zc, ws->tc, Vc, nv, v0, c->loss, ws->mask, d_row_weight,
                                                           ws->msum, ws->lse, ws->arg);
        KERNELS_CHECK_LAUNCH("lmhead_loss_backward_kernel");
        /* dxn (+)= dz[R, nv] · lm_head[v0 : v0 + nv, D] */
        if (blas_matmul(d_dxn, BLAS_F32, (const bf16 *)ws->zc, 0, d_lm_head + (size_t)v0 * D, 0, NULL, R, D, nv, Vc, D,
                        D, 1.f, v0 == 0 ? 0.f : 1.f, stream))
            return kernels_fail("lmhead_loss_backward: dx GEMM at v0=%d: %s", v0, kernels_error());
    }
    return 0;
}

extern "C" int lmhead_prune(const bf16 *d_full, int V_t, int D, const int64_t *d_d2t, int V_d, bf16 *d_out,
                            cudaStream_t stream) {
    if (V_t < 1 || V_d < 1 || V_d > V_t || D < 1)
        return kernels_fail("lmhead_prune: need 1 <= V_d=%d <= V_t=%d and D=%d >= 1", V_d, V_t, D);
    lmhead_prune_kernel<<<V_d, 256, 0, stream>>>((const __nv_bfloat16 *)d_full, D, d_d2t, (__nv_bfloat16 *)d_out);
    KERNELS_CHECK_LAUNCH("lmhead_prune_kernel");
    return 0;
}
