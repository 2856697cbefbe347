/*
 * tests/test_rmsnorm.c — the RMSNorm references (kernels/rmsnorm.h): forward against a naive double
 * computation (plain, fused residual, per-head q/k norm), backward against finite differences in
 * double (dx and dw), accumulate_dx for the fused-residual backward.
 */
#include "kernels/rmsnorm.h"
#include "testutil.h"

static void naive_norm(double *y, const double *x, const float *w, int N, int C, double eps) {
    for (int r = 0; r < N; r++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += x[r * C + c] * x[r * C + c];
        double rs = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) y[r * C + c] = w[c] * x[r * C + c] * rs;
    }
}

static double loss(const float *x, const float *w, const float *g, int N, int C, double eps) {
    double *xd = malloc(sizeof(double) * N * C), *y = malloc(sizeof(double) * N * C), L = 0;
    for (int i = 0; i < N * C; i++) xd[i] = x[i];
    naive_norm(y, xd, w, N, C, eps);
    for (int i = 0; i < N * C; i++) L += y[i] * g[i];
    free(xd); free(y);
    return L;
}

START_TEST(rmsnorm_forward_matches_naive) {
    int shapes[][2] = {{1, 1}, {3, 40}, {7, 129}, {16, 4096}};
    uint64_t seed = 3;
    for (int s = 0; s < 4; s++) {
        int N = shapes[s][0], C = shapes[s][1];
        float *x = malloc(sizeof(float) * N * C), *w = malloc(sizeof(float) * C), *y = malloc(sizeof(float) * N * C);
        float *rstd = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N * C);
        double *xd = malloc(sizeof(double) * N * C), *yd = malloc(sizeof(double) * N * C);
        test_rng_fill(&seed, x, (size_t)N * C, -3, 3);
        test_rng_fill(&seed, w, C, 0.5, 1.5);
        for (int i = 0; i < N * C; i++) xd[i] = x[i];
        rmsnorm_forward_ref(y, rstd, x, w, N, C, 1e-6f);
        naive_norm(yd, xd, w, N, C, 1e-6);
        for (int i = 0; i < N * C; i++) ref[i] = (float)yd[i];
        ck_assert(test_allclose("rmsnorm y", y, ref, (size_t)N * C, 1e-6, 1e-5));
        for (int r = 0; r < N; r++) {
            double ss = 0;
            for (int c = 0; c < C; c++) ss += xd[r * C + c] * xd[r * C + c];
            ck_assert_double_eq_tol(rstd[r], 1.0 / sqrt(ss / C + 1e-6), 1e-5 / sqrt(ss / C + 1e-6));
        }
        /* in place (y aliases x) gives the same result */
        rmsnorm_forward_ref(x, NULL, x, w, N, C, 1e-6f);
        ck_assert(test_allclose("rmsnorm in place", x, y, (size_t)N * C, 0, 0));
        free(x); free(w); free(y); free(rstd); free(ref); free(xd); free(yd);
    }
}
END_TEST

START_TEST(rmsnorm_residual_and_qk_norm) {
    const int T = 5, NH = 3, HD = 16, C = NH * HD;
    uint64_t seed = 4;
    float x[T * C], r[T * C], r0[T * C], w[C], y[T * C], rstd[T], h[T * C], y2[T * C];
    test_rng_fill(&seed, x, T * C, -2, 2);
    test_rng_fill(&seed, r, T * C, -2, 2);
    test_rng_fill(&seed, w, C, 0.5, 1.5);
    memcpy(r0, r, sizeof r);
    rmsnorm_residual_forward_ref(y, r, rstd, x, w, T, C, 1e-5f);
    for (int i = 0; i < T * C; i++) h[i] = x[i] + r0[i];
    ck_assert(test_allclose("residual updated", r, h, T * C, 0, 0));
    rmsnorm_forward_ref(y2, NULL, h, w, T, C, 1e-5f);
    ck_assert(test_allclose("residual y", y, y2, T * C, 0, 0));

    /* q/k norm: rows = T·NH over HD, weight [HD] shared by the heads; check head by head */
    float qn[T * C];
    rmsnorm_forward_ref(qn, NULL, x, w, T * NH, HD, 1e-6f);
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < NH; hh++) {
            const float *v = x + (t * NH + hh) * HD;
            double ss = 0;
            for (int c = 0; c < HD; c++) ss += (double)v[c] * v[c];
            for (int c = 0; c < HD; c++)
                ck_assert_double_eq_tol(qn[(t * NH + hh) * HD + c], w[c] * v[c] / sqrt(ss / HD + 1e-6), 1e-5);
        }
}
END_TEST

START_TEST(rmsnorm_backward_finite_differences) {
    const int N = 4, C = 11;
    const double eps = 1e-5;
    uint64_t seed = 5;
    float x[N * C], w[C], g[N * C], y[N * C], rstd[N], dx[N * C], dw[C];
    test_rng_fill(&seed, x, N * C, -2, 2);
    test_rng_fill(&seed, w, C, 0.5, 1.5);
    test_rng_fill(&seed, g, N * C, -1, 1);
    rmsnorm_forward_ref(y, rstd, x, w, N, C, (float)eps);
    for (int i = 0; i < C; i++) dw[i] = 0.25f;   /* dw accumulates */
    rmsnorm_backward_ref(dx, dw, g, x, w, rstd, N, C, 0);
    const float h = 1.0f / 512;
    for (int i = 0; i < N * C; i++) {
        float keep = x[i];
        x[i] = keep + h; double lp = loss(x, w, g, N, C, eps);
        x[i] = keep - h; double lm = loss(x, w, g, N, C, eps);
        x[i] = keep;
        double fd = (lp - lm) / (2.0 * h);   /* O(h²) truncation: ~1e-5 relative at these sizes */
        ck_assert_msg(fabs(fd - dx[i]) <= 1e-4 + 1e-3 * fabs(fd), "dx[%d]: fd %.9g analytic %.9g", i, fd, dx[i]);
    }
    for (int c = 0; c < C; c++) {
        float keep = w[c];
        w[c] = keep + h; double lp = loss(x, w, g, N, C, eps);
        w[c] = keep - h; double lm = loss(x, w, g, N, C, eps);
        w[c] = keep;
        double fd = (lp - lm) / (2.0 * h);   /* linear in w: exact up to rounding */
        ck_assert_msg(fabs(fd - (dw[c] - 0.25)) <= 1e-4 + 1e-4 * fabs(fd), "dw[%d]: fd %.9g analytic %.9g", c, fd,
                      dw[c] - 0.25);
    }
    /* fused-residual backward: accumulate_dx adds onto the gradient the residual stream carries */
    float dh[N * C];
    for (int i = 0; i < N * C; i++) dh[i] = (float)i * 0.01f;
    rmsnorm_backward_ref(dh, NULL, g, x, w, rstd, N, C, 1);
    for (int i = 0; i < N * C; i++) ck_assert_float_eq_tol(dh[i], (float)i * 0.01f + dx[i], 1e-5);
}
END_TEST

int main(void) {
    Suite *s = suite_create("rmsnorm");
    TCase *tc = tcase_create("rmsnorm");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, rmsnorm_forward_matches_naive);
    tcase_add_test(tc, rmsnorm_residual_and_qk_norm);
    tcase_add_test(tc, rmsnorm_backward_finite_differences);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
