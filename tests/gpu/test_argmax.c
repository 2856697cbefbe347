/*
 * tests/gpu/test_argmax.c — the device row argmax (kernels/argmax.h) against the reference loop, exactly: rows of
 * random values, rows of a small pool of values (ties, ±inf, NaN, signed zeros), rows whose element 0 is NaN, rows
 * of all NaN but one, at V = 1, 7, 1000, 1025 and 151936 (Qwen3's vocabulary) and R = 1..17.
 */
#include "kernels/argmax.h"
#include "k1util.h"

#include <math.h>

static void one(int R, int V, int mode, uint64_t seed) {
    static const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, 2.5f, NAN, INFINITY, -INFINITY, 3.0f, -7.0f, 0.5f};
    size_t n = (size_t)R * V;
    float *x = malloc(4 * n);
    ck_assert_ptr_nonnull(x);
    for (size_t e = 0; e < n; e++) {
        uint64_t r = kernels_rng_next(&seed);
        x[e] = mode == 1 ? pool[r % (sizeof pool / sizeof pool[0])]
                         : (float)((double)(r >> 11) / 9007199254740992.0 * 20.0 - 10.0);
        if (mode == 2 && e % (size_t)V == 0) x[e] = NAN;                              /* element 0 NaN */
        if (mode == 3 && (e % (size_t)V) != (size_t)(r % (uint64_t)V)) x[e] = NAN;   /* mostly NaN */
    }
    int32_t *want = malloc(4 * (size_t)R), *got = malloc(4 * (size_t)R);
    argmax_rows_ref(want, x, R, V);
    float *d_x = k1_upload(x, 4 * n);
    int32_t *d_out = k1_malloc(4 * (size_t)R);
    k1_poison(d_out, 4 * (size_t)R);
    K1_LAUNCH(argmax_rows(d_out, d_x, R, V, 0));
    K1_CUDA(cudaDeviceSynchronize());
    K1_CUDA(cudaMemcpy(got, d_out, 4 * (size_t)R, cudaMemcpyDeviceToHost));
    for (int r = 0; r < R; r++)
        ck_assert_msg(got[r] == want[r], "argmax R=%d V=%d mode %d row %d: device %d, reference %d", R, V, mode, r,
                      got[r], want[r]);
    cudaFree(d_x);
    cudaFree(d_out);
    free(x);
    free(want);
    free(got);
}

START_TEST(argmax_gpu_equals_reference) {
    const int Vs[] = {1, 7, 1000, 1025, 151936};
    uint64_t seed = 77;
    for (int vi = 0; vi < 5; vi++)
        for (int mode = 0; mode < 4; mode++)
            for (int R = 1; R <= 17; R += 8) one(R, Vs[vi], mode, seed++);
}
END_TEST

START_TEST(argmax_gpu_preconditions) {
    int32_t *o = k1_malloc(64);
    float *x = k1_malloc(64);
    ck_assert_int_eq(argmax_rows(o, x, 2, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "V >= 1"));
    ck_assert_int_eq(argmax_rows(o, x, -1, 4, 0), -1);
    ck_assert_int_eq(argmax_rows(o, x, 0, 4, 0), 0);
    cudaFree(o);
    cudaFree(x);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_argmax");
    TCase *tc = tcase_create("gpu_argmax");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, argmax_gpu_equals_reference);
    tcase_add_test(tc, argmax_gpu_preconditions);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
