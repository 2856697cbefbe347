/*
 * tests/test_cpu_ops.c — the fast CPU ops of the trainer (stages/train/cpu_ops.h) against the kernels/<op>_ref.c
 * references: the BLAS linear layers (forward, dx, dw) against gemm_ref, the fused LM head + loss against the three
 * lmhead references in every loss/weighting/mode combination, block attention forward and backward against
 * block_attn_ref; and for each, bitwise the same result on 1 and 3 threads (chunks depend on the shapes only). The
 * row-wise ops (rmsnorm, swiglu, rope on row chunks) must equal their references bit for bit.
 *
 * Tolerances: the references accumulate in double, the fast ops in fp32 (OpenBLAS SGEMM, fp32 dot products), so
 * the error of a K-term dot product is a few fp32 ulps times sqrt(K) times the typical term: we bound each element
 * by atol + rtol·|ref| with rtol 1e-5 and atol 2e-6·sqrt(K)·(scale of the terms), far above what fp32 summation
 * produces (measured max errors are printed) and far below any indexing or semantics bug (errors of order 1).
 */
#include "testutil.h"

#include "kernels/block_attn.h"
#include "kernels/gemm.h"
#include "kernels/lmhead_loss.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "train/cpu_ops.h"

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || isnan(d)) m = d;
    }
    return m;
}

/* ---------------------------------------------------------------- linear */

static void check_linear(int M, int N, int K, uint64_t seed) {
    uint64_t rng = seed;
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *dy = malloc(sizeof(float) * M * N);
    float *y = malloc(sizeof(float) * M * N), *yr = malloc(sizeof(float) * M * N), *y3 = malloc(sizeof(float) * M * N);
    float *dx = malloc(sizeof(float) * M * K), *dxr = malloc(sizeof(float) * M * K), *dx3 = malloc(sizeof(float) * M * K);
    float *dw = malloc(sizeof(float) * N * K), *dwr = malloc(sizeof(float) * N * K), *dw3 = malloc(sizeof(float) * N * K);
    test_rng_fill(&rng, x, (size_t)M * K, -1, 1);
    test_rng_fill(&rng, w, (size_t)N * K, -1, 1);
    test_rng_fill(&rng, dy, (size_t)M * N, -1, 1);
    char what[96];

    cpu_ops_linear_forward(2, y, x, w, M, N, K);
    cpu_ops_linear_forward(3, y3, x, w, M, N, K);
    gemm_linear_forward_ref(yr, x, w, NULL, M, N, K);
    snprintf(what, sizeof what, "linear forward %dx%dx%d", M, N, K);
    ck_assert(test_allclose(what, y, yr, (size_t)M * N, 2e-6 * sqrt(K), 1e-5));
    ck_assert_msg(!memcmp(y, y3, sizeof(float) * M * N), "%s: 2 and 3 threads differ", what);

    for (int acc = 0; acc < 2; acc++) {   /* dx = and += (start from a non-zero dx) */
        test_rng_fill(&rng, dx, (size_t)M * K, -1, 1);
        memcpy(dxr, dx, sizeof(float) * M * K);
        memcpy(dx3, dx, sizeof(float) * M * K);
        cpu_ops_linear_backward_dx(2, dx, dy, w, M, N, K, acc);
        cpu_ops_linear_backward_dx(3, dx3, dy, w, M, N, K, acc);
        gemm_linear_backward_ref(dxr, NULL, NULL, dy, x, w, M, N, K, acc);
        snprintf(what, sizeof what, "linear dx %dx%dx%d acc %d", M, N, K, acc);
        ck_assert(test_allclose(what, dx, dxr, (size_t)M * K, 2e-6 * sqrt(N) + 2e-7, 1e-5));
        ck_assert_msg(!memcmp(dx, dx3, sizeof(float) * M * K), "%s: 2 and 3 threads differ", what);
    }
    test_rng_fill(&rng, dw, (size_t)N * K, -1, 1);   /* dw += */
    memcpy(dwr, dw, sizeof(float) * N * K);
    memcpy(dw3, dw, sizeof(float) * N * K);
    cpu_ops_linear_backward_dw(2, dw, dy, x, M, N, K);
    cpu_ops_linear_backward_dw(3, dw3, dy, x, M, N, K);
    gemm_linear_backward_ref(NULL, dwr, NULL, dy, x, w, M, N, K, 1);
    snprintf(what, sizeof what, "linear dw %dx%dx%d", M, N, K);
    ck_assert(test_allclose(what, dw, dwr, (size_t)N * K, 2e-6 * sqrt(M) + 2e-7, 1e-5));
    ck_assert_msg(!memcmp(dw, dw3, sizeof(float) * N * K), "%s: 2 and 3 threads differ", what);
    fprintf(stderr, "linear %dx%dx%d: max abs err forward %.3g dw %.3g\n", M, N, K, max_abs_diff(y, yr, (size_t)M * N),
            max_abs_diff(dw, dwr, (size_t)N * K));
    free(x); free(w); free(dy); free(y); free(yr); free(y3); free(dx); free(dxr); free(dx3);
    free(dw); free(dwr); free(dw3);
}

START_TEST(cpu_ops_linear) {
    check_linear(1, 1, 1, 1);
    check_linear(97, 33, 70, 2);      /* tails of every chunk size */
    check_linear(16, 130, 5, 3);
    check_linear(600, 130, 128, 4);
    check_linear(1025, 64, 256, 5);   /* the trainer's context projections */
}
END_TEST

/* ---------------------------------------------------------------- LM head + loss */

struct lmcase {
    int loss, weighting, sample_from_anchor;
    int T, budget, N, B, D, V;
};

static void check_lmhead(const struct lmcase *k, uint64_t seed) {
    lmhead_loss_config c = {k->T, k->N, k->B, k->D, k->V, k->loss, k->weighting, 4.0f, 0.5f, 1e-6f};
    lmhead_loss_mode md = {k->budget, k->sample_from_anchor};
    int R = k->N * k->B, T = k->T, D = k->D, V = k->V, B = k->B;
    uint64_t rng = seed;
    float *xn = malloc(sizeof(float) * R * D), *lm = malloc(sizeof(float) * V * D), *vlm = malloc(sizeof(float) * V * D);
    float *last = malloc(sizeof(float) * T * D), vn[256];
    test_rng_fill(&rng, xn, (size_t)R * D, -1, 1);
    test_rng_fill(&rng, lm, (size_t)V * D, -0.5f, 0.5f);
    test_rng_fill(&rng, vlm, (size_t)V * D, -0.5f, 0.5f);
    test_rng_fill(&rng, last, (size_t)T * D, -2, 2);
    test_rng_fill(&rng, vn, (size_t)D, 0.5f, 1.5f);
    uint8_t *mask = malloc((size_t)T), valid[512];
    int32_t anchors[512];
    for (int p = 0; p < T; p++) mask[p] = test_rng_next(&rng) % 4 != 0;
    int lim = k->budget > T ? k->budget : T;
    for (int b = 0; b < k->N; b++) {
        valid[b] = b % 5 != 4;   /* some padding anchors */
        anchors[b] = valid[b] ? (int32_t)(test_rng_next(&rng) % (uint64_t)(lim - B + 1)) : 0;
        if (anchors[b] >= T) anchors[b] = T - 1;
    }
    anchors[0] = 0;                 /* src = -1 wraps to T - 1 */
    anchors[1] = lim - B < T - 1 ? lim - B : T - 1;   /* a block running past T when budget > T */
    valid[0] = valid[1] = 1;
    float loss_r, loss_f, loss_3;
    float *rl_r = calloc(R, 4), *rw_r = calloc(R, 4), *rl_f = calloc(R, 4), *rw_f = calloc(R, 4);
    float *dx_r = calloc((size_t)R * D, 4), *dx_f = calloc((size_t)R * D, 4), *dx_3 = calloc((size_t)R * D, 4);
    int32_t cor_r[64], tot_r[64], cor_f[64], tot_f[64], *pr_r = calloc(R, 4), *tg_r = calloc(R, 4);
    int32_t *pr_f = calloc(R, 4), *tg_f = calloc(R, 4);
    uint8_t *mk_r = calloc(R, 1), *mk_f = calloc(R, 1);
    char err[256];
    ck_assert_msg(lmhead_loss_forward_mode_ref(&c, &md, xn, lm, vlm, vn, last, anchors, valid, mask, 0, &loss_r, rl_r,
                                               rw_r, cor_r, tot_r, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(lmhead_argmax_ref(&c, &md, xn, lm, vlm, vn, last, anchors, valid, mask, 0, pr_r, tg_r, mk_r, err,
                                    sizeof err) == 0, "%s", err);
    ck_assert_msg(lmhead_loss_backward_mode_ref(&c, &md, xn, lm, vlm, vn, last, anchors, valid, mask, 0, rw_r, dx_r,
                                                err, sizeof err) == 0, "%s", err);
    float *ws = malloc(sizeof(float) * (size_t)cpu_ops_lmhead_ws_floats(&c, 3));
    ck_assert_msg(cpu_ops_lmhead_loss(2, &c, &md, xn, lm, vlm, vn, last, anchors, valid, mask, ws, &loss_f, rl_f, rw_f,
                                      cor_f, tot_f, pr_f, tg_f, mk_f, dx_f, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(fabs(loss_f - loss_r) <= 1e-5 * fabs(loss_r) + 1e-6, "loss %.9g, ref %.9g", loss_f, loss_r);
    ck_assert(V == 1 || loss_r > 0.1);   /* V = 1: every loss and gradient is 0 */
    int supervised = 0;
    for (int s = 0; s < R; s++) {
        ck_assert_msg(mk_f[s] == mk_r[s] && pr_f[s] == pr_r[s] && tg_f[s] == tg_r[s],
                      "row %d: mask/pred/tgt %d/%d/%d, ref %d/%d/%d", s, mk_f[s], pr_f[s], tg_f[s], mk_r[s], pr_r[s],
                      tg_r[s]);
        supervised += mk_r[s];
    }
    ck_assert_int_gt(supervised, 0);
    ck_assert(!memcmp(cor_f, cor_r, sizeof(int32_t) * B) && !memcmp(tot_f, tot_r, sizeof(int32_t) * B));
    ck_assert(test_allclose("row_loss", rl_f, rl_r, (size_t)R, 1e-5, 1e-5));
    ck_assert(test_allclose("row_weight", rw_f, rw_r, (size_t)R, 1e-6, 1e-5));
    double dscale = 0;
    for (size_t i = 0; i < (size_t)R * D; i++) if (fabs(dx_r[i]) > dscale) dscale = fabs(dx_r[i]);
    ck_assert(V == 1 || dscale > 0);
    ck_assert(test_allclose("dxn", dx_f, dx_r, (size_t)R * D, 1e-5 * dscale, 1e-4));
    /* bitwise the same on 3 threads; no dxn: the forward outputs are unchanged */
    ck_assert(cpu_ops_lmhead_loss(3, &c, &md, xn, lm, vlm, vn, last, anchors, valid, mask, ws, &loss_3, rl_r, rw_r,
                                  cor_r, tot_r, pr_r, tg_r, mk_r, dx_3, err, sizeof err) == 0);
    ck_assert(loss_3 == loss_f && !memcmp(dx_3, dx_f, sizeof(float) * R * D) && !memcmp(rl_r, rl_f, 4 * (size_t)R));
    ck_assert(cpu_ops_lmhead_loss(1, &c, &md, xn, lm, vlm, vn, last, anchors, valid, mask, ws, &loss_3, rl_r, rw_r,
                                  cor_r, tot_r, pr_r, tg_r, mk_r, NULL, err, sizeof err) == 0);
    ck_assert(loss_3 == loss_f && !memcmp(rw_r, rw_f, 4 * (size_t)R) && !memcmp(pr_r, pr_f, 4 * (size_t)R));
    fprintf(stderr, "lmhead loss %d weighting %d sfa %d R %d V %d: loss %.7f (ref %.7f), max dxn err %.3g of %.3g\n",
            k->loss, k->weighting, k->sample_from_anchor, R, V, loss_f, loss_r, max_abs_diff(dx_f, dx_r, (size_t)R * D),
            dscale);
    free(xn); free(lm); free(vlm); free(last); free(mask); free(rl_r); free(rw_r); free(rl_f); free(rw_f);
    free(dx_r); free(dx_f); free(dx_3); free(pr_r); free(tg_r); free(pr_f); free(tg_f); free(mk_r); free(mk_f); free(ws);
}

START_TEST(cpu_ops_lmhead) {
    struct lmcase cases[] = {
        {LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 0, 40, 44, 6, 4, 24, 97},
        {LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 0, 40, 40, 7, 4, 24, 97},
        {LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 1, 40, 48, 6, 8, 16, 50},
        {LMHEAD_LOSS_CE, LMHEAD_WEIGHT_NONE, 1, 33, 33, 5, 3, 9, 1},      /* V = 1 */
        {LMHEAD_LOSS_CE, LMHEAD_WEIGHT_EXP_DECAY, 0, 300, 300, 20, 16, 64, 1000},   /* several chunks per thread */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_lmhead(&cases[i], 100 + i);
}
END_TEST

/* ---------------------------------------------------------------- block attention */

static void check_attn(int n_h, int n_kv, int d_h, int window, int causal, uint64_t seed) {
    int T = 40, N = 7, B = 4, R = N * B, KV = T + R;
    block_attn_config c = {T, N, B, n_h, n_kv, d_h, window, causal, 1.0f / sqrtf((float)d_h)};
    uint64_t rng = seed;
    size_t nq = (size_t)R * n_h * d_h, nk = (size_t)KV * n_kv * d_h;
    float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk), *dout = malloc(4 * nq);
    float *o_r = malloc(4 * nq), *o_f = malloc(4 * nq), *l_r = malloc(4 * (size_t)R * n_h), *l_f = malloc(4 * (size_t)R * n_h);
    float *dq_r = malloc(4 * nq), *dq_f = malloc(4 * nq), *dk_r = malloc(4 * nk), *dk_f = malloc(4 * nk);
    float *dv_r = malloc(4 * nk), *dv_f = malloc(4 * nk), *dq_3 = malloc(4 * nq), *dk_3 = malloc(4 * nk), *dv_3 = malloc(4 * nk);
    test_rng_fill(&rng, q, nq, -1.5f, 1.5f);
    test_rng_fill(&rng, k, nk, -1.5f, 1.5f);
    test_rng_fill(&rng, v, nk, -1, 1);
    test_rng_fill(&rng, dout, nq, -1, 1);
    int32_t doc[40], anchors[7] = {0, 3, 11, 14, 25, 39, 0};
    for (int p = 0; p < T; p++) doc[p] = p >= 36 ? -1 : p >= 22 ? 2 : p >= 12 ? 1 : 0;   /* padding at the end */
    char err[256];
    ck_assert(block_attn_forward_ref(&c, q, k, v, anchors, doc, 0, o_r, l_r, err, sizeof err) == 0);
    ck_assert_msg(cpu_ops_block_attn_forward(2, &c, q, k, v, anchors, doc, o_f, l_f, err, sizeof err) == 0, "%s", err);
    ck_assert(test_allclose("attn out", o_f, o_r, nq, 1e-6, 1e-5));
    ck_assert(test_allclose("attn lse", l_f, l_r, (size_t)R * n_h, 1e-6, 1e-6));
    ck_assert(block_attn_backward_ref(&c, q, k, v, anchors, doc, o_r, dout, l_r, dq_r, dk_r, dv_r, err, sizeof err) == 0);
    ck_assert_msg(cpu_ops_block_attn_backward(2, &c, q, k, v, anchors, doc, o_r, dout, l_r, dq_f, dk_f, dv_f, err,
                                              sizeof err) == 0, "%s", err);
    ck_assert(test_allclose("attn dq", dq_f, dq_r, nq, 1e-5, 1e-4));
    ck_assert(test_allclose("attn dk", dk_f, dk_r, nk, 1e-5, 1e-4));
    ck_assert(test_allclose("attn dv", dv_f, dv_r, nk, 1e-5, 1e-4));
    ck_assert(cpu_ops_block_attn_backward(3, &c, q, k, v, anchors, doc, o_r, dout, l_r, dq_3, dk_3, dv_3, err,
                                          sizeof err) == 0);
    ck_assert(!memcmp(dq_3, dq_f, 4 * nq) && !memcmp(dk_3, dk_f, 4 * nk) && !memcmp(dv_3, dv_f, 4 * nk));
    ck_assert(cpu_ops_block_attn_forward(3, &c, q, k, v, anchors, doc, dq_3, l_r, err, sizeof err) == 0);
    ck_assert(!memcmp(dq_3, o_f, 4 * nq) && !memcmp(l_r, l_f, 4 * (size_t)R * n_h));
    free(q); free(k); free(v); free(dout); free(o_r); free(o_f); free(l_r); free(l_f); free(dq_r); free(dq_f);
    free(dk_r); free(dk_f); free(dv_r); free(dv_f); free(dq_3); free(dk_3); free(dv_3);
}

START_TEST(cpu_ops_block_attn) {
    check_attn(2, 1, 8, 0, 0, 1);
    check_attn(4, 2, 13, 5, 1, 2);    /* head dim with a tail, sliding causal */
    check_attn(4, 4, 32, 6, 0, 3);    /* sliding non-causal, no GQA */
    check_attn(1, 1, 1, 0, 1, 4);
    char err[256];
    block_attn_config bad = {10, 1, 4, 3, 2, 8, 0, 0, 1.0f};
    int32_t a[1] = {0}, doc[10] = {0};
    float x[1];
    ck_assert(cpu_ops_block_attn_forward(1, &bad, x, x, x, a, doc, x, x, err, sizeof err) == -1);
    ck_assert_msg(strstr(err, "multiple"), "%s", err);
}
END_TEST


/* ---------------------------------------------------------------- row-wise ops: bitwise the references */

START_TEST(cpu_ops_rows_bitwise) {
    int shapes[][2] = {{1, 1}, {2049, 32}, {517, 128}, {300, 385}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int N = shapes[si][0], C = shapes[si][1];
        size_t n = (size_t)N * C;
        uint64_t rng = 50 + si;
        float *x = malloc(4 * n), *dy = malloc(4 * n), *w = malloc(4 * (size_t)C), *y1 = malloc(4 * n),
              *y2 = malloc(4 * n), *r1 = malloc(4 * (size_t)N), *r2 = malloc(4 * (size_t)N), *d1 = malloc(4 * n),
              *d2 = malloc(4 * n), *dw1 = malloc(4 * (size_t)C), *dw2 = malloc(4 * (size_t)C);
        test_rng_fill(&rng, x, n, -2, 2);
        test_rng_fill(&rng, dy, n, -1, 1);
        test_rng_fill(&rng, w, (size_t)C, 0.5f, 1.5f);
        rmsnorm_forward_ref(y1, r1, x, w, N, C, 1e-6f);
        cpu_ops_rmsnorm_forward(3, y2, r2, x, w, N, C, 1e-6f);
        ck_assert(!memcmp(y1, y2, 4 * n) && !memcmp(r1, r2, 4 * (size_t)N));
        for (int acc = 0; acc < 2; acc++) {
            test_rng_fill(&rng, d1, n, -1, 1);
            memcpy(d2, d1, 4 * n);
            test_rng_fill(&rng, dw1, (size_t)C, -1, 1);
            memcpy(dw2, dw1, 4 * (size_t)C);
            rmsnorm_backward_ref(d1, dw1, dy, x, w, r1, N, C, acc);
            cpu_ops_rmsnorm_backward(3, d2, dw2, dy, x, w, r1, N, C, acc);
            ck_assert_msg(!memcmp(d1, d2, 4 * n) && !memcmp(dw1, dw2, 4 * (size_t)C), "rmsnorm backward %dx%d acc %d",
                          N, C, acc);
        }
        swiglu_forward_ref(y1, x, dy, N, C, C);
        cpu_ops_swiglu_forward(3, y2, x, dy, N, C);
        ck_assert(!memcmp(y1, y2, 4 * n));
        float *u1 = malloc(4 * n), *u2 = malloc(4 * n);   /* dout: the forward output */
        swiglu_backward_ref(d1, u1, y1, x, dy, N, C, C);
        cpu_ops_swiglu_backward(3, d2, u2, y1, x, dy, N, C);
        ck_assert(!memcmp(d1, d2, 4 * n) && !memcmp(u1, u2, 4 * n));
        free(u1);
        free(u2);
        if (C % 2 == 0) {   /* rope: rows of NH = 2 heads of C / 2 */
            int32_t *pos = malloc(4 * (size_t)N);
            float inv[512];
            for (int i = 0; i < N; i++) pos[i] = (int32_t)(test_rng_next(&rng) % 5000);
            for (int i = 0; i < C / 4; i++) inv[i] = powf(10000.0f, -4.0f * i / C);
            if (C >= 4) {
                memcpy(y1, x, 4 * n);
                memcpy(y2, x, 4 * n);
                rope_forward_ref(y1, NULL, pos, inv, N, 2, 0, C / 2);
                cpu_ops_rope_forward(3, y2, pos, inv, N, 2, C / 2);
                ck_assert(!memcmp(y1, y2, 4 * n));
                rope_backward_ref(y1, NULL, pos, inv, N, 2, 0, C / 2);
                cpu_ops_rope_backward(3, y2, pos, inv, N, 2, C / 2);
                ck_assert(!memcmp(y1, y2, 4 * n));
            }
            free(pos);
        }
        free(x); free(dy); free(w); free(y1); free(y2); free(r1); free(r2); free(d1); free(d2); free(dw1); free(dw2);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, cpu_ops_linear);
    tcase_add_test(tc, cpu_ops_lmhead);
    tcase_add_test(tc, cpu_ops_block_attn);
    tcase_add_test(tc, cpu_ops_rows_bitwise);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
