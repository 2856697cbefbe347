/*
 * stages/model/target.h — the frozen target model (Qwen3ForCausalLM / LlamaForCausalLM / the Qwen3.5
 * hybrid on the CPU): weights
 * loaded once, working memory planned once, and the forward over one packed batch with capture
 * of the hidden states the drafter needs (design.md §6-7, dflash-reference.md §3.1).
 *
 * Forward over T packed tokens (documents back to back, no padding rows, positions reset per
 * document), per decoder layer l, with x the residual stream [T, C]:
 *     h = RMSNorm_in(x);  [q;k;v] = h · W_qkvᵀ;  q,k = RMSNorm per head (Qwen3 only);
 *     q,k = RoPE(position_ids);  a = varlen causal GQA attention (own document only);
 *     x = x + a · W_oᵀ;  h = RMSNorm_post(x);  [g;u] = h · W_guᵀ;  x = x + (silu(g) ⊙ u) · W_downᵀ
 * The residual adds are fused into the GEMMs (beta = 1). Captured states use the z-lab
 * convention: id i is the output of decoder layer i (Hugging Face hidden_states[i + 1]); `last`
 * is the output of the last decoder layer BEFORE the final norm (HF hidden_states[n] is after
 * the norm, so it is not this). The final norm and the LM head are never computed here.
 *
 * Qwen3.5 / Qwen3.6 hybrids (HF_ARCH_QWEN3_5, CPU and GPU; the GPU layer order is the CPU's with
 * the kernels/ launchers: conv1d, l2norm, gated_delta (chunked, fp32 state), gated_rmsnorm,
 * gated_attn, attention at the config's head_dim): each layer's token mixer is either a Gated DeltaNet (model/gdn.h: causal conv1d + gated delta
 * rule, its conv window and recurrent state restarted at every document boundary) or a gated full
 * attention (q_proj rows [query; gate] per head, (1 + w) q/k RMSNorm, RoPE over the first
 * rotary_dim dims, output ⊙ sigmoid(gate)); every RMSNorm is Qwen3_5RMSNorm (weight 1 + w), the
 * MLP and the capture convention are Qwen3's. Flat (Qwen3_5ForCausalLM) and multimodal
 * (Qwen3_5ForConditionalGeneration, weights under model.language_model.) checkpoints load alike;
 * every tensor's name and shape is checked against the config before anything is allocated, and
 * the vision / MTP tensors the text model does not read are counted in one log line. A head layout
 * the GPU kernels do not cover (gated_delta_check_shape) is refused from the config alone.
 *
 * Devices: on the CPU everything is fp32 and the ops are the kernels' plain-C references; on a
 * GPU weights are bf16 (norm weights fp32), activations bf16, accumulation fp32 (cuBLASLt and the
 * kernels/ launchers). Q/K/V and gate/up weights are fused ([q;k;v] and [gate;up] along the output
 * dimension) so each is one GEMM.
 *
 * Memory is planned, not discovered (design.md §7): target_load sizes every activation buffer
 * from opt->max_tokens and allocates it once; target_forward allocates nothing and rejects a
 * batch larger than the plan with a sentence.
 *
 * A struct target belongs to one thread at a time (it owns its working memory and, on a GPU, one
 * CUDA stream). Nothing here exits; failures return -1 / NULL with one sentence in err.
 */
#ifndef STAGES_MODEL_TARGET_H
#define STAGES_MODEL_TARGET_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/common.h"
#include "model/hfconfig.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TARGET_MAX_CAPTURE 64           /* captured layers at most (= DESC_MAX_LAYERS) */
#define TARGET_DEFAULT_DRAFT_LAYERS 5   /* the default capture is the z-lab formula for 5 layers */

struct target_options {
    int cuda_device;                    /* -1: CPU, fp32; N >= 0: CUDA device N, bf16 */
    int max_tokens;                     /* the largest batch T ever passed to target_forward */
    int n_capture;                      /* 0: z-lab default ids for TARGET_DEFAULT_DRAFT_LAYERS */
    int capture[TARGET_MAX_CAPTURE];    /* z-lab ids in [0, n_layers), list order = storage order */
    int cpu_bf16_points;                /* CPU hybrid forward only: round activations to bf16 where the GPU
                                         * forward stores them in bf16 (the residual stream, norm outputs, the
                                         * projections, q/k/v/gate, attention and gated-norm outputs, the MLP's
                                         * points), so a test has the GPU's precision baseline (style.md's 2x
                                         * rule); 0 (default): plain fp32 */
};

/* One packed batch as the forward reads it. Host memory; T = cu_seqlens[n_docs] (no padding). */
struct target_batch {
    uint64_t seq;                       /* batch sequence number (for error messages only) */
    int n_tokens;                       /* T, 1 <= T <= max_tokens */
    int n_docs;                         /* ND >= 1 */
    const int32_t *input_ids;           /* (T) in [0, V) */
    const int32_t *position_ids;        /* (T) >= 0, reset per document */
    const int32_t *cu_seqlens;          /* (ND+1): 0 = cu[0] <= ... <= cu[ND] = T */
};

struct target;

/* Fill opt with defaults: CPU, max_tokens 8192, default capture. */
void target_options_defaults(struct target_options *opt);

/* Load a Hugging Face checkpoint directory (config.json + model.safetensors or shards with an
 * index) for the device of opt: fp32 host copies on the CPU; on a GPU every tensor is converted
 * into one host staging buffer (as large as the largest destination: the embedding or a fused
 * matrix) at its slice of the fused layout and copied to its bf16 device weight, so host memory
 * stays bounded for any model size. Validates the config (hfconfig.h),
 * every tensor's name, shape and dtype (weights.h: the sentence names file and tensor), that the
 * final norm (and lm_head unless tied) exist, and the capture ids. Plans and allocates the working
 * memory for opt->max_tokens. Blocks for the load (seconds to minutes for 8B). Returns the model
 * (free with target_free) or NULL with a sentence in err. */
struct target *target_load(const char *model_dir, const struct target_options *opt,
                           char *err, int err_len);

/* The same model shape from a config, with seeded random weights: matrices uniform with standard
 * deviation `std` (e.g. 0.02), norm weights 1 + small noise. For benchmarks (a Qwen3-8B-shaped
 * model without a 16 GB file) and tests. On a GPU the weights are generated on the device.
 * Returns the model or NULL with a sentence. */
struct target *target_init_random(const struct model_config *cfg, const struct target_options *opt,
                                  uint64_t seed, float std, char *err, int err_len);

/* The bytes target_load / target_init_random will allocate for config c and max_tokens, without
 * allocating: weights and working memory, on a GPU (gpu = 1: bf16 matrices, device index arrays) or
 * the CPU (fp32). Equal to target_weight_bytes / target_work_bytes of the loaded model (tested).
 * Pure; for the start-up memory plan (model/jobplan.h). */
void target_plan_bytes(const struct model_config *c, int max_tokens, int gpu, size_t *weight_bytes,
                       size_t *work_bytes);

/* Release weights, working memory and the stream. NULL is fine. */
void target_free(struct target *t);

/* Check a batch without running it: T in [1, max_tokens], cu_seqlens valid and ending at T,
 * positions >= 0, every input id in [0, V). The sentence names the batch seq and the position,
 * e.g. "batch seq 12: input_ids[77] = 152000 is outside the vocabulary [0, 151936)". 0/-1. */
int target_check_batch(const struct target *t, const struct target_batch *b, char *err, int err_len);

/* Run the forward over batch b (checked first with target_check_batch) and write
 *   states [k][T, C]  the captured layers in capture-list order, rows packed (no padding), and
 *   last   [T, C]     the last decoder layer's output before the final norm (may be NULL).
 * CPU: host float pointers. GPU: bf16 pointers the CUDA runtime can address (device memory on
 * this or a peer GPU, e.g. a ring slot's IPC buffer, or host memory); the call returns only after every device write has completed (the model's stream
 * is synchronised), so the caller may publish at once. Allocates nothing. Blocks for the forward.
 * Returns 0, or -1 with a sentence (bad batch, kernel or CUDA failure). */
int target_forward(struct target *t, const struct target_batch *b, void *states, void *last,
                   char *err, int err_len);

/* What was loaded. Pointers stay valid until target_free. */
const struct model_config *target_config(const struct target *t);
int target_device(const struct target *t);             /* -1 CPU, else the CUDA ordinal */
int target_max_tokens(const struct target *t);
int target_n_capture(const struct target *t);
const int *target_capture(const struct target *t);    /* (n_capture) z-lab ids */
size_t target_elem_bytes(const struct target *t);      /* 4 on the CPU (fp32), 2 on a GPU (bf16) */
size_t target_weight_bytes(const struct target *t);    /* bytes of weights held (host or device) */
size_t target_work_bytes(const struct target *t);      /* bytes of planned working memory */
/* FLOPs of one forward over b: 2 · (matmul parameters per layer) · n_layers · T (embedding and
 * LM head excluded: neither is a matmul here) + causal attention 4 · HD · NH · n_layers ·
 * Σ_docs len·(len+1)/2 (QKᵀ and PV over the visible pairs, 2 FLOPs per multiply-add). */
double target_flops(const struct target *t, const int32_t *cu_seqlens, int n_docs);

/* Read-only views of a CPU target's fp32 weights, for stages/model/decode.c (the same layers run over a KV cache).
 * Matrices in the fused layout described above. 0, or -1 with a sentence for a GPU target or l out of range. */
struct target_layer_view {
    const float *w_qkv, *w_o, *w_gu, *w_down;  /* (QKV, C), (C, NH·HD), (2·I, C), (C, I) */
    const float *ln_in, *ln_post;              /* (C) */
    const float *q_norm, *k_norm;              /* (HD) Qwen3 and Qwen3.5 attention (as 1 + w), else NULL */
    int linear;                                /* 1: a Gated DeltaNet layer (Qwen3.5; no w_qkv / w_o) */
    /* Qwen3.5 Gated DeltaNet layers only (else NULL): model/gdn.h's arguments */
    const float *w_lin_in, *conv_w, *a_neg, *dt_bias, *gnorm, *w_lin_out;
};
int target_cpu_layer(const struct target *t, int l, struct target_layer_view *out, char *err, int err_len);
const float *target_cpu_embed(const struct target *t);       /* (V, C); NULL on a GPU */
const float *target_cpu_inv_freq(const struct target *t);    /* (R/2) RoPE inverse frequencies; NULL on a GPU */

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* ---------------------------------------------------------------- glue kernels (target.cu) */

/* Split the fused QKV GEMM output qkv [T, (NH+2·NKV)·HD] into dense q [T, NH·HD], k and v
 * [T, NKV·HD] (the kernels take dense tensors). HD % 8 == 0, 16-byte aligned. Asynchronous;
 * 0 or -1 with kernels_error(). */
int target_qkv_split(bf16 *q, bf16 *k, bf16 *v, const bf16 *qkv, int T, int NH, int NKV, int HD,
                     cudaStream_t stream);
/* Fill p [n] with bf16(mean + U(-1,1)·std·√3) from a counter-based generator keyed by seed.
 * Asynchronous; 0 or -1. */
int target_fill_random_bf16(bf16 *p, size_t n, uint64_t seed, float mean, float std,
                            cudaStream_t stream);
/* Same into fp32 (norm weights). */
int target_fill_random_f32(float *p, size_t n, uint64_t seed, float mean, float std,
                           cudaStream_t stream);
/* The model's CUDA stream (for callers that order their own copies before target_forward). */
cudaStream_t target_stream(const struct target *t);

/* Read-only views of a GPU target's weights (device memory), for stages/model/decode.c's GPU path: bf16
 * matrices in the fused layout above, fp32 norm weights. 0, or -1 with a sentence for a CPU target or l out of
 * range. */
struct target_gpu_layer_view {
    const bf16 *w_qkv, *w_o, *w_gu, *w_down;   /* (QKV, C), (C, NH·HD), (2·I, C), (C, I) */
    const float *ln_in, *ln_post;              /* (C) */
    const float *q_norm, *k_norm;              /* (HD) Qwen3 and Qwen3.5 full attention, else NULL */
    int linear;                                /* 1: a Gated DeltaNet layer, with (else NULL): */
    const bf16 *w_lin_in, *w_lin_out;          /* (LIN_IN, C), (C, NV·d_v) */
    const float *conv_w, *a_neg, *dt_bias, *gnorm;   /* (conv_dim, K), (NV), (NV), (d_v) */
};
int target_gpu_layer(const struct target *t, int l, struct target_gpu_layer_view *out, char *err, int err_len);
const bf16 *target_gpu_embed(const struct target *t);       /* (V, C) device bf16; NULL on the CPU */
const float *target_gpu_inv_freq(const struct target *t);   /* (HD/2) device fp32; NULL on the CPU */

/* Per-phase device time of the GPU forward, for benchmarks (issue 27: the time per layer kind).
 * target_timing(t, 1) creates the events once (at most 8·n_layers + 2) and makes every later
 * target_forward record one event at each phase boundary on its stream (no extra synchronisation:
 * the forward synchronises at its end anyway); target_phase_ms then adds the elapsed times of the
 * last forward into ms[TARGET_PH_N] (milliseconds). 0 or -1 with a sentence. */
enum { TARGET_PH_EMBED = 0, TARGET_PH_LINEAR = 1, TARGET_PH_FULL = 2, TARGET_PH_MLP = 3, TARGET_PH_COPY = 4,
       /* the Gated DeltaNet mixer's parts, whose sum is its TARGET_PH_LINEAR share: the input norm and the fused
        * input projection; the causal conv1d + SiLU and the q/k l2 norms; the chunked delta rule; the gated norm and
        * the output projection (TARGET_PH_LINEAR itself stays 0 on a hybrid: add the four) */
       TARGET_PH_LIN_PROJ = 5, TARGET_PH_LIN_CONV = 6, TARGET_PH_LIN_DELTA = 7, TARGET_PH_LIN_OUT = 8,
       TARGET_PH_N = 9 };
int target_timing(struct target *t, int on, char *err, int err_len);
int target_phase_ms(struct target *t, double *ms, char *err, int err_len);
#endif

#ifdef __cplusplus
}
#endif
#endif /* STAGES_MODEL_TARGET_H */
