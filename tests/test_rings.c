/*
 * tests/test_rings.c — stages/core/rings: one sizing function for every ring, the spec line
 * every --print-ring-spec prints (parsed back by ring_parse_specs), and the budget check sentence.
 */
#include "core/rings.h"
#include "shm/ring.h"
#include "testutil.h"

START_TEST(sizes_match_the_descriptors) {
    struct rings_geometry g = {1000, 3, 64, DESC_DTYPE_BF16};
    ck_assert_uint_eq(rings_payload_bytes(DESC_KIND_BATCH, &g), desc_batch_max_payload_bytes(1000));
    ck_assert_uint_eq(rings_payload_bytes(DESC_KIND_HIDDEN, &g), desc_hidden_max_payload_bytes(1000, 3, 64, DESC_DTYPE_BF16));
    ck_assert_uint_eq(rings_payload_bytes(DESC_KIND_FEATURES, &g),
                      desc_features_max_payload_bytes(1000, 3, 64, DESC_DTYPE_BF16));
    ck_assert_uint_eq(rings_payload_bytes((enum desc_kind)99, &g), 0);
    ck_assert_uint_eq(rings_desc_bytes(DESC_KIND_HIDDEN, &g), DESC_MAX_BYTES);
    uint32_t d = rings_desc_bytes(DESC_KIND_BATCH, &g);
    ck_assert_uint_gt(d, 16);
    ck_assert_uint_le(d, DESC_MAX_BYTES);
    ck_assert_str_eq(RING_NAME_BATCHES, "batches");
    ck_assert_str_eq(RING_NAME_HIDDEN, "hidden");
    ck_assert_str_eq(RING_NAME_FEATURES, "features");
}
END_TEST

START_TEST(spec_line_parses_back) {
    struct rings_geometry g = {512, 2, 32, DESC_DTYPE_F32};
    char line[256], err[256];
    ck_assert_int_eq(rings_format_spec(line, sizeof line, "hidden", 4, DESC_KIND_HIDDEN, &g, -1, err, sizeof err), 0);
    char want[256];
    snprintf(want, sizeof want, "hidden:slots=4,bytes=%llu,desc=%u,dev=host",
             (unsigned long long)desc_hidden_max_payload_bytes(512, 2, 32, DESC_DTYPE_F32), DESC_MAX_BYTES);
    ck_assert_str_eq(line, want);
    struct ring_spec s[2];
    int n = 0;
    ck_assert_int_eq(ring_parse_specs(line, s, 2, &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_uint_eq(s[0].payload_bytes, desc_hidden_max_payload_bytes(512, 2, 32, DESC_DTYPE_F32));
    ck_assert_int_eq(s[0].device, -1);
    ck_assert_int_eq(rings_format_spec(line, sizeof line, "hidden", 2, DESC_KIND_HIDDEN, &g, 1, err, sizeof err), 0);
    ck_assert_msg(strstr(line, ",dev=cuda:1") != NULL, "%s", line);
    ck_assert_int_eq(rings_format_spec(line, sizeof line, "x", 0, DESC_KIND_BATCH, &g, -1, err, sizeof err), -1);
    ck_assert_str_eq(err, "ring 'x': slots must be at least 1");
    ck_assert_int_eq(rings_format_spec(line, 10, "x", 1, DESC_KIND_BATCH, &g, -1, err, sizeof err), -1);
    ck_assert_str_eq(err, "ring 'x': spec line does not fit 10 bytes");
    ck_assert_int_eq(rings_format_spec(line, sizeof line, "x", 1, (enum desc_kind)7, &g, -1, err, sizeof err), -1);
    ck_assert_str_eq(err, "ring 'x': unknown descriptor kind 7");
}
END_TEST

START_TEST(budget_check_says_expected_and_found) {
    char err[256];
    ck_assert_int_eq(rings_check_budget(3, 100, 256, 256, err, sizeof err), 0);
    ck_assert_int_eq(rings_check_budget(3, 100, 512, 256, err, sizeof err), -1);
    ck_assert_str_eq(err, "batch seq 3: 512 tokens, this stage planned memory for --tokens 256");
    ck_assert_int_eq(rings_check_budget(7, 300, 200, 256, err, sizeof err), -1);
    ck_assert_str_eq(err, "batch seq 7: 300 tokens, this stage planned memory for --tokens 256");
}
END_TEST

int main(void) {
    Suite *s = suite_create("rings");
    TCase *tc = tcase_create("rings");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, sizes_match_the_descriptors);
    tcase_add_test(tc, spec_line_parses_back);
    tcase_add_test(tc, budget_check_says_expected_and_found);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
