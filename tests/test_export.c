/*
 * tests/test_export.c — exports (stages/export/export.h): both layouts round-trip from a checkpoint (export ->
 * check/reload -> identical bf16 weights and config), an existing export is replaced atomically, a directory that
 * is not an export is refused, bad checkpoints/targets fail with a sentence, dflash-export runs end to end, one
 * export per row of the loaders' rules table gets the verdicts the rules give (and README.md holds the table),
 * dflash-train refuses an unservable configuration at start-up, the z-lab export's dflash.py drafts what
 * dflash-eval's proposer drafts (when python3 has torch and transformers), and the checker refuses a corpus of
 * broken exports, one per loader rule (each made from a good export by one edit).
 */
#include "testutil.h"

#include <jansson.h>
#include <signal.h>
#include <dirent.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/fsutil.h"
#include "export/eval.h"
#include "export/export.h"
#include "kernels/common.h"
#include "core/safetensors.h"
#include "train/ckpt.h"
#include "train/optim.h"
#include "train/vocab.h"

#include "test_export_util.h"

/* A checkpoint as dflash-train writes it (its config_to_json keys, optimizer + guard table), of a drafter with
 * layer types `types` ("sliding,full"), B 4, W 4, ids [0, 2], random weights; returns the drafter (kept for the
 * comparison) and the checkpoint path in ckpt. */
static int g_vd;                 /* > 0: the next make_ckpt prunes the draft vocabulary to the even tokens < 2·g_vd */
static int g_sfa;                /* the next make_ckpt's drafter has sample_from_anchor (the checkpoint JSON does not) */
static int g_ids[2] = {0, 2};    /* the next make_ckpt's z-lab ids */
static char g_vocab_dir[600];    /* ... and writes t2d.npy / d2t.npy here */

static struct drafter *make_ckpt(const char *target, const char *types, int non_causal, char *ckpt, size_t len) {
    struct drafter_config c;
    drafter_config_defaults(&c);
    ck_assert_int_eq(drafter_parse_layer_types(&c, types, err, sizeof err), 0);
    c.B = 4;
    c.sliding_window = 4;
    c.sliding_window_non_causal = non_causal;
    c.N = 4;
    c.T_max = 64;
    c.k = 2;
    c.layer_ids[0] = g_ids[0];
    c.layer_ids[1] = g_ids[1];
    c.sample_from_anchor = g_sfa;
    c.mask_token_id = 500;
    ck_assert_msg(drafter_config_from_target(&c, target, err, sizeof err) == 0, "%s", err);
    int V_t = c.V_t;
    if (g_vd) c.V_d = g_vd;
    struct drafter *d = drafter_init(&c, 7, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    if (g_vd) {
        uint8_t *t2d = calloc((size_t)V_t, 1);
        int64_t *d2t = calloc((size_t)g_vd, sizeof *d2t);
        for (int i = 0; i < g_vd; i++) {
            t2d[2 * i] = 1;
            d2t[i] = i;   /* target id = i + d2t[i] = 2i */
        }
        ck_assert_msg(drafter_set_vocab(d, t2d, d2t, g_vd, err, sizeof err) == 0, "%s", err);
        snprintf(g_vocab_dir, sizeof g_vocab_dir, "%s", test_tmpdir("export-vocab"));
        char p[700];
        snprintf(p, sizeof p, "%s/t2d.npy", g_vocab_dir);
        ck_assert_int_eq(vocab_npy_write_bool(p, t2d, V_t, err, sizeof err), 0);
        snprintf(p, sizeof p, "%s/d2t.npy", g_vocab_dir);
        ck_assert_int_eq(vocab_npy_write_i64(p, d2t, g_vd, err, sizeof err), 0);
        free(t2d);
        free(d2t);
    }
    ck_assert_msg(drafter_load_target(d, target, err, sizeof err) == 0, "%s", err);
    /* norms away from 1 so a swapped tensor shows */
    uint64_t s = 99;
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (p->trainable && p->ndim == 1)
            for (int64_t e = 0; e < p->numel; e++) p->w[e] = 1 + test_rng_uniform(&s, -0.3f, 0.3f);
    }
    save_ckpt(d, ckpt, len);
    return d;
}

static void assert_same_weights(const struct drafter *a, const struct drafter *b) {
    for (int i = 0; i < drafter_n_params(a); i++) {
        const struct drafter_param *p = drafter_param(a, i), *q = drafter_param_find(b, p->name);
        ck_assert_ptr_nonnull(q);
        ck_assert_int_eq(p->numel, q->numel);
        ck_assert_msg(memcmp(p->w, q->w, sizeof(float) * (size_t)p->numel) == 0, "%s differs after the reload",
                      p->name);
    }
}

static void roundtrip(int format, const char *types, int non_causal) {
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d0 = make_ckpt(target, types, non_causal, ckpt, sizeof ckpt);
    int64_t step = -1;
    struct drafter *d = export_load_checkpoint(ckpt, target, NULL, 0, 0, &step, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_int_eq(step, 5);
    assert_same_weights(d0, d);
    char out[700];
    snprintf(out, sizeof out, "%s/export", test_tmpdir("export-out"));
    ck_assert_msg(export_write(d, format, out, "tiny-target", err, sizeof err) == 0, "%s", err);
    /* SGLang reads only the z-lab layout, and reads is_causal there (written for bidirectional sliding layers) */
    struct export_check_opts o = {target, d, format == EXPORT_ZLAB ? EXPORT_ENGINE_BIT(EXPORT_SGLANG) : 0};
    struct export_derived x;
    ck_assert_msg(export_check(out, &o, &x, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(x.sglang_ok, format == EXPORT_ZLAB);
    ck_assert_msg(x.why[EXPORT_VLLM][0] == '\0', "%s", x.why[EXPORT_VLLM]);
    const struct drafter_config *c = drafter_config_of(d);
    ck_assert_int_eq(x.format, format);
    ck_assert_int_eq(x.L, c->L);
    ck_assert_int_eq(x.B, c->B);
    ck_assert_int_eq(x.k, 2);
    ck_assert_int_eq(x.zlab_ids[0], 0);
    ck_assert_int_eq(x.zlab_ids[1], 2);
    ck_assert_int_eq(x.mask_token_id, 500);
    ck_assert_int_eq(x.window, strstr(types, "sliding") ? 4 : 0);
    ck_assert_int_eq(x.n_target, c->target.num_hidden_layers);
    for (int l = 0; l < c->L; l++) {
        ck_assert_int_eq(x.sliding[l], c->layer_type[l] == DRAFTER_LAYER_SLIDING);
        ck_assert_int_eq(x.causal[l], c->layer_type[l] == DRAFTER_LAYER_SLIDING && !non_causal);
    }
    /* the stored tensors are exactly bf16 of the masters: read them back */
    char p[800];
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    struct st_file f;
    ck_assert_msg(st_open(&f, p, err, sizeof err) == 0, "%s", err);
    int n_expect = 0;
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *q = drafter_param(d, i);
        if (!strncmp(q->name, "verifier_", 9)) continue;
        int body = strcmp(q->name, "embed_tokens.weight") && strcmp(q->name, "lm_head.weight");
        const struct st_tensor *t = st_find(&f, q->name);
        if (format == EXPORT_ZLAB && !body) {
            ck_assert_msg(t == NULL, "the z-lab layout must not carry %s", q->name);
            continue;
        }
        ck_assert_msg(t != NULL, "%s missing", q->name);
        n_expect++;
        ck_assert_int_eq(t->dtype, ST_BF16);
        for (int64_t e = 0; e < q->numel; e++) {
            bf16 h;
            memcpy(&h, (const char *)t->data + 2 * e, 2);
            ck_assert_uint_eq(h, float_to_bf16(q->w[e]));
        }
    }
    ck_assert_int_eq(f.n_tensors, n_expect);
    st_close(&f);
    snprintf(p, sizeof p, "%s/dflash.py", out);   /* auto_map's modeling file, z-lab only */
    ck_assert_int_eq(fs_exists(p), format == EXPORT_ZLAB);
    /* export again over it: replaced, no temporaries left */
    ck_assert_msg(export_write(d, format, out, "tiny-target", err, sizeof err) == 0, "%s", err);
    ck_assert_msg(export_check(out, &o, &x, err, sizeof err) == 0, "%s", err);
    char parent[700];
    snprintf(parent, sizeof parent, "%s", out);
    *strrchr(parent, '/') = '\0';
    DIR *dd = opendir(parent);
    struct dirent *de;
    int entries = 0;
    while ((de = readdir(dd)))
        if (de->d_name[0] != '.') entries++;
    closedir(dd);
    ck_assert_int_eq(entries, 1);
    /* the export loads back into a drafter: same config, weights = bf16 of the masters */
    struct drafter *dl = export_load_dir(out, target, 0, 0, err, sizeof err);
    ck_assert_msg(dl != NULL, "%s", err);
    const struct drafter_config *cl = drafter_config_of(dl);
    ck_assert_int_eq(cl->L, c->L);
    ck_assert_int_eq(cl->B, c->B);
    ck_assert_int_eq(cl->sliding_window_non_causal, c->sliding_window_non_causal);
    ck_assert_int_eq(cl->mask_token_id, c->mask_token_id);
    for (int l = 0; l < c->L; l++) ck_assert_int_eq(cl->layer_type[l], c->layer_type[l]);
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *q = drafter_param(d, i), *r = drafter_param_find(dl, q->name);
        ck_assert_ptr_nonnull(r);
        for (int64_t e = 0; e < q->numel; e++)
            ck_assert_msg(r->w[e] == bf16_round(q->w[e]) || !strncmp(q->name, "verifier_", 9) ||
                          (format == EXPORT_ZLAB && !strcmp(q->name, "embed_tokens.weight")) ||
                          (format == EXPORT_ZLAB && !strcmp(q->name, "lm_head.weight")),
                          "%s[%lld]: %g vs %g", q->name, (long long)e, (double)r->w[e], (double)q->w[e]);
    }
    drafter_free(dl);
    /* a weight changed after the export is caught */
    drafter_param(d, 0)->w[3] += 1.0f;
    ck_assert_int_eq(export_check(out, &o, &x, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not its bf16 rounding"), "%s", err);
    drafter_free(d);
    drafter_free(d0);
}

START_TEST(zlab_roundtrip) { roundtrip(EXPORT_ZLAB, "sliding,sliding", 0); }
END_TEST
START_TEST(zlab_roundtrip_mixed_noncausal) { roundtrip(EXPORT_ZLAB, "sliding,full", 1); }
END_TEST
START_TEST(speculators_roundtrip) { roundtrip(EXPORT_SPECULATORS, "sliding,sliding", 0); }
END_TEST
START_TEST(speculators_roundtrip_full_noncausal) { roundtrip(EXPORT_SPECULATORS, "full,full", 0); }
END_TEST
START_TEST(speculators_roundtrip_mixed_noncausal) { roundtrip(EXPORT_SPECULATORS, "sliding,full", 1); }
END_TEST

/* Causal sliding + bidirectional full layers (dflash-train's default): vLLM's speculators path applies one causality
 * to every layer, so that layout is not for vLLM; it is still a complete export that speculators loads exactly, so
 * the checker accepts it (exit codes mean what they say) unless vLLM is required, and the README has no vLLM line. */
START_TEST(speculators_mixed_causal_refused) {
    const char *target = tiny_target();
    char ckpt[1024], out[700];
    struct drafter *d = make_ckpt(target, "sliding,full", 0, ckpt, sizeof ckpt);
    ck_assert_int_eq(export_speculators_vllm_servable(drafter_config_of(d)), 0);
    snprintf(out, sizeof out, "%s/export", test_tmpdir("export-mixed"));
    ck_assert_msg(export_write(d, EXPORT_SPECULATORS, out, "t", err, sizeof err) == 0, "%s", err);
    struct export_check_opts o = {target, d, 0};
    struct export_derived x;
    ck_assert_msg(export_check(out, &o, &x, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(x.why[EXPORT_VLLM], "vLLM derives layer 1 as causal"), "%s", x.why[EXPORT_VLLM]);
    ck_assert_msg(x.why[EXPORT_SPECLIB][0] == '\0', "%s", x.why[EXPORT_SPECLIB]);
    o.require = EXPORT_ENGINE_BIT(EXPORT_VLLM);
    ck_assert_int_eq(export_check(out, &o, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "vLLM 0.33.0 does not serve it as trained") && strstr(err, "vLLM derives layer 1 as causal"),
                  "%s", err);
    char p[800], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/README.md", out);
    ck_assert_int_eq(fs_read_file(p, &text, &len, err, sizeof err), 0);
    ck_assert_msg(strstr(text, "# vLLM 0.33.0 does not serve it as trained") && !strstr(text, "vllm serve"), "%s", text);
    free(text);
    /* dflash-export exits 0 for it (complete, speculators loads it exactly), 1 when vLLM is required */
    const char *a1[] = {test_bin("dflash-export"), ckpt, "--target-model", target, "--format", "speculators", "--out",
                        out, NULL};
    ck_assert_msg(run_argv(a1) == 0, "%s", out_text);
    const char *a2[] = {test_bin("dflash-export"), "--check", out, "--target-model", target, "--require", "vllm", NULL};
    ck_assert_int_eq(run_argv(a2), 1);
    ck_assert_msg(strstr(out_text, "REFUSED") && strstr(out_text, "vLLM 0.33.0"), "%s", out_text);
    drafter_free(d);
}
END_TEST

/* Capturing the target's last layer (z-lab id 3 of the 4-layer target): vLLM captures it before the final norm, as
 * trained; SGLang never captures it, speculators' z-lab converter drops it and z-lab reads it after the norm: the
 * checker names them, and refuses when one of them is required. */
START_TEST(last_layer_capture) {
    const char *target = tiny_target();
    char ckpt[1024], out[700];
    g_ids[1] = 3;
    struct drafter *d = make_ckpt(target, "full,full", 0, ckpt, sizeof ckpt);
    g_ids[1] = 2;
    snprintf(out, sizeof out, "%s/export", test_tmpdir("export-last"));
    ck_assert_msg(export_write(d, EXPORT_ZLAB, out, "t", err, sizeof err) == 0, "%s", err);
    struct export_check_opts o = {target, d, 0};
    struct export_derived x;
    ck_assert_msg(export_check(out, &o, &x, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(x.why[EXPORT_VLLM][0] == '\0', "%s", x.why[EXPORT_VLLM]);
    ck_assert_msg(strstr(x.why[EXPORT_SGLANG], "never captures the last layer"), "%s", x.why[EXPORT_SGLANG]);
    ck_assert_msg(strstr(x.why[EXPORT_SPECLIB], "drops the last target layer"), "%s", x.why[EXPORT_SPECLIB]);
    ck_assert_msg(strstr(x.why[EXPORT_ZLABREF], "after the final norm"), "%s", x.why[EXPORT_ZLABREF]);
    for (int e = EXPORT_SGLANG; e < EXPORT_N_ENGINES; e++) {
        o.require = EXPORT_ENGINE_BIT(e);
        ck_assert_int_eq(export_check(out, &o, NULL, err, sizeof err), -1);
        ck_assert_msg(strstr(err, export_engine_name(e)) && strchr(err, '\n') == NULL, "%s", err);
    }
    char p[800], *text;
    size_t len;
    snprintf(p, sizeof p, "%s/README.md", out);
    ck_assert_int_eq(fs_read_file(p, &text, &len, err, sizeof err), 0);
    ck_assert_msg(strstr(text, "vllm serve") && !strstr(text, "sglang.launch_server"), "%s", text);
    free(text);
    /* the speculators layout: vLLM and speculators serve it */
    ck_assert_msg(export_write(d, EXPORT_SPECULATORS, out, "t", err, sizeof err) == 0, "%s", err);
    o.require = EXPORT_ENGINE_BIT(EXPORT_VLLM) | EXPORT_ENGINE_BIT(EXPORT_SPECLIB);
    ck_assert_msg(export_check(out, &o, &x, err, sizeof err) == 0, "%s", err);
    drafter_free(d);
}
END_TEST

START_TEST(refuses_bad_inputs) {
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d0 = make_ckpt(target, "sliding,sliding", 0, ckpt, sizeof ckpt);
    /* a directory that is not an export is never replaced */
    const char *other = test_tmpdir("export-other");
    ck_assert_int_eq(export_write(d0, EXPORT_ZLAB, other, "t", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not an export directory"), "%s", err);
    /* a target whose vocabulary / hidden size does not fit */
    const char *t2 = test_tmpdir("export-target2");
    char src[700], dst[700], *text;
    size_t len;
    snprintf(src, sizeof src, "%s/config.json", target);
    ck_assert_int_eq(fs_read_file(src, &text, &len, err, sizeof err), 0);
    json_t *j = json_loads(text, 0, NULL);
    free(text);
    json_object_set_new(j, "vocab_size", json_integer(600));
    text = json_dumps(j, 0);
    snprintf(dst, sizeof dst, "%s/config.json", t2);
    ck_assert_int_eq(fs_write_atomic(dst, text, strlen(text), err, sizeof err), 0);
    free(text);
    ck_assert_ptr_null(export_load_checkpoint(ckpt, t2, NULL, 0, 0, NULL, err, sizeof err));
    ck_assert_msg(strstr(err, "vocab_size") && strstr(err, ckpt), "%s", err);
    json_object_set_new(j, "vocab_size", json_integer(512));
    json_object_set_new(j, "hidden_size", json_integer(32));
    text = json_dumps(j, 0);
    ck_assert_int_eq(fs_write_atomic(dst, text, strlen(text), err, sizeof err), 0);
    free(text);
    json_decref(j);
    ck_assert_ptr_null(export_load_checkpoint(ckpt, t2, NULL, 0, 0, NULL, err, sizeof err));
    ck_assert_msg(strstr(err, "hidden_size"), "%s", err);
    /* an export checked against a checkpoint of another configuration */
    char ck2[1024], out[700];
    struct drafter *d2 = make_ckpt(target, "sliding,full", 0, ck2, sizeof ck2);
    snprintf(out, sizeof out, "%s/export", test_tmpdir("export-other-cfg"));
    ck_assert_msg(export_write(d0, EXPORT_ZLAB, out, "t", err, sizeof err) == 0, "%s", err);
    struct export_check_opts oc = {target, d2, 0};
    ck_assert_int_eq(export_check(out, &oc, NULL, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "layer_types differs from the checkpoint's") && strstr(err, "another configuration"),
                  "%s", err);
    drafter_free(d2);
    /* not a checkpoint */
    ck_assert_ptr_null(export_load_checkpoint(src, target, NULL, 0, 0, NULL, err, sizeof err));
    drafter_free(d0);
}
END_TEST

/* A pruned draft vocabulary: both layouts carry t2d / d2t and the pruned LM head (vLLM maps the z-lab layout's
 * draft ids through d2t when draft_vocab_size differs from the target's) and load back; SGLang, which drafts with
 * the target's full head, is named; the checkpoint needs the vocabulary dir. */
START_TEST(speculators_pruned_vocab) {
    const char *target = tiny_target();
    char ckpt[1024];
    g_vd = 100;
    struct drafter *d0 = make_ckpt(target, "sliding,sliding", 0, ckpt, sizeof ckpt);
    ck_assert_ptr_null(export_load_checkpoint(ckpt, target, NULL, 0, 0, NULL, err, sizeof err));
    ck_assert_msg(strstr(err, "draft_vocab_size"), "%s", err);
    struct drafter *d = export_load_checkpoint(ckpt, target, g_vocab_dir, 0, 0, NULL, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    assert_same_weights(d0, d);
    char out[700], p[800];
    snprintf(out, sizeof out, "%s/export", test_tmpdir("export-pruned"));
    struct export_check_opts o = {target, d, 0};
    struct export_derived x;
    for (int format = EXPORT_ZLAB; format <= EXPORT_SPECULATORS; format++) {
    ck_assert_msg(export_write(d, format, out, "t", err, sizeof err) == 0, "%s", err);
    ck_assert_msg(export_check(out, &o, &x, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(x.V_d, 100);
    ck_assert_msg(x.why[EXPORT_VLLM][0] == '\0', "%s", x.why[EXPORT_VLLM]);
    ck_assert_msg(strstr(x.why[EXPORT_SGLANG], format == EXPORT_ZLAB ? "full LM head" : "only the z-lab layout"), "%s",
                  x.why[EXPORT_SGLANG]);
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    struct st_file f;
    ck_assert_int_eq(st_open(&f, p, err, sizeof err), 0);
    const struct st_tensor *t2d = st_find(&f, "t2d"), *d2t = st_find(&f, "d2t"), *lm = st_find(&f, "lm_head.weight");
    ck_assert_ptr_nonnull(t2d);
    ck_assert_ptr_nonnull(d2t);
    ck_assert_int_eq(t2d->dtype, ST_BOOL);
    ck_assert_int_eq(d2t->dtype, ST_I64);
    ck_assert_int_eq(lm->shape[0], 100);
    int64_t v;
    memcpy(&v, (const char *)d2t->data + 8 * 7, 8);
    ck_assert_int_eq(v, 7);
    ck_assert_int_eq(((const uint8_t *)t2d->data)[14], 1);
    ck_assert_int_eq(((const uint8_t *)t2d->data)[15], 0);
    st_close(&f);
    struct drafter *dl = export_load_dir(out, target, 0, 0, err, sizeof err);
    ck_assert_msg(dl != NULL, "%s", err);
    ck_assert_int_eq(drafter_config_of(dl)->V_d, 100);
    const struct drafter_param *a = drafter_param_find(d, "lm_head.weight"), *b = drafter_param_find(dl, "lm_head.weight");
    for (int64_t e = 0; e < a->numel; e++) ck_assert(b->w[e] == bf16_round(a->w[e]));
    drafter_free(dl);
    }
    drafter_free(d);
    drafter_free(d0);
    g_vd = 0;
}
END_TEST

/* What dflash-train calls at the end: both layouts under RUN/export, checked. */
START_TEST(run_exports) {
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d = make_ckpt(target, "sliding,full", 0, ckpt, sizeof ckpt);
    const char *run = test_tmpdir("export-runend");
    char skipped[768], p[800];
    ck_assert_msg(export_write_run(d, run, target, skipped, sizeof skipped, err, sizeof err) == 0, "%s", err);
    /* mixed, causal sliding layers: the z-lab layout for both engines, the speculators one for neither */
    ck_assert_msg(strstr(skipped, "export/zlab serves on vLLM 0.33.0 and SGLang 0.5.23") &&
                  strstr(skipped, "export/speculators serves on no serving engine"), "%s", skipped);
    struct export_check_opts o = {target, d, 0};
    snprintf(p, sizeof p, "%s/export/zlab", run);
    ck_assert_msg(export_check(p, &o, NULL, err, sizeof err) == 0, "%s", err);
    snprintf(p, sizeof p, "%s/export/speculators", run);
    ck_assert_msg(fs_exists(p), "%s", p);
    /* an all-sliding drafter: both layouts checked, nothing skipped. The first drafter stays alive until the
     * check against it is done (freed earlier, a new drafter at the same address made the check flaky). */
    struct drafter *d2 = make_ckpt(target, "sliding,sliding", 0, ckpt, sizeof ckpt);
    ck_assert_msg(export_write_run(d2, run, target, skipped, sizeof skipped, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(strstr(skipped, "export/speculators serves on vLLM 0.33.0;") == NULL &&
                  strstr(skipped, "export/speculators serves on vLLM 0.33.0"), "%s", skipped);
    ck_assert_msg(export_check(p, &o, NULL, err, sizeof err) == -1, "the old drafter must not match");
    struct export_check_opts o2 = {target, d2, 0};
    ck_assert_msg(export_check(p, &o2, NULL, err, sizeof err) == 0, "%s", err);
    drafter_free(d);
    drafter_free(d2);
}
END_TEST

/* dflash-export end to end: export both layouts, --check them (with the checkpoint), serve lines printed. */
START_TEST(cli_end_to_end) {
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d0 = make_ckpt(target, "sliding,sliding", 0, ckpt, sizeof ckpt);
    drafter_free(d0);
    const char *fmts[] = {"zlab", "speculators"};
    for (int k = 0; k < 2; k++) {
        char out[700];
        snprintf(out, sizeof out, "%s/%s", test_tmpdir("export-cli"), fmts[k]);
        const char *a1[] = {test_bin("dflash-export"), ckpt, "--target-model", target, "--format", fmts[k], "--out",
                            out, NULL};
        ck_assert_msg(run_argv(a1) == 0, "%s", out_text);
        ck_assert_msg(strstr(out_text, "vllm serve") && (k == 1) == !strstr(out_text, "sglang.launch_server"), "%s",
                      out_text);   /* SGLang reads only the z-lab layout */
        ck_assert_msg(strstr(out_text, "SGLang 0.5.23") && strstr(out_text, "serves as trained"), "%s", out_text);
        const char *a2[] = {test_bin("dflash-export"), "--check", out, "--target-model", target, "--ckpt", ckpt, NULL};
        ck_assert_msg(run_argv(a2) == 0, "%s", out_text);
        ck_assert_msg(strstr(out_text, "accepted") && strstr(out_text, "num_speculative_tokens\": 3"), "%s", out_text);
    }
    /* --help prints the rules table */
    const char *h[] = {test_bin("dflash-export"), "--help", NULL};
    run_argv(h);
    ck_assert_msg(strstr(out_text, "| configuration | layout | vLLM 0.33.0 | SGLang 0.5.23 |"), "%s", out_text);
    /* a refused export exits 1 with one sentence */
    const char *a3[] = {test_bin("dflash-export"), "--check", target, NULL};
    ck_assert_int_eq(run_argv(a3), 1);
    ck_assert_msg(strstr(out_text, "REFUSED") && strstr(out_text, "architectures"), "%s", out_text);
}
END_TEST


/* The real trainer: shm + target + hspack + dflash-train on the tiny model, fed by dflash-pack; at the end the
 * exports under RUN/export pass the checker against the trainer's own checkpoint (its config JSON is what
 * export_load_checkpoint parses), and dflash-export re-exports that checkpoint. */
static char *spec_of(const char *const *argv) {
    static char buf[3][512];
    static int k;
    ck_assert_msg(run_argv(argv) == 0, "%s", out_text);
    char *b = buf[k++ % 3];
    size_t n = strcspn(out_text, "\n");
    ck_assert_uint_lt(n, 512);
    memcpy(b, out_text, n);
    b[n] = '\0';
    return b;
}

static int wait_exit(pid_t pid, int seconds) {
    for (int i = 0; i < seconds * 20; i++) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        ck_assert_int_ge(r, 0);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_abort_msg("pid %d did not exit within %d s", (int)pid, seconds);
    return -1;
}

START_TEST(trainer_writes_exports) {
    const char *model = test_tmpdir("export-train-model");
    char data[700], run[700], log[800];
    snprintf(data, sizeof data, "%s/data.jsonl", model);
    snprintf(run, sizeof run, "%s/run", test_tmpdir("export-train-run"));
    const char *mk[] = {test_bin("dflash-mkmodel"), "--preset", "tiny", "--out", model, "--dataset", data, "--samples",
                        "16", "--median-len", "40", "--min-len", "16", "--max-len", "100", NULL};
    ck_assert_msg(run_argv(mk) == 0, "%s", out_text);
    const char *p1[] = {test_bin("dflash-pack"), "--tokens", "128", "--print-ring-spec", NULL};
    const char *p2[] = {test_bin("dflash-target"), "--model", model, "--tokens", "128", "--device", "cpu", "--layers",
                        "0,2", "--print-ring-spec", NULL};
    const char *p3[] = {test_bin("dflash-hspack"), "--tokens", "128", "--n-layers", "2", "--hidden-size", "64",
                        "--dtype", "f32", "--print-ring-spec", NULL};
    char *s1 = spec_of(p1), *s2 = spec_of(p2), *s3 = spec_of(p3);
    snprintf(log, sizeof log, "%s.log", run);
    const char *shm[] = {test_bin("dflash-shm"), "--run", run, "--ring", s1, "--ring", s2, "--ring", s3, NULL};
    pid_t ps = test_spawn_log(log, shm);
    const char *tg[] = {test_bin("dflash-target"), "--run", run, "--model", model, "--tokens", "128", "--device", "cpu",
                        "--layers", "0,2", NULL};
    const char *hs[] = {test_bin("dflash-hspack"), "--run", run, "--device", "cpu", NULL};
    const char *tr[] = {test_bin("dflash-train"), "--run", run, "--target-model", model, "--device", "cpu", "--tokens",
                        "128", "--block-size", "4", "--max-anchors", "8", "--layer-types", "sliding,full",
                        "--sliding-window", "8", "--target-layer-ids", "0,2", "--mask-token-id", "511", "--max-steps",
                        "3", NULL};
    pid_t pt = test_spawn_log(log, tg), ph = test_spawn_log(log, hs), pr = test_spawn_log(log, tr);
    const char *pk[] = {test_bin("dflash-pack"), "--run", run, "--data", data, "--tokens", "128", "--epochs", "1", NULL};
    pid_t pp = test_spawn_log(log, pk);
    int rc_train = wait_exit(pr, 40);
    int rc_pack = wait_exit(pp, 20);
    const char *down[] = {test_bin("dflash-shm"), "--run", run, "--shutdown", NULL};
    run_argv(down);
    wait_exit(ps, 20);
    kill(pt, SIGTERM);
    kill(ph, SIGTERM);
    wait_exit(pt, 20);
    wait_exit(ph, 20);
    char *text;
    size_t len;
    ck_assert_int_eq(fs_read_file(log, &text, &len, err, sizeof err), 0);
    ck_assert_msg(rc_train == 0 && rc_pack == 0, "train %d, pack %d: %s", rc_train, rc_pack, text);
    ck_assert_msg(strstr(text, "exports written to"), "%s", text);
    free(text);
    char ckpt[800], zl[800], sp[800], again[800];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-3.ckpt", run);
    snprintf(zl, sizeof zl, "%s/export/zlab", run);
    snprintf(sp, sizeof sp, "%s/export/speculators", run);
    snprintf(again, sizeof again, "%s/export/again", run);
    struct drafter *d = export_load_checkpoint(ckpt, model, NULL, 0, 0, NULL, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    struct export_check_opts o = {model, d, 0};
    struct export_derived x;
    ck_assert_msg(export_check(zl, &o, &x, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(x.mixed, 1);
    ck_assert_int_eq(x.window, 8);
    ck_assert_int_eq(x.mask_token_id, 511);
    ck_assert_msg(export_check(sp, &o, &x, err, sizeof err) == 0, "%s", err);   /* complete: speculators loads it */
    ck_assert_msg(strstr(x.why[EXPORT_VLLM], "vLLM derives layer 1 as causal"), "%s", x.why[EXPORT_VLLM]);
    o.require = EXPORT_ENGINE_BIT(EXPORT_VLLM);   /* mixed + causal sliding: not for vLLM in this layout */
    ck_assert_int_eq(export_check(sp, &o, &x, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "vLLM derives layer 1 as causal"), "%s", err);
    drafter_free(d);
    const char *ex[] = {test_bin("dflash-export"), ckpt, "--target-model", model, "--format", "zlab", "--out", again,
                        NULL};
    ck_assert_msg(run_argv(ex) == 0, "%s", out_text);
    char a[900], b[900], *ta, *tb;
    size_t la, lb;
    snprintf(a, sizeof a, "%s/model.safetensors", zl);
    snprintf(b, sizeof b, "%s/model.safetensors", again);
    ck_assert_int_eq(fs_read_file(a, &ta, &la, err, sizeof err), 0);
    ck_assert_int_eq(fs_read_file(b, &tb, &lb, err, sizeof err), 0);
    ck_assert_msg(la == lb && memcmp(ta, tb, la) == 0, "the trainer's export and dflash-export's differ");
    free(ta);
    free(tb);
}
END_TEST

/* ---------------------------------------------------------------- the rules table, one export per row */

/* Every row of the rules table (export_rules_table, printed by README.md and dflash-export --help) made on the
 * tiny target: each layout written (the z-lab one refused for sample_from_anchor), checked, and the verdicts the
 * checker derives from the files equal to the rules' for the configuration; export_unservable only where no
 * serving engine serves either layout. */
START_TEST(rules_table_rows) {
    const struct export_rules_row *r = export_rules_row(_i);
    ck_assert_ptr_nonnull(r);
    const char *target = tiny_target();
    char ckpt[1024], out[700];
    g_vd = r->pruned ? 100 : 0;
    g_sfa = r->sfa;
    g_ids[1] = r->last ? 3 : 2;
    struct drafter *d = make_ckpt(target, r->types, r->nc, ckpt, sizeof ckpt);
    g_vd = g_sfa = 0;
    g_ids[1] = 2;
    const struct drafter_config *c = drafter_config_of(d);
    int unservable = export_unservable(c, err, sizeof err);
    ck_assert_msg(unservable == r->sfa, "%s: export_unservable %d: %s", r->name, unservable, err);
    if (unservable) ck_assert_msg(strstr(err, "--allow-unservable") && strstr(err, "--sample-from-anchor"), "%s", err);
    for (int f = EXPORT_ZLAB; f <= EXPORT_SPECULATORS; f++) {
        char why[EXPORT_N_ENGINES][EXPORT_WHY_LEN];
        export_rules(c, f, why);
        snprintf(out, sizeof out, "%s/%s", test_tmpdir("export-row"), export_format_name(f));
        if (f == EXPORT_ZLAB && r->sfa) {
            ck_assert_int_eq(export_write(d, f, out, "t", err, sizeof err), -1);
            ck_assert_msg(strstr(err, "sample_from_anchor"), "%s", err);
            continue;
        }
        ck_assert_msg(export_write(d, f, out, "t", err, sizeof err) == 0, "%s %s: %s", r->name, export_format_name(f), err);
        struct export_check_opts o = {target, d, 0};
        struct export_derived x;
        ck_assert_msg(export_check(out, &o, &x, err, sizeof err) == 0, "%s %s: %s", r->name, export_format_name(f), err);
        for (int e = 0; e < EXPORT_N_ENGINES; e++)
            ck_assert_msg(!x.why[e][0] == !why[e][0], "%s, %s layout, %s: checker \"%s\", rules \"%s\"", r->name,
                          export_format_name(f), export_engine_name(e), x.why[e], why[e]);
        /* the README's serve lines: a launch line exactly for the engines that serve it */
        char p[800], *text;
        size_t len;
        snprintf(p, sizeof p, "%s/README.md", out);
        ck_assert_int_eq(fs_read_file(p, &text, &len, err, sizeof err), 0);
        ck_assert_msg(!strstr(text, "vllm serve") == !!why[EXPORT_VLLM][0], "%s", text);
        ck_assert_msg(!strstr(text, "sglang.launch_server") == !!why[EXPORT_SGLANG][0], "%s", text);
        if (!why[EXPORT_VLLM][0] && x.mixed) ck_assert_msg(strstr(text, "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve"), "%s", text);
        free(text);
    }
    drafter_free(d);
}
END_TEST

/* dflash-train refuses a configuration no serving engine serves (--sample-from-anchor) at start-up, before it waits
 * for any input, with one line naming the engines and the flag; --allow-unservable trains it anyway (here it then
 * waits for its input ring, which does not exist, and says so). */
START_TEST(trainer_refuses_unservable) {
    const char *model = test_tmpdir("export-unserv-model");
    const char *mk[] = {test_bin("dflash-mkmodel"), "--preset", "tiny", "--out", model, NULL};
    ck_assert_msg(run_argv(mk) == 0, "%s", out_text);
    char run[700];
    snprintf(run, sizeof run, "%s/run", test_tmpdir("export-unserv-run"));
    const char *tr[] = {test_bin("dflash-train"), "--run", run, "--target-model", model, "--device", "cpu", "--tokens",
                        "128", "--layer-types", "full,full", "--target-layer-ids", "0,2", "--mask-token-id", "511",
                        "--max-steps", "1", "--wait-ms", "300", "--sample-from-anchor", NULL, NULL};
    ck_assert_int_ne(run_argv(tr), 0);
    ck_assert_msg(strstr(out_text, "no serving engine serves this drafter") && strstr(out_text, "vLLM 0.33.0") &&
                  strstr(out_text, "SGLang 0.5.23") && strstr(out_text, "--sample-from-anchor") &&
                  strstr(out_text, "--allow-unservable") && !strstr(out_text, "does not exist after waiting"),
                  "%s", out_text);
    tr[sizeof tr / sizeof tr[0] - 2] = "--allow-unservable";
    ck_assert_int_ne(run_argv(tr), 0);
    ck_assert_msg(strstr(out_text, "--allow-unservable: no serving engine") && strstr(out_text, "does not exist"), "%s",
                  out_text);
}
END_TEST

/* README.md holds the rules table as the code prints it (run from the repository root, as make test does). */
START_TEST(readme_has_rules_table) {
    static char table[16384];
    export_rules_table(table, sizeof table);
    char *text;
    size_t len;
    ck_assert_msg(fs_read_file("README.md", &text, &len, err, sizeof err) == 0, "%s", err);
    for (char *line = table, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        ck_assert_ptr_nonnull(nl);
        *nl = '\0';
        ck_assert_msg(strstr(text, line), "README.md lacks the rules table row: %s", line);
    }
    free(text);
}
END_TEST

/* ---------------------------------------------------------------- dflash.py against dflash-eval's proposer */

/* The z-lab export's dflash.py, loaded by transformers (AutoModel, trust_remote_code), drafts the same tokens as
 * dflash-eval's proposer (eval_drafter_propose on the same export) from the same target features, and its block
 * states agree within 1e-4: a mixed causal drafter with a window shorter than the context, and a pruned
 * vocabulary with bidirectional sliding layers (d2t). Skipped, with a printed line, without python3 + torch +
 * transformers. */
START_TEST(dflash_py_matches_eval) {
    const char *probe[] = {"/bin/sh", "-c", "python3 -c 'import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) "
                           "for m in (\"torch\", \"transformers\", \"safetensors\")) else 1)' >/dev/null 2>&1", NULL};
    if (run_argv(probe) != 0) {
        printf("test_export: dflash_py_matches_eval skipped: python3 cannot import torch, transformers and "
               "safetensors\n");
        return;
    }
    const char *target = tiny_target();
    setenv("HF_MODULES_CACHE", test_tmpdir("export-hfmod"), 1);
    static const struct { const char *types; int nc, vd; } cases[] = {{"sliding,full", 0, 0}, {"sliding,sliding", 1, 100}};
    for (int k = 0; k < 2; k++) {
        char ckpt[1024], out[700], inp[800];
        g_vd = cases[k].vd;
        struct drafter *d0 = make_ckpt(target, cases[k].types, cases[k].nc, ckpt, sizeof ckpt);
        g_vd = 0;
        snprintf(out, sizeof out, "%s/export", test_tmpdir("export-py"));
        ck_assert_msg(export_write(d0, EXPORT_ZLAB, out, "t", err, sizeof err) == 0, "%s", err);
        struct drafter *dl = export_load_dir(out, target, 64, 1, err, sizeof err);
        ck_assert_msg(dl != NULL, "%s", err);
        const struct drafter_config *c = drafter_config_of(dl);
        int ids[DESC_MAX_LAYERS];
        drafter_zlab_ids(c, ids);
        struct eval_target et;
        ck_assert_msg(eval_target_open(&et, target, 64, ids, c->k, err, sizeof err) == 0, "%s", err);
        struct eval_drafter ed;
        ck_assert_msg(eval_drafter_init(&ed, dl, err, sizeof err) == 0, "%s", err);
        enum { n = 19 };
        int32_t tok[n], pred[n], draft[DRAFTER_MAX_B];
        uint64_t rs = 5 + (uint64_t)k;
        for (int i = 0; i < n; i++) tok[i] = (int32_t)(test_rng_uniform(&rs, 0, 1) * 400);
        ck_assert_msg(eval_target_forward(&et, tok, n, n - 1, pred, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(eval_drafter_propose(&ed, &et, tok, n, c->B, draft, err, sizeof err) == 0, "%s", err);
        struct drafter_last ls;
        drafter_last_step(dl, &ls);
        snprintf(inp, sizeof inp, "%s/inputs.json", test_tmpdir("export-pyin"));
        FILE *fp = fopen(inp, "w");
        ck_assert_ptr_nonnull(fp);
        fprintf(fp, "{\"anchor\": %d, \"features\": [", tok[n - 1]);
        for (int t = 0; t < n - 1; t++) {   /* the context: features strictly before the anchor */
            fprintf(fp, "%s[", t ? ", " : "");
            for (int e = 0; e < c->k * c->H; e++)
                fprintf(fp, "%s%.9g", e ? ", " : "", (double)ed.hidden[(size_t)t * c->k * c->H + e]);
            fprintf(fp, "]");
        }
        fprintf(fp, "], \"draft\": [");
        for (int j = 0; j < c->B - 1; j++) fprintf(fp, "%s%d", j ? ", " : "", draft[j]);
        fprintf(fp, "], \"xn\": [");
        for (int j = 0; j < c->B; j++) {   /* block 0's final-normed states */
            fprintf(fp, "%s[", j ? ", " : "");
            for (int e = 0; e < c->H; e++) fprintf(fp, "%s%.9g", e ? ", " : "", (double)ls.xn[(size_t)j * c->H + e]);
            fprintf(fp, "]");
        }
        fprintf(fp, "]}\n");
        ck_assert_int_eq(fclose(fp), 0);
        const char *py[] = {"/bin/sh", "-c", "HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error exec python3 tests/dflash_py_check.py \"$0\" \"$1\" \"$2\"", out, target,
                            inp, NULL};
        int rc = run_argv(py);
        ck_assert_msg(rc == 0, "dflash.py (case %d, rc %d): %s", k, rc, out_text);
        printf("test_export: case %d: %s", k, out_text);
        eval_drafter_free(&ed);
        eval_target_close(&et);
        drafter_free(dl);
        drafter_free(d0);
    }
}
END_TEST

/* ---------------------------------------------------------------- the broken corpus */

/* One edit of a good export and the words the refusal must contain. */
struct breakage {
    int format;
    const char *types;          /* layer types of the drafter */
    const char *edit;           /* see apply() */
    const char *key;            /* JSON path a.b (edit set/del) or tensor name */
    const char *value;          /* JSON text for set */
    const char *expect;
};

static const struct breakage corpus[] = {
    {EXPORT_ZLAB, "sliding,sliding", "rm", "model.safetensors", NULL, "model.safetensors"},
    {EXPORT_ZLAB, "sliding,sliding", "rm", "README.md", NULL, "README.md"},
    {EXPORT_ZLAB, "sliding,sliding", "garble", "config.json", NULL, "not a JSON object"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "architectures", "[\"Qwen3ForCausalLM\"]", "architectures"},
    /* vLLM names, shapes, fusion */
    {EXPORT_ZLAB, "sliding,sliding", "rename", "layers.1.mlp.up_proj.weight", "layers.1.mlp.upproj.weight",
     "has no parameter"},
    {EXPORT_ZLAB, "sliding,sliding", "swapname", "layers.0.mlp.gate_proj.weight", "layers.0.mlp.down_proj.weight",
     "vLLM fuses"},
    /* vLLM 0.33 prepends "model." itself: a "model." name fails there */
    {EXPORT_ZLAB, "sliding,sliding", "rename", "layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight",
     "prepends"},
    /* vLLM renames midlayer. -> layers.0., SGLang does not know it */
    {EXPORT_ZLAB, "sliding,sliding", "rename", "layers.0.mlp.gate_proj.weight", "midlayer.mlp.gate_proj.weight",
     "midlayer"},
    {EXPORT_SPECULATORS, "sliding,sliding", "rename", "layers.0.mlp.gate_proj.weight", "midlayer.mlp.gate_proj.weight",
     "speculators 0.9.0 does not know the midlayer"},
    /* a NaN / inf weight (every loader would serve it) */
    {EXPORT_ZLAB, "sliding,sliding", "nan", "layers.1.mlp.up_proj.weight", "0x7fc0", "is NaN"},
    {EXPORT_SPECULATORS, "sliding,sliding", "nan", "fc.weight", "0xff80", "is inf"},
    {EXPORT_ZLAB, "sliding,sliding", "swap", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.o_proj.weight",
     NULL},   /* square here (q = o = 64x64): shapes cannot tell; the weight comparison does */
    {EXPORT_ZLAB, "sliding,sliding", "ids3", "", NULL, "number of target layers"},
    /* SGLang presence */
    {EXPORT_ZLAB, "sliding,sliding", "drop", "hidden_norm.weight", NULL, "serve it uninitialised"},
    {EXPORT_ZLAB, "sliding,sliding", "drop", "layers.1.self_attn.q_norm.weight", NULL, "is missing"},
    /* layer ids */
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.target_layer_ids", "[1, 3]", "capture other layers"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.target_layer_ids", "[0, 4]", "num_target_layers"},
    {EXPORT_ZLAB, "sliding,sliding", "move-ids", "", NULL, "top level only"},
    {EXPORT_ZLAB, "sliding,sliding", "del", "dflash_config.target_layer_ids", NULL, "target_layer_ids\" is missing"},
    /* causality */
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.causal", "false", "vLLM derives layer 0 as bidirectional"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "is_causal", "false", "vLLM derives layer 0 as bidirectional"},
    {EXPORT_ZLAB, "full,full", "set", "is_causal", "true", "vLLM derives layer 0 as causal"},
    {EXPORT_ZLAB, "sliding,full", "set", "dflash_config.causal", "true", "vLLM derives layer 1 as causal"},
    {EXPORT_ZLAB, "sliding,sliding", "del", "dflash_config.causal", NULL, NULL},   /* sliding => causal: same */
    {EXPORT_ZLAB, "sliding,sliding", "nc", "", NULL, "SGLang (dflash) runs layer 0 causal"},
    {EXPORT_ZLAB, "sliding,full", "set", "is_causal", "false", "vLLM derives layer 0 as bidirectional"},
    /* window */
    {EXPORT_ZLAB, "sliding,sliding", "set", "sliding_window", "3", "sliding window 3"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.swa_window_size", "5", "sliding window 5"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "sliding_window", "null", "sliding_window\" must be an integer >= 2"},
    /* layer types, mixed */
    {EXPORT_ZLAB, "sliding,sliding", "set", "layer_types", "[\"sliding_attention\", \"linear_attention\"]",
     "knows only full_attention and sliding_attention"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "layer_types", "[\"sliding_attention\", \"full_attention\"]",
     "training ran it as sliding"},
    {EXPORT_ZLAB, "sliding,full", "readme", "", NULL, "V2 model runner"},
    /* SGLang keys */
    {EXPORT_ZLAB, "sliding,sliding", "set", "hidden_act", "\"gelu\"", "silu"},
    {EXPORT_ZLAB, "sliding,sliding", "del", "dflash_config.block_size", NULL, NULL},   /* SGLang: the top level */
    {EXPORT_ZLAB, "sliding,sliding", "del-bs", "", NULL, "default 16"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.block_size", "8", "block_size"},
    {EXPORT_ZLAB, "sliding,sliding", "del", "dflash_config.mask_token_id", NULL, "mask_token_id\" is missing"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.mask_token_id", "-1", "non-negative integer"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.mask_token_id", "512", "inside the vocabulary"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "dflash_config.mask_token_id", "0", "training used 500"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "target_hidden_size", "null", NULL},   /* vLLM: or hidden_size */
    {EXPORT_ZLAB, "sliding,sliding", "set", "target_hidden_size", "32", "target_hidden_size"},
    {EXPORT_ZLAB, "sliding,sliding", "set", "num_target_layers", "6", "num_target_layers\" is 6"},
    /* the speculators form */
    {EXPORT_SPECULATORS, "sliding,sliding", "del", "aux_hidden_state_layer_ids", NULL, "aux_hidden_state_layer_ids"},
    {EXPORT_SPECULATORS, "sliding,sliding", "set", "aux_hidden_state_layer_ids", "[0, 2]", "count from 1"},
    {EXPORT_SPECULATORS, "sliding,sliding", "set", "aux_hidden_state_layer_ids", "[2, 4]", "capture other layers"},
    {EXPORT_SPECULATORS, "sliding,sliding", "del", "mask_token_id", NULL, "mask_token_id\" is missing"},
    {EXPORT_SPECULATORS, "sliding,sliding", "set", "sliding_window_non_causal", "true", "vLLM derives layer 0"},
    {EXPORT_SPECULATORS, "sliding,sliding", "set", "speculators_config.proposal_methods.0.speculative_tokens", "4",
     "num_speculative_tokens + 1"},
    {EXPORT_SPECULATORS, "sliding,sliding", "set", "transformer_layer_config.use_sliding_window", "false",
     "use_sliding_window"},
    {EXPORT_SPECULATORS, "sliding,sliding", "set", "transformer_layer_config.sliding_window", "5", "sliding window 5"},
    {EXPORT_SPECULATORS, "sliding,sliding", "drop", "lm_head.weight", NULL, "lm_head.weight"},
    {EXPORT_SPECULATORS, "sliding,sliding", "set", "speculators_model_type", "\"eagle3\"", "speculators_model_type"},
};

/* The parent object and last key of a dotted path ("a.b.0.c"). */
static json_t *walk(json_t *j, const char *path, char *last, size_t len) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL, *tok = strtok_r(buf, ".", &save), *next;
    while ((next = strtok_r(NULL, ".", &save))) {
        j = json_is_array(j) ? json_array_get(j, (size_t)atoi(tok)) : json_object_get(j, tok);
        ck_assert_ptr_nonnull(j);
        tok = next;
    }
    snprintf(last, len, "%s", tok);
    return j;
}

static void edit_config(const char *dir, const struct breakage *b) {
    char p[800], *text, last[128];
    size_t len;
    snprintf(p, sizeof p, "%s/config.json", dir);
    ck_assert_int_eq(fs_read_file(p, &text, &len, err, sizeof err), 0);
    json_t *j = json_loads(text, 0, NULL);
    free(text);
    ck_assert_ptr_nonnull(j);
    if (!strcmp(b->edit, "set") || !strcmp(b->edit, "del")) {
        json_t *par = walk(j, b->key, last, sizeof last);
        if (!strcmp(b->edit, "del")) {
            ck_assert_int_eq(json_object_del(par, last), 0);
        } else {
            json_t *v = json_loads(b->value, JSON_DECODE_ANY, NULL);
            ck_assert_ptr_nonnull(v);
            if (json_is_array(par)) json_array_set_new(par, (size_t)atoi(last), v);
            else json_object_set_new(par, last, v);
        }
    } else if (!strcmp(b->edit, "move-ids")) {
        json_t *dc = json_object_get(j, "dflash_config");
        json_object_set(j, "target_layer_ids", json_object_get(dc, "target_layer_ids"));
        json_object_del(dc, "target_layer_ids");
    } else if (!strcmp(b->edit, "nc")) {   /* trained bidirectional, vLLM told so: SGLang cannot be */
        json_object_set_new(json_object_get(j, "dflash_config"), "causal", json_false());
        json_object_set_new(json_object_get(j, "dflash_pipe"), "causal", json_pack("[b, b]", 0, 0));
    } else if (!strcmp(b->edit, "del-bs")) {   /* no block size at either level: SGLang's default 16 */
        json_object_del(json_object_get(j, "dflash_config"), "block_size");
        json_object_del(j, "block_size");
    } else if (!strcmp(b->edit, "ids3")) {   /* 3 ids everywhere (training record too): fc is for 2 */
        json_t *ids = json_pack("[i, i, i]", 0, 1, 2);
        json_object_set(json_object_get(j, "dflash_config"), "target_layer_ids", ids);
        json_object_set(json_object_get(j, "dflash_pipe"), "target_layer_ids_zlab", ids);
        json_decref(ids);
    }
    text = json_dumps(j, JSON_INDENT(1));
    json_decref(j);
    ck_assert_int_eq(fs_write_atomic(p, text, strlen(text), err, sizeof err), 0);
    free(text);
}

static void edit_weights(const char *dir, const struct breakage *b) {
    char p[800];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct st_file f;
    ck_assert_msg(st_open(&f, p, err, sizeof err) == 0, "%s", err);
    struct st_write_tensor *t = calloc((size_t)f.n_tensors, sizeof *t);
    int n = 0;
    const struct st_tensor *sw = !strcmp(b->edit, "swap") ? st_find(&f, b->value) : NULL;
    uint16_t *poisoned = NULL;   /* "nan": a copy of key with element 5 = value (bf16 bits) */
    for (int i = 0; i < f.n_tensors; i++) {
        const struct st_tensor *s = &f.tensors[i];
        if (!strcmp(b->edit, "drop") && !strcmp(s->name, b->key)) continue;
        t[n] = (struct st_write_tensor){s->name, s->dtype, s->ndim, {0}, s->data};
        memcpy(t[n].shape, s->shape, sizeof s->shape);
        if (!strcmp(s->name, b->key)) {
            if (!strcmp(b->edit, "rename") || !strcmp(b->edit, "swapname")) t[n].name = b->value;
            if (sw) t[n].data = sw->data;
        }
        if (sw && !strcmp(s->name, b->value)) t[n].data = st_find(&f, b->key)->data;
        if (!strcmp(b->edit, "nan") && !strcmp(s->name, b->key)) {
            poisoned = malloc(s->nbytes);
            memcpy(poisoned, s->data, s->nbytes);
            poisoned[5] = (uint16_t)strtol(b->value, NULL, 16);
            t[n].data = poisoned;
        }
        if (!strcmp(b->edit, "swapname") && !strcmp(s->name, b->value)) t[n].name = b->key;
        n++;
    }
    /* write beside, then over (the mapping stays valid until st_close) */
    char q[900];
    snprintf(q, sizeof q, "%s/new.safetensors", dir);
    ck_assert_msg(st_write_file(q, n, t, err, sizeof err) == 0, "%s", err);
    st_close(&f);
    free(t);
    free(poisoned);
    ck_assert_int_eq(rename(q, p), 0);
}

START_TEST(checker_refuses_corpus) {
    const struct breakage *b = &corpus[_i];
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d = make_ckpt(target, b->types, 0, ckpt, sizeof ckpt);
    char out[700], p[800];
    snprintf(out, sizeof out, "%s/export", test_tmpdir("export-broken"));
    ck_assert_msg(export_write(d, b->format, out, "tiny-target", err, sizeof err) == 0, "%s", err);
    struct export_check_opts o = {target, d, 0};
    ck_assert_msg(export_check(out, &o, NULL, err, sizeof err) == 0, "the good export is refused: %s", err);
    if (!strcmp(b->edit, "rm")) {
        snprintf(p, sizeof p, "%s/%s", out, b->key);
        ck_assert_int_eq(unlink(p), 0);
    } else if (!strcmp(b->edit, "garble")) {
        snprintf(p, sizeof p, "%s/config.json", out);
        ck_assert_int_eq(fs_write_atomic(p, "{\"a\": ", 6, err, sizeof err), 0);
    } else if (!strcmp(b->edit, "readme")) {
        snprintf(p, sizeof p, "%s/README.md", out);
        ck_assert_int_eq(fs_write_atomic(p, "a drafter\n", 10, err, sizeof err), 0);
    } else if (!strcmp(b->edit, "drop") || !strcmp(b->edit, "rename") || !strcmp(b->edit, "swap") ||
               !strcmp(b->edit, "swapname") || !strcmp(b->edit, "nan")) {
        edit_weights(out, b);
    } else {
        edit_config(out, b);
    }
    if (!strcmp(b->edit, "ids3")) o.d = NULL;   /* the checkpoint's ids would refuse it first: test fc alone */
    int rc = export_check(out, &o, NULL, err, sizeof err);
    if (!b->expect && strcmp(b->edit, "swap")) {
        ck_assert_msg(rc == 0, "edit %s %s must be accepted: %s", b->edit, b->key, err);
    } else if (!b->expect) {
        /* shapes agree; only the comparison with the checkpoint catches it */
        struct export_check_opts o2 = {target, NULL, 0};
        ck_assert_msg(export_check(out, &o2, NULL, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(export_check(out, &o, NULL, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "not its bf16 rounding"), "%s", err);
    } else {
        ck_assert_msg(rc == -1, "edit %s %s was accepted", b->edit, b->key);
        ck_assert_msg(strstr(err, b->expect), "edit %s %s: \"%s\" not in: %s", b->edit, b->key, b->expect, err);
        ck_assert_msg(strchr(err, '\n') == NULL, "one line: %s", err);
    }
    drafter_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("export");
    TCase *tc = tcase_create("export");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, zlab_roundtrip);
    tcase_add_test(tc, zlab_roundtrip_mixed_noncausal);
    tcase_add_test(tc, speculators_roundtrip);
    tcase_add_test(tc, speculators_roundtrip_full_noncausal);
    tcase_add_test(tc, speculators_roundtrip_mixed_noncausal);
    tcase_add_test(tc, speculators_mixed_causal_refused);
    tcase_add_test(tc, last_layer_capture);
    tcase_add_loop_test(tc, rules_table_rows, 0, export_rules_n_rows());
    tcase_add_test(tc, readme_has_rules_table);
    tcase_add_test(tc, trainer_refuses_unservable);

    tcase_add_test(tc, refuses_bad_inputs);
    tcase_add_test(tc, cli_end_to_end);
    tcase_add_test(tc, run_exports);
    tcase_add_test(tc, speculators_pruned_vocab);
    tcase_add_test(tc, trainer_writes_exports);
    tcase_add_loop_test(tc, checker_refuses_corpus, 0, (int)(sizeof corpus / sizeof corpus[0]));
    suite_add_tcase(s, tc);
    TCase *py = tcase_create("python");   /* python3 + torch import: slow on a loaded machine */
    tcase_set_timeout(py, 300);
    tcase_add_checked_fixture(py, setup, teardown);
    tcase_add_test(py, dflash_py_matches_eval);
    suite_add_tcase(s, py);
    return test_run_suite(s);
}
