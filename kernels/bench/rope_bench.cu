/*
 * kernels/bench/rope_bench.cu — RoPE forward in place on q and k (kernels/rope.h).
 *
 * Build: make BUILD=build-k1 build-k1/bench/rope_bench   Run: build-k1/bench/rope_bench
 * Variant 1: the library kernel (8 pairs per thread, accurate sincosf).
 * Bytes: q and k read and written once: 2·2·T·(NH+NKV)·HD. Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/rope.h"
#include "k1bench.cuh"

int main(void) {
    const int T = 8192, NH = 32, NKV = 8, HD = 128;
    size_t nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    float *hq, inv[HD / 2], *finv;
    bf16 *q = bench_rand_bf16(nq, -2, 2, 1, &hq), *k = bench_rand_bf16(nk, -2, 2, 2);
    int32_t *pos, *hpos = (int32_t *)malloc(4 * T);
    for (int t = 0; t < T; t++) hpos[t] = t % 1200;
    struct rope_config cfg = {1e6, HD, ROPE_SCALING_NONE, 0, 0, 0, 0};
    BENCH_OK(rope_inv_freq(inv, &cfg));
    BENCH_CUDA(cudaMalloc(&pos, 4 * T));
    BENCH_CUDA(cudaMalloc(&finv, 4 * HD / 2));
    BENCH_CUDA(cudaMemcpy(pos, hpos, 4 * T, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(finv, inv, 4 * HD / 2, cudaMemcpyHostToDevice));
    BENCH_OK(rope_forward(q, NULL, pos, finv, T, NH, NKV, HD, 0));
    BENCH_CUDA(cudaDeviceSynchronize());
    rope_forward_ref(hq, NULL, hpos, inv, T, NH, NKV, HD);
    bench_check("rope q T=8192 NH=32 HD=128", bench_max_err(q, hq, nq), 3e-2);
    double ms = bench_ms([&]() { BENCH_OK(rope_forward(q, k, pos, finv, T, NH, NKV, HD, 0)); });
    bench_report_bytes("rope_forward q+k", "T=8192 NH=32 NKV=8 HD=128", ms, 4.0 * (nq + nk));
    ms = bench_ms([&]() { BENCH_OK(rope_backward(q, k, pos, finv, T, NH, NKV, HD, 0)); });
    bench_report_bytes("rope_backward q+k", "T=8192 NH=32 NKV=8 HD=128", ms, 4.0 * (nq + nk));
    return 0;
}
