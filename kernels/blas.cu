/*
 * kernels/blas.cu — the process's cuBLASLt handle, workspace and per-shape algorithm cache
 * (kernels/blas.h).
 *
 * A row-major D[M,N] = op(A)[M,K]·op(B)[K,N] is handed to cuBLASLt as the column-major problem
 * Dᵀ[N,M] = op(B)ᵀ·op(A)ᵀ: no data moves, only the roles of A and B swap. Each distinct problem
 * (sizes, transposes, leading dimensions, dtypes, epilogue, beta != 0, pointer alignment class)
 * gets its descriptors and heuristic algorithm built once and kept in a locked table of
 * BLAS_CACHE_MAX plans. Packed batches have a different token count M almost every time, so the
 * table evicts its least recently used plan when full (a long run meets thousands of shapes; a
 * full table must never fail a GEMM). The lock is held through the enqueue: a plan in use cannot be
 * evicted, and the bias pointer set on a shared descriptor cannot race.
 */
#include "kernels/blas.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>

#define BLAS_CACHE_MAX 512

struct blas_plan {
    int M, N, K, ta, tb, lda, ldb, ldd, dtype, bias, beta_nz, align;
    int batch;                           /* 1: a plain GEMM; > 1: strided batched (sa, sb, sd in elements) */
    long long sa, sb, sd;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;   /* cuBLAS roles: A' = b, B' = a, C'/D' = d */
    cublasLtMatmulAlgo_t algo;
    uint64_t last_use;                   /* blas_tick at the last call: the LRU eviction order */
};

static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
static cublasLtHandle_t blas_handle;
static void *blas_ws;
static size_t blas_ws_bytes;
static int blas_ready;
static struct blas_plan blas_plans[BLAS_CACHE_MAX];
static int blas_nplans;
static uint64_t blas_tick;
static uint64_t blas_evictions;

static const char *lt_str(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS status (unknown)";
    }
}

#define LT_TRY(call) do { cublasStatus_t s_ = (call); \
        if (s_ != CUBLAS_STATUS_SUCCESS) return kernels_fail("blas: %s failed: %s", #call, lt_str(s_)); } while (0)

static int init_locked(size_t ws_bytes) {
    if (blas_ready) return 0;
    if (ws_bytes == 0) ws_bytes = (size_t)64 << 20;
    LT_TRY(cublasLtCreate(&blas_handle));
    cudaError_t e = cudaMalloc(&blas_ws, ws_bytes);
    if (e != cudaSuccess) {
        cublasLtDestroy(blas_handle);
        return kernels_fail("blas_init: cudaMalloc of a %zu-byte workspace failed: %s", ws_bytes, cudaGetErrorString(e));
    }
    blas_ws_bytes = ws_bytes;
    blas_ready = 1;
    return 0;
}

extern "C" int blas_init(size_t workspace_bytes) {
    pthread_mutex_lock(&blas_lock);
    int r = init_locked(workspace_bytes);
    pthread_mutex_unlock(&blas_lock);
    return r;
}

static void plan_destroy(struct blas_plan *p) {
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    p->desc = NULL; p->la = p->lb = p->ld = NULL;
}

extern "C" void blas_free(void) {
    pthread_mutex_lock(&blas_lock);
    for (int i = 0; i < blas_nplans; i++) plan_destroy(&blas_plans[i]);
    blas_nplans = 0;
    blas_evictions = 0;
    if (blas_ready) {
        cudaFree(blas_ws);
        cublasLtDestroy(blas_handle);
        blas_ws = NULL;
        blas_ready = 0;
    }
    pthread_mutex_unlock(&blas_lock);
}

/* Largest power of two (<= 256) dividing the address: cuBLASLt assumes 256-byte alignment unless told. */
static int align_of(const void *p) {
    uintptr_t u = (uintptr_t)p;
    int a = 256;
    while (a > 16 && (u % (uintptr_t)a)) a >>= 1;
    return a;
}

/* Build descriptors and pick the algorithm for the plan's key fields. Called under the lock. */
static int plan_build(struct blas_plan *p) {
    cudaDataType_t dt = p->dtype == BLAS_F32 ? CUDA_R_32F : CUDA_R_16BF;
    cublasOperation_t opa = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;   /* A' = b */
    cublasOperation_t opb = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N;   /* B' = a */
    LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (p->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        int32_t bt = (int32_t)dt;
        LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    /* column-major views: A' = op(B)ᵀ [N,K], B' = op(A)ᵀ [K,M], D' [N,M] */
    if (p->tb) LT_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, p->K, p->N, p->ldb));
    else       LT_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, p->N, p->K, p->ldb));
    if (p->ta) LT_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, p->M, p->K, p->lda));
    else       LT_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, p->K, p->M, p->lda));
    LT_TRY(cublasLtMatrixLayoutCreate(&p->ld, dt, p->N, p->M, p->ldd));
    if (p->batch > 1) {   /* strided batches: every layout gets the count and its own stride */
        int32_t bc = p->batch;
        int64_t s_la = p->sb, s_lb = p->sa, s_ld = p->sd;
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->ld, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->la, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s_la, sizeof s_la));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->lb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s_lb, sizeof s_lb));
        LT_TRY(cublasLtMatrixLayoutSetAttribute(p->ld, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &s_ld, sizeof s_ld));
    }

    cublasLtMatmulPreference_t pref;
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    uint32_t al = (uint32_t)p->align;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &blas_ws_bytes, sizeof blas_ws_bytes);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al);
    cublasLtMatmulHeuristicResult_t res;
    int n = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(blas_handle, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1, &res, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS)
        return kernels_fail("blas: heuristic query failed for M=%d N=%d K=%d: %s", p->M, p->N, p->K, lt_str(s));
    if (n < 1)
        return kernels_fail("blas: cuBLASLt has no algorithm for M=%d N=%d K=%d trans_a=%d trans_b=%d "
                            "out=%s bias=%d alignment=%d batch=%d", p->M, p->N, p->K, p->ta, p->tb,
                            p->dtype == BLAS_F32 ? "f32" : "bf16", p->bias, p->align, p->batch);
    p->algo = res.algo;
    return 0;
}

/* Largest power of two (<= 256) dividing a batch stride in bytes (256 for no stride). */
static int align_of_stride(long long elems, int elem_bytes) {
    return elems ? align_of((const void *)(uintptr_t)(elems * elem_bytes)) : 256;
}

/* The one implementation of blas_matmul and blas_matmul_batched: c is the C operand (== d for in place),
 * batch 1 ignores the strides. */
static int matmul_impl(void *d, const void *c, blas_dtype d_type, const bf16 *a, int trans_a, const bf16 *b,
                       int trans_b, const void *bias, int M, int N, int K, int lda, int ldb, int ldd, long long sa,
                       long long sb, long long sd, int batch, float alpha, float beta, cudaStream_t stream) {
    if (M <= 0 || N <= 0 || K <= 0)
        return kernels_fail("blas_matmul: M, N, K must be positive, got M=%d N=%d K=%d", M, N, K);
    if (batch < 1) return kernels_fail("blas_matmul_batched: batch count must be >= 1, got %d", batch);
    if (batch == 1) sa = sb = sd = 0;
    if (d_type != BLAS_BF16 && d_type != BLAS_F32)
        return kernels_fail("blas_matmul: unknown output dtype %d", (int)d_type);
    int a_row = trans_a ? M : K, b_row = trans_b ? K : N;   /* stored row lengths */
    if (lda == 0) lda = a_row;
    if (ldb == 0) ldb = b_row;
    if (ldd == 0) ldd = N;
    if (lda < a_row || ldb < b_row || ldd < N)
        return kernels_fail("blas_matmul: leading dimensions too small: lda=%d (rows of %d), ldb=%d (rows of %d), "
                            "ldd=%d (rows of %d)", lda, a_row, ldb, b_row, ldd, N);
    if (lda % 8 || ldb % 8 || ldd % 8)
        return kernels_fail("blas_matmul: leading dimensions must be multiples of 8 elements (16 bytes), "
                            "got lda=%d ldb=%d ldd=%d (M=%d N=%d K=%d)", lda, ldb, ldd, M, N, K);
    if (((uintptr_t)a | (uintptr_t)b | (uintptr_t)d | (uintptr_t)c | (uintptr_t)bias) % 16)
        return kernels_fail("blas_matmul: pointers must be 16-byte aligned (a=%p b=%p c=%p d=%p bias=%p)",
                            (const void *)a, (const void *)b, c, d, bias);
    if (bias && beta != 0.0f)
        return kernels_fail("blas_matmul: a bias epilogue needs beta == 0 (got %g)", beta);
    if (batch > 1) {
        if (sa % 8 || sb % 8 || sd % 8 || sa < 0 || sb < 0)
            return kernels_fail("blas_matmul_batched: batch strides must be non-negative multiples of 8 elements, got "
                                "stride_a=%lld stride_b=%lld stride_d=%lld", sa, sb, sd);
        if (sd < (long long)M * ldd)
            return kernels_fail("blas_matmul_batched: stride_d %lld is smaller than one output (M=%d x ldd=%d): the "
                                "batches would overlap", sd, M, ldd);
    }
    int align = align_of(a);
    if (align_of(b) < align) align = align_of(b);
    if (align_of(d) < align) align = align_of(d);
    if (align_of(c) < align) align = align_of(c);
    if (bias && align_of(bias) < align) align = align_of(bias);
    if (batch > 1) {   /* every batch's pointer must keep the alignment the algorithm is chosen for */
        const int esz = d_type == BLAS_F32 ? 4 : 2;
        if (align_of_stride(sa, 2) < align) align = align_of_stride(sa, 2);
        if (align_of_stride(sb, 2) < align) align = align_of_stride(sb, 2);
        if (align_of_stride(sd, esz) < align) align = align_of_stride(sd, esz);
    }

    pthread_mutex_lock(&blas_lock);
    if (init_locked(0)) { pthread_mutex_unlock(&blas_lock); return -1; }
    struct blas_plan *p = NULL;
    int beta_nz = beta != 0.0f, has_bias = bias != NULL;
    for (int i = 0; i < blas_nplans; i++) {
        struct blas_plan *q = &blas_plans[i];
        if (q->M == M && q->N == N && q->K == K && q->ta == !!trans_a && q->tb == !!trans_b && q->lda == lda &&
            q->ldb == ldb && q->ldd == ldd && q->dtype == (int)d_type && q->bias == has_bias &&
            q->beta_nz == beta_nz && q->align == align && q->batch == batch && q->sa == sa && q->sb == sb &&
            q->sd == sd) { p = q; break; }
    }
    if (!p) {
        if (blas_nplans == BLAS_CACHE_MAX) {   /* evict the least recently used plan */
            p = &blas_plans[0];
            for (int i = 1; i < blas_nplans; i++)
                if (blas_plans[i].last_use < p->last_use) p = &blas_plans[i];
            plan_destroy(p);
            blas_evictions++;
        } else {
            p = &blas_plans[blas_nplans++];
        }
        memset(p, 0, sizeof *p);
        p->M = M; p->N = N; p->K = K; p->ta = !!trans_a; p->tb = !!trans_b;
        p->lda = lda; p->ldb = ldb; p->ldd = ldd; p->dtype = (int)d_type; p->bias = has_bias;
        p->beta_nz = beta_nz; p->align = align;
        p->batch = batch; p->sa = sa; p->sb = sb; p->sd = sd;
        if (plan_build(p)) {
            plan_destroy(p);
            p->M = -1;   /* an unusable slot: never matches, first to be evicted */
            p->last_use = 0;
            pthread_mutex_unlock(&blas_lock);
            return -1;
        }
    }
    p->last_use = ++blas_tick;

    int rc = 0;
    if (bias) {
        cublasStatus_t s = cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (s != CUBLAS_STATUS_SUCCESS) rc = kernels_fail("blas_matmul: setting the bias pointer failed: %s", lt_str(s));
    }
    if (rc == 0) {
        cublasStatus_t s = cublasLtMatmul(blas_handle, p->desc, &alpha, b, p->la, a, p->lb, &beta, c, p->ld, d, p->ld,
                                          &p->algo, blas_ws, blas_ws_bytes, stream);
        if (s != CUBLAS_STATUS_SUCCESS)
            rc = kernels_fail("blas_matmul: cublasLtMatmul failed for M=%d N=%d K=%d: %s", M, N, K, lt_str(s));
    }
    pthread_mutex_unlock(&blas_lock);
    if (rc == 0 && kernels_sync_debug()) {
        cudaError_t e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) return kernels_fail("blas_matmul: %s", cudaGetErrorString(e));
    }
    return rc;
}

extern "C" int blas_matmul(void *d, blas_dtype d_type, const bf16 *a, int trans_a, const bf16 *b, int trans_b,
                           const void *bias, int M, int N, int K, int lda, int ldb, int ldd,
                           float alpha, float beta, cudaStream_t stream) {
    return matmul_impl(d, d, d_type, a, trans_a, b, trans_b, bias, M, N, K, lda, ldb, ldd, 0, 0, 0, 1, alpha, beta,
                       stream);
}

extern "C" int blas_matmul_batched(void *d, const void *c, blas_dtype d_type, const bf16 *a, int trans_a,
                                   const bf16 *b, int trans_b, int M, int N, int K, int lda, int ldb, int ldd,
                                   long long stride_a, long long stride_b, long long stride_d, int batch, float alpha,
                                   float beta, cudaStream_t stream) {
    if (c && c != d && beta == 0.0f) c = d;   /* C is not read: one layout, in place */
    return matmul_impl(d, c ? c : d, d_type, a, trans_a, b, trans_b, NULL, M, N, K, lda, ldb, ldd, stride_a, stride_b,
                       stride_d, batch, alpha, beta, stream);
}

extern "C" void blas_cache_stats(int *plans, uint64_t *evictions) {
    pthread_mutex_lock(&blas_lock);
    if (plans) *plans = blas_nplans;
    if (evictions) *evictions = blas_evictions;
    pthread_mutex_unlock(&blas_lock);
}

extern "C" int blas_linear_forward(void *y, blas_dtype y_type, const bf16 *x, const bf16 *w, const void *bias,
                                   int M, int N, int K, cudaStream_t stream) {
    return blas_matmul(y, y_type, x, 0, w, 1, bias, M, N, K, 0, 0, 0, 1.0f, 0.0f, stream);
}

extern "C" int blas_linear_backward_dx(void *dx, blas_dtype dx_type, const bf16 *dy, const bf16 *w,
                                       int M, int N, int K, int accumulate, cudaStream_t stream) {
    /* dx[M,K] = dy[M,N] · w[N,K] */
    return blas_matmul(dx, dx_type, dy, 0, w, 0, NULL, M, K, N, 0, 0, 0, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

extern "C" int blas_linear_backward_dw(void *dw, blas_dtype dw_type, const bf16 *dy, const bf16 *x,
                                       int M, int N, int K, int accumulate, cudaStream_t stream) {
    /* dw[N,K] = dy[M,N]ᵀ · x[M,K] */
    return blas_matmul(dw, dw_type, dy, 1, x, 0, NULL, N, K, M, 0, 0, 0, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}
