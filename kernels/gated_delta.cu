/*
 * kernels/gated_delta.cu — the chunked gated delta rule forward (kernels/gated_delta.h).
 *
 * One CTA of 256 threads per (value-column tile of 32, value head, document); it walks its
 * document's chunks of 64 tokens in order, the state tile S [d_k, 32] staying in shared memory
 * (fp32) across chunks. Per chunk:
 *   1. stage K, Q [n, d_k] fp32, V's 32 columns, beta and g (from the bf16 b / a), G = cumsum g;
 *   2. every thread: entries of A (strictly lower) and P (lower incl. diagonal), one d_k dot each;
 *   3. per value column, a group of 8 lanes in one warp (so only __syncwarp orders the column's
 *      work): RHS = beta (v − e^G K S), the inter-chunk output e^G Q S, the forward substitution
 *      U = (I + A)⁻¹ RHS row by row, o = inter + P U, and S = e^{G_last} S + Σ_s e^{G_last−G_s} k_s U_s.
 * Chunks restart at each document start, so a document never reads another's rows and the state
 * starts from zero. Allocates nothing; shared memory ~135 KB at d_k = 128 (opt-in above 48 KB).
 * CUDA cores only, fp32 FMAs: correctness first; the tensor-core version is a later step.
 */
#include "kernels/gated_delta.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define GD_C GATED_DELTA_CHUNK
#define GD_VT 32                 /* value columns per CTA */
#define GD_LANES 8               /* threads per value column */
#define GD_THREADS (GD_VT * GD_LANES)

/* shared-memory layout (floats), dkp = d_k + 1 (odd row stride: row-strided reads hit distinct banks) */
struct gd_smem {
    int dkp, s_off, k_off, q_off, a_off, p_off, u_off, o_off, g_off, b_off, w_off, total;
};

static __host__ __device__ gd_smem gd_layout(int dk) {
    gd_smem m;
    m.dkp = dk + 1;
    m.s_off = 0;                                  /* S [dk][GD_VT + 1] */
    m.k_off = m.s_off + dk * (GD_VT + 1);         /* K [GD_C][dkp] */
    m.q_off = m.k_off + GD_C * m.dkp;             /* Q [GD_C][dkp] */
    m.a_off = m.q_off + GD_C * m.dkp;             /* A [GD_C][GD_C + 1] */
    m.p_off = m.a_off + GD_C * (GD_C + 1);        /* P [GD_C][GD_C + 1] */
    m.u_off = m.p_off + GD_C * (GD_C + 1);        /* U [GD_C][GD_VT + 1] */
    m.o_off = m.u_off + GD_C * (GD_VT + 1);       /* O (inter-chunk part) [GD_C][GD_VT + 1] */
    m.g_off = m.o_off + GD_C * (GD_VT + 1);       /* G [GD_C] */
    m.b_off = m.g_off + GD_C;                     /* beta [GD_C] */
    m.w_off = m.b_off + GD_C;                     /* exp(G_last - G_s) [GD_C] */
    m.total = m.w_off + GD_C;
    return m;
}

/* ---------------------------------------------------------------- kernels */

__device__ __forceinline__ float gd_group_sum(float x) {
    /* the 8 lanes of a column group are consecutive lanes of one warp */
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x;
}

__global__ void __launch_bounds__(GD_THREADS)
gated_delta_forward_kernel(float *o, const float *q, const float *k, const float *v, const __nv_bfloat16 *b,
                           const __nv_bfloat16 *a, const float *a_neg, const float *dt_bias,
                           const int32_t *cu_seqlens, gated_delta_shape s) {
    extern __shared__ float sm[];
    const int dk = s.d_k, dv = s.d_v, nvt = (dv + GD_VT - 1) / GD_VT;
    const int j = blockIdx.x / nvt, e0 = (blockIdx.x % nvt) * GD_VT, doc = blockIdx.y;
    const int hk = j / (s.n_v / s.n_k);
    const gd_smem m = gd_layout(dk);
    float *S = sm + m.s_off, *K = sm + m.k_off, *Q = sm + m.q_off, *A = sm + m.a_off, *P = sm + m.p_off;
    float *U = sm + m.u_off, *O = sm + m.o_off, *G = sm + m.g_off, *B = sm + m.b_off, *W = sm + m.w_off;
    const int tid = threadIdx.x, col = tid / GD_LANES, lane = tid % GD_LANES, e = e0 + col;
    const int SP = GD_VT + 1, AP = GD_C + 1;
    const float an = a_neg[j], dtb = dt_bias[j];
    const int s0 = cu_seqlens[doc], s1 = cu_seqlens[doc + 1];

    for (int i = tid; i < dk * SP; i += GD_THREADS) S[i] = 0.0f;   /* the document starts from zero */
    for (int c0 = s0; c0 < s1; c0 += GD_C) {
        const int n = min(GD_C, s1 - c0);
        __syncthreads();   /* the previous chunk's readers of K, Q, A, P, G are done */
        for (int idx = tid; idx < n * dk; idx += GD_THREADS) {
            int t = idx / dk, i = idx % dk;
            size_t r = (size_t)(c0 + t) * s.qk_stride + (size_t)hk * dk + i;
            K[t * m.dkp + i] = k[r];
            Q[t * m.dkp + i] = q[r];
        }
        for (int idx = tid; idx < n * GD_VT; idx += GD_THREADS) {
            int t = idx / GD_VT, c = idx % GD_VT;
            U[t * SP + c] = e0 + c < dv ? v[(size_t)(c0 + t) * s.v_stride + (size_t)j * dv + e0 + c] : 0.0f;
        }
        if (tid < n) {
            size_t r = (size_t)(c0 + tid) * s.ba_stride + j;
            float bb = __bfloat162float(b[r]), aa = __bfloat162float(a[r]) + dtb;
            B[tid] = 1.0f / (1.0f + expf(-bb));
            G[tid] = an * (aa > 20.0f ? aa : log1pf(expf(aa)));
        }
        __syncthreads();
        if (tid == 0)
            for (int t = 1; t < n; t++) G[t] += G[t - 1];
        __syncthreads();
        if (tid < n) W[tid] = expf(G[n - 1] - G[tid]);
        for (int idx = tid; idx < n * n; idx += GD_THREADS) {
            int t = idx / n, u = idx % n;
            if (u > t) continue;
            const float *kt = K + t * m.dkp, *qt = Q + t * m.dkp, *ku = K + u * m.dkp;
            float kk = 0.0f, qk = 0.0f;
            for (int i = 0; i < dk; i++) { kk += kt[i] * ku[i]; qk += qt[i] * ku[i]; }
            float dec = expf(G[t] - G[u]);
            A[t * AP + u] = u < t ? B[t] * dec * kk : 0.0f;
            P[t * AP + u] = dec * qk;
        }
        __syncthreads();
        /* ---- per value column: 8 lanes of one warp; S, U and O columns are private to the group */
        for (int t = 0; t < n; t++) {
            const float *kt = K + t * m.dkp, *qt = Q + t * m.dkp;
            float ks = 0.0f, qs = 0.0f;
            for (int i = lane; i < dk; i += GD_LANES) {
                float sv = S[i * SP + col];
                ks += kt[i] * sv;
                qs += qt[i] * sv;
            }
            ks = gd_group_sum(ks);
            qs = gd_group_sum(qs);
            if (lane == 0) {
                float eg = expf(G[t]);
                U[t * SP + col] = B[t] * (U[t * SP + col] - eg * ks);
                O[t * SP + col] = eg * qs;
            }
        }
        __syncwarp();
        for (int t = 1; t < n; t++) {
            float acc = 0.0f;
            for (int u = lane; u < t; u += GD_LANES) acc += A[t * AP + u] * U[u * SP + col];
            acc = gd_group_sum(acc);
            if (lane == 0) U[t * SP + col] -= acc;
            __syncwarp();
        }
        for (int t = 0; t < n; t++) {
            float acc = 0.0f;
            for (int u = lane; u <= t; u += GD_LANES) acc += P[t * AP + u] * U[u * SP + col];
            acc = gd_group_sum(acc);
            if (lane == 0 && e < dv) o[(size_t)(c0 + t) * s.n_v * dv + (size_t)j * dv + e] = O[t * SP + col] + acc;
        }
        const float gl = expf(G[n - 1]);
        for (int i = lane; i < dk; i += GD_LANES) {
            float acc = 0.0f;
            for (int u = 0; u < n; u++) acc += W[u] * K[u * m.dkp + i] * U[u * SP + col];
            S[i * SP + col] = gl * S[i * SP + col] + acc;
        }
    }
}

/* ---------------------------------------------------------------- launcher */

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
