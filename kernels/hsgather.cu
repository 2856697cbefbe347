/*
 * kernels/hsgather.cu — hidden-state concat/split (kernels/hsgather.h). Pure 16-byte copies.
 *
 * One warp per row part (token t, part l), warps grid-stride over the T·L row parts; the only
 * division is the one (t, l) = divmod(part, L) per row part (a div/mod chain per 16-byte element
 * costs a third of the copy bandwidth), and each lane keeps HS_UNROLL 16-byte loads in flight
 * before it stores. The L part pointers travel in the kernel parameters.
 */
#include "kernels/hsgather.h"
#include "kernels/vec.cuh"

#define HS_THREADS 256
#define HS_UNROLL 4

/* ---------------------------------------------------------------- kernels */

/* Part pointer l of the kernel parameters, chosen by a compare chain rather than a dynamic index
 * (a dynamically indexed parameter array would be copied to local memory). */
template <typename P>
static __device__ __forceinline__ P hs_pick(const P *p, int l) {
    P r = p[0];
#pragma unroll
    for (int i = 1; i < HSGATHER_MAX_PARTS; i++)
        if (l == i) r = p[i];
    return r;
}

__global__ void __launch_bounds__(HS_THREADS) hsgather_concat_kernel(uint4 *out, struct hs_parts parts,
                                                                     const int32_t *rows, int L, int T_out,
                                                                     int T_in, int C8) {
    int lane = threadIdx.x % 32;
    size_t nparts = (size_t)T_out * L, nwarps = (size_t)gridDim.x * (HS_THREADS / 32);
    for (size_t pi = blockIdx.x * (size_t)(HS_THREADS / 32) + threadIdx.x / 32; pi < nparts; pi += nwarps) {
        int t = (int)(pi / L), l = (int)(pi % L);
        int src = rows ? __ldg(rows + t) : t;
        bool ok = src >= 0 && src < T_in;
        const uint4 *s = (const uint4 *)hs_pick(parts.p, l) + (size_t)(ok ? src : 0) * C8;
        uint4 *d = out + pi * C8;   /* out row t, part l starts at (t·L + l)·C8 */
        for (int c0 = 0; c0 < C8; c0 += 32 * HS_UNROLL) {
            uint4 v[HS_UNROLL];
#pragma unroll
            for (int u = 0; u < HS_UNROLL; u++) {
                int c = c0 + u * 32 + lane;
                v[u] = make_uint4(0, 0, 0, 0);
                if (ok && c < C8) v[u] = __ldg(s + c);
            }
#pragma unroll
            for (int u = 0; u < HS_UNROLL; u++) {
                int c = c0 + u * 32 + lane;
                if (c < C8) d[c] = v[u];
            }
        }
    }
}

__global__ void __launch_bounds__(HS_THREADS) hsgather_split_kernel(struct hs_parts_out parts, const uint4 *in, int L,
                                                                    int T, int C8) {
    int lane = threadIdx.x % 32;
    size_t nparts = (size_t)T * L, nwarps = (size_t)gridDim.x * (HS_THREADS / 32);
    for (size_t pi = blockIdx.x * (size_t)(HS_THREADS / 32) + threadIdx.x / 32; pi < nparts; pi += nwarps) {
        int t = (int)(pi / L), l = (int)(pi % L);
        const uint4 *s = in + pi * C8;
        uint4 *d = (uint4 *)hs_pick(parts.p, l) + (size_t)t * C8;
        for (int c0 = 0; c0 < C8; c0 += 32 * HS_UNROLL) {
            uint4 v[HS_UNROLL];
#pragma unroll
            for (int u = 0; u < HS_UNROLL; u++) {
                int c = c0 + u * 32 + lane;
                if (c < C8) v[u] = __ldg(s + c);
            }
#pragma unroll
            for (int u = 0; u < HS_UNROLL; u++) {
                int c = c0 + u * 32 + lane;
                if (c < C8) d[c] = v[u];
            }
        }
    }
}

/* ---------------------------------------------------------------- launchers */

/* Blocks for one warp per row part, capped (the warps grid-stride over the rest). */
static unsigned hs_blocks(size_t nparts) {
    size_t b = (nparts + HS_THREADS / 32 - 1) / (HS_THREADS / 32);
    if (b > 132u * 64u) b = 132u * 64u;
    return b ? (unsigned)b : 1u;
}

extern "C" int hsgather_concat(bf16 *out, struct hs_parts parts, const int32_t *rows, int L, int T_out, int T_in,
                               int C, cudaStream_t stream) {
    if (L < 1 || L > HSGATHER_MAX_PARTS)
        return kernels_fail("hsgather_concat: L=%d parts, expected 1..%d", L, HSGATHER_MAX_PARTS);
    if (T_out < 0 || T_in < 0 || C <= 0 || C % 8)
        return kernels_fail("hsgather_concat: bad sizes T_out=%d T_in=%d C=%d (C must be a multiple of 8)", T_out, T_in, C);
    if (!rows && T_out != T_in)
        return kernels_fail("hsgather_concat: without a row list T_out (%d) must equal T_in (%d)", T_out, T_in);
    if (!vec_aligned16(out)) return kernels_fail("hsgather_concat: out must be 16-byte aligned");
    for (int l = 0; l < L; l++)
        if (!vec_aligned16(parts.p[l])) return kernels_fail("hsgather_concat: part %d must be 16-byte aligned", l);
    if (T_out == 0) return 0;
    hsgather_concat_kernel<<<hs_blocks((size_t)T_out * L), HS_THREADS, 0, stream>>>((uint4 *)out, parts, rows, L, T_out,
                                                                                    T_in, C / 8);
    KERNELS_CHECK_LAUNCH("hsgather_concat");
    return 0;
}

extern "C" int hsgather_split(struct hs_parts_out parts, const bf16 *in, int L, int T, int C, cudaStream_t stream) {
    if (L < 1 || L > HSGATHER_MAX_PARTS)
        return kernels_fail("hsgather_split: L=%d parts, expected 1..%d", L, HSGATHER_MAX_PARTS);
    if (T < 0 || C <= 0 || C % 8)
        return kernels_fail("hsgather_split: bad sizes T=%d C=%d (C must be a multiple of 8)", T, C);
    if (!vec_aligned16(in)) return kernels_fail("hsgather_split: in must be 16-byte aligned");
    for (int l = 0; l < L; l++)
        if (!vec_aligned16(parts.p[l])) return kernels_fail("hsgather_split: part %d must be 16-byte aligned", l);
    if (T == 0) return 0;
    hsgather_split_kernel<<<hs_blocks((size_t)T * L), HS_THREADS, 0, stream>>>(parts, (const uint4 *)in, L, T, C / 8);
    KERNELS_CHECK_LAUNCH("hsgather_split");
    return 0;
}
