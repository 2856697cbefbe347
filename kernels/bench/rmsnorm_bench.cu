/*
 * kernels/bench/rmsnorm_bench.cu — RMSNorm forward, fused residual forward, backward (kernels/rmsnorm.h).
 *
 * Build: make BUILD=build-k1 build-k1/bench/rmsnorm_bench   Run: build-k1/bench/rmsnorm_bench
 * Variant 1: the library kernels (row group of 8/16/32 lanes, two passes over the row, the second
 *            from L1/L2; backward dx the same way, dw by a deterministic column reduction).
 * Bytes counted (bf16 tensors of N·C): forward read x + write y = 2; fused read x, r + write r, y = 4;
 * backward read dy, x + write dx = 3, plus the dw pass (read dy, x again = 2) reported separately
 * in the total. Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/rmsnorm.h"
#include "k1bench.cuh"

#include <math.h>

static void one(int N, int C) {
    size_t n = (size_t)N * C;
    float *hx, *hw = (float *)malloc(4 * C), *ref = (float *)malloc(4 * n);
    bf16 *x = bench_rand_bf16(n, -2, 2, 1, &hx), *r = bench_rand_bf16(n, -2, 2, 2), *dy = bench_rand_bf16(n, -1, 1, 3), *y, *dx;
    for (int c = 0; c < C; c++) hw[c] = 0.5f + (float)c / C;
    float *w, *rstd, *dw, *scr;
    BENCH_CUDA(cudaMalloc(&y, 2 * n));
    BENCH_CUDA(cudaMalloc(&dx, 2 * n));
    BENCH_CUDA(cudaMalloc(&w, 4 * C));
    BENCH_CUDA(cudaMalloc(&dw, 4 * C));
    BENCH_CUDA(cudaMalloc(&rstd, 4 * (size_t)N));
    BENCH_CUDA(cudaMalloc(&scr, 4 * rmsnorm_backward_scratch_floats(N, C)));
    BENCH_CUDA(cudaMemcpy(w, hw, 4 * C, cudaMemcpyHostToDevice));
    BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0));
    BENCH_CUDA(cudaDeviceSynchronize());
    rmsnorm_forward_ref(ref, NULL, hx, hw, N, C, 1e-6f);
    char shp[64];
    snprintf(shp, sizeof shp, "N=%d C=%d", N, C);
    bench_check(shp, bench_max_err(y, ref, n), 3e-2);   /* |y| <= ~4: bf16 half-ulp 1.6e-2 */
    double b = 2.0 * n;
    bench_report_bytes("rmsnorm_forward", shp, bench_ms([&]() { BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0)); }),
                       2 * b);
    bench_report_bytes("rmsnorm_residual_forward", shp,
                       bench_ms([&]() { BENCH_OK(rmsnorm_residual_forward(y, r, rstd, x, w, N, C, 1e-6f, 0)); }), 4 * b);
    bench_report_bytes("rmsnorm_backward dx only", shp,
                       bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, NULL, dy, x, w, rstd, scr, N, C, 0, 0)); }), 3 * b);
    bench_report_bytes("rmsnorm_backward dx+dw (3 of 5)", shp,
                       bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); }), 3 * b);
    cudaFree(x); cudaFree(r); cudaFree(dy); cudaFree(y); cudaFree(dx); cudaFree(w); cudaFree(dw); cudaFree(rstd); cudaFree(scr);
    free(hx); free(hw); free(ref);
}

int main(void) {
    one(8192, 4096);        /* hidden norm of the standard batch */
    one(8192 * 32, 128);    /* q norm: 8192 tokens × 32 heads */
    one(8192 * 8, 128);     /* k norm */
    return 0;
}
