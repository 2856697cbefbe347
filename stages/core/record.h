/*
 * stages/core/record.h — what dflash-record does with each ring item, as a module the tests drive
 * directly: validate an item (descriptor of stages/core/desc.h + payload content), find the
 * sequence numbers a recording already holds (into the relay's seen set, stages/core/relay.h:
 * one seen-set type for every consumer), and write / read one item as a file so a later replayer
 * can feed it back to a ring (design.md §8 "Replace").
 *
 * THE RECORDING FORMAT (one format for dflash-record, dflash-hspack --record, dflash-tap --record;
 * read back by dflash-replay; README "Recordings"). A recording is a directory:
 *   item-<seq %012llu>.safetensors   one item (one batch) per shard, a plain safetensors file
 *       tensors: row_ids I64 [n_docs], input_ids I32 [T], loss_mask BOOL [T] (0/1),
 *       position_ids I32 [T], doc_ids I32 [T], cu_seqlens I32 [n_docs+1]; for hidden and
 *       features also states (BF16|F32: hidden and split [k, T, H], concat [T, k*H]) and
 *       last [T, H]. __metadata__: "dflash.format" = "dflash-rec", "dflash.version" = "2",
 *       "dflash.kind", "dflash.seq", "dflash.model" (record_model_str: "kind=features k=5 H=4096
 *       dtype=bf16 layout=concat layers=1,9,17,25,33"; "kind=batch" for batches),
 *       "dflash.desc" (the item's msgpack descriptor, hex, re-laid out canonically: offsets of
 *       desc_*_layout, so a replayer publishes it as is), "dflash.data_fnv" (FNV-1a 64 of the
 *       whole data area, 16 hex digits).
 *   index.txt   written last, atomically, when the recording is complete (a recorder never
 *       writes it for a stream with gaps): "dflash-rec 2", "model <model string>", then one line
 *       "item <seq> <file> <n_tokens> <payload bytes> <data_fnv hex>" per item in seq order, then
 *       "end <n_items>".
 * A shard is written to a temporary and renamed into place (stages/core/safetensors.h writer:
 * fsync'ed), so a reader sees a complete file or none, even after SIGKILL. Only the arrays are
 * stored, never the slot's alignment padding, so two identical runs write identical files.
 * record_read_into rebuilds the canonical payload (padding zeroed) and checks everything:
 * format, version, kind, seq, descriptor, every tensor's dtype and shape against the
 * descriptor, and the data checksum.
 *
 * Invariants: record_read_file rejects any file whose magic, version, header size, lengths (vs
 * the file size) or checksums do not match, with a sentence saying expected vs found. All
 * functions are thread-safe on distinct objects, never exit, and return 0 / -1 with one sentence
 * in err (or the documented value).
 */
#ifndef STAGES_CORE_RECORD_H
#define STAGES_CORE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "core/desc.h"

struct relay_seen;   /* stages/core/relay.h */

#define RECORD_FORMAT "dflash-rec"
#define RECORD_VERSION 2u
#define RECORD_MODEL_MAX 512          /* bytes of a model string, NUL included */

/* What an item file holds, as read back (not an on-disk struct). */
struct record_header {
    uint32_t version;       /* RECORD_VERSION */
    uint32_t kind;          /* enum desc_kind */
    uint64_t seq;
    uint32_t desc_len;      /* bytes of the canonical msgpack descriptor */
    uint64_t payload_len;   /* canonical payload bytes (= the descriptor's payload_bytes) */
    uint32_t n_tokens;
    uint64_t data_fnv;      /* FNV-1a 64 of the file's data area */
    char model[RECORD_MODEL_MAX];
};

/* What record_check learnt about an item. */
struct record_info {
    enum desc_kind kind;
    uint64_t seq;
    uint32_t n_tokens, n_docs;
    uint64_t payload_bytes;   /* as the descriptor says */
    uint64_t n_checked;       /* state values checked for finiteness (0 for batches or unchecked) */
};

/* FNV-1a 64 of n bytes. */
uint64_t record_fnv(const void *p, size_t n);

/* Validate one item as it sits in a slot: the descriptor (desc_peek_kind, then the kind's decode
 * with payload_cap; want_kind 0 accepts any kind, else it must match), its seq against slot_seq,
 * payload_len >= the descriptor's payload_bytes, and, when payload is a host pointer (non-NULL),
 * the content: the batch arrays (desc_batch_check_payload; vocab_size 0 skips the id bound) and,
 * for hidden/features, that every state value (states and last) is finite. Returns 0 with *info
 * filled, or -1 with a sentence naming the seq and what was expected and found. Pure; O(payload). */
int record_check(const void *desc, size_t desc_len, uint64_t slot_seq, const void *payload, uint64_t payload_len,
                 uint64_t payload_cap, enum desc_kind want_kind, int64_t vocab_size, struct record_info *info,
                 char *err, int err_len);

/* The model identity of a descriptor: "kind=batch", or "kind=<hidden|features> k=.. H=.. dtype=..
 * [layout=..] layers=a,b,..". Returns 0, or -1 with a sentence when the descriptor does not decode. */
int record_model_str(const void *desc, size_t desc_len, char *out, size_t out_len, char *err, int err_len);

/* "<dir>/item-<seq %012llu>.safetensors" into out. Returns 0, or -1 when it does not fit. */
int record_path(char *out, size_t out_len, const char *dir, uint64_t seq);

/* Write one item file atomically (see top) from a slot's descriptor and HOST payload: only the
 * arrays the descriptor names are written. kind must be the descriptor's. durable is accepted for
 * the old signature: every shard is fsync'ed (the safetensors writer does). Blocks on disk I/O.
 * Returns 0, or -1 with a sentence naming the seq, the failing call and the path. */
int record_write_file(const char *dir, uint64_t seq, enum desc_kind kind, const void *desc, uint32_t desc_len,
                      const void *payload, uint64_t payload_len, int durable, char *err, int err_len);

/* Read and fully validate one item file (see top) into caller buffers: the canonical descriptor
 * into desc (capacity desc_cap, >= DESC_MAX_BYTES is always enough) and the canonical payload
 * into payload (host memory, capacity payload_cap; padding between arrays zeroed). h gets what
 * the file holds. want_model non-NULL: the item's model string must equal it. Returns 0, or -1
 * with one sentence naming the file and what was expected and found (truncated, checksum,
 * other model, too large for the buffer); on -1 the buffers hold garbage. */
int record_read_into(const char *path, void *desc, uint32_t desc_cap, void *payload, uint64_t payload_cap,
                     const char *want_model, struct record_header *h, char *err, int err_len);

/* An item read back into its own block: desc and payload point into one malloc'd block (payload
 * aligned to DESC_ALIGN, so desc_batch_arrays works on it). Free with record_item_free. */
struct record_item {
    struct record_header h;
    void *desc;               /* [h.desc_len] */
    void *payload;            /* [h.payload_len] */
    void *block_;             /* internal */
};
/* record_read_into on a block of the right size. Returns 0 with *it filled, or -1. */
int record_read_file(const char *path, struct record_item *it, char *err, int err_len);
void record_item_free(struct record_item *it);

/* One line of index.txt. */
struct record_index_entry {
    uint64_t seq;
    uint32_t n_tokens;
    uint64_t payload_bytes;
    uint64_t data_fnv;
};
/* A recording's index: the model string and the items in seq order. */
struct record_index {
    char model[RECORD_MODEL_MAX];
    uint64_t n_items;
    struct record_index_entry *items;   /* [n_items], seqs strictly increasing */
    uint64_t max_payload_bytes, max_tokens;
};
/* Write dir/index.txt atomically from the item files present: each is opened (header only, no
 * data read), all must have one model string and the seqs must be min..max without a gap, else
 * -1 with a sentence naming the file (a recording with gaps is never marked complete). Returns
 * the number of items, or -1. */
int64_t record_index_write(const char *dir, char *err, int err_len);
/* Parse dir/index.txt (missing: "not a complete recording"). Returns 0 with *ix filled (free
 * with record_index_free), or -1 with a sentence naming the file and line. */
int record_index_read(const char *dir, struct record_index *ix, char *err, int err_len);
void record_index_free(struct record_index *ix);

/* For a restarted recorder: validate every item file in dir (record_read_into, so a truncated or
 * garbage file is never counted as done) and add the seq of each good one to the seen set s
 * (relay.h), in increasing seq order, so they count as distinct seqs and never as duplicates or
 * out of order. *min_seq gets the lowest good seq (untouched when none). A bad file is renamed
 * to "<name>.bad" (kept for inspection, re-recorded from the ring) and counted in *n_bad;
 * temporaries of dead writers are removed; a stale index.txt is removed (the recording is no
 * longer known complete). A missing dir is fine (0 added). Returns the number of good files
 * added, or -1 with a sentence (also when a seq lies beyond the seen set's window).
 * O(bytes on disk). */
int64_t record_scan_dir(const char *dir, struct relay_seen *s, uint64_t *min_seq, uint64_t *n_bad, char *err,
                        int err_len);

#endif /* STAGES_CORE_RECORD_H */
