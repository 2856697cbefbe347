/*
 * tests/test_adamw.c — AdamW reference, global grad norm, clipping and the lr schedules
 * (kernels/adamw.h), against hand-computed values and an independent double-precision loop.
 */
#include "kernels/adamw.h"
#include "testutil.h"

static adamw_params params(float lr, int step, float max_norm) {
    adamw_params p = {lr, 0.9f, 0.999f, 1e-8f, 0.01f, step, max_norm};
    return p;
}

/* One step by hand: w=1, g=0.5, lr 0.1, wd 0.01, t=1: m=0.05, v=2.5e-4, m̂=0.5, v̂=0.25,
 * w = 1·(1 - 0.001) - 0.1·0.5/(0.5 + 1e-8) = 0.899. */
START_TEST(adamw_hand_step) {
    float w = 1, m = 0, v = 0, g = 0.5f;
    bf16 copy = 0;
    char err[256];
    adamw_params p = params(0.1f, 1, 0);
    ck_assert_int_eq(adamw_step_ref(&w, &m, &v, &g, &copy, 1, &p, 0.25, err, sizeof err), 0);
    ck_assert_float_eq_tol(m, 0.05f, 1e-7f);
    ck_assert_float_eq_tol(v, 2.5e-4f, 1e-8f);   /* 1 - 0.999f is 9.99987e-4 in float */
    ck_assert_float_eq_tol(w, 0.899f, 1e-6f);
    ck_assert_uint_eq(copy, float_to_bf16(w));
    p.step = 0;
    ck_assert_int_eq(adamw_step_ref(&w, &m, &v, &g, &copy, 1, &p, 0.25, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "step=0"));
}
END_TEST

/* Several steps on random tensors against a straightforward double loop (torch.optim.AdamW). */
START_TEST(adamw_matches_double_loop) {
    enum { n = 1000 };
    uint64_t rng = 5;
    static float w[n], m[n], v[n], g[n];
    static double wd_[n], md[n], vd[n];
    static bf16 copy[n];
    test_rng_fill(&rng, w, n, -1, 1);
    for (int i = 0; i < n; i++) { wd_[i] = w[i]; md[i] = vd[i] = 0; m[i] = v[i] = 0; }
    char err[256];
    for (int t = 1; t <= 5; t++) {
        test_rng_fill(&rng, g, n, -0.1f, 0.1f);
        adamw_params p = params(1e-3f * t, t, 0);
        ck_assert_int_eq(adamw_step_ref(w, m, v, g, copy, n, &p, 0, err, sizeof err), 0);
        for (int i = 0; i < n; i++) {
            double lr = 1e-3 * t;
            wd_[i] *= 1 - lr * 0.01;
            md[i] = 0.9 * md[i] + 0.1 * g[i];
            vd[i] = 0.999 * vd[i] + 0.001 * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(0.9, t)), vh = vd[i] / (1 - pow(0.999, t));
            wd_[i] -= lr * mh / (sqrt(vh) + 1e-8);
        }
    }
    float ref[n];
    for (int i = 0; i < n; i++) ref[i] = (float)wd_[i];
    ck_assert(test_allclose("adamw master", w, ref, n, 1e-6, 1e-5));
    for (int i = 0; i < n; i++) ck_assert_uint_eq(copy[i], float_to_bf16(w[i]));
}
END_TEST

/* Global norm over two tensors; clipping with norm 2.5 > max 1 equals a step on grads scaled by
 * 1/(2.5 + 1e-6); below the threshold the grads are unchanged. */
START_TEST(adamw_clip) {
    float g1[3] = {1.5f, 0, 0}, g2[2] = {0, 2.0f};
    double ss = 0;
    adamw_grad_sumsq_ref(g1, 3, &ss);
    adamw_grad_sumsq_ref(g2, 2, &ss);
    ck_assert_double_eq_tol(ss, 6.25, 1e-12);
    ck_assert_float_eq_tol(adamw_clip_factor(ss, 1.0f), (float)(1.0 / (2.5 + 1e-6)), 1e-9f);
    ck_assert_float_eq(adamw_clip_factor(ss, 5.0f), 1.0f);
    ck_assert_float_eq(adamw_clip_factor(ss, 0.0f), 1.0f);
    float w1[3] = {0.3f, -0.2f, 0.1f}, m1[3] = {0}, v1[3] = {0};
    float w2[3] = {0.3f, -0.2f, 0.1f}, m2[3] = {0}, v2[3] = {0}, gs[3];
    float c = (float)(1.0 / (2.5 + 1e-6));
    for (int i = 0; i < 3; i++) gs[i] = g1[i] * c;
    char err[256];
    adamw_params p = params(0.01f, 1, 1.0f), q = params(0.01f, 1, 0);
    adamw_step_ref(w1, m1, v1, g1, NULL, 3, &p, ss, err, sizeof err);
    adamw_step_ref(w2, m2, v2, gs, NULL, 3, &q, 0, err, sizeof err);
    ck_assert(test_allclose("clipped m", m1, m2, 3, 0, 1e-6));
    ck_assert(test_allclose("clipped w", w1, w2, 3, 0, 1e-6));
    ck_assert_float_eq_tol(m1[0], 0.1f * 1.5f / 2.5f, 1e-6f);
}
END_TEST

START_TEST(adamw_schedules) {
    /* linear: f(s) = s/w below w, then (S-s)/(S-w), never below 0 */
    ck_assert_double_eq(adamw_lr_linear(0, 1000, 10), 0);
    ck_assert_double_eq_tol(adamw_lr_linear(5, 1000, 10), 0.5, 1e-12);
    ck_assert_double_eq_tol(adamw_lr_linear(10, 1000, 10), 1.0, 1e-12);
    ck_assert_double_eq_tol(adamw_lr_linear(505, 1000, 10), 0.5, 1e-12);
    ck_assert_double_eq(adamw_lr_linear(1000, 1000, 10), 0);
    ck_assert_double_eq(adamw_lr_linear(1200, 1000, 10), 0);
    ck_assert_double_eq_tol(adamw_lr_linear(0, 100, 0), 1.0, 1e-12);   /* no warm-up: full lr at step 0 */
    /* cosine (0.5 cycles): 1 at the end of warm-up, 0.5 half way, 0 at the end */
    ck_assert_double_eq_tol(adamw_lr_cosine(5, 1000, 10), 0.5, 1e-12);
    ck_assert_double_eq_tol(adamw_lr_cosine(10, 1000, 10), 1.0, 1e-12);
    ck_assert_double_eq_tol(adamw_lr_cosine(505, 1000, 10), 0.5, 1e-12);
    ck_assert_double_eq_tol(adamw_lr_cosine(260, 1010, 10), 0.5 * (1 + cos(M_PI * 0.25)), 1e-12);
    ck_assert_double_eq_tol(adamw_lr_cosine(1000, 1000, 10), 0, 1e-12);
}
END_TEST

int main(void) {
    Suite *s = suite_create("adamw");
    TCase *tc = tcase_create("ref");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, adamw_hand_step);
    tcase_add_test(tc, adamw_matches_double_loop);
    tcase_add_test(tc, adamw_clip);
    tcase_add_test(tc, adamw_schedules);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
