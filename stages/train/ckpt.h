/*
 * stages/train/ckpt.h — the trainer's own checkpoints, lossless and exactly resumable
 * (issue 16 item 5), plus the small state file the pipeline reads to rewind the packer.
 *
 * One file per checkpoint, <dir>/step-<N>.ckpt (dir is normally <run>/checkpoints), little-endian:
 *   header   struct ckpt_header, CKPT_HEADER_BYTES, zero-padded (magic, version, sizes, spare
 *            room, and a hash of its own bytes, as llm.c's state files carry a fixed header)
 *   config   config_bytes of JSON text (the run's full configuration, supplied by the caller), 8-aligned
 *   rng      rng_bytes of opaque RNG state from the caller, 8-aligned
 *   tensors  n_tensors records, each struct ckpt_record, then the name (name_bytes, no NUL,
 *            8-aligned), then the data (n elements of the dtype, 8-aligned)
 *   checksum uint64: ckpt_hash of every byte from the end of the header to here
 * The tensors are whatever the caller lists (ckpt_table): the trainable weights and the optimizer
 * state (AdamW exp_avg/exp_avg_sq and step, Muon momentum_buffer and step), fp32/int64 exactly as
 * held in memory, so a resumed run continues bit for bit (speculators' bf16 checkpoints do not).
 *
 * Writing is atomic: <path>.tmp.<pid> is written, fsync'ed, renamed over the final name and the
 * directory fsync'ed; only then are older checkpoints beyond the newest K deleted. A reader
 * therefore sees complete files only, but still checks everything (a disk can be truncated or
 * bit-rotted, a file copied half): magic, version, header size, header hash, the file size against
 * the header, every section's bounds, each record, and the checksum.
 *
 * Resume, as the stage main is meant to use this module (--resume):
 *   1. ckpt_find_newest_valid(<run>/checkpoints, this run's config JSON, ...): corrupt or truncated
 *      checkpoints are skipped with a logged line each; another configuration is refused with a
 *      sentence naming the field (or skipped, if the stage chooses); 0 means start fresh;
 *   2. build the same ckpt_table as when saving (ckpt_table_add_optim + ckpt_table_add_guard + any
 *      of the stage's own) and ckpt_load it with the RNG state buffer;
 *   3. print "resuming from FILE at step S; next sequence number N" on stdout and write
 *      <run>/state/train.json with ckpt_write_state, so the pipeline can rewind the packer to N;
 *   4. drop every incoming batch whose sequence number is < N (already applied).
 * Saving: every N steps and at the end, ckpt_save(<run>/checkpoints, meta, table, keep K), then
 * ckpt_write_state with the new step and next sequence number.
 *
 * Functions return 0 (or a count) or -1 with one sentence in err naming the file; none exits.
 * Not thread-safe with respect to one directory (one trainer writes it).
 */
#ifndef STAGES_TRAIN_CKPT_H
#define STAGES_TRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "train/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_MAGIC "DFLCKPT\n"        /* 8 bytes */
#define CKPT_VERSION 1u
#define CKPT_HEADER_BYTES 1024u
#define CKPT_NAME_MAX 512             /* longest tensor name */

enum ckpt_dtype { CKPT_F32 = 1, CKPT_I64 = 2, CKPT_U8 = 3 };

/* On-disk header (the first bytes of CKPT_HEADER_BYTES; the rest is zero: room for new fields). */
struct ckpt_header {
    char magic[8];            /* CKPT_MAGIC */
    uint32_t version;         /* CKPT_VERSION */
    uint32_t header_bytes;    /* CKPT_HEADER_BYTES */
    uint64_t file_bytes;      /* total size, checksum included */
    int64_t step;             /* optimizer steps done (the N of step-N) */
    int64_t next_seq;         /* the next batch sequence number the run needs */
    int64_t sched_pos;        /* schedule position (the s of sched_factor for the next step) */
    uint64_t config_bytes, rng_bytes;
    uint32_t n_tensors;
    uint32_t reserved0;
    uint64_t off_config, off_rng, off_tensors, off_checksum;
    uint64_t reserved[16];    /* 0 */
    uint64_t header_hash;     /* ckpt_hash of the header bytes before this field */
};

/* Before each tensor's name and data. */
struct ckpt_record {
    uint32_t name_bytes;      /* 1..CKPT_NAME_MAX */
    uint32_t dtype;           /* enum ckpt_dtype */
    uint64_t n;               /* elements */
};

struct ckpt_tensor {
    const char *name;
    int dtype;                /* enum ckpt_dtype */
    int64_t n;                /* elements */
    void *data;               /* (n) read when writing, filled when loading */
};

/* A growable list of tensors; names are copied (owned by the table). */
struct ckpt_table {
    int n, cap;
    struct ckpt_tensor *t;
};

/* What a checkpoint says about itself (filled by ckpt_verify / ckpt_load; free with ckpt_info_free). */
struct ckpt_info {
    int64_t step, next_seq, sched_pos;
    char *config_json;        /* malloc'd, NUL-terminated */
    size_t rng_bytes;
    uint32_t n_tensors;
    uint64_t file_bytes;
};

/* What the caller saves besides tensors. */
struct ckpt_meta {
    int64_t step, next_seq, sched_pos;
    const char *config_json;  /* the full config as JSON text (an object) */
    const void *rng;          /* rng_bytes of opaque RNG state (may be NULL with 0 bytes) */
    size_t rng_bytes;
};

/* Word-wise FNV-1a 64 over 8-byte little-endian words (the tail zero-padded) with the length mixed
 * in at the end; any change to one word changes the result. Streaming: init, update, final. */
struct ckpt_hasher { uint64_t h, len; uint8_t buf[8]; int nbuf; };
void ckpt_hash_init(struct ckpt_hasher *s);
void ckpt_hash_update(struct ckpt_hasher *s, const void *data, size_t n);
uint64_t ckpt_hash_final(const struct ckpt_hasher *s);
uint64_t ckpt_hash(const void *data, size_t n);

/* ---------------------------------------------------------------- tables */

void ckpt_table_init(struct ckpt_table *tab);
void ckpt_table_free(struct ckpt_table *tab);
/* Append one tensor (name copied). Fails on a duplicate or over-long name, or out of memory. */
int ckpt_table_add(struct ckpt_table *tab, const char *name, int dtype, int64_t n, void *data,
                   char *err, int err_len);
/* Append everything an optimizer needs to resume exactly: every trainable weight under its own
 * name, "optim.adamw.exp_avg.<name>" / "optim.adamw.exp_avg_sq.<name>" for AdamW tensors,
 * "optim.muon.momentum_buffer.<name>" for Muon ones, and the int64 counters "optim.adamw.step"
 * and "optim.muon.step". The pointers are o's own; o must outlive the table. */
int ckpt_table_add_optim(struct ckpt_table *tab, struct optim *o, char *err, int err_len);
/* Append the non-finite guard's counters (its streak included, so a resumed run stops at the same
 * step an uninterrupted one would) as the bytes of the struct, "guard.state" (u8). */
int ckpt_table_add_guard(struct ckpt_table *tab, struct optim_guard *g, char *err, int err_len);

/* ---------------------------------------------------------------- files */

/* Write one checkpoint atomically to path (see the top comment). Blocks on file I/O and fsync.
 * On failure the temporary file is removed and nothing under path changes. */
int ckpt_write(const char *path, const struct ckpt_meta *meta, const struct ckpt_tensor *t, int n,
               char *err, int err_len);

/* Check a file completely (header, sizes, records, checksum: reads the whole file) and fill info.
 * Errors are one sentence naming the file and what is wrong ("truncated: 1234 bytes, the header
 * says 5678", "checksum mismatch", "bad magic"...). */
int ckpt_verify(const char *path, struct ckpt_info *info, char *err, int err_len);
void ckpt_info_free(struct ckpt_info *info);

/* Verify the file, then check that its records are exactly the table's (same names, dtypes and
 * element counts, none missing or extra; rng_bytes equal to rng_cap), and only then copy the data
 * into the table's buffers and the RNG state into rng. So on any bad file nothing of the caller's is
 * overwritten (only a read error in the middle of the copy, after every check passed, can leave the
 * buffers partly loaded). info may be NULL. */
int ckpt_load(const char *path, const struct ckpt_tensor *t, int n, void *rng, size_t rng_cap,
              struct ckpt_info *info, char *err, int err_len);

/* Compare two JSON configs key by key (objects recursively, dotted paths; arrays and scalars by
 * value, 1 and 1.0 equal). Keys listed in ignore (NULL-terminated dotted paths, may be NULL) are
 * skipped. Returns 0 when equal, else -1 with "field F: the checkpoint has X, this run has Y" (or
 * "... is missing in ...") for the first differing field in the run config's key order, then the
 * checkpoint's extra keys. A string that is not a JSON object is an error too. */
int ckpt_config_diff(const char *ckpt_json, const char *run_json, const char *const *ignore,
                     char *err, int err_len);

/* ---------------------------------------------------------------- a checkpoint directory */

/* <dir>/step-<step>.ckpt into out. Returns -1 if it does not fit. */
int ckpt_path(char *out, size_t out_len, const char *dir, int64_t step);

/* Steps of the step-<N>.ckpt files (N in decimal without leading zeros, as ckpt_path writes it) in dir, descending, into a malloc'd array (*steps, caller frees;
 * NULL when none). Other names (temporaries included) are ignored. A missing dir counts as empty.
 * Returns the count or -1. */
int ckpt_list(const char *dir, int64_t **steps, char *err, int err_len);

/* Write <dir>/step-<meta->step>.ckpt atomically (dir created if needed); then, the new file being
 * durable, delete all but the `keep` newest checkpoints (keep <= 0: keep all) and stale
 * temporaries (*.tmp.*) in dir, and fsync dir. out_path (may be NULL) gets the file's path. */
int ckpt_save(const char *dir, const struct ckpt_meta *meta, const struct ckpt_tensor *t, int n,
              int keep, char *out_path, size_t out_len, char *err, int err_len);

/* Bytes of a checkpoint of these n tensors, the header and records included (the config and RNG state not: a
 * lower bound by their few KB). */
uint64_t ckpt_tensor_bytes(const struct ckpt_tensor *t, int n);
/* 0 when path's filesystem (path, or its nearest existing parent) has at least need bytes free for this user
 * (statvfs f_bavail); else -1 with a sentence naming path, what needs it, the sizes and what to change. A run
 * refuses at start-up what its first checkpoint would fail on after hours (RESULTS.md run 54: ENOSPC at the
 * 27B drafter's final checkpoint). */
int ckpt_check_space(const char *path, uint64_t need, const char *what, char *err, int err_len);

/* Log callback: one line, without newline. */
typedef void (*ckpt_log_fn)(void *ctx, const char *line);

/* Find the newest checkpoint in dir that ckpt_verify accepts; each newer one it rejects is logged
 * through log as "skipping checkpoint FILE: reason". The one found is then compared with run_config
 * (ckpt_config_diff, ignore): if it differs and skip_other_config is 0, fail with "FILE was
 * written with another configuration: field ..." (resume refused; nothing changed); with
 * skip_other_config 1 it is logged and skipped like a corrupt one. Returns 1 with out_path and
 * info filled, 0 when there is none (a fresh start), -1 on an error. */
int ckpt_find_newest_valid(const char *dir, const char *run_config, const char *const *ignore,
                           int skip_other_config, ckpt_log_fn log, void *log_ctx,
                           char *out_path, size_t out_len, struct ckpt_info *info, char *err, int err_len);

/* The pipeline's resume state: write {"step": S, "next_seq": N, "checkpoint": "PATH"} atomically to
 * path (normally <run>/state/train.json; its directory must exist). ckpt_path may be NULL. */
int ckpt_write_state(const char *path, int64_t step, int64_t next_seq, const char *ckpt_file,
                     char *err, int err_len);
/* Read it back (ckpt_file may be NULL; else filled, size out_len). A missing or malformed file or a
 * missing/negative field is an error naming the file and the field. */
int ckpt_read_state(const char *path, int64_t *step, int64_t *next_seq, char *ckpt_file, size_t out_len,
                    char *err, int err_len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_TRAIN_CKPT_H */
