/*
 * stages/dflash-eval.c — measure acceptance directly: greedy speculative decoding with the frozen target and a
 * drafter (a checkpoint or an export) on a prompt set, checked token for token against plain greedy decoding (issue 17 item 3;
 * stages/export/eval.h).
 *
 *   dflash-eval --target-model DIR --ckpt CKPT | --drafter EXPORT_DIR --prompts FILE [--max-new 32] [--skip N] [--limit N]
 *               [--batch 8] [--temperature 0 --top-p 1 --seed 1] [--no-kv-cache] [--no-drafter-cache]
 *               [--device cpu|cuda:N] [--out FILE]
 *
 * Prompts: JSONL, one per line, either a JSON array of token ids or an object with "input_ids" (a training row:
 * with a "loss_mask", the prompt is the tokens before the first supervised one) and optionally "set" (a name: τ is
 * also reported per set). The target on the CPU or (--device cuda:N) a GPU: its decode step and LM head run there
 * (model/decode.h), and so does the drafter's block proposal (drafter_step_gpu, bf16; the features of the
 * committed context go up every round). The offline estimate stays on the CPU. KV-cached and batched: --batch prompts advance together, one
 * cached target step per round verifies all their drafts; then plain decoding runs the same way, and the speed-up
 * is the ratio of the two wall times (the drafter's cost included). Greedy (--temperature 0): speculative output
 * must equal plain greedy output token for token. Sampled: speculative sampling's acceptance (a draft token d is
 * kept with probability p(d)). Qwen3.5 hybrids decode with their recurrent state and conv rows carried between
 * steps, on either device (model/decode.h); --no-kv-cache forces the old path anywhere, which recomputes the
 * target over the prefix every round. On the CPU the drafter's proposal is KV-cached too (export/drafter_cache.h:
 * each prompt's context keys and values are kept, a round projects only the rows committed since the last one);
 * --no-drafter-cache re-runs the drafter's training forward over the whole context every round, for comparison.
 * Prints τ (mean over responses of the per-response mean, as z-lab's benchmark), the τ histogram, per-position
 * acceptance, and the offline estimate a trainer reports: 1 + Σ_j Π_{i<=j} acc_i from teacher-forced per-position
 * accuracies on the same responses (SpecForge's simulated acceptance length), beside the teacher-forced mean
 * accepted length. Exit 1 on bad input (one line naming the file, line and key) and when speculative and greedy
 * outputs differ (a bug).
 */
#include "core/check.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/stage.h"
#include "export/eval.h"
#include "export/export.h"
#include "model/decode.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct prompt { int32_t *ids; int n, set; };

#define MAX_SETS 64
static char *set_names[MAX_SETS];
static int n_sets;

static int set_index(const char *path, int lineno, const char *name) {
    for (int i = 0; i < n_sets; i++)
        if (!strcmp(set_names[i], name)) return i;
    if (n_sets == MAX_SETS) DIE("%s:%d: key set: more than %d prompt sets", path, lineno, MAX_SETS);
    set_names[n_sets] = strdup(name);
    ALLOC_CHECK(set_names[n_sets]);
    return n_sets++;
}

/* Read the prompt file; every id checked against V. Dies with FILE:LINE: key on bad input. */
static int read_prompts(const char *path, int V, int skip, int limit, int max_prompt, struct prompt **out) {
    FILE *f = fopen(path, "r");
    if (!f) DIE("%s: %s", path, check_errno_str());
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, n = 0, cap_p = 0, row = 0;
    struct prompt *p = NULL;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len <= 1 && (len == 0 || line[0] == '\n')) continue;
        if (row++ < skip) continue;
        if (limit > 0 && n >= limit) break;
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) DIE("%s:%d: not JSON (%s)", path, lineno, je.text);
        json_t *ids = json_is_array(j) ? j : json_object_get(j, "input_ids");
        if (!json_is_array(ids) || json_array_size(ids) == 0)
            DIE("%s:%d: key input_ids: expected a non-empty array of token ids", path, lineno);
        int m = (int)json_array_size(ids);
        json_t *lm = json_is_object(j) ? json_object_get(j, "loss_mask") : NULL;
        if (lm) {
            if (!json_is_array(lm) || (int)json_array_size(lm) != m)
                DIE("%s:%d: key loss_mask: expected %d entries like input_ids", path, lineno, m);
            int first = m;
            for (int i = 0; i < m; i++)
                if (json_integer_value(json_array_get(lm, (size_t)i))) {
                    first = i;
                    break;
                }
            m = first;
            if (m == 0) DIE("%s:%d: key loss_mask: the first token is supervised, so the prompt is empty", path, lineno);
        }
        if (max_prompt > 0 && m > max_prompt) m = max_prompt;
        json_t *set = json_is_object(j) ? json_object_get(j, "set") : NULL;
        if (set && !json_is_string(set)) DIE("%s:%d: key set: expected a string (the prompt set's name)", path, lineno);
        if (n == cap_p) {
            cap_p = cap_p ? 2 * cap_p : 16;
            p = realloc(p, sizeof *p * (size_t)cap_p);
            ALLOC_CHECK(p);
        }
        p[n].ids = malloc(sizeof(int32_t) * (size_t)m);
        ALLOC_CHECK(p[n].ids);
        p[n].n = m;
        p[n].set = set_index(path, lineno, set ? json_string_value(set) : "all");
        for (int i = 0; i < m; i++) {
            json_t *v = json_array_get(ids, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= V)
                DIE("%s:%d: key input_ids[%d]: %s is not a token id in the target's vocabulary [0, %d)", path, lineno,
                    i, json_is_integer(v) ? "value" : "a non-integer", V);
            p[n].ids[i] = (int32_t)json_integer_value(v);
        }
        n++;
        json_decref(j);
    }
    free(line);
    fclose(f);
    if (!n) DIE("%s: no prompts (after --skip %d)", path, skip);
    *out = p;
    return n;
}

/* The trainer's own offline estimate: the mean eal_marginal (Σ_j Π_{i<=j} acc_j of a step) over the last `last`
 * dflash-train records of a metrics.jsonl. Returns the count used (0: none), *mean filled. Dies on an unreadable
 * file or a malformed line (naming the line). */
static int train_metrics_eal(const char *path, int last, double *mean) {
    FILE *f = fopen(path, "r");
    if (!f) DIE("%s: %s", path, check_errno_str());
    double *v = malloc(sizeof *v * (size_t)last);
    ALLOC_CHECK(v);
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, n = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        if (line[0] == '\n') continue;
        json_error_t je;
        json_t *j = json_loads(line, 0, &je);
        if (!j) DIE("%s:%d: not JSON (%s)", path, lineno, je.text);
        const char *st = json_string_value(json_object_get(j, "stage"));
        json_t *e = json_object_get(j, "eal_marginal");
        if (st && !strcmp(st, "dflash-train") && json_is_number(e)) v[n++ % last] = json_number_value(e);
        json_decref(j);
    }
    free(line);
    fclose(f);
    int used = n < last ? n : last;
    double s = 0;
    for (int i = 0; i < used; i++) s += v[i];
    *mean = used ? s / used : 0;
    free(v);
    return used;
}

static void stats_add(struct eval_stats *a, const struct eval_stats *b) {
    a->responses += b->responses;
    a->rounds += b->rounds;
    a->accepted += b->accepted;
    a->tau_sum += b->tau_sum;
    for (int i = 0; i <= DRAFTER_MAX_B; i++) a->hist[i] += b->hist[i];
    for (int i = 0; i < DRAFTER_MAX_B; i++) a->at_pos[i] += b->at_pos[i];
}

int main(int argc, char **argv) {
    log_init("dflash-eval");
    const char *target = NULL, *ckpt = NULL, *exp_dir = NULL, *prompts = NULL, *out_path = NULL, *vocab = NULL,
               *train_metrics = NULL, *device = "cpu";
    int max_new = 32, skip = 0, limit = 0, max_prompt = 0, offline = 1, batch = 8, kv_cache = 1, drafter_cache = 1;
    double temperature = 0, top_p = 1;
    int64_t seed = 1;
    struct flag table[] = {
        {"target-model", FLAG_STRING, &target, "the target's Hugging Face directory", 1, 0},
        {"ckpt", FLAG_STRING, &ckpt, "the drafter: a dflash-train checkpoint (RUN/checkpoints/step-N.ckpt)", 1, 0},
        {"drafter", FLAG_STRING, &exp_dir, "the drafter as an export directory (dflash-export, either layout; bf16 "
         "weights) instead of --ckpt", 1, 0},
        {"draft-vocab", FLAG_STRING, &vocab, "t2d.npy / d2t.npy directory when the checkpoint's vocabulary is pruned",
         1, 0},
        {"prompts", FLAG_STRING, &prompts, "JSONL: token-id arrays, or rows with input_ids (+ loss_mask: the prompt "
         "ends before the first supervised token; + set: a prompt set name for per-set tau)", 1, 0},
        {"max-new", FLAG_INT, &max_new, "tokens to generate per prompt", 1, 1 << 16},
        {"max-prompt-tokens", FLAG_INT, &max_prompt, "cut prompts to their first N tokens (0: whole)", 0, 1 << 20},
        {"skip", FLAG_INT, &skip, "skip the first N prompts (held-out rows after the training ones)", 0, 1 << 30},
        {"limit", FLAG_INT, &limit, "at most N prompts (0: all)", 0, 1 << 30},
        {"batch", FLAG_INT, &batch, "prompts decoded together (KV-cache slots)", 1, 4096},
        {"temperature", FLAG_DOUBLE, &temperature, "0: greedy (checked against plain greedy decoding); > 0: sampled "
         "decoding with speculative sampling's acceptance", 0, 100},
        {"top-p", FLAG_DOUBLE, &top_p, "nucleus sampling with --temperature (1: off)", 0, 1},
        {"seed", FLAG_INT64, &seed, "sampling seed", 0, INT64_MAX},
        {"kv-cache", FLAG_BOOL, &kv_cache, "KV-cached, batched decoding; --no-kv-cache recomputes the target over the "
         "prefix every round, one prompt at a time (the old path)", 1, 0},
        {"drafter-cache", FLAG_BOOL, &drafter_cache, "with the KV cache, on the CPU: the drafter keeps each prompt's "
         "context keys and values and projects only the newly committed rows a round; --no-drafter-cache re-runs its "
         "whole training forward over the context every round (the old proposal, for comparison). On a GPU the "
         "cached proposal is written but runs only with DFLASH_GPU_DRAFTER_CACHE=1 until it has been validated "
         "there", 1, 0},
        {"offline", FLAG_BOOL, &offline, "also compute the offline (teacher-forced) estimate on the same responses",
         1, 0},
        {"train-metrics", FLAG_STRING, &train_metrics, "RUN/metrics.jsonl of the training run: also print the "
         "trainer's estimate 1 + eal_marginal (mean of its last 10 steps) beside the measured tau", 1, 0},
        {"out", FLAG_STRING, &out_path, "also write the results as JSON here", 1, 0},
        {"device", FLAG_STRING, &device, "cpu or cuda:N (auto: cuda:0 when a GPU is present): where the target runs",
         1, 0},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--target-model DIR --ckpt CKPT --prompts FILE [--max-new N] [--out FILE]",
                        "Speculative decoding with the target and a drafter (KV-cached, batched): acceptance length "
                        "τ per prompt set, its histogram, per-position acceptance and the speed-up over plain "
                        "decoding, checked against plain greedy decoding.", NULL, 0);
    if (!target || !prompts || !ckpt == !exp_dir)
        DIE("--target-model, --prompts and one of --ckpt / --drafter are required (see --help)");
    char err[2048];
    int dev = -1;
    LIB_CHECK(stage_parse_device(device, &dev, err, sizeof err), err);
    struct model_config tc;
    char tcfg[4200];
    snprintf(tcfg, sizeof tcfg, "%s/config.json", target);
    LIB_CHECK(hf_config_load(&tc, tcfg, err, sizeof err), err);
    struct prompt *p = NULL;
    int np = read_prompts(prompts, tc.vocab_size, skip, limit, max_prompt, &p);
    int longest = 0;
    for (int i = 0; i < np; i++)
        if (p[i].n > longest) longest = p[i].n;
    int total = longest + max_new;
    int no_cache = !kv_cache;
    if (no_cache && temperature > 0) DIE("--temperature needs the KV-cached path (not --no-kv-cache)");

    /* the online drafter plans one block; the offline one an anchor at every generated token */
    struct drafter *d = ckpt ? export_load_checkpoint(ckpt, target, vocab, total + DRAFTER_MAX_B + 1, 1, NULL, err,
                                                      sizeof err)
                             : export_load_dir(exp_dir, target, total + DRAFTER_MAX_B + 1, 1, err, sizeof err);
    if (!d) DIE("%s", err);
    const struct drafter_config *dc = drafter_config_of(d);
    int B = dc->B;
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(dc, zl);
    struct eval_target et;
    LIB_CHECK(eval_target_open_dev(&et, target, total + 2 * B, zl, dc->k, dev, err, sizeof err), err);
    if (!no_cache) LIB_CHECK(eval_target_enable_cache(&et, batch, total + 2 * B, err, sizeof err), err);
    struct eval_drafter ed;
    LIB_CHECK(eval_drafter_init_dev(&ed, d, dev, err, sizeof err), err);
    /* the GPU drafter's cached proposal stays off until it has run on a GPU (eval_gpu_drafter_cache_on) */
    int dcached = !no_cache && drafter_cache && (dev < 0 || eval_gpu_drafter_cache_on());
    if (dcached && eval_drafter_enable_cache(&ed, batch, total + 2 * B, err, sizeof err)) {
        if (dev < 0) DIE("%s", err);
        /* a shape the GPU cache cannot take (export/drafter_cache.h): the uncached proposal, said once */
        fprintf(stderr, "dflash-eval: the drafter's proposal runs uncached on %s: %s\n", device, err);
        dcached = 0;
    }
    ed.no_cache = !dcached;
    struct eval_stats s, per_set[MAX_SETS];
    eval_stats_init(&s, B);
    for (int k = 0; k < n_sets; k++) eval_stats_init(&per_set[k], B);
    int32_t **outs = calloc((size_t)np, sizeof *outs), **spec = calloc((size_t)np, sizeof *spec);
    int *len_o = calloc((size_t)np, sizeof *len_o), *len_s = calloc((size_t)np, sizeof *len_s);
    ALLOC_CHECK(outs);
    ALLOC_CHECK(spec);
    ALLOC_CHECK(len_o);
    ALLOC_CHECK(len_s);
    for (int i = 0; i < np; i++) {
        outs[i] = malloc(sizeof(int32_t) * (size_t)(total + 2 * B));
        spec[i] = malloc(sizeof(int32_t) * (size_t)(total + 2 * B));
        ALLOC_CHECK(outs[i]);
        ALLOC_CHECK(spec[i]);
    }
    double t_spec = 0, t_plain = 0;
    if (no_cache) {
        for (int i = 0; i < np; i++) {
            double t0 = time_mono_s();
            LIB_CHECK(eval_speculative(&et, p[i].ids, p[i].n, max_new, B, eval_drafter_propose, &ed, spec[i],
                                       &per_set[p[i].set], err, sizeof err), err);
            double t1 = time_mono_s();
            LIB_CHECK(eval_greedy(&et, p[i].ids, p[i].n, max_new, outs[i], err, sizeof err), err);
            t_plain += time_mono_s() - t1;
            t_spec += t1 - t0;
            len_o[i] = len_s[i] = p[i].n + max_new;
        }
    } else {
        /* speculative, one prompt set at a time (its own τ); then plain decoding of every prompt */
        const int32_t **ids = malloc(sizeof *ids * (size_t)np);
        int *lens = malloc(sizeof *lens * (size_t)np), *map = malloc(sizeof *map * (size_t)np);
        int32_t **o2 = malloc(sizeof *o2 * (size_t)np);
        int *l2 = malloc(sizeof *l2 * (size_t)np);
        ALLOC_CHECK(ids);
        ALLOC_CHECK(lens);
        ALLOC_CHECK(map);
        ALLOC_CHECK(o2);
        ALLOC_CHECK(l2);
        struct eval_gen_opts go = {.max_new = max_new, .B = B, .fn = eval_drafter_propose, .ctx = &ed,
                                   .temperature = temperature, .top_p = top_p, .seed = (uint64_t)seed};
        for (int k = 0; k < n_sets; k++) {
            int m = 0;
            for (int i = 0; i < np; i++)
                if (p[i].set == k) {
                    map[m] = i;
                    ids[m] = p[i].ids;
                    lens[m] = p[i].n;
                    o2[m] = spec[i];
                    m++;
                }
            double t0 = time_mono_s();
            /* each prompt keeps its own sampling stream (index_base: its index in the file), whatever its set;
             * a set's contiguous runs of prompts go together */
            for (int q = 0; q < m;) {
                int r = q;
                while (r + 1 < m && map[r + 1] == map[r] + 1) r++;
                go.index_base = map[q];
                LIB_CHECK(eval_generate(&et, r - q + 1, ids + q, lens + q, &go, o2 + q, l2 + q, &per_set[k], err,
                                        sizeof err), err);
                q = r + 1;
            }
            t_spec += time_mono_s() - t0;
            for (int q = 0; q < m; q++) len_s[map[q]] = l2[q];
        }
        for (int i = 0; i < np; i++) {
            ids[i] = p[i].ids;
            lens[i] = p[i].n;
        }
        struct eval_gen_opts gp = {.max_new = max_new, .temperature = temperature, .top_p = top_p,
                                   .seed = (uint64_t)seed};
        double t0 = time_mono_s();
        LIB_CHECK(eval_generate(&et, np, ids, lens, &gp, outs, len_o, NULL, err, sizeof err), err);
        t_plain = time_mono_s() - t0;
        free(ids);
        free(lens);
        free(map);
        free(o2);
        free(l2);
    }
    for (int k = 0; k < n_sets; k++) stats_add(&s, &per_set[k]);
    int64_t gen_tokens = 0;
    for (int i = 0; i < np; i++) {
        gen_tokens += len_o[i] - p[i].n;
        if (temperature > 0) continue;
        for (int t = 0; t < p[i].n + max_new; t++)
            if (len_s[i] != len_o[i] || spec[i][t] != outs[i][t]) {
                fprintf(stderr, "dflash-eval: BUG: prompt %d: speculative decoding gives token %d at position %d, "
                        "greedy decoding %d\n", i + skip, spec[i][t], t, outs[i][t]);
                if (dev >= 0)
                    fprintf(stderr, "hint: on a GPU a verification step runs its GEMMs over other row counts than "
                            "plain decoding; bf16 results that are not batch-invariant can resolve a near-tie of the "
                            "logits differently\n");
                return 1;
            }
    }
    eval_drafter_free(&ed);
    drafter_free(d);

    /* offline estimate: teacher-forced drafter_step on the responses, anchors at the generated tokens */
    struct drafter_metrics pooled;
    drafter_metrics_zero(&pooled, B);
    if (offline) {
        struct drafter *d2 = ckpt ? export_load_checkpoint(ckpt, target, vocab, total + B + 1, max_new, NULL, err,
                                                           sizeof err)
                                  : export_load_dir(exp_dir, target, total + B + 1, max_new, err, sizeof err);
        if (!d2) DIE("%s", err);
        struct eval_drafter e2;
        LIB_CHECK(eval_drafter_init(&e2, d2, err, sizeof err), err);
        for (int i = 0; i < np; i++) {
            int n = p[i].n + max_new, H = et.H, k = et.k;
            LIB_CHECK(eval_target_forward(&et, outs[i], n, n, NULL, err, sizeof err), err);
            for (int t = 0; t < n; t++)
                for (int q = 0; q < k; q++)
                    memcpy(e2.hidden + ((size_t)t * k + q) * H, et.states + ((size_t)q * n + t) * H,
                           sizeof(float) * (size_t)H);
            uint8_t *mask = calloc((size_t)n, 1);
            int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *doc = calloc((size_t)n, sizeof(int32_t));
            ALLOC_CHECK(mask);
            ALLOC_CHECK(pos);
            ALLOC_CHECK(doc);
            for (int t = 0; t < n; t++) {
                pos[t] = t;
                mask[t] = t >= p[i].n - 1;   /* the anchors: the last prompt token and the generated ones */
            }
            struct drafter_batch b = {n, n + B, outs[i], mask, pos, doc, e2.hidden, et.last};
            struct drafter_metrics m;
            LIB_CHECK(drafter_step(d2, &b, 0, (uint64_t)i, 0, &m, err, sizeof err), err);
            drafter_metrics_add(&pooled, &m);
            free(mask);
            free(pos);
            free(doc);
        }
        eval_drafter_free(&e2);
        drafter_free(d2);
    }
    double tau = eval_stats_tau(&s), sim = 1.0 + drafter_metrics_eal_marginal(&pooled);
    double tf = pooled.eal_count ? pooled.eal_sum / (double)pooled.eal_count : 0;
    if (temperature > 0)
        printf("dflash-eval: %lld responses, %lld rounds, block %d: tau %.4f (micro %.4f); sampled at temperature %g, "
               "top-p %g\n", (long long)s.responses, (long long)s.rounds, B, tau, eval_stats_tau_micro(&s),
               temperature, top_p);
    else
        printf("dflash-eval: %lld responses, %lld rounds, block %d: tau %.4f (micro %.4f); speculative == greedy on "
               "every token\n", (long long)s.responses, (long long)s.rounds, B, tau, eval_stats_tau_micro(&s));
    if (n_sets > 1 || strcmp(set_names[0], "all")) {
        printf("  tau per prompt set:");
        for (int k = 0; k < n_sets; k++)
            printf(" %s %.4f (%lld)", set_names[k], eval_stats_tau(&per_set[k]), (long long)per_set[k].responses);
        printf("\n");
    }
    double speedup = t_spec > 0 ? t_plain / t_spec : 0;
    printf("  speed-up over plain decoding: %.2fx (%lld tokens: speculative %.1f s = %.1f tok/s, plain %.1f s = %.1f "
           "tok/s; %s, drafter %s, batch %d, %s)\n", speedup, (long long)gen_tokens, t_spec,
           t_spec > 0 ? gen_tokens / t_spec : 0, t_plain, t_plain > 0 ? gen_tokens / t_plain : 0,
           no_cache ? "no KV cache" : "KV cache", dcached ? "cached" : "uncached", no_cache ? 1 : batch, device);
    printf("  tau histogram (1..%d):", B);
    for (int i = 1; i <= B; i++) printf(" %lld", (long long)s.hist[i]);
    printf("\n  acceptance at position (1..%d):", B - 1);
    for (int j = 1; j < B; j++) printf(" %.3f", s.rounds ? (double)s.at_pos[j] / (double)s.rounds : 0.0);
    printf("\n");
    if (offline)
        printf("  offline estimate: simulated tau 1 + sum prod acc = %.4f, teacher-forced accepted length %.4f "
               "(%lld anchors)\n", sim, tf, (long long)pooled.eal_count);
    double train_sim = 0;
    int train_n = train_metrics ? train_metrics_eal(train_metrics, 10, &train_sim) : 0;
    if (train_metrics && !train_n) DIE("%s: no dflash-train record with eal_marginal", train_metrics);
    if (train_n)
        printf("  training metrics (last %d steps of %s): simulated tau 1 + eal_marginal = %.4f\n", train_n,
               train_metrics, 1 + train_sim);
    if (out_path) {
        json_t *h = json_array(), *ap = json_array(), *acc = json_array();
        for (int i = 1; i <= B; i++) json_array_append_new(h, json_integer(s.hist[i]));
        for (int j = 1; j < B; j++)
            json_array_append_new(ap, json_real(s.rounds ? (double)s.at_pos[j] / (double)s.rounds : 0.0));
        for (int j = 0; j < B; j++)
            json_array_append_new(acc, json_real(pooled.total[j] ? (double)pooled.correct[j] / pooled.total[j] : 0.0));
        json_t *j = json_pack("{s:I, s:I, s:i, s:f, s:f, s:o, s:o, s:b, s:f, s:f, s:o}", "responses",
                              (json_int_t)s.responses, "rounds", (json_int_t)s.rounds, "block_size", B, "tau", tau,
                              "tau_micro", eval_stats_tau_micro(&s), "tau_histogram", h, "acceptance_at_pos", ap,
                              "matches_greedy", 1, "offline_simulated_tau", sim, "offline_teacher_forced_tau", tf,
                              "offline_position_acc", acc);
        if (train_n) json_object_set_new(j, "train_simulated_tau", json_real(1 + train_sim));
        json_t *sets = json_object();
        for (int k = 0; k < n_sets; k++)
            json_object_set_new(sets, set_names[k], json_pack("{s:I, s:f}", "responses",
                                                              (json_int_t)per_set[k].responses, "tau",
                                                              eval_stats_tau(&per_set[k])));
        json_object_set_new(j, "sets", sets);
        json_object_set_new(j, "matches_greedy", json_boolean(temperature <= 0));
        json_object_set_new(j, "temperature", json_real(temperature));
        json_object_set_new(j, "kv_cache", json_boolean(!no_cache));
        json_object_set_new(j, "drafter_cache", json_boolean(dcached));
        json_object_set_new(j, "device", json_string(dev >= 0 ? device : "cpu"));
        json_object_set_new(j, "speedup", json_real(speedup));
        json_object_set_new(j, "spec_seconds", json_real(t_spec));
        json_object_set_new(j, "plain_seconds", json_real(t_plain));
        json_object_set_new(j, "generated_tokens", json_integer(gen_tokens));
        char *text = json_dumps(j, JSON_INDENT(2));
        json_decref(j);
        ALLOC_CHECK(text);
        LIB_CHECK(fs_write_atomic(out_path, text, strlen(text), err, sizeof err), err);
        free(text);
    }
    for (int i = 0; i < np; i++) {
        free(p[i].ids);
        free(outs[i]);
        free(spec[i]);
    }
    for (int k = 0; k < n_sets; k++) free(set_names[k]);
    free(p);
    free(outs);
    free(spec);
    free(len_o);
    free(len_s);
    eval_target_close(&et);
    return 0;
}
