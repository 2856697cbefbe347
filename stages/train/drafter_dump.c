/*
 * stages/train/drafter_dump.c — the speculators-style config.json of a drafter and the debug dump of one step
 * (stages/train/drafter.h, issue 16 item 7), so any other implementation can replay the step.
 *
 * dir/step-N/ holds
 *   batch.safetensors       hidden_states F32 [T, k·H] (as consumed: after noise; the CPU path does not round to
 *                           bf16), verifier_last_hidden_states F32 [T, H], input_ids, loss_mask, position_ids,
 *                           document_ids I64 [T] (unpadded; the budget is the manifest's total_seq_len),
 *                           anchors I64 [N], anchor_valid BOOL [N] (0/1 bytes: safetensors.h has no U8),
 *                           target_ids, pred_ids I64 [N·B] (per-row argmaxes; target -1 past the batch),
 *                           loss_mask_aligned BOOL [N·B] (the §5 row mask)
 *   weights.safetensors     every drafter tensor before the step, F32, speculators names, + t2d BOOL [V_t] and
 *                           d2t I64 [V_d] when V_d < V_t
 *   grads.safetensors       the micro-batch's own gradient, F32, trainable tensors only, same names
 *   activations.safetensors context.fc [T, H] (after fc), context.hidden_norm [T, H] (after hidden_norm),
 *                           layers.{l}.output [N·B, H], norm.output [N·B, H] (the final normed state)
 *   manifest.json           drafter_config_json's keys + the step's record (see dump_manifest)
 * Every file is written atomically (safetensors writer, fs_write_atomic).
 */
#include "train/drafter.h"

#include "core/err.h"
#include "core/fsutil.h"
#include "kernels/lmhead_loss.h"
#include "core/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- config.json */

/* A float option as the decimal a person wrote (0.02, not 0.019999999552965164). */
static double f2d(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)x);
    return strtod(b, NULL);
}

static json_t *config_json(const struct drafter_config *c, const char *verifier_name) {
    const struct model_config *t = &c->target;
    int ids[DESC_MAX_LAYERS], any_sliding = 0;
    drafter_zlab_ids(c, ids);
    json_t *aux = json_array(), *types = json_array();
    for (int i = 0; i < c->k; i++) json_array_append_new(aux, json_integer(ids[i] + 1));   /* speculators ids */
    for (int l = 0; l < c->L; l++) {
        any_sliding |= c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        json_array_append_new(types, json_string(c->layer_type[l] == DRAFTER_LAYER_SLIDING ? "sliding_attention"
                                                                                           : "full_attention"));
    }
    json_t *rope_scaling = hf_rope_scaling_json(t);
    int spec = c->sample_from_anchor ? c->B : c->B - 1;
    json_t *layer = json_pack(
        "{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:f, s:b, s:b, s:b, s:i, s:o, s:f, s:o}",
        "model_type", "qwen3", "vocab_size", c->V_t, "hidden_size", c->H, "intermediate_size", c->I,
        "num_hidden_layers", c->L, "num_attention_heads", c->n_h, "num_key_value_heads", c->n_kv, "head_dim", c->d_h,
        "hidden_act", "silu", "max_position_embeddings", t->max_position_embeddings, "initializer_range",
        f2d(c->init_std), "rms_norm_eps", c->target.rms_norm_eps > 0 ? c->target.rms_norm_eps : f2d(c->eps), "attention_bias", 0, "tie_word_embeddings", 0,
        "use_sliding_window", any_sliding, "sliding_window", c->sliding_window, "layer_types", types, "rope_theta",
        t->rope_theta, "rope_scaling", rope_scaling);
    json_t *verifier = json_pack("{s:s, s:[s]}", "name_or_path", verifier_name ? verifier_name : "",
                                 "architectures", t->architecture);
    json_t *sc = json_pack("{s:s, s:[{s:s, s:i, s:i, s:f}], s:s, s:o}", "algorithm", "dflash", "proposal_methods",
                           "proposal_type", "greedy", "speculative_tokens", spec, "verifier_accept_k", 1,
                           "accept_tolerance", 0.0, "default_proposal_method", "greedy", "verifier", verifier);
    json_t *j = json_pack("{s:[s], s:s, s:s, s:b, s:i, s:i, s:n, s:o, s:I, s:b, s:b, s:o, s:o}", "architectures",
                          "DFlashSpeculator", "speculators_model_type", "dflash", "dtype", "bfloat16",
                          "tie_word_embeddings", 0, "block_size", c->B, "draft_vocab_size", c->V_d,
                          "target_hidden_size", "aux_hidden_state_layer_ids", aux, "mask_token_id",
                          (json_int_t)c->mask_token_id, "sliding_window_non_causal", c->sliding_window_non_causal,
                          "sample_from_anchor", c->sample_from_anchor, "speculators_config", sc,
                          "transformer_layer_config", layer);
    return j;
}

char *drafter_config_json_text(const struct drafter_config *c, const char *verifier_name) {
    json_t *j = config_json(c, verifier_name);
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    return s;
}

/* ---------------------------------------------------------------- safetensors helpers */

struct tlist {
    int n, cap;
    struct st_write_tensor *t;
    void **owned;
    int n_owned;
    int oom;
};

static void tl_add(struct tlist *l, const char *name, enum st_dtype dt, int ndim, int64_t d0, int64_t d1,
                   const void *data) {
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 32;
        struct st_write_tensor *t = realloc(l->t, sizeof *t * (size_t)cap);
        if (!t) {
            l->oom = 1;
            return;
        }
        l->t = t;
        l->cap = cap;
    }
    struct st_write_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = data;
}

/* A buffer the list frees afterwards (widened copies); NULL on allocation failure (l->oom set). */
static void *tl_own(struct tlist *l, size_t bytes) {
    void **o = realloc(l->owned, sizeof *o * (size_t)(l->n_owned + 1));
    void *p = malloc(bytes ? bytes : 1);
    if (!o || !p) {
        free(p);
        if (o) l->owned = o;
        l->oom = 1;
        return NULL;
    }
    l->owned = o;
    l->owned[l->n_owned++] = p;
    return p;
}

static int64_t *tl_i64_from_i32(struct tlist *l, const int32_t *x, size_t n) {
    int64_t *p = tl_own(l, sizeof *p * n);
    if (p)
        for (size_t i = 0; i < n; i++) p[i] = x[i];
    return p;
}

static void tl_free(struct tlist *l) {
    for (int i = 0; i < l->n_owned; i++) free(l->owned[i]);
    free(l->owned);
    free(l->t);
}

static int tl_write(struct tlist *l, const char *dir, const char *file, char *err, int err_len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (l->oom) return err_fail(err, err_len, "%s: out of memory preparing the tensors", path);
    return st_write_file(path, l->n, l->t, err, err_len);
}

/* ---------------------------------------------------------------- dump */

static int dump_manifest(const struct drafter *d, const char *sdir, const struct drafter_batch *b,
                         const struct drafter_metrics *m, const struct drafter_dump_info *info, double grad_norm,
                         char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    json_t *j = config_json(c, info->verifier_name);
    if (!j) return err_fail(err, err_len, "%s/manifest.json: could not build the config JSON", sdir);
    json_t *pc = json_array(), *pt = json_array();
    for (int k = 0; k < c->B; k++) {
        json_array_append_new(pc, json_integer(m->correct[k]));
        json_array_append_new(pt, json_integer(m->total[k]));
    }
    const char *loss = c->loss == LMHEAD_LOSS_CE ? "ce" : "kl_div";
    const char *wt = c->weighting == LMHEAD_WEIGHT_DPACE ? "dpace"
                     : c->weighting == LMHEAD_WEIGHT_EXP_DECAY ? "fixed-exp-decay" : "none";
    int ids[DESC_MAX_LAYERS];
    drafter_zlab_ids(c, ids);
    json_t *given = json_array();
    for (int i = 0; i < c->k; i++) json_array_append_new(given, json_integer(c->layer_ids[i]));
    json_t *extra = json_pack(
        "{s:i, s:i, s:s, s:s, s:s, s:s, s:f, s:f, s:f, s:f, s:o, s:o, s:f, s:f, s:I, s:f, s:f, s:I, s:I, s:I, s:o, "
        "s:s, s:f, s:i, s:i}",
        "total_seq_len", b->budget, "n_tokens", b->T, "target_model_type", c->target.model_type, "compute_dtype",
        info->compute_dtype ? info->compute_dtype : "float32", "loss", loss, "weighting", wt, "gamma",
        f2d(c->gamma), "alpha", f2d(c->alpha), "loss_value", m->loss_sum, "grad_norm", grad_norm,
        "position_correct", pc, "position_total", pt, "full_acc",
        m->full_total ? (double)m->full_correct / (double)m->full_total : 0.0, "eal",
        m->eal_count ? m->eal_sum / (double)m->eal_count : 0.0, "eal_count", (json_int_t)m->eal_count,
        "eal_marginal", m->eal_marginal, "eal_sum", m->eal_sum, "step", (json_int_t)info->step, "seed",
        (json_int_t)info->seed, "mask_token", (json_int_t)c->mask_token_id, "target_layer_ids", given,
        "target_layer_ids_convention", drafter_ids_convention_name(c->ids_convention), "noise", f2d(c->noise),
        "max_anchors", c->N, "n_anchors", m->n_anchors);
    if (!extra) {
        json_decref(j);
        return err_fail(err, err_len, "%s/manifest.json: could not build the step record", sdir);
    }
    /* sample_from_anchor, sliding_window_non_causal, mask_token_id and block_size are config keys already */
    json_object_update(j, extra);
    json_decref(extra);
    char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text) return err_fail(err, err_len, "%s/manifest.json: json_dumps failed", sdir);
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", sdir);
    int rc = fs_write_atomic(path, text, strlen(text), err, err_len);
    free(text);
    return rc;
}

int drafter_dump_step(const struct drafter *d, const char *dir, const struct drafter_batch *b,
                      const struct drafter_metrics *m, const struct drafter_dump_info *info, char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    struct drafter_last ls;
    drafter_last_step(d, &ls);
    if (ls.T != b->T)
        return err_fail(err, err_len, "drafter_dump_step: the last step ran on %d tokens, the batch has %d: call it "
                        "right after drafter_step on that batch", ls.T, b->T);
    char sdir[4096];
    if (snprintf(sdir, sizeof sdir, "%s/step-%llu", dir, (unsigned long long)info->step) >= (int)sizeof sdir)
        return err_fail(err, err_len, "drafter_dump_step: dump directory path \"%s\" is too long", dir);
    if (fs_mkdir_p(sdir, err, err_len)) return -1;
    int T = b->T, N = c->N, R = c->N * c->B, H = c->H;
    int rc = -1;

    /* batch */
    struct tlist bl = {0};
    int64_t *anchors = tl_i64_from_i32(&bl, ls.anchors, (size_t)N);
    int64_t *pred = tl_i64_from_i32(&bl, ls.pred, (size_t)R), *tgt = tl_i64_from_i32(&bl, ls.tgt, (size_t)R);
    int64_t *ids = tl_i64_from_i32(&bl, b->input_ids, (size_t)T), *pos = tl_i64_from_i32(&bl, b->position_ids, (size_t)T);
    int64_t *doc = tl_i64_from_i32(&bl, b->doc_ids, (size_t)T), *lm = tl_own(&bl, sizeof(int64_t) * (size_t)T);
    if (lm)
        for (int t = 0; t < T; t++) lm[t] = b->loss_mask[t];
    tl_add(&bl, "hidden_states", ST_F32, 2, T, (int64_t)c->k * H, ls.hidden_used);
    tl_add(&bl, "verifier_last_hidden_states", ST_F32, 2, T, H, b->last);
    tl_add(&bl, "input_ids", ST_I64, 1, T, 0, ids);
    tl_add(&bl, "loss_mask", ST_I64, 1, T, 0, lm);
    tl_add(&bl, "position_ids", ST_I64, 1, T, 0, pos);
    tl_add(&bl, "document_ids", ST_I64, 1, T, 0, doc);
    tl_add(&bl, "anchors", ST_I64, 1, N, 0, anchors);
    tl_add(&bl, "anchor_valid", ST_BOOL, 1, N, 0, ls.valid);
    tl_add(&bl, "target_ids", ST_I64, 1, R, 0, tgt);
    tl_add(&bl, "pred_ids", ST_I64, 1, R, 0, pred);
    tl_add(&bl, "loss_mask_aligned", ST_BOOL, 1, R, 0, ls.row_mask);
    rc = tl_write(&bl, sdir, "batch.safetensors", err, err_len);
    tl_free(&bl);
    if (rc) return -1;

    /* weights and grads; the grad norm of this micro-batch (pre-clip) */
    struct tlist wl = {0}, gl = {0};
    double sumsq = 0;
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *p = drafter_param(d, i);
        tl_add(&wl, p->name, ST_F32, p->ndim, p->shape[0], p->shape[1], p->w);
        if (p->g) {
            tl_add(&gl, p->name, ST_F32, p->ndim, p->shape[0], p->shape[1], p->g);
            for (int64_t e = 0; e < p->numel; e++) sumsq += (double)p->g[e] * p->g[e];
        }
    }
    if (ls.d2t && c->V_d < c->V_t) {
        tl_add(&wl, "t2d", ST_BOOL, 1, c->V_t, 0, ls.t2d);
        tl_add(&wl, "d2t", ST_I64, 1, c->V_d, 0, ls.d2t);
    }
    rc = tl_write(&wl, sdir, "weights.safetensors", err, err_len);
    if (!rc) rc = tl_write(&gl, sdir, "grads.safetensors", err, err_len);
    tl_free(&wl);
    tl_free(&gl);
    if (rc) return -1;

    /* activations */
    struct tlist al = {0};
    char names[DRAFTER_MAX_LAYERS][48];
    tl_add(&al, "context.fc", ST_F32, 2, T, H, ls.ctx_fc);
    tl_add(&al, "context.hidden_norm", ST_F32, 2, T, H, ls.ctx);
    for (int l = 0; l < c->L; l++) {
        snprintf(names[l], sizeof names[l], "layers.%d.output", l);
        tl_add(&al, names[l], ST_F32, 2, R, H, ls.layer_out[l]);
    }
    tl_add(&al, "norm.output", ST_F32, 2, R, H, ls.xn);
    rc = tl_write(&al, sdir, "activations.safetensors", err, err_len);
    tl_free(&al);
    if (rc) return -1;

    return dump_manifest(d, sdir, b, m, info, sqrt(sumsq), err, err_len);
}
