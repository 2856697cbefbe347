/*
 * tests/test_hsgather.c — hidden-state concat/split reference (kernels/hsgather.h): the concat row
 * layout of design.md §6, a row index list, split as the inverse, and the error sentences.
 */
#include "kernels/hsgather.h"
#include "testutil.h"

START_TEST(hsgather_concat_split) {
    enum { L = 3, T = 5, C = 4 };
    bf16 a[L][T * C], cat[T * L * C], back[L][T * C];
    for (int l = 0; l < L; l++)
        for (int i = 0; i < T * C; i++) a[l][i] = (bf16)(l * 1000 + i);
    struct hs_parts p = {{a[0], a[1], a[2]}};
    ck_assert_int_eq(hsgather_concat_ref(cat, &p, NULL, L, T, T, C), 0);
    for (int t = 0; t < T; t++)
        for (int l = 0; l < L; l++)
            for (int c = 0; c < C; c++) ck_assert_uint_eq(cat[(t * L + l) * C + c], (bf16)(l * 1000 + t * C + c));
    struct hs_parts_out po = {{back[0], back[1], back[2]}};
    ck_assert_int_eq(hsgather_split_ref(&po, cat, L, T, C), 0);
    ck_assert(memcmp(back, a, sizeof a) == 0);

    int32_t rows[2] = {4, 0};
    bf16 sub[2 * L * C];
    ck_assert_int_eq(hsgather_concat_ref(sub, &p, rows, L, 2, T, C), 0);
    ck_assert(memcmp(sub, cat + 4 * L * C, sizeof(bf16) * L * C) == 0);
    ck_assert(memcmp(sub + L * C, cat, sizeof(bf16) * L * C) == 0);

    rows[1] = 5;
    ck_assert_int_eq(hsgather_concat_ref(sub, &p, rows, L, 2, T, C), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "rows[1] = 5"));
    ck_assert_int_eq(hsgather_concat_ref(sub, &p, NULL, 0, T, T, C), -1);
    ck_assert_int_eq(hsgather_split_ref(&po, cat, HSGATHER_MAX_PARTS + 1, T, C), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("hsgather");
    TCase *tc = tcase_create("hsgather");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, hsgather_concat_split);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
