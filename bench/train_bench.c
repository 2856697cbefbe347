/*
 * bench/train_bench.c — the GPU trainer step (train/drafter.h drafter_step_gpu + train/optim_gpu.h) in the standard
 * configuration of design.md §10, with synthetic features (the target does not run): a Qwen3-8B-shaped drafter
 * (hidden 4096, 32 heads, 8 kv heads, head dim 128, MLP 12288, target vocabulary 151936, draft vocabulary 32000),
 * 5 layers (4 sliding 2048 + 1 full), block 16, 512 anchors, target layers [1, 9, 17, 25, 33] (k = 5), KL loss with
 * exp-decay weighting, Muon + AdamW, packed batches of 8192 tokens of log-normal documents (median 1200, sigma 0.6,
 * at least 64) with the first 30% of each document unsupervised.
 *
 *   build: make BUILD=build build/bench/train_bench
 *   run:   build/bench/train_bench [--steps 20] [--warmup 3] [--variants muon,adamw,muon-ga4]
 *
 * Variants (issue 28 item 6): one drafter, then each listed optimizer x accumulation variant in turn with its own
 * optimizer state (freed before the next): muon (Muon + AdamW, the default), adamw (AdamW for every tensor), and
 * either with -gaA: A micro-batches of 8192 tokens per optimizer step (--grad-accum A). Each variant prints a
 * section opened by "=== variant NAME: ..." with the lines below; --steps and --warmup count optimizer steps.
 *
 * Reported: the memory plan (printed by drafter_gpu_init / optim_gpu_init) and the device memory in use after
 * start-up and at the end; the time from launch to the first completed optimizer step (the first variant's); tokens/s
 * over --steps optimizer steps (A micro-batches each); per-phase time of a step (drafter_gpu_timing: inputs, context, layer
 * GEMMs, layer elementwise, block attention forward / backward, loss) plus the optimizer and the batch copies
 * (host -> device from pinned memory, as a features ring read would be), and idle = wall − the sum; MFU against the
 * bf16 GEMM peak measured here (cuBLASLt 8192³, best of 5) and against the 989 TFLOP/s spec.
 * FLOPs counted (train_flops): every GEMM of the step, forward 2·M·N·K, backward 2× that (dx and dw) except fc
 * (dw only: its input is the features) and the LM head (draft logits forward, target logits forward, dz·lm_head
 * backward; no dw, the head is frozen); block attention 4·d_h·n_h per visible (query, key) pair forward and 2.5×
 * that backward, with the visible pairs counted exactly from the batch's anchors on the host. The Newton–Schulz
 * GEMMs of Muon are counted in the optimizer's FLOPs separately (not in MFU): printed with the optimizer's achieved
 * TFLOP/s (Newton–Schulz FLOPs / the whole optimizer step's time).
 * Exit status: 0, or 1 when a step fails or the loss is not finite (printed as FAIL). Not run on a GPU yet
 * (written 2026-12-01).
 */
#include "kernels/anchors.h"
#include "kernels/common.h"
#include "kernels/lmhead_loss.h"
#include "train/drafter.h"
#include "train/optim.h"

#include <math.h>
#include <pthread.h>
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

/* U(-a, a) from the splitmix64 stream of seed; element i is draw i + 1, so threads over ranges give the same values
 * (the frozen tables are 1.9G values: single-threaded this dominated the bench's start-up). */
struct fill_job {
    float *w;
    size_t i0, i1;
    uint64_t seed;
    float a;
};

static void *fill_range(void *arg) {
    const struct fill_job *j = arg;
    uint64_t st = j->seed + (uint64_t)j->i0 * KERNELS_RNG_GAMMA;
    for (size_t i = j->i0; i < j->i1; i++)
        j->w[i] = j->a * (float)(((kernels_rng_next(&st) >> 40) * (1.0 / 16777216.0)) * 2 - 1);
    return NULL;
}

static void fill_host(float *w, size_t n, uint64_t seed, float a) {
    enum { NT = 16 };
    struct fill_job jobs[NT];
    pthread_t th[NT];
    int started[NT] = {0};
    for (int t = 0; t < NT; t++) {
        jobs[t] = (struct fill_job){w, n * t / NT, n * (t + 1) / NT, seed, a};
        started[t] = t > 0 && pthread_create(&th[t], NULL, fill_range, &jobs[t]) == 0;
    }
    for (int t = 0; t < NT; t++)
        if (!started[t]) fill_range(&jobs[t]);
    for (int t = 1; t < NT; t++)
        if (started[t]) pthread_join(th[t], NULL);
}

/* One optimizer x accumulation variant of the benchmark: "muon", "adamw", or either with "-gaA" (A micro-batches of
 * T tokens per optimizer step). */
struct variant {
    char name[32];
    enum optim_kind kind;
    int accum;
};

static int parse_variants(const char *list, struct variant *v, int cap) {
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == cap) return -1;
        struct variant *x = &v[n];
        snprintf(x->name, sizeof x->name, "%s", tok);
        x->accum = 1;
        char *ga = strstr(tok, "-ga");
        if (ga) {
            x->accum = atoi(ga + 3);
            *ga = 0;
            if (x->accum < 1 || x->accum > 64) return -1;
        }
        if (!strcmp(tok, "muon")) x->kind = OPTIM_MUON_ADAMW;
        else if (!strcmp(tok, "adamw")) x->kind = OPTIM_ADAMW;
        else return -1;
        n++;
    }
    return n;
}

struct bench_ctx {
    struct drafter_config c;
    struct drafter *d;
    struct drafter_gpu *g;
    int T;
    void *h_feat;
    size_t feat, lastb;
    double t_launch, peak;
    int first_done;
};

/* Runs one variant: its own optimizer (state freed at the end), warmup + steps optimizer steps; prints its section. */
static int run_variant(struct bench_ctx *x, const struct variant *v, int steps, int warmup) {
    char err[1024];
    const struct drafter_config *cp = &x->c;
    const int T = x->T, A = v->accum;
    struct drafter *d = x->d;
    struct drafter_gpu *g = x->g;
    printf("=== variant %s: %s, %d micro-batch%s of %d tokens per optimizer step\n", v->name,
           v->kind == OPTIM_ADAMW ? "AdamW for every tensor" : "Muon for the matrices + AdamW for the rest", A,
           A == 1 ? "" : "es", T);
    int n = drafter_n_params(d);
    struct optim_tensor *tens = calloc((size_t)n, sizeof *tens);
    for (int i = 0; i < n; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        tens[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable, p->is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    oc.kind = v->kind;
    struct optim o;
    CHECK(optim_init(&o, tens, n, &oc, err, sizeof err) == 0, "optim_init: %s", err);
    struct optim_gpu *og = optim_gpu_init(&o, g, stdout, err, sizeof err);
    CHECK(og, "optim_gpu_init: %s", err);
    cudaDeviceSynchronize();
    size_t f1, tot;
    cudaMemGetInfo(&f1, &tot);
    printf("device memory in use after start-up: %.2f GiB of %.2f GiB (planned %.2f GiB drafter + %.2f GiB optimizer)\n",
           (tot - f1) / 1073741824.0, tot / 1073741824.0, drafter_gpu_planned_bytes(g) / 1073741824.0,
           optim_gpu_planned_bytes(og) / 1073741824.0);
    const struct drafter_gpu_inputs *in = drafter_gpu_inputs(g);
    struct hbatch hb;
    hb.ids = malloc(4 * (size_t)T), hb.pos = malloc(4 * (size_t)T), hb.doc = malloc(4 * (size_t)T), hb.mask = malloc((size_t)T);
    int32_t *anchors = malloc(4 * (size_t)cp->N);
    uint8_t *valid = malloc((size_t)cp->N);
    uint64_t rng = 42;
    cudaEvent_t ec0, ec1, eo0, eo1;
    cudaEventCreate(&ec0), cudaEventCreate(&ec1), cudaEventCreate(&eo0), cudaEventCreate(&eo1);
    CHECK(drafter_gpu_timing(g, 1, err, sizeof err) == 0, "%s", err);
    double ph[DRAFTER_GPU_PH_N] = {0}, copy_ms = 0, opt_ms = 0, wall = 0, flops = 0, tok = 0;
    int bad = 0;
    uint64_t micro = 0;
    for (int s = 0; s < warmup + steps; s++) {
        const double t0 = now_s();
        double pairs_step = 0, junk[DRAFTER_GPU_PH_N] = {0};
        CHECK(drafter_gpu_zero_grad(g, err, sizeof err) == 0, "%s", err);
        for (int a = 0; a < A; a++, micro++) {
            make_batch(&rng, T, cp->V_t, &hb);
            int K = anchors_forward_ref(hb.mask, T, cp->B, cp->N, 9, micro, anchors, valid, err, sizeof err);
            CHECK(K >= 0, "anchors: %s", err);
            for (int l = 0; l < cp->L; l++) {
                int sl = cp->layer_type[l] == DRAFTER_LAYER_SLIDING;
                pairs_step += visible_pairs(&hb, anchors, cp->N, cp->B, sl ? cp->sliding_window : 0,
                                            sl && !cp->sliding_window_non_causal);
            }
            cudaEventRecord(ec0, 0);
            cudaMemcpyAsync(in->input_ids, hb.ids, 4 * (size_t)T, cudaMemcpyHostToDevice, 0);
            cudaMemcpyAsync(in->position_ids, hb.pos, 4 * (size_t)T, cudaMemcpyHostToDevice, 0);
            cudaMemcpyAsync(in->doc_ids, hb.doc, 4 * (size_t)T, cudaMemcpyHostToDevice, 0);
            cudaMemcpyAsync(in->loss_mask, hb.mask, (size_t)T, cudaMemcpyHostToDevice, 0);
            cudaMemcpyAsync(in->hidden, x->h_feat, x->feat, cudaMemcpyHostToDevice, 0);
            cudaMemcpyAsync(in->last, (char *)x->h_feat + x->feat, x->lastb, cudaMemcpyHostToDevice, 0);
            cudaEventRecord(ec1, 0);
            CHECK(drafter_step_gpu(g, T, T, 9, micro, 1, NULL, err, sizeof err) == 0, "step %d: %s", s, err);
            /* the phase events of this micro-batch (waits for it) */
            CHECK(drafter_gpu_phase_times(g, s < warmup ? junk : ph, err, sizeof err) == 0, "%s", err);
            float ms;
            cudaEventElapsedTime(&ms, ec0, ec1);
            if (s >= warmup) copy_ms += ms;
        }
        CHECK(optim_gpu_grad_norm_start(og, 1.0f / (float)A, err, sizeof err) == 0, "%s", err);
        double norm;
        CHECK(optim_gpu_grad_norm_wait(og, &norm, err, sizeof err) == 0, "%s", err);
        struct drafter_metrics m;
        CHECK(drafter_gpu_metrics(g, &m, err, sizeof err) == 0, "%s", err);
        if (!isfinite(m.loss_sum) || !isfinite(norm)) {
            fprintf(stderr, "train_bench: FAIL: %s step %d: loss %g, grad norm %g\n", v->name, s, m.loss_sum, norm);
            bad = 1;
        }
        cudaEventRecord(eo0, 0);
        CHECK(optim_gpu_step(og, 1.0, 1.0, err, sizeof err) == 0, "%s", err);
        cudaEventRecord(eo1, 0);
        cudaEventSynchronize(eo1);
        const double t1 = now_s();
        if (!x->first_done) {
            x->first_done = 1;
            printf("time from launch to the first optimizer step: %.2f s\n", t1 - x->t_launch);
        }
        if (s == 0 || s == warmup + steps - 1)
            printf("step %d: loss %.4f, grad norm %.4f, anchors %d, %.1f ms\n", s, m.loss_sum / A, norm, m.n_anchors,
                   (t1 - t0) * 1e3);
        if (s < warmup) continue;
        float ms;
        cudaEventElapsedTime(&ms, eo0, eo1);
        opt_ms += ms;
        wall += t1 - t0;
        flops += train_flops(cp, T, pairs_step / A) * A;
        tok += (double)T * A;
    }
    if (x->peak == 0) x->peak = gemm_peak();   /* after the first variant's steps: not in its start-up time */
    const double peak = x->peak;
    printf("trainer: %.0f tokens/s over %d steps (%.1f ms/step), %.1f TFLOP/s model FLOPs\n", tok / wall, steps,
           wall / steps * 1e3, flops / wall / 1e12);
    printf("MFU: %.1f%% of the measured bf16 GEMM peak (%.0f TFLOP/s), %.1f%% of the 989 TFLOP/s spec\n",
           peak > 0 ? 100 * flops / wall / 1e12 / peak : 0.0, peak, 100 * flops / wall / 1e12 / 989.0);
    double sum = copy_ms + opt_ms;
    printf("per optimizer step (ms; %d micro-batch%s):\n", A, A == 1 ? "" : "es");
    for (int i = 0; i < DRAFTER_GPU_PH_N; i++) {
        printf("  %-34s %9.2f\n", drafter_gpu_phase_name(i), ph[i] / steps);
        sum += ph[i];
    }
    printf("  %-34s %9.2f\n", v->kind == OPTIM_ADAMW ? "optimizer (AdamW)" : "optimizer (Muon + AdamW)", opt_ms / steps);
    const double ns_fl = optim_gpu_muon_flops(og);
    if (ns_fl > 0)
        printf("  %-34s %9.2f TFLOP per step, %.1f TFLOP/s over the whole optimizer step (%d shape batches)\n",
               "  Muon Newton-Schulz", ns_fl / 1e12, opt_ms > 0 ? ns_fl / (opt_ms / steps * 1e-3) / 1e12 : 0.0,
               optim_gpu_muon_batches(og));
    printf("  %-34s %9.2f\n", "batch copies (host -> device)", copy_ms / steps);
    printf("  %-34s %9.2f\n", "idle (wall - the above)", (wall * 1e3 - sum) / steps);
    size_t f2;
    cudaMemGetInfo(&f2, &tot);
    printf("device memory in use at the end: %.2f GiB (after start-up %.2f GiB)%s\n", (tot - f2) / 1073741824.0,
           (tot - f1) / 1073741824.0, f2 == f1 ? "" : "  (changed: a step allocated)");
    CHECK(drafter_gpu_timing(g, 0, err, sizeof err) == 0, "%s", err);
    cudaEventDestroy(ec0), cudaEventDestroy(ec1), cudaEventDestroy(eo0), cudaEventDestroy(eo1);
    free(hb.ids), free(hb.pos), free(hb.doc), free(hb.mask), free(anchors), free(valid);
    optim_gpu_free(og);
    optim_free(&o);
    free(tens);
    return bad;
}

int main(int argc, char **argv) {
    const double t_launch = now_s();
    int steps = 20, warmup = 3, q36 = 0;
    const char *vlist = "muon";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            /* qwen3.6-27b (issue 27): the drafter of a Qwen3.6-27B target, SpecForge's published shape */
            const char *v = argv[++i];
            if (!strcmp(v, "qwen3.6-27b")) q36 = 1;
            else if (strcmp(v, "qwen3-8b")) { fprintf(stderr, "train_bench: --config qwen3-8b | qwen3.6-27b\n"); return 2; }
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--variants") && i + 1 < argc) vlist = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--config qwen3-8b|qwen3.6-27b] [--steps 20] [--warmup 3] [--variants "
                    "muon,adamw,muon-ga4]\n", argv[0]);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0) { fprintf(stderr, "train_bench: need --steps >= 1 and --warmup >= 0\n"); return 2; }
    struct variant vars[8];
    int nv = parse_variants(vlist, vars, 8);
    if (nv < 1) {
        fprintf(stderr, "train_bench: --variants '%s': expected a comma list of muon, adamw, each optionally -gaA "
                "(A in 1..64 micro-batches per step), at most 8\n", vlist);
        return 2;
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("train_bench: no CUDA device, skipped\n"); return 0; }
    char err[1024];
    struct bench_ctx x;
    memset(&x, 0, sizeof x);
    x.t_launch = t_launch;
    struct drafter_config *cp = &x.c;
    drafter_config_defaults(cp);
    cp->target.num_hidden_layers = 36;
    cp->target.rope_theta = 1e6;
    cp->target.head_dim = 128;
    cp->H = 4096, cp->n_h = 32, cp->n_kv = 8, cp->d_h = 128, cp->I = 12288, cp->eps = 1e-6f;
    cp->V_t = 151936, cp->V_d = 32000;
    cp->k = 5;
    int ids[5] = {1, 9, 17, 25, 33};
    memcpy(cp->layer_ids, ids, sizeof ids);
    cp->mask_token_id = 151669;
    if (q36) {   /* 5 layers, hidden 5120, head dim 256, 24 / 4 heads, MLP 17408 (~1.83 B trainable) */
        cp->target.num_hidden_layers = 64;
        cp->target.rope_theta = 1e7;
        cp->target.head_dim = 256;
        cp->H = 5120, cp->n_h = 24, cp->n_kv = 4, cp->d_h = 256, cp->I = 17408;
        cp->V_t = 248320;
        int ids36[5] = {1, 16, 31, 46, 61};
        memcpy(cp->layer_ids, ids36, sizeof ids36);
        cp->mask_token_id = 248077;
    }
    cp->loss = LMHEAD_LOSS_KL;
    cp->weighting = LMHEAD_WEIGHT_EXP_DECAY;
    const int T = x.T = cp->T_max;   /* 8192 */
    struct drafter *d = x.d = drafter_init(cp, 1, err, sizeof err);
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
    struct drafter_gpu *g = x.g = drafter_gpu_init(d, 0, stdout, err, sizeof err);
    CHECK(g, "drafter_gpu_init: %s", err);
    CHECK(drafter_gpu_warmup(g, T, err, sizeof err) == 0, "warmup: %s", err);
    /* synthetic features on the device, a pinned host copy of one batch's features for the copy phase */
    const struct drafter_gpu_inputs *in = drafter_gpu_inputs(g);
    const size_t kH = (size_t)cp->k * cp->H;
    x.feat = (size_t)T * kH * 2, x.lastb = (size_t)T * cp->H * 2;
    CHECK(target_fill_random_bf16(in->hidden, (size_t)T * kH, 5, 0, 1.0f, 0) == 0, "fill: %s", kernels_error());
    CHECK(target_fill_random_bf16(in->last, (size_t)T * cp->H, 6, 0, 1.0f, 0) == 0, "fill: %s", kernels_error());
    CHECK(cudaMallocHost(&x.h_feat, x.feat + x.lastb) == cudaSuccess, "cudaMallocHost of %zu bytes", x.feat + x.lastb);
    CHECK(cudaMemcpy(x.h_feat, in->hidden, x.feat, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    CHECK(cudaMemcpy((char *)x.h_feat + x.feat, in->last, x.lastb, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    int bad = 0;
    for (int i = 0; i < nv; i++) bad |= run_variant(&x, &vars[i], steps, warmup);
    cudaFreeHost(x.h_feat);
    drafter_gpu_free(g);
    drafter_free(d);
    return bad;
}
#else
int main(void) {
    printf("train_bench: built without CUDA, skipped\n");
    return 0;
}
#endif
