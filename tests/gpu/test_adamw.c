/*
 * tests/gpu/test_adamw.c — adamw_grad_sumsq and adamw_step on the GPU against the CPU reference
 * (kernels/adamw.h): vector and scalar paths, a tail, a size of 1, clipping from the device sumsq.
 */
#include <cuda_runtime_api.h>

#include "kernels/adamw.h"
#include "tests/testutil.h"

#define CK_CUDA(x) do { cudaError_t e_ = (x); ck_assert_msg(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_)); } while (0)

/* offset shifts the device pointers by one float to force the scalar path. */
static void one(size_t n, int offset, float max_norm) {
    uint64_t rng = n * 3 + (uint64_t)offset;
    float *w = malloc(4 * n), *m = malloc(4 * n), *v = malloc(4 * n), *g = malloc(4 * n);
    float *w2 = malloc(4 * n), *m2 = malloc(4 * n), *v2 = malloc(4 * n);
    bf16 *cp = malloc(2 * n), *cp2 = malloc(2 * n);
    test_rng_fill(&rng, w, n, -1, 1);
    test_rng_fill(&rng, m, n, -0.01f, 0.01f);
    test_rng_fill(&rng, v, n, 0, 1e-4f);
    test_rng_fill(&rng, g, n, -0.05f, 0.05f);
    float *dw, *dm, *dv, *dg, *dss;
    bf16 *dc;
    CK_CUDA(cudaMalloc((void **)&dw, 4 * (n + 1)));
    CK_CUDA(cudaMalloc((void **)&dm, 4 * (n + 1)));
    CK_CUDA(cudaMalloc((void **)&dv, 4 * (n + 1)));
    CK_CUDA(cudaMalloc((void **)&dg, 4 * (n + 1)));
    CK_CUDA(cudaMalloc((void **)&dc, 2 * (n + 1)));
    CK_CUDA(cudaMalloc((void **)&dss, 4));
    CK_CUDA(cudaMemcpy(dw + offset, w, 4 * n, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(dm + offset, m, 4 * n, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(dv + offset, v, 4 * n, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(dg + offset, g, 4 * n, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemset(dss, 0, 4));
    /* the grad counted twice: two "tensors" of the global norm */
    ck_assert(adamw_grad_sumsq(dg + offset, n, dss, 0) == 0);
    ck_assert(adamw_grad_sumsq(dg + offset, n, dss, 0) == 0);
    adamw_params p = {3e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 7, max_norm};
    ck_assert_msg(adamw_step(dw + offset, dm + offset, dv + offset, dg + offset, dc + offset, n, &p, dss, 0) == 0, "%s",
                  kernels_error());
    CK_CUDA(cudaDeviceSynchronize());
    float ss_gpu;
    CK_CUDA(cudaMemcpy(&ss_gpu, dss, 4, cudaMemcpyDeviceToHost));
    double ss = 0;
    adamw_grad_sumsq_ref(g, n, &ss);
    adamw_grad_sumsq_ref(g, n, &ss);
    /* fp32 partial sums and atomics: relative error ~ 1e-6 for a million positive terms */
    ck_assert_msg(fabs(ss_gpu - ss) <= 1e-5 * ss, "sumsq gpu %.9g ref %.9g", ss_gpu, ss);
    char err[256];
    ck_assert(adamw_step_ref(w, m, v, g, cp, n, &p, (double)ss_gpu, err, sizeof err) == 0);
    CK_CUDA(cudaMemcpy(w2, dw + offset, 4 * n, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(m2, dm + offset, 4 * n, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(v2, dv + offset, 4 * n, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(cp2, dc + offset, 2 * n, cudaMemcpyDeviceToHost));
    /* same float formula; only FMA contraction differs: a few ulp of the operands. m = β1·m + (1-β1)·g
     * can cancel (|β1·m| up to 9e-3 here, ulp 9.3e-10), so its bound is absolute: 4 ulp of the operands
     * (the H200 run of 2026-11-29 saw 9.3e-10 with a relative error of 1.2e-5 on a cancelled value). */
    ck_assert(test_allclose("master", w2, w, n, 1e-7, 1e-6));
    ck_assert(test_allclose("m", m2, m, n, 4e-9, 1e-6));
    ck_assert(test_allclose("v", v2, v, n, 1e-12, 1e-6));
    /* the copy is bf16 of the GPU's own master, and within one bf16 ulp of the reference's copy (the masters differ by
     * a few fp32 ulp, which can cross a bf16 rounding boundary; comparing only with the GPU's own master would
     * not catch a copy written from a wrong master) */
    size_t flips = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_eq(cp2[i], float_to_bf16(w2[i]));
        float a = bf16_to_float(cp2[i]), b = bf16_to_float(cp[i]), mag = fmaxf(fabsf(a), fabsf(b));
        if (cp2[i] == cp[i]) continue;
        flips++;
        ck_assert_msg(fabsf(a - b) <= ldexpf(1.0f, ilogbf(mag) - 7), "copy[%zu]: gpu %g, reference %g", i, a, b);
    }
    ck_assert_msg(flips <= n / 100 + 1, "%zu of %zu bf16 copies differ from the reference's", flips, n);
    cudaFree(dw); cudaFree(dm); cudaFree(dv); cudaFree(dg); cudaFree(dc); cudaFree(dss);
    free(w); free(m); free(v); free(g); free(w2); free(m2); free(v2); free(cp); free(cp2);
}

START_TEST(adamw_gpu_matches_ref) {
    one(1, 0, 1.0f);
    one(97, 0, 1.0f);
    one(1000003, 0, 1.0f);    /* vector path with a tail of 3; the norm ~ 41 forces clipping */
    one(1000003, 1, 1.0f);    /* misaligned: scalar path */
    one(4096, 0, 0.0f);       /* no clipping */
    one(4096, 0, 1e9f);       /* threshold above the norm: clip factor 1 */
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_adamw");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, adamw_gpu_matches_ref);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
