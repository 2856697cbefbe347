/*
 * kernels/bench/rmsnorm_bench.cu — RMSNorm forward, fused residual forward, backward (kernels/rmsnorm.h).
 *
 * Build: make BUILD=build-k1b build-k1b/bench/rmsnorm_bench   Run: build-k1b/bench/rmsnorm_bench
 * The variants are the library's two kernel paths, picked through DFLASH_RMSNORM_KERNEL (read by the
 * launchers at every call):
 * Variant 1: two passes (row group of 8/16/32 lanes, the second pass re-reads the row from L1/L2;
 *            dw by a separate column-reduction kernel over dy and x, 256 row chunks). Measured on the
 *            H200 (K1): forward 58%, fused 73%, dx 55%, dx+dw 34%, q-norm dx+dw 47% at C=4096/128.
 * Variant 2: register-resident (the default for C <= 8192): a group of G = 8..256 threads holds its
 *            row in registers (V <= 4 16-byte vectors per thread, all loads in flight at once); the
 *            backward walks rows with a fixed grid of 264 blocks, prefetches the next row, and sums
 *            dw per thread in fp32, then per block (fixed order) and across blocks (fixed order).
 * Every variant is validated against the CPU reference (y, h, rstd, dx, dw) before it is timed.
 * Bytes counted (bf16 tensors of N·C): forward read x + write y = 2; fused read x, r + write r, y = 4;
 * backward read dy, x + write dx = 3 (dx+dw also 3: a fused dw reads nothing more; variant 1 reads
 * dy, x twice, so its "3 of 5"). Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/rmsnorm.h"
#include "k1bench.cuh"

#include <math.h>
#include <string.h>

/* max over i of |got - ref| / (atol + rtol·|ref|): <= 1 passes. */
static double worst(const float *got, const float *ref, size_t n, double atol, double rtol) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]) / (atol + rtol * fabs((double)ref[i]));
        if (!(d <= m)) m = d;
    }
    return m;
}
static void down_bf16(float *h, const bf16 *d, size_t n) {
    bf16 *t = (bf16 *)malloc(2 * n + 2);
    BENCH_CUDA(cudaMemcpy(t, d, 2 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) h[i] = bf16_to_float(t[i]);
    free(t);
}
static double rms(const float *a, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s / (n ? n : 1));
}

static void one(int N, int C) {
    size_t n = (size_t)N * C;
    float *hx, *hr, *hdy, *hw = (float *)malloc(4 * C);
    bf16 *x = bench_rand_bf16(n, -2, 2, 1, &hx), *r0 = bench_rand_bf16(n, -2, 2, 2, &hr), *dy = bench_rand_bf16(n, -1, 1, 3, &hdy);
    bf16 *y, *dx, *r;
    for (int c = 0; c < C; c++) hw[c] = 0.5f + (float)c / C;
    float *w, *rstd, *dw, *scr;
    BENCH_CUDA(cudaMalloc(&y, 2 * n));
    BENCH_CUDA(cudaMalloc(&r, 2 * n));
    BENCH_CUDA(cudaMalloc(&dx, 2 * n));
    BENCH_CUDA(cudaMalloc(&w, 4 * C));
    BENCH_CUDA(cudaMalloc(&dw, 4 * C));
    BENCH_CUDA(cudaMalloc(&rstd, 4 * (size_t)N));
    BENCH_CUDA(cudaMalloc(&scr, 4 * rmsnorm_backward_scratch_floats(N, C)));
    BENCH_CUDA(cudaMemcpy(w, hw, 4 * C, cudaMemcpyHostToDevice));

    /* references: y = norm(x); h = bf16(x + r), yh = norm(h); dx, dw of norm(x) */
    float *ref = (float *)malloc(4 * n), *refh = (float *)malloc(4 * n), *refyh = (float *)malloc(4 * n);
    float *refrs = (float *)malloc(4 * (size_t)N), *refdx = (float *)malloc(4 * n), *refdw = (float *)calloc(C, 4);
    float *got = (float *)malloc(4 * n), *grs = (float *)malloc(4 * (size_t)N), *gdw = (float *)malloc(4 * C);
    float *gdw1 = (float *)malloc(4 * C);
    rmsnorm_forward_ref(ref, refrs, hx, hw, N, C, 1e-6f);
    for (size_t i = 0; i < n; i++) refh[i] = bf16_round(hx[i] + hr[i]);
    rmsnorm_forward_ref(refyh, NULL, refh, hw, N, C, 1e-6f);
    rmsnorm_backward_ref(refdx, refdw, hdy, hx, hw, refrs, N, C, 0);
    double dx_atol = 1e-2 * rms(refdx, n), dw_atol = 1e-3 * sqrt((double)N);

    char shp[64];
    snprintf(shp, sizeof shp, "N=%d C=%d", N, C);
    for (int v = 1; v <= 2; v++) {
        setenv("DFLASH_RMSNORM_KERNEL", v == 1 ? "1" : "2", 1);
        char what[96];
        BENCH_CUDA(cudaMemset(y, 0xff, 2 * n));
        BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, y, n);
        BENCH_CUDA(cudaMemcpy(grs, rstd, 4 * (size_t)N, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "v%d forward y %s", v, shp);
        bench_check(what, worst(got, ref, n, 1e-2, 1.6e-2), 1.0);
        snprintf(what, sizeof what, "v%d forward rstd %s", v, shp);
        bench_check(what, worst(grs, refrs, N, 0, 1e-4), 1.0);

        BENCH_CUDA(cudaMemcpy(r, r0, 2 * n, cudaMemcpyDeviceToDevice));
        BENCH_CUDA(cudaMemset(y, 0xff, 2 * n));
        BENCH_OK(rmsnorm_residual_forward(y, r, NULL, x, w, N, C, 1e-6f, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, r, n);
        snprintf(what, sizeof what, "v%d residual h (exact) %s", v, shp);
        bench_check(what, memcmp(got, refh, 4 * n) ? 2.0 : 0.0, 1.0);
        down_bf16(got, y, n);
        snprintf(what, sizeof what, "v%d residual y %s", v, shp);
        bench_check(what, worst(got, refyh, n, 1e-2, 1.6e-2), 1.0);

        /* backward against the reference fed the GPU's rstd (as tests/gpu/test_rmsnorm.c does) */
        float *rdx = (float *)malloc(4 * n), *rdw = (float *)calloc(C, 4);
        rmsnorm_backward_ref(rdx, rdw, hdy, hx, hw, grs, N, C, 0);
        BENCH_CUDA(cudaMemset(dx, 0xff, 2 * n));
        BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
        BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, dx, n);
        BENCH_CUDA(cudaMemcpy(gdw, dw, 4 * C, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "v%d backward dx %s", v, shp);
        bench_check(what, worst(got, rdx, n, dx_atol, 1.6e-2), 1.0);
        snprintf(what, sizeof what, "v%d backward dw %s", v, shp);
        bench_check(what, worst(gdw, rdw, C, dw_atol, 1e-3), 1.0);
        BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
        BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
        BENCH_CUDA(cudaMemcpy(gdw1, dw, 4 * C, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "v%d backward dw deterministic %s", v, shp);
        bench_check(what, memcmp(gdw, gdw1, 4 * C) ? 2.0 : 0.0, 1.0);
        free(rdx); free(rdw);

        double b = 2.0 * n;
        char name[64];
        snprintf(name, sizeof name, "v%d rmsnorm_forward", v);
        bench_report_bytes(name, shp, bench_ms([&]() { BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0)); }), 2 * b);
        snprintf(name, sizeof name, "v%d rmsnorm_residual_forward", v);
        bench_report_bytes(name, shp, bench_ms([&]() { BENCH_OK(rmsnorm_residual_forward(y, r, rstd, x, w, N, C, 1e-6f, 0)); }),
                           4 * b);
        snprintf(name, sizeof name, "v%d rmsnorm_backward dx only", v);
        bench_report_bytes(name, shp, bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, NULL, dy, x, w, rstd, scr, N, C, 0, 0)); }),
                           3 * b);
        snprintf(name, sizeof name, "v%d rmsnorm_backward dx+dw (3 B)", v);
        bench_report_bytes(name, shp, bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); }),
                           3 * b);
        snprintf(name, sizeof name, "v%d rmsnorm_backward dx+=,dw (4 B)", v);
        bench_report_bytes(name, shp, bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 1, 0)); }),
                           4 * b);
    }
    unsetenv("DFLASH_RMSNORM_KERNEL");
    cudaFree(x); cudaFree(r0); cudaFree(r); cudaFree(dy); cudaFree(y); cudaFree(dx); cudaFree(w); cudaFree(dw);
    cudaFree(rstd); cudaFree(scr);
    free(hx); free(hr); free(hdy); free(hw); free(ref); free(refh); free(refyh); free(refrs); free(refdx); free(refdw);
    free(got); free(grs); free(gdw); free(gdw1);
}

int main(void) {
    one(8192, 4096);        /* hidden norm of the standard batch */
    one(8192 * 32, 128);    /* q norm: 8192 tokens × 32 heads */
    one(8192 * 8, 128);     /* k norm */
    one(1000, 1032);        /* awkward: C/8 = 129, a tail past a power-of-two group */
    return 0;
}
