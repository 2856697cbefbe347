/*
 * kernels/attention_ref.c — reference causal varlen GQA attention (kernels/attention.h).
 *
 * Plain loops per document, head and query: scores in double, max-subtracted softmax, weighted
 * sum of values in double. O(Σ len²·NH·HD): fine for tests, not for training.
 */
#include "kernels/attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int attention_shape_supported(int NH, int NKV, int HD, char *err, int err_len) {
    const char *taken = "the GPU attention takes head_dim 16, 32, 64, 128 or 256 with num_heads a positive multiple "
                        "of num_kv_heads";
    if (NH <= 0 || NKV <= 0 || NH % NKV) {
        if (err && err_len > 0)
            snprintf(err, (size_t)err_len, "attention: num_heads %d / num_kv_heads %d is not a GPU shape: %s", NH, NKV,
                     taken);
        return -1;
    }
    if (HD != 16 && HD != 32 && HD != 64 && HD != 128 && HD != 256) {
        if (err && err_len > 0)
            snprintf(err, (size_t)err_len, "attention: HD=%d (head_dim) is not a GPU shape: %s", HD, taken);
        return -1;
    }
    return 0;
}

int attention_check_cu_seqlens(const int32_t *cu_seqlens, int ND, int T, int *max_seqlen) {
    if (ND < 0) return kernels_fail("attention: n_docs must be >= 0, got %d", ND);
    if (cu_seqlens[0] != 0) return kernels_fail("attention: cu_seqlens[0] must be 0, got %d", cu_seqlens[0]);
    int mx = 0;
    for (int d = 0; d < ND; d++) {
        int len = cu_seqlens[d + 1] - cu_seqlens[d];
        if (len < 0)
            return kernels_fail("attention: cu_seqlens must be non-decreasing, but cu_seqlens[%d]=%d > cu_seqlens[%d]=%d",
                                d, cu_seqlens[d], d + 1, cu_seqlens[d + 1]);
        if (len > mx) mx = len;
    }
    if (cu_seqlens[ND] > T)
        return kernels_fail("attention: cu_seqlens[%d]=%d exceeds T=%d", ND, cu_seqlens[ND], T);
    if (max_seqlen) *max_seqlen = mx;
    return 0;
}

int attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v,
                          const int32_t *cu_seqlens, int ND, int T, int NH, int NKV, int HD, float scale) {
    if (NKV <= 0 || NH % NKV)
        return kernels_fail("attention_forward_ref: NH=%d must be a multiple of NKV=%d", NH, NKV);
    if (attention_check_cu_seqlens(cu_seqlens, ND, T, NULL)) return -1;
    int G = NH / NKV;
    double *p = malloc(((size_t)T + 1) * sizeof *p), *o = malloc(((size_t)HD + 1) * sizeof *o);
    if (!p || !o) { free(p); free(o); return kernels_fail("attention_forward_ref: out of memory"); }
    for (int d = 0; d < ND; d++) {
        int s0 = cu_seqlens[d], len = cu_seqlens[d + 1] - s0;
        for (int h = 0; h < NH; h++) {
            int kh = h / G;
            for (int i = 0; i < len; i++) {
                const float *qi = q + ((size_t)(s0 + i) * NH + h) * HD;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *kj = k + ((size_t)(s0 + j) * NKV + kh) * HD;
                    double s = 0;
                    for (int c = 0; c < HD; c++) s += (double)qi[c] * kj[c];
                    p[j] = s * scale;
                    if (p[j] > m) m = p[j];
                }
                for (int c = 0; c < HD; c++) o[c] = 0;
                for (int j = 0; j <= i; j++) {
                    double e = exp(p[j] - m);
                    sum += e;
                    const float *vj = v + ((size_t)(s0 + j) * NKV + kh) * HD;
                    for (int c = 0; c < HD; c++) o[c] += e * vj[c];
                }
                float *oi = out + ((size_t)(s0 + i) * NH + h) * HD;
                for (int c = 0; c < HD; c++) oi[c] = (float)(o[c] / sum);
                if (lse) lse[(size_t)h * T + s0 + i] = (float)(m + log(sum));
            }
        }
    }
    free(p);
    free(o);
    return 0;
}
