/*
 * kernels/gated_delta.cu — the chunked gated delta rule forward (kernels/gated_delta.h).
 *
 * One CTA of 256 threads per (value-column tile of 64, value head, document); it walks its
 * document's chunks of 64 tokens in order, the state tile S [d_k, 64] staying in shared memory
 * (fp32) across chunks. Per chunk:
 *   1. stage K, Q [64, d_k] fp32 (rows past the document end zero), V's 64 columns, beta, g, and
 *      G = cumsum g (padding rows add 0, so G[t >= n] = G[n-1] and their decay weights vanish);
 *   2. register-tiled products (each thread a 4 x 4 tile, rows ty + 16a, columns tx + 16b, so a
 *      warp's shared-memory reads hit distinct banks or broadcast):
 *        A = strictly-lower beta_t e^{G_t-G_s} K Kᵀ,  P = lower e^{G_t-G_s} Q Kᵀ,
 *        RHS = beta ⊙ (V − e^G ⊙ K S)  (into U),   O = e^G ⊙ Q S  (registers);
 *   3. forward substitution U = (I + A)⁻¹ RHS, row by row, 4 lanes of one warp per value column
 *      (only __syncwarp between rows);
 *   4. o = O + P U (4 x 4 tiles), and S = e^{G_last} S + Σ_s e^{G_last−G_s} k_s ⊗ U_s (8 x 4 tiles).
 * Chunks restart at each document start, so a document never reads another's rows and its state
 * starts from zero. Allocates nothing; ~150 KB of shared memory at d_k = 128 (opt-in above 48 KB).
 * fp32 FMAs on the CUDA cores (kernels/bench/gated_delta_bench.cu also times an untiled form).
 * The decode step (gated_delta_decode) is the per-token recurrence from a slot's state: a step has few rows
 * per sequence, where the chunked form's set-up would dominate.
 */
#include "kernels/gated_delta.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define GD_C GATED_DELTA_CHUNK   /* 64 */
#define GD_VT 64                 /* value columns per CTA */
#define GD_THREADS 256           /* 16 x 16 thread grid for the tiled products */
#define GD_SP (GD_VT + 1)        /* row stride of S and U */
#define GD_AP (GD_C + 1)         /* row stride of A and P */

/* shared-memory layout (floats); dkp = d_k + 1 (odd: row-strided reads hit distinct banks) */
struct gd_smem {
    int dkp, s_off, k_off, q_off, a_off, p_off, u_off, g_off, b_off, w_off, total;
};

static __host__ __device__ gd_smem gd_layout(int dk) {
    gd_smem m;
    m.dkp = dk + 1;
    m.s_off = 0;                              /* S [dk][GD_SP] */
    m.k_off = m.s_off + dk * GD_SP;           /* K [GD_C][dkp] */
    m.q_off = m.k_off + GD_C * m.dkp;         /* Q [GD_C][dkp] */
    m.a_off = m.q_off + GD_C * m.dkp;         /* A [GD_C][GD_AP] */
    m.p_off = m.a_off + GD_C * GD_AP;         /* P [GD_C][GD_AP] */
    m.u_off = m.p_off + GD_C * GD_AP;         /* U [GD_C][GD_SP]: V, then RHS, then the new values */
    m.g_off = m.u_off + GD_C * GD_SP;         /* G [GD_C] */
    m.b_off = m.g_off + GD_C;                 /* beta [GD_C] */
    m.w_off = m.b_off + GD_C;                 /* exp(G_last − G_s), 0 past the document end [GD_C] */
    m.total = m.w_off + GD_C;
    return m;
}

/* ---------------------------------------------------------------- kernels */

__global__ void __launch_bounds__(GD_THREADS)
gated_delta_forward_kernel(float *o, const float *q, const float *k, const float *v, const __nv_bfloat16 *b,
                           const __nv_bfloat16 *a, const float *a_neg, const float *dt_bias,
                           const int32_t *cu_seqlens, gated_delta_shape s) {
    extern __shared__ float sm[];
    const int dk = s.d_k, dv = s.d_v, nvt = (dv + GD_VT - 1) / GD_VT;
    const int j = blockIdx.x / nvt, e0 = (blockIdx.x % nvt) * GD_VT, doc = blockIdx.y;
    const int hk = j / (s.n_v / s.n_k);
    const gd_smem m = gd_layout(dk);
    const int dkp = m.dkp;
    float *S = sm + m.s_off, *K = sm + m.k_off, *Q = sm + m.q_off, *A = sm + m.a_off, *P = sm + m.p_off;
    float *U = sm + m.u_off, *G = sm + m.g_off, *B = sm + m.b_off, *W = sm + m.w_off;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const float an = a_neg[j], dtb = dt_bias[j];
    const int s0 = cu_seqlens[doc], s1 = cu_seqlens[doc + 1];
    const size_t orow = (size_t)s.n_v * dv;

    for (int i = tid; i < dk * GD_SP; i += GD_THREADS) S[i] = 0.0f;   /* the document starts from zero */
    for (int c0 = s0; c0 < s1; c0 += GD_C) {
        const int n = min(GD_C, s1 - c0);
        __syncthreads();   /* the previous chunk is done with K, Q, A, P, U, G, W and wrote S */
        for (int idx = tid; idx < GD_C * dk; idx += GD_THREADS) {
            int t = idx / dk, i = idx % dk;
            float kv = 0.0f, qv = 0.0f;
            if (t < n) {
                size_t r = (size_t)(c0 + t) * s.qk_stride + (size_t)hk * dk + i;
                kv = k[r];
                qv = q[r];
            }
            K[t * dkp + i] = kv;
            Q[t * dkp + i] = qv;
        }
        for (int idx = tid; idx < GD_C * GD_VT; idx += GD_THREADS) {
            int t = idx / GD_VT, c = idx % GD_VT;
            U[t * GD_SP + c] = t < n && e0 + c < dv ? v[(size_t)(c0 + t) * s.v_stride + (size_t)j * dv + e0 + c] : 0.0f;
        }
        if (tid < GD_C) {
            float bb = 0.0f, gg = 0.0f;
            if (tid < n) {
                size_t r = (size_t)(c0 + tid) * s.ba_stride + j;
                float x = __bfloat162float(b[r]), y = __bfloat162float(a[r]) + dtb;
                bb = 1.0f / (1.0f + expf(-x));
                gg = an * (y > 20.0f ? y : log1pf(expf(y)));
            }
            B[tid] = bb;
            G[tid] = gg;
        }
        __syncthreads();
        if (tid == 0)
            for (int t = 1; t < GD_C; t++) G[t] += G[t - 1];
        __syncthreads();
        if (tid < GD_C) W[tid] = tid < n ? expf(G[n - 1] - G[tid]) : 0.0f;

        /* ---- A, P (rows t = ty + 16x, columns u = tx + 16y) */
        {
            float ra[4][4] = {}, rp[4][4] = {};
            for (int i = 0; i < dk; i++) {
                float kt[4], qt[4], ku[4];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    kt[x] = K[(ty + 16 * x) * dkp + i];
                    qt[x] = Q[(ty + 16 * x) * dkp + i];
                    ku[x] = K[(tx + 16 * x) * dkp + i];
                }
#pragma unroll
                for (int x = 0; x < 4; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        ra[x][y] += kt[x] * ku[y];
                        rp[x][y] += qt[x] * ku[y];
                    }
            }
#pragma unroll
            for (int x = 0; x < 4; x++)
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    int t = ty + 16 * x, u = tx + 16 * y;
                    float dec = u <= t ? expf(G[t] - G[u]) : 0.0f;
                    A[t * GD_AP + u] = u < t ? B[t] * dec * ra[x][y] : 0.0f;
                    P[t * GD_AP + u] = dec * rp[x][y];
                }
        }
        /* ---- K S and Q S against the state at the chunk start (rows t = ty + 16x, columns c = tx + 16y) */
        float oi[4][4];
        {
            float rk[4][4] = {}, rq[4][4] = {};
            for (int i = 0; i < dk; i++) {
                float kt[4], qt[4], sv[4];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    kt[x] = K[(ty + 16 * x) * dkp + i];
                    qt[x] = Q[(ty + 16 * x) * dkp + i];
                    sv[x] = S[i * GD_SP + tx + 16 * x];
                }
#pragma unroll
                for (int x = 0; x < 4; x++)
#pragma unroll
                    for (int y = 0; y < 4; y++) {
                        rk[x][y] += kt[x] * sv[y];
                        rq[x][y] += qt[x] * sv[y];
                    }
            }
#pragma unroll
            for (int x = 0; x < 4; x++) {
                int t = ty + 16 * x;
                float eg = expf(G[t]);
#pragma unroll
                for (int y = 0; y < 4; y++) {
                    float *u = &U[t * GD_SP + tx + 16 * y];   /* this thread's own entry: V -> RHS */
                    *u = B[t] * (*u - eg * rk[x][y]);
                    oi[x][y] = eg * rq[x][y];
                }
            }
        }
        __syncthreads();   /* A and the RHS complete */

        /* ---- U = (I + A)⁻¹ RHS: 4 lanes (one warp) per column, rows in order */
        {
            const int col = tid >> 2, part = tid & 3;
            for (int t = 1; t < n; t++) {
                float acc = 0.0f;
                for (int u = part; u < t; u += 4) acc += A[t * GD_AP + u] * U[u * GD_SP + col];
                acc += __shfl_xor_sync(0xffffffffu, acc, 1);
                acc += __shfl_xor_sync(0xffffffffu, acc, 2);
                if (part == 0) U[t * GD_SP + col] -= acc;
                __syncwarp();
            }
        }
        __syncthreads();   /* U complete */

        /* ---- o = O + P U (P is zero above the diagonal and past n; U is zero past n) */
        {
            float ro[4][4] = {};
            for (int u = 0; u < n; u++) {
                float pt[4], uu[4];
#pragma unroll
                for (int x = 0; x < 4; x++) {
                    pt[x] = P[(ty + 16 * x) * GD_AP + u];
                    uu[x] = U[u * GD_SP + tx + 16 * x];
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
                    if (e < dv) o[(size_t)(c0 + t) * orow + (size_t)j * dv + e] = oi[x][y] + ro[x][y];
                }
            }
        }
        /* ---- S = e^{G_last} S + Σ_s W_s k_s ⊗ U_s (rows i = ty + 16x, x < 8; columns tx + 16y).
         * Every read of S this chunk happened before the last __syncthreads; each thread writes
         * only its own entries. */
        {
            const float gl = expf(G[n - 1]);
            float rs[8][4] = {};
            for (int u = 0; u < n; u++) {
                const float w = W[u];
                float kk[8], uu[4];
#pragma unroll
                for (int x = 0; x < 8; x++) {
                    int i = ty + 16 * x;
                    kk[x] = i < dk ? w * K[u * dkp + i] : 0.0f;
                }
#pragma unroll
                for (int y = 0; y < 4; y++) uu[y] = U[u * GD_SP + tx + 16 * y];
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
                    float *sp = &S[i * GD_SP + tx + 16 * y];
                    *sp = gl * *sp + rs[x][y];
                }
            }
        }
    }
}

#define GDD_MAX_DV 256   /* threads per decode CTA at most: a thread's column of S stays in its 255 registers */

/* The decode step: CTA (value head j, sequence i), thread e owns value column e of S [d_k, d_v] in registers
 * (GATED_DELTA_MAX_DK floats, loops unrolled to that bound and guarded by d_k), the sequence's rows in order; q
 * and k of the row staged in shared memory. Per row: S *= decay; m = Sᵀk (column e); S += k·beta(v − m);
 * o = Sᵀq. Every sum over i ascending in fp32. */
__global__ void __launch_bounds__(GDD_MAX_DV)
gated_delta_decode_kernel(float *o, const float *q, const float *k, const float *v, const __nv_bfloat16 *b,
                          const __nv_bfloat16 *a, const float *a_neg, const float *dt_bias, const int32_t *cu,
                          const int32_t *seq_slot, const int32_t *seq_pos, gated_delta_shape s, float *state,
                          float *snap, int n_snap) {
    __shared__ float sk[GATED_DELTA_MAX_DK], sq[GATED_DELTA_MAX_DK];
    const int j = blockIdx.x, seq = blockIdx.y, e = threadIdx.x, dk = s.d_k, dv = s.d_v;
    const int hk = j / (s.n_v / s.n_k), slot = seq_slot[seq], r0 = cu[seq], r1 = cu[seq + 1];
    const bool live = e < dv;
    const size_t SS = (size_t)s.n_v * dk * dv, head = (size_t)j * dk * dv + (size_t)(live ? e : 0);
    float *st = state + (size_t)slot * SS + head;
    float S[GATED_DELTA_MAX_DK];
#pragma unroll
    for (int i = 0; i < GATED_DELTA_MAX_DK; i++) S[i] = live && i < dk ? st[(size_t)i * dv] : 0.0f;
    const float an = a_neg[j], dtb = dt_bias[j];
    for (int r = r0; r < r1; r++) {
        __syncthreads();   /* the previous row's q, k are read by every thread */
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            sk[i] = k[(size_t)r * s.qk_stride + (size_t)hk * dk + i];
            sq[i] = q[(size_t)r * s.qk_stride + (size_t)hk * dk + i];
        }
        __syncthreads();
        const float beta = 1.0f / (1.0f + expf(-__bfloat162float(b[(size_t)r * s.ba_stride + j])));
        const float x = __bfloat162float(a[(size_t)r * s.ba_stride + j]) + dtb;
        const float decay = expf(an * (x > 20.0f ? x : log1pf(expf(x))));
        float m = 0.0f;
#pragma unroll
        for (int i = 0; i < GATED_DELTA_MAX_DK; i++)
            if (i < dk) {
                S[i] *= decay;
                m += S[i] * sk[i];
            }
        const float delta = ((live ? v[(size_t)r * s.v_stride + (size_t)j * dv + e] : 0.0f) - m) * beta;
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < GATED_DELTA_MAX_DK; i++)
            if (i < dk) {
                S[i] += sk[i] * delta;
                acc += S[i] * sq[i];
            }
        if (!live) continue;
        o[(size_t)r * s.n_v * dv + (size_t)j * dv + e] = acc;
        if (n_snap > 0 && r >= r1 - n_snap) {
            const int p = seq_pos[seq] + (r - r0);
            float *sn = snap + ((size_t)slot * n_snap + (size_t)(p % n_snap)) * SS + head;
#pragma unroll
            for (int i = 0; i < GATED_DELTA_MAX_DK; i++)
                if (i < dk) sn[(size_t)i * dv] = S[i];
        }
    }
    if (live)
#pragma unroll
        for (int i = 0; i < GATED_DELTA_MAX_DK; i++)
            if (i < dk) st[(size_t)i * dv] = S[i];
}

/* ---------------------------------------------------------------- launchers */

extern "C" int gated_delta_decode(float *o, const float *q, const float *k, const float *v, const bf16 *b,
                                  const bf16 *a, const float *a_neg, const float *dt_bias, const int32_t *cu,
                                  const int32_t *seq_slot, const int32_t *seq_pos, const struct gated_delta_shape *s,
                                  float *state, float *snap, int n_snap, cudaStream_t stream) {
    char why[256];
    if (gated_delta_check_shape(s->n_k, s->n_v, s->d_k, s->d_v, why, sizeof why))
        return kernels_fail("gated_delta_decode: %s", why);
    if (s->T < 1 || s->n_docs < 1 || s->n_docs > 65535 || s->d_v > GDD_MAX_DV || n_snap < 0 ||
        s->qk_stride < s->n_k * s->d_k || s->v_stride < s->n_v * s->d_v || s->ba_stride < s->n_v)
        return kernels_fail("gated_delta_decode: bad sizes T=%d sequences=%d d_v=%d n_snap=%d or strides qk %d / v %d "
                            "/ ba %d below the row widths %d / %d / %d (need 1..65535 sequences, d_v <= %d)", s->T,
                            s->n_docs, s->d_v, n_snap, s->qk_stride, s->v_stride, s->ba_stride, s->n_k * s->d_k,
                            s->n_v * s->d_v, s->n_v, GDD_MAX_DV);
    const int threads = (s->d_v + 31) / 32 * 32;
    gated_delta_decode_kernel<<<dim3((unsigned)s->n_v, (unsigned)s->n_docs), threads, 0, stream>>>(
        o, q, k, v, (const __nv_bfloat16 *)b, (const __nv_bfloat16 *)a, a_neg, dt_bias, cu, seq_slot, seq_pos, *s,
        state, snap, n_snap);
    KERNELS_CHECK_LAUNCH("gated_delta_decode");
    return 0;
}

extern "C" int gated_delta_forward(float *o, const float *q, const float *k, const float *v, const bf16 *b,
                                   const bf16 *a, const float *a_neg, const float *dt_bias, const int32_t *cu_seqlens,
                                   const struct gated_delta_shape *s, cudaStream_t stream) {
    char why[256];
    if (gated_delta_check_shape(s->n_k, s->n_v, s->d_k, s->d_v, why, sizeof why))
        return kernels_fail("gated_delta_forward: %s", why);
    if (s->T < 0 || s->n_docs < 1 || s->qk_stride < s->n_k * s->d_k || s->v_stride < s->n_v * s->d_v ||
        s->ba_stride < s->n_v)
        return kernels_fail("gated_delta_forward: bad sizes T=%d n_docs=%d or strides qk %d / v %d / ba %d below the "
                            "row widths %d / %d / %d", s->T, s->n_docs, s->qk_stride, s->v_stride, s->ba_stride,
                            s->n_k * s->d_k, s->n_v * s->d_v, s->n_v);
    if (s->n_docs > 65535) return kernels_fail("gated_delta_forward: %d documents, at most 65535 per call", s->n_docs);
    if (s->T == 0) return 0;
    const gd_smem m = gd_layout(s->d_k);
    const size_t smem = (size_t)m.total * sizeof(float);
    if (cudaFuncSetAttribute(gated_delta_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess) {
        cudaError_t e = cudaGetLastError();
        return kernels_fail("gated_delta_forward: %zu bytes of shared memory refused: %s", smem, cudaGetErrorString(e));
    }
    const int nvt = (s->d_v + GD_VT - 1) / GD_VT;
    dim3 grid((unsigned)(s->n_v * nvt), (unsigned)s->n_docs);
    gated_delta_forward_kernel<<<grid, GD_THREADS, smem, stream>>>(o, q, k, v, (const __nv_bfloat16 *)b,
                                                                   (const __nv_bfloat16 *)a, a_neg, dt_bias, cu_seqlens,
                                                                   *s);
    KERNELS_CHECK_LAUNCH("gated_delta_forward");
    return 0;
}
