/*
 * tests/test_eval.c — dflash-eval (stages/export/eval.h): speculative decoding equals plain greedy decoding token
 * for token on the tiny model; an oracle proposer (the target's own greedy continuation, built in the test: a real
 * drafter cannot be made an oracle) gives tau = B exactly; an untrained drafter gives tau about 1; the binary reads
 * prompts, reports tau / histogram / per-position acceptance / the offline estimate, and refuses bad prompt ids
 * with a line naming the file, line and key; the KV-cached drafter proposal equals the uncached one every round.
 */
#include "kernels/argmax.h"
#include "testutil.h"

#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "core/fsutil.h"
#include "export/drafter_cache.h"
#include "export/eval.h"
#include "export/export.h"
#include "kernels/common.h"
#include "core/safetensors.h"
#include "model/decode.h"
#include "train/ckpt.h"
#include "train/optim.h"

#include "test_export_util.h"

/* A checkpoint as dflash-train writes it (its config_to_json keys, optimizer + guard table), of a drafter with
 * layer types `types` ("sliding,full"), B 4, W 4, ids [0, 2], random weights; returns the drafter (kept for the
 * comparison) and the checkpoint path in ckpt. */
static struct drafter *make_drafter(const char *target, const char *types, int non_causal, int N, int T_max, int B,
                                    int W) {
    struct drafter_config c;
    drafter_config_defaults(&c);
    ck_assert_int_eq(drafter_parse_layer_types(&c, types, err, sizeof err), 0);
    c.B = B;
    c.sliding_window = W;
    c.sliding_window_non_causal = non_causal;
    c.N = N;
    c.T_max = T_max;
    c.k = 2;
    c.layer_ids[0] = 0;
    c.layer_ids[1] = 2;
    c.mask_token_id = 500;
    ck_assert_msg(drafter_config_from_target(&c, target, err, sizeof err) == 0, "%s", err);
    struct drafter *d = drafter_init(&c, 7, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_msg(drafter_load_target(d, target, err, sizeof err) == 0, "%s", err);
    /* norms away from 1 so a swapped tensor shows */
    uint64_t s = 99;
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (p->trainable && p->ndim == 1)
            for (int64_t e = 0; e < p->numel; e++) p->w[e] = 1 + test_rng_uniform(&s, -0.3f, 0.3f);
    }
    return d;
}

static struct drafter *make_ckpt(const char *target, const char *types, int non_causal, char *ckpt, size_t len) {
    struct drafter *d = make_drafter(target, types, non_causal, 4, 64, 4, 4);
    save_ckpt(d, ckpt, len);
    return d;
}


/* The oracle: the target's own greedy continuation of c, B-1 tokens. */
static int oracle_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *e,
                          int el) {
    (void)ctx;
    int32_t seq[512], pred[512];
    memcpy(seq, c, sizeof *seq * (size_t)n);
    for (int j = 0; j < B - 1; j++) {
        if (eval_target_forward(et, seq, n + j, n + j - 1, pred, e, el)) return -1;
        seq[n + j] = pred[n + j - 1];
        draft[j] = seq[n + j];
    }
    return 0;
}

static void prompt_of(int i, int32_t *p, int P) {
    uint64_t s = 1000 + (uint64_t)i;
    for (int t = 0; t < P; t++) p[t] = (int32_t)(test_rng_next(&s) % 500);
}

/* eval_argmax (the greedy pick of every decode path) against the plain first-maximum loop: random rows of
 * every length 1..70 and one of 151936, with ties (values from a small set), NaNs, infinities and signed zeros. */
START_TEST(argmax_equals_plain_loop) {
    enum { BIG = 151936 };
    float *x = malloc(sizeof(float) * BIG);
    ck_assert_ptr_nonnull(x);
    const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 2.5f, 2.5f, NAN, INFINITY, -INFINITY, 3.0f, -7.0f, 0.5f};
    uint64_t sd = 4242;
    for (int trial = 0; trial < 4000; trial++) {
        int n = trial < 3999 ? 1 + trial % 70 : BIG;
        int mode = trial % 3;   /* 0: small pool (ties, NaN, inf), 1: random values, 2: random + some NaN */
        for (int v = 0; v < n; v++) {
            uint64_t r = test_rng_next(&sd);
            x[v] = mode == 0 ? pool[r % (sizeof pool / sizeof pool[0])]
                             : (float)((double)(r >> 11) / 9007199254740992.0 * 20.0 - 10.0);
            if (mode == 2 && r % 17 == 0) x[v] = NAN;
        }
        int32_t want = 0;
        argmax_rows_ref(&want, x, 1, n);   /* the plain loop (kernels/argmax.h), the GPU kernel's reference */
        ck_assert_msg(eval_argmax(x, n) == want, "trial %d (n %d, mode %d): %d, the plain loop %d", trial, n, mode,
                      eval_argmax(x, n), want);
    }
    free(x);
}
END_TEST

START_TEST(speculative_equals_greedy_and_tau) {
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d0 = make_ckpt(target, "sliding,full", 0, ckpt, sizeof ckpt);
    drafter_free(d0);
    enum { P = 12, NEW = 24 };
    struct drafter *d = export_load_checkpoint(ckpt, target, NULL, P + NEW + 8, 1, NULL, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(drafter_config_of(d), zl);
    int B = drafter_config_of(d)->B;
    struct eval_target et;
    ck_assert_msg(eval_target_open(&et, target, P + NEW + B, zl, 2, err, sizeof err) == 0, "%s", err);
    struct eval_drafter ed;
    ck_assert_int_eq(eval_drafter_init(&ed, d, err, sizeof err), 0);
    struct eval_stats su, so;
    eval_stats_init(&su, B);
    eval_stats_init(&so, B);
    for (int i = 0; i < 3; i++) {
        int32_t prompt[P], g[P + NEW], s1[P + NEW + 16], s2[P + NEW + 16];
        prompt_of(i, prompt, P);
        ck_assert_msg(eval_greedy(&et, prompt, P, NEW, g, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(eval_speculative(&et, prompt, P, NEW, B, eval_drafter_propose, &ed, s1, &su, err, sizeof err) == 0,
                      "%s", err);
        ck_assert_msg(eval_speculative(&et, prompt, P, NEW, B, oracle_propose, NULL, s2, &so, err, sizeof err) == 0,
                      "%s", err);
        for (int t = 0; t < P + NEW; t++) {
            ck_assert_msg(s1[t] == g[t], "prompt %d: drafter run differs from greedy at %d", i, t);
            ck_assert_msg(s2[t] == g[t], "prompt %d: oracle run differs from greedy at %d", i, t);
        }
    }
    /* the oracle: every round accepts B-1 and adds the bonus */
    ck_assert_int_eq(so.responses, 3);
    ck_assert_double_eq_tol(eval_stats_tau(&so), B, 1e-12);
    ck_assert_int_eq(so.hist[B], so.rounds);
    for (int j = 1; j < B; j++) ck_assert_int_eq(so.at_pos[j], so.rounds);
    /* untrained: about 1 */
    ck_assert_int_eq(su.responses, 3);
    double tu = eval_stats_tau(&su);
    ck_assert_msg(tu >= 1.0 && tu < 1.3, "untrained tau %g", tu);
    int64_t h = 0;
    for (int i = 1; i <= B; i++) h += su.hist[i];
    ck_assert_int_eq(h, su.rounds);
    eval_drafter_free(&ed);
    eval_target_close(&et);
    drafter_free(d);
}
END_TEST

START_TEST(cli_reports_and_refuses) {
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d0 = make_ckpt(target, "sliding,sliding", 0, ckpt, sizeof ckpt);
    drafter_free(d0);
    const char *dir = test_tmpdir("eval-prompts");
    char pf[700], of[700], bad[700];
    snprintf(pf, sizeof pf, "%s/prompts.jsonl", dir);
    snprintf(of, sizeof of, "%s/eval.json", dir);
    snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
    const char *text = "[1, 2, 3, 4, 5, 6, 7, 8]\n{\"input_ids\": [9, 8, 7, 6, 5, 4, 3, 2], \"loss_mask\": [0, 0, 0, 0, 0, 1, 1, 1]}\n"
                       "{\"input_ids\": [11, 12, 13, 14, 15, 16], \"set\": \"code\"}\n{\"input_ids\": [21, 22, 23], \"set\": \"code\"}\n";
    ck_assert_int_eq(fs_write_atomic(pf, text, strlen(text), err, sizeof err), 0);
    char mf[700];
    snprintf(mf, sizeof mf, "%s/metrics.jsonl", dir);
    const char *mt = "{\"stage\": \"dflash-pack\", \"step\": 1}\n{\"stage\": \"dflash-train\", \"step\": 1, \"eal_marginal\": 0.5}\n"
                     "{\"stage\": \"dflash-train\", \"step\": 2, \"eal_marginal\": 0.7}\n";
    ck_assert_int_eq(fs_write_atomic(mf, mt, strlen(mt), err, sizeof err), 0);
    const char *a[] = {test_bin("dflash-eval"), "--target-model", target, "--ckpt", ckpt, "--prompts", pf, "--max-new",
                       "12", "--out", of, "--train-metrics", mf, NULL};
    ck_assert_msg(run_argv(a) == 0, "%s", out_text);
    ck_assert_msg(strstr(out_text, "speculative == greedy") && strstr(out_text, "offline estimate"), "%s", out_text);
    char *js;
    size_t len;
    ck_assert_int_eq(fs_read_file(of, &js, &len, err, sizeof err), 0);
    json_t *j = json_loads(js, 0, NULL);
    free(js);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "responses")), 4);
    ck_assert_msg(strstr(out_text, "tau per prompt set: all ") && strstr(out_text, " code ") &&
                  strstr(out_text, "speed-up over plain decoding: "), "%s", out_text);
    json_t *sets = json_object_get(j, "sets");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(sets, "all"), "responses")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(sets, "code"), "responses")), 2);
    ck_assert(json_is_true(json_object_get(j, "kv_cache")));
    ck_assert(json_is_true(json_object_get(j, "drafter_cache")));
    ck_assert(json_number_value(json_object_get(j, "speedup")) > 0);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "generated_tokens")), 4 * 12);
    double tau_cached = json_number_value(json_object_get(j, "tau"));
    ck_assert(json_number_value(json_object_get(j, "tau")) >= 1.0);
    ck_assert_int_eq(json_array_size(json_object_get(j, "tau_histogram")), 4);
    ck_assert_int_eq(json_array_size(json_object_get(j, "acceptance_at_pos")), 3);
    ck_assert(json_number_value(json_object_get(j, "offline_simulated_tau")) >= 1.0);
    ck_assert_double_eq_tol(json_number_value(json_object_get(j, "train_simulated_tau")), 1.6, 1e-12);
    json_decref(j);
    /* the uncached drafter proposal (--no-drafter-cache) gives the same drafts, so the same tau */
    const char *a1[] = {test_bin("dflash-eval"), "--target-model", target, "--ckpt", ckpt, "--prompts", pf, "--max-new",
                        "12", "--out", of, "--no-drafter-cache", "--no-offline", NULL};
    ck_assert_msg(run_argv(a1) == 0, "%s", out_text);
    ck_assert_msg(strstr(out_text, "drafter uncached"), "%s", out_text);
    ck_assert_int_eq(fs_read_file(of, &js, &len, err, sizeof err), 0);
    j = json_loads(js, 0, NULL);
    free(js);
    ck_assert(json_is_false(json_object_get(j, "drafter_cache")));
    ck_assert_double_eq_tol(json_number_value(json_object_get(j, "tau")), tau_cached, 1e-12);
    json_decref(j);
    /* the old path (no cache, one prompt at a time) measures the same tau: the cached features are the same */
    const char *a2[] = {test_bin("dflash-eval"), "--target-model", target, "--ckpt", ckpt, "--prompts", pf, "--max-new",
                        "12", "--out", of, "--no-kv-cache", "--no-offline", NULL};
    ck_assert_msg(run_argv(a2) == 0, "%s", out_text);
    ck_assert_int_eq(fs_read_file(of, &js, &len, err, sizeof err), 0);
    j = json_loads(js, 0, NULL);
    free(js);
    ck_assert(json_is_false(json_object_get(j, "kv_cache")));
    ck_assert_double_eq_tol(json_number_value(json_object_get(j, "tau")), tau_cached, 1e-12);
    json_decref(j);
    /* sampled: runs, reports, and is deterministic for a seed */
    const char *a3[] = {test_bin("dflash-eval"), "--target-model", target, "--ckpt", ckpt, "--prompts", pf, "--max-new",
                        "12", "--temperature", "0.7", "--top-p", "0.9", "--batch", "3", "--no-offline", NULL};
    ck_assert_msg(run_argv(a3) == 0, "%s", out_text);
    ck_assert_msg(strstr(out_text, "sampled at temperature 0.7"), "%s", out_text);
    const char *btext = "[1, 2, 3]\n[4, 512, 6]\n";
    ck_assert_int_eq(fs_write_atomic(bad, btext, strlen(btext), err, sizeof err), 0);
    const char *b[] = {test_bin("dflash-eval"), "--target-model", target, "--ckpt", ckpt, "--prompts", bad, NULL};
    ck_assert_int_eq(run_argv(b), 1);
    ck_assert_msg(strstr(out_text, "bad.jsonl:2: key input_ids[1]"), "%s", out_text);
}
END_TEST


/* ---------------------------------------------------------------- KV cache (issue 30 item 3) */

/* The cached step is bitwise the full forward: slot 0 gets a prompt, one token, a block, a rollback and another
 * block (the last step shared with slot 1's prompt); every row of states and last equals target_forward's over the
 * final sequences. */
START_TEST(decode_equals_full_forward) {
    const char *target = tiny_target();
    struct target_options o;
    target_options_defaults(&o);
    o.max_tokens = 64;
    o.n_capture = 2;
    o.capture[0] = 0;
    o.capture[1] = 2;
    struct target *t = target_load(target, &o, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    int H = target_config(t)->hidden_size;
    struct decode *d = decode_init(t, 2, 32, 32, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    int32_t s0[32], s1[32];
    uint64_t r = 5;
    for (int i = 0; i < 32; i++) {
        s0[i] = (int32_t)(test_rng_next(&r) % 500);
        s1[i] = (int32_t)(test_rng_next(&r) % 500);
    }
    static float st[2 * 32 * 64], la[32 * 64], fst[2 * 64 * 64], fla[64 * 64];
    float keep_st[2][20][64], keep_la[20][64];   /* slot 0's committed rows, by position */
    int slot0 = 0, both[2] = {0, 1};
    /* steps for slot 0: 9 (prefill), 1, 4; roll back to 12; then 5 together with slot 1's 7 */
    int lens[3] = {9, 1, 4}, at = 0;
    for (int k = 0; k < 3; k++) {
        int32_t cu[2] = {0, lens[k]};
        ck_assert_msg(decode_extend(d, 1, &slot0, s0 + at, cu, st, la, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < lens[k]; i++) {
            memcpy(keep_la[at + i], la + (size_t)i * H, sizeof(float) * (size_t)H);
            for (int c = 0; c < 2; c++) memcpy(keep_st[c][at + i], st + ((size_t)c * lens[k] + i) * H, sizeof(float) * (size_t)H);
        }
        at += lens[k];
    }
    ck_assert_int_eq(decode_len(d, 0), 14);
    ck_assert_int_eq(decode_truncate(d, 0, 12, err, sizeof err), 0);
    ck_assert_int_eq(decode_truncate(d, 0, 13, err, sizeof err), -1);   /* only backwards */
    /* slot 0 continues at 12 with other tokens than before: s0[12..17) := s1[20..25) */
    memcpy(s0 + 12, s1 + 20, sizeof(int32_t) * 5);
    int32_t ids[12], cu2[3] = {0, 5, 12};
    memcpy(ids, s0 + 12, sizeof(int32_t) * 5);
    memcpy(ids + 5, s1, sizeof(int32_t) * 7);
    ck_assert_msg(decode_extend(d, 2, both, ids, cu2, st, la, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 5; i++) {
        memcpy(keep_la[12 + i], la + (size_t)i * H, sizeof(float) * (size_t)H);
        for (int c = 0; c < 2; c++) memcpy(keep_st[c][12 + i], st + ((size_t)c * 12 + i) * H, sizeof(float) * (size_t)H);
    }
    /* the full forward over both final sequences, as two documents */
    int32_t all[24], pos[24], cu[3] = {0, 17, 24};
    memcpy(all, s0, sizeof(int32_t) * 17);
    memcpy(all + 17, s1, sizeof(int32_t) * 7);
    for (int i = 0; i < 24; i++) pos[i] = i < 17 ? i : i - 17;
    struct target_batch b = {0, 24, 2, all, pos, cu};
    ck_assert_msg(target_forward(t, &b, fst, fla, err, sizeof err) == 0, "%s", err);
    for (int p = 0; p < 17; p++) {
        ck_assert_msg(!memcmp(keep_la[p], fla + (size_t)p * H, sizeof(float) * (size_t)H), "slot 0 last row %d differs", p);
        for (int c = 0; c < 2; c++)
            ck_assert_msg(!memcmp(keep_st[c][p], fst + ((size_t)c * 24 + p) * H, sizeof(float) * (size_t)H),
                          "slot 0 state %d row %d differs", c, p);
    }
    for (int p = 0; p < 7; p++)
        ck_assert_msg(!memcmp(la + (size_t)(5 + p) * H, fla + (size_t)(17 + p) * H, sizeof(float) * (size_t)H),
                      "slot 1 last row %d differs", p);
    /* the greedy pick: decode_argmax is the reference argmax of decode_logits' rows, in any order */
    {
        int V = target_config(t)->vocab_size;
        float *nw = malloc(sizeof(float) * (size_t)H), *hw = malloc(sizeof(float) * (size_t)V * H);
        float *lg = malloc(sizeof(float) * 12 * (size_t)V);
        ck_assert(nw && hw && lg);
        uint64_t sd = 9;
        for (int c = 0; c < H; c++) nw[c] = 1.0f;
        for (size_t e = 0; e < (size_t)V * H; e++)
            hw[e] = (float)((double)(test_rng_next(&sd) >> 11) / 9007199254740992.0 - 0.5);
        int32_t rows[12], got[12], want[12];
        for (int i = 0; i < 12; i++) rows[i] = (i * 5) % 12;
        ck_assert_int_eq(decode_argmax(d, 12, rows, got, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "decode_argmax needs decode_set_head"), "%s", err);
        ck_assert_msg(decode_set_head(d, nw, hw, 12, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(decode_logits(d, 12, rows, lg, err, sizeof err) == 0, "%s", err);
        argmax_rows_ref(want, lg, 12, V);
        ck_assert_msg(decode_argmax(d, 12, rows, got, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < 12; i++) ck_assert_msg(got[i] == want[i], "row %d: %d, the reference %d", rows[i], got[i], want[i]);
        rows[3] = 12;
        ck_assert_int_eq(decode_argmax(d, 12, rows, got, err, sizeof err), -1);
        ck_assert_msg(strstr(err, "not a row of the last step"), "%s", err);
        free(nw);
        free(hw);
        free(lg);
    }
    /* bad steps are refused with a sentence */
    int32_t cbig[2] = {0, 33};
    ck_assert_int_eq(decode_extend(d, 1, &slot0, s0, cbig, NULL, la, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "33 new tokens"), "%s", err);
    int same[2] = {1, 1};
    ck_assert_int_eq(decode_extend(d, 2, same, ids, cu2, NULL, la, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "slot 1 twice"), "%s", err);
    int32_t c20[2] = {0, 20};
    ck_assert_int_eq(decode_extend(d, 1, &slot0, s0, c20, NULL, la, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "would hold 37 tokens"), "%s", err);
    decode_free(d);
    target_free(t);

}
END_TEST

/* The Qwen3.5 hybrid's cached step (issue 30 item 2): the Gated DeltaNet layers carry their conv rows and
 * recurrent state between steps, the attention layers their KV cache. Slot 0: a prefill of 9, one token, a block of
 * 4, a rollback of 2 into that block (the state restored from its snapshot), then 5 other tokens in one step with
 * slot 1's prefill of 7; every captured and last row is bitwise the full forward's over the final sequences.
 * A rollback past the last step is refused with a sentence; a rollback to 0 restarts the slot. Then eval_generate
 * on the hybrid: cached greedy decoding equals the uncached eval_greedy, and so does speculative decoding with an
 * oracle proposer (tau = B, every block accepted: rollbacks of 0) and with a one-token-wrong proposer (rollbacks
 * into every block); dflash-sample --device cpu regenerates from it, sampled rows the same whatever --batch. */
static int wrong_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *e,
                         int el) {
    (void)ctx;
    int32_t seq[512], pred[512];
    memcpy(seq, c, sizeof *seq * (size_t)n);
    for (int j = 0; j < B - 1; j++) {
        if (eval_target_forward(et, seq, n + j, n + j - 1, pred, e, el)) return -1;
        seq[n + j] = pred[n + j - 1];
        draft[j] = seq[n + j];
    }
    int at = (n * 7) % (B - 1);   /* the rejection moves around the block */
    draft[at] = (draft[at] + 1) % et->V;
    return 0;
}

static int oracle_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *e,
                          int el);

START_TEST(decode_hybrid_equals_full_forward) {
    const char *hy = test_tmpdir("decode-qwen35");
    const char *argv[] = {test_bin("dflash-mkmodel"), "--preset", "qwen3.5-tiny", "--out", hy, "--std", "0.15",
                          "--embed-std", "1.0", "--lm-head-std", "0.45", "--seed", "5", NULL};
    ck_assert_msg(run_argv(argv) == 0, "%s", out_text);
    struct target_options o;
    target_options_defaults(&o);
    o.max_tokens = 64;
    o.n_capture = 2;
    o.capture[0] = 0;
    o.capture[1] = 2;
    struct target *t = target_load(hy, &o, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    const struct model_config *c = target_config(t);
    int H = c->hidden_size, V = c->vocab_size, n_lin = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) n_lin += c->layer_linear[l];
    ck_assert_msg(n_lin > 0 && n_lin < c->num_hidden_layers, "the preset has %d linear layers of %d", n_lin,
                  c->num_hidden_layers);
    ck_assert_int_le(H, 256);
    struct decode *d = decode_init(t, 3, 32, 32, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    int32_t s0[32], s1[32];
    uint64_t r = 5;
    for (int i = 0; i < 32; i++) {
        s0[i] = (int32_t)(test_rng_next(&r) % (uint64_t)V);
        s1[i] = (int32_t)(test_rng_next(&r) % (uint64_t)V);
    }
    /* slot 2: a prefill of 25 keeps snapshots after its last DECODE_STATE_SNAPS (17) positions only */
    int slot2 = 2;
    int32_t c25[2] = {0, 25};
    ck_assert_msg(decode_extend(d, 1, &slot2, s1, c25, NULL, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(decode_truncate(d, 2, 5, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "rolls back only into the last 17 tokens"), "%s", err);
    ck_assert_int_eq(decode_truncate(d, 2, 9, err, sizeof err), 0);   /* after position 8: held */
    static float st[2 * 32 * 256], la[32 * 256], fst[2 * 64 * 256], fla[64 * 256];
    static float keep_st[2][20][256], keep_la[20][256];
    int slot0 = 0, both[2] = {0, 1};
    int lens[3] = {9, 1, 4}, at = 0;
    for (int k = 0; k < 3; k++) {
        int32_t cu[2] = {0, lens[k]};
        ck_assert_msg(decode_extend(d, 1, &slot0, s0 + at, cu, st, la, err, sizeof err) == 0, "%s", err);
        for (int i = 0; i < lens[k]; i++) {
            memcpy(keep_la[at + i], la + (size_t)i * H, sizeof(float) * (size_t)H);
            for (int q = 0; q < 2; q++)
                memcpy(keep_st[q][at + i], st + ((size_t)q * lens[k] + i) * H, sizeof(float) * (size_t)H);
        }
        at += lens[k];
    }
    ck_assert_int_eq(decode_len(d, 0), 14);
    ck_assert_int_eq(decode_truncate(d, 0, 12, err, sizeof err), 0);
    memcpy(s0 + 12, s1 + 20, sizeof(int32_t) * 5);
    int32_t ids[12], cu2[3] = {0, 5, 12};
    memcpy(ids, s0 + 12, sizeof(int32_t) * 5);
    memcpy(ids + 5, s1, sizeof(int32_t) * 7);
    ck_assert_msg(decode_extend(d, 2, both, ids, cu2, st, la, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < 5; i++) {
        memcpy(keep_la[12 + i], la + (size_t)i * H, sizeof(float) * (size_t)H);
        for (int q = 0; q < 2; q++)
            memcpy(keep_st[q][12 + i], st + ((size_t)q * 12 + i) * H, sizeof(float) * (size_t)H);
    }
    int32_t all[24], pos[24], cu[3] = {0, 17, 24};
    memcpy(all, s0, sizeof(int32_t) * 17);
    memcpy(all + 17, s1, sizeof(int32_t) * 7);
    for (int i = 0; i < 24; i++) pos[i] = i < 17 ? i : i - 17;
    struct target_batch b = {0, 24, 2, all, pos, cu};
    ck_assert_msg(target_forward(t, &b, fst, fla, err, sizeof err) == 0, "%s", err);
    for (int p = 0; p < 17; p++) {
        ck_assert_msg(!memcmp(keep_la[p], fla + (size_t)p * H, sizeof(float) * (size_t)H), "slot 0 last row %d differs",
                      p);
        for (int q = 0; q < 2; q++)
            ck_assert_msg(!memcmp(keep_st[q][p], fst + ((size_t)q * 24 + p) * H, sizeof(float) * (size_t)H),
                          "slot 0 state %d row %d differs", q, p);
    }
    for (int p = 0; p < 7; p++)
        ck_assert_msg(!memcmp(la + (size_t)(5 + p) * H, fla + (size_t)(17 + p) * H, sizeof(float) * (size_t)H),
                      "slot 1 last row %d differs", p);
    /* back to 0 and a new prompt: the slot starts from a zero state (slot 1's 7 rows again, in slot 0) */
    ck_assert_int_eq(decode_truncate(d, 0, 0, err, sizeof err), 0);
    int32_t c7[2] = {0, 7};
    ck_assert_msg(decode_extend(d, 1, &slot0, s1, c7, NULL, la, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(!memcmp(la, fla + (size_t)17 * H, sizeof(float) * 7 * (size_t)H), "slot 0 restarted differs");
    decode_free(d);
    target_free(t);

    /* eval_generate on the hybrid */
    enum { NP = 3, NEW = 12, B = 4 };
    int zl[2] = {0, 2};
    struct eval_target et;
    ck_assert_msg(eval_target_open(&et, hy, 64, zl, 2, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(&et, 2, 64, err, sizeof err) == 0, "%s", err);
    int32_t prompts[NP][16], *pp[NP], *ref[NP], *og[NP];
    int P[NP], lg[NP];
    for (int i = 0; i < NP; i++) {
        P[i] = 5 + 3 * i;
        uint64_t sd = 77 + (uint64_t)i;
        for (int q = 0; q < P[i]; q++) prompts[i][q] = (int32_t)(test_rng_next(&sd) % (uint64_t)V);
        pp[i] = prompts[i];
        ref[i] = malloc(sizeof(int32_t) * 64);
        og[i] = malloc(sizeof(int32_t) * 64);
        ck_assert_msg(eval_greedy(&et, prompts[i], P[i], NEW, ref[i], err, sizeof err) == 0, "%s", err);
    }
    struct eval_gen_opts runs[3] = {{.max_new = NEW}, {.max_new = NEW, .B = B, .fn = oracle_propose},
                                    {.max_new = NEW, .B = B, .fn = wrong_propose}};
    for (int k = 0; k < 3; k++) {
        struct eval_stats ss;
        eval_stats_init(&ss, B);
        ck_assert_msg(eval_generate(&et, NP, (const int32_t *const *)pp, P, &runs[k], og, lg, &ss, err, sizeof err) == 0,
                      "%s", err);
        for (int i = 0; i < NP; i++) {
            ck_assert_int_eq(lg[i], P[i] + NEW);
            for (int q = 0; q < lg[i]; q++)
                ck_assert_msg(og[i][q] == ref[i][q], "run %d prompt %d: cached output differs from eval_greedy at %d",
                              k, i, q);
        }
        if (k == 1) ck_assert_double_eq_tol(eval_stats_tau(&ss), B, 1e-12);
        if (k == 2) ck_assert_msg(eval_stats_tau(&ss) < B && eval_stats_tau(&ss) > 1, "tau %g", eval_stats_tau(&ss));
    }
    /* dflash-sample regenerates from the hybrid (the cached path): sampled rows the same whatever --batch */
    char data[800], o2[800], o3[800];
    snprintf(data, sizeof data, "%s/rows.jsonl", hy);
    snprintf(o2, sizeof o2, "%s/regen-b2.jsonl", hy);
    snprintf(o3, sizeof o3, "%s/regen-b3.jsonl", hy);
    FILE *f = fopen(data, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < NP; i++) {
        fprintf(f, "{\"input_ids\": [");
        for (int q = 0; q < P[i] + 2; q++) fprintf(f, "%s%d", q ? ", " : "", q < P[i] ? prompts[i][q] : 7);
        fprintf(f, "], \"loss_mask\": [");
        for (int q = 0; q < P[i] + 2; q++) fprintf(f, "%s%d", q ? ", " : "", q >= P[i]);
        fprintf(f, "]}\n");
    }
    fclose(f);
    for (int k = 0; k < 2; k++) {
        const char *sa[] = {test_bin("dflash-sample"), "--target-model", hy, "--prompts", data, "--out", k ? o3 : o2,
                            "--gen-len", "10", "--temperature", "0.8", "--top-p", "0.9", "--seed", "4", "--batch",
                            k ? "3" : "2", "--stop-ids", "999999", "--device", "cpu", NULL};
        ck_assert_msg(run_argv(sa) == 0, "%s", out_text);
    }
    size_t n2, n3;
    char *t2 = test_slurp(o2, &n2), *t3 = test_slurp(o3, &n3);
    ck_assert_msg(t2 && t3 && n2 == n3 && !memcmp(t2, t3, n2), "sampled hybrid regeneration depends on --batch");
    free(t2);
    free(t3);
    for (int i = 0; i < NP; i++) {
        free(ref[i]);
        free(og[i]);
    }
    eval_target_close(&et);
}
END_TEST

/* eval_generate: KV-cached plain greedy decoding equals the uncached eval_greedy; speculative decoding (drafter
 * and oracle) equals it token for token, batched in groups of 2 over 5 prompts of different lengths; the oracle
 * gives tau = B; stop tokens end a response; sampled decoding is deterministic for a seed whatever the grouping,
 * and its speculative form accepts with probability p(d) (the oracle then stays below B). */
START_TEST(cached_generation) {
    const char *target = tiny_target();
    char ckpt[1024];
    struct drafter *d0 = make_ckpt(target, "sliding,full", 0, ckpt, sizeof ckpt);
    drafter_free(d0);
    enum { NP = 5, NEW = 20, MAXP = 14 };
    struct drafter *d = export_load_checkpoint(ckpt, target, NULL, MAXP + NEW + 8, 1, NULL, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(drafter_config_of(d), zl);
    int B = drafter_config_of(d)->B;
    struct eval_target et;
    ck_assert_msg(eval_target_open(&et, target, MAXP + NEW + 2 * B, zl, 2, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(&et, 2, MAXP + NEW + 2 * B, err, sizeof err) == 0, "%s", err);
    struct eval_drafter ed;
    ck_assert_int_eq(eval_drafter_init(&ed, d, err, sizeof err), 0);
    int32_t prompts[NP][MAXP], *pp[NP], *og[NP], *os[NP], *oo[NP], *ref[NP], *tmp[NP];
    int P[NP], lg[NP], ls[NP], lo[NP];
    for (int i = 0; i < NP; i++) {
        P[i] = 6 + 2 * i;
        prompt_of(i, prompts[i], P[i]);
        pp[i] = prompts[i];
        og[i] = malloc(sizeof(int32_t) * 64);
        os[i] = malloc(sizeof(int32_t) * 64);
        oo[i] = malloc(sizeof(int32_t) * 64);
        ref[i] = malloc(sizeof(int32_t) * 64);
        tmp[i] = malloc(sizeof(int32_t) * 64);
        ck_assert_msg(eval_greedy(&et, prompts[i], P[i], NEW, ref[i], err, sizeof err) == 0, "%s", err);
    }
    struct eval_gen_opts plain = {.max_new = NEW}, spec = {.max_new = NEW, .B = B, .fn = eval_drafter_propose,
                                                          .ctx = &ed},
                         orac = {.max_new = NEW, .B = B, .fn = oracle_propose};
    struct eval_stats ss, so;
    eval_stats_init(&ss, B);
    eval_stats_init(&so, B);
    const int32_t *const *cp = (const int32_t *const *)pp;
    ck_assert_msg(eval_generate(&et, NP, cp, P, &plain, og, lg, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_generate(&et, NP, cp, P, &spec, os, ls, &ss, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_generate(&et, NP, cp, P, &orac, oo, lo, &so, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < NP; i++) {
        ck_assert_int_eq(lg[i], P[i] + NEW);
        ck_assert_int_eq(ls[i], P[i] + NEW);
        ck_assert_int_eq(lo[i], P[i] + NEW);
        for (int t = 0; t < P[i] + NEW; t++) {
            ck_assert_msg(og[i][t] == ref[i][t], "prompt %d: cached greedy differs from uncached at %d", i, t);
            ck_assert_msg(os[i][t] == ref[i][t], "prompt %d: cached speculative differs from greedy at %d", i, t);
            ck_assert_msg(oo[i][t] == ref[i][t], "prompt %d: oracle run differs from greedy at %d", i, t);
        }
    }
    ck_assert_int_eq(so.responses, NP);
    ck_assert_double_eq_tol(eval_stats_tau(&so), B, 1e-12);
    ck_assert_int_eq(ss.responses, NP);
    double tu = eval_stats_tau(&ss);
    ck_assert_msg(tu >= 1.0 && tu < 1.3, "untrained tau %g", tu);
    /* a stop token: prompt 1's 4th generated token (its first occurrence in the response) */
    int32_t stop = ref[1][P[1] + 3];
    int first = 0;
    while (ref[1][P[1] + first] != stop) first++;
    struct eval_gen_opts st = {.max_new = NEW, .B = B, .fn = eval_drafter_propose, .ctx = &ed, .stop = &stop,
                               .n_stop = 1};
    ck_assert_msg(eval_generate(&et, NP, cp, P, &st, os, ls, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(ls[1], P[1] + first + 1);
    ck_assert_int_eq(os[1][ls[1] - 1], stop);
    /* sampled: same seed, groups of 2 vs one prompt at a time -> the same tokens */
    struct eval_gen_opts sa = {.max_new = NEW, .temperature = 0.8, .top_p = 0.9, .seed = 11};
    ck_assert_msg(eval_generate(&et, NP, cp, P, &sa, og, lg, NULL, err, sizeof err) == 0, "%s", err);
    int differs = 0;
    for (int i = 0; i < NP; i++) {
        struct eval_gen_opts one = sa;
        one.index_base = i;
        ck_assert_msg(eval_generate(&et, 1, cp + i, P + i, &one, tmp + i, lo + i, NULL, err, sizeof err) == 0, "%s",
                      err);
        ck_assert_int_eq(lo[i], lg[i]);
        for (int t = 0; t < lg[i]; t++) ck_assert_msg(tmp[i][t] == og[i][t], "prompt %d: sampled run depends on grouping", i);
        for (int t = P[i]; t < lg[i]; t++) differs += og[i][t] != ref[i][t];
    }
    ck_assert_msg(differs > 0, "temperature 0.8 gave exactly the greedy tokens");
    /* the oracle's tokens are the argmax: near temperature 0 nearly every one is accepted (p(d) ~ 1); at 0.8 on
     * this flat random model p(d) is tiny and nearly every round rejects at once */
    double taus[2];
    for (int k = 0; k < 2; k++) {
        struct eval_gen_opts so2 = {.max_new = NEW, .B = B, .fn = oracle_propose, .temperature = k ? 0.8 : 1e-4,
                                    .top_p = 0.95, .seed = 11};
        eval_stats_init(&so, B);
        ck_assert_msg(eval_generate(&et, NP, cp, P, &so2, oo, lo, &so, err, sizeof err) == 0, "%s", err);
        taus[k] = eval_stats_tau(&so);
    }
    ck_assert_msg(taus[0] > 0.75 * B && taus[0] <= B, "sampled oracle tau %g at temperature 1e-4", taus[0]);
    ck_assert_msg(taus[1] >= 1.0 && taus[1] < 1.5, "sampled oracle tau %g at temperature 0.8", taus[1]);
    for (int i = 0; i < NP; i++) {
        free(og[i]);
        free(os[i]);
        free(oo[i]);
        free(ref[i]);
        free(tmp[i]);
    }
    eval_drafter_free(&ed);
    eval_target_close(&et);
    drafter_free(d);
}
END_TEST

/* ---------------------------------------------------------------- the drafter cache (issue 30 item 3) */

/* Two proposers on one drafter, asked the same question every round: the cached one (export/drafter_cache.h) and
 * the uncached drafter_step over the whole context (no_cache). Their drafts must be equal token for token and
 * their final block states (xn) equal to fp32 rounding. The round's answer is the cached draft (mode 0) or the
 * target's own continuation with one token wrong at a moving place (mode 1: accepted runs of every length, so a
 * round commits 1..B tokens and the cache grows by as many). */
struct pair {
    struct eval_drafter *cached, *plain;
    int mode;
    int64_t rounds, sum_n;   /* sum_n: context rows the uncached proposer ran over */
    double max_err;          /* max |xn_cached - xn| / max |xn| of a row */
};

static int pair_propose(void *ctx, struct eval_target *et, const int32_t *c, int n, int B, int32_t *draft, char *e,
                        int el) {
    struct pair *p = ctx;
    int32_t d1[DRAFTER_MAX_B], d2[DRAFTER_MAX_B];
    ck_assert_int_ge(et->ctx_slot, 0);
    if (eval_drafter_propose(p->cached, et, c, n, B, d1, e, el)) return -1;
    if (eval_drafter_propose(p->plain, et, c, n, B, d2, e, el)) return -1;
    const float *xc = drafter_cache_xn(p->cached->cache);
    struct drafter_last ls;
    drafter_last_step(p->plain->d, &ls);
    int H = drafter_config_of(p->plain->d)->H;
    for (int j = 0; j < B; j++) {
        double m = 0, dmax = 0;
        for (int q = 0; q < H; q++) {
            double ref = ls.xn[(size_t)j * H + q], dd = fabs(xc[(size_t)j * H + q] - ref);
            m = fabs(ref) > m ? fabs(ref) : m;
            dmax = dd > dmax ? dd : dmax;
        }
        if (dmax / m > p->max_err) p->max_err = dmax / m;
        ck_assert_msg(dmax <= 1e-5 * m, "round %lld (n %d) row %d: cached xn differs by %g (row max %g)",
                      (long long)p->rounds, n, j, dmax, m);
    }
    for (int j = 0; j < B - 1; j++)
        ck_assert_msg(d1[j] == d2[j], "round %lld (n %d, slot %d): cached draft[%d] %d, uncached %d",
                      (long long)p->rounds, n, et->ctx_slot, j, d1[j], d2[j]);
    p->rounds++;
    p->sum_n += n;
    if (p->mode == 0) {
        memcpy(draft, d1, sizeof(int32_t) * (size_t)(B - 1));
        return 0;
    }
    /* the target's continuation: every B-th round all B-1 accepted, else one token wrong at 0..B-2 in turn */
    if (oracle_propose(NULL, et, c, n, B, draft, e, el)) return -1;
    int at = (int)(p->rounds % B) - 1;
    if (at >= 0) draft[at] = (draft[at] + 1) % et->V;
    return 0;
}


/* The target with a 2-slot KV cache of max_len tokens capturing d's layers, and two proposers of d: edc with the
 * drafter cache (the default), edp without. */
static void open_cache_pair(const char *target, int max_len, struct drafter *d, struct eval_target *et,
                            struct eval_drafter *edc, struct eval_drafter *edp) {
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(drafter_config_of(d), zl);
    ck_assert_msg(eval_target_open(et, target, max_len, zl, 2, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(eval_target_enable_cache(et, 2, max_len, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(eval_drafter_init(edc, d, err, sizeof err), 0);
    ck_assert_int_eq(eval_drafter_init(edp, d, err, sizeof err), 0);
    edp->no_cache = 1;
}

/* open_cache_pair's undoing, with the n response rows ref and out and the drafter itself. */
static void close_cache_pair(struct eval_target *et, struct eval_drafter *edc, struct eval_drafter *edp,
                             struct drafter *d, int32_t **ref, int32_t **out, int n) {
    for (int i = 0; i < n; i++) {
        free(ref[i]);
        free(out[i]);
    }
    eval_drafter_free(edc);
    eval_drafter_free(edp);
    eval_target_close(et);
    drafter_free(d);
}

/* n prompts of lengths P (tokens < 500, from seeds seed0 + i) in store (n rows of maxp), their pointers in pp, and
 * response rows of max_len tokens in ref and out (close_cache_pair frees them); returns the prompts' total length. */
static int cache_prompts(int n, const int *P, int32_t *store, int maxp, uint64_t seed0, int32_t **pp, int32_t **ref,
                         int32_t **out, int max_len) {
    int sum = 0;
    for (int i = 0; i < n; i++) {
        uint64_t sd = seed0 + (uint64_t)i;
        pp[i] = store + (size_t)i * maxp;
        for (int q = 0; q < P[i]; q++) pp[i][q] = (int32_t)(test_rng_next(&sd) % 500);
        ref[i] = malloc(sizeof(int32_t) * (size_t)max_len);
        out[i] = malloc(sizeof(int32_t) * (size_t)max_len);
        sum += P[i];
    }
    return sum;
}

/* The cached proposal equals the uncached one every round (drafts token for token, block states to 1e-5 of the
 * row) on a tiny Qwen3 target (sliding layers causal and not) and a Qwen3.5 hybrid, drafter "sliding,full" with
 * window 4 (smaller than every context), 5 prompts of lengths 1..14 in 2 slots (so slots are reused within a
 * call, and again by the next calls), with the drafter's own drafts and with accept/reject rounds of every length;
 * speculative output equals plain decoding's. The cache is hit: each sequence starts over once, and the rows
 * projected are the prompts plus at most B a round (the uncached proposer runs over the whole context every
 * round). */
START_TEST(drafter_cache_equals_uncached) {
    for (int cfg = 0; cfg < 3; cfg++) {   /* tiny Qwen3; the same with non-causal sliding layers; the hybrid */
        int hyb = cfg == 2;
        const char *target = hyb ? NULL : tiny_target();
        if (hyb) {
            target = test_tmpdir("dcache-qwen35");
            const char *argv[] = {test_bin("dflash-mkmodel"), "--preset", "qwen3.5-tiny", "--out", target, "--std",
                                  "0.15", "--embed-std", "1.0", "--lm-head-std", "0.45", "--seed", "5", NULL};
            ck_assert_msg(run_argv(argv) == 0, "%s", out_text);
        }
        enum { NP = 5, NEW = 20, MAXLEN = 48 };
        struct drafter *d = make_drafter(target, "sliding,full", cfg == 1, 1, MAXLEN + 8, 4, 4);
        int B = drafter_config_of(d)->B;
        struct eval_target et;
        struct eval_drafter edc, edp;
        open_cache_pair(target, MAXLEN, d, &et, &edc, &edp);
        const int P[NP] = {1, 9, 14, 6, 11};
        int32_t prompts[NP][16], *pp[NP], *ref[NP], *out[NP];
        int lr[NP], lo[NP], sum_p = cache_prompts(NP, P, prompts[0], 16, 300, pp, ref, out, MAXLEN);
        const int32_t *const *cp = (const int32_t *const *)pp;
        struct eval_gen_opts plain = {.max_new = NEW};
        ck_assert_msg(eval_generate(&et, NP, cp, P, &plain, ref, lr, NULL, err, sizeof err) == 0, "%s", err);
        struct pair pr = {&edc, &edp, 0, 0, 0, 0};
        int64_t rounds_sum = 0;
        /* three calls: short responses; then prompts in another order, so slot 0's next prompt (14 tokens) is
         * longer than all its previous sequence (11 + 3) cached: only the sequence number tells them apart; then
         * accept/reject rounds */
        const int runs[3][2] = {{0, 3}, {0, NEW}, {1, NEW}}, perm[3][NP] = {{0, 1, 2, 3, 4}, {2, 0, 4, 1, 3},
                                                                           {0, 1, 2, 3, 4}};
        for (int r = 0; r < 3; r++) {
            int mode = runs[r][0], pl[NP];
            const int32_t *pq[NP];
            for (int i = 0; i < NP; i++) {
                pq[i] = pp[perm[r][i]];
                pl[i] = P[perm[r][i]];
            }
            pr.mode = mode;
            struct eval_gen_opts o = {.max_new = runs[r][1], .B = B, .fn = pair_propose, .ctx = &pr};
            struct eval_stats ss;
            eval_stats_init(&ss, B);
            ck_assert_msg(eval_generate(&et, NP, pq, pl, &o, out, lo, &ss, err, sizeof err) == 0, "%s", err);
            for (int i = 0; i < NP; i++) {
                int k = perm[r][i];
                ck_assert_int_eq(lo[i], P[k] + runs[r][1]);
                for (int q = 0; q < lo[i]; q++)
                    ck_assert_msg(out[i][q] == ref[k][q], "target %d run %d prompt %d: speculative differs from plain "
                                  "decoding at %d", hyb, r, k, q);
            }
            if (mode == 1) {
                /* accept/reject rounds: committed runs of 1..B */
                ck_assert_msg(ss.hist[1] > 0 && ss.hist[B] > 0 && ss.hist[2] + ss.hist[3] > 0, "histogram %lld %lld "
                              "%lld %lld", (long long)ss.hist[1], (long long)ss.hist[2], (long long)ss.hist[3],
                              (long long)ss.hist[4]);
            }
            rounds_sum += ss.rounds;
        }
        struct drafter_cache_stats cs;
        drafter_cache_get_stats(edc.cache, &cs);
        fprintf(stderr, "drafter_cache_equals_uncached (%s): %lld rounds, rows projected cached %lld, uncached %lld, "
                "max xn error %.2e of the row\n", hyb ? "qwen3.5-tiny" : cfg ? "tiny qwen3, non-causal sliding" :
                "tiny qwen3", (long long)pr.rounds,
                (long long)cs.ctx_rows, (long long)pr.sum_n, pr.max_err);
        ck_assert_int_eq(cs.proposals, pr.rounds);
        ck_assert_int_eq(pr.rounds, rounds_sum);
        ck_assert_int_eq(cs.resets, 3 * NP);   /* each prompt's stay in a slot, once */
        ck_assert_msg(cs.ctx_rows >= 3 * sum_p && cs.ctx_rows <= 3 * sum_p + pr.rounds * B,
                      "%lld context rows projected for %lld rounds over prompts of %d tokens", (long long)cs.ctx_rows,
                      (long long)pr.rounds, 3 * sum_p);
        ck_assert_msg(cs.ctx_rows * 3 < pr.sum_n, "cached %lld rows, uncached %lld", (long long)cs.ctx_rows,
                      (long long)pr.sum_n);
        /* a plain proposer through eval_generate takes the cached path by itself (planned at its first round) */
        struct eval_drafter edd;
        ck_assert_int_eq(eval_drafter_init(&edd, d, err, sizeof err), 0);
        struct eval_gen_opts od = {.max_new = NEW, .B = B, .fn = eval_drafter_propose, .ctx = &edd};
        ck_assert_msg(eval_generate(&et, NP, cp, P, &od, out, lo, NULL, err, sizeof err) == 0, "%s", err);
        ck_assert_ptr_nonnull(edd.cache);
        drafter_cache_get_stats(edd.cache, &cs);
        ck_assert_int_gt(cs.proposals, 0);
        for (int i = 0; i < NP; i++)
            for (int q = 0; q < lo[i]; q++) ck_assert_int_eq(out[i][q], ref[i][q]);
        eval_drafter_free(&edd);
        close_cache_pair(&et, &edc, &edp, d, ref, out, NP);
    }
}
END_TEST

/* Wider shapes, where the proposal's GEMMs and the context passes run on threads and in chunks: a target of
 * hidden 256 with 8 heads of 32 over 2 kv heads, a drafter with block 16 and window 24, prompts of 1..100 tokens
 * (longer than a context pass of 64 rows) in 2 slots; drafts equal the uncached proposer's every round, block
 * states within 1e-5 of the row, and speculative output equals plain decoding's. */
START_TEST(drafter_cache_wide_shapes) {
    const char *target = test_tmpdir("dcache-wide");
    const char *argv[] = {test_bin("dflash-mkmodel"), "--preset", "tiny", "--out", target, "--hidden", "256",
                          "--heads", "8", "--kv-heads", "2", "--head-dim", "32", "--seed", "9", NULL};
    ck_assert_msg(run_argv(argv) == 0, "%s", out_text);
    enum { NP = 5, NEW = 40, MAXLEN = 160 };
    struct drafter *d = make_drafter(target, "sliding,full,sliding", 0, 1, MAXLEN + 8, 16, 24);
    int B = drafter_config_of(d)->B;
    struct eval_target et;
    struct eval_drafter edc, edp;
    open_cache_pair(target, MAXLEN, d, &et, &edc, &edp);
    const int P[NP] = {70, 1, 100, 33, 80};
    static int32_t prompts[NP][100];
    int32_t *pp[NP], *ref[NP], *out[NP];
    int lr[NP], lo[NP], sum_p = cache_prompts(NP, P, prompts[0], 100, 900, pp, ref, out, MAXLEN);
    const int32_t *const *cp = (const int32_t *const *)pp;
    struct eval_gen_opts plain = {.max_new = NEW}, o = {.max_new = NEW, .B = B, .fn = pair_propose};
    ck_assert_msg(eval_generate(&et, NP, cp, P, &plain, ref, lr, NULL, err, sizeof err) == 0, "%s", err);
    struct pair pr = {&edc, &edp, 0, 0, 0, 0};
    o.ctx = &pr;
    ck_assert_msg(eval_generate(&et, NP, cp, P, &o, out, lo, NULL, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < NP; i++) {
        ck_assert_int_eq(lo[i], lr[i]);
        for (int q = 0; q < lo[i]; q++)
            ck_assert_msg(out[i][q] == ref[i][q], "prompt %d: speculative differs from plain decoding at %d", i, q);
    }
    struct drafter_cache_stats cs;
    drafter_cache_get_stats(edc.cache, &cs);
    fprintf(stderr, "drafter_cache_wide_shapes: %lld rounds, rows projected cached %lld, uncached %lld, max xn error "
            "%.2e of the row\n", (long long)pr.rounds, (long long)cs.ctx_rows, (long long)pr.sum_n, pr.max_err);
    ck_assert_int_eq(cs.proposals, pr.rounds);
    ck_assert_int_eq(cs.resets, NP);
    ck_assert_msg(cs.ctx_rows >= sum_p && cs.ctx_rows <= sum_p + pr.rounds * B, "%lld rows", (long long)cs.ctx_rows);
    close_cache_pair(&et, &edc, &edp, d, ref, out, NP);
}
END_TEST

/* ---------------------------------------------------------------- dflash-sample --prompts (issue 30 item 2) */

static int count_rows(const char *path) {
    size_t len;
    char *t = test_slurp(path, &len);
    ck_assert_ptr_nonnull(t);
    int n = 0;
    for (size_t i = 0; i < len; i++) n += t[i] == '\n';
    free(t);
    return n;
}

/* Regeneration: one row per supervised span, its prompt the original tokens before the span, its response the
 * target's greedy continuation (checked against eval_greedy) up to a stop token; a killed run (a torn last line)
 * resumes to the same bytes as an uninterrupted one; sampled output is the same for a seed whatever --batch; bad
 * rows are named by line. */
START_TEST(sample_regenerates_and_resumes) {
    const char *target = tiny_target();
    const char *dir = test_tmpdir("regen");
    char data[700], o1[700], o2[700], o3[700], o4[700], bad[700];
    snprintf(data, sizeof data, "%s/train.jsonl", dir);
    snprintf(o1, sizeof o1, "%s/full.jsonl", dir);
    snprintf(o2, sizeof o2, "%s/resumed.jsonl", dir);
    snprintf(o3, sizeof o3, "%s/s1.jsonl", dir);
    snprintf(o4, sizeof o4, "%s/s3.jsonl", dir);
    snprintf(bad, sizeof bad, "%s/bad.jsonl", dir);
    /* row 2 has two assistant spans: [4, 6) and [9, 11) */
    const char *text = "{\"input_ids\": [1, 2, 3, 4, 5, 6], \"loss_mask\": [0, 0, 0, 1, 1, 1]}\n"
                       "{\"input_ids\": [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], \"loss_mask\": [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]}\n"
                       "{\"input_ids\": [20, 21, 22, 23, 24], \"loss_mask\": [0, 0, 1, 1, 1]}\n";
    ck_assert_int_eq(fs_write_atomic(data, text, strlen(text), err, sizeof err), 0);
    const char *a[] = {test_bin("dflash-sample"), "--target-model", target, "--prompts", data, "--out", o1, "--gen-len",
                       "10", "--temperature", "0", "--batch", "3", "--stop-ids", "999999", NULL};
    ck_assert_msg(run_argv(a) == 0, "%s", out_text);
    ck_assert_msg(strstr(out_text, "4/4 rows") && strstr(out_text, "ETA"), "%s", out_text);
    ck_assert_int_eq(count_rows(o1), 4);
    /* each row: the prompt, then the target's greedy continuation */
    int zero = 0;
    struct eval_target et;
    ck_assert_msg(eval_target_open(&et, target, 64, &zero, 1, err, sizeof err) == 0, "%s", err);
    static const int32_t prompts[4][9] = {{1, 2, 3}, {7, 8, 9, 10}, {7, 8, 9, 10, 11, 12, 13, 14, 15}, {20, 21}};
    static const int plen[4] = {3, 4, 9, 2};
    char *all = test_slurp(o1, NULL), *line = all;
    for (int r = 0; r < 4; r++) {
        char *e = strchr(line, '\n');
        *e = '\0';
        json_t *j = json_loads(line, 0, NULL);
        ck_assert_ptr_nonnull(j);
        json_t *ids = json_object_get(j, "input_ids"), *lm = json_object_get(j, "loss_mask");
        int n = (int)json_array_size(ids);
        ck_assert_int_eq(n, plen[r] + 10);   /* 999999 is no token: no stop */
        ck_assert_int_eq((int)json_array_size(lm), n);
        int32_t g[32];
        ck_assert_msg(eval_greedy(&et, prompts[r], plen[r], 10, g, err, sizeof err) == 0, "%s", err);
        for (int t = 0; t < n; t++) {
            ck_assert_int_eq(json_integer_value(json_array_get(ids, (size_t)t)), g[t]);
            ck_assert_int_eq(json_integer_value(json_array_get(lm, (size_t)t)), t >= plen[r]);
        }
        json_decref(j);
        line = e + 1;
    }
    free(all);
    /* a stop token: row 0 ends at the first occurrence of its 3rd generated token */
    int32_t g0[32];
    ck_assert_int_eq(eval_greedy(&et, prompts[0], 3, 10, g0, err, sizeof err), 0);
    int first = 0;
    while (g0[3 + first] != g0[5]) first++;
    char stop[16];
    snprintf(stop, sizeof stop, "%d", g0[5]);
    const char *as[] = {test_bin("dflash-sample"), "--target-model", target, "--prompts", data, "--out", o3, "--gen-len",
                        "10", "--temperature", "0", "--stop-ids", stop, "--limit", "1", NULL};
    ck_assert_msg(run_argv(as) == 0, "%s", out_text);
    char *r0 = test_slurp(o3, NULL);
    json_t *j0 = json_loads(r0, JSON_DISABLE_EOF_CHECK, NULL);
    ck_assert_int_eq((int)json_array_size(json_object_get(j0, "input_ids")), 3 + first + 1);
    json_decref(j0);
    free(r0);
    unlink(o3);
    eval_target_close(&et);

    /* resume: 2 jobs, then a torn line as a kill mid-write leaves, then the whole run again */
    const char *b1[] = {test_bin("dflash-sample"), "--target-model", target, "--prompts", data, "--out", o2, "--gen-len",
                        "10", "--temperature", "0", "--batch", "2", "--stop-ids", "999999", "--limit", "2", NULL};
    ck_assert_msg(run_argv(b1) == 0, "%s", out_text);
    ck_assert_int_eq(count_rows(o2), 2);
    int fd = open(o2, O_WRONLY | O_APPEND);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "{\"input_ids\": [7, 8", 19), 19);
    close(fd);
    const char *b2[] = {test_bin("dflash-sample"), "--target-model", target, "--prompts", data, "--out", o2, "--gen-len",
                        "10", "--temperature", "0", "--batch", "2", "--stop-ids", "999999", NULL};
    ck_assert_msg(run_argv(b2) == 0, "%s", out_text);
    ck_assert_msg(strstr(out_text, "cutting a torn last line") && strstr(out_text, "2 of 4 rows already written"), "%s",
                  out_text);
    char *x = test_slurp(o1, NULL), *y = test_slurp(o2, NULL);
    ck_assert_str_eq(x, y);
    free(x);
    free(y);

    /* sampled: the same seed gives the same file with --batch 1 and --batch 3 */
    const char *c1[] = {test_bin("dflash-sample"), "--target-model", target, "--prompts", data, "--out", o3, "--gen-len",
                        "10", "--temperature", "0.9", "--top-p", "0.95", "--seed", "5", "--batch", "1", NULL};
    const char *c3[] = {test_bin("dflash-sample"), "--target-model", target, "--prompts", data, "--out", o4, "--gen-len",
                        "10", "--temperature", "0.9", "--top-p", "0.95", "--seed", "5", "--batch", "3", NULL};
    ck_assert_msg(run_argv(c1) == 0, "%s", out_text);
    ck_assert_msg(run_argv(c3) == 0, "%s", out_text);
    x = test_slurp(o3, NULL);
    y = test_slurp(o4, NULL);
    ck_assert_str_eq(x, y);
    char *g = test_slurp(o1, NULL);
    ck_assert_msg(strcmp(x, g) != 0, "temperature 0.9 gave the greedy file");
    free(x);
    free(y);
    free(g);

    const char *btext = "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}\n{\"input_ids\": [1, 2, 3]}\n";
    ck_assert_int_eq(fs_write_atomic(bad, btext, strlen(btext), err, sizeof err), 0);
    const char *d[] = {test_bin("dflash-sample"), "--target-model", target, "--prompts", bad, "--out", o3, NULL};
    ck_assert_int_eq(run_argv(d), 1);
    ck_assert_msg(strstr(out_text, "bad.jsonl:2: key loss_mask"), "%s", out_text);
}
END_TEST

/* ---------------------------------------------------------------- training moves tau (issue 17 item 4) */

/* Make the tiny target learnable: embedding N(0, 1), LM head N(0, 0.45), the layers' matrices N(0, 0.06) (what
 * dflash-mkmodel's --embed-std / --lm-head-std give on another branch), norms kept. */
static void make_learnable(const char *dir) {
    char p[700], q[720];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(q, sizeof q, "%s/new.safetensors", dir);
    struct st_file f;
    ck_assert_msg(st_open(&f, p, err, sizeof err) == 0, "%s", err);
    struct st_write_tensor *t = calloc((size_t)f.n_tensors, sizeof *t);
    bf16 **bufs = calloc((size_t)f.n_tensors, sizeof *bufs);
    uint64_t s = 4242;
    for (int i = 0; i < f.n_tensors; i++) {
        const struct st_tensor *x = &f.tensors[i];
        t[i] = (struct st_write_tensor){x->name, x->dtype, x->ndim, {0}, x->data};
        memcpy(t[i].shape, x->shape, sizeof x->shape);
        if (x->ndim != 2) continue;
        ck_assert_int_eq(x->dtype, ST_BF16);
        float std = strstr(x->name, "embed_tokens") ? 1.0f : strstr(x->name, "lm_head") ? 0.45f : 0.06f;
        bufs[i] = malloc(sizeof(bf16) * (size_t)x->numel);
        for (int64_t e = 0; e < x->numel; e += 2) {
            double u1 = ((double)(test_rng_next(&s) >> 11) + 1) / 9007199254740993.0;
            double u2 = (double)(test_rng_next(&s) >> 11) / 9007199254740992.0;
            double r = sqrt(-2 * log(u1));
            bufs[i][e] = float_to_bf16((float)(std * r * cos(2 * M_PI * u2)));
            if (e + 1 < x->numel) bufs[i][e + 1] = float_to_bf16((float)(std * r * sin(2 * M_PI * u2)));
        }
        t[i].data = bufs[i];
    }
    ck_assert_msg(st_write_file(q, f.n_tensors, t, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < f.n_tensors; i++) free(bufs[i]);
    free(bufs);
    free(t);
    st_close(&f);
    ck_assert_int_eq(rename(q, p), 0);
}

struct row { int32_t ids[64]; uint8_t mask[64]; int n, P; };

static int read_rows(const char *path, struct row *rows, int max) {
    char *text;
    size_t len;
    ck_assert_int_eq(fs_read_file(path, &text, &len, err, sizeof err), 0);
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && n < max; line = strtok_r(NULL, "\n", &save)) {
        json_t *j = json_loads(line, 0, NULL);
        ck_assert_ptr_nonnull(j);
        json_t *ids = json_object_get(j, "input_ids"), *lm = json_object_get(j, "loss_mask");
        struct row *r = &rows[n++];
        r->n = (int)json_array_size(ids);
        ck_assert_int_le(r->n, 64);
        r->P = r->n;
        for (int i = 0; i < r->n; i++) {
            r->ids[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
            r->mask[i] = (uint8_t)json_integer_value(json_array_get(lm, (size_t)i));
            if (r->mask[i] && r->P == r->n) r->P = i;
        }
        json_decref(j);
    }
    free(text);
    return n;
}

static double eval_tau(struct eval_target *et, struct eval_drafter *ed, const struct row *rows, int n, int new_tokens,
                       struct eval_stats *st) {
    int B = drafter_config_of(ed->d)->B;
    eval_stats_init(st, B);
    for (int i = 0; i < n; i++) {
        int32_t out[128], g[128];
        ck_assert_msg(eval_speculative(et, rows[i].ids, rows[i].P, new_tokens, B, eval_drafter_propose, ed, out, st, err,
                                       sizeof err) == 0, "%s", err);
        ck_assert_msg(eval_greedy(et, rows[i].ids, rows[i].P, new_tokens, g, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(memcmp(out, g, sizeof(int32_t) * (size_t)(rows[i].P + new_tokens)) == 0, "differs from greedy");
    }
    return eval_stats_tau(st);
}

/* A tiny target's drafter (layers full,full, B 4, 16 anchors; sample_from_anchor as given) trained for `steps`
 * steps, one of rows[0..n_train) a step, by the trainer's step (drafter_step + clip + AdamW 5e-3); τ on the held-out
 * rows before training in tr->tau0. The caller measures after and frees with trained_free. */
struct trained {
    struct drafter *d;
    struct eval_target et;
    struct eval_drafter ed;
    struct optim o;
    struct optim_tensor *t;
    struct eval_stats before;
    double tau0, first_loss, last_loss;
    struct drafter_metrics tail;   /* the trainer's estimate over the last 50 steps */
};

static void train_tiny(struct trained *tr, const char *target, const struct row *rows, int n_train, int steps, int sfa,
                       const struct row *held, int n_held, int new_tokens) {
    struct drafter_config c;
    memset(tr, 0, sizeof *tr);
    drafter_config_defaults(&c);
    ck_assert_int_eq(drafter_parse_layer_types(&c, "full,full", err, sizeof err), 0);
    c.B = 4;
    c.N = 16;
    c.T_max = 64;
    c.k = 2;
    c.layer_ids[0] = 1;
    c.layer_ids[1] = 3;
    c.mask_token_id = 511;
    c.noise = 0;
    c.sample_from_anchor = sfa;
    ck_assert_msg(drafter_config_from_target(&c, target, err, sizeof err) == 0, "%s", err);
    struct drafter *d = tr->d = drafter_init(&c, 3, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_msg(drafter_load_target(d, target, err, sizeof err) == 0, "%s", err);
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(drafter_config_of(d), zl);
    struct eval_target *et = &tr->et;
    ck_assert_msg(eval_target_open(et, target, 64, zl, 2, err, sizeof err) == 0, "%s", err);
    struct eval_drafter *ed = &tr->ed;
    ck_assert_int_eq(eval_drafter_init(ed, d, err, sizeof err), 0);
    tr->tau0 = eval_tau(et, ed, held, n_held, new_tokens, &tr->before);

    /* train: one sampled row per step, AdamW, the trainer's step (drafter_step + clip + optimizer) */
    int n = drafter_n_params(d);
    struct optim_tensor *t = tr->t = calloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        t[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable,
                                     p->is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    oc.kind = OPTIM_ADAMW;
    oc.lr = 5e-3;
    oc.weight_decay = 0;
    struct optim *o = &tr->o;
    ck_assert_msg(optim_init(o, t, n, &oc, err, sizeof err) == 0, "%s", err);
    int32_t pos[64], doc[64] = {0};
    for (int i = 0; i < 64; i++) pos[i] = i;
    drafter_metrics_zero(&tr->tail, c.B);
    for (int s = 0; s < steps; s++) {
        const struct row *r = &rows[s % n_train];
        ck_assert_msg(eval_target_forward(et, r->ids, r->n, r->n, NULL, err, sizeof err) == 0, "%s", err);
        for (int tt = 0; tt < r->n; tt++)
            for (int q = 0; q < 2; q++)
                memcpy(ed->hidden + ((size_t)tt * 2 + q) * et->H, et->states + ((size_t)q * r->n + tt) * et->H,
                       sizeof(float) * (size_t)et->H);
        struct drafter_batch b = {r->n, r->n + 1, r->ids, r->mask, pos, doc, ed->hidden, et->last};
        struct drafter_metrics m;
        drafter_zero_grad(d);
        ck_assert_msg(drafter_step(d, &b, 5, (uint64_t)s, 1, &m, err, sizeof err) == 0, "%s", err);
        optim_clip_grad_norm(t, n, 1.0);
        ck_assert_msg(optim_step(o, 1.0, err, sizeof err) == 0, "%s", err);
        if (s < 20) tr->first_loss += m.loss_sum / 20;
        if (s >= steps - 20) tr->last_loss += m.loss_sum / 20;
        if (s >= steps - 50) drafter_metrics_add(&tr->tail, &m);   /* the trainer's estimate over its last steps */
    }
}

static void trained_free(struct trained *tr) {
    optim_free(&tr->o);
    free(tr->t);
    eval_drafter_free(&tr->ed);
    eval_target_close(&tr->et);
    drafter_free(tr->d);
}

/* The tiny target made learnable, and n rows sampled from it by dflash-sample (8-token prompts, 24 tokens at
 * temperature 0.3) into data = dir/sampled.jsonl (dir [600] = a fresh test directory named tag, data [700]), read
 * back into rows. */
static void learnable_rows(const char *target, const char *tag, char *dir, char *data, struct row *rows, int n) {
    make_learnable(target);
    snprintf(dir, 600, "%s", test_tmpdir(tag));   /* dir: 600 bytes, so dir/<file> fits the callers' 700 */
    snprintf(data, 700, "%s/sampled.jsonl", dir);
    char ns[16];
    snprintf(ns, sizeof ns, "%d", n);
    const char *a[] = {test_bin("dflash-sample"), "--target-model", target, "--out", data, "--samples", ns,
                       "--prompt-len", "8", "--gen-len", "24", "--temperature", "0.3", "--max-token", "500", NULL};
    ck_assert_msg(run_argv(a) == 0, "%s", out_text);
    ck_assert_int_eq(read_rows(data, rows, n), n);
}

START_TEST(training_moves_tau) {
    const char *target = tiny_target();
    char dir[600], data[700];
    enum { TRAIN = 160, HELD = 12, NEW = 24, STEPS = 600 };
    static struct row rows[TRAIN + HELD];
    learnable_rows(target, "eval-demo", dir, data, rows, TRAIN + HELD);

    struct trained tr;
    train_tiny(&tr, target, rows, TRAIN, STEPS, 0, rows + TRAIN, HELD, NEW);
    struct drafter *d = tr.d;
    const struct drafter_config *cf = drafter_config_of(d);
    struct eval_stats after;
    double tau0 = tr.tau0;
    double tau1 = eval_tau(&tr.et, &tr.ed, rows + TRAIN, HELD, NEW, &after);
    /* the same through the binaries: a checkpoint, dflash-eval on the held-out rows (with the offline estimate) */
    char ckpt[1024], res[700];
    save_ckpt(d, ckpt, sizeof ckpt);
    snprintf(res, sizeof res, "%s/eval.json", dir);
    char skip[16], lim[16], nw[16];
    snprintf(skip, sizeof skip, "%d", TRAIN);
    snprintf(lim, sizeof lim, "%d", HELD);
    snprintf(nw, sizeof nw, "%d", NEW);
    const char *ev[] = {test_bin("dflash-eval"), "--target-model", target, "--ckpt", ckpt, "--prompts", data, "--skip",
                        skip, "--limit", lim, "--max-new", nw, "--out", res, NULL};
    ck_assert_msg(run_argv(ev) == 0, "%s", out_text);
    char *js;
    size_t jl;
    ck_assert_int_eq(fs_read_file(res, &js, &jl, err, sizeof err), 0);
    json_t *jr = json_loads(js, 0, NULL);
    free(js);
    double cli_tau = json_number_value(json_object_get(jr, "tau"));
    double sim = json_number_value(json_object_get(jr, "offline_simulated_tau"));
    double tf = json_number_value(json_object_get(jr, "offline_teacher_forced_tau"));
    json_decref(jr);
    fprintf(stderr, "training_moves_tau: dflash-eval on the checkpoint: tau %.3f; offline estimate: simulated %.3f, "
            "teacher-forced %.3f\n", cli_tau, sim, tf);
    ck_assert_double_eq_tol(cli_tau, tau1, 1e-9);
    /* and from its z-lab export (bf16 weights), as a server would load it */
    char exp[700];
    snprintf(exp, sizeof exp, "%s/export-zlab", dir);
    ck_assert_msg(export_write(d, EXPORT_ZLAB, exp, target, err, sizeof err) == 0, "%s", err);
    const char *ev2[] = {test_bin("dflash-eval"), "--target-model", target, "--drafter", exp, "--prompts", data,
                         "--skip", skip, "--limit", lim, "--max-new", nw, "--out", res, NULL};
    ck_assert_msg(run_argv(ev2) == 0, "%s", out_text);
    ck_assert_int_eq(fs_read_file(res, &js, &jl, err, sizeof err), 0);
    jr = json_loads(js, 0, NULL);
    free(js);
    double exp_tau = json_number_value(json_object_get(jr, "tau"));
    json_decref(jr);
    fprintf(stderr, "training_moves_tau: dflash-eval on the z-lab export (bf16): tau %.3f\n", exp_tau);
    ck_assert_msg(exp_tau > 1.5, "export tau %g", exp_tau);
    fprintf(stderr, "training_moves_tau: loss %.3f -> %.3f over %d steps; held-out tau %.3f -> %.3f (B %d); training "
            "estimate (last 50 steps, noise 0) 1 + eal_marginal = %.3f; acceptance at 1..3 after: %.2f %.2f %.2f\n",
            tr.first_loss, tr.last_loss, STEPS, tau0, tau1, cf->B, 1 + drafter_metrics_eal_marginal(&tr.tail),
            (double)after.at_pos[1] / after.rounds, (double)after.at_pos[2] / after.rounds,
            (double)after.at_pos[3] / after.rounds);
    ck_assert_msg(tau0 < 1.3, "untrained tau %g", tau0);
    ck_assert_msg(tau1 > 1.5 && tau1 > tau0 + 0.3, "tau did not rise: %g -> %g", tau0, tau1);
    trained_free(&tr);
}
END_TEST

/* A drafter trained with sample_from_anchor (block row j predicts the token at a + j + 1, reference §5): its
 * draft for positions n..n+B-2 is rows 0..B-2 (without the mode, rows 1..B-1). Trained, it is accepted: τ rises as
 * the plain drafter's does (taking rows 1..B-1, as before this test, drafts one position too far: τ 1.008).
 * dflash-eval on its checkpoint (KV-cached target and drafter, batched) gives the same τ. */
START_TEST(sample_from_anchor_proposes_its_rows) {
    const char *target = tiny_target();
    char dir[600], data[700];
    enum { TRAIN = 160, HELD = 12, NEW = 24, STEPS = 600 };
    static struct row rows[TRAIN + HELD];
    learnable_rows(target, "eval-sfa", dir, data, rows, TRAIN + HELD);
    struct trained tr;
    train_tiny(&tr, target, rows, TRAIN, STEPS, 1, rows + TRAIN, HELD, NEW);
    ck_assert(drafter_config_of(tr.d)->sample_from_anchor);
    struct eval_stats after;
    double tau1 = eval_tau(&tr.et, &tr.ed, rows + TRAIN, HELD, NEW, &after);
    char ckpt[1024], res[700];
    save_ckpt(tr.d, ckpt, sizeof ckpt);
    snprintf(res, sizeof res, "%s/eval.json", dir);
    const char *ev[] = {test_bin("dflash-eval"), "--target-model", target, "--ckpt", ckpt, "--prompts", data, "--skip",
                        "160", "--limit", "12", "--max-new", "24", "--no-offline", "--out", res, NULL};
    ck_assert_msg(run_argv(ev) == 0, "%s", out_text);
    json_t *jr = json_load_file(res, 0, NULL);
    ck_assert_ptr_nonnull(jr);
    double cli_tau = json_number_value(json_object_get(jr, "tau"));
    ck_assert(json_is_true(json_object_get(jr, "drafter_cache")));
    json_decref(jr);
    fprintf(stderr, "sample_from_anchor_proposes_its_rows: loss %.3f -> %.3f; held-out tau %.3f -> %.3f (B %d); "
            "dflash-eval (cached) %.3f\n", tr.first_loss, tr.last_loss, tr.tau0, tau1, drafter_config_of(tr.d)->B,
            cli_tau);
    /* untrained, row 0 already drafts fairly well (the anchor token's own embedding through the frozen LM head of
     * this learnable target: τ ~1.6); the rows one position too far gave τ 1.008 after training */
    ck_assert_msg(tau1 > 1.8 && tau1 > tr.tau0 + 0.3, "tau did not rise: %g -> %g", tr.tau0, tau1);
    ck_assert_double_eq_tol(cli_tau, tau1, 1e-9);
    trained_free(&tr);
}
END_TEST

int main(void) {
    Suite *s = suite_create("eval");
    TCase *tc = tcase_create("eval");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, argmax_equals_plain_loop);
    tcase_add_test(tc, speculative_equals_greedy_and_tau);
    tcase_add_test(tc, cli_reports_and_refuses);
    tcase_add_test(tc, decode_equals_full_forward);
    tcase_add_test(tc, decode_hybrid_equals_full_forward);
    tcase_add_test(tc, cached_generation);
    tcase_add_test(tc, drafter_cache_equals_uncached);
    tcase_add_test(tc, drafter_cache_wide_shapes);
    tcase_add_test(tc, sample_regenerates_and_resumes);
    tcase_add_test(tc, training_moves_tau);
    tcase_add_test(tc, sample_from_anchor_proposes_its_rows);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
