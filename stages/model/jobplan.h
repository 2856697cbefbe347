/*
 * stages/model/jobplan.h — the device-memory plan of the whole training job on ONE GPU (issue 27
 * item 3): the frozen target (weights + working memory), the drafter's training state and
 * activations, the device rings between the stages, and a fixed reserve per GPU process (CUDA
 * context, cuBLASLt workspaces). Computed at start-up from the configuration alone, printed per
 * stage and in total, and checked against the GPU's capacity: a job that cannot fit is refused
 * with one line naming the shortfall and the flags that shrink it, never an OOM mid-run.
 *
 * Arithmetic (bytes; T the token budget, R = anchors·block the drafter's rows, KV = T + R):
 * - target: target_plan_bytes (exactly what target.c allocates; tested against it);
 * - drafter state: trainable parameters × (fp32 master 4 + fp32 gradient 4 + bf16 copy 2 +
 *   optimizer 8: AdamW's two fp32 moments, an upper bound for Muon's one momentum), frozen
 *   embedding [V_t, H] and LM head [V_d, H] in bf16, norms fp32; as drafter_gpu_init / optim_gpu_init
 *   plan them;
 * - drafter activations: per layer 4·R·H + 3·R·(n_h·d_h) + 3·KV·(n_kv·d_h) + 3·R·I bf16 plus fp32
 *   statistics; once: the inputs T·(k+1)·H bf16, the context and backward buffers (drafter_gpu.c's
 *   plan, region by region), the LM-head loss workspace (two [R, V_d] bf16 logit buffers when they
 *   fit in 2 GiB, else two [R, 8192] chunks: kernels/lmhead_loss.h);
 * - rings: slots × (T·(k+1)·H bf16 + the batch arrays) for the hidden and the features ring;
 * - reserve: JOBPLAN_RESERVE_BYTES per GPU process (target, trainer, dflash-shm).
 * The drafter terms mirror drafter_gpu.c's plan: when that plan changes, change this one (the CPU
 * test pins the 27B numbers so a drift is seen).
 *
 * Pure functions, no CUDA; thread-safe.
 */
#ifndef STAGES_MODEL_JOBPLAN_H
#define STAGES_MODEL_JOBPLAN_H

#include <stddef.h>
#include <stdio.h>

#include "model/hfconfig.h"

#ifdef __cplusplus
extern "C" {
#endif

#define JOBPLAN_RESERVE_BYTES ((size_t)1 << 30)   /* CUDA context + cuBLASLt workspaces, per GPU process */
#define JOBPLAN_MAX_LINES 12

struct jobplan_inputs {
    const struct model_config *target;   /* the target's config (its H, V_t, layers) */
    int tokens;                          /* --tokens: the batch budget T */
    int n_capture;                       /* k captured layers */
    /* the drafter (dflash-train's flags; H and the vocabulary come from the target) */
    int draft_layers;                    /* L_d */
    int draft_heads, draft_kv_heads, draft_head_dim, draft_intermediate;   /* 0: the target's */
    int max_anchors;                     /* --max-anchors N */
    int block_size;                      /* --block-size B */
    int draft_vocab;                     /* --draft-vocab size V_d (0: the full vocabulary) */
    int grad_accum;                      /* --grad-accum (reported; accumulation reuses the gradient buffers) */
    int ring_slots;                      /* slots of the hidden and the features ring each */
    size_t capacity_bytes;               /* the GPU's memory (cudaMemGetInfo's total), e.g. 141 GB */
};

struct jobplan_line {
    char stage[24];                      /* "target", "trainer", "rings", "reserve" */
    char what[96];
    size_t bytes;
};

struct jobplan {
    int n;
    struct jobplan_line line[JOBPLAN_MAX_LINES];
    size_t target_bytes, trainer_bytes, ring_bytes, reserve_bytes, total_bytes, capacity_bytes;
    double draft_params;                 /* trainable drafter parameters */
};

/* Compute the plan. 0, or -1 with a sentence for inputs that make no sense (a size < 1). */
int jobplan_compute(const struct jobplan_inputs *in, struct jobplan *p, char *err, int err_len);
/* One line per entry, per-stage subtotals and the total against the capacity. */
void jobplan_print(const struct jobplan *p, FILE *f);
/* 0 when the total fits the capacity; else -1 and one line: the shortfall and what to change, e.g.
 * "memory plan: the job needs 150.2 GB on one GPU of 141.0 GB (short by 9.2 GB: trainer 60.1 GB, ...);
 * lower --tokens (...), --max-anchors (...), use --draft-vocab (...), or --grad-accum with a smaller --tokens". */
int jobplan_check(const struct jobplan *p, char *err, int err_len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_MODEL_JOBPLAN_H */
