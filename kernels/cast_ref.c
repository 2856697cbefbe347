/*
 * kernels/cast_ref.c — reference casts (kernels/cast.h): the kernels/common.h conversions under the
 * reference names, so tests and the CPU path call every op the same way.
 */
#include "kernels/cast.h"

void cast_f32_to_bf16_ref(bf16 *dst, const float *src, size_t n) { bf16_from_floats(dst, src, n); }
void cast_bf16_to_f32_ref(float *dst, const bf16 *src, size_t n) { floats_from_bf16(dst, src, n); }
