/*
 * kernels/swiglu.h — SwiGLU activation of the MLP: out = silu(gate) ⊙ up, silu(g) = g·σ(g).
 *
 * gate and up are rows of width I read with a row stride: separate tensors [T,I] (stride I), or
 * one fused GEMM output gu [T, 2I] with gate = gu, up = gu + I and stride 2I (the layout a single
 * [gate_proj; up_proj] GEMM produces). Backward:
 *     dgate = dout ⊙ up ⊙ σ(g)·(1 + g·(1 − σ(g))),     dup = dout ⊙ silu(g)
 * written with the same stride (so the fused gradient dgu [T,2I] feeds one dX/dW GEMM).
 * GPU: bf16 in/out, fp32 math.
 */
#ifndef KERNELS_SWIGLU_H
#define KERNELS_SWIGLU_H

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* out [T,I] (dense), gate/up rows of I at row stride in_stride (>= I). */
void swiglu_forward_ref(float *out, const float *gate, const float *up, int T, int I, int in_stride);
/* dgate/dup rows of I at stride in_stride (overwritten), from dout [T,I] dense and the forward inputs.
 * dgate/dup may alias gate/up (each element is read before it is written). */
void swiglu_backward_ref(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                         int T, int I, int in_stride);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* out [T,I] bf16 dense; gate/up bf16 at row stride in_stride. I % 8 == 0, in_stride % 8 == 0,
 * 16-byte aligned pointers; checked. Asynchronous; 0 or -1 with kernels_error(). */
int swiglu_forward(bf16 *out, const bf16 *gate, const bf16 *up, int T, int I, int in_stride,
                   cudaStream_t stream);
/* dgate/dup bf16 at stride in_stride (may alias gate/up), dout [T,I] bf16. Same preconditions. */
int swiglu_backward(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                    int T, int I, int in_stride, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_SWIGLU_H */
