/*
 * stages/dflash-sample.c — a dataset sampled from the target itself, so a short CPU run can show a drafter
 * learning it (issue 17 item 4): prompts of random tokens, continuations drawn from the target at a temperature
 * (below 1 the target is predictable enough for τ to rise clearly above 1).
 *
 *   dflash-sample --target-model DIR --out FILE [--samples 256] [--prompt-len 8] [--gen-len 24]
 *                 [--temperature 0.5] [--max-token V] [--seed 1]
 *
 * Rows are {"input_ids": [...], "loss_mask": [0 × prompt, 1 × continuation]} (the dataset JSONL the packer and
 * dflash-eval read). CPU, fp32, no KV cache: each token recomputes the forward over the prefix (tiny models).
 * Sampling is seeded (splitmix64), so the file depends only on the flags and the target.
 */
#include "core/check.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "export/eval.h"
#include "kernels/common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double uniform01(uint64_t *s) { return (double)(kernels_rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

int main(int argc, char **argv) {
    log_init("dflash-sample");
    const char *target = NULL, *out = NULL;
    int samples = 256, prompt_len = 8, gen_len = 24, max_token = 0;
    double temperature = 0.5;
    int64_t seed = 1;
    struct flag table[] = {
        {"target-model", FLAG_STRING, &target, "the target's Hugging Face directory", 1, 0},
        {"out", FLAG_STRING, &out, "JSONL file to write (atomically)", 1, 0},
        {"samples", FLAG_INT, &samples, "rows", 1, 1 << 24},
        {"prompt-len", FLAG_INT, &prompt_len, "random prompt tokens per row", 1, 1 << 16},
        {"gen-len", FLAG_INT, &gen_len, "tokens sampled from the target per row (supervised)", 1, 1 << 16},
        {"temperature", FLAG_DOUBLE, &temperature, "sampling temperature (0: greedy)", 0, 100},
        {"max-token", FLAG_INT, &max_token, "prompt tokens are drawn from [0, N) (0: the vocabulary; keep the mask "
         "token out)", 0, 1 << 30},
        {"seed", FLAG_INT64, &seed, "seed of prompts and sampling", 0, INT64_MAX},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--target-model DIR --out FILE [--samples N] [--temperature T]",
                        "Write a dataset sampled from the target: random prompts, continuations by the target.", NULL,
                        0);
    if (!target || !out) DIE("--target-model and --out are required (see --help)");
    char err[2048];
    int L = prompt_len + gen_len, zero = 0;
    struct eval_target et;
    LIB_CHECK(eval_target_open(&et, target, L, &zero, 1, err, sizeof err), err);
    int V = et.V;
    if (max_token <= 0 || max_token > V) max_token = V;
    float *logits = malloc(sizeof(float) * (size_t)V);
    double *p = malloc(sizeof(double) * (size_t)V);
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)L);
    size_t cap = (size_t)samples * ((size_t)L * 16 + 64) + 1024, len = 0;
    char *text = malloc(cap);
    ALLOC_CHECK(logits);
    ALLOC_CHECK(p);
    ALLOC_CHECK(seq);
    ALLOC_CHECK(text);
    uint64_t rng = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    for (int r = 0; r < samples; r++) {
        for (int t = 0; t < prompt_len; t++) seq[t] = (int32_t)(kernels_rng_next(&rng) % (uint64_t)max_token);
        for (int n = prompt_len; n < L; n++) {
            LIB_CHECK(eval_target_forward(&et, seq, n, n, NULL, err, sizeof err), err);
            eval_target_logits(&et, et.last + (size_t)(n - 1) * et.H, logits);
            int best = 0;
            for (int v = 1; v < V; v++)
                if (logits[v] > logits[best]) best = v;
            if (temperature <= 0) {
                seq[n] = best;
                continue;
            }
            double z = 0;
            for (int v = 0; v < V; v++) z += p[v] = exp((logits[v] - logits[best]) / temperature);
            double u = uniform01(&rng) * z, acc = 0;
            int pick = V - 1;
            for (int v = 0; v < V; v++)
                if ((acc += p[v]) > u) {
                    pick = v;
                    break;
                }
            seq[n] = pick;
        }
        len += (size_t)snprintf(text + len, cap - len, "{\"input_ids\": [");
        for (int t = 0; t < L; t++) len += (size_t)snprintf(text + len, cap - len, "%s%d", t ? ", " : "", seq[t]);
        len += (size_t)snprintf(text + len, cap - len, "], \"loss_mask\": [");
        for (int t = 0; t < L; t++) len += (size_t)snprintf(text + len, cap - len, "%s%d", t ? ", " : "", t >= prompt_len);
        len += (size_t)snprintf(text + len, cap - len, "]}\n");
        if (len >= cap) DIE("internal: the output buffer of %zu bytes is too small", cap);
    }
    LIB_CHECK(fs_write_atomic(out, text, len, err, sizeof err), err);
    log_info("wrote %s: %d rows of %d prompt + %d sampled tokens (temperature %g)", out, samples, prompt_len, gen_len,
             temperature);
    free(text);
    free(seq);
    free(p);
    free(logits);
    eval_target_close(&et);
    return 0;
}
