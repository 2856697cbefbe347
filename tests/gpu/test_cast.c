/*
 * tests/gpu/test_cast.c — GPU casts (kernels/cast.h) bit-exact against the host conversions: sizes
 * 1, 7, 8 and 1000003, aligned (vector path) and offset by one element (scalar path), ties to
 * even, infinities; NaN stays NaN (its payload may differ). bf16 -> fp32 also on every bit pattern
 * class with the source 8 bytes off a 16-byte boundary (the 4-element path takes it) and 2 bytes
 * off (element path).
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

/* bf16 -> fp32 of random bit patterns (NaNs and infinities included), source soff elements past a
 * 16-byte boundary, destination aligned: bit-exact (the widening is a 16-bit shift). */
static void up(size_t n, int soff, uint64_t seed) {
    bf16 *h = malloc(2 * n);
    for (size_t i = 0; i < n; i++) h[i] = (bf16)test_rng_next(&seed);
    bf16 *d_b = k1_malloc(2 * (n + 8));
    float *d_x = k1_malloc(4 * (n + 1)), *got = malloc(4 * (n + 1));
    K1_CUDA(cudaMemcpy(d_b + soff, h, 2 * n, cudaMemcpyHostToDevice));
    K1_CUDA(cudaMemset(d_x, 0xff, 4 * (n + 1)));
    K1_LAUNCH(cast_bf16_to_f32(d_x, d_b + soff, n, 0));
    K1_CUDA(cudaMemcpy(got, d_x, 4 * (n + 1), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        uint32_t u, want = (uint32_t)h[i] << 16;
        memcpy(&u, &got[i], 4);
        ck_assert_msg(u == want, "n=%zu soff=%d [%zu]: got 0x%08x want 0x%08x", n, soff, i, u, want);
    }
    uint32_t past;
    memcpy(&past, &got[n], 4);
    ck_assert_msg(past == 0xffffffffu, "n=%zu soff=%d: wrote past the end", n, soff);
    cudaFree(d_b); cudaFree(d_x);
    free(h); free(got);
}

START_TEST(cast_gpu_up) {
    size_t ns[] = {1, 3, 4, 5, 1000003, 4194304};
    for (int i = 0; i < 6; i++) {
        up(ns[i], 0, 21 + i);
        up(ns[i], 4, 31 + i);
        up(ns[i], 1, 41 + i);
    }
}
END_TEST

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
    tcase_add_test(tc, cast_gpu_up);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
