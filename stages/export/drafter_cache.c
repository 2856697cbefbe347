/*
 * stages/export/drafter_cache.c — the KV-cached block proposal of the drafter on the CPU
 * (stages/export/drafter_cache.h). The sequence of ops is drafter.c's step_impl forward with fast = 1, N = 1
 * (one block, anchored at n - 1), split into the context rows (projected once per sequence, into the cache) and
 * the block rows (every proposal).
 */
#include "export/drafter_cache.h"

#include "core/err.h"
#include "kernels/embedding.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "train/cpu_ops.h"

#include <cblas.h>
#undef I   /* complex.h's imaginary unit (through cblas.h) would shadow the config's field c->I */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Context rows projected per pass (bounds the scratch; a prompt is projected in passes of this many rows). */
#define DCACHE_CHUNK 64


struct drafter_cache {
    struct drafter *d;
    const struct drafter_config *c;
    int n_slots, max_len, cap;          /* cap = max_len + B rows per cache */
    int n_threads, V_d;
    const float *fc, *hnorm, *norm, *embed, *lm;
    const float *lw[DRAFTER_MAX_LAYERS][DRAFTER_LT_N];
    const int64_t *d2t;
    float *inv_freq;                    /* (d_h / 2) */
    float *k, *v;                       /* (n_slots, L, n_kv, cap, d_h) each */
    int64_t *seq;                       /* (n_slots) the sequence cached in the slot (-1: none) */
    int *rows;                          /* (n_slots) context rows cached */
    /* context pass scratch (DCACHE_CHUNK rows) */
    float *hid, *cfc, *ctx, *crstd, *ck, *cv;   /* (C, k·H), (C, H) x2, (C·n_kv), (C, n_kv·d_h) x2 */
    int32_t *cpos;                              /* (C) */
    /* block scratch (B rows) */
    float *x, *xn1, *rstd, *q, *kraw, *bk, *bv, *o, *h, *xn2, *gate, *up, *act, *xn, *logits;
    int32_t *tok, *bpos;
    /* attention scratch, per thread: qg (G·B, d_h), og (G·B, d_h), scores (G·B, cap) */
    float *att;
    size_t att_floats;
    struct drafter_cache_stats st;
};

static float *dc_alloc(size_t n, int *fail) {
    float *p = malloc(sizeof(float) * (n ? n : 1));
    if (!p) *fail = 1;
    return p;
}

void drafter_cache_free(struct drafter_cache *dc) {
    if (!dc) return;
    void *p[] = {dc->inv_freq, dc->k, dc->v, dc->seq, dc->rows, dc->hid, dc->cfc, dc->ctx, dc->crstd, dc->ck,
                 dc->cv, dc->cpos, dc->x, dc->xn1, dc->rstd, dc->q, dc->kraw, dc->bk, dc->bv, dc->o, dc->h, dc->xn2,
                 dc->gate, dc->up, dc->act, dc->xn, dc->logits, dc->tok, dc->bpos, dc->att};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    free(dc);
}

static const float *weight(struct drafter *d, const char *name, int64_t numel, char *err, int err_len) {
    const struct drafter_param *p = drafter_param_find(d, name);
    if (!p || p->numel != numel) {
        err_fail(err, err_len, "drafter_cache: the drafter has no tensor %s of %lld elements", name, (long long)numel);
        return NULL;
    }
    return p->w;
}

struct drafter_cache *drafter_cache_init(struct drafter *d, int n_slots, int max_len, char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    if (n_slots < 1 || max_len < 1) {
        err_fail(err, err_len, "drafter_cache: %d slots of %d tokens, expected >= 1 of each", n_slots, max_len);
        return NULL;
    }
    struct drafter_cache *dc = calloc(1, sizeof *dc);
    if (!dc) {
        err_fail(err, err_len, "drafter_cache: out of memory");
        return NULL;
    }
    dc->d = d;
    dc->c = c;
    dc->n_slots = n_slots;
    dc->max_len = max_len;
    dc->cap = max_len + c->B;
    dc->n_threads = drafter_threads(d);
    const int H = c->H, kH = c->k * H, QD = c->n_h * c->d_h, KD = c->n_kv * c->d_h, NI = c->I, B = c->B, L = c->L;
    const struct drafter_param *lmp = drafter_param_find(d, "lm_head.weight");
    dc->V_d = lmp ? (int)lmp->shape[0] : 0;
    if (!lmp || !(dc->fc = weight(d, "fc.weight", (int64_t)H * kH, err, err_len)) ||
        !(dc->hnorm = weight(d, "hidden_norm.weight", H, err, err_len)) ||
        !(dc->norm = weight(d, "norm.weight", H, err, err_len)) ||
        !(dc->embed = weight(d, "embed_tokens.weight", (int64_t)c->V_t * H, err, err_len)) ||
        !(dc->lm = weight(d, "lm_head.weight", (int64_t)dc->V_d * H, err, err_len))) {
        if (!lmp) err_fail(err, err_len, "drafter_cache: the drafter has no lm_head.weight");
        drafter_cache_free(dc);
        return NULL;
    }
    for (int l = 0; l < L; l++)   /* the layer tensors, shaped by drafter_init from the same config */
        for (int j = 0; j < DRAFTER_LT_N; j++) dc->lw[l][j] = drafter_layer_param(d, l, j)->w;
    struct drafter_last ls;
    drafter_last_step(d, &ls);
    dc->d2t = ls.d2t;
    int fail = 0, G = c->n_h / c->n_kv;
    size_t per = (size_t)n_slots * L * c->n_kv * (size_t)dc->cap * c->d_h;
    dc->inv_freq = dc_alloc((size_t)c->d_h / 2, &fail);
    dc->k = dc_alloc(per, &fail);
    dc->v = dc_alloc(per, &fail);
    dc->seq = malloc(sizeof *dc->seq * (size_t)n_slots);
    dc->rows = calloc((size_t)n_slots, sizeof *dc->rows);
    dc->hid = dc_alloc((size_t)DCACHE_CHUNK * kH, &fail);
    dc->cfc = dc_alloc((size_t)DCACHE_CHUNK * H, &fail);
    dc->ctx = dc_alloc((size_t)DCACHE_CHUNK * H, &fail);
    dc->crstd = dc_alloc((size_t)DCACHE_CHUNK * c->n_kv, &fail);
    dc->ck = dc_alloc((size_t)DCACHE_CHUNK * KD, &fail);
    dc->cv = dc_alloc((size_t)DCACHE_CHUNK * KD, &fail);
    dc->cpos = malloc(sizeof *dc->cpos * DCACHE_CHUNK);
    dc->x = dc_alloc((size_t)B * H, &fail);
    dc->xn1 = dc_alloc((size_t)B * H, &fail);
    dc->rstd = dc_alloc((size_t)B * (c->n_h > c->n_kv ? c->n_h : c->n_kv), &fail);
    dc->q = dc_alloc((size_t)B * QD, &fail);
    dc->kraw = dc_alloc((size_t)B * KD, &fail);
    dc->bk = dc_alloc((size_t)B * KD, &fail);
    dc->bv = dc_alloc((size_t)B * KD, &fail);
    dc->o = dc_alloc((size_t)B * QD, &fail);
    dc->h = dc_alloc((size_t)B * H, &fail);
    dc->xn2 = dc_alloc((size_t)B * H, &fail);
    dc->gate = dc_alloc((size_t)B * NI, &fail);
    dc->up = dc_alloc((size_t)B * NI, &fail);
    dc->act = dc_alloc((size_t)B * NI, &fail);
    dc->xn = dc_alloc((size_t)B * H, &fail);
    dc->logits = dc_alloc((size_t)B * dc->V_d, &fail);
    dc->tok = malloc(sizeof *dc->tok * (size_t)B);
    dc->bpos = malloc(sizeof *dc->bpos * (size_t)B);
    dc->att_floats = 2 * (size_t)G * B * c->d_h + (size_t)G * B * dc->cap;
    dc->att = dc_alloc(dc->att_floats * (size_t)dc->n_threads, &fail);
    if (fail || !dc->seq || !dc->rows || !dc->cpos || !dc->tok || !dc->bpos) {
        err_fail(err, err_len, "drafter_cache: out of memory for %d slots x %d tokens x %d layers of keys and values "
                 "(%.1f MB)", n_slots, max_len, L, 2.0 * (double)per * sizeof(float) / 1e6);
        drafter_cache_free(dc);
        return NULL;
    }
    if ((size_t)G * B > 1024) {   /* the softmax's per-row sums below: cpu_ops' block attention bound */
        err_fail(err, err_len, "drafter_cache: %d query heads per kv head x block %d > 1024 rows", G, B);
        drafter_cache_free(dc);
        return NULL;
    }
    for (int s = 0; s < n_slots; s++) dc->seq[s] = -1;
    drafter_rope_inv_freq(c, dc->inv_freq);
    return dc;
}

const float *drafter_cache_xn(const struct drafter_cache *dc) { return dc->xn; }

void drafter_cache_get_stats(const struct drafter_cache *dc, struct drafter_cache_stats *s) { *s = dc->st; }

/* ---------------------------------------------------------------- linear layers on column chunks */

struct cols {
    float *y;
    const float *x, *w;
    int M, N, K, cols;
};

static void cols_chunk(void *ctx, int ch, int thread) {
    (void)thread;
    struct cols *a = ctx;
    int c0 = ch * a->cols, c1 = c0 + a->cols < a->N ? c0 + a->cols : a->N;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, a->M, c1 - c0, a->K, 1.0f, a->x, a->K,
                a->w + (size_t)c0 * a->K, a->K, 0.0f, a->y + c0, a->N);
}

/* y (M, N) = x (M, K) · w (N, K)ᵀ. A proposal's GEMMs have few rows (B, or the rows committed in a round), so the
 * work is cut over the output columns (chunks of a multiple of 16 columns, by shape only); small products run on
 * the calling thread (starting threads would cost more). */
static void lin(const struct drafter_cache *dc, float *y, const float *x, const float *w, int M, int N, int K) {
    if (M <= 0 || N <= 0) return;
    int per = ((N + 7) / 8 + 15) / 16 * 16;
    struct cols a = {y, x, w, M, N, K, per};
    double flops = (double)M * N * K;
    cpu_ops_parallel(flops >= (1 << 20) ? dc->n_threads : 1, (N + per - 1) / per, cols_chunk, &a);
}

/* ---------------------------------------------------------------- context rows */

static float *cache_k(const struct drafter_cache *dc, int slot, int l) {
    return dc->k + ((size_t)slot * dc->c->L + l) * dc->c->n_kv * (size_t)dc->cap * dc->c->d_h;
}

static float *cache_v(const struct drafter_cache *dc, int slot, int l) {
    return dc->v + ((size_t)slot * dc->c->L + l) * dc->c->n_kv * (size_t)dc->cap * dc->c->d_h;
}

/* Write m rows (m, n_kv·d_h) of keys and values into slot's layer-l cache at rows r0.. (head-major). */
static void cache_put(struct drafter_cache *dc, int slot, int l, int r0, int m, const float *k, const float *v) {
    const int D = dc->c->d_h, nkv = dc->c->n_kv;
    float *K = cache_k(dc, slot, l), *V = cache_v(dc, slot, l);
    for (int g = 0; g < nkv; g++)
        for (int i = 0; i < m; i++) {
            size_t to = ((size_t)g * dc->cap + r0 + i) * D, from = ((size_t)i * nkv + g) * D;
            memcpy(K + to, k + from, sizeof(float) * (size_t)D);
            memcpy(V + to, v + from, sizeof(float) * (size_t)D);
        }
}

/* Project context rows [r0, r1) of the sequence in slot into its cache: ctx = hidden_norm(fc(features)), then per
 * layer k_norm + RoPE of W_k·ctx and W_v·ctx (step_impl's context rows). */
static void project_context(struct drafter_cache *dc, int slot, const float *states, int rows, int r0, int r1) {
    const struct drafter_config *c = dc->c;
    const int H = c->H, k = c->k, kH = k * H, KD = c->n_kv * c->d_h;
    for (int t0 = r0; t0 < r1; t0 += DCACHE_CHUNK) {
        int m = r1 - t0 < DCACHE_CHUNK ? r1 - t0 : DCACHE_CHUNK;
        for (int i = 0; i < m; i++) {
            dc->cpos[i] = t0 + i;
            for (int q = 0; q < k; q++)
                memcpy(dc->hid + (size_t)i * kH + (size_t)q * H, states + ((size_t)q * rows + t0 + i) * H,
                       sizeof(float) * (size_t)H);
        }
        lin(dc, dc->cfc, dc->hid, dc->fc, m, H, kH);
        rmsnorm_forward_ref(dc->ctx, dc->crstd, dc->cfc, dc->hnorm, m, H, c->eps);
        for (int l = 0; l < c->L; l++) {
            lin(dc, dc->cv, dc->ctx, dc->lw[l][DRAFTER_LT_K], m, KD, H);   /* raw keys, normed into ck */
            rmsnorm_forward_ref(dc->ck, dc->crstd, dc->cv, dc->lw[l][DRAFTER_LT_KN], m * c->n_kv, c->d_h, c->eps);
            rope_forward_ref(dc->ck, NULL, dc->cpos, dc->inv_freq, m, c->n_kv, 0, c->d_h);
            lin(dc, dc->cv, dc->ctx, dc->lw[l][DRAFTER_LT_V], m, KD, H);
            cache_put(dc, slot, l, t0, m, dc->ck, dc->cv);
        }
        dc->st.ctx_rows += m;
    }
}

/* ---------------------------------------------------------------- the block */

struct att {
    struct drafter_cache *dc;
    const float *K, *V;   /* the slot's layer caches */
    int lo, nc, causal;   /* visible context rows lo..lo+nc-1, then the block's B rows */
};

/* kv head g of the block (cpu_ops.c's ba_fwd_chunk on keys that need no gather): scores by one SGEMM, the softmax
 * in the same arithmetic (fp32 exp, double sums), P·V by another SGEMM. */
static void att_head(void *ctx, int g, int thread) {
    struct att *a = ctx;
    struct drafter_cache *dc = a->dc;
    const struct drafter_config *c = dc->c;
    const int D = c->d_h, G = c->n_h / c->n_kv, B = c->B, GB = G * B, n = a->nc + B;
    float *qg = dc->att + (size_t)thread * dc->att_floats, *og = qg + (size_t)GB * D, *sc = og + (size_t)GB * D;
    const float *kg = a->K + ((size_t)g * dc->cap + a->lo) * D, *vg = a->V + ((size_t)g * dc->cap + a->lo) * D;
    for (int j = 0; j < B; j++)
        memcpy(qg + (size_t)j * G * D, dc->q + ((size_t)j * c->n_h + (size_t)g * G) * D, sizeof(float) * (size_t)G * D);
    float scale = 1.0f / sqrtf((float)D);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GB, n, D, scale, qg, D, kg, D, 0.0f, sc, n);
    double lsum[1024];   /* GB <= 1024: checked at init */
    for (int r = 0; r < GB; r++) {
        int j = r / G, nv = a->nc + (a->causal ? j + 1 : B);
        float m;
        lsum[r] = cpu_ops_softmax_prefix(sc + (size_t)r * n, nv, n, &m);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, GB, D, n, 1.0f, sc, n, vg, D, 0.0f, og, D);
    for (int r = 0; r < GB; r++) {
        int j = r / G, h = g * G + r % G;
        float inv = (float)(1.0 / lsum[r]), *o = dc->o + ((size_t)j * c->n_h + h) * D;
        for (int e = 0; e < D; e++) o[e] = og[(size_t)r * D + e] * inv;
    }
}

int drafter_cache_propose(struct drafter_cache *dc, int slot, int64_t seq, const int32_t *cv, int n,
                          const float *states, int rows, int32_t *draft, char *err, int err_len) {
    const struct drafter_config *c = dc->c;
    const int H = c->H, B = c->B, QD = c->n_h * c->d_h, KD = c->n_kv * c->d_h, NI = c->I, a = n - 1;
    if (slot < 0 || slot >= dc->n_slots)
        return err_fail(err, err_len, "drafter_cache: slot %d outside the plan's %d", slot, dc->n_slots);
    if (n < 1 || a + B > dc->cap)
        return err_fail(err, err_len, "drafter_cache: %d committed tokens + block %d exceed the plan (%d tokens)", n, B,
                        dc->max_len);
    if (rows < a || !states)
        return err_fail(err, err_len, "drafter_cache: features of %d rows for %d committed tokens", rows, n);
    if (dc->seq[slot] != seq || dc->rows[slot] > a) {   /* a new sequence in the slot, or it went back: start over */
        dc->seq[slot] = seq;
        dc->rows[slot] = 0;
        dc->st.resets++;
    }
    project_context(dc, slot, states, rows, dc->rows[slot], a);
    dc->rows[slot] = a;

    /* the block: the anchor token, then the mask token; positions a + j (step_impl, §4.2 steps 2 and 4) */
    for (int j = 0; j < B; j++) {
        dc->tok[j] = j == 0 ? cv[a] : (int32_t)c->mask_token_id;
        dc->bpos[j] = a + j;
    }
    if (embedding_forward_ref(dc->x, dc->tok, dc->embed, B, H, c->V_t))
        return err_fail(err, err_len, "drafter_cache: the anchor token %d is outside the embedding [0, %d)", cv[a],
                        c->V_t);
    for (int l = 0; l < c->L; l++) {
        const float *const *w = dc->lw[l];
        int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        int window = sliding ? c->sliding_window : 0;
        rmsnorm_forward_ref(dc->xn1, dc->rstd, dc->x, w[DRAFTER_LT_IN_LN], B, H, c->eps);
        lin(dc, dc->o, dc->xn1, w[DRAFTER_LT_Q], B, QD, H);   /* raw queries, normed into q */
        lin(dc, dc->kraw, dc->xn1, w[DRAFTER_LT_K], B, KD, H);
        lin(dc, dc->bv, dc->xn1, w[DRAFTER_LT_V], B, KD, H);
        rmsnorm_forward_ref(dc->q, dc->rstd, dc->o, w[DRAFTER_LT_QN], B * c->n_h, c->d_h, c->eps);
        rmsnorm_forward_ref(dc->bk, dc->rstd, dc->kraw, w[DRAFTER_LT_KN], B * c->n_kv, c->d_h, c->eps);
        rope_forward_ref(dc->q, NULL, dc->bpos, dc->inv_freq, B, c->n_h, 0, c->d_h);
        rope_forward_ref(dc->bk, NULL, dc->bpos, dc->inv_freq, B, c->n_kv, 0, c->d_h);
        /* the block's keys right after the visible context (rows a..a+B-1; the next proposal's context
         * overwrites them) */
        cache_put(dc, slot, l, a, B, dc->bk, dc->bv);
        int lo = window > 0 && a - window > 0 ? a - window : 0;
        struct att at = {dc, cache_k(dc, slot, l), cache_v(dc, slot, l), lo, a - lo,
                         sliding && !c->sliding_window_non_causal};
        double flops = (double)c->n_h * B * (a - lo + B) * c->d_h;
        cpu_ops_parallel(flops >= (1 << 20) ? dc->n_threads : 1, c->n_kv, att_head, &at);
        /* h = x + o_proj(attn) */
        lin(dc, dc->h, dc->o, w[DRAFTER_LT_O], B, H, QD);
        for (size_t e = 0; e < (size_t)B * H; e++) dc->h[e] += dc->x[e];
        rmsnorm_forward_ref(dc->xn2, dc->rstd, dc->h, w[DRAFTER_LT_POST_LN], B, H, c->eps);
        lin(dc, dc->gate, dc->xn2, w[DRAFTER_LT_GATE], B, NI, H);
        lin(dc, dc->up, dc->xn2, w[DRAFTER_LT_UP], B, NI, H);
        swiglu_forward_ref(dc->act, dc->gate, dc->up, B, NI, NI);
        lin(dc, dc->x, dc->act, w[DRAFTER_LT_DOWN], B, H, NI);
        for (size_t e = 0; e < (size_t)B * H; e++) dc->x[e] += dc->h[e];
    }
    rmsnorm_forward_ref(dc->xn, dc->rstd, dc->x, dc->norm, B, H, c->eps);
    /* rows first..first+B-2 are the draft (drafter_draft_row0); the first maximum wins, as cpu_ops_lmhead_loss
     * picks pred */
    int first = drafter_draft_row0(c);
    lin(dc, dc->logits, dc->xn + (size_t)first * H, dc->lm, B - 1, dc->V_d, H);
    for (int j = 0; j < B - 1; j++) {
        const float *z = dc->logits + (size_t)j * dc->V_d;
        int32_t p = 0;
        for (int v = 1; v < dc->V_d; v++)
            if (z[v] > z[p]) p = v;
        draft[j] = dc->d2t ? (int32_t)(p + dc->d2t[p]) : p;
    }
    dc->st.proposals++;
    return 0;
}
