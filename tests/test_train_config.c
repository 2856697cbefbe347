/*
 * tests/test_train_config.c — the checkpoint's "dflash-train config" has one owner (stages/train/train_config.h):
 * what dflash-train writes, dflash-export reads back to the same drafter configuration and hyper-parameters;
 * a missing or misspelled key is refused by name.
 */
#include "kernels/lmhead_loss.h"
#include "train/optim.h"
#include "train/sched.h"
#include "train/train_config.h"

#include "testutil.h"

#include <check.h>
#include <jansson.h>

static void config(struct drafter_config *c) {
    drafter_config_defaults(c);
    snprintf(c->target.model_type, sizeof c->target.model_type, "qwen3");
    c->target.num_hidden_layers = 36;
    c->H = 4096;
    c->V_t = 151936;
    c->V_d = 32000;
    c->B = 8;
    c->L = 3;
    c->layer_type[0] = DRAFTER_LAYER_SLIDING;
    c->layer_type[1] = DRAFTER_LAYER_FULL;
    c->layer_type[2] = DRAFTER_LAYER_SLIDING;
    c->sliding_window = 1024;
    c->sliding_window_non_causal = 1;
    c->N = 256;
    c->T_max = 4096;
    c->k = 3;
    c->layer_ids[0] = 1;
    c->layer_ids[1] = 17;
    c->layer_ids[2] = 33;
    c->sample_from_anchor = 1;
    c->mask_token_id = 151669;
    c->noise = 0.25f;
    c->loss = LMHEAD_LOSS_KL;
    c->weighting = LMHEAD_WEIGHT_EXP_DECAY;
    c->gamma = 7.0f;
    c->alpha = 0.25f;
    c->init_std = 0.125f;
}

START_TEST(round_trip) {
    struct drafter_config c, r;
    config(&c);
    struct train_hparams h = {.seed = 99, .optimizer = OPTIM_ADAMW, .lr = 3e-4, .muon_lr = 2e-3, .weight_decay = 0.5,
                              .muon_weight_decay = 0.25, .schedule = SCHED_COSINE, .total_steps = 1000,
                              .warmup_steps = 10, .grad_accum = 4, .clip = 2.0},
                         hr;
    char *text = train_config_json(&c, &h);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(strstr(text, "{\"format\":\"dflash-train config\",\"version\":1,"));
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    ck_assert_ptr_nonnull(j);
    struct train_config_target t;
    char err[512];
    ck_assert_msg(train_config_parse(j, "ckpt", &r, &hr, &t, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(t.hidden_size, 4096);
    ck_assert_int_eq(t.target_layers, 36);
    ck_assert_int_eq(t.vocab_size, 151936);
    ck_assert_int_eq(t.draft_vocab_size, 32000);
    ck_assert_int_eq(r.B, 8);
    ck_assert_int_eq(r.L, 3);
    ck_assert_mem_eq(r.layer_type, c.layer_type, 3 * sizeof c.layer_type[0]);
    ck_assert_int_eq(r.sliding_window, 1024);
    ck_assert_int_eq(r.sliding_window_non_causal, 1);
    ck_assert_int_eq(r.N, 256);
    ck_assert_int_eq(r.T_max, 4096);
    ck_assert_int_eq(r.k, 3);
    ck_assert_mem_eq(r.layer_ids, c.layer_ids, 3 * sizeof c.layer_ids[0]);
    ck_assert_int_eq(r.sample_from_anchor, 1);
    ck_assert_int_eq(r.mask_token_id, 151669);
    ck_assert_float_eq(r.noise, 0.25f);
    ck_assert_int_eq(r.loss, LMHEAD_LOSS_KL);
    ck_assert_int_eq(r.weighting, LMHEAD_WEIGHT_EXP_DECAY);
    ck_assert_float_eq(r.gamma, 7.0f);
    ck_assert_float_eq(r.alpha, 0.25f);
    ck_assert_float_eq(r.init_std, 0.125f);
    ck_assert_int_eq(hr.seed, 99);
    ck_assert_int_eq(hr.optimizer, OPTIM_ADAMW);
    ck_assert_double_eq(hr.lr, 3e-4);
    ck_assert_double_eq(hr.muon_lr, 2e-3);
    ck_assert_double_eq(hr.weight_decay, 0.5);
    ck_assert_double_eq(hr.muon_weight_decay, 0.25);
    ck_assert_int_eq(hr.schedule, SCHED_COSINE);
    ck_assert_int_eq(hr.total_steps, 1000);
    ck_assert_int_eq(hr.warmup_steps, 10);
    ck_assert_int_eq(hr.grad_accum, 4);
    ck_assert_double_eq(hr.clip, 2.0);
    /* written again from what was read, with the target's facts as drafter_config_from_target fills them: the
     * same text (a resumed run's config equals the checkpoint's) */
    r.target = c.target;
    r.H = (int)t.hidden_size;
    r.V_t = (int)t.vocab_size;
    r.V_d = (int)t.draft_vocab_size;
    char *again = train_config_json(&r, &hr);
    ck_assert_ptr_nonnull(again);
    ck_assert_str_eq(again, text);
    free(again);

    /* broken keys are refused by name */
    struct { const char *key; json_t *value; const char *needle; } bad[] = {
        {"format", json_string("other"), "not \"dflash-train config\""},
        {"block_size", json_string("8"), "key \"block_size\" must be an integer"},
        {"layer_types", json_pack("[s]", "dense"), "\"layer_types\"[0] must be \"sliding\" or \"full\""},
        {"loss", json_string("mse"), "key \"loss\" must be kl or ce"},
        {"target_layer_ids_zlab", json_string("1,2"), "\"target_layer_ids_zlab\" must be an array"},
        {"seed", NULL, "key \"seed\" is missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *b = json_deep_copy(j);
        if (bad[i].value) json_object_set_new(b, bad[i].key, bad[i].value);
        else json_object_del(b, bad[i].key);
        ck_assert_int_eq(train_config_parse(b, "F.ckpt", &r, &hr, &t, err, sizeof err), -1);
        ck_assert_msg(strstr(err, bad[i].needle) && strstr(err, "F.ckpt"), "%s: %s", bad[i].key, err);
        json_decref(b);
    }
    json_decref(j);
    free(text);
}
END_TEST

int main(void) {
    Suite *s = suite_create("train_config");
    TCase *tc = tcase_create("train_config");
    tcase_add_test(tc, round_trip);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
