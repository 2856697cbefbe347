/*
 * stages/train/optim.c — Muon + AdamW on the host (stages/train/optim.h). Plain loops and the
 * reference GEMM (kernels/gemm_ref.c); the AdamW update is kernels/adamw_ref.c's.
 */
#include "train/optim.h"

#include "core/err.h"
#include "kernels/adamw.h"
#include "kernels/common.h"
#include "kernels/gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void optim_config_default(struct optim_config *c) {
    memset(c, 0, sizeof *c);
    c->kind = OPTIM_MUON_ADAMW;
    c->lr = 1e-4;
    c->muon_lr = 0;            /* 10 × lr */
    c->beta1 = 0.9;
    c->beta2 = 0.999;
    c->eps = 1e-8;
    c->weight_decay = 0.01;
    c->muon_weight_decay = 0.1;
    c->muon_momentum = 0.95;
    c->muon_nesterov = 1;
    c->ns_steps = 5;
    c->ns_a = 3.4445;
    c->ns_b = -4.7750;
    c->ns_c = 2.0315;
    c->ns_eps = 1e-7;
    c->muon_bf16 = 1;
}

static int64_t numel_of(const struct optim_tensor *t) {
    return t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1];
}

void optim_free(struct optim *o) {
    if (o->m)
        for (int i = 0; i < o->n; i++) { free(o->m[i]); free(o->v[i]); free(o->mom[i]); }
    free(o->t); free(o->group); free(o->numel); free(o->m); free(o->v); free(o->mom);
    free(o->ns_x_); free(o->ns_y_); free(o->ns_a_); free(o->ns_b_);
    memset(o, 0, sizeof *o);
}

int optim_init(struct optim *o, const struct optim_tensor *t, int n, const struct optim_config *c,
               char *err, int err_len) {
    memset(o, 0, sizeof *o);
    if (n < 0 || (n > 0 && !t)) return err_fail(err, err_len, "optim_init: bad tensor table (n = %d)", n);
    if (c->kind != OPTIM_MUON_ADAMW && c->kind != OPTIM_ADAMW)
        return err_fail(err, err_len, "optim_init: unknown optimizer kind %d", (int)c->kind);
    if (!(c->lr >= 0) || isnan(c->muon_lr) || !(c->beta1 >= 0 && c->beta1 < 1) ||
        !(c->beta2 >= 0 && c->beta2 < 1) || !(c->eps > 0) || !(c->weight_decay >= 0) ||
        !(c->muon_weight_decay >= 0) || !(c->muon_momentum >= 0 && c->muon_momentum < 1) ||
        c->ns_steps < 0 || !(c->ns_eps > 0))
        return err_fail(err, err_len, "optim_init: hyper-parameter out of range (lr %g, betas %g/%g, eps %g, "
                        "wd %g/%g, momentum %g, ns_steps %d, ns_eps %g)", c->lr, c->beta1, c->beta2, c->eps,
                        c->weight_decay, c->muon_weight_decay, c->muon_momentum, c->ns_steps, c->ns_eps);
    o->cfg = *c;
    if (o->cfg.muon_lr <= 0) o->cfg.muon_lr = 10.0 * c->lr;
    o->n = n;
    o->t = calloc(n ? n : 1, sizeof *o->t);
    o->group = calloc(n ? n : 1, sizeof *o->group);
    o->numel = calloc(n ? n : 1, sizeof *o->numel);
    o->m = calloc(n ? n : 1, sizeof *o->m);
    o->v = calloc(n ? n : 1, sizeof *o->v);
    o->mom = calloc(n ? n : 1, sizeof *o->mom);
    if (!o->t || !o->group || !o->numel || !o->m || !o->v || !o->mom) {
        optim_free(o);
        return err_fail(err, err_len, "optim_init: out of memory for %d tensors", n);
    }
    int64_t ns_mn = 0, ns_mm = 0;
    for (int i = 0; i < n; i++) {
        const struct optim_tensor *x = &t[i];
        o->t[i] = *x;
        const char *nm = x->name ? x->name : "(unnamed)";
        if (x->ndim != 1 && x->ndim != 2) { optim_free(o); return err_fail(err, err_len, "optim_init: tensor %s: ndim %d, expected 1 or 2", nm, x->ndim); }
        if (x->shape[0] < 1 || (x->ndim == 2 && x->shape[1] < 1)) { optim_free(o); return err_fail(err, err_len, "optim_init: tensor %s: empty shape", nm); }
        if (!x->w) { optim_free(o); return err_fail(err, err_len, "optim_init: tensor %s: no weights", nm); }
        o->numel[i] = numel_of(x);
        if (!x->trainable) { o->group[i] = OPTIM_GROUP_NONE; continue; }
        if (!x->g) { optim_free(o); return err_fail(err, err_len, "optim_init: tensor %s is trainable but has no gradient", nm); }
        if (x->is_matrix) {
            if (x->ndim != 2 || x->shape[0] < 2 || x->shape[1] < 2 ||
                (x->name && (strstr(x->name, "embed_tokens") || strstr(x->name, "lm_head")))) {
                optim_free(o);
                return err_fail(err, err_len, "optim_init: tensor %s is marked is_matrix but is not a 2-D matrix with both "
                                "dims > 1 outside embed_tokens/lm_head (ndim %d, shape %lld x %lld)", nm, x->ndim,
                                (long long)x->shape[0], (long long)(x->ndim == 2 ? x->shape[1] : 1));
            }
        }
        if (x->is_matrix && c->kind == OPTIM_MUON_ADAMW) {
            o->group[i] = OPTIM_GROUP_MUON;
            o->n_muon++;
            o->mom[i] = calloc((size_t)o->numel[i], sizeof(float));
            if (!o->mom[i]) { optim_free(o); return err_fail(err, err_len, "optim_init: out of memory for %s's momentum", nm); }
            int64_t mn = x->shape[0] < x->shape[1] ? x->shape[0] : x->shape[1];
            if (o->numel[i] > ns_mn) ns_mn = o->numel[i];
            if (mn * mn > ns_mm) ns_mm = mn * mn;
        } else {
            o->group[i] = OPTIM_GROUP_ADAMW;
            o->n_adamw++;
            o->m[i] = calloc((size_t)o->numel[i], sizeof(float));
            o->v[i] = calloc((size_t)o->numel[i], sizeof(float));
            if (!o->m[i] || !o->v[i]) { optim_free(o); return err_fail(err, err_len, "optim_init: out of memory for %s's moments", nm); }
        }
    }
    if (o->n_muon) {
        o->ns_x_ = malloc((size_t)ns_mn * sizeof(float));
        o->ns_y_ = malloc((size_t)(2 * ns_mn + 2 * ns_mm) * sizeof(float));
        if (!o->ns_x_ || !o->ns_y_) { optim_free(o); return err_fail(err, err_len, "optim_init: out of memory for Newton-Schulz scratch"); }
    }
    return 0;
}

/* ---------------------------------------------------------------- gradients */

double optim_grad_norm(const struct optim_tensor *t, int n) {
    double sumsq = 0;
    for (int i = 0; i < n; i++)
        if (t[i].trainable && t[i].g) adamw_grad_sumsq_ref(t[i].g, (size_t)numel_of(&t[i]), &sumsq);
    return sqrt(sumsq);
}

double optim_clip_grad_norm(const struct optim_tensor *t, int n, double max_norm) {
    double sumsq = 0;
    for (int i = 0; i < n; i++)
        if (t[i].trainable && t[i].g) adamw_grad_sumsq_ref(t[i].g, (size_t)numel_of(&t[i]), &sumsq);
    double norm = sqrt(sumsq);
    if (!isfinite(norm) || !(max_norm > 0)) return norm;
    float clip = adamw_clip_factor(sumsq, (float)max_norm);
    if (clip < 1.0f) optim_scale_grads(t, n, clip);
    return norm;
}

void optim_scale_grads(const struct optim_tensor *t, int n, float s) {
    for (int i = 0; i < n; i++) {
        if (!t[i].trainable || !t[i].g) continue;
        int64_t k = numel_of(&t[i]);
        for (int64_t j = 0; j < k; j++) t[i].g[j] *= s;
    }
}

void optim_zero_grad(const struct optim_tensor *t, int n) {
    for (int i = 0; i < n; i++)
        if (t[i].trainable && t[i].g) memset(t[i].g, 0, (size_t)numel_of(&t[i]) * sizeof(float));
}

/* ---------------------------------------------------------------- Muon */

/* torch.lerp(a, b, w) as its CPU/CUDA kernels evaluate it (two branches for accuracy). */
static inline float lerpf_torch(float a, float b, float w) {
    return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

static inline float rnd(float x, int bf) { return bf ? bf16_to_float(float_to_bf16(x)) : x; }

void optim_muon_orthogonalize(const struct optim_config *c, const float *u, int64_t rows, int64_t cols,
                              float *out, float *scratch) {
    const int bf = c->muon_bf16;
    const int tr = rows > cols;
    const int64_t m = tr ? cols : rows, nn = tr ? rows : cols;   /* X is (m, nn), m <= nn */
    float *x = scratch, *y = x + m * nn, *a = y + m * nn, *b = a + m * m;
    /* X = bf16(U), transposed when rows > cols */
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            float val = rnd(u[i * cols + j], bf);
            if (tr) x[j * nn + i] = val; else x[i * nn + j] = val;
        }
    double ss = 0;
    for (int64_t k = 0; k < m * nn; k++) ss += (double)x[k] * x[k];
    float norm = rnd((float)sqrt(ss), bf);          /* torch: X.norm() of a bf16 tensor is bf16 */
    if (norm < (float)c->ns_eps) norm = (float)c->ns_eps;
    for (int64_t k = 0; k < m * nn; k++) x[k] = rnd(x[k] / norm, bf);
    const float ca = (float)c->ns_a, cb = (float)c->ns_b, cc = (float)c->ns_c;
    for (int it = 0; it < c->ns_steps; it++) {
        /* A = X·Xᵀ (m, m) */
        gemm_forward_ref(a, x, 0, x, 1, (int)m, (int)m, (int)nn, 1.0f, 0.0f);
        for (int64_t k = 0; k < m * m; k++) a[k] = rnd(a[k], bf);
        /* B = b·A + c·A·A (torch.addmm(A, A, A, beta=b, alpha=c)) */
        for (int64_t k = 0; k < m * m; k++) b[k] = a[k];
        gemm_forward_ref(b, a, 0, a, 0, (int)m, (int)m, (int)m, cc, cb);
        for (int64_t k = 0; k < m * m; k++) b[k] = rnd(b[k], bf);
        /* X = a·X + B·X (torch.addmm(X, B, X, beta=a)) */
        memcpy(y, x, (size_t)(m * nn) * sizeof(float));
        gemm_forward_ref(y, b, 0, x, 0, (int)m, (int)nn, (int)m, 1.0f, ca);
        for (int64_t k = 0; k < m * nn; k++) x[k] = rnd(y[k], bf);
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) out[i * cols + j] = tr ? x[j * nn + i] : x[i * nn + j];
}

static void muon_step_one(struct optim *o, int i, float lr) {
    const struct optim_config *c = &o->cfg;
    struct optim_tensor *t = &o->t[i];
    const int64_t k = o->numel[i], rows = t->shape[0], cols = t->shape[1];
    float *mom = o->mom[i], *u = o->ns_x_;
    const float mu = (float)c->muon_momentum;
    for (int64_t j = 0; j < k; j++) {
        mom[j] = lerpf_torch(mom[j], t->g[j], 1.0f - mu);       /* buf.lerp_(grad, 1 - momentum) */
        u[j] = c->muon_nesterov ? lerpf_torch(t->g[j], mom[j], mu) : mom[j];
    }
    /* the direction goes back into u (ns_x_), which the orthogonalization no longer needs after
     * copying it into its own scratch */
    optim_muon_orthogonalize(c, u, rows, cols, u, o->ns_y_);
    const double ratio = 0.2 * sqrt((double)(rows > cols ? rows : cols));   /* match_rms_adamw */
    const float adj = (float)((double)lr * ratio);
    const float decay = 1.0f - lr * (float)c->muon_weight_decay;
    for (int64_t j = 0; j < k; j++) {
        float w = t->w[j] * decay;
        t->w[j] = w - adj * u[j];
    }
}

int optim_step(struct optim *o, double lr_mult, char *err, int err_len) {
    if (!(lr_mult >= 0) || !isfinite(lr_mult))
        return err_fail(err, err_len, "optim_step: lr multiplier must be finite and >= 0, got %g", lr_mult);
    if (o->n_muon) {
        float lr = (float)(o->cfg.muon_lr * lr_mult);
        for (int i = 0; i < o->n; i++)
            if (o->group[i] == OPTIM_GROUP_MUON) muon_step_one(o, i, lr);
        o->muon_step++;
    }
    if (o->n_adamw) {
        if (o->adamw_step + 1 > 0x7fffffff) return err_fail(err, err_len, "optim_step: AdamW step counter overflows int");
        adamw_params p = { (float)(o->cfg.lr * lr_mult), (float)o->cfg.beta1, (float)o->cfg.beta2, (float)o->cfg.eps,
                           (float)o->cfg.weight_decay, (int)(o->adamw_step + 1), 0.0f /* grads already clipped */ };
        for (int i = 0; i < o->n; i++) {
            if (o->group[i] != OPTIM_GROUP_ADAMW) continue;
            if (adamw_step_ref(o->t[i].w, o->m[i], o->v[i], o->t[i].g, NULL, (size_t)o->numel[i], &p, 0.0, err, err_len))
                return -1;
        }
        o->adamw_step++;
    }
    return 0;
}

/* ---------------------------------------------------------------- non-finite guard */

void optim_guard_init(struct optim_guard *g, int max_consecutive) {
    memset(g, 0, sizeof *g);
    g->max_consecutive = max_consecutive < 1 ? 1 : max_consecutive;
    g->first_step = -1;
}

static const char *nf_word(double x) { return isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"); }

enum optim_guard_action optim_guard_check(struct optim_guard *g, int64_t step, double loss,
                                          double grad_norm, char *msg, int msg_len) {
    if (isfinite(loss) && isfinite(grad_norm)) {
        g->consecutive = 0;
        g->first_step = -1;
        if (msg && msg_len > 0) msg[0] = 0;
        return OPTIM_GUARD_OK;
    }
    const char *what = !isfinite(loss) ? "loss" : "grad norm";
    double val = !isfinite(loss) ? loss : grad_norm;
    if (g->consecutive == 0) {
        g->first_step = step;
        snprintf(g->first_what, sizeof g->first_what, "%s", what);
        g->first_value = val;
    }
    g->consecutive++;
    g->skipped_total++;
    if (g->consecutive >= g->max_consecutive) {
        snprintf(msg, msg_len, "step %lld: %s is %s (first non-finite value); %d non-finite steps in a row, stopping",
                 (long long)g->first_step, g->first_what, nf_word(g->first_value), g->consecutive);
        return OPTIM_GUARD_STOP;
    }
    snprintf(msg, msg_len, "step %lld: %s is %s; skipped (%d in a row, %lld in total)", (long long)step, what,
             nf_word(val), g->consecutive, (long long)g->skipped_total);
    return OPTIM_GUARD_SKIP;
}
