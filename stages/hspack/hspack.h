/*
 * stages/hspack/hspack.h — the pieces of dflash-hspack (issue 15) that do not need a ring: the
 * layout conversion hidden [k][T, H] -> features (concat [T, k·H] or split k × [T, H]), on the
 * host and on devices (same GPU, another GPU, host <-> GPU); the bounded reorder window that
 * restores seq order when several target replicas finish out of order; and the pinned-host spill
 * pool that absorbs bursts when the features ring is full.
 *
 * Conversion. hspack_plan decodes an input descriptor (hidden, or features of either layout) and
 * fixes the output features descriptor: the wanted layout, optionally another dtype (host only:
 * f32 <-> bf16, round to nearest even) and optionally a subset of the captured layers (indexes
 * into the input's layer list; for smaller recordings). The output is laid out canonically
 * (desc_features_layout), its alignment gaps zeroed, so equal inputs give byte-equal outputs.
 * Shapes: T tokens, k captured layers, H hidden size (C in kernels/shapes.md).
 *
 * Reorder window. Items enter with hspack_window_put in any order; hspack_window_take returns the
 * entry of seq `next` when it is there. Seqs below next, or already in the window, are
 * duplicates (counted). The window holds at most `held_max` entries that still occupy an input
 * slot (HELD; one of those places is reserved for next) plus `spill_max` entries copied to the
 * spill pool (SPILLED); when it is full and next is missing the caller waits for next (it is
 * never dropped). A window may hold one shard of the seqs (hspack_window_set_shard: a host's chain of a
 * several-host run, stages/core/shard.h): next then steps over the seqs outside it, and putting one is an error.
 * depth = entries held now;
 * max_depth is the high-water mark (a metric).
 *
 * Everything here is single-threaded per object, never exits, and returns 0 / -1 with one
 * sentence in err (or the documented value).
 */
#ifndef STAGES_HSPACK_HSPACK_H
#define STAGES_HSPACK_HSPACK_H

#include <stddef.h>
#include <stdint.h>

#include "core/desc.h"
#include "core/shard.h"

#define HSPACK_MAX_WINDOW 256   /* held_max + spill_max at most */

/* ---------------------------------------------------------------- conversion */

/* What the output should look like. */
struct hspack_want {
    enum desc_layout layout;            /* DESC_LAYOUT_CONCAT or DESC_LAYOUT_SPLIT */
    enum desc_dtype dtype;              /* 0: the input's dtype */
    uint32_t n_select;                  /* 0: every captured layer, in order */
    int32_t select[DESC_MAX_LAYERS];    /* layer IDS (z-lab ids of the input's `layers`) to keep, in output order */
};

/* A planned conversion of one item. */
struct hspack_plan {
    enum desc_kind in_kind;             /* hidden or features */
    enum desc_layout in_layout;         /* split for hidden */
    enum desc_dtype in_dtype;
    uint32_t in_k;                      /* captured layers of the input */
    uint64_t in_off_states, in_off_last;
    struct desc_batch in_batch;         /* offsets into the input payload */
    uint32_t src_layer[DESC_MAX_LAYERS];/* output layer j = input layer src_layer[j] */
    struct desc_features out;           /* canonical output descriptor */
    uint8_t out_desc[DESC_MAX_BYTES];   /* encoded */
    uint32_t out_desc_len;
};

/* Decode in_desc (kind hidden or features; in_cap: the input slot's payload capacity, 0 = no
 * check) and plan its conversion to `want`. out_cap: the output buffer's capacity (0 = no check).
 * Returns 0, or -1 with a sentence naming the seq and the field (unknown kind, a selected layer
 * not captured, an output larger than out_cap, ...). Pure. */
int hspack_plan(const void *in_desc, size_t in_len, uint64_t in_cap, const struct hspack_want *want,
                uint64_t out_cap, struct hspack_plan *p, char *err, int err_len);

/* Host conversion: out_payload [p->out.batch.payload_bytes] <- in_payload (both host memory, not
 * overlapping). O(payload). Returns 0 (cannot fail once planned; -1 only for a NULL pointer). */
int hspack_convert_host(const struct hspack_plan *p, const void *in_payload, void *out_payload, char *err,
                        int err_len);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* Device conversion: the same result as hspack_convert_host, with in on in_device and out on
 * out_device (-1: host memory, pinned for asynchrony). Same device: cudaMemcpy2DAsync; different
 * devices: cudaMemcpy3DPeerAsync per layer (peer access when enabled, else the driver stages it);
 * host <-> device: cudaMemcpy2DAsync. dtype conversion is not done on devices (-1 with a sentence).
 * Asynchronous on stream: synchronise before publishing. Returns 0, or -1 with the CUDA error. */
int hspack_convert_device(const struct hspack_plan *p, const void *in_payload, int in_device, void *out_payload,
                          int out_device, cudaStream_t stream, char *err, int err_len);
#endif

/* ---------------------------------------------------------------- reorder window */

enum hspack_where { HSPACK_HELD = 1, HSPACK_SPILLED = 2 };

struct hspack_entry {
    uint64_t seq;
    enum hspack_where where;
    int ref;                    /* caller's handle: e.g. an index into its held slots or spill buffers */
};

struct hspack_window {
    uint64_t next;              /* the seq to emit next */
    uint32_t held_max, spill_max;
    uint32_t n_held, n_spilled;
    struct hspack_entry e[HSPACK_MAX_WINDOW];   /* [n_held + n_spilled], unordered */
    uint64_t n_dups, n_in, n_out, n_spills;
    uint32_t max_depth;
    struct seq_shard shard;     /* the seqs this window takes (every seq unless hspack_window_set_shard) */
};

/* Empty window starting at seq next. held_max >= 1; held_max + spill_max <= HSPACK_MAX_WINDOW.
 * Returns 0, or -1 with a sentence. */
int hspack_window_init(struct hspack_window *w, uint32_t held_max, uint32_t spill_max, uint64_t next, char *err,
                       int err_len);
/* Take only the seqs of shard s from now on: next moves up to the first of them. Returns 0, or -1 with a sentence
 * when the window is not empty. */
int hspack_window_set_shard(struct hspack_window *w, const struct seq_shard *s, char *err, int err_len);
/* 1 if seq is a duplicate (below next, or in the window), else 0. Pure. */
int hspack_window_is_dup(const struct hspack_window *w, uint64_t seq);
/* Room for seq as an entry of that kind: 1 or 0. One held place is always kept for seq next, so
 * the seq everybody waits for never finds the window full (held_max 1: no reordering beyond
 * waiting for next). Pure. */
int hspack_window_has_room(const struct hspack_window *w, enum hspack_where where, uint64_t seq);
/* Add seq (not a duplicate, room checked first). Returns 0, or -1 with a sentence (also for a seq outside the
 * window's shard). */
int hspack_window_put(struct hspack_window *w, uint64_t seq, enum hspack_where where, int ref, char *err, int err_len);
/* Count a duplicate the caller dropped. */
void hspack_window_count_dup(struct hspack_window *w);
/* The entry of seq next, or NULL when it has not arrived. Pure. */
const struct hspack_entry *hspack_window_peek(const struct hspack_window *w);
/* Remove the entry of seq next (it was emitted) and advance next (to the shard's next seq). 0, or -1 if absent. */
int hspack_window_take(struct hspack_window *w, struct hspack_entry *out);
/* The HELD entry with the highest seq other than next (the one to spill so the input ring gets a
 * free slot), or NULL. */
const struct hspack_entry *hspack_window_spill_victim(const struct hspack_window *w);
/* Mark a HELD entry SPILLED with a new ref (room for a spilled entry checked first). 0 or -1. */
int hspack_window_mark_spilled(struct hspack_window *w, uint64_t seq, int ref, char *err, int err_len);
/* Entries now (held + spilled), and the lowest / highest seq held (0 when empty). */
uint32_t hspack_window_depth(const struct hspack_window *w);
void hspack_window_range(const struct hspack_window *w, uint64_t *lo, uint64_t *hi);

/* ---------------------------------------------------------------- spill pool */

/* n buffers of item_bytes each (DESC_ALIGN-aligned), in pinned host memory when `pinned` (CUDA
 * builds; cudaMallocHost), else plain host memory. */
struct hspack_spill {
    uint8_t *base;
    uint64_t item_bytes;        /* rounded up to DESC_ALIGN */
    uint32_t n, n_used;
    uint8_t used[HSPACK_MAX_WINDOW];
    uint32_t desc_len[HSPACK_MAX_WINDOW];
    uint8_t desc[HSPACK_MAX_WINDOW][DESC_MAX_BYTES];
    int pinned;
};
/* Allocate (n may be 0: an empty pool). Returns 0, or -1 with a sentence (out of memory). */
int hspack_spill_init(struct hspack_spill *s, uint32_t n, uint64_t item_bytes, int pinned, char *err, int err_len);
/* A free buffer's index, or -1 when the pool is full. */
int hspack_spill_get(struct hspack_spill *s);
void *hspack_spill_ptr(const struct hspack_spill *s, int i);
void hspack_spill_put(struct hspack_spill *s, int i);
void hspack_spill_free(struct hspack_spill *s);

#endif /* STAGES_HSPACK_HSPACK_H */
