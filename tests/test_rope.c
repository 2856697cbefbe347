/*
 * tests/test_rope.c — RoPE (kernels/rope.h): inverse frequencies (default and Llama-3 scaling)
 * against the Hugging Face formulas in double, the rotate-half forward against a naive double
 * rotation with a position per token (q and k, GQA head counts), the backward against finite
 * differences in double and as the exact inverse of the forward; invalid configurations fail.
 */
#include "kernels/rope.h"
#include "testutil.h"

START_TEST(rope_inv_freq_default_and_llama3) {
    float f[64];
    struct rope_config cfg = {.theta = 1e6, .head_dim = 128};
    ck_assert_int_eq(rope_inv_freq(f, &cfg), 0);
    for (int i = 0; i < 64; i++) ck_assert_double_eq_tol(f[i], pow(1e6, -2.0 * i / 128), 3e-6 * pow(1e6, -2.0 * i / 128));
    /* head dim 96 (not a power of two): the fp32 exponent rounds, still within a few ulps */
    struct rope_config c96 = {.theta = 1e4, .head_dim = 96};
    ck_assert_int_eq(rope_inv_freq(f, &c96), 0);
    for (int i = 0; i < 48; i++) ck_assert_double_eq_tol(f[i], pow(1e4, -2.0 * i / 96), 3e-6 * pow(1e4, -2.0 * i / 96));

    /* Llama-3.1-8B: theta 5e5, factor 8, low 1, high 4, original 8192 */
    struct rope_config l3 = {.theta = 5e5, .head_dim = 128, .scaling = ROPE_SCALING_LLAMA3, .factor = 8,
                             .low_freq_factor = 1, .high_freq_factor = 4, .original_max_positions = 8192};
    ck_assert_int_eq(rope_inv_freq(f, &l3), 0);
    int n_high = 0, n_low = 0, n_mid = 0;
    for (int i = 0; i < 64; i++) {
        double base = pow(5e5, -2.0 * i / 128), wl = 2 * M_PI / base, want;
        if (wl < 8192.0 / 4) { want = base; n_high++; }
        else if (wl > 8192.0 / 1) { want = base / 8; n_low++; }
        else {
            double s = (8192.0 / wl - 1) / (4 - 1);
            want = (1 - s) * base / 8 + s * base;
            n_mid++;
        }
        ck_assert_msg(fabs(f[i] - want) <= 3e-6 * want, "llama3 inv_freq[%d] %.9g want %.9g", i, f[i], want);
    }
    ck_assert(n_high > 0 && n_low > 0 && n_mid > 0);   /* all three branches were exercised */
    ck_assert_double_eq_tol(f[0], 1.0, 1e-7);
    ck_assert_double_eq_tol(f[63], pow(5e5, -126.0 / 128) / 8, 1e-6 * f[63]);

    struct rope_config bad = {.theta = 1e4, .head_dim = 7};
    ck_assert_int_eq(rope_inv_freq(f, &bad), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "even"));
    struct rope_config bad2 = l3;
    bad2.high_freq_factor = 0.5;
    ck_assert_int_eq(rope_inv_freq(f, &bad2), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "llama3"));
}
END_TEST

/* naive rotation of x [rows, HD] in double, angle = the fp32 product like HF. */
static void naive(double *y, const float *x, int T, int H, int HD, const int32_t *pos, const float *inv, int sign) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < HD / 2; i++) {
                float a = (float)pos[t] * inv[i];
                double c = cos((double)a), s = sign * sin((double)a);
                const float *v = x + ((size_t)t * H + h) * HD;
                double *o = y + ((size_t)t * H + h) * HD;
                o[i] = v[i] * c - v[i + HD / 2] * s;
                o[i + HD / 2] = v[i + HD / 2] * c + v[i] * s;
            }
}

START_TEST(rope_forward_backward) {
    enum { T = 6, NH = 4, NKV = 2, HD = 16 };
    int32_t pos[T] = {0, 1, 2, 0, 1, 4093};   /* two documents; a large position */
    float inv[HD / 2], q[T * NH * HD], k[T * NKV * HD], q0[T * NH * HD], k0[T * NKV * HD], ref[T * NH * HD];
    double yd[T * NH * HD];
    struct rope_config cfg = {.theta = 1e4, .head_dim = HD};
    ck_assert_int_eq(rope_inv_freq(inv, &cfg), 0);
    uint64_t seed = 12;
    test_rng_fill(&seed, q, T * NH * HD, -2, 2);
    test_rng_fill(&seed, k, T * NKV * HD, -2, 2);
    memcpy(q0, q, sizeof q);
    memcpy(k0, k, sizeof k);
    rope_forward_ref(q, k, pos, inv, T, NH, NKV, HD);
    naive(yd, q0, T, NH, HD, pos, inv, 1);
    for (int i = 0; i < T * NH * HD; i++) ref[i] = (float)yd[i];
    /* cosf/sinf vs cos/sin of the same fp32 angle: a few ulps */
    ck_assert(test_allclose("rope q", q, ref, T * NH * HD, 1e-6, 1e-5));
    naive(yd, k0, T, NKV, HD, pos, inv, 1);
    for (int i = 0; i < T * NKV * HD; i++) ref[i] = (float)yd[i];
    ck_assert(test_allclose("rope k", k, ref, T * NKV * HD, 1e-6, 1e-5));
    /* position 0 is the identity */
    ck_assert(test_allclose("rope pos 0", q, q0, NH * HD, 0, 0));

    /* backward: L = Σ g ⊙ rope(x) is linear in x; central differences in double are exact up to
     * rounding, and the analytic gradient is the inverse rotation of g */
    float g[T * NH * HD], dq[T * NH * HD];
    test_rng_fill(&seed, g, T * NH * HD, -1, 1);
    memcpy(dq, g, sizeof g);
    rope_backward_ref(dq, NULL, pos, inv, T, NH, NKV, HD);
    float x[T * NH * HD];
    memcpy(x, q0, sizeof x);
    for (int i = 0; i < T * NH * HD; i += 7) {
        const float h = 1.0f / 256;
        float keep = x[i];
        double lp = 0, lm = 0;
        x[i] = keep + h; naive(yd, x, T, NH, HD, pos, inv, 1);
        for (int j = 0; j < T * NH * HD; j++) lp += yd[j] * g[j];
        x[i] = keep - h; naive(yd, x, T, NH, HD, pos, inv, 1);
        for (int j = 0; j < T * NH * HD; j++) lm += yd[j] * g[j];
        x[i] = keep;
        double fd = (lp - lm) / (2.0 * h);
        ck_assert_msg(fabs(fd - dq[i]) <= 1e-5 + 1e-5 * fabs(fd), "dq[%d]: fd %.9g analytic %.9g", i, fd, dq[i]);
    }
    /* backward(forward(x)) == x */
    rope_backward_ref(q, k, pos, inv, T, NH, NKV, HD);
    ck_assert(test_allclose("rope inverse q", q, q0, T * NH * HD, 1e-5, 1e-5));
    ck_assert(test_allclose("rope inverse k", k, k0, T * NKV * HD, 1e-5, 1e-5));
}
END_TEST

int main(void) {
    Suite *s = suite_create("rope");
    TCase *tc = tcase_create("rope");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, rope_inv_freq_default_and_llama3);
    tcase_add_test(tc, rope_forward_backward);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
