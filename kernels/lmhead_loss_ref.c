/*
 * kernels/lmhead_loss_ref.c — CPU reference of the fused LM head + DFlash loss (kernels/lmhead_loss.h).
 *
 * Row by row: gather and norm the target state, form both logit rows in full (V is small in tests),
 * then the per-slot loss, weights, normalisation and metrics exactly as the formulas read. The backward
 * recomputes the rows. Double accumulators for the dot products and the softmax sums.
 */
#include "kernels/lmhead_loss.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int lmhead_loss_check(const lmhead_loss_config *c, char *err, int err_len) {
    if (c->T < 1 || c->N < 1 || c->B < 1 || c->D < 1 || c->V < 1) {
        snprintf(err, err_len, "lmhead_loss: sizes must be positive (T=%d N=%d B=%d D=%d V=%d)", c->T, c->N, c->B,
                 c->D, c->V);
        return -1;
    }
    if (c->loss != LMHEAD_LOSS_KL && c->loss != LMHEAD_LOSS_CE) {
        snprintf(err, err_len, "lmhead_loss: loss %d is neither KL (0) nor CE (1)", c->loss);
        return -1;
    }
    if (c->weighting < LMHEAD_WEIGHT_NONE || c->weighting > LMHEAD_WEIGHT_DPACE) {
        snprintf(err, err_len, "lmhead_loss: weighting %d is not NONE, EXP_DECAY or DPACE", c->weighting);
        return -1;
    }
    if (c->weighting == LMHEAD_WEIGHT_DPACE && (c->loss != LMHEAD_LOSS_CE || !(c->alpha > 0 && c->alpha <= 1))) {
        snprintf(err, err_len, "lmhead_loss: D-PACE needs the CE loss and alpha in (0, 1] (loss=%d alpha=%g)", c->loss,
                 c->alpha);
        return -1;
    }
    if (c->weighting == LMHEAD_WEIGHT_EXP_DECAY && !(c->gamma > 0)) {
        snprintf(err, err_len, "lmhead_loss: exp-decay needs gamma > 0, got %g", c->gamma);
        return -1;
    }
    return 0;
}

double lmhead_eal(const int32_t *correct, const int32_t *total, int B) {
    double eal = 0, prod = 1;
    for (int j = 1; j < B; j++) {
        prod *= (double)correct[j] / (double)(total[j] > 1 ? total[j] : 1);
        eal += prod;
    }
    return eal;
}

int lmhead_vocab_check(const uint8_t *t2d, int V_t, const int64_t *d2t, int V_d, char *err, int err_len) {
    int d = 0;
    for (int id = 0; id < V_t; id++) {
        if (!t2d[id]) continue;
        if (d >= V_d) {
            snprintf(err, err_len, "vocab mapping: t2d has more than V_d=%d set entries", V_d);
            return -1;
        }
        if (d + d2t[d] != id) {
            snprintf(err, err_len, "vocab mapping: draft %d maps to %lld but the %d-th set t2d id is %d", d,
                     (long long)(d + d2t[d]), d, id);
            return -1;
        }
        d++;
    }
    if (d != V_d) {
        snprintf(err, err_len, "vocab mapping: t2d has %d set entries, expected V_d=%d", d, V_d);
        return -1;
    }
    return 0;
}

int lmhead_prune_ref(const float *full, int V_t, int D, const int64_t *d2t, int V_d, float *out,
                     char *err, int err_len) {
    for (int d = 0; d < V_d; d++) {
        int64_t id = d + d2t[d];
        if (id < 0 || id >= V_t) {
            snprintf(err, err_len, "lmhead_prune_ref: draft %d maps to id %lld outside [0, %d)", d, (long long)id, V_t);
            return -1;
        }
        memcpy(out + (size_t)d * D, full + (size_t)id * D, sizeof(float) * (size_t)D);
    }
    return 0;
}

/* ---------------------------------------------------------------- per-row pieces */

static const lmhead_loss_mode lmhead_zero_mode;

static int lmhead_args(const lmhead_loss_config *c, const lmhead_loss_mode *md, const int32_t *anchors, char *err,
                       int err_len) {
    if (lmhead_loss_check(c, err, err_len)) return -1;
    int lim = md->budget > c->T ? md->budget : c->T;
    for (int b = 0; b < c->N; b++)
        if (anchors[b] < 0 || anchors[b] >= c->T || anchors[b] + c->B > lim) {
            snprintf(err, err_len, "lmhead_loss: anchors[%d]=%d leaves no room for a block of %d in T=%d (budget %d)",
                     b, anchors[b], c->B, c->T, md->budget);
            return -1;
        }
    return 0;
}

/* The row's packed position p = a + j; the position whose token it predicts is p (+1 with
 * sample_from_anchor); rows predicting past T are masked, so nothing past the batch is read. */
static int lmhead_mask(const lmhead_loss_config *c, const lmhead_loss_mode *md, const int32_t *anchors,
                       const uint8_t *valid, const uint8_t *loss_mask, int s) {
    int b = s / c->B, j = s % c->B;
    int p = anchors[b] + j + (md->sample_from_anchor ? 1 : 0);
    if (p >= c->T || !valid[b]) return 0;
    return (md->sample_from_anchor || j != 0) && loss_mask[p];
}

/* z (V) and t (V) of row s, and the index of the first maximum of t. */
static int lmhead_row(const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn, const float *lm_head, const float *vlm_head,
                      const float *vnorm_w, const float *last, const int32_t *anchors, int round_bf16, int s,
                      float *th, float *z, float *t) {
    int b = s / c->B, j = s % c->B, D = c->D;
    int src = anchors[b] + j - (md->sample_from_anchor ? 0 : 1);
    if (src < 0) src += c->T;
    const float *y = last + (size_t)src * D;
    double ss = 0;
    for (int e = 0; e < D; e++) ss += (double)y[e] * y[e];
    float rstd = (float)(1.0 / sqrt(ss / D + c->eps));
    for (int e = 0; e < D; e++) {
        /* §9: normalize in fp32, round to the input dtype, then multiply by the fp32 weight */
        th[e] = round_bf16 ? bf16_round(bf16_round(y[e] * rstd) * vnorm_w[e]) : y[e] * rstd * vnorm_w[e];
    }
    const float *x = xn + (size_t)s * D;
    int arg = 0;
    for (int v = 0; v < c->V; v++) {
        double dz = 0, dt = 0;
        for (int e = 0; e < D; e++) {
            dz += (double)x[e] * lm_head[(size_t)v * D + e];
            dt += (double)th[e] * vlm_head[(size_t)v * D + e];
        }
        z[v] = round_bf16 ? bf16_round((float)dz) : (float)dz;
        t[v] = round_bf16 ? bf16_round((float)dt) : (float)dt;
        if (t[v] > t[arg]) arg = v;
    }
    return arg;
}

static double lmhead_lse(const float *z, int V) {
    double m = -INFINITY, s = 0;
    for (int v = 0; v < V; v++) if (z[v] > m) m = z[v];
    for (int v = 0; v < V; v++) s += exp(z[v] - m);
    return m + log(s);
}

/* ---------------------------------------------------------------- reference */

int lmhead_loss_forward_ref(const lmhead_loss_config *c, const float *xn, const float *lm_head,
                            const float *vlm_head, const float *vnorm_w, const float *last,
                            const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                            int round_bf16, float *loss, float *row_loss, float *row_weight,
                            int32_t *correct, int32_t *total, char *err, int err_len) {
    return lmhead_loss_forward_mode_ref(c, NULL, xn, lm_head, vlm_head, vnorm_w, last, anchors, valid, loss_mask,
                                        round_bf16, loss, row_loss, row_weight, correct, total, err, err_len);
}

int lmhead_loss_backward_ref(const lmhead_loss_config *c, const float *xn, const float *lm_head,
                             const float *vlm_head, const float *vnorm_w, const float *last,
                             const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                             int round_bf16, const float *row_weight, float *dxn, char *err, int err_len) {
    return lmhead_loss_backward_mode_ref(c, NULL, xn, lm_head, vlm_head, vnorm_w, last, anchors, valid, loss_mask,
                                         round_bf16, row_weight, dxn, err, err_len);
}

int lmhead_loss_forward_mode_ref(const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn,
                                 const float *lm_head, const float *vlm_head, const float *vnorm_w, const float *last,
                                 const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                                 int round_bf16, float *loss, float *row_loss, float *row_weight,
                                 int32_t *correct, int32_t *total, char *err, int err_len) {
    if (!md) md = &lmhead_zero_mode;
    if (lmhead_args(c, md, anchors, err, err_len)) return -1;
    int R = c->N * c->B, V = c->V, B = c->B;
    float *z = malloc(sizeof *z * (size_t)V), *t = malloc(sizeof *t * (size_t)V), *th = malloc(sizeof *th * (size_t)c->D);
    if (!z || !t || !th) {
        free(z); free(t); free(th);
        snprintf(err, err_len, "lmhead_loss_forward_ref: out of memory");
        return -1;
    }
    memset(correct, 0, sizeof *correct * (size_t)B);
    memset(total, 0, sizeof *total * (size_t)B);
    double msum = 0;
    for (int s = 0; s < R; s++) {
        int m = lmhead_mask(c, md, anchors, valid, loss_mask, s);
        row_loss[s] = 0;
        if (!m) continue;
        msum += 1;
        int tgt = lmhead_row(c, md, xn, lm_head, vlm_head, vnorm_w, last, anchors, round_bf16, s, th, z, t);
        double lz = lmhead_lse(z, V), l;
        if (c->loss == LMHEAD_LOSS_CE) {
            l = lz - z[tgt];
        } else {
            double lt = lmhead_lse(t, V);
            l = 0;
            for (int v = 0; v < V; v++) l += exp(t[v] - lt) * ((t[v] - lt) - (z[v] - lz));
        }
        row_loss[s] = (float)l;
        int pred = 0;
        for (int v = 1; v < V; v++) if (z[v] > z[pred]) pred = v;
        correct[s % B] += pred == tgt;
        total[s % B] += 1;
    }
    double L = 0;
    for (int b = 0; b < c->N; b++) {
        double P = 1, suffix = 0;
        double pk[1024];   /* D-PACE prefix products of this block (B <= 1024 checked below) */
        if (B > 1024) {
            free(z); free(t); free(th);
            snprintf(err, err_len, "lmhead_loss_forward_ref: B=%d > 1024", B);
            return -1;
        }
        for (int j = 0; j < B; j++) {
            int s = b * B + j, m = lmhead_mask(c, md, anchors, valid, loss_mask, s);
            double sj = m ? (1.0 - c->alpha) * exp(-(double)row_loss[s]) + c->alpha : 1.0;
            P *= sj;
            pk[j] = P;
        }
        for (int j = B - 1; j >= 0; j--) {
            int s = b * B + j, m = lmhead_mask(c, md, anchors, valid, loss_mask, s);
            double w;
            if (c->weighting == LMHEAD_WEIGHT_NONE) w = 1;
            else if (c->weighting == LMHEAD_WEIGHT_EXP_DECAY && md->sample_from_anchor) w = exp(-(double)j / c->gamma);
            else if (c->weighting == LMHEAD_WEIGHT_EXP_DECAY) w = j == 0 ? 0 : exp(-(double)(j - 1) / c->gamma);
            else {
                suffix += m ? pk[j] : 0;
                w = suffix;
            }
            row_weight[s] = m ? (float)w : 0.0f;
            L += (double)row_weight[s] * row_loss[s];
        }
    }
    *loss = (float)(L / (msum + 1e-5));
    free(z); free(t); free(th);
    return 0;
}

int lmhead_loss_backward_mode_ref(const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn,
                                  const float *lm_head, const float *vlm_head, const float *vnorm_w, const float *last,
                                  const int32_t *anchors, const uint8_t *valid, const uint8_t *loss_mask,
                                  int round_bf16, const float *row_weight, float *dxn, char *err, int err_len) {
    if (!md) md = &lmhead_zero_mode;
    if (lmhead_args(c, md, anchors, err, err_len)) return -1;
    int R = c->N * c->B, V = c->V, D = c->D;
    float *z = malloc(sizeof *z * (size_t)V), *t = malloc(sizeof *t * (size_t)V), *th = malloc(sizeof *th * (size_t)D);
    double *acc = malloc(sizeof *acc * (size_t)D);
    if (!z || !t || !th || !acc) {
        free(z); free(t); free(th); free(acc);
        snprintf(err, err_len, "lmhead_loss_backward_ref: out of memory");
        return -1;
    }
    double msum = 0;
    for (int s = 0; s < R; s++) msum += lmhead_mask(c, md, anchors, valid, loss_mask, s);
    for (int s = 0; s < R; s++) {
        float *dx = dxn + (size_t)s * D;
        double coef = row_weight[s] / (msum + 1e-5);
        if (!lmhead_mask(c, md, anchors, valid, loss_mask, s) || coef == 0) {
            memset(dx, 0, sizeof *dx * (size_t)D);
            continue;
        }
        int tgt = lmhead_row(c, md, xn, lm_head, vlm_head, vnorm_w, last, anchors, round_bf16, s, th, z, t);
        double lz = lmhead_lse(z, V), lt = c->loss == LMHEAD_LOSS_KL ? lmhead_lse(t, V) : 0;
        memset(acc, 0, sizeof *acc * (size_t)D);
        for (int v = 0; v < V; v++) {
            double p = c->loss == LMHEAD_LOSS_KL ? exp(t[v] - lt) : (double)(v == tgt);
            double dz = coef * (exp(z[v] - lz) - p);
            if (round_bf16) dz = bf16_round((float)dz);
            for (int e = 0; e < D; e++) acc[e] += dz * lm_head[(size_t)v * D + e];
        }
        for (int e = 0; e < D; e++) dx[e] = (float)acc[e];
    }
    free(z); free(t); free(th); free(acc);
    return 0;
}

int lmhead_argmax_ref(const lmhead_loss_config *c, const lmhead_loss_mode *md, const float *xn, const float *lm_head, const float *vlm_head,
                      const float *vnorm_w, const float *last, const int32_t *anchors, const uint8_t *valid,
                      const uint8_t *loss_mask, int round_bf16, int32_t *pred, int32_t *tgt, uint8_t *mask,
                      char *err, int err_len) {
    if (!md) md = &lmhead_zero_mode;
    if (lmhead_args(c, md, anchors, err, err_len)) return -1;
    int R = c->N * c->B, V = c->V, D = c->D;
    float *z = malloc(sizeof *z * (size_t)V), *t = malloc(sizeof *t * (size_t)V), *th = malloc(sizeof *th * (size_t)D);
    if (!z || !t || !th) {
        free(z); free(t); free(th);
        snprintf(err, err_len, "lmhead_argmax_ref: out of memory");
        return -1;
    }
    for (int s = 0; s < R; s++) {
        int b = s / c->B, j = s % c->B;
        int src = anchors[b] + j - (md->sample_from_anchor ? 0 : 1);
        mask[s] = (uint8_t)lmhead_mask(c, md, anchors, valid, loss_mask, s);
        if (src < c->T) {
            tgt[s] = lmhead_row(c, md, xn, lm_head, vlm_head, vnorm_w, last, anchors, round_bf16, s, th, z, t);
        } else {   /* the draft logits only: the target row lies past the batch */
            tgt[s] = -1;
            const float *x = xn + (size_t)s * D;
            for (int v = 0; v < V; v++) {
                double dz = 0;
                for (int e = 0; e < D; e++) dz += (double)x[e] * lm_head[(size_t)v * D + e];
                z[v] = round_bf16 ? bf16_round((float)dz) : (float)dz;
            }
        }
        int arg = 0;
        for (int v = 1; v < V; v++) if (z[v] > z[arg]) arg = v;
        pred[s] = arg;
    }
    free(z); free(t); free(th);
    return 0;
}

void lmhead_eal_blocks(const uint8_t *mask, const int32_t *pred, const int32_t *tgt, int N, int B, int first,
                       double *sum, int64_t *count) {
    for (int b = 0; b < N; b++) {
        int any = 0, run = 0, open = 1;
        for (int j = first; j < B; j++) {
            int s = b * B + j;
            any |= mask[s] != 0;
            if (open && mask[s] && pred[s] == tgt[s]) run++;
            else open = 0;
        }
        if (!any) continue;
        *sum += run + 1;
        *count += 1;
    }
}
