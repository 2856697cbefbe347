/*
 * kernels/hsgather.cu — hidden-state concat/split (kernels/hsgather.h): one thread per 16-byte
 * vector of the concatenated row, grid-stride; the L part pointers travel in the kernel parameters.
 */
#include "kernels/hsgather.h"
#include "kernels/vec.cuh"

/* ---------------------------------------------------------------- kernels */

__global__ void hsgather_concat_kernel(uint4 *out, struct hs_parts parts, const int32_t *rows, int L, int T_out,
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

__global__ void hsgather_split_kernel(struct hs_parts_out parts, const uint4 *in, int L, int T, int C8) {
    size_t row8 = (size_t)L * C8, n = (size_t)T * row8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / row8), r = (int)(i % row8), l = r / C8, c = r % C8;
        ((uint4 *)parts.p[l])[(size_t)t * C8 + c] = __ldg(in + i);
    }
}

/* ---------------------------------------------------------------- launchers */

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
    size_t n = (size_t)T_out * L * (C / 8);
    hsgather_concat_kernel<<<vec_blocks(n, 256), 256, 0, stream>>>((uint4 *)out, parts, rows, L, T_out, T_in, C / 8);
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
    size_t n = (size_t)T * L * (C / 8);
    hsgather_split_kernel<<<vec_blocks(n, 256), 256, 0, stream>>>(parts, (const uint4 *)in, L, T, C / 8);
    KERNELS_CHECK_LAUNCH("hsgather_split");
    return 0;
}
