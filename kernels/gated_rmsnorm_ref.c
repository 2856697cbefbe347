/*
 * kernels/gated_rmsnorm_ref.c — reference gated RMSNorm (kernels/gated_rmsnorm.h), the arithmetic of
 * stages/model/gdn.c's output norm.
 */
#include "kernels/gated_rmsnorm.h"

#include <math.h>

void gated_rmsnorm_forward_ref(float *y, const float *o, const float *z, int z_stride, const float *w, int T,
                               int n_heads, int d, float eps) {
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *ov = o + ((size_t)t * n_heads + h) * d, *zv = z + (size_t)t * z_stride + (size_t)h * d;
            float *yv = y + ((size_t)t * n_heads + h) * d;
            double ss = 0;
            for (int e = 0; e < d; e++) ss += (double)ov[e] * ov[e];
            float rs = (float)(1.0 / sqrt(ss / d + eps));
            for (int e = 0; e < d; e++) yv[e] = w[e] * (ov[e] * rs) * (zv[e] / (1.0f + expf(-zv[e])));
        }
}
