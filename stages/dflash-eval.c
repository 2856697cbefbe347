/*
 * stages/dflash-eval.c — measure acceptance directly: greedy speculative decoding with the frozen target and a
 * drafter (a checkpoint or an export) on a prompt set, checked token for token against plain greedy decoding (issue 17 item 3;
 * stages/export/eval.h).
 *
 *   dflash-eval --target-model DIR --ckpt CKPT | --drafter EXPORT_DIR --prompts FILE [--max-new 32] [--skip N] [--limit N] [--out FILE]
 *
 * Prompts: JSONL, one per line, either a JSON array of token ids or an object with "input_ids" (a training row:
 * with a "loss_mask", the prompt is the tokens before the first supervised one). CPU only, no KV cache (every
 * round recomputes the target over the prefix): meant for the tiny model and small sets.
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
#include "export/eval.h"
#include "export/export.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct prompt { int32_t *ids; int n; };

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
        if (n == cap_p) {
            cap_p = cap_p ? 2 * cap_p : 16;
            p = realloc(p, sizeof *p * (size_t)cap_p);
            ALLOC_CHECK(p);
        }
        p[n].ids = malloc(sizeof(int32_t) * (size_t)m);
        ALLOC_CHECK(p[n].ids);
        p[n].n = m;
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

int main(int argc, char **argv) {
    log_init("dflash-eval");
    const char *target = NULL, *ckpt = NULL, *exp_dir = NULL, *prompts = NULL, *out_path = NULL, *vocab = NULL,
               *train_metrics = NULL;
    int max_new = 32, skip = 0, limit = 0, max_prompt = 0, offline = 1;
    struct flag table[] = {
        {"target-model", FLAG_STRING, &target, "the target's Hugging Face directory", 1, 0},
        {"ckpt", FLAG_STRING, &ckpt, "the drafter: a dflash-train checkpoint (RUN/checkpoints/step-N.ckpt)", 1, 0},
        {"drafter", FLAG_STRING, &exp_dir, "the drafter as an export directory (dflash-export, either layout; bf16 "
         "weights) instead of --ckpt", 1, 0},
        {"draft-vocab", FLAG_STRING, &vocab, "t2d.npy / d2t.npy directory when the checkpoint's vocabulary is pruned",
         1, 0},
        {"prompts", FLAG_STRING, &prompts, "JSONL: token-id arrays, or rows with input_ids (+ loss_mask: the prompt "
         "ends before the first supervised token)", 1, 0},
        {"max-new", FLAG_INT, &max_new, "tokens to generate per prompt", 1, 1 << 16},
        {"max-prompt-tokens", FLAG_INT, &max_prompt, "cut prompts to their first N tokens (0: whole)", 0, 1 << 20},
        {"skip", FLAG_INT, &skip, "skip the first N prompts (held-out rows after the training ones)", 0, 1 << 30},
        {"limit", FLAG_INT, &limit, "at most N prompts (0: all)", 0, 1 << 30},
        {"offline", FLAG_BOOL, &offline, "also compute the offline (teacher-forced) estimate on the same responses",
         1, 0},
        {"train-metrics", FLAG_STRING, &train_metrics, "RUN/metrics.jsonl of the training run: also print the "
         "trainer's estimate 1 + eal_marginal (mean of its last 10 steps) beside the measured tau", 1, 0},
        {"out", FLAG_STRING, &out_path, "also write the results as JSON here", 1, 0},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--target-model DIR --ckpt CKPT --prompts FILE [--max-new N] [--out FILE]",
                        "Greedy speculative decoding with the target and a drafter: acceptance length τ, its "
                        "histogram and per-position acceptance, checked against plain greedy decoding.", NULL, 0);
    if (!target || !prompts || !ckpt == !exp_dir)
        DIE("--target-model, --prompts and one of --ckpt / --drafter are required (see --help)");
    char err[2048];
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
    LIB_CHECK(eval_target_open(&et, target, total + B, zl, dc->k, err, sizeof err), err);
    struct eval_drafter ed;
    LIB_CHECK(eval_drafter_init(&ed, d, err, sizeof err), err);
    struct eval_stats s;
    eval_stats_init(&s, B);
    int32_t *spec = malloc(sizeof(int32_t) * (size_t)(total + B)), *greedy = malloc(sizeof(int32_t) * (size_t)total);
    int32_t **outs = calloc((size_t)np, sizeof *outs);
    ALLOC_CHECK(spec);
    ALLOC_CHECK(greedy);
    ALLOC_CHECK(outs);
    for (int i = 0; i < np; i++) {
        LIB_CHECK(eval_speculative(&et, p[i].ids, p[i].n, max_new, B, eval_drafter_propose, &ed, spec, &s, err,
                                   sizeof err), err);
        LIB_CHECK(eval_greedy(&et, p[i].ids, p[i].n, max_new, greedy, err, sizeof err), err);
        for (int t = 0; t < p[i].n + max_new; t++)
            if (spec[t] != greedy[t]) {
                fprintf(stderr, "dflash-eval: BUG: prompt %d: speculative decoding gives token %d at position %d, "
                        "greedy decoding %d\n", i + skip, spec[t], t, greedy[t]);
                return 1;
            }
        outs[i] = malloc(sizeof(int32_t) * (size_t)(p[i].n + max_new));
        ALLOC_CHECK(outs[i]);
        memcpy(outs[i], greedy, sizeof(int32_t) * (size_t)(p[i].n + max_new));
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
    printf("dflash-eval: %lld responses, %lld rounds, block %d: tau %.4f (micro %.4f); speculative == greedy on "
           "every token\n", (long long)s.responses, (long long)s.rounds, B, tau, eval_stats_tau_micro(&s));
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
        char *text = json_dumps(j, JSON_INDENT(2));
        json_decref(j);
        ALLOC_CHECK(text);
        LIB_CHECK(fs_write_atomic(out_path, text, strlen(text), err, sizeof err), err);
        free(text);
    }
    for (int i = 0; i < np; i++) {
        free(p[i].ids);
        free(outs[i]);
    }
    free(p);
    free(outs);
    free(spec);
    free(greedy);
    eval_target_close(&et);
    return 0;
}
