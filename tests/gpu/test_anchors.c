/*
 * tests/gpu/test_anchors.c — anchors_forward on the GPU must pick exactly the CPU reference's anchors
 * (kernels/anchors.h), for tails, a size of 1, the production shape and beyond.
 */
#include <cuda_runtime_api.h>

#include "kernels/anchors.h"
#include "kernels/common.h"
#include "tests/testutil.h"

#define CK_CUDA(x) do { cudaError_t e_ = (x); ck_assert_msg(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_)); } while (0)

static void one(int T, int B, int N, int density_pct, uint64_t seed, uint64_t step) {
    uint64_t rng = seed * 1000 + step + (uint64_t)T;
    uint8_t *mask = malloc((size_t)T);
    for (int p = 0; p < T; p++) mask[p] = (int)(test_rng_next(&rng) % 100) < density_pct;
    int32_t *a_ref = malloc(sizeof(int32_t) * N), *a_gpu = malloc(sizeof(int32_t) * N);
    uint8_t *v_ref = malloc(N), *v_gpu = malloc(N);
    char err[256];
    int K = anchors_forward_ref(mask, T, B, N, seed, step, a_ref, v_ref, err, sizeof err);
    ck_assert_int_ge(K, 0);
    uint8_t *d_mask, *d_valid;
    int32_t *d_a, *d_count, count = -1;
    void *ws;
    CK_CUDA(cudaMalloc((void **)&d_mask, (size_t)T));
    CK_CUDA(cudaMalloc((void **)&d_a, sizeof(int32_t) * N));
    CK_CUDA(cudaMalloc((void **)&d_valid, (size_t)N));
    CK_CUDA(cudaMalloc((void **)&d_count, sizeof(int32_t)));
    CK_CUDA(cudaMalloc(&ws, anchors_workspace_bytes(T)));
    CK_CUDA(cudaMemset(d_a, 0x7f, sizeof(int32_t) * N));   /* poison */
    CK_CUDA(cudaMemset(d_valid, 0x7f, (size_t)N));
    CK_CUDA(cudaMemcpy(d_mask, mask, (size_t)T, cudaMemcpyHostToDevice));
    ck_assert_msg(anchors_forward(d_mask, T, B, N, seed, step, d_a, d_valid, d_count, ws, 0) == 0, "%s", kernels_error());
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(a_gpu, d_a, sizeof(int32_t) * N, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(v_gpu, d_valid, (size_t)N, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(&count, d_count, sizeof count, cudaMemcpyDeviceToHost));
    ck_assert_int_eq(count, K);
    for (int i = 0; i < N; i++)
        ck_assert_msg(a_gpu[i] == a_ref[i] && v_gpu[i] == v_ref[i], "T=%d N=%d slot %d: gpu (%d,%d) cpu (%d,%d)", T, N, i,
                      a_gpu[i], v_gpu[i], a_ref[i], v_ref[i]);
    cudaFree(d_mask); cudaFree(d_a); cudaFree(d_valid); cudaFree(d_count); cudaFree(ws);
    free(mask); free(a_ref); free(a_gpu); free(v_ref); free(v_gpu);
}

START_TEST(anchors_gpu_equals_cpu) {
    one(97, 16, 5, 70, 42, 0);
    one(1, 16, 4, 100, 42, 1);
    one(17, 16, 1, 100, 42, 2);
    one(40, 8, 64, 100, 42, 3);          /* N > candidates: all taken, padding after */
    one(8192, 16, 512, 70, 42, 4);       /* the standard configuration */
    one(8192, 16, 512, 3, 42, 5);        /* fewer candidates than N */
    one(20011, 16, 3072, 50, 7, 6);
    for (int step = 10; step < 30; step++) one(1025, 16, 64, 60, 42, (uint64_t)step);
}
END_TEST

START_TEST(anchors_gpu_rejects_bad_args) {
    ck_assert_int_eq(anchors_forward(NULL, 0, 16, 4, 1, 1, NULL, NULL, NULL, NULL, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "T=0"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_anchors");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, anchors_gpu_equals_cpu);
    tcase_add_test(tc, anchors_gpu_rejects_bad_args);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
