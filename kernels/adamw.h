/*
 * kernels/adamw.h — AdamW with fp32 master weights (dflash-reference.md §9), the global gradient
 * L2 norm with clipping, and the learning-rate schedules.
 *
 * One step on a tensor of n elements (torch.optim.AdamW semantics, step t counted from 1):
 *   g = grad * clip,  clip = min(1, max_norm / (sqrt(sumsq) + 1e-6))   (torch clip_grad_norm_)
 *   w *= 1 - lr*wd                                                     (decoupled decay)
 *   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
 *   w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
 *   copy = bf16(w)                     (the bf16 weights the forward uses, refreshed after the step)
 * The clip factor is computed from sumsq, the squared global norm over ALL parameters (Muon's and
 * AdamW's), which adamw_grad_sumsq accumulates tensor by tensor. On the device sumsq stays in device
 * memory so the step never synchronises with the host. max_norm <= 0 disables clipping.
 * Grads are fp32; state m, v and master w are fp32; copy may be NULL when no bf16 copy exists.
 */
#ifndef KERNELS_ADAMW_H
#define KERNELS_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float lr;            /* this step's learning rate (base lr times the schedule factor) */
    float beta1, beta2;  /* 0.9, 0.999 */
    float eps;           /* 1e-8 */
    float weight_decay;  /* 0.01 */
    int step;            /* t >= 1, for the bias corrections */
    float max_norm;      /* clip threshold of the global grad norm (1.0); <= 0: no clipping */
} adamw_params;

/* The clip factor min(1, max_norm / (sqrt(sumsq) + 1e-6)); 1 when max_norm <= 0. Pure. */
float adamw_clip_factor(double sumsq, float max_norm);

/* Schedules: the factor that scales the base lr at optimizer step s (0-based) of total steps with
 * warmup steps (transformers' get_linear/cosine_schedule_with_warmup, 0.5 cycles). Pure. */
double adamw_lr_linear(long s, long total, long warmup);
double adamw_lr_cosine(long s, long total, long warmup);

/* Reference: sum of squares of grads (n) in double, added to *sumsq. Thread-safe. */
void adamw_grad_sumsq_ref(const float *grad, size_t n, double *sumsq);
/* Reference step on one tensor (master, m, v, grad: (n) fp32; copy: (n) bf16 or NULL), clipping with
 * the global sumsq. Returns 0, or -1 with a sentence in err on bad params (step < 1, lr < 0). */
int adamw_step_ref(float *master, float *m, float *v, const float *grad, bf16 *copy, size_t n,
                   const adamw_params *p, double sumsq, char *err, int err_len);

/* ---- the multi-tensor step: one launch over every tensor of a table (issue 28)
 * The table lists the tensors (device pointers); a host plan cuts them into chunks of at most ADAMW_CHUNK
 * elements (each chunk one thread block, a tensor's chunks start at multiples of ADAMW_CHUNK, so float4 loads stay
 * aligned), and one kernel runs every chunk: per element read grad, master, m, v (16 B), write master, m, v (12 B)
 * and the bf16 copy (2 B) — the memory floor of AdamW. Same per-element float formula as adamw_step_ref. */
#define ADAMW_CHUNK 16384

typedef struct {
    float *master, *m, *v;   /* (n) fp32, device */
    const float *grad;       /* (n) fp32, device */
    bf16 *copy;              /* (n) bf16, device, or NULL */
    int64_t n;
    int32_t vec4;            /* set by adamw_multi_plan: every pointer allows 16-byte (copy 8-byte) accesses */
    int32_t pad_;
} adamw_tensor;

typedef struct {
    int32_t tensor;          /* index into the table */
    int32_t len;             /* elements in this chunk (1..ADAMW_CHUNK) */
    int64_t start;           /* first element, a multiple of ADAMW_CHUNK */
} adamw_chunk;

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* Chunks needed for a table of n tensors (host, pure; CUDA builds). */
int64_t adamw_multi_chunks(const adamw_tensor *t, int n);
/* Host plan: sets t[i].vec4 and writes adamw_multi_chunks(t, n) chunks (tensors in table order) into chunks, which
 * holds cap. Returns the count, or -1 with kernels_error() when cap is too small or a tensor has a NULL pointer. */
int64_t adamw_multi_plan(adamw_tensor *t, int n, adamw_chunk *chunks, int64_t cap);

/* One AdamW step over every tensor of a device table (d_tensors (n), d_chunks (n_chunks) as adamw_multi_plan made
 * them, copied to the device), one kernel launch. The clip factor min(1, max_norm / (sqrt(*d_sumsq) + 1e-6)) is read
 * from the device double d_sumsq (NULL or max_norm <= 0: none), as adamw_clip_factor computes it. Asynchronous; no
 * allocation. Returns 0 or -1 (kernels_error()). */
int adamw_step_multi(const adamw_tensor *d_tensors, const adamw_chunk *d_chunks, int64_t n_chunks,
                     const adamw_params *p, const double *d_sumsq, cudaStream_t stream);
/* Adds the sum of squares of d_grad (n) to the device float *d_sumsq (the caller zeroes it once per
 * step, then calls this for every tensor). Asynchronous; fp32 atomics, so the last bits depend on
 * scheduling. Returns 0 or -1 (kernels_error()). */
int adamw_grad_sumsq(const float *d_grad, size_t n, float *d_sumsq, cudaStream_t stream);
/* One AdamW step on device tensors, clip factor read from *d_sumsq on the device (NULL: no clipping).
 * d_copy may be NULL. Asynchronous; no allocation. Returns 0 or -1 (kernels_error()). */
int adamw_step(float *d_master, float *d_m, float *d_v, const float *d_grad, bf16 *d_copy, size_t n,
               const adamw_params *p, const float *d_sumsq, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif
#endif /* KERNELS_ADAMW_H */
