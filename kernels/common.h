/*
 * kernels/common.h — what every kernel module shares: the host-side bf16 type and conversions,
 * the error channel of kernel launchers, and the seeded generator references and tests use.
 *
 * bf16 on the host is its bit pattern in a uint16_t (headers must compile from C; the .cu files
 * reinterpret it as __nv_bfloat16). Conversions round to nearest even, as __float2bfloat16 does,
 * so a CPU reference "in the kernel's precision" rounds exactly like the GPU.
 *
 * Launchers (CUDA) return 0, or -1 after writing a one-line reason retrievable with
 * kernels_error() (thread-local, like dlerror): a violated shape precondition ("rmsnorm_forward:
 * C=4097 must be a multiple of 8"), or the cudaGetLastError() text after the launch. In DEBUG=1
 * builds (the Makefile defines DFLASH_DEBUG) launchers also synchronise, so an asynchronous fault is
 * reported at the launch that caused it; release builds never do (a compile-time choice, so no run
 * can change the launch sequence from the environment). kernels/ never exits and never includes stage headers.
 */
#ifndef KERNELS_COMMON_H
#define KERNELS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t bf16;   /* bf16 bit pattern on the host */

static inline float bf16_to_float(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline bf16 float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))  /* NaN stays a quiet NaN */
        return (bf16)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);   /* round to nearest even */
    return (bf16)(u >> 16);
}
/* Round a float to the nearest bf16 value, kept in a float (for "reference in kernel precision"). */
static inline float bf16_round(float f) { return bf16_to_float(float_to_bf16(f)); }

void bf16_from_floats(bf16 *dst, const float *src, size_t n);
void floats_from_bf16(float *dst, const bf16 *src, size_t n);

/* The reason of the last failed launcher call in this thread ("" if none). */
const char *kernels_error(void);
/* Set the reason (printf-style) and return -1; for launchers' precondition checks. */
int kernels_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* splitmix64: a tiny seeded generator shared by references, tests and benchmarks. */
static inline uint64_t kernels_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#ifdef __cplusplus
}
#endif

/* 1 in DEBUG=1 builds: launchers synchronise after each launch (see the top of this file). */
#ifdef DFLASH_DEBUG
#define KERNELS_SYNC_AFTER_LAUNCH 1
#else
#define KERNELS_SYNC_AFTER_LAUNCH 0
#endif
static inline int kernels_sync_debug(void) { return KERNELS_SYNC_AFTER_LAUNCH; }

#ifdef __CUDACC__
#include <cuda_runtime.h>
/* Check a launch right afterwards (style.md); returns -1 from the launcher on failure. */
#define KERNELS_CHECK_LAUNCH(name) do { \
        cudaError_t e_ = cudaGetLastError(); \
        if (e_ == cudaSuccess && KERNELS_SYNC_AFTER_LAUNCH) e_ = cudaDeviceSynchronize(); \
        if (e_ != cudaSuccess) return kernels_fail("%s: %s", (name), cudaGetErrorString(e_)); \
    } while (0)
#endif

#endif /* KERNELS_COMMON_H */
