/*
 * tests/test_gemm.c — the CPU reference GEMMs (kernels/gemm.h) against a naive double-precision
 * triple loop (all four transpose combinations, alpha/beta, awkward and size-1 shapes, a threaded
 * shape), and the linear backward against finite differences in double.
 */
#include "kernels/gemm.h"
#include "testutil.h"

/* d = alpha·op(a)·op(b) + beta·d, in double, straight from the definition. */
static void naive(double *d, const float *a, int ta, const float *b, int tb, int M, int N, int K,
                  double alpha, double beta, const float *d0) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                double av = ta ? a[(size_t)k * M + i] : a[(size_t)i * K + k];
                double bv = tb ? b[(size_t)j * K + k] : b[(size_t)k * N + j];
                s += av * bv;
            }
            d[(size_t)i * N + j] = alpha * s + (d0 ? beta * d0[(size_t)i * N + j] : 0);
        }
}

static int check_shape(int M, int N, int K, int ta, int tb, float alpha, float beta, uint64_t seed) {
    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *d = malloc(sizeof(float) * M * N), *d0 = malloc(sizeof(float) * M * N), *ref = malloc(sizeof(float) * M * N);
    double *dd = malloc(sizeof(double) * M * N);
    test_rng_fill(&seed, a, (size_t)M * K, -1, 1);
    test_rng_fill(&seed, b, (size_t)K * N, -1, 1);
    test_rng_fill(&seed, d0, (size_t)M * N, -1, 1);
    memcpy(d, d0, sizeof(float) * M * N);
    if (beta == 0.0f)
        for (int i = 0; i < M * N; i++) d[i] = NAN;   /* beta 0: d must not be read */
    gemm_forward_ref(d, a, ta, b, tb, M, N, K, alpha, beta);
    naive(dd, a, ta, b, tb, M, N, K, alpha, beta, beta == 0.0f ? NULL : d0);
    for (int i = 0; i < M * N; i++) ref[i] = (float)dd[i];
    char what[96];
    snprintf(what, sizeof what, "gemm M=%d N=%d K=%d ta=%d tb=%d", M, N, K, ta, tb);
    /* fp32 products of values in [-1,1], K <= 512 terms: the double-chunked sum is within ~1e-6·sqrt(K) */
    int ok = test_allclose(what, d, ref, (size_t)M * N, 1e-5, 1e-5);
    free(a); free(b); free(d); free(d0); free(ref); free(dd);
    return ok;
}

START_TEST(gemm_transposes_and_tails) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            ck_assert(check_shape(37, 29, 67, ta, tb, 1.0f, 0.0f, 1 + ta * 2 + tb));
            ck_assert(check_shape(5, 70, 131, ta, tb, 0.5f, 1.0f, 11 + ta * 2 + tb));
            ck_assert(check_shape(1, 1, 1, ta, tb, 1.0f, 0.0f, 21));
            ck_assert(check_shape(1, 9, 3, ta, tb, -2.0f, 0.25f, 22));
        }
}
END_TEST

START_TEST(gemm_threaded_shape) {
    ck_assert(check_shape(257, 192, 320, 0, 1, 1.0f, 0.0f, 5));   /* > 4e6 MACs: runs threaded */
    ck_assert(check_shape(192, 257, 511, 1, 0, 1.0f, 1.0f, 6));
}
END_TEST

/* L(x, w, bias) = Σ g ⊙ (x·wᵀ + bias), in double. */
static double loss(const float *x, const float *w, const float *bias, const float *g, int M, int N, int K) {
    double L = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = bias[j];
            for (int k = 0; k < K; k++) s += (double)x[(size_t)i * K + k] * w[(size_t)j * K + k];
            L += s * g[(size_t)i * N + j];
        }
    return L;
}

START_TEST(gemm_linear_backward_finite_differences) {
    const int M = 6, N = 5, K = 7;
    uint64_t seed = 77;
    float x[M * K], w[N * K], bias[N], g[M * N], y[M * N], dx[M * K], dw[N * K], db[N];
    test_rng_fill(&seed, x, M * K, -1, 1);
    test_rng_fill(&seed, w, N * K, -1, 1);
    test_rng_fill(&seed, bias, N, -1, 1);
    test_rng_fill(&seed, g, M * N, -1, 1);
    gemm_linear_forward_ref(y, x, w, bias, M, N, K);
    ck_assert_double_eq_tol(loss(x, w, bias, g, M, N, K), ({ double s = 0; for (int i = 0; i < M * N; i++) s += (double)y[i] * g[i]; s; }), 1e-4);
    gemm_linear_backward_ref(dx, dw, db, g, x, w, M, N, K, 0);
    /* Perturb in float steps of 2^-10 (exact in fp32 for values in [-1,1]); the loss is linear in
     * each variable, so the central difference is exact up to double rounding. */
    const float h = 1.0f / 1024;
    float *vars[3] = {x, w, bias}, *grads[3] = {dx, dw, db};
    int n[3] = {M * K, N * K, N};
    for (int v = 0; v < 3; v++)
        for (int i = 0; i < n[v]; i++) {
            float keep = vars[v][i];
            vars[v][i] = keep + h;
            double lp = loss(x, w, bias, g, M, N, K);
            vars[v][i] = keep - h;
            double lm = loss(x, w, bias, g, M, N, K);
            vars[v][i] = keep;
            double fd = (lp - lm) / (2.0 * h);
            ck_assert_msg(fabs(fd - grads[v][i]) <= 1e-5 + 1e-5 * fabs(fd), "var %d [%d]: fd %.9g analytic %.9g",
                          v, i, fd, grads[v][i]);
        }
    /* accumulate adds onto what is there */
    float dx2[M * K], dw2[N * K], db2[N];
    for (int i = 0; i < M * K; i++) dx2[i] = 1.0f;
    for (int i = 0; i < N * K; i++) dw2[i] = -1.0f;
    for (int i = 0; i < N; i++) db2[i] = 2.0f;
    gemm_linear_backward_ref(dx2, dw2, db2, g, x, w, M, N, K, 1);
    for (int i = 0; i < M * K; i++) ck_assert_float_eq_tol(dx2[i], dx[i] + 1.0f, 1e-5);
    for (int i = 0; i < N * K; i++) ck_assert_float_eq_tol(dw2[i], dw[i] - 1.0f, 1e-5);
    for (int i = 0; i < N; i++) ck_assert_float_eq_tol(db2[i], db[i] + 2.0f, 1e-5);
    /* NULL outputs are skipped */
    gemm_linear_backward_ref(NULL, dw2, NULL, g, x, w, M, N, K, 0);
    for (int i = 0; i < N * K; i++) ck_assert_float_eq_tol(dw2[i], dw[i], 1e-6);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gemm_transposes_and_tails);
    tcase_add_test(tc, gemm_threaded_shape);
    tcase_add_test(tc, gemm_linear_backward_finite_differences);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
