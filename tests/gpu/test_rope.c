/*
 * tests/gpu/test_rope.c — GPU RoPE (kernels/rope.h) against the reference on the same bf16-rounded
 * inputs: HD 64 and 128, q and k (GQA head counts) and q alone, T = 1, positions restarting per
 * document and large positions (up to 131071) with Llama-3 scaled frequencies, the production
 * shape (8192 tokens, 32 + 8 heads, HD 128); backward as the inverse rotation.
 *
 * Tolerance: each output is x0·cos − x1·sin in fp32 from the same bf16 inputs and the same fp32
 * angle, rounded once to bf16; GPU sincosf and glibc sinf/cosf differ by ~1 ulp (even at angle
 * 1.3e5, where both reduce the argument exactly): rtol 1.6e-2, atol 1e-2 for |x| ≤ 2.
 */
#include "kernels/rope.h"
#include "k1util.h"

static void one(int T, int NH, int NKV, int HD, int with_k, int llama3, int max_pos, uint64_t seed) {
    size_t nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    float *q = k1_randn(&seed, nq, -2, 2), *k = k1_randn(&seed, nk, -2, 2), *got = malloc(4 * nq + 4);
    int32_t *pos = malloc(4 * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = (int32_t)(test_rng_next(&seed) % (uint64_t)(max_pos + 1));
    if (T > 3) pos[0] = 0, pos[1] = 1, pos[2] = max_pos;
    float inv[128];
    struct rope_config cfg = {.theta = llama3 ? 5e5 : 1e6, .head_dim = HD};
    if (llama3) {
        cfg.scaling = ROPE_SCALING_LLAMA3; cfg.factor = 8; cfg.low_freq_factor = 1; cfg.high_freq_factor = 4;
        cfg.original_max_positions = 8192;
    }
    ck_assert_int_eq(rope_inv_freq(inv, &cfg), 0);
    bf16 *d_q = k1_upload_bf16(q, nq), *d_k = k1_upload_bf16(k, nk);
    int32_t *d_pos = k1_upload(pos, 4 * (size_t)T);
    float *d_inv = k1_upload(inv, 4 * (size_t)(HD / 2));
    K1_LAUNCH(rope_forward(d_q, with_k ? d_k : NULL, d_pos, d_inv, T, NH, NKV, HD, 0));
    K1_CUDA(cudaDeviceSynchronize());
    float *q0 = malloc(4 * nq), *k0 = malloc(4 * nk);
    memcpy(q0, q, 4 * nq);
    memcpy(k0, k, 4 * nk);
    rope_forward_ref(q, with_k ? k : NULL, pos, inv, T, NH, NKV, HD);
    char what[96];
    snprintf(what, sizeof what, "rope T=%d NH=%d NKV=%d HD=%d k=%d llama3=%d", T, NH, NKV, HD, with_k, llama3);
    k1_download_bf16(got, d_q, nq);
    ck_assert_msg(test_allclose("q", got, q, nq, 1e-2, 1.6e-2), "%s", what);
    k1_download_bf16(got, d_k, nk);
    ck_assert_msg(test_allclose("k", got, k, nk, 1e-2, 1.6e-2), "%s", what);   /* untouched when with_k = 0 */
    /* backward: the inverse rotation brings the rotated tensors back to the inputs (two roundings) */
    K1_LAUNCH(rope_backward(d_q, with_k ? d_k : NULL, d_pos, d_inv, T, NH, NKV, HD, 0));
    K1_CUDA(cudaDeviceSynchronize());
    k1_download_bf16(got, d_q, nq);
    ck_assert_msg(test_allclose("q back", got, q0, nq, 2e-2, 1.6e-2), "%s", what);
    k1_download_bf16(got, d_k, nk);
    ck_assert_msg(test_allclose("k back", got, k0, nk, 2e-2, 1.6e-2), "%s", what);
    cudaFree(d_q); cudaFree(d_k); cudaFree(d_pos); cudaFree(d_inv);
    free(q); free(k); free(got); free(pos); free(q0); free(k0);
}

START_TEST(rope_gpu_shapes) {
    one(1, 1, 1, 64, 1, 0, 0, 1);
    one(37, 4, 2, 64, 1, 0, 300, 2);
    one(37, 4, 2, 128, 0, 0, 300, 3);
    one(101, 8, 1, 128, 1, 1, 131071, 4);
    one(16, 3, 3, 16, 1, 0, 50, 5);
}
END_TEST

START_TEST(rope_gpu_production) {
    one(8192, 32, 8, 128, 1, 0, 8191, 6);
}
END_TEST

START_TEST(rope_gpu_preconditions) {
    bf16 *q = k1_malloc(4096);
    ck_assert_int_eq(rope_forward(q, NULL, NULL, NULL, 4, 2, 2, 72, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of 16"));
    cudaFree(q);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_rope");
    TCase *tc = tcase_create("gpu_rope");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rope_gpu_shapes);
    tcase_add_test(tc, rope_gpu_production);
    tcase_add_test(tc, rope_gpu_preconditions);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
