/*
 * kernels/embedding.h — embedding gather: out[t,:] = table[ids[t],:].
 *
 * The tables are frozen in DFlash (target and drafter embeddings), so there is no backward.
 * GPU: bf16 table and output, 16-byte vector copies (C % 8 == 0). An id outside [0, V) cannot
 * be reported by the asynchronous kernel: its row is filled with NaN so it is loud downstream;
 * the reference reports it with -1.
 */
#ifndef KERNELS_EMBEDDING_H
#define KERNELS_EMBEDDING_H

#include <stdint.h>
#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out [T,C] = table [V,C] rows ids [T]. Returns 0, or -1 (kernels_error() names the token and
 * id) when an id is out of range; rows before it are written. */
int embedding_forward_ref(float *out, const int32_t *ids, const float *table, int T, int C, int V);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* GPU gather, bf16. out [T,C], ids [T] (device), table [V,C]. C % 8 == 0 and 16-byte aligned
 * pointers, checked. Asynchronous; 0 or -1 with kernels_error(). Out-of-range ids give NaN rows. */
int embedding_forward(bf16 *out, const int32_t *ids, const bf16 *table, int T, int C, int V,
                      cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_EMBEDDING_H */
