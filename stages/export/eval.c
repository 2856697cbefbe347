/*
 * stages/export/eval.c — speculative decoding and acceptance statistics (stages/export/eval.h).
 */
#include "export/eval.h"

#include "core/err.h"
#include "core/safetensors.h"
#include "model/weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int eval_target_open(struct eval_target *et, const char *target_dir, int max_tokens, const int *zlab_ids, int k,
                     char *err, int err_len) {
    memset(et, 0, sizeof *et);
    if (k < 1 || k > TARGET_MAX_CAPTURE) return err_fail(err, err_len, "eval: %d captured layers", k);
    struct target_options o;
    target_options_defaults(&o);
    o.cuda_device = -1;
    o.max_tokens = max_tokens;
    o.n_capture = k;
    memcpy(o.capture, zlab_ids, sizeof(int) * (size_t)k);
    et->t = target_load(target_dir, &o, err, err_len);
    if (!et->t) return -1;
    et->cfg = target_config(et->t);
    et->H = et->cfg->hidden_size;
    et->V = et->cfg->vocab_size;
    et->k = k;
    et->norm = malloc(sizeof(float) * (size_t)et->H);
    et->lm_head = malloc(sizeof(float) * (size_t)et->V * (size_t)et->H);
    et->states = malloc(sizeof(float) * (size_t)k * (size_t)max_tokens * (size_t)et->H);
    et->last = malloc(sizeof(float) * (size_t)max_tokens * (size_t)et->H);
    et->xn = malloc(sizeof(float) * (size_t)et->H);
    et->logits = malloc(sizeof(float) * (size_t)et->V);
    if (!et->norm || !et->lm_head || !et->states || !et->last || !et->xn || !et->logits) {
        eval_target_close(et);
        return err_fail(err, err_len, "%s: out of memory for the eval buffers", target_dir);
    }
    struct hf_weights w;
    if (hf_weights_open(&w, target_dir, err, err_len)) {
        eval_target_close(et);
        return -1;
    }
    int64_t sh[2] = {et->V, et->H}, sn[1] = {et->H};
    int rc = weights_get_f32(&w, "model.norm.weight", 1, sn, et->norm, err, err_len);
    if (!rc)
        rc = weights_get_f32(&w, et->cfg->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", 2, sh,
                             et->lm_head, err, err_len);
    hf_weights_close(&w);
    if (rc) eval_target_close(et);
    return rc;
}

void eval_target_close(struct eval_target *et) {
    target_free(et->t);
    free(et->norm);
    free(et->lm_head);
    free(et->states);
    free(et->last);
    free(et->xn);
    free(et->logits);
    memset(et, 0, sizeof *et);
}

void eval_target_logits(struct eval_target *et, const float *x, float *logits) {
    int H = et->H;
    double ss = 0;
    for (int c = 0; c < H; c++) ss += (double)x[c] * x[c];
    float r = (float)(1.0 / sqrt(ss / H + et->cfg->rms_norm_eps));
    for (int c = 0; c < H; c++) et->xn[c] = x[c] * r * et->norm[c];
    for (int v = 0; v < et->V; v++) {
        const float *w = et->lm_head + (size_t)v * H;
        float s = 0;
        for (int c = 0; c < H; c++) s += w[c] * et->xn[c];
        logits[v] = s;
    }
}

/* The greedy next token after a last-layer state: argmax of the logits (first maximum on ties). */
static int32_t greedy_next(struct eval_target *et, const float *x) {
    eval_target_logits(et, x, et->logits);
    int32_t best = 0;
    for (int v = 1; v < et->V; v++)
        if (et->logits[v] > et->logits[best]) best = v;
    return best;
}

int eval_target_forward(struct eval_target *et, const int32_t *tokens, int n, int from, int32_t *pred, char *err,
                        int err_len) {
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    if (!pos) return err_fail(err, err_len, "eval: out of memory");
    for (int i = 0; i < n; i++) pos[i] = i;
    int32_t cu[2] = {0, n};
    struct target_batch b = {0, n, 1, tokens, pos, cu};
    /* states come back as k blocks of [n, H] */
    int rc = target_forward(et->t, &b, et->states, et->last, err, err_len);
    free(pos);
    if (rc) return -1;
    if (pred)
        for (int i = from < 0 ? 0 : from; i < n; i++) pred[i] = greedy_next(et, et->last + (size_t)i * et->H);
    return 0;
}

/* ---------------------------------------------------------------- the drafter proposer */

int eval_drafter_init(struct eval_drafter *ed, struct drafter *d, char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    ed->d = d;
    ed->hidden = malloc(sizeof(float) * (size_t)c->T_max * (size_t)c->k * (size_t)c->H);
    if (!ed->hidden) return err_fail(err, err_len, "eval: out of memory for the drafter's features");
    return 0;
}

void eval_drafter_free(struct eval_drafter *ed) {
    free(ed->hidden);
    ed->hidden = NULL;
}

int eval_drafter_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *err,
                         int err_len) {
    struct eval_drafter *ed = ctx;
    const struct drafter_config *cfg = drafter_config_of(ed->d);
    int H = cfg->H, k = cfg->k;
    if (B != cfg->B) return err_fail(err, err_len, "eval: block size %d, the drafter's is %d", B, cfg->B);
    if (n + B > cfg->T_max)
        return err_fail(err, err_len, "eval: a sequence of %d tokens + block %d exceeds the drafter's plan (%d)", n, B,
                        cfg->T_max);
    if (k != et->k || H != et->H) return err_fail(err, err_len, "eval: the target captures %d x %d, the drafter "
                                                  "wants %d x %d", et->k, et->H, k, H);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < k; i++)
            memcpy(ed->hidden + ((size_t)t * k + i) * H, et->states + ((size_t)i * n + t) * H, sizeof(float) * (size_t)H);
    uint8_t *mask = calloc((size_t)n, 1);
    int32_t *pos = malloc(sizeof *pos * (size_t)n), *doc = malloc(sizeof *doc * (size_t)n);
    if (!mask || !pos || !doc) {
        free(mask);
        free(pos);
        free(doc);
        return err_fail(err, err_len, "eval: out of memory");
    }
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        doc[t] = 0;
    }
    mask[n - 1] = 1;   /* the only anchor candidate: the last committed token */
    struct drafter_batch b = {n, n + B, c, mask, pos, doc, ed->hidden, et->last};
    struct drafter_metrics m;
    int rc = drafter_step(ed->d, &b, 0, 0, 0, &m, err, err_len);
    free(mask);
    free(pos);
    free(doc);
    if (rc) return -1;
    struct drafter_last ls;
    drafter_last_step(ed->d, &ls);
    if (!ls.valid[0] || ls.anchors[0] != n - 1)
        return err_fail(err, err_len, "eval: the drafter did not anchor at the last committed token (%d)", n - 1);
    for (int j = 1; j < B; j++) {
        int32_t p = ls.pred[j];
        draft[j - 1] = ls.d2t ? (int32_t)(p + ls.d2t[p]) : p;
    }
    return 0;
}

/* ---------------------------------------------------------------- decoding */

void eval_stats_init(struct eval_stats *s, int B) {
    memset(s, 0, sizeof *s);
    s->B = B;
}

double eval_stats_tau(const struct eval_stats *s) { return s->responses ? s->tau_sum / (double)s->responses : 0; }

double eval_stats_tau_micro(const struct eval_stats *s) {
    return s->rounds ? 1.0 + (double)s->accepted / (double)s->rounds : 0;
}

int eval_speculative(struct eval_target *et, const int32_t *prompt, int P, int max_new, int B, eval_propose_fn fn,
                     void *ctx, int32_t *out, struct eval_stats *s, char *err, int err_len) {
    if (P < 1) return err_fail(err, err_len, "eval: an empty prompt");
    if (B < 2 || B > DRAFTER_MAX_B) return err_fail(err, err_len, "eval: block size %d", B);
    int end = P + max_new;
    int32_t *seq = malloc(sizeof *seq * (size_t)(end + B)), *pred = malloc(sizeof *pred * (size_t)(end + B));
    int32_t draft[DRAFTER_MAX_B];
    if (!seq || !pred) {
        free(seq);
        free(pred);
        return err_fail(err, err_len, "eval: out of memory");
    }
    memcpy(out, prompt, sizeof *out * (size_t)P);
    int n = P, rc = 0;
    int64_t rounds = 0, tau_sum = 0;
    while (n < end && !rc) {
        /* the first committed token after the prompt is the target's own (no draft has context yet) */
        if (n == P) {
            rc = eval_target_forward(et, out, n, n - 1, pred, err, err_len);
            if (rc) break;
            out[n] = pred[n - 1];
            n++;
            continue;
        }
        rc = eval_target_forward(et, out, n, n, NULL, err, err_len);
        if (!rc) rc = fn(ctx, et, out, n, B, draft, err, err_len);
        if (rc) break;
        memcpy(seq, out, sizeof *seq * (size_t)n);
        memcpy(seq + n, draft, sizeof *seq * (size_t)(B - 1));
        rc = eval_target_forward(et, seq, n + B - 1, n - 1, pred, err, err_len);
        if (rc) break;
        int acc = 0;
        while (acc < B - 1 && draft[acc] == pred[n - 1 + acc]) acc++;
        for (int i = 0; i < acc && n + i < end; i++) out[n + i] = draft[i];
        if (n + acc < end) out[n + acc] = pred[n - 1 + acc];
        n += acc + 1;
        rounds++;
        tau_sum += acc + 1;
        s->hist[acc + 1]++;
        for (int j = 1; j <= acc; j++) s->at_pos[j]++;
        s->accepted += acc;
    }
    free(seq);
    free(pred);
    if (rc) return -1;
    s->rounds += rounds;
    if (rounds) {
        s->responses++;
        s->tau_sum += (double)tau_sum / (double)rounds;
    }
    return 0;
}

int eval_greedy(struct eval_target *et, const int32_t *prompt, int P, int max_new, int32_t *out, char *err,
                int err_len) {
    int32_t *pred = malloc(sizeof *pred * (size_t)(P + max_new));
    if (!pred) return err_fail(err, err_len, "eval: out of memory");
    memcpy(out, prompt, sizeof *out * (size_t)P);
    int rc = 0;
    for (int n = P; n < P + max_new && !rc; n++) {
        rc = eval_target_forward(et, out, n, n - 1, pred, err, err_len);
        if (!rc) out[n] = pred[n - 1];
    }
    free(pred);
    return rc;
}
