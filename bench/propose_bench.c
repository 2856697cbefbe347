/*
 * bench/propose_bench.c — the drafter's block proposal on the GPU as dflash-eval runs it (issue 30 item 3), uncached
 * (drafter_step_gpu over the whole committed context every round) against the KV-cached proposal
 * (export/drafter_cache.h's GPU half: only the rows committed since the last round are projected), on the drafter of
 * a Qwen3-8B target (train_bench's shape: hidden 4096, 32 / 8 heads of 128, MLP 12288, k 5, draft vocabulary 32000,
 * block 16) with random weights and random fp32 features on the host, as eval_target hands them over.
 *
 *   build: make build/bench/propose_bench      run: build/bench/propose_bench [--context 1024] [--rounds 32]
 *          [--accept 4]
 *
 * What is timed (wall, each call returns after its ids are on the host): R uncached proposals at n = --context
 * committed tokens; the cached proposal's first call at n = --context (the whole context projected: the prefill);
 * then R cached rounds, each --accept tokens further (the rows a round commits at τ ≈ --accept). Printed: the
 * median of each and their ratio, the GPU cache's memory, and how many of the cached drafts at n = --context equal
 * the uncached ones (bf16 near-ties aside, all). Napkin math: the drafter's weights (~1 GB bf16 with a 151936 x
 * 4096 embedding that is gathered, not read whole, and a 32000 x 4096 LM head) read once per proposal take ~0.2 ms
 * at 4.8 TB/s; the uncached proposal also uploads n·k·H features (84 MB at n 1024 in fp32 on the host, converted
 * to 42 MB of bf16) and runs the drafter over n + B rows.
 */
#include "export/eval.h"
#include "kernels/common.h"
#include "train/drafter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = scale * ((float)(s >> 40) / (float)(1ull << 24) * 2.0f - 1.0f);
    }
}

#define CHECK(cond, ...) do { if (!(cond)) { fprintf(stderr, "propose_bench: " __VA_ARGS__); fprintf(stderr, "\n"); \
        return 1; } } while (0)

int main(int argc, char **argv) {
    int context = 1024, rounds = 32, accept = 4;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--context") ? &context : !strcmp(argv[i], "--rounds") ? &rounds
                 : !strcmp(argv[i], "--accept") ? &accept : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(stderr, "usage: %s [--context 1024] [--rounds 32] [--accept 4]\n", argv[0]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("propose_bench: no CUDA device, skipped\n"); return 0; }
    setenv("DFLASH_GPU_DRAFTER_CACHE", "1", 1);   /* the cached proposal is what is measured */
    char err[1024];
    const int B = 16, last_n = context + rounds * accept, max_len = last_n + 2 * B;
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
    c.B = B;
    c.N = 1;
    c.T_max = max_len + B;
    struct drafter *d = drafter_init(&c, 1, err, sizeof err);
    CHECK(d, "drafter_init: %s", err);
    const char *frozen[] = {"embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight"};
    for (int i = 0; i < 3; i++) {
        const struct drafter_param *p = drafter_param_find(d, frozen[i]);
        fill(p->w, (size_t)p->numel, 77 + (i == 2 ? 1 : (uint64_t)i), 0.02f);
    }
    {
        const struct drafter_param *lm = drafter_param_find(d, "lm_head.weight"),
                                   *vl = drafter_param_find(d, "verifier_lm_head.weight");
        memcpy(vl->w, lm->w, sizeof(float) * (size_t)lm->numel);
    }
    const int H = c.H, k = c.k;
    float *states = malloc(sizeof(float) * (size_t)k * max_len * H), *last = malloc(sizeof(float) * (size_t)max_len * H);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)max_len);
    CHECK(states && last && tok, "out of memory for %d rows of features", max_len);
    fill(states, (size_t)k * max_len * H, 5, 1.0f);
    fill(last, (size_t)max_len * H, 6, 1.0f);
    uint64_t s = 11;
    for (int t = 0; t < max_len; t++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        tok[t] = (int32_t)(s % (uint64_t)c.V_t);
    }
    struct eval_drafter ed;
    CHECK(eval_drafter_init_dev(&ed, d, 0, err, sizeof err) == 0, "%s", err);
    CHECK(eval_drafter_enable_cache(&ed, 1, max_len, err, sizeof err) == 0, "%s", err);
    printf("propose_bench: drafter hidden %d, %d layers, %d/%d heads of %d, MLP %d, block %d, draft vocabulary %d; "
           "context %d, %d rounds of %d tokens; GPU cache %.1f MB\n", H, c.L, c.n_h, c.n_kv, c.d_h, c.I, B, c.V_d,
           context, rounds, accept, (double)drafter_cache_gpu_planned_bytes(ed.gcache) / 1e6);
    /* the proposer's view, as eval_generate sets it */
    struct eval_target et;
    memset(&et, 0, sizeof et);
    et.k = k, et.H = H, et.ctx_states = states, et.ctx_last = last, et.ctx_rows = max_len;
    et.n_slots = 1, et.max_len = max_len;
    int32_t du[DRAFTER_MAX_B], dcd[DRAFTER_MAX_B];
    double *tu = malloc(sizeof(double) * (size_t)rounds), *tc = malloc(sizeof(double) * (size_t)rounds);
    CHECK(tu && tc, "out of memory");
    /* uncached: warm up once (cuBLASLt's plans), then R proposals at n = context */
    et.ctx_slot = -1;
    CHECK(eval_drafter_propose(&ed, &et, tok, context, B, du, err, sizeof err) == 0, "uncached: %s", err);
    for (int r = 0; r < rounds; r++) {
        double t0 = now_s();
        CHECK(eval_drafter_propose(&ed, &et, tok, context, B, du, err, sizeof err) == 0, "uncached: %s", err);
        tu[r] = now_s() - t0;
    }
    /* cached: the first call projects the whole context; then rounds of `accept` new rows */
    et.ctx_slot = 0, et.ctx_seq = 1;
    double t0 = now_s();
    CHECK(eval_drafter_propose(&ed, &et, tok, context, B, dcd, err, sizeof err) == 0, "cached: %s", err);
    double t_prefill = now_s() - t0;
    int same = 0;
    for (int j = 0; j < B - 1; j++) same += dcd[j] == du[j];
    for (int r = 0; r < rounds; r++) {
        t0 = now_s();
        CHECK(eval_drafter_propose(&ed, &et, tok, context + (r + 1) * accept, B, dcd, err, sizeof err) == 0,
              "cached: %s", err);
        tc[r] = now_s() - t0;
    }
    struct drafter_cache_stats cs;
    drafter_cache_gpu_get_stats(ed.gcache, &cs);
    double mu = median(tu, rounds), mc = median(tc, rounds);
    printf("propose_bench: uncached %.2f ms per proposal at %d tokens; cached: first call %.2f ms (the context "
           "projected), then %.3f ms per round (%d new rows); %d of %d drafts at %d tokens equal; %lld context rows "
           "projected\n", 1e3 * mu, context, 1e3 * t_prefill, 1e3 * mc, accept, same, B - 1, context,
           (long long)cs.ctx_rows);
    printf("RESULT propose_bench context %d: uncached %.2f ms, cached %.3f ms per proposal (%.1fx)\n", context, 1e3 * mu,
           1e3 * mc, mc > 0 ? mu / mc : 0);
    eval_drafter_free(&ed);
    drafter_free(d);
    free(states);
    free(last);
    free(tok);
    free(tu);
    free(tc);
    return 0;
}
#else
int main(void) {
    printf("propose_bench: built without CUDA, skipped\n");
    return 0;
}
#endif
