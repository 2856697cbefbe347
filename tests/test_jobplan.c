/*
 * tests/test_jobplan.c — the one-GPU memory plan (stages/model/jobplan.h) and target_plan_bytes:
 * - target_plan_bytes equals what target.c allocates (CPU build: fp32; a Qwen3 and a Qwen3.5 hybrid
 *   config), so the target's line of the plan is exact;
 * - the issue-27 job (Qwen3.6-27B target in bf16, SpecForge's 1.83 B drafter, 8192-token batches,
 *   512 anchors x block 16, 32000-token draft vocabulary, 4-slot rings) fits one 141 GB H200, with
 *   the arithmetic pinned: target weights, trainable drafter parameters, the total;
 * - a job that does not fit (32768 tokens; or an 80 GB GPU) is refused with one line naming the
 *   shortfall and the flags to change.
 */
#include "model/jobplan.h"
#include "model/target.h"
#include "testutil.h"

static char err[1024];

static struct model_config q36(void) {
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = HF_ARCH_QWEN3_5;
    snprintf(c.architecture, sizeof c.architecture, "Qwen3_5ForCausalLM");
    c.vocab_size = 248320; c.hidden_size = 5120; c.intermediate_size = 17408; c.num_hidden_layers = 64;
    c.num_attention_heads = 24; c.num_key_value_heads = 4; c.head_dim = 256; c.rotary_dim = 64; c.qk_norm = 1;
    c.rms_norm_eps = 1e-6; c.rope_theta = 1e7; c.linear_conv_kernel_dim = 4; c.linear_key_head_dim = 128;
    c.linear_value_head_dim = 128; c.linear_num_key_heads = 16; c.linear_num_value_heads = 48;
    for (int l = 0; l < 64; l++) c.layer_linear[l] = (l + 1) % 4 != 0;
    return c;
}

static void plan_matches_allocation(struct model_config *c, int T) {
    struct target_options opt;
    target_options_defaults(&opt);
    opt.max_tokens = T;
    struct target *t = target_init_random(c, &opt, 1, 0.02f, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    size_t w = 0, k = 0;
    target_plan_bytes(c, T, 0, &w, &k);
    ck_assert_msg(w == target_weight_bytes(t), "planned weights %zu, allocated %zu", w, target_weight_bytes(t));
    ck_assert_msg(k == target_work_bytes(t), "planned working memory %zu, allocated %zu", k, target_work_bytes(t));
    target_free(t);
}

START_TEST(target_plan_is_the_allocation) {
    struct model_config h = q36();   /* the 27B layout scaled down: 4 layers, small widths */
    h.vocab_size = 300; h.hidden_size = 64; h.intermediate_size = 96; h.num_hidden_layers = 4;
    h.num_attention_heads = 4; h.num_key_value_heads = 2; h.head_dim = 16; h.rotary_dim = 8;
    h.linear_key_head_dim = 8; h.linear_value_head_dim = 12; h.linear_num_key_heads = 2; h.linear_num_value_heads = 4;
    plan_matches_allocation(&h, 37);
    struct model_config q;
    memset(&q, 0, sizeof q);
    q.arch = HF_ARCH_QWEN3;
    snprintf(q.architecture, sizeof q.architecture, "Qwen3ForCausalLM");
    q.vocab_size = 300; q.hidden_size = 64; q.intermediate_size = 128; q.num_hidden_layers = 3;
    q.num_attention_heads = 4; q.num_key_value_heads = 2; q.head_dim = 16; q.qk_norm = 1; q.rms_norm_eps = 1e-6;
    q.rope_theta = 1e6;
    plan_matches_allocation(&q, 50);
}
END_TEST

static struct jobplan_inputs job27(const struct model_config *c) {
    struct jobplan_inputs in = {c, 8192, 5, 5, 0, 0, 0, 0, 512, 16, 32000, 1, 4, (size_t)141e9};
    return in;
}

START_TEST(qwen36_27b_job_fits_one_h200) {
    struct model_config c = q36();
    struct jobplan_inputs in = job27(&c);
    struct jobplan p;
    ck_assert_msg(jobplan_compute(&in, &p, err, sizeof err) == 0, "%s", err);
    jobplan_print(&p, stderr);
    /* target weights: 64 layers (48 DeltaNet, 16 gated attention) + embedding, bf16, no lm_head (the
     * target never computes logits): 25.6 G parameters -> 51.3 GB */
    size_t w = 0, k = 0;
    target_plan_bytes(&c, 8192, 1, &w, &k);
    ck_assert_msg(w > 51.0e9 && w < 52.5e9, "target weights %.2f GB", w / 1e9);
    ck_assert_msg(k > 1.0e9 && k < 3.0e9, "target working memory %.2f GB", k / 1e9);
    ck_assert_uint_eq(p.target_bytes, w + k);
    /* SpecForge's drafter: 5 x (q 5120x6144 + k, v 5120x1024 + o 6144x5120 + MLP 3x5120x17408) + fc 5120x25600 */
    ck_assert_msg(p.draft_params > 1.83e9 && p.draft_params < 1.84e9, "drafter %.4g parameters", p.draft_params);
    /* 18 bytes per trainable parameter (fp32 master + grad, bf16 copy, two fp32 moments) */
    ck_assert_msg(p.line[2].bytes > 32.9e9 && p.line[2].bytes < 33.1e9, "drafter state %.2f GB", p.line[2].bytes / 1e9);
    ck_assert_uint_eq(p.total_bytes, p.target_bytes + p.trainer_bytes + p.ring_bytes + p.reserve_bytes);
    ck_assert_msg(p.total_bytes < 141e9, "total %.2f GB", p.total_bytes / 1e9);
    ck_assert_int_eq(jobplan_check(&p, err, sizeof err), 0);
}
END_TEST

START_TEST(job_that_cannot_fit_is_refused_with_the_fix) {
    struct model_config c = q36();
    struct jobplan_inputs in = job27(&c);
    struct jobplan p;
    in.capacity_bytes = (size_t)80e9;   /* an 80 GB GPU */
    ck_assert_int_eq(jobplan_compute(&in, &p, err, sizeof err), 0);
    ck_assert_int_eq(jobplan_check(&p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "short by") && strstr(err, "of 80.0 GB") && strstr(err, "--tokens") &&
                  strstr(err, "--max-anchors") && strstr(err, "--draft-vocab") && strstr(err, "--grad-accum"), "%s", err);
    ck_assert_ptr_null(strchr(err, '\n'));   /* one line */
    /* more tokens and anchors on the 141 GB GPU: the activations outgrow it */
    in = job27(&c);
    in.tokens = 65536;
    in.max_anchors = 4096;
    ck_assert_int_eq(jobplan_compute(&in, &p, err, sizeof err), 0);
    ck_assert_int_eq(jobplan_check(&p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "of 141.0 GB"), "%s", err);
    /* nonsense inputs are a sentence, not a plan */
    in = job27(&c);
    in.block_size = 0;
    ck_assert_int_eq(jobplan_compute(&in, &p, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "--block-size"));
}
END_TEST

int main(void) {
    Suite *s = suite_create("jobplan");
    TCase *tc = tcase_create("jobplan");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, target_plan_is_the_allocation);
    tcase_add_test(tc, qwen36_27b_job_fits_one_h200);
    tcase_add_test(tc, job_that_cannot_fit_is_refused_with_the_fix);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
