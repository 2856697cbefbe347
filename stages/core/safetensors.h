/*
 * stages/core/safetensors.h — Hugging Face safetensors files: a validating mmap reader, a
 * streaming writer, and sharded checkpoints (model.safetensors.index.json) behind one lookup.
 *
 * File format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
 * N, N bytes of JSON {"__metadata__": {str: str}, "<name>": {"dtype": "BF16", "shape": [..],
 * "data_offsets": [begin, end]}, ...}, then the data area; offsets are relative to its start.
 *
 * Reader invariants (st_open checks all of them, each failure is one sentence naming the file
 * and, where there is one, the tensor): the header length fits in the file; the header is a JSON
 * object without duplicate keys; every name is non-empty printable ASCII; dtype is one of
 * BF16 F16 F32 I64 I32 BOOL; shape is at most ST_MAX_DIMS non-negative integers; end - begin ==
 * numel * element size; [begin, end) lies inside the data area; no two tensors overlap. Holes in
 * the data area are tolerated (the writer never makes any). Tensor data stays in a read-only
 * MAP_PRIVATE mapping of the whole file, so opening a 16 GB checkpoint costs no copy; pointers in
 * struct st_tensor are valid until st_close. Data pointers are NOT guaranteed to be aligned to the
 * element size (files from other writers): read them with memcpy or through weights.h.
 *
 * Writer invariants: tensors are declared first, then their bytes are streamed in layout order
 * (declaration order, stably sorted by element size, largest first, so every tensor is aligned to
 * its element size when the header is padded to 8 bytes); the file is written to <path>.tmp.<pid>
 * and renamed over <path> only when every declared byte arrived, so a reader never sees a torn file.
 *
 * Nothing here exits; every function that can fail returns 0/-1 (or NULL) with a sentence in the
 * caller's err buffer. Objects are not thread-safe; an opened st_file / hf_weights is read-only and
 * may be shared by threads once open returned.
 */
#ifndef STAGES_MODEL_SAFETENSORS_H
#define STAGES_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER_BYTES 100000000u   /* the reference implementation's limit */

enum st_dtype { ST_BF16 = 0, ST_F16, ST_F32, ST_I64, ST_I32, ST_BOOL, ST_N_DTYPES };

/* "BF16", "F16", ... (the header spelling); "?" for an invalid value. */
const char *st_dtype_name(enum st_dtype d);
/* Bytes per element (BOOL is 1). 0 for an invalid value. */
size_t st_dtype_size(enum st_dtype d);
/* Parse a header spelling ("BF16"); returns 0, or -1 for anything else. */
int st_dtype_parse(const char *s, enum st_dtype *out);

/* One tensor of an opened file. All pointers are owned by the st_file. */
struct st_tensor {
    const char *name;
    const char *path;             /* the file it lives in (for error messages) */
    enum st_dtype dtype;
    int ndim;                     /* 0 for a scalar */
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;                /* product of shape (1 for a scalar) */
    size_t nbytes;                /* numel * st_dtype_size(dtype) */
    uint64_t offset;              /* absolute byte offset of the data in the file */
    const void *data;             /* into the read-only mapping; possibly unaligned */
};

/* An opened safetensors file. Treat as read-only; tensors are sorted by name. */
struct st_file {
    char *path;
    void *map;                    /* whole-file mapping (NULL for an empty mapping) */
    size_t file_bytes;
    uint64_t header_bytes;        /* N */
    int n_tensors;
    struct st_tensor *tensors;    /* [n_tensors], sorted by name */
    int n_metadata;
    char **metadata;              /* [2*n_metadata]: key, value, key, value, ... */
};

/* Open, map and validate `path`. On success fills *f (free with st_close) and returns 0; on
 * failure returns -1, leaves *f closed (safe to st_close) and writes one sentence naming the file
 * and tensor to err. Does not block beyond the open/mmap syscalls. */
int st_open(struct st_file *f, const char *path, char *err, int err_len);
/* Unmap and free. Idempotent; pointers into the file become invalid. */
void st_close(struct st_file *f);
/* The tensor called `name`, or NULL (binary search). */
const struct st_tensor *st_find(const struct st_file *f, const char *name);
/* The __metadata__ value for key, or NULL. */
const char *st_metadata(const struct st_file *f, const char *key);

/* "[4096, 128]" into buf (always NUL-terminated); returns buf. For error messages. */
char *st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* ---------------------------------------------------------------- writer */

struct st_writer;

/* Start a new file at `path` (written to <path>.tmp.<pid> until st_writer_finish). Metadata
 * {"format": "pt"} is always written (transformers requires it). Returns NULL with a sentence in
 * err on failure. */
struct st_writer *st_writer_create(const char *path, char *err, int err_len);
/* Add a __metadata__ string pair (before st_writer_begin). */
int st_writer_metadata(struct st_writer *w, const char *key, const char *value, char *err, int err_len);
/* Declare a tensor (before st_writer_begin). Names must be unique and valid; shape entries >= 0. */
int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dtype, int ndim,
                  const int64_t *shape, char *err, int err_len);
/* Fix the layout and write the header. After it, st_writer_order() tells which tensor's bytes come
 * next. Returns 0/-1. */
int st_writer_begin(struct st_writer *w, char *err, int err_len);
/* Number of declared tensors, and the k-th in layout order (its declaration index and bytes). */
int st_writer_count(const struct st_writer *w);
int st_writer_order(const struct st_writer *w, int k, const char **name, size_t *nbytes);
/* Append `len` bytes to the data area, in layout order; one tensor may come in several calls and
 * one call may span tensors. Blocks on write(2). Fails if more bytes arrive than were declared. */
int st_writer_write(struct st_writer *w, const void *data, size_t len, char *err, int err_len);
/* Check every declared byte arrived, fsync, rename over the final path, fsync the directory.
 * Returns 0/-1. The writer must still be freed. */
int st_writer_finish(struct st_writer *w, char *err, int err_len);
/* Free; if finish did not succeed the temporary file is removed. NULL is fine. */
void st_writer_free(struct st_writer *w);

/* A tensor in memory to write with st_write_file. */
struct st_write_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data;             /* numel * element size bytes */
};
/* Write n tensors from memory to `path` in one go (create/add/begin/write/finish). 0/-1. */
int st_write_file(const char *path, int n, const struct st_write_tensor *t, char *err, int err_len);

/* ---------------------------------------------------------------- checkpoint directories */

/* Every tensor of a Hugging Face checkpoint directory: model.safetensors, or the shards named
 * by model.safetensors.index.json. Read-only after open. */
struct hf_weights {
    char *dir;
    char *index_path;             /* NULL for a single model.safetensors */
    int n_files;
    struct st_file *files;        /* [n_files] */
    int n_tensors;
    const struct st_tensor **tensors;  /* [n_tensors], sorted by name; point into files */
};

/* Open `path`: a checkpoint directory (model.safetensors if present, else the shards of
 * model.safetensors.index.json: the order transformers' from_pretrained uses) or a single
 * .safetensors file. For an index: every shard it names is opened
 * and validated; a missing shard, a shard name with '/' in it, or a tensor the index places in a
 * shard that does not hold it fails with a sentence naming the file and tensor. Tensors present
 * in a shard but not listed in the index are ignored (as transformers does). Returns 0/-1; on
 * failure *w is left closed. */
int hf_weights_open(struct hf_weights *w, const char *path, char *err, int err_len);
void hf_weights_close(struct hf_weights *w);
/* The tensor called `name`, or NULL when the checkpoint has none (binary search). */
const struct st_tensor *hf_weights_find(const struct hf_weights *w, const char *name);
/* Like hf_weights_find, but a missing tensor is an error: "<index or file>: no tensor 'name'". */
int hf_weights_get(const struct hf_weights *w, const char *name, const struct st_tensor **out,
                   char *err, int err_len);

#ifdef __cplusplus
}
#endif

#endif /* STAGES_MODEL_SAFETENSORS_H */
