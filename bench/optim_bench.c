/*
 * bench/optim_bench.c — the GPU optimizers alone (train/optim_gpu.h) on the standard configuration's parameter table
 * (design.md §10: hidden 4096, 32 / 8 heads of 128, MLP 12288, 5 layers, fc 4096 x 20480; 36 Muon matrices and 22
 * norm vectors, 1.05B trainable parameters), synthetic fp32 weights and gradients, no drafter (optim_gpu_init_table).
 *
 *   build: make build/bench/optim_bench      run: build/bench/optim_bench [--steps 10] [--warmup 2]
 *
 * Variants (each a full optimizer step: the gradient norm, then optim_gpu_step with the clip active):
 *   1. Muon + AdamW, Muon by shape batches (strided-batched Newton–Schulz GEMMs; the default since issue 28)
 *   2. Muon + AdamW, Muon one matrix at a time (the path before issue 28)
 *   3. AdamW for every tensor (the multi-tensor launch)
 * Validation first: one step of variant 1 and one of variant 2 from identical states; the weights of the first matrix
 * of every shape batch must agree within the bf16 Newton–Schulz noise (max |Δw| <= 10% of max |update|: the two paths
 * differ by the GEMMs' accumulation order, a few bf16 ulp of the direction); printed as FAIL otherwise (exit 1).
 * tests/gpu/test_optim_gpu.c is the correctness test (style.md's rule against the CPU reference).
 * Reported: ms per step (CUDA events, median of --steps), the Newton–Schulz FLOPs (5 x (4 m² n + 2 m³) per matrix,
 * m = min(rows, cols), n = max) and achieved TFLOP/s against the bf16 GEMM peak measured here (cuBLASLt 8192³, best
 * of 5); AdamW's GB/s at 30 bytes per parameter (read w, g, m, v; write w, m, v and the bf16 copy) against the
 * device copy ceiling measured here (cudaMemcpy device to device, 1 GiB, read + write).
 */
#include "kernels/common.h"
#include "train/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/blas.h"
#include "train/optim_gpu.h"

#define CHECK(x, ...) do { if (!(x)) { fprintf(stderr, "optim_bench: FAIL: " __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)
#define NMAX 64

struct table {
    int n;
    char name[NMAX][64];
    int ndim[NMAX];
    int64_t shape[NMAX][2], numel[NMAX];
    int is_matrix[NMAX];
};

static void add(struct table *t, const char *name, int64_t r, int64_t c) {
    int i = t->n++;
    snprintf(t->name[i], sizeof t->name[i], "%s", name);
    t->ndim[i] = c ? 2 : 1;
    t->shape[i][0] = r;
    t->shape[i][1] = c;
    t->numel[i] = c ? r * c : r;
    t->is_matrix[i] = c != 0;
}

static void standard_table(struct table *t) {
    memset(t, 0, sizeof *t);
    const int64_t H = 4096, I = 12288, QD = 32 * 128, KD = 8 * 128, dh = 128;
    add(t, "fc.weight", H, 5 * H);
    add(t, "hidden_norm.weight", H, 0);
    for (int l = 0; l < 5; l++) {
        char nm[64];
#define L(s, r, c) (snprintf(nm, sizeof nm, "layers.%d.%s", l, s), add(t, nm, r, c))
        L("input_layernorm.weight", H, 0);
        L("self_attn.q_proj.weight", QD, H);
        L("self_attn.k_proj.weight", KD, H);
        L("self_attn.v_proj.weight", KD, H);
        L("self_attn.o_proj.weight", H, QD);
        L("self_attn.q_norm.weight", dh, 0);
        L("self_attn.k_norm.weight", dh, 0);
        L("post_attention_layernorm.weight", H, 0);
        L("mlp.gate_proj.weight", I, H);
        L("mlp.up_proj.weight", I, H);
        L("mlp.down_proj.weight", H, I);
#undef L
    }
    add(t, "norm.weight", H, 0);
}

/* Device tensors of the table: w, g fp32 (tiled from a pinned random block), bf16 copy. */
struct dev {
    struct optim_gpu_tensor t[NMAX];
};

static void dev_init(struct dev *d, const struct table *t, const float *blk, size_t blk_n) {
    for (int i = 0; i < t->n; i++) {
        size_t n = (size_t)t->numel[i];
        CHECK(cudaMalloc((void **)&d->t[i].w, 4 * n) == cudaSuccess, "cudaMalloc");
        CHECK(cudaMalloc((void **)&d->t[i].g, 4 * n) == cudaSuccess, "cudaMalloc");
        CHECK(cudaMalloc((void **)&d->t[i].copy, 2 * n) == cudaSuccess, "cudaMalloc");
        for (size_t at = 0; at < n; at += blk_n) {
            size_t k = n - at < blk_n ? n - at : blk_n;
            CHECK(cudaMemcpy(d->t[i].w + at, blk, 4 * k, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
            CHECK(cudaMemcpy(d->t[i].g + at, blk + (blk_n - k), 4 * k, cudaMemcpyHostToDevice) == cudaSuccess, "upload");
        }
    }
}

static void dev_free(struct dev *d, int n) {
    for (int i = 0; i < n; i++) cudaFree(d->t[i].w), cudaFree(d->t[i].g), cudaFree(d->t[i].copy);
}

/* The host optimizer over the table (host w/g are never touched by the GPU optimizer: one dummy pointer). */
static float dummy_host[1];
static void host_optim(struct optim *o, struct optim_tensor *ot, const struct table *t, enum optim_kind kind) {
    char err[512];
    for (int i = 0; i < t->n; i++)
        ot[i] = (struct optim_tensor){t->name[i], t->ndim[i], {t->shape[i][0], t->shape[i][1]}, dummy_host, dummy_host, 1,
                                      t->is_matrix[i]};
    struct optim_config oc;
    optim_config_default(&oc);
    oc.kind = kind;
    CHECK(optim_init(o, ot, t->n, &oc, err, sizeof err) == 0, "optim_init: %s", err);
}

static double gemm_peak(void) {
    const int n = 8192;
    bf16 *a, *b, *d;
    if (cudaMalloc((void **)&a, 2ull * n * n) || cudaMalloc((void **)&b, 2ull * n * n) || cudaMalloc((void **)&d, 2ull * n * n))
        return 0;
    cudaMemset(a, 0x3c, 2ull * n * n);   /* bf16 0x3c3c ~ 0.0115: non-zero operands */
    cudaMemset(b, 0x3c, 2ull * n * n);
    double best = 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    for (int it = 0; it < 6; it++) {
        cudaEventRecord(e0, 0);
        if (blas_matmul(d, BLAS_BF16, a, 0, b, 1, NULL, n, n, n, 0, 0, 0, 1.0f, 0.0f, 0)) break;
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        double tf = 2.0 * n * n * (double)n / (ms * 1e-3) / 1e12;
        if (it > 0 && tf > best) best = tf;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b), cudaFree(d);
    return best;
}

static double copy_ceiling(void) {
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    if (cudaMalloc(&a, bytes) || cudaMalloc(&b, bytes)) return 0;
    cudaMemset(a, 1, bytes);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double best = 0;
    for (int it = 0; it < 6; it++) {
        cudaEventRecord(e0, 0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        double gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
        if (it > 0 && gbs > best) best = gbs;
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    return best;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median ms of `steps` full optimizer steps after `warmup`. */
static double time_steps(struct optim_gpu *og, int warmup, int steps) {
    char err[512];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    double *ms = calloc((size_t)steps, sizeof *ms);
    for (int s = 0; s < warmup + steps; s++) {
        double norm;
        cudaEventRecord(e0, 0);
        CHECK(optim_gpu_grad_norm_start(og, 1.0f, err, sizeof err) == 0, "%s", err);
        CHECK(optim_gpu_grad_norm_wait(og, &norm, err, sizeof err) == 0, "%s", err);
        CHECK(isfinite(norm), "grad norm %g", norm);
        CHECK(optim_gpu_step(og, 1.0, norm / 2, err, sizeof err) == 0, "%s", err);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (s >= warmup) ms[s - warmup] = t;
    }
    qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
    double med = ms[steps / 2];
    free(ms);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return med;
}

int main(int argc, char **argv) {
    int steps = 10, warmup = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: optim_bench [--steps N] [--warmup N]\n");
            return 2;
        }
    }
    if (steps < 1) steps = 1;
    char err[512];
    struct table t;
    standard_table(&t);
    int64_t params = 0;
    for (int i = 0; i < t.n; i++) params += t.numel[i];
    const size_t blk_n = (size_t)1 << 24;
    float *blk;
    CHECK(cudaMallocHost((void **)&blk, 4 * blk_n) == cudaSuccess, "cudaMallocHost");
    uint64_t rng = 1234;
    for (size_t i = 0; i < blk_n; i++) blk[i] = (float)(((kernels_rng_next(&rng) >> 40) * 0x1.0p-24 - 0.5) * 0.04);
    const double peak = gemm_peak(), copy = copy_ceiling();
    printf("ceilings measured here: bf16 GEMM 8192^3 %.0f TFLOP/s, device copy %.0f GB/s (read + write)\n", peak, copy);

    /* variants 1 and 2: two identical tables, one optimizer each */
    struct dev d1, d2;
    dev_init(&d1, &t, blk, blk_n);
    dev_init(&d2, &t, blk, blk_n);
    struct optim h1, h2, h3;
    struct optim_tensor ot1[NMAX], ot2[NMAX], ot3[NMAX];
    host_optim(&h1, ot1, &t, OPTIM_MUON_ADAMW);
    host_optim(&h2, ot2, &t, OPTIM_MUON_ADAMW);
    struct optim_gpu *ob = optim_gpu_init_table(&h1, d1.t, 0, stdout, err, sizeof err);
    CHECK(ob, "optim_gpu_init_table: %s", err);
    struct optim_gpu *om = optim_gpu_init_table(&h2, d2.t, 0, NULL, err, sizeof err);
    CHECK(om, "optim_gpu_init_table: %s", err);
    optim_gpu_set_muon_batched(om, 0);
    printf("table: %d tensors, %.3fB parameters, %d Muon matrices in %d shape batches\n", t.n, params / 1e9, h1.n_muon,
           optim_gpu_muon_batches(ob));

    /* validation: one step each from identical states */
    int bad = 0;
    {
        double n1, n2;
        CHECK(optim_gpu_grad_norm_start(ob, 1.0f, err, sizeof err) == 0 && optim_gpu_grad_norm_wait(ob, &n1, err, sizeof err) == 0 &&
              optim_gpu_step(ob, 1.0, n1 / 2, err, sizeof err) == 0, "%s", err);
        CHECK(optim_gpu_grad_norm_start(om, 1.0f, err, sizeof err) == 0 && optim_gpu_grad_norm_wait(om, &n2, err, sizeof err) == 0 &&
              optim_gpu_step(om, 1.0, n2 / 2, err, sizeof err) == 0, "%s", err);
        CHECK(cudaDeviceSynchronize() == cudaSuccess, "sync");
        CHECK(n1 == n2, "the two norms differ: %.17g vs %.17g", n1, n2);
        int64_t seen[8][2];
        int ns = 0;
        for (int i = 0; i < t.n && !bad; i++) {
            if (!t.is_matrix[i]) continue;
            int dup = 0;
            for (int k = 0; k < ns; k++) dup |= seen[k][0] == t.shape[i][0] && seen[k][1] == t.shape[i][1];
            if (dup || ns == 8) continue;
            seen[ns][0] = t.shape[i][0], seen[ns][1] = t.shape[i][1], ns++;
            size_t n = (size_t)t.numel[i];
            float *a = malloc(4 * n), *b = malloc(4 * n);
            CHECK(a && b, "out of memory");
            CHECK(cudaMemcpy(a, d1.t[i].w, 4 * n, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
            CHECK(cudaMemcpy(b, d2.t[i].w, 4 * n, cudaMemcpyDeviceToHost) == cudaSuccess, "download");
            /* the update = w_after - w_before (w_before = the tiled block) */
            double dmax = 0, umax = 0;
            for (size_t e = 0; e < n; e++) {
                double w0 = blk[e % blk_n], du = fabs((double)a[e] - w0), dd = fabs((double)a[e] - b[e]);
                if (!isfinite(a[e]) || !isfinite(b[e])) dd = INFINITY;
                if (du > umax) umax = du;
                if (dd > dmax) dmax = dd;
            }
            int ok = dmax <= 0.10 * umax && umax > 0;
            printf("check %-32s (%lld x %lld): batched vs per-matrix max |dw| %.3e, max |update| %.3e (%.2f%%)%s\n",
                   t.name[i], (long long)t.shape[i][0], (long long)t.shape[i][1], dmax, umax,
                   umax > 0 ? 100 * dmax / umax : 0.0, ok ? "" : "  FAIL");
            bad |= !ok;
            free(a), free(b);
        }
    }
    const double flops = optim_gpu_muon_flops(ob);
    double tb = time_steps(ob, warmup, steps), tm = time_steps(om, warmup, steps);
    optim_gpu_set_ns_symmetric(ob, 1);   /* the same optimizer, the symmetric block products (issue 28 item 1) */
    double tsym = time_steps(ob, warmup, steps);
    optim_gpu_set_ns_symmetric(ob, 0);
    printf("Newton-Schulz FLOPs per step: %.2f TFLOP\n", flops / 1e12);
    printf("%-44s %8.2f ms/step  NS %6.1f TFLOP/s (%4.1f%% of the GEMM peak)\n", "Muon + AdamW, Muon batched by shape", tb,
           flops / (tb * 1e-3) / 1e12, peak > 0 ? 100 * flops / (tb * 1e-3) / 1e12 / peak : 0.0);
    printf("%-44s %8.2f ms/step  NS %6.1f TFLOP/s nominal (full-product FLOPs over the time)\n",
           "Muon + AdamW, batched, symmetric A and B", tsym, flops / (tsym * 1e-3) / 1e12);
    printf("%-44s %8.2f ms/step  NS %6.1f TFLOP/s (%4.1f%% of the GEMM peak)\n", "Muon + AdamW, Muon per matrix", tm,
           flops / (tm * 1e-3) / 1e12, peak > 0 ? 100 * flops / (tm * 1e-3) / 1e12 / peak : 0.0);
    optim_gpu_free(om);
    optim_free(&h2);
    dev_free(&d2, t.n);

    /* variant 3: AdamW for all, on d1's tensors */
    host_optim(&h3, ot3, &t, OPTIM_ADAMW);
    struct optim_gpu *oa = optim_gpu_init_table(&h3, d1.t, 0, stdout, err, sizeof err);
    CHECK(oa, "optim_gpu_init_table: %s", err);
    double ta = time_steps(oa, warmup, steps);
    const double bytes = 30.0 * (double)params;
    printf("%-44s %8.2f ms/step  %6.0f GB/s at 30 B/param (%4.1f%% of the copy ceiling; floor %.2f ms)\n",
           "AdamW for every tensor (one launch)", ta, bytes / (ta * 1e-3) / 1e9,
           copy > 0 ? 100 * bytes / (ta * 1e-3) / 1e9 / copy : 0.0, copy > 0 ? bytes / (copy * 1e9) * 1e3 : 0.0);
    printf("optim_bench: %s\n", bad ? "FAIL (validation above)" : "ok");
    optim_gpu_free(oa);
    optim_gpu_free(ob);
    optim_free(&h3);
    optim_free(&h1);
    dev_free(&d1, t.n);
    cudaFreeHost(blk);
    return bad;
}
#else
int main(void) {
    printf("optim_bench: built without CUDA, skipped\n");
    return 0;
}
#endif
