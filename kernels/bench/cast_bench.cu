/*
 * kernels/bench/cast_bench.cu — fp32 <-> bf16 casts (kernels/cast.h).
 *
 * Build: make BUILD=build-k1b build-k1b/bench/cast_bench   Run: build-k1b/bench/cast_bench
 * Variant 1: 8 elements per thread when aligned (fp32 -> bf16 still uses it). bf16 -> fp32 measured
 *            64% on the H200 (K1): each lane stores two float4 32 bytes apart.
 * Variant 2 (bf16 -> fp32, the default): 4 elements per item (8-byte load, one float4 store), 4
 *            items in flight per thread, streaming hints. DFLASH_CAST_KERNEL=1 selects variant 1.
 * Bytes: 4 + 2 per element. Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/cast.h"
#include "k1bench.cuh"

#include <string.h>

/* bit pattern of a float, to compare NaN payloads too */
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* bf16 -> fp32 of the first 4096 + a misaligned-by-one and an odd-length slice: bitwise. */
static int check_up(float *f, const bf16 *b, const bf16 *hb) {
    float got[4096];
    int bad = 0;
    BENCH_CUDA(cudaMemset(f, 0xff, 4 * 4100));
    BENCH_OK(cast_bf16_to_f32(f, b, 4096, 0));
    BENCH_CUDA(cudaMemcpy(got, f, 4 * 4096, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4096; i++) bad += bits(got[i]) != ((uint32_t)hb[i] << 16);
    BENCH_CUDA(cudaMemset(f, 0xff, 4 * 4100));
    BENCH_OK(cast_bf16_to_f32(f, b + 1, 4093, 0));   /* src 2-byte aligned: the element path */
    BENCH_CUDA(cudaMemcpy(got, f, 4 * 4094, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4093; i++) bad += bits(got[i]) != ((uint32_t)hb[i + 1] << 16);
    bad += got[4093] == got[4093];   /* the element past n stays the 0xff.. NaN poison */
    BENCH_OK(cast_bf16_to_f32(f, b, 4095, 0));       /* aligned, n % 4 = 3: vector body + tail */
    BENCH_CUDA(cudaMemcpy(got, f, 4 * 4096, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4095; i++) bad += bits(got[i]) != ((uint32_t)hb[i] << 16);
    return bad;
}

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
    for (int v = 1; v <= 2; v++) {
        setenv("DFLASH_CAST_KERNEL", v == 1 ? "1" : "2", 1);
        char what[64];
        snprintf(what, sizeof what, "v%d cast_bf16_to_f32 (bitwise, 3 slices)", v);
        bench_check(what, check_up(f, b, hb), 0);
        ms = bench_ms([&]() { BENCH_OK(cast_bf16_to_f32(f, b, n, 0)); }, 5);
        snprintf(what, sizeof what, "v%d cast_bf16_to_f32", v);
        bench_report_bytes(what, "n=965Mi", ms, 6.0 * n);
        /* the last Mi elements of the timed full-size cast (the grid-stride tail), bitwise */
        {
            const size_t m = (size_t)1 << 20, off = n - m;
            bf16 *hb2 = (bf16 *)malloc(2 * m);
            float *hf2 = (float *)malloc(4 * m);
            BENCH_CUDA(cudaMemcpy(hb2, b + off, 2 * m, cudaMemcpyDeviceToHost));
            BENCH_CUDA(cudaMemcpy(hf2, f + off, 4 * m, cudaMemcpyDeviceToHost));
            int bad = 0;
            for (size_t i = 0; i < m; i++) bad += bits(hf2[i]) != ((uint32_t)hb2[i] << 16);
            snprintf(what, sizeof what, "v%d cast_bf16_to_f32 full size (last Mi, bitwise)", v);
            bench_check(what, bad, 0);
            free(hb2); free(hf2);
        }
    }
    unsetenv("DFLASH_CAST_KERNEL");
    return 0;
}
