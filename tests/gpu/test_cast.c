/*
 * tests/gpu/test_cast.c — GPU casts (kernels/cast.h) bit-exact against the host conversions: sizes
 * 1, 7, 8 and 1000003, aligned (vector path) and offset by one element (scalar path), ties to
 * even, infinities; NaN stays NaN (its payload may differ).
 */
#include "kernels/cast.h"
#include "k1util.h"

static void one(size_t n, int off, uint64_t seed) {
    float *x = k1_randn(&seed, n, -1000, 1000);
    if (n > 4) {
        uint32_t tie = 0x3f808000u;
        memcpy(&x[0], &tie, 4);
        x[1] = INFINITY; x[2] = -INFINITY; x[3] = NAN;
    }
    bf16 *want = malloc(2 * n), *got = malloc(2 * n);
    cast_f32_to_bf16_ref(want, x, n);
    float *d_x = k1_malloc(4 * (n + 1));
    bf16 *d_b = k1_malloc(2 * (n + 1));
    K1_CUDA(cudaMemcpy(d_x + off, x, 4 * n, cudaMemcpyHostToDevice));
    K1_LAUNCH(cast_f32_to_bf16(d_b + off, d_x + off, n, 0));
    K1_CUDA(cudaMemcpy(got, d_b + off, 2 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        int nan = (want[i] & 0x7f80) == 0x7f80 && (want[i] & 0x7f);
        if (nan) ck_assert_msg((got[i] & 0x7f80) == 0x7f80 && (got[i] & 0x7f), "[%zu] NaN became 0x%04x", i, got[i]);
        else ck_assert_msg(got[i] == want[i], "n=%zu off=%d [%zu]: got 0x%04x want 0x%04x", n, off, i, got[i], want[i]);
    }
    /* and back: exact */
    float *back = malloc(4 * n), *wantf = malloc(4 * n);
    cast_bf16_to_f32_ref(wantf, got, n);
    K1_CUDA(cudaMemset(d_x, 0xff, 4 * (n + 1)));
    K1_LAUNCH(cast_bf16_to_f32(d_x + off, d_b + off, n, 0));
    K1_CUDA(cudaMemcpy(back, d_x + off, 4 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&back[i], &wantf[i], 4) == 0 || (isnan(back[i]) && isnan(wantf[i])), "back [%zu]", i);
    cudaFree(d_x); cudaFree(d_b);
    free(x); free(want); free(got); free(back); free(wantf);
}

START_TEST(cast_gpu) {
    size_t ns[] = {1, 7, 8, 1000003};
    for (int i = 0; i < 4; i++) {
        one(ns[i], 0, 1 + i);
        one(ns[i], 1, 11 + i);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_cast");
    TCase *tc = tcase_create("gpu_cast");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cast_gpu);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
