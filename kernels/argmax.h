/*
 * kernels/argmax.h — the index of each row's largest value: greedy decoding's pick from fp32 logits, on the device,
 * so that R ids cross to the host instead of R·V logits (model/decode.h decode_argmax; at batch 16 and a 151936
 * vocabulary the logits' transfer and the host scan took 2 of a 9.5 ms decode step, RESULTS.md run 55).
 *
 * The pick is the plain loop's `best = 0; for v >= 1: if (x[v] > x[best]) best = v`: the first maximum on ties, a
 * NaN never wins, and a row whose element 0 is NaN gives 0 (stages/export/eval.h eval_argmax is the same pick).
 */
#ifndef KERNELS_ARGMAX_H
#define KERNELS_ARGMAX_H

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out[r] = the pick of row r of x (R, V), V >= 1: the plain loop above. */
void argmax_rows_ref(int32_t *out, const float *x, int R, int V);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* The same on the device: out (R) int32, x (R, V) fp32 dense; one block per row. R >= 0, V >= 1; checked.
 * Asynchronous; 0 or -1 with kernels_error(). */
int argmax_rows(int32_t *out, const float *x, int R, int V, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_ARGMAX_H */
