/*
 * kernels/anchors.h — DFlash anchor selection (dflash-reference.md §5) on the device, with a CPU
 * reference that reproduces the device's choice exactly.
 *
 * Candidates are {p : loss_mask[p] != 0 and p < T - B}. K = min(N, |candidates|) of them are taken
 * uniformly without replacement and written sorted ascending to anchors[0..K-1]; slots K..N-1 get
 * anchor 0 and valid 0.
 *
 * Reproducibility: every position p gets a 63-bit key from a counter-based hash of (seed, step, p)
 * (anchors_key); non-candidates get the key UINT64_MAX. The selected set is the N positions with the
 * smallest (key, p) pairs among the candidates. i.i.d. keys make every K-subset equally likely, and
 * because the choice depends only on the keys (no sequential generator state, no thread order) the
 * CPU reference and any GPU schedule pick the identical set.
 */
#ifndef KERNELS_ANCHORS_H
#define KERNELS_ANCHORS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/common.h"

#ifdef __CUDACC__
#define ANCHORS_HD __host__ __device__
#else
#define ANCHORS_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* One splitmix64 step from state z (kernels/common.h: the project's one generator). */
static inline ANCHORS_HD uint64_t anchors_mix64(uint64_t z) { return kernels_mix64(z + KERNELS_RNG_GAMMA); }
/* The selection key of position p at (seed, step): a 63-bit hash, so UINT64_MAX marks non-candidates. */
static inline ANCHORS_HD uint64_t anchors_key(uint64_t seed, uint64_t step, uint32_t p) {
    return anchors_mix64(anchors_mix64(anchors_mix64(seed) ^ step) ^ (uint64_t)p) >> 1;
}

/* CPU reference. loss_mask: (T) uint8. Writes anchors (N) int32 sorted ascending with padding 0, and
 * valid (N) uint8. Returns K = the number of valid anchors, or -1 with a sentence in err on bad
 * arguments (T < 1, B < 1, N < 1) or allocation failure. Thread-safe; allocates O(T) temporarily. */
int anchors_forward_ref(const uint8_t *loss_mask, int T, int B, int N, uint64_t seed, uint64_t step,
                        int32_t *anchors, uint8_t *valid, char *err, int err_len);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* Bytes of device workspace anchors_forward needs for a packed length T. */
size_t anchors_workspace_bytes(int T);
/* Device launcher: same contract as the reference, on device pointers d_loss_mask (T), d_anchors (N),
 * d_valid (N), d_count (1, int32, may be NULL: receives K) and d_workspace (anchors_workspace_bytes(T)).
 * Asynchronous on stream; no host synchronisation, no allocation. Returns 0, or -1 (kernels_error()). */
int anchors_forward(const uint8_t *d_loss_mask, int T, int B, int N, uint64_t seed, uint64_t step,
                    int32_t *d_anchors, uint8_t *d_valid, int32_t *d_count, void *d_workspace,
                    cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_ANCHORS_H */
