/*
 * kernels/bench/embedding_bench.cu — embedding gather (kernels/embedding.h).
 *
 * Build: make BUILD=build-k1 build-k1/bench/embedding_bench   Run: build-k1/bench/embedding_bench
 * Variant 1: the library kernel (one 16-byte vector per thread). Bytes: rows read + written, 2·2·T·C.
 * Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/embedding.h"
#include "k1bench.cuh"

#include <string.h>

int main(void) {
    const int T = 8192, C = 4096, V = 151936;
    bf16 *table = bench_rand_bf16((size_t)V * C, -1, 1, 1), *out;
    int32_t *ids, *hids = (int32_t *)malloc(4 * T);
    uint64_t s = 5;
    for (int t = 0; t < T; t++) hids[t] = (int32_t)(kernels_rng_next(&s) % V);
    BENCH_CUDA(cudaMalloc(&ids, 4 * T));
    BENCH_CUDA(cudaMalloc(&out, 2 * (size_t)T * C));
    BENCH_CUDA(cudaMemcpy(ids, hids, 4 * T, cudaMemcpyHostToDevice));
    BENCH_OK(embedding_forward(out, ids, table, T, C, V, 0));
    BENCH_CUDA(cudaDeviceSynchronize());
    bf16 *a = (bf16 *)malloc(2 * C), *b = (bf16 *)malloc(2 * C);
    int bad = 0;
    for (int t = 0; t < T; t += 511) {
        BENCH_CUDA(cudaMemcpy(a, out + (size_t)t * C, 2 * C, cudaMemcpyDeviceToHost));
        BENCH_CUDA(cudaMemcpy(b, table + (size_t)hids[t] * C, 2 * C, cudaMemcpyDeviceToHost));
        bad += memcmp(a, b, 2 * C) != 0;
    }
    bench_check("embedding rows (sampled, bitwise)", bad, 0);
    double ms = bench_ms([&]() { BENCH_OK(embedding_forward(out, ids, table, T, C, V, 0)); });
    bench_report_bytes("embedding_forward", "T=8192 C=4096 V=151936", ms, 4.0 * T * C);
    return 0;
}
