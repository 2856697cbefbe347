/*
 * stages/record/replay.h — what dflash-replay decides without a ring: which recorded item goes
 * out at each position of a multi-epoch replay, and the descriptor it goes out with.
 *
 * Positions run 0 .. epochs·n - 1; position p is item replay_index(p) of epoch p / n. In order,
 * that is p % n; shuffled, a permutation of the n items per epoch (Fisher-Yates driven by
 * splitmix64 of seed and epoch), so the same seed gives the same order on every run and a
 * restarted replayer continues exactly where it stopped. Output seqs are contiguous from the
 * recording's first seq over every published item, so epoch 0 in order reproduces the recording
 * bit for bit; later epochs get new seqs (a trainer drops seqs it has seen) and epoch + e.
 *
 * Pure functions; thread-safe; nothing exits.
 */
#ifndef STAGES_RECORD_REPLAY_H
#define STAGES_RECORD_REPLAY_H

#include <stddef.h>
#include <stdint.h>

/* Fill perm[0..n) with the order of epoch `epoch`: identity when !shuffle. */
void replay_permutation(uint64_t n, uint64_t seed, uint32_t epoch, int shuffle, uint64_t *perm);

/* Rewrite a canonical descriptor (any kind) in place for its replayed position: batch seq ->
 * seq, epoch -> epoch + add_epoch, plan -> plan (the replaying run's plan hash, 0: none; the
 * recording's own plan belongs to the run that recorded it). *len is updated. Returns 0, or -1
 * with a sentence (does not decode, or does not fit cap). */
int replay_reseq(void *desc, size_t *len, size_t cap, uint64_t seq, uint32_t add_epoch, uint64_t plan, char *err,
                 int err_len);

#endif /* STAGES_RECORD_REPLAY_H */
