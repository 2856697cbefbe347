/*
 * tests/gpu/test_hsgather.c — GPU hidden-state concat/split (kernels/hsgather.h), bit-exact against
 * the reference: L = 1, 5 and 16 (every part pointer) parts, T = 1, a row index list, C/8 = 129 (a
 * tail past the 128-vector unroll of a warp), more row parts than the grid has warps (grid-stride),
 * the production shape (5 × [8192, 4096]), split as the inverse.
 */
#include "kernels/hsgather.h"
#include "k1util.h"

static void one(int L, int T, int C, int with_rows, uint64_t seed) {
    size_t n = (size_t)T * C;
    struct hs_parts hp, dp;
    struct hs_parts_out hpo, dpo;
    bf16 *host[HSGATHER_MAX_PARTS];
    for (int l = 0; l < L; l++) {
        host[l] = malloc(2 * n);
        for (size_t i = 0; i < n; i++) host[l][i] = (bf16)(test_rng_next(&seed) & 0x7f7f);
        hp.p[l] = host[l];
        dp.p[l] = k1_upload(host[l], 2 * n);
    }
    int T_out = with_rows ? (T + 1) / 2 : T;
    int32_t *rows = malloc(4 * (size_t)T_out + 4);
    for (int i = 0; i < T_out; i++) rows[i] = (int32_t)((T - 1 - 2 * i + T) % T);
    int32_t *d_rows = with_rows ? k1_upload(rows, 4 * (size_t)T_out) : NULL;
    size_t nout = (size_t)T_out * L * C;
    bf16 *want = malloc(2 * nout), *got = malloc(2 * nout), *d_out = k1_malloc(2 * nout);
    k1_poison(d_out, 2 * nout);
    ck_assert_int_eq(hsgather_concat_ref(want, &hp, with_rows ? rows : NULL, L, T_out, T, C), 0);
    K1_LAUNCH(hsgather_concat(d_out, dp, d_rows, L, T_out, T, C, 0));
    K1_CUDA(cudaMemcpy(got, d_out, 2 * nout, cudaMemcpyDeviceToHost));
    ck_assert_msg(memcmp(got, want, 2 * nout) == 0, "concat L=%d T=%d C=%d rows=%d differs", L, T, C, with_rows);
    if (!with_rows) {
        for (int l = 0; l < L; l++) { dpo.p[l] = k1_malloc(2 * n); k1_poison(dpo.p[l], 2 * n); hpo.p[l] = malloc(2 * n); }
        K1_LAUNCH(hsgather_split(dpo, d_out, L, T, C, 0));
        for (int l = 0; l < L; l++) {
            K1_CUDA(cudaMemcpy(hpo.p[l], dpo.p[l], 2 * n, cudaMemcpyDeviceToHost));
            ck_assert_msg(memcmp(hpo.p[l], host[l], 2 * n) == 0, "split part %d differs", l);
            cudaFree(dpo.p[l]); free(hpo.p[l]);
        }
    }
    for (int l = 0; l < L; l++) { cudaFree((void *)dp.p[l]); free(host[l]); }
    cudaFree(d_out); cudaFree(d_rows);
    free(rows); free(want); free(got);
}

START_TEST(hsgather_gpu) {
    one(1, 1, 8, 0, 1);
    one(5, 37, 136, 0, 2);
    one(5, 37, 136, 1, 3);
    one(3, 1, 64, 1, 4);
    one(5, 8192, 4096, 0, 5);
    one(16, 97, 1032, 0, 6);
    one(16, 97, 1032, 1, 7);
    one(16, 5000, 8, 0, 8);       /* 80000 row parts > 8448 blocks x 8 warps */
    one(7, 3001, 24, 1, 9);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_hsgather");
    TCase *tc = tcase_create("gpu_hsgather");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, hsgather_gpu);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
