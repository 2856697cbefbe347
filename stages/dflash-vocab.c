/*
 * stages/dflash-vocab.c — build the draft vocabulary of a dataset (dflash-reference.md §1.6):
 * count the supervised tokens (loss_mask = 1) of every row, keep the V_d most frequent ids
 * (ties by smaller id, padded with the smallest unseen ids), and write into --out:
 *   t2d.npy          bool  [V_t]  True for the kept ids          (as speculators' np.save)
 *   d2t.npy          int64 [V_d]  target_id = d + d2t[d]          (as speculators' np.save)
 *   token_freq.npy   int64 [V_t]  the supervised-token counts (speculators keeps a torch-pickled
 *                                 dict token_freq.pt; we write the dense counts as .npy instead)
 * Each file is written atomically. One summary line goes to stdout. Not a pipeline stage: it runs
 * once before training, on a JSONL file or on the index dflash-pack --index wrote.
 */
#include "core/check.h"
#include "core/dataset.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "train/vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_bad(void *ctx, const char *msg) {
    (void)ctx;
    log_warn("skipping bad sample: %s", msg);
}

int main(int argc, char **argv) {
    log_init("dflash-vocab");
    const char *data = NULL, *out = NULL;
    int64_t V_t = 0, V_d = 0;
    int skip_bad = 0;
    struct flag table[] = {
        {"data", FLAG_STRING, &data, "dataset: JSONL ({input_ids, loss_mask} rows) or a dflash-pack index", 1, 0},
        {"vocab-size", FLAG_INT64, &V_t, "target vocabulary size V_t", 1, (int64_t)1 << 31},
        {"draft-vocab-size", FLAG_INT64, &V_d, "draft vocabulary size V_d (<= V_t)", 1, (int64_t)1 << 31},
        {"out", FLAG_STRING, &out, "directory for t2d.npy, d2t.npy, token_freq.npy (created)", 1, 0},
        {"skip-bad", FLAG_BOOL, &skip_bad, "skip malformed JSONL samples (logged) instead of failing", 1, 0},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--data FILE --vocab-size V --draft-vocab-size VD --out DIR",
                        "Build the draft vocabulary (t2d/d2t) from a dataset's supervised-token counts.", NULL, 0);
    if (!data) DIE("--data is required");
    if (!out) DIE("--out is required");
    if (V_t < 1) DIE("--vocab-size is required (the target's vocab_size)");
    if (V_d < 1) DIE("--draft-vocab-size is required");
    if (V_d > V_t) DIE("--draft-vocab-size %lld exceeds --vocab-size %lld", (long long)V_d, (long long)V_t);

    char err[1024];
    struct dataset ds;
    memset(&ds, 0, sizeof ds);
    struct dataset_load_opts o = { V_t, skip_bad, on_bad, NULL };
    struct dataset_load_stats st;
    memset(&st, 0, sizeof st);
    LIB_CHECK(dataset_open(&ds, data, &o, &st, 1, err, sizeof err), err);
    uint64_t *counts = calloc((size_t)V_t, sizeof *counts);
    uint8_t *t2d = malloc((size_t)V_t);
    int64_t *d2t = malloc((size_t)V_d * sizeof *d2t);
    ALLOC_CHECK(counts);
    ALLOC_CHECK(t2d);
    ALLOC_CHECK(d2t);
    LIB_CHECK(vocab_count_dataset(&ds, V_t, counts, err, sizeof err), err);
    LIB_CHECK(vocab_build(counts, V_t, V_d, t2d, d2t, err, sizeof err), err);

    uint64_t total = 0, kept = 0, distinct = 0;
    for (int64_t i = 0; i < V_t; i++) {
        total += counts[i];
        distinct += counts[i] > 0;
        if (t2d[i]) kept += counts[i];
    }
    LIB_CHECK(fs_mkdir_p(out, err, sizeof err), err);
    char path[4096];
    int64_t *freq = malloc((size_t)V_t * sizeof *freq);
    ALLOC_CHECK(freq);
    for (int64_t i = 0; i < V_t; i++) freq[i] = (int64_t)counts[i];
    if (snprintf(path, sizeof path, "%s/token_freq.npy", out) >= (int)sizeof path) DIE("--out path too long: %s", out);
    LIB_CHECK(vocab_npy_write_i64(path, freq, V_t, err, sizeof err), err);
    snprintf(path, sizeof path, "%s/d2t.npy", out);
    LIB_CHECK(vocab_npy_write_i64(path, d2t, V_d, err, sizeof err), err);
    snprintf(path, sizeof path, "%s/t2d.npy", out);   /* last: a directory with t2d.npy is complete */
    LIB_CHECK(vocab_npy_write_bool(path, t2d, V_t, err, sizeof err), err);
    printf("dflash-vocab: %llu rows (%llu skipped), %llu supervised tokens, %llu distinct ids; kept %lld of %lld ids "
           "covering %.2f%% of supervised tokens%s; wrote %s/{t2d,d2t,token_freq}.npy\n",
           (unsigned long long)ds.n_rows, (unsigned long long)st.skipped_bad, (unsigned long long)total,
           (unsigned long long)distinct, (long long)V_d, (long long)V_t, total ? 100.0 * (double)kept / (double)total : 0.0,
           distinct < (uint64_t)V_d ? " (padded with the smallest unseen ids)" : "", out);
    free(freq); free(counts); free(t2d); free(d2t);
    dataset_free(&ds);
    return 0;
}
