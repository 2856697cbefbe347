/*
 * kernels/bench/cast_bench.cu — fp32 <-> bf16 casts (kernels/cast.h).
 *
 * Build: make BUILD=build-k1 build-k1/bench/cast_bench   Run: build-k1/bench/cast_bench
 * Variant 1: the library kernels (8 elements per thread when aligned). Bytes: 4 + 2 per element.
 * Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/cast.h"
#include "k1bench.cuh"

int main(void) {
    const size_t n = (size_t)965 << 20;   /* ~1e9: the drafter's trainable parameters */
    float *f, *hf = (float *)malloc(4 * 4096);
    bf16 *b, hb[4096];
    BENCH_CUDA(cudaMalloc(&f, 4 * n));
    BENCH_CUDA(cudaMalloc(&b, 2 * n));
    for (int i = 0; i < 4096; i++) hf[i] = (float)i * 0.37f - 700.0f;
    BENCH_CUDA(cudaMemcpy(f, hf, 4 * 4096, cudaMemcpyHostToDevice));
    BENCH_OK(cast_f32_to_bf16(b, f, n, 0));
    BENCH_CUDA(cudaMemcpy(hb, b, 2 * 4096, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 4096; i++) bad += hb[i] != float_to_bf16(hf[i]);
    bench_check("cast_f32_to_bf16 (bitwise, first 4096)", bad, 0);
    double ms = bench_ms([&]() { BENCH_OK(cast_f32_to_bf16(b, f, n, 0)); }, 5);
    bench_report_bytes("cast_f32_to_bf16", "n=965Mi", ms, 6.0 * n);
    ms = bench_ms([&]() { BENCH_OK(cast_bf16_to_f32(f, b, n, 0)); }, 5);
    bench_report_bytes("cast_bf16_to_f32", "n=965Mi", ms, 6.0 * n);
    return 0;
}
