/*
 * stages/train/sched.h — the learning-rate schedule (dflash-reference.md §9): one multiplier per
 * optimizer step s (0-based) that scales both optimizers' base lrs (speculators keeps one LambdaLR
 * per optimizer with the same lambda, so one factor is the same thing).
 *
 *   linear: f(s) = s/w for s < w, then max(0, (S-s)/(S-w))      (the speculators default)
 *   cosine: f(s) = s/w for s < w, then max(0, 0.5·(1 + cos(π·progress))), 0.5 cycles
 *   none:   f(s) = 1                                              (constant; no warm-up)
 * S = total optimizer steps; w = S // 100 unless overridden by steps or by a ratio (w = floor(r·S)).
 * f(0) = 0 whenever w > 0, so the very first step uses lr 0, exactly as speculators does. The
 * values are kernels/adamw_ref.c's adamw_lr_linear / adamw_lr_cosine (transformers' formulas).
 * Pure functions; thread-safe.
 */
#ifndef STAGES_TRAIN_SCHED_H
#define STAGES_TRAIN_SCHED_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum sched_kind { SCHED_LINEAR = 0, SCHED_COSINE = 1, SCHED_NONE = 2 };

struct sched {
    enum sched_kind kind;
    int64_t total;     /* S >= 1 */
    int64_t warmup;    /* w, 0 <= w <= S */
};

/* Parse "linear" | "cosine" | "none" into *kind; -1 with a sentence naming the value otherwise. */
int sched_parse_kind(const char *s, enum sched_kind *kind, char *err, int err_len);
const char *sched_kind_name(enum sched_kind kind);

/* Set up the schedule. warmup_steps >= 0 overrides the default S // 100; else warmup_ratio in
 * [0, 1] (when >= 0) gives w = floor(ratio·S); giving both is an error. Fails on S < 1 or w > S. */
int sched_init(struct sched *s, enum sched_kind kind, int64_t total, int64_t warmup_steps,
               double warmup_ratio, char *err, int err_len);

/* The lr multiplier at optimizer step `step` (0-based; steps past S give 0 for linear/cosine). */
double sched_factor(const struct sched *s, int64_t step);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_TRAIN_SCHED_H */
