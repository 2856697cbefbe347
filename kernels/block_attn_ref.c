/*
 * kernels/block_attn_ref.c — CPU reference of anchored block attention (kernels/block_attn.h).
 *
 * Per (block, head, slot): list the visible keys (context range of the anchor's document and window,
 * then the block's own slots), softmax of the scaled scores in double, weighted sum of values. The
 * backward recomputes P from lse. Readable, not fast: O(N·B·n_h·(window + B)·d_h).
 */
#include "kernels/block_attn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int block_attn_check(const block_attn_config *c, char *err, int err_len) {
    if (c->T < 1 || c->N < 1 || c->B < 1 || c->n_h < 1 || c->n_kv < 1 || c->d_h < 1 || c->window < 0) {
        snprintf(err, err_len, "block_attn: sizes must be positive (T=%d N=%d B=%d n_h=%d n_kv=%d d_h=%d window=%d)",
                 c->T, c->N, c->B, c->n_h, c->n_kv, c->d_h, c->window);
        return -1;
    }
    if (c->n_h % c->n_kv) {
        snprintf(err, err_len, "block_attn: n_h=%d must be a multiple of n_kv=%d", c->n_h, c->n_kv);
        return -1;
    }
    return 0;
}

int block_attn_shape_supported(const block_attn_config *c, char *err, int err_len) {
    if (block_attn_check(c, err, err_len)) return -1;
    if ((c->d_h != 16 && c->d_h != 32 && c->d_h != 64 && c->d_h != 128 && c->d_h != 256) || c->n_kv > 65535) {
        snprintf(err, err_len, "block_attn: d_h=%d n_kv=%d is not a GPU shape: the GPU block attention takes head_dim "
                 "16, 32, 64, 128 or 256 and at most 65535 kv heads (wgmma kernels at 64 and 128 with "
                 "(n_h/n_kv)·B <= 64, fp32 kernels otherwise)", c->d_h, c->n_kv);
        return -1;
    }
    return 0;
}

/* Key rows visible to slot (b, j): fills idx (capacity T + B) with key row indices (context rows p, block
 * rows T + b·B + jj) and returns their count. Slot j limits the block
 * keys when causal. */
static int block_attn_keys(const block_attn_config *c, const int32_t *anchors, const int32_t *doc_ids, int b,
                           int j, int *idx) {
    int a = anchors[b], n = 0;
    int d = doc_ids[a];
    int lo = c->window > 0 ? a - c->window : 0;
    if (lo < 0) lo = 0;
    if (d != -1)
        for (int p = lo; p < a; p++)
            if (doc_ids[p] == d) idx[n++] = p;
    int last = c->causal ? j : c->B - 1;
    for (int jj = 0; jj <= last; jj++) idx[n++] = c->T + b * c->B + jj;
    return n;
}

static int block_attn_args(const block_attn_config *c, const int32_t *anchors, char *err, int err_len) {
    if (block_attn_check(c, err, err_len)) return -1;
    for (int b = 0; b < c->N; b++)
        if (anchors[b] < 0 || anchors[b] >= c->T) {
            snprintf(err, err_len, "block_attn: anchors[%d]=%d is outside [0, T=%d)", b, anchors[b], c->T);
            return -1;
        }
    return 0;
}

int block_attn_forward_ref(const block_attn_config *c, const float *q, const float *k, const float *v,
                           const int32_t *anchors, const int32_t *doc_ids, int round_p,
                           float *out, float *lse, char *err, int err_len) {
    if (block_attn_args(c, anchors, err, err_len)) return -1;
    int D = c->d_h, G = c->n_h / c->n_kv;
    int *idx = malloc(sizeof *idx * (size_t)(c->T + c->B));
    double *s = malloc(sizeof *s * (size_t)(c->T + c->B));
    double *acc = malloc(sizeof *acc * (size_t)D);
    if (!idx || !s || !acc) {
        free(idx); free(s); free(acc);
        snprintf(err, err_len, "block_attn_forward_ref: out of memory");
        return -1;
    }
    for (int b = 0; b < c->N; b++)
        for (int j = 0; j < c->B; j++) {
            int n = block_attn_keys(c, anchors, doc_ids, b, j, idx);
            size_t row = (size_t)b * c->B + j;
            for (int h = 0; h < c->n_h; h++) {
                const float *qr = q + (row * c->n_h + h) * D;
                int g = h / G;
                double m = -INFINITY, l = 0;
                for (int i = 0; i < n; i++) {
                    const float *kr = k + ((size_t)idx[i] * c->n_kv + g) * D;
                    double dot = 0;
                    for (int e = 0; e < D; e++) dot += (double)qr[e] * kr[e];
                    s[i] = dot * c->scale;
                    if (s[i] > m) m = s[i];
                }
                for (int i = 0; i < n; i++) l += exp(s[i] - m);
                memset(acc, 0, sizeof *acc * (size_t)D);
                for (int i = 0; i < n; i++) {
                    double p = exp(s[i] - m);
                    if (round_p) p = bf16_round((float)p);
                    const float *vr = v + ((size_t)idx[i] * c->n_kv + g) * D;
                    for (int e = 0; e < D; e++) acc[e] += p * vr[e];
                }
                float *o = out + (row * c->n_h + h) * D;
                for (int e = 0; e < D; e++) {
                    o[e] = (float)(acc[e] / l);
                    if (round_p) o[e] = bf16_round(o[e]);
                }
                lse[(size_t)h * c->N * c->B + row] = (float)(m + log(l));
            }
        }
    free(idx); free(s); free(acc);
    return 0;
}

int block_attn_backward_ref(const block_attn_config *c, const float *q, const float *k, const float *v,
                            const int32_t *anchors, const int32_t *doc_ids, const float *out,
                            const float *dout, const float *lse, float *dq, float *dk, float *dv,
                            char *err, int err_len) {
    return block_attn_backward_ref_prec(c, q, k, v, anchors, doc_ids, out, dout, lse, 0, dq, dk, dv, err, err_len);
}

int block_attn_backward_ref_prec(const block_attn_config *c, const float *q, const float *k, const float *v,
                                 const int32_t *anchors, const int32_t *doc_ids, const float *out,
                                 const float *dout, const float *lse, int round_p, float *dq, float *dk, float *dv,
                                 char *err, int err_len) {
    if (block_attn_args(c, anchors, err, err_len)) return -1;
    int D = c->d_h, G = c->n_h / c->n_kv;
    size_t nk = ((size_t)c->T + (size_t)c->N * c->B) * c->n_kv * D;
    int *idx = malloc(sizeof *idx * (size_t)(c->T + c->B));
    double *dqa = malloc(sizeof *dqa * (size_t)D);
    double *dka = calloc(nk, sizeof *dka), *dva = calloc(nk, sizeof *dva);
    if (!idx || !dqa || !dka || !dva) {
        free(idx); free(dqa); free(dka); free(dva);
        snprintf(err, err_len, "block_attn_backward_ref: out of memory");
        return -1;
    }
    for (int b = 0; b < c->N; b++)
        for (int j = 0; j < c->B; j++) {
            int n = block_attn_keys(c, anchors, doc_ids, b, j, idx);
            size_t row = (size_t)b * c->B + j;
            for (int h = 0; h < c->n_h; h++) {
                size_t qo = (row * c->n_h + h) * D;
                int g = h / G;
                double Di = 0;
                for (int e = 0; e < D; e++) Di += (double)dout[qo + e] * out[qo + e];
                memset(dqa, 0, sizeof *dqa * (size_t)D);
                for (int i = 0; i < n; i++) {
                    size_t ko = ((size_t)idx[i] * c->n_kv + g) * D;
                    double dot = 0, dp = 0;
                    for (int e = 0; e < D; e++) {
                        dot += (double)q[qo + e] * k[ko + e];
                        dp += (double)dout[qo + e] * v[ko + e];
                    }
                    double p = exp(dot * c->scale - lse[(size_t)h * c->N * c->B + row]);
                    double ds = p * (dp - Di), pv = p;
                    if (round_p) {   /* the device's precision: P and dS rounded to bf16 for the products */
                        pv = bf16_round((float)p);
                        ds = bf16_round((float)ds);
                    }
                    ds *= c->scale;
                    for (int e = 0; e < D; e++) {
                        dqa[e] += ds * k[ko + e];
                        dka[ko + e] += ds * q[qo + e];
                        dva[ko + e] += pv * dout[qo + e];
                    }
                }
                for (int e = 0; e < D; e++) dq[qo + e] = (float)dqa[e];
            }
        }
    for (size_t i = 0; i < nk; i++) { dk[i] = (float)dka[i]; dv[i] = (float)dva[i]; }
    free(idx); free(dqa); free(dka); free(dva);
    return 0;
}
