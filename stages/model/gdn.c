/*
 * stages/model/gdn.c — Qwen3.5 Gated DeltaNet and gated-attention helpers, fp32 reference (gdn.h).
 */
#include "model/gdn.h"

#include <math.h>
#include <string.h>

int gdn_conv_dim(const struct gdn_shape *s) { return 2 * s->n_k * s->d_k + s->n_v * s->d_v; }
int gdn_in_dim(const struct gdn_shape *s) { return gdn_conv_dim(s) + s->n_v * s->d_v + 2 * s->n_v; }

static float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static float siluf_(float x) { return x / (1.0f + expf(-x)); }
/* torch.nn.functional.softplus(beta=1, threshold=20) */
static float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* l2norm over n values in place: x · rsqrt(Σx² + 1e-6) (transformers' l2norm, FLA's eps). */
static void l2norm_(float *x, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt((double)(float)ss + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= r;
}

void gdn_conv_rows(float *conv, const float *in, int in_stride, int t0, int t1, const struct gdn_shape *s,
                   const float *conv_w) {
    const int D = gdn_conv_dim(s), K = s->K, nk = s->n_k, dk = s->d_k;
    const int kd = nk * dk;
    /* causal depthwise conv1d (zero left padding: the window starts empty at the document start) + silu */
    for (int t = t0; t < t1; t++) {
        float *o = conv + (size_t)(t - t0) * D;
        for (int c = 0; c < D; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int src = t - (K - 1) + j;
                if (src >= 0) acc += (double)conv_w[(size_t)c * K + j] * in[(size_t)src * in_stride + c];
            }
            o[c] = siluf_((float)acc);
        }
        /* l2norm of each q and k head, then q / sqrt(d_k) */
        float qs = 1.0f / sqrtf((float)dk);
        for (int h = 0; h < nk; h++) {
            l2norm_(o + (size_t)h * dk, dk);
            l2norm_(o + kd + (size_t)h * dk, dk);
            for (int i = 0; i < dk; i++) o[(size_t)h * dk + i] *= qs;
        }
    }
}

void gdn_recur_rows(float *y, const float *conv, const float *in, int in_stride, int n, const struct gdn_shape *s,
                    const float *a_neg, const float *dt_bias, const float *norm_w, float eps, float *state) {
    const int D = gdn_conv_dim(s), nk = s->n_k, nv = s->n_v, dk = s->d_k, dv = s->d_v;
    const int kd = nk * dk, vd = nv * dv, rep = nv / nk;
    for (int t = 0; t < n; t++) {
        const float *u = conv + (size_t)t * D, *row = in + (size_t)t * in_stride;
        const float *bcol = row + D + vd, *acol = bcol + nv;
        float *yt = y + (size_t)t * vd;
        for (int j = 0; j < nv; j++) {
            const float *q = u + (size_t)(j / rep) * dk, *k = u + kd + (size_t)(j / rep) * dk;
            const float *v = u + 2 * kd + (size_t)j * dv;
            float beta = sigmoidf_(bcol[j]);
            float g = a_neg[j] * softplusf_(acol[j] + dt_bias[j]);
            float decay = expf(g);
            float *S = state + (size_t)j * dk * dv;
            for (size_t i = 0; i < (size_t)dk * dv; i++) S[i] *= decay;
            float *o = yt + (size_t)j * dv;
            for (int e = 0; e < dv; e++) {
                double m = 0;
                for (int i = 0; i < dk; i++) m += (double)S[(size_t)i * dv + e] * k[i];
                float delta = (v[e] - (float)m) * beta;
                for (int i = 0; i < dk; i++) S[(size_t)i * dv + e] += k[i] * delta;
                double acc = 0;
                for (int i = 0; i < dk; i++) acc += (double)S[(size_t)i * dv + e] * q[i];
                o[e] = (float)acc;
            }
        }
        /* gated RMSNorm per value head: norm(o) · w ⊙ silu(z) */
        const float *z = row + D;
        for (int j = 0; j < nv; j++) {
            float *o = yt + (size_t)j * dv;
            double ss = 0;
            for (int e = 0; e < dv; e++) ss += (double)o[e] * o[e];
            float rs = (float)(1.0 / sqrt(ss / dv + eps));
            for (int e = 0; e < dv; e++) o[e] = norm_w[e] * (o[e] * rs) * siluf_(z[(size_t)j * dv + e]);
        }
    }
}

void gdn_forward_doc(float *y, const float *in, int in_stride, int len, const struct gdn_shape *s,
                     const float *conv_w, const float *a_neg, const float *dt_bias, const float *norm_w,
                     float eps, float *conv, float *state) {
    gdn_conv_rows(conv, in, in_stride, 0, len, s, conv_w);
    memset(state, 0, (size_t)s->n_v * s->d_k * s->d_v * sizeof(float));
    gdn_recur_rows(y, conv, in, in_stride, len, s, a_neg, dt_bias, norm_w, eps, state);
}
