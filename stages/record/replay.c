/*
 * stages/record/replay.c — replay order and descriptor re-sequencing (replay.h).
 */
#include "kernels/common.h"
#include "record/replay.h"
#include "core/desc.h"
#include "core/err.h"

#include <string.h>

void replay_permutation(uint64_t n, uint64_t seed, uint32_t epoch, int shuffle, uint64_t *perm) {
    for (uint64_t i = 0; i < n; i++) perm[i] = i;
    if (!shuffle || n < 2) return;
    uint64_t s = seed ^ (0xD1B54A32D192ED03ull * ((uint64_t)epoch + 1));
    for (uint64_t i = n - 1; i > 0; i--) {
        uint64_t j = kernels_rng_next(&s) % (i + 1);   /* modulo bias < n / 2^64: irrelevant here */
        uint64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

int replay_reseq(void *desc, size_t *len, size_t cap, uint64_t seq, uint32_t add_epoch, uint64_t plan, char *err,
                 int err_len) {
    char why[768];
    enum desc_kind kind;
    if (desc_peek_kind(desc, *len, &kind, why, sizeof why)) return err_fail(err, err_len, "descriptor rejected: %s", why);
    int rc;
    if (kind == DESC_KIND_BATCH) {
        struct desc_batch b;
        if (desc_batch_decode(desc, *len, 0, &b, why, sizeof why)) return err_fail(err, err_len, "%s", why);
        b.seq = seq;
        b.epoch += add_epoch;
        b.plan = plan;
        rc = desc_batch_encode(&b, desc, cap, len, why, sizeof why);
    } else if (kind == DESC_KIND_HIDDEN) {
        struct desc_hidden h;
        if (desc_hidden_decode(desc, *len, 0, &h, why, sizeof why)) return err_fail(err, err_len, "%s", why);
        h.batch.seq = seq;
        h.batch.epoch += add_epoch;
        h.batch.plan = plan;
        rc = desc_hidden_encode(&h, desc, cap, len, why, sizeof why);
    } else {
        struct desc_features f;
        if (desc_features_decode(desc, *len, 0, &f, why, sizeof why)) return err_fail(err, err_len, "%s", why);
        f.batch.seq = seq;
        f.batch.epoch += add_epoch;
        f.batch.plan = plan;
        rc = desc_features_encode(&f, desc, cap, len, why, sizeof why);
    }
    if (rc) return err_fail(err, err_len, "re-encoding the descriptor for seq %llu: %s", (unsigned long long)seq, why);
    return 0;
}
