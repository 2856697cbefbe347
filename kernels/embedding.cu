/*
 * kernels/embedding.cu — embedding gather (kernels/embedding.h): one thread per 16-byte vector of
 * the output, grid-stride; bad ids write NaN rows (the kernel cannot return an error).
 */
#include "kernels/embedding.h"
#include "kernels/vec.cuh"

/* ---------------------------------------------------------------- kernels */

__global__ void embedding_forward_kernel(uint4 *out, const int32_t *ids, const uint4 *table, int T, int C8, int V) {
    size_t n = (size_t)T * C8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(i / C8), c = (int)(i % C8);
        int id = __ldg(ids + t);
        uint4 v;
        if (id >= 0 && id < V) v = __ldg(table + (size_t)id * C8 + c);
        else v = make_uint4(0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u);   /* bf16 NaN */
        out[i] = v;
    }
}

/* ---------------------------------------------------------------- launchers */

extern "C" int embedding_forward(bf16 *out, const int32_t *ids, const bf16 *table, int T, int C, int V,
                                 cudaStream_t stream) {
    if (T < 0 || C <= 0 || V <= 0) return kernels_fail("embedding_forward: bad sizes T=%d C=%d V=%d", T, C, V);
    if (C % 8) return kernels_fail("embedding_forward: C=%d must be a multiple of 8", C);
    if (!vec_aligned16(out) || !vec_aligned16(table))
        return kernels_fail("embedding_forward: out and table must be 16-byte aligned");
    if (T == 0) return 0;
    size_t n = (size_t)T * (C / 8);
    embedding_forward_kernel<<<vec_blocks(n, 256), 256, 0, stream>>>((uint4 *)out, ids, (const uint4 *)table, T, C / 8, V);
    KERNELS_CHECK_LAUNCH("embedding_forward");
    return 0;
}
