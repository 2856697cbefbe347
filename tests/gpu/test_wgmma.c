/*
 * tests/gpu/test_wgmma.c — the wgmma primitives of kernels/wgmma.cuh through kernels/wgmma_check.h:
 * C[64×128] = A[64×64]·B[64×128] for every operand layout the attention kernels use, against a
 * double-precision product of the same bf16 inputs. A wrong descriptor field, swizzle or fragment
 * mapping permutes or drops whole 8×8 blocks, which these random operands turn into O(1) errors.
 *
 * Tolerance: products of bf16 values are exact in fp32; 64 of them are summed in fp32 in an
 * unspecified order, so |err| <= 64 · 2^-24 · Σ|a·b| ≈ 4e-6 · 64 for inputs in [-2, 2]: atol 1e-3,
 * rtol 1e-4.
 */
#include "kernels/wgmma_check.h"
#include "k1util.h"

static void check_mode(int mode) {
    uint64_t seed = 0x5eed0000u + (uint64_t)mode;
    const int M = 64, K = 64, N = 128;
    float *a = k1_randn(&seed, (size_t)M * K, -2, 2), *b = k1_randn(&seed, (size_t)K * N, -2, 2);
    bf16 *d_a = k1_upload_bf16(a, (size_t)M * K), *d_b = k1_upload_bf16(b, (size_t)K * N);
    float *d_c = k1_malloc(4 * (size_t)M * N);
    K1_CUDA(cudaMemset(d_c, 0xff, 4 * (size_t)M * N));
    K1_LAUNCH(wgmma_check_gemm(mode, d_a, d_b, d_c, 0));
    K1_CUDA(cudaDeviceSynchronize());
    float *got = malloc(4 * (size_t)M * N), *want = malloc(4 * (size_t)M * N);
    K1_CUDA(cudaMemcpy(got, d_c, 4 * (size_t)M * N, cudaMemcpyDeviceToHost));
    /* a is [m][k] (modes 0-2) or [k][m] (mode 3); b is [n][k] (mode 0) or [k][n] */
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                double av = mode == WGMMA_CHECK_SS_MM ? a[k * M + m] : a[m * K + k];
                double bv = mode == WGMMA_CHECK_SS_KK ? b[n * K + k] : b[k * N + n];
                s += av * bv;
            }
            want[m * N + n] = (float)s;
        }
    char what[32];
    snprintf(what, sizeof what, "wgmma mode %d", mode);
    ck_assert_msg(test_allclose(what, got, want, (size_t)M * N, 1e-3, 1e-4), "%s", what);
    cudaFree(d_a);
    cudaFree(d_b);
    cudaFree(d_c);
    free(a), free(b), free(got), free(want);
}

START_TEST(wgmma_ss_kmajor) { check_mode(WGMMA_CHECK_SS_KK); }
END_TEST
START_TEST(wgmma_rs_mnmajor_n128) { check_mode(WGMMA_CHECK_RS_MN128); }
END_TEST
START_TEST(wgmma_rs_mnmajor_n64) { check_mode(WGMMA_CHECK_RS_MN64); }
END_TEST
START_TEST(wgmma_ss_mmajor) { check_mode(WGMMA_CHECK_SS_MM); }
END_TEST
START_TEST(wgmma_bad_mode) {
    ck_assert_int_eq(wgmma_check_gemm(WGMMA_CHECK_MODES, NULL, NULL, NULL, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "mode"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("wgmma_gpu");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, wgmma_ss_kmajor);
    tcase_add_test(tc, wgmma_rs_mnmajor_n128);
    tcase_add_test(tc, wgmma_rs_mnmajor_n64);
    tcase_add_test(tc, wgmma_ss_mmajor);
    tcase_add_test(tc, wgmma_bad_mode);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
