/*
 * tests/test_attention.c — the causal varlen GQA attention reference (kernels/attention.h) against
 * an independent dense computation: a full [T,T] visibility mask built from per-token document ids
 * (same document and key <= query), softmax in double. Documents of length 1, 5, 0 (empty), 17,
 * 64 and 97, padding rows after the last document (must stay untouched), GQA/MQA/MHA head ratios,
 * lse, and the cu_seqlens validation sentences.
 */
#include "kernels/attention.h"
#include "testutil.h"

static void dense(float *out, float *lse, const float *q, const float *k, const float *v, const int32_t *cu, int ND,
                  int T, int NH, int NKV, int HD, float scale) {
    int *doc = malloc(sizeof(int) * T);
    double *p = malloc(sizeof(double) * T);
    for (int t = 0; t < T; t++) doc[t] = -1;
    for (int d = 0; d < ND; d++)
        for (int t = cu[d]; t < cu[d + 1]; t++) doc[t] = d;
    for (int h = 0; h < NH; h++) {
        int kh = h * NKV / NH;   /* = h / (NH/NKV) */
        for (int t = 0; t < T; t++) {
            if (doc[t] < 0) continue;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < T; j++) {
                int vis = doc[j] == doc[t] && j <= t;
                if (!vis) { p[j] = -INFINITY; continue; }
                double s = 0;
                for (int c = 0; c < HD; c++) s += (double)q[((size_t)t * NH + h) * HD + c] * k[((size_t)j * NKV + kh) * HD + c];
                p[j] = s * scale;
                if (p[j] > m) m = p[j];
            }
            for (int j = 0; j < T; j++) { p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - m); sum += p[j]; }
            for (int c = 0; c < HD; c++) {
                double o = 0;
                for (int j = 0; j < T; j++) o += p[j] * v[((size_t)j * NKV + kh) * HD + c];
                out[((size_t)t * NH + h) * HD + c] = (float)(o / sum);
            }
            lse[(size_t)h * T + t] = (float)(m + log(sum));
        }
    }
    free(doc);
    free(p);
}

static void run_case(int NH, int NKV, int HD, uint64_t seed) {
    const int32_t cu[] = {0, 1, 6, 6, 23, 87, 184};
    const int ND = 6, T = 190;
    size_t nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *o = malloc(nq * 4), *od = malloc(nq * 4);
    float *lse = malloc((size_t)NH * T * 4), *lsed = malloc((size_t)NH * T * 4);
    test_rng_fill(&seed, q, nq, -2, 2);
    test_rng_fill(&seed, k, nk, -2, 2);
    test_rng_fill(&seed, v, nk, -1, 1);
    for (size_t i = 0; i < nq; i++) o[i] = od[i] = 12345.0f;   /* padding rows must keep this */
    for (size_t i = 0; i < (size_t)NH * T; i++) lse[i] = lsed[i] = 12345.0f;
    float scale = 1.0f / sqrtf((float)HD);
    ck_assert_int_eq(attention_forward_ref(o, lse, q, k, v, cu, ND, T, NH, NKV, HD, scale), 0);
    dense(od, lsed, q, k, v, cu, ND, T, NH, NKV, HD, scale);
    ck_assert(test_allclose("attention out", o, od, nq, 1e-6, 1e-5));
    ck_assert(test_allclose("attention lse", lse, lsed, (size_t)NH * T, 1e-6, 1e-6));
    ck_assert_float_eq(o[(size_t)185 * NH * HD], 12345.0f);
    /* a length-1 document attends only to itself: out = v */
    for (int h = 0; h < NH; h++)
        for (int c = 0; c < HD; c++) ck_assert_float_eq_tol(o[(size_t)h * HD + c], v[(size_t)(h * NKV / NH) * HD + c], 1e-6);
    free(q); free(k); free(v); free(o); free(od); free(lse); free(lsed);
}

START_TEST(attention_matches_dense) {
    run_case(4, 2, 16, 1);   /* GQA */
    run_case(3, 1, 8, 2);    /* MQA */
    run_case(2, 2, 24, 3);   /* MHA, odd head dim */
}
END_TEST

START_TEST(attention_cu_seqlens_validation) {
    int mx = -1;
    int32_t good[] = {0, 3, 3, 10};
    ck_assert_int_eq(attention_check_cu_seqlens(good, 3, 12, &mx), 0);
    ck_assert_int_eq(mx, 7);
    int32_t nz[] = {1, 3};
    ck_assert_int_eq(attention_check_cu_seqlens(nz, 1, 12, NULL), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "cu_seqlens[0] must be 0"));
    int32_t dec[] = {0, 5, 4};
    ck_assert_int_eq(attention_check_cu_seqlens(dec, 2, 12, NULL), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "non-decreasing"));
    int32_t big[] = {0, 13};
    ck_assert_int_eq(attention_check_cu_seqlens(big, 1, 12, NULL), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "exceeds T=12"));
    float x[4] = {0};
    ck_assert_int_eq(attention_forward_ref(x, NULL, x, x, x, good, 3, 12, 3, 2, 1, 1.0f), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of NKV"));
}
END_TEST

/* The shape gate of the GPU attention (host only): the head dims its kernels take, one line otherwise. */
START_TEST(attention_gpu_shapes) {
    char err[256];
    const int taken[5] = {16, 32, 64, 128, 256};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(attention_shape_supported(24, 4, taken[i], err, sizeof err), 0);
    const int refused[5] = {8, 48, 80, 96, 512};
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(attention_shape_supported(8, 2, refused[i], err, sizeof err), -1);
        char want[16];
        snprintf(want, sizeof want, "HD=%d", refused[i]);
        ck_assert_msg(strstr(err, want) && strstr(err, "16, 32, 64, 128 or 256") && !strchr(err, '\n'), "%s", err);
    }
    ck_assert_int_eq(attention_shape_supported(6, 4, 128, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "6 / num_kv_heads 4"), "%s", err);
    ck_assert_int_eq(attention_shape_supported(0, 1, 128, err, sizeof err), -1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("attention");
    TCase *tc = tcase_create("attention");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, attention_matches_dense);
    tcase_add_test(tc, attention_cu_seqlens_validation);
    tcase_add_test(tc, attention_gpu_shapes);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
