/*
 * kernels/bench/adamw_bench.cu — AdamW step and grad sum of squares bandwidth on 256 M parameters
 * (about the drafter's AdamW + Muon parameter count, 965 M, / 4: big enough to stream from HBM).
 *
 *   build: make bench (-> $(BUILD)/bench/adamw_bench); run on the GPU machine.
 *   step variant 1: kernels/adamw.cu (grid-stride, float4 when aligned, clip factor read on the device).
 *   sumsq variant 1: scalar grid-stride loads, one atomic per block (K2's first kernel; history, below).
 *   sumsq variant 2: kernels/adamw.cu (float4 loads, 4 in flight per thread, 1056 blocks).
 *
 * Napkin math: the step reads grad, master, m, v (16 B) and writes master, m, v (12 B) and the bf16
 * copy (2 B): 30 B per parameter; sumsq reads 4 B. Ceiling: device copy ~4.1-4.2 TB/s (gpu-machine.md);
 * target >= 80%.
 */
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/adamw.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKK(x) do { if ((x) != 0) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, kernels_error()); exit(1); } } while (0)

__global__ void fill_kernel(float *x, size_t n, float scale, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
        x[i] = scale * ((h & 0xffffff) / 16777216.0f - 0.5f);
    }
}

/* sumsq variant 1 (history): 2547 GB/s = 61% on the H200 (RESULTS.md). */
__global__ void adamw_grad_sumsq_kernel1(const float *grad, size_t n, float *sumsq) {
    float s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += grad[i] * grad[i];
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    __shared__ float part[32];
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0;
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) atomicAdd(sumsq, s);
    }
}
static int sumsq1(const float *g, size_t n, float *ss) {
    size_t b = (n + 255) / 256;
    adamw_grad_sumsq_kernel1<<<(unsigned)(b < 1 ? 1 : b > 132 * 16 ? 132 * 16 : b), 256>>>(g, n, ss);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

static int g_failed;   /* a validation printed FAIL: the exit status says so */

int main(void) {
    const size_t n = (size_t)256 << 20;
    float *w, *m, *v, *g, *ss;
    bf16 *cp;
    CK(cudaMalloc(&w, 4 * n)); CK(cudaMalloc(&m, 4 * n)); CK(cudaMalloc(&v, 4 * n)); CK(cudaMalloc(&g, 4 * n));
    CK(cudaMalloc(&cp, 2 * n)); CK(cudaMalloc(&ss, 4));
    fill_kernel<<<1024, 256>>>(w, n, 2.0f, 1);
    fill_kernel<<<1024, 256>>>(g, n, 0.01f, 2);
    CK(cudaMemset(m, 0, 4 * n));
    CK(cudaMemset(v, 0, 4 * n));
    /* validate on the first 1 M elements against the reference */
    {
        const size_t nv = 1 << 20;
        std::vector<float> hw(nv), hm(nv, 0), hv(nv, 0), hg(nv), gw(nv);
        CK(cudaMemcpy(hw.data(), w, 4 * nv, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hg.data(), g, 4 * nv, cudaMemcpyDeviceToHost));
        adamw_params p = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 0.0f};
        float *w2;
        CK(cudaMalloc(&w2, 4 * nv));
        CK(cudaMemcpy(w2, hw.data(), 4 * nv, cudaMemcpyHostToDevice));
        float *m2, *v2;
        CK(cudaMalloc(&m2, 4 * nv)); CK(cudaMalloc(&v2, 4 * nv));
        CK(cudaMemset(m2, 0, 4 * nv)); CK(cudaMemset(v2, 0, 4 * nv));
        CKK(adamw_step(w2, m2, v2, g, NULL, nv, &p, NULL, 0));
        CK(cudaMemcpy(gw.data(), w2, 4 * nv, cudaMemcpyDeviceToHost));
        char err[256];
        adamw_step_ref(hw.data(), hm.data(), hv.data(), hg.data(), NULL, nv, &p, 0, err, sizeof err);
        double e = 0;
        for (size_t i = 0; i < nv; i++) e = std::max(e, (double)fabsf(gw[i] - hw[i]) / (fabsf(hw[i]) + 1e-6f));
        printf("validate (1 M): max rel err %.3g: %s\n", e, e < 1e-5 ? "OK" : "FAIL");
        if (!(e < 1e-5)) g_failed = 1;
        cudaFree(w2); cudaFree(m2); cudaFree(v2);
    }
    /* sumsq: both variants against a double sum on the host, aligned and misaligned by one float */
    bool sumsq_ok[3] = {true, true, true};
    {
        std::vector<float> hg(n);
        CK(cudaMemcpy(hg.data(), g, 4 * n, cudaMemcpyDeviceToHost));
        for (int off = 0; off < 2; off++) {
            double ref = 0;
            for (size_t i = off; i < n; i++) ref += (double)hg[i] * hg[i];
            for (int var = 1; var <= 2; var++) {
                float got;
                CK(cudaMemset(ss, 0, 4));
                if (var == 1) CKK(sumsq1(g + off, n - off, ss));
                else CKK(adamw_grad_sumsq(g + off, n - off, ss, 0));
                CK(cudaMemcpy(&got, ss, 4, cudaMemcpyDeviceToHost));
                double rel = fabs(got - ref) / ref;
                sumsq_ok[var] = sumsq_ok[var] && rel < 1e-5;
                if (!(rel < 1e-5)) g_failed = 1;
                printf("validate sumsq variant %d (offset %d, %zu floats): rel err %.3g: %s\n", var, off, n - off, rel,
                       rel < 1e-5 ? "OK" : "FAIL");
            }
        }
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int pass = 0; pass < 3; pass++) {   /* step, sumsq variant 1, sumsq variant 2 */
        if (pass > 0 && !sumsq_ok[pass]) continue;
        std::vector<float> ms;
        for (int it = 0; it < 13; it++) {
            adamw_params p = {1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, it + 1, 1.0f};
            CK(cudaMemset(ss, 0, 4));
            CK(cudaEventRecord(e0));
            if (pass == 0) CKK(adamw_step(w, m, v, g, cp, n, &p, ss, 0));
            else if (pass == 1) CKK(sumsq1(g, n, ss));
            else CKK(adamw_grad_sumsq(g, n, ss, 0));
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            if (it >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        double med = ms[ms.size() / 2], bytes = (double)n * (pass == 0 ? 30 : 4);
        printf("variant %d %-6s n=%zu median %.3f ms  %.0f GB/s  (%.0f%% of 4150 GB/s copy ceiling; target >= 80%%)\n",
               pass == 0 ? 1 : pass, pass == 0 ? "step" : "sumsq", n, med, bytes / med / 1e6, 100.0 * bytes / med / 1e6 / 4150.0);
    }
    return g_failed ? 1 : 0;
}
