/*
 * stages/core/record.h — what dflash-record does with each ring item, as a module the tests drive
 * directly: validate an item (descriptor of stages/core/desc.h + payload content), track the
 * sequence numbers seen (duplicates, gaps, order), and write / read one item as a file so a later
 * replayer can feed it back to a ring (design.md §8 "Replace").
 *
 * Item file format (one file per seq, `<dir>/item-<seq, 12 digits>.rec`, little-endian):
 *   struct record_header (RECORD_HEADER_BYTES = 64 bytes: magic "DFRECRD\n", version, the
 *   descriptor's kind, seq, descriptor and payload lengths, FNV-1a 64 checksums of both),
 *   then desc_len bytes of the msgpack descriptor exactly as it travelled in the slot, then
 *   payload_len payload bytes exactly as they were in the slot (so the descriptor's offsets stay
 *   valid: a replayer copies the payload into a slot and publishes the descriptor unchanged).
 * A file is written to `<dir>/.item-<seq>.tmp.<pid>` and renamed into place, so a reader (or a
 * restarted recorder scanning the directory) sees a complete file or none, even after SIGKILL;
 * with `durable` the file is fsync'ed before the rename and the directory after it.
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

#define RECORD_MAGIC "DFRECRD\n"
#define RECORD_VERSION 1u
#define RECORD_HEADER_BYTES 64u
#define RECORD_MAX_SEQ (1ull << 32)   /* seqs the tracker accepts (its bitmap grows with the highest seq: 512 MiB at most) */

/* The on-disk header (exactly RECORD_HEADER_BYTES; reserved bytes are zero). */
struct record_header {
    char magic[8];          /* RECORD_MAGIC, no NUL */
    uint32_t version;       /* RECORD_VERSION */
    uint32_t kind;          /* enum desc_kind of the descriptor */
    uint64_t seq;           /* the slot's sequence number (= the descriptor's seq) */
    uint32_t desc_len;      /* bytes of msgpack descriptor after the header */
    uint32_t header_bytes;  /* RECORD_HEADER_BYTES */
    uint64_t payload_len;   /* payload bytes after the descriptor */
    uint64_t desc_fnv;      /* FNV-1a 64 of the descriptor bytes */
    uint64_t payload_fnv;   /* FNV-1a 64 of the payload bytes */
    uint8_t reserved[8];
};

/* What record_check learnt about an item. */
struct record_info {
    enum desc_kind kind;
    uint64_t seq;
    uint32_t n_tokens, n_docs;
    uint64_t payload_bytes;   /* as the descriptor says */
    uint64_t n_checked;       /* state values checked for finiteness (0 for batches or unchecked) */
};

/* An item read back from a file: desc and payload point into one malloc'd block (payload aligned
 * to DESC_ALIGN, so desc_batch_arrays works on it). Free with record_item_free. */
struct record_item {
    struct record_header h;
    void *desc;               /* [h.desc_len] */
    void *payload;            /* [h.payload_len] */
    void *block_;             /* internal */
};

/* The sequence numbers a consumer has seen: a growable bitmap (seqs < RECORD_MAX_SEQ). */
struct record_seqs {
    uint64_t *bits;
    uint64_t n_words;
    uint64_t n_distinct;      /* distinct seqs added */
    uint64_t n_dups;          /* adds of a seq already present */
    uint64_t n_out_of_order;  /* new seqs lower than the highest seen before them */
    uint64_t min, max;        /* valid when n_distinct > 0 */
    uint64_t n_added;         /* new seqs added by record_seqs_add (not by record_scan_dir) */
    uint64_t first, last;     /* first and last seq new to record_seqs_add, in arrival order (valid when n_added > 0) */
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

/* "<dir>/item-<seq %012llu>.rec" into out. Returns 0, or -1 when it does not fit. */
int record_path(char *out, size_t out_len, const char *dir, uint64_t seq);

/* Write one item file atomically (see top). payload is a host pointer. Blocks on disk I/O only.
 * Returns 0, or -1 with a sentence naming the failing syscall and path. */
int record_write_file(const char *dir, uint64_t seq, enum desc_kind kind, const void *desc, uint32_t desc_len,
                      const void *payload, uint64_t payload_len, int durable, char *err, int err_len);

/* Read and fully validate one item file (header, sizes, checksums, and that the descriptor's kind
 * equals the header's). Returns 0 with *it filled (caller frees with record_item_free), or -1. */
int record_read_file(const char *path, struct record_item *it, char *err, int err_len);
void record_item_free(struct record_item *it);

/* Zero a tracker. */
void record_seqs_init(struct record_seqs *s);
/* Add a seq: 1 when new, 0 when a duplicate (counted), -1 with a sentence when seq >=
 * RECORD_MAX_SEQ or memory runs out. */
int record_seqs_add(struct record_seqs *s, uint64_t seq, char *err, int err_len);
int record_seqs_has(const struct record_seqs *s, uint64_t seq);
/* Seqs missing between min and max (0 when nothing was added). */
uint64_t record_seqs_gaps(const struct record_seqs *s);
/* Lowest seq >= from that has not been added. */
uint64_t record_seqs_next_missing(const struct record_seqs *s, uint64_t from);
void record_seqs_free(struct record_seqs *s);

/* Add the seq of every complete item file in dir (names item-<digits>.rec; temporaries are
 * removed) to s, without counting them as duplicates of each other. For a restarted recorder.
 * A missing dir is fine (0 added). Returns the number of files added, or -1 with a sentence. */
int64_t record_scan_dir(const char *dir, struct record_seqs *s, char *err, int err_len);

#endif /* STAGES_CORE_RECORD_H */
