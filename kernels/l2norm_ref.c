/*
 * kernels/l2norm_ref.c — reference per-head L2 normalisation (kernels/l2norm.h).
 */
#include "kernels/l2norm.h"

#include <math.h>

void l2norm_forward_ref(float *x, int N, int row_stride, int n_heads, int d, float scale) {
    for (int r = 0; r < N; r++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (size_t)r * row_stride + (size_t)h * d;
            double ss = 0;
            for (int i = 0; i < d; i++) ss += (double)v[i] * v[i];
            float rn = (float)(1.0 / sqrt((double)(float)ss + L2NORM_EPS));
            for (int i = 0; i < d; i++) {
                v[i] *= rn;
                if (scale != 1.0f) v[i] *= scale;
            }
        }
}
