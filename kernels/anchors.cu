/*
 * kernels/anchors.cu — anchor selection on the device (kernels/anchors.h).
 *
 * Kernel 1 gives every position its key (UINT64_MAX for non-candidates) and kernel 2 its rank in
 * (key, p) order by scanning all keys through shared memory (O(T^2) compares: 67 M at T = 8192, a few
 * microseconds spread over the GPU). A candidate is selected iff rank < N, which selects exactly the
 * reference's set. Kernel 3 (one block) turns the selected flags into sorted anchors with a block-wide
 * prefix count and pads the slots after K.
 */
#include "kernels/anchors.h"
#include "kernels/common.h"

/* ---------------------------------------------------------------- kernels */

__global__ void anchors_keys_kernel(const uint8_t *loss_mask, int T, int B, uint64_t seed, uint64_t step,
                                    uint64_t *keys) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= T) return;
    keys[p] = (p < T - B && loss_mask[p]) ? anchors_key(seed, step, (uint32_t)p) : UINT64_MAX;
}

__global__ void anchors_forward_kernel(const uint64_t *keys, int T, int N, uint8_t *selected) {
    __shared__ uint64_t tile[256];
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    uint64_t mine = p < T ? keys[p] : UINT64_MAX;
    int rank = 0;
    for (int base = 0; base < T; base += 256) {
        int q = base + threadIdx.x;
        tile[threadIdx.x] = q < T ? keys[q] : UINT64_MAX;
        __syncthreads();
        int n = min(256, T - base);
        for (int i = 0; i < n; i++) {
            uint64_t k = tile[i];
            rank += (k < mine) || (k == mine && base + i < p);
        }
        __syncthreads();
    }
    if (p < T) selected[p] = mine != UINT64_MAX && rank < N;
}

__global__ void anchors_compact_kernel(const uint8_t *selected, int T, int N, int32_t *anchors, uint8_t *valid,
                                       int32_t *count) {
    __shared__ int sums[1024];
    int tid = threadIdx.x, nt = blockDim.x;
    int chunk = (T + nt - 1) / nt;
    int lo = min(T, tid * chunk), hi = min(T, lo + chunk);
    int local = 0;
    for (int p = lo; p < hi; p++) local += selected[p];
    sums[tid] = local;
    __syncthreads();
    for (int off = 1; off < nt; off <<= 1) {   /* inclusive Hillis-Steele scan */
        int v = tid >= off ? sums[tid - off] : 0;
        __syncthreads();
        sums[tid] += v;
        __syncthreads();
    }
    int idx = sums[tid] - local;
    for (int p = lo; p < hi; p++)
        if (selected[p]) { anchors[idx] = p; valid[idx] = 1; idx++; }
    int K = sums[nt - 1];
    for (int i = K + tid; i < N; i += nt) { anchors[i] = 0; valid[i] = 0; }
    if (tid == 0 && count) *count = K;
}

/* ---------------------------------------------------------------- launchers */

extern "C" size_t anchors_workspace_bytes(int T) {
    return (size_t)T * sizeof(uint64_t) + (size_t)T;
}

extern "C" int anchors_forward(const uint8_t *d_loss_mask, int T, int B, int N, uint64_t seed, uint64_t step,
                               int32_t *d_anchors, uint8_t *d_valid, int32_t *d_count, void *d_workspace,
                               cudaStream_t stream) {
    if (T < 1 || B < 1 || N < 1)
        return kernels_fail("anchors_forward: need T, B, N >= 1, got T=%d B=%d N=%d", T, B, N);
    if (!d_loss_mask || !d_anchors || !d_valid || !d_workspace)
        return kernels_fail("anchors_forward: a required device pointer is NULL");
    uint64_t *keys = (uint64_t *)d_workspace;
    uint8_t *selected = (uint8_t *)(keys + T);
    int grid = (T + 255) / 256;
    anchors_keys_kernel<<<grid, 256, 0, stream>>>(d_loss_mask, T, B, seed, step, keys);
    KERNELS_CHECK_LAUNCH("anchors_keys_kernel");
    anchors_forward_kernel<<<grid, 256, 0, stream>>>(keys, T, N, selected);
    KERNELS_CHECK_LAUNCH("anchors_forward_kernel");
    anchors_compact_kernel<<<1, 1024, 0, stream>>>(selected, T, N, d_anchors, d_valid, d_count);
    KERNELS_CHECK_LAUNCH("anchors_compact_kernel");
    return 0;
}
