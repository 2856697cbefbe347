/*
 * stages/core/shard.h — which batch seqs one part of a run handles (issue 29, topology (c): several hosts).
 *
 * A run of W trainer ranks on H hosts (L = W / H ranks per host, rank r on host r / L) gives batch seq s to rank
 * s % W (dflash-train, stages/train/dp.h). Host h's own chain (pack -> target -> hspack) therefore produces exactly
 * the seqs s with h·L <= s % W < (h+1)·L: a seq_shard of period W and residues [lo, hi). The whole stream is the
 * shard {1, 0, 1}. The packer skips the seqs outside its shard (it still packs them, so every host's batches are
 * the one-host stream's); dflash-hspack's reorder window steps its next seq over them.
 *
 * Pure functions; nothing here allocates or exits.
 */
#ifndef STAGES_CORE_SHARD_H
#define STAGES_CORE_SHARD_H

#include <stdint.h>

struct seq_shard {
    uint64_t period;   /* >= 1 */
    uint64_t lo, hi;   /* a seq belongs to the shard iff lo <= seq % period < hi; lo < hi <= period */
};

/* Every seq: {1, 0, 1}. */
void seq_shard_all(struct seq_shard *s);
/* Host `host` of `hosts` with `ranks` trainer ranks (ranks % hosts == 0, host < hosts): period ranks, residues
 * [host·L, (host+1)·L). Returns 0, or -1 when the arguments break those rules. */
int seq_shard_host(struct seq_shard *s, int ranks, int hosts, int host);
/* 1 if seq belongs to s, else 0. */
int seq_shard_owns(const struct seq_shard *s, uint64_t seq);
/* The smallest seq >= seq that belongs to s (seq itself when it does). */
uint64_t seq_shard_next(const struct seq_shard *s, uint64_t seq);
/* 1 when s is every seq. */
int seq_shard_is_all(const struct seq_shard *s);

#endif /* STAGES_CORE_SHARD_H */
