/*
 * tests/gpu/test_swiglu.c — GPU SwiGLU (kernels/swiglu.h) against the reference on the same
 * bf16-rounded inputs: fused [T,2I] and separate layouts, I = 8 and tails (I = 200), T = 1, the
 * production width I = 12288 (512 tokens), and the in-place backward.
 *
 * Tolerance: fp32 math from identical inputs (expf differs by an ulp), one bf16 rounding per
 * output: rtol 1.6e-2, atol 1e-3 (outputs near zero only arise from g or u near zero, where the
 * products are tiny in absolute terms too).
 */
#include "kernels/swiglu.h"
#include "k1util.h"

static void one(int T, int I, int fused, uint64_t seed) {
    int stride = fused ? 2 * I : I;
    size_t nin = (size_t)T * stride, n = (size_t)T * I;
    float *g = k1_randn(&seed, nin, -8, 8), *u = k1_randn(&seed, nin, -2, 2), *d = k1_randn(&seed, n, -1, 1);
    float *out = malloc(4 * n), *got = malloc(4 * nin), *dg = malloc(4 * nin), *du = malloc(4 * nin);
    bf16 *d_g = k1_upload_bf16(g, nin), *d_u = fused ? d_g + I : k1_upload_bf16(u, nin), *d_d = k1_upload_bf16(d, n);
    const float *gp = g, *up = fused ? g + I : u;
    bf16 *d_out = k1_malloc(2 * n);
    k1_poison(d_out, 2 * n);
    K1_LAUNCH(swiglu_forward(d_out, d_g, d_u, T, I, stride, 0));
    K1_CUDA(cudaDeviceSynchronize());
    swiglu_forward_ref(out, gp, up, T, I, stride);
    k1_download_bf16(got, d_out, n);
    char what[64];
    snprintf(what, sizeof what, "swiglu T=%d I=%d fused=%d", T, I, fused);
    ck_assert_msg(test_allclose("out", got, out, n, 1e-3, 1.6e-2), "%s", what);
    /* backward in place: dgate/dup overwrite gate/up */
    float *du_ref = fused ? dg + I : du;   /* the fused gradient is one [T,2I] tensor, like the input */
    swiglu_backward_ref(dg, du_ref, d, gp, up, T, I, stride);
    K1_LAUNCH(swiglu_backward(d_g, d_u, d_d, d_g, d_u, T, I, stride, 0));
    K1_CUDA(cudaDeviceSynchronize());
    float *gg = malloc(4 * nin), *gu = malloc(4 * nin);
    k1_download_bf16(gg, d_g, nin);
    if (!fused) k1_download_bf16(gu, d_u, nin);
    for (int t = 0; t < T; t++) {
        const float *rowg = gg + (size_t)t * stride, *rowu = fused ? gg + (size_t)t * stride + I : gu + (size_t)t * stride;
        ck_assert_msg(test_allclose("dgate", rowg, dg + (size_t)t * stride, I, 1e-3, 1.6e-2), "%s t=%d", what, t);
        ck_assert_msg(test_allclose("dup", rowu, du_ref + (size_t)t * stride, I, 1e-3, 1.6e-2), "%s t=%d", what, t);
    }
    cudaFree(d_g); if (!fused) cudaFree(d_u); cudaFree(d_d); cudaFree(d_out);
    free(g); free(u); free(d); free(out); free(got); free(dg); free(du); free(gg); free(gu);
}

START_TEST(swiglu_gpu_shapes) {
    int shapes[][2] = {{1, 8}, {7, 200}, {33, 64}, {512, 12288}};
    for (int s = 0; s < 4; s++) {
        one(shapes[s][0], shapes[s][1], 0, 1 + s);
        one(shapes[s][0], shapes[s][1], 1, 11 + s);
    }
}
END_TEST

START_TEST(swiglu_gpu_preconditions) {
    bf16 *x = k1_malloc(4096);
    ck_assert_int_eq(swiglu_forward(x, x, x, 2, 12, 12, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiples of 8"));
    ck_assert_int_eq(swiglu_forward(x, x, x, 2, 16, 8, 0), -1);
    cudaFree(x);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_swiglu");
    TCase *tc = tcase_create("gpu_swiglu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, swiglu_gpu_shapes);
    tcase_add_test(tc, swiglu_gpu_preconditions);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
