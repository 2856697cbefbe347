/*
 * stages/train/drafter.c — the DFlash drafter: config, parameter table, planned memory and the CPU training
 * step (stages/train/drafter.h; dflash-reference.md §4–§8).
 *
 * The CPU step is the forward of §4.2 and its backward written over the kernels/<op>_ref.c references, buffer by
 * buffer, so every intermediate the backward needs is kept (nothing is recomputed except what the refs
 * recompute themselves: P in block attention, the logit rows in the loss). One sequence (step_impl) serves both
 * CPU steps: drafter_step_cpu calls the references, drafter_step_fast the stages/train/cpu_ops.h ops in their
 * place (BLAS linear layers and attention, the fused LM head + loss, row ops on threads). Row layouts: block rows R = N·B
 * (block-major), context rows T, key/value rows T + R (context first, then the block rows, §6).
 */
#include "train/drafter.h"

#include "core/err.h"
#include "model/weights.h"
#include "train/cpu_ops.h"
#include "train/mask_token.h"

#include "kernels/anchors.h"
#include "kernels/block_attn.h"
#include "kernels/common.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/lmhead_loss.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- config */

void drafter_config_defaults(struct drafter_config *c) {
    memset(c, 0, sizeof *c);
    c->B = 16;
    c->L = 5;
    for (int l = 0; l < c->L; l++) c->layer_type[l] = l < 4 ? DRAFTER_LAYER_SLIDING : DRAFTER_LAYER_FULL;
    c->sliding_window = 2048;
    c->N = 512;
    c->T_max = 8192;
    c->ids_convention = DRAFTER_IDS_ZLAB;
    c->mask_token_id = -1;
    c->noise = 0.05f;
    c->loss = LMHEAD_LOSS_CE;
    c->weighting = LMHEAD_WEIGHT_DPACE;
    c->gamma = 4.0f;
    c->alpha = 0.5f;
    c->init_std = 0.02f;
}

const char *drafter_ids_convention_name(int convention) {
    return convention == DRAFTER_IDS_ZLAB ? "zlab" : convention == DRAFTER_IDS_SPECULATORS ? "speculators" : "?";
}

int drafter_parse_layer_types(struct drafter_config *c, const char *list, char *err, int err_len) {
    if (!strcmp(list, "all-sliding")) {   /* what speculators ships: every layer sliding */
        if (c->L < 1 || c->L > DRAFTER_MAX_LAYERS)
            return err_fail(err, err_len, "layer types all-sliding: layer count %d outside [1, %d]", c->L,
                            DRAFTER_MAX_LAYERS);
        for (int l = 0; l < c->L; l++) c->layer_type[l] = DRAFTER_LAYER_SLIDING;
        return 0;
    }
    int n = 0;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char tok[64];
        if (len == 0 || len >= sizeof tok)
            return err_fail(err, err_len, "layer types \"%s\": entry %d is empty or too long", list, n);
        memcpy(tok, p, len);
        tok[len] = 0;
        if (n >= DRAFTER_MAX_LAYERS)
            return err_fail(err, err_len, "layer types \"%s\": more than %d layers", list, DRAFTER_MAX_LAYERS);
        if (!strcmp(tok, "sliding") || !strcmp(tok, "sliding_attention")) c->layer_type[n++] = DRAFTER_LAYER_SLIDING;
        else if (!strcmp(tok, "full") || !strcmp(tok, "full_attention")) c->layer_type[n++] = DRAFTER_LAYER_FULL;
        else if (strstr(tok, "full") && strstr(tok, "causal"))
            return err_fail(err, err_len, "layer types \"%s\": entry %d \"%s\": full-attention layers are always "
                            "bidirectional inside the block; only sliding layers can be causal", list, n, tok);
        else
            return err_fail(err, err_len, "layer types \"%s\": entry %d \"%s\" is neither sliding[_attention] nor "
                            "full[_attention]", list, n, tok);
        p = e ? e + 1 : p + len;
    }
    if (n == 0) return err_fail(err, err_len, "layer types \"%s\": no layers", list);
    c->L = n;
    return 0;
}

void drafter_zlab_ids(const struct drafter_config *c, int *ids) {
    for (int i = 0; i < c->k; i++) ids[i] = c->layer_ids[i] - (c->ids_convention == DRAFTER_IDS_SPECULATORS ? 1 : 0);
}

int drafter_config_check(const struct drafter_config *c, char *err, int err_len) {
    if (c->H < 1 || c->n_h < 1 || c->n_kv < 1 || c->d_h < 2 || c->d_h % 2 || c->I < 1 || c->V_t < 1 || c->V_d < 1)
        return err_fail(err, err_len, "drafter: sizes must be positive (H=%d n_h=%d n_kv=%d d_h=%d (even) I=%d V_t=%d "
                        "V_d=%d)", c->H, c->n_h, c->n_kv, c->d_h, c->I, c->V_t, c->V_d);
    if (c->n_h % c->n_kv)
        return err_fail(err, err_len, "drafter: n_h=%d is not a multiple of n_kv=%d", c->n_h, c->n_kv);
    if (c->V_d > c->V_t) return err_fail(err, err_len, "drafter: draft vocabulary %d > target vocabulary %d", c->V_d, c->V_t);
    if (!(c->eps > 0)) return err_fail(err, err_len, "drafter: rms_norm_eps must be > 0, got %g", c->eps);
    if (!(c->target.rope_theta > 0))
        return err_fail(err, err_len, "drafter: the target's rope_theta must be > 0, got %g", c->target.rope_theta);
    if (c->B < 2 || c->B > DRAFTER_MAX_B)
        return err_fail(err, err_len, "drafter: block size %d outside [2, %d]", c->B, DRAFTER_MAX_B);
    if (c->L < 1 || c->L > DRAFTER_MAX_LAYERS)
        return err_fail(err, err_len, "drafter: layer count %d outside [1, %d]", c->L, DRAFTER_MAX_LAYERS);
    int any_sliding = 0;
    for (int l = 0; l < c->L; l++) {
        if (c->layer_type[l] != DRAFTER_LAYER_SLIDING && c->layer_type[l] != DRAFTER_LAYER_FULL)
            return err_fail(err, err_len, "drafter: layer %d has type %d, neither sliding (0) nor full (1)", l,
                            c->layer_type[l]);
        any_sliding |= c->layer_type[l] == DRAFTER_LAYER_SLIDING;
    }
    if (any_sliding && c->sliding_window < 1)
        return err_fail(err, err_len, "drafter: sliding layers need a window >= 1, got %d", c->sliding_window);
    if (c->N < 1) return err_fail(err, err_len, "drafter: max anchors %d must be >= 1", c->N);
    if (c->T_max <= c->B) return err_fail(err, err_len, "drafter: token budget %d must exceed the block size %d", c->T_max, c->B);
    if (c->k < 1 || c->k > DESC_MAX_LAYERS)
        return err_fail(err, err_len, "drafter: %d target layer ids, expected 1..%d", c->k, DESC_MAX_LAYERS);
    if (c->ids_convention != DRAFTER_IDS_ZLAB && c->ids_convention != DRAFTER_IDS_SPECULATORS)
        return err_fail(err, err_len, "drafter: layer id convention %d is neither zlab (0) nor speculators (1)",
                        c->ids_convention);
    int n = c->target.num_hidden_layers;
    int ids[DESC_MAX_LAYERS];
    drafter_zlab_ids(c, ids);
    for (int i = 0; i < c->k; i++)
        if (n > 0 && (ids[i] < 0 || ids[i] >= n))
            return err_fail(err, err_len, "drafter: target layer id %d (%s convention) is outside the target's %d layers "
                            "(z-lab ids 0..%d, speculators 1..%d)", c->layer_ids[i],
                            drafter_ids_convention_name(c->ids_convention), n, n - 1, n);
    if (c->mask_token_id < 0 || c->mask_token_id >= c->V_t)
        return err_fail(err, err_len, "drafter: mask token id %lld is outside the embedding [0, %d)",
                        (long long)c->mask_token_id, c->V_t);
    if (c->loss == LMHEAD_LOSS_KL && c->weighting == LMHEAD_WEIGHT_DPACE)
        return err_fail(err, err_len, "drafter: D-PACE weighting needs the ce loss (D-PACE with kl is refused)");
    lmhead_loss_config lc = {c->T_max, c->N, c->B, c->H, c->V_d, c->loss, c->weighting, c->gamma, c->alpha, c->eps};
    if (lmhead_loss_check(&lc, err, err_len)) return -1;
    if (!(c->noise >= 0)) return err_fail(err, err_len, "drafter: hidden-state noise %g must be >= 0", c->noise);
    if (!(c->init_std > 0)) return err_fail(err, err_len, "drafter: init std %g must be > 0", c->init_std);
    return 0;
}

void drafter_rope_inv_freq(const struct drafter_config *c, float *inv_freq) {
    double inv[DRAFTER_MAX_HALF_HEAD];
    struct model_config rc = c->target;
    rc.head_dim = c->d_h;
    rc.rotary_dim = 0;   /* the whole head (hf_config_rotary_dim): hf_rope_inv_freq fills d_h / 2 entries */
    hf_rope_inv_freq(&rc, inv);
    for (int i = 0; i < c->d_h / 2; i++) inv_freq[i] = (float)inv[i];
}

int drafter_config_from_target(struct drafter_config *c, const char *dir, char *err, int err_len) {
    if (hf_config_load(&c->target, dir, err, err_len)) return -1;
    const struct model_config *t = &c->target;
    c->H = t->hidden_size;
    c->n_h = t->num_attention_heads;
    c->n_kv = t->num_key_value_heads;
    c->d_h = t->head_dim;
    c->I = t->intermediate_size;
    c->eps = (float)t->rms_norm_eps;
    c->V_t = t->vocab_size;
    if (c->V_d <= 0) c->V_d = c->V_t;
    if (c->k == 0) {
        c->k = c->L;
        c->ids_convention = DRAFTER_IDS_ZLAB;
        if (c->L > DESC_MAX_LAYERS || hf_zlab_layer_ids(t->num_hidden_layers, c->L, c->layer_ids))
            return err_fail(err, err_len, "%s/config.json: the z-lab default layer ids for %d draft layers do not fit "
                            "the target's %d layers: pass the target layer ids", dir, c->L, t->num_hidden_layers);
    }
    enum mask_token_source src;
    if (mask_token_resolve(dir, c->V_t, c->mask_token_id, &c->mask_token_id, &src, err, err_len)) return -1;
    return drafter_config_check(c, err, err_len);
}

int drafter_check_features(const struct drafter_config *c, const struct desc_features *f, char *err, int err_len) {
    if (f->layout != DESC_LAYOUT_CONCAT)
        return err_fail(err, err_len, "features: layout %s, the drafter expects concat", desc_layout_name(f->layout));
    if (f->dtype != DESC_DTYPE_BF16 && f->dtype != DESC_DTYPE_F32)
        return err_fail(err, err_len, "features: dtype %d, expected bf16 or f32", (int)f->dtype);
    if ((int)f->hidden_size != c->H)
        return err_fail(err, err_len, "features: hidden size %u, the drafter's target has H=%d", f->hidden_size, c->H);
    if ((int)f->n_layers != c->k)
        return err_fail(err, err_len, "features: %u captured layers, the drafter expects k=%d", f->n_layers, c->k);
    int ids[DESC_MAX_LAYERS];
    drafter_zlab_ids(c, ids);
    for (int i = 0; i < c->k; i++)
        if (f->layers[i] != ids[i])
            return err_fail(err, err_len, "features: captured layer %d is z-lab id %d, the drafter expects %d (%s id %d)",
                            i, f->layers[i], ids[i], drafter_ids_convention_name(c->ids_convention), c->layer_ids[i]);
    if ((int64_t)f->batch.n_tokens > c->T_max || (int64_t)f->batch.budget > c->T_max)
        return err_fail(err, err_len, "features: batch of %u tokens (budget %u) exceeds the drafter's budget %d",
                        f->batch.n_tokens, f->batch.budget, c->T_max);
    return 0;
}

/* ---------------------------------------------------------------- the drafter */

enum { LP_IN_LN, LP_Q, LP_K, LP_V, LP_O, LP_QN, LP_KN, LP_POST_LN, LP_GATE, LP_UP, LP_DOWN, LP_N };
_Static_assert((int)LP_N == (int)DRAFTER_LT_N && (int)LP_DOWN == (int)DRAFTER_LT_DOWN && (int)LP_QN == (int)DRAFTER_LT_QN,
               "layer tensor order");
const char *const drafter_layer_tensor_names[DRAFTER_LT_N] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};

/* Saved activations of one layer (rows: R block rows, KV = T_max + R key/value rows). */
struct drafter_act {
    float *xin, *xn1, *rstd1;          /* (R, H), (R, H), (R) */
    float *qraw, *rstdq, *q;           /* (R, n_h·d_h), (R·n_h), (R, n_h·d_h) after norm and rope */
    float *kraw, *rstdk, *k, *v;       /* (KV, n_kv·d_h), (KV·n_kv), (KV, n_kv·d_h) x2 */
    float *o, *lse;                    /* (R, n_h·d_h), (n_h·R) */
    float *h, *xn2, *rstd2;            /* (R, H), (R, H), (R) */
    float *gate, *up, *act;            /* (R, I) x3 */
};

struct drafter {
    struct drafter_config cfg;
    int V_d_cap;                       /* V_d the lm_head buffers were planned for */
    int n_params;
    struct drafter_param *params;
    char (*names)[64];
    int i_fc, i_hnorm, i_layer0, i_norm, i_embed, i_lm, i_vnorm, i_vlm;
    uint8_t *t2d;                      /* (V_t) or NULL */
    int64_t *d2t;                      /* (V_d) or NULL */
    float *inv_freq;                   /* (d_h/2) */
    /* activations */
    int R, KVmax;
    float *hid_used;                   /* (T_max, k·H) features after noise */
    float *ctx_fc, *ctx, *rstd_c;      /* (T_max, H) x2, (T_max) */
    struct drafter_act *act;           /* (L) */
    float *x_out;                      /* (R, H) output of the last layer */
    float *xn, *rstd_f;                /* (R, H), (R) */
    int32_t *pos;                      /* (T_max + R) context then block positions */
    int32_t *tok;                      /* (R) block tokens */
    uint8_t *maskpad;                  /* (T_max) loss mask padded to the budget with 0 */
    int32_t *anchors;                  /* (N) */
    uint8_t *valid;                    /* (N) */
    float *row_loss, *row_weight;      /* (R) */
    int32_t *pred, *tgt;               /* (R) */
    uint8_t *row_mask;                 /* (R) */
    int32_t correct[DRAFTER_MAX_B], total[DRAFTER_MAX_B];
    /* backward scratch */
    float *dx, *dh, *dxn, *dxn1;       /* (R, H) */
    float *dact, *dgate, *dup;         /* (R, I) */
    float *dout, *dq;                  /* (R, n_h·d_h) */
    float *dk, *dv, *dkraw;            /* (KV, n_kv·d_h) */
    float *dctx, *dctx_fc;             /* (T_max, H) */
    /* fast CPU path (stages/train/cpu_ops.h) */
    int n_threads;
    float *lm_ws;                      /* cpu_ops_lmhead_ws_floats(n_threads) */
    /* last step */
    int last_T;
    float last_loss;
};

static float *falloc(size_t n, int *fail) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (!p) *fail = 1;
    return p;
}

static int add_param(struct drafter *d, const char *name, int ndim, int64_t r, int64_t c, int trainable, int *fail) {
    int i = d->n_params++;
    struct drafter_param *p = &d->params[i];
    snprintf(d->names[i], sizeof d->names[i], "%s", name);
    p->name = d->names[i];
    p->ndim = ndim;
    p->shape[0] = r;
    p->shape[1] = ndim == 2 ? c : 0;
    p->numel = ndim == 2 ? r * c : r;
    p->trainable = trainable;
    p->is_matrix = trainable && ndim == 2 && r > 1 && c > 1 && !strstr(name, "embed_tokens") && !strstr(name, "lm_head");
    p->w = falloc((size_t)p->numel, fail);
    p->g = trainable ? falloc((size_t)p->numel, fail) : NULL;
    if (!trainable && p->w)
        for (int64_t e = 0; e < p->numel; e++) p->w[e] = NAN;   /* frozen: NaN until loaded (§4.1) */
    return i;
}

static void free_act(struct drafter_act *a) {
    float **f[] = {&a->xin, &a->xn1, &a->rstd1, &a->qraw, &a->rstdq, &a->q, &a->kraw, &a->rstdk, &a->k, &a->v,
                   &a->o, &a->lse, &a->h, &a->xn2, &a->rstd2, &a->gate, &a->up, &a->act};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(*f[i]);
}

void drafter_free(struct drafter *d) {
    if (!d) return;
    for (int i = 0; i < d->n_params; i++) {
        free(d->params[i].w);
        free(d->params[i].g);
    }
    free(d->params);
    free(d->names);
    free(d->t2d);
    free(d->d2t);
    free(d->inv_freq);
    if (d->act)
        for (int l = 0; l < d->cfg.L; l++) free_act(&d->act[l]);
    free(d->act);
    void *p[] = {d->hid_used, d->ctx_fc, d->ctx, d->rstd_c, d->x_out, d->xn, d->rstd_f, d->pos, d->tok, d->maskpad,
                 d->anchors, d->valid, d->row_loss, d->row_weight, d->pred, d->tgt, d->row_mask, d->dx, d->dh,
                 d->dxn, d->dxn1, d->dact, d->dgate, d->dup, d->dout, d->dq, d->dk, d->dv, d->dkraw, d->dctx, d->dctx_fc,
                 d->lm_ws};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    free(d);
}

struct drafter *drafter_init(const struct drafter_config *c, uint64_t seed, char *err, int err_len) {
    if (drafter_config_check(c, err, err_len)) return NULL;
    struct drafter *d = calloc(1, sizeof *d);
    if (!d) {
        err_fail(err, err_len, "drafter_init: out of memory");
        return NULL;
    }
    d->cfg = *c;
    d->V_d_cap = c->V_d;
    int H = c->H, QD = c->n_h * c->d_h, KD = c->n_kv * c->d_h, I = c->I, L = c->L;
    int maxp = 2 + LP_N * L + 5, fail = 0;
    d->params = calloc((size_t)maxp, sizeof *d->params);
    d->names = calloc((size_t)maxp, sizeof *d->names);
    d->act = calloc((size_t)L, sizeof *d->act);
    if (!d->params || !d->names || !d->act) {
        drafter_free(d);
        err_fail(err, err_len, "drafter_init: out of memory");
        return NULL;
    }
    d->i_fc = add_param(d, "fc.weight", 2, H, (int64_t)c->k * H, 1, &fail);
    d->i_hnorm = add_param(d, "hidden_norm.weight", 1, H, 0, 1, &fail);
    d->i_layer0 = d->n_params;
    for (int l = 0; l < L; l++) {
        int64_t shp[LP_N][3] = {{1, H, 0}, {2, QD, H}, {2, KD, H}, {2, KD, H}, {2, H, QD}, {1, c->d_h, 0},
                                {1, c->d_h, 0}, {1, H, 0}, {2, I, H}, {2, I, H}, {2, H, I}};
        for (int j = 0; j < LP_N; j++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.%s", l, drafter_layer_tensor_names[j]);
            add_param(d, name, (int)shp[j][0], shp[j][1], shp[j][2], 1, &fail);
        }
    }
    d->i_norm = add_param(d, "norm.weight", 1, H, 0, 1, &fail);
    d->i_embed = add_param(d, "embed_tokens.weight", 2, c->V_t, H, 0, &fail);
    d->i_lm = add_param(d, "lm_head.weight", 2, c->V_d, H, 0, &fail);
    d->i_vnorm = add_param(d, "verifier_norm.weight", 1, H, 0, 0, &fail);
    d->i_vlm = add_param(d, "verifier_lm_head.weight", 2, c->V_d, H, 0, &fail);

    int R = c->N * c->B, T = c->T_max, KV = T + R;
    d->R = R;
    d->KVmax = KV;
    d->inv_freq = falloc((size_t)c->d_h / 2, &fail);
    d->hid_used = falloc((size_t)T * c->k * H, &fail);
    d->ctx_fc = falloc((size_t)T * H, &fail);
    d->ctx = falloc((size_t)T * H, &fail);
    d->rstd_c = falloc((size_t)T, &fail);
    for (int l = 0; l < L && !fail; l++) {
        struct drafter_act *a = &d->act[l];
        a->xin = falloc((size_t)R * H, &fail);
        a->xn1 = falloc((size_t)R * H, &fail);
        a->rstd1 = falloc((size_t)R, &fail);
        a->qraw = falloc((size_t)R * QD, &fail);
        a->rstdq = falloc((size_t)R * c->n_h, &fail);
        a->q = falloc((size_t)R * QD, &fail);
        a->kraw = falloc((size_t)KV * KD, &fail);
        a->rstdk = falloc((size_t)KV * c->n_kv, &fail);
        a->k = falloc((size_t)KV * KD, &fail);
        a->v = falloc((size_t)KV * KD, &fail);
        a->o = falloc((size_t)R * QD, &fail);
        a->lse = falloc((size_t)R * c->n_h, &fail);
        a->h = falloc((size_t)R * H, &fail);
        a->xn2 = falloc((size_t)R * H, &fail);
        a->rstd2 = falloc((size_t)R, &fail);
        a->gate = falloc((size_t)R * I, &fail);
        a->up = falloc((size_t)R * I, &fail);
        a->act = falloc((size_t)R * I, &fail);
    }
    d->x_out = falloc((size_t)R * H, &fail);
    d->xn = falloc((size_t)R * H, &fail);
    d->rstd_f = falloc((size_t)R, &fail);
    d->pos = calloc((size_t)KV, sizeof *d->pos);
    d->tok = calloc((size_t)R, sizeof *d->tok);
    d->maskpad = calloc((size_t)T, 1);
    d->anchors = calloc((size_t)c->N, sizeof *d->anchors);
    d->valid = calloc((size_t)c->N, 1);
    d->row_loss = falloc((size_t)R, &fail);
    d->row_weight = falloc((size_t)R, &fail);
    d->pred = calloc((size_t)R, sizeof *d->pred);
    d->tgt = calloc((size_t)R, sizeof *d->tgt);
    d->row_mask = calloc((size_t)R, 1);
    d->dx = falloc((size_t)R * H, &fail);
    d->dh = falloc((size_t)R * H, &fail);
    d->dxn = falloc((size_t)R * H, &fail);
    d->dxn1 = falloc((size_t)R * H, &fail);
    d->dact = falloc((size_t)R * I, &fail);
    d->dgate = falloc((size_t)R * I, &fail);
    d->dup = falloc((size_t)R * I, &fail);
    d->dout = falloc((size_t)R * QD, &fail);
    d->dq = falloc((size_t)R * QD, &fail);
    d->dk = falloc((size_t)KV * KD, &fail);
    d->dv = falloc((size_t)KV * KD, &fail);
    d->dkraw = falloc((size_t)KV * KD, &fail);
    d->dctx = falloc((size_t)T * H, &fail);
    d->dctx_fc = falloc((size_t)T * H, &fail);
    cpu_ops_blas_init();
    d->n_threads = cpu_ops_default_threads();
    lmhead_loss_config lc = {T, c->N, c->B, H, c->V_d, c->loss, c->weighting, c->gamma, c->alpha, c->eps};
    d->lm_ws = falloc((size_t)cpu_ops_lmhead_ws_floats(&lc, d->n_threads), &fail);
    if (fail || !d->pos || !d->tok || !d->maskpad || !d->anchors || !d->valid || !d->pred || !d->tgt || !d->row_mask) {
        drafter_free(d);
        err_fail(err, err_len, "drafter_init: out of memory planning buffers for T_max=%d N=%d B=%d H=%d", T, c->N,
                 c->B, H);
        return NULL;
    }
    if (c->d_h / 2 > DRAFTER_MAX_HALF_HEAD) {
        drafter_free(d);
        err_fail(err, err_len, "drafter_init: head dim %d too large", c->d_h);
        return NULL;
    }
    drafter_rope_inv_freq(c, d->inv_freq);
    drafter_init_weights(d, seed);
    return d;
}

const struct drafter_config *drafter_config_of(const struct drafter *d) { return &d->cfg; }

int drafter_set_threads(struct drafter *d, int n_threads, char *err, int err_len) {
    if (n_threads < 1 || n_threads > CPU_OPS_MAX_THREADS)
        return err_fail(err, err_len, "drafter_set_threads: %d threads, expected 1..%d", n_threads, CPU_OPS_MAX_THREADS);
    const struct drafter_config *c = &d->cfg;
    lmhead_loss_config lc = {c->T_max, c->N, c->B, c->H, d->V_d_cap, c->loss, c->weighting, c->gamma, c->alpha, c->eps};
    float *ws = calloc((size_t)cpu_ops_lmhead_ws_floats(&lc, n_threads), sizeof *ws);
    if (!ws) return err_fail(err, err_len, "drafter_set_threads: out of memory for the LM-head workspace of %d threads",
                             n_threads);
    free(d->lm_ws);
    d->lm_ws = ws;
    d->n_threads = n_threads;
    return 0;
}

int drafter_threads(const struct drafter *d) { return d->n_threads; }
int drafter_n_params(const struct drafter *d) { return d->n_params; }
const struct drafter_param *drafter_param(const struct drafter *d, int i) {
    return i >= 0 && i < d->n_params ? &d->params[i] : NULL;
}
const struct drafter_param *drafter_layer_param(const struct drafter *d, int l, int j) {
    if (l < 0 || l >= d->cfg.L || j < 0 || j >= LP_N) return NULL;
    return &d->params[d->i_layer0 + LP_N * l + j];
}
const struct drafter_param *drafter_param_find(const struct drafter *d, const char *name) {
    for (int i = 0; i < d->n_params; i++)
        if (!strcmp(d->params[i].name, name)) return &d->params[i];
    return NULL;
}
void drafter_zero_grad(struct drafter *d) {
    for (int i = 0; i < d->n_params; i++)
        if (d->params[i].g) memset(d->params[i].g, 0, sizeof(float) * (size_t)d->params[i].numel);
}

/* Elements [e0, e1) of one matrix's init stream (e0 even): pair k = e/2 takes draws 2k+1 and 2k+2 of the splitmix64
 * stream from st0, so a range starts from the state st0 + e0·gamma and any split of the pairs gives the same values
 * bit for bit (the counter form of kernels/common.h). */
struct init_job {
    float *w;
    int64_t numel, e0, e1;
    uint64_t st0;
    double std;
};

static void *init_range(void *arg) {
    const struct init_job *j = arg;
    uint64_t st = j->st0 + (uint64_t)j->e0 * KERNELS_RNG_GAMMA;
    for (int64_t e = j->e0; e < j->e1; e += 2) {
        /* Box–Muller on two 53-bit uniforms; u1 in (0, 1] so the log is finite */
        double u1 = ((kernels_rng_next(&st) >> 11) + 1.0) * 0x1.0p-53;
        double u2 = (kernels_rng_next(&st) >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1));
        j->w[e] = (float)(j->std * r * cos(2 * M_PI * u2));
        if (e + 1 < j->numel) j->w[e + 1] = (float)(j->std * r * sin(2 * M_PI * u2));
    }
    return NULL;
}

/* Threads for the init of a large matrix (start-up of the standard drafter: 1.05B values, ~40 s on one core). */
#define INIT_MAX_THREADS 32
#define INIT_MIN_PER_THREAD ((int64_t)1 << 20)

void drafter_init_weights(struct drafter *d, uint64_t seed) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt_max = cores < 1 ? 1 : cores > INIT_MAX_THREADS ? INIT_MAX_THREADS : (int)cores;
    for (int i = 0; i < d->n_params; i++) {
        struct drafter_param *p = &d->params[i];
        if (!p->trainable) continue;
        if (p->ndim == 1) {
            for (int64_t e = 0; e < p->numel; e++) p->w[e] = 1.0f;
            continue;
        }
        const uint64_t st0 = anchors_mix64(anchors_mix64(seed) ^ (uint64_t)i);
        int nt = (int)(p->numel / INIT_MIN_PER_THREAD);
        nt = nt < 1 ? 1 : nt > nt_max ? nt_max : nt;
        struct init_job jobs[INIT_MAX_THREADS];
        pthread_t th[INIT_MAX_THREADS];
        int started[INIT_MAX_THREADS] = {0};
        const int64_t pairs = (p->numel + 1) / 2;
        for (int t = 0; t < nt; t++) {
            int64_t a = 2 * (pairs * t / nt), b = 2 * (pairs * (t + 1) / nt);
            jobs[t] = (struct init_job){p->w, p->numel, a, b < p->numel ? b : p->numel, st0, (double)d->cfg.init_std};
            /* a thread that cannot start runs its range here: the values do not depend on who computes them */
            started[t] = t > 0 && pthread_create(&th[t], NULL, init_range, &jobs[t]) == 0;
        }
        for (int t = 0; t < nt; t++)
            if (!started[t]) init_range(&jobs[t]);
        for (int t = 1; t < nt; t++)
            if (started[t]) pthread_join(th[t], NULL);
    }
}

int drafter_set_vocab(struct drafter *d, const uint8_t *t2d, const int64_t *d2t, int V_d, char *err, int err_len) {
    if (V_d < 1 || V_d > d->V_d_cap)
        return err_fail(err, err_len, "drafter_set_vocab: V_d=%d outside [1, %d] (the drafter was planned for %d)", V_d,
                        d->V_d_cap, d->V_d_cap);
    if (lmhead_vocab_check(t2d, d->cfg.V_t, d2t, V_d, err, err_len)) return -1;
    uint8_t *t = malloc((size_t)d->cfg.V_t);
    int64_t *m = malloc(sizeof *m * (size_t)V_d);
    if (!t || !m) {
        free(t); free(m);
        return err_fail(err, err_len, "drafter_set_vocab: out of memory");
    }
    memcpy(t, t2d, (size_t)d->cfg.V_t);
    memcpy(m, d2t, sizeof *m * (size_t)V_d);
    free(d->t2d);
    free(d->d2t);
    d->t2d = t;
    d->d2t = m;
    d->cfg.V_d = V_d;
    d->params[d->i_lm].shape[0] = d->params[d->i_vlm].shape[0] = V_d;
    d->params[d->i_lm].numel = d->params[d->i_vlm].numel = (int64_t)V_d * d->cfg.H;
    return 0;
}

/* lm_head and verifier_lm_head from a full [V_t, H] head, pruned by d2t when set. */
static int set_heads(struct drafter *d, const float *full, char *err, int err_len) {
    int H = d->cfg.H, V_d = d->cfg.V_d;
    float *lm = d->params[d->i_lm].w, *vlm = d->params[d->i_vlm].w;
    if (d->d2t) {
        if (lmhead_prune_ref(full, d->cfg.V_t, H, d->d2t, V_d, lm, err, err_len)) return -1;
    } else {
        memcpy(lm, full, sizeof(float) * (size_t)V_d * H);
    }
    memcpy(vlm, lm, sizeof(float) * (size_t)V_d * H);
    return 0;
}

int drafter_set_frozen(struct drafter *d, const float *embed, const float *norm, const float *lm_head, char *err,
                       int err_len) {
    memcpy(d->params[d->i_embed].w, embed, sizeof(float) * (size_t)d->cfg.V_t * d->cfg.H);
    memcpy(d->params[d->i_vnorm].w, norm, sizeof(float) * (size_t)d->cfg.H);
    return set_heads(d, lm_head, err, err_len);
}

int drafter_load_target(struct drafter *d, const char *dir, char *err, int err_len) {
    struct hf_weights w;
    if (hf_weights_open(&w, dir, err, err_len)) return -1;
    int rc = -1, H = d->cfg.H;
    int64_t sh_e[2] = {d->cfg.V_t, H}, sh_n[1] = {H};
    float *full = NULL;
    if (weights_get_f32(&w, "model.embed_tokens.weight", 2, sh_e, d->params[d->i_embed].w, err, err_len)) goto out;
    if (weights_get_f32(&w, "model.norm.weight", 1, sh_n, d->params[d->i_vnorm].w, err, err_len)) goto out;
    if (d->cfg.target.tie_word_embeddings) {
        rc = set_heads(d, d->params[d->i_embed].w, err, err_len);
        goto out;
    }
    full = malloc(sizeof *full * (size_t)d->cfg.V_t * H);
    if (!full) {
        err_fail(err, err_len, "drafter_load_target: out of memory for the [%d, %d] LM head", d->cfg.V_t, H);
        goto out;
    }
    if (weights_get_f32(&w, "lm_head.weight", 2, sh_e, full, err, err_len)) goto out;
    rc = set_heads(d, full, err, err_len);
out:
    free(full);
    hf_weights_close(&w);
    return rc;
}

/* ---------------------------------------------------------------- metrics */

void drafter_metrics_zero(struct drafter_metrics *m, int B) {
    memset(m, 0, sizeof *m);
    m->B = B;
}

void drafter_metrics_add(struct drafter_metrics *dst, const struct drafter_metrics *src) {
    dst->loss_sum += src->loss_sum;
    dst->loss_count += src->loss_count;
    if (src->B > dst->B) dst->B = src->B;
    for (int j = 0; j < src->B; j++) {
        dst->correct[j] += src->correct[j];
        dst->total[j] += src->total[j];
    }
    dst->full_correct += src->full_correct;
    dst->full_total += src->full_total;
    dst->eal_sum += src->eal_sum;
    dst->eal_count += src->eal_count;
    dst->n_anchors += src->n_anchors;
    dst->eal_marginal = drafter_metrics_eal_marginal(dst);
}

double drafter_metrics_eal_marginal(const struct drafter_metrics *m) {
    double eal = 0, prod = 1;
    for (int j = 1; j < m->B; j++) {
        prod *= (double)m->correct[j] / (double)(m->total[j] > 1 ? m->total[j] : 1);
        eal += prod;
    }
    return eal;
}

uint64_t drafter_noise_base(uint64_t seed, uint64_t step) {
    return anchors_mix64(anchors_mix64(seed ^ 0x6e6f697365ull /* "noise" */) ^ step);
}

/* ---------------------------------------------------------------- CPU step */

#define W(i) (d->params[(i)].w)
#define G(i) (d->params[(i)].g)
#define LW(l, j) W(d->i_layer0 + LP_N * (l) + (j))
#define LG(l, j) G(d->i_layer0 + LP_N * (l) + (j))

/* y[M,N] = x[M,K]·w[N,K]ᵀ: the reference, or BLAS on d->n_threads threads when fast. */
static void lin_fwd(const struct drafter *d, int fast, float *y, const float *x, const float *w, int M, int N, int K) {
    if (fast) cpu_ops_linear_forward(d->n_threads, y, x, w, M, N, K);
    else gemm_linear_forward_ref(y, x, w, NULL, M, N, K);
}

/* dx (=, or += when dx_acc) = dy·w and dw += dyᵀ·x for a linear y[M,N] = x[M,K]·w[N,K]ᵀ; either may be NULL. */
static void lin_bwd(const struct drafter *d, int fast, float *dx, int dx_acc, float *dw, const float *dy,
                    const float *x, const float *w, int M, int N, int K) {
    if (fast) {
        if (dx) cpu_ops_linear_backward_dx(d->n_threads, dx, dy, w, M, N, K, dx_acc);
        if (dw) cpu_ops_linear_backward_dw(d->n_threads, dw, dy, x, M, N, K);
        return;
    }
    if (dx) gemm_linear_backward_ref(dx, NULL, NULL, dy, x, w, M, N, K, dx_acc);
    if (dw) gemm_linear_backward_ref(NULL, dw, NULL, dy, x, w, M, N, K, 1);
}

/* The row-wise ops: the reference, or the same reference on row chunks in parallel (bitwise equal) when fast. */
static void rms_fwd(const struct drafter *d, int fast, float *y, float *rstd, const float *x, const float *w, int N,
                    int C, float eps) {
    if (fast) cpu_ops_rmsnorm_forward(d->n_threads, y, rstd, x, w, N, C, eps);
    else rmsnorm_forward_ref(y, rstd, x, w, N, C, eps);
}

static void rms_bwd(const struct drafter *d, int fast, float *dx, float *dw, const float *dy, const float *x,
                    const float *w, const float *rstd, int N, int C, int accumulate_dx) {
    if (fast) cpu_ops_rmsnorm_backward(d->n_threads, dx, dw, dy, x, w, rstd, N, C, accumulate_dx);
    else rmsnorm_backward_ref(dx, dw, dy, x, w, rstd, N, C, accumulate_dx);
}

static void rope_fwd(const struct drafter *d, int fast, float *q, const int32_t *pos, int T, int NH, int HD) {
    if (fast) cpu_ops_rope_forward(d->n_threads, q, pos, d->inv_freq, T, NH, HD);
    else rope_forward_ref(q, NULL, pos, d->inv_freq, T, NH, 0, HD);
}

static void rope_bwd(const struct drafter *d, int fast, float *dq, const int32_t *pos, int T, int NH, int HD) {
    if (fast) cpu_ops_rope_backward(d->n_threads, dq, pos, d->inv_freq, T, NH, HD);
    else rope_backward_ref(dq, NULL, pos, d->inv_freq, T, NH, 0, HD);
}

static int check_batch(const struct drafter *d, const struct drafter_batch *b, char *err, int err_len) {
    const struct drafter_config *c = &d->cfg;
    if (b->T < 1 || b->T > c->T_max)
        return err_fail(err, err_len, "drafter_step: batch of %d tokens, expected 1..%d (the drafter's budget)", b->T,
                        c->T_max);
    if (b->budget < b->T || b->budget > c->T_max)
        return err_fail(err, err_len, "drafter_step: token budget %d must lie in [T=%d, T_max=%d]", b->budget, b->T,
                        c->T_max);
    if (!b->input_ids || !b->loss_mask || !b->position_ids || !b->doc_ids || !b->hidden || !b->last)
        return err_fail(err, err_len, "drafter_step: a batch array is NULL");
    for (int t = 0; t < b->T; t++) {
        if (b->input_ids[t] < 0 || b->input_ids[t] >= c->V_t)
            return err_fail(err, err_len, "drafter_step: input_ids[%d]=%d is outside the embedding [0, %d)", t,
                            b->input_ids[t], c->V_t);
        if (b->position_ids[t] < 0)
            return err_fail(err, err_len, "drafter_step: position_ids[%d]=%d is negative", t, b->position_ids[t]);
    }
    return 0;
}

static int step_impl(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                     int fast, struct drafter_metrics *m, char *err, int err_len);

int drafter_step(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                 struct drafter_metrics *m, char *err, int err_len) {
    return step_impl(d, b, seed, step, train, 1, m, err, err_len);
}

int drafter_step_fast(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                      struct drafter_metrics *m, char *err, int err_len) {
    return step_impl(d, b, seed, step, train, 1, m, err, err_len);
}

int drafter_step_cpu(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                     struct drafter_metrics *m, char *err, int err_len) {
    return step_impl(d, b, seed, step, train, 0, m, err, err_len);
}

/* The step, fast = 0: every op a kernels/<op>_ref.c reference; fast = 1: stages/train/cpu_ops.h: the linear layers,
 * block attention and the LM head + loss on BLAS (fused, threaded), the row-wise ops as the references on row
 * chunks in parallel (bitwise equal to the references). */
static int step_impl(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                     int fast, struct drafter_metrics *m, char *err, int err_len) {
    if (check_batch(d, b, err, err_len)) return -1;
    const struct drafter_config *c = &d->cfg;
    const int T = b->T, N = c->N, B = c->B, R = N * B, H = c->H, I = c->I, kH = c->k * H;
    const int nh = c->n_h, nkv = c->n_kv, dh = c->d_h, QD = nh * dh, KD = nkv * dh, KV = T + R;
    const float eps = c->eps;

    /* anchors (§5): candidates p < budget - B with loss_mask[p]; the mask is padded with 0 to the budget */
    memset(d->maskpad, 0, (size_t)b->budget);
    memcpy(d->maskpad, b->loss_mask, (size_t)T);
    int K = anchors_forward_ref(d->maskpad, b->budget, B, N, seed, step, d->anchors, d->valid, err, err_len);
    if (K < 0) return -1;

    /* block tokens and positions (§4.2 steps 2 and 4) */
    for (int bb = 0; bb < N; bb++)
        for (int j = 0; j < B; j++) {
            int a = d->anchors[bb];
            d->tok[bb * B + j] = j == 0 ? b->input_ids[a] : (int32_t)c->mask_token_id;
            d->pos[T + bb * B + j] = b->position_ids[a] + j;
        }
    memcpy(d->pos, b->position_ids, sizeof(int32_t) * (size_t)T);
    if (embedding_forward_ref(d->act[0].xin, d->tok, W(d->i_embed), R, H, c->V_t))
        return err_fail(err, err_len, "drafter_step: %s", kernels_error());

    /* features as consumed: + uniform noise on the train path only (§0), counter-based */
    if (train && c->noise > 0) {
        uint64_t base = drafter_noise_base(seed, step);
        for (size_t e = 0; e < (size_t)T * kH; e++) {
            uint64_t st = base + (uint64_t)e * 0x9E3779B97F4A7C15ull;
            double u = (kernels_rng_next(&st) >> 40) * 0x1.0p-24;
            d->hid_used[e] = b->hidden[e] + (float)(2.0 * (u - 0.5) * c->noise);
        }
    } else {
        memcpy(d->hid_used, b->hidden, sizeof(float) * (size_t)T * kH);
    }

    /* context c = hidden_norm(fc(features)) (§4.2 step 3) */
    lin_fwd(d, fast, d->ctx_fc, d->hid_used, W(d->i_fc), T, H, kH);
    rms_fwd(d, fast, d->ctx, d->rstd_c, d->ctx_fc, W(d->i_hnorm), T, H, eps);

    block_attn_config ac = {T, N, B, nh, nkv, dh, 0, 0, 1.0f / sqrtf((float)dh)};
    for (int l = 0; l < c->L; l++) {
        struct drafter_act *a = &d->act[l];
        int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        ac.window = sliding ? c->sliding_window : 0;
        ac.causal = sliding && !c->sliding_window_non_causal;
        rms_fwd(d, fast, a->xn1, a->rstd1, a->xin, LW(l, LP_IN_LN), R, H, eps);
        lin_fwd(d, fast, a->qraw, a->xn1, LW(l, LP_Q), R, QD, H);
        lin_fwd(d, fast, a->kraw, d->ctx, LW(l, LP_K), T, KD, H);
        lin_fwd(d, fast, a->kraw + (size_t)T * KD, a->xn1, LW(l, LP_K), R, KD, H);
        lin_fwd(d, fast, a->v, d->ctx, LW(l, LP_V), T, KD, H);
        lin_fwd(d, fast, a->v + (size_t)T * KD, a->xn1, LW(l, LP_V), R, KD, H);
        rms_fwd(d, fast, a->q, a->rstdq, a->qraw, LW(l, LP_QN), R * nh, dh, eps);
        rms_fwd(d, fast, a->k, a->rstdk, a->kraw, LW(l, LP_KN), KV * nkv, dh, eps);
        rope_fwd(d, fast, a->q, d->pos + T, R, nh, dh);
        rope_fwd(d, fast, a->k, d->pos, KV, nkv, dh);
        if (fast ? cpu_ops_block_attn_forward(d->n_threads, &ac, a->q, a->k, a->v, d->anchors, b->doc_ids, a->o, a->lse,
                                              err, err_len)
                 : block_attn_forward_ref(&ac, a->q, a->k, a->v, d->anchors, b->doc_ids, 0, a->o, a->lse, err, err_len))
            return -1;
        /* h = x + o_proj(attn) */
        lin_fwd(d, fast, a->h, a->o, LW(l, LP_O), R, H, QD);
        for (size_t e = 0; e < (size_t)R * H; e++) a->h[e] += a->xin[e];
        rms_fwd(d, fast, a->xn2, a->rstd2, a->h, LW(l, LP_POST_LN), R, H, eps);
        lin_fwd(d, fast, a->gate, a->xn2, LW(l, LP_GATE), R, I, H);
        lin_fwd(d, fast, a->up, a->xn2, LW(l, LP_UP), R, I, H);
        if (fast) cpu_ops_swiglu_forward(d->n_threads, a->act, a->gate, a->up, R, I);
        else swiglu_forward_ref(a->act, a->gate, a->up, R, I, I);
        float *xo = l + 1 < c->L ? d->act[l + 1].xin : d->x_out;
        lin_fwd(d, fast, xo, a->act, LW(l, LP_DOWN), R, H, I);
        for (size_t e = 0; e < (size_t)R * H; e++) xo[e] += a->h[e];
    }
    rms_fwd(d, fast, d->xn, d->rstd_f, d->x_out, W(d->i_norm), R, H, eps);

    /* loss and metrics (§7, §8) */
    lmhead_loss_config lc = {T, N, B, H, c->V_d, c->loss, c->weighting, c->gamma, c->alpha, eps};
    lmhead_loss_mode md = {b->budget, c->sample_from_anchor};
    float loss;
    if (fast) {   /* forward, metrics and (train) dL/dxn in one pass over the vocabulary */
        if (cpu_ops_lmhead_loss(d->n_threads, &lc, &md, d->xn, W(d->i_lm), W(d->i_vlm), W(d->i_vnorm), b->last,
                                d->anchors, d->valid, b->loss_mask, d->lm_ws, &loss, d->row_loss, d->row_weight,
                                d->correct, d->total, d->pred, d->tgt, d->row_mask, train ? d->dxn : NULL, err,
                                err_len))
            return -1;
    } else {
        if (lmhead_loss_forward_mode_ref(&lc, &md, d->xn, W(d->i_lm), W(d->i_vlm), W(d->i_vnorm), b->last, d->anchors,
                                         d->valid, b->loss_mask, 0, &loss, d->row_loss, d->row_weight, d->correct,
                                         d->total, err, err_len))
            return -1;
        if (lmhead_argmax_ref(&lc, &md, d->xn, W(d->i_lm), W(d->i_vlm), W(d->i_vnorm), b->last, d->anchors, d->valid,
                              b->loss_mask, 0, d->pred, d->tgt, d->row_mask, err, err_len))
            return -1;
    }
    d->last_T = T;
    d->last_loss = loss;
    if (m) {
        int first = c->sample_from_anchor ? 0 : 1;
        drafter_metrics_zero(m, B);
        m->loss_sum = loss;
        m->loss_count = 1;
        for (int j = 0; j < B; j++) {
            m->correct[j] = d->correct[j];
            m->total[j] = d->total[j];
            if (j >= first) {
                m->full_correct += d->correct[j];
                m->full_total += d->total[j];
            }
        }
        lmhead_eal_blocks(d->row_mask, d->pred, d->tgt, N, B, first, &m->eal_sum, &m->eal_count);
        m->eal_marginal = lmhead_eal(d->correct, d->total, B);
        m->n_anchors = K;
    }
    if (!train) return 0;

    /* ---- backward: gradients added into g */
    if (!fast && lmhead_loss_backward_mode_ref(&lc, &md, d->xn, W(d->i_lm), W(d->i_vlm), W(d->i_vnorm), b->last,
                                               d->anchors, d->valid, b->loss_mask, 0, d->row_weight, d->dxn, err,
                                               err_len))
        return -1;
    rms_bwd(d, fast, d->dx, G(d->i_norm), d->dxn, d->x_out, W(d->i_norm), d->rstd_f, R, H, 0);
    memset(d->dctx, 0, sizeof(float) * (size_t)T * H);
    for (int l = c->L - 1; l >= 0; l--) {
        struct drafter_act *a = &d->act[l];
        int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        ac.window = sliding ? c->sliding_window : 0;
        ac.causal = sliding && !c->sliding_window_non_causal;
        /* MLP: x_out = h + down(swiglu(gate(xn2), up(xn2))) */
        lin_bwd(d, fast, d->dact, 0, LG(l, LP_DOWN), d->dx, a->act, LW(l, LP_DOWN), R, H, I);
        if (fast) cpu_ops_swiglu_backward(d->n_threads, d->dgate, d->dup, d->dact, a->gate, a->up, R, I);
        else swiglu_backward_ref(d->dgate, d->dup, d->dact, a->gate, a->up, R, I, I);
        lin_bwd(d, fast, d->dxn, 0, LG(l, LP_GATE), d->dgate, a->xn2, LW(l, LP_GATE), R, I, H);
        lin_bwd(d, fast, d->dxn, 1, LG(l, LP_UP), d->dup, a->xn2, LW(l, LP_UP), R, I, H);
        memcpy(d->dh, d->dx, sizeof(float) * (size_t)R * H);
        rms_bwd(d, fast, d->dh, LG(l, LP_POST_LN), d->dxn, a->h, LW(l, LP_POST_LN), a->rstd2, R, H, 1);
        /* attention: h = xin + o_proj(attn(q, k, v)) */
        lin_bwd(d, fast, d->dout, 0, LG(l, LP_O), d->dh, a->o, LW(l, LP_O), R, H, QD);
        if (fast ? cpu_ops_block_attn_backward(d->n_threads, &ac, a->q, a->k, a->v, d->anchors, b->doc_ids, a->o,
                                               d->dout, a->lse, d->dq, d->dk, d->dv, err, err_len)
                 : block_attn_backward_ref(&ac, a->q, a->k, a->v, d->anchors, b->doc_ids, a->o, d->dout, a->lse, d->dq,
                                           d->dk, d->dv, err, err_len))
            return -1;
        rope_bwd(d, fast, d->dq, d->pos + T, R, nh, dh);
        rope_bwd(d, fast, d->dk, d->pos, KV, nkv, dh);
        /* q/k norms: the gradients of the raw projections (dout is free again after the attention backward) */
        float *dqraw = d->dout, *dkraw = d->dkraw;
        rms_bwd(d, fast, dqraw, LG(l, LP_QN), d->dq, a->qraw, LW(l, LP_QN), a->rstdq, R * nh, dh, 0);
        rms_bwd(d, fast, dkraw, LG(l, LP_KN), d->dk, a->kraw, LW(l, LP_KN), a->rstdk, KV * nkv, dh, 0);
        /* projections: block rows from xn1, context rows from ctx */
        lin_bwd(d, fast, d->dxn1, 0, LG(l, LP_Q), dqraw, a->xn1, LW(l, LP_Q), R, QD, H);
        lin_bwd(d, fast, d->dxn1, 1, LG(l, LP_K), dkraw + (size_t)T * KD, a->xn1, LW(l, LP_K), R, KD, H);
        lin_bwd(d, fast, d->dxn1, 1, LG(l, LP_V), d->dv + (size_t)T * KD, a->xn1, LW(l, LP_V), R, KD, H);
        lin_bwd(d, fast, d->dctx, 1, LG(l, LP_K), dkraw, d->ctx, LW(l, LP_K), T, KD, H);
        lin_bwd(d, fast, d->dctx, 1, LG(l, LP_V), d->dv, d->ctx, LW(l, LP_V), T, KD, H);
        /* residual: dx_in = dh + input_layernorm backward */
        memcpy(d->dx, d->dh, sizeof(float) * (size_t)R * H);
        rms_bwd(d, fast, d->dx, LG(l, LP_IN_LN), d->dxn1, a->xin, LW(l, LP_IN_LN), a->rstd1, R, H, 1);
    }
    /* the block input is the frozen embedding: d->dx stops here. Context: hidden_norm then fc. */
    rms_bwd(d, fast, d->dctx_fc, G(d->i_hnorm), d->dctx, d->ctx_fc, W(d->i_hnorm), d->rstd_c, T, H, 0);
    lin_bwd(d, fast, NULL, 0, G(d->i_fc), d->dctx_fc, d->hid_used, W(d->i_fc), T, H, kH);
    return 0;
}

void drafter_last_step(const struct drafter *d, struct drafter_last *out) {
    out->T = d->last_T;
    out->N = d->cfg.N;
    out->B = d->cfg.B;
    out->H = d->cfg.H;
    out->k = d->cfg.k;
    out->anchors = d->anchors;
    out->valid = d->valid;
    out->pred = d->pred;
    out->tgt = d->tgt;
    out->row_mask = d->row_mask;
    out->xn = d->xn;
    out->hidden_used = d->hid_used;
    out->loss = d->last_loss;
    out->ctx_fc = d->ctx_fc;
    out->ctx = d->ctx;
    for (int l = 0; l < d->cfg.L; l++) out->layer_out[l] = l + 1 < d->cfg.L ? d->act[l + 1].xin : d->x_out;
    out->t2d = d->t2d;
    out->d2t = d->d2t;
}
