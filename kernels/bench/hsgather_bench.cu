/*
 * kernels/bench/hsgather_bench.cu — hidden-state concat and split (kernels/hsgather.h).
 *
 * Build: make BUILD=build-k1 build-k1/bench/hsgather_bench   Run: build-k1/bench/hsgather_bench
 * Variant 1: the library kernels (one 16-byte vector per thread). Bytes: 2·2·L·T·C (read + write).
 * Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/hsgather.h"
#include "k1bench.cuh"

#include <string.h>

int main(void) {
    const int L = 5, T = 8192, C = 4096;
    struct hs_parts p;
    struct hs_parts_out po;
    for (int l = 0; l < L; l++) {
        p.p[l] = bench_rand_bf16((size_t)T * C, -1, 1, 10 + l);
        BENCH_CUDA(cudaMalloc(&po.p[l], 2 * (size_t)T * C));
    }
    bf16 *cat;
    BENCH_CUDA(cudaMalloc(&cat, 2 * (size_t)L * T * C));
    BENCH_OK(hsgather_concat(cat, p, NULL, L, T, T, C, 0));
    BENCH_OK(hsgather_split(po, cat, L, T, C, 0));
    BENCH_CUDA(cudaDeviceSynchronize());
    bf16 *a = (bf16 *)malloc(2 * C), *b = (bf16 *)malloc(2 * C);
    int bad = 0;
    for (int l = 0; l < L; l++)
        for (int t = 0; t < T; t += 1023) {
            BENCH_CUDA(cudaMemcpy(a, cat + ((size_t)t * L + l) * C, 2 * C, cudaMemcpyDeviceToHost));
            BENCH_CUDA(cudaMemcpy(b, p.p[l] + (size_t)t * C, 2 * C, cudaMemcpyDeviceToHost));
            bad += memcmp(a, b, 2 * C) != 0;
            BENCH_CUDA(cudaMemcpy(a, po.p[l] + (size_t)t * C, 2 * C, cudaMemcpyDeviceToHost));
            bad += memcmp(a, b, 2 * C) != 0;
        }
    bench_check("hsgather concat/split rows (sampled, bitwise)", bad, 0);
    double bytes = 4.0 * L * T * C;
    bench_report_bytes("hsgather_concat", "L=5 T=8192 C=4096", bench_ms([&]() { BENCH_OK(hsgather_concat(cat, p, NULL, L, T, T, C, 0)); }), bytes);
    bench_report_bytes("hsgather_split", "L=5 T=8192 C=4096", bench_ms([&]() { BENCH_OK(hsgather_split(po, cat, L, T, C, 0)); }), bytes);
    return 0;
}
