/*
 * stages/train/step.h — the device side of dflash-train's optimizer step behind one interface, with a CPU
 * (step_cpu.c) and a GPU (step_gpu.c) implementation, as the target mirrors forward_cpu/forward_gpu (issue 25).
 *
 * dflash-train keeps the orchestration (decode and check each features item, accumulate A micro-batches, the
 * non-finite guard, the learning-rate schedule, metrics, validation pooling, checkpoints, exports); a
 * struct step_exec does what touches the weights and gradients:
 *   micro      one features item (already decoded and checked against the drafter): train = 1 runs forward and
 *              backward (gradients accumulate) and adds the metrics to `acc`, now (CPU) or at the next collect
 *              (GPU, metrics stay on the device); train = 0 runs forward only (no noise, nothing accumulates) and
 *              writes that batch's metrics to *val. The slot may be released when micro returns.
 *   grad_norm  the end of the accumulation: gradients *= scale (1/A), the global norm into *norm (the CPU also
 *              clips to `clip` here; the GPU clips in apply), and every pending train metric added to `acc`.
 *   apply      Muon + AdamW at lr x lr_factor (clip to `clip` first on the GPU).
 *   zero_grad  the gradients back to zero.
 *   to_host    the host drafter and struct optim equal the device's (checkpoints, exports read them); a no-op on
 *              the CPU.
 *   free       releases what the implementation planned (the drafter and optimizer stay the caller's).
 *   sum_grads  the gradients summed over the trainer ranks in fp32, in place (issue 29; train/dp.h): MPI on the
 *              host gradients (CPU), ncclAllReduce on the device gradients on the step's stream (GPU).
 * Memory: each implementation plans everything in its constructor; a step allocates nothing.
 */
#ifndef STAGES_TRAIN_STEP_H
#define STAGES_TRAIN_STEP_H

#include "core/desc.h"
#include "shm/ring.h"
#include "train/dp.h"
#include "train/drafter.h"
#include "train/optim.h"

#include <stdint.h>

/* The metrics of the current optimizer step's train micro-batches. */
struct step_acc {
    struct drafter_metrics m;
    double loss_sum;           /* Σ per-batch losses */
};

/* A replayable dump of one micro-batch (CPU only: dflash-train --dump-step). */
struct step_dump {
    const char *dir;
    struct drafter_dump_info info;
};

struct step_exec {
    void *impl;
    const char *name;          /* "cpu" | "gpu" */
    double mem_gib;            /* device memory in use after start-up (GPU; 0 on the CPU) */
    int (*micro)(void *impl, const struct ring_slot *is, const struct desc_features *fd, int train, uint64_t seed,
                 struct step_acc *acc, struct drafter_metrics *val, const struct step_dump *dump, char *err,
                 int err_len);
    int (*grad_norm)(void *impl, struct step_acc *acc, float scale, double clip, double *norm, char *err, int err_len);
    int (*apply)(void *impl, double lr_factor, double clip, char *err, int err_len);
    int (*zero_grad)(void *impl, char *err, int err_len);
    int (*to_host)(void *impl, char *err, int err_len);
    void (*free)(void *impl);
    int (*sum_grads)(void *impl, struct dp *dp, char *err, int err_len);
};

/* The CPU path: d and opt are the caller's; tens[0..n_tens) the optimizer's view of d's parameters. Plans the
 * widening buffers of bf16 features (T_max x k·H and T_max x H floats). 0, or -1 with a sentence. */
int step_cpu_init(struct step_exec *x, struct drafter *d, struct optim *opt, struct optim_tensor *tens, int n_tens,
                  const char *in_ring, char *err, int err_len);
/* dflash-train --round-features-bf16: fp32 features are rounded to bf16 on load, as the GPU path stores them, so
 * the two trainers can be compared on equal inputs (tests/gpu/test_train_tau_gpu.c). Call after step_cpu_init. */
void step_cpu_round_features(struct step_exec *x, int on);

/* The GPU path on CUDA device `device` (after any checkpoint restore into d and opt: the device copies start
 * from the host state; it makes `device` current, so call it before attaching GPU rings): the device drafter and
 * optimizer, a warm-up step at the full budget, a pinned buffer for a device slot's batch arrays. The memory
 * plan goes to `plan` line by line, and later the path's one warning (a host slot CUDA refused to register:
 * copies from pageable memory). Without CUDA in the build: -1 with a sentence. */
int step_gpu_init(struct step_exec *x, struct drafter *d, struct optim *opt, int device, const char *in_ring,
                  void (*plan)(const char *line), char *err, int err_len);
/* Once the input ring is attached: its n_slots host slots may each be registered with CUDA once (the table is
 * allocated here). 0, or -1 with a sentence. */
int step_gpu_plan_slots(struct step_exec *x, uint32_t n_slots, char *err, int err_len);

#endif /* STAGES_TRAIN_STEP_H */
