/*
 * tests/test_gdn_kernels.c — the CPU references of the Gated DeltaNet / gated attention kernels
 * (kernels/gated_delta.h, conv1d.h, l2norm.h, gated_rmsnorm.h, gated_attn.h):
 * - the chunked gated delta rule (the GPU kernel's algorithm in fp32) against the per-token
 *   recurrence, over documents of 1, 63, 64, 65 and 1000 tokens packed together (chunk boundaries
 *   inside documents and at document starts), at the tiny model's and a 64-dim head layout;
 * - the kernel references composed (conv1d → l2norm → gated delta → gated RMSNorm) against
 *   stages/model/gdn.c's gdn_forward_doc, the CPU target's layer, document by document;
 * - the gated attention references against gdn.c's split / rope / gate;
 * - the head-layout check names the field;
 * - the decode step's references (conv1d_decode over the slots' rings, gated_delta_decode from the slots' states)
 *   run over a schedule of steps give bitwise the whole-sequence references' rows, and each state snapshot is
 *   bitwise the state after its position.
 */
#include "kernels/conv1d.h"
#include "kernels/gated_attn.h"
#include "kernels/gated_delta.h"
#include "kernels/gated_rmsnorm.h"
#include "kernels/l2norm.h"
#include "model/gdn.h"
#include "tests/gdn_inputs.h"

static const int awkward[] = {1, 63, 64, 65, 1000};

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static void chunked_vs_recurrent(int n_k, int n_v, int d_k, int d_v, uint64_t seed) {
    struct gdn_inputs g;
    gdn_inputs_make(&g, awkward, 5, n_k, n_v, d_k, d_v, seed);
    size_t n = (size_t)g.s.T * n_v * d_v;
    float *ref = malloc(4 * n), *chk = malloc(4 * n), *state = malloc(4 * (size_t)n_v * d_k * d_v);
    gated_delta_forward_ref(ref, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias, g.cu, &g.s,
                            state);
    gated_delta_forward_chunked_ref(chk, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias,
                                    g.cu, &g.s, state);
    /* Same math, fp32 in another order (the exp(G_t − G_s) of cumulative sums against a product of
     * per-token decays, ≤ 64 + d_k term sums): round-off of a few ulps of the output scale. 1e-4 of
     * the largest output is ~1000 ulps; a wrong chunk boundary or a lost reset errs by O(scale). */
    double scale = max_abs(ref, n);
    double err = 0;
    for (size_t i = 0; i < n; i++) err = fabs(chk[i] - ref[i]) > err ? fabs(chk[i] - ref[i]) : err;
    fprintf(stderr, "chunked vs recurrent (n_k %d n_v %d d_k %d d_v %d): output scale %.3g, max abs diff %.3g\n", n_k,
            n_v, d_k, d_v, scale, err);
    ck_assert(scale > 0.01);   /* the inputs exercise the state (not a vanishing output) */
    ck_assert_msg(test_allclose("chunked vs recurrent", chk, ref, n, 1e-4 * scale, 1e-4),
                  "n_k %d n_v %d d_k %d d_v %d", n_k, n_v, d_k, d_v);
    /* the split form (W, U0 solved per chunk first, U = U0 − W S after): the same math regrouped, so its fp32
     * error stays within style.md's 2x of the chunked form's, plus a few ulps of the scale */
    float *spl = malloc(4 * n);
    gated_delta_forward_split_ref(spl, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias,
                                  g.cu, &g.s, state);
    double e_split = 0;
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(isfinite(spl[i]), "split form: output %zu is %g", i, spl[i]);
        e_split = fabs(spl[i] - ref[i]) > e_split ? fabs(spl[i] - ref[i]) : e_split;
    }
    fprintf(stderr, "split vs recurrent: max abs diff %.3g (chunked %.3g)\n", e_split, err);
    ck_assert_msg(e_split <= 2 * err + 1e-6 * scale, "split form error %.3g against the chunked form's %.3g", e_split,
                  err);
    free(spl);
    free(ref); free(chk); free(state);
    gdn_inputs_free(&g);
}

START_TEST(gated_delta_chunked_matches_recurrent) {
    chunked_vs_recurrent(2, 4, 8, 12, 1);     /* qwen3.5-tiny's layout */
    chunked_vs_recurrent(1, 2, 64, 40, 2);    /* a longer key head, a value width not a multiple of 32 */
    chunked_vs_recurrent(1, 1, 128, 160, 3);  /* the GPU's largest key head; two column passes of the split form */
}
END_TEST

/* Documents are independent: each document alone gives the rows it gives packed (references are
 * deterministic per document, so bitwise). */
START_TEST(gated_delta_documents_independent) {
    struct gdn_inputs g;
    gdn_inputs_make(&g, awkward, 5, 2, 4, 8, 12, 3);
    size_t row = (size_t)g.s.n_v * g.s.d_v, n = (size_t)g.s.T * row;
    float *all = malloc(4 * n), *one = malloc(4 * n), *state = malloc(4 * 4 * 8 * 12);
    gated_delta_forward_chunked_ref(all, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias,
                                    g.cu, &g.s, state);
    for (int d = 0; d < 5; d++) {
        int s0 = g.cu[d];
        int32_t cu1[2] = {0, awkward[d]};
        struct gated_delta_shape s1 = g.s;
        s1.T = awkward[d];
        s1.n_docs = 1;
        size_t off = (size_t)s0 * g.conv_dim, boff = (size_t)s0 * 2 * g.s.n_v;
        gated_delta_forward_chunked_ref(one, GDN_Q(&g) + off, GDN_K(&g) + off, GDN_V(&g) + off, GDN_B(&g) + boff,
                                        GDN_A(&g) + boff, g.a_neg, g.dt_bias, cu1, &s1, state);
        ck_assert_msg(memcmp(one, all + (size_t)s0 * row, 4 * (size_t)awkward[d] * row) == 0, "document %d", d);
    }
    free(all); free(one); free(state);
    gdn_inputs_free(&g);
}
END_TEST

/* conv1d → l2norm → gated delta → gated RMSNorm over a packed batch == gdn_forward_doc per document. */
START_TEST(gdn_kernel_refs_compose_to_the_layer) {
    struct gdn_shape gs = {2, 4, 8, 12, 4};
    int lens[] = {5, 70, 1, 64}, nd = 4, T = 140;
    int D = gdn_conv_dim(&gs), IN = gdn_in_dim(&gs), VD = gs.n_v * gs.d_v, kd = gs.n_k * gs.d_k;
    uint64_t seed = 7;
    float *in = malloc(4 * (size_t)T * IN), *conv_w = malloc(4 * (size_t)D * gs.K), a_neg[4], dtb[4], nw[12];
    test_rng_fill(&seed, in, (size_t)T * IN, -1, 1);
    test_rng_fill(&seed, conv_w, (size_t)D * gs.K, -0.5f, 0.5f);
    for (int j = 0; j < 4; j++) { a_neg[j] = -expf(test_rng_uniform(&seed, -1, 1)); dtb[j] = test_rng_uniform(&seed, -1, 1); }
    test_rng_fill(&seed, nw, 12, 0.5f, 1.5f);
    int32_t cu[5] = {0};
    for (int d = 0; d < nd; d++) cu[d + 1] = cu[d] + lens[d];
    ck_assert_int_eq(cu[nd], T);
    float *y_layer = malloc(4 * (size_t)T * VD), *scr = malloc(4 * (size_t)T * D), *st = malloc(4 * 4 * 8 * 12);
    for (int d = 0; d < nd; d++)
        gdn_forward_doc(y_layer + (size_t)cu[d] * VD, in + (size_t)cu[d] * IN, IN, lens[d], &gs, conv_w, a_neg, dtb, nw,
                        1e-6f, scr + (size_t)cu[d] * D, st);
    float *conv = malloc(4 * (size_t)T * D), *o = malloc(4 * (size_t)T * VD), *y = malloc(4 * (size_t)T * VD);
    conv1d_forward_ref(conv, in, IN, conv_w, cu, nd, T, D, gs.K);
    l2norm_forward_ref(conv, T, D, gs.n_k, gs.d_k, 1.0f / sqrtf((float)gs.d_k));
    l2norm_forward_ref(conv + kd, T, D, gs.n_k, gs.d_k, 1.0f);
    struct gated_delta_shape s = {T, nd, gs.n_k, gs.n_v, gs.d_k, gs.d_v, D, D, IN};
    gated_delta_forward_ref(o, conv, conv + kd, conv + 2 * kd, in + D + VD, in + D + VD + gs.n_v, a_neg, dtb, cu, &s, st);
    gated_rmsnorm_forward_ref(y, o, in + D, IN, nw, T, gs.n_v, gs.d_v, 1e-6f);
    /* the same arithmetic in the same order: equal to the last ulp or two */
    ck_assert(test_allclose("kernel refs vs gdn_forward_doc", y, y_layer, (size_t)T * VD, 1e-6, 1e-5));
    free(in); free(conv_w); free(y_layer); free(scr); free(st); free(conv); free(o); free(y);
}
END_TEST

START_TEST(conv1d_resets_at_document_start) {
    /* K = 4 ones: y = silu(sum of the last <= 4 rows of the same document) */
    float x[6] = {1, 2, 3, 4, 5, 6}, w[4] = {1, 1, 1, 1}, y[6];
    int32_t cu[3] = {0, 2, 6};
    conv1d_forward_ref(y, x, 1, w, cu, 2, 6, 1, 4);
    float want_pre[6] = {1, 3, 3, 7, 12, 18};   /* document 2 starts at row 2: its rows never see 1, 2 */
    for (int i = 0; i < 6; i++) {
        float f = want_pre[i];
        ck_assert_float_eq_tol(y[i], f / (1.0f + expf(-f)), 1e-6f);
    }
}
END_TEST

START_TEST(gated_attn_refs_match_gdn) {
    /* The CPU target's gated attention runs these references (stages/model/target.c): pin their layout and
     * arithmetic against values written out by hand. */
    int T = 9, NH = 4, NKV = 2, HD = 16, R = 8;
    size_t row = 2 * (size_t)NH * HD + 2 * (size_t)NKV * HD, nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    uint64_t seed = 11;
    float *qkv = malloc(4 * T * row), *q1 = malloc(4 * nq), *g1 = malloc(4 * nq), *k1 = malloc(4 * nk),
          *v1 = malloc(4 * nk), *q2 = malloc(4 * nq);
    test_rng_fill(&seed, qkv, T * row, -2, 2);
    gated_attn_split_forward_ref(q1, g1, k1, v1, qkv, T, NH, NKV, HD);
    /* per head [query | gate] in the fused row, then k, then v */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++)
            for (int e = 0; e < HD; e++) {
                ck_assert(q1[((size_t)t * NH + h) * HD + e] == qkv[(size_t)t * row + (size_t)h * 2 * HD + e]);
                ck_assert(g1[((size_t)t * NH + h) * HD + e] == qkv[(size_t)t * row + (size_t)h * 2 * HD + HD + e]);
            }
    for (int t = 0; t < T; t++)
        for (size_t e = 0; e < (size_t)NKV * HD; e++) {
            ck_assert(k1[(size_t)t * NKV * HD + e] == qkv[(size_t)t * row + 2 * (size_t)NH * HD + e]);
            ck_assert(v1[(size_t)t * NKV * HD + e] == qkv[(size_t)t * row + 2 * (size_t)NH * HD + (size_t)NKV * HD + e]);
        }
    int32_t pos[9] = {0, 1, 2, 3, 0, 1, 2, 100000, 5};
    float inv[4] = {1.0f, 0.1f, 0.01f, 0.001f};
    memcpy(q2, q1, 4 * nq);
    gated_attn_rope_forward_ref(q1, pos, inv, T, NH, HD, R);
    /* half-split pairs (i, i + R/2) rotated by pos·inv_freq[i]; columns R.. pass through */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            const float *a = q2 + ((size_t)t * NH + h) * HD, *b = q1 + ((size_t)t * NH + h) * HD;
            for (int i = 0; i < R / 2; i++) {
                float an = (float)pos[t] * inv[i], c = cosf(an), sn = sinf(an);
                ck_assert(b[i] == a[i] * c - a[i + R / 2] * sn);
                ck_assert(b[i + R / 2] == a[i + R / 2] * c + a[i] * sn);
            }
            for (int e = R; e < HD; e++) ck_assert(b[e] == a[e]);
        }
    memcpy(q2, q1, 4 * nq);
    gated_attn_gate_forward_ref(q1, g1, (int64_t)nq);
    for (size_t e = 0; e < nq; e++) ck_assert(q1[e] == q2[e] * (1.0f / (1.0f + expf(-g1[e]))));
    free(qkv); free(q1); free(g1); free(k1); free(v1); free(q2);
}
END_TEST

START_TEST(gated_attn_rope_leaves_the_tail) {
    /* dims R..HD-1 pass through; position 0 is the identity */
    float x[16], x0[16], inv[2] = {1.0f, 0.5f};
    for (int i = 0; i < 16; i++) x[i] = x0[i] = (float)i - 3.5f;
    int32_t p1 = 3;
    gated_attn_rope_forward_ref(x, &p1, inv, 1, 1, 16, 4);
    for (int i = 4; i < 16; i++) ck_assert_float_eq(x[i], x0[i]);
    ck_assert_float_eq_tol(x[0], x0[0] * cosf(3.0f) - x0[2] * sinf(3.0f), 1e-6f);
    ck_assert_float_eq_tol(x[3], x0[3] * cosf(1.5f) + x0[1] * sinf(1.5f), 1e-6f);
}
END_TEST

START_TEST(gated_delta_shape_check_names_the_field) {
    char err[256];
    ck_assert_int_eq(gated_delta_check_shape(16, 48, 128, 128, err, sizeof err), 0);
    ck_assert_int_eq(gated_delta_check_shape(2, 4, 8, 12, err, sizeof err), 0);
    ck_assert_int_eq(gated_delta_check_shape(16, 48, 192, 128, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "linear_key_head_dim"));
    ck_assert_int_eq(gated_delta_check_shape(16, 40, 128, 128, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "linear_num_key_heads"));
}
END_TEST

START_TEST(l2norm_unit_rows) {
    float x[2 * 6];
    for (int i = 0; i < 12; i++) x[i] = (float)(i + 1);
    l2norm_forward_ref(x, 2, 6, 2, 3, 0.5f);
    for (int r = 0; r < 4; r++) {
        double ss = 0;
        for (int i = 0; i < 3; i++) ss += (double)x[r * 3 + i] * x[r * 3 + i];
        ck_assert_double_eq_tol(ss, 0.25, 1e-5);   /* unit norm, then scaled by 0.5 */
    }
}
END_TEST

static const int step_sizes[] = {5, 1, 17, 3, 64, 1, 2, 40};

START_TEST(conv1d_decode_matches_forward) {
    int lens[] = {40, 7, 130, 1, 66}, nd = 5, D = 24, K = 4, max_step = 64, W = max_step + 17 + K - 1;
    int32_t cu[6] = {0};
    for (int d = 0; d < nd; d++) cu[d + 1] = cu[d] + lens[d];
    int T = cu[nd], X = D + 5;   /* rows wider than the conv input, as the projection rows are */
    uint64_t seed = 99;
    float *x = malloc(4 * (size_t)T * X), *w = malloc(4 * (size_t)D * K), *ref = malloc(4 * (size_t)T * D);
    test_rng_fill(&seed, x, (size_t)T * X, -1, 1);
    test_rng_fill(&seed, w, (size_t)D * K, -0.5f, 0.5f);
    conv1d_forward_ref(ref, x, X, w, cu, nd, T, D, K);
    struct gdn_step steps[64];
    int n = gdn_schedule(cu, nd, step_sizes, 8, steps, 64);
    ck_assert_int_gt(n, 3);
    float *hist = malloc(4 * (size_t)nd * W * D), *xs = malloc(4 * (size_t)T * X), *y = malloc(4 * (size_t)T * D);
    int32_t slot[256], pos[256];
    for (size_t i = 0; i < (size_t)nd * W * D; i++) hist[i] = NAN;   /* a row read before it is written shows */
    for (int k = 0; k < n; k++) {
        struct gdn_step *st = &steps[k];
        ck_assert_int_le(st->T, 256);
        gdn_gather(xs, x, X, X, st);
        gdn_row_slots(st, slot, pos);
        conv1d_decode_append_ref(hist, xs, X, slot, pos, st->T, W, D);
        conv1d_decode_ref(y, hist, slot, pos, st->T, W, w, D, K);
        for (int r = 0; r < st->T; r++)
            ck_assert_msg(!memcmp(y + (size_t)r * D, ref + (size_t)st->rows[r] * D, 4 * (size_t)D),
                          "step %d row %d (slot %d position %d): not the whole sequence's conv row", k, r, slot[r],
                          pos[r]);
        free(st->rows);
    }
    free(x); free(w); free(ref); free(hist); free(xs); free(y);
}
END_TEST

START_TEST(gated_delta_decode_matches_forward) {
    int n_k = 2, n_v = 4, d_k = 8, d_v = 12, n_snap = 17;
    struct gdn_inputs g;
    gdn_inputs_make(&g, awkward, 5, n_k, n_v, d_k, d_v, 31);
    size_t SS = (size_t)n_v * d_k * d_v, VD = (size_t)n_v * d_v;
    float *ref = malloc(4 * (size_t)g.s.T * VD), *scr = malloc(4 * SS);
    gated_delta_forward_ref(ref, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias, g.cu, &g.s,
                            scr);
    struct gdn_step steps[128];
    int n = gdn_schedule(g.cu, 5, step_sizes, 8, steps, 128);
    ck_assert_int_gt(n, 3);
    float *state = calloc(5 * SS, 4), *snap = malloc(4 * 5 * n_snap * SS);
    float *conv = malloc(4 * (size_t)g.s.T * g.conv_dim), *ba = malloc(4 * (size_t)g.s.T * 2 * n_v);
    float *o = malloc(4 * (size_t)g.s.T * VD);
    int snap_pos[5][17];
    memset(snap_pos, 0xff, sizeof snap_pos);
    for (int k = 0; k < n; k++) {
        struct gdn_step *st = &steps[k];
        gdn_gather(conv, g.conv, g.conv_dim, g.conv_dim, st);
        gdn_gather(ba, g.ba, 2 * n_v, 2 * n_v, st);
        struct gated_delta_shape s = g.s;
        s.T = st->T;
        s.n_docs = st->n_seq;
        int kd = n_k * d_k;
        gated_delta_decode_ref(o, conv, conv + kd, conv + 2 * kd, ba, ba + n_v, g.a_neg, g.dt_bias, st->cu, st->slot,
                               st->pos, &s, state, snap, n_snap);
        for (int r = 0; r < st->T; r++)
            ck_assert_msg(!memcmp(o + (size_t)r * VD, ref + (size_t)st->rows[r] * VD, 4 * VD),
                          "step %d row %d: not the whole sequence's row", k, r);
        for (int i = 0; i < st->n_seq; i++) {
            int m = st->cu[i + 1] - st->cu[i];
            for (int r = m > n_snap ? m - n_snap : 0; r < m; r++)
                snap_pos[st->slot[i]][(st->pos[i] + r) % n_snap] = st->pos[i] + r;
            /* the last snapshot is the live state */
            int p = st->pos[i] + m - 1;
            ck_assert(!memcmp(snap + ((size_t)st->slot[i] * n_snap + p % n_snap) * SS, state + (size_t)st->slot[i] * SS,
                              4 * SS));
        }
        free(st->rows);
    }
    /* every snapshot left is the state after its position: the recurrence over that prefix alone */
    int checked = 0;
    for (int d = 0; d < 5; d++)
        for (int e = 0; e < n_snap; e++) {
            int p = snap_pos[d][e];
            if (p < 0) continue;
            int32_t cu1[2] = {0, p + 1};
            struct gated_delta_shape s = g.s;
            s.T = p + 1;
            s.n_docs = 1;
            size_t r0 = (size_t)g.cu[d];
            gated_delta_forward_ref(o, GDN_Q(&g) + r0 * g.conv_dim, GDN_K(&g) + r0 * g.conv_dim,
                                    GDN_V(&g) + r0 * g.conv_dim, GDN_B(&g) + r0 * 2 * n_v, GDN_A(&g) + r0 * 2 * n_v,
                                    g.a_neg, g.dt_bias, cu1, &s, scr);
            ck_assert_msg(!memcmp(snap + ((size_t)d * n_snap + e) * SS, scr, 4 * SS),
                          "slot %d: the snapshot of position %d is not the state after it", d, p);
            checked++;
        }
    ck_assert_int_ge(checked, 30);
    free(ref); free(scr); free(state); free(snap); free(conv); free(ba); free(o);
    gdn_inputs_free(&g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gdn_kernels");
    TCase *tc = tcase_create("gdn_kernels");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, gated_delta_chunked_matches_recurrent);
    tcase_add_test(tc, gated_delta_documents_independent);
    tcase_add_test(tc, gdn_kernel_refs_compose_to_the_layer);
    tcase_add_test(tc, conv1d_resets_at_document_start);
    tcase_add_test(tc, gated_attn_refs_match_gdn);
    tcase_add_test(tc, gated_attn_rope_leaves_the_tail);
    tcase_add_test(tc, gated_delta_shape_check_names_the_field);
    tcase_add_test(tc, l2norm_unit_rows);
    tcase_add_test(tc, conv1d_decode_matches_forward);
    tcase_add_test(tc, gated_delta_decode_matches_forward);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
