/*
 * kernels/bench/swiglu_bench.cu — SwiGLU forward and backward on the fused [T, 2I] layout (kernels/swiglu.h).
 *
 * Build: make BUILD=build-k1 build-k1/bench/swiglu_bench   Run: build-k1/bench/swiglu_bench
 * Variant 1: the library kernels (8 elements per thread, 16-byte accesses).
 * Bytes: forward read 2·T·I + write T·I (bf16); backward read 2·T·I + T·I, write 2·T·I.
 * Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/swiglu.h"
#include "k1bench.cuh"

int main(void) {
    const int T = 8192, I = 12288;
    size_t n = (size_t)T * I;
    float *hgu;
    bf16 *gu = bench_rand_bf16(2 * n, -4, 4, 1, &hgu), *d = bench_rand_bf16(n, -1, 1, 2), *out, *dgu;
    BENCH_CUDA(cudaMalloc(&out, 2 * n));
    BENCH_CUDA(cudaMalloc(&dgu, 4 * n));
    BENCH_OK(swiglu_forward(out, gu, gu + I, T, I, 2 * I, 0));
    BENCH_CUDA(cudaDeviceSynchronize());
    const int R = 64;   /* validate the first 64 rows */
    float *ref = (float *)malloc(4 * (size_t)R * I);
    swiglu_forward_ref(ref, hgu, hgu + I, R, I, 2 * I);
    bench_check("swiglu T=64 rows I=12288", bench_max_err(out, ref, (size_t)R * I), 5e-2);   /* |out| <= 16 */
    double ms = bench_ms([&]() { BENCH_OK(swiglu_forward(out, gu, gu + I, T, I, 2 * I, 0)); });
    bench_report_bytes("swiglu_forward fused", "T=8192 I=12288", ms, 2.0 * 3 * n);
    ms = bench_ms([&]() { BENCH_OK(swiglu_backward(dgu, dgu + I, d, gu, gu + I, T, I, 2 * I, 0)); });
    bench_report_bytes("swiglu_backward fused", "T=8192 I=12288", ms, 2.0 * 5 * n);
    return 0;
}
