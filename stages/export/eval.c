/*
 * stages/export/eval.c — speculative decoding and acceptance statistics (stages/export/eval.h).
 */
#include "export/eval.h"

#include "core/err.h"
#include "core/safetensors.h"
#include "model/decode.h"
#include "model/weights.h"

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int eval_target_open(struct eval_target *et, const char *target_dir, int max_tokens, const int *zlab_ids, int k,
                     char *err, int err_len) {
    return eval_target_open_dev(et, target_dir, max_tokens, zlab_ids, k, -1, err, err_len);
}

int eval_target_open_dev(struct eval_target *et, const char *target_dir, int max_tokens, const int *zlab_ids, int k,
                         int cuda_device, char *err, int err_len) {
    memset(et, 0, sizeof *et);
    if (k < 1 || k > TARGET_MAX_CAPTURE) return err_fail(err, err_len, "eval: %d captured layers", k);
    struct target_options o;
    target_options_defaults(&o);
    o.cuda_device = cuda_device;
    o.max_tokens = max_tokens;
    o.n_capture = k;
    memcpy(o.capture, zlab_ids, sizeof(int) * (size_t)k);
    et->ctx_slot = -1;
    et->t = target_load(target_dir, &o, err, err_len);
    if (!et->t) return -1;
    et->dev = cuda_device;
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
    et->probs = malloc(sizeof(double) * (size_t)et->V);
    et->cand = malloc(sizeof(int32_t) * (size_t)et->V);
    if (cuda_device >= 0) {   /* target_forward writes bf16 on a GPU target: host staging, widened after */
        et->states16 = malloc(sizeof(bf16) * (size_t)k * (size_t)max_tokens * (size_t)et->H);
        et->last16 = malloc(sizeof(bf16) * (size_t)max_tokens * (size_t)et->H);
    }
    if (!et->norm || !et->lm_head || !et->states || !et->last || !et->xn || !et->logits || !et->probs || !et->cand ||
        (cuda_device >= 0 && (!et->states16 || !et->last16))) {
        eval_target_close(et);
        return err_fail(err, err_len, "%s: out of memory for the eval buffers", target_dir);
    }
    struct hf_weights w;
    if (hf_weights_open(&w, target_dir, err, err_len)) {
        eval_target_close(et);
        return -1;
    }
    int64_t sh[2] = {et->V, et->H}, sn[1] = {et->H};
    /* Qwen3.5 / 3.6: the text model's tensors may sit under model.language_model., and the final norm is
     * Qwen3_5RMSNorm (weight 1 + w), as target.c loads every other norm of it */
    int hyb = et->cfg->arch == HF_ARCH_QWEN3_5;
    const char *pre = hyb && et->cfg->nested ? "model.language_model." : "model.";
    char nn[96], en[96];
    snprintf(nn, sizeof nn, "%snorm.weight", pre);
    snprintf(en, sizeof en, "%sembed_tokens.weight", pre);
    int rc = weights_get_f32(&w, nn, 1, sn, et->norm, err, err_len);
    if (!rc && hyb)
        for (int c = 0; c < et->H; c++) et->norm[c] += 1.0f;
    if (!rc)
        rc = weights_get_f32(&w, et->cfg->tie_word_embeddings ? en : "lm_head.weight", 2, sh, et->lm_head, err,
                             err_len);
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
    free(et->probs);
    free(et->cand);
    decode_free(et->dc);
    free(et->hist);
    free(et->hist_last);
    free(et->step_states);
    free(et->step_last);
#ifdef DFLASH_CUDA
    if (et->logits_pinned) cudaFreeHost(et->step_logits);
    else
#endif
        free(et->step_logits);
    free(et->step_ids);
    free(et->states16);
    free(et->last16);
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
    return eval_argmax(et->logits, et->V);
}

int eval_target_forward(struct eval_target *et, const int32_t *tokens, int n, int from, int32_t *pred, char *err,
                        int err_len) {
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    if (!pos) return err_fail(err, err_len, "eval: out of memory");
    for (int i = 0; i < n; i++) pos[i] = i;
    int32_t cu[2] = {0, n};
    struct target_batch b = {0, n, 1, tokens, pos, cu};
    /* states come back as k blocks of [n, H] */
    int rc = et->dev >= 0 ? target_forward(et->t, &b, et->states16, et->last16, err, err_len)
                          : target_forward(et->t, &b, et->states, et->last, err, err_len);
    free(pos);
    if (rc) return -1;
    if (et->dev >= 0) {
        floats_from_bf16(et->states, et->states16, (size_t)et->k * (size_t)n * (size_t)et->H);
        floats_from_bf16(et->last, et->last16, (size_t)n * (size_t)et->H);
    }
    et->ctx_states = et->states;
    et->ctx_last = et->last;
    et->ctx_rows = n;
    et->ctx_slot = -1;
    if (pred)
        for (int i = from < 0 ? 0 : from; i < n; i++) pred[i] = greedy_next(et, et->last + (size_t)i * et->H);
    return 0;
}

/* ---------------------------------------------------------------- the drafter proposer */

int eval_drafter_init(struct eval_drafter *ed, struct drafter *d, char *err, int err_len) {
    return eval_drafter_init_dev(ed, d, -1, err, err_len);
}

int eval_drafter_init_dev(struct eval_drafter *ed, struct drafter *d, int cuda_device, char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    memset(ed, 0, sizeof *ed);
    ed->d = d;
    if (cuda_device >= 0) {
#ifdef DFLASH_CUDA
        cudaStream_t s;
        cudaError_t e = cudaSetDevice(cuda_device);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        if (e != cudaSuccess) return err_fail(err, err_len, "eval: cuda:%d: %s", cuda_device, cudaGetErrorString(e));
        ed->gpu = drafter_gpu_init(d, s, NULL, err, err_len);
        if (!ed->gpu) {
            cudaStreamDestroy(s);
            return -1;
        }
#else
        return err_fail(err, err_len, "eval: the drafter on cuda:%d in a build without CUDA", cuda_device);
#endif
    }
    ed->hidden = malloc(sizeof(float) * (size_t)c->T_max * (size_t)c->k * (size_t)c->H);
    if (!ed->hidden) return err_fail(err, err_len, "eval: out of memory for the drafter's features");
    return 0;
}

void eval_drafter_free(struct eval_drafter *ed) {
#ifdef DFLASH_CUDA
    drafter_cache_gpu_free(ed->gcache);
    ed->gcache = NULL;
    if (ed->gpu) {
        cudaStream_t s = drafter_gpu_stream(ed->gpu);
        drafter_gpu_free(ed->gpu);
        cudaStreamDestroy(s);
        ed->gpu = NULL;
    }
#endif
    free(ed->hidden);
    ed->hidden = NULL;
    drafter_cache_free(ed->cache);
    ed->cache = NULL;
}

int eval_gpu_drafter_cache_on(void) {
    const char *v = getenv("DFLASH_GPU_DRAFTER_CACHE");
    return v && !strcmp(v, "1");
}

int eval_drafter_enable_cache(struct eval_drafter *ed, int n_slots, int max_len, char *err, int err_len) {
    if (ed->cache || ed->gcache) return err_fail(err, err_len, "eval: the drafter cache is already planned");
    if (ed->gpu) {
#ifdef DFLASH_CUDA
        if (!eval_gpu_drafter_cache_on())
            return err_fail(err, err_len, "eval: the GPU drafter's cached proposal is off until it has run on a GPU "
                            "(DFLASH_GPU_DRAFTER_CACHE=1 turns it on)");
        ed->gcache = drafter_cache_gpu_init(ed->d, ed->gpu, n_slots, max_len, NULL, err, err_len);
        return ed->gcache ? 0 : -1;
#endif
    }
    ed->cache = drafter_cache_init(ed->d, n_slots, max_len, err, err_len);
    return ed->cache ? 0 : -1;
}

#ifdef DFLASH_CUDA
/* The proposal on the GPU: the batch eval_drafter_propose builds, through the device step; the block's argmaxes
 * (row j of block 0 = the draft for position n - 1 + j) come back with the anchor. */
static int propose_gpu(struct eval_drafter *ed, const struct drafter_batch *b, int B, int32_t *draft, char *err,
                       int err_len) {
    struct drafter_gpu *g = ed->gpu;
    if (drafter_gpu_load_batch(g, b, err, err_len)) return -1;
    struct drafter_metrics m;
    if (drafter_step_gpu(g, b->T, b->budget, 0, 0, 0, &m, err, err_len)) return -1;
    struct drafter_gpu_last gl;
    drafter_gpu_last_step(g, &gl);
    int32_t anchor, arg[2 * DRAFTER_MAX_B];
    uint8_t valid;
    cudaStream_t s = drafter_gpu_stream(g);
    cudaError_t e = cudaMemcpyAsync(&anchor, gl.anchors, 4, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(&valid, gl.valid, 1, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaMemcpyAsync(arg, gl.arg, sizeof(int32_t) * 2 * (size_t)B, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return err_fail(err, err_len, "eval: the GPU drafter's result: %s", cudaGetErrorString(e));
    if (!valid || anchor != b->T - 1)
        return err_fail(err, err_len, "eval: the GPU drafter did not anchor at the last committed token (%d)", b->T - 1);
    struct drafter_last ls;
    drafter_last_step(ed->d, &ls);   /* d2t only: the host drafter's pruned-vocabulary map */
    int first = drafter_draft_row0(drafter_config_of(ed->d));
    for (int j = 0; j < B - 1; j++) {
        int32_t p = arg[2 * (first + j)];
        draft[j] = ls.d2t ? (int32_t)(p + ls.d2t[p]) : p;
    }
    return 0;
}
#endif

int eval_drafter_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *err,
                         int err_len) {
    struct eval_drafter *ed = ctx;
    const struct drafter_config *cfg = drafter_config_of(ed->d);
    int H = cfg->H, k = cfg->k;
    if (B != cfg->B) return err_fail(err, err_len, "eval: block size %d, the drafter's is %d", B, cfg->B);
    if (k != et->k || H != et->H) return err_fail(err, err_len, "eval: the target captures %d x %d, the drafter "
                                                  "wants %d x %d", et->k, et->H, k, H);
    if (!et->ctx_states || et->ctx_rows < n) return err_fail(err, err_len, "eval: the proposer has no features");
#ifdef DFLASH_CUDA
    if (ed->gcache && !ed->no_cache && et->ctx_slot >= 0)
        return drafter_cache_gpu_propose(ed->gcache, et->ctx_slot, et->ctx_seq, c, n, et->ctx_states, et->ctx_rows,
                                         draft, err, err_len);
#endif
    if (!ed->gpu && !ed->no_cache && et->ctx_slot >= 0) {   /* bounded by the cache's plan, not T_max */
        if (!ed->cache && eval_drafter_enable_cache(ed, et->n_slots, et->max_len, err, err_len)) return -1;
        return drafter_cache_propose(ed->cache, et->ctx_slot, et->ctx_seq, c, n, et->ctx_states, et->ctx_rows, draft,
                                     err, err_len);
    }
    if (n + B > cfg->T_max)
        return err_fail(err, err_len, "eval: a sequence of %d tokens + block %d exceeds the drafter's plan (%d)", n, B,
                        cfg->T_max);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < k; i++)
            memcpy(ed->hidden + ((size_t)t * k + i) * H, et->ctx_states + ((size_t)i * et->ctx_rows + t) * H,
                   sizeof(float) * (size_t)H);
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
    struct drafter_batch b = {n, n + B, c, mask, pos, doc, ed->hidden, et->ctx_last};
    struct drafter_metrics m;
#ifdef DFLASH_CUDA
    if (ed->gpu) {
        int rc = propose_gpu(ed, &b, B, draft, err, err_len);
        free(mask);
        free(pos);
        free(doc);
        return rc;
    }
#endif
    int rc = drafter_step(ed->d, &b, 0, 0, 0, &m, err, err_len);
    free(mask);
    free(pos);
    free(doc);
    if (rc) return -1;
    struct drafter_last ls;
    drafter_last_step(ed->d, &ls);
    if (!ls.valid[0] || ls.anchors[0] != n - 1)
        return err_fail(err, err_len, "eval: the drafter did not anchor at the last committed token (%d)", n - 1);
    int first = drafter_draft_row0(cfg);
    for (int j = 0; j < B - 1; j++) {
        int32_t p = ls.pred[first + j];
        draft[j] = ls.d2t ? (int32_t)(p + ls.d2t[p]) : p;
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

/* ---------------------------------------------------------------- KV-cached, batched generation */

int eval_target_enable_cache(struct eval_target *et, int n_slots, int max_len, char *err, int err_len) {
    if (et->dc) return err_fail(err, err_len, "eval: the cache is already planned");
    int step = n_slots * DRAFTER_MAX_B > max_len ? n_slots * DRAFTER_MAX_B : max_len;
    et->dc = decode_init(et->t, n_slots, max_len, step, err, err_len);
    if (!et->dc) return -1;
    /* logits: the prefill's last row, or every row of a verification step (n_slots blocks) */
    int rows = n_slots * DRAFTER_MAX_B;
    if (decode_set_head(et->dc, et->norm, et->lm_head, rows, err, err_len)) return -1;
    size_t lb = sizeof(float) * (size_t)rows * (size_t)et->V;
#ifdef DFLASH_CUDA
    /* pinned on a GPU: a step's logits cross at the bus's speed, not through a pageable bounce buffer */
    if (et->dev >= 0 && cudaMallocHost((void **)&et->step_logits, lb) != cudaSuccess) {
        (void)cudaGetLastError();
        et->step_logits = NULL;
    }
    et->logits_pinned = et->step_logits != NULL;
#endif
    if (!et->step_logits) et->step_logits = malloc(lb);
    et->step_ids = malloc(sizeof(int32_t) * (size_t)rows);
    if (!et->step_logits || !et->step_ids)
        return err_fail(err, err_len, "eval: out of memory for %d rows of logits", rows);
    et->n_slots = n_slots;
    et->max_len = max_len;
    et->max_step = step;
    size_t H = (size_t)et->H, k = (size_t)et->k;
    /* zeroed: rows past a prompt's committed features are read (never used) by the proposer's copy */
    et->hist = calloc((size_t)n_slots * k * (size_t)max_len * H, sizeof(float));
    et->hist_last = calloc((size_t)n_slots * (size_t)max_len * H, sizeof(float));
    et->step_states = malloc(sizeof(float) * k * (size_t)step * H);
    et->step_last = malloc(sizeof(float) * (size_t)step * H);
    if (!et->hist || !et->hist_last || !et->step_states || !et->step_last)
        return err_fail(err, err_len, "eval: out of memory for the features of %d prompts x %d tokens", n_slots,
                        max_len);
    return 0;
}

static double uniform01(uint64_t *s) { return (double)(kernels_rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }

/* The logits after row r of the last decode_extend. CPU: computed for that row alone when asked (a rejected
 * draft's later rows are never computed). GPU, a decoding step (extend with all_rows): every row of the step at
 * once on the device, the first time one is asked (one transfer), then served from et->step_logits; a prefill:
 * the asked row alone. */
static const float *row_logits(struct eval_target *et, int r, char *err, int err_len) {
    if (et->dev < 0) return decode_logits(et->dc, 1, &r, et->logits, err, err_len) ? NULL : et->logits;
    if (!et->logits_all) {   /* a prefill: only its last row is asked; one row crosses */
        if (!et->logits_ready || et->logits_first != r) {
            if (decode_logits(et->dc, 1, &r, et->step_logits, err, err_len)) return NULL;
            et->logits_first = r;
            et->logits_ready = 1;
        }
        return et->step_logits;
    }
    if (!et->logits_ready) {
        int32_t rows[et->step_T];
        for (int i = 0; i < et->step_T; i++) rows[i] = i;
        if (decode_logits(et->dc, et->step_T, rows, et->step_logits, err, err_len)) return NULL;
        et->logits_ready = 1;
    }
    return et->step_logits + (size_t)r * et->V;
}

/* The greedy pick after row r of the last decode_extend: eval_argmax of row_logits. On a GPU decoding step, every
 * row's pick at once on the device (decode_argmax: the same logits, the same first-maximum pick), only the ids
 * crossing; the logits of the step are then not fetched unless asked. */
static int row_argmax(struct eval_target *et, int r, int32_t *pick, char *err, int err_len) {
    if (et->dev >= 0 && et->logits_all) {
        if (!et->ids_ready) {
            int32_t rows[et->step_T];
            for (int i = 0; i < et->step_T; i++) rows[i] = i;
            if (decode_argmax(et->dc, et->step_T, rows, et->step_ids, err, err_len)) return -1;
            et->ids_ready = 1;
        }
        *pick = et->step_ids[r];
        return 0;
    }
    const float *lg = row_logits(et, r, err, err_len);
    if (!lg) return -1;
    *pick = eval_argmax(lg, et->V);
    return 0;
}

int32_t eval_argmax(const float *x, int n) {
    if (isnan(x[0])) return 0;
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = x[0];
    int v = 0;
    for (; v + 8 <= n; v += 8)
        for (int j = 0; j < 8; j++) m[j] = x[v + j] > m[j] ? x[v + j] : m[j];
    float best = m[0];
    for (int j = 1; j < 8; j++) best = m[j] > best ? m[j] : best;
    for (; v < n; v++) best = x[v] > best ? x[v] : best;
    for (v = 0; v < n; v++)
        if (x[v] == best) break;
    return v;
}

/* Argmax of a logits row (first maximum on ties). */
static int32_t argmax_of(const struct eval_target *et, const float *logits) { return eval_argmax(logits, et->V); }

/* The target's distribution for a logits row at temperature T, restricted to the top-p nucleus, into et->probs
 * (normalised). */
static void target_probs(struct eval_target *et, const float *logits, double T, double top_p) {
    int V = et->V, best = eval_argmax(logits, V);
    double z = 0;
    for (int v = 0; v < V; v++) z += et->probs[v] = exp((double)(logits[v] - logits[best]) / T);
    for (int v = 0; v < V; v++) et->probs[v] /= z;
    if (top_p > 0 && top_p < 1) {
        /* the smallest set of most likely tokens whose mass reaches top_p: find the probability threshold by
         * bisection on the mass above it (no sort). Only tokens at or above lo can count again, so the scan runs
         * over a shrinking candidate list (in token order: the sums are the full scan's, bit for bit); a peaked
         * distribution over a 150K vocabulary then costs a few passes, not 60. */
        int n = 0;
        for (int v = 0; v < V; v++) et->cand[n++] = v;
        double lo = 0, hi = 1;
        for (int it = 0; it < 60; it++) {
            double mid = 0.5 * (lo + hi), m = 0;
            for (int i = 0; i < n; i++)
                if (et->probs[et->cand[i]] >= mid) m += et->probs[et->cand[i]];
            if (m >= top_p) {
                lo = mid;
                int k = 0;
                for (int i = 0; i < n; i++)
                    if (et->probs[et->cand[i]] >= lo) et->cand[k++] = et->cand[i];
                n = k;
            } else {
                hi = mid;
            }
        }
        z = 0;
        for (int v = 0; v < V; v++) {
            if (et->probs[v] < lo) et->probs[v] = 0;
            z += et->probs[v];
        }
        for (int v = 0; v < V; v++) et->probs[v] /= z;
    }
}

/* A draw from et->probs, with token `except` removed (-1: none) and the rest renormalised. */
static int32_t draw(struct eval_target *et, uint64_t *rng, int32_t except) {
    double z = 0;
    for (int v = 0; v < et->V; v++)
        if (v != except) z += et->probs[v];
    double u = uniform01(rng) * z, acc = 0;
    int32_t last = -1;
    for (int v = 0; v < et->V; v++) {
        if (v == except || et->probs[v] <= 0) continue;
        last = v;
        if ((acc += et->probs[v]) > u) return v;
    }
    return last >= 0 ? last : 0;
}

struct gen_seq {
    int idx, slot, n, end, done;
    int64_t seq;   /* et->ctx_seq of this prompt's stay in its slot */
    int64_t rounds, tau_sum;
    uint64_t rng;
};

static int is_stop(const struct eval_gen_opts *o, int32_t t) {
    for (int i = 0; i < o->n_stop; i++)
        if (o->stop[i] == t) return 1;
    return 0;
}

/* Commit token t at position q of sequence g; marks it done at a stop token or at its end. */
static void commit(struct gen_seq *g, int32_t *out, const struct eval_gen_opts *o, int32_t t) {
    if (g->done) return;
    out[g->n++] = t;
    if (g->n >= g->end || is_stop(o, t)) g->done = 1;
}

/* Copy `rows` feature rows of the last step (from step row r0) into sequence g's history at row h0. */
static void keep_features(struct eval_target *et, const struct gen_seq *g, int r0, int h0, int rows) {
    size_t H = (size_t)et->H, L = (size_t)et->max_len;
    for (int i = 0; i < et->k; i++)
        memcpy(et->hist + (((size_t)g->slot * et->k + i) * L + h0) * H,
               et->step_states + ((size_t)i * et->max_step + r0) * H, sizeof(float) * H * (size_t)rows);
    memcpy(et->hist_last + ((size_t)g->slot * L + h0) * H, et->step_last + (size_t)r0 * H,
           sizeof(float) * H * (size_t)rows);
}

/* One decode_extend; its k blocks of T state rows are re-spaced to max_step rows (keep_features' stride).
 * features = 0: the proposer needs no features (plain decoding), so none cross from the device. */
static int extend(struct eval_target *et, int n_seq, const int *slots, const int32_t *ids, const int32_t *cu,
                  int features, int all_rows, char *err, int err_len) {
    int T = cu[n_seq];
    if (all_rows && T > et->n_slots * DRAFTER_MAX_B)
        return err_fail(err, err_len, "eval: a step of %d rows exceeds the logits plan (%d)", T,
                        et->n_slots * DRAFTER_MAX_B);
    et->logits_ready = 0;
    et->ids_ready = 0;
    et->logits_all = all_rows;
    et->step_T = T;
    if (decode_extend(et->dc, n_seq, slots, ids, cu, features ? et->step_states : NULL,
                      features ? et->step_last : NULL, err, err_len))
        return -1;
    for (int i = et->k - 1; features && i > 0 && T < et->max_step; i--)   /* highest block first: no overlap */
        memmove(et->step_states + (size_t)i * et->max_step * et->H, et->step_states + (size_t)i * T * et->H,
                sizeof(float) * (size_t)T * et->H);
    return 0;
}

static int generate_group(struct eval_target *et, int n, const int32_t *const *prompts, const int *P,
                          const struct eval_gen_opts *o, int32_t **outs, int *out_len, struct eval_stats *s,
                          int first, char *err, int err_len) {
    struct gen_seq g[et->n_slots];
    int B = o->fn ? o->B : 1, sampled = o->temperature > 0;
    int slots[et->n_slots];
    int32_t cu[et->n_slots + 1];
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)et->max_step);
    if (!ids) return err_fail(err, err_len, "eval: out of memory");
    int rc = 0;
    /* prefill, one prompt per step (a prompt may be as long as the plan) */
    for (int i = 0; i < n && !rc; i++) {
        int idx = first + i;
        g[i] = (struct gen_seq){idx, i, P[idx], P[idx] + o->max_new, o->max_new <= 0, et->seq_next++, 0, 0, 0};
        g[i].rng = kernels_mix64(o->seed + (uint64_t)(o->index_base + idx + 1) * KERNELS_RNG_GAMMA);
        memcpy(outs[idx], prompts[idx], sizeof(int32_t) * (size_t)P[idx]);
        if (P[idx] < 1) {
            rc = err_fail(err, err_len, "eval: prompt %lld is empty", (long long)(o->index_base + idx));
            break;
        }
        if (P[idx] + o->max_new + B > et->max_len) {
            rc = err_fail(err, err_len, "eval: prompt %lld: %d + %d new + block %d tokens exceed the cache's %d",
                          (long long)(o->index_base + idx), P[idx], o->max_new, B, et->max_len);
            break;
        }
        int slot = i;
        int32_t c2[2] = {0, P[idx]};
        if ((rc = decode_truncate(et->dc, slot, 0, err, err_len))) break;
        if ((rc = extend(et, 1, &slot, prompts[idx], c2, o->fn != NULL, 0, err, err_len))) break;
        if (o->fn) keep_features(et, &g[i], 0, 0, P[idx]);
        const float *lg = row_logits(et, P[idx] - 1, err, err_len);
        if (!lg) {
            rc = -1;
            break;
        }
        int32_t t;
        if (sampled) {
            target_probs(et, lg, o->temperature, o->top_p);
            t = draw(et, &g[i].rng, -1);
        } else {
            t = argmax_of(et, lg);
        }
        if (!g[i].done) commit(&g[i], outs[idx], o, t);
    }
    while (!rc) {
        int m = 0;
        cu[0] = 0;
        int32_t draft[et->n_slots][DRAFTER_MAX_B];
        for (int i = 0; i < n && !rc; i++) {
            if (g[i].done) continue;
            int32_t *out = outs[g[i].idx];
            /* the cache holds out[0 .. n-1); the anchor out[n-1] is fed again with the draft */
            ids[cu[m]] = out[g[i].n - 1];
            if (o->fn) {
                et->ctx_states = et->hist + (size_t)g[i].slot * et->k * et->max_len * et->H;
                et->ctx_last = et->hist_last + (size_t)g[i].slot * et->max_len * et->H;
                et->ctx_rows = et->max_len;
                et->ctx_slot = g[i].slot;
                et->ctx_seq = g[i].seq;
                rc = o->fn(o->ctx, et, out, g[i].n, B, draft[i], err, err_len);
                memcpy(ids + cu[m] + 1, draft[i], sizeof(int32_t) * (size_t)(B - 1));
            }
            slots[m] = g[i].slot;
            cu[m + 1] = cu[m] + B;
            m++;
        }
        if (rc || m == 0) break;
        if ((rc = extend(et, m, slots, ids, cu, o->fn != NULL, 1, err, err_len))) break;
        int j = 0;
        for (int i = 0; i < n; i++) {
            if (g[i].done) continue;
            int32_t *out = outs[g[i].idx];
            int n0 = g[i].n, r0 = cu[j++], acc = 0;
            int32_t bonus;
            for (;;) {
                if (sampled) {
                    const float *lg = row_logits(et, r0 + acc, err, err_len);
                    if (!lg) {
                        rc = -1;
                        break;
                    }
                    target_probs(et, lg, o->temperature, o->top_p);
                    if (acc < B - 1 && uniform01(&g[i].rng) < et->probs[draft[i][acc]]) {
                        acc++;
                        continue;
                    }
                    bonus = draw(et, &g[i].rng, acc < B - 1 ? draft[i][acc] : -1);
                } else {
                    int32_t p;
                    if ((rc = row_argmax(et, r0 + acc, &p, err, err_len))) break;
                    if (acc < B - 1 && p == draft[i][acc]) {
                        acc++;
                        continue;
                    }
                    bonus = p;
                }
                break;
            }
            if (rc) break;
            for (int a = 0; a < acc; a++) commit(&g[i], out, o, draft[i][a]);
            commit(&g[i], out, o, bonus);
            /* features of the anchor and the accepted drafts are now committed context; the rest rolls back */
            if (o->fn) keep_features(et, &g[i], r0, n0 - 1, acc + 1);
            if ((rc = decode_truncate(et->dc, g[i].slot, n0 + acc, err, err_len))) break;
            if (o->fn) {
                g[i].rounds++;
                g[i].tau_sum += acc + 1;
                if (s) {
                    s->hist[acc + 1]++;
                    for (int q = 1; q <= acc; q++) s->at_pos[q]++;
                    s->accepted += acc;
                }
            }
        }
    }
    for (int i = 0; i < n; i++) {
        out_len[g[i].idx] = g[i].n;
        if (o->fn && s && g[i].rounds) {
            s->rounds += g[i].rounds;
            s->responses++;
            s->tau_sum += (double)g[i].tau_sum / (double)g[i].rounds;
        }
    }
    free(ids);
    return rc;
}

int eval_generate(struct eval_target *et, int n, const int32_t *const *prompts, const int *P,
                  const struct eval_gen_opts *o, int32_t **outs, int *out_len, struct eval_stats *s, char *err,
                  int err_len) {
    if (!et->dc) return err_fail(err, err_len, "eval: eval_generate needs eval_target_enable_cache first");
    if (o->fn && (o->B < 2 || o->B > DRAFTER_MAX_B)) return err_fail(err, err_len, "eval: block size %d", o->B);
    if (o->fn && o->B * et->n_slots > et->max_step)
        return err_fail(err, err_len, "eval: %d slots x block %d exceed the step plan %d", et->n_slots, o->B,
                        et->max_step);
    for (int first = 0; first < n; first += et->n_slots) {
        int m = n - first < et->n_slots ? n - first : et->n_slots;
        if (generate_group(et, m, prompts, P, o, outs, out_len, s, first, err, err_len)) return -1;
    }
    return 0;
}
