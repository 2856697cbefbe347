/*
 * bench/train_cpu_bench.c — the CPU trainer step (train/drafter.h drafter_step_fast + train/optim.h AdamW) on the
 * issue-28 item-7 recipe, with synthetic features (the target does not run): a 2-layer drafter of hidden 128
 * (4 heads, 2 kv heads, head dim 32, MLP 384; layers full, full), target vocabulary = draft vocabulary 2048,
 * k = 2 captured layers, block 8, 64 anchors, packed batches of 1024 tokens (documents of 64..256 tokens, the first
 * 30% of each unsupervised), CE loss with D-PACE weighting, AdamW.
 *
 *   build: make BUILD=build build/bench/train_cpu_bench
 *   run:   build/bench/train_cpu_bench [--steps 20] [--warmup 2] [--vocab 2048] [--tokens 1024] [--threads N] [--ref]
 *
 * --ref times the plain reference composition (drafter_step_cpu: every op a kernels/<op>_ref.c call), the path
 * the fast step is tested against. Reported: seconds per step (median and mean of --steps, after --warmup), the
 * drafter step and the optimizer separately, and the final loss (so two builds can be compared for sanity).
 * Exit status: 0, or 1 when a step fails or the loss is not finite.
 */
#include "kernels/common.h"
#include "train/drafter.h"
#include "train/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(x, ...) do { if (!(x)) { fprintf(stderr, "train_cpu_bench: FAIL: " __VA_ARGS__); fputc('\n', stderr); return 1; } } while (0)

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float urand(uint64_t *rng, float lo, float hi) {
    return lo + (hi - lo) * (float)((kernels_rng_next(rng) >> 40) * 0x1.0p-24);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int steps = 20, warmup = 2, V = 2048, T = 1024, use_ref = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) V = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ref")) use_ref = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: train_cpu_bench [--steps N] [--warmup N] [--vocab V] [--tokens T] [--threads N] [--ref]\n");
            return 2;
        }
    }
    CHECK(steps >= 1 && warmup >= 0 && V >= 16 && T >= 64, "bad arguments");
    char err[512];
    struct drafter_config c;
    drafter_config_defaults(&c);
    c.target.num_hidden_layers = 4;
    c.target.rope_theta = 10000.0;
    c.target.rope_type = HF_ROPE_DEFAULT;
    c.target.head_dim = 32;
    c.H = 128;
    c.n_h = 4;
    c.n_kv = 2;
    c.d_h = 32;
    c.I = 384;
    c.eps = 1e-6f;
    c.V_t = c.V_d = V;
    c.B = 8;
    c.L = 2;
    c.layer_type[0] = c.layer_type[1] = DRAFTER_LAYER_FULL;
    c.N = 64;
    c.T_max = T;
    c.k = 2;
    c.layer_ids[0] = 1;
    c.layer_ids[1] = 3;
    c.mask_token_id = V - 1;
    struct drafter *d = drafter_init(&c, 7, err, sizeof err);
    CHECK(d, "drafter_init: %s", err);
    if (threads > 0) CHECK(drafter_set_threads(d, threads, err, sizeof err) == 0, "%s", err);
    uint64_t rng = 12345;
    int H = c.H, kH = c.k * H;
    float *embed = malloc(sizeof *embed * (size_t)V * H), *head = malloc(sizeof *head * (size_t)V * H);
    float *norm = malloc(sizeof *norm * (size_t)H);
    CHECK(embed && head && norm, "out of memory");
    for (size_t e = 0; e < (size_t)V * H; e++) embed[e] = urand(&rng, -1, 1), head[e] = urand(&rng, -0.2f, 0.2f);
    for (int e = 0; e < H; e++) norm[e] = urand(&rng, 0.5f, 1.5f);
    CHECK(drafter_set_frozen(d, embed, norm, head, err, sizeof err) == 0, "set_frozen: %s", err);
    free(embed);
    free(head);
    free(norm);

    int n = drafter_n_params(d);
    struct optim_tensor *tens = calloc((size_t)n, sizeof *tens);
    for (int i = 0; i < n; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        tens[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable, p->is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    oc.kind = OPTIM_ADAMW;
    oc.lr = 1e-3;
    struct optim o;
    CHECK(optim_init(&o, tens, n, &oc, err, sizeof err) == 0, "optim_init: %s", err);

    int32_t *ids = malloc(sizeof *ids * T), *pos = malloc(sizeof *pos * T), *doc = malloc(sizeof *doc * T);
    uint8_t *mask = malloc((size_t)T);
    float *hidden = malloc(sizeof *hidden * (size_t)T * kH), *last = malloc(sizeof *last * (size_t)T * H);
    CHECK(ids && pos && doc && mask && hidden && last, "out of memory");

    int total = warmup + steps;
    double *t_step = calloc((size_t)total, sizeof *t_step), *t_opt = calloc((size_t)total, sizeof *t_opt);
    double loss = 0, cpu_total = 0;
    printf("train_cpu_bench: %s step, H %d, 2 layers, heads 4/2, d_h 32, I %d, V %d, T %d, N %d, B %d, AdamW; "
           "%d warm-up + %d timed steps\n", use_ref ? "reference" : "fast", H, c.I, V, T, c.N, c.B, warmup, steps);
    for (int s = 0; s < total; s++) {
        /* a fresh packed batch per step */
        int p = 0, dd = 0;
        while (p < T) {
            int len = 64 + (int)(kernels_rng_next(&rng) % 193);
            if (len > T - p) len = T - p;
            for (int i = 0; i < len; i++, p++) {
                ids[p] = (int32_t)(kernels_rng_next(&rng) % (uint64_t)(V - 1));
                pos[p] = i;
                doc[p] = dd;
                mask[p] = i >= (int)(0.3 * len);
            }
            dd++;
        }
        for (size_t e = 0; e < (size_t)T * kH; e++) hidden[e] = urand(&rng, -1, 1);
        for (size_t e = 0; e < (size_t)T * H; e++) last[e] = urand(&rng, -1, 1);
        struct drafter_batch b = {T, T, ids, mask, pos, doc, hidden, last};
        struct drafter_metrics m;
        double t0 = now_s(), c0 = cpu_s();
        drafter_zero_grad(d);
        int rc = use_ref ? drafter_step_cpu(d, &b, 1, (uint64_t)s, 1, &m, err, sizeof err)
                         : drafter_step_fast(d, &b, 1, (uint64_t)s, 1, &m, err, sizeof err);
        CHECK(rc == 0, "step %d: %s", s, err);
        double t1 = now_s();
        optim_clip_grad_norm(tens, n, 1.0);
        CHECK(optim_step(&o, 1.0, err, sizeof err) == 0, "optim_step: %s", err);
        double t2 = now_s();
        if (s >= warmup) cpu_total += cpu_s() - c0;
        t_step[s] = t1 - t0;
        t_opt[s] = t2 - t1;
        loss = m.loss_sum;
        CHECK(isfinite(loss), "step %d: loss %g", s, loss);
    }
    double sum_s = 0, sum_o = 0, tot[4096];
    int nt = steps < 4096 ? steps : 4096;
    for (int s = warmup; s < total; s++) sum_s += t_step[s], sum_o += t_opt[s];
    for (int s = 0; s < nt; s++) tot[s] = t_step[warmup + s] + t_opt[warmup + s];
    qsort(tot, (size_t)nt, sizeof tot[0], cmp_d);
    printf("per step: median %.4f s, mean %.4f s (drafter step %.4f s, optimizer %.4f s), CPU time %.4f s on %d "
           "threads; last loss %.6f\n", tot[nt / 2], (sum_s + sum_o) / steps, sum_s / steps, sum_o / steps,
           cpu_total / steps, drafter_threads(d), loss);
    optim_free(&o);
    drafter_free(d);
    free(tens);
    free(ids); free(pos); free(doc); free(mask); free(hidden); free(last);
    free(t_step); free(t_opt);
    return 0;
}
