/*
 * stages/model/weights.c — checked tensor fetch and dtype conversion (weights.h).
 *
 * Source data comes straight from the safetensors mapping and may be unaligned, so elements are
 * read with memcpy (the compiler turns it into a plain load); same-dtype fetches are one memcpy.
 */
#include "model/weights.h"
#include "core/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

float weights_f16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        float f = (float)m * 5.9604644775390625e-08f;   /* zero or subnormal: m * 2^-24, exact */
        return sign ? -f : f;
    }
    if (e == 31) u = sign | 0x7f800000u | (m << 13);    /* inf / NaN */
    else u = sign | ((e + 112u) << 23) | (m << 13);     /* rebias 15 -> 127 */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t weights_float_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));   /* quiet NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* >= 65520 (incl. inf) rounds to inf */
    if (a < 0x38800000u) {   /* below 2^-14: a subnormal half m * 2^-24; scaling by 2^24 is exact */
        float af;
        memcpy(&af, &a, 4);
        return (uint16_t)(sign | (uint16_t)rintf(af * 16777216.0f));   /* rint: round half to even */
    }
    a += 0xfffu + ((a >> 13) & 1u);   /* round the 13 dropped mantissa bits to nearest even */
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13));   /* rebias 127 -> 15 */
}

static int is_float_dtype(enum st_dtype d) { return d == ST_BF16 || d == ST_F16 || d == ST_F32; }

int weights_lookup(const struct hf_weights *w, const char *name, int ndim, const int64_t *shape,
                   const struct st_tensor **out, char *err, int err_len) {
    const struct st_tensor *t;
    if (hf_weights_get(w, name, &t, err, err_len) != 0) return -1;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        return err_fail(err, err_len, "%s: tensor '%s' has shape %s, expected %s", t->path, name,
                    st_shape_str(a, sizeof a, t->ndim, t->shape), st_shape_str(b, sizeof b, ndim, shape));
    }
    if (!is_float_dtype(t->dtype))
        return err_fail(err, err_len, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32", t->path, name,
                    st_dtype_name(t->dtype));
    *out = t;
    return 0;
}

static int check_range(const struct st_tensor *t, int64_t first, int64_t n, char *err, int err_len) {
    if (!is_float_dtype(t->dtype))
        return err_fail(err, err_len, "%s: tensor '%s' has dtype %s, expected BF16, F16 or F32", t->path, t->name,
                    st_dtype_name(t->dtype));
    if (first < 0 || n < 0 || first > t->numel || n > t->numel - first)
        return err_fail(err, err_len, "%s: tensor '%s': elements [%lld, %lld) are outside its %lld elements", t->path,
                    t->name, (long long)first, (long long)(first + n), (long long)t->numel);
    return 0;
}

/* A checkpoint weight that is NaN or infinite is refused at load (style: bad input gets a
 * sentence naming file, tensor and element), not found downstream as NaN hidden states. */
static int nonfinite(const struct st_tensor *t, int64_t i, float v, char *err, int err_len) {
    return err_fail(err, err_len, "%s: tensor '%s' element %lld is %s: the checkpoint is corrupt", t->path, t->name, (long long)i,
                    isnan(v) ? "NaN" : "infinite");
}

int weights_convert_f32(const struct st_tensor *t, int64_t first, int64_t n, float *dst, char *err, int err_len) {
    if (check_range(t, first, n, err, err_len) != 0) return -1;
    const unsigned char *src = (const unsigned char *)t->data + (size_t)first * st_dtype_size(t->dtype);
    switch (t->dtype) {
    case ST_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case ST_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = bf16_to_float(h);
        }
        break;
    case ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = weights_f16_to_float(h);
        }
        break;
    default:
        break;   /* excluded by check_range */
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(dst[i])) return nonfinite(t, first + i, dst[i], err, err_len);
    return 0;
}

int weights_convert_bf16(const struct st_tensor *t, int64_t first, int64_t n, bf16 *dst, char *err, int err_len) {
    if (check_range(t, first, n, err, err_len) != 0) return -1;
    const unsigned char *src = (const unsigned char *)t->data + (size_t)first * st_dtype_size(t->dtype);
    switch (t->dtype) {
    case ST_BF16:
        memcpy(dst, src, (size_t)n * 2);
        break;
    case ST_F32:
        for (int64_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + 4 * i, 4);
            dst[i] = float_to_bf16(f);
        }
        break;
    case ST_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = float_to_bf16(weights_f16_to_float(h));   /* exact to float, one rounding to bf16 */
        }
        break;
    default:
        break;
    }
    for (int64_t i = 0; i < n; i++)
        if ((dst[i] & 0x7f80u) == 0x7f80u) return nonfinite(t, first + i, bf16_to_float(dst[i]), err, err_len);
    return 0;
}

int weights_get_f32(const struct hf_weights *w, const char *name, int ndim, const int64_t *shape, float *dst,
                    char *err, int err_len) {
    const struct st_tensor *t;
    if (weights_lookup(w, name, ndim, shape, &t, err, err_len) != 0) return -1;
    return weights_convert_f32(t, 0, t->numel, dst, err, err_len);
}

int weights_get_bf16(const struct hf_weights *w, const char *name, int ndim, const int64_t *shape, bf16 *dst,
                     char *err, int err_len) {
    const struct st_tensor *t;
    if (weights_lookup(w, name, ndim, shape, &t, err, err_len) != 0) return -1;
    return weights_convert_bf16(t, 0, t->numel, dst, err, err_len);
}
