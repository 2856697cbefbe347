/*
 * kernels/gated_delta_split.cu — the gated delta rule forward in three phases (kernels/gated_delta.h,
 * gated_delta_forward_split; reference gated_delta_forward_split_ref).
 *
 * Why: gated_delta_forward walks each (document, value head, 64-column tile) through its chunks in one CTA, doing
 * every chunk's A and P products, the RHS, a 64-row forward substitution (one row at a time, a warp per column)
 * and the output inside that sequential walk, on ~670 CTAs of one block per SM for an 8192-token batch of the 27B
 * layout. Here only what truly depends on the previous chunk stays sequential:
 *   gs_table:  the batch's chunks (start row, length) and each document's first chunk, from cu_seqlens on the
 *              device (one thread; a batch has at most T/64 + n_docs chunks);
 *   gs_local:  per (chunk, value head), all chunks at once: G = cumsum g, A = strictly-lower beta e^{G_t−G_s} K Kᵀ,
 *              and the solves W = (I + A)⁻¹ (beta e^G ⊙ K), U0 = (I + A)⁻¹ (beta ⊙ V): one thread per column of
 *              [W | U0], its 64 rows in registers, the substitution fully unrolled (A read by broadcast);
 *   gs_walk:   per (document, value head, 64 value columns), chunk after chunk with the state tile S [d_k, 64] in
 *              shared memory: U = U0 − W·S and o = e^G ⊙ Q·S (4 x 4 register tiles), U back to the workspace, then
 *              S = e^{G_last} S + Σ_s e^{G_last−G_s} k_s ⊗ U_s (8 x 4 tiles);
 *   gs_output: per (chunk, value head, 64 value columns), all chunks at once: P = lower e^{G_t−G_s} Q Kᵀ and
 *              o += P·U.
 * fp32 throughout (CUDA cores), dots over i ascending and the substitution's sum subtracted once, as the reference.
 * The workspace holds, by token row (chunks are disjoint row ranges, so nothing is padded whatever the documents'
 * lengths), G [T, n_v], W [T, n_v, d_k] and U0/U [T, n_v, d_v], and the chunk table (T/64 + n_docs slots).
 */
#include "kernels/gated_delta.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define GS_C GATED_DELTA_CHUNK   /* 64 rows per chunk */
#define GS_VT 64                 /* value columns per CTA of gs_walk / gs_output */
#define GS_THREADS 256           /* 16 x 16 thread grid of the tiled products */
#define GS_SP (GS_VT + 1)        /* row stride of S and U tiles */
#define GS_AP (GS_C + 1)         /* row stride of A and P */

static __host__ __device__ size_t gs_align(size_t b) { return (b + 255) / 256 * 256; }

/* the workspace's regions, from its sizes */
struct gs_ws {
    int32_t *cstart, *clen, *doc0, *nch;
    float *G, *W, *U;
};

static __host__ __device__ int gs_cap(int T, int n_docs) { return T / GS_C + n_docs; }

static __host__ __device__ size_t gs_layout(void *base, int T, int n_docs, int n_v, int d_k, int d_v, gs_ws *w) {
    const size_t nc = (size_t)gs_cap(T, n_docs), rows = (size_t)T;
    size_t off = 0;
    char *p = (char *)base;
    size_t ints = gs_align(4 * (2 * nc + (size_t)n_docs + 2));
    if (w) {
        w->cstart = (int32_t *)(p + off);
        w->clen = w->cstart + nc;
        w->doc0 = w->clen + nc;
        w->nch = w->doc0 + n_docs + 1;
    }
    off += ints;
    if (w) w->G = (float *)(p + off);
    off += gs_align(4 * rows * (size_t)n_v);
    if (w) w->W = (float *)(p + off);
    off += gs_align(4 * rows * (size_t)n_v * d_k);
    if (w) w->U = (float *)(p + off);
    off += gs_align(4 * rows * (size_t)n_v * d_v);
    return off;
}

/* beta and g of row r, value head j (gated_delta_forward_kernel's formulas) */
static __device__ __forceinline__ void gs_beta_g(const __nv_bfloat16 *b, const __nv_bfloat16 *a, size_t r, float an,
                                                 float dtb, float *bb, float *gg) {
    float x = __bfloat162float(b[r]), y = __bfloat162float(a[r]) + dtb;
    *bb = 1.0f / (1.0f + expf(-x));
    *gg = an * (y > 20.0f ? y : log1pf(expf(y)));
}

/* Rows t < n of the chunk at c0 of q and k (key head hk) into Q, K [64][dkp] (Q may be NULL), zero past n. */
static __device__ __forceinline__ void gs_stage_qk(float *Q, float *K, const float *q, const float *k,
                                                   const gated_delta_shape &s, int c0, int n, int hk, int dkp) {
    const int dk = s.d_k;
    for (int idx = threadIdx.x; idx < GS_C * dk; idx += GS_THREADS) {
        int t = idx / dk, i = idx % dk;
        size_t r = (size_t)(c0 + t) * s.qk_stride + (size_t)hk * dk + i;
        if (Q) Q[t * dkp + i] = t < n ? q[r] : 0.0f;
        K[t * dkp + i] = t < n ? k[r] : 0.0f;
    }
}

/* r[x][y] = Σ_i L[t][i] · R[u][i] over i ascending, rows t = ty + 16x, u = tx + 16y of L, R [64][dkp] */
static __device__ __forceinline__ void gs_dots44(float r[4][4], const float *L, const float *R, int dk, int dkp,
                                                 int tx, int ty) {
#pragma unroll
    for (int x = 0; x < 4; x++)
#pragma unroll
        for (int y = 0; y < 4; y++) r[x][y] = 0.0f;
    for (int i = 0; i < dk; i++) {
        float lt[4], ru[4];
#pragma unroll
        for (int x = 0; x < 4; x++) {
            lt[x] = L[(ty + 16 * x) * dkp + i];
            ru[x] = R[(tx + 16 * x) * dkp + i];
        }
#pragma unroll
        for (int x = 0; x < 4; x++)
#pragma unroll
            for (int y = 0; y < 4; y++) r[x][y] += lt[x] * ru[y];
    }
}

/* ---------------------------------------------------------------- the chunk table */

__global__ void gs_table_kernel(const int32_t *cu, int n_docs, int cap, gs_ws w) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int total = 0;
    for (int d = 0; d < n_docs; d++) {
        w.doc0[d] = total;
        const int s0 = cu[d], s1 = cu[d + 1];
        for (int c = s0; c < s1; c += GS_C) {
            if (total < cap) {
                w.cstart[total] = c;
                w.clen[total] = min(GS_C, s1 - c);
            }
            total++;
        }
    }
    w.doc0[n_docs] = min(total, cap);
    *w.nch = min(total, cap);   /* cu_seqlens ending at T never exceed the cap */
}

/* ---------------------------------------------------------------- chunk-local solves */

__global__ void __launch_bounds__(GS_THREADS, 1)   /* ptxas: 255 registers, no spill (128 spilled 228 B) */
gs_local_kernel(const float *k, const float *v, const __nv_bfloat16 *b, const __nv_bfloat16 *a, const float *a_neg,
                const float *dt_bias, gated_delta_shape s, int cap, gs_ws w) {
    extern __shared__ float sm[];
    const int ci = blockIdx.x, j = blockIdx.y;
    if (ci >= *w.nch || ci >= cap) return;
    const int dk = s.d_k, dv = s.d_v, dkp = dk + 1, hk = j / (s.n_v / s.n_k);
    float *K = sm, *A = K + GS_C * dkp, *G = A + GS_C * GS_AP, *B = G + GS_C;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int c0 = w.cstart[ci], n = w.clen[ci];
    gs_stage_qk(NULL, K, NULL, k, s, c0, n, hk, dkp);
    if (tid < GS_C) {
        float bb = 0.0f, gg = 0.0f;
        if (tid < n) gs_beta_g(b, a, (size_t)(c0 + tid) * s.ba_stride + j, a_neg[j], dt_bias[j], &bb, &gg);
        B[tid] = bb;
        G[tid] = gg;
    }
    __syncthreads();
    if (tid == 0)
        for (int t = 1; t < GS_C; t++) G[t] += G[t - 1];
    __syncthreads();
    if (tid < n) w.G[(size_t)(c0 + tid) * s.n_v + j] = G[tid];
    /* A (rows t = ty + 16x, columns u = tx + 16y) */
    {
        float ra[4][4];
        gs_dots44(ra, K, K, dk, dkp, tx, ty);
#pragma unroll
        for (int x = 0; x < 4; x++)
#pragma unroll
            for (int y = 0; y < 4; y++) {
                int t = ty + 16 * x, u = tx + 16 * y;
                A[t * GS_AP + u] = u < t ? B[t] * expf(G[t] - G[u]) * ra[x][y] : 0.0f;
            }
    }
    __syncthreads();
    /* [W | U0] = (I + A)⁻¹ [beta e^G ⊙ K | beta ⊙ V], a column per thread; rows past n have A = 0, rhs = 0 */
    const size_t wrow = (size_t)s.n_v * dk, urow = (size_t)s.n_v * dv;   /* workspace row strides */
    float *Wc = w.W + (size_t)c0 * wrow + (size_t)j * dk, *Uc = w.U + (size_t)c0 * urow + (size_t)j * dv;
    for (int col = tid; col < dk + dv; col += GS_THREADS) {
        float x[GS_C];
        if (col < dk) {
#pragma unroll
            for (int t = 0; t < GS_C; t++) x[t] = B[t] * expf(G[t]) * K[t * dkp + col];
        } else {
            const float *vc = v + (size_t)j * dv + (col - dk);
#pragma unroll
            for (int t = 0; t < GS_C; t++) x[t] = t < n ? B[t] * vc[(size_t)(c0 + t) * s.v_stride] : 0.0f;
        }
#pragma unroll
        for (int t = 1; t < GS_C; t++) {
            float acc = 0.0f;
#pragma unroll
            for (int u = 0; u < t; u++) acc += A[t * GS_AP + u] * x[u];
            x[t] -= acc;
        }
        /* rows past n (zero) are stored over row n - 1 first, which row n - 1 then overwrites: stores without a
         * branch per row (predicated stores made ptxas spill) that never touch the next chunk's rows */
        float *dst = col < dk ? Wc + col : Uc + (col - dk);
        const size_t stride = col < dk ? wrow : urow;
#pragma unroll
        for (int t = GS_C - 1; t >= 0; t--) dst[(size_t)(t < n ? t : n - 1) * stride] = x[t];
    }
}

/* ---------------------------------------------------------------- the walk over a document's chunks */

__global__ void __launch_bounds__(GS_THREADS)
gs_walk_kernel(float *o, const float *q, const float *k, gated_delta_shape s, gs_ws w) {
    extern __shared__ float sm[];
    const int dk = s.d_k, dv = s.d_v, dkp = dk + 1, nvt = (dv + GS_VT - 1) / GS_VT;
    const int j = blockIdx.x / nvt, e0 = (blockIdx.x % nvt) * GS_VT, doc = blockIdx.y;
    const int hk = j / (s.n_v / s.n_k);
    float *S = sm, *Wm = S + dk * GS_SP, *Q = Wm + GS_C * dkp, *K = Q + GS_C * dkp, *U = K + GS_C * dkp;
    float *G = U + GS_C * GS_SP, *D = G + GS_C;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const size_t orow = (size_t)s.n_v * dv;
    for (int i = tid; i < dk * GS_SP; i += GS_THREADS) S[i] = 0.0f;   /* the document starts from zero */
    const int c_end = w.doc0[doc + 1];
    for (int ci = w.doc0[doc]; ci < c_end; ci++) {
        const int c0 = w.cstart[ci], n = w.clen[ci];
        const size_t wrow = (size_t)s.n_v * dk, urow = (size_t)s.n_v * dv;
        const float *Wc = w.W + (size_t)c0 * wrow + (size_t)j * dk;
        float *Uc = w.U + (size_t)c0 * urow + (size_t)j * dv;
        __syncthreads();   /* the previous chunk is done with W, Q, K, U, G, D and wrote S */
        gs_stage_qk(Q, K, q, k, s, c0, n, hk, dkp);
        for (int idx = tid; idx < GS_C * dk; idx += GS_THREADS) {
            int t = idx / dk, i = idx % dk;
            Wm[t * dkp + i] = t < n ? Wc[(size_t)t * wrow + i] : 0.0f;
        }
        for (int idx = tid; idx < GS_C * GS_VT; idx += GS_THREADS) {
            int t = idx / GS_VT, c = idx % GS_VT;
            U[t * GS_SP + c] = t < n && e0 + c < dv ? Uc[(size_t)t * urow + e0 + c] : 0.0f;
        }
        if (tid < GS_C) G[tid] = tid < n ? w.G[(size_t)(c0 + tid) * s.n_v + j] : 0.0f;
        __syncthreads();
        if (tid < GS_C) D[tid] = tid < n ? expf(G[n - 1] - G[tid]) : 0.0f;
        /* U = U0 − W S, o = e^G ⊙ Q S (rows t = ty + 16x, columns c = tx + 16y) */
        {
            float rw[4][4] = {}, rq[4][4] = {};
            for (int i = 0; i < dk; i++) {
                float wt[4], qt[4], sv[4];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    wt[x] = Wm[(ty + 16 * x) * dkp + i];
                    qt[x] = Q[(ty + 16 * x) * dkp + i];
                    sv[x] = S[i * GS_SP + tx + 16 * x];
                }
#pragma unroll
                for (int x = 0; x < 4; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        rw[x][y] += wt[x] * sv[y];
                        rq[x][y] += qt[x] * sv[y];
                    }
            }
#pragma unroll
            for (int x = 0; x < 4; x++) {
                int t = ty + 16 * x;
                float eg = expf(G[t]);
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    int c = tx + 16 * y, e = e0 + c;
                    float *u = &U[t * GS_SP + c];   /* this thread's own entry: U0 -> U */
                    *u -= rw[x][y];
                    if (e < dv && t < n) {
                        Uc[(size_t)t * urow + e] = *u;   /* for gs_output */
                        o[(size_t)(c0 + t) * orow + (size_t)j * dv + e] = eg * rq[x][y];
                    }
                }
            }
        }
        __syncthreads();   /* U and D complete; every read of S this chunk is done */
        /* S = e^{G_last} S + Σ_s D_s k_s ⊗ U_s (rows i = ty + 16x, x < 8; columns tx + 16y) */
        {
            const float gl = expf(G[n - 1]);
            float rs[8][4] = {};
            for (int u = 0; u < n; u++) {
                const float d = D[u];
                float kk[8], uu[4];
#pragma unroll
                for (int x = 0; x < 8; x++) {
                    int i = ty + 16 * x;
                    kk[x] = i < dk ? d * K[u * dkp + i] : 0.0f;
                }
#pragma unroll
                for (int y = 0; y < 4; y++) uu[y] = U[u * GS_SP + tx + 16 * y];
#pragma unroll
                for (int x = 0; x < 8; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++) rs[x][y] += kk[x] * uu[y];
            }
#pragma unroll
            for (int x = 0; x < 8; x++) {
                int i = ty + 16 * x;
                if (i >= dk) continue;
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    float *sp = &S[i * GS_SP + tx + 16 * y];
                    *sp = gl * *sp + rs[x][y];
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- the intra-chunk output */

__global__ void __launch_bounds__(GS_THREADS)
gs_output_kernel(float *o, const float *q, const float *k, gated_delta_shape s, int cap, gs_ws w) {
    extern __shared__ float sm[];
    const int ci = blockIdx.x;
    if (ci >= *w.nch || ci >= cap) return;
    const int dk = s.d_k, dv = s.d_v, dkp = dk + 1, nvt = (dv + GS_VT - 1) / GS_VT;
    const int j = blockIdx.y / nvt, e0 = (blockIdx.y % nvt) * GS_VT, hk = j / (s.n_v / s.n_k);
    float *Q = sm, *K = Q + GS_C * dkp, *P = K + GS_C * dkp, *U = P + GS_C * GS_AP, *G = U + GS_C * GS_SP;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int c0 = w.cstart[ci], n = w.clen[ci];
    const size_t orow = (size_t)s.n_v * dv, urow = (size_t)s.n_v * dv;
    const float *Uc = w.U + (size_t)c0 * urow + (size_t)j * dv;
    gs_stage_qk(Q, K, q, k, s, c0, n, hk, dkp);
    for (int idx = tid; idx < GS_C * GS_VT; idx += GS_THREADS) {
        int t = idx / GS_VT, c = idx % GS_VT;
        U[t * GS_SP + c] = t < n && e0 + c < dv ? Uc[(size_t)t * urow + e0 + c] : 0.0f;
    }
    if (tid < GS_C) G[tid] = tid < n ? w.G[(size_t)(c0 + tid) * s.n_v + j] : 0.0f;
    __syncthreads();
    {
        float rp[4][4];
        gs_dots44(rp, Q, K, dk, dkp, tx, ty);
#pragma unroll
        for (int x = 0; x < 4; x++)
#pragma unroll
            for (int y = 0; y < 4; y++) {
                int t = ty + 16 * x, u = tx + 16 * y;
                P[t * GS_AP + u] = u <= t ? expf(G[t] - G[u]) * rp[x][y] : 0.0f;
            }
    }
    __syncthreads();
    float ro[4][4] = {};
    for (int u = 0; u < n; u++) {
        float pt[4], uu[4];
#pragma unroll
        for (int x = 0; x < 4; x++) {
            pt[x] = P[(ty + 16 * x) * GS_AP + u];
            uu[x] = U[u * GS_SP + tx + 16 * x];
        }
#pragma unroll
        for (int x = 0; x < 4; x++)
#pragma unroll
            for (int y = 0; y < 4; y++) ro[x][y] += pt[x] * uu[y];
    }
#pragma unroll
    for (int x = 0; x < 4; x++) {
        int t = ty + 16 * x;
        if (t >= n) continue;
#pragma unroll
        for (int y = 0; y < 4; y++) {
            int e = e0 + tx + 16 * y;
            if (e < dv) o[(size_t)(c0 + t) * orow + (size_t)j * dv + e] += ro[x][y];
        }
    }
}

/* ---------------------------------------------------------------- launcher */

static int gs_smem(const void *fn, size_t bytes, const char *name) {
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) != cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        return kernels_fail("gated_delta_forward_split: %s: %zu bytes of shared memory refused: %s", name, bytes,
                            cudaGetErrorString(e));
    }
    return 0;
}

extern "C" int gated_delta_forward_split(float *o, const float *q, const float *k, const float *v, const bf16 *b,
                                         const bf16 *a, const float *a_neg, const float *dt_bias,
                                         const int32_t *cu_seqlens, const struct gated_delta_shape *s, void *workspace,
                                         size_t workspace_bytes, cudaStream_t stream) {
    char why[256];
    if (gated_delta_check_shape(s->n_k, s->n_v, s->d_k, s->d_v, why, sizeof why))
        return kernels_fail("gated_delta_forward_split: %s", why);
    if (s->T < 0 || s->n_docs < 1 || s->qk_stride < s->n_k * s->d_k || s->v_stride < s->n_v * s->d_v ||
        s->ba_stride < s->n_v)
        return kernels_fail("gated_delta_forward_split: bad sizes T=%d n_docs=%d or strides qk %d / v %d / ba %d below "
                            "the row widths %d / %d / %d", s->T, s->n_docs, s->qk_stride, s->v_stride, s->ba_stride,
                            s->n_k * s->d_k, s->n_v * s->d_v, s->n_v);
    if (s->n_docs > 65535) return kernels_fail("gated_delta_forward_split: %d documents, at most 65535 per call", s->n_docs);
    const size_t need = gated_delta_split_workspace_bytes(s->T, s->n_docs, s);
    if (need != gs_layout(NULL, s->T, s->n_docs, s->n_v, s->d_k, s->d_v, NULL))
        return kernels_fail("gated_delta_forward_split: gated_delta_split_workspace_bytes (%zu) disagrees with the "
                            "kernels' layout (%zu)", need, gs_layout(NULL, s->T, s->n_docs, s->n_v, s->d_k, s->d_v, NULL));
    if (!workspace || workspace_bytes < need || ((uintptr_t)workspace & 255))
        return kernels_fail("gated_delta_forward_split: a workspace of %zu bytes at a 256-byte boundary is needed for "
                            "%d tokens in %d documents (given %zu at %p)", need, s->T, s->n_docs, workspace_bytes,
                            workspace);
    if (s->T == 0) return 0;
    const int dk = s->d_k, dkp = dk + 1, cap = gs_cap(s->T, s->n_docs), nvt = (s->d_v + GS_VT - 1) / GS_VT;
    gs_ws w;
    gs_layout(workspace, s->T, s->n_docs, s->n_v, s->d_k, s->d_v, &w);
    const size_t sm_local = 4 * ((size_t)GS_C * dkp + GS_C * GS_AP + 2 * GS_C);
    const size_t sm_walk = 4 * ((size_t)dk * GS_SP + 3 * GS_C * dkp + GS_C * GS_SP + 2 * GS_C);
    const size_t sm_out = 4 * (2 * (size_t)GS_C * dkp + GS_C * GS_AP + GS_C * GS_SP + GS_C);
    if (gs_smem((const void *)gs_local_kernel, sm_local, "gs_local") ||
        gs_smem((const void *)gs_walk_kernel, sm_walk, "gs_walk") ||
        gs_smem((const void *)gs_output_kernel, sm_out, "gs_output"))
        return -1;
    gs_table_kernel<<<1, 32, 0, stream>>>(cu_seqlens, s->n_docs, cap, w);
    KERNELS_CHECK_LAUNCH("gated_delta_forward_split (table)");
    gs_local_kernel<<<dim3((unsigned)cap, (unsigned)s->n_v), GS_THREADS, sm_local, stream>>>(
        k, v, (const __nv_bfloat16 *)b, (const __nv_bfloat16 *)a, a_neg, dt_bias, *s, cap, w);
    KERNELS_CHECK_LAUNCH("gated_delta_forward_split (local)");
    gs_walk_kernel<<<dim3((unsigned)(s->n_v * nvt), (unsigned)s->n_docs), GS_THREADS, sm_walk, stream>>>(o, q, k, *s,
                                                                                                          w);
    KERNELS_CHECK_LAUNCH("gated_delta_forward_split (walk)");
    gs_output_kernel<<<dim3((unsigned)cap, (unsigned)(s->n_v * nvt)), GS_THREADS, sm_out, stream>>>(o, q, k, *s, cap,
                                                                                                     w);
    KERNELS_CHECK_LAUNCH("gated_delta_forward_split (output)");
    return 0;
}
