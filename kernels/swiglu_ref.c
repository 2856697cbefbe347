/*
 * kernels/swiglu_ref.c — reference SwiGLU forward and backward (kernels/swiglu.h).
 */
#include "kernels/swiglu.h"

#include <math.h>

static float sigmoidf_(float g) { return 1.0f / (1.0f + expf(-g)); }

void swiglu_forward_ref(float *out, const float *gate, const float *up, int T, int I, int in_stride) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            float g = gate[(size_t)t * in_stride + i], u = up[(size_t)t * in_stride + i];
            out[(size_t)t * I + i] = g * sigmoidf_(g) * u;
        }
}

void swiglu_backward_ref(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                         int T, int I, int in_stride) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < I; i++) {
            size_t o = (size_t)t * in_stride + i;
            float g = gate[o], u = up[o], d = dout[(size_t)t * I + i], s = sigmoidf_(g);
            dgate[o] = d * u * s * (1.0f + g * (1.0f - s));
            dup[o] = d * g * s;
        }
}
