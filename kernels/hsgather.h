/*
 * kernels/hsgather.h — the hidden-state layout step of design.md §6 (dflash-hspack).
 *
 * The target captures L layers as L separate [T,C] buffers (the `hidden` ring: [L][T,C]). The
 * drafter wants either one concatenated row per token, concat [T, L·C] (row t = part 0 row t,
 * part 1 row t, ...; what `fc` [D, L·C] consumes in one GEMM), or the L parts split again
 * (split: each [T,C], projected by its slice of fc). hsgather_concat optionally picks rows by an
 * index list (row i of the output = row rows[i] of every part), so a consumer can reorder or
 * subset tokens in the same pass; hsgather_split is the exact inverse of the identity concat.
 * Pure data movement: bit-exact, any dtype of 2 bytes (bf16 or fp16).
 */
#ifndef KERNELS_HSGATHER_H
#define KERNELS_HSGATHER_H

#include <stdint.h>
#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HSGATHER_MAX_PARTS 16

/* L part pointers passed by value (each [T_in, C]). */
struct hs_parts { const bf16 *p[HSGATHER_MAX_PARTS]; };
struct hs_parts_out { bf16 *p[HSGATHER_MAX_PARTS]; };

/* Reference. out [T_out, L·C] <- parts (each [T_in,C]); rows [T_out] indexes into [0,T_in) or is
 * NULL (identity, T_out == T_in). Returns 0, or -1 when L is out of range or a row index is. */
int hsgather_concat_ref(bf16 *out, const struct hs_parts *parts, const int32_t *rows, int L, int T_out,
                        int T_in, int C);
/* Reference. parts (each [T,C]) <- in [T, L·C]. Returns 0 or -1 (L out of range). */
int hsgather_split_ref(const struct hs_parts_out *parts, const bf16 *in, int L, int T, int C);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* GPU concat. Device pointers; rows [T_out] int32 device or NULL. C % 8 == 0 and 16-byte aligned
 * pointers (checked). Out-of-range row indices give zero rows (cannot be reported asynchronously;
 * validate on the host). Asynchronous; 0 or -1 with kernels_error(). */
int hsgather_concat(bf16 *out, struct hs_parts parts, const int32_t *rows, int L, int T_out, int T_in,
                    int C, cudaStream_t stream);
/* GPU split: parts (each [T,C]) <- in [T, L·C]. Same preconditions. */
int hsgather_split(struct hs_parts_out parts, const bf16 *in, int L, int T, int C, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_HSGATHER_H */
