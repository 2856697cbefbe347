/*
 * tests/test_swiglu.c — the SwiGLU references (kernels/swiglu.h): forward against a naive double
 * computation for separate and fused [T,2I] layouts, backward against finite differences in double,
 * and the in-place (aliased) backward.
 */
#include "kernels/swiglu.h"
#include "testutil.h"

static double silu(double g) { return g / (1.0 + exp(-g)); }

START_TEST(swiglu_forward_layouts) {
    const int T = 7, I = 13;
    uint64_t seed = 9;
    float gu[T * 2 * I], out[T * I], out2[T * I], ref[T * I], gate[T * I], up[T * I];
    test_rng_fill(&seed, gu, T * 2 * I, -6, 6);
    swiglu_forward_ref(out, gu, gu + I, T, I, 2 * I);   /* fused layout */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            double g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
            ref[t * I + i] = (float)(silu(g) * u);
            gate[t * I + i] = (float)g;
            up[t * I + i] = (float)u;
        }
    ck_assert(test_allclose("swiglu fused", out, ref, T * I, 1e-6, 1e-5));
    swiglu_forward_ref(out2, gate, up, T, I, I);   /* separate tensors */
    ck_assert(test_allclose("swiglu separate", out2, out, T * I, 0, 0));
    float one = 0;
    float g1 = 1.5f, u1 = -2.0f;
    swiglu_forward_ref(&one, &g1, &u1, 1, 1, 1);
    ck_assert_float_eq_tol(one, (float)(silu(1.5) * -2.0), 1e-6);
}
END_TEST

START_TEST(swiglu_backward_finite_differences) {
    const int T = 3, I = 8;
    uint64_t seed = 10;
    float gu[T * 2 * I], d[T * I], dgu[T * 2 * I];
    test_rng_fill(&seed, gu, T * 2 * I, -5, 5);
    test_rng_fill(&seed, d, T * I, -1, 1);
    swiglu_backward_ref(dgu, dgu + I, d, gu, gu + I, T, I, 2 * I);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            double g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i], dd = d[t * I + i], h = 1e-4;
            double fdg = (silu(g + h) - silu(g - h)) / (2 * h) * u * dd;
            double fdu = silu(g) * dd;   /* linear in u */
            ck_assert_msg(fabs(fdg - dgu[t * 2 * I + i]) <= 1e-5 + 1e-4 * fabs(fdg), "dgate %.9g vs fd %.9g",
                          dgu[t * 2 * I + i], fdg);
            ck_assert_msg(fabs(fdu - dgu[t * 2 * I + I + i]) <= 1e-5 + 1e-5 * fabs(fdu), "dup %.9g vs %.9g",
                          dgu[t * 2 * I + I + i], fdu);
        }
    /* the gradient may overwrite the inputs in place */
    float alias[T * 2 * I];
    memcpy(alias, gu, sizeof gu);
    swiglu_backward_ref(alias, alias + I, d, alias, alias + I, T, I, 2 * I);
    ck_assert(test_allclose("swiglu backward in place", alias, dgu, T * 2 * I, 0, 0));
}
END_TEST

int main(void) {
    Suite *s = suite_create("swiglu");
    TCase *tc = tcase_create("swiglu");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, swiglu_forward_layouts);
    tcase_add_test(tc, swiglu_backward_finite_differences);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
