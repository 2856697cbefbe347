/*
 * kernels/decode_attn_ref.c — plain-C fp32 reference of kernels/decode_attn.h: the attention loop of
 * attention_ref.c (keys in position order, double accumulators), reading keys and values from a slot's cache.
 */
#include "kernels/decode_attn.h"

#include <math.h>
#include <string.h>

static int check_rows(const int32_t *slot, const int32_t *pos, int T, int S, int max_len, const char *who) {
    for (int r = 0; r < T; r++) {
        if (slot[r] < 0 || slot[r] >= S) return kernels_fail("%s: row %d: slot %d of %d", who, r, slot[r], S);
        if (pos[r] < 0 || pos[r] >= max_len)
            return kernels_fail("%s: row %d: position %d outside the cache's [0, %d)", who, r, pos[r], max_len);
    }
    return 0;
}

int decode_attn_append_ref(float *kc, float *vc, const float *k, const float *v, const int32_t *slot,
                           const int32_t *pos, int T, int S, int max_len, int NKV, int HD) {
    if (check_rows(slot, pos, T, S, max_len, "decode_attn_append_ref")) return -1;
    size_t row = (size_t)NKV * HD;
    for (int r = 0; r < T; r++) {
        size_t at = ((size_t)slot[r] * max_len + (size_t)pos[r]) * row;
        memcpy(kc + at, k + (size_t)r * row, row * sizeof(float));
        memcpy(vc + at, v + (size_t)r * row, row * sizeof(float));
    }
    return 0;
}

int decode_attn_forward_ref(float *out, const float *q, const float *kc, const float *vc, const int32_t *slot,
                            const int32_t *pos, int T, int S, int max_len, int NH, int NKV, int HD, float scale,
                            double *scratch) {
    if (NKV <= 0 || NH % NKV) return kernels_fail("decode_attn_forward_ref: NH=%d must be a multiple of NKV=%d", NH, NKV);
    if (check_rows(slot, pos, T, S, max_len, "decode_attn_forward_ref")) return -1;
    int G = NH / NKV;
    size_t row = (size_t)NKV * HD;
    double *p = scratch, *o = scratch + max_len;
    for (int r = 0; r < T; r++) {
        const float *kcs = kc + (size_t)slot[r] * max_len * row, *vcs = vc + (size_t)slot[r] * max_len * row;
        int n = pos[r] + 1;   /* keys 0 .. pos */
        for (int h = 0; h < NH; h++) {
            int kh = h / G;
            const float *qi = q + ((size_t)r * NH + h) * HD;
            double m = -INFINITY, sum = 0;
            for (int j = 0; j < n; j++) {
                const float *kj = kcs + (size_t)j * row + (size_t)kh * HD;
                double s = 0;
                for (int e = 0; e < HD; e++) s += (double)qi[e] * kj[e];
                p[j] = s * scale;
                if (p[j] > m) m = p[j];
            }
            for (int e = 0; e < HD; e++) o[e] = 0;
            for (int j = 0; j < n; j++) {
                double w = exp(p[j] - m);
                sum += w;
                const float *vj = vcs + (size_t)j * row + (size_t)kh * HD;
                for (int e = 0; e < HD; e++) o[e] += w * vj[e];
            }
            float *oi = out + ((size_t)r * NH + h) * HD;
            for (int e = 0; e < HD; e++) oi[e] = (float)(o[e] / sum);
        }
    }
    return 0;
}
