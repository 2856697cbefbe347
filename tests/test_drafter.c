/*
 * tests/test_drafter.c — the DFlash drafter's CPU step (stages/train/drafter.h) against an independent
 * double-precision forward written here from dflash-reference.md §4–§7 with a dense §6 mask, and against
 * central finite differences of that forward; config validation; anchors and masks by brute force;
 * gradient accumulation; noise; a one-batch overfit run with kernels/adamw_ref.c.
 */
#include "testutil.h"

#include "kernels/adamw.h"
#include "kernels/anchors.h"
#include "kernels/block_attn.h"
#include "kernels/lmhead_loss.h"
#include "model/hfconfig.h"
#include "train/drafter.h"

/* ---------------------------------------------------------------- the tiny drafter */

/* H 16, 2 heads, 1 kv head, d_h 8, I 24, 2 layers (sliding W 4 causal, then full), B 4, N 6, V 40, k 2. */
static void tiny_config(struct drafter_config *c) {
    drafter_config_defaults(c);
    c->target.num_hidden_layers = 4;
    c->target.rope_theta = 10000.0;
    c->target.rope_type = HF_ROPE_DEFAULT;
    c->target.head_dim = 8;
    c->H = 16;
    c->n_h = 2;
    c->n_kv = 1;
    c->d_h = 8;
    c->I = 24;
    c->eps = 1e-6f;
    c->V_t = c->V_d = 40;
    c->B = 4;
    c->L = 2;
    c->layer_type[0] = DRAFTER_LAYER_SLIDING;
    c->layer_type[1] = DRAFTER_LAYER_FULL;
    c->sliding_window = 4;
    c->N = 6;
    c->T_max = 40;
    c->k = 2;
    c->layer_ids[0] = 1;
    c->layer_ids[1] = 2;
    c->mask_token_id = 39;
    c->init_std = 0.3f;   /* large enough that every path carries gradient well above fp32 noise */
}

/* A batch of T tokens over 3 documents (lengths 12, 10, T - 22). Sparse: fewer candidates than N (padding
 * anchors) and a block that runs past T (use T 30, budget 32); dense 1: more candidates than N; dense 2: every
 * token supervised. */
struct tbatch {
    int T, budget, kH, H;
    int32_t ids[64], pos[64], doc[64];
    uint8_t mask[64];
    float hidden[64 * 64], last[64 * 16];
    struct drafter_batch b;
};

static void tiny_batch(struct tbatch *t, const struct drafter_config *c, int T, int budget, uint64_t seed, int dense) {
    memset(t, 0, sizeof *t);
    uint64_t rng = seed;
    t->T = T;
    t->budget = budget;
    t->kH = c->k * c->H;
    t->H = c->H;
    int starts[3] = {0, 12, 22};
    for (int p = 0; p < T; p++) {
        int dd = p >= 22 ? 2 : p >= 12 ? 1 : 0;
        t->doc[p] = dd;
        t->pos[p] = p - starts[dd];
        t->ids[p] = (int32_t)(test_rng_next(&rng) % 38);
    }
    if (dense == 2) {
        for (int p = 0; p < T; p++) t->mask[p] = 1;   /* every slot of every block supervised */
    } else if (dense) {
        /* 13 supervised tokens: more candidates than N = 6 (random selection) */
        int sup[] = {2, 3, 4, 5, 6, 14, 15, 16, 17, 24, 25, 26, 27};
        for (size_t i = 0; i < sizeof sup / sizeof sup[0]; i++) t->mask[sup[i]] = 1;
    } else {
        /* candidates (p < budget - B = 28) 4, 5, 14, 15, 27: one padding anchor at N = 6; 28, 29 are supervised
         * but no candidates, and the block of 27 runs past T = 30 */
        int sup[] = {4, 5, 14, 15, 27, 28, 29};
        for (size_t i = 0; i < sizeof sup / sizeof sup[0]; i++) t->mask[sup[i]] = 1;
    }
    test_rng_fill(&rng, t->hidden, (size_t)T * t->kH, -1.5f, 1.5f);
    test_rng_fill(&rng, t->last, (size_t)T * c->H, -2.0f, 2.0f);
    t->b = (struct drafter_batch){T, budget, t->ids, t->mask, t->pos, t->doc, t->hidden, t->last};
}

static struct drafter *tiny_drafter(const struct drafter_config *c, uint64_t seed) {
    char err[512];
    struct drafter *d = drafter_init(c, seed, err, sizeof err);
    ck_assert_msg(d != NULL, "drafter_init: %s", err);
    uint64_t rng = seed ^ 0x1234;
    size_t ne = (size_t)c->V_t * c->H;
    float *embed = malloc(sizeof *embed * ne), *head = malloc(sizeof *head * ne), norm[64];
    test_rng_fill(&rng, embed, ne, -1, 1);
    test_rng_fill(&rng, head, ne, -1, 1);
    test_rng_fill(&rng, norm, (size_t)c->H, 0.5f, 1.5f);
    ck_assert_msg(drafter_set_frozen(d, embed, norm, head, err, sizeof err) == 0, "%s", err);
    free(embed);
    free(head);
    return d;
}

/* ---------------------------------------------------------------- double reference forward */

struct dref {
    const struct drafter_config *c;
    int np;
    double **w;                  /* per parameter table entry */
    int i_fc, i_hn, i_l0, i_norm, i_embed, i_lm, i_vn, i_vlm;
    float inv_freq[64];
};

static void dref_init(struct dref *r, const struct drafter *d) {
    r->c = drafter_config_of(d);
    r->np = drafter_n_params(d);
    r->w = calloc((size_t)r->np, sizeof *r->w);
    for (int i = 0; i < r->np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        r->w[i] = malloc(sizeof(double) * (size_t)p->numel);
        for (int64_t e = 0; e < p->numel; e++) r->w[i][e] = p->w[e];
        if (!strcmp(p->name, "fc.weight")) r->i_fc = i;
        if (!strcmp(p->name, "hidden_norm.weight")) r->i_hn = i;
        if (!strcmp(p->name, "layers.0.input_layernorm.weight")) r->i_l0 = i;
        if (!strcmp(p->name, "norm.weight")) r->i_norm = i;
        if (!strcmp(p->name, "embed_tokens.weight")) r->i_embed = i;
        if (!strcmp(p->name, "lm_head.weight")) r->i_lm = i;
        if (!strcmp(p->name, "verifier_norm.weight")) r->i_vn = i;
        if (!strcmp(p->name, "verifier_lm_head.weight")) r->i_vlm = i;
    }
    double inv[64];
    hf_rope_inv_freq(&r->c->target, inv);
    for (int i = 0; i < r->c->d_h / 2; i++) r->inv_freq[i] = (float)inv[i];
}

static void dref_free(struct dref *r) {
    for (int i = 0; i < r->np; i++) free(r->w[i]);
    free(r->w);
}

static void d_rms(double *y, const double *x, const double *w, int n, int C, double eps) {
    for (int r = 0; r < n; r++) {
        double ss = 0;
        for (int e = 0; e < C; e++) ss += x[r * C + e] * x[r * C + e];
        double rs = 1.0 / sqrt(ss / C + eps);
        for (int e = 0; e < C; e++) y[r * C + e] = w[e] * x[r * C + e] * rs;
    }
}
/* y[M,N] = x[M,K]·w[N,K]ᵀ */
static void d_lin(double *y, const double *x, const double *w, int M, int N, int K) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += x[m * K + k] * w[n * K + k];
            y[m * N + n] = s;
        }
}
static void d_rope(double *x, int rows, int heads, int dh, const int32_t *pos, const float *inv) {
    for (int r = 0; r < rows; r++)
        for (int h = 0; h < heads; h++) {
            double *v = x + ((size_t)r * heads + h) * dh;
            for (int i = 0; i < dh / 2; i++) {
                double a = (double)((float)pos[r] * inv[i]);
                double x0 = v[i], x1 = v[i + dh / 2];
                v[i] = x0 * cos(a) - x1 * sin(a);
                v[i + dh / 2] = x1 * cos(a) + x0 * sin(a);
            }
        }
}

/* The §6 visibility of key column col (T + N·B columns) for query row (b, j), built from the definition. */
static int vis(const struct drafter_config *c, int sliding, const int32_t *anchors, const int32_t *doc, int T, int b,
               int j, int col) {
    int a = anchors[b], dd = doc[a];
    if (col < T) {
        int p = col;
        if (dd == -1 || doc[p] != dd || p >= a) return 0;
        return !sliding || p >= a - c->sliding_window;
    }
    int bb = (col - T) / c->B, jj = (col - T) % c->B;
    if (bb != b) return 0;
    return !(sliding && !c->sliding_window_non_causal) || jj <= j;
}

/* The loss of one step in double, for anchors/valid and the features as consumed (hid, T·kH). weights (R) in/out:
 * with freeze the given row weights are used (stop-gradient D-PACE); else they are computed and written. Also
 * writes xn_out (R·H) when not NULL. */
static double dref_loss(const struct dref *r, const struct tbatch *tb, const float *hid, const int32_t *anchors,
                        const uint8_t *valid, double *weights, int freeze, double *xn_out) {
    const struct drafter_config *c = r->c;
    int T = tb->T, N = c->N, B = c->B, R = N * B, H = c->H, I = c->I, kH = c->k * H, nh = c->n_h, nkv = c->n_kv,
        dh = c->d_h, QD = nh * dh, KD = nkv * dh, KV = T + R;
    double *x = calloc((size_t)R * H, 8), *hd = calloc((size_t)T * kH, 8), *cf = calloc((size_t)T * H, 8),
           *ctx = calloc((size_t)T * H, 8), *xn1 = calloc((size_t)R * H, 8), *q = calloc((size_t)R * QD, 8),
           *kin = calloc((size_t)KV * H, 8), *k = calloc((size_t)KV * KD, 8), *v = calloc((size_t)KV * KD, 8),
           *o = calloc((size_t)R * QD, 8), *hh = calloc((size_t)R * H, 8), *xn2 = calloc((size_t)R * H, 8),
           *g = calloc((size_t)R * I, 8), *u = calloc((size_t)R * I, 8), *tmp = calloc((size_t)R * H, 8),
           *s = calloc((size_t)KV, 8);
    int32_t pos[256];
    for (int p = 0; p < T; p++) pos[p] = tb->pos[p];
    for (int b = 0; b < N; b++)
        for (int j = 0; j < B; j++) {
            int tok = j == 0 ? tb->ids[anchors[b]] : (int)c->mask_token_id;
            for (int e = 0; e < H; e++) x[(b * B + j) * H + e] = r->w[r->i_embed][(size_t)tok * H + e];
            pos[T + b * B + j] = tb->pos[anchors[b]] + j;
        }
    for (size_t e = 0; e < (size_t)T * kH; e++) hd[e] = hid[e];
    d_lin(cf, hd, r->w[r->i_fc], T, H, kH);
    d_rms(ctx, cf, r->w[r->i_hn], T, H, c->eps);
    for (int l = 0; l < c->L; l++) {
        double **lw = r->w + r->i_l0 + 11 * l;
        int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        d_rms(xn1, x, lw[0], R, H, c->eps);
        d_lin(q, xn1, lw[1], R, QD, H);
        d_rms(q, q, lw[5], R * nh, dh, c->eps);
        d_rope(q, R, nh, dh, pos + T, r->inv_freq);
        memcpy(kin, ctx, sizeof(double) * (size_t)T * H);
        memcpy(kin + (size_t)T * H, xn1, sizeof(double) * (size_t)R * H);
        d_lin(k, kin, lw[2], KV, KD, H);
        d_lin(v, kin, lw[3], KV, KD, H);
        d_rms(k, k, lw[6], KV * nkv, dh, c->eps);
        d_rope(k, KV, nkv, dh, pos, r->inv_freq);
        for (int b = 0; b < N; b++)
            for (int j = 0; j < B; j++)
                for (int h = 0; h < nh; h++) {
                    int row = b * B + j, gk = h / (nh / nkv);
                    double m = -INFINITY, z = 0;
                    for (int col = 0; col < KV; col++) {
                        s[col] = -INFINITY;
                        if (!vis(c, sliding, anchors, tb->doc, T, b, j, col)) continue;
                        double dot = 0;
                        for (int e = 0; e < dh; e++) dot += q[(row * nh + h) * dh + e] * k[(col * nkv + gk) * dh + e];
                        s[col] = dot / sqrt((double)dh);
                        if (s[col] > m) m = s[col];
                    }
                    for (int col = 0; col < KV; col++) z += s[col] == -INFINITY ? 0 : exp(s[col] - m);
                    for (int e = 0; e < dh; e++) {
                        double acc = 0;
                        for (int col = 0; col < KV; col++)
                            if (s[col] != -INFINITY) acc += exp(s[col] - m) / z * v[(col * nkv + gk) * dh + e];
                        o[(row * nh + h) * dh + e] = acc;
                    }
                }
        d_lin(tmp, o, lw[4], R, H, QD);
        for (size_t e = 0; e < (size_t)R * H; e++) hh[e] = x[e] + tmp[e];
        d_rms(xn2, hh, lw[7], R, H, c->eps);
        d_lin(g, xn2, lw[8], R, I, H);
        d_lin(u, xn2, lw[9], R, I, H);
        for (size_t e = 0; e < (size_t)R * I; e++) g[e] = g[e] / (1 + exp(-g[e])) * u[e];
        d_lin(tmp, g, lw[10], R, H, I);
        for (size_t e = 0; e < (size_t)R * H; e++) x[e] = hh[e] + tmp[e];
    }
    d_rms(xn1, x, r->w[r->i_norm], R, H, c->eps);
    if (xn_out) memcpy(xn_out, xn1, sizeof(double) * (size_t)R * H);
    /* loss (§7) */
    int V = c->V_d;
    double *zz = malloc(sizeof(double) * V), *tt = malloc(sizeof(double) * V), th[64], lrow[1024];
    int mrow[1024];
    double msum = 0;
    for (int row = 0; row < R; row++) {
        int b = row / B, j = row % B, p = anchors[b] + j;
        int m = j != 0 && valid[b] && p < T && tb->mask[p];
        if (c->sample_from_anchor) m = valid[b] && p + 1 < T && tb->mask[p + 1];
        mrow[row] = m;
        lrow[row] = 0;
        if (!m) continue;
        msum += 1;
        int src = c->sample_from_anchor ? p : p - 1;
        double ss = 0;
        for (int e = 0; e < H; e++) ss += (double)tb->last[src * H + e] * tb->last[src * H + e];
        /* the target side is fp32 in the drafter (no gradient): form it the same way */
        float rstd = (float)(1.0 / sqrt(ss / H + c->eps));
        for (int e = 0; e < H; e++) th[e] = (double)(tb->last[src * H + e] * rstd * (float)r->w[r->i_vn][e]);
        int arg = 0;
        for (int vv = 0; vv < V; vv++) {
            double a1 = 0, a2 = 0;
            for (int e = 0; e < H; e++) {
                a1 += xn1[row * H + e] * r->w[r->i_lm][vv * H + e];
                a2 += th[e] * r->w[r->i_vlm][vv * H + e];
            }
            zz[vv] = a1;
            tt[vv] = (double)(float)a2;
            if (tt[vv] > tt[arg]) arg = vv;
        }
        double mz = -INFINITY, mt = -INFINITY, sz = 0, st = 0;
        for (int vv = 0; vv < V; vv++) { if (zz[vv] > mz) mz = zz[vv]; if (tt[vv] > mt) mt = tt[vv]; }
        for (int vv = 0; vv < V; vv++) { sz += exp(zz[vv] - mz); st += exp(tt[vv] - mt); }
        double lz = mz + log(sz), lt = mt + log(st);
        if (c->loss == LMHEAD_LOSS_CE) lrow[row] = lz - zz[arg];
        else {
            double kl = 0;
            for (int vv = 0; vv < V; vv++) kl += exp(tt[vv] - lt) * ((tt[vv] - lt) - (zz[vv] - lz));
            lrow[row] = kl;
        }
    }
    if (!freeze)
        for (int b = 0; b < N; b++) {
            double P = 1, pk[64], suffix = 0;
            for (int j = 0; j < B; j++) {
                int row = b * B + j;
                P *= mrow[row] ? (1 - c->alpha) * exp(-lrow[row]) + c->alpha : 1.0;
                pk[j] = P;
            }
            for (int j = B - 1; j >= 0; j--) {
                int row = b * B + j;
                double w = 1;
                if (c->weighting == LMHEAD_WEIGHT_EXP_DECAY)
                    w = c->sample_from_anchor ? exp(-j / (double)c->gamma) : j == 0 ? 0 : exp(-(j - 1) / (double)c->gamma);
                if (c->weighting == LMHEAD_WEIGHT_DPACE) {
                    suffix += mrow[row] ? pk[j] : 0;
                    w = suffix;
                }
                weights[row] = mrow[row] ? w : 0;
            }
        }
    double L = 0;
    for (int row = 0; row < R; row++) L += weights[row] * lrow[row];
    L /= msum + 1e-5;
    free(zz); free(tt);
    free(x); free(hd); free(cf); free(ctx); free(xn1); free(q); free(kin); free(k); free(v); free(o); free(hh);
    free(xn2); free(g); free(u); free(tmp); free(s);
    return L;
}

/* ---------------------------------------------------------------- forward and gradient vs the double reference */

/* Forward loss vs the double forward, then every parameter group's gradient vs central differences of the
 * double loss (h and the tolerance are justified below). D-PACE weights are held at their unperturbed values in
 * the differences: they are stop-gradient (§7.3). */
static void check_grad(int loss, int weighting, int non_causal, int sample_from_anchor) {
    struct drafter_config c;
    tiny_config(&c);
    c.loss = loss;
    c.weighting = weighting;
    c.sliding_window_non_causal = non_causal;
    c.sample_from_anchor = sample_from_anchor;
    struct drafter *d = tiny_drafter(&c, 7);
    struct tbatch tb;
    tiny_batch(&tb, &c, 30, 32, 11, 0);
    char err[512];
    struct drafter_metrics m;
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step(d, &tb.b, 5, 3, 1, &m, err, sizeof err) == 0, "%s", err);
    struct drafter_last last;
    drafter_last_step(d, &last);
    int K = 0;
    for (int b = 0; b < c.N; b++) K += last.valid[b];
    ck_assert_msg(K > 0 && K < c.N, "want padding anchors: K=%d of N=%d", K, c.N);
    int past = 0;
    for (int b = 0; b < c.N; b++) past |= last.valid[b] && last.anchors[b] + c.B > tb.T;
    ck_assert_msg(past, "want a block running past the batch end");

    struct dref r;
    dref_init(&r, d);
    double wts[1024];
    double L0 = dref_loss(&r, &tb, last.hidden_used, last.anchors, last.valid, wts, 0, NULL);
    ck_assert_msg(fabs(L0 - m.loss_sum) <= 2e-5 * fabs(L0) + 1e-6, "loss %.9g vs double %.9g", m.loss_sum, L0);
    ck_assert_msg(L0 > 0.1, "loss %.3g too small to test gradients", L0);

    /* Central differences of the double loss with h = 1e-5: truncation O(h²·L''') ~ 1e-10 and rounding
     * ~ 1e-16·L/h ~ 1e-11, so the FD value is exact to ~1e-9. The analytic gradient comes from the fp32 step
     * (float storage, double accumulation in the refs): its error is ~1e-6 relative to the group's scale. The
     * tolerance |g - fd| <= 2e-3·max|fd of the group| + 2e-3·|fd| leaves a 100x margin over that while a wrong
     * term (missing path, wrong sign, wrong mask) shows up at O(1) of the group scale. */
    const double h = 1e-5;
    uint64_t rng = 99;
    int groups = 0;
    for (int i = 0; i < r.np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->trainable) {
            ck_assert_ptr_null(p->g);
            continue;
        }
        groups++;
        int ns = p->numel < 6 ? (int)p->numel : 6;
        double fd[6], ga[6], scale = 0;
        int64_t idx[6];
        for (int s = 0; s < ns; s++) {
            idx[s] = (int64_t)(test_rng_next(&rng) % (uint64_t)p->numel);
            double w0 = r.w[i][idx[s]];
            r.w[i][idx[s]] = w0 + h;
            double Lp = dref_loss(&r, &tb, last.hidden_used, last.anchors, last.valid, wts, 1, NULL);
            r.w[i][idx[s]] = w0 - h;
            double Lm = dref_loss(&r, &tb, last.hidden_used, last.anchors, last.valid, wts, 1, NULL);
            r.w[i][idx[s]] = w0;
            fd[s] = (Lp - Lm) / (2 * h);
            ga[s] = p->g[idx[s]];
            if (fabs(fd[s]) > scale) scale = fabs(fd[s]);
        }
        /* the group's scale: the largest analytic entry of the whole tensor (robust when the samples are tiny) */
        for (int64_t e = 0; e < p->numel; e++) if (fabs(p->g[e]) > scale) scale = fabs(p->g[e]);
        ck_assert_msg(scale > 1e-6, "%s: gradient is identically ~0 (scale %.3g)", p->name, scale);
        for (int s = 0; s < ns; s++)
            ck_assert_msg(fabs(ga[s] - fd[s]) <= 2e-3 * scale + 2e-3 * fabs(fd[s]),
                          "%s[%lld]: analytic %.9g vs finite difference %.9g (group scale %.3g) loss=%d w=%d nc=%d sfa=%d",
                          p->name, (long long)idx[s], ga[s], fd[s], scale, loss, weighting, non_causal,
                          sample_from_anchor);
    }
    ck_assert_int_eq(groups, 2 + 11 * c.L + 1);
    dref_free(&r);
    drafter_free(d);
}

START_TEST(drafter_grad_ce_dpace) { check_grad(LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 0, 0); }
END_TEST
START_TEST(drafter_grad_kl_expdecay) { check_grad(LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 0, 0); }
END_TEST
START_TEST(drafter_grad_ce_none_noncausal) { check_grad(LMHEAD_LOSS_CE, LMHEAD_WEIGHT_NONE, 1, 0); }
END_TEST
START_TEST(drafter_grad_kl_sample_from_anchor) { check_grad(LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 0, 1); }
END_TEST

/* ---------------------------------------------------------------- anchors and masks by brute force */

START_TEST(drafter_anchors_brute_force) {
    struct drafter_config c;
    tiny_config(&c);
    struct drafter *d = tiny_drafter(&c, 1);
    struct tbatch tb;
    tiny_batch(&tb, &c, 30, 32, 3, 1);
    char err[512];
    for (uint64_t step = 0; step < 20; step++) {
        struct drafter_metrics m;
        ck_assert_msg(drafter_step(d, &tb.b, 17, step, 0, &m, err, sizeof err) == 0, "%s", err);
        struct drafter_last last;
        drafter_last_step(d, &last);
        /* candidates by definition: supervised and p < budget - B (the batch stays unpadded) */
        int cand[64], nc = 0;
        for (int p = 0; p < tb.budget - c.B; p++)
            if (p < tb.T && tb.mask[p]) cand[nc++] = p;
        int K = nc < c.N ? nc : c.N;
        ck_assert_int_eq(m.n_anchors, K);
        /* the chosen set = the K candidates with the smallest keys, sorted ascending, then padding (0, invalid) */
        int chosen[64] = {0};
        for (int t = 0; t < K; t++) {
            int best = -1;
            for (int i = 0; i < nc; i++) {
                if (chosen[i]) continue;
                if (best < 0 || anchors_key(17, step, (uint32_t)cand[i]) < anchors_key(17, step, (uint32_t)cand[best]))
                    best = i;
            }
            chosen[best] = 1;
        }
        int b = 0;
        for (int i = 0; i < nc; i++)
            if (chosen[i]) {
                ck_assert_int_eq(last.anchors[b], cand[i]);
                ck_assert_int_eq(last.valid[b], 1);
                b++;
            }
        for (; b < c.N; b++) {
            ck_assert_int_eq(last.anchors[b], 0);
            ck_assert_int_eq(last.valid[b], 0);
        }
        /* row mask (§5 with the budget): m = loss_mask[a + j]·valid·[j != 0], 0 past the batch */
        for (int s = 0; s < c.N * c.B; s++) {
            int bb = s / c.B, j = s % c.B, p = last.anchors[bb] + j;
            int want = j != 0 && last.valid[bb] && p < tb.T && tb.mask[p];
            ck_assert_msg(last.row_mask[s] == want, "row %d: mask %d, want %d", s, last.row_mask[s], want);
        }
    }
    drafter_free(d);
}
END_TEST

/* What block_attn_forward_ref attends to equals the dense §6 matrix built from the definition: with one-hot
 * values (value row col = e_col) the output of row (b, j) is the softmax row itself, non-zero exactly on the
 * visible columns. Sliding causal, sliding non-causal and full, several documents, padding anchors. */
START_TEST(drafter_mask_dense) {
    struct drafter_config c;
    tiny_config(&c);
    int T = 30, N = 6, B = 4, R = N * B, KV = T + R;
    int32_t doc[30], anchors[6] = {0, 3, 9, 14, 25, 0};
    for (int p = 0; p < T; p++) doc[p] = p >= 22 ? 2 : p >= 12 ? 1 : 0;
    anchors[5] = 0;   /* padding */
    int modes[3][2] = {{1, 0}, {1, 1}, {0, 0}};
    float *v = calloc((size_t)KV * KV, 4),
          *o = calloc((size_t)R * KV, 4), lse[64];
    for (int i = 0; i < KV; i++) v[(size_t)i * KV + i] = 1.0f;   /* one-hot values: d_h = KV */
    for (int mi = 0; mi < 3; mi++) {
        c.sliding_window_non_causal = modes[mi][1];
        int sliding = modes[mi][0];
        block_attn_config ac = {T, N, B, 1, 1, KV, sliding ? c.sliding_window : 0,
                                sliding && !c.sliding_window_non_causal, 1.0f};
        /* q = k = 0: uniform scores, so every visible column gets 1/count */
        float *qq = calloc((size_t)R * KV, 4), *kk = calloc((size_t)KV * KV, 4);
        char err[256];
        ck_assert_msg(block_attn_forward_ref(&ac, qq, kk, v, anchors, doc, 0, o, lse, err, sizeof err) == 0, "%s", err);
        for (int b = 0; b < N; b++)
            for (int j = 0; j < B; j++) {
                int row = b * B + j, cnt = 0;
                for (int col = 0; col < KV; col++) cnt += vis(&c, sliding, anchors, doc, T, b, j, col);
                ck_assert_int_gt(cnt, 0);
                for (int col = 0; col < KV; col++) {
                    float want = vis(&c, sliding, anchors, doc, T, b, j, col) ? 1.0f / cnt : 0.0f;
                    ck_assert_msg(fabsf(o[(size_t)row * KV + col] - want) < 1e-6f,
                                  "mode %d row (%d,%d) col %d: %g, want %g", mi, b, j, col, o[(size_t)row * KV + col],
                                  want);
                }
            }
        free(qq);
        free(kk);
    }
    free(v); free(o);
}
END_TEST

/* ---------------------------------------------------------------- metrics by hand */

START_TEST(drafter_eal_blocks_by_hand) {
    /* 3 blocks of B = 4: block 0: slots 1,2 correct, 3 wrong -> 3; block 1: slot 1 wrong -> 1; block 2: nothing
     * supervised -> not counted. Block 3: slot 1 unsupervised, slot 2 correct -> run stops at slot 1 -> 1. */
    uint8_t mask[16] = {0, 1, 1, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0};
    int32_t pred[16] = {0, 5, 6, 7, 0, 1, 2, 3, 0, 0, 0, 0, 0, 9, 9, 0};
    int32_t tgt[16] = {1, 5, 6, 8, 0, 2, 2, 3, 0, 0, 0, 0, 0, 9, 9, 0};
    double sum = 0;
    int64_t count = 0;
    lmhead_eal_blocks(mask, pred, tgt, 4, 4, 1, &sum, &count);
    ck_assert_int_eq(count, 3);
    ck_assert_double_eq_tol(sum, 3 + 1 + 1, 1e-12);
    /* sample_from_anchor: slot 0 counts too; block 0 slot 0 is unsupervised -> run 0 -> 1 */
    uint8_t mask2[4] = {1, 1, 1, 0};
    int32_t p2[4] = {4, 5, 6, 0}, t2[4] = {4, 5, 7, 0};
    sum = 0;
    count = 0;
    lmhead_eal_blocks(mask2, p2, t2, 1, 4, 0, &sum, &count);
    ck_assert_int_eq(count, 1);
    ck_assert_double_eq_tol(sum, 3, 1e-12);
    /* pooling: (sum, count) pairs add */
    struct drafter_metrics a, b2;
    drafter_metrics_zero(&a, 4);
    drafter_metrics_zero(&b2, 4);
    a.eal_sum = 5;
    a.eal_count = 3;
    a.correct[1] = 2; a.total[1] = 3; a.correct[2] = 1; a.total[2] = 2;
    b2.eal_sum = 3;
    b2.eal_count = 1;
    b2.correct[1] = 1; b2.total[1] = 1; b2.correct[2] = 1; b2.total[2] = 2;
    drafter_metrics_add(&a, &b2);
    ck_assert_double_eq_tol(a.eal_sum / a.eal_count, 2.0, 1e-12);
    /* marginal: acc1 = 3/4, acc2 = 2/4 -> 0.75 + 0.375 (+ slot 3: 0) */
    ck_assert_double_eq_tol(drafter_metrics_eal_marginal(&a), 0.75 + 0.375, 1e-12);
}
END_TEST

/* The step's metrics against a recount from the per-row argmaxes (§8), and the loss is finite and positive. */
START_TEST(drafter_metrics_consistent) {
    struct drafter_config c;
    tiny_config(&c);
    struct drafter *d = tiny_drafter(&c, 2);
    struct tbatch tb;
    tiny_batch(&tb, &c, 30, 32, 5, 1);
    char err[512];
    struct drafter_metrics m;
    ck_assert_msg(drafter_step(d, &tb.b, 1, 0, 0, &m, err, sizeof err) == 0, "%s", err);
    struct drafter_last last;
    drafter_last_step(d, &last);
    int64_t corr[8] = {0}, tot[8] = {0}, fc = 0, ft = 0;
    for (int s = 0; s < c.N * c.B; s++)
        if (last.row_mask[s]) {
            tot[s % c.B]++;
            corr[s % c.B] += last.pred[s] == last.tgt[s];
            ck_assert_int_ge(last.tgt[s], 0);
        }
    for (int j = 0; j < c.B; j++) {
        ck_assert_int_eq(m.correct[j], corr[j]);
        ck_assert_int_eq(m.total[j], tot[j]);
        if (j >= 1) { fc += corr[j]; ft += tot[j]; }
    }
    ck_assert_int_eq(m.full_correct, fc);
    ck_assert_int_eq(m.full_total, ft);
    ck_assert_int_eq(m.total[0], 0);
    ck_assert(ft > 0);
    ck_assert(m.eal_count > 0 && m.eal_sum >= m.eal_count && m.eal_sum <= m.eal_count * (double)c.B);
    ck_assert(isfinite(m.loss_sum) && m.loss_sum > 0 && m.loss_count == 1);
    drafter_free(d);
}
END_TEST

/* ---------------------------------------------------------------- accumulation, noise, config */

/* Two documents whose last B tokens are unsupervised and N >= all candidates (anchors deterministic), no noise,
 * CE without weights: micro-batches doc1, doc2 with counts M1, M2 accumulate to M1·g1 + M2·g2 = (M1 + M2)·g of
 * the packed batch (§7.2 normalises per batch by its supervised count). Also: accumulation is +=. */
START_TEST(drafter_grad_accumulation) {
    struct drafter_config c;
    tiny_config(&c);
    c.noise = 0;
    c.weighting = LMHEAD_WEIGHT_NONE;
    c.N = 12;
    struct drafter *d = tiny_drafter(&c, 4);
    int T1 = 12, T2 = 10, T = T1 + T2;
    struct tbatch big, b1, b2;
    tiny_batch(&big, &c, 30, 30, 21, 0);
    /* rebuild as two documents of 12 and 10 tokens */
    for (int p = 0; p < T; p++) {
        big.doc[p] = p < T1 ? 0 : 1;
        big.pos[p] = p < T1 ? p : p - T1;
        big.mask[p] = 0;
    }
    int sup[] = {1, 2, 3, 5, 6, 7, 13, 14, 15, 16};
    for (size_t i = 0; i < sizeof sup / sizeof sup[0]; i++) big.mask[sup[i]] = 1;
    big.T = big.budget = T;
    big.b.T = big.b.budget = T;
    b1 = big;
    b1.T = b1.budget = T1;
    b1.b = (struct drafter_batch){T1, T1, b1.ids, b1.mask, b1.pos, b1.doc, b1.hidden, b1.last};
    b2 = big;
    memmove(b2.ids, big.ids + T1, sizeof(int32_t) * T2);
    memmove(b2.pos, big.pos + T1, sizeof(int32_t) * T2);
    memmove(b2.mask, big.mask + T1, T2);
    for (int p = 0; p < T2; p++) b2.doc[p] = 0;
    memmove(b2.hidden, big.hidden + (size_t)T1 * big.kH, sizeof(float) * T2 * big.kH);
    memmove(b2.last, big.last + (size_t)T1 * c.H, sizeof(float) * T2 * c.H);
    b2.T = b2.budget = T2;
    b2.b = (struct drafter_batch){T2, T2, b2.ids, b2.mask, b2.pos, b2.doc, b2.hidden, b2.last};
    big.b = (struct drafter_batch){T, T, big.ids, big.mask, big.pos, big.doc, big.hidden, big.last};

    char err[512];
    struct drafter_metrics m1, m2, mb;
    int np = drafter_n_params(d);
    double **g1 = calloc((size_t)np, sizeof *g1);
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step(d, &b1.b, 3, 0, 1, &m1, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        g1[i] = malloc(sizeof(double) * (size_t)p->numel);
        for (int64_t e = 0; e < p->numel; e++) g1[i][e] = p->g[e];
    }
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step(d, &b2.b, 3, 0, 1, &m2, err, sizeof err) == 0, "%s", err);
    double M1 = (double)m1.full_total, M2 = (double)m2.full_total;
    ck_assert(M1 > 0 && M2 > 0);
    double **acc = calloc((size_t)np, sizeof *acc);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        acc[i] = malloc(sizeof(double) * (size_t)p->numel);
        for (int64_t e = 0; e < p->numel; e++) acc[i][e] = M1 * g1[i][e] + M2 * p->g[e];
    }
    /* += semantics: g after b1 then b2 without zeroing = g1 + g2 */
    ck_assert_msg(drafter_step(d, &b1.b, 3, 0, 1, &m1, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        for (int64_t e = 0; e < p->numel; e++) {
            double g2 = (acc[i][e] - M1 * g1[i][e]) / M2;
            ck_assert_msg(fabs(p->g[e] - (g1[i][e] + g2)) <= 1e-5 * (fabs(g1[i][e]) + fabs(g2)) + 1e-9,
                          "%s[%lld]: accumulated %.9g, want %.9g", p->name, (long long)e, p->g[e], g1[i][e] + g2);
        }
    }
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step(d, &big.b, 3, 0, 1, &mb, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(mb.full_total, m1.full_total + m2.full_total);
    ck_assert_int_eq(mb.n_anchors, m1.n_anchors + m2.n_anchors);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        double scale = 0;
        for (int64_t e = 0; e < p->numel; e++) if (fabs(acc[i][e]) > scale) scale = fabs(acc[i][e]);
        for (int64_t e = 0; e < p->numel; e++) {
            double want = acc[i][e] / (M1 + M2);
            ck_assert_msg(fabs(p->g[e] - want) <= 1e-4 * scale / (M1 + M2) + 1e-5 * fabs(want),
                          "%s[%lld]: packed %.9g vs accumulated %.9g", p->name, (long long)e, p->g[e], want);
        }
        free(g1[i]);
        free(acc[i]);
    }
    free(g1);
    free(acc);
    drafter_free(d);
}
END_TEST

/* Noise: train only, not on last, in [-0.05, 0.05], mean ~0, a function of (seed, step) only. */
START_TEST(drafter_noise) {
    struct drafter_config c;
    tiny_config(&c);
    struct drafter *d = tiny_drafter(&c, 1);
    struct tbatch tb;
    tiny_batch(&tb, &c, 30, 32, 5, 1);
    char err[512];
    size_t n = (size_t)tb.T * tb.kH;
    float *n1 = malloc(n * 4), *n2 = malloc(n * 4);
    struct drafter_last last;
    struct drafter_metrics m;
    ck_assert(drafter_step(d, &tb.b, 9, 4, 0, &m, err, sizeof err) == 0);
    drafter_last_step(d, &last);
    for (size_t e = 0; e < n; e++) ck_assert(last.hidden_used[e] == tb.hidden[e]);
    ck_assert(drafter_step(d, &tb.b, 9, 4, 1, &m, err, sizeof err) == 0);
    drafter_last_step(d, &last);
    double mean = 0, maxabs = 0;
    for (size_t e = 0; e < n; e++) {
        n1[e] = last.hidden_used[e] - tb.hidden[e];
        mean += n1[e];
        if (fabs(n1[e]) > maxabs) maxabs = fabs(n1[e]);
    }
    mean /= (double)n;
    ck_assert_msg(maxabs <= 0.05 + 1e-6 && maxabs > 0.04, "noise max |.| %g", maxabs);
    ck_assert_msg(fabs(mean) < 0.005, "noise mean %g", mean);
    ck_assert(drafter_step(d, &tb.b, 9, 4, 1, &m, err, sizeof err) == 0);
    drafter_last_step(d, &last);
    for (size_t e = 0; e < n; e++) ck_assert(last.hidden_used[e] - tb.hidden[e] == n1[e]);
    ck_assert(drafter_step(d, &tb.b, 9, 5, 1, &m, err, sizeof err) == 0);
    drafter_last_step(d, &last);
    int same = 0;
    for (size_t e = 0; e < n; e++) {
        n2[e] = last.hidden_used[e] - tb.hidden[e];
        same += n2[e] == n1[e];
    }
    ck_assert_msg(same < (int)(n / 50), "step 5 noise equals step 4's at %d of %zu", same, n);
    free(n1);
    free(n2);
    drafter_free(d);
}
END_TEST

START_TEST(drafter_config_errors) {
    struct drafter_config c;
    char err[512];
    tiny_config(&c);
    ck_assert_msg(drafter_config_check(&c, err, sizeof err) == 0, "%s", err);
    c.loss = LMHEAD_LOSS_KL;
    c.weighting = LMHEAD_WEIGHT_DPACE;
    ck_assert_int_eq(drafter_config_check(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "D-PACE") != NULL, "%s", err);
    tiny_config(&c);
    c.mask_token_id = 40;
    ck_assert_int_eq(drafter_config_check(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "mask token id 40") != NULL, "%s", err);
    tiny_config(&c);
    c.layer_ids[1] = 4;
    ck_assert_int_eq(drafter_config_check(&c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "outside the target") != NULL, "%s", err);
    c.ids_convention = DRAFTER_IDS_SPECULATORS;   /* speculators 4 = z-lab 3: fine */
    ck_assert_msg(drafter_config_check(&c, err, sizeof err) == 0, "%s", err);
    tiny_config(&c);
    ck_assert_int_eq(drafter_parse_layer_types(&c, "sliding,full_causal", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "bidirectional") != NULL, "%s", err);
    ck_assert_int_eq(drafter_parse_layer_types(&c, "sliding,bogus", err, sizeof err), -1);
    ck_assert_int_eq(drafter_parse_layer_types(&c, "sliding_attention,sliding,full", err, sizeof err), 0);
    ck_assert_int_eq(c.L, 3);
    ck_assert_int_eq(c.layer_type[2], DRAFTER_LAYER_FULL);
    ck_assert_int_eq(drafter_parse_layer_types(&c, "all-sliding", err, sizeof err), 0);
    ck_assert_int_eq(c.L, 3);
    ck_assert_int_eq(c.layer_type[2], DRAFTER_LAYER_SLIDING);
    /* defaults: speculators' */
    drafter_config_defaults(&c);
    ck_assert_int_eq(c.B, 16);
    ck_assert_int_eq(c.L, 5);
    ck_assert_int_eq(c.N, 512);
    ck_assert_int_eq(c.sliding_window, 2048);
    ck_assert_int_eq(c.layer_type[3], DRAFTER_LAYER_SLIDING);
    ck_assert_int_eq(c.layer_type[4], DRAFTER_LAYER_FULL);
    ck_assert_int_eq(c.loss, LMHEAD_LOSS_CE);
    ck_assert_int_eq(c.weighting, LMHEAD_WEIGHT_DPACE);
    /* features descriptor mismatches */
    tiny_config(&c);
    struct desc_features f;
    memset(&f, 0, sizeof f);
    f.layout = DESC_LAYOUT_CONCAT;
    f.dtype = DESC_DTYPE_BF16;
    f.hidden_size = 16;
    f.n_layers = 2;
    f.layers[0] = 1;
    f.layers[1] = 2;
    f.batch.n_tokens = 30;
    f.batch.budget = 40;
    ck_assert_msg(drafter_check_features(&c, &f, err, sizeof err) == 0, "%s", err);
    f.layers[1] = 3;
    ck_assert_int_eq(drafter_check_features(&c, &f, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "captured layer 1") != NULL, "%s", err);
    f.layers[1] = 2;
    f.hidden_size = 32;
    ck_assert_int_eq(drafter_check_features(&c, &f, err, sizeof err), -1);
    f.hidden_size = 16;
    f.layout = DESC_LAYOUT_SPLIT;
    ck_assert_int_eq(drafter_check_features(&c, &f, err, sizeof err), -1);
    f.layout = DESC_LAYOUT_CONCAT;
    f.n_layers = 3;
    ck_assert_int_eq(drafter_check_features(&c, &f, err, sizeof err), -1);
    /* a speculators-convention config expects z-lab ids one lower in the descriptor */
    f.n_layers = 2;
    c.ids_convention = DRAFTER_IDS_SPECULATORS;
    ck_assert_int_eq(drafter_check_features(&c, &f, err, sizeof err), -1);
    f.layers[0] = 0;
    f.layers[1] = 1;
    ck_assert_msg(drafter_check_features(&c, &f, err, sizeof err) == 0, "%s", err);
}
END_TEST

/* The parameter table: names, shapes, trainable / Muon flags, init statistics, frozen NaN until loaded. */
START_TEST(drafter_param_table) {
    struct drafter_config c;
    tiny_config(&c);
    c.init_std = 0.02f;
    char err[512];
    struct drafter *d = drafter_init(&c, 3, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    ck_assert_int_eq(drafter_n_params(d), 2 + 11 * 2 + 5);
    const struct drafter_param *p = drafter_param_find(d, "fc.weight");
    ck_assert(p && p->shape[0] == 16 && p->shape[1] == 32 && p->trainable && p->is_matrix && p->g);
    double s = 0, s2 = 0;
    for (int64_t e = 0; e < p->numel; e++) { s += p->w[e]; s2 += (double)p->w[e] * p->w[e]; }
    ck_assert_msg(fabs(sqrt(s2 / p->numel) - 0.02) < 0.004, "fc std %g", sqrt(s2 / p->numel));
    p = drafter_param_find(d, "layers.1.self_attn.k_proj.weight");
    ck_assert(p && p->shape[0] == 8 && p->shape[1] == 16 && p->is_matrix);
    p = drafter_param_find(d, "layers.0.self_attn.q_norm.weight");
    ck_assert(p && p->ndim == 1 && p->shape[0] == 8 && p->trainable && !p->is_matrix && p->w[3] == 1.0f);
    p = drafter_param_find(d, "layers.0.mlp.down_proj.weight");
    ck_assert(p && p->shape[0] == 16 && p->shape[1] == 24);
    const char *frozen[] = {"embed_tokens.weight", "lm_head.weight", "verifier_norm.weight", "verifier_lm_head.weight"};
    for (int i = 0; i < 4; i++) {
        p = drafter_param_find(d, frozen[i]);
        ck_assert_msg(p && !p->trainable && !p->is_matrix && p->g == NULL && isnan(p->w[0]), "%s", frozen[i]);
    }
    /* same seed, same init; another seed, another */
    struct drafter *d2 = drafter_init(&c, 3, err, sizeof err), *d3 = drafter_init(&c, 4, err, sizeof err);
    ck_assert(memcmp(drafter_param_find(d, "fc.weight")->w, drafter_param_find(d2, "fc.weight")->w, 16 * 32 * 4) == 0);
    ck_assert(memcmp(drafter_param_find(d, "fc.weight")->w, drafter_param_find(d3, "fc.weight")->w, 16 * 32 * 4) != 0);
    drafter_free(d);
    drafter_free(d2);
    drafter_free(d3);
}
END_TEST

/* The drafter's RoPE covers its whole head even when the target's covers a part (a Qwen3.5/3.6 target's rotary_dim;
 * the export writes no partial factor): 1 / theta^(2i / d_h) for every i < d_h / 2. Before the fix a drafter of a
 * hybrid target read the target's rotary_dim: wrong exponents, and d_h / 2 - rotary_dim / 2 uninitialised entries. */
START_TEST(drafter_rope_whole_head) {
    struct drafter_config c;
    tiny_config(&c);
    c.target.head_dim = 16;
    c.target.rotary_dim = 4;   /* the target rotates 4 of its 16 dims */
    c.d_h = 16;
    float inv[8];
    for (int i = 0; i < 8; i++) inv[i] = NAN;
    drafter_rope_inv_freq(&c, inv);
    for (int i = 0; i < 8; i++) {
        double want = 1.0 / pow(10000.0, 2.0 * i / 16.0);
        ck_assert_msg(fabs(inv[i] - want) <= 1e-6 * want, "inv_freq[%d] = %g, expected %g", i, inv[i], want);
    }
}
END_TEST

/* ---------------------------------------------------------------- overfit one batch */

START_TEST(drafter_overfit_one_batch) {
    struct drafter_config c;
    tiny_config(&c);
    c.init_std = 0.1f;
    c.noise = 0;
    c.N = 26;   /* = every candidate (p < T - B), so the anchors are the same each step */
    struct drafter *d = tiny_drafter(&c, 12);
    struct tbatch tb;
    tiny_batch(&tb, &c, 30, 30, 8, 2);
    char err[512];
    int np = drafter_n_params(d);
    float **mm = calloc((size_t)np, sizeof *mm), **vv = calloc((size_t)np, sizeof *vv);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        mm[i] = calloc((size_t)p->numel, 4);
        vv[i] = calloc((size_t)p->numel, 4);
    }
    struct drafter_metrics m;
    double first_loss = 0;
    int steps = 300;
    for (int s = 1; s <= steps; s++) {
        drafter_zero_grad(d);
        ck_assert_msg(drafter_step(d, &tb.b, 1, (uint64_t)s, 1, &m, err, sizeof err) == 0, "%s", err);
        if (s == 1) first_loss = m.loss_sum;
        adamw_params ap = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, s, 0.0f};
        for (int i = 0; i < np; i++) {
            const struct drafter_param *p = drafter_param(d, i);
            if (!p->g) continue;
            ck_assert_msg(adamw_step_ref(p->w, mm[i], vv[i], p->g, NULL, (size_t)p->numel, &ap, 0, err, sizeof err) == 0,
                          "%s", err);
        }
    }
    ck_assert_msg(drafter_step(d, &tb.b, 1, 0, 0, &m, err, sizeof err) == 0, "%s", err);
    double full = (double)m.full_correct / (double)m.full_total, eal = m.eal_sum / (double)m.eal_count;
    fprintf(stderr, "overfit: loss %.4f -> %.4f, full_acc %.3f, eal %.3f (B=%d), eal_marginal %.3f\n", first_loss,
            m.loss_sum, full, eal, c.B, m.eal_marginal);
    ck_assert_msg(full >= 0.95, "full accuracy %.3f after %d steps", full, steps);
    ck_assert_msg(eal >= c.B - 0.5, "EAL %.3f, want near B=%d", eal, c.B);
    ck_assert(m.loss_sum < 0.1 * first_loss);
    for (int i = 0; i < np; i++) { free(mm[i]); free(vv[i]); }
    free(mm);
    free(vv);
    drafter_free(d);
}
END_TEST


/* ---------------------------------------------------------------- fast path vs the reference composition */

/* drafter_step_fast (BLAS, fused loss, fp32 attention) against drafter_step_cpu (the kernels/<op>_ref.c
 * composition) in four loss / weighting / mask modes: the same anchors, masks, argmaxes and metrics exactly, the
 * loss within 1e-5 relative, every gradient within 2e-5 of the largest |g| of its tensor plus 1e-4 relative (both
 * paths are fp32 end to end; the reference accumulates its dot products in double, the fast one in fp32, so they
 * differ by fp32 rounding carried through 2 layers and the backward; measured about 1e-6 of the scale). Then the
 * fast step on 1 and on 3 threads: bitwise the same gradients and loss (what makes resume exact on any thread
 * count). */
static void check_fast(int loss, int weighting, int non_causal, int sample_from_anchor) {
    struct drafter_config c;
    tiny_config(&c);
    c.loss = loss;
    c.weighting = weighting;
    c.sliding_window_non_causal = non_causal;
    c.sample_from_anchor = sample_from_anchor;
    struct drafter *d = tiny_drafter(&c, 7);
    struct tbatch tb;
    tiny_batch(&tb, &c, 30, 32, 11, 0);
    char err[512];
    struct drafter_metrics mr, mf, m3;
    int np = drafter_n_params(d);
    float **gr = calloc((size_t)np, sizeof *gr);
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step_cpu(d, &tb.b, 5, 3, 1, &mr, err, sizeof err) == 0, "%s", err);
    struct drafter_last last;
    drafter_last_step(d, &last);
    int R = c.N * c.B;
    int32_t pred[64], tgt[64];
    memcpy(pred, last.pred, sizeof(int32_t) * R);
    memcpy(tgt, last.tgt, sizeof(int32_t) * R);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        gr[i] = malloc(sizeof(float) * (size_t)p->numel);
        memcpy(gr[i], p->g, sizeof(float) * (size_t)p->numel);
    }
    ck_assert(drafter_set_threads(d, 2, err, sizeof err) == 0);
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step_fast(d, &tb.b, 5, 3, 1, &mf, err, sizeof err) == 0, "%s", err);
    drafter_last_step(d, &last);
    ck_assert_msg(fabs(mf.loss_sum - mr.loss_sum) <= 1e-5 * fabs(mr.loss_sum), "loss %.9g, reference %.9g",
                  mf.loss_sum, mr.loss_sum);
    ck_assert(!memcmp(mf.correct, mr.correct, sizeof mr.correct) && !memcmp(mf.total, mr.total, sizeof mr.total));
    ck_assert(mf.eal_sum == mr.eal_sum && mf.n_anchors == mr.n_anchors && mr.full_total > 0);
    for (int s = 0; s < R; s++)
        ck_assert_msg(last.pred[s] == pred[s] && last.tgt[s] == tgt[s], "row %d: pred/tgt %d/%d, reference %d/%d", s,
                      last.pred[s], last.tgt[s], pred[s], tgt[s]);
    double worst = 0;
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        double scale = 0;
        for (int64_t e = 0; e < p->numel; e++) if (fabs(gr[i][e]) > scale) scale = fabs(gr[i][e]);
        ck_assert_msg(scale > 0, "%s: zero reference gradient", p->name);
        ck_assert(test_allclose(p->name, p->g, gr[i], (size_t)p->numel, 2e-5 * scale, 1e-4));
        for (int64_t e = 0; e < p->numel; e++) {
            double r = fabs(p->g[e] - gr[i][e]) / scale;
            if (r > worst) worst = r;
        }
        memcpy(gr[i], p->g, sizeof(float) * (size_t)p->numel);   /* keep the 2-thread result */
    }
    fprintf(stderr, "fast vs reference (loss %d weighting %d non-causal %d sfa %d): loss %.8f vs %.8f, worst gradient "
            "error %.3g of its tensor's scale\n", loss, weighting, non_causal, sample_from_anchor, mf.loss_sum,
            mr.loss_sum, worst);
    ck_assert(drafter_set_threads(d, 3, err, sizeof err) == 0);
    ck_assert_int_eq(drafter_threads(d), 3);
    drafter_zero_grad(d);
    ck_assert(drafter_step_fast(d, &tb.b, 5, 3, 1, &m3, err, sizeof err) == 0);
    ck_assert(m3.loss_sum == mf.loss_sum);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        ck_assert_msg(!memcmp(gr[i], p->g, sizeof(float) * (size_t)p->numel), "%s: 2 and 3 threads differ", p->name);
        free(gr[i]);
    }
    ck_assert(drafter_set_threads(d, 0, err, sizeof err) == -1 && strstr(err, "threads"));
    free(gr);
    drafter_free(d);
}

START_TEST(drafter_fast_vs_reference) {
    check_fast(LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 0, 0);
    check_fast(LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 0, 0);
    check_fast(LMHEAD_LOSS_CE, LMHEAD_WEIGHT_NONE, 1, 0);
    check_fast(LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 0, 1);
}
/* drafter_init_weights splits a large matrix's init stream over threads (start-up, issue 28): every matrix must
 * equal the sequential stream of the header's definition bit for bit. I = 2^17 makes the MLP matrices 2^21 values,
 * large enough for two threads on a 2-core machine. */
START_TEST(drafter_init_threads_bitwise) {
    struct drafter_config c;
    tiny_config(&c);
    c.I = 1 << 17;
    char err[512];
    struct drafter *d = drafter_init(&c, 99, err, sizeof err);
    ck_assert_msg(d != NULL, "%s", err);
    int big = 0;
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->trainable) continue;
        if (p->ndim == 1) {
            for (int64_t e = 0; e < p->numel; e++) ck_assert_float_eq(p->w[e], 1.0f);
            continue;
        }
        big |= p->numel >= ((int64_t)1 << 21);
        int64_t bad = 0, first = 0;
        uint64_t st = anchors_mix64(anchors_mix64(99) ^ (uint64_t)i);
        for (int64_t e = 0; e < p->numel; e += 2) {
            double u1 = ((kernels_rng_next(&st) >> 11) + 1.0) * 0x1.0p-53;
            double u2 = (kernels_rng_next(&st) >> 11) * 0x1.0p-53;
            double r = sqrt(-2.0 * log(u1));
            float a = (float)(c.init_std * r * cos(2 * M_PI * u2)), b = (float)(c.init_std * r * sin(2 * M_PI * u2));
            /* one assertion per tensor below (Check's per-assertion mark costs a pipe write) */
            if (memcmp(&p->w[e], &a, 4) || (e + 1 < p->numel && memcmp(&p->w[e + 1], &b, 4))) {
                if (!bad++) first = e;
            }
        }
        ck_assert_msg(bad == 0, "%s: %lld pairs differ from the sequential stream, the first at %lld (%.9g)", p->name,
                      (long long)bad, (long long)first, p->w[first]);
    }
    ck_assert_msg(big, "no matrix large enough for the threaded init");
    drafter_free(d);
}
END_TEST

int main(void) {
    Suite *s = suite_create("drafter");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, drafter_config_errors);
    tcase_add_test(tc, drafter_param_table);
    tcase_add_test(tc, drafter_grad_ce_dpace);
    tcase_add_test(tc, drafter_grad_kl_expdecay);
    tcase_add_test(tc, drafter_grad_ce_none_noncausal);
    tcase_add_test(tc, drafter_grad_kl_sample_from_anchor);
    tcase_add_test(tc, drafter_anchors_brute_force);
    tcase_add_test(tc, drafter_mask_dense);
    tcase_add_test(tc, drafter_eal_blocks_by_hand);
    tcase_add_test(tc, drafter_metrics_consistent);
    tcase_add_test(tc, drafter_grad_accumulation);
    tcase_add_test(tc, drafter_noise);
    tcase_add_test(tc, drafter_rope_whole_head);
    tcase_add_test(tc, drafter_overfit_one_batch);
    tcase_add_test(tc, drafter_fast_vs_reference);
    tcase_add_test(tc, drafter_init_threads_bitwise);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
