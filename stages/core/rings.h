/*
 * stages/core/rings.h — the pipeline's ring names and slot sizes, defined once (issue 13 item 2).
 *
 * Every ring-writing binary answers `--print-ring-spec` the same way: it prints the dflash-shm
 * --ring spec of the ring it produces, `NAME:slots=N,bytes=B,desc=D,dev=host|cuda:N`, sized by
 * rings_payload_bytes for its own flags (budget, captured layers, hidden size, dtype), and exits
 * 0. Pipeline scripts paste that into dflash-shm instead of repeating a size formula in shell.
 */
#ifndef STAGES_CORE_RINGS_H
#define STAGES_CORE_RINGS_H

#include "core/desc.h"
#include "shm/ring.h"

#include <stddef.h>
#include <stdint.h>

#define RING_NAME_BATCHES  "batches"    /* dflash-pack -> dflash-target: packed token batches, host payload */
#define RING_NAME_HIDDEN   "hidden"     /* dflash-target -> dflash-hspack: captured hidden states */
#define RING_NAME_FEATURES "features"   /* dflash-hspack -> dflash-train: training features */

#define RINGS_DEFAULT_SLOTS 4

/* What a slot's payload depends on. batch uses only budget. */
struct rings_geometry {
    uint32_t budget;          /* tokens per item (--tokens) */
    uint32_t n_layers;        /* captured layers k (hidden, features) */
    uint32_t hidden_size;     /* target hidden size H (hidden, features) */
    enum desc_dtype dtype;    /* bf16 on GPU rings, f32 on the CPU path */
};

/* Payload capacity one slot of a `kind` ring needs for g: desc_batch_max_payload_bytes,
 * desc_hidden_max_payload_bytes or desc_features_max_payload_bytes. 0 for an unknown kind. Pure. */
uint64_t rings_payload_bytes(enum desc_kind kind, const struct rings_geometry *g);
/* Descriptor capacity one slot needs: the largest encoded batch descriptor for g->budget (every
 * field at its maximum) for batch, DESC_MAX_BYTES for the others. Pure. */
uint32_t rings_desc_bytes(enum desc_kind kind, const struct rings_geometry *g);

/* Write the spec line "NAME:slots=N,bytes=B,desc=D,dev=host|cuda:N" (no newline) into out.
 * device -1 is host. Returns 0, or -1 with a sentence (bad kind, n_slots 0, too small a buffer). */
int rings_format_spec(char *out, size_t out_len, const char *name, uint32_t n_slots, enum desc_kind kind,
                      const struct rings_geometry *g, int device, char *err, int err_len);

/* The --print-ring-spec / --ring-slots flag pair every ring-writing binary adds to its table. */
#define RINGS_SPEC_FLAGS(print_ptr, slots_ptr) \
    { "print-ring-spec", FLAG_BOOL, (print_ptr), "print the dflash-shm --ring spec of the ring this stage writes " \
      "(sized for these flags) and exit", 1, 0 }, \
    { "ring-slots", FLAG_INT, (slots_ptr), "slots in the spec --print-ring-spec prints", 1, 1 << 16 }

/* Check a descriptor's token counts against the budget this stage planned its memory for:
 * 0, or -1 with "batch seq S: N tokens, this stage planned memory for --tokens M". Pure. */
int rings_check_budget(uint64_t seq, uint32_t n_tokens, uint32_t budget, uint32_t planned, char *err, int err_len);

/* A stage that read a run plan (stages/plan/plan.h) checks each ring it attached: a ring made for
 * another plan (its header's plan hash differs) is refused with one sentence naming both hashes.
 * plan 0 (the stage has no plan) or a ring made without a plan (hash 0) passes. Pure. */
int rings_check_plan(const struct ring *r, uint64_t plan, char *err, int err_len);

#endif /* STAGES_CORE_RINGS_H */
