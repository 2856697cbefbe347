/*
 * tests/gpu/test_decode_gpu.c — the KV-cached decode step on the GPU (model/decode.h, issue 30 items 1 and 3):
 *
 * decode_gpu_matches_cpu: greedy decoding of 8 prompts (lengths 1..97, batch 4, 48 new tokens) on a Qwen3 (q/k
 *   norm, untied, head_dim 128) and a Llama (llama3 rope, tied, head_dim 64) model from dflash-mkmodel (bf16 on
 *   disk, so both devices hold the same weights), GPU (bf16 activations) against CPU (fp32), teacher-forced so one
 *   near-tie does not derail the rest: the CPU's full forward over the GPU's own output gives its logits after
 *   each prefix, and every GPU token must be the CPU's argmax or within 10% of the logits' rms of its maximum
 *   (test_target_gpu measures the bf16 path's hidden states within 2.5e-2 relative L2 of the CPU's, so a logit
 *   moves by a few % of the logits' scale and a difference of two by at most about twice that: only a near-tie
 *   may resolve differently), and at least 80% must be exactly the argmax. Prints how many prompts decode
 *   identically on both and both devices' tokens/s. A plan larger than the device is refused at decode_init with
 *   one line. The same for a Qwen3.5 hybrid (qwen3.5-tiny: Gated DeltaNet layers, their conv rows and recurrent
 *   state carried per slot on the device, gated attention at head_dim 16).
 * decode_gpu_speculative_equals_greedy: on the GPU, speculative decoding with an oracle proposer (the target's own
 *   greedy continuation by the uncached GPU forward), a proposer wrong at one place per block (rejections and
 *   rollbacks every round) and a real (random) drafter from a checkpoint, its proposal on the CPU and on the GPU
 *   (drafter_step_gpu), give exactly plain greedy decoding's
 *   tokens, in groups of 4 over 6 prompts; a stop token ends a response; dflash-eval --device cuda:0 on the
 *   checkpoint exits 0 with matches_greedy and reports tau and the speed-up; dflash-sample --device cuda:0
 *   regenerates a prepared dataset with the same rows, prompts and masks as --device cpu, its tokens checked on the
 *   CPU as above.
 *
 * Runs on the GPU machine (bash build/gpu/run.sh tests decode_gpu); CUDA starts inside each test (Check forks).
 */
#include "export/eval.h"
#include "export/export.h"
#include "model/decode.h"

#include "../test_export_util.h"

#include <cuda_runtime_api.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { ARCH_QWEN3 = 0, ARCH_LLAMA = 1, ARCH_QWEN35 = 2 };
static const char *const arch_name[] = {"qwen3", "llama", "qwen3.5"};

static void make_model(const char *dir, int arch, char *model, size_t len) {
    int llama = arch == ARCH_LLAMA;
    snprintf(model, len, "%s/model-%s", dir, arch_name[arch]);
    if (arch == ARCH_QWEN35) {   /* test_eval's hybrid, bf16 on disk */
        const char *hy[] = {test_bin("dflash-mkmodel"), "--preset", "qwen3.5-tiny", "--out", model, "--std", "0.15",
                            "--embed-std", "1.0", "--lm-head-std", "0.45", "--seed", "5", "--dtype", "bf16", NULL};
        ck_assert_msg(run_argv(hy) == 0, "dflash-mkmodel: %s", out_text);
        return;
    }
    const char *argv[64] = {test_bin("dflash-mkmodel"), "--out", model, "--preset", llama ? "llama3.2-1b" : "tiny",
                            "--hidden", "256", "--layers", "3", "--heads", "4", "--kv-heads", "2",
                            "--head-dim", llama ? "64" : "128", "--intermediate", "512", "--vocab", "1000",
                            "--dtype", "bf16", "--std", "0.06", "--seed", "5", "--threads", "4"};
    int n = 0;
    while (argv[n]) n++;
    if (llama) {
        const char *more[] = {"--arch", "llama", "--tied", "--embed-std", "0.45"};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) argv[n++] = more[i];
    } else {
        const char *more[] = {"--arch", "qwen3", "--no-tied", "--lm-head-std", "0.45"};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) argv[n++] = more[i];
    }
    argv[n] = NULL;
    ck_assert_msg(run_argv(argv) == 0, "dflash-mkmodel: %s", out_text);
}

enum { NP = 8, NEW = 48, MAXP = 97, SLOTS = 4 };
static const int plen[NP] = {1, 5, 17, 33, 64, 97, 3, 40};

static void prompts_of(int V, int32_t prompts[NP][MAXP], int32_t **pp, int *P) {
    uint64_t s = 4242;
    for (int i = 0; i < NP; i++) {
        P[i] = plen[i];
        for (int t = 0; t < P[i]; t++) prompts[i][t] = (int32_t)(test_rng_next(&s) % (uint64_t)V);
        pp[i] = prompts[i];
    }
}

/* The GPU's greedy tokens seq[P..n) checked on the CPU, teacher-forced: the CPU's full forward over the GPU's own
 * sequence gives, at every generated position, the CPU's logits after the same prefix; the GPU's token must be the
 * CPU's argmax or within a near-tie of it (its CPU logit at most 10% of the logits' rms below the maximum).
 * Returns how many were exactly the CPU's argmax; *worst gets the largest gap / rms seen. */
static int check_gpu_tokens(struct eval_target *ec, const int32_t *seq, int P, int n, const char *what,
                            double *worst) {
    ck_assert_msg(eval_target_forward(ec, seq, n, n, NULL, err, sizeof err) == 0, "%s", err);
    float *lg = malloc(sizeof(float) * (size_t)ec->V);
    int exact = 0;
    for (int t = P; t < n; t++) {
        eval_target_logits(ec, ec->last + (size_t)(t - 1) * ec->H, lg);
        double ss = 0;
        int best = 0;
        for (int v = 0; v < ec->V; v++) {
            ss += (double)lg[v] * lg[v];
            if (lg[v] > lg[best]) best = v;
        }
        double rms = sqrt(ss / ec->V), gap = (double)lg[best] - (double)lg[seq[t]];
        exact += seq[t] == best;
        if (gap / rms > *worst) *worst = gap / rms;
        ck_assert_msg(gap <= 0.1 * rms, "%s: generated token %d: the GPU chose %d, the CPU's argmax after the same "
                      "prefix is %d, %.4f above it (rms %.3f): not a near-tie", what, t - P, seq[t], best, gap, rms);
    }
    free(lg);
    return exact;
}

static void compare_model(int arch) {
    char model[700];
    make_model(test_tmpdir("decode-gpu"), arch, model, sizeof model);
    int zl[1] = {0};
    struct eval_target ec, eg;
    ck_assert_msg(eval_target_open_dev(&ec, model, 256, zl, 1, -1, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_open_dev(&eg, model, 256, zl, 1, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(&ec, SLOTS, MAXP + NEW + 2, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(&eg, SLOTS, MAXP + NEW + 2, err, sizeof err) == 0, "%s", err);
    int32_t prompts[NP][MAXP], *pp[NP], *oc[NP], *og[NP];
    int P[NP], lc[NP], lg[NP];
    prompts_of(ec.V, prompts, pp, P);
    for (int i = 0; i < NP; i++) {
        oc[i] = malloc(sizeof(int32_t) * (MAXP + NEW + 2));
        og[i] = malloc(sizeof(int32_t) * (MAXP + NEW + 2));
    }
    struct eval_gen_opts o = {.max_new = NEW};
    const int32_t *const *cp = (const int32_t *const *)pp;
    double t0 = now_s();
    ck_assert_msg(eval_generate(&ec, NP, cp, P, &o, oc, lc, NULL, err, sizeof err) == 0, "%s", err);
    double t1 = now_s();
    ck_assert_msg(eval_generate(&eg, NP, cp, P, &o, og, lg, NULL, err, sizeof err) == 0, "%s", err);   /* warm-up */
    double t2 = now_s();
    ck_assert_msg(eval_generate(&eg, NP, cp, P, &o, og, lg, NULL, err, sizeof err) == 0, "%s", err);
    double t3 = now_s();
    int exact = 0, total = 0, same = 0;
    double worst = 0;
    for (int i = 0; i < NP; i++) {
        ck_assert_int_eq(lc[i], P[i] + NEW);
        ck_assert_int_eq(lg[i], P[i] + NEW);
        for (int t = 0; t < P[i]; t++) ck_assert_int_eq(og[i][t], prompts[i][t]);
        char what[64];
        snprintf(what, sizeof what, "%s prompt %d", arch_name[arch], i);
        exact += check_gpu_tokens(&ec, og[i], P[i], lg[i], what, &worst);
        total += NEW;
        same += !memcmp(oc[i], og[i], sizeof(int32_t) * (size_t)lg[i]);
    }
    printf("decode_gpu_matches_cpu %s: %d of %d GPU tokens are the CPU's argmax after the same prefix (the others "
           "near-ties, worst gap %.3f rms); %d of %d prompts decode identically on both; greedy batch %d: CPU %.1f "
           "tok/s, GPU %.1f tok/s (after a warm-up run of %.2f s)\n", arch_name[arch], exact, total, worst,
           same, NP, SLOTS, total / (t1 - t0), total / (t3 - t2), t2 - t1);
    ck_assert_msg(exact >= 0.8 * total, "only %d of %d GPU tokens are the CPU's argmax", exact, total);
    for (int i = 0; i < NP; i++) {
        free(oc[i]);
        free(og[i]);
    }
    eval_target_close(&ec);
    /* a plan beyond the device: refused at start-up with one line */
    struct decode *big = decode_init(eg.t, 100000, 100000, 64, err, sizeof err);
    ck_assert_ptr_null(big);
    ck_assert_msg(strstr(err, "GiB are free") && strstr(err, "lower --batch"), "%s", err);
    eval_target_close(&eg);
}

START_TEST(decode_gpu_matches_cpu) {
    compare_model(ARCH_QWEN3);
    compare_model(ARCH_LLAMA);
    compare_model(ARCH_QWEN35);
}
END_TEST

/* ---------------------------------------------------------------- speculative == greedy on the GPU */

static int oracle_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *e,
                          int el) {
    int wrong = ctx != NULL;
    int32_t seq[512], pred[512];
    memcpy(seq, c, sizeof *seq * (size_t)n);
    for (int j = 0; j < B - 1; j++) {
        if (eval_target_forward(et, seq, n + j, n + j - 1, pred, e, el)) return -1;
        seq[n + j] = pred[n + j - 1];
        draft[j] = seq[n + j];
    }
    if (wrong) {
        int at = (n * 7) % (B - 1);
        draft[at] = (draft[at] + 1) % et->V;
    }
    return 0;
}

/* NP output rows of n tokens each in a and in b */
static void rows_alloc(int32_t **a, int32_t **b, int n) {
    for (int i = 0; i < NP; i++) {
        a[i] = malloc(sizeof(int32_t) * (size_t)n);
        b[i] = malloc(sizeof(int32_t) * (size_t)n);
    }
}

/* Plain greedy decoding of n prompts into ref, then each of the runs' speculative decodings into out, which must
 * equal it token for token; runs[1] must be the proposer wrong once per block (its tau below B). */
static void spec_equals_greedy(struct eval_target *eg, int n, const int32_t *const *cp, const int *P, int max_new,
                               int B, const struct eval_gen_opts *runs, const char *const *names, int n_runs,
                               int32_t **ref, int *lr, int32_t **out, int *lo) {
    struct eval_gen_opts plain = {.max_new = max_new};
    ck_assert_msg(eval_generate(eg, n, cp, P, &plain, ref, lr, NULL, err, sizeof err) == 0, "%s", err);
    for (int k = 0; k < n_runs; k++) {
        struct eval_stats s;
        eval_stats_init(&s, B);
        ck_assert_msg(eval_generate(eg, n, cp, P, &runs[k], out, lo, &s, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < n; i++) {
            ck_assert_int_eq(lo[i], lr[i]);
            for (int t = 0; t < lr[i]; t++)
                ck_assert_msg(out[i][t] == ref[i][t], "%s: prompt %d: speculative token %d at %d, greedy %d", names[k],
                              i, out[i][t], t, ref[i][t]);
        }
        printf("decode_gpu_speculative_equals_greedy: %s proposer: tau %.3f over %lld rounds, output == greedy\n",
               names[k], eval_stats_tau(&s), (long long)s.rounds);
        if (k == 1)
            ck_assert_msg(eval_stats_tau(&s) < B, "a wrong token in every block, yet tau %g", eval_stats_tau(&s));
    }
}

/* The Qwen3.5 hybrid on the GPU: rollbacks of rejected blocks restore the recurrent state from the device
 * snapshots, so the oracle and the proposer wrong once per block still give plain greedy decoding exactly. */
/* A random drafter of target (seed 7) with the given layer types, block, sliding window and plan; k 2 (ids 0, 2),
 * 4 anchors, mask token 500, the target's embedding and LM head */
static struct drafter *new_drafter(const char *target, const char *types, int B, int window, int T_max) {
    struct drafter_config c;
    drafter_config_defaults(&c);
    ck_assert_int_eq(drafter_parse_layer_types(&c, types, err, sizeof err), 0);
    c.B = B;
    c.sliding_window = window;
    c.N = 4;
    c.T_max = T_max;
    c.k = 2;
    c.layer_ids[0] = 0;
    c.layer_ids[1] = 2;
    c.mask_token_id = 500;
    ck_assert_msg(drafter_config_from_target(&c, target, err, sizeof err) == 0, "%s", err);
    struct drafter *d = drafter_init(&c, 7, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_msg(drafter_load_target(d, target, err, sizeof err) == 0, "%s", err);
    return d;
}

/* test_eval.c's checkpoint: layers sliding + full, B 4, window 4, random weights */
static struct drafter *make_ckpt(const char *target, char *ckpt, size_t len) {
    struct drafter *d = new_drafter(target, "sliding,full", 4, 4, 64);
    save_ckpt(d, ckpt, len);
    return d;
}

/* dflash-eval --device cuda:0 on ckpt, from a prompt file of the first n prompts: matches greedy, reports tau */
static void eval_cli_on_gpu(const char *dir, const char *model, const char *ckpt, int32_t prompts[NP][MAXP],
                            const int *P, int n) {
    char pf[800], js[800];
    snprintf(pf, sizeof pf, "%s/prompts.jsonl", dir);
    snprintf(js, sizeof js, "%s/eval.json", dir);
    FILE *f = fopen(pf, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"input_ids\": [");
        for (int t = 0; t < P[i]; t++) fprintf(f, "%s%d", t ? ", " : "", prompts[i][t]);
        fprintf(f, "], \"set\": \"%s\"}\n", i % 2 ? "odd" : "even");
    }
    fclose(f);
    const char *ev[] = {test_bin("dflash-eval"), "--target-model", model, "--ckpt", ckpt, "--prompts", pf, "--max-new",
                        "24", "--batch", "4", "--device", "cuda:0", "--no-offline", "--out", js, NULL};
    ck_assert_msg(run_argv(ev) == 0, "dflash-eval --device cuda:0: %s", out_text);
    printf("%s", out_text);
    json_t *j = json_load_file(js, 0, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert(json_is_true(json_object_get(j, "matches_greedy")));
    ck_assert_str_eq(json_string_value(json_object_get(j, "device")), "cuda:0");
    ck_assert_int_eq(json_integer_value(json_object_get(j, "responses")), n);
    ck_assert_ptr_nonnull(json_object_get(json_object_get(j, "sets"), "odd"));
    ck_assert(json_real_value(json_object_get(j, "tau")) >= 1.0);
    json_decref(j);
}

/* dflash-sample on the GPU against the CPU: rows of a prepared dataset (the first n prompts, then a supervised span);
 * the GPU's tokens are the CPU's argmax after the same prefix but at near-ties */
static void sample_cli_gpu_vs_cpu(const char *dir, const char *model, int32_t prompts[NP][MAXP], const int *P,
                                  int n) {
    char data[800], o_cpu[800], o_gpu[800];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    snprintf(o_cpu, sizeof o_cpu, "%s/regen-cpu.jsonl", dir);
    snprintf(o_gpu, sizeof o_gpu, "%s/regen-gpu.jsonl", dir);
    FILE *f = fopen(data, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "{\"input_ids\": [");
        for (int t = 0; t < P[i] + 3; t++) fprintf(f, "%s%d", t ? ", " : "", t < P[i] ? prompts[i][t] : 7);
        fprintf(f, "], \"loss_mask\": [");
        for (int t = 0; t < P[i] + 3; t++) fprintf(f, "%s%d", t ? ", " : "", t >= P[i]);
        fprintf(f, "]}\n");
    }
    fclose(f);
    for (int g = 0; g < 2; g++) {
        const char *sa[] = {test_bin("dflash-sample"), "--target-model", model, "--prompts", data, "--out",
                            g ? o_gpu : o_cpu, "--gen-len", "40", "--temperature", "0", "--batch", "4", "--stop-ids",
                            "999999", "--device", g ? "cuda:0" : "cpu", NULL};
        ck_assert_msg(run_argv(sa) == 0, "dflash-sample --device %s: %s", g ? "cuda:0" : "cpu", out_text);
    }
    size_t n1, n2;
    char *a = test_slurp(o_cpu, &n1), *b = test_slurp(o_gpu, &n2);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    struct eval_target ec;
    int zero = 0;
    ck_assert_msg(eval_target_open_dev(&ec, model, MAXP + 40 + 1, &zero, 1, -1, err, sizeof err) == 0, "%s", err);
    char *sa1 = NULL, *sa2 = NULL;
    int rows = 0, exact = 0, same = 0;
    double worst = 0;
    for (char *l1 = strtok_r(a, "\n", &sa1), *l2 = strtok_r(b, "\n", &sa2); l1 && l2;
         l1 = strtok_r(NULL, "\n", &sa1), l2 = strtok_r(NULL, "\n", &sa2), rows++) {
        json_t *j1 = json_loads(l1, 0, NULL), *j2 = json_loads(l2, 0, NULL);
        ck_assert(j1 && j2);
        json_t *i1 = json_object_get(j1, "input_ids"), *i2 = json_object_get(j2, "input_ids");
        int len = P[rows] + 40;
        ck_assert_int_eq(json_array_size(i1), len);
        ck_assert_int_eq(json_array_size(i2), len);
        ck_assert(json_equal(json_object_get(j1, "loss_mask"), json_object_get(j2, "loss_mask")));
        int32_t seq[MAXP + 40];
        for (int t = 0; t < len; t++) {
            seq[t] = (int32_t)json_integer_value(json_array_get(i2, (size_t)t));
            if (t < P[rows]) ck_assert_int_eq(seq[t], prompts[rows][t]);
        }
        char what[64];
        snprintf(what, sizeof what, "dflash-sample row %d", rows);
        exact += check_gpu_tokens(&ec, seq, P[rows], len, what, &worst);
        same += json_equal(i1, i2);
        json_decref(j1);
        json_decref(j2);
    }
    ck_assert_int_eq(rows, n);
    printf("dflash-sample --device cuda:0: %d rows (%d identical to --device cpu); %d of %d generated tokens are the "
           "CPU's argmax after the same prefix (worst gap %.3f rms)\n", rows, same, exact, 40 * n, worst);
    ck_assert_msg(exact >= 0.8 * 40 * n, "only %d of %d GPU tokens are the CPU's argmax", exact, 40 * n);
    eval_target_close(&ec);
    free(a);
    free(b);
}

START_TEST(decode_gpu_hybrid_speculative_equals_greedy) {
    const char *dir = test_tmpdir("spec-gpu-hybrid");
    char model[700], ckpt[1024];
    make_model(dir, ARCH_QWEN35, model, sizeof model);
    enum { N6 = 6, NEW2 = 32, B = 4 };
    int zl[1] = {0};
    struct eval_target eg;
    ck_assert_msg(eval_target_open_dev(&eg, model, MAXP + NEW2 + 2 * B, zl, 1, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(&eg, SLOTS, MAXP + NEW2 + 2 * B, err, sizeof err) == 0, "%s", err);
    int32_t prompts[NP][MAXP], *pp[NP], *ref[NP], *out[NP];
    int P[NP], lr[NP], lo[NP];
    prompts_of(eg.V, prompts, pp, P);
    rows_alloc(ref, out, MAXP + NEW2 + 2 * B);
    int one = 1;
    struct eval_gen_opts runs[2] = {{.max_new = NEW2, .B = B, .fn = oracle_propose},
                                    {.max_new = NEW2, .B = B, .fn = oracle_propose, .ctx = &one}};
    const char *names[2] = {"qwen3.5 oracle", "qwen3.5 one wrong per block"};
    spec_equals_greedy(&eg, N6, (const int32_t *const *)pp, P, NEW2, B, runs, names, 2, ref, lr, out, lo);
    for (int i = 0; i < NP; i++) {
        free(ref[i]);
        free(out[i]);
    }
    eval_target_close(&eg);
    /* the stages on the hybrid's GPU decode step: dflash-eval with a drafter of this target, dflash-sample */
    drafter_free(make_ckpt(model, ckpt, sizeof ckpt));
    eval_cli_on_gpu(dir, model, ckpt, prompts, P, N6);
    sample_cli_gpu_vs_cpu(dir, model, prompts, P, N6);
}
END_TEST

START_TEST(decode_gpu_speculative_equals_greedy) {
    const char *dir = test_tmpdir("spec-gpu");
    char model[700], ckpt[1024];
    make_model(dir, 0, model, sizeof model);
    drafter_free(make_ckpt(model, ckpt, sizeof ckpt));
    enum { N6 = 6, NEW2 = 32 };
    struct drafter *d = export_load_checkpoint(ckpt, model, NULL, MAXP + NEW2 + 20, 1, NULL, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(drafter_config_of(d), zl);
    int B = drafter_config_of(d)->B;
    struct eval_target eg;
    ck_assert_msg(eval_target_open_dev(&eg, model, MAXP + NEW2 + 2 * B, zl, 2, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(&eg, SLOTS, MAXP + NEW2 + 2 * B, err, sizeof err) == 0, "%s", err);
    struct eval_drafter ed, edg;
    ck_assert_int_eq(eval_drafter_init(&ed, d, err, sizeof err), 0);
    ck_assert_msg(eval_drafter_init_dev(&edg, d, 0, err, sizeof err) == 0, "%s", err);
    int32_t prompts[NP][MAXP], *pp[NP], *ref[NP], *out[NP];
    int P[NP], lr[NP], lo[NP];
    prompts_of(eg.V, prompts, pp, P);
    rows_alloc(ref, out, MAXP + NEW2 + 2 * B);
    const int32_t *const *cp = (const int32_t *const *)pp;
    int one = 1;
    struct eval_gen_opts runs[4] = {{.max_new = NEW2, .B = B, .fn = oracle_propose},
                                    {.max_new = NEW2, .B = B, .fn = oracle_propose, .ctx = &one},
                                    {.max_new = NEW2, .B = B, .fn = eval_drafter_propose, .ctx = &ed},
                                    {.max_new = NEW2, .B = B, .fn = eval_drafter_propose, .ctx = &edg}};
    const char *names[4] = {"oracle", "one wrong per block", "random drafter (CPU)", "random drafter (GPU)"};
    spec_equals_greedy(&eg, N6, cp, P, NEW2, B, runs, names, 4, ref, lr, out, lo);
    /* a stop token: prompt 1's 4th generated token */
    int32_t stop = ref[1][P[1] + 3];
    int first = 0;
    while (ref[1][P[1] + first] != stop) first++;
    struct eval_gen_opts st = {.max_new = NEW2, .B = B, .fn = eval_drafter_propose, .ctx = &ed, .stop = &stop,
                               .n_stop = 1};
    ck_assert_msg(eval_generate(&eg, N6, cp, P, &st, out, lo, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(lo[1], P[1] + first + 1);
    eval_drafter_free(&ed);
    eval_drafter_free(&edg);
    drafter_free(d);
    eval_target_close(&eg);

    eval_cli_on_gpu(dir, model, ckpt, prompts, P, N6);
    sample_cli_gpu_vs_cpu(dir, model, prompts, P, N6);
    for (int i = 0; i < NP; i++) {
        free(ref[i]);
        free(out[i]);
    }
}
END_TEST

/* ---------------------------------------------------------------- the drafter's cached proposal on the GPU */

/* Both cached proposers on every round (export/drafter_cache.h): the GPU's (bf16, the decode attention) against
 * the CPU's (fp32) on the same features; the GPU's drafts drive the decoding. */
struct gpair {
    struct eval_drafter *gpu, *cpu;
    int64_t rounds, agree, drafts, sum_n;
    double max_err;   /* max over rows of |xn_gpu - xn_cpu|_2 / |xn_cpu|_2 */
    float *xg;
};

static int gpair_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *e,
                         int el) {
    struct gpair *p = ctx;
    int32_t dc[DRAFTER_MAX_B];
    ck_assert_int_ge(et->ctx_slot, 0);
    if (eval_drafter_propose(p->gpu, et, c, n, B, draft, e, el)) return -1;
    if (eval_drafter_propose(p->cpu, et, c, n, B, dc, e, el)) return -1;
    ck_assert_ptr_nonnull(p->gpu->gcache);
    ck_assert_ptr_nonnull(p->cpu->cache);
    ck_assert_msg(drafter_cache_gpu_xn(p->gpu->gcache, p->xg, err, sizeof err) == 0, "%s", err);
    const float *xc = drafter_cache_xn(p->cpu->cache);
    int H = drafter_config_of(p->cpu->d)->H;
    for (int j = 0; j < B; j++) {
        double num = 0, den = 0;
        for (int q = 0; q < H; q++) {
            double a = p->xg[(size_t)j * H + q], b = xc[(size_t)j * H + q];
            ck_assert_msg(isfinite(a), "round %lld row %d: GPU xn[%d] = %g", (long long)p->rounds, j, q, a);
            num += (a - b) * (a - b);
            den += b * b;
        }
        double r = sqrt(num / (den > 0 ? den : 1));
        if (r > p->max_err) p->max_err = r;
    }
    for (int j = 0; j < B - 1; j++) p->agree += draft[j] == dc[j];
    p->drafts += B - 1;
    p->rounds++;
    p->sum_n += n;
    return 0;
}

/* One decoding of n prompts (lengths P, tokens pp) with the GPU-cached proposer driving and the CPU-cached one
 * beside it, in `slots` slots: output equal to plain greedy decoding; the GPU cache's counters; block states and
 * drafts against the CPU's. */
static void gpair_run(const char *model, struct drafter *d, int slots, int n, const int32_t *const *pp, const int *P,
                      int max_new) {
    const int B = drafter_config_of(d)->B, maxlen = 320 + max_new + 2 * B;
    int zl[DESC_MAX_LAYERS], sum_p = 0, lr[NP], lo[NP];
    drafter_zlab_ids(drafter_config_of(d), zl);
    struct eval_target eg;
    ck_assert_msg(eval_target_open_dev(&eg, model, maxlen, zl, 2, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(&eg, slots, maxlen, err, sizeof err) == 0, "%s", err);
    struct eval_drafter eg_d, ec_d;
    ck_assert_msg(eval_drafter_init_dev(&eg_d, d, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_drafter_enable_cache(&eg_d, slots, maxlen, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(eval_drafter_init(&ec_d, d, err, sizeof err), 0);
    int32_t *ref[NP], *out[NP];
    rows_alloc(ref, out, maxlen);
    for (int i = 0; i < n; i++) sum_p += P[i];
    struct eval_gen_opts plain = {.max_new = max_new};
    ck_assert_msg(eval_generate(&eg, n, pp, P, &plain, ref, lr, NULL, err, sizeof err) == 0, "%s", err);
    struct gpair gp = {&eg_d, &ec_d, 0, 0, 0, 0, 0, malloc(sizeof(float) * (size_t)B * drafter_config_of(d)->H)};
    struct eval_gen_opts o = {.max_new = max_new, .B = B, .fn = gpair_propose, .ctx = &gp};
    struct eval_stats ss;
    eval_stats_init(&ss, B);
    ck_assert_msg(eval_generate(&eg, n, pp, P, &o, out, lo, &ss, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(lo[i], lr[i]);
        for (int t = 0; t < lr[i]; t++)
            ck_assert_msg(out[i][t] == ref[i][t], "slots %d prompt %d: speculative token %d at %d, greedy %d", slots, i,
                          out[i][t], t, ref[i][t]);
    }
    struct drafter_cache_stats cs;
    drafter_cache_gpu_get_stats(eg_d.gcache, &cs);
    printf("drafter_cache_gpu_matches_cpu (%d prompts of %d tokens, %d slots): %lld rounds, tau %.3f, drafts equal "
           "to the CPU's %lld of %lld, block states within %.2e (relative L2) of the CPU's, context rows projected "
           "%lld (uncached: %lld), GPU cache %.1f MB\n", n, sum_p, slots, (long long)gp.rounds, eval_stats_tau(&ss),
           (long long)gp.agree, (long long)gp.drafts, gp.max_err, (long long)cs.ctx_rows, (long long)gp.sum_n,
           (double)drafter_cache_gpu_planned_bytes(eg_d.gcache) / 1e6);
    ck_assert_int_eq(cs.proposals, gp.rounds);
    ck_assert_int_eq(cs.resets, n);   /* each prompt's stay in a slot, once */
    ck_assert_msg(cs.ctx_rows >= sum_p - n && cs.ctx_rows <= sum_p + gp.rounds * B, "%lld context rows for prompts "
                  "of %d tokens over %lld rounds", (long long)cs.ctx_rows, sum_p, (long long)gp.rounds);
    ck_assert_msg(gp.max_err <= 3e-2, "GPU block states %.3e from the CPU's", gp.max_err);
    ck_assert_msg(gp.agree >= 0.8 * (double)gp.drafts, "drafts equal %lld of %lld", (long long)gp.agree,
                  (long long)gp.drafts);
    free(gp.xg);
    for (int i = 0; i < NP; i++) {
        free(ref[i]);
        free(out[i]);
    }
    eval_drafter_free(&eg_d);
    eval_drafter_free(&ec_d);
    eval_target_close(&eg);
}

/* A drafter with a causal sliding layer of window 24, then two full (non-causal) layers, on the Qwen3 test model at
 * head_dim 128, block 8: its cached GPU proposal against the cached CPU proposal, over the 8 prompts of 1..97 tokens
 * in 4 slots, then over prompts of 300 and 260 tokens (two context passes of DCACHE_GPU_CHUNK rows; the window
 * moves the sliding layer's first row far in) and 5 in 2 slots (slots change hands); then test_eval's drafter
 * (block 4, window 4): block states within 3e-2 relative L2 of the CPU's per row, at least 80% of the drafts equal,
 * output equal to plain greedy decoding, each context row projected once per stay in a slot. dflash-eval --device
 * cuda:0 with DFLASH_GPU_DRAFTER_CACHE=1 reports the cached proposal and matches greedy. */
START_TEST(drafter_cache_gpu_matches_cpu) {
    const char *dir = test_tmpdir("dcache-gpu");
    char model[700], ckpt[1024];
    make_model(dir, ARCH_QWEN3, model, sizeof model);
    ck_assert_int_eq(setenv("DFLASH_GPU_DRAFTER_CACHE", "1", 1), 0);
    ck_assert(eval_gpu_drafter_cache_on());
    struct drafter *d = new_drafter(model, "sliding,full,full", 8, 24, 512);
    ck_assert_int_eq(drafter_config_of(d)->sliding_window_non_causal, 0);   /* the sliding layer is causal */
    int32_t prompts[NP][MAXP], *pp[NP];
    int P[NP];
    prompts_of(1000, prompts, pp, P);
    gpair_run(model, d, SLOTS, NP, (const int32_t *const *)pp, P, 40);
    static int32_t longp[3][300];
    const int LP[3] = {300, 5, 260};
    const int32_t *lpp[3] = {longp[0], longp[1], longp[2]};
    uint64_t sd = 77;
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < LP[i]; t++) longp[i][t] = (int32_t)(test_rng_next(&sd) % 1000);
    gpair_run(model, d, 2, 3, lpp, LP, 24);
    save_ckpt(d, ckpt, sizeof ckpt);
    drafter_free(d);
    /* the stage: dflash-eval on the GPU with the cached proposal (the variable is inherited) */
    eval_cli_on_gpu(dir, model, ckpt, prompts, P, 6);
    ck_assert_msg(strstr(out_text, "drafter cached") != NULL, "dflash-eval did not take the cached proposal: %s",
                  out_text);

    /* test_eval's checkpoint drafter: block 4, a window of 4 (every context longer), in 2 slots */
    struct drafter *dw = make_ckpt(model, ckpt, sizeof ckpt);
    gpair_run(model, dw, 2, NP, (const int32_t *const *)pp, P, 24);
    drafter_free(dw);
    unsetenv("DFLASH_GPU_DRAFTER_CACHE");
}
END_TEST

int main(void) {
    (void)tiny_target;   /* test_export_util.h's; these models are larger */
    Suite *s = suite_create("gpu_decode");
    TCase *tc = tcase_create("gpu_decode");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, decode_gpu_matches_cpu);
    tcase_add_test(tc, decode_gpu_speculative_equals_greedy);
    tcase_add_test(tc, decode_gpu_hybrid_speculative_equals_greedy);
    tcase_add_test(tc, drafter_cache_gpu_matches_cpu);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
