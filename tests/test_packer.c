/*
 * tests/test_packer.c — stages/pack/packer: packing invariants (budget, document boundaries,
 * positions, masks, cu_seqlens, contents equal to the dataset rows, every eligible row exactly
 * once per epoch, dropped and truncated rows counted), padding, determinism, seeking and cursor
 * resume, sharding, the end of the stream, and the validation split (held-out rows, interleaved passes).
 */
#include "pack/packer.h"
#include "testutil.h"

/* ---------------------------------------------------------------- an in-memory dataset */

struct mem_ds { struct dataset ds; uint64_t *off; uint32_t *first; int32_t *tok; uint8_t *loss; };

/* n rows with lengths in [1, max_len] (a few longer than 2*max_len to exercise truncation),
 * ~5% without any supervised token, ~3% supervised only at their very end. */
static void mem_ds_init(struct mem_ds *m, uint64_t n, uint32_t max_len, uint64_t seed) {
    uint64_t s = seed, total = 0;
    uint32_t *len = malloc(sizeof(uint32_t) * n);
    for (uint64_t r = 0; r < n; r++) {
        uint64_t x = test_rng_next(&s);
        len[r] = 1 + (uint32_t)(x % max_len);
        if (x % 97 == 0) len[r] = 2 * max_len + (uint32_t)(x % 13);
        total += len[r];
    }
    m->off = malloc(8 * (n + 1));
    m->first = malloc(4 * n);
    m->tok = malloc(4 * total);
    m->loss = malloc(total);
    m->off[0] = 0;
    for (uint64_t r = 0; r < n; r++) {
        uint64_t o = m->off[r], kind = test_rng_next(&s) % 100;
        uint32_t first = len[r];
        for (uint32_t i = 0; i < len[r]; i++) {
            m->tok[o + i] = (int32_t)(test_rng_next(&s) % 32000);
            int l = kind < 5 ? 0 : kind < 8 ? (i == len[r] - 1) : (int)(test_rng_next(&s) % 4 != 0);
            m->loss[o + i] = (uint8_t)l;
            if (l && first == len[r]) first = i;
        }
        m->first[r] = first;
        m->off[r + 1] = o + len[r];
    }
    free(len);
    memset(&m->ds, 0, sizeof m->ds);
    m->ds.n_rows = n;
    m->ds.n_tokens = total;
    m->ds.offsets = m->off;
    m->ds.first_loss = m->first;
    m->ds.tokens = m->tok;
    m->ds.loss_mask = m->loss;
    m->ds.max_token_id = 31999;
    m->ds.data_hash = dataset_hash64(m->tok, 4 * total, seed);
    snprintf(m->ds.path, sizeof m->ds.path, "mem-%llu", (unsigned long long)seed);
}

static void mem_ds_free(struct mem_ds *m) {
    free(m->off);
    free(m->first);
    free(m->tok);
    free(m->loss);
}

static void *payload_alloc(uint64_t bytes) {
    void *p = aligned_alloc(DESC_ALIGN, (bytes + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
    ck_assert(p != NULL);
    return p;
}

static struct packer_config cfg_default(void) {
    return (struct packer_config){.budget = 1024, .window = 256, .seed = 7, .shard = 0, .n_shards = 1, .epochs = 2, .max_batches = 0};
}

/* One batch reduced to a hash of its encoded descriptor and its payload bytes. */
static uint64_t batch_hash(const struct desc_batch *d, const void *payload) {
    char buf[DESC_MAX_BYTES], err[256];
    size_t len;
    ck_assert_msg(desc_batch_encode(d, buf, sizeof buf, &len, err, sizeof err) == 0, "%s", err);
    return dataset_hash64(payload, d->payload_bytes, dataset_hash64(buf, len, 3));
}

/* Emit up to max batches (all when 0) and return their hashes (malloc'd) and count. */
static uint64_t *collect(struct packer *p, uint64_t max, uint64_t *count) {
    uint64_t cap = desc_batch_max_payload_bytes(p->cfg.budget), n = 0, room = 64;
    void *payload = payload_alloc(cap);
    uint64_t *h = malloc(sizeof(uint64_t) * room);
    struct desc_batch d;
    char err[256];
    int rc;
    while ((!max || n < max) && (rc = packer_next(p, payload, cap, &d, err, sizeof err)) == 1) {
        if (n == room) h = realloc(h, sizeof(uint64_t) * (room *= 2));
        h[n++] = batch_hash(&d, payload);
    }
    ck_assert_msg(max ? 1 : rc == 0, "packer_next failed: %s", err);
    free(payload);
    *count = n;
    return h;
}

/* ---------------------------------------------------------------- invariants */

START_TEST(invariants) {
    struct mem_ds m;
    mem_ds_init(&m, 3000, 900, 11);
    struct packer_config c = cfg_default();
    struct packer p;
    char err[256];
    ck_assert_msg(packer_init(&p, &m.ds, &c, err, sizeof err) == 0, "%s", err);
    /* expected classification, computed independently */
    uint64_t want_dropped = 0, want_trunc = 0, want_elig = 0;
    for (uint64_t r = 0; r < m.ds.n_rows; r++) {
        uint64_t len = dataset_row_len(&m.ds, r), eff = len < c.budget ? len : c.budget;
        int any = 0;
        for (uint64_t i = 0; i < eff; i++) any |= m.loss[m.off[r] + i];
        if (!any) want_dropped++;
        else { want_elig++; want_trunc += len > c.budget; }
    }
    ck_assert_uint_gt(want_trunc, 0);
    ck_assert_uint_gt(want_dropped, 0);
    ck_assert_uint_eq(p.stats.dropped, want_dropped);
    ck_assert_uint_eq(p.stats.truncated, want_trunc);
    ck_assert_uint_eq(p.stats.eligible, want_elig);

    uint64_t cap = desc_batch_max_payload_bytes(c.budget);
    void *payload = payload_alloc(cap);
    uint8_t *seen = calloc(m.ds.n_rows, 1);
    struct desc_batch d;
    uint64_t seq = 0, tokens = 0, padding = 0, epoch_rows = 0;
    uint32_t epoch = 0;
    int rc;
    while ((rc = packer_next(&p, payload, cap, &d, err, sizeof err)) == 1) {
        ck_assert_uint_eq(d.seq, seq++);
        ck_assert_msg(desc_batch_check_payload(&d, payload, 32000, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_le(d.n_tokens, c.budget);
        ck_assert_uint_eq(d.budget, c.budget);
        ck_assert_uint_ge(d.epoch, epoch);
        if (d.epoch != epoch) {   /* an epoch ended: every eligible row was seen exactly once */
            ck_assert_uint_eq(epoch_rows, want_elig);
            memset(seen, 0, m.ds.n_rows);
            epoch_rows = 0;
            epoch = d.epoch;
        }
        struct desc_batch_arrays a;
        desc_batch_arrays(&d, payload, &a);
        for (uint32_t i = 0; i < d.n_docs; i++) {
            int64_t r = a.row_ids[i];
            ck_assert_int_lt(r, (int64_t)m.ds.n_rows);
            ck_assert_msg(!seen[r], "row %lld twice in epoch %u", (long long)r, epoch);
            seen[r] = 1;
            epoch_rows++;
            uint64_t len = dataset_row_len(&m.ds, (uint64_t)r), dl = (uint64_t)(a.cu_seqlens[i + 1] - a.cu_seqlens[i]);
            ck_assert_uint_eq(dl, len < c.budget ? len : c.budget);   /* truncated to the budget */
            ck_assert(!memcmp(a.input_ids + a.cu_seqlens[i], m.tok + m.off[r], 4 * dl));
            ck_assert(!memcmp(a.loss_mask + a.cu_seqlens[i], m.loss + m.off[r], dl));
        }
        tokens += d.n_tokens;
        padding += d.budget - d.n_tokens;
    }
    ck_assert_msg(rc == 0, "%s", err);
    ck_assert_uint_eq(epoch, 1);
    ck_assert_uint_eq(epoch_rows, want_elig);
    ck_assert_uint_eq(p.stats.batches, seq);
    ck_assert_uint_eq(p.stats.tokens, tokens);
    ck_assert_uint_eq(p.stats.padding, padding);
    ck_assert_uint_eq(tokens, 2 * p.stats.eligible_tokens);
    double pad = (double)padding / (double)(tokens + padding);
    ck_assert_msg(pad < 0.03, "padding fraction %.4f with window 256", pad);
    /* no more batches after the end */
    ck_assert_int_eq(packer_at_end(&p, err, sizeof err), 1);
    ck_assert_int_eq(packer_next(&p, payload, cap, &d, err, sizeof err), 0);
    /* a payload buffer that is too small is an error, not an overflow */
    struct packer q;
    ck_assert_int_eq(packer_init(&q, &m.ds, &c, err, sizeof err), 0);
    ck_assert_int_eq(packer_at_end(&q, err, sizeof err), 0);
    ck_assert_int_eq(packer_next(&q, payload, 100, &d, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "the slot has 100"), "%s", err);
    packer_free(&q);
    free(seen);
    free(payload);
    packer_free(&p);
    mem_ds_free(&m);
}
END_TEST

START_TEST(window_reduces_padding) {
    struct mem_ds m;
    mem_ds_init(&m, 4000, 1500, 5);
    double pad[2];
    uint32_t windows[2] = {8, 2048};
    for (int i = 0; i < 2; i++) {
        struct packer_config c = cfg_default();
        c.epochs = 1;
        c.budget = 4096;
        c.window = windows[i];
        struct packer p;
        char err[256];
        ck_assert_int_eq(packer_init(&p, &m.ds, &c, err, sizeof err), 0);
        uint64_t n;
        free(collect(&p, 0, &n));
        pad[i] = (double)p.stats.padding / (double)(p.stats.padding + p.stats.tokens);
        packer_free(&p);
    }
    ck_assert_msg(pad[1] < pad[0] && pad[1] < 0.01, "padding window 8: %.4f, window 2048: %.4f", pad[0], pad[1]);
    mem_ds_free(&m);
}
END_TEST

/* ---------------------------------------------------------------- determinism, seek, resume */

START_TEST(determinism) {
    struct mem_ds m;
    mem_ds_init(&m, 1500, 700, 3);
    struct packer_config c = cfg_default();
    struct packer p1, p2, p3;
    char err[256];
    uint64_t n1, n2, n3;
    ck_assert_int_eq(packer_init(&p1, &m.ds, &c, err, sizeof err), 0);
    ck_assert_int_eq(packer_init(&p2, &m.ds, &c, err, sizeof err), 0);
    uint64_t *h1 = collect(&p1, 0, &n1), *h2 = collect(&p2, 0, &n2);
    ck_assert_uint_eq(n1, n2);
    ck_assert(!memcmp(h1, h2, 8 * n1));
    ck_assert_uint_eq(p1.fingerprint, p2.fingerprint);
    /* another seed gives another stream (and another fingerprint) */
    c.seed = 8;
    ck_assert_int_eq(packer_init(&p3, &m.ds, &c, err, sizeof err), 0);
    uint64_t *h3 = collect(&p3, 0, &n3);
    ck_assert(n3 != n1 || memcmp(h1, h3, 8 * n1));
    ck_assert_uint_ne(p3.fingerprint, p1.fingerprint);
    /* the two epochs are ordered differently: no batch of epoch 1 equals the batch at the same
     * place in epoch 0 for most positions (checked via the first batch) */
    int64_t e0 = packer_epoch_batches(&p1, 0, err, sizeof err);
    ck_assert_int_gt(e0, 1);
    ck_assert_uint_ne(h1[0], h1[e0]);
    free(h1);
    free(h2);
    free(h3);
    packer_free(&p1);
    packer_free(&p2);
    packer_free(&p3);
    mem_ds_free(&m);
}
END_TEST

START_TEST(seek_and_resume) {
    struct mem_ds m;
    mem_ds_init(&m, 1200, 600, 9);
    struct packer_config c = cfg_default();
    c.epochs = 3;
    struct packer p;
    char err[256];
    uint64_t n;
    ck_assert_int_eq(packer_init(&p, &m.ds, &c, err, sizeof err), 0);
    uint64_t *all = collect(&p, 0, &n);
    int64_t e0 = packer_epoch_batches(&p, 0, err, sizeof err), e1 = packer_epoch_batches(&p, 1, err, sizeof err);
    ck_assert_uint_eq(n, (uint64_t)(e0 + e1 + packer_epoch_batches(&p, 2, err, sizeof err)));
    uint64_t targets[] = {0, 1, (uint64_t)e0 - 1, (uint64_t)e0, (uint64_t)e0 + 5, (uint64_t)(e0 + e1), n - 1, n};
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        uint64_t S = targets[t], k;
        ck_assert_int_eq(packer_seek(&p, S, err, sizeof err), 0);
        uint64_t *h = collect(&p, 0, &k);
        ck_assert_uint_eq(k, S < n ? n - S : 0);
        ck_assert_msg(!k || !memcmp(h, all + S, 8 * k), "stream after seek(%llu) differs", (unsigned long long)S);
        free(h);
    }
    /* one past the end is an error that says so (issue 14 item 6: it used to be a silent no-op) */
    ck_assert_int_eq(packer_seek(&p, n + 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "past the end") && strstr(err, "batches"), "%s", err);
    ck_assert_int_eq(packer_seek(&p, n + 10, err, sizeof err), -1);
    /* resume from a saved cursor (through its text form) in a fresh packer */
    struct packer q;
    ck_assert_int_eq(packer_init(&q, &m.ds, &c, err, sizeof err), 0);
    uint64_t k;
    free(collect(&q, (uint64_t)e0, &k));   /* stop exactly at an epoch boundary */
    struct packer_cursor cur, back;
    packer_get_cursor(&q, &cur);
    ck_assert_uint_eq(cur.next_seq, (uint64_t)e0);
    ck_assert_uint_eq(cur.epoch, 1);
    ck_assert_uint_eq(cur.position, 0);
    char text[256];
    ck_assert_int_gt(packer_cursor_format(&cur, text, sizeof text), 0);
    ck_assert_msg(packer_cursor_parse(text, strlen(text), &back, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(back.fingerprint, cur.fingerprint);
    ck_assert_int_eq(back.origin, -1);
    cur.origin = 17;   /* the stage's bookkeeping survives the text form */
    ck_assert_int_gt(packer_cursor_format(&cur, text, sizeof text), 0);
    ck_assert_int_eq(packer_cursor_parse(text, strlen(text), &back, err, sizeof err), 0);
    ck_assert_int_eq(back.origin, 17);
    packer_free(&q);
    ck_assert_int_eq(packer_init(&q, &m.ds, &c, err, sizeof err), 0);
    ck_assert_msg(packer_resume(&q, &back, err, sizeof err) == 0, "%s", err);
    uint64_t *h = collect(&q, 0, &k);
    ck_assert_uint_eq(k, n - (uint64_t)e0);
    ck_assert(!memcmp(h, all + e0, 8 * k));
    free(h);
    /* a cursor of other flags, or an inconsistent one, is refused */
    struct packer_cursor bad = back;
    bad.fingerprint ^= 1;
    ck_assert_int_eq(packer_resume(&q, &bad, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "another dataset or other packing flags"), "%s", err);
    bad = back;
    bad.position = 3;
    ck_assert_int_eq(packer_resume(&q, &bad, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "this plan puts it at epoch 1 position 0"), "%s", err);
    ck_assert_int_eq(packer_cursor_parse("{\"version\": 1}", 14, &bad, err, sizeof err), -1);
    ck_assert_int_eq(packer_cursor_parse("{\"version\": 1, \"epoch\": 0, \"position\": 0, \"next_seq\": 0, \"fingerprint\": \"xyz\"}",
                                         78, &bad, err, sizeof err), -1);
    ck_assert_int_eq(packer_cursor_parse("garbage", 7, &bad, err, sizeof err), -1);
    packer_free(&q);
    free(all);
    packer_free(&p);
    mem_ds_free(&m);
}
END_TEST

START_TEST(limits_and_end) {
    struct mem_ds m;
    mem_ds_init(&m, 500, 400, 4);
    struct packer_config c = cfg_default();
    c.epochs = 0;   /* unlimited: max_batches ends it */
    c.max_batches = 237;
    struct packer p;
    char err[256];
    uint64_t n;
    ck_assert_int_eq(packer_init(&p, &m.ds, &c, err, sizeof err), 0);
    int64_t e0 = packer_epoch_batches(&p, 0, err, sizeof err);
    ck_assert_int_lt(e0, 237);   /* so the stream crosses epochs */
    free(collect(&p, 0, &n));
    ck_assert_uint_eq(n, 237);
    packer_free(&p);
    /* init errors: nothing eligible, too many shards */
    struct dataset tiny = m.ds;
    tiny.n_rows = 1;
    c.budget = 1;
    c.n_shards = 1;
    uint32_t f0 = m.first[0];
    m.first[0] = 1;   /* supervised from token 1 on: nothing within a budget of 1 */
    ck_assert_int_eq(packer_init(&p, &tiny, &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "nothing to pack"), "%s", err);
    m.first[0] = f0;
    c = cfg_default();
    c.n_shards = 100000;
    c.shard = 3;
    ck_assert_int_eq(packer_init(&p, &m.ds, &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "fewer than the 100000 shards"), "%s", err);
    c.shard = 100000;
    ck_assert_int_eq(packer_init(&p, &m.ds, &c, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--shard"), "%s", err);
    mem_ds_free(&m);
}
END_TEST

START_TEST(shards) {
    struct mem_ds m;
    mem_ds_init(&m, 2000, 500, 21);
    const uint32_t N = 3;
    struct packer_config c = cfg_default();
    c.epochs = 1;
    struct packer whole;
    char err[256];
    uint64_t nw;
    ck_assert_int_eq(packer_init(&whole, &m.ds, &c, err, sizeof err), 0);
    uint64_t *hw = collect(&whole, 0, &nw);
    uint64_t counts[3];
    for (uint32_t s = 0; s < N; s++) {
        struct packer_config cs = c;
        cs.shard = s;
        cs.n_shards = N;
        struct packer p;
        ck_assert_int_eq(packer_init(&p, &m.ds, &cs, err, sizeof err), 0);
        uint64_t cap = desc_batch_max_payload_bytes(c.budget);
        void *payload = payload_alloc(cap);
        struct desc_batch d;
        uint64_t k = 0;
        while (packer_next(&p, payload, cap, &d, err, sizeof err) == 1) {
            /* shard s's batch k is the unsharded plan's batch k*N + s, renumbered */
            ck_assert_uint_eq(d.seq, k);
            struct desc_batch g = d;
            g.seq = k * N + s;
            ck_assert_uint_eq(batch_hash(&g, payload), hw[k * N + s]);
            k++;
        }
        counts[s] = k;
        ck_assert_uint_eq(k, nw / N);
        ck_assert_uint_eq(p.stats.tail_dropped, nw % N);
        free(payload);
        packer_free(&p);
    }
    ck_assert_uint_eq(counts[0], counts[2]);
    free(hw);
    packer_free(&whole);
    mem_ds_free(&m);
}
END_TEST


/* ---------------------------------------------------------------- validation split */

struct vbatch { uint64_t seq, hash, payload_hash; uint32_t epoch, n_docs; enum desc_split split; int64_t rows[64]; };

/* Emit the whole stream, keeping each batch's split, epoch, row ids (first 64) and hashes. */
static struct vbatch *collect_v(struct packer *p, uint64_t *count) {
    uint64_t cap = desc_batch_max_payload_bytes(p->cfg.budget), n = 0, room = 64;
    void *payload = payload_alloc(cap);
    struct vbatch *v = malloc(sizeof *v * room);
    struct desc_batch d;
    char err[256];
    int rc;
    while ((rc = packer_next(p, payload, cap, &d, err, sizeof err)) == 1) {
        if (n == room) v = realloc(v, sizeof *v * (room *= 2));
        struct desc_batch_arrays a;
        desc_batch_arrays(&d, payload, &a);
        ck_assert_msg(desc_batch_check_payload(&d, payload, 32000, err, sizeof err) == 0, "%s", err);
        struct vbatch *b = &v[n++];
        memset(b, 0, sizeof *b);
        b->seq = d.seq;
        b->epoch = d.epoch;
        b->split = d.split;
        b->n_docs = d.n_docs;
        b->hash = batch_hash(&d, payload);
        b->payload_hash = dataset_hash64(payload, d.payload_bytes, 5);
        for (uint32_t i = 0; i < d.n_docs && i < 64; i++) b->rows[i] = a.row_ids[i];
    }
    ck_assert_msg(rc == 0, "packer_next failed: %s", err);
    free(payload);
    *count = n;
    return v;
}

START_TEST(validation_split) {
    struct mem_ds m;
    mem_ds_init(&m, 1000, 300, 21);
    struct packer_config c = cfg_default();
    c.val_frac = 0.1;
    c.val_every = 5;
    struct packer p;
    char err[256];
    ck_assert_msg(packer_init(&p, &m.ds, &c, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(p.stats.val_rows, 100);
    ck_assert_uint_gt(p.stats.val_eligible, 80);
    uint64_t V = p.val_count, N = 5, P = N + V, n;
    ck_assert_uint_ge(V, 2);
    int64_t e0 = packer_epoch_batches(&p, 0, err, sizeof err), e1 = packer_epoch_batches(&p, 1, err, sizeof err);
    uint64_t n_train = (uint64_t)(e0 + e1);
    struct vbatch *all = collect_v(&p, &n);
    /* the interleaving: V val batches after every N-th train batch, the last one included */
    ck_assert_uint_eq(n, n_train + (n_train / N) * V);
    uint64_t train_docs = 0, t_seen = 0, passes = 0;
    uint8_t *in_pass = calloc(1000, 1);
    for (uint64_t i = 0; i < n; i++) {
        const struct vbatch *b = &all[i];
        ck_assert_uint_eq(b->seq, i);
        ck_assert_int_eq(b->split, i % P >= N ? DESC_SPLIT_VAL : DESC_SPLIT_TRAIN);
        for (uint32_t d = 0; d < b->n_docs && d < 64; d++) {
            if (b->split == DESC_SPLIT_TRAIN) ck_assert_int_lt(b->rows[d], 900);   /* held-out rows never train */
            else ck_assert_int_ge(b->rows[d], 900);
        }
        if (b->split == DESC_SPLIT_TRAIN) {
            train_docs += b->n_docs;
            t_seen++;
            ck_assert_uint_eq(b->epoch, t_seen <= (uint64_t)e0 ? 0 : 1);
        } else {
            /* every pass is the same batches (payload bytes) in the same order, and covers the held-out rows */
            uint64_t k = i % P - N;
            ck_assert_uint_eq(b->payload_hash, all[N + k].payload_hash);
            ck_assert_uint_eq(b->epoch, all[i - k - 1].epoch);   /* the epoch of the train batch it follows */
            for (uint32_t d = 0; d < b->n_docs && d < 64; d++) in_pass[b->rows[d]] = 1;
            if (k == V - 1) passes++;
        }
    }
    ck_assert_uint_eq(train_docs, 2 * p.stats.eligible);
    ck_assert_uint_eq(passes, n_train / N);
    uint64_t covered = 0;
    for (int r = 900; r < 1000; r++) covered += in_pass[r];
    ck_assert_uint_eq(covered, p.stats.val_eligible);   /* (a pass's batches hold < 64 docs each here) */
    free(in_pass);
    /* seeking lands anywhere, a val pass's middle included, and the stream continues identically */
    uint64_t targets[] = {0, N - 1, N, N + 1, P - 1, P, 3 * P + N + V / 2, n - 1, n};
    for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
        uint64_t S = targets[t], k;
        ck_assert_msg(packer_seek(&p, S, err, sizeof err) == 0, "seek %llu: %s", (unsigned long long)S, err);
        struct vbatch *h = collect_v(&p, &k);
        ck_assert_uint_eq(k, n - S);
        for (uint64_t i = 0; i < k; i++) ck_assert_uint_eq(h[i].hash, all[S + i].hash);
        free(h);
    }
    ck_assert_int_eq(packer_seek(&p, n + 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "past the end"), "%s", err);
    /* a cursor saved in the middle of a pass resumes in a fresh packer */
    struct packer q;
    ck_assert_int_eq(packer_init(&q, &m.ds, &c, err, sizeof err), 0);
    ck_assert_int_eq(packer_seek(&q, 2 * P + N + 1, err, sizeof err), 0);
    struct packer_cursor cur;
    packer_get_cursor(&q, &cur);
    packer_free(&q);
    ck_assert_int_eq(packer_init(&q, &m.ds, &c, err, sizeof err), 0);
    ck_assert_msg(packer_resume(&q, &cur, err, sizeof err) == 0, "%s", err);
    uint64_t k;
    struct vbatch *h = collect_v(&q, &k);
    ck_assert_uint_eq(k, n - (2 * P + N + 1));
    ck_assert_uint_eq(h[0].hash, all[2 * P + N + 1].hash);
    free(h);
    packer_free(&q);
    /* the split is part of the fingerprint; without it the fingerprint is what it always was */
    struct packer_config c0 = cfg_default();
    ck_assert_int_eq(packer_init(&q, &m.ds, &c0, err, sizeof err), 0);
    ck_assert_uint_ne(q.fingerprint, p.fingerprint);
    ck_assert_uint_eq(q.val_count, 0);
    packer_free(&q);
    /* max_batches counts val batches too */
    struct packer_config cm = c;
    cm.max_batches = N + 2;
    ck_assert_int_eq(packer_init(&q, &m.ds, &cm, err, sizeof err), 0);
    h = collect_v(&q, &k);
    ck_assert_uint_eq(k, N + 2);
    ck_assert_int_eq(h[N + 1].split, DESC_SPLIT_VAL);
    free(h);
    packer_free(&q);
    /* shards: each takes every n-th val batch; together they cover one pass */
    uint64_t cov = 0;
    uint8_t *seen = calloc(1000, 1);
    for (uint32_t sh = 0; sh < 2; sh++) {
        struct packer_config cs = c;
        cs.shard = sh;
        cs.n_shards = 2;
        ck_assert_int_eq(packer_init(&q, &m.ds, &cs, err, sizeof err), 0);
        ck_assert_uint_eq(q.val_count, (V + 1 - sh) / 2);
        h = collect_v(&q, &k);
        for (uint64_t i = N; i < N + q.val_count; i++) {
            ck_assert_int_eq(h[i].split, DESC_SPLIT_VAL);
            for (uint32_t d = 0; d < h[i].n_docs && d < 64; d++) cov += !seen[h[i].rows[d]]++;
        }
        free(h);
        packer_free(&q);
    }
    ck_assert_uint_eq(cov, p.stats.val_eligible);
    free(seen);
    /* bad flags, one sentence each */
    struct packer_config cb = c;
    cb.val_every = 0;
    ck_assert_int_eq(packer_init(&q, &m.ds, &cb, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--val-frac 0.1 needs --val-every"), "%s", err);
    cb = cfg_default();
    cb.val_every = 3;
    ck_assert_int_eq(packer_init(&q, &m.ds, &cb, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--val-every needs --val-frac"), "%s", err);
    cb = c;
    cb.val_frac = 0.9999;
    ck_assert_int_eq(packer_init(&q, &m.ds, &cb, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "leaving none to train on"), "%s", err);
    cb.val_frac = 1.5;
    ck_assert_int_eq(packer_init(&q, &m.ds, &cb, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--val-frac: expected a fraction"), "%s", err);
    free(all);
    packer_free(&p);
    mem_ds_free(&m);
}
END_TEST

int main(void) {
    Suite *s = suite_create("packer");
    TCase *tc = tcase_create("packer");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, invariants);
    tcase_add_test(tc, window_reduces_padding);
    tcase_add_test(tc, determinism);
    tcase_add_test(tc, seek_and_resume);
    tcase_add_test(tc, limits_and_end);
    tcase_add_test(tc, shards);
    tcase_add_test(tc, validation_split);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
