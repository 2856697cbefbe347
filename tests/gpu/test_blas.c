/*
 * tests/gpu/test_blas.c — the cuBLASLt wrapper (kernels/blas.h) against the CPU reference GEMM
 * (kernels/gemm.h) run on the same bf16-rounded inputs: the three linear calls (forward with and
 * without bias, dX with accumulate, dW into fp32 with accumulate), all transpose combinations,
 * a strided sub-matrix (a slice of fc), shapes with tails and M = 1, one production shape
 * (T=8192 rows of q_proj, checked on sampled rows), strided batches (blas_matmul_batched, C apart from D and in
 * place), and the precondition sentences.
 *
 * Tolerances: both sides accumulate in fp32 from identical bf16 inputs, so they differ by
 * accumulation order only (≤ ~K·2^-24 relative to Σ|a·b|, ~1e-4 here); a bf16 output adds one
 * rounding of ≤ 2^-9 relative: rtol 8e-3 (two bf16 half-ulps) plus atol 2e-3·sqrt(K)·|a||b|.
 */
#include "kernels/blas.h"
#include "kernels/gemm.h"
#include "k1util.h"

static void compare(const char *what, const void *dev, blas_dtype dt, const float *ref, size_t n, int K) {
    float *got = malloc(4 * n + 4);
    if (dt == BLAS_BF16) k1_download_bf16(got, dev, n);
    else K1_CUDA(cudaMemcpy(got, dev, 4 * n, cudaMemcpyDeviceToHost));
    double atol = (dt == BLAS_BF16 ? 2e-3 : 2e-4) * sqrt((double)K), rtol = dt == BLAS_BF16 ? 8e-3 : 1e-4;
    ck_assert(test_allclose(what, got, ref, n, atol, rtol));
    free(got);
}

static void one_matmul(int M, int N, int K, int ta, int tb, blas_dtype dt, float beta, int with_bias, uint64_t seed) {
    size_t na = (size_t)M * K, nb = (size_t)K * N, nd = (size_t)M * N;
    float *a = k1_randn(&seed, na, -1, 1), *b = k1_randn(&seed, nb, -1, 1), *d = k1_randn(&seed, nd, -1, 1);
    float *bias = k1_randn(&seed, N, -1, 1);
    bf16 *da = k1_upload_bf16(a, na), *db = k1_upload_bf16(b, nb);
    void *dd, *dbias = NULL;
    if (dt == BLAS_BF16) { dd = k1_upload_bf16(d, nd); if (with_bias) dbias = k1_upload_bf16(bias, N); }
    else { dd = k1_upload(d, 4 * nd); if (with_bias) dbias = k1_upload(bias, 4 * (size_t)N); }
    if (beta == 0.0f) k1_poison(dd, nd * (dt == BLAS_BF16 ? 2 : 4));   /* beta 0 must not read d */
    K1_LAUNCH(blas_matmul(dd, dt, da, ta, db, tb, dbias, M, N, K, 0, 0, 0, 1.0f, beta, 0));
    K1_CUDA(cudaDeviceSynchronize());
    gemm_forward_ref(d, a, ta, b, tb, M, N, K, 1.0f, beta);
    if (with_bias)
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) d[(size_t)i * N + j] += bias[j];
    char what[128];
    snprintf(what, sizeof what, "matmul M=%d N=%d K=%d ta=%d tb=%d %s beta=%g bias=%d", M, N, K, ta, tb,
             dt == BLAS_BF16 ? "bf16" : "f32", beta, with_bias);
    compare(what, dd, dt, d, nd, K);
    cudaFree(da); cudaFree(db); cudaFree(dd); cudaFree(dbias);
    free(a); free(b); free(d); free(bias);
}

START_TEST(blas_matmul_shapes) {
    int shapes[][3] = {{1, 8, 8}, {37, 72, 200}, {129, 136, 64}, {256, 256, 1032}};
    for (int s = 0; s < 4; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                if (ta && M % 8) continue;   /* a stored [K,M] needs M % 8 == 0 */
                one_matmul(M, N, K, ta, tb, BLAS_BF16, 0.0f, 0, 100 + s);
                one_matmul(M, N, K, ta, tb, BLAS_F32, 1.0f, 0, 200 + s);
            }
    one_matmul(37, 72, 200, 0, 1, BLAS_BF16, 0.0f, 1, 300);   /* bias epilogue */
    one_matmul(64, 136, 64, 0, 1, BLAS_F32, 0.0f, 1, 301);
}
END_TEST

/* Linear layer forward / dX / dW through the named wrappers. */
START_TEST(blas_linear_calls) {
    const int M = 77, N = 96, K = 160;
    uint64_t seed = 7;
    float *x = k1_randn(&seed, (size_t)M * K, -1, 1), *w = k1_randn(&seed, (size_t)N * K, -1, 1);
    float *dy = k1_randn(&seed, (size_t)M * N, -1, 1), *y = malloc(4 * M * N);
    float *dx = k1_randn(&seed, (size_t)M * K, -1, 1), *dw = k1_randn(&seed, (size_t)N * K, -1, 1);
    bf16 *d_x = k1_upload_bf16(x, (size_t)M * K), *d_w = k1_upload_bf16(w, (size_t)N * K);
    bf16 *d_dy = k1_upload_bf16(dy, (size_t)M * N), *d_dx = k1_upload_bf16(dx, (size_t)M * K);
    float *d_dw = k1_upload(dw, 4 * (size_t)N * K);
    bf16 *d_y = k1_malloc(2 * (size_t)M * N);
    k1_poison(d_y, 2 * (size_t)M * N);
    K1_LAUNCH(blas_linear_forward(d_y, BLAS_BF16, d_x, d_w, NULL, M, N, K, 0));
    K1_LAUNCH(blas_linear_backward_dx(d_dx, BLAS_BF16, d_dy, d_w, M, N, K, 1, 0));
    K1_LAUNCH(blas_linear_backward_dw(d_dw, BLAS_F32, d_dy, d_x, M, N, K, 1, 0));
    K1_CUDA(cudaDeviceSynchronize());
    gemm_linear_forward_ref(y, x, w, NULL, M, N, K);
    gemm_linear_backward_ref(dx, dw, NULL, dy, x, w, M, N, K, 1);
    compare("linear y", d_y, BLAS_BF16, y, (size_t)M * N, K);
    compare("linear dx (accumulated)", d_dx, BLAS_BF16, dx, (size_t)M * K, N);
    compare("linear dw (fp32, accumulated)", d_dw, BLAS_F32, dw, (size_t)N * K, M);
    cudaFree(d_x); cudaFree(d_w); cudaFree(d_dy); cudaFree(d_dx); cudaFree(d_dw); cudaFree(d_y);
    free(x); free(w); free(dy); free(y); free(dx); free(dw);
}
END_TEST

/* fc [D, L·C] applied to one part: x_l [T,C] · (fc[:, l·C:(l+1)·C])ᵀ, the slice read with ldb = L·C. */
START_TEST(blas_strided_slice) {
    const int T = 40, C = 64, L = 3, D = 48, l = 1;
    uint64_t seed = 8;
    float *x = k1_randn(&seed, (size_t)T * C, -1, 1), *fc = k1_randn(&seed, (size_t)D * L * C, -1, 1);
    float *ws = malloc(4 * D * C), *y = malloc(4 * T * D);
    bf16 *d_x = k1_upload_bf16(x, (size_t)T * C), *d_fc = k1_upload_bf16(fc, (size_t)D * L * C);
    for (int r = 0; r < D; r++) memcpy(ws + r * C, fc + (size_t)r * L * C + l * C, 4 * C);
    bf16 *d_y = k1_malloc(2 * T * D);
    K1_LAUNCH(blas_matmul(d_y, BLAS_BF16, d_x, 0, d_fc + l * C, 1, NULL, T, D, C, 0, L * C, 0, 1.0f, 0.0f, 0));
    K1_CUDA(cudaDeviceSynchronize());
    gemm_linear_forward_ref(y, x, ws, NULL, T, D, C);
    compare("fc slice", d_y, BLAS_BF16, y, (size_t)T * D, C);
    cudaFree(d_x); cudaFree(d_fc); cudaFree(d_y);
    free(x); free(fc); free(ws); free(y);
}
END_TEST

/* q_proj of the standard configuration: [8192,4096]·[4096,4096]ᵀ; 24 sampled rows checked. */
START_TEST(blas_production_shape) {
    const int M = 8192, N = 4096, K = 4096, S = 24;
    uint64_t seed = 9;
    float *x = k1_randn(&seed, (size_t)M * K, -1, 1), *w = k1_randn(&seed, (size_t)N * K, -0.05f, 0.05f);
    bf16 *d_x = k1_upload_bf16(x, (size_t)M * K), *d_w = k1_upload_bf16(w, (size_t)N * K);
    bf16 *d_y = k1_malloc(2 * (size_t)M * N);
    k1_poison(d_y, 2 * (size_t)M * N);
    K1_LAUNCH(blas_linear_forward(d_y, BLAS_BF16, d_x, d_w, NULL, M, N, K, 0));
    K1_CUDA(cudaDeviceSynchronize());
    float *xs = malloc(4 * (size_t)S * K), *ys = malloc(4 * (size_t)S * N), *got = malloc(4 * (size_t)N);
    for (int s = 0; s < S; s++) memcpy(xs + (size_t)s * K, x + (size_t)(s * (M - 1) / (S - 1)) * K, 4 * (size_t)K);
    gemm_linear_forward_ref(ys, xs, w, NULL, S, N, K);
    for (int s = 0; s < S; s++) {
        k1_download_bf16(got, d_y + (size_t)(s * (M - 1) / (S - 1)) * N, N);
        /* |x|,|w| ≤ 1, 0.05: outputs ~ 1.8 rms; atol scaled to the weights' range */
        ck_assert(test_allclose("q_proj row", got, ys + (size_t)s * N, N, 2e-3 * 0.05 * sqrt((double)K), 8e-3));
    }
    cudaFree(d_x); cudaFree(d_w); cudaFree(d_y);
    free(x); free(w); free(xs); free(ys); free(got);
}
END_TEST

/* More distinct shapes than the plan cache holds (a long run of packed batches: a new token count
 * almost every step) must keep working: least recently used plans are evicted, results stay right. */
START_TEST(blas_many_shapes_evict) {
    const int N = 64, K = 64, n_shapes = 700;
    int plans0;
    uint64_t ev0, ev1;
    blas_cache_stats(&plans0, &ev0);
    for (int M = 1; M <= n_shapes; M++) {
        if (M % 97 == 1 || M == n_shapes) {
            one_matmul(M, N, K, 0, 1, BLAS_BF16, 0.0f, 0, 100 + (uint64_t)M);   /* checked against the reference */
        } else {
            bf16 *da = k1_malloc(2 * (size_t)M * K), *db = k1_malloc(2 * (size_t)N * K), *dd = k1_malloc(2 * (size_t)M * N);
            K1_CUDA(cudaMemset(da, 0, 2 * (size_t)M * K));
            K1_CUDA(cudaMemset(db, 0, 2 * (size_t)N * K));
            K1_LAUNCH(blas_matmul(dd, BLAS_BF16, da, 0, db, 1, NULL, M, N, K, 0, 0, 0, 1.0f, 0.0f, 0));
            K1_CUDA(cudaDeviceSynchronize());
            cudaFree(da); cudaFree(db); cudaFree(dd);
        }
    }
    int plans1;
    blas_cache_stats(&plans1, &ev1);
    ck_assert_msg(ev1 > ev0, "no eviction after %d shapes (plans %d)", n_shapes, plans1);
    /* an evicted shape comes back rebuilt and correct */
    one_matmul(1, N, K, 0, 1, BLAS_BF16, 0.0f, 0, 7);
    one_matmul(2, N, K, 0, 1, BLAS_F32, 1.0f, 0, 8);
}
END_TEST

/* Strided batches (blas_matmul_batched): batch nb of D_i = alpha·op(A_i)·op(B_i) + beta·C_i, every batch against
 * the reference; C separate from D (D poisoned first, so a batch that is not written fails), and in place. Strides
 * larger than one matrix (a gap of 8 elements) so a wrong stride reads the wrong data. */
static void one_batched(int nb, int M, int N, int K, int ta, int tb, blas_dtype dt, float alpha, float beta, int sep,
                        uint64_t seed) {
    const size_t na = (size_t)M * K, nbm = (size_t)K * N, nd = (size_t)M * N;
    const long long sa = (long long)na + 8, sb = (long long)nbm + 8, sd = (long long)nd + 8;
    const size_t esz = dt == BLAS_BF16 ? 2 : 4;
    float *a = k1_randn(&seed, (size_t)sa * nb, -1, 1), *b = k1_randn(&seed, (size_t)sb * nb, -1, 1);
    float *c = k1_randn(&seed, (size_t)sd * nb, -1, 1);
    bf16 *da = k1_upload_bf16(a, (size_t)sa * nb), *db = k1_upload_bf16(b, (size_t)sb * nb);
    void *dc = dt == BLAS_BF16 ? (void *)k1_upload_bf16(c, (size_t)sd * nb) : k1_upload(c, 4 * (size_t)sd * nb);
    void *dd = dc;
    if (sep) {
        dd = k1_malloc(esz * (size_t)sd * nb);
        k1_poison(dd, esz * (size_t)sd * nb);
    }
    K1_LAUNCH(blas_matmul_batched(dd, sep ? dc : NULL, dt, da, ta, db, tb, M, N, K, 0, 0, 0, sa, sb, sd, nb, alpha,
                                  beta, 0));
    K1_CUDA(cudaDeviceSynchronize());
    float *got = malloc(4 * (size_t)sd * nb);
    if (dt == BLAS_BF16) k1_download_bf16(got, dd, (size_t)sd * nb);
    else K1_CUDA(cudaMemcpy(got, dd, 4 * (size_t)sd * nb, cudaMemcpyDeviceToHost));
    double atol = (dt == BLAS_BF16 ? 2e-3 : 2e-4) * sqrt((double)K) * (fabs(alpha) + fabs(beta)),
           rtol = dt == BLAS_BF16 ? 8e-3 : 1e-4;
    for (int i = 0; i < nb; i++) {
        float *ref = c + (size_t)i * sd;
        gemm_forward_ref(ref, a + (size_t)i * sa, ta, b + (size_t)i * sb, tb, M, N, K, alpha, beta);
        char what[160];
        snprintf(what, sizeof what, "batched %d/%d M=%d N=%d K=%d ta=%d tb=%d %s alpha=%g beta=%g %s", i, nb, M, N, K,
                 ta, tb, dt == BLAS_BF16 ? "bf16" : "f32", alpha, beta, sep ? "C != D" : "in place");
        ck_assert(test_allclose(what, got + (size_t)i * sd, ref, nd, atol, rtol));
    }
    if (sep) cudaFree(dd);
    cudaFree(da); cudaFree(db); cudaFree(dc);
    free(a); free(b); free(c); free(got);
}

START_TEST(blas_matmul_batched_shapes) {
    /* Newton–Schulz's three forms (X·Xᵀ, A·A with C = A, B·X with C = X) and the tall X's transposed ones */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            one_batched(3, 24, 40, 72, ta, tb, BLAS_BF16, 1.0f, 0.0f, 0, 400 + 2 * ta + tb);
            one_batched(3, 24, 40, 72, ta, tb, BLAS_BF16, 2.0315f, -4.775f, 1, 410 + 2 * ta + tb);
        }
    one_batched(5, 64, 64, 64, 0, 0, BLAS_BF16, 1.0f, 3.4445f, 0, 420);
    one_batched(2, 128, 136, 256, 0, 1, BLAS_F32, 1.0f, 1.0f, 1, 421);
    one_batched(1, 8, 8, 8, 0, 0, BLAS_BF16, 1.0f, 0.5f, 1, 422);   /* a batch of 1 is a plain GEMM */
}
END_TEST

START_TEST(blas_preconditions) {
    bf16 *a = k1_malloc(4096), *b = k1_malloc(4096);
    float *d = k1_malloc(4096);
    ck_assert_int_eq(blas_matmul(d, BLAS_F32, a, 0, b, 1, NULL, 4, 12, 12, 0, 0, 0, 1, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiples of 8"));
    ck_assert_int_eq(blas_matmul(d, BLAS_F32, a + 1, 0, b, 1, NULL, 4, 8, 8, 0, 0, 0, 1, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "16-byte aligned"));
    ck_assert_int_eq(blas_matmul(d, BLAS_F32, a, 0, b, 1, NULL, 0, 8, 8, 0, 0, 0, 1, 0, 0), -1);
    ck_assert_int_eq(blas_matmul(d, BLAS_F32, a, 0, b, 1, NULL, 4, 8, 8, 4, 0, 0, 1, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "too small"));
    ck_assert_int_eq(blas_matmul(d, BLAS_F32, a, 0, b, 1, d, 4, 8, 8, 0, 0, 0, 1, 1, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "beta == 0"));
    ck_assert_int_eq(blas_matmul_batched(d, NULL, BLAS_F32, a, 0, b, 0, 4, 8, 8, 0, 0, 0, 32, 64, 16, 2, 1, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "overlap"));
    ck_assert_int_eq(blas_matmul_batched(d, NULL, BLAS_F32, a, 0, b, 0, 4, 8, 8, 0, 0, 0, 36, 64, 32, 2, 1, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiples of 8"));
    ck_assert_int_eq(blas_matmul_batched(d, NULL, BLAS_F32, a, 0, b, 0, 4, 8, 8, 0, 0, 0, 32, 64, 32, 0, 1, 0, 0), -1);
    ck_assert_int_eq(blas_init(0), 0);
    ck_assert_int_eq(blas_init(0), 0);   /* idempotent */
    blas_free();
    cudaFree(a); cudaFree(b); cudaFree(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_blas");
    TCase *tc = tcase_create("gpu_blas");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, blas_matmul_shapes);
    tcase_add_test(tc, blas_linear_calls);
    tcase_add_test(tc, blas_strided_slice);
    tcase_add_test(tc, blas_matmul_batched_shapes);
    tcase_add_test(tc, blas_production_shape);
    tcase_add_test(tc, blas_preconditions);
    tcase_add_test(tc, blas_many_shapes_evict);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
