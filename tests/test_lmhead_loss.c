/*
 * tests/test_lmhead_loss.c — fused LM head + loss reference (kernels/lmhead_loss.h).
 *
 * Hand-built tiny cases whose logits are read off directly (lm_head rows are unit vectors), checked
 * against the formulas of dflash-reference.md §7 (KL, CE with first-index ties, exp-decay, D-PACE,
 * normalisation by the count of supervised slots) and §8 (per-position agreement, EAL); the backward
 * against central finite differences; vocabulary pruning against a softmax over the chosen ids.
 */
#include "kernels/lmhead_loss.h"
#include "testutil.h"

static double lse3(double a, double b, double c) {
    double m = fmax(a, fmax(b, c));
    return m + log(exp(a - m) + exp(b - m) + exp(c - m));
}

/* KL(P || Q) for 3 logits each, written out. */
static double kl3(const double *t, const double *z) {
    double lt = lse3(t[0], t[1], t[2]), lz = lse3(z[0], z[1], z[2]), s = 0;
    for (int v = 0; v < 3; v++) s += exp(t[v] - lt) * ((t[v] - lt) - (z[v] - lz));
    return s;
}

typedef struct {
    lmhead_loss_config c;
    float xn[6 * 2], head[3 * 2], w[2], last[8 * 2];
    int32_t anchors[2];
    uint8_t valid[2], mask[8];
} hand_case;

/* D=2, V=3, T=8, N=2, B=3, lm_head = vlm_head = [e0; e1; 0], vnorm_w = 1, eps = 0, so
 * z = (x0, x1, 0) and t = (y0, y1, 0)·sqrt(2)/|y|. Supervised slots: (0,1), (0,2), (1,1);
 * (1,2) has loss_mask 0 and slot 0 never counts. */
static void make_hand(hand_case *h, int loss, int weighting) {
    memset(h, 0, sizeof *h);
    lmhead_loss_config c = {8, 2, 3, 2, 3, loss, weighting, 4.0f, 0.5f, 0.0f};
    h->c = c;
    float head[6] = {1, 0, 0, 1, 0, 0};
    memcpy(h->head, head, sizeof head);
    h->w[0] = h->w[1] = 1;
    for (int p = 0; p < 8; p++) { h->last[2 * p] = 1; h->last[2 * p + 1] = 2; h->mask[p] = 1; }
    h->mask[6] = 0;
    h->last[2] = 1; h->last[3] = 1;   /* last[1] -> t = (1, 1, 0): a tie, argmax is 0 */
    h->last[4] = 2; h->last[5] = 0;   /* last[2] -> t = (√2, 0, 0) */
    h->last[8] = 0; h->last[9] = 3;   /* last[4] -> t = (0, √2, 0) */
    h->anchors[0] = 1; h->anchors[1] = 4;
    h->valid[0] = h->valid[1] = 1;
    float xn[12] = {9, 9, 0.5f, -0.5f, 1, 2, 9, 9, 0, 1, 9, 9};   /* 9s sit in unsupervised rows */
    memcpy(h->xn, xn, sizeof xn);
}

static double hand_z[3][3] = {{0.5, -0.5, 0}, {1, 2, 0}, {0, 1, 0}};
static const int hand_rows[3] = {1, 2, 4};   /* row index s = b·B + j of the supervised slots */

static void run_hand(hand_case *h, float *L, float *rl, float *rw, int32_t *cor, int32_t *tot) {
    char err[256];
    ck_assert_msg(lmhead_loss_forward_ref(&h->c, h->xn, h->head, h->head, h->w, h->last, h->anchors, h->valid,
                                          h->mask, 0, L, rl, rw, cor, tot, err, sizeof err) == 0, "%s", err);
}

START_TEST(lmhead_hand_ce_and_metrics) {
    hand_case h;
    make_hand(&h, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_NONE);
    float L, rl[6], rw[6];
    int32_t cor[3], tot[3];
    run_hand(&h, &L, rl, rw, cor, tot);
    /* CE = lse(z) - z[argmax t]; targets 0 (tie), 0, 1 */
    double l1 = lse3(0.5, -0.5, 0) - 0.5, l2 = lse3(1, 2, 0) - 1, l3 = lse3(0, 1, 0) - 1;
    ck_assert_double_eq_tol(rl[1], l1, 1e-6);
    ck_assert_double_eq_tol(rl[2], l2, 1e-6);
    ck_assert_double_eq_tol(rl[4], l3, 1e-6);
    ck_assert(rl[0] == 0 && rl[3] == 0 && rl[5] == 0);
    ck_assert(rw[0] == 0 && rw[1] == 1 && rw[2] == 1 && rw[3] == 0 && rw[4] == 1 && rw[5] == 0);
    ck_assert_double_eq_tol(L, (l1 + l2 + l3) / (3 + 1e-5), 1e-6);
    /* agreement: (0,1) pred 0 = tgt 0; (0,2) pred 1 != tgt 0; (1,1) pred 1 = tgt 1 */
    ck_assert(cor[0] == 0 && tot[0] == 0);
    ck_assert(cor[1] == 2 && tot[1] == 2);
    ck_assert(cor[2] == 0 && tot[2] == 1);
    ck_assert_double_eq_tol(lmhead_eal(cor, tot, 3), 1.0 + 1.0 * 0.0, 1e-12);
    int32_t c2[4] = {0, 3, 1, 0}, t2[4] = {0, 4, 2, 0};   /* total 0 counts as 1 */
    ck_assert_double_eq_tol(lmhead_eal(c2, t2, 4), 0.75 + 0.75 * 0.5 + 0.0, 1e-12);
}
END_TEST

START_TEST(lmhead_hand_kl) {
    hand_case h;
    make_hand(&h, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_NONE);
    float L, rl[6], rw[6];
    int32_t cor[3], tot[3];
    run_hand(&h, &L, rl, rw, cor, tot);
    double r2 = sqrt(2.0);
    double t[3][3] = {{1, 1, 0}, {r2, 0, 0}, {0, r2, 0}};
    double sum = 0;
    for (int i = 0; i < 3; i++) {
        double l = kl3(t[i], hand_z[i]);
        ck_assert_double_eq_tol(rl[hand_rows[i]], l, 1e-6);
        sum += l;
    }
    ck_assert_double_eq_tol(L, sum / (3 + 1e-5), 1e-6);
    ck_assert(cor[1] == 2 && tot[1] == 2 && cor[2] == 0 && tot[2] == 1);   /* metrics do not depend on the loss */
}
END_TEST

START_TEST(lmhead_hand_weights) {
    hand_case h;
    float L, rl[6], rw[6];
    int32_t cor[3], tot[3];
    double l[3] = {lse3(0.5, -0.5, 0) - 0.5, lse3(1, 2, 0) - 1, lse3(0, 1, 0) - 1};
    /* exp-decay γ = 4: w(1) = 1, w(2) = e^{-1/4} */
    make_hand(&h, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_EXP_DECAY);
    run_hand(&h, &L, rl, rw, cor, tot);
    ck_assert_double_eq_tol(rw[1], 1.0, 1e-7);
    ck_assert_double_eq_tol(rw[2], exp(-0.25), 1e-7);
    ck_assert_double_eq_tol(rw[4], 1.0, 1e-7);
    ck_assert(rw[0] == 0 && rw[5] == 0);
    ck_assert_double_eq_tol(L, (l[0] + exp(-0.25) * l[1] + l[2]) / (3 + 1e-5), 1e-6);
    /* D-PACE α = 0.5: block 0 m = (0,1,1): s = (1, .5c1+.5, .5c2+.5), w1 = P1 + P2, w2 = P2;
     * block 1 m = (0,1,0): w1 = P1 (the masked slot 2 adds nothing) */
    make_hand(&h, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE);
    run_hand(&h, &L, rl, rw, cor, tot);
    double s1 = 0.5 * exp(-l[0]) + 0.5, s2 = 0.5 * exp(-l[1]) + 0.5, s3 = 0.5 * exp(-l[2]) + 0.5;
    double w1 = s1 + s1 * s2, w2 = s1 * s2, w3 = s3;
    ck_assert_double_eq_tol(rw[1], w1, 1e-6);
    ck_assert_double_eq_tol(rw[2], w2, 1e-6);
    ck_assert_double_eq_tol(rw[4], w3, 1e-6);
    ck_assert(rw[0] == 0 && rw[3] == 0 && rw[5] == 0);
    ck_assert_double_eq_tol(L, (w1 * l[0] + w2 * l[1] + w3 * l[2]) / (3 + 1e-5), 1e-6);
    /* D-PACE with KL is rejected */
    char err[256];
    h.c.loss = LMHEAD_LOSS_KL;
    ck_assert_int_eq(lmhead_loss_forward_ref(&h.c, h.xn, h.head, h.head, h.w, h.last, h.anchors, h.valid, h.mask, 0,
                                             &L, rl, rw, cor, tot, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "D-PACE needs the CE loss"));
}
END_TEST

/* Invalid anchors and a zero loss mask supervise nothing: L = 0 (normalised by 0 + 1e-5, no NaN). */
START_TEST(lmhead_nothing_supervised) {
    hand_case h;
    make_hand(&h, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_NONE);
    h.valid[0] = 0;
    h.mask[5] = 0;
    h.anchors[0] = 0;   /* padding anchor: slot 0 wraps to last[T-1] */
    float L, rl[6], rw[6];
    int32_t cor[3], tot[3];
    run_hand(&h, &L, rl, rw, cor, tot);
    ck_assert_float_eq(L, 0.0f);
    for (int s = 0; s < 6; s++) ck_assert(rw[s] == 0 && rl[s] == 0);
    for (int j = 0; j < 3; j++) ck_assert(tot[j] == 0 && cor[j] == 0);
}
END_TEST

/* Random case: dxn against central differences of L. For D-PACE the weights are held fixed (they
 * carry no gradient), so the difference is taken of Σ w0_s ℓ_s(x) / (Σ m + 1e-5). */
START_TEST(lmhead_backward_matches_finite_differences) {
    enum { T = 40, N = 3, B = 4, D = 6, V = 11, R = N * B };
    int combos[4][2] = {{LMHEAD_LOSS_KL, LMHEAD_WEIGHT_NONE}, {LMHEAD_LOSS_CE, LMHEAD_WEIGHT_NONE},
                        {LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY}, {LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE}};
    for (int ci = 0; ci < 4; ci++) {
        lmhead_loss_config c = {T, N, B, D, V, combos[ci][0], combos[ci][1], 4.0f, 0.5f, 1e-6f};
        uint64_t rng = 77 + ci;
        float xn[R * D], head[V * D], vhead[V * D], w[D], last[T * D];
        test_rng_fill(&rng, xn, R * D, -1, 1);
        test_rng_fill(&rng, head, V * D, -1, 1);
        test_rng_fill(&rng, vhead, V * D, -1, 1);
        test_rng_fill(&rng, w, D, 0.5f, 1.5f);
        test_rng_fill(&rng, last, T * D, -2, 2);
        int32_t anchors[N] = {2, 17, 30};
        uint8_t valid[N] = {1, 1, 1}, mask[T];
        for (int p = 0; p < T; p++) mask[p] = p % 5 != 3;
        float L, rl[R], rw[R], dx[R * D];
        int32_t cor[B], tot[B];
        char err[256];
        ck_assert(lmhead_loss_forward_ref(&c, xn, head, vhead, w, last, anchors, valid, mask, 0, &L, rl, rw, cor, tot,
                                          err, sizeof err) == 0);
        ck_assert(lmhead_loss_backward_ref(&c, xn, head, vhead, w, last, anchors, valid, mask, 0, rw, dx, err,
                                           sizeof err) == 0);
        double msum = 0;
        for (int s = 0; s < R; s++) msum += (s % B) != 0 && mask[anchors[s / B] + s % B];
        int nonzero = 0;
        for (int i = 0; i < R * D; i++) {
            float x0 = xn[i], h = 1e-3f, Lp, Lm, rl2[R], rw2[R];
            double fixed[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                xn[i] = x0 + (sgn ? -h : h);
                lmhead_loss_forward_ref(&c, xn, head, vhead, w, last, anchors, valid, mask, 0, sgn ? &Lm : &Lp, rl2, rw2,
                                        cor, tot, err, sizeof err);
                double acc = 0;
                for (int s = 0; s < R; s++) acc += (double)rw[s] * rl2[s];
                fixed[sgn] = acc / (msum + 1e-5);
            }
            xn[i] = x0;
            double fd = c.weighting == LMHEAD_WEIGHT_DPACE ? (fixed[0] - fixed[1]) / (2.0 * h) : ((double)Lp - Lm) / (2.0 * h);
            nonzero += dx[i] != 0;
            ck_assert_msg(fabs(fd - dx[i]) <= 2e-4 + 1e-3 * fabs(fd), "combo %d dxn[%d]: analytic %.7g fd %.7g", ci, i,
                          dx[i], fd);
        }
        ck_assert_int_gt(nonzero, R * D / 4);   /* 6 of the 12 rows are supervised */
    }
}
END_TEST

/* t2d/d2t: V_t = 10, chosen ids {1, 4, 5, 8}. The pruned heads give a softmax over those ids only. */
START_TEST(lmhead_vocab_subset) {
    enum { VT = 10, VD = 4, D = 4 };
    uint8_t t2d[VT] = {0, 1, 0, 0, 1, 1, 0, 0, 1, 0};
    int64_t d2t[VD] = {1, 3, 3, 5}, bad[VD] = {1, 3, 4, 5};
    char err[256];
    ck_assert_int_eq(lmhead_vocab_check(t2d, VT, d2t, VD, err, sizeof err), 0);
    ck_assert_int_eq(lmhead_vocab_check(t2d, VT, bad, VD, err, sizeof err), -1);
    ck_assert_int_eq(lmhead_vocab_check(t2d, VT, d2t, 3, err, sizeof err), -1);
    uint64_t rng = 3;
    float full[VT * D], pruned[VD * D];
    test_rng_fill(&rng, full, VT * D, -1, 1);
    ck_assert_int_eq(lmhead_prune_ref(full, VT, D, d2t, VD, pruned, err, sizeof err), 0);
    ck_assert_mem_eq(pruned + 2 * D, full + 5 * D, sizeof(float) * D);
    ck_assert_int_eq(lmhead_prune_ref(full, 5, D, d2t, VD, pruned, err, sizeof err), -1);
    /* one block of 2 at anchor 1: the only supervised row is (0,1), target from last[1] */
    lmhead_loss_config c = {4, 1, 2, D, VD, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_NONE, 4, 0.5f, 1e-6f};
    float xn[2 * D], w[D] = {1, 1, 1, 1}, last[4 * D];
    test_rng_fill(&rng, xn, 2 * D, -1, 1);
    test_rng_fill(&rng, last, 4 * D, -1, 1);
    int32_t anchors[1] = {1};
    uint8_t valid[1] = {1}, mask[4] = {1, 1, 1, 1};
    float L, rl[2], rw[2];
    int32_t cor[2], tot[2];
    ck_assert(lmhead_loss_forward_ref(&c, xn, pruned, pruned, w, last, anchors, valid, mask, 0, &L, rl, rw, cor, tot, err,
                                      sizeof err) == 0);
    const float *x = xn + D, *y = last + D;
    double ss = 0, z[VD], t[VD], mz = -1e30, mt = -1e30, sz = 0, st = 0, kl = 0;
    for (int e = 0; e < D; e++) ss += (double)y[e] * y[e];
    double rstd = 1 / sqrt(ss / D + 1e-6);
    int ids[VD] = {1, 4, 5, 8};
    for (int d = 0; d < VD; d++) {
        z[d] = t[d] = 0;
        for (int e = 0; e < D; e++) {
            z[d] += x[e] * full[ids[d] * D + e];
            t[d] += y[e] * rstd * full[ids[d] * D + e];
        }
        mz = fmax(mz, z[d]);
        mt = fmax(mt, t[d]);
    }
    for (int d = 0; d < VD; d++) { sz += exp(z[d] - mz); st += exp(t[d] - mt); }
    for (int d = 0; d < VD; d++) {
        double lp = t[d] - mt - log(st), lq = z[d] - mz - log(sz);
        kl += exp(lp) * (lp - lq);
    }
    ck_assert_double_eq_tol(rl[1], kl, 1e-5);
    ck_assert_double_eq_tol(L, kl / (1 + 1e-5), 1e-5);
}
END_TEST


/* The trainer's modes (lmhead_loss_mode) on the hand case. Budget: an anchor whose block runs past T is
 * accepted, its rows past T are masked and nothing past T is read. sample_from_anchor: row p predicts p + 1
 * from last[p], slot 0 included, exp-decay exp(-j/γ). */
START_TEST(lmhead_hand_modes) {
    hand_case h;
    make_hand(&h, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_EXP_DECAY);
    char err[256];
    float L, rl[6], rw[6];
    int32_t cor[3], tot[3], pred[6], tgt[6];
    uint8_t m[6];
    h.anchors[1] = 6;   /* rows at 6, 7, 8: 8 >= T */
    ck_assert_int_eq(lmhead_loss_forward_ref(&h.c, h.xn, h.head, h.head, h.w, h.last, h.anchors, h.valid, h.mask, 0,
                                             &L, rl, rw, cor, tot, err, sizeof err), -1);
    lmhead_loss_mode md = {10, 0};
    ck_assert_msg(lmhead_loss_forward_mode_ref(&h.c, &md, h.xn, h.head, h.head, h.w, h.last, h.anchors, h.valid,
                                               h.mask, 0, &L, rl, rw, cor, tot, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(lmhead_argmax_ref(&h.c, &md, h.xn, h.head, h.head, h.w, h.last, h.anchors, h.valid, h.mask, 0, pred,
                                    tgt, m, err, sizeof err) == 0, "%s", err);
    /* rows (0,1) (0,2) (1,1) supervised, (1,2) at p = 8 masked; (1,1) at p = 7 targets last[6] = (1, 2) -> 1 */
    uint8_t want_m[6] = {0, 1, 1, 0, 1, 0};
    for (int s = 0; s < 6; s++) ck_assert_int_eq(m[s], want_m[s]);
    ck_assert_int_eq(tgt[4], 1);
    ck_assert_int_eq(tgt[5], 1);   /* (1,2) reads last[7], still inside the batch */
    ck_assert_int_eq(pred[4], 1);  /* xn row 4 = (0, 1) */
    ck_assert_int_eq(tot[1], 2);
    ck_assert_int_eq(tot[2], 1);
    ck_assert_float_eq(rw[5], 0.0f);
    md.budget = 8;   /* = T: 6 + 3 > 8 */
    ck_assert_int_eq(lmhead_loss_forward_mode_ref(&h.c, &md, h.xn, h.head, h.head, h.w, h.last, h.anchors, h.valid,
                                                  h.mask, 0, &L, rl, rw, cor, tot, err, sizeof err), -1);
    /* sample_from_anchor */
    make_hand(&h, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_EXP_DECAY);
    lmhead_loss_mode sf = {0, 1};
    ck_assert_msg(lmhead_loss_forward_mode_ref(&h.c, &sf, h.xn, h.head, h.head, h.w, h.last, h.anchors, h.valid,
                                               h.mask, 0, &L, rl, rw, cor, tot, err, sizeof err) == 0, "%s", err);
    /* (0,0): p = 1 predicts token 2 (mask 1) from last[1] = (1, 1): tie -> target 0; z = (9, 9, 0) */
    ck_assert_double_eq_tol(rl[0], log(2 * exp(9.0) + 1) - 9, 1e-5);
    ck_assert_double_eq_tol(rw[0], 1.0, 1e-7);
    ck_assert_double_eq_tol(rw[1], exp(-0.25), 1e-7);
    ck_assert_int_eq(tot[0], 2);   /* slot 0 of both blocks */
    /* (1,1): p = 5 predicts token 6, loss_mask[6] = 0 -> masked; (1,2): p = 6 predicts 7 -> supervised */
    ck_assert_float_eq(rw[4], 0.0f);
    ck_assert(rw[5] > 0);
    ck_assert_int_eq(tot[1], 1);
    ck_assert_int_eq(tot[2], 2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("lmhead_loss");
    TCase *tc = tcase_create("ref");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lmhead_hand_ce_and_metrics);
    tcase_add_test(tc, lmhead_hand_kl);
    tcase_add_test(tc, lmhead_hand_weights);
    tcase_add_test(tc, lmhead_nothing_supervised);
    tcase_add_test(tc, lmhead_backward_matches_finite_differences);
    tcase_add_test(tc, lmhead_vocab_subset);
    tcase_add_test(tc, lmhead_hand_modes);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
