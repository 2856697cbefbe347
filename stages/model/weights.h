/*
 * stages/model/weights.h — fetch a named tensor of a checkpoint with the shape the model expects,
 * and convert it to host fp32 or bf16.
 *
 * This is where "the file holds what the model needs" is decided, so the target and the drafter
 * never touch raw safetensors data: a missing tensor, a wrong shape or an unsupported dtype fails
 * with one sentence naming the file, the tensor, the expected and the found shape/dtype, e.g.
 * "ckpt/model-00002-of-00004.safetensors: tensor 'model.layers.3.mlp.up_proj.weight' has shape
 * [12288, 4096], expected [14336, 4096]". Source dtypes BF16, F16 and F32 convert to either
 * destination (rounding to nearest even into bf16, as __float2bfloat16 does; bf16 -> bf16 and
 * f32 -> f32 are plain copies). Unaligned source data is handled.
 *
 * Destinations are caller-owned buffers of numel elements (so a caller can fill a slice of a fused
 * QKV or gate/up buffer, or pinned memory for a straight copy to the GPU). Nothing here exits;
 * 0/-1 with a sentence in err. Thread-safe on a shared opened hf_weights.
 */
#ifndef STAGES_MODEL_WEIGHTS_H
#define STAGES_MODEL_WEIGHTS_H

#include "kernels/common.h"
#include "core/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Find `name` and check it has exactly the given shape (ndim entries) and a floating dtype
 * (BF16/F16/F32). On success *out points at the tensor (its data is the raw mapped bytes in
 * (*out)->dtype: a caller may upload it directly when the dtype is what it wants). 0/-1. */
int weights_lookup(const struct hf_weights *w, const char *name, int ndim, const int64_t *shape,
                   const struct st_tensor **out, char *err, int err_len);

/* weights_lookup, then convert all numel elements into dst (fp32). 0/-1. */
int weights_get_f32(const struct hf_weights *w, const char *name, int ndim, const int64_t *shape,
                    float *dst, char *err, int err_len);
/* weights_lookup, then convert into dst (bf16 bit patterns). 0/-1. */
int weights_get_bf16(const struct hf_weights *w, const char *name, int ndim, const int64_t *shape,
                     bf16 *dst, char *err, int err_len);

/* Convert n elements of a floating tensor's data (possibly unaligned) starting at element `first`
 * into fp32 / bf16. The tensor must be BF16, F16 or F32 (else -1 with a sentence). For callers that
 * stream a big tensor in slices. */
int weights_convert_f32(const struct st_tensor *t, int64_t first, int64_t n, float *dst,
                        char *err, int err_len);
int weights_convert_bf16(const struct st_tensor *t, int64_t first, int64_t n, bf16 *dst,
                         char *err, int err_len);

/* IEEE half (bit pattern) to float, exact. */
float weights_f16_to_float(uint16_t h);
/* Float to IEEE half, rounding to nearest even (overflow to inf, NaN stays NaN), as __float2half. */
uint16_t weights_float_to_f16(float f);

#ifdef __cplusplus
}
#endif

#endif /* STAGES_MODEL_WEIGHTS_H */
