/*
 * bench/train_bench.c — the GPU trainer step (train/drafter.h drafter_step_gpu + train/optim_gpu.h) in the standard
 * configuration of design.md §10, with synthetic features (the target does not run): a Qwen3-8B-shaped drafter
 * (hidden 4096, 32 heads, 8 kv heads, head dim 128, MLP 12288, target vocabulary 151936, draft vocabulary 32000),
 * 5 layers (4 sliding 2048 + 1 full), block 16, 512 anchors, target layers [1, 9, 17, 25, 33] (k = 5), KL loss with
 * exp-decay weighting, Muon + AdamW, packed batches of 8192 tokens of log-normal documents (median 1200, sigma 0.6,
 * at least 64) with the first 30% of each document unsupervised.
 *
 *   build: make BUILD=build build/bench/train_bench      run: build/bench/train_bench [--steps 20] [--warmup 3]
 *
 * Reported: the memory plan (printed by drafter_gpu_init / optim_gpu_init) and the device memory in use after
 * start-up and at the end; the time from launch to the first completed optimizer step; tokens/s over --steps
 * optimizer steps (one micro-batch each); per-phase time of a step (drafter_gpu_timing: inputs, context, layer
 * GEMMs, layer elementwise, block attention forward / backward, loss) plus the optimizer and the batch copies
 * (host -> device from pinned memory, as a features ring read would be), and idle = wall − the sum; MFU against the
 * bf16 GEMM peak measured here (cuBLASLt 8192³, best of 5) and against the 989 TFLOP/s spec.
 * FLOPs counted (train_flops): every GEMM of the step, forward 2·M·N·K, backward 2× that (dx and dw) except fc
 * (dw only: its input is the features) and the LM head (draft logits forward, target logits forward, dz·lm_head
 * backward; no dw, the head is frozen); block attention 4·d_h·n_h per visible (query, key) pair forward and 2.5×
 * that backward, with the visible pairs counted exactly from the batch's anchors on the host. The Newton–Schulz
 * GEMMs of Muon are counted in the optimizer's FLOPs separately (not in MFU).
 * Exit status: 0, or 1 when a step fails or the loss is not finite (printed as FAIL). Not run on a GPU yet
 * (written 2026-12-01).
 */
#include "kernels/anchors.h"
#include "kernels/common.h"
#include "kernels/lmhead_loss.h"
#include "train/drafter.h"
#include "train/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

#include "kernels/blas.h"
#include "model/target.h"
#include "train/optim_gpu.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(x, ...) do { if (!(x)) { fprintf(stderr, "train_bench: FAIL: " __VA_ARGS__); fputc('\n', stderr); return 1; } } while (0)

struct hbatch {
    int32_t *ids, *pos, *doc;
    uint8_t *mask;
};

/* Documents of log-normal length packed into exactly T tokens; the first 30% of each unsupervised. */
static void make_batch(uint64_t *rng, int T, int V, struct hbatch *b) {
    int n = 0, d = 0;
    while (n < T) {
        double u1 = ((kernels_rng_next(rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        double u2 = ((kernels_rng_next(rng) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
        int len = (int)(1200 * exp(0.6 * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2)));
        if (len < 64) len = 64;
        if (len > T - n) len = T - n;
        int prompt = (int)(0.3 * len);
        for (int i = 0; i < len; i++, n++) {
            b->ids[n] = (int32_t)(kernels_rng_next(rng) % (uint64_t)V);
            b->pos[n] = i;
            b->doc[n] = d;
            b->mask[n] = i >= prompt;
        }
        d++;
    }
}

/* Visible (query, key) pairs of block attention for one layer type, from the anchors the step will draw (padding
 * anchors are anchor 0: an empty context, their own block only). */
static double visible_pairs(const struct hbatch *b, const int32_t *anchors, int N, int B, int window, int causal) {
    double pairs = 0;
    for (int k = 0; k < N; k++) {
        int a = anchors[k], d = b->doc[a], lo = window > 0 && a - window > 0 ? a - window : 0;
        double ctx = 0;
        for (int p = lo; p < a; p++) ctx += b->doc[p] == d;
        pairs += B * ctx + (causal ? B * (B + 1) / 2.0 : (double)B * B);
    }
    return pairs;
}

static double train_flops(const struct drafter_config *c, int T, double attn_pairs_total) {
    const double H = c->H, I = c->I, QD = c->n_h * c->d_h, KD = c->n_kv * c->d_h, R = (double)c->N * c->B;
    const double kH = (double)c->k * c->H, V = c->V_d;
    double fwd = 0, bwd = 0;
    fwd += 2 * T * H * kH;                      /* fc */
    bwd += 2 * T * H * kH;                      /* fc dw only */
    double layer = 2 * R * H * (QD + 2 * KD) + 2 * T * H * 2 * KD + 2 * R * QD * H + 2 * R * H * I * 3;
    fwd += c->L * layer;
    bwd += c->L * 2 * layer;
    fwd += 2 * (2 * R * H * V);                 /* draft and target logits */
    bwd += 2 * R * H * V;                       /* dz · lm_head */
    double attn = 4.0 * c->d_h * c->n_h * attn_pairs_total;
    return fwd + bwd + attn * (1 + 2.5);
}

/* Best-of-5 bf16 GEMM rate of cuBLASLt at 8192³ (TFLOP/s). */
static double gemm_peak(void) {
    const int n = 8192;
    bf16 *a, *b, *d;
    if (cudaMalloc((void **)&a, 2ull * n * n) || cudaMalloc((void **)&b, 2ull * n * n) || cudaMalloc((void **)&d, 2ull * n * n))
        return 0;
    target_fill_random_bf16(a, (size_t)n * n, 1, 0, 0.02f, 0);
    target_fill_random_bf16(b, (size_t)n * n, 2, 0, 0.02f, 0);
    double best = 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
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
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    return best;
}

static void fill_host(float *w, size_t n, uint64_t seed, float a) {
    uint64_t st = seed;
    for (size_t i = 0; i < n; i++) w[i] = a * (float)(((kernels_rng_next(&st) >> 40) * (1.0 / 16777216.0)) * 2 - 1);
}

int main(int argc, char **argv) {
    const double t_launch = now_s();
    int steps = 20, warmup = 3, q36 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            /* qwen3.6-27b (issue 27): the drafter of a Qwen3.6-27B target, SpecForge's published shape */
            const char *v = argv[++i];
            if (!strcmp(v, "qwen3.6-27b")) q36 = 1;
            else if (strcmp(v, "qwen3-8b")) { fprintf(stderr, "train_bench: --config qwen3-8b | qwen3.6-27b\n"); return 2; }
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--config qwen3-8b|qwen3.6-27b] [--steps 20] [--warmup 3]\n", argv[0]); return 2; }
    }
    if (steps < 1 || warmup < 0) { fprintf(stderr, "train_bench: need --steps >= 1 and --warmup >= 0\n"); return 2; }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("train_bench: no CUDA device, skipped\n"); return 0; }
    char err[1024];
    struct drafter_config c;
    drafter_config_defaults(&c);
    c.target.num_hidden_layers = 36;
    c.target.rope_theta = 1e6;
    c.target.head_dim = 128;
    c.H = 4096, c.n_h = 32, c.n_kv = 8, c.d_h = 128, c.I = 12288, c.eps = 1e-6f;
    c.V_t = 151936, c.V_d = 32000;
    c.k = 5;
    int ids[5] = {1, 9, 17, 25, 33};
    memcpy(c.layer_ids, ids, sizeof ids);
    c.mask_token_id = 151669;
    if (q36) {   /* 5 layers, hidden 5120, head dim 256, 24 / 4 heads, MLP 17408 (~1.83 B trainable) */
        c.target.num_hidden_layers = 64;
        c.target.rope_theta = 1e7;
        c.target.head_dim = 256;
        c.H = 5120, c.n_h = 24, c.n_kv = 4, c.d_h = 256, c.I = 17408;
        c.V_t = 248320;
        int ids36[5] = {1, 16, 31, 46, 61};
        memcpy(c.layer_ids, ids36, sizeof ids36);
        c.mask_token_id = 248077;
    }
    c.loss = LMHEAD_LOSS_KL;
    c.weighting = LMHEAD_WEIGHT_EXP_DECAY;
    const int T = c.T_max;   /* 8192 */
    struct drafter *d = drafter_init(&c, 1, err, sizeof err);
    CHECK(d, "drafter_init: %s", err);
    /* frozen tables: random (the bench never reads a target) */
    const char *frozen[] = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight"};
    for (int i = 0; i < 3; i++) {
        const struct drafter_param *p = drafter_param_find(d, frozen[i]);
        fill_host(p->w, (size_t)p->numel, 77 + (i == 2 ? 1 : (uint64_t)i), 0.02f);
    }
    {   /* the two heads must be equal (drafter.c keeps them so) */
        const struct drafter_param *lm = drafter_param_find(d, "lm_head.weight"), *vl = drafter_param_find(d, "verifier_lm_head.weight");
        memcpy(vl->w, lm->w, sizeof(float) * (size_t)lm->numel);
        const struct drafter_param *vn = drafter_param_find(d, "verifier_norm.weight");
        for (int64_t e = 0; e < vn->numel; e++) vn->w[e] = 1.0f;
    }
    size_t f0, tot;
    cudaMemGetInfo(&f0, &tot);
    struct drafter_gpu *g = drafter_gpu_init(d, 0, stdout, err, sizeof err);
    CHECK(g, "drafter_gpu_init: %s", err);
    int n = drafter_n_params(d);
    struct optim_tensor *tens = calloc((size_t)n, sizeof *tens);
    for (int i = 0; i < n; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        tens[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable, p->is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    struct optim o;
    CHECK(optim_init(&o, tens, n, &oc, err, sizeof err) == 0, "optim_init: %s", err);
    struct optim_gpu *og = optim_gpu_init(&o, g, stdout, err, sizeof err);
    CHECK(og, "optim_gpu_init: %s", err);
    CHECK(drafter_gpu_warmup(g, T, err, sizeof err) == 0, "warmup: %s", err);
    cudaDeviceSynchronize();
    size_t f1;
    cudaMemGetInfo(&f1, &tot);
    printf("device memory in use after start-up: %.2f GiB of %.2f GiB (planned %.2f GiB drafter + %.2f GiB optimizer)\n",
           (tot - f1) / 1073741824.0, tot / 1073741824.0, drafter_gpu_planned_bytes(g) / 1073741824.0,
           optim_gpu_planned_bytes(og) / 1073741824.0);

    /* synthetic features on the device, a pinned host copy of one batch's features for the copy phase */
    const struct drafter_gpu_inputs *in = drafter_gpu_inputs(g);
    const size_t kH = (size_t)c.k * c.H, feat = (size_t)T * kH * 2, lastb = (size_t)T * c.H * 2;
    CHECK(target_fill_random_bf16(in->hidden, (size_t)T * kH, 5, 0, 1.0f, 0) == 0, "fill: %s", kernels_error());
    CHECK(target_fill_random_bf16(in->last, (size_t)T * c.H, 6, 0, 1.0f, 0) == 0, "fill: %s", kernels_error());
    void *h_feat = NULL;
    CHECK(cudaMallocHost(&h_feat, feat + lastb) == cudaSuccess, "cudaMallocHost of %zu bytes", feat + lastb);
    CHECK(cudaMemcpy(h_feat, in->hidden, feat, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    CHECK(cudaMemcpy((char *)h_feat + feat, in->last, lastb, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    struct hbatch hb;
    hb.ids = malloc(4 * (size_t)T), hb.pos = malloc(4 * (size_t)T), hb.doc = malloc(4 * (size_t)T), hb.mask = malloc((size_t)T);
    int32_t *anchors = malloc(4 * (size_t)c.N);
    uint8_t *valid = malloc((size_t)c.N);
    uint64_t rng = 42;
    cudaEvent_t ec0, ec1, eo0, eo1;
    cudaEventCreate(&ec0), cudaEventCreate(&ec1), cudaEventCreate(&eo0), cudaEventCreate(&eo1);
    CHECK(drafter_gpu_timing(g, 1, err, sizeof err) == 0, "%s", err);
    double ph[DRAFTER_GPU_PH_N] = {0}, copy_ms = 0, opt_ms = 0, wall = 0, flops = 0, t_first = -1, tok = 0;
    int bad = 0;
    for (int s = 0; s < warmup + steps; s++) {
        make_batch(&rng, T, c.V_t, &hb);
        int K = anchors_forward_ref(hb.mask, T, c.B, c.N, 9, (uint64_t)s, anchors, valid, err, sizeof err);
        CHECK(K >= 0, "anchors: %s", err);
        double pairs = 0;
        for (int l = 0; l < c.L; l++) {
            int sl = c.layer_type[l] == DRAFTER_LAYER_SLIDING;
            pairs += visible_pairs(&hb, anchors, c.N, c.B, sl ? c.sliding_window : 0, sl && !c.sliding_window_non_causal);
        }
        const double t0 = now_s();
        cudaEventRecord(ec0, 0);
        cudaMemcpyAsync(in->input_ids, hb.ids, 4 * (size_t)T, cudaMemcpyHostToDevice, 0);
        cudaMemcpyAsync(in->position_ids, hb.pos, 4 * (size_t)T, cudaMemcpyHostToDevice, 0);
        cudaMemcpyAsync(in->doc_ids, hb.doc, 4 * (size_t)T, cudaMemcpyHostToDevice, 0);
        cudaMemcpyAsync(in->loss_mask, hb.mask, (size_t)T, cudaMemcpyHostToDevice, 0);
        cudaMemcpyAsync(in->hidden, h_feat, feat, cudaMemcpyHostToDevice, 0);
        cudaMemcpyAsync(in->last, (char *)h_feat + feat, lastb, cudaMemcpyHostToDevice, 0);
        cudaEventRecord(ec1, 0);
        CHECK(drafter_gpu_zero_grad(g, err, sizeof err) == 0, "%s", err);
        CHECK(drafter_step_gpu(g, T, T, 9, (uint64_t)s, 1, NULL, err, sizeof err) == 0, "step %d: %s", s, err);
        CHECK(optim_gpu_grad_norm_start(og, 1.0f, err, sizeof err) == 0, "%s", err);
        double norm;
        CHECK(optim_gpu_grad_norm_wait(og, &norm, err, sizeof err) == 0, "%s", err);
        struct drafter_metrics m;
        CHECK(drafter_gpu_metrics(g, &m, err, sizeof err) == 0, "%s", err);
        if (!isfinite(m.loss_sum) || !isfinite(norm)) {
            fprintf(stderr, "train_bench: FAIL: step %d: loss %g, grad norm %g\n", s, m.loss_sum, norm);
            bad = 1;
        }
        cudaEventRecord(eo0, 0);
        CHECK(optim_gpu_step(og, 1.0, 1.0, err, sizeof err) == 0, "%s", err);
        cudaEventRecord(eo1, 0);
        cudaEventSynchronize(eo1);
        const double t1 = now_s();
        if (t_first < 0) t_first = t1 - t_launch;
        if (s == 0 || s == warmup + steps - 1)
            printf("step %d: loss %.4f, grad norm %.4f, anchors %d, %.1f ms\n", s, m.loss_sum, norm, m.n_anchors,
                   (t1 - t0) * 1e3);
        if (s < warmup) {
            double junk[DRAFTER_GPU_PH_N] = {0};
            drafter_gpu_phase_times(g, junk, err, sizeof err);
            continue;
        }
        CHECK(drafter_gpu_phase_times(g, ph, err, sizeof err) == 0, "%s", err);
        float ms;
        cudaEventElapsedTime(&ms, ec0, ec1);
        copy_ms += ms;
        cudaEventElapsedTime(&ms, eo0, eo1);
        opt_ms += ms;
        wall += t1 - t0;
        flops += train_flops(&c, T, pairs);
        tok += T;
    }
    double peak = gemm_peak();
    printf("time from launch to the first optimizer step: %.2f s\n", t_first);
    printf("trainer: %.0f tokens/s over %d steps (%.1f ms/step), %.1f TFLOP/s model FLOPs\n", tok / wall, steps,
           wall / steps * 1e3, flops / wall / 1e12);
    printf("MFU: %.1f%% of the measured bf16 GEMM peak (%.0f TFLOP/s), %.1f%% of the 989 TFLOP/s spec\n",
           peak > 0 ? 100 * flops / wall / 1e12 / peak : 0.0, peak, 100 * flops / wall / 1e12 / 989.0);
    double sum = copy_ms + opt_ms;
    printf("per step (ms):\n");
    for (int i = 0; i < DRAFTER_GPU_PH_N; i++) {
        printf("  %-34s %9.2f\n", drafter_gpu_phase_name(i), ph[i] / steps);
        sum += ph[i];
    }
    printf("  %-34s %9.2f\n", "optimizer (Muon + AdamW)", opt_ms / steps);
    printf("  %-34s %9.2f\n", "batch copies (host -> device)", copy_ms / steps);
    printf("  %-34s %9.2f\n", "idle (wall - the above)", (wall * 1e3 - sum) / steps);
    size_t f2;
    cudaMemGetInfo(&f2, &tot);
    printf("device memory in use at the end: %.2f GiB (after start-up %.2f GiB)%s\n", (tot - f2) / 1073741824.0,
           (tot - f1) / 1073741824.0, f2 == f1 ? "" : "  (changed: a step allocated)");
    (void)f0;
    optim_gpu_free(og);
    drafter_gpu_free(g);
    optim_free(&o);
    drafter_free(d);
    return bad;
}
#else
int main(void) {
    printf("train_bench: built without CUDA, skipped\n");
    return 0;
}
#endif
