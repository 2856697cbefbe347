/*
 * tests/test_drafter_io.c — the drafter's files: config from a target directory (z-lab default ids, mask token
 * resolution, bad inputs), the frozen tensors read from it (untied, tied, pruned by d2t, wrong shapes), the
 * speculators config.json, and the debug dump of one step (names, shapes, dtypes, values, manifest keys).
 */
#include "testutil.h"

#include <jansson.h>

#include "kernels/lmhead_loss.h"
#include "core/safetensors.h"
#include "train/drafter.h"
#include "train/mask_token.h"

enum { V = 40, HH = 16, NL = 8 };

static void write_text(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL, "fopen %s", path);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* A tiny Qwen3 target: config.json, model.safetensors with embed / norm / lm_head (unless tied), of hidden size
 * h and vocabulary v. Values: embed[r][c] = r + c/100, norm[c] = 1 + c/10, head[r][c] = -(r + c/100). */
static void write_target(const char *dir, int v, int h, int tied, int head_rows) {
    char text[2048];
    snprintf(text, sizeof text,
             "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": %d,\n"
             " \"hidden_size\": %d, \"intermediate_size\": 24, \"num_hidden_layers\": %d,\n"
             " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8,\n"
             " \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"rope_scaling\": null, \"tie_word_embeddings\": %s,\n"
             " \"max_position_embeddings\": 4096, \"attention_bias\": false, \"hidden_act\": \"silu\",\n"
             " \"use_sliding_window\": false, \"torch_dtype\": \"float32\"}\n",
             v, HH, NL, tied ? "true" : "false");
    write_text(dir, "config.json", text);
    float *e = malloc(sizeof *e * (size_t)v * h), *hd = malloc(sizeof *hd * (size_t)head_rows * h), n[64];
    for (int r = 0; r < v; r++)
        for (int c = 0; c < h; c++) e[r * h + c] = r + c / 100.0f;
    for (int r = 0; r < head_rows; r++)
        for (int c = 0; c < h; c++) hd[r * h + c] = -(r + c / 100.0f);
    for (int c = 0; c < h; c++) n[c] = 1 + c / 10.0f;
    struct st_write_tensor t[3] = {
        {"model.embed_tokens.weight", ST_F32, 2, {v, h}, e},
        {"model.norm.weight", ST_F32, 1, {h}, n},
        {"lm_head.weight", ST_F32, 2, {head_rows, h}, hd},
    };
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_msg(st_write_file(path, tied ? 2 : 3, t, err, sizeof err) == 0, "%s", err);
    free(e);
    free(hd);
}

static void opts(struct drafter_config *c) {
    drafter_config_defaults(c);
    c->B = 4;
    c->L = 2;
    c->layer_type[0] = DRAFTER_LAYER_SLIDING;
    c->layer_type[1] = DRAFTER_LAYER_FULL;
    c->sliding_window = 4;
    c->N = 6;
    c->T_max = 40;
}

START_TEST(drafter_from_target) {
    const char *dir = test_tmpdir("drafter-target");
    write_target(dir, V, HH, 0, V);
    /* tokenizer of 36 tokens: the first unused row is 36 */
    write_text(dir, "tokenizer.json", "{\"added_tokens\": [{\"id\": 35, \"content\": \"<eos>\"}],"
                                      " \"model\": {\"vocab\": {\"a\": 0, \"b\": 34}}}");
    struct drafter_config c;
    char err[512];
    opts(&c);
    ck_assert_msg(drafter_config_from_target(&c, dir, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.H, HH);
    ck_assert_int_eq(c.n_h, 2);
    ck_assert_int_eq(c.V_t, V);
    ck_assert_int_eq(c.V_d, V);
    ck_assert_int_eq(c.mask_token_id, 36);
    ck_assert_int_eq(c.k, 2);   /* z-lab formula: round(1 + i·(n-4)/(L-1)) = [1, 5] for n = 8, L = 2 */
    ck_assert_int_eq(c.ids_convention, DRAFTER_IDS_ZLAB);
    ck_assert_int_eq(c.layer_ids[0], 1);
    ck_assert_int_eq(c.layer_ids[1], 5);
    /* the tokenizer's mask token wins over the unused row */
    write_text(dir, "tokenizer_config.json", "{\"mask_token\": \"<mask>\", \"added_tokens_decoder\": "
                                             "{\"33\": {\"content\": \"<mask>\"}}}");
    opts(&c);
    ck_assert_msg(drafter_config_from_target(&c, dir, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.mask_token_id, 33);
    /* explicit wins; outside the embedding is an error */
    opts(&c);
    c.mask_token_id = 7;
    ck_assert_msg(drafter_config_from_target(&c, dir, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.mask_token_id, 7);
    opts(&c);
    c.mask_token_id = 40;
    ck_assert_int_eq(drafter_config_from_target(&c, dir, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "outside the embedding") != NULL, "%s", err);
    /* no tokenizer and no unused row -> error, never pad / eos */
    int64_t id;
    enum mask_token_source src;
    const char *d2 = test_tmpdir("drafter-notok");
    ck_assert_int_eq(mask_token_resolve(d2, 40, -1, &id, &src, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "explicitly") != NULL, "%s", err);
    write_text(d2, "tokenizer.json", "{\"model\": {\"vocab\": {\"a\": 0, \"z\": 39}}}");
    ck_assert_int_eq(mask_token_resolve(d2, 40, -1, &id, &src, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no row is unused") != NULL, "%s", err);
    ck_assert_int_eq(mask_token_resolve(d2, 41, -1, &id, &src, err, sizeof err), 0);
    ck_assert_int_eq(id, 40);
    ck_assert_int_eq(src, MASK_TOKEN_UNUSED_ROW);

    /* frozen tensors: untied head */
    opts(&c);
    ck_assert_msg(drafter_config_from_target(&c, dir, err, sizeof err) == 0, "%s", err);
    struct drafter *d = drafter_init(&c, 1, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_msg(drafter_load_target(d, dir, err, sizeof err) == 0, "%s", err);
    const struct drafter_param *e = drafter_param_find(d, "embed_tokens.weight"),
                               *lm = drafter_param_find(d, "lm_head.weight"),
                               *vlm = drafter_param_find(d, "verifier_lm_head.weight"),
                               *vn = drafter_param_find(d, "verifier_norm.weight");
    ck_assert_float_eq(e->w[3 * HH + 2], 3.02f);
    ck_assert_float_eq(lm->w[5 * HH + 1], -5.01f);
    ck_assert_float_eq(vlm->w[5 * HH + 1], -5.01f);
    ck_assert_float_eq(vn->w[4], 1.4f);
    drafter_free(d);

    /* pruned by d2t: V_d = 10 of the even ids */
    uint8_t t2d[V] = {0};
    int64_t d2t[10];
    for (int i = 0; i < 10; i++) {
        t2d[2 * i] = 1;
        d2t[i] = 2 * i - i;
    }
    d = drafter_init(&c, 1, err, sizeof err);
    ck_assert_int_eq(drafter_set_vocab(d, t2d, d2t, 10, err, sizeof err), 0);
    ck_assert_msg(drafter_load_target(d, dir, err, sizeof err) == 0, "%s", err);
    lm = drafter_param_find(d, "lm_head.weight");
    ck_assert_int_eq(lm->shape[0], 10);
    ck_assert_float_eq(lm->w[3 * HH], -6.0f);
    ck_assert_int_eq(drafter_config_of(d)->V_d, 10);
    d2t[3] = 5;   /* inconsistent with t2d */
    ck_assert_int_eq(drafter_set_vocab(d, t2d, d2t, 10, err, sizeof err), -1);
    drafter_free(d);

    /* tied: lm_head = embedding */
    const char *dt = test_tmpdir("drafter-tied");
    write_target(dt, V, HH, 1, V);
    opts(&c);
    c.mask_token_id = 39;
    ck_assert_msg(drafter_config_from_target(&c, dt, err, sizeof err) == 0, "%s", err);
    d = drafter_init(&c, 1, err, sizeof err);
    ck_assert_msg(drafter_load_target(d, dt, err, sizeof err) == 0, "%s", err);
    ck_assert_float_eq(drafter_param_find(d, "lm_head.weight")->w[5 * HH + 1], 5.01f);
    drafter_free(d);

    /* an LM head that does not match the vocabulary: one sentence naming the tensor */
    const char *db = test_tmpdir("drafter-badhead");
    write_target(db, V, HH, 0, V - 1);
    opts(&c);
    c.mask_token_id = 39;
    ck_assert_msg(drafter_config_from_target(&c, db, err, sizeof err) == 0, "%s", err);
    d = drafter_init(&c, 1, err, sizeof err);
    ck_assert_int_eq(drafter_load_target(d, db, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "lm_head.weight") != NULL && strchr(err, '\n') == NULL, "%s", err);
    drafter_free(d);
}
END_TEST

static json_t *load_json(const char *path) {
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    ck_assert_msg(j != NULL, "%s: %s", path, je.text);
    return j;
}

START_TEST(drafter_dump_files) {
    const char *dir = test_tmpdir("drafter-dump");
    write_target(dir, V, HH, 0, V);
    struct drafter_config c;
    char err[512];
    opts(&c);
    c.mask_token_id = 39;
    c.V_d = 32;
    ck_assert_msg(drafter_config_from_target(&c, dir, err, sizeof err) == 0, "%s", err);
    struct drafter *d = drafter_init(&c, 5, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    uint8_t t2d[V] = {0};
    int64_t d2t[32];
    for (int i = 0; i < 32; i++) {
        t2d[i + 4] = 1;
        d2t[i] = 4;
    }
    ck_assert_int_eq(drafter_set_vocab(d, t2d, d2t, 32, err, sizeof err), 0);
    ck_assert_msg(drafter_load_target(d, dir, err, sizeof err) == 0, "%s", err);
    /* the loaded heads are huge (|w| ~ 40): scale them down so the step is well conditioned */
    const char *heads[2] = {"lm_head.weight", "verifier_lm_head.weight"};
    for (int i = 0; i < 2; i++) {
        const struct drafter_param *p = drafter_param_find(d, heads[i]);
        for (int64_t e = 0; e < p->numel; e++) p->w[e] *= 0.01f;
    }
    int T = 30, k = c.k;
    int32_t ids[30], pos[30], doc[30];
    uint8_t mask[30];
    float *hid = malloc(sizeof(float) * T * k * HH), *last = malloc(sizeof(float) * T * HH);
    uint64_t rng = 3;
    for (int t = 0; t < T; t++) {
        ids[t] = (int32_t)(test_rng_next(&rng) % 39);
        doc[t] = t < 16 ? 0 : 1;
        pos[t] = t < 16 ? t : t - 16;
        mask[t] = t % 3 != 0;
    }
    test_rng_fill(&rng, hid, (size_t)T * k * HH, -1, 1);
    test_rng_fill(&rng, last, (size_t)T * HH, -1, 1);
    struct drafter_batch b = {T, 36, ids, mask, pos, doc, hid, last};
    struct drafter_metrics m;
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step(d, &b, 42, 7, 1, &m, err, sizeof err) == 0, "%s", err);
    const char *out = test_tmpdir("drafter-dump-out");
    struct drafter_dump_info info = {7, 42, "float32", "tiny/qwen3"};
    ck_assert_msg(drafter_dump_step(d, out, &b, &m, &info, err, sizeof err) == 0, "%s", err);

    char path[1024];
    struct st_file f;
    int R = c.N * c.B;
    /* batch */
    snprintf(path, sizeof path, "%s/step-7/batch.safetensors", out);
    ck_assert_msg(st_open(&f, path, err, sizeof err) == 0, "%s", err);
    struct { const char *name; enum st_dtype dt; int ndim; int64_t d0, d1; } want[] = {
        {"hidden_states", ST_F32, 2, T, k * HH}, {"verifier_last_hidden_states", ST_F32, 2, T, HH},
        {"input_ids", ST_I64, 1, T, 0}, {"loss_mask", ST_I64, 1, T, 0}, {"position_ids", ST_I64, 1, T, 0},
        {"document_ids", ST_I64, 1, T, 0}, {"anchors", ST_I64, 1, c.N, 0}, {"anchor_valid", ST_BOOL, 1, c.N, 0},
        {"target_ids", ST_I64, 1, R, 0}, {"pred_ids", ST_I64, 1, R, 0}, {"loss_mask_aligned", ST_BOOL, 1, R, 0}};
    ck_assert_int_eq(f.n_tensors, (int)(sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct st_tensor *t = st_find(&f, want[i].name);
        ck_assert_msg(t != NULL, "batch: no %s", want[i].name);
        ck_assert_msg(t->dtype == want[i].dt && t->ndim == want[i].ndim && t->shape[0] == want[i].d0 &&
                      (t->ndim == 1 || t->shape[1] == want[i].d1), "batch: %s has the wrong dtype or shape",
                      want[i].name);
    }
    struct drafter_last ls;
    drafter_last_step(d, &ls);
    int64_t a0;
    memcpy(&a0, st_find(&f, "anchors")->data, 8);
    ck_assert_int_eq(a0, ls.anchors[0]);
    float h0;
    memcpy(&h0, st_find(&f, "hidden_states")->data, 4);
    ck_assert(h0 == ls.hidden_used[0] && h0 != hid[0]);   /* after noise */
    int64_t p5;
    memcpy(&p5, (const char *)st_find(&f, "pred_ids")->data + 5 * 8, 8);
    ck_assert_int_eq(p5, ls.pred[5]);
    st_close(&f);
    /* weights: every tensor plus t2d / d2t; grads: trainable only, equal to g */
    snprintf(path, sizeof path, "%s/step-7/weights.safetensors", out);
    ck_assert_msg(st_open(&f, path, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(f.n_tensors, drafter_n_params(d) + 2);
    ck_assert(st_find(&f, "t2d")->dtype == ST_BOOL && st_find(&f, "t2d")->shape[0] == V);
    ck_assert(st_find(&f, "d2t")->dtype == ST_I64 && st_find(&f, "d2t")->shape[0] == 32);
    const char *names[] = {"fc.weight", "hidden_norm.weight", "layers.0.self_attn.q_proj.weight",
                           "layers.1.mlp.down_proj.weight", "norm.weight", "embed_tokens.weight", "lm_head.weight",
                           "verifier_norm.weight", "verifier_lm_head.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const struct st_tensor *t = st_find(&f, names[i]);
        const struct drafter_param *p = drafter_param_find(d, names[i]);
        ck_assert_msg(t && t->dtype == ST_F32 && t->numel == p->numel && t->shape[0] == p->shape[0], "%s", names[i]);
        ck_assert_msg(memcmp(t->data, p->w, sizeof(float) * (size_t)p->numel) == 0, "weights: %s differs", names[i]);
    }
    ck_assert_int_eq(st_find(&f, "lm_head.weight")->shape[0], 32);
    st_close(&f);
    snprintf(path, sizeof path, "%s/step-7/grads.safetensors", out);
    ck_assert_msg(st_open(&f, path, err, sizeof err) == 0, "%s", err);
    int n_train = 0;
    double sumsq = 0;
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *p = drafter_param(d, i);
        const struct st_tensor *t = st_find(&f, p->name);
        if (!p->trainable) {
            ck_assert_msg(t == NULL, "grads: frozen %s present", p->name);
            continue;
        }
        n_train++;
        ck_assert_msg(t && t->dtype == ST_F32 && memcmp(t->data, p->g, sizeof(float) * (size_t)p->numel) == 0,
                      "grads: %s", p->name);
        for (int64_t e = 0; e < p->numel; e++) sumsq += (double)p->g[e] * p->g[e];
    }
    ck_assert_int_eq(f.n_tensors, n_train);
    st_close(&f);
    snprintf(path, sizeof path, "%s/step-7/activations.safetensors", out);
    ck_assert_msg(st_open(&f, path, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(f.n_tensors, 2 + c.L + 1);
    ck_assert(st_find(&f, "context.fc")->shape[0] == T && st_find(&f, "context.hidden_norm")->shape[1] == HH);
    ck_assert(st_find(&f, "layers.1.output")->shape[0] == R && st_find(&f, "norm.output")->shape[0] == R);
    ck_assert(memcmp(st_find(&f, "norm.output")->data, ls.xn, sizeof(float) * (size_t)R * HH) == 0);
    st_close(&f);
    /* manifest */
    snprintf(path, sizeof path, "%s/step-7/manifest.json", out);
    json_t *j = load_json(path);
    const char *keys[] = {"architectures", "speculators_model_type", "block_size", "draft_vocab_size",
                          "aux_hidden_state_layer_ids", "mask_token_id", "sliding_window_non_causal",
                          "sample_from_anchor", "speculators_config", "transformer_layer_config", "total_seq_len",
                          "target_model_type", "compute_dtype", "loss", "weighting", "gamma", "alpha", "loss_value",
                          "grad_norm", "position_correct", "position_total", "full_acc", "eal", "eal_marginal",
                          "step", "seed", "target_layer_ids_convention"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ck_assert_msg(json_object_get(j, keys[i]) != NULL, "manifest: no key %s", keys[i]);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "total_seq_len")), 36);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "draft_vocab_size")), 32);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "step")), 7);
    ck_assert_str_eq(json_string_value(json_object_get(j, "loss")), "ce");
    ck_assert_str_eq(json_string_value(json_object_get(j, "weighting")), "dpace");
    ck_assert_str_eq(json_string_value(json_object_get(j, "target_model_type")), "qwen3");
    ck_assert_int_eq((int)json_array_size(json_object_get(j, "position_total")), c.B);
    ck_assert(fabs(json_real_value(json_object_get(j, "grad_norm")) - sqrt(sumsq)) < 1e-9 * sqrt(sumsq));
    ck_assert(fabs(json_real_value(json_object_get(j, "loss_value")) - m.loss_sum) < 1e-9);
    /* speculators ids = z-lab + 1 */
    json_t *aux = json_object_get(j, "aux_hidden_state_layer_ids");
    ck_assert_int_eq(json_integer_value(json_array_get(aux, 0)), c.layer_ids[0] + 1);
    json_t *tl = json_object_get(j, "transformer_layer_config");
    ck_assert(json_is_true(json_object_get(tl, "use_sliding_window")));
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(tl, "layer_types"), 1)), "full_attention");
    json_t *sc = json_object_get(j, "speculators_config");
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(json_object_get(sc, "proposal_methods"), 0),
                                                        "speculative_tokens")), c.B - 1);
    json_decref(j);
    free(hid);
    free(last);
    drafter_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("drafter_io");
    TCase *tc = tcase_create("files");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, drafter_from_target);
    tcase_add_test(tc, drafter_dump_files);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
