/*
 * kernels/gated_attn_ref.c — reference split / partial rotary / output gate of the gated attention
 * layer (kernels/gated_attn.h); the arithmetic of stages/model/gdn.c.
 */
#include "kernels/gated_attn.h"

#include <math.h>
#include <string.h>

void gated_attn_split_forward_ref(float *q, float *gate, float *k, float *v, const float *qkv, int T, int NH, int NKV,
                                  int HD) {
    size_t nq = (size_t)NH * HD, nk = (size_t)NKV * HD, row = 2 * nq + 2 * nk;
    for (int t = 0; t < T; t++) {
        const float *r = qkv + (size_t)t * row;
        for (int h = 0; h < NH; h++) {
            memcpy(q + (size_t)t * nq + (size_t)h * HD, r + (size_t)h * 2 * HD, (size_t)HD * sizeof(float));
            memcpy(gate + (size_t)t * nq + (size_t)h * HD, r + (size_t)h * 2 * HD + HD, (size_t)HD * sizeof(float));
        }
        memcpy(k + (size_t)t * nk, r + 2 * nq, nk * sizeof(float));
        memcpy(v + (size_t)t * nk, r + 2 * nq + nk, nk * sizeof(float));
    }
}

void gated_attn_rope_forward_ref(float *x, const int32_t *pos, const float *inv_freq, int T, int n_heads, int HD,
                                 int R) {
    int h2 = R / 2;
    for (int t = 0; t < T; t++) {
        float p = (float)pos[t];
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * HD;
            for (int i = 0; i < h2; i++) {
                float a = p * inv_freq[i];
                float c = cosf(a), s = sinf(a);
                float x0 = v[i], x1 = v[i + h2];
                v[i] = x0 * c - x1 * s;
                v[i + h2] = x1 * c + x0 * s;
            }
        }
    }
}

void gated_attn_gate_forward_ref(float *att, const float *gate, int64_t n) {
    for (int64_t i = 0; i < n; i++) att[i] *= 1.0f / (1.0f + expf(-gate[i]));
}
