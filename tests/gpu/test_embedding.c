/*
 * tests/gpu/test_embedding.c — GPU embedding gather (kernels/embedding.h): bit-exact rows against the
 * reference (pure copies), T = 1, the production width C = 4096 with ids at 0 and V-1, NaN rows for
 * out-of-range ids, and the precondition sentences.
 */
#include "kernels/embedding.h"
#include "k1util.h"

static void one(int T, int C, int V, uint64_t seed) {
    float *table = k1_randn(&seed, (size_t)V * C, -1, 1), *out = malloc(4 * (size_t)T * C), *got = malloc(4 * (size_t)T * C);
    int32_t *ids = malloc(4 * (size_t)T);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(test_rng_next(&seed) % (uint64_t)V);
    if (T >= 2) ids[0] = 0, ids[T - 1] = V - 1;
    bf16 *d_table = k1_upload_bf16(table, (size_t)V * C), *d_out = k1_malloc(2 * (size_t)T * C);
    int32_t *d_ids = k1_upload(ids, 4 * (size_t)T);
    k1_poison(d_out, 2 * (size_t)T * C);
    K1_LAUNCH(embedding_forward(d_out, d_ids, d_table, T, C, V, 0));
    K1_CUDA(cudaDeviceSynchronize());
    ck_assert_int_eq(embedding_forward_ref(out, ids, table, T, C, V), 0);
    k1_download_bf16(got, d_out, (size_t)T * C);
    ck_assert(test_allclose("embedding", got, out, (size_t)T * C, 0, 0));
    cudaFree(d_table); cudaFree(d_out); cudaFree(d_ids);
    free(table); free(out); free(got); free(ids);
}

START_TEST(embedding_gpu) {
    one(1, 8, 3, 1);
    one(333, 136, 1000, 2);
    one(8192, 4096, 4000, 3);
    /* an out-of-range id gives a NaN row, the others are intact */
    int32_t ids[3] = {1, 7, -2};
    float table[2 * 8 * 4];
    uint64_t seed = 4;
    test_rng_fill(&seed, table, 64, -1, 1);
    bf16 *d_t = k1_upload_bf16(table, 32), *d_o = k1_malloc(2 * 24);
    int32_t *d_ids = k1_upload(ids, sizeof ids);
    K1_LAUNCH(embedding_forward(d_o, d_ids, d_t, 3, 8, 4, 0));
    float got[24];
    k1_download_bf16(got, d_o, 24);
    for (int c = 0; c < 8; c++) {
        ck_assert_float_eq(got[c], table[8 + c]);
        ck_assert(isnan(got[8 + c]) && isnan(got[16 + c]));
    }
    ck_assert_int_eq(embedding_forward(d_o, d_ids, d_t, 3, 12, 4, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of 8"));
    cudaFree(d_t); cudaFree(d_o); cudaFree(d_ids);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_embedding");
    TCase *tc = tcase_create("gpu_embedding");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, embedding_gpu);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
