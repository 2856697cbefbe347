/*
 * tests/gpu/k1util.h — helpers for the GPU suites of the Kernels I ops (tests only, header-only):
 * a checked CUDA call for Check tests, bf16 device buffers filled from seeded floats (the host keeps
 * the bf16-rounded copy the reference runs on), downloads to floats, and a poison fill so a kernel
 * that skips an element is caught. CUDA is initialised by the first call inside a test, never in
 * main (Check forks each test).
 */
#ifndef TESTS_GPU_K1UTIL_H
#define TESTS_GPU_K1UTIL_H

#include <cuda_runtime_api.h>

#include "kernels/common.h"
#include "tests/testutil.h"

#define K1_CUDA(x) do { cudaError_t e_ = (x); ck_assert_msg(e_ == cudaSuccess, "%s: %s", #x, cudaGetErrorString(e_)); } while (0)
#define K1_LAUNCH(x) do { int r_ = (x); ck_assert_msg(r_ == 0, "%s: %s", #x, kernels_error()); } while (0)

static inline void *k1_malloc(size_t bytes) {
    void *p = NULL;
    K1_CUDA(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

/* host floats -> rounded in place to bf16 values -> device bf16 buffer (new). */
static inline bf16 *k1_upload_bf16(float *host, size_t n) {
    bf16 *tmp = malloc(2 * n + 2);
    for (size_t i = 0; i < n; i++) {
        tmp[i] = float_to_bf16(host[i]);
        host[i] = bf16_to_float(tmp[i]);
    }
    bf16 *d = k1_malloc(2 * n);
    K1_CUDA(cudaMemcpy(d, tmp, 2 * n, cudaMemcpyHostToDevice));
    free(tmp);
    return d;
}

static inline void *k1_upload(const void *host, size_t bytes) {
    void *d = k1_malloc(bytes);
    K1_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static inline void k1_download_bf16(float *host, const bf16 *dev, size_t n) {
    bf16 *tmp = malloc(2 * n + 2);
    K1_CUDA(cudaMemcpy(tmp, dev, 2 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) host[i] = bf16_to_float(tmp[i]);
    free(tmp);
}

/* Fill with 0xFFFF bf16 (a NaN): anything a kernel forgets to write shows up as NaN. */
static inline void k1_poison(void *dev, size_t bytes) { K1_CUDA(cudaMemset(dev, 0xff, bytes)); }

static inline float *k1_randn(uint64_t *seed, size_t n, float lo, float hi) {
    float *x = malloc(4 * n + 4);
    test_rng_fill(seed, x, n, lo, hi);
    return x;
}

/* n random bf16-representable values in [lo, hi): the bf16 array for the device and its float copy */
static inline void k1_fill_bf16(uint64_t *rng, bf16 *hb, float *hf, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) {
        hb[i] = float_to_bf16(test_rng_uniform(rng, lo, hi));
        hf[i] = bf16_to_float(hb[i]);
    }
}

/* max |a - b|; INFINITY when any pair has a NaN (fmax would skip it), so every "err <= bound" fails */
static inline double k1_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (isnan(d)) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* max |a|; NaN when any element is NaN (a bound scaled by it then fails every comparison) */
static inline double k1_max_abs(const float *a, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i]);
        if (isnan(d)) return NAN;
        if (d > m) m = d;
    }
    return m;
}

static inline double k1_rms(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return n ? sqrt(s / n) : 0;
}

#endif /* TESTS_GPU_K1UTIL_H */
