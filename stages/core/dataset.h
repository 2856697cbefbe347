/*
 * stages/core/dataset.h — the packer's input: tokenized samples from JSONL, or from the binary
 * indexed format that `dflash-pack --index` writes once and then memory-maps.
 *
 * JSONL: one sample per line, {"input_ids": [int, ...], "loss_mask": [0|1, ...]} (the
 * speculators preprocessed row, dflash-reference.md §1.1); other keys are ignored; blank lines are
 * ignored. A bad line (malformed JSON, not an object, a missing key, a non-integer or negative id,
 * an id >= vocab_size when given, a loss_mask value other than 0/1, lengths that differ, an empty
 * sample) is reported as "FILE:LINE: reason" ("FILE:LINE:COL: malformed JSON: ..." for syntax
 * errors); with skip_bad it is counted, passed to the on_bad callback and left out, else loading
 * fails with that sentence. Rows are numbered 0.. in file order among the samples kept; that number
 * is the row id the batches carry.
 *
 * Indexed format (little-endian, version DATASET_INDEX_VERSION), every section 4096-aligned:
 *   header   struct dataset_index_header (DATASET_INDEX_HEADER_BYTES, zero-padded)
 *   offsets  uint64[n_rows+1]   token offset of each row; offsets[0] = 0, offsets[n_rows] = n_tokens
 *   first    uint32[n_rows]     index of the row's first loss_mask = 1 token (= its length if none)
 *   tokens   int32[n_tokens]
 *   loss     uint8[n_tokens]    0/1
 * The header carries a hash of its own bytes and a hash of the four sections. Opening always
 * checks magic, version, header hash, the file size against the sizes in the header, section
 * placement, that offsets are increasing, and every token (0 <= id <= the header's max_token_id)
 * and mask value (0/1) and the `first` table (O(n_tokens), about 1 GB/s): later stages index
 * embeddings with these ids, so these checks never depend on verify; verify adds the data hash.
 * dataset_open sends a file with a damaged magic (a "DFLIDX" prefix, or a NUL byte in its first 16
 * bytes) to the index reader, which reports "bad magic" rather than malformed JSON. A NUL byte in a
 * JSONL line is malformed JSON ("FILE:LINE:COL: ...").
 * While an index is mapped, a SIGBUS on its pages (the file was truncated under a running stage)
 * writes one line naming the file to stderr before the process dies of the signal as before.
 *
 * A struct dataset is read-only once loaded, so several threads may read one. Functions return 0
 * or -1 with one sentence in err (naming the file); none exits.
 */
#ifndef STAGES_CORE_DATASET_H
#define STAGES_CORE_DATASET_H

#include <stddef.h>
#include <stdint.h>

#define DATASET_INDEX_MAGIC "DFLIDX\r\n"      /* 8 bytes; \r\n catches text-mode mangling */
#define DATASET_INDEX_VERSION 1u
#define DATASET_INDEX_HEADER_BYTES 4096u
#define DATASET_INDEX_ALIGN 4096u
#define DATASET_MAX_ROW_TOKENS 0x7fffffffu      /* one row's length must fit in int32 */

/* On-disk header (the first bytes of DATASET_INDEX_HEADER_BYTES). */
struct dataset_index_header {
    char magic[8];             /* DATASET_INDEX_MAGIC */
    uint32_t version;          /* DATASET_INDEX_VERSION */
    uint32_t header_bytes;     /* DATASET_INDEX_HEADER_BYTES */
    uint64_t n_rows;
    uint64_t n_tokens;
    uint64_t off_offsets, off_first, off_tokens, off_loss;   /* byte offsets of the sections */
    uint64_t file_bytes;       /* total file size */
    int32_t max_token_id;      /* largest token id in the file (-1 when empty) */
    uint32_t reserved;         /* 0 */
    uint64_t data_hash;        /* dataset_hash64 chained over offsets, first, tokens, loss */
    uint64_t header_hash;      /* dataset_hash64 of the header bytes before this field */
};

struct dataset {
    uint64_t n_rows;
    uint64_t n_tokens;
    const uint64_t *offsets;   /* [n_rows+1] */
    const uint32_t *first_loss;/* [n_rows] first supervised token of each row (= length if none) */
    const int32_t *tokens;     /* [n_tokens] */
    const uint8_t *loss_mask;  /* [n_tokens] */
    int32_t max_token_id;      /* -1 when empty */
    uint64_t data_hash;        /* identifies the content (used in the packer's cursor fingerprint) */
    char path[1024];           /* the source, for messages */
    int is_index;              /* 1: memory-mapped index; 0: loaded from JSONL into memory */
    /* private */
    void *map_;
    size_t map_bytes_;
    void *own_[4];
};

struct dataset_load_opts {
    int64_t vocab_size;        /* > 0: token ids must be < vocab_size */
    int skip_bad;              /* 1: skip bad samples (counted, reported to on_bad); 0: fail on the first */
    void (*on_bad)(void *ctx, const char *msg);   /* each skipped sample's "FILE:LINE: reason"; may be NULL */
    void *ctx;
};

struct dataset_load_stats {
    uint64_t lines;            /* lines read, blank ones included */
    uint64_t rows;             /* samples kept */
    uint64_t skipped_bad;      /* bad samples skipped (skip_bad) */
};

/* Row length and pointers (no checks: r < n_rows). */
static inline uint64_t dataset_row_len(const struct dataset *ds, uint64_t r) { return ds->offsets[r + 1] - ds->offsets[r]; }

/* Load a JSONL file into memory (the caller's ds is overwritten; free with dataset_free). o may be
 * NULL (no vocab check, fail on the first bad sample); st may be NULL. Blocks on file I/O. */
int dataset_load_jsonl(struct dataset *ds, const char *path, const struct dataset_load_opts *o,
                       struct dataset_load_stats *st, char *err, int err_len);

/* Write ds in the indexed format to path: a temporary file in the same directory, fsync'ed, then
 * renamed over path, so a crash never leaves a half-written index under that name. */
int dataset_write_index(const struct dataset *ds, const char *path, char *err, int err_len);

/* Memory-map an index file read-only and validate it (see the top comment; verify = 1 for the
 * full O(n_tokens) check). A truncated or corrupt file fails with a sentence naming the file and
 * what is wrong. */
int dataset_open_index(struct dataset *ds, const char *path, int verify, char *err, int err_len);

/* Open either kind: an index when the file starts with the index magic, else JSONL (o and st
 * apply to JSONL only; for an index o->vocab_size is checked with dataset_check_vocab). */
int dataset_open(struct dataset *ds, const char *path, const struct dataset_load_opts *o,
                 struct dataset_load_stats *st, int verify, char *err, int err_len);

/* Fail with "FILE: row R: input_ids[i] = X >= vocab size V" if any token is >= vocab_size. O(1)
 * when max_token_id is below it, else scans to name the first offending row. */
int dataset_check_vocab(const struct dataset *ds, int64_t vocab_size, char *err, int err_len);

/* Unmap or free; ds is zeroed. Safe on a zeroed or already freed dataset. */
void dataset_free(struct dataset *ds);

/* 64-bit hash of n bytes, chained through `seed` (not cryptographic: it detects accidental
 * corruption; a change to any one 8-byte word always changes the result). About 5 GB/s. */
uint64_t dataset_hash64(const void *data, size_t n, uint64_t seed);

#endif /* STAGES_CORE_DATASET_H */
