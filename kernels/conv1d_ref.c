/*
 * kernels/conv1d_ref.c — reference causal depthwise conv1d + SiLU with per-document reset (kernels/conv1d.h).
 */
#include "kernels/conv1d.h"

#include <math.h>

void conv1d_forward_ref(float *y, const float *x, int x_stride, const float *w, const int32_t *cu_seqlens,
                        int n_docs, int T, int D, int K) {
    (void)T;
    for (int d = 0; d < n_docs; d++)
        for (int t = cu_seqlens[d]; t < cu_seqlens[d + 1]; t++)
            for (int c = 0; c < D; c++) {
                double acc = 0;
                for (int j = 0; j < K; j++) {
                    int src = t - (K - 1) + j;
                    if (src >= cu_seqlens[d]) acc += (double)w[(size_t)c * K + j] * x[(size_t)src * x_stride + c];
                }
                float f = (float)acc;
                y[(size_t)t * D + c] = f / (1.0f + expf(-f));
            }
}

void conv1d_decode_append_ref(float *hist, const float *x, int x_stride, const int32_t *slot, const int32_t *pos,
                              int T, int W, int D) {
    for (int r = 0; r < T; r++)
        for (int c = 0; c < D; c++)
            hist[((size_t)slot[r] * W + (size_t)(pos[r] % W)) * D + c] = x[(size_t)r * x_stride + c];
}

void conv1d_decode_ref(float *y, const float *hist, const int32_t *slot, const int32_t *pos, int T, int W,
                       const float *w, int D, int K) {
    for (int r = 0; r < T; r++)
        for (int c = 0; c < D; c++) {
            double acc = 0;
            for (int j = 0; j < K; j++) {
                int src = pos[r] - (K - 1) + j;
                if (src >= 0)
                    acc += (double)w[(size_t)c * K + j] * hist[((size_t)slot[r] * W + (size_t)(src % W)) * D + c];
            }
            float f = (float)acc;
            y[(size_t)r * D + c] = f / (1.0f + expf(-f));
        }
}
