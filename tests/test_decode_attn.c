/*
 * tests/test_decode_attn.c — the reference of kernels/decode_attn.h: S slots get their sequences through
 * decode_attn_append_ref in uneven steps (a prefill, single tokens, a block shared by two slots, a rewrite after a
 * rollback); every row's decode_attn_forward_ref is bitwise the full causal attention_forward_ref's row over its
 * slot's final sequence (the same loop, keys in order), with GQA (G 3) and a head dim that is not a power of two;
 * a bad slot or position is refused with a sentence.
 */
#include "kernels/attention.h"
#include "kernels/decode_attn.h"
#include "testutil.h"

enum { S = 3, ML = 40, NH = 6, NKV = 2, HD = 24 };

START_TEST(decode_attn_ref_equals_full_attention) {
    size_t row = (size_t)NKV * HD, qrow = (size_t)NH * HD;
    static float kc[S * ML * NKV * HD], vc[S * ML * NKV * HD];
    /* the final sequences' q, k, v per slot (lengths 33, 1, 17) */
    int len[S] = {33, 1, 17};
    static float q[S][ML * NH * HD], k[S][ML * NKV * HD], v[S][ML * NKV * HD];
    uint64_t seed = 7;
    for (int s = 0; s < S; s++) {
        test_rng_fill(&seed, q[s], (size_t)len[s] * qrow, -1, 1);
        test_rng_fill(&seed, k[s], (size_t)len[s] * row, -1, 1);
        test_rng_fill(&seed, v[s], (size_t)len[s] * row, -1, 1);
    }
    for (size_t i = 0; i < sizeof kc / sizeof kc[0]; i++) kc[i] = vc[i] = NAN;   /* unwritten rows must stay unread */
    float scale = 1.0f / sqrtf((float)HD);
    double scratch[ML + HD + 1];
    static float got[S][ML * NH * HD];
    /* steps: (slot, first position, count); slot 0 writes 20..24 twice (a rejected block rewritten) */
    struct { int slot[2], at[2], n[2], m; } steps[] = {
        {{0}, {0}, {20}, 1}, {{1}, {0}, {1}, 1}, {{0, 2}, {20, 0}, {5, 10}, 2},
        {{0, 2}, {20, 10}, {13, 7}, 2},
    };
    for (size_t st = 0; st < sizeof steps / sizeof steps[0]; st++) {
        static float qs[ML * 2 * NH * HD], ks[ML * 2 * NKV * HD], vs[ML * 2 * NKV * HD], out[ML * 2 * NH * HD];
        int32_t slot[2 * ML], pos[2 * ML];
        int T = 0;
        for (int i = 0; i < steps[st].m; i++) {
            int s = steps[st].slot[i];
            for (int j = 0; j < steps[st].n[i]; j++, T++) {
                int p = steps[st].at[i] + j;
                slot[T] = s;
                pos[T] = p;
                /* the first visit of slot 0's 20..24 writes other values: the rewrite must replace them */
                float junk = st == 2 && s == 0 ? 0.5f : 0.0f;
                for (size_t e = 0; e < qrow; e++) qs[T * qrow + e] = q[s][p * qrow + e];
                for (size_t e = 0; e < row; e++) {
                    ks[T * row + e] = k[s][p * row + e] + junk;
                    vs[T * row + e] = v[s][p * row + e] - junk;
                }
            }
        }
        ck_assert_int_eq(decode_attn_append_ref(kc, vc, ks, vs, slot, pos, T, S, ML, NKV, HD), 0);
        ck_assert_int_eq(decode_attn_forward_ref(out, qs, kc, vc, slot, pos, T, S, ML, NH, NKV, HD, scale, scratch), 0);
        for (int r = 0; r < T; r++) {
            for (size_t e = 0; e < qrow; e++) ck_assert_msg(!isnan(out[r * qrow + e]), "step %zu row %d NaN", st, r);
            memcpy(got[slot[r]] + pos[r] * qrow, out + r * qrow, sizeof(float) * qrow);
        }
    }
    for (int s = 0; s < S; s++) {
        static float ref[ML * NH * HD];
        int32_t cu[2] = {0, len[s]};
        ck_assert_int_eq(attention_forward_ref(ref, NULL, q[s], k[s], v[s], cu, 1, len[s], NH, NKV, HD, scale), 0);
        /* slot 0's rows 20..24 were first computed over junk keys (step 2), then again after their rewrite */
        for (int p = 0; p < len[s]; p++) {
            ck_assert_msg(!memcmp(got[s] + p * qrow, ref + p * qrow, sizeof(float) * qrow),
                          "slot %d row %d differs from the full attention", s, p);
        }
    }
    /* refused: a slot out of range, a position past the cache */
    int32_t bad_slot = S, zero = 0, bad_pos = ML;
    ck_assert_int_eq(decode_attn_append_ref(kc, vc, k[0], v[0], &bad_slot, &zero, 1, S, ML, NKV, HD), -1);
    ck_assert_msg(strstr(kernels_error(), "slot 3 of 3"), "%s", kernels_error());
    ck_assert_int_eq(decode_attn_forward_ref(got[0], q[0], kc, vc, &zero, &bad_pos, 1, S, ML, NH, NKV, HD, scale,
                                             scratch), -1);
    ck_assert_msg(strstr(kernels_error(), "position 40 outside"), "%s", kernels_error());
    ck_assert_int_eq(decode_attn_forward_ref(got[0], q[0], kc, vc, &zero, &zero, 1, S, ML, 5, NKV, HD, scale,
                                             scratch), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("decode_attn");
    TCase *tc = tcase_create("decode_attn");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, decode_attn_ref_equals_full_attention);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
