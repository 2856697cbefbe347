/*
 * kernels/bench/hsgather_bench.cu — hidden-state concat and split (kernels/hsgather.h).
 *
 * Build: make BUILD=build-k1b build-k1b/bench/hsgather_bench   Run: build-k1b/bench/hsgather_bench
 * Variant 1: one thread per 16-byte vector with a div/mod chain per element (and the part pointers
 *            copied to local memory per thread); measured 64% of 4.1 TB/s on the H200 (K1).
 *            DFLASH_HSGATHER_KERNEL=1 selects it.
 * Variant 2 (the default): one warp per row part (token, layer), a single divmod per row part,
 *            4 16-byte loads in flight per lane, part pointer picked by a compare chain.
 * Every variant is checked bitwise against hsgather_concat_ref / the source parts (identity and a
 * reversed-and-subset row list) before it is timed. Bytes: 2·2·L·T·C (read + write).
 * Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/hsgather.h"
#include "k1bench.cuh"

#include <string.h>

int main(void) {
    const int L = 5, T = 8192, C = 4096, T_sub = 3001;
    const size_t n = (size_t)T * C;
    struct hs_parts p, hp;
    struct hs_parts_out po;
    bf16 *host[HSGATHER_MAX_PARTS];
    for (int l = 0; l < L; l++) {
        p.p[l] = bench_rand_bf16(n, -1, 1, 10 + l);
        host[l] = (bf16 *)malloc(2 * n);
        BENCH_CUDA(cudaMemcpy(host[l], p.p[l], 2 * n, cudaMemcpyDeviceToHost));
        hp.p[l] = host[l];
        BENCH_CUDA(cudaMalloc(&po.p[l], 2 * n));
    }
    bf16 *cat, *got = (bf16 *)malloc(2 * (size_t)L * n), *want = (bf16 *)malloc(2 * (size_t)L * n);
    BENCH_CUDA(cudaMalloc(&cat, 2 * (size_t)L * n));
    int32_t *hrows = (int32_t *)malloc(4 * T_sub), *rows;
    for (int i = 0; i < T_sub; i++) hrows[i] = T - 1 - 2 * i;   /* reversed, every other token */
    BENCH_CUDA(cudaMalloc(&rows, 4 * T_sub));
    BENCH_CUDA(cudaMemcpy(rows, hrows, 4 * T_sub, cudaMemcpyHostToDevice));
    double bytes = 4.0 * L * T * C;
    for (int v = 1; v <= 2; v++) {
        setenv("DFLASH_HSGATHER_KERNEL", v == 1 ? "1" : "2", 1);
        char what[96];
        /* identity concat, then split back: bitwise */
        BENCH_CUDA(cudaMemset(cat, 0xff, 2 * (size_t)L * n));
        BENCH_OK(hsgather_concat(cat, p, NULL, L, T, T, C, 0));
        BENCH_CUDA(cudaMemcpy(got, cat, 2 * (size_t)L * n, cudaMemcpyDeviceToHost));
        if (hsgather_concat_ref(want, &hp, NULL, L, T, T, C)) { fprintf(stderr, "reference failed\n"); return 1; }
        snprintf(what, sizeof what, "v%d concat identity (bitwise, whole)", v);
        bench_check(what, memcmp(got, want, 2 * (size_t)L * n) ? 1 : 0, 0);
        int bad = 0;
        for (int l = 0; l < L; l++) BENCH_CUDA(cudaMemset(po.p[l], 0xff, 2 * n));
        BENCH_OK(hsgather_split(po, cat, L, T, C, 0));
        for (int l = 0; l < L; l++) {
            BENCH_CUDA(cudaMemcpy(got, po.p[l], 2 * n, cudaMemcpyDeviceToHost));
            bad += memcmp(got, host[l], 2 * n) != 0;
        }
        snprintf(what, sizeof what, "v%d split (bitwise, whole)", v);
        bench_check(what, bad, 0);
        /* row list */
        BENCH_CUDA(cudaMemset(cat, 0xff, 2 * (size_t)L * n));
        BENCH_OK(hsgather_concat(cat, p, rows, L, T_sub, T, C, 0));
        BENCH_CUDA(cudaMemcpy(got, cat, 2 * (size_t)L * T_sub * C, cudaMemcpyDeviceToHost));
        if (hsgather_concat_ref(want, &hp, hrows, L, T_sub, T, C)) { fprintf(stderr, "reference failed\n"); return 1; }
        snprintf(what, sizeof what, "v%d concat row list T_out=%d (bitwise)", v, T_sub);
        bench_check(what, memcmp(got, want, 2 * (size_t)L * T_sub * C) ? 1 : 0, 0);

        char name[64];
        snprintf(name, sizeof name, "v%d hsgather_concat", v);
        bench_report_bytes(name, "L=5 T=8192 C=4096", bench_ms([&]() { BENCH_OK(hsgather_concat(cat, p, NULL, L, T, T, C, 0)); }), bytes);
        snprintf(name, sizeof name, "v%d hsgather_split", v);
        bench_report_bytes(name, "L=5 T=8192 C=4096", bench_ms([&]() { BENCH_OK(hsgather_split(po, cat, L, T, C, 0)); }), bytes);
    }
    unsetenv("DFLASH_HSGATHER_KERNEL");
    return 0;
}
