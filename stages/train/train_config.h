/*
 * stages/train/train_config.h — the checkpoint's "dflash-train config": the one owner of its keys (issue 25).
 *
 * dflash-train writes it into every checkpoint (train_config_json) and resumes only from a checkpoint whose
 * config equals it (ckpt.h); dflash-export and dflash-eval read a checkpoint's drafter back from it
 * (train_config_parse, through export_load_checkpoint). Adding a key is one edit here, in both directions. The
 * spellings of the option names (losses, weightings, optimizers, layer types, schedules) live here too, and
 * dflash-train's flag tables use these arrays.
 *
 * Keys (version 1): format "dflash-train config", version, target_model_type, hidden_size, target_layers,
 * vocab_size, draft_vocab_size, block_size, layer_types, sliding_window, sliding_window_non_causal, max_anchors,
 * tokens, target_layer_ids_zlab, sample_from_anchor, mask_token_id, noise, loss, weighting, gamma, alpha,
 * init_std, seed, optimizer, lr, muon_lr, weight_decay, muon_weight_decay, schedule, total_steps,
 * warmup_steps, grad_accum, clip.
 */
#ifndef STAGES_TRAIN_TRAIN_CONFIG_H
#define STAGES_TRAIN_TRAIN_CONFIG_H

#include "train/drafter.h"

#include <stdint.h>

extern const char *const train_loss_names[];        /* LMHEAD_LOSS_* order: kl, ce */
extern const char *const train_weighting_names[];   /* LMHEAD_WEIGHT_* order: none, exp-decay, dpace */
extern const char *const train_optimizer_names[];   /* enum optim_kind order: muon, adamw */
extern const char *const train_schedule_names[];    /* enum sched_kind order: linear, cosine, none */
extern const char *const train_layer_type_names[];  /* DRAFTER_LAYER_* order: sliding, full */
extern const char *const train_convention_names[];  /* DRAFTER_IDS_* order: zlab, speculators */

/* What a run computes beyond the drafter's configuration. */
struct train_hparams {
    int64_t seed;
    int optimizer;                  /* enum optim_kind */
    double lr, muon_lr, weight_decay, muon_weight_decay;
    int schedule;                   /* enum sched_kind */
    int64_t total_steps, warmup_steps;
    int grad_accum;
    double clip;
};

/* The config JSON text (compact, key order as listed above) of a complete drafter config c (after
 * drafter_config_from_target) and h. Returns a malloc'ed string, or NULL when out of memory. */
char *train_config_json(const struct drafter_config *c, const struct train_hparams *h);

/* The target facts a checkpoint records, checked against the target it is loaded with. */
struct train_config_target {
    int64_t hidden_size, target_layers, vocab_size, draft_vocab_size;
};

/* Parse a checkpoint's config object into c (drafter_config_defaults, then every key; the target fields stay
 * for drafter_config_from_target), h (seed and optimizer; the rest when present) and t. `what` names the file in
 * errors. 0, or -1 with "WHAT: key K ...". */
int train_config_parse(const struct json_t *j, const char *what, struct drafter_config *c, struct train_hparams *h,
                       struct train_config_target *t, char *err, int err_len);

#endif /* STAGES_TRAIN_TRAIN_CONFIG_H */
