/*
 * kernels/rope_ref.c — rotary embedding: inverse frequencies (HF "default" and "llama3" rope
 * init) and the reference rotate-half forward/backward (kernels/rope.h).
 *
 * The angle is the fp32 product float(pos)·inv_freq[i], as Hugging Face forms it (it disables
 * autocast for that product), so the GPU kernel, which forms the same product, sees the same angle.
 */
#include "kernels/rope.h"

#include <math.h>

int rope_inv_freq(float *inv_freq, const struct rope_config *cfg) {
    int HD = cfg->head_dim;
    if (HD <= 0 || HD % 2)
        return kernels_fail("rope_inv_freq: head_dim must be positive and even, got %d", HD);
    if (!(cfg->theta > 0))
        return kernels_fail("rope_inv_freq: rope_theta must be positive, got %g", cfg->theta);
    if (cfg->scaling == ROPE_SCALING_LLAMA3 &&
        !(cfg->factor > 0 && cfg->low_freq_factor > 0 && cfg->high_freq_factor > cfg->low_freq_factor &&
          cfg->original_max_positions > 0))
        return kernels_fail("rope_inv_freq: llama3 scaling needs factor > 0, 0 < low_freq_factor < "
                            "high_freq_factor and original_max_position_embeddings > 0; got factor %g, "
                            "low %g, high %g, original %d", cfg->factor, cfg->low_freq_factor,
                            cfg->high_freq_factor, cfg->original_max_positions);
    if (cfg->scaling != ROPE_SCALING_NONE && cfg->scaling != ROPE_SCALING_LLAMA3)
        return kernels_fail("rope_inv_freq: unknown rope scaling type %d", (int)cfg->scaling);
    for (int i = 0; i < HD / 2; i++) {
        float e = (float)(2 * i) / (float)HD;   /* HF: arange(0, dim, 2).float() / dim in fp32 */
        float f = (float)(1.0 / pow(cfg->theta, (double)e));
        if (cfg->scaling == ROPE_SCALING_LLAMA3) {
            double old = cfg->original_max_positions;
            double low_wl = old / cfg->low_freq_factor, high_wl = old / cfg->high_freq_factor;
            double wl = 2.0 * M_PI / f;
            if (wl > low_wl) {
                f = (float)(f / cfg->factor);
            } else if (!(wl < high_wl)) {   /* medium frequencies: interpolate */
                double s = (old / wl - cfg->low_freq_factor) / (cfg->high_freq_factor - cfg->low_freq_factor);
                f = (float)((1.0 - s) * f / cfg->factor + s * f);
            }
        }
        inv_freq[i] = f;
    }
    return 0;
}

static void rotate(float *x, int rows, int HD, float pos, const float *inv_freq, float sign) {
    int h2 = HD / 2;
    for (int r = 0; r < rows; r++) {
        float *v = x + (size_t)r * HD;
        for (int i = 0; i < h2; i++) {
            float a = pos * inv_freq[i];
            float c = cosf(a), s = sign * sinf(a);
            float x0 = v[i], x1 = v[i + h2];
            v[i] = x0 * c - x1 * s;
            v[i + h2] = x1 * c + x0 * s;
        }
    }
}

void rope_forward_ref(float *q, float *k, const int32_t *pos, const float *inv_freq,
                      int T, int NH, int NKV, int HD) {
    for (int t = 0; t < T; t++) {
        rotate(q + (size_t)t * NH * HD, NH, HD, (float)pos[t], inv_freq, 1.0f);
        if (k) rotate(k + (size_t)t * NKV * HD, NKV, HD, (float)pos[t], inv_freq, 1.0f);
    }
}

void rope_backward_ref(float *dq, float *dk, const int32_t *pos, const float *inv_freq,
                       int T, int NH, int NKV, int HD) {
    /* y = R(a)·x, so dx = R(a)ᵀ·dy = R(−a)·dy. */
    for (int t = 0; t < T; t++) {
        rotate(dq + (size_t)t * NH * HD, NH, HD, (float)pos[t], inv_freq, -1.0f);
        if (dk) rotate(dk + (size_t)t * NKV * HD, NKV, HD, (float)pos[t], inv_freq, -1.0f);
    }
}
