/*
 * kernels/bench/lmhead_loss_bench.cu — fused LM head + loss, forward + backward, at the standard
 * configuration: R = 512 anchors x 16 = 8192 rows, D = 4096, draft vocabulary 32000, KL with exp-decay
 * weights, T = 8192 — against its GEMMs alone (z = xn·Wᵀ, t = th·Wvᵀ, dxn = dz·W through kernels/blas.h).
 *
 *   build: make bench (-> $(BUILD)/bench/lmhead_loss_bench); run on the GPU machine.
 *   variant 1: one vocabulary chunk (vocab_chunk >= V): logits kept in bf16 (2 x 0.5 GiB), no recompute.
 *   variant 2: chunks of 8192: (R, 8192) buffers only; the backward recomputes both logit chunks.
 *   variant 3: the default plan (vocab_chunk 0; since K2c one chunk when the logits fit in
 *              LMHEAD_SINGLE_CHUNK_MAX_BYTES, as here), printed with the chunk it chose.
 *   All time kernels/lmhead_loss.cu as it is; K2's first row kernels (2-byte loads, a stat merge per
 *   logit) measured 1.347x / 2.197x (RESULTS.md, commit 79e07de); since K2b they use 16-byte loads and
 *   one exp per logit and stream; since K2c they load the next step's vectors before folding this one's.
 *
 * Baseline: the three GEMMs on random data. Until K2c the dxn GEMM multiplied an all-zero dz (a GEMM on
 * zeros draws less power, so it may run at higher clocks than the fused op's GEMM on real dz); that
 * baseline is still printed ("dz = 0") for comparison with the earlier entries, and each variant's
 * ratio is given against both.
 *
 * Napkin math: each GEMM is 2·R·V·D = 2.15 TFLOP; target: fused time <= 1.25 x the three GEMMs.
 * Validation: both variants against lmhead_loss_forward_ref/backward_ref on a small problem first.
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "kernels/blas.h"
#include "kernels/lmhead_loss.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CKK(x) do { if ((x) != 0) { fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, kernels_error()); exit(1); } } while (0)

struct problem {
    lmhead_loss_config c;
    std::vector<bf16> x, h, last;
    std::vector<float> w;
    std::vector<int32_t> anchors;
    std::vector<uint8_t> valid, mask;
    bf16 *d_x, *d_h, *d_last;
    float *d_w, *d_L, *d_rl, *d_rw, *d_dx;
    int32_t *d_a, *d_c, *d_t;
    uint8_t *d_valid, *d_mask;
};

/* x[i] = bf16 of a hash of (seed, i) in [-s, s): device fill of the big GEMM operands */
__global__ void fill_random(bf16 *x, size_t n, uint64_t seed, float s) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
        h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 27; h *= 0x94D049BB133111EBull; h ^= h >> 31;
        float u = (float)((h >> 40) / 8388608.0 - 1.0) * s;
        __nv_bfloat16 b = __float2bfloat16_rn(u);
        x[i] = *reinterpret_cast<bf16 *>(&b);
    }
}

static int g_failed;   /* a validation printed FAIL: the exit status says so */
static float frand(uint64_t *r, float s) { return s * (float)((kernels_rng_next(r) >> 40) / 8388608.0 - 1.0); }

static void make(problem &p, int T, int N, int B, int D, int V) {
    lmhead_loss_config c = {T, N, B, D, V, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 4.0f, 0.5f, 1e-6f};
    p.c = c;
    int R = N * B;
    uint64_t rng = 42;
    float sc = sqrtf(27.0f / D);
    p.x.resize((size_t)R * D); p.h.resize((size_t)V * D); p.last.resize((size_t)T * D); p.w.resize(D);
    for (auto &e : p.x) e = float_to_bf16(frand(&rng, 1));
    for (auto &e : p.h) e = float_to_bf16(frand(&rng, sc));
    for (auto &e : p.last) e = float_to_bf16(frand(&rng, 3));
    for (auto &e : p.w) e = 1.0f + frand(&rng, 0.5f);
    p.anchors.resize(N); p.valid.resize(N); p.mask.resize(T);
    for (int i = 0; i < T; i++) p.mask[i] = kernels_rng_next(&rng) % 10 < 7;
    for (int b = 0; b < N; b++) { p.valid[b] = 1; p.anchors[b] = (int)(kernels_rng_next(&rng) % (uint64_t)(T - B)); }
    std::sort(p.anchors.begin(), p.anchors.end());
    CK(cudaMalloc(&p.d_x, 2 * p.x.size())); CK(cudaMalloc(&p.d_h, 2 * p.h.size())); CK(cudaMalloc(&p.d_last, 2 * p.last.size()));
    CK(cudaMalloc(&p.d_w, 4 * (size_t)D)); CK(cudaMalloc(&p.d_L, 4)); CK(cudaMalloc(&p.d_rl, 4 * (size_t)R));
    CK(cudaMalloc(&p.d_rw, 4 * (size_t)R)); CK(cudaMalloc(&p.d_dx, 4 * (size_t)R * D)); CK(cudaMalloc(&p.d_a, 4 * (size_t)N));
    CK(cudaMalloc(&p.d_c, 4 * (size_t)B)); CK(cudaMalloc(&p.d_t, 4 * (size_t)B)); CK(cudaMalloc(&p.d_valid, N));
    CK(cudaMalloc(&p.d_mask, T));
    CK(cudaMemcpy(p.d_x, p.x.data(), 2 * p.x.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_h, p.h.data(), 2 * p.h.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_last, p.last.data(), 2 * p.last.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_w, p.w.data(), 4 * (size_t)D, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_a, p.anchors.data(), 4 * (size_t)N, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_valid, p.valid.data(), N, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.d_mask, p.mask.data(), T, cudaMemcpyHostToDevice));
}

static void run(problem &p, lmhead_loss_ws *ws) {
    CKK(lmhead_loss_forward(ws, &p.c, p.d_x, p.d_h, p.d_h, p.d_w, p.d_last, p.d_a, p.d_valid, p.d_mask, p.d_L, p.d_rl,
                            p.d_rw, p.d_c, p.d_t, 0));
    CKK(lmhead_loss_backward(ws, &p.c, p.d_x, p.d_h, p.d_h, p.d_rw, p.d_dx, 0));
}

static void validate(int chunk) {
    problem p;
    make(p, 512, 8, 16, 256, 5000);
    int R = 8 * 16, D = 256;
    std::vector<float> x(p.x.size()), h(p.h.size()), last(p.last.size());
    for (size_t i = 0; i < x.size(); i++) x[i] = bf16_to_float(p.x[i]);
    for (size_t i = 0; i < h.size(); i++) h[i] = bf16_to_float(p.h[i]);
    for (size_t i = 0; i < last.size(); i++) last[i] = bf16_to_float(p.last[i]);
    float L32, Lbf;
    std::vector<float> rl(R), rw(R), rwb(R), dx((size_t)R * D), dxb((size_t)R * D), dxg((size_t)R * D);
    std::vector<int32_t> cc(16), tt(16);
    char err[256];
    lmhead_loss_forward_ref(&p.c, x.data(), h.data(), h.data(), p.w.data(), last.data(), p.anchors.data(), p.valid.data(),
                            p.mask.data(), 0, &L32, rl.data(), rw.data(), cc.data(), tt.data(), err, sizeof err);
    lmhead_loss_forward_ref(&p.c, x.data(), h.data(), h.data(), p.w.data(), last.data(), p.anchors.data(), p.valid.data(),
                            p.mask.data(), 1, &Lbf, rl.data(), rwb.data(), cc.data(), tt.data(), err, sizeof err);
    lmhead_loss_backward_ref(&p.c, x.data(), h.data(), h.data(), p.w.data(), last.data(), p.anchors.data(), p.valid.data(),
                             p.mask.data(), 0, rw.data(), dx.data(), err, sizeof err);
    lmhead_loss_backward_ref(&p.c, x.data(), h.data(), h.data(), p.w.data(), last.data(), p.anchors.data(), p.valid.data(),
                             p.mask.data(), 1, rwb.data(), dxb.data(), err, sizeof err);
    lmhead_loss_ws *ws;
    CKK(lmhead_loss_ws_init(&ws, &p.c, chunk));
    run(p, ws);
    CK(cudaDeviceSynchronize());
    float Lg;
    CK(cudaMemcpy(&Lg, p.d_L, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(dxg.data(), p.d_dx, 4 * dxg.size(), cudaMemcpyDeviceToHost));
    double ed = 0, bd = 0;
    for (size_t i = 0; i < dxg.size(); i++) { ed = std::max(ed, (double)fabsf(dxg[i] - dx[i])); bd = std::max(bd, (double)fabsf(dxb[i] - dx[i])); }
    double eL = fabs(Lg - L32), bL = fabs(Lbf - L32);
    printf("validate chunk=%d: loss %.6g err %.3g (bf16 ref %.3g), dxn err %.3g (bf16 ref %.3g): %s\n", chunk, L32, eL, bL, ed,
           bd, (eL <= 2 * bL + 1e-6 * fabs(L32) && ed <= 3 * bd + 1e-9) ? "OK" : "FAIL");
    if (!(eL <= 2 * bL + 1e-6 * fabs(L32) && ed <= 3 * bd + 1e-9)) g_failed = 1;
    lmhead_loss_ws_free(ws);
}

int main(void) {
    CKK(blas_init(0));
    validate(0);
    validate(1024);
    problem p;
    const int T = 8192, N = 512, B = 16, D = 4096, V = 32000, R = N * B;
    make(p, T, N, B, D, V);
    bf16 *z, *t, *dz;
    CK(cudaMalloc(&z, 2 * (size_t)R * V)); CK(cudaMalloc(&t, 2 * (size_t)R * V)); CK(cudaMalloc(&dz, 2 * (size_t)R * V));
    bf16 *dz0;   /* the pre-K2c baseline's all-zero dz */
    CK(cudaMalloc(&dz0, 2 * (size_t)R * V));
    CK(cudaMemset(dz0, 0, 2 * (size_t)R * V));
    /* dz of the size of a softmax gradient: coef·(Q - P) ~ 1e-4 / R per element at most, values ~1e-6 */
    fill_random<<<1024, 256>>>(dz, (size_t)R * V, 7, 1e-6f);
    CK(cudaGetLastError());
    void *flush;
    CK(cudaMalloc(&flush, 256 << 20));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    double gemm_tflop = 2.0 * R * (double)V * D / 1e12;
    double base = 0, base0 = 0;
    /* -1: GEMMs on the zero dz (history); 0: GEMMs alone; 1, 2, 3: the variants */
    for (int variant = -1; variant < 4; variant++) {
        lmhead_loss_ws *ws = NULL;
        if (variant > 0) CKK(lmhead_loss_ws_init(&ws, &p.c, variant == 1 ? V + 8 : variant == 2 ? 8192 : 0));
        std::vector<float> ms;
        for (int it = 0; it < 8; it++) {
            CK(cudaMemset(flush, it, 256 << 20));
            CK(cudaEventRecord(e0));
            if (variant <= 0) {   /* the three GEMMs alone */
                CKK(blas_matmul(z, BLAS_BF16, p.d_x, 0, p.d_h, 1, NULL, R, V, D, D, D, V, 1.f, 0.f, 0));
                CKK(blas_matmul(t, BLAS_BF16, p.d_x, 0, p.d_h, 1, NULL, R, V, D, D, D, V, 1.f, 0.f, 0));
                CKK(blas_matmul(p.d_dx, BLAS_F32, variant < 0 ? dz0 : dz, 0, p.d_h, 0, NULL, R, D, V, V, D, D, 1.f, 0.f, 0));
            } else {
                run(p, ws);
            }
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms1;
            CK(cudaEventElapsedTime(&ms1, e0, e1));
            if (it >= 2) ms.push_back(ms1);
        }
        std::sort(ms.begin(), ms.end());
        double med = ms[ms.size() / 2];
        if (variant < 0) base0 = med;
        if (variant == 0) base = med;
        char name[64];
        if (variant < 0) snprintf(name, sizeof name, "GEMMs alone, dz = 0");
        else if (variant == 0) snprintf(name, sizeof name, "GEMMs alone (3)");
        else snprintf(name, sizeof name, "variant %d (chunk %d)", variant, lmhead_loss_ws_chunk(ws));
        printf("%-26s R=%d D=%d V=%d: median %.3f ms  (%.1f TFLOP/s over 3 GEMMs)  ratio to GEMMs %.3f (target <= 1.25; "
               "%.3f to the dz = 0 GEMMs)\n", name, R, D, V, med, 3 * gemm_tflop / med * 1e3, variant < 0 ? med / base0 : med / (base ? base : med), med / base0);
        if (ws) lmhead_loss_ws_free(ws);
    }
    return g_failed ? 1 : 0;
}
