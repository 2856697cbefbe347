/*
 * kernels/argmax.cu — row argmax (kernels/argmax.h): one block of 1024 threads per row. Each thread folds its
 * columns v = tid, tid + 1024, ... in increasing order into (max, index) with `x > max` (a NaN never wins, a tie
 * keeps the earlier index); the pairs then merge by (larger value, then smaller index), within warps by shuffles
 * and across warps in shared memory. That is the plain loop's pick except when x[0] is NaN (the loop then keeps 0
 * whatever follows), which thread 0 settles at the end.
 */
#include "kernels/argmax.h"

#include <math.h>

#define AM_THREADS 1024

__device__ __forceinline__ void am_merge(float &m, int &i, float m2, int i2) {
    if (m2 > m || (m2 == m && i2 < i)) {
        m = m2;
        i = i2;
    }
}

__global__ void __launch_bounds__(AM_THREADS) argmax_rows_kernel(int32_t *out, const float *x, int V) {
    __shared__ float sm[AM_THREADS / 32];
    __shared__ int si[AM_THREADS / 32];
    const float *row = x + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    int i = 0x7fffffff;
    for (int v = threadIdx.x; v < V; v += AM_THREADS) {
        float a = __ldg(row + v);
        if (a > m || (a == m && v < i)) {   /* the second clause only while m is -inf (v increases) */
            m = a;
            i = v;
        }
    }
    for (int o = 16; o; o >>= 1) am_merge(m, i, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, i, o));
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        sm[w] = m;
        si[w] = i;
    }
    __syncthreads();
    if (w == 0) {
        m = sm[lane];
        i = si[lane];
        for (int o = 16; o; o >>= 1)
            am_merge(m, i, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, i, o));
        if (lane == 0) out[blockIdx.x] = isnan(row[0]) ? 0 : i;
    }
}

extern "C" int argmax_rows(int32_t *out, const float *x, int R, int V, cudaStream_t stream) {
    if (R < 0 || V < 1) return kernels_fail("argmax_rows: bad sizes R=%d V=%d (need R >= 0, V >= 1)", R, V);
    if (R > 0 && (!out || !x)) return kernels_fail("argmax_rows: a NULL pointer");
    if (R == 0) return 0;
    argmax_rows_kernel<<<R, AM_THREADS, 0, stream>>>(out, x, V);
    KERNELS_CHECK_LAUNCH("argmax_rows");
    return 0;
}
