/*
 * kernels/bench/k1bench.cuh — timing helpers for the Kernels I benchmarks (header-only, CUDA):
 * L2 flush between repeats (a 256 MiB memset, larger than the H200's L2), warm-up, CUDA-event
 * timing, median of the repeats, and a one-line report with the napkin math against the ceilings
 * of gpu-machine.md (bf16 GEMM ~760-795 TFLOP/s at 8192³, device copy ~4.1 TB/s).
 */
#ifndef KERNELS_BENCH_K1BENCH_CUH
#define KERNELS_BENCH_K1BENCH_CUH

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "kernels/common.h"

#define BENCH_CUDA(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
        fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define BENCH_OK(x) do { if ((x) != 0) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, kernels_error()); exit(1); } } while (0)

#define BENCH_PEAK_TFLOPS 760.0
#define BENCH_PEAK_GBS 4100.0

static void *bench_flush_buf;
static inline void bench_flush_l2(void) {
    const size_t n = (size_t)256 << 20;
    if (!bench_flush_buf) BENCH_CUDA(cudaMalloc(&bench_flush_buf, n));
    BENCH_CUDA(cudaMemsetAsync(bench_flush_buf, 0, n, 0));
}

/* Median milliseconds of fn() over reps runs, each after an L2 flush, after 2 warm-up runs. */
template <typename F>
static double bench_ms(F fn, int reps = 10) {
    cudaEvent_t a, b;
    BENCH_CUDA(cudaEventCreate(&a));
    BENCH_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 2; i++) fn();
    BENCH_CUDA(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        bench_flush_l2();
        BENCH_CUDA(cudaEventRecord(a, 0));
        fn();
        BENCH_CUDA(cudaEventRecord(b, 0));
        BENCH_CUDA(cudaEventSynchronize(b));
        float ms;
        BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms);
    }
    BENCH_CUDA(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static inline void bench_report_flops(const char *name, const char *shape, double ms, double flop) {
    double tf = flop / (ms * 1e-3) / 1e12;
    printf("%-34s %-34s %9.4f ms %8.1f TFLOP/s  %5.1f%% of %.0f\n", name, shape, ms, tf, 100 * tf / BENCH_PEAK_TFLOPS,
           BENCH_PEAK_TFLOPS);
    fflush(stdout);
}
static inline void bench_report_bytes(const char *name, const char *shape, double ms, double bytes) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("%-34s %-34s %9.4f ms %8.1f GB/s     %5.1f%% of %.0f\n", name, shape, ms, gbs, 100 * gbs / BENCH_PEAK_GBS,
           BENCH_PEAK_GBS);
    fflush(stdout);
}

/* Random bf16 device buffer in [lo, hi) (seeded); the host copy (bf16-rounded floats) is returned
 * in *host when host != NULL (caller frees). */
static inline bf16 *bench_rand_bf16(size_t n, float lo, float hi, uint64_t seed, float **host = NULL) {
    float *f = (float *)malloc(4 * n + 4);
    bf16 *h = (bf16 *)malloc(2 * n + 2);
    for (size_t i = 0; i < n; i++) {
        f[i] = lo + (hi - lo) * (float)((kernels_rng_next(&seed) >> 40) * (1.0 / 16777216.0));
        h[i] = float_to_bf16(f[i]);
        f[i] = bf16_to_float(h[i]);
    }
    bf16 *d;
    BENCH_CUDA(cudaMalloc(&d, 2 * n + 16));
    BENCH_CUDA(cudaMemcpy(d, h, 2 * n, cudaMemcpyHostToDevice));
    free(h);
    if (host) *host = f; else free(f);
    return d;
}

/* max |a - b| over n, with b given as floats and a as device bf16. */
static inline double bench_max_err(const bf16 *dev, const float *ref, size_t n) {
    bf16 *h = (bf16 *)malloc(2 * n + 2);
    BENCH_CUDA(cudaMemcpy(h, dev, 2 * n, cudaMemcpyDeviceToHost));
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)bf16_to_float(h[i]) - ref[i]);
        if (!(d <= m)) m = d;
    }
    free(h);
    return m;
}

static inline void bench_check(const char *what, double err, double tol) {
    printf("validate %-40s max err %.3g (tol %.3g) %s\n", what, err, tol, err <= tol ? "ok" : "FAILED");
    fflush(stdout);
    if (!(err <= tol)) exit(1);
}

#endif /* KERNELS_BENCH_K1BENCH_CUH */
