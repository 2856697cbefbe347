/*
 * kernels/bench/gated_delta_bench.cu — the chunked gated delta rule (kernels/gated_delta.h) at the
 * Qwen3.6-27B layout (16 key / 48 value heads of 128), one 8192-token packed batch of documents of
 * 800..2000 tokens: what one Gated DeltaNet layer of the target spends in the recurrence.
 *
 * Build: make build/bench/gated_delta_bench      Run: build/bench/gated_delta_bench
 * Variant 1: one CTA per (32 value columns, head, document), 8 lanes per column, untiled fp32 dot
 *            products from shared memory (the first version; shared-memory bound).
 * Variant 2: the library kernel: 64-column tiles, 4 x 4 / 8 x 4 register tiles for A, P, K·S, Q·S,
 *            P·U and the state update.
 * Variant 3: gated_delta_forward_split: the chunk-local solves of every chunk at once, the sequential walk
 *            (U = U0 − W·S, e^G ⊙ Q·S, the state update) per (document, head, 64 columns), then P·U of every
 *            chunk at once (its timing includes all four launches).
 * Napkin math (FLOPs per token and value head, 64-token chunks): A and P lower triangles 2·64·d_k,
 * K·S and Q·S 4·d_k·d_v, substitution and P·U 2·64·d_v, state update 2·d_k·d_v: 48 heads x 8192
 * tokens = 52 GFLOP per layer; at ~40 TFLOP/s fp32 (CUDA cores) ~1.3 ms, x 48 layers.
 * Each variant is validated against gated_delta_forward_chunked_ref on a 1193-token batch first.
 */
#include "kernels/gated_delta.h"
#include "kernels/l2norm.h"
#include "k1bench.cuh"

#include <cuda_bf16.h>

#define V1_C GATED_DELTA_CHUNK
#define V1_VT 32                 /* value columns per CTA */
#define V1_LANES 8               /* threads per value column */
#define V1_THREADS (V1_VT * V1_LANES)

/* shared-memory layout (floats), dkp = d_k + 1 (odd row stride: row-strided reads hit distinct banks) */
struct v1_smem {
    int dkp, s_off, k_off, q_off, a_off, p_off, u_off, o_off, g_off, b_off, w_off, total;
};

static __host__ __device__ v1_smem v1_layout(int dk) {
    v1_smem m;
    m.dkp = dk + 1;
    m.s_off = 0;                                  /* S [dk][V1_VT + 1] */
    m.k_off = m.s_off + dk * (V1_VT + 1);         /* K [V1_C][dkp] */
    m.q_off = m.k_off + V1_C * m.dkp;             /* Q [V1_C][dkp] */
    m.a_off = m.q_off + V1_C * m.dkp;             /* A [V1_C][V1_C + 1] */
    m.p_off = m.a_off + V1_C * (V1_C + 1);        /* P [V1_C][V1_C + 1] */
    m.u_off = m.p_off + V1_C * (V1_C + 1);        /* U [V1_C][V1_VT + 1] */
    m.o_off = m.u_off + V1_C * (V1_VT + 1);       /* O (inter-chunk part) [V1_C][V1_VT + 1] */
    m.g_off = m.o_off + V1_C * (V1_VT + 1);       /* G [V1_C] */
    m.b_off = m.g_off + V1_C;                     /* beta [V1_C] */
    m.w_off = m.b_off + V1_C;                     /* exp(G_last - G_s) [V1_C] */
    m.total = m.w_off + V1_C;
    return m;
}

/* ---------------------------------------------------------------- kernels */

__device__ __forceinline__ float v1_group_sum(float x) {
    /* the 8 lanes of a column group are consecutive lanes of one warp */
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x;
}

__global__ void __launch_bounds__(V1_THREADS)
gated_delta_forward_kernel1(float *o, const float *q, const float *k, const float *v, const __nv_bfloat16 *b,
                           const __nv_bfloat16 *a, const float *a_neg, const float *dt_bias,
                           const int32_t *cu_seqlens, gated_delta_shape s) {
    extern __shared__ float sm[];
    const int dk = s.d_k, dv = s.d_v, nvt = (dv + V1_VT - 1) / V1_VT;
    const int j = blockIdx.x / nvt, e0 = (blockIdx.x % nvt) * V1_VT, doc = blockIdx.y;
    const int hk = j / (s.n_v / s.n_k);
    const v1_smem m = v1_layout(dk);
    float *S = sm + m.s_off, *K = sm + m.k_off, *Q = sm + m.q_off, *A = sm + m.a_off, *P = sm + m.p_off;
    float *U = sm + m.u_off, *O = sm + m.o_off, *G = sm + m.g_off, *B = sm + m.b_off, *W = sm + m.w_off;
    const int tid = threadIdx.x, col = tid / V1_LANES, lane = tid % V1_LANES, e = e0 + col;
    const int SP = V1_VT + 1, AP = V1_C + 1;
    const float an = a_neg[j], dtb = dt_bias[j];
    const int s0 = cu_seqlens[doc], s1 = cu_seqlens[doc + 1];

    for (int i = tid; i < dk * SP; i += V1_THREADS) S[i] = 0.0f;   /* the document starts from zero */
    for (int c0 = s0; c0 < s1; c0 += V1_C) {
        const int n = min(V1_C, s1 - c0);
        __syncthreads();   /* the previous chunk's readers of K, Q, A, P, G are done */
        for (int idx = tid; idx < n * dk; idx += V1_THREADS) {
            int t = idx / dk, i = idx % dk;
            size_t r = (size_t)(c0 + t) * s.qk_stride + (size_t)hk * dk + i;
            K[t * m.dkp + i] = k[r];
            Q[t * m.dkp + i] = q[r];
        }
        for (int idx = tid; idx < n * V1_VT; idx += V1_THREADS) {
            int t = idx / V1_VT, c = idx % V1_VT;
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
        for (int idx = tid; idx < n * n; idx += V1_THREADS) {
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
            for (int i = lane; i < dk; i += V1_LANES) {
                float sv = S[i * SP + col];
                ks += kt[i] * sv;
                qs += qt[i] * sv;
            }
            ks = v1_group_sum(ks);
            qs = v1_group_sum(qs);
            if (lane == 0) {
                float eg = expf(G[t]);
                U[t * SP + col] = B[t] * (U[t * SP + col] - eg * ks);
                O[t * SP + col] = eg * qs;
            }
        }
        __syncwarp();
        for (int t = 1; t < n; t++) {
            float acc = 0.0f;
            for (int u = lane; u < t; u += V1_LANES) acc += A[t * AP + u] * U[u * SP + col];
            acc = v1_group_sum(acc);
            if (lane == 0) U[t * SP + col] -= acc;
            __syncwarp();
        }
        for (int t = 0; t < n; t++) {
            float acc = 0.0f;
            for (int u = lane; u <= t; u += V1_LANES) acc += P[t * AP + u] * U[u * SP + col];
            acc = v1_group_sum(acc);
            if (lane == 0 && e < dv) o[(size_t)(c0 + t) * s.n_v * dv + (size_t)j * dv + e] = O[t * SP + col] + acc;
        }
        const float gl = expf(G[n - 1]);
        for (int i = lane; i < dk; i += V1_LANES) {
            float acc = 0.0f;
            for (int u = 0; u < n; u++) acc += W[u] * K[u * m.dkp + i] * U[u * SP + col];
            S[i * SP + col] = gl * S[i * SP + col] + acc;
        }
    }
}


/* ---------------------------------------------------------------- harness */

static void *g_ws;      /* variant 3's workspace, sized for the larger batch */
static size_t g_wsb;

static int run_variant(int var, float *o, const float *q, const float *k, const float *v, const bf16 *b,
                       const bf16 *a, const float *an, const float *dtb, const int32_t *cu, const gated_delta_shape *s) {
    if (var == 2) return gated_delta_forward(o, q, k, v, b, a, an, dtb, cu, s, 0);
    if (var == 3) return gated_delta_forward_split(o, q, k, v, b, a, an, dtb, cu, s, g_ws, g_wsb, 0);
    v1_smem m = v1_layout(s->d_k);
    size_t smem = (size_t)m.total * 4;
    BENCH_CUDA(cudaFuncSetAttribute(gated_delta_forward_kernel1, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int nvt = (s->d_v + V1_VT - 1) / V1_VT;
    dim3 grid((unsigned)(s->n_v * nvt), (unsigned)s->n_docs);
    gated_delta_forward_kernel1<<<grid, V1_THREADS, smem>>>(o, q, k, v, (const __nv_bfloat16 *)b,
                                                           (const __nv_bfloat16 *)a, an, dtb, cu, *s);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

struct batch {
    gated_delta_shape s;
    float *h_conv, *h_ba, *h_an, *h_dtb;
    int32_t *h_cu;
    float *conv, *an, *dtb, *o;
    bf16 *ba;
    int32_t *cu;
};

static void make(batch *B, const int *lens, int nd, uint64_t seed) {
    const int nk = 16, nv = 48, dk = 128, dv = 128, D = 2 * nk * dk + nv * dv;
    int T = 0;
    B->h_cu = (int32_t *)malloc(4 * (nd + 1));
    B->h_cu[0] = 0;
    for (int d = 0; d < nd; d++) B->h_cu[d + 1] = T += lens[d];
    B->s = gated_delta_shape{T, nd, nk, nv, dk, dv, D, D, 2 * nv};
    B->h_conv = (float *)malloc(4 * (size_t)T * D);
    for (size_t i = 0; i < (size_t)T * D; i++)
        B->h_conv[i] = (float)((kernels_rng_next(&seed) >> 40) * (1.0 / 16777216.0)) * 2 - 1;
    l2norm_forward_ref(B->h_conv, T, D, nk, dk, 1.0f / sqrtf((float)dk));
    l2norm_forward_ref(B->h_conv + nk * dk, T, D, nk, dk, 1.0f);
    B->ba = bench_rand_bf16((size_t)T * 2 * nv, -3, 3, seed + 1, &B->h_ba);
    B->h_an = (float *)malloc(4 * nv);
    B->h_dtb = (float *)malloc(4 * nv);
    for (int j = 0; j < nv; j++) {
        B->h_an[j] = -expf((float)((kernels_rng_next(&seed) >> 40) * (1.0 / 16777216.0)) * 2.5f - 1.0f);
        B->h_dtb[j] = (float)((kernels_rng_next(&seed) >> 40) * (1.0 / 16777216.0)) * 2 - 1;
    }
    BENCH_CUDA(cudaMalloc(&B->conv, 4 * (size_t)T * D));
    BENCH_CUDA(cudaMemcpy(B->conv, B->h_conv, 4 * (size_t)T * D, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMalloc(&B->an, 4 * nv));
    BENCH_CUDA(cudaMemcpy(B->an, B->h_an, 4 * nv, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMalloc(&B->dtb, 4 * nv));
    BENCH_CUDA(cudaMemcpy(B->dtb, B->h_dtb, 4 * nv, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMalloc(&B->cu, 4 * (nd + 1)));
    BENCH_CUDA(cudaMemcpy(B->cu, B->h_cu, 4 * (nd + 1), cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMalloc(&B->o, 4 * (size_t)T * nv * dv));
}

static int run(int var, batch *B) {
    const int kd = B->s.n_k * B->s.d_k;
    return run_variant(var, B->o, B->conv, B->conv + kd, B->conv + 2 * kd, B->ba, B->ba + B->s.n_v, B->an, B->dtb,
                       B->cu, &B->s);
}

int main(void) {
    int small[] = {1, 63, 64, 65, 1000}, big[] = {1200, 900, 2000, 1500, 800, 1792};
    batch S, L;
    make(&S, small, 5, 1);
    make(&L, big, 6, 2);
    size_t n = (size_t)S.s.T * S.s.n_v * S.s.d_v;
    float *ref = (float *)malloc(4 * n), *got = (float *)malloc(4 * n);
    float *st = (float *)malloc(4 * (size_t)S.s.n_v * S.s.d_k * S.s.d_v);
    const int kd = S.s.n_k * S.s.d_k;
    gated_delta_forward_chunked_ref(ref, S.h_conv, S.h_conv + kd, S.h_conv + 2 * kd, S.h_ba, S.h_ba + S.s.n_v, S.h_an,
                                    S.h_dtb, S.h_cu, &S.s, st);
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(ref[i]));
    const double T = L.s.T, H = L.s.n_v, dk = L.s.d_k, dv = L.s.d_v;
    const double flop = 2 * T * H * (64 * dk + 2 * dk * dv + 64 * dv + dk * dv);
    g_wsb = gated_delta_split_workspace_bytes(L.s.T, L.s.n_docs, &L.s);
    size_t ws_small = gated_delta_split_workspace_bytes(S.s.T, S.s.n_docs, &S.s);
    if (ws_small > g_wsb) g_wsb = ws_small;
    BENCH_CUDA(cudaMalloc(&g_ws, g_wsb));
    printf("variant 3 workspace: %.1f MB\n", g_wsb / 1e6);
    for (int var = 1; var <= 3; var++) {
        BENCH_CUDA(cudaMemset(S.o, 0xff, 4 * n));
        BENCH_OK(run(var, &S));
        BENCH_CUDA(cudaDeviceSynchronize());
        BENCH_CUDA(cudaMemcpy(got, S.o, 4 * n, cudaMemcpyDeviceToHost));
        double err = 0;
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)got[i] - ref[i]);
            if (!(d <= err)) err = d;
        }
        char what[64];
        snprintf(what, sizeof what, "variant %d vs chunked fp32 ref", var);   /* 1e-4 of the scale: a lost term errs by O(scale) */
        bench_check(what, err, 1e-4 * scale);
        double ms = bench_ms([&]() { BENCH_OK(run(var, &L)); });
        snprintf(what, sizeof what, "gated_delta variant %d", var);
        bench_report_flops(what, "T=8192 6 docs 48x128x128", ms, flop);
    }
    return 0;
}
