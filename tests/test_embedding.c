/*
 * tests/test_embedding.c — embedding gather reference (kernels/embedding.h): rows land where the
 * ids say (repeats, first and last row, a single token) and out-of-range ids fail with a sentence.
 */
#include "kernels/embedding.h"
#include "testutil.h"

START_TEST(embedding_gather) {
    enum { V = 11, C = 6, T = 7 };
    float table[V * C], out[T * C];
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) table[v * C + c] = (float)(v * 100 + c);
    int32_t ids[T] = {3, 0, 10, 3, 7, 7, 1};
    ck_assert_int_eq(embedding_forward_ref(out, ids, table, T, C, V), 0);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) ck_assert_float_eq(out[t * C + c], (float)(ids[t] * 100 + c));
    int32_t one = 10;
    ck_assert_int_eq(embedding_forward_ref(out, &one, table, 1, C, V), 0);
    ck_assert_float_eq(out[C - 1], 1005.0f);
    int32_t bad[2] = {2, 11};
    ck_assert_int_eq(embedding_forward_ref(out, bad, table, 2, C, V), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "id 11"));
    int32_t neg = -1;
    ck_assert_int_eq(embedding_forward_ref(out, &neg, table, 1, C, V), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("embedding");
    TCase *tc = tcase_create("embedding");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, embedding_gather);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
