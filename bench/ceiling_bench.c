/*
 * bench/ceiling_bench.c — the two ceilings scripts/bench.sh --gpu divides by, measured in the same run instead of
 * taken from constants (issue 21): the bf16 GEMM peak and the device-to-device copy bandwidth of this GPU.
 *
 *   build: make BUILD=build build/bench/ceiling_bench      run: build/bench/ceiling_bench [--n 8192] [--reps 10]
 *                                                                  [--copy-mib 2048]
 *
 * GEMM: D[n,n] = A[n,n] · B[n,n]ᵀ in bf16 (fp32 accumulate) through kernels/blas.h blas_matmul, the cuBLASLt path
 * every GEMM of the target and the trainer takes (train_bench's own peak is the same call), n = 8192 by default;
 * 2·n³ FLOPs per call; one untimed warm-up call (plan and algorithm selection), then --reps calls each timed
 * with CUDA events; best and median reported. Copy: cudaMemcpyAsync device to device of --copy-mib MiB, one
 * untimed warm-up, --reps timed copies; the rate counts bytes read + bytes written (2 × size), as gpu-machine.md's
 * 4.1 TB/s does. Random inputs (not zeros: a GEMM of zeros can run faster on some parts).
 * Output, one line each (bench.sh parses them):
 *   RESULT ceiling gemm_bf16 n 8192 TFLOP/s best X median Y reps R
 *   RESULT ceiling d2d_copy MiB 2048 TB/s best X median Y reps R
 * Exit 0; 1 when a CUDA call fails (FAIL line names it). Without CUDA (or with no device) it prints "skipped".
 */
#include "kernels/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/blas.h"
#include "model/target.h"

#define FAIL(...) do { fprintf(stderr, "ceiling_bench: FAIL: " __VA_ARGS__); fputc('\n', stderr); return 1; } while (0)
#define CU(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) FAIL("%s: %s", #x, cudaGetErrorString(e_)); } while (0)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* best (largest) and median of r[0..n) */
static void best_median(double *r, int n, double *best, double *med) {
    qsort(r, (size_t)n, sizeof *r, cmp_double);
    *best = r[n - 1];
    *med = n % 2 ? r[n / 2] : 0.5 * (r[n / 2 - 1] + r[n / 2]);
}

int main(int argc, char **argv) {
    int n = 8192, reps = 10, copy_mib = 2048;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--copy-mib") && i + 1 < argc) copy_mib = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--n 8192] [--reps 10] [--copy-mib 2048]\n", argv[0]); return 2; }
    }
    if (n < 256 || n % 64 || reps < 1 || reps > 1000 || copy_mib < 1 || copy_mib > 65536) {
        fprintf(stderr, "ceiling_bench: need --n >= 256 (a multiple of 64), 1 <= --reps <= 1000, 1 <= --copy-mib <= 65536\n");
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("ceiling_bench: no CUDA device, skipped\n"); return 0; }
    struct cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, %.1f GiB\n", prop.name, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    double *r = calloc((size_t)reps, sizeof *r);
    if (!r) FAIL("out of host memory");
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));

    /* ---- bf16 GEMM */
    bf16 *a, *b, *d;
    const size_t nn = (size_t)n * n;
    CU(cudaMalloc((void **)&a, 2 * nn));
    CU(cudaMalloc((void **)&b, 2 * nn));
    CU(cudaMalloc((void **)&d, 2 * nn));
    if (target_fill_random_bf16(a, nn, 1, 0, 0.02f, 0) || target_fill_random_bf16(b, nn, 2, 0, 0.02f, 0))
        FAIL("fill: %s", kernels_error());
    for (int it = -1; it < reps; it++) {
        CU(cudaEventRecord(e0, 0));
        if (blas_matmul(d, BLAS_BF16, a, 0, b, 1, NULL, n, n, n, 0, 0, 0, 1.0f, 0.0f, 0))
            FAIL("blas_matmul %d^3: %s", n, kernels_error());
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 0) r[it] = 2.0 * n * (double)n * n / (ms * 1e-3) / 1e12;
    }
    double gbest, gmed;
    best_median(r, reps, &gbest, &gmed);
    printf("RESULT ceiling gemm_bf16 n %d TFLOP/s best %.1f median %.1f reps %d\n", n, gbest, gmed, reps);
    CU(cudaFree(a));
    CU(cudaFree(b));
    CU(cudaFree(d));

    /* ---- device-to-device copy */
    const size_t bytes = (size_t)copy_mib << 20;
    void *src, *dst;
    CU(cudaMalloc(&src, bytes));
    CU(cudaMalloc(&dst, bytes));
    if (target_fill_random_bf16(src, bytes / 2, 3, 0, 1.0f, 0)) FAIL("fill: %s", kernels_error());
    for (int it = -1; it < reps; it++) {
        CU(cudaEventRecord(e0, 0));
        CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
        CU(cudaEventRecord(e1, 0));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 0) r[it] = 2.0 * (double)bytes / (ms * 1e-3) / 1e12;
    }
    double cbest, cmed;
    best_median(r, reps, &cbest, &cmed);
    printf("RESULT ceiling d2d_copy MiB %d TB/s best %.2f median %.2f reps %d (bytes read + written)\n", copy_mib,
           cbest, cmed, reps);
    CU(cudaFree(src));
    CU(cudaFree(dst));
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    free(r);
    return 0;
}
#else
int main(void) {
    printf("ceiling_bench: built without CUDA, skipped\n");
    return 0;
}
#endif
