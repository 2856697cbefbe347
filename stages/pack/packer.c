/*
 * stages/pack/packer.c — the packing policy (packer.h): eligibility, per-epoch plans (shuffle,
 * windowed first-fit decreasing), sharding, seeking, and filling one batch payload.
 *
 * First-fit uses a max-tree over the window's open batches (leaf = remaining capacity), so
 * placing a row is O(log window) and the leftmost batch with room is found by descending the
 * tree. The plan of one epoch (row order + batch boundaries) is kept as a cache: anything that
 * needs another epoch replans, and packer_next replans the cursor's epoch when needed.
 */
#include "kernels/common.h"
#include "pack/packer.h"
#include "core/err.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PACKER_POLICY_VERSION 1u   /* bump when the plan for given inputs changes: it voids old cursors */

static uint32_t pow2_at_least(uint32_t x) {
    uint32_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

/* ---------------------------------------------------------------- init / free */

void packer_free(struct packer *p) {
    free(p->eff_len);
    free(p->eligible);
    free(p->plan_rows);
    free(p->plan_start);
    free(p->perm);
    free(p->sort_buf);
    free(p->bin_fill);
    free(p->bin_next);
    free(p->bin_first);
    free(p->bin_last);
    free(p->epoch_count);
    free(p->val_eligible);
    free(p->val_rows);
    free(p->val_start);
    memset(p, 0, sizeof *p);
}

static uint64_t fingerprint(const struct dataset *ds, const struct packer_config *c) {
    uint64_t v[10] = {PACKER_POLICY_VERSION, ds->data_hash, ds->n_rows, ds->n_tokens, c->budget, c->window, c->seed,
                      c->shard, c->n_shards, 0x706163u};
    uint64_t fp = dataset_hash64(v, sizeof v, 11);
    if (c->val_frac > 0) {   /* only a held-out split changes the fingerprint: older cursors stay valid */
        uint64_t frac_bits;
        memcpy(&frac_bits, &c->val_frac, sizeof frac_bits);
        uint64_t w[4] = {fp, frac_bits, c->val_every, 0x76616cu};
        fp = dataset_hash64(w, sizeof w, 13);
    }
    return fp;
}

/* Rows held out for validation: the last round(val_frac * rows) row ids, at least 1 when val_frac > 0. */
static uint64_t val_row_count(const struct packer_config *c, uint64_t n) {
    if (c->val_frac <= 0) return 0;
    uint64_t k = (uint64_t)(c->val_frac * (double)n + 0.5);
    return k ? k : 1;
}

static uint64_t plan_fill(struct packer *p, const uint32_t *order, uint64_t m, uint32_t *rows_out, uint64_t *start_out);

static int64_t epoch_count(struct packer *p, uint32_t e, char *err, int err_len);

int packer_init(struct packer *p, const struct dataset *ds, const struct packer_config *cfg, char *err, int err_len) {
    memset(p, 0, sizeof *p);
    if (cfg->budget < 1 || cfg->budget > (uint32_t)INT32_MAX)
        return err_fail(err, err_len, "--tokens: expected 1..%d, got %u", INT32_MAX, cfg->budget);
    if (cfg->window < 1 || cfg->window > (1u << 24))
        return err_fail(err, err_len, "--window: expected 1..%u, got %u", 1u << 24, cfg->window);
    if (cfg->n_shards < 1 || cfg->shard >= cfg->n_shards)
        return err_fail(err, err_len, "--shard: expected i/n with 0 <= i < n, got %u/%u", cfg->shard, cfg->n_shards);
    if (!(cfg->val_frac >= 0 && cfg->val_frac < 1))
        return err_fail(err, err_len, "--val-frac: expected a fraction in [0, 1), got %g", cfg->val_frac);
    if ((cfg->val_frac > 0) != (cfg->val_every > 0))
        return err_fail(err, err_len, cfg->val_frac > 0 ? "--val-frac %g needs --val-every N (train batches between two "
                        "validation passes)" : "--val-every needs --val-frac F > 0 (the rows to hold out)", cfg->val_frac);
    if (ds->n_rows >= UINT32_MAX)
        return err_fail(err, err_len, "%s: %llu rows; the packer handles fewer than 2^32", ds->path, (unsigned long long)ds->n_rows);
    p->ds = ds;
    p->cfg = *cfg;
    p->plan_epoch = UINT32_MAX;
    p->fingerprint = fingerprint(ds, cfg);
    uint64_t n = ds->n_rows;
    p->eff_len = malloc(sizeof(uint32_t) * (n ? n : 1));
    p->eligible = malloc(sizeof(uint32_t) * (n ? n : 1));
    p->val_eligible = malloc(sizeof(uint32_t) * (n ? n : 1));
    if (!p->eff_len || !p->eligible || !p->val_eligible) { packer_free(p); return err_fail(err, err_len, "packer: out of memory for %llu rows", (unsigned long long)n); }
    struct packer_stats *s = &p->stats;
    s->rows = n;
    uint64_t n_val = val_row_count(cfg, n);
    if (n_val >= n) {
        packer_free(p);
        return err_fail(err, err_len, "%s: --val-frac %g holds out %llu of %llu rows, leaving none to train on", ds->path,
                        cfg->val_frac, (unsigned long long)n_val, (unsigned long long)n);
    }
    s->val_rows = n_val;
    for (uint64_t r = 0; r < n; r++) {
        uint64_t len = dataset_row_len(ds, r);
        uint32_t eff = len > cfg->budget ? cfg->budget : (uint32_t)len;
        if (ds->first_loss[r] >= eff) {   /* nothing supervised within what would be packed */
            p->eff_len[r] = 0;
            s->dropped++;
            continue;
        }
        p->eff_len[r] = eff;
        if (len > cfg->budget) s->truncated++;
        if (r >= n - n_val) {   /* held out: packed into the validation batches only */
            p->val_eligible[s->val_eligible++] = (uint32_t)r;
            continue;
        }
        p->eligible[s->eligible++] = (uint32_t)r;
        s->eligible_tokens += eff;
    }
    if (n_val && !s->val_eligible) {
        packer_free(p);
        return err_fail(err, err_len, "%s: --val-frac %g holds out the last %llu rows, but none of them has a supervised "
                        "token within the first %u tokens", ds->path, cfg->val_frac, (unsigned long long)n_val, cfg->budget);
    }
    if (!s->eligible) {
        packer_free(p);
        return err_fail(err, err_len, "%s: nothing to pack: %llu rows, none with a supervised token within the first %u tokens",
                    ds->path, (unsigned long long)n, cfg->budget);
    }
    uint64_t m = s->eligible, mv = s->val_eligible, mm = m > mv ? m : mv;
    uint32_t w = cfg->window < mm ? cfg->window : (uint32_t)mm;
    uint32_t leaves = pow2_at_least(w);
    p->plan_rows = malloc(sizeof(uint32_t) * m);
    p->plan_start = malloc(sizeof(uint64_t) * (m + 1));
    p->perm = malloc(sizeof(uint32_t) * mm);
    p->sort_buf = malloc(sizeof(uint64_t) * w);
    p->bin_fill = malloc(sizeof(uint32_t) * 2 * leaves);   /* max-tree of remaining capacity */
    p->bin_next = malloc(sizeof(uint32_t) * w);
    p->bin_first = malloc(sizeof(uint32_t) * w);
    p->bin_last = malloc(sizeof(uint32_t) * w);
    if (!p->plan_rows || !p->plan_start || !p->perm || !p->sort_buf || !p->bin_fill || !p->bin_next || !p->bin_first ||
        !p->bin_last) {
        packer_free(p);
        return err_fail(err, err_len, "packer: out of memory planning %llu rows", (unsigned long long)m);
    }
    if (mv) {   /* the validation plan: held-out rows in row-id order, windowed first-fit decreasing, fixed */
        p->val_rows = malloc(sizeof(uint32_t) * mv);
        p->val_start = malloc(sizeof(uint64_t) * (mv + 1));
        if (!p->val_rows || !p->val_start) {
            packer_free(p);
            return err_fail(err, err_len, "packer: out of memory planning %llu validation rows", (unsigned long long)mv);
        }
        p->val_plan_bins = plan_fill(p, p->val_eligible, mv, p->val_rows, p->val_start);
        p->val_count = p->val_plan_bins > cfg->shard ? (p->val_plan_bins - cfg->shard + cfg->n_shards - 1) / cfg->n_shards : 0;
        if (!p->val_count) {
            packer_free(p);
            return err_fail(err, err_len, "%s: the %llu held-out rows pack into %llu validation batches, fewer than the %u "
                            "shards: raise --val-frac or use fewer shards", ds->path, (unsigned long long)mv,
                            (unsigned long long)p->val_plan_bins, cfg->n_shards);
        }
    }
    int64_t c0 = epoch_count(p, 0, err, err_len);
    if (c0 < 0) { packer_free(p); return -1; }
    if (c0 == 0) {
        packer_free(p);
        return err_fail(err, err_len, "%s: epoch 0 packs into %llu batches, fewer than the %u shards: use fewer shards or more data",
                    ds->path, (unsigned long long)p->plan_n_bins, cfg->n_shards);
    }
    p->cur.fingerprint = p->fingerprint;
    p->cur.origin = -1;
    return 0;
}

/* ---------------------------------------------------------------- planning */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void plan_epoch(struct packer *p, uint32_t e);

/* Windowed first-fit decreasing over rows `order`[0..m): writes the rows in emission order into rows_out and
 * the batch boundaries into start_out[0..n_bins]; returns n_bins. Uses the planning scratch. */
static uint64_t plan_fill(struct packer *p, const uint32_t *perm, uint64_t m, uint32_t *rows_out, uint64_t *start_out) {
    const uint32_t budget = p->cfg.budget;
    uint64_t *keys = p->sort_buf;
    uint32_t *tree = p->bin_fill;
    uint64_t n_bins = 0, out = 0;
    start_out[0] = 0;
    for (uint64_t w0 = 0; w0 < m; w0 += p->cfg.window) {
        uint32_t wn = (uint32_t)(m - w0 < p->cfg.window ? m - w0 : p->cfg.window);
        /* longest first; ties keep permutation order (the low bits hold the position) */
        for (uint32_t i = 0; i < wn; i++)
            keys[i] = ((uint64_t)(UINT32_MAX - p->eff_len[perm[w0 + i]]) << 32) | i;
        qsort(keys, wn, sizeof(uint64_t), cmp_u64);
        uint32_t leaves = pow2_at_least(wn), nb = 0;
        memset(tree, 0, sizeof(uint32_t) * 2 * leaves);
        for (uint32_t k = 0; k < wn; k++) {
            uint32_t pos = (uint32_t)keys[k], row = perm[w0 + pos], len = p->eff_len[row], b;
            if (tree[1] >= len) {   /* leftmost open batch with room */
                uint32_t node = 1;
                while (node < leaves) node = tree[2 * node] >= len ? 2 * node : 2 * node + 1;
                b = node - leaves;
                p->bin_next[p->bin_last[b]] = k;
            } else {
                b = nb++;
                tree[leaves + b] = budget;
                p->bin_first[b] = k;
            }
            p->bin_last[b] = k;
            p->bin_next[k] = UINT32_MAX;
            uint32_t node = leaves + b;
            tree[node] -= len;
            for (node >>= 1; node; node >>= 1)
                tree[node] = tree[2 * node] > tree[2 * node + 1] ? tree[2 * node] : tree[2 * node + 1];
        }
        for (uint32_t b = 0; b < nb; b++) {
            for (uint32_t k = p->bin_first[b]; k != UINT32_MAX; k = p->bin_next[k])
                rows_out[out++] = perm[w0 + (uint32_t)keys[k]];
            start_out[++n_bins] = out;
        }
    }
    return n_bins;
}

/* Plan epoch e: fill plan_rows / plan_start / plan_n_bins. */
static void plan_epoch(struct packer *p, uint32_t e) {
    if (p->plan_epoch == e) return;
    const uint64_t m = p->stats.eligible;
    uint32_t *perm = p->perm;
    memcpy(perm, p->eligible, sizeof(uint32_t) * m);
    uint64_t rng = p->cfg.seed * 0xD1342543DE82EF95ull ^ ((uint64_t)e + 1) * 0x9E3779B97F4A7C15ull;
    (void)kernels_rng_next(&rng);
    for (uint64_t i = m - 1; i > 0; i--) {   /* Fisher-Yates; j uniform in [0, i] by multiply-high */
        uint64_t j = (uint64_t)(((unsigned __int128)kernels_rng_next(&rng) * (i + 1)) >> 64);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    p->plan_n_bins = plan_fill(p, perm, m, p->plan_rows, p->plan_start);
    p->plan_epoch = e;
}

/* Shard-local batch count of epoch e, planning (and caching counts of) epochs in order up to e. */
static int64_t epoch_count(struct packer *p, uint32_t e, char *err, int err_len) {
    while (p->epoch_count_n <= e) {
        if (p->epoch_count_n == p->epoch_count_cap) {
            uint32_t cap = p->epoch_count_cap ? 2 * p->epoch_count_cap : 16;
            uint64_t *a = realloc(p->epoch_count, sizeof(uint64_t) * cap);
            if (!a) return err_fail(err, err_len, "packer: out of memory");
            p->epoch_count = a;
            p->epoch_count_cap = cap;
        }
        plan_epoch(p, p->epoch_count_n);
        uint64_t c = p->cfg.n_shards == 1 ? p->plan_n_bins : p->plan_n_bins / p->cfg.n_shards;
        p->stats.tail_dropped += p->plan_n_bins - c * p->cfg.n_shards;
        p->epoch_count[p->epoch_count_n++] = c;
    }
    return (int64_t)p->epoch_count[e];
}

int64_t packer_epoch_batches(struct packer *p, uint32_t epoch, char *err, int err_len) {
    return epoch_count(p, epoch, err, err_len);
}

static int epoch_done(const struct packer *p, uint32_t e) { return p->cfg.epochs && e >= p->cfg.epochs; }

/* Move (epoch, position) past exhausted epochs. */
static int normalize(struct packer *p, char *err, int err_len) {
    for (;;) {
        if (epoch_done(p, p->cur.epoch)) return 0;
        int64_t c = epoch_count(p, p->cur.epoch, err, err_len);
        if (c < 0) return -1;
        if (p->cur.position < (uint64_t)c) return 0;
        p->cur.epoch++;
        p->cur.position = 0;
    }
}

/* The stream interleaving (packer.h): with validation, period P = val_every + val_count; seq s is train
 * batch (s / P) * val_every + min(s % P, val_every), or validation batch s % P - val_every when that is >= 0. */
static int val_on(const struct packer *p) { return p->val_count > 0; }
static uint64_t train_index(const struct packer *p, uint64_t seq) {
    if (!val_on(p)) return seq;
    uint64_t P = p->cfg.val_every + p->val_count, r = seq % P;
    return seq / P * p->cfg.val_every + (r < p->cfg.val_every ? r : p->cfg.val_every);
}
static int64_t val_index(const struct packer *p, uint64_t seq) {   /* -1: a train batch */
    if (!val_on(p)) return -1;
    uint64_t P = p->cfg.val_every + p->val_count, r = seq % P;
    return r < p->cfg.val_every ? -1 : (int64_t)(r - p->cfg.val_every);
}

/* The epoch of train batch ti (ti below the stream's train length). */
static int64_t train_epoch(struct packer *p, uint64_t ti, char *err, int err_len) {
    for (uint32_t e = 0; !epoch_done(p, e); e++) {
        int64_t c = epoch_count(p, e, err, err_len);
        if (c < 0) return -1;
        if (ti < (uint64_t)c) return e;
        ti -= (uint64_t)c;
    }
    return p->cfg.epochs ? p->cfg.epochs - 1 : 0;
}

int packer_seek(struct packer *p, uint64_t seq, char *err, int err_len) {
    uint64_t rem = train_index(p, seq), ti = rem;
    uint32_t e = 0;
    for (; !epoch_done(p, e); e++) {
        int64_t c = epoch_count(p, e, err, err_len);
        if (c < 0) return -1;
        if (rem < (uint64_t)c) break;
        rem -= (uint64_t)c;
    }
    if (epoch_done(p, e) && rem > 0) {
        if (val_on(p))
            return err_fail(err, err_len, "seq %llu is past the end of the stream, which has %llu train batches in %u "
                            "epoch(s) (seq %llu would be train batch %llu)", (unsigned long long)seq,
                            (unsigned long long)(ti - rem), p->cfg.epochs, (unsigned long long)seq, (unsigned long long)ti);
        return err_fail(err, err_len, "seq %llu is past the end of the stream, which has %llu batches in %u epoch(s) "
                        "(nothing would be packed; the last seq is %llu)", (unsigned long long)seq,
                        (unsigned long long)(seq - rem), p->cfg.epochs, (unsigned long long)(seq - rem) - 1);
    }
    if (p->cfg.max_batches && seq > p->cfg.max_batches)
        return err_fail(err, err_len, "seq %llu is past the end of the stream, which stops after --max-batches %llu",
                        (unsigned long long)seq, (unsigned long long)p->cfg.max_batches);
    p->cur = (struct packer_cursor){e, epoch_done(p, e) ? 0 : rem, seq, p->fingerprint, -1};
    p->stats.batches = p->stats.tokens = p->stats.loss_tokens = p->stats.padding = 0;
    p->ended = 0;
    return 0;
}

int packer_resume(struct packer *p, const struct packer_cursor *c, char *err, int err_len) {
    if (c->fingerprint != p->fingerprint)
        return err_fail(err, err_len, "the saved cursor belongs to another dataset or other packing flags (fingerprint %016llx, "
                    "this run %016llx)", (unsigned long long)c->fingerprint, (unsigned long long)p->fingerprint);
    if (packer_seek(p, c->next_seq, err, err_len)) return -1;
    if (p->cur.epoch != c->epoch || p->cur.position != c->position)
        return err_fail(err, err_len, "the saved cursor says seq %llu is epoch %u position %llu, but this plan puts it at epoch %u "
                    "position %llu", (unsigned long long)c->next_seq, c->epoch, (unsigned long long)c->position,
                    p->cur.epoch, (unsigned long long)p->cur.position);
    return 0;
}

void packer_get_cursor(const struct packer *p, struct packer_cursor *c) { *c = p->cur; }

/* ---------------------------------------------------------------- emitting */

/* Zero the alignment gaps between the arrays, so a batch's payload bytes are a pure function of
 * the batch (stable checksums, byte-identical --out-dir files across runs). */
static void zero_gaps(const struct desc_batch *d, void *payload) {
    uint64_t T = d->n_tokens, n = d->n_docs;
    const uint64_t start[6] = {d->off_row_ids, d->off_input_ids, d->off_loss_mask, d->off_position_ids, d->off_doc_ids,
                               d->off_cu_seqlens};
    const uint64_t end[6] = {d->off_row_ids + 8 * n, d->off_input_ids + 4 * T, d->off_loss_mask + T,
                             d->off_position_ids + 4 * T, d->off_doc_ids + 4 * T, d->off_cu_seqlens + 4 * (n + 1)};
    char *p = payload;
    if (start[0]) memset(p, 0, start[0]);
    for (int i = 0; i < 5; i++)   /* the standard layout keeps the arrays in this order */
        memset(p + end[i], 0, start[i + 1] - end[i]);
}

int packer_at_end(struct packer *p, char *err, int err_len) {
    if (p->ended) return 1;
    if (normalize(p, err, err_len)) return -1;
    if (p->cfg.max_batches && p->cur.next_seq >= p->cfg.max_batches) return 1;
    if (val_index(p, p->cur.next_seq) >= 0) return 0;   /* a validation pass follows its N-th train batch, even the last */
    return epoch_done(p, p->cur.epoch);
}

/* Write one batch of rows[0..n_docs) into payload and d (seq, epoch, split, counts, offsets). */
static int fill_batch(struct packer *p, const uint32_t *rows, uint32_t n_docs, uint32_t epoch, enum desc_split split,
                      void *payload, uint64_t payload_cap, struct desc_batch *d, char *err, int err_len);

int packer_next(struct packer *p, void *payload, uint64_t payload_cap, struct desc_batch *d, char *err, int err_len) {
    int end = packer_at_end(p, err, err_len);
    if (end) {
        if (end > 0) p->ended = 1;
        return end > 0 ? 0 : -1;
    }
    int64_t vi = val_index(p, p->cur.next_seq);
    if (vi >= 0) {   /* validation batch vi of this shard: global validation batch vi * n + shard */
        uint64_t ti = train_index(p, p->cur.next_seq);
        int64_t e = train_epoch(p, ti - 1, err, err_len);   /* the epoch of the train batch the pass follows */
        if (e < 0) return -1;
        uint64_t b = (uint64_t)vi * p->cfg.n_shards + p->cfg.shard;
        if (fill_batch(p, p->val_rows + p->val_start[b], (uint32_t)(p->val_start[b + 1] - p->val_start[b]), (uint32_t)e,
                       DESC_SPLIT_VAL, payload, payload_cap, d, err, err_len))
            return -1;
        p->stats.val_batches++;
        p->cur.next_seq++;
        return 1;
    }
    plan_epoch(p, p->cur.epoch);
    uint64_t b = p->cur.position * p->cfg.n_shards + p->cfg.shard;
    if (fill_batch(p, p->plan_rows + p->plan_start[b], (uint32_t)(p->plan_start[b + 1] - p->plan_start[b]), p->cur.epoch,
                   DESC_SPLIT_TRAIN, payload, payload_cap, d, err, err_len))
        return -1;
    p->cur.position++;
    p->cur.next_seq++;
    if (normalize(p, err, err_len)) return -1;
    return 1;
}

static int fill_batch(struct packer *p, const uint32_t *rows, uint32_t n_docs, uint32_t epoch, enum desc_split split,
                      void *payload, uint64_t payload_cap, struct desc_batch *d, char *err, int err_len) {
    uint32_t T = 0;
    for (uint32_t i = 0; i < n_docs; i++) T += p->eff_len[rows[i]];
    memset(d, 0, sizeof *d);
    d->seq = p->cur.next_seq;
    d->epoch = epoch;
    d->split = split;
    d->budget = p->cfg.budget;
    d->n_tokens = T;
    d->n_docs = n_docs;
    if (desc_batch_layout(d) > payload_cap)
        return err_fail(err, err_len, "batch seq %llu needs %llu payload bytes, the slot has %llu", (unsigned long long)d->seq,
                    (unsigned long long)d->payload_bytes, (unsigned long long)payload_cap);
    struct desc_batch_arrays a;
    desc_batch_arrays(d, payload, &a);
    const struct dataset *ds = p->ds;
    int32_t t = 0;
    uint32_t n_loss = 0;
    for (uint32_t i = 0; i < n_docs; i++) {
        uint32_t r = rows[i], L = p->eff_len[r];
        uint64_t src = ds->offsets[r];
        a.row_ids[i] = r;
        a.cu_seqlens[i] = t;
        memcpy(a.input_ids + t, ds->tokens + src, sizeof(int32_t) * L);
        memcpy(a.loss_mask + t, ds->loss_mask + src, L);
        int32_t *pos = a.position_ids + t, *doc = a.doc_ids + t;
        const uint8_t *lm = a.loss_mask + t;
        uint32_t nl = 0;
        for (uint32_t j = 0; j < L; j++) {
            pos[j] = (int32_t)j;
            doc[j] = (int32_t)i;
            nl += lm[j];
        }
        n_loss += nl;
        t += (int32_t)L;
    }
    a.cu_seqlens[n_docs] = t;
    zero_gaps(d, payload);
    d->n_loss = n_loss;
    p->stats.batches++;
    p->stats.tokens += T;
    p->stats.loss_tokens += n_loss;
    p->stats.padding += p->cfg.budget - T;
    return 0;
}

/* ---------------------------------------------------------------- cursor text */

int packer_cursor_format(const struct packer_cursor *c, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "{\"version\": 1, \"epoch\": %u, \"position\": %llu, \"next_seq\": %llu, \"fingerprint\": \"%016llx\", "
                     "\"origin\": %lld}\n", c->epoch, (unsigned long long)c->position, (unsigned long long)c->next_seq,
                     (unsigned long long)c->fingerprint, (long long)c->origin);
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

int packer_cursor_parse(const char *text, size_t len, struct packer_cursor *c, char *err, int err_len) {
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return err_fail(err, err_len, "cursor: malformed JSON at line %d column %d: %s", je.line, je.column, je.text);
    int rc = -1;
    json_t *v = json_object_get(root, "version"), *e = json_object_get(root, "epoch"), *pos = json_object_get(root, "position"),
           *s = json_object_get(root, "next_seq"), *f = json_object_get(root, "fingerprint");
    if (!json_is_integer(v) || json_integer_value(v) != 1) { err_fail(err, err_len, "cursor: expected \"version\": 1"); goto out; }
    if (!json_is_integer(e) || !json_is_integer(pos) || !json_is_integer(s) || !json_is_string(f) ||
        json_integer_value(e) < 0 || json_integer_value(e) > UINT32_MAX || json_integer_value(pos) < 0 || json_integer_value(s) < 0) {
        err_fail(err, err_len, "cursor: expected non-negative integers epoch, position, next_seq and a string fingerprint");
        goto out;
    }
    const char *fs = json_string_value(f);
    char *end;
    unsigned long long fp = strtoull(fs, &end, 16);
    if (strlen(fs) != 16 || *end) { err_fail(err, err_len, "cursor: fingerprint '%s' is not 16 hex digits", fs); goto out; }
    c->epoch = (uint32_t)json_integer_value(e);
    c->position = (uint64_t)json_integer_value(pos);
    c->next_seq = (uint64_t)json_integer_value(s);
    c->fingerprint = fp;
    json_t *o = json_object_get(root, "origin");   /* optional: absent means none */
    if (o && (!json_is_integer(o) || json_integer_value(o) < -1)) {
        err_fail(err, err_len, "cursor: origin must be an integer >= -1");
        goto out;
    }
    c->origin = o ? (int64_t)json_integer_value(o) : -1;
    rc = 0;
out:
    json_decref(root);
    return rc;
}
