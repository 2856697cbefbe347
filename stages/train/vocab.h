/*
 * stages/train/vocab.h — the draft vocabulary (dflash-reference.md §1.6): counting supervised
 * tokens of a dataset, building t2d/d2t from the counts, and reading/writing them as the .npy
 * files speculators writes (np.save of d2t int64 [V_d] and t2d bool [V_t]).
 *
 * Build rule (speculators vocab_mapping.py): sort token ids by (count descending, id ascending),
 * take the top V_d; if fewer distinct tokens were seen, pad with the smallest ids not yet chosen;
 * sort the chosen ids ascending; t2d[id] = 1 for chosen ids; d2t[d] = chosen[d] - d, so that
 * target_id = d + d2t[d]. Sorting ALL V_t ids by (count desc, id asc) gives exactly that padding,
 * because the unseen ids (count 0) come last in ascending id order; vocab_build does that.
 *
 * .npy: format version 1.0, header "{'descr': '<i8', 'fortran_order': False, 'shape': (N,), }"
 * plus numpy's 21-digit growth room and space padding to a 64-byte boundary ending in '\n' — the
 * bytes numpy >= 1.24 writes. The reader accepts versions 1.0-3.0, any padding, and checks magic,
 * descr, fortran_order, a 1-D shape and the data size against the file size.
 *
 * Functions return 0 or -1 with one sentence in err naming the file; none exits. Thread-safe
 * (no shared state).
 */
#ifndef STAGES_TRAIN_VOCAB_H
#define STAGES_TRAIN_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "core/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

/* counts (V_t) += occurrences of each token id at loss_mask = 1 positions of every row (the
 * supervised tokens, like speculators' token_freq). Fails naming the row on an id >= V_t. */
int vocab_count_dataset(const struct dataset *ds, int64_t V_t, uint64_t *counts, char *err, int err_len);

/* Build the mapping from counts (V_t) by the rule above: t2d (V_t) 0/1, d2t (V_d). 1 <= V_d <= V_t.
 * The result is checked with kernels/lmhead_loss.h lmhead_vocab_check. Allocates O(V_t). */
int vocab_build(const uint64_t *counts, int64_t V_t, int64_t V_d, uint8_t *t2d, int64_t *d2t,
                char *err, int err_len);

/* Check a mapping's sizes and consistency: t2d length V_t, popcount V_d, d2t length V_d and
 * d + d2t[d] the d-th set id (lmhead_vocab_check). */
int vocab_check(const uint8_t *t2d, int64_t V_t, const int64_t *d2t, int64_t V_d, char *err, int err_len);

/* Encode a 1-D npy header for descr ("<i8" or "|b1") and n elements into out (at least 256
 * bytes); returns its length (a multiple of 64) or -1. Exposed for tests. */
int vocab_npy_header(char *out, size_t out_len, const char *descr, int64_t n);

/* Write a 1-D int64 / bool array as .npy, atomically (fs_write_atomic). */
int vocab_npy_write_i64(const char *path, const int64_t *x, int64_t n, char *err, int err_len);
int vocab_npy_write_bool(const char *path, const uint8_t *x, int64_t n, char *err, int err_len);
/* Read a 1-D int64 (<i8) / bool (|b1) .npy into a malloc'd array (*out, caller frees; *n its
 * length). Any other dtype or shape, a bad header or a size mismatch is an error naming the file.
 * Bool values other than 0/1 are refused. */
int vocab_npy_read_i64(const char *path, int64_t **out, int64_t *n, char *err, int err_len);
int vocab_npy_read_bool(const char *path, uint8_t **out, int64_t *n, char *err, int err_len);

/* Read <dir>/t2d.npy and <dir>/d2t.npy and check them against V_t (and V_d when > 0; else V_d is
 * taken from d2t). On success *t2d (V_t) and *d2t (*V_d) are malloc'd (caller frees). */
int vocab_load(const char *dir, int64_t V_t, int64_t *V_d, uint8_t **t2d, int64_t **d2t,
               char *err, int err_len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_TRAIN_VOCAB_H */
