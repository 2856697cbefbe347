/*
 * kernels/bench/hsgather_bench.cu — hidden-state concat and split (kernels/hsgather.h).
 *
 * Build: make BUILD=build-k1b build-k1b/bench/hsgather_bench   Run: build-k1b/bench/hsgather_bench
 * Variant 1: one thread per 16-byte vector with a div/mod chain per element (and the part pointers
 *            copied to local memory per thread); measured 64% of 4.1 TB/s on the H200 (K1). Retired
 *            from the library; its kernels live here only, as the baseline to measure against.
 * Variant 2 (the default): one warp per row part (token, layer), a single divmod per row part,
 *            4 16-byte loads in flight per lane, part pointer picked by a compare chain.
 * Every variant is checked bitwise against hsgather_concat_ref / the source parts (identity and a
 * reversed-and-subset row list) before it is timed. Bytes: 2·2·L·T·C (read + write).
 * Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/hsgather.h"
#include "kernels/vec.cuh"
#include "k1bench.cuh"

#include <string.h>

/* ---------------------------------------------------------------- variant 1 (retired, bench only) */

__global__ void hsgather_concat_elem_kernel(uint4 *out, struct hs_parts parts, const int32_t *rows, int L, int T_out,
                                       int T_in, int C8) {
    size_t row8 = (size_t)L * C8, n = (size_t)T_out * row8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / row8), r = (int)(i % row8), l = r / C8, c = r % C8;
        int src = rows ? __ldg(rows + t) : t;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (src >= 0 && src < T_in) v = __ldg((const uint4 *)parts.p[l] + (size_t)src * C8 + c);
        out[i] = v;
    }
}

__global__ void hsgather_split_elem_kernel(struct hs_parts_out parts, const uint4 *in, int L, int T, int C8) {
    size_t row8 = (size_t)L * C8, n = (size_t)T * row8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / row8), r = (int)(i % row8), l = r / C8, c = r % C8;
        ((uint4 *)parts.p[l])[(size_t)t * C8 + c] = __ldg(in + i);
    }
}

static int v1_concat(bf16 *out, struct hs_parts parts, const int32_t *rows, int L, int T_out, int T_in, int C) {
    size_t n = (size_t)T_out * L * (C / 8);
    hsgather_concat_elem_kernel<<<vec_blocks(n, 256), 256>>>((uint4 *)out, parts, rows, L, T_out, T_in, C / 8);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

static int v1_split(struct hs_parts_out parts, const bf16 *in, int L, int T, int C) {
    size_t n = (size_t)T * L * (C / 8);
    hsgather_split_elem_kernel<<<vec_blocks(n, 256), 256>>>(parts, (const uint4 *)in, L, T, C / 8);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

/* variant v (1 or 2 = the library) */
static int concat_v(int v, bf16 *out, struct hs_parts parts, const int32_t *rows, int L, int T_out, int T_in, int C) {
    return v == 1 ? v1_concat(out, parts, rows, L, T_out, T_in, C) : hsgather_concat(out, parts, rows, L, T_out, T_in, C, 0);
}

static int split_v(int v, struct hs_parts_out parts, const bf16 *in, int L, int T, int C) {
    return v == 1 ? v1_split(parts, in, L, T, C) : hsgather_split(parts, in, L, T, C, 0);
}

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
        char what[96];
        /* identity concat, then split back: bitwise */
        BENCH_CUDA(cudaMemset(cat, 0xff, 2 * (size_t)L * n));
        BENCH_OK(concat_v(v, cat, p, NULL, L, T, T, C));
        BENCH_CUDA(cudaMemcpy(got, cat, 2 * (size_t)L * n, cudaMemcpyDeviceToHost));
        if (hsgather_concat_ref(want, &hp, NULL, L, T, T, C)) { fprintf(stderr, "reference failed\n"); return 1; }
        snprintf(what, sizeof what, "v%d concat identity (bitwise, whole)", v);
        bench_check(what, memcmp(got, want, 2 * (size_t)L * n) ? 1 : 0, 0);
        int bad = 0;
        for (int l = 0; l < L; l++) BENCH_CUDA(cudaMemset(po.p[l], 0xff, 2 * n));
        BENCH_OK(split_v(v, po, cat, L, T, C));
        for (int l = 0; l < L; l++) {
            BENCH_CUDA(cudaMemcpy(got, po.p[l], 2 * n, cudaMemcpyDeviceToHost));
            bad += memcmp(got, host[l], 2 * n) != 0;
        }
        snprintf(what, sizeof what, "v%d split (bitwise, whole)", v);
        bench_check(what, bad, 0);
        /* row list */
        BENCH_CUDA(cudaMemset(cat, 0xff, 2 * (size_t)L * n));
        BENCH_OK(concat_v(v, cat, p, rows, L, T_sub, T, C));
        BENCH_CUDA(cudaMemcpy(got, cat, 2 * (size_t)L * T_sub * C, cudaMemcpyDeviceToHost));
        if (hsgather_concat_ref(want, &hp, hrows, L, T_sub, T, C)) { fprintf(stderr, "reference failed\n"); return 1; }
        snprintf(what, sizeof what, "v%d concat row list T_out=%d (bitwise)", v, T_sub);
        bench_check(what, memcmp(got, want, 2 * (size_t)L * T_sub * C) ? 1 : 0, 0);

        char name[64];
        snprintf(name, sizeof name, "v%d hsgather_concat", v);
        bench_report_bytes(name, "L=5 T=8192 C=4096", bench_ms([&]() { BENCH_OK(concat_v(v, cat, p, NULL, L, T, T, C)); }), bytes);
        snprintf(name, sizeof name, "v%d hsgather_split", v);
        bench_report_bytes(name, "L=5 T=8192 C=4096", bench_ms([&]() { BENCH_OK(split_v(v, po, cat, L, T, C)); }), bytes);
    }
    return 0;
}
