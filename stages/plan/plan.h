/*
 * stages/plan/plan.h — the run plan: RUN/plan.json, the one owner of a run's geometry (issue 25).
 *
 * Before, each fact of a run was typed on several command lines (the token budget on eight, the
 * captured layer ids under two flag names, the hidden size and dtype picked by the shell, the steps
 * counted by writing every batch to disk). Now `dflash-plan MODEL DATA [flags] --run RUN` writes
 * RUN/plan.json once (plan_make + plan_write), and every stage started with `--run RUN` reads it
 * (plan_open_run) and takes from it what its flags would otherwise say:
 *
 *   key                  what                                              read by
 *   model, data          absolute paths of the target dir and dataset      pack (data), target, train
 *   device               cpu | cuda:N: the target's and hspack's device,     target, hspack
 *                        and the GPU rings'
 *   train_device         the trainer's device (default: device; a GPU       train
 *                        trainer reads host rings when device is cpu)
 *   tokens               the packed batch budget                           pack, target, hspack, train
 *   target.layers        the target's decoder layer count (config.json)    (the ids' range)
 *   target.hidden_size   H (config.json)                                   hspack
 *   capture.layer_ids    captured ids, z-lab convention (output of decoder layer i); default
 *                        plan_default_layer_ids(target.layers, drafter.layers) target, hspack (k), train
 *   dtype                bf16 on a GPU, f32 on the CPU path                hspack
 *   drafter.layer_types  one per draft layer (the count is the layer count) train
 *   drafter.block_size   B                                                 train
 *   seed, window         the packer's shuffle seed and packing window       pack
 *   epochs               dataset passes the steps were counted from        (dflash-plan)
 *   steps, grad_accum    optimizer steps, packed batches per step          train
 *   batches              steps x grad_accum: what the packer emits         pack (--max-batches)
 *   target_replicas      dflash-target processes sharing batches/hidden    pipelines (issue 29); hidden ring's
 *                        (written only when > 1; absent: 1)                  producers= and slots
 *   ranks                dflash-train ranks (written only when > 1)        train (its world must equal it)
 *   hosts                hosts of a several-host run (topology (c); only     pack, hspack, train, pipelines
 *                        when > 1): rank r lives on host r / (ranks/hosts)
 *   host                 only in a host's plan RUN/hosts/<h>/plan.json       pack, hspack (their seq shard)
 *                        (plan_for_host): the host this directory runs
 *   rings                dflash-shm --ring specs (without plan=)            shm
 *   hash                 FNV-1a 64 of the plan's canonical JSON without `hash` and `host` (16 hex digits): every
 *                        host's plan has the run's hash, so the trainer ranks (which read RUN/plan.json) accept
 *                        the rings of their host's chain
 *
 * Several hosts (issue 29, topology (c)): RUN (on a filesystem every host mounts) holds the run's plan, with
 * hosts H and ranks W; host h runs its own chain in RUN/hosts/<h> (plan_host_dir; its rings are per host, as
 * /dev/shm is), with the plan plan_for_host writes there. Host h's packer packs every batch and publishes only
 * its shard's seqs (plan_shard: s % W in [h·L, (h+1)·L), L = W / H), its hspack steps over the others, and its L
 * trainer ranks (ranks h·L .. h·L+L-1) read that host's features ring; checkpoints and exports stay in RUN.
 *
 * Binding rules (plan_bind_*): a flag the stage was not given takes the plan's value; a flag given
 * with the plan's value is accepted (an old command line, a swapped binary); a flag given with
 * another value is an error naming both ("--tokens 4096 conflicts with the plan's tokens 8192
 * (runs/x/plan.json)"). A run directory without plan.json runs on flags alone, as before. To run
 * an experiment with other geometry, write another plan (dflash-plan, or edit the file and run
 * `dflash-plan --rehash --run RUN`).
 *
 * The plan's hash goes into every ring dflash-shm creates from it (ring spec key plan=, the ring
 * header, shm/ring.h); a stage reading a plan refuses a ring made for another plan with one line
 * (rings_check_plan, stages/core/rings.h).
 *
 * Library code: nothing here exits; errors are one sentence naming the file and key.
 */
#ifndef STAGES_PLAN_PLAN_H
#define STAGES_PLAN_PLAN_H

#include "core/desc.h"
#include "core/shard.h"

#include <stddef.h>

#include <limits.h>
#include <stdint.h>

#define PLAN_VERSION 1
#define PLAN_FILE "plan.json"
#define PLAN_MAX_RINGS 4
#define PLAN_MAX_DRAFT_LAYERS 64
#define PLAN_DEFAULT_TOKENS 8192
#define PLAN_DEFAULT_SEED 1
#define PLAN_DEFAULT_WINDOW 4096   /* dflash-pack --window */

struct plan {
    char path[PATH_MAX];            /* the file it was read from or written to ("" before) */
    uint64_t hash;
    char model[PATH_MAX], data[PATH_MAX];
    char device[32];                /* "cpu" or "cuda:N": target, hspack and the rings' payloads */
    char train_device[32];          /* "cpu" or "cuda:N": dflash-train */
    uint32_t tokens;
    int target_layers, hidden_size;
    int n_ids, ids[DESC_MAX_LAYERS];        /* z-lab convention */
    enum desc_dtype dtype;
    int draft_layers;                       /* = the count of layer_types */
    int layer_types[PLAN_MAX_DRAFT_LAYERS]; /* DRAFTER_LAYER_* (stages/train/drafter.h) */
    int block_size;
    int64_t seed, steps, batches;
    int window, grad_accum, epochs;
    int target_replicas;                    /* >= 1 */
    int ranks;                              /* >= 1: dflash-train ranks (1: not said) */
    int hosts;                              /* >= 1: hosts of the run; ranks % hosts == 0 */
    int host;                               /* -1: the whole run; else this host plan's host, < hosts */
    int n_rings;
    char rings[PLAN_MAX_RINGS][256];        /* dflash-shm --ring specs, without plan= */
};

/* What dflash-plan is given. Zero / NULL fields take the defaults listed in dflash-plan --help. */
struct plan_inputs {
    const char *model, *data;       /* data: the dataset (JSONL or index) the batches are counted from */
    const char *device;             /* cpu | cuda:N (auto is resolved by the caller) */
    const char *train_device;       /* cpu | cuda:N, or NULL: device */
    int tokens;                     /* 0: PLAN_DEFAULT_TOKENS */
    int n_ids, ids[DESC_MAX_LAYERS];/* 0: plan_default_layer_ids for the drafter's layer count */
    const char *layer_types;        /* "sliding,full" or NULL: the drafter's default (drafter_config_defaults) */
    int block_size;                 /* 0: the drafter's default */
    int64_t steps;                  /* 0: ceil(batches of `epochs` epochs / grad_accum) */
    int epochs;                     /* 0: 1 */
    int grad_accum;                 /* 0: 1 */
    int64_t seed;                   /* < 0: PLAN_DEFAULT_SEED */
    int window;                     /* 0: PLAN_DEFAULT_WINDOW */
    int ring_slots;                 /* 0: RINGS_DEFAULT_SLOTS */
    int target_replicas;            /* 0: 1 */
    int ranks;                      /* 0: 1 (trainer ranks; grad_accum must divide by it) */
    int hosts;                      /* 0: 1 (ranks must divide by it) */
};
#define PLAN_MAX_TARGET_REPLICAS 64

/* The z-lab default captured layer ids for a drafter of n_draft layers on an n_target-layer target:
 * the ONE place every stage and dflash-plan take them from (it calls hf_zlab_layer_ids,
 * stages/model/hfconfig.h). Returns 0, or -1 with a sentence when they do not fit the target. */
int plan_default_layer_ids(int n_target, int n_draft, int *ids, char *err, int err_len);

/* Fill p from the inputs: reads MODEL/config.json, counts the packed batches of the dataset when
 * in->steps is 0, computes the ring specs and the hash. 0, or -1 with a sentence. */
int plan_make(const struct plan_inputs *in, struct plan *p, char *err, int err_len);
/* Write p as JSON to path (atomically); sets p->path. */
int plan_write(struct plan *p, const char *path, char *err, int err_len);
/* Read and validate path into p. With check_hash, a stored hash that differs from the content's
 * (the file was edited) is an error that says to run dflash-plan --rehash. */
int plan_read(const char *path, int check_hash, struct plan *p, char *err, int err_len);
/* RUN/plan.json when it exists: 1 with p filled, 0 when there is none, -1 with a sentence. */
int plan_open_run(const char *run_dir, struct plan *p, char *err, int err_len);
/* The hash of p's content (everything but `hash`). */
uint64_t plan_compute_hash(const struct plan *p);

/* ---------------------------------------------------------------- binding flags to the plan */
/* Each: given = the flag was on the command line (flags_given). Not given: *value = the plan's.
 * Given and equal: 0. Given and different: -1 with "--FLAG X conflicts with the plan's KEY Y (PATH)". */
int plan_bind_int(const struct plan *p, const char *flag, int given, int *value, int64_t plan_value,
                  const char *key, char *err, int err_len);
int plan_bind_int64(const struct plan *p, const char *flag, int given, int64_t *value, int64_t plan_value,
                    const char *key, char *err, int err_len);
/* Strings compare as paths when both exist (realpath), else as text. */
int plan_bind_str(const struct plan *p, const char *flag, int given, const char **value, const char *plan_value,
                  const char *key, char *err, int err_len);
int plan_bind_list(const struct plan *p, const char *flag, int given, int *items, int *count, const int *plan_items,
                   int plan_count, const char *key, char *err, int err_len);
/* --device: "auto" (not given) becomes plan_device (p->device, or p->train_device for the trainer); a given
 * device must equal it. */
int plan_bind_device(const struct plan *p, int given, const char **device, const char *plan_device, char *err,
                     int err_len);

/* ---------------------------------------------------------------- several hosts */
#define PLAN_MAX_HOSTS 4096
/* out = shared with host = `host`: the plan host `host`'s chain runs on (same hash). -1 with a sentence when the
 * plan has no hosts (hosts 1), is already a host's plan, or host is outside 0..hosts-1. */
int plan_for_host(const struct plan *shared, int host, struct plan *out, char *err, int err_len);
/* "RUN/hosts/<host>": host `host`'s run directory (its rings, bus, logs and state). 0, or -1 (too long). */
int plan_host_dir(const char *run_dir, int host, char *out, size_t cap);
/* The host trainer rank `rank` lives on: rank / (ranks / hosts) (0 with one host). */
int plan_rank_host(const struct plan *p, int rank);
/* The seqs this plan's chain produces: every seq, or with a host, that host's shard (core/shard.h). */
void plan_shard(const struct plan *p, struct seq_shard *s);

/* "1,9,17" of n ints into buf. */
const char *plan_format_ids(const int *ids, int n, char *buf, int len);

#endif /* STAGES_PLAN_PLAN_H */
