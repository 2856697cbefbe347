/*
 * kernels/bench/gemm_bench.cu — cuBLASLt GEMMs of the standard configuration (design.md §10)
 * through kernels/blas.h.
 *
 * Build: make BUILD=build-k1 build-k1/bench/gemm_bench   Run: build-k1/bench/gemm_bench
 * Variant 1: blas_matmul (cuBLASLt heuristic algorithm, bf16 in, fp32 accumulate), forward
 *            y = x·Wᵀ (TN), dX = dY·W (NN), dW = dYᵀ·X into fp32 with accumulate (NT).
 * FLOPs = 2·M·N·K. Ceiling: ~760-795 TFLOP/s measured at 8192³; target >= 85% of it.
 * Every shape is validated first on sampled rows against the CPU reference.
 */
#include "kernels/blas.h"
#include "kernels/gemm.h"
#include "k1bench.cuh"

#include <math.h>
#include <string.h>

struct shape { const char *name; int M, N, K, kind; };   /* kind 0 fwd, 1 dX, 2 dW (fp32 accumulate) */

static void run(const struct shape *s) {
    int M = s->M, N = s->N, K = s->K;
    /* operand sizes per kind: fwd a=[M,K] b=[N,K]; dX a=[M,K'] ... expressed through blas_matmul */
    size_t na = (size_t)M * K, nb = (size_t)N * K, nd = (size_t)M * N;
    float *ha, *hb;
    bf16 *a = bench_rand_bf16(na, -1, 1, 1, &ha), *b = bench_rand_bf16(nb, -0.05f, 0.05f, 2, &hb);
    void *d;
    BENCH_CUDA(cudaMalloc(&d, nd * 4));
    BENCH_CUDA(cudaMemset(d, 0, nd * 4));
    int ta = s->kind == 2, tb = s->kind == 0;
    blas_dtype dt = s->kind == 2 ? BLAS_F32 : BLAS_BF16;
    float beta = s->kind == 2 ? 1.0f : 0.0f;
    /* a is op(A) [M,K] stored [M,K] or ([K,M] for dW); b is op(B) [K,N] stored [N,K] (fwd) or [K,N] */
    auto fn = [&]() { BENCH_OK(blas_matmul(d, dt, a, ta, b, tb, NULL, M, N, K, 0, 0, 0, 1.0f, beta, 0)); };
    /* validate on 4 rows with beta 0 semantics: run once from zero */
    BENCH_CUDA(cudaMemset(d, 0, nd * 4));
    fn();
    BENCH_CUDA(cudaDeviceSynchronize());
    double err = 0;
    for (int r = 0; r < 4; r++) {
        int i = r * (M - 1) / 3;
        for (int j = 0; j < N; j += 97) {
            double acc = 0;
            for (int k = 0; k < K; k++) {
                double av = ta ? ha[(size_t)k * M + i] : ha[(size_t)i * K + k];
                double bv = tb ? hb[(size_t)j * K + k] : hb[(size_t)k * N + j];
                acc += av * bv;
            }
            float got;
            if (dt == BLAS_F32) BENCH_CUDA(cudaMemcpy(&got, (float *)d + (size_t)i * N + j, 4, cudaMemcpyDeviceToHost));
            else {
                bf16 h;
                BENCH_CUDA(cudaMemcpy(&h, (bf16 *)d + (size_t)i * N + j, 2, cudaMemcpyDeviceToHost));
                got = bf16_to_float(h);
            }
            double e = fabs(got - acc) / (1e-2 + fabs(acc));
            if (!(e <= err)) err = e;
        }
    }
    char what[96];
    snprintf(what, sizeof what, "%s (rel, sampled)", s->name);
    bench_check(what, err, 1.6e-2);
    double ms = bench_ms(fn, 10);
    char shp[64];
    snprintf(shp, sizeof shp, "M=%d N=%d K=%d %s", M, N, K, s->kind == 0 ? "TN" : s->kind == 1 ? "NN" : "NT+f32acc");
    bench_report_flops(s->name, shp, ms, 2.0 * M * N * K);
    cudaFree(a); cudaFree(b); cudaFree(d);
    free(ha); free(hb);
}

int main(void) {
    struct shape shapes[] = {
        {"peak 8192^3", 8192, 8192, 8192, 0},
        {"target qkv (fused)", 8192, 6144, 4096, 0},
        {"target o_proj", 8192, 4096, 4096, 0},
        {"target gate_up (fused)", 8192, 24576, 4096, 0},
        {"target down_proj", 8192, 4096, 12288, 0},
        {"drafter fc (k=5)", 8192, 4096, 20480, 0},
        {"drafter k/v ctx+block", 16384, 2048, 4096, 0},
        {"drafter lm_head V=32000", 8192, 32000, 4096, 0},
        {"drafter dX gate_up", 8192, 4096, 24576, 1},
        {"drafter dX down", 8192, 12288, 4096, 1},
        {"drafter dW gate_up (f32 acc)", 24576, 4096, 8192, 2},
        {"drafter dW down (f32 acc)", 4096, 12288, 8192, 2},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run(&shapes[i]);
    blas_free();
    return 0;
}
