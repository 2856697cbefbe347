/*
 * tests/gpu/test_attention.c — GPU causal varlen GQA attention (kernels/attention.h) against exact
 * double-precision attention on the same bf16-rounded q, k, v.
 *
 * Tolerance (style.md's rule for low-precision accumulation, as flash-attention tests it): a
 * baseline "in the kernel's precision" — exact scores, probabilities rounded to bf16 before the
 * P·V product, output rounded to bf16 — is also compared with the exact result, and the kernel's
 * max abs error must be at most 2× the baseline's (plus 1e-3 for the different rounding points of
 * an online softmax). lse is fp32 from fp32 scores of bf16 inputs: atol 2e-3, rtol 1e-4.
 * Shapes: documents of length 1, 5, 0 (empty), 17, 64, 97, 200, 1025 (tails of the 64-row tiles),
 * padding rows after the last document (must stay poisoned), 300 short documents, one long
 * document, HD 64 and 128, GQA 4:1 and 8:2, MQA; a production batch (8192 tokens, 32/8 heads,
 * HD 128, documents of 64–3000 tokens) checked on 3 heads; short documents packed with one long one
 * (the longest-first tile order of the default kernel leaves most grid slots of short documents
 * empty); an attention sink with scaled logits near 100 (an online max that falls below the true
 * one overflows there); documents whose lengths sit at the 64/128-row and 64/128-key tile edges.
 * The cases run on the library's one kernel (bench variant 34: the wgmma kernel, 128-row query tiles
 * of two 64-row warpgroups with a ping-pong issue order, 128-key tiles, staged stores, lazy
 * rescaling, longest-first tile order; so the lengths above also cover a last tile whose second
 * warpgroup has no rows, 1025, and one with a few, 97, 200). The variants that lost on the H200 are
 * bench-only (kernels/bench/attention_bench.cu, attention_variants.cuh); the bench validates each
 * of them against the CPU reference before timing it.
 * attention_gpu_other_head_dims runs the mma.sync kernel of the other head dims (kernels/attention_mma.cu:
 * HD 16, the demo's; 32; 256, Qwen3.5/3.6's gated attention) on documents of 1, 63, 64, 65 and 1000 tokens
 * (tails of its 64-row query tiles and 64/32-key tiles), padding rows, GQA 24:4 at HD 256, and an attention
 * sink at HD 256 (scaled logits ~144); attention_gpu_shape_supported checks the shape gate the stages call.
 */
#include "kernels/attention.h"
#include "k1util.h"

struct errs { double kernel, base, lse; };

/* Exact and baseline attention for query head h over all documents; accumulates max errors of the
 * GPU output `got` [T,NH,HD] and GPU lse [NH,T]. */
static void check_head(struct errs *e, const float *got, const float *glse, const float *q, const float *k,
                       const float *v, const int32_t *cu, int ND, int T, int NH, int NKV, int HD, int h, float scale) {
    int kh = h / (NH / NKV);
    double *s = malloc(sizeof(double) * (T + 1)), *o = malloc(sizeof(double) * HD), *ob = malloc(sizeof(double) * HD);
    for (int d = 0; d < ND; d++) {
        int s0 = cu[d], len = cu[d + 1] - s0;
        for (int i = 0; i < len; i++) {
            const float *qi = q + ((size_t)(s0 + i) * NH + h) * HD;
            double m = -INFINITY, l = 0;
            for (int j = 0; j <= i; j++) {
                const float *kj = k + ((size_t)(s0 + j) * NKV + kh) * HD;
                double acc = 0;
                for (int c = 0; c < HD; c++) acc += (double)qi[c] * kj[c];
                s[j] = acc * scale;
                if (s[j] > m) m = s[j];
            }
            for (int c = 0; c < HD; c++) o[c] = ob[c] = 0;
            for (int j = 0; j <= i; j++) {
                double p = exp(s[j] - m), pb = bf16_round((float)p);
                l += p;
                const float *vj = v + ((size_t)(s0 + j) * NKV + kh) * HD;
                for (int c = 0; c < HD; c++) { o[c] += p * vj[c]; ob[c] += pb * vj[c]; }
            }
            const float *gi = got + ((size_t)(s0 + i) * NH + h) * HD;
            for (int c = 0; c < HD; c++) {
                double exact = o[c] / l, base = bf16_round((float)(ob[c] / l));
                double ek = fabs(gi[c] - exact), eb = fabs(base - exact);
                if (!(ek <= e->kernel)) e->kernel = ek;   /* NaN propagates */
                if (eb > e->base) e->base = eb;
            }
            double lse = m + log(l), el = fabs(glse[(size_t)h * T + s0 + i] - lse) / (2e-3 + 1e-4 * fabs(lse));
            if (!(el <= e->lse)) e->lse = el;
        }
    }
    free(s); free(o); free(ob);
}

static int g_sink;   /* run(): attention-sink inputs with very large logits */

static void run(const int32_t *cu, int ND, int T, int NH, int NKV, int HD, const int *heads, int nheads, uint64_t seed) {
    size_t nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    float *q = k1_randn(&seed, nq, -1, 1), *k = k1_randn(&seed, nk, -1, 1), *v = k1_randn(&seed, nk, -1, 1);
    /* a few large-logit rows so the online max actually moves between tiles */
    for (size_t i = 0; i < nq; i += 97 * HD) q[i] *= 8;
    if (g_sink) {
        /* an attention sink: every query is 3s and each document's first key is 3s, so the first
         * key tile holds a scaled logit of 9·HD/sqrt(HD) (~102 at HD 128) and later tiles far
         * smaller ones; a running max that falls below the true one overflows exp here */
        for (size_t i = 0; i < nq; i++) q[i] = 3.0f;
        for (int d = 0; d < ND; d++)
            if (cu[d + 1] > cu[d])
                for (int c = 0; c < NKV * HD; c++) k[(size_t)cu[d] * NKV * HD + c] = 3.0f;
    }
    bf16 *d_q = k1_upload_bf16(q, nq), *d_k = k1_upload_bf16(k, nk), *d_v = k1_upload_bf16(v, nk);
    bf16 *d_o = k1_malloc(2 * nq);
    float *d_lse = k1_malloc(4 * (size_t)NH * T);
    int32_t *d_cu = k1_upload(cu, 4 * (size_t)(ND + 1));
    k1_poison(d_o, 2 * nq);
    k1_poison(d_lse, 4 * (size_t)NH * T);
    int max_seqlen = 0;
    ck_assert_int_eq(attention_check_cu_seqlens(cu, ND, T, &max_seqlen), 0);
    float scale = 1.0f / sqrtf((float)HD);
    K1_LAUNCH(attention_forward(d_o, d_lse, d_q, d_k, d_v, d_cu, ND, max_seqlen, T, NH, NKV, HD, scale, 0));
    K1_CUDA(cudaDeviceSynchronize());
    float *got = malloc(4 * nq), *glse = malloc(4 * (size_t)NH * T);
    k1_download_bf16(got, d_o, nq);
    K1_CUDA(cudaMemcpy(glse, d_lse, 4 * (size_t)NH * T, cudaMemcpyDeviceToHost));
    struct errs e = {0, 0, 0};
    for (int i = 0; i < nheads; i++) check_head(&e, got, glse, q, k, v, cu, ND, T, NH, NKV, HD, heads[i], scale);
    fprintf(stderr, "attention T=%d ND=%d NH=%d NKV=%d HD=%d: max err kernel %.3g, bf16 baseline %.3g, lse %.3g of tol\n",
            T, ND, NH, NKV, HD, e.kernel, e.base, e.lse);
    ck_assert_msg(e.kernel <= 2 * e.base + 1e-3, "kernel max err %.4g > 2 x baseline %.4g + 1e-3", e.kernel, e.base);
    ck_assert_msg(e.lse <= 1.0, "lse error %.3g of its tolerance", e.lse);
    /* rows after the last document are never written */
    for (size_t i = (size_t)cu[ND] * NH * HD; i < nq; i++) ck_assert_msg(isnan(got[i]), "padding row written at %zu", i);
    cudaFree(d_q); cudaFree(d_k); cudaFree(d_v); cudaFree(d_o); cudaFree(d_lse); cudaFree(d_cu);
    free(q); free(k); free(v); free(got); free(glse);
}

static const int all8[8] = {0, 1, 2, 3, 4, 5, 6, 7};

START_TEST(attention_gpu_awkward_docs) {
    const int32_t cu[] = {0, 1, 6, 6, 23, 87, 184, 384, 1409};
    run(cu, 8, 1412, 8, 2, 64, all8, 8, 1);
    run(cu, 8, 1412, 8, 2, 128, all8, 8, 2);
    run(cu, 8, 1409, 4, 1, 128, all8, 4, 3);   /* MQA, no padding */
}
END_TEST

START_TEST(attention_gpu_many_short_and_one_long) {
    int32_t cu[301];
    uint64_t seed = 5;
    cu[0] = 0;
    for (int d = 0; d < 300; d++) cu[d + 1] = cu[d] + 1 + (int)(test_rng_next(&seed) % 8);
    run(cu, 300, cu[300] + 5, 4, 2, 128, all8, 4, 4);
    const int32_t one[] = {0, 1000};
    run(one, 1, 1000, 2, 1, 64, all8, 2, 5);
    const int32_t single[] = {0, 1};
    run(single, 1, 1, 2, 2, 128, all8, 2, 6);
    /* 120 short documents around one of 1700 tokens, then 40 more: 14 query tiles of the long
     * document, one for each short one */
    int32_t mix[162];
    mix[0] = 0;
    for (int d = 0; d < 161; d++) mix[d + 1] = mix[d] + (d == 120 ? 1700 : 1 + (int)(test_rng_next(&seed) % 150));
    run(mix, 161, mix[161] + 3, 4, 2, 128, all8, 4, 8);
    run(mix, 161, mix[161], 4, 4, 64, all8, 4, 9);
}
END_TEST

START_TEST(attention_gpu_large_logits) {
    const int32_t cu[] = {0, 300, 301, 1000};
    g_sink = 1;
    run(cu, 3, 1000, 4, 2, 128, all8, 4, 11);
    run(cu, 3, 1000, 4, 2, 64, all8, 4, 12);
    g_sink = 0;
}
END_TEST

START_TEST(attention_gpu_production) {
    const int32_t lens[] = {1200, 64, 3000, 97, 1025, 2048, 310};   /* 7742 tokens, 450 rows of padding */
    int32_t cu[8];
    cu[0] = 0;
    for (int d = 0; d < 7; d++) cu[d + 1] = cu[d] + lens[d];
    const int heads[3] = {0, 13, 31};
    run(cu, 7, 8192, 32, 8, 128, heads, 3, 7);
}
END_TEST

START_TEST(attention_gpu_preconditions) {
    bf16 *x = k1_malloc(4096);
    int32_t *cu = k1_malloc(64);
    ck_assert_int_eq(attention_forward(x, NULL, x, x, x, cu, 1, 4, 4, 2, 2, 96, 0.1f, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "HD=96"));
    ck_assert_int_eq(attention_forward(x, NULL, x, x, x, cu, 1, 4, 4, 3, 2, 64, 0.1f, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of NKV"));
    cudaFree(x); cudaFree(cu);
}
END_TEST

/* Documents whose lengths sit at and around the 128-row tiles, 64-row warpgroups and 64/128-key
 * tiles: 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257 and 2049 tokens. */
static void run_tile_edges(void) {
    const int lens[13] = {63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 2049};
    int32_t cu[14];
    cu[0] = 0;
    for (int d = 0; d < 13; d++) cu[d + 1] = cu[d] + lens[d];
    run(cu, 13, cu[13] + 7, 4, 2, 128, all8, 4, 21);
    run(cu, 13, cu[13], 2, 1, 64, all8, 2, 22);
}

/* The mma.sync kernel of HD 16, 32 and 256 (kernels/attention_mma.cu) */
START_TEST(attention_gpu_other_head_dims) {
    const int32_t cu[] = {0, 1, 64, 127, 192, 1192, 1193};   /* documents of 1, 63, 63, 65, 1000, 1; 7 padding rows */
    const int32_t cu2[] = {0, 64, 65, 1065};                  /* 64, 1, 1000 */
    run(cu, 6, 1200, 4, 2, 16, all8, 4, 31);
    run(cu2, 3, 1065, 4, 1, 16, all8, 4, 32);
    run(cu, 6, 1200, 8, 2, 32, all8, 8, 33);
    run(cu, 6, 1200, 24, 4, 256, (const int[]){0, 5, 6, 11, 23}, 5, 34);   /* Qwen3.6-27B's head layout */
    run(cu2, 3, 1065, 2, 2, 256, all8, 2, 35);
    g_sink = 1;
    run(cu2, 3, 1065, 4, 2, 256, all8, 4, 36);
    g_sink = 0;
}
END_TEST

START_TEST(attention_gpu_shape_supported) {
    char err[256];
    const int ok_hd[5] = {16, 32, 64, 128, 256};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(attention_shape_supported(24, 4, ok_hd[i], err, sizeof err), 0);
    ck_assert_int_eq(attention_shape_supported(8, 2, 96, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "HD=96") && strstr(err, "16, 32, 64, 128 or 256"), "%s", err);
    ck_assert_int_eq(attention_shape_supported(6, 4, 128, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "multiple"), "%s", err);
    /* the launcher refuses the same shapes before any launch */
    bf16 *x = k1_malloc(4096);
    int32_t *cu = k1_malloc(64);
    ck_assert_int_eq(attention_forward(x, NULL, x, x, x, cu, 1, 4, 4, 2, 2, 48, 0.1f, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "HD=48"));
    cudaFree(x); cudaFree(cu);
}
END_TEST

/* The default (wgmma) kernel on the tile edges */
START_TEST(attention_gpu_tile_edges) { run_tile_edges(); }
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_attention");
    TCase *tc = tcase_create("gpu_attention");
    tcase_set_timeout(tc, 200);
    tcase_add_test(tc, attention_gpu_awkward_docs);
    tcase_add_test(tc, attention_gpu_large_logits);
    tcase_add_test(tc, attention_gpu_many_short_and_one_long);
    tcase_add_test(tc, attention_gpu_production);
    tcase_add_test(tc, attention_gpu_preconditions);
    tcase_add_test(tc, attention_gpu_tile_edges);
    tcase_add_test(tc, attention_gpu_other_head_dims);
    tcase_add_test(tc, attention_gpu_shape_supported);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
