/*
 * tests/test_block_attn.c — anchored block attention reference (kernels/block_attn.h).
 *
 * The reference is checked against a naive implementation in this file that builds the dense
 * [N·B, T + N·B] mask straight from dflash-reference.md §6 and runs masked softmax attention in
 * double. Cases cover several documents, padding (doc id -1), an anchor at a document start, padding
 * anchors (anchor 0), sliding windows, causal and bidirectional blocks, GQA. The backward is checked
 * against central finite differences of the naive double forward.
 */
#include "kernels/block_attn.h"
#include "testutil.h"

/* Dense §6 mask: vis[r * (T + N·B) + col]. */
static unsigned char *dense_mask(const block_attn_config *c, const int32_t *anchors, const int32_t *doc) {
    int R = c->N * c->B, KV = c->T + R;
    unsigned char *vis = calloc((size_t)R * KV, 1);
    for (int r = 0; r < R; r++) {
        int b = r / c->B, j = r % c->B, a = anchors[b], d = doc[a];
        for (int col = 0; col < KV; col++) {
            int ok;
            if (col < c->T) {
                ok = d != -1 && doc[col] == d && col < a;
                if (c->window > 0) ok = ok && col >= a - c->window;
            } else {
                int bb = (col - c->T) / c->B, jj = (col - c->T) % c->B;
                ok = bb == b && (!c->causal || jj <= j);
            }
            vis[(size_t)r * KV + col] = (unsigned char)ok;
        }
    }
    return vis;
}

/* Naive masked attention in double; returns L = Σ out·G when G != NULL. */
static double naive(const block_attn_config *c, const unsigned char *vis, const double *q, const double *k,
                    const double *v, double *out, double *lse, const double *G) {
    int R = c->N * c->B, KV = c->T + R, D = c->d_h, grp = c->n_h / c->n_kv;
    double L = 0, *s = malloc(sizeof *s * (size_t)KV);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < c->n_h; h++) {
            double m = -INFINITY, l = 0;
            for (int col = 0; col < KV; col++) {
                s[col] = -INFINITY;
                if (!vis[(size_t)r * KV + col]) continue;
                double dot = 0;
                for (int e = 0; e < D; e++)
                    dot += q[((size_t)r * c->n_h + h) * D + e] * k[((size_t)col * c->n_kv + h / grp) * D + e];
                s[col] = dot * c->scale;
                if (s[col] > m) m = s[col];
            }
            for (int col = 0; col < KV; col++) if (s[col] > -INFINITY) l += exp(s[col] - m);
            for (int e = 0; e < D; e++) {
                double o = 0;
                for (int col = 0; col < KV; col++)
                    if (s[col] > -INFINITY) o += exp(s[col] - m) / l * v[((size_t)col * c->n_kv + h / grp) * D + e];
                size_t idx = ((size_t)r * c->n_h + h) * D + e;
                if (out) out[idx] = o;
                if (G) L += o * G[idx];
            }
            if (lse) lse[(size_t)h * R + r] = m + log(l);
        }
    free(s);
    return L;
}

typedef struct {
    block_attn_config c;
    int32_t anchors[8];
    int32_t doc[128];
    float *q, *k, *v;
    size_t nq, nk;
} attn_case;

/* T = 61: doc 0 = 0..19, doc 1 = 20..44, doc 2 = 45..54, padding 55..60. Anchors exercise: context
 * inside one document, a window cut, a document start (no context), padding anchors 0, an anchor on a
 * padding position (doc -1: no context). */
static void make_case(attn_case *t, int window, int causal, uint64_t seed) {
    block_attn_config c = {61, 6, 4, 4, 2, 8, window, causal, 0};
    c.scale = 1.0f / sqrtf((float)c.d_h);
    t->c = c;
    int32_t a[6] = {3, 20, 30, 44, 0, 57};
    memcpy(t->anchors, a, sizeof a);
    for (int p = 0; p < c.T; p++) t->doc[p] = p < 20 ? 0 : p < 45 ? 1 : p < 55 ? 2 : -1;
    t->nq = (size_t)c.N * c.B * c.n_h * c.d_h;
    t->nk = ((size_t)c.T + (size_t)c.N * c.B) * c.n_kv * c.d_h;
    t->q = malloc(sizeof(float) * t->nq);
    t->k = malloc(sizeof(float) * t->nk);
    t->v = malloc(sizeof(float) * t->nk);
    uint64_t rng = seed;
    test_rng_fill(&rng, t->q, t->nq, -2, 2);
    test_rng_fill(&rng, t->k, t->nk, -2, 2);
    test_rng_fill(&rng, t->v, t->nk, -1, 1);
}
static void free_case(attn_case *t) { free(t->q); free(t->k); free(t->v); }

static double *to_double(const float *x, size_t n) {
    double *d = malloc(sizeof *d * n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static const int modes[4][2] = {{0, 0}, {0, 1}, {8, 1}, {8, 0}};   /* (window, causal) */

START_TEST(block_attn_forward_matches_dense_mask) {
    for (int mi = 0; mi < 4; mi++) {
        attn_case t;
        make_case(&t, modes[mi][0], modes[mi][1], 100 + mi);
        int R = t.c.N * t.c.B;
        float *out = malloc(sizeof(float) * t.nq), *lse = malloc(sizeof(float) * (size_t)R * t.c.n_h);
        char err[256];
        ck_assert_int_eq(block_attn_forward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, 0, out, lse, err, sizeof err), 0);
        unsigned char *vis = dense_mask(&t.c, t.anchors, t.doc);
        double *qd = to_double(t.q, t.nq), *kd = to_double(t.k, t.nk), *vd = to_double(t.v, t.nk);
        double *od = malloc(sizeof *od * t.nq), *ld = malloc(sizeof *ld * (size_t)R * t.c.n_h);
        naive(&t.c, vis, qd, kd, vd, od, ld, NULL);
        float *of = malloc(sizeof(float) * t.nq), *lf = malloc(sizeof(float) * (size_t)R * t.c.n_h);
        for (size_t i = 0; i < t.nq; i++) of[i] = (float)od[i];
        for (int i = 0; i < R * t.c.n_h; i++) lf[i] = (float)ld[i];
        ck_assert_msg(test_allclose("out", out, of, t.nq, 1e-6, 1e-5), "mode window=%d causal=%d", modes[mi][0],
                      modes[mi][1]);
        ck_assert(test_allclose("lse", lse, lf, (size_t)R * t.c.n_h, 1e-6, 1e-5));
        /* sanity of the case itself: the doc-start, padding-anchor and doc -1 blocks see only themselves */
        for (int b = 1; b < t.c.N; b++) {
            if (t.anchors[b] != 20 && t.anchors[b] != 0 && t.anchors[b] != 57) continue;
            for (int col = 0; col < t.c.T; col++) ck_assert(!vis[(size_t)(b * t.c.B) * (t.c.T + R) + col]);
        }
        free(vis); free(qd); free(kd); free(vd); free(od); free(ld); free(of); free(lf); free(out); free(lse);
        free_case(&t);
    }
}
END_TEST

/* Changing a key or value the mask hides must not change anything (guards against a reference that
 * silently reads the wrong document or the window edge). */
START_TEST(block_attn_invisible_keys_ignored) {
    attn_case t;
    make_case(&t, 8, 1, 7);
    int R = t.c.N * t.c.B;
    float *o1 = malloc(sizeof(float) * t.nq), *o2 = malloc(sizeof(float) * t.nq), *lse = malloc(sizeof(float) * R * 4);
    char err[256];
    block_attn_forward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, 0, o1, lse, err, sizeof err);
    /* anchor 30 with W=8 sees 22..29: poison 21 (outside the window), 30 (the anchor itself), 19 (doc 0) */
    int poison[] = {19, 21, 30, 45};
    for (size_t i = 0; i < 4; i++)
        for (int e = 0; e < 2 * 8; e++) {
            t.k[(size_t)poison[i] * 16 + e] = 50;
            t.v[(size_t)poison[i] * 16 + e] = 50;
        }
    block_attn_forward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, 0, o2, lse, err, sizeof err);
    for (int r = 2 * 4; r < 3 * 4; r++)   /* block 2 (anchor 30) */
        for (int i = 0; i < 4 * 8; i++) ck_assert_float_eq(o1[(size_t)r * 32 + i], o2[(size_t)r * 32 + i]);
    free(o1); free(o2); free(lse);
    free_case(&t);
}
END_TEST

/* dq, dk, dv of the reference against central differences of the naive double forward, L = Σ out·G. */
START_TEST(block_attn_backward_matches_finite_differences) {
    for (int mi = 0; mi < 4; mi++) {
        attn_case t;
        make_case(&t, modes[mi][0], modes[mi][1], 200 + mi);
        int R = t.c.N * t.c.B;
        uint64_t rng = 9;
        float *G = malloc(sizeof(float) * t.nq), *out = malloc(sizeof(float) * t.nq);
        float *lse = malloc(sizeof(float) * (size_t)R * t.c.n_h);
        float *dq = malloc(sizeof(float) * t.nq), *dk = malloc(sizeof(float) * t.nk), *dv = malloc(sizeof(float) * t.nk);
        test_rng_fill(&rng, G, t.nq, -1, 1);
        char err[256];
        ck_assert_int_eq(block_attn_forward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, 0, out, lse, err, sizeof err), 0);
        ck_assert_int_eq(block_attn_backward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, out, G, lse, dq, dk, dv, err,
                                                 sizeof err), 0);
        unsigned char *vis = dense_mask(&t.c, t.anchors, t.doc);
        double *qd = to_double(t.q, t.nq), *kd = to_double(t.k, t.nk), *vd = to_double(t.v, t.nk);
        double *Gd = to_double(G, t.nq);
        struct { double *x; float *g; size_t n; const char *name; } ts[3] = {
            {qd, dq, t.nq, "dq"}, {kd, dk, t.nk, "dk"}, {vd, dv, t.nk, "dv"}};
        for (int ti = 0; ti < 3; ti++) {
            /* every 7th element keeps the test fast; rows of both context and block keys are hit */
            for (size_t i = 0; i < ts[ti].n; i += 7) {
                double x0 = ts[ti].x[i], h = 1e-5;
                ts[ti].x[i] = x0 + h;
                double lp = naive(&t.c, vis, qd, kd, vd, NULL, NULL, Gd);
                ts[ti].x[i] = x0 - h;
                double lm = naive(&t.c, vis, qd, kd, vd, NULL, NULL, Gd);
                ts[ti].x[i] = x0;
                double fd = (lp - lm) / (2 * h);
                ck_assert_msg(fabs(fd - ts[ti].g[i]) <= 1e-5 + 1e-4 * fabs(fd),
                              "mode %d %s[%zu]: analytic %.8g finite difference %.8g", mi, ts[ti].name, i,
                              ts[ti].g[i], fd);
            }
        }
        free(vis); free(qd); free(kd); free(vd); free(Gd); free(G); free(out); free(lse); free(dq); free(dk); free(dv);
        free_case(&t);
    }
}
END_TEST

/* The backward in the device's precision (round_p 1: P and dS rounded to bf16): round_p 0 is bitwise
 * block_attn_backward_ref; round_p 1 differs from it (the rounding happened) by a few bf16 ulps of the
 * gradients' scale, far inside the GPU test's fixed bound (3% of the max + 5% relative). */
START_TEST(block_attn_backward_prec_ref) {
    for (int mi = 0; mi < 4; mi++) {
        attn_case t;
        make_case(&t, modes[mi][0], modes[mi][1], 300 + mi);
        int R = t.c.N * t.c.B;
        uint64_t rng = 11;
        float *G = malloc(sizeof(float) * t.nq), *out = malloc(sizeof(float) * t.nq);
        float *lse = malloc(sizeof(float) * (size_t)R * t.c.n_h);
        float *g[3][3];   /* [exact, prec 0, prec 1][dq, dk, dv] */
        size_t n[3] = {t.nq, t.nk, t.nk};
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) g[a][b] = malloc(sizeof(float) * n[b]);
        test_rng_fill(&rng, G, t.nq, -1, 1);
        char err[256];
        ck_assert_int_eq(block_attn_forward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, 0, out, lse, err, sizeof err), 0);
        ck_assert_int_eq(block_attn_backward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, out, G, lse, g[0][0], g[0][1],
                                                 g[0][2], err, sizeof err), 0);
        for (int r = 0; r < 2; r++)
            ck_assert_int_eq(block_attn_backward_ref_prec(&t.c, t.q, t.k, t.v, t.anchors, t.doc, out, G, lse, r,
                                                          g[1 + r][0], g[1 + r][1], g[1 + r][2], err, sizeof err), 0);
        double moved = 0;
        for (int b = 0; b < 3; b++) {
            ck_assert(memcmp(g[0][b], g[1][b], sizeof(float) * n[b]) == 0);
            double mx = 0, d = 0;
            for (size_t i = 0; i < n[b]; i++) {
                mx = fmax(mx, fabs(g[0][b][i]));
                d = fmax(d, fabs((double)g[2][b][i] - g[0][b][i]));
            }
            ck_assert_msg(d <= 0.03 * mx + 1e-5, "mode %d grad %d: rounded reference off by %.4g (max %.4g)", mi, b, d, mx);
            moved += d;
        }
        ck_assert_msg(moved > 0, "mode %d: round_p 1 changed nothing", mi);
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) free(g[a][b]);
        free(G); free(out); free(lse);
        free_case(&t);
    }
}
END_TEST

START_TEST(block_attn_rejects_bad_args) {
    attn_case t;
    make_case(&t, 0, 0, 1);
    float out[1], lse[1];
    char err[256];
    t.c.n_kv = 3;
    ck_assert_int_eq(block_attn_forward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, 0, out, lse, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "multiple of n_kv=3"));
    t.c.n_kv = 2;
    t.anchors[0] = 61;
    ck_assert_int_eq(block_attn_forward_ref(&t.c, t.q, t.k, t.v, t.anchors, t.doc, 0, out, lse, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "anchors[0]=61"));
    free_case(&t);
}
END_TEST

/* The shape gate of the GPU block attention (host only): d_h 16-256 with any GQA group; one line otherwise. */
START_TEST(block_attn_gpu_shapes) {
    char err[320];
    block_attn_config c = {8192, 512, 16, 24, 4, 256, 0, 0, 0.0625f};   /* the Qwen3.6-27B drafter */
    ck_assert_int_eq(block_attn_shape_supported(&c, err, sizeof err), 0);
    c.n_h = 32;   /* a group of 8 at B = 16 */
    ck_assert_int_eq(block_attn_shape_supported(&c, err, sizeof err), 0);
    const int taken[4] = {16, 32, 64, 128};
    for (int i = 0; i < 4; i++) {
        c.d_h = taken[i];
        ck_assert_int_eq(block_attn_shape_supported(&c, err, sizeof err), 0);
    }
    c.d_h = 96;
    ck_assert_int_eq(block_attn_shape_supported(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "d_h=96") && strstr(err, "16, 32, 64, 128 or 256") && !strchr(err, '\n'), "%s", err);
    c.d_h = 128;
    c.n_kv = 5;   /* 32 % 5 */
    ck_assert_int_eq(block_attn_shape_supported(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "multiple"), "%s", err);
}
END_TEST

int main(void) {
    Suite *s = suite_create("block_attn");
    TCase *tc = tcase_create("ref");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, block_attn_forward_matches_dense_mask);
    tcase_add_test(tc, block_attn_invisible_keys_ignored);
    tcase_add_test(tc, block_attn_backward_matches_finite_differences);
    tcase_add_test(tc, block_attn_backward_prec_ref);
    tcase_add_test(tc, block_attn_rejects_bad_args);
    tcase_add_test(tc, block_attn_gpu_shapes);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
