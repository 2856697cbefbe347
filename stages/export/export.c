/*
 * stages/export/export.c — exports for vLLM / SGLang, the loaders' rules (export_rules: one function, read from
 * the loaders' code at the versions export.h names), their checker, and a drafter rebuilt from a checkpoint
 * (stages/export/export.h).
 */
#include "export/export.h"
#include "train/train_config.h"

#include "core/err.h"
#include "core/fsutil.h"
#include "kernels/common.h"
#include "kernels/lmhead_loss.h"
#include "model/hfconfig.h"
#include "core/safetensors.h"
#include "model/weights.h"
#include "train/ckpt.h"
#include "train/optim.h"
#include "train/vocab.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *export_format_name(int format) { return format == EXPORT_ZLAB ? "zlab" : "speculators"; }

/* ---------------------------------------------------------------- JSON helpers */

/* An integer key of o (a JSON integer, or a real with an integral value); 0 found, 1 absent, -1 wrong type. */
static int j_int(const json_t *o, const char *key, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 1;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    return -1;
}

/* A required integer key: 0, or -1 with "FILE: key K ..." */
static int need_int(const json_t *o, const char *key, int64_t *out, const char *what, char *err, int err_len) {
    int r = j_int(o, key, out);
    if (r == 1) return err_fail(err, err_len, "%s: key \"%s\" is missing", what, key);
    if (r < 0) return err_fail(err, err_len, "%s: key \"%s\" must be an integer", what, key);
    return 0;
}

/* An array of integers into ids (at most max); returns the count, or -1 with a sentence. */
static int int_array(const json_t *a, const char *key, int *ids, int max, const char *what, char *err, int err_len) {
    if (!json_is_array(a))
        return err_fail(err, err_len, "%s: key \"%s\" must be an array of integers", what, key);
    int n = (int)json_array_size(a);
    if (n > max) return err_fail(err, err_len, "%s: key \"%s\" has %d entries, at most %d", what, key, n, max);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < INT_MIN || json_integer_value(v) > INT_MAX)
            return err_fail(err, err_len, "%s: key \"%s\"[%d] must be an integer", what, key, i);
        ids[i] = (int)json_integer_value(v);
    }
    return n;
}

/* ---------------------------------------------------------------- checkpoint -> drafter */

struct drafter *export_load_checkpoint(const char *ckpt_path, const char *target_dir, const char *draft_vocab_dir,
                                       int T_max, int N, int64_t *step, char *err, int err_len) {
    struct ckpt_info info;
    memset(&info, 0, sizeof info);
    if (ckpt_verify(ckpt_path, &info, err, err_len)) return NULL;
    json_error_t je;
    json_t *j = json_loads(info.config_json, 0, &je);
    if (!j || !json_is_object(j)) {
        err_fail(err, err_len, "%s: the configuration is not a JSON object (%s)", ckpt_path, je.text);
        json_decref(j);
        ckpt_info_free(&info);
        return NULL;
    }
    struct drafter_config c;
    struct train_hparams hp;
    struct train_config_target tt;
    int rc = train_config_parse(j, ckpt_path, &c, &hp, &tt, err, err_len);   /* the keys' one owner */
    int64_t seed = hp.seed, hidden = tt.hidden_size, layers = tt.target_layers, vocab = tt.vocab_size,
            dvocab = tt.draft_vocab_size;
    int opt_kind = hp.optimizer;
    json_decref(j);
    if (step) *step = info.step;
    ckpt_info_free(&info);
    if (rc) return NULL;
    struct model_config tc;
    char tcfg[4096];
    snprintf(tcfg, sizeof tcfg, "%s/config.json", target_dir);
    if (hf_config_load(&tc, tcfg, err, err_len)) return NULL;
    if (tc.hidden_size != hidden) {
        err_fail(err, err_len, "%s: key hidden_size is %lld, the target %s has %d", ckpt_path, (long long)hidden, tcfg,
                 tc.hidden_size);
        return NULL;
    }
    if (tc.num_hidden_layers != layers) {
        err_fail(err, err_len, "%s: key target_layers is %lld, the target %s has num_hidden_layers %d", ckpt_path,
                 (long long)layers, tcfg, tc.num_hidden_layers);
        return NULL;
    }
    if (tc.vocab_size != vocab) {
        err_fail(err, err_len, "%s: key vocab_size is %lld, the target %s has %d", ckpt_path, (long long)vocab, tcfg,
                 tc.vocab_size);
        return NULL;
    }
    if (T_max > 0) c.T_max = T_max;
    if (N > 0) c.N = N;
    if (drafter_config_from_target(&c, target_dir, err, err_len)) return NULL;
    uint8_t *t2d = NULL;
    int64_t *d2t = NULL;
    if (dvocab < vocab) {
        if (!draft_vocab_dir) {
            err_fail(err, err_len, "%s: key draft_vocab_size is %lld < vocab_size %lld: pass the draft vocabulary "
                     "directory (t2d.npy, d2t.npy) it was trained with", ckpt_path, (long long)dvocab, (long long)vocab);
            return NULL;
        }
        int64_t V_d = dvocab;
        if (vocab_load(draft_vocab_dir, vocab, &V_d, &t2d, &d2t, err, err_len)) return NULL;
        c.V_d = (int)V_d;
    }
    struct drafter *d = drafter_init(&c, (uint64_t)seed, err, err_len);
    if (!d) goto fail;
    if (t2d && drafter_set_vocab(d, t2d, d2t, c.V_d, err, err_len)) goto fail;
    if (drafter_load_target(d, target_dir, err, err_len)) goto fail;
    /* the trainer's table: optimizer (weights + state) + guard, loaded all or nothing */
    int n = drafter_n_params(d);
    struct optim_tensor *tens = calloc((size_t)n, sizeof *tens);
    if (!tens) {
        err_fail(err, err_len, "%s: out of memory", ckpt_path);
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        tens[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable,
                                        p->is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    oc.kind = (enum optim_kind)opt_kind;
    struct optim o;
    memset(&o, 0, sizeof o);
    struct optim_guard g;
    optim_guard_init(&g, 1);
    struct ckpt_table tab;
    ckpt_table_init(&tab);
    rc = optim_init(&o, tens, n, &oc, err, err_len);
    if (!rc) rc = ckpt_table_add_optim(&tab, &o, err, err_len);
    if (!rc) rc = ckpt_table_add_guard(&tab, &g, err, err_len);
    if (!rc) rc = ckpt_load(ckpt_path, tab.t, tab.n, NULL, 0, NULL, err, err_len);
    ckpt_table_free(&tab);
    optim_free(&o);
    free(tens);
    if (rc) goto fail;
    free(t2d);
    free(d2t);
    return d;
fail:
    drafter_free(d);
    free(t2d);
    free(d2t);
    return NULL;
}

/* ---------------------------------------------------------------- configs */

/* A float option as the decimal a person wrote (0.02, not 0.019999999552965164). */
static double f2d(float x) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", (double)x);
    return strtod(b, NULL);
}

/* Per-layer causality as trained (§6): a sliding layer is causal in its block unless sliding_window_non_causal;
 * a full layer always sees its whole block. */
static int trained_causal(const struct drafter_config *c, int l) {
    return c->layer_type[l] == DRAFTER_LAYER_SLIDING && !c->sliding_window_non_causal;
}

int export_speculators_vllm_servable(const struct drafter_config *c) {
    int n = 0;
    for (int l = 0; l < c->L; l++) n += trained_causal(c, l);
    return n == 0 || n == c->L;
}

/* ---------------------------------------------------------------- the rules (export.h DESIGN) */

static const char *const engine_names[EXPORT_N_ENGINES] = {"vLLM 0.33.0", "SGLang 0.5.23", "speculators 0.9.0",
                                                           "z-lab reference"};

const char *export_engine_name(int engine) {
    return engine >= 0 && engine < EXPORT_N_ENGINES ? engine_names[engine] : "?";
}

/* The first captured z-lab id that is the target's last layer, or -1. */
static int last_layer_id(const struct drafter_config *c) {
    int ids[DESC_MAX_LAYERS], n = c->target.num_hidden_layers;
    drafter_zlab_ids(c, ids);
    for (int i = 0; i < c->k; i++)
        if (n > 0 && ids[i] == n - 1) return ids[i];
    return -1;
}

void export_rules(const struct drafter_config *c, int format, char why[EXPORT_N_ENGINES][EXPORT_WHY_LEN]) {
    int any_s = 0, n_causal = 0;
    for (int l = 0; l < c->L; l++) {
        any_s |= c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        n_causal += trained_causal(c, l);
    }
    int last = last_layer_id(c), pruned = c->V_d < c->V_t, sfa = c->sample_from_anchor;
    int nc = any_s && c->sliding_window_non_causal;   /* sliding layers bidirectional: not the loaders' default */
    for (int e = 0; e < EXPORT_N_ENGINES; e++) why[e][0] = '\0';
#define WHY(e, ...) do { if (!why[e][0]) snprintf(why[e], EXPORT_WHY_LEN, __VA_ARGS__); } while (0)
    if (format == EXPORT_ZLAB && sfa) {
        for (int e = 0; e < EXPORT_N_ENGINES; e++)
            WHY(e, "the z-lab layout has no sample_from_anchor mode (not written)");
        return;
    }
    /* vLLM */
    if (sfa)
        WHY(EXPORT_VLLM, "its V2 model runner refuses sample_from_anchor and its V1 runner drafts with the anchor as "
            "the bonus token");
    if (format == EXPORT_SPECULATORS && n_causal != 0 && n_causal != c->L)
        WHY(EXPORT_VLLM, "it applies one causality (not sliding_window_non_causal) to every layer of this layout, and "
            "this drafter has causal sliding and bidirectional full layers: serve the z-lab layout");
    /* SGLang */
    if (format == EXPORT_SPECULATORS) WHY(EXPORT_SGLANG, "it reads only the z-lab layout");
    if (last >= 0)
        WHY(EXPORT_SGLANG, "it captures layer id + 1 inside the target's layer loop, so it never captures the last "
            "layer (z-lab id %d) and fc gets too few columns", last);
    if (pruned) WHY(EXPORT_SGLANG, "it drafts with the target's full LM head (no d2t), not the pruned one trained");
    /* speculators */
    if (format == EXPORT_ZLAB) {
        if (last >= 0)
            WHY(EXPORT_SPECLIB, "its z-lab converter drops the last target layer (z-lab id %d) from the ids, and fc's "
                "shape then fails: use the speculators layout", last);
        if (pruned) WHY(EXPORT_SPECLIB, "its z-lab converter sets draft_vocab_size = vocab_size: use the speculators "
                        "layout");
        if (nc) WHY(EXPORT_SPECLIB, "its z-lab converter sets sliding_window_non_causal false (sliding layers causal): "
                    "use the speculators layout");
    }
    /* z-lab reference */
    if (format == EXPORT_SPECULATORS) WHY(EXPORT_ZLABREF, "it reads only the z-lab layout");
    if (sfa) WHY(EXPORT_ZLABREF, "it has no sample_from_anchor mode");
    if (n_causal) WHY(EXPORT_ZLABREF, "it runs every layer bidirectionally (is_causal=False, no mask)");
    if (any_s) WHY(EXPORT_ZLABREF, "it applies no sliding window (no attention mask with its default attention)");
    if (last >= 0)
        WHY(EXPORT_ZLABREF, "it reads hidden_states[id + 1], which for the last layer (z-lab id %d) is after the final "
            "norm; training used the pre-norm state", last);
    if (pruned) WHY(EXPORT_ZLABREF, "it drafts with the target's full LM head, not the pruned one trained");
#undef WHY
}

int export_sglang_servable(const struct drafter_config *c) {
    char why[EXPORT_N_ENGINES][EXPORT_WHY_LEN];
    export_rules(c, EXPORT_ZLAB, why);
    return why[EXPORT_SGLANG][0] == '\0';
}

int export_unservable(const struct drafter_config *c, char *err, int err_len) {
    char wz[EXPORT_N_ENGINES][EXPORT_WHY_LEN], ws[EXPORT_N_ENGINES][EXPORT_WHY_LEN];
    export_rules(c, EXPORT_ZLAB, wz);
    export_rules(c, EXPORT_SPECULATORS, ws);
    for (int e = EXPORT_VLLM; e <= EXPORT_SGLANG; e++)
        if (!wz[e][0] || !ws[e][0]) return 0;
    err_fail(err, err_len, "no serving engine serves this drafter as trained: %s: %s; %s: %s; change the flag that "
             "asks for it (%s) or pass --allow-unservable to train it anyway", engine_names[EXPORT_VLLM],
             ws[EXPORT_VLLM][0] ? ws[EXPORT_VLLM] : wz[EXPORT_VLLM], engine_names[EXPORT_SGLANG],
             wz[EXPORT_SGLANG][0] ? wz[EXPORT_SGLANG] : ws[EXPORT_SGLANG],
             c->sample_from_anchor ? "--sample-from-anchor" : "--layer-types / --sliding-window-non-causal / "
             "--draft-vocab / --target-layer-ids");
    return 1;
}

/* The representative configurations of the table (on a 36-layer target, 5 draft layers unless said). */
static const struct export_rules_row rules_rows[] = {
    {"all full (bidirectional)", "full,full,full,full,full", 0, 0, 0, 0},
    {"all sliding, causal (speculators default)", "sliding,sliding,sliding,sliding,sliding", 0, 0, 0, 0},
    {"all sliding, --sliding-window-non-causal", "sliding,sliding,sliding,sliding,sliding", 1, 0, 0, 0},
    {"4 causal sliding + 1 full (dflash-train default)", "sliding,sliding,sliding,sliding,full", 0, 0, 0, 0},
    {"4 sliding + 1 full, --sliding-window-non-causal", "sliding,sliding,sliding,sliding,full", 1, 0, 0, 0},
    {"dflash-train default + --draft-vocab (pruned)", "sliding,sliding,sliding,sliding,full", 0, 1, 0, 0},
    {"all full, captures the target's last layer", "full,full,full,full,full", 0, 0, 0, 1},
    {"any + --sample-from-anchor", "sliding,sliding,sliding,sliding,full", 0, 0, 1, 0},
};

/* The config of a table row (rules only read layer types, causality, ids, vocabulary sizes, sample_from_anchor). */
int export_rules_n_rows(void) { return (int)(sizeof rules_rows / sizeof rules_rows[0]); }
const struct export_rules_row *export_rules_row(int i) {
    return i >= 0 && i < export_rules_n_rows() ? &rules_rows[i] : NULL;
}

static void rules_row_config(const struct export_rules_row *r, struct drafter_config *c) {
    char e[128];
    drafter_config_defaults(c);
    drafter_parse_layer_types(c, r->types, e, sizeof e);
    c->sliding_window_non_causal = r->nc;
    c->sample_from_anchor = r->sfa;
    c->target.num_hidden_layers = 36;
    c->V_t = 151936;
    c->V_d = r->pruned ? 32000 : c->V_t;
    c->ids_convention = DRAFTER_IDS_ZLAB;
    c->k = 5;
    hf_zlab_layer_ids(36, 5, c->layer_ids);
    if (r->last) c->layer_ids[4] = 35;
}

void export_rules_table(char *buf, size_t len) {
    size_t at = 0;
#define PUT(...) do { if (at < len) at += (size_t)snprintf(buf + at, len - at, __VA_ARGS__); } while (0)
    PUT("| configuration | layout |");
    for (int e = 0; e < EXPORT_N_ENGINES; e++) PUT(" %s |", engine_names[e]);
    PUT("\n|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof rules_rows / sizeof rules_rows[0]; i++) {
        struct drafter_config c;
        rules_row_config(&rules_rows[i], &c);
        for (int f = EXPORT_ZLAB; f <= EXPORT_SPECULATORS; f++) {
            char why[EXPORT_N_ENGINES][EXPORT_WHY_LEN];
            export_rules(&c, f, why);
            PUT("| %s | %s |", rules_rows[i].name, export_format_name(f));
            int mixed = strchr(rules_rows[i].types, 's') && strstr(rules_rows[i].types, "full");
            for (int e = 0; e < EXPORT_N_ENGINES; e++)
                PUT(" %s |", why[e][0] ? why[e] : e == EXPORT_VLLM && mixed ? "serves as trained "
                    "(VLLM_USE_V2_MODEL_RUNNER=1)" : "serves as trained");
            PUT("\n");
        }
    }
#undef PUT
}

static json_t *pipe_block(const struct drafter_config *c) {
    int ids[DESC_MAX_LAYERS];
    drafter_zlab_ids(c, ids);
    json_t *types = json_array(), *causal = json_array(), *jid = json_array();
    for (int l = 0; l < c->L; l++) {
        json_array_append_new(types, json_string(c->layer_type[l] == DRAFTER_LAYER_SLIDING ? "sliding_attention"
                                                                                           : "full_attention"));
        json_array_append_new(causal, json_boolean(trained_causal(c, l)));
    }
    for (int i = 0; i < c->k; i++) json_array_append_new(jid, json_integer(ids[i]));
    return json_pack("{s:s, s:o, s:o, s:i, s:o, s:i, s:I, s:i, s:i, s:i, s:i, s:b, s:b}", "note",
                     "what dflash-train trained; serving loaders ignore this block, dflash-export --check compares "
                     "what each loader derives against it", "layer_types", types, "causal", causal, "sliding_window",
                     c->sliding_window, "target_layer_ids_zlab", jid, "block_size", c->B, "mask_token_id",
                     (json_int_t)c->mask_token_id, "num_target_layers", c->target.num_hidden_layers, "hidden_size",
                     c->H, "vocab_size", c->V_t, "draft_vocab_size", c->V_d, "sample_from_anchor",
                     c->sample_from_anchor, "sliding_window_non_causal", c->sliding_window_non_causal);
}

static json_t *zlab_config(const struct drafter_config *c) {
    const struct model_config *t = &c->target;
    int ids[DESC_MAX_LAYERS], any_sliding = 0, n_causal = 0;
    drafter_zlab_ids(c, ids);
    json_t *types = json_array(), *jid = json_array();
    for (int l = 0; l < c->L; l++) {
        any_sliding |= c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        n_causal += trained_causal(c, l);
        json_array_append_new(types, json_string(c->layer_type[l] == DRAFTER_LAYER_SLIDING ? "sliding_attention"
                                                                                           : "full_attention"));
    }
    for (int i = 0; i < c->k; i++) json_array_append_new(jid, json_integer(ids[i]));
    json_t *rope_scaling = hf_rope_scaling_json(t);
    json_t *dc = json_pack("{s:o, s:I, s:i}", "target_layer_ids", jid, "mask_token_id", (json_int_t)c->mask_token_id,
                           "block_size", c->B);
    /* vLLM applies dflash_config.causal to every layer; without it, sliding => causal, full => not, which is
     * training's rule unless sliding_window_non_causal; so write it only when every layer has the same value */
    if (n_causal == 0 || n_causal == c->L) json_object_set_new(dc, "causal", json_boolean(n_causal == c->L));
    /* SGLang reads no dflash_config.causal: is_causal (one value, read by vLLM first too) where the default
     * (sliding => causal, full => bidirectional) is not training's, i.e. bidirectional sliding layers */
    int bidir_sliding = any_sliding && n_causal == 0;
    json_t *j = json_pack(
        "{s:[s], s:{s:s}, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:f, s:b, s:b, s:b, s:o, s:o, s:f, "
        "s:o, s:s, s:i, s:i, s:o}",
        "architectures", "DFlashDraftModel", "auto_map", "AutoModel", "dflash.DFlashDraftModel", "model_type", "qwen3",
        "vocab_size", c->V_t, "hidden_size", c->H, "intermediate_size", c->I, "num_hidden_layers", c->L,
        "num_attention_heads", c->n_h, "num_key_value_heads", c->n_kv, "head_dim", c->d_h, "hidden_act", "silu",
        "max_position_embeddings", t->max_position_embeddings, "rms_norm_eps",
        t->rms_norm_eps > 0 ? t->rms_norm_eps : (double)c->eps, "initializer_range", f2d(c->init_std),
        "attention_bias", 0, "tie_word_embeddings", 0, "use_sliding_window", any_sliding, "sliding_window",
        any_sliding ? json_integer(c->sliding_window) : json_null(), "layer_types", types, "rope_theta",
        t->rope_theta, "rope_scaling", rope_scaling, "torch_dtype", "bfloat16", "block_size", c->B,
        "num_target_layers", t->num_hidden_layers, "dflash_config", dc);
    if (j) {
        json_object_set_new(j, "draft_vocab_size", json_integer(c->V_d));   /* vLLM sizes lm_head / d2t by it */
        if (bidir_sliding) json_object_set_new(j, "is_causal", json_false());
        json_object_set_new(j, "dflash_pipe", pipe_block(c));
    }
    return j;
}

char *export_zlab_config_json_text(const struct drafter_config *c) {
    json_t *j = zlab_config(c);
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(j);
    return s;
}

static char *spec_config_text(const struct drafter_config *c, const char *verifier) {
    /* without sliding layers the flag changes nothing in training, but vLLM turns sliding_window_non_causal false
     * into causal = true for every layer: write true so full layers stay bidirectional there too */
    struct drafter_config cc = *c;
    int any_sliding = 0;
    for (int l = 0; l < c->L; l++) any_sliding |= c->layer_type[l] == DRAFTER_LAYER_SLIDING;
    if (!any_sliding) cc.sliding_window_non_causal = 1;
    char *base = drafter_config_json_text(&cc, verifier);
    if (!base) return NULL;
    json_t *j = json_loads(base, 0, NULL);
    free(base);
    if (!j) return NULL;
    json_object_set_new(j, "dflash_pipe", pipe_block(c));
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(j);
    return s;
}

/* ---------------------------------------------------------------- writing */

static int is_body(const char *name) {
    return strcmp(name, "embed_tokens.weight") && strcmp(name, "lm_head.weight") && strncmp(name, "verifier_", 9);
}

/* The z-lab layout borrows the target's embedding and LM head, except a pruned LM head (with d2t). */
static int exported(int format, const char *name, int pruned) {
    if (!strncmp(name, "verifier_", 9)) return 0;
    return format == EXPORT_SPECULATORS || is_body(name) || (pruned && !strcmp(name, "lm_head.weight"));
}

static int write_weights(const struct drafter *d, int format, const char *path, char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    struct drafter_last ls;
    drafter_last_step(d, &ls);
    int pruned = ls.d2t && c->V_d < c->V_t;
    struct st_writer *w = st_writer_create(path, err, err_len);
    if (!w) return -1;
    int rc = 0;
    for (int i = 0; i < drafter_n_params(d) && !rc; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!exported(format, p->name, pruned)) continue;
        rc = st_writer_add(w, p->name, ST_BF16, p->ndim, p->shape, err, err_len);
    }
    if (!rc && pruned) {
        int64_t s1 = c->V_t, s2 = c->V_d;
        rc = st_writer_add(w, "t2d", ST_BOOL, 1, &s1, err, err_len);
        if (!rc) rc = st_writer_add(w, "d2t", ST_I64, 1, &s2, err, err_len);
    }
    if (!rc) rc = st_writer_begin(w, err, err_len);
    enum { CHUNK = 1 << 16 };
    bf16 *buf = malloc(sizeof *buf * CHUNK);
    if (!buf && !rc) rc = err_fail(err, err_len, "%s: out of memory", path);
    for (int k = 0; !rc && k < st_writer_count(w); k++) {
        const char *name;
        size_t nb;
        st_writer_order(w, k, &name, &nb);
        if (!strcmp(name, "t2d")) {
            rc = st_writer_write(w, ls.t2d, (size_t)c->V_t, err, err_len);
            continue;
        }
        if (!strcmp(name, "d2t")) {
            rc = st_writer_write(w, ls.d2t, sizeof(int64_t) * (size_t)c->V_d, err, err_len);
            continue;
        }
        const struct drafter_param *p = drafter_param_find(d, name);
        for (int64_t e = 0; !rc && e < p->numel; e += CHUNK) {
            size_t m = (size_t)(p->numel - e < CHUNK ? p->numel - e : CHUNK);
            bf16_from_floats(buf, p->w + e, m);
            rc = st_writer_write(w, buf, m * sizeof *buf, err, err_len);
        }
    }
    free(buf);
    if (!rc) rc = st_writer_finish(w, err, err_len);
    st_writer_free(w);
    return rc;
}

static int readme_text(const struct drafter_config *c, int format, const char *dir, const char *verifier, char *buf,
                       size_t len) {
    struct export_derived x;
    memset(&x, 0, sizeof x);
    x.format = format;
    x.B = c->B;
    int any_s = 0, any_f = 0;
    for (int l = 0; l < c->L; l++) {
        any_s |= c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        any_f |= c->layer_type[l] == DRAFTER_LAYER_FULL;
    }
    x.mixed = any_s && any_f;
    export_rules(c, format, x.why);
    x.sglang_ok = !x.why[EXPORT_SGLANG][0];
    char serve[4096];
    export_serve_lines(&x, dir, verifier, serve, sizeof serve);
    int ids[DESC_MAX_LAYERS];
    drafter_zlab_ids(c, ids);
    char idl[512] = "", loaders[2048] = "";
    for (int i = 0, n = 0; i < c->k && n < (int)sizeof idl - 16; i++)
        n += snprintf(idl + n, sizeof idl - (size_t)n, "%s%d", i ? ", " : "", ids[i]);
    for (int e = 0, n = 0; e < EXPORT_N_ENGINES && n < (int)sizeof loaders; e++)
        n += snprintf(loaders + n, sizeof loaders - (size_t)n, "- %s: %s\n", export_engine_name(e),
                      x.why[e][0] ? x.why[e] : "serves as trained");
    return snprintf(buf, len,
                    "# DFlash drafter (%s layout), exported by dflash-export\n\n"
                    "- target: %s\n- block size %d (%d speculative tokens), %d draft layers, window %d%s\n"
                    "- captured target layers (z-lab ids, output of decoder layer i): [%s]\n- mask token id %lld\n"
                    "- draft vocabulary %d of %d%s\n%s\n"
                    "## Loaders (as their code reads this layout)\n\n%s\n"
                    "## Serving\n\n```\n%s```\n\n"
                    "%s"
                    "Check it the way the loaders read it: `dflash-export --check %s --target-model %s`.\n",
                    export_format_name(format), verifier, c->B, c->B - 1, c->L, c->sliding_window,
                    c->sliding_window_non_causal ? " (sliding layers non-causal in the block)" : "", idl,
                    (long long)c->mask_token_id, c->V_d, c->V_t, c->V_d < c->V_t ? " (lm_head.weight and d2t here)" : "",
                    x.mixed ? "\n**This drafter mixes sliding and full attention layers: vLLM serves it only with its "
                              "V2 model runner (VLLM_USE_V2_MODEL_RUNNER=1).**\n"
                            : "",
                    loaders, serve,
                    format == EXPORT_ZLAB ? "transformers: `AutoModel.from_pretrained(DIR, trust_remote_code=True)` "
                                            "loads dflash.py (its `draft` runs one block with the trained masks).\n\n"
                                          : "",
                    dir, verifier) >= (int)len
               ? -1
               : 0;
}

static const char *const export_files[] = {"config.json", "model.safetensors", "README.md", "dflash.py", NULL};

/* Remove an export directory we wrote (only our files, then the directory). */
static int remove_export(const char *dir, char *err, int err_len) {
    char p[PATH_MAX];
    for (int i = 0; export_files[i]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, export_files[i]);
        if (unlink(p) && errno != ENOENT) return err_fail(err, err_len, "%s: unlink: %s", p, strerror(errno));
    }
    if (rmdir(dir)) return err_fail(err, err_len, "%s: rmdir: %s (files other than an export's are in it)", dir,
                                    strerror(errno));
    return 0;
}

int export_write(const struct drafter *d, int format, const char *out_dir, const char *verifier_name, char *err,
                 int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    if (format == EXPORT_ZLAB && c->sample_from_anchor)
        return err_fail(err, err_len, "%s: the z-lab layout has no sample_from_anchor mode: export --format "
                        "speculators", out_dir);
    struct stat st;
    int exists = stat(out_dir, &st) == 0;
    if (exists) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/config.json", out_dir);
        if (!S_ISDIR(st.st_mode) || !fs_exists(p))
            return err_fail(err, err_len, "%s exists and is not an export directory (no config.json): refusing to "
                            "replace it", out_dir);
    }
    char tmp[PATH_MAX], old[PATH_MAX], path[PATH_MAX + 32];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", out_dir, (int)getpid()) >= (int)sizeof tmp ||
        snprintf(old, sizeof old, "%s.old.%d", out_dir, (int)getpid()) >= (int)sizeof old)
        return err_fail(err, err_len, "%s: path too long", out_dir);
    if (fs_mkdir_p(tmp, err, err_len)) return -1;
    char *cfg = format == EXPORT_ZLAB ? export_zlab_config_json_text(c) : spec_config_text(c, verifier_name);
    int rc = cfg ? 0 : err_fail(err, err_len, "%s: could not build config.json", out_dir);
    if (!rc) {
        snprintf(path, sizeof path, "%s/config.json", tmp);
        rc = fs_write_atomic(path, cfg, strlen(cfg), err, err_len);
    }
    free(cfg);
    if (!rc) {
        snprintf(path, sizeof path, "%s/model.safetensors", tmp);
        rc = write_weights(d, format, path, err, err_len);
    }
    if (!rc) {
        char readme[8192];
        if (readme_text(c, format, out_dir, verifier_name ? verifier_name : "TARGET", readme, sizeof readme))
            rc = err_fail(err, err_len, "%s: README.md too long", out_dir);
        snprintf(path, sizeof path, "%s/README.md", tmp);
        if (!rc) rc = fs_write_atomic(path, readme, strlen(readme), err, err_len);
    }
    if (!rc && format == EXPORT_ZLAB) {   /* auto_map's dflash.DFlashDraftModel */
        snprintf(path, sizeof path, "%s/dflash.py", tmp);
        rc = fs_write_atomic(path, export_dflash_py, strlen(export_dflash_py), err, err_len);
    }
    if (!rc) rc = fs_fsync_dir(tmp, err, err_len);
    if (!rc && exists && rename(out_dir, old))
        rc = err_fail(err, err_len, "rename %s -> %s: %s", out_dir, old, strerror(errno));
    if (!rc && rename(tmp, out_dir)) {
        rc = err_fail(err, err_len, "rename %s -> %s: %s", tmp, out_dir, strerror(errno));
        if (exists && rename(old, out_dir)) { /* keep the old export under its .old name; the sentence says why */ }
    }
    if (rc) {
        char e2[256];
        remove_export(tmp, e2, sizeof e2);
        return -1;
    }
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", out_dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = '\0'; else snprintf(parent, sizeof parent, ".");
    if (fs_fsync_dir(parent[0] ? parent : "/", err, err_len)) return -1;
    if (exists && remove_export(old, err, err_len)) return -1;
    return 0;
}

int export_write_run(const struct drafter *d, const char *run_dir, const char *verifier_name, char *skipped,
                     size_t skipped_len, char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    char dir[PATH_MAX];
    size_t at = 0;
    if (skipped && skipped_len) skipped[0] = '\0';
    if (snprintf(dir, sizeof dir, "%s/export", run_dir) >= (int)sizeof dir)
        return err_fail(err, err_len, "%s: path too long", run_dir);
    if (fs_mkdir_p(dir, err, err_len)) return -1;
    for (int format = EXPORT_ZLAB; format <= EXPORT_SPECULATORS; format++) {
        char why[EXPORT_N_ENGINES][EXPORT_WHY_LEN];
        export_rules(c, format, why);
        if (format == EXPORT_ZLAB && c->sample_from_anchor) {
            if (skipped && at < skipped_len)
                at += (size_t)snprintf(skipped + at, skipped_len - at, "the z-lab layout was not written: it has no "
                                       "sample_from_anchor mode");
            continue;
        }
        if (snprintf(dir, sizeof dir, "%s/export/%s", run_dir, export_format_name(format)) >= (int)sizeof dir)
            return err_fail(err, err_len, "%s: path too long", run_dir);
        if (export_write(d, format, dir, verifier_name, err, err_len)) return -1;
        struct export_check_opts o = {NULL, d, 0};
        if (export_check(dir, &o, NULL, err, err_len)) return -1;
        /* which engines serve this layout, so the log says which export to serve where */
        char eng[128] = "";
        for (int e = EXPORT_VLLM, n = 0; e <= EXPORT_SGLANG; e++)
            if (!why[e][0]) n += snprintf(eng + n, sizeof eng - (size_t)n, "%s%s", n ? " and " : "", export_engine_name(e));
        if (skipped && at < skipped_len)
            at += (size_t)snprintf(skipped + at, skipped_len - at, "%sexport/%s serves on %s", at ? "; " : "",
                                   export_format_name(format), eng[0] ? eng : "no serving engine (speculators only)");
    }
    return 0;
}

/* ---------------------------------------------------------------- the checker */

static const char *const layer_names[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", NULL};

struct dims { int64_t H, n_h, n_kv, d_h, I, L, V, V_d, k; };

/* The expected shape of a (renamed) tensor name; 0 known, -1 unknown. */
static int expected_shape(const struct dims *m, int format, const char *name, int *ndim, int64_t s[2]) {
    *ndim = 1;
    s[1] = 0;
    if (!strcmp(name, "fc.weight")) { *ndim = 2; s[0] = m->H; s[1] = m->H * m->k; return 0; }
    if (!strcmp(name, "hidden_norm.weight") || !strcmp(name, "norm.weight")) { s[0] = m->H; return 0; }
    if (format == EXPORT_SPECULATORS || m->V_d < m->V) {   /* the z-lab layout: a pruned head + d2t only */
        if (format == EXPORT_SPECULATORS && !strcmp(name, "embed_tokens.weight")) {
            *ndim = 2; s[0] = m->V; s[1] = m->H; return 0;
        }
        if (!strcmp(name, "lm_head.weight")) { *ndim = 2; s[0] = m->V_d; s[1] = m->H; return 0; }
        if (!strcmp(name, "t2d")) { s[0] = m->V; return 0; }
        if (!strcmp(name, "d2t")) { s[0] = m->V_d; return 0; }
    }
    int l, off = 0;
    if (sscanf(name, "layers.%d.%n", &l, &off) != 1 || off == 0 || l < 0 || l >= m->L) return -1;
    const char *r = name + off;
    int64_t q = m->n_h * m->d_h, kv = m->n_kv * m->d_h;
    if (!strcmp(r, "input_layernorm.weight") || !strcmp(r, "post_attention_layernorm.weight")) { s[0] = m->H; return 0; }
    if (!strcmp(r, "self_attn.q_norm.weight") || !strcmp(r, "self_attn.k_norm.weight")) { s[0] = m->d_h; return 0; }
    *ndim = 2;
    if (!strcmp(r, "self_attn.q_proj.weight")) { s[0] = q; s[1] = m->H; return 0; }
    if (!strcmp(r, "self_attn.k_proj.weight") || !strcmp(r, "self_attn.v_proj.weight")) { s[0] = kv; s[1] = m->H; return 0; }
    if (!strcmp(r, "self_attn.o_proj.weight")) { s[0] = m->H; s[1] = q; return 0; }
    if (!strcmp(r, "mlp.gate_proj.weight") || !strcmp(r, "mlp.up_proj.weight")) { s[0] = m->I; s[1] = m->H; return 0; }
    if (!strcmp(r, "mlp.down_proj.weight")) { s[0] = m->H; s[1] = m->I; return 0; }
    return -1;
}

/* vLLM 0.33's rename (qwen3_dflash.py hf_to_vllm_mapper): "midlayer." -> "layers.0.". It prepends "model." to
 * every name itself, so a "model." name is refused before this. */
static void vllm_rename(const char *in, char *out, size_t len) {
    if (!strncmp(in, "midlayer.", 9)) snprintf(out, len, "layers.0.%s", in + 9);
    else snprintf(out, len, "%s", in);
}

/* Weights: vLLM names/shapes/fusion, presence, finiteness, and (d) equality with the drafter's masters. */
static int check_weights(const char *dir, int format, const struct dims *m, const struct drafter *d, char *err,
                         int err_len) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct st_file f;
    if (st_open(&f, path, err, err_len)) return -1;
    int rc = 0;
    char nm[600];
    for (int i = 0; i < f.n_tensors && !rc; i++) {
        const struct st_tensor *t = &f.tensors[i];
        if (!strncmp(t->name, "model.", 6)) {
            rc = err_fail(err, err_len, "%s: tensor \"%s\": vLLM 0.33.0 prepends \"model.\" to every name itself and "
                          "fails on model.%s (write the name without the prefix)", path, t->name, t->name);
            break;
        }
        vllm_rename(t->name, nm, sizeof nm);
        int nd;
        int64_t s[2];
        if (expected_shape(m, format, nm, &nd, s)) {
            rc = err_fail(err, err_len, "%s: tensor \"%s\": vLLM (qwen3_dflash) has no parameter %s for this config "
                          "(%lld layers) and fails on it", path, t->name, nm, (long long)m->L);
            break;
        }
        if (t->ndim != nd || t->shape[0] != s[0] || (nd == 2 && t->shape[1] != s[1])) {
            char a[64], b[64];
            st_shape_str(a, sizeof a, t->ndim, t->shape);
            st_shape_str(b, sizeof b, nd, s);
            if (!strcmp(nm, "fc.weight"))
                rc = err_fail(err, err_len, "%s: tensor fc.weight is %s: vLLM builds fc with input hidden_size x "
                              "number of target layers = %s", path, a, b);
            else
                rc = err_fail(err, err_len, "%s: tensor \"%s\" is %s, the config says %s (vLLM fuses q/k/v and "
                              "gate/up by these shapes)", path, t->name, a, b);
            break;
        }
        int want = !strcmp(nm, "t2d") ? ST_BOOL : !strcmp(nm, "d2t") ? ST_I64 : ST_BF16;
        if ((int)t->dtype != want) {
            rc = err_fail(err, err_len, "%s: tensor \"%s\" is %s, the export must be %s", path, t->name,
                          st_dtype_name(t->dtype), st_dtype_name((enum st_dtype)want));
            break;
        }
        if (want == ST_BF16) {   /* a NaN or inf weight: every loader would serve it (dflash-eval refuses it) */
            for (int64_t e = 0; e < (int64_t)(t->nbytes / 2); e++) {
                bf16 h;
                memcpy(&h, (const char *)t->data + 2 * e, 2);
                if ((h & 0x7f80) == 0x7f80) {
                    rc = err_fail(err, err_len, "%s: tensor \"%s\"[%lld] is %s: no loader checks it, every engine "
                                  "would draft with it", path, t->name, (long long)e, h & 0x7f ? "NaN" : "inf");
                    break;
                }
            }
            if (rc) break;
        }
        if (d && (!strcmp(nm, "t2d") || !strcmp(nm, "d2t"))) {
            struct drafter_last ls;
            drafter_last_step(d, &ls);
            const void *mine = nm[0] == 't' ? (const void *)ls.t2d : (const void *)ls.d2t;
            if (!mine || t->nbytes != (nm[0] == 't' ? (size_t)m->V : sizeof(int64_t) * (size_t)m->V_d) ||
                memcmp(mine, t->data, t->nbytes)) {
                rc = err_fail(err, err_len, "%s: tensor \"%s\" is not the draft vocabulary the checkpoint was "
                              "trained with", path, t->name);
                break;
            }
        }
        if (d) {
            const struct drafter_param *p = drafter_param_find(d, nm);
            if (p) {
                for (int64_t e = 0; e < p->numel; e++) {
                    bf16 got;
                    memcpy(&got, (const char *)t->data + 2 * e, 2);
                    if (got != float_to_bf16(p->w[e])) {
                        rc = err_fail(err, err_len, "%s: tensor \"%s\"[%lld] is %g, the checkpoint has %g (not its "
                                      "bf16 rounding)", path, t->name, (long long)e, (double)bf16_to_float(got),
                                      (double)p->w[e]);
                        break;
                    }
                }
            }
        }
    }
    /* every parameter present: neither vLLM 0.33.0 (DFlash's load_weights returns no loaded set, so the loader does
     * not track missing weights) nor SGLang 0.5.23 (it skips what it does not find) fails on a missing one */
    for (int l = -1; l < m->L && !rc; l++) {
        const char *top[] = {"fc.weight", "hidden_norm.weight", "norm.weight", NULL};
        for (int q = 0; (l < 0 ? top[q] : layer_names[q]) && !rc; q++) {
            char want[128], alt1[160], alt2[160];
            if (l < 0) snprintf(want, sizeof want, "%s", top[q]);
            else snprintf(want, sizeof want, "layers.%d.%s", l, layer_names[q]);
            snprintf(alt1, sizeof alt1, "model.%s", want);
            alt2[0] = '\0';
            if (l == 0) snprintf(alt2, sizeof alt2, "midlayer.%s", layer_names[q]);
            if (!st_find(&f, want) && !st_find(&f, alt1) && !(alt2[0] && st_find(&f, alt2)))
                rc = err_fail(err, err_len, "%s: tensor \"%s\" is missing: vLLM 0.33.0 and SGLang 0.5.23 would both "
                              "load the export and serve it uninitialised (neither tracks a missing DFlash weight)",
                              path, want);
        }
    }
    if (!rc && format == EXPORT_SPECULATORS)
        for (int q = 0; q < 2 && !rc; q++) {
            const char *n2 = q ? "lm_head.weight" : "embed_tokens.weight";
            if (!st_find(&f, n2))
                rc = err_fail(err, err_len, "%s: tensor \"%s\" is missing: the speculators layout carries the draft "
                              "embedding and LM head", path, n2);
        }
    if (!rc && m->V_d < m->V && (!st_find(&f, "d2t") || !st_find(&f, "lm_head.weight")))
        rc = err_fail(err, err_len, "%s: draft_vocab_size %lld < vocab_size %lld but d2t or lm_head.weight is missing "
                      "(vLLM maps the pruned head's ids through d2t)", path, (long long)m->V_d, (long long)m->V);
    st_close(&f);
    return rc;
}

static int read_layer_types(const json_t *o, int L, int *sliding, const char *what, char *err, int err_len) {
    json_t *lt = json_object_get(o, "layer_types");
    if (!lt || json_is_null(lt)) {
        for (int l = 0; l < L; l++) sliding[l] = 0;
        return 0;
    }
    if (!json_is_array(lt) || (int)json_array_size(lt) != L)
        return err_fail(err, err_len, "%s: key \"layer_types\" must list one type per layer (%d)", what, L);
    for (int l = 0; l < L; l++) {
        const char *s = json_string_value(json_array_get(lt, (size_t)l));
        if (s && !strcmp(s, "sliding_attention")) sliding[l] = 1;
        else if (s && !strcmp(s, "full_attention")) sliding[l] = 0;
        else
            return err_fail(err, err_len, "%s: key \"layer_types\"[%d] is %s%s%s: SGLang (dflash) knows only "
                            "full_attention and sliding_attention", what, l, s ? "\"" : "", s ? s : "not a string",
                            s ? "\"" : "");
    }
    return 0;
}

static int check_inner(const char *dir, const json_t *j, const char *what, const struct export_check_opts *opts,
                       struct export_derived *x, char *err, int err_len) {
    char readme[PATH_MAX];
    snprintf(readme, sizeof readme, "%s/README.md", dir);
    json_t *arch = json_array_get(json_object_get(j, "architectures"), 0);
    const char *a = json_string_value(arch);
    const json_t *cfg;          /* the Qwen3Config part */
    if (a && !strcmp(a, "DFlashDraftModel")) {
        x->format = EXPORT_ZLAB;
        cfg = j;
    } else if (a && !strcmp(a, "DFlashSpeculator")) {
        x->format = EXPORT_SPECULATORS;
        const char *smt = json_string_value(json_object_get(j, "speculators_model_type"));
        if (!smt || strcmp(smt, "dflash"))
            return err_fail(err, err_len, "%s: key \"speculators_model_type\" must be \"dflash\" (vLLM picks the "
                            "speculator class by it)", what);
        cfg = json_object_get(j, "transformer_layer_config");
        if (!json_is_object(cfg))
            return err_fail(err, err_len, "%s: key \"transformer_layer_config\" is missing or not an object", what);
    } else {
        return err_fail(err, err_len, "%s: key \"architectures\"[0] must be \"DFlashDraftModel\" (z-lab) or "
                        "\"DFlashSpeculator\" (speculators): the loaders choose the model class by it", what);
    }
    if (!fs_exists(readme)) return err_fail(err, err_len, "%s: missing (the export's serve lines and notes)", readme);
    struct dims m;
    memset(&m, 0, sizeof m);
    if (need_int(cfg, "hidden_size", &m.H, what, err, err_len) || need_int(cfg, "num_hidden_layers", &m.L, what, err, err_len) ||
        need_int(cfg, "num_attention_heads", &m.n_h, what, err, err_len) ||
        need_int(cfg, "num_key_value_heads", &m.n_kv, what, err, err_len) ||
        need_int(cfg, "intermediate_size", &m.I, what, err, err_len) || need_int(cfg, "vocab_size", &m.V, what, err, err_len))
        return -1;
    if (m.L < 1 || m.L > DRAFTER_MAX_LAYERS || m.H < 1 || m.n_h < 1 || m.n_kv < 1 || m.V < 1)
        return err_fail(err, err_len, "%s: sizes out of range (num_hidden_layers %lld, hidden_size %lld)", what,
                        (long long)m.L, (long long)m.H);
    if (j_int(cfg, "head_dim", &m.d_h) != 0) m.d_h = m.H / m.n_h;
    const char *act = json_string_value(json_object_get(cfg, "hidden_act"));
    if (json_object_get(cfg, "hidden_act") && (!act || strcmp(act, "silu")))
        return err_fail(err, err_len, "%s: key \"hidden_act\" must be \"silu\" (SGLang's dflash MLP is SiLU only)",
                        what);
    x->L = (int)m.L;
    x->H = (int)m.H;
    x->V = (int)m.V;
    if (read_layer_types(cfg, x->L, x->sliding, what, err, err_len)) return -1;
    int any_s = 0, any_f = 0;
    for (int l = 0; l < x->L; l++) {
        any_s |= x->sliding[l];
        any_f |= !x->sliding[l];
    }
    x->mixed = any_s && any_f;
    const json_t *pipe = json_object_get(j, "dflash_pipe");
    if (pipe && !json_is_object(pipe)) return err_fail(err, err_len, "%s: key \"dflash_pipe\" must be an object", what);
    int64_t v;
    x->n_target = 0;
    int sg_causal[DRAFTER_MAX_LAYERS], sp_causal[DRAFTER_MAX_LAYERS], bs_default = 0;

    if (x->format == EXPORT_ZLAB) {
        const json_t *dc = json_object_get(j, "dflash_config");
        if (dc && !json_is_object(dc)) return err_fail(err, err_len, "%s: key \"dflash_config\" must be an object", what);
        /* target layer ids: vLLM reads dflash_config.target_layer_ids; SGLang also the top level */
        const json_t *ids = dc ? json_object_get(dc, "target_layer_ids") : NULL;
        const char *ids_key = "dflash_config.target_layer_ids";
        if (!ids) {
            ids = json_object_get(j, "target_layer_ids");
            ids_key = "target_layer_ids";
            if (ids)
                return err_fail(err, err_len, "%s: key \"target_layer_ids\" is at the top level only: SGLang reads it "
                                "there but vLLM reads dflash_config.target_layer_ids (and would use num_hidden_layers "
                                "features)", what);
            return err_fail(err, err_len, "%s: key \"dflash_config.target_layer_ids\" is missing (vLLM and SGLang "
                            "read the captured layers from it)", what);
        }
        int n = int_array(ids, ids_key, x->zlab_ids, DESC_MAX_LAYERS, what, err, err_len);
        if (n < 1) return n < 0 ? -1 : err_fail(err, err_len, "%s: key \"%s\" is empty", what, ids_key);
        x->k = n;
        if (need_int(j, "num_target_layers", &v, what, err, err_len)) return -1;
        x->n_target = (int)v;
        for (int i = 0; i < n; i++)
            if (x->zlab_ids[i] < 0 || x->zlab_ids[i] >= x->n_target)
                return err_fail(err, err_len, "%s: key \"%s\"[%d] = %d is outside [0, num_target_layers %d): vLLM "
                                "and SGLang read z-lab ids (output of decoder layer i) and capture layer i + 1",
                                what, ids_key, i, x->zlab_ids[i], x->n_target);
        /* mask token */
        int r = dc ? j_int(dc, "mask_token_id", &x->mask_token_id) : 1;
        if (r == 1) return err_fail(err, err_len, "%s: key \"dflash_config.mask_token_id\" is missing (vLLM and "
                                    "SGLang fill the block with it)", what);
        if (r < 0 || x->mask_token_id < 0 || x->mask_token_id >= m.V)
            return err_fail(err, err_len, "%s: key \"dflash_config.mask_token_id\" must be a non-negative integer "
                            "inside the vocabulary [0, %lld) (SGLang)", what, (long long)m.V);
        /* block size: SGLang 0.5.23 dflash_config.block_size, else the top level, else 16; the z-lab loader and
         * speculators' converter the top level first */
        int64_t bs = 16, top;
        r = dc ? j_int(dc, "block_size", &bs) : 1;
        if (r < 0) return err_fail(err, err_len, "%s: key \"dflash_config.block_size\" must be an integer", what);
        int rt = j_int(j, "block_size", &top);
        if (r == 1 && rt == 0) bs = top;
        bs_default = r == 1 && rt != 0;
        x->B = (int)bs;
        if (rt == 0 && top != bs)
            return err_fail(err, err_len, "%s: key \"block_size\" is %lld at the top level (the z-lab loader) but "
                            "SGLang reads dflash_config.block_size = %lld", what, (long long)top, (long long)bs);
        /* causality: vLLM: is_causal, then dflash_config.causal, else sliding => causal; SGLang: is_causal, else
         * sliding => causal (it reads no dflash_config.causal) */
        json_t *ic = json_object_get(j, "is_causal"), *cc = dc ? json_object_get(dc, "causal") : NULL;
        if (ic && json_is_null(ic)) ic = NULL;
        if (ic && !json_is_boolean(ic)) return err_fail(err, err_len, "%s: key \"is_causal\" must be a boolean", what);
        if (cc && !json_is_boolean(cc))
            return err_fail(err, err_len, "%s: key \"dflash_config.causal\" must be a boolean", what);
        for (int l = 0; l < x->L; l++) {
            x->causal[l] = ic ? json_is_true(ic) : cc ? json_is_true(cc) : x->sliding[l];
            sg_causal[l] = ic ? json_is_true(ic) : x->sliding[l];
            sp_causal[l] = x->sliding[l];   /* speculators' converter: sliding_window_non_causal false */
        }
        /* window: vLLM dflash_config.swa_window_size, else sliding_window */
        int64_t w = 0;
        r = dc ? j_int(dc, "swa_window_size", &w) : 1;
        if (r == 1) r = j_int(cfg, "sliding_window", &w);
        if (any_s) {
            if (r != 0 || w < 2)
                return err_fail(err, err_len, "%s: key \"sliding_window\" must be an integer >= 2 when a layer slides "
                                "(vLLM reads dflash_config.swa_window_size, else sliding_window; SGLang uses window - "
                                "1)", what);
            x->window = (int)w;
        }
        int64_t ths;
        r = j_int(j, "target_hidden_size", &ths);   /* vLLM: target_hidden_size or hidden_size (null: absent) */
        if (r < 0 || (r == 0 && ths != m.H))
            return err_fail(err, err_len, "%s: key \"target_hidden_size\" must be null or an integer equal to "
                            "hidden_size %lld (vLLM sizes fc with target_hidden_size x layers)", what, (long long)m.H);
        int64_t vd;   /* vLLM: draft_vocab_size, else vocab_size (SGLang always drafts over the target's) */
        r = j_int(j, "draft_vocab_size", &vd);
        if (r < 0 || (r == 0 && (vd < 1 || vd > m.V)))
            return err_fail(err, err_len, "%s: key \"draft_vocab_size\" must be an integer in [1, vocab_size %lld]",
                            what, (long long)m.V);
        x->V_d = r == 0 ? (int)vd : x->V;
    } else {
        int n = int_array(json_object_get(j, "aux_hidden_state_layer_ids"), "aux_hidden_state_layer_ids", x->zlab_ids,
                          DESC_MAX_LAYERS, what, err, err_len);
        if (n < 0) return -1;
        if (n == 0) return err_fail(err, err_len, "%s: key \"aux_hidden_state_layer_ids\" is empty", what);
        x->k = n;
        for (int i = 0; i < n; i++) {
            if (x->zlab_ids[i] < 1)
                return err_fail(err, err_len, "%s: key \"aux_hidden_state_layer_ids\"[%d] = %d: speculators ids count "
                                "from 1 (= z-lab id + 1)", what, i, x->zlab_ids[i]);
            x->zlab_ids[i] -= 1;
        }
        int r = j_int(j, "mask_token_id", &x->mask_token_id);
        if (r == 1) return err_fail(err, err_len, "%s: key \"mask_token_id\" is missing (vLLM's speculators path "
                                    "needs it)", what);
        if (r < 0 || x->mask_token_id < 0 || x->mask_token_id >= m.V)
            return err_fail(err, err_len, "%s: key \"mask_token_id\" must be a non-negative integer inside the "
                            "vocabulary [0, %lld)", what, (long long)m.V);
        if (need_int(j, "block_size", &v, what, err, err_len)) return -1;
        x->B = (int)v;
        if (need_int(j, "draft_vocab_size", &v, what, err, err_len)) return -1;
        x->V_d = (int)v;
        if (x->V_d < 1 || x->V_d > x->V)
            return err_fail(err, err_len, "%s: key \"draft_vocab_size\" %d is outside [1, vocab_size %d]", what, x->V_d,
                            x->V);
        json_t *pm = json_array_get(json_object_get(json_object_get(j, "speculators_config"), "proposal_methods"), 0);
        if (need_int(pm, "speculative_tokens", &v, "speculators_config.proposal_methods[0]", err, err_len)) {
            char e2[512];
            snprintf(e2, sizeof e2, "%s", err);
            return err_fail(err, err_len, "%s: %s", what, e2);
        }
        int sfa = json_is_true(json_object_get(j, "sample_from_anchor"));
        x->sample_from_anchor = sfa;
        if (v + (sfa ? 0 : 1) != x->B)
            return err_fail(err, err_len, "%s: key \"speculators_config.proposal_methods[0].speculative_tokens\" is "
                            "%lld but vLLM's block width is num_speculative_tokens + 1 = block_size %d, so it must be "
                            "%d", what, (long long)v, x->B, x->B - (sfa ? 0 : 1));
        json_t *nc = json_object_get(j, "sliding_window_non_causal");
        if (nc && !json_is_boolean(nc))
            return err_fail(err, err_len, "%s: key \"sliding_window_non_causal\" must be a boolean", what);
        /* vLLM maps it to dflash_config.causal, which it applies to every layer, full ones included (a missing
         * key reads as true: causal false); speculators applies it to the sliding layers only */
        for (int l = 0; l < x->L; l++) {
            x->causal[l] = nc ? !json_is_true(nc) : 0;
            sp_causal[l] = x->sliding[l] && !json_is_true(nc);
            sg_causal[l] = x->sliding[l];   /* unused: SGLang reads only the z-lab layout */
        }
        if (any_s) {
            if (!json_is_true(json_object_get(cfg, "use_sliding_window")))
                return err_fail(err, err_len, "%s: key \"transformer_layer_config.use_sliding_window\" must be true "
                                "when a layer slides: transformers sets sliding_window to null otherwise and the "
                                "sliding layers silently become full attention", what);
            int64_t w;
            if (j_int(cfg, "sliding_window", &w) != 0 || w < 2)
                return err_fail(err, err_len, "%s: key \"transformer_layer_config.sliding_window\" must be an integer "
                                ">= 2 when a layer slides", what);
            x->window = (int)w;
        }
    }
    m.k = x->k;
    m.V_d = x->V_d;
    if (x->B < 2 || x->B > DRAFTER_MAX_B)
        return err_fail(err, err_len, "%s: block size %d is outside [2, %d]", what, x->B, DRAFTER_MAX_B);

    /* what training meant (dflash_pipe), and what each loader derives from the loader keys against it */
    int tc[DRAFTER_MAX_LAYERS];
    for (int l = 0; l < x->L; l++) tc[l] = x->causal[l];   /* no record: vLLM's reading stands for training */
    int64_t pm = x->mask_token_id, sfa_t = x->sample_from_anchor, pvd = x->V_d;
    if (pipe) {
        int tl[DESC_MAX_LAYERS];
        int n = int_array(json_object_get(pipe, "target_layer_ids_zlab"), "dflash_pipe.target_layer_ids_zlab", tl,
                          DESC_MAX_LAYERS, what, err, err_len);
        if (n < 0) return -1;
        const char *idk = x->format == EXPORT_ZLAB ? "dflash_config.target_layer_ids" : "aux_hidden_state_layer_ids";
        int same = n == x->k;
        for (int i = 0; same && i < n; i++) same = tl[i] == x->zlab_ids[i];
        if (!same)
            return err_fail(err, err_len, "%s: key \"%s\" makes the loaders capture other layers than training did "
                            "(z-lab ids %d... vs trained %d...; speculators ids are z-lab + 1)", what, idk,
                            x->k ? x->zlab_ids[0] : -1, n ? tl[0] : -1);
        int64_t pb, pw;
        if (need_int(pipe, "block_size", &pb, what, err, err_len) || need_int(pipe, "mask_token_id", &pm, what, err, err_len) ||
            need_int(pipe, "sliding_window", &pw, what, err, err_len))
            return -1;
        if (pb != x->B)
            return err_fail(err, err_len, "%s: key \"%s\" gives the loaders block size %d%s, training used %lld", what,
                            x->format == EXPORT_ZLAB ? "dflash_config.block_size" : "block_size", x->B,
                            bs_default ? " (absent at both levels: SGLang's default 16)" : "", (long long)pb);
        if (pm != x->mask_token_id)
            return err_fail(err, err_len, "%s: key \"%smask_token_id\" is %lld, training used %lld", what,
                            x->format == EXPORT_ZLAB ? "dflash_config." : "", (long long)x->mask_token_id,
                            (long long)pm);
        int sl[DRAFTER_MAX_LAYERS];
        json_t *pseudo = json_pack("{s:O}", "layer_types", json_object_get(pipe, "layer_types"));
        int r = read_layer_types(pseudo, x->L, sl, what, err, err_len);
        json_decref(pseudo);
        if (r) return -1;
        for (int l = 0; l < x->L; l++)
            if (sl[l] != x->sliding[l])
                return err_fail(err, err_len, "%s: key \"layer_types\"[%d] makes the loaders run layer %d as %s, "
                                "training ran it as %s", what, l, l, x->sliding[l] ? "sliding" : "full",
                                sl[l] ? "sliding" : "full");
        json_t *pc = json_object_get(pipe, "causal");
        if (!json_is_array(pc) || (int)json_array_size(pc) != x->L)
            return err_fail(err, err_len, "%s: key \"dflash_pipe.causal\" must list one boolean per layer", what);
        for (int l = 0; l < x->L; l++) tc[l] = json_is_true(json_array_get(pc, (size_t)l));
        if (any_s && pw != x->window)
            return err_fail(err, err_len, "%s: the loaders read sliding window %d (%s), training used %lld", what,
                            x->window, x->format == EXPORT_ZLAB ? "dflash_config.swa_window_size, else sliding_window"
                                                                : "transformer_layer_config.sliding_window",
                            (long long)pw);
        int64_t nt;
        if (j_int(pipe, "num_target_layers", &nt) == 0 && !x->n_target) x->n_target = (int)nt;
        sfa_t = json_is_true(json_object_get(pipe, "sample_from_anchor"));
        if (j_int(pipe, "draft_vocab_size", &pvd) != 0) pvd = x->V_d;
        if (pvd != x->V_d)
            return err_fail(err, err_len, "%s: key \"draft_vocab_size\" gives vLLM a draft vocabulary of %d, training "
                            "used %lld", what, x->V_d, (long long)pvd);
    }
    /* the rules on the trained configuration: which loaders should serve this layout, and their other reasons */
    struct drafter_config rc;
    memset(&rc, 0, sizeof rc);
    rc.L = x->L;
    int n_tc = 0;
    for (int l = 0; l < x->L; l++) {
        rc.layer_type[l] = x->sliding[l] ? DRAFTER_LAYER_SLIDING : DRAFTER_LAYER_FULL;
        n_tc += tc[l];
    }
    rc.sliding_window_non_causal = any_s && n_tc == 0;
    rc.sample_from_anchor = (int)sfa_t;
    rc.k = x->k;
    memcpy(rc.layer_ids, x->zlab_ids, sizeof(int) * (size_t)x->k);
    rc.ids_convention = DRAFTER_IDS_ZLAB;
    rc.target.num_hidden_layers = x->n_target;
    if (opts && opts->target_dir) {
        struct model_config tcf;
        char tp[PATH_MAX];
        snprintf(tp, sizeof tp, "%s/config.json", opts->target_dir);
        if (hf_config_load(&tcf, tp, err, err_len)) return -1;
        rc.target.num_hidden_layers = tcf.num_hidden_layers;
    }
    rc.V_t = x->V;
    rc.V_d = x->V_d;
    char rule[EXPORT_N_ENGINES][EXPORT_WHY_LEN];
    export_rules(&rc, x->format, rule);
    x->expected = 0;
    for (int e = 0; e < EXPORT_N_ENGINES; e++)
        if (!rule[e][0] && pipe) x->expected |= EXPORT_ENGINE_BIT(e);
    /* layer 0 named midlayer.* (vLLM renames it, SGLang does not know it) */
    int midlayer = 0;
    {
        char sp[PATH_MAX + 32];
        snprintf(sp, sizeof sp, "%s/model.safetensors", dir);
        struct st_file f;
        if (st_open(&f, sp, err, err_len)) return -1;
        for (int i = 0; i < f.n_tensors; i++) midlayer |= !strncmp(f.tensors[i].name, "midlayer.", 9);
        st_close(&f);
    }
    /* each loader's own reading of the causality keys, then the rules' reasons */
    for (int l = 0; l < x->L && !x->why[EXPORT_VLLM][0]; l++)
        if (tc[l] != x->causal[l])
            snprintf(x->why[EXPORT_VLLM], EXPORT_WHY_LEN, "vLLM derives layer %d as %s in the block (%s), training ran "
                     "it %s", l, x->causal[l] ? "causal" : "bidirectional",
                     x->format == EXPORT_ZLAB ? "is_causal, then dflash_config.causal, else sliding => causal"
                                              : "causal = not sliding_window_non_causal",
                     tc[l] ? "causal" : "bidirectional");
    for (int l = 0; x->format == EXPORT_ZLAB && l < x->L && !x->why[EXPORT_SGLANG][0]; l++)
        if (tc[l] != sg_causal[l])
            snprintf(x->why[EXPORT_SGLANG], EXPORT_WHY_LEN, "SGLang (dflash) runs layer %d %s (is_causal, else sliding "
                     "=> causal, full => bidirectional; it reads no dflash_config.causal), training ran it %s", l,
                     sg_causal[l] ? "causal" : "bidirectional", tc[l] ? "causal" : "bidirectional");
    for (int e = EXPORT_SGLANG; midlayer && e < EXPORT_N_ENGINES; e++)   /* only vLLM renames midlayer. */
        if (!x->why[e][0])
            snprintf(x->why[e], EXPORT_WHY_LEN, "%s does not know the midlayer.* names (only vLLM renames them) and "
                     "would leave layer 0 uninitialised", export_engine_name(e));
    for (int l = 0; l < x->L && !x->why[EXPORT_SPECLIB][0] && (pipe || x->format == EXPORT_SPECULATORS); l++)
        if (tc[l] != sp_causal[l])
            snprintf(x->why[EXPORT_SPECLIB], EXPORT_WHY_LEN, "speculators runs layer %d %s (%s), training ran it %s", l,
                     sp_causal[l] ? "causal" : "bidirectional",
                     x->format == EXPORT_ZLAB ? "its z-lab converter sets sliding_window_non_causal false"
                                              : "sliding layers causal unless sliding_window_non_causal",
                     tc[l] ? "causal" : "bidirectional");
    for (int e = 0; e < EXPORT_N_ENGINES; e++)
        if (!x->why[e][0] && rule[e][0]) memcpy(x->why[e], rule[e], EXPORT_WHY_LEN);
    x->sglang_ok = !x->why[EXPORT_SGLANG][0];
    int must = x->expected | (opts ? opts->require : 0);
    for (int e = 0; e < EXPORT_N_ENGINES; e++)
        if ((must & EXPORT_ENGINE_BIT(e)) && x->why[e][0])
            return err_fail(err, err_len, "%s: %s does not serve it as trained%s: %s", what, export_engine_name(e),
                            x->expected & EXPORT_ENGINE_BIT(e) ? " (the rules say it should, for this configuration "
                            "and layout)" : "", x->why[e]);
    if (x->mixed && !x->why[EXPORT_VLLM][0]) {
        char *rt = NULL;
        size_t rl;
        if (fs_read_file(readme, &rt, &rl, err, err_len)) return -1;
        int ok = strstr(rt, "VLLM_USE_V2_MODEL_RUNNER=1") != NULL;
        free(rt);
        if (!ok)
            return err_fail(err, err_len, "%s: this drafter mixes sliding and full layers, which vLLM serves only "
                            "with its V2 model runner, and the README's vLLM line does not set "
                            "VLLM_USE_V2_MODEL_RUNNER=1", readme);
    }
    /* the target */
    if (opts && opts->target_dir) {
        struct model_config tc;
        char tp[PATH_MAX];
        snprintf(tp, sizeof tp, "%s/config.json", opts->target_dir);
        if (hf_config_load(&tc, tp, err, err_len)) return -1;
        if (tc.hidden_size != x->H)
            return err_fail(err, err_len, "%s: key \"hidden_size\" is %d, the target %s has %d", what, x->H, tp,
                            tc.hidden_size);
        if (tc.vocab_size != x->V)
            return err_fail(err, err_len, "%s: key \"vocab_size\" is %d, the target %s has %d", what, x->V, tp,
                            tc.vocab_size);
        if (x->n_target && tc.num_hidden_layers != x->n_target)
            return err_fail(err, err_len, "%s: key \"num_target_layers\" is %d, the target %s has %d layers", what,
                            x->n_target, tp, tc.num_hidden_layers);
        x->n_target = tc.num_hidden_layers;
        for (int i = 0; i < x->k; i++)
            if (x->zlab_ids[i] >= x->n_target)
                return err_fail(err, err_len, "%s: captured layer (z-lab id) %d is outside the target's %d layers",
                                what, x->zlab_ids[i], x->n_target);
    }
    if (opts && opts->d) {   /* the checkpoint's configuration, key by key */
        const struct drafter_config *c = drafter_config_of(opts->d);
        int ids[DESC_MAX_LAYERS];
        drafter_zlab_ids(c, ids);
        int same_ids = c->k == x->k;
        for (int i = 0; same_ids && i < c->k; i++) same_ids = ids[i] == x->zlab_ids[i];
        const char *key = NULL;
        char a[64] = "", b[64] = "";
        if (c->L != x->L) key = "num_hidden_layers", snprintf(a, sizeof a, "%d", x->L), snprintf(b, sizeof b, "%d", c->L);
        else if (c->B != x->B) key = "block_size", snprintf(a, sizeof a, "%d", x->B), snprintf(b, sizeof b, "%d", c->B);
        else if (!same_ids) key = "target layer ids";
        else if (c->mask_token_id != x->mask_token_id)
            key = "mask_token_id", snprintf(a, sizeof a, "%lld", (long long)x->mask_token_id),
            snprintf(b, sizeof b, "%lld", (long long)c->mask_token_id);
        else if (c->V_d != x->V_d) key = "draft_vocab_size", snprintf(a, sizeof a, "%d", x->V_d), snprintf(b, sizeof b, "%d", c->V_d);
        for (int l = 0; !key && l < c->L; l++) {
            if ((c->layer_type[l] == DRAFTER_LAYER_SLIDING) != x->sliding[l]) key = "layer_types";
            else if (trained_causal(c, l) != tc[l]) key = "causality (dflash_pipe.causal)";
            else if (x->sliding[l] && c->sliding_window != x->window)
                key = "sliding_window", snprintf(a, sizeof a, "%d", x->window), snprintf(b, sizeof b, "%d", c->sliding_window);
        }
        if (key)
            return err_fail(err, err_len, "%s: %s%s%s%s%s differs from the checkpoint's%s%s: the export was made from "
                            "another configuration", what, key, a[0] ? " (" : "", a, a[0] ? ")" : "", "",
                            b[0] ? " " : "", b);
    }
    return check_weights(dir, x->format, &m, opts ? opts->d : NULL, err, err_len);
}

int export_check(const char *dir, const struct export_check_opts *opts, struct export_derived *out, char *err,
                 int err_len) {
    struct export_derived x;
    memset(&x, 0, sizeof x);
    char what[PATH_MAX];
    snprintf(what, sizeof what, "%s/config.json", dir);
    char *text = NULL;
    size_t len;
    if (fs_read_file(what, &text, &len, err, err_len)) return -1;
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    free(text);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return err_fail(err, err_len, "%s:%d: not a JSON object (%s)", what, je.line, je.text);
    }
    int rc = check_inner(dir, j, what, opts, &x, err, err_len);
    const char *vn = json_string_value(
        json_object_get(json_object_get(json_object_get(j, "speculators_config"), "verifier"), "name_or_path"));
    snprintf(x.verifier, sizeof x.verifier, "%s", vn ? vn : "");
    json_decref(j);
    if (out) *out = x;
    return rc;
}

void export_serve_lines(const struct export_derived *x, const char *dir, const char *target, char *buf, size_t len) {
    int spec = x->B - 1;
    size_t at = 0;
    if (!x->why[EXPORT_VLLM][0])
        at += (size_t)snprintf(buf + at, len - at,
                               "%svllm serve %s --speculative-config '{\"method\": \"dflash\", \"model\": \"%s\", "
                               "\"num_speculative_tokens\": %d}'\n",
                               x->mixed ? "VLLM_USE_V2_MODEL_RUNNER=1 " : "", target, dir, spec);
    else
        at += (size_t)snprintf(buf + at, len - at, "# %s does not serve it as trained: %s\n",
                               export_engine_name(EXPORT_VLLM), x->why[EXPORT_VLLM]);
    if (at >= len) return;
    if (!x->why[EXPORT_SGLANG][0])
        snprintf(buf + at, len - at,
                 "python -m sglang.launch_server --model-path %s --speculative-algorithm DFLASH "
                 "--speculative-draft-model-path %s --dtype bfloat16\n", target, dir);
    else
        snprintf(buf + at, len - at, "# %s does not serve it as trained: %s\n", export_engine_name(EXPORT_SGLANG),
                 x->why[EXPORT_SGLANG]);
}

/* ---------------------------------------------------------------- an export back into a drafter */

struct drafter *export_load_dir(const char *dir, const char *target_dir, int T_max, int N, char *err, int err_len) {
    struct export_derived x;
    struct export_check_opts o = {target_dir, NULL, 0};
    if (export_check(dir, &o, &x, err, err_len)) return NULL;
    char what[PATH_MAX];
    snprintf(what, sizeof what, "%s/config.json", dir);
    struct drafter_config c;
    drafter_config_defaults(&c);
    c.L = x.L;
    c.B = x.B;
    int nc = -1;
    for (int l = 0; l < x.L; l++) {
        c.layer_type[l] = x.sliding[l] ? DRAFTER_LAYER_SLIDING : DRAFTER_LAYER_FULL;
        if (!x.sliding[l]) {
            if (x.causal[l]) {
                err_fail(err, err_len, "%s: layer %d is a causal full-attention layer, which dflash-train does not "
                         "have", what, l);
                return NULL;
            }
            continue;
        }
        if (nc >= 0 && nc != !x.causal[l]) {
            err_fail(err, err_len, "%s: sliding layers differ in causality, which dflash-train does not have", what);
            return NULL;
        }
        nc = !x.causal[l];
    }
    c.sliding_window_non_causal = nc > 0;
    if (x.window) c.sliding_window = x.window;
    c.k = x.k;
    memcpy(c.layer_ids, x.zlab_ids, sizeof(int) * (size_t)x.k);
    c.ids_convention = DRAFTER_IDS_ZLAB;
    c.mask_token_id = x.mask_token_id;
    c.sample_from_anchor = x.sample_from_anchor;
    if (T_max > 0) c.T_max = T_max;
    if (N > 0) c.N = N;
    if (drafter_config_from_target(&c, target_dir, err, err_len)) return NULL;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct st_file f;
    if (st_open(&f, path, err, err_len)) return NULL;
    struct drafter *d = NULL;
    uint8_t *t2d = NULL;
    int64_t *d2t = NULL;
    const struct st_tensor *tt = st_find(&f, "t2d"), *td = st_find(&f, "d2t");
    if (x.V_d < x.V) {
        c.V_d = x.V_d;
        t2d = malloc((size_t)x.V);
        d2t = malloc(sizeof *d2t * (size_t)x.V_d);
        if (!t2d || !d2t || !tt || !td) {
            err_fail(err, err_len, "%s: the pruned vocabulary's t2d / d2t could not be read", path);
            goto fail;
        }
        memcpy(t2d, tt->data, (size_t)x.V);
        memcpy(d2t, td->data, sizeof *d2t * (size_t)x.V_d);
    }
    d = drafter_init(&c, 0, err, err_len);
    if (!d) goto fail;
    if (t2d && drafter_set_vocab(d, t2d, d2t, c.V_d, err, err_len)) goto fail;
    if (drafter_load_target(d, target_dir, err, err_len)) goto fail;
    for (int i = 0; i < f.n_tensors; i++) {
        char nm[600];
        vllm_rename(f.tensors[i].name, nm, sizeof nm);
        const struct drafter_param *p = drafter_param_find(d, nm);
        if (!p) continue;   /* t2d / d2t */
        if (f.tensors[i].numel != p->numel) {
            err_fail(err, err_len, "%s: tensor \"%s\" has %lld elements, the drafter's %s %lld", path,
                     f.tensors[i].name, (long long)f.tensors[i].numel, p->name, (long long)p->numel);
            goto fail;
        }
        if (weights_convert_f32(&f.tensors[i], 0, p->numel, p->w, err, err_len)) goto fail;
    }
    st_close(&f);
    free(t2d);
    free(d2t);
    return d;
fail:
    st_close(&f);
    drafter_free(d);
    free(t2d);
    free(d2t);
    return NULL;
}
