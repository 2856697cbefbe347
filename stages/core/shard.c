/*
 * stages/core/shard.c — seq shards of a several-host run (shard.h).
 */
#include "core/shard.h"

void seq_shard_all(struct seq_shard *s) { *s = (struct seq_shard){1, 0, 1}; }

int seq_shard_host(struct seq_shard *s, int ranks, int hosts, int host) {
    if (ranks < 1 || hosts < 1 || ranks % hosts || host < 0 || host >= hosts) return -1;
    uint64_t per = (uint64_t)(ranks / hosts);
    *s = (struct seq_shard){(uint64_t)ranks, (uint64_t)host * per, (uint64_t)(host + 1) * per};
    return 0;
}

int seq_shard_owns(const struct seq_shard *s, uint64_t seq) {
    uint64_t m = seq % s->period;
    return m >= s->lo && m < s->hi;
}

uint64_t seq_shard_next(const struct seq_shard *s, uint64_t seq) {
    uint64_t m = seq % s->period;
    if (m >= s->lo && m < s->hi) return seq;
    /* below lo: forward to lo of this period; at or above hi: to lo of the next period */
    return m < s->lo ? seq + (s->lo - m) : seq + (s->period - m) + s->lo;
}

int seq_shard_is_all(const struct seq_shard *s) { return s->lo == 0 && s->hi == s->period; }
