/*
 * kernels/common.c — bf16 array conversions and the launchers' thread-local error channel
 * (kernels/common.h).
 */
#include "kernels/common.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char kernels_err[512];

void bf16_from_floats(bf16 *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = float_to_bf16(src[i]);
}

void floats_from_bf16(float *dst, const bf16 *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_float(src[i]);
}

const char *kernels_error(void) { return kernels_err; }

int kernels_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kernels_err, sizeof kernels_err, fmt, ap);
    va_end(ap);
    return -1;
}
