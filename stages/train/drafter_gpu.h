/*
 * stages/train/drafter_gpu.h — the device glue kernels of the GPU training step (drafter_gpu.cu), used by
 * drafter_gpu.c only: building the block tokens and positions from the anchors, the hidden-state noise, and
 * the EAL reduction of the per-row argmaxes. None of them does arithmetic the CPU path would not do the same
 * way (the noise is the CPU's counter-based formula element by element; the rest is data movement and integer
 * counting), so each is deterministic. The public GPU API is in train/drafter.h under DFLASH_CUDA.
 */
#ifndef STAGES_TRAIN_DRAFTER_GPU_H
#define STAGES_TRAIN_DRAFTER_GPU_H

#ifdef DFLASH_CUDA
#include <stdint.h>
#include <cuda_runtime_api.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* pos (Tc + N·B): pos[p] = position_ids[p] for p < Tc, pos[Tc + b·B + j] = position_ids[anchors[b]] + j;
 * tok (N·B): tok[b·B + j] = j == 0 ? input_ids[anchors[b]] : mask_token. Anchors must lie in [0, Tc). */
int dg_block_inputs(int32_t *pos, int32_t *tok, const int32_t *anchors, const int32_t *input_ids,
                    const int32_t *position_ids, int Tc, int N, int B, int32_t mask_token, cudaStream_t stream);

/* out (Tc, C) = bf16(float(in) + noise(e)) for the elements e < T·C, noise as drafter_noise_base's DESIGN note
 * (splitmix64 of base + (e + 1)·0x9E3779B97F4A7C15, top 24 bits, 2(u − 0.5)·scale in double, added in fp32);
 * rows T..Tc-1 are copied (they are the zero padding). */
int dg_noise(bf16 *out, const bf16 *in, int T, int Tc, int C, uint64_t base, float scale, cudaStream_t stream);

/* EAL of speculators 0.9 over the N blocks (lmhead_eal_blocks): arg (N·B, 2) int32 = (pred, tgt) per row,
 * mask (N·B); writes sum (1) and count (1) int32 (overwritten). One block; integer sums, so deterministic. */
int dg_eal(int32_t *sum, int32_t *count, const int32_t *arg, const uint8_t *mask, int N, int B, int first,
           cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* DFLASH_CUDA */
#endif /* STAGES_TRAIN_DRAFTER_GPU_H */
