/*
 * stages/train/drafter.h — the DFlash drafter being trained: config, parameter table, planned memory and one
 * training step (forward, backward, loss, metrics) on one packed batch (dflash-reference.md §3–§8; issue 16).
 *
 * DESIGN
 * - One struct drafter owns the fp32 master parameters, their gradients and every activation buffer of a step,
 *   all sized once by drafter_init from (budget T_max, max anchors N, config). A step allocates nothing itself;
 *   on the CPU path some kernels/<op>_ref.c functions allocate temporaries internally (block_attn_*_ref: O(T + B)
 *   and, in the backward, O((T + N·B)·n_kv·d_h) doubles; lmhead_*_ref: O(V + D); anchors_forward_ref: O(T);
 *   gemm_forward_ref: thread stacks only; the fast step's block attention: O(threads·(T + B)·(4·d_h + 2·G·B))
 *   floats per call, stages/train/cpu_ops.h; its LM-head workspace is planned with the drafter).
 * - The reference CPU step (drafter_step_cpu) is fp32 and composed only from the kernels/<op>_ref.c references, so
 *   it is the exact specification the GPU path and the fast CPU step (drafter_step_fast: BLAS, fused loss, threads;
 *   what drafter_step runs) are tested against. The GPU path (bf16 compute, fp32 masters, planned device
 *   memory, one asynchronous metrics copy per step) is declared below under DFLASH_CUDA (struct drafter_gpu,
 *   drafter_step_gpu; stages/train/drafter_gpu.c), launcher for launcher the same sequence as drafter_step_cpu.
 * - The optimizer and checkpoint code see the parameters only through the table (drafter_n_params /
 *   drafter_param): speculators names, shapes, master fp32 data, fp32 gradient (NULL when frozen), and whether
 *   the tensor is Muon-eligible (§9).
 * - Gradients accumulate: drafter_step adds this micro-batch's gradient into g (+=). Zeroing (drafter_zero_grad)
 *   and the loop over micro-batches belong to the caller, so gradient accumulation is the caller's loop.
 *   Each micro-batch's gradient is that of its own loss L (normalised by its own supervised-slot count, §7.2).
 * - Layer ids: the config keeps them in the convention it was given (cfg.ids_convention). z-lab id i = output of
 *   decoder layer i; speculators id = z-lab id + 1 (§3.1). The features descriptor carries z-lab ids.
 * - Randomness is counter-based, keyed by (seed, step): anchors (kernels/anchors.h anchors_key) and the
 *   hidden-state noise, element e of the [T, k·H] features getting splitmix64 of drafter_noise_base(seed, step)
 *   + (e + 1)·0x9E3779B97F4A7C15 (kernels/common.h kernels_rng_next), u = top 24 bits / 2^24,
 *   noise = 2·(u − 0.5)·noise_scale. Resume at any step is exact; a GPU kernel can draw element e alone.
 *
 * Invariants: every function returns 0/-1 with one sentence in err (library code, never exits). A struct drafter
 * is not thread-safe; distinct drafters are independent.
 */
#ifndef STAGES_TRAIN_DRAFTER_H
#define STAGES_TRAIN_DRAFTER_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "core/desc.h"
#include "model/hfconfig.h"
#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#include "kernels/common.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define DRAFTER_MAX_LAYERS 64
#define DRAFTER_MAX_B 256
#define DRAFTER_MAX_HALF_HEAD 4096   /* d_h / 2 at most (the RoPE frequency table) */

enum drafter_ids_convention { DRAFTER_IDS_ZLAB = 0, DRAFTER_IDS_SPECULATORS = 1 };
enum drafter_layer_type { DRAFTER_LAYER_SLIDING = 0, DRAFTER_LAYER_FULL = 1 };
/* loss / weighting take kernels/lmhead_loss.h's LMHEAD_LOSS_* / LMHEAD_WEIGHT_* values. */

struct drafter_config {
    /* from the target's config.json (drafter_config_from_target) */
    struct model_config target;      /* the verifier's config: model_type, rope, eps, layer count */
    int H;                           /* hidden size (= target's) */
    int n_h, n_kv, d_h;              /* heads, kv heads, head dim (= target's) */
    int I;                           /* MLP width (= target's intermediate_size) */
    float eps;                       /* rms_norm_eps */
    int V_t;                         /* target vocabulary (embedding rows) */
    int V_d;                         /* draft vocabulary (= V_t unless drafter_set_vocab) */
    /* options (drafter_config_defaults sets the speculators defaults) */
    int B;                           /* block size (16) */
    int L;                           /* draft layers (5) */
    int layer_type[DRAFTER_MAX_LAYERS]; /* DRAFTER_LAYER_* per layer (4 sliding then 1 full) */
    int sliding_window;              /* W of the sliding layers (2048) */
    int sliding_window_non_causal;   /* 1: sliding layers see their whole block too (0) */
    int N;                           /* max anchors per batch (512) */
    int T_max;                       /* token budget (8192) = the padded length of §5 */
    int k;                           /* captured target layers (0: the z-lab default, L ids) */
    int layer_ids[DESC_MAX_LAYERS];  /* in ids_convention, concat order */
    int ids_convention;              /* DRAFTER_IDS_ZLAB (default) or DRAFTER_IDS_SPECULATORS */
    int sample_from_anchor;          /* 0 */
    int64_t mask_token_id;           /* < 0: resolve from the target dir (stages/train/mask_token.h) */
    float noise;                     /* hidden-state noise half-width (0.05); 0 disables */
    int loss;                        /* LMHEAD_LOSS_CE (default) or LMHEAD_LOSS_KL */
    int weighting;                   /* LMHEAD_WEIGHT_DPACE (default), _EXP_DECAY or _NONE */
    float gamma;                     /* exp-decay γ (4) */
    float alpha;                     /* D-PACE α (0.5) */
    float init_std;                  /* N(0, std) init of the trainable matrices (0.02) */
};

/* The speculators defaults of every option (§0 and issue 16); target fields zeroed. */
void drafter_config_defaults(struct drafter_config *c);
/* Parse a layer-type list "sliding,sliding,full" ("sliding_attention"/"full_attention" also accepted) into
 * c->layer_type and c->L; "all-sliding" makes all c->L layers sliding (what speculators ships). A causal full layer cannot be asked for (full layers are always bidirectional in
 * the block). 0/-1 with a sentence. */
int drafter_parse_layer_types(struct drafter_config *c, const char *list, char *err, int err_len);
/* Read dir/config.json (stages/model/hfconfig.h) into the target fields, fill the z-lab default layer ids when
 * c->k == 0, resolve the mask token when c->mask_token_id < 0, then drafter_config_check. The option fields
 * must be set before (drafter_config_defaults + flags). Only config.json and the tokenizer files are read.
 * 0/-1 with a sentence naming the file and field. */
int drafter_config_from_target(struct drafter_config *c, const char *dir, char *err, int err_len);
/* Validate a complete config: sizes, layer types, ids in range for the target's layer count and convention,
 * mask token inside the embedding, loss/weighting (D-PACE with KL refused), B <= DRAFTER_MAX_B, N >= 1,
 * T_max > B. 0/-1 with a sentence. */
int drafter_config_check(const struct drafter_config *c, char *err, int err_len);
/* The layer ids in z-lab convention (what the features descriptor carries). */
void drafter_zlab_ids(const struct drafter_config *c, int *ids /* (k) */);
/* The drafter's RoPE inverse frequencies (d_h / 2 of them, transformers' fp32): the target's rope_theta and
 * scaling over the whole head. The drafter is a Qwen3-style model: its exported config carries no partial rotary
 * factor, so a Qwen3.5/3.6 target's partial rotary (its rotary_dim) is not inherited. */
void drafter_rope_inv_freq(const struct drafter_config *c, float *inv_freq /* (d_h / 2) */);
/* The block row whose prediction is the token right after the anchor (the first draft token): 1 for DFlash (row
 * j predicts the token at a + j; row 0 is the anchor itself), 0 with sample_from_anchor (row j predicts a + j + 1).
 * A proposal of B - 1 tokens reads rows drafter_draft_row0 .. drafter_draft_row0 + B - 2. */
static inline int drafter_draft_row0(const struct drafter_config *c) { return c->sample_from_anchor ? 0 : 1; }
/* "zlab" | "speculators". */
const char *drafter_ids_convention_name(int convention);

/* Check a features descriptor against the drafter: concat layout, k, H, dtype bf16/f32, captured layer ids
 * (z-lab) equal to the config's in order, T <= T_max. 0/-1 with a sentence saying expected and found. */
int drafter_check_features(const struct drafter_config *c, const struct desc_features *f, char *err, int err_len);

/* ---------------------------------------------------------------- parameters */

struct drafter_param {
    const char *name;     /* speculators name: fc.weight, layers.0.self_attn.q_proj.weight, ... */
    int ndim;             /* 1 or 2 */
    int64_t shape[2];
    int64_t numel;
    float *w;             /* fp32 master data, owned by the drafter */
    float *g;             /* fp32 gradient (+= by drafter_step), NULL if frozen */
    int trainable;
    int is_matrix;        /* Muon-eligible (§9): trainable, 2-D, both dims > 1, not embed_tokens / lm_head */
};

struct drafter;

/* Allocate a drafter for config c (checked): the parameter table, gradients and every activation buffer for
 * batches of up to c->T_max tokens and c->N anchors. Parameters start as NaN (frozen ones) or as the seeded
 * init (drafter_init_weights is called with seed). Returns NULL with a sentence in err. */
struct drafter *drafter_init(const struct drafter_config *c, uint64_t seed, char *err, int err_len);
void drafter_free(struct drafter *d);
const struct drafter_config *drafter_config_of(const struct drafter *d);
/* Re-initialise the trainable tensors from seed: matrices N(0, init_std) (Box–Muller over splitmix64 of
 * (seed, tensor index)), norms ones. Frozen tensors are not touched. */
void drafter_init_weights(struct drafter *d, uint64_t seed);
/* Load the frozen tensors from the target directory: model.embed_tokens.weight [V_t, H] -> embed_tokens,
 * model.norm.weight [H] -> verifier_norm, lm_head.weight [V_t, H] (or the embedding when tied) -> lm_head and
 * verifier_lm_head, pruned by d2t when drafter_set_vocab was called before. Only those tensors are read.
 * A shape that does not match H or V_t fails with a sentence naming the file and tensor. 0/-1. */
int drafter_load_target(struct drafter *d, const char *dir, char *err, int err_len);
/* Use a draft vocabulary: t2d (V_t) bool, d2t (V_d) offsets (§1.6; checked with lmhead_vocab_check). Call it
 * before drafter_load_target / drafter_set_frozen (the full heads are not kept). Copies both tables (the dump
 * writes them as t2d / d2t). V_d must be <= the config's V_d at drafter_init (memory is planned from it);
 * the lm_head entries' shapes become [V_d, H]. 0/-1. */
int drafter_set_vocab(struct drafter *d, const uint8_t *t2d, const int64_t *d2t, int V_d, char *err, int err_len);
/* Copy frozen tensors from memory (tests, and callers that already hold them): embed [V_t, H], final norm [H],
 * full LM head [V_t, H] (pruned by the current d2t). */
int drafter_set_frozen(struct drafter *d, const float *embed, const float *norm, const float *lm_head, char *err,
                       int err_len);

int drafter_n_params(const struct drafter *d);
/* Entry i in [0, drafter_n_params): fc.weight, hidden_norm.weight, layers.{l}.{input_layernorm, q_proj, k_proj,
 * v_proj, o_proj, q_norm, k_norm, post_attention_layernorm, gate_proj, up_proj, down_proj}, norm.weight,
 * embed_tokens.weight, lm_head.weight, verifier_norm.weight, verifier_lm_head.weight. NULL outside. */
const struct drafter_param *drafter_param(const struct drafter *d, int i);
/* The entry called name, or NULL. */
const struct drafter_param *drafter_param_find(const struct drafter *d, const char *name);
/* A layer's tensors in table order: layers.{l}.<drafter_layer_tensor_names[j]> is entry drafter_layer_param(d, l, j)
 * (the norms and the q/k norms 1-D, the rest 2-D [out, in]). */
enum { DRAFTER_LT_IN_LN, DRAFTER_LT_Q, DRAFTER_LT_K, DRAFTER_LT_V, DRAFTER_LT_O, DRAFTER_LT_QN, DRAFTER_LT_KN,
       DRAFTER_LT_POST_LN, DRAFTER_LT_GATE, DRAFTER_LT_UP, DRAFTER_LT_DOWN, DRAFTER_LT_N };
extern const char *const drafter_layer_tensor_names[DRAFTER_LT_N];
/* Tensor j of layer l, or NULL outside the layers; its index in the table is the result - drafter_param(d, 0). */
const struct drafter_param *drafter_layer_param(const struct drafter *d, int l, int j);
/* g = 0 for every trainable tensor. */
void drafter_zero_grad(struct drafter *d);

/* ---------------------------------------------------------------- one step */

/* One packed batch, host pointers, unpadded (T <= budget = the packer's token budget <= T_max). */
struct drafter_batch {
    int T;                       /* tokens */
    int budget;                  /* the token budget the batch was packed against (the §5 padded length) */
    const int32_t *input_ids;    /* (T) */
    const uint8_t *loss_mask;    /* (T) 0/1 */
    const int32_t *position_ids; /* (T) */
    const int32_t *doc_ids;      /* (T) (-1: padding) */
    const float *hidden;         /* (T, k·H) concat in the config's layer order, fp32 (bf16 widened exactly by
                                  * the caller) */
    const float *last;           /* (T, H) last decoder layer output before the final norm, fp32 */
};

/* Per-step metrics as (sum, count) pairs (§8); drafter_metrics_add pools steps, micro-batches and ranks. */
struct drafter_metrics {
    double loss_sum;             /* L of this batch */
    int64_t loss_count;          /* 1 */
    int B;
    int64_t correct[DRAFTER_MAX_B], total[DRAFTER_MAX_B]; /* per in-block slot, over supervised rows */
    int64_t full_correct, full_total;                     /* Σ_j over j >= 1 (j >= 0 with sample_from_anchor) */
    double eal_sum;              /* Σ accepted lengths (leading correct run + 1) over blocks with a supervised slot */
    int64_t eal_count;           /* those blocks */
    double eal_marginal;         /* Σ_j Π_{i<=j} acc_i of THIS batch (lmhead_eal); recompute from correct/total
                                  * after pooling with drafter_metrics_eal_marginal */
    int n_anchors;               /* valid anchors K */
};
void drafter_metrics_zero(struct drafter_metrics *m, int B);
void drafter_metrics_add(struct drafter_metrics *dst, const struct drafter_metrics *src);
double drafter_metrics_eal_marginal(const struct drafter_metrics *m);

/* The hidden-state noise base of (seed, step) (see DESIGN). */
uint64_t drafter_noise_base(uint64_t seed, uint64_t step);

/* One step on batch b: anchors from (seed, step), masks, forward, loss and metrics; with train != 0 also the
 * hidden-state noise (not on last) and the backward, adding the gradient into every trainable g (+=). Writes
 * *m (not accumulated). The batch must stay valid during the call only (the drafter keeps copies of what the
 * dump needs). 0/-1 with a sentence (bad sizes, ids outside the embedding, T > T_max). drafter_step is the fast
 * CPU step (drafter_step_fast) today; the GPU path will be selected inside it. */
int drafter_step(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                 struct drafter_metrics *m, char *err, int err_len);
int drafter_step_cpu(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                     struct drafter_metrics *m, char *err, int err_len);
/* drafter_step_cpu: the reference composition (every op a kernels/<op>_ref.c call; the specification the GPU
 * path and drafter_step_fast are tested against). drafter_step_fast: the same sequence with the linear layers on
 * BLAS and the LM head + loss fused (stages/train/cpu_ops.h), on drafter_threads(d) threads; its bits depend on
 * the inputs and shapes only, not on the thread count. drafter_step runs drafter_step_fast. */
int drafter_step_fast(struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step, int train,
                      struct drafter_metrics *m, char *err, int err_len);
/* Threads of drafter_step_fast (default: online CPUs, at most 8; results do not depend on it). Re-plans the
 * LM-head workspace; call between steps. 0/-1 with a sentence (n outside 1..8, out of memory). */
int drafter_set_threads(struct drafter *d, int n_threads, char *err, int err_len);
int drafter_threads(const struct drafter *d);
#ifdef DFLASH_CUDA
/* ---------------------------------------------------------------- GPU path (issue 20; stages/train/drafter_gpu.c)
 *
 * A struct drafter_gpu mirrors one host drafter on the current device: fp32 master weights and gradients,
 * bf16 copies of the 2-D weights the GEMMs read (norm weights stay fp32: the rmsnorm kernels take fp32 weights),
 * the frozen embedding / LM heads in bf16, every activation of a step in bf16 (rstd, lse, loss statistics and
 * gradient accumulators fp32), the batch inputs, and every kernel workspace. All of it is planned at
 * drafter_gpu_init from (T_max, N, B, the model) as one cudaMalloc, printed region by region with its total.
 * A step allocates nothing, does no host synchronisation except the optional metrics wait, and calls only
 * launchers whose shapes are fixed by (budget, N, B, model): the context runs at the batch's budget (rows
 * T..budget-1 padded: features and last 0, loss mask 0, doc id -1, which no query can see), so every GEMM shape
 * is a function of the budget and is planned by cuBLASLt's heuristic once (the first step or
 * drafter_gpu_warmup). Numerics: bf16 storage, fp32 accumulation (cuBLASLt), fp32 statistics and loss.
 * The gradient of a step is added into the device fp32 gradients (+=), like drafter_step_cpu. */

struct drafter_gpu;

/* Device input buffers of capacity T_max rows, owned by the drafter_gpu. The caller fills rows [0, T) (e.g.
 * cudaMemcpyAsync from the features ring on the same stream) before drafter_step_gpu; the step pads the rest. */
struct drafter_gpu_inputs {
    int32_t *input_ids, *position_ids, *doc_ids;   /* (T_max) */
    uint8_t *loss_mask;                            /* (T_max) */
    bf16 *hidden;                                  /* (T_max, k·H) concat, bf16 */
    bf16 *last;                                    /* (T_max, H) bf16 */
};

/* One tensor of the device parameter table, entry i as drafter_param(d, i): fp32 master w and gradient g (NULL
 * when frozen), the bf16 copy the GEMMs read (NULL for 1-D tensors). The optimizer (optim_gpu.h) updates w and
 * refreshes copy. */
struct drafter_gpu_param {
    const struct drafter_param *host;
    float *w, *g;
    bf16 *copy;
};

/* Plan and allocate the device state of drafter d on the current device, on stream (one stream for every call
 * of this drafter_gpu), and upload d's weights (drafter_gpu_upload_weights). plan (nullable) gets the memory
 * plan, one line per region and the total. The device must be Hopper (block attention is sm_90a). The host
 * drafter must outlive the drafter_gpu (its parameter table is shared). NULL with a sentence in err. */
struct drafter_gpu *drafter_gpu_init(struct drafter *d, cudaStream_t stream, FILE *plan, char *err, int err_len);
void drafter_gpu_free(struct drafter_gpu *g);
/* Bytes of the planned device allocation (the plan's total). */
size_t drafter_gpu_planned_bytes(const struct drafter_gpu *g);
const struct drafter_gpu_inputs *drafter_gpu_inputs(const struct drafter_gpu *g);
/* Device memory in use on g's device now (cudaMemGetInfo: total − free, every process's) and the device's total,
 * in bytes: after drafter_gpu_init + optim_gpu_init + drafter_gpu_warmup this is the trainer's peak, since a step
 * allocates nothing (report it at start and with each bus record). 0/-1. */
int drafter_gpu_memory(const struct drafter_gpu *g, size_t *in_use, size_t *total, char *err, int err_len);
int drafter_gpu_n_params(const struct drafter_gpu *g);
const struct drafter_gpu_param *drafter_gpu_param(const struct drafter_gpu *g, int i);
cudaStream_t drafter_gpu_stream(const struct drafter_gpu *g);

/* Host masters (every tensor, frozen included) -> device masters and bf16 copies; synchronous. 0/-1. */
int drafter_gpu_upload_weights(struct drafter_gpu *g, char *err, int err_len);
/* Device masters of the trainable tensors -> the host table's w (checkpoints, exports); synchronous. 0/-1. */
int drafter_gpu_download_weights(struct drafter_gpu *g, char *err, int err_len);
/* Device gradients -> the host table's g (tests, dumps); synchronous. 0/-1. */
int drafter_gpu_download_grads(struct drafter_gpu *g, char *err, int err_len);
/* g = 0 on the device for every trainable tensor (asynchronous). 0/-1. */
int drafter_gpu_zero_grad(struct drafter_gpu *g, char *err, int err_len);
/* Refresh the bf16 copies from the fp32 masters (asynchronous; the optimizer does it itself). 0/-1. */
int drafter_gpu_refresh_copies(struct drafter_gpu *g, char *err, int err_len);

/* Copy a host batch into the input buffers (bf16-rounding hidden and last), checking ids and sizes like
 * drafter_step_cpu. For tests and the CPU-features fallback: it converts on the host in a buffer planned at
 * init and synchronises; the trainer's hot path copies bf16 features itself. 0/-1 with a sentence. */
int drafter_gpu_load_batch(struct drafter_gpu *g, const struct drafter_batch *b, char *err, int err_len);

/* One step on the batch in the input buffers (T rows, packed against budget, T <= budget <= T_max): the same
 * computation as drafter_step_cpu in bf16 (anchors from (seed, step) against the budget, noise on the
 * features when train, forward, fused LM-head loss, metrics, and with train the backward adding into the
 * device gradients). Everything is enqueued on the stream; the metrics (one small device buffer) are copied
 * asynchronously to pinned host memory (one slot per step, up to 256 pending). With m != NULL the call waits for
 * that copy (the step's only host synchronisation) and fills *m with this step's metrics (when no earlier step's
 * are pending); with m == NULL it returns at once and drafter_gpu_metrics collects them later, so A micro-batches
 * of gradient accumulation cost one synchronisation in all.
 * Device ids outside the embedding give NaN rows (not reported here: drafter_gpu_load_batch checks on the host).
 * sample_from_anchor runs as on the CPU (lmhead_loss_forward_mode). 0/-1 with a sentence. */
int drafter_step_gpu(struct drafter_gpu *g, int T, int budget, uint64_t seed, uint64_t step, int train,
                     struct drafter_metrics *m, char *err, int err_len);
/* Wait for the last step's metrics copy and fill *m with the metrics of every step since the previous call,
 * pooled with drafter_metrics_add (loss_sum and loss_count add up: loss_sum / loss_count is the mean loss); one
 * step gives exactly its own. 0/-1. */
int drafter_gpu_metrics(struct drafter_gpu *g, struct drafter_metrics *m, char *err, int err_len);
/* Run one forward+backward on a zero batch of the full budget to front-load cuBLASLt's plan queries, then zero
 * the gradients. Call at start-up. 0/-1. */
int drafter_gpu_warmup(struct drafter_gpu *g, int budget, char *err, int err_len);

/* Phase timing for benchmarks (bench/train_bench.c): with on != 0 every following step records cudaEvents at its
 * phase boundaries (up to 1024 per step; the events are created by the first call); drafter_gpu_phase_times waits
 * for the last step and adds its milliseconds per phase into ms[DRAFTER_GPU_PH_N]. Off by default: an untimed
 * step records no events. 0/-1. */
enum { DRAFTER_GPU_PH_INPUTS, DRAFTER_GPU_PH_CONTEXT, DRAFTER_GPU_PH_GEMM, DRAFTER_GPU_PH_ELEM, DRAFTER_GPU_PH_ATTN_FWD,
       DRAFTER_GPU_PH_ATTN_BWD, DRAFTER_GPU_PH_LOSS, DRAFTER_GPU_PH_N };
const char *drafter_gpu_phase_name(int ph);
int drafter_gpu_timing(struct drafter_gpu *g, int on, char *err, int err_len);
int drafter_gpu_phase_times(struct drafter_gpu *g, double *ms, char *err, int err_len);

/* Device pointers into the last step's state (tests, dumps), valid until the next step: xn (N·B, H) bf16, the
 * layer outputs (N·B, H) bf16, the context (budget, H) bf16 after hidden_norm, anchors (N) int32, valid (N), the
 * loss rows (N·B) fp32: ℓ_s (0 where unsupervised) and w_s·m_s, and the rows' argmaxes (the draft, for eval). */
struct drafter_gpu_last {
    int T, budget, N, B, H;
    const bf16 *xn, *ctx;
    const float *row_loss, *row_weight;
    const bf16 *layer_out[DRAFTER_MAX_LAYERS];
    const int32_t *anchors;
    const uint8_t *valid;
    const int32_t *arg;    /* (N·B, 2) per row (argmax of the drafter's logits, argmax of the target's), draft ids;
                            * every row after a step with train = 0, only the supervised rows after a training step
                            * (INT32_MAX elsewhere) */
};
void drafter_gpu_last_step(const struct drafter_gpu *g, struct drafter_gpu_last *out);
#endif

/* Results of the last drafter_step, for tests and the dump (pointers into the drafter, valid until the next
 * step): anchors (N) int32, valid (N), per-row pred/tgt argmax (N·B) int32 (tgt -1 past the batch), row mask
 * (N·B), the final normed state xn (N·B, H), the features as consumed (T, k·H; after noise), the context and the
 * layer outputs. */
struct drafter_last {
    int T, N, B, H, k;
    const int32_t *anchors;
    const uint8_t *valid;
    const int32_t *pred, *tgt;
    const uint8_t *row_mask;
    const float *xn;
    const float *hidden_used;
    float loss;
    const float *ctx_fc, *ctx;                     /* (T, H) the context after fc, and after hidden_norm */
    const float *layer_out[DRAFTER_MAX_LAYERS];    /* (N·B, H) each layer's output (residual stream) */
    const uint8_t *t2d;                            /* (V_t) or NULL when V_d == V_t */
    const int64_t *d2t;                            /* (V_d) or NULL */
};
void drafter_last_step(const struct drafter *d, struct drafter_last *out);

/* ---------------------------------------------------------------- config.json and debug dump (issue 16 item 7) */

/* The drafter's config.json as the speculators export writes it (§11a): top-level keys, speculators_config and
 * transformer_layer_config; aux_hidden_state_layer_ids in the speculators convention. verifier_name goes into
 * speculators_config.verifier.name_or_path. Returns malloc'ed text (caller frees), NULL when out of memory. */
char *drafter_config_json_text(const struct drafter_config *c, const char *verifier_name);

/* What the dump records beside the drafter's own state. */
struct drafter_dump_info {
    uint64_t step;               /* optimizer step N (the directory is dir/step-N) */
    uint64_t seed;
    const char *compute_dtype;   /* "float32" on the CPU path, "bfloat16" on the GPU path */
    const char *verifier_name;   /* name_or_path of the target, for speculators_config.verifier */
};
/* Write dir/step-N/{batch,weights,grads,activations}.safetensors and manifest.json for the micro-batch b the
 * last drafter_step ran on (call it right after that step, on the first micro-batch of optimizer step N, with
 * the gradients zeroed before it: g then holds this micro-batch's own gradient, before accumulation, all-reduce
 * and clipping; the weights are those before the optimizer step). m is that step's metrics. Creates the
 * directories. Tensor names, shapes and dtypes are listed in drafter_dump.c; manifest.json holds the
 * drafter_config_json_text keys plus total_seq_len (the budget), n_tokens, target_model_type, compute_dtype, loss,
 * weighting, gamma, alpha, loss_value, grad_norm (of this micro-batch, pre-clip), position_correct /
 * position_total (length B, by slot), full_acc, eal (+ eal_sum, eal_count), eal_marginal, step, seed,
 * mask_token, target_layer_ids (+ _convention), noise, max_anchors, n_anchors. 0/-1 with a sentence. */
int drafter_dump_step(const struct drafter *d, const char *dir, const struct drafter_batch *b,
                      const struct drafter_metrics *m, const struct drafter_dump_info *info, char *err, int err_len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_TRAIN_DRAFTER_H */
