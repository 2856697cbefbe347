/*
 * kernels/adamw_ref.c — CPU reference of AdamW, the global grad norm and the lr schedules
 * (kernels/adamw.h). Plain loops; the update is evaluated in the same float order as adamw.cu.
 */
#include "kernels/adamw.h"

#include <math.h>
#include <stdio.h>

float adamw_clip_factor(double sumsq, float max_norm) {
    if (max_norm <= 0) return 1.0f;
    double c = (double)max_norm / (sqrt(sumsq) + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

double adamw_lr_linear(long s, long total, long warmup) {
    if (s < warmup) return (double)s / (double)(warmup > 1 ? warmup : 1);
    double f = (double)(total - s) / (double)(total - warmup > 1 ? total - warmup : 1);
    return f > 0 ? f : 0;
}

double adamw_lr_cosine(long s, long total, long warmup) {
    if (s < warmup) return (double)s / (double)(warmup > 1 ? warmup : 1);
    double progress = (double)(s - warmup) / (double)(total - warmup > 1 ? total - warmup : 1);
    double f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
    return f > 0 ? f : 0;
}

void adamw_grad_sumsq_ref(const float *grad, size_t n, double *sumsq) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)grad[i] * grad[i];
    *sumsq += s;
}

int adamw_step_ref(float *master, float *m, float *v, const float *grad, bf16 *copy, size_t n,
                   const adamw_params *p, double sumsq, char *err, int err_len) {
    if (p->step < 1 || !(p->lr >= 0)) {
        snprintf(err, err_len, "adamw_step_ref: need step >= 1 and lr >= 0, got step=%d lr=%g", p->step, p->lr);
        return -1;
    }
    float clip = adamw_clip_factor(sumsq, p->max_norm);
    float bc1 = 1.0f - powf(p->beta1, (float)p->step);
    float bc2_sqrt = sqrtf(1.0f - powf(p->beta2, (float)p->step));
    float step_size = p->lr / bc1;
    float decay = 1.0f - p->lr * p->weight_decay;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * clip;
        float w = master[i] * decay;
        float mi = p->beta1 * m[i] + (1.0f - p->beta1) * g;
        float vi = p->beta2 * v[i] + (1.0f - p->beta2) * g * g;
        w -= step_size * mi / (sqrtf(vi) / bc2_sqrt + p->eps);
        master[i] = w;
        m[i] = mi;
        v[i] = vi;
        if (copy) copy[i] = float_to_bf16(w);
    }
    return 0;
}
