/*
 * kernels/rmsnorm_ref.c — reference RMSNorm, fused residual form and backward (kernels/rmsnorm.h).
 * Row statistics in double; everything stored in fp32.
 */
#include "kernels/rmsnorm.h"

#include <math.h>

void rmsnorm_forward_ref(float *y, float *rstd, const float *x, const float *w, int N, int C, float eps) {
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)xr[c] * xr[c];
        float rs = (float)(1.0 / sqrt(ss / C + eps));
        if (rstd) rstd[r] = rs;
        float *yr = y + (size_t)r * C;
        for (int c = 0; c < C; c++) yr[c] = w[c] * (xr[c] * rs);
    }
}

void rmsnorm_residual_forward_ref(float *y, float *resid, float *rstd, const float *x, const float *w,
                                  int N, int C, float eps) {
    for (size_t i = 0; i < (size_t)N * C; i++) resid[i] = x[i] + resid[i];
    rmsnorm_forward_ref(y, rstd, resid, w, N, C, eps);
}

void rmsnorm_backward_ref(float *dx, float *dw, const float *dy, const float *x, const float *w,
                          const float *rstd, int N, int C, int accumulate_dx) {
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * C, *dyr = dy + (size_t)r * C;
        float *dxr = dx + (size_t)r * C;
        double rs = rstd[r], m = 0;
        for (int c = 0; c < C; c++) m += (double)w[c] * dyr[c] * (xr[c] * rs);
        m /= C;
        for (int c = 0; c < C; c++) {
            double xhat = xr[c] * rs;
            double g = rs * ((double)w[c] * dyr[c] - xhat * m);
            dxr[c] = (float)(accumulate_dx ? dxr[c] + g : g);
            if (dw) dw[c] += (float)(dyr[c] * xhat);
        }
    }
}
