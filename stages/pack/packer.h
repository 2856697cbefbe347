/*
 * stages/pack/packer.h — the packing policy of dflash-pack: turns a dataset into a deterministic
 * stream of packed batches (desc.h `batch` descriptor + payload), one per sequence number.
 *
 * POLICY (the stream is a pure function of the dataset content and budget, window, seed, shard):
 *   - Eligibility, fixed for the run: a row is packed with length min(len, budget) (longer rows are
 *     TRUNCATED to the budget and fill a batch alone); a row with no loss_mask = 1 token in that
 *     prefix is DROPPED. Both are counted (struct packer_stats).
 *   - Epoch e: the eligible rows are permuted with a Fisher-Yates shuffle driven by splitmix64
 *     seeded from (seed, e). The permutation is cut into windows of `window` rows; inside a window
 *     rows are sorted longest first (ties: permutation order) and placed first-fit into batches of
 *     at most `budget` tokens (first-fit decreasing), and the window's batches are emitted in the
 *     order they were opened, documents in placement order. Only the last batches of a window can
 *     be loosely filled, so padding stays small; a larger window packs tighter and mixes less.
 *   - Shards (--shard i/n, for several nodes): every shard computes the same epoch plan; shard i
 *     takes the plan's batches b with b % n == i, and each shard takes floor(n_batches / n) of
 *     them, so all shards step equally often (up to n-1 tail batches per epoch are left out when
 *     n > 1, counted in tail_dropped). Sequence numbers are per shard stream: 0, 1, 2, ... across
 *     epochs.
 *   - Validation split (--val-frac F --val-every N): the LAST round(F * rows) row ids (at least one)
 *     are held out, as speculators' train_data_ratio splits a dataset (train first, val last); they
 *     never appear in a train batch. They are planned once, in row-id order (no shuffle, the same
 *     every pass), by the same windowed first-fit decreasing, into val batches; shard i takes the
 *     val batches b with b % n == i (V of them, all of its share, none dropped). The stream
 *     interleaves: after every N-th train batch (the last one included) comes one full pass over
 *     this shard's V val batches, so seq s is, with P = N + V, train batch (s / P)·N + min(s % P, N)
 *     or val batch s % P - N when s % P >= N. A val batch's descriptor says split = val and carries
 *     the epoch of the train batch it follows. The trainer's step count is therefore unchanged by
 *     validation (val batches are not micro-batches), and seeking stays arithmetic. Without
 *     --val-frac the stream (and the fingerprint) is exactly what it was before the split existed.
 *   - End: after `epochs` epochs (0 = never) or once `max_batches` batches (train and val) were
 *     emitted in total (0 = no limit), whichever is first; a validation pass due after the last
 *     train batch is still emitted.
 *   - Seeking: batch plans are recomputed per epoch (O(rows log window)), so packer_seek(S) walks
 *     the epochs' batch counts (cached) and lands on batch S without packing anything.
 *
 * A struct packer is single-threaded; it only reads the dataset, which must outlive it.
 * Functions return 0 (or a count) or -1 with one sentence in err; none exits.
 */
#ifndef STAGES_CORE_PACKER_H
#define STAGES_CORE_PACKER_H

#include <stddef.h>
#include <stdint.h>

#include "core/dataset.h"
#include "core/desc.h"

struct packer_config {
    uint32_t budget;           /* token budget T per batch (--tokens), >= 1 */
    uint32_t window;           /* rows per packing window (--window), >= 1 */
    uint64_t seed;             /* --seed */
    uint32_t shard, n_shards;  /* --shard i/n: 0 <= shard < n_shards */
    uint32_t epochs;           /* --epochs, 0 = unlimited */
    uint64_t max_batches;      /* --max-batches, 0 = unlimited */
    double val_frac;           /* --val-frac: fraction of rows held out for validation, [0, 1); 0 = none */
    uint64_t val_every;        /* --val-every: train batches between two validation passes (> 0 iff val_frac > 0) */
};

/* Where the stream stands: the next TRAIN batch to emit is plan position `position` of epoch `epoch`
 * and the next batch (train or val) gets sequence number `next_seq`. fingerprint identifies (dataset, budget, window, seed,
 * shard); a saved cursor is only valid for the same fingerprint. */
struct packer_cursor {
    uint32_t epoch;
    uint64_t position;
    uint64_t next_seq;
    uint64_t fingerprint;
    int64_t origin;            /* for the stage: the --resume-from-seq S this stream was rewound to (-1:
                                * none), so a restart with that same flag continues instead of rewinding
                                * again; kept in the text form, ignored by the packer */
};

struct packer_stats {
    uint64_t rows;             /* rows in the dataset */
    uint64_t eligible;         /* rows packed every epoch */
    uint64_t dropped;          /* rows without a supervised token (within the budget) */
    uint64_t truncated;        /* eligible rows longer than the budget, cut to it */
    uint64_t eligible_tokens;  /* tokens packed per epoch (after truncation) */
    uint64_t batches;          /* batches emitted by this packer since init/seek */
    uint64_t tokens;           /* tokens in them */
    uint64_t loss_tokens;      /* loss_mask = 1 tokens in them */
    uint64_t padding;          /* sum of budget - n_tokens over them */
    uint64_t tail_dropped;     /* plan batches left out for equal shard lengths (n_shards > 1), all epochs computed */
    uint64_t val_rows;         /* rows held out for validation (the last ones by row id) */
    uint64_t val_eligible;     /* of them, rows packed into the val batches (eligible counts train rows only) */
    uint64_t val_batches;      /* val batches emitted since init/seek (also counted in batches) */
};

struct packer {
    const struct dataset *ds;
    struct packer_config cfg;
    struct packer_stats stats;
    uint64_t fingerprint;
    uint32_t *eff_len;         /* [rows] packed length, 0 = dropped */
    uint32_t *eligible;        /* [n_eligible] eligible train row ids, ascending */
    uint32_t *val_eligible;    /* [stats.val_eligible] eligible held-out row ids, ascending */
    uint32_t *val_rows;        /* the validation plan (global, before sharding): rows in emission order */
    uint64_t *val_start;       /* [val_plan_bins+1] */
    uint64_t val_plan_bins;
    uint64_t val_count;        /* val batches of this shard per pass (V); 0 = no validation */
    /* the current epoch's plan (global, before sharding) */
    uint32_t plan_epoch;       /* epoch the plan below belongs to (UINT32_MAX: none) */
    uint32_t *plan_rows;       /* [n_eligible] row ids in emission order */
    uint64_t *plan_start;      /* [plan_n_bins+1] start of each batch in plan_rows */
    uint64_t plan_n_bins;
    /* scratch for planning */
    uint32_t *perm;
    void *sort_buf;
    uint32_t *bin_fill, *bin_next, *bin_first, *bin_last;
    /* shard-local batch counts per epoch, filled as epochs are planned */
    uint64_t *epoch_count;
    uint32_t epoch_count_n, epoch_count_cap;
    struct packer_cursor cur;
    int ended;
};

/* Validate cfg, classify every row (dropped/truncated), and position the stream at seq 0. Fails
 * with a sentence when nothing is eligible, or when epoch 0 gives this shard no batch (too few
 * rows for n_shards). The dataset must outlive the packer. Allocates O(rows). */
int packer_init(struct packer *p, const struct dataset *ds, const struct packer_config *cfg, char *err, int err_len);
void packer_free(struct packer *p);

/* Position the stream so that the next batch emitted has sequence number seq. A seq exactly at
 * the end of the stream is fine (packer_next then returns 0); one past the end fails with a
 * sentence giving the stream's length (a resume point beyond it means a wrong --resume-from-seq
 * or another dataset, and must not pass for "done"). Cost: one plan per epoch not yet
 * seen, O(rows log window) each. Resets the emitted-batch counters of stats. */
int packer_seek(struct packer *p, uint64_t seq, char *err, int err_len);

/* Resume from a saved cursor: checks its fingerprint against this packer's, seeks to next_seq and
 * checks that epoch and position agree. A mismatch fails with a sentence (the dataset or flags
 * changed since the cursor was written). */
int packer_resume(struct packer *p, const struct packer_cursor *c, char *err, int err_len);

/* Emit the next batch: write its arrays into payload (capacity payload_cap bytes, host memory;
 * desc_batch_max_payload_bytes(budget) always suffices) in the standard layout of
 * desc_batch_layout, and fill *d (seq, epoch, budget, counts, offsets). Returns 1 with a batch, 0
 * at the end of the stream, -1 on error (payload too small). Advances the cursor. */
int packer_next(struct packer *p, void *payload, uint64_t payload_cap, struct desc_batch *d, char *err, int err_len);

/* 1 when packer_next would return 0 (the stream has ended), 0 when a batch follows, -1 on error.
 * Lets a producer avoid claiming a ring slot it would only give back. */
int packer_at_end(struct packer *p, char *err, int err_len);

/* The cursor after the last emitted batch (what to save). */
void packer_get_cursor(const struct packer *p, struct packer_cursor *c);

/* Encode / decode a cursor as a small JSON text (for state/pack.cursor). Encode returns the
 * length written into buf (NUL-terminated) or -1 when it does not fit; decode returns 0 or -1 with
 * a sentence. */
int packer_cursor_format(const struct packer_cursor *c, char *buf, size_t cap);
int packer_cursor_parse(const char *text, size_t len, struct packer_cursor *c, char *err, int err_len);

/* The number of batches epoch e gives this shard (plans epochs up to e if not done yet; the
 * plan is a cache, so this may be called at any time). -1 on error. */
int64_t packer_epoch_batches(struct packer *p, uint32_t epoch, char *err, int err_len);

#endif /* STAGES_CORE_PACKER_H */
