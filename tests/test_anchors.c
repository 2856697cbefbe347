/*
 * tests/test_anchors.c — anchor selection reference (kernels/anchors.h): count, sortedness, validity,
 * padding, reproducibility, and a uniformity sanity check over many steps.
 */
#include "kernels/anchors.h"
#include "testutil.h"

static int cand_count(const uint8_t *mask, int T, int B) {
    int n = 0;
    for (int p = 0; p < T - B; p++) n += mask[p] != 0;
    return n;
}

static void check_anchors(const uint8_t *mask, int T, int B, int N, uint64_t seed, uint64_t step) {
    int32_t a[600];
    uint8_t valid[600];
    char err[256];
    ck_assert_int_le(N, 600);
    int K = anchors_forward_ref(mask, T, B, N, seed, step, a, valid, err, sizeof err);
    int C = cand_count(mask, T, B);
    ck_assert_int_eq(K, C < N ? C : N);
    for (int i = 0; i < N; i++) {
        if (i < K) {
            ck_assert_int_eq(valid[i], 1);
            ck_assert_int_ge(a[i], 0);
            ck_assert_int_lt(a[i], T - B);
            ck_assert_msg(mask[a[i]] != 0, "anchor %d at %d is not supervised", i, a[i]);
            if (i > 0) ck_assert_int_lt(a[i - 1], a[i]);   /* sorted and distinct */
        } else {
            ck_assert_int_eq(valid[i], 0);
            ck_assert_int_eq(a[i], 0);
        }
    }
}

START_TEST(anchors_count_sorted_valid) {
    uint64_t rng = 11;
    int Ts[] = {97, 1, 17, 1025, 8192};
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
        int T = Ts[ti];
        uint8_t *mask = malloc((size_t)T);
        for (int p = 0; p < T; p++) mask[p] = (test_rng_next(&rng) % 10) < 7;
        int Ns[] = {1, 5, 16, 512};
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++) check_anchors(mask, T, 16, Ns[ni], 42, ti * 7 + ni);
        free(mask);
    }
}
END_TEST

START_TEST(anchors_all_candidates_taken_and_none) {
    uint8_t mask[40];
    memset(mask, 1, sizeof mask);
    int32_t a[64];
    uint8_t valid[64];
    char err[256];
    /* N larger than the candidate count: every candidate 0..T-B-1 is taken, in order */
    ck_assert_int_eq(anchors_forward_ref(mask, 40, 8, 64, 1, 2, a, valid, err, sizeof err), 32);
    for (int i = 0; i < 32; i++) ck_assert_int_eq(a[i], i);
    for (int i = 32; i < 64; i++) ck_assert(a[i] == 0 && valid[i] == 0);
    /* the last B positions are never candidates, even when supervised */
    memset(mask, 0, sizeof mask);
    for (int p = 32; p < 40; p++) mask[p] = 1;
    ck_assert_int_eq(anchors_forward_ref(mask, 40, 8, 4, 1, 2, a, valid, err, sizeof err), 0);
    for (int i = 0; i < 4; i++) ck_assert(a[i] == 0 && valid[i] == 0);
    ck_assert_int_eq(anchors_forward_ref(mask, 0, 8, 4, 1, 2, a, valid, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "T=0"));
}
END_TEST

START_TEST(anchors_reproducible) {
    uint8_t mask[300];
    for (int p = 0; p < 300; p++) mask[p] = p % 3 != 0;
    int32_t a1[20], a2[20], a3[20];
    uint8_t v[20];
    char err[256];
    anchors_forward_ref(mask, 300, 16, 20, 42, 7, a1, v, err, sizeof err);
    anchors_forward_ref(mask, 300, 16, 20, 42, 7, a2, v, err, sizeof err);
    ck_assert_mem_eq(a1, a2, sizeof a1);
    anchors_forward_ref(mask, 300, 16, 20, 42, 8, a3, v, err, sizeof err);
    ck_assert_msg(memcmp(a1, a3, sizeof a1) != 0, "a new step must draw new anchors");
    anchors_forward_ref(mask, 300, 16, 20, 43, 7, a3, v, err, sizeof err);
    ck_assert_msg(memcmp(a1, a3, sizeof a1) != 0, "a new seed must draw new anchors");
}
END_TEST

/* 32 candidates, 4 drawn per step, 8000 steps: each position is expected 1000 times with standard
 * deviation sqrt(8000·(1/8)·(7/8)) ≈ 29.6; allow 6 sigma per position, and a chi-square over the 32
 * positions below 80 (31 degrees of freedom: P(chi2 > 80) < 1e-5). Pairs: positions 0 and 1 together
 * are expected 8000·(4·3)/(32·31) ≈ 96.8 times (catches a sampler that is uniform per position but
 * correlated). */
START_TEST(anchors_uniform) {
    uint8_t mask[40];
    memset(mask, 1, sizeof mask);
    int count[32] = {0}, both = 0;
    int32_t a[4];
    uint8_t v[4];
    char err[256];
    for (int step = 0; step < 8000; step++) {
        ck_assert_int_eq(anchors_forward_ref(mask, 40, 8, 4, 42, (uint64_t)step, a, v, err, sizeof err), 4);
        int has0 = 0, has1 = 0;
        for (int i = 0; i < 4; i++) {
            count[a[i]]++;
            has0 |= a[i] == 0;
            has1 |= a[i] == 1;
        }
        both += has0 && has1;
    }
    double chi2 = 0;
    for (int p = 0; p < 32; p++) {
        ck_assert_msg(abs(count[p] - 1000) < 6 * 30, "position %d drawn %d times, expected ~1000", p, count[p]);
        chi2 += (count[p] - 1000.0) * (count[p] - 1000.0) / 1000.0;
    }
    ck_assert_msg(chi2 < 80, "chi2 %.1f over 31 dof", chi2);
    ck_assert_msg(abs(both - 97) < 6 * 10, "pair (0,1) drawn together %d times, expected ~97", both);
}
END_TEST

int main(void) {
    Suite *s = suite_create("anchors");
    TCase *tc = tcase_create("ref");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, anchors_count_sorted_valid);
    tcase_add_test(tc, anchors_all_candidates_taken_and_none);
    tcase_add_test(tc, anchors_reproducible);
    tcase_add_test(tc, anchors_uniform);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
