/*
 * tests/test_optim.c — stages/train/optim.h and sched.h: AdamW and Muon against plain double
 * formula implementations written here (small matrices, both orientations, weight decay, several
 * steps), the global clip, gradient scaling, the schedules and the non-finite guard.
 */
#include "train/optim.h"
#include "train/sched.h"
#include "kernels/common.h"
#include "testutil.h"

/* ---------------------------------------------------------------- plain formulas (double) */

/* torch.optim.AdamW on one tensor, double. */
static void adamw_double(double *w, double *m, double *v, const double *g, int n, double lr, double wd, int t) {
    for (int i = 0; i < n; i++) {
        w[i] *= 1 - lr * wd;
        m[i] = 0.9 * m[i] + 0.1 * g[i];
        v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
        double mh = m[i] / (1 - pow(0.9, t)), vh = v[i] / (1 - pow(0.999, t));
        w[i] -= lr * mh / (sqrt(vh) + 1e-8);
    }
}

static double rb(double x, int bf) { return bf ? (double)bf16_to_float(float_to_bf16((float)x)) : x; }

/* Muon on one (r, c) matrix, double; bf != 0 rounds to bf16 at the points torch holds bf16 tensors. */
static void muon_double(double *w, double *mom, const double *g, int r, int c, double lr, double wd, int bf) {
    int tr = r > c, m = tr ? c : r, n = tr ? r : c;
    double *x = calloc((size_t)m * n, sizeof *x), *y = calloc((size_t)m * n, sizeof *y);
    double *a = calloc((size_t)m * m, sizeof *a), *b = calloc((size_t)m * m, sizeof *b);
    for (int i = 0; i < r * c; i++) mom[i] = 0.95 * mom[i] + 0.05 * g[i];
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) {
            double u = 0.05 * g[i * c + j] + 0.95 * mom[i * c + j];
            if (tr) x[j * n + i] = rb(u, bf); else x[i * n + j] = rb(u, bf);
        }
    double nrm = 0;
    for (int k = 0; k < m * n; k++) nrm += x[k] * x[k];
    nrm = rb(sqrt(nrm), bf);
    if (nrm < 1e-7) nrm = 1e-7;
    for (int k = 0; k < m * n; k++) x[k] = rb(x[k] / nrm, bf);
    for (int it = 0; it < 5; it++) {
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++) {
                double s = 0;
                for (int k = 0; k < n; k++) s += x[i * n + k] * x[j * n + k];
                a[i * m + j] = rb(s, bf);
            }
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++) {
                double s = 0;
                for (int k = 0; k < m; k++) s += a[i * m + k] * a[k * m + j];
                b[i * m + j] = rb(-4.7750 * a[i * m + j] + 2.0315 * s, bf);
            }
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int k = 0; k < m; k++) s += b[i * m + k] * x[k * n + j];
                y[i * n + j] = rb(3.4445 * x[i * n + j] + s, bf);
            }
        memcpy(x, y, sizeof(double) * m * n);
    }
    double adj = lr * 0.2 * sqrt((double)(r > c ? r : c));
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) {
            double o = tr ? x[j * n + i] : x[i * n + j];
            w[i * c + j] = w[i * c + j] * (1 - lr * wd) - adj * o;
        }
    free(x); free(y); free(a); free(b);
}

/* ---------------------------------------------------------------- a small model table */

enum { NT = 5 };
struct toy {
    struct optim_tensor t[NT];
    float *w[NT], *g[NT];
    double *wd[NT], *md[NT], *vd[NT];
};
static const int64_t toy_shape[NT][2] = { {6, 10}, {12, 5}, {10, 1}, {7, 7}, {9, 4} };
static const char *toy_name[NT] = { "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
                                    "layers.0.input_layernorm.weight", "lm_head.weight", "embed_tokens.weight" };

static int64_t toy_numel(int i) { return toy_shape[i][0] * toy_shape[i][1]; }

static void toy_init(struct toy *z, uint64_t seed) {
    uint64_t rng = seed;
    for (int i = 0; i < NT; i++) {
        int64_t k = toy_numel(i);
        z->w[i] = malloc(k * sizeof(float)); z->g[i] = calloc(k, sizeof(float));
        z->wd[i] = calloc(k, sizeof(double)); z->md[i] = calloc(k, sizeof(double)); z->vd[i] = calloc(k, sizeof(double));
        test_rng_fill(&rng, z->w[i], k, -0.5f, 0.5f);
        for (int64_t j = 0; j < k; j++) z->wd[i][j] = z->w[i][j];
        struct optim_tensor t = { toy_name[i], i == 2 ? 1 : 2, { toy_shape[i][0], i == 2 ? 0 : toy_shape[i][1] },
                                  z->w[i], i == 4 ? NULL : z->g[i], i != 4, i < 2 };
        z->t[i] = t;
    }
}
static void toy_free(struct toy *z) {
    for (int i = 0; i < NT; i++) { free(z->w[i]); free(z->g[i]); free(z->wd[i]); free(z->md[i]); free(z->vd[i]); }
}

static void check_close(const char *what, const float *got, const double *ref, int64_t n, double atol, double rtol) {
    float *r = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) r[i] = (float)ref[i];
    int ok = test_allclose(what, got, r, (size_t)n, atol, rtol);
    free(r);
    ck_assert_msg(ok, "%s differs from the double formula", what);
}

/* Muon + AdamW, several steps with random grads: q/down (6x10 and the rows > cols 12x5 case) by
 * Muon, the norm and lm_head by AdamW, embed_tokens frozen (must not move). */
static void run_muon_adamw(int bf, double atol, double rtol) {
    struct toy z;
    toy_init(&z, 11);
    struct optim_config c;
    optim_config_default(&c);
    c.muon_bf16 = bf;
    c.lr = 3e-3;
    struct optim o;
    char err[256];
    ck_assert_int_eq(optim_init(&o, z.t, NT, &c, err, sizeof err), 0);
    ck_assert_int_eq(o.n_muon, 2);
    ck_assert_int_eq(o.n_adamw, 2);
    ck_assert_int_eq(o.group[4], OPTIM_GROUP_NONE);
    float w4[36];
    memcpy(w4, z.w[4], sizeof w4);
    uint64_t rng = 99;
    for (int s = 1; s <= 4; s++) {
        double mult = 0.25 * s;
        for (int i = 0; i < 4; i++) test_rng_fill(&rng, z.g[i], toy_numel(i), -1, 1);
        double *gd[NT];
        for (int i = 0; i < 4; i++) {
            gd[i] = malloc(toy_numel(i) * sizeof(double));
            for (int64_t j = 0; j < toy_numel(i); j++) gd[i][j] = z.g[i][j];
        }
        ck_assert_int_eq(optim_step(&o, mult, err, sizeof err), 0);
        muon_double(z.wd[0], z.md[0], gd[0], 6, 10, 3e-2 * mult, 0.1, bf);
        muon_double(z.wd[1], z.md[1], gd[1], 12, 5, 3e-2 * mult, 0.1, bf);
        adamw_double(z.wd[2], z.md[2], z.vd[2], gd[2], 10, 3e-3 * mult, 0.01, s);
        adamw_double(z.wd[3], z.md[3], z.vd[3], gd[3], 49, 3e-3 * mult, 0.01, s);
        for (int i = 0; i < 4; i++) free(gd[i]);
    }
    ck_assert_int_eq(o.muon_step, 4);
    ck_assert_int_eq(o.adamw_step, 4);
    check_close("muon 6x10", z.w[0], z.wd[0], 60, atol, rtol);
    check_close("muon 12x5 (transposed)", z.w[1], z.wd[1], 60, atol, rtol);
    check_close("adamw norm", z.w[2], z.wd[2], 10, 1e-6, 1e-5);
    check_close("adamw lm_head", z.w[3], z.wd[3], 49, 1e-6, 1e-5);
    check_close("muon momentum", o.mom[1], z.md[1], 60, 1e-6, 1e-5);
    ck_assert_int_eq(memcmp(w4, z.w[4], sizeof w4), 0);
    optim_free(&o);
    toy_free(&z);
}

START_TEST(muon_adamw_fp32_matches_formula) { run_muon_adamw(0, 2e-6, 1e-5); }
END_TEST

/* bf16 emulation against the same formula rounded at the same points: an occasional rounding flip
 * between float and double accumulation moves one element by one bf16 ulp of the direction (2^-8
 * relative), times adj·lr ≈ 4e-3 per step, so atol 1e-4 over 4 steps. */
START_TEST(muon_bf16_matches_rounded_formula) { run_muon_adamw(1, 1e-4, 1e-4); }
END_TEST

/* The bf16 path really rounds: its direction differs from the fp32 one, but only by bf16 error. */
START_TEST(muon_bf16_rounds) {
    enum { R = 8, C = 16 };
    float u[R * C], o32[R * C], o16[R * C];
    float *scratch = malloc((2 * R * C + 2 * R * R) * sizeof(float));
    uint64_t rng = 3;
    test_rng_fill(&rng, u, R * C, -1, 1);
    struct optim_config c;
    optim_config_default(&c);
    c.muon_bf16 = 0;
    optim_muon_orthogonalize(&c, u, R, C, o32, scratch);
    c.muon_bf16 = 1;
    optim_muon_orthogonalize(&c, u, R, C, o16, scratch);
    ck_assert_int_ne(memcmp(o32, o16, sizeof o32), 0);
    ck_assert(test_allclose("bf16 vs fp32 NS", o16, o32, R * C, 0.05, 0.05));
    for (int k = 0; k < R * C; k++) ck_assert_uint_eq(float_to_bf16(o16[k]), (uint32_t)(*(uint32_t *)&o16[k] >> 16));
    /* NS5 output has singular values near 1: rows are nearly orthonormal (|X·Xᵀ - I| small, loose) */
    for (int i = 0; i < R; i++) {
        double s = 0;
        for (int k = 0; k < C; k++) s += (double)o32[i * C + k] * o32[i * C + k];
        ck_assert_msg(s > 0.4 && s < 1.6, "row %d squared norm %g", i, s);
    }
    free(scratch);
}
END_TEST

/* --optimizer adamw: every trainable tensor (matrices included) by AdamW, checked against the formula. */
START_TEST(adamw_all) {
    struct toy z;
    toy_init(&z, 5);
    struct optim_config c;
    optim_config_default(&c);
    c.kind = OPTIM_ADAMW;
    c.weight_decay = 0.05;
    struct optim o;
    char err[256];
    ck_assert_int_eq(optim_init(&o, z.t, NT, &c, err, sizeof err), 0);
    ck_assert_int_eq(o.n_muon, 0);
    ck_assert_int_eq(o.n_adamw, 4);
    uint64_t rng = 8;
    for (int s = 1; s <= 3; s++) {
        for (int i = 0; i < 4; i++) test_rng_fill(&rng, z.g[i], toy_numel(i), -0.1f, 0.1f);
        for (int i = 0; i < 4; i++) {
            double *gd = malloc(toy_numel(i) * sizeof(double));
            for (int64_t j = 0; j < toy_numel(i); j++) gd[j] = z.g[i][j];
            adamw_double(z.wd[i], z.md[i], z.vd[i], gd, (int)toy_numel(i), 1e-4 * 0.5, 0.05, s);
            free(gd);
        }
        ck_assert_int_eq(optim_step(&o, 0.5, err, sizeof err), 0);
    }
    for (int i = 0; i < 4; i++) check_close(toy_name[i], z.w[i], z.wd[i], toy_numel(i), 1e-7, 1e-5);
    check_close("adamw v", o.v[0], z.vd[0], 60, 1e-10, 1e-4);
    ck_assert_int_eq(optim_step(&o, -1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "-1"));
    optim_free(&o);
    toy_free(&z);
}
END_TEST

START_TEST(init_rejects_bad_tables) {
    struct toy z;
    toy_init(&z, 1);
    struct optim_config c;
    optim_config_default(&c);
    struct optim o;
    char err[256];
    z.t[3].is_matrix = 1;   /* lm_head is never Muon */
    ck_assert_int_eq(optim_init(&o, z.t, NT, &c, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "lm_head.weight"));
    z.t[3].is_matrix = 0;
    z.t[2].g = NULL;        /* trainable without a gradient */
    ck_assert_int_eq(optim_init(&o, z.t, NT, &c, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "input_layernorm"));
    z.t[2].g = z.g[2];
    c.beta1 = 1.0;
    ck_assert_int_eq(optim_init(&o, z.t, NT, &c, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "betas 1"));
    toy_free(&z);
}
END_TEST

/* Global norm over all trainable tensors (frozen excluded), torch's clip factor, scale and zero. */
START_TEST(clip_scale_zero) {
    struct toy z;
    toy_init(&z, 2);
    double ss = 0;
    for (int i = 0; i < NT; i++)
        for (int64_t j = 0; j < toy_numel(i); j++) {
            z.g[i][j] = (float)(0.01 * ((j % 7) - 3) + 0.001 * i);
            if (i != 4) ss += (double)z.g[i][j] * z.g[i][j];
        }
    ck_assert_double_eq_tol(optim_grad_norm(z.t, NT), sqrt(ss), 1e-12);
    float before = z.g[0][1];
    double n0 = optim_clip_grad_norm(z.t, NT, 1e6);    /* below the threshold: unchanged */
    ck_assert_double_eq_tol(n0, sqrt(ss), 1e-12);
    ck_assert(z.g[0][1] == before);
    double n1 = optim_clip_grad_norm(z.t, NT, 0.1);
    ck_assert_double_eq_tol(n1, sqrt(ss), 1e-12);
    ck_assert(sqrt(ss) > 0.1);
    ck_assert_float_eq_tol(z.g[0][1], before * (float)(0.1 / (sqrt(ss) + 1e-6)), 1e-9f);
    ck_assert_double_eq_tol(optim_grad_norm(z.t, NT), 0.1, 1e-6);
    float fz = z.g[4][0];   /* frozen grads are neither counted nor scaled */
    optim_scale_grads(z.t, NT, 0.25f);
    ck_assert_double_eq_tol(optim_grad_norm(z.t, NT), 0.025, 1e-6);
    ck_assert(z.g[4][0] == fz);
    z.g[1][3] = NAN;       /* non-finite norm is returned and grads are left alone */
    float keep = z.g[0][0];
    ck_assert(isnan(optim_clip_grad_norm(z.t, NT, 1.0)));
    ck_assert(z.g[0][0] == keep);
    optim_zero_grad(z.t, NT);
    ck_assert_double_eq(optim_grad_norm(z.t, NT), 0);
    ck_assert(z.g[4][0] == fz);
    toy_free(&z);
}
END_TEST

START_TEST(schedules) {
    struct sched s;
    char err[256];
    ck_assert_int_eq(sched_init(&s, SCHED_LINEAR, 1000, -1, -1, err, sizeof err), 0);
    ck_assert_int_eq(s.warmup, 10);                       /* S // 100 */
    ck_assert_double_eq(sched_factor(&s, 0), 0);          /* f(0) = 0 when w > 0 */
    ck_assert_double_eq_tol(sched_factor(&s, 5), 0.5, 1e-15);
    ck_assert_double_eq(sched_factor(&s, 10), 1);         /* peak */
    ck_assert_double_eq_tol(sched_factor(&s, 505), 0.5, 1e-15);
    ck_assert_double_eq(sched_factor(&s, 1000), 0);       /* end */
    ck_assert_double_eq(sched_factor(&s, 1200), 0);
    ck_assert_int_eq(sched_init(&s, SCHED_COSINE, 110, 10, -1, err, sizeof err), 0);
    ck_assert_double_eq(sched_factor(&s, 0), 0);
    ck_assert_double_eq_tol(sched_factor(&s, 10), 1, 1e-15);
    ck_assert_double_eq_tol(sched_factor(&s, 60), 0.5, 1e-12);   /* half way: cos(π/2) */
    ck_assert_double_eq_tol(sched_factor(&s, 35), 0.5 * (1 + cos(M_PI * 0.25)), 1e-12);
    ck_assert_double_eq_tol(sched_factor(&s, 110), 0, 1e-15);
    ck_assert_int_eq(sched_init(&s, SCHED_LINEAR, 50, -1, 0.1, err, sizeof err), 0);
    ck_assert_int_eq(s.warmup, 5);
    ck_assert_int_eq(sched_init(&s, SCHED_LINEAR, 50, 0, -1, err, sizeof err), 0);
    ck_assert_double_eq(sched_factor(&s, 0), 1);          /* no warm-up: full lr at once */
    ck_assert_int_eq(sched_init(&s, SCHED_NONE, 50, -1, -1, err, sizeof err), 0);
    ck_assert_double_eq(sched_factor(&s, 0), 1);
    ck_assert_double_eq(sched_factor(&s, 49), 1);
    ck_assert_int_eq(sched_init(&s, SCHED_LINEAR, 50, 60, -1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "60"));
    ck_assert_int_eq(sched_init(&s, SCHED_LINEAR, 50, 5, 0.1, err, sizeof err), -1);
    enum sched_kind k;
    ck_assert_int_eq(sched_parse_kind("cosine", &k, err, sizeof err), 0);
    ck_assert_int_eq(k, SCHED_COSINE);
    ck_assert_int_eq(sched_parse_kind("step", &k, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "'step'"));
}
END_TEST

START_TEST(guard) {
    struct optim_guard g;
    char msg[256];
    optim_guard_init(&g, 3);
    ck_assert_int_eq(optim_guard_check(&g, 1, 2.0, 0.5, msg, sizeof msg), OPTIM_GUARD_OK);
    ck_assert_int_eq(optim_guard_check(&g, 2, 2.0, INFINITY, msg, sizeof msg), OPTIM_GUARD_SKIP);
    ck_assert_str_eq(msg, "step 2: grad norm is inf; skipped (1 in a row, 1 in total)");
    ck_assert_int_eq(optim_guard_check(&g, 3, 1.0, 0.5, msg, sizeof msg), OPTIM_GUARD_OK);   /* streak resets */
    ck_assert_int_eq(optim_guard_check(&g, 7, NAN, 0.5, msg, sizeof msg), OPTIM_GUARD_SKIP);
    ck_assert_int_eq(optim_guard_check(&g, 8, 1.0, NAN, msg, sizeof msg), OPTIM_GUARD_SKIP);
    ck_assert_int_eq(optim_guard_check(&g, 9, -INFINITY, 1.0, msg, sizeof msg), OPTIM_GUARD_STOP);
    ck_assert_str_eq(msg, "step 7: loss is nan (first non-finite value); 3 non-finite steps in a row, stopping");
    ck_assert_int_eq(g.skipped_total, 4);
}
END_TEST

int main(void) {
    Suite *s = suite_create("optim");
    TCase *tc = tcase_create("optim");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, muon_adamw_fp32_matches_formula);
    tcase_add_test(tc, muon_bf16_matches_rounded_formula);
    tcase_add_test(tc, muon_bf16_rounds);
    tcase_add_test(tc, adamw_all);
    tcase_add_test(tc, init_rejects_bad_tables);
    tcase_add_test(tc, clip_scale_zero);
    tcase_add_test(tc, schedules);
    tcase_add_test(tc, guard);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
