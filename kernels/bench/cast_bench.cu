/*
 * kernels/bench/cast_bench.cu — fp32 <-> bf16 casts (kernels/cast.h).
 *
 * Build: make BUILD=build-k1b build-k1b/bench/cast_bench   Run: build-k1b/bench/cast_bench
 * Variant 1: 8 elements per thread when aligned (fp32 -> bf16 still uses it). bf16 -> fp32 measured
 *            64% on the H200 (K1): each lane stores two float4 32 bytes apart.
 * Variant 2 (bf16 -> fp32, the default): 4 elements per item (8-byte load, one float4 store), 4
 *            items in flight per thread, streaming hints. Variant 1's bf16 -> fp32 kernel is retired
 *            from the library and lives here only, as the baseline to measure against.
 * Bytes: 4 + 2 per element. Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/cast.h"
#include "kernels/vec.cuh"
#include "k1bench.cuh"

#include <string.h>

/* ---------------------------------------------------------------- variant 1 (retired, bench only) */

__global__ void cast_bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n, int vec) {
    size_t stride = (size_t)gridDim.x * blockDim.x, i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t nv = vec ? n / 8 : 0;
    for (size_t i = i0; i < nv; i += stride) {
        float f[8];
        vec_unpack8(__ldg((const uint4 *)src + i), f);
        ((float4 *)dst)[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
        ((float4 *)dst)[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    const __nv_bfloat16 *s = (const __nv_bfloat16 *)src;
    for (size_t i = nv * 8 + i0; i < n; i += stride) dst[i] = __bfloat162float(s[i]);
}

/* bf16 -> fp32 by variant v (1, or 2 = the library's cast_bf16_to_f32) */
static int up_v(int v, float *dst, const bf16 *src, size_t n) {
    if (v != 1) return cast_bf16_to_f32(dst, src, n, 0);
    if (n == 0) return 0;
    int vec = vec_aligned16(dst) && vec_aligned16(src);
    cast_bf16_to_f32_kernel<<<vec_blocks(vec ? n / 8 + 8 : n, 256), 256>>>(dst, src, n, vec);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

/* bit pattern of a float, to compare NaN payloads too */
static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* bf16 -> fp32 of the first 4096 + a misaligned-by-one and an odd-length slice: bitwise. */
static int check_up(int v, float *f, const bf16 *b, const bf16 *hb) {
    float got[4096];
    int bad = 0;
    BENCH_CUDA(cudaMemset(f, 0xff, 4 * 4100));
    BENCH_OK(up_v(v, f, b, 4096));
    BENCH_CUDA(cudaMemcpy(got, f, 4 * 4096, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4096; i++) bad += bits(got[i]) != ((uint32_t)hb[i] << 16);
    BENCH_CUDA(cudaMemset(f, 0xff, 4 * 4100));
    BENCH_OK(up_v(v, f, b + 1, 4093));   /* src 2-byte aligned: the element path */
    BENCH_CUDA(cudaMemcpy(got, f, 4 * 4094, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 4093; i++) bad += bits(got[i]) != ((uint32_t)hb[i + 1] << 16);
    bad += got[4093] == got[4093];   /* the element past n stays the 0xff.. NaN poison */
    BENCH_OK(up_v(v, f, b, 4095));       /* aligned, n % 4 = 3: vector body + tail */
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
        char what[64];
        snprintf(what, sizeof what, "v%d cast_bf16_to_f32 (bitwise, 3 slices)", v);
        bench_check(what, check_up(v, f, b, hb), 0);
        ms = bench_ms([&]() { BENCH_OK(up_v(v, f, b, n)); }, 5);
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
    return 0;
}
