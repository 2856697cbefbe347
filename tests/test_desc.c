/*
 * tests/test_desc.c — stages/core/desc: round trips of the batch, hidden and features
 * descriptors, payload layouts and sizes, and rejection of malformed descriptors (wrong kind,
 * version, field count, types, duplicates, trailing bytes, arrays outside the payload) and of bad
 * batch contents.
 */
#include "core/desc.h"
#include "testutil.h"

#include <msgpack.h>

static struct desc_batch sample_batch(uint32_t T, uint32_t n_docs) {
    struct desc_batch d = {.seq = 123456789012ull, .epoch = 3, .n_tokens = T, .budget = T + 17, .n_docs = n_docs, .n_loss = 1,
                           .plan = 0x1234abcd5678ef90ull};
    desc_batch_layout(&d);
    return d;
}

static int batch_eq(const struct desc_batch *a, const struct desc_batch *b) {
    return a->seq == b->seq && a->epoch == b->epoch && a->n_tokens == b->n_tokens && a->budget == b->budget &&
           a->n_docs == b->n_docs && a->n_loss == b->n_loss && a->payload_bytes == b->payload_bytes &&
           a->off_row_ids == b->off_row_ids && a->off_input_ids == b->off_input_ids &&
           a->off_loss_mask == b->off_loss_mask && a->off_position_ids == b->off_position_ids &&
           a->off_doc_ids == b->off_doc_ids && a->off_cu_seqlens == b->off_cu_seqlens && a->split == b->split &&
           a->plan == b->plan;
}

/* ---------------------------------------------------------------- round trips */

START_TEST(batch_round_trip) {
    struct desc_batch d = sample_batch(1000, 7), out;
    char buf[DESC_MAX_BYTES], err[256];
    size_t len = 0;
    ck_assert_int_eq(desc_batch_encode(&d, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_uint_gt(len, 0);
    ck_assert_int_eq(desc_batch_decode(buf, len, d.payload_bytes, &out, err, sizeof err), 0);
    ck_assert(batch_eq(&d, &out));
    enum desc_kind k;
    ck_assert_int_eq(desc_peek_kind(buf, len, &k, err, sizeof err), 0);
    ck_assert_int_eq(k, DESC_KIND_BATCH);
    /* the standard layout: aligned, in struct order, ends at payload_bytes */
    ck_assert_uint_eq(d.off_row_ids, 0);
    ck_assert_uint_eq(d.off_input_ids % DESC_ALIGN, 0);
    ck_assert_uint_ge(d.off_input_ids, 8 * 7);
    ck_assert_uint_eq(d.payload_bytes, d.off_cu_seqlens + 4 * 8);
    /* payload capacity smaller than payload_bytes is rejected */
    ck_assert_int_eq(desc_batch_decode(buf, len, d.payload_bytes - 1, &out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "exceeds the slot's payload capacity"), "%s", err);
}
END_TEST

/* The split travels: batch, hidden and features descriptors keep train|val through encode and decode, and
 * a forwarded batch part (what dflash-target and dflash-hspack copy) keeps it through the layouts. */
START_TEST(split_round_trip) {
    char buf[DESC_MAX_BYTES], err[256];
    size_t len = 0;
    struct desc_batch d = sample_batch(300, 3), out;
    ck_assert_int_eq(d.split, DESC_SPLIT_TRAIN);   /* zero-initialised = train */
    d.split = DESC_SPLIT_VAL;
    ck_assert_int_eq(desc_batch_encode(&d, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_batch_decode(buf, len, 0, &out, err, sizeof err), 0);
    ck_assert_int_eq(out.split, DESC_SPLIT_VAL);
    struct desc_hidden h = {.batch = out, .n_layers = 2, .layers = {1, 3}, .dtype = DESC_DTYPE_F32, .hidden_size = 16}, h2;
    desc_hidden_layout(&h);
    ck_assert_int_eq(desc_hidden_encode(&h, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_hidden_decode(buf, len, 0, &h2, err, sizeof err), 0);
    ck_assert_int_eq(h2.batch.split, DESC_SPLIT_VAL);
    struct desc_features f = {.batch = h2.batch, .layout = DESC_LAYOUT_CONCAT, .n_layers = 2, .layers = {1, 3},
                              .dtype = DESC_DTYPE_BF16, .hidden_size = 16}, f2;
    desc_features_layout(&f);
    ck_assert_int_eq(desc_features_encode(&f, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_features_decode(buf, len, 0, &f2, err, sizeof err), 0);
    ck_assert_int_eq(f2.batch.split, DESC_SPLIT_VAL);
    f.batch.split = DESC_SPLIT_TRAIN;
    ck_assert_int_eq(desc_features_encode(&f, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_features_decode(buf, len, 0, &f2, err, sizeof err), 0);
    ck_assert_int_eq(f2.batch.split, DESC_SPLIT_TRAIN);
    d.split = (enum desc_split)7;
    ck_assert_int_eq(desc_batch_encode(&d, buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "split: expected train or val"), "%s", err);
    ck_assert_str_eq(desc_split_name(DESC_SPLIT_VAL), "val");
}
END_TEST

START_TEST(hidden_features_round_trip) {
    char buf[DESC_MAX_BYTES], err[256];
    size_t len;
    struct desc_hidden h = {.batch = sample_batch(8192, 5), .n_layers = 5, .layers = {1, 9, 17, 25, 33},
                            .dtype = DESC_DTYPE_BF16, .hidden_size = 4096, .target_id = 0xfedcba9876543210ull};
    uint64_t bytes = desc_hidden_layout(&h);
    ck_assert_uint_eq(bytes, h.batch.payload_bytes);
    ck_assert_uint_eq(h.off_last - h.off_states, 5ull * 8192 * 4096 * 2);
    ck_assert_uint_eq(bytes, h.off_last + 8192ull * 4096 * 2);
    ck_assert_int_eq(desc_hidden_encode(&h, buf, sizeof buf, &len, err, sizeof err), 0);
    struct desc_hidden h2;
    ck_assert_int_eq(desc_hidden_decode(buf, len, bytes, &h2, err, sizeof err), 0);
    ck_assert(batch_eq(&h.batch, &h2.batch));
    ck_assert_uint_eq(h2.n_layers, 5);
    ck_assert_int_eq(h2.layers[4], 33);
    ck_assert_int_eq(h2.dtype, DESC_DTYPE_BF16);
    ck_assert_uint_eq(h2.hidden_size, 4096);
    ck_assert_uint_eq(h2.off_states, h.off_states);
    ck_assert_uint_eq(h2.off_last, h.off_last);
    ck_assert_uint_eq(h2.target_id, 0xfedcba9876543210ull);   /* issue 24: the target travels */
    /* a hidden descriptor is not a batch descriptor */
    struct desc_batch b;
    ck_assert_int_eq(desc_batch_decode(buf, len, 0, &b, err, sizeof err), -1);
    ck_assert_str_eq(err, "descriptor kind: expected 'batch', found 'hidden'");

    struct desc_features f = {.batch = sample_batch(97, 1), .layout = DESC_LAYOUT_SPLIT, .n_layers = 3, .layers = {2, 18, 33},
                              .dtype = DESC_DTYPE_F32, .hidden_size = 64, .target_id = 42};
    desc_features_layout(&f);
    ck_assert_int_eq(desc_features_encode(&f, buf, sizeof buf, &len, err, sizeof err), 0);
    struct desc_features f2;
    ck_assert_int_eq(desc_features_decode(buf, len, 0, &f2, err, sizeof err), 0);
    ck_assert_int_eq(f2.layout, DESC_LAYOUT_SPLIT);
    ck_assert_int_eq(f2.dtype, DESC_DTYPE_F32);
    ck_assert_uint_eq(f2.n_layers, 3);
    ck_assert_int_eq(f2.layers[1], 18);
    ck_assert_uint_eq(f2.target_id, 42);
    ck_assert(batch_eq(&f.batch, &f2.batch));
    /* the identity: of the config.json bytes, never 0, another config another id */
    ck_assert_uint_ne(desc_target_id("{\"hidden_size\": 64}", 19), desc_target_id("{\"hidden_size\": 65}", 19));
    ck_assert_uint_eq(desc_target_id("{\"hidden_size\": 64}", 19), desc_target_id("{\"hidden_size\": 64}", 19));
    ck_assert_uint_ne(desc_target_id("", 0), 0);
    enum desc_kind k;
    ck_assert_int_eq(desc_peek_kind(buf, len, &k, err, sizeof err), 0);
    ck_assert_int_eq(k, DESC_KIND_FEATURES);
    ck_assert_int_eq(desc_hidden_decode(buf, len, 0, &h2, err, sizeof err), -1);
}
END_TEST

START_TEST(sizes_and_limits) {
    char buf[DESC_MAX_BYTES], err[256];
    size_t len;
    /* worst-case descriptor (64 large layer ids, huge numbers) fits DESC_MAX_BYTES */
    struct desc_features f = {.batch = {.seq = UINT64_MAX, .epoch = UINT32_MAX, .n_tokens = INT32_MAX, .budget = INT32_MAX,
                                        .n_docs = INT32_MAX, .n_loss = INT32_MAX},
                              .layout = DESC_LAYOUT_CONCAT, .n_layers = DESC_MAX_LAYERS, .dtype = DESC_DTYPE_F32,
                              .hidden_size = 1u << 20};
    for (int i = 0; i < DESC_MAX_LAYERS; i++) f.layers[i] = INT32_MAX - i;
    desc_features_layout(&f);
    ck_assert_int_eq(desc_features_encode(&f, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_uint_le(len, DESC_MAX_BYTES);
    /* a buffer too small says how much is needed */
    struct desc_batch d = sample_batch(10, 2);
    ck_assert_int_eq(desc_batch_encode(&d, buf, 20, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "buffer has 20"), "%s", err);
    /* max payload helpers bound every batch of the budget */
    uint64_t mx = desc_batch_max_payload_bytes(8192);
    for (uint32_t n = 1; n <= 8192; n = n * 3 + 1) {
        struct desc_batch b = {.n_tokens = 8192, .n_docs = n};
        ck_assert_uint_le(desc_batch_layout(&b), mx);
    }
    ck_assert_uint_ge(desc_hidden_max_payload_bytes(8192, 5, 4096, DESC_DTYPE_BF16), 6ull * 8192 * 4096 * 2 + mx);
    ck_assert_uint_eq(desc_features_max_payload_bytes(8192, 5, 4096, DESC_DTYPE_BF16),
                      desc_hidden_max_payload_bytes(8192, 5, 4096, DESC_DTYPE_BF16));
    ck_assert_uint_eq(desc_dtype_bytes(DESC_DTYPE_BF16), 2);
    ck_assert_uint_eq(desc_dtype_bytes(DESC_DTYPE_F32), 4);
}
END_TEST

/* The run plan's hash travels in every kind (issue 25): each kind is at version 4 (the one that added it), a
 * forwarded batch part keeps it, and desc_check_plan refuses another plan's item with one line naming the ring,
 * the seq and both hashes, while a stage or an item without a plan (0) passes. */
START_TEST(plan_hash) {
    ck_assert_uint_eq(desc_version(DESC_KIND_BATCH), 4);
    ck_assert_uint_eq(desc_version(DESC_KIND_HIDDEN), 4);
    ck_assert_uint_eq(desc_version(DESC_KIND_FEATURES), 4);
    ck_assert_uint_eq(desc_version((enum desc_kind)9), 0);
    char buf[DESC_MAX_BYTES], err[512];
    size_t len = 0;
    struct desc_batch d = sample_batch(64, 2), out;
    d.plan = UINT64_MAX;   /* the full range survives */
    ck_assert_int_eq(desc_batch_encode(&d, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_batch_decode(buf, len, 0, &out, err, sizeof err), 0);
    ck_assert_uint_eq(out.plan, UINT64_MAX);
    d.plan = 0x00000000000000abull;
    struct desc_hidden h = {.batch = d, .n_layers = 1, .layers = {2}, .dtype = DESC_DTYPE_F32, .hidden_size = 8}, h2;
    desc_hidden_layout(&h);
    ck_assert_int_eq(desc_hidden_encode(&h, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_hidden_decode(buf, len, 0, &h2, err, sizeof err), 0);
    ck_assert_uint_eq(h2.batch.plan, 0xab);
    struct desc_features f = {.batch = h2.batch, .layout = DESC_LAYOUT_SPLIT, .n_layers = 1, .layers = {2},
                              .dtype = DESC_DTYPE_F32, .hidden_size = 8}, f2;
    desc_features_layout(&f);
    ck_assert_int_eq(desc_features_encode(&f, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_features_decode(buf, len, 0, &f2, err, sizeof err), 0);
    ck_assert_uint_eq(f2.batch.plan, 0xab);
    /* the check */
    ck_assert_int_eq(desc_check_plan(&f2.batch, 0xab, "features", err, sizeof err), 0);   /* same plan */
    ck_assert_int_eq(desc_check_plan(&f2.batch, 0, "features", err, sizeof err), 0);      /* stage without a plan */
    f2.batch.plan = 0;
    ck_assert_int_eq(desc_check_plan(&f2.batch, 0xab, "features", err, sizeof err), 0);   /* item without a plan */
    f2.batch.plan = 0xfeedull;
    f2.batch.seq = 12;
    ck_assert_int_eq(desc_check_plan(&f2.batch, 0xab, "features", err, sizeof err), -1);
    ck_assert_str_eq(err, "ring 'features' seq 12 was made under run plan 000000000000feed, this stage read plan "
                          "00000000000000ab from its run's plan.json: a stage of another run (or an older plan) feeds "
                          "this ring");
    ck_assert_ptr_null(strchr(err, '\n'));
    ck_assert_int_eq(desc_check_plan(&f2.batch, 0xab, NULL, err, sizeof err), -1);
    ck_assert_msg(!strncmp(err, "seq 12 was made under run plan 000000000000feed", 47), "%s", err);
}
END_TEST

/* ---------------------------------------------------------------- malformed descriptors */

struct mod {
    const char *kind;          /* kind string to write */
    uint64_t version;
    const char *drop;          /* field to leave out */
    const char *dup;           /* field to write twice */
    const char *as_string;     /* field whose value is written as a string */
    const char *extra;         /* an additional field */
    const char *override;      /* field whose value becomes override_value */
    uint64_t override_value;
    int trailing;              /* append a byte after the map */
    const char *split;         /* the split string to write (NULL: "train") */
    int drop_split;            /* leave the split field out */
};

static void pk_str(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* Pack a batch descriptor by hand with one modification. */
static void pack_batch_mod(const struct desc_batch *d, const struct mod *m, msgpack_sbuffer *sb) {
    struct { const char *k; uint64_t v; } f[] = {
        {"version", m->version}, {"seq", d->seq}, {"epoch", d->epoch}, {"n_tokens", d->n_tokens}, {"budget", d->budget},
        {"n_docs", d->n_docs}, {"n_loss", d->n_loss}, {"payload_bytes", d->payload_bytes}, {"off_row_ids", d->off_row_ids},
        {"off_input_ids", d->off_input_ids}, {"off_loss_mask", d->off_loss_mask}, {"off_position_ids", d->off_position_ids},
        {"off_doc_ids", d->off_doc_ids}, {"off_cu_seqlens", d->off_cu_seqlens}, {"plan", d->plan}};
    int n = (int)(sizeof f / sizeof f[0]);
    int count = 2 + n - (m->drop ? 1 : 0) + (m->dup ? 1 : 0) + (m->extra ? 1 : 0) - (m->drop_split ? 1 : 0);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)count);
    pk_str(&pk, "kind");
    pk_str(&pk, m->kind);
    for (int i = 0; i < n; i++) {
        if (m->drop && !strcmp(m->drop, f[i].k)) continue;
        for (int rep = 0; rep < ((m->dup && !strcmp(m->dup, f[i].k)) ? 2 : 1); rep++) {
            pk_str(&pk, f[i].k);
            if (m->as_string && !strcmp(m->as_string, f[i].k)) pk_str(&pk, "12");
            else msgpack_pack_uint64(&pk, (m->override && !strcmp(m->override, f[i].k)) ? m->override_value : f[i].v);
        }
    }
    if (!m->drop_split) {
        pk_str(&pk, "split");
        pk_str(&pk, m->split ? m->split : desc_split_name(d->split));
    }
    if (m->extra) {
        pk_str(&pk, m->extra);
        msgpack_pack_uint64(&pk, 1);
    }
    if (m->trailing) msgpack_pack_nil(&pk);
}

static void expect_reject(struct mod m, const char *want) {
    struct desc_batch d = sample_batch(100, 4), out;
    char err[256] = "";
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (!m.kind) m.kind = "batch";
    if (!m.version) m.version = DESC_BATCH_VERSION;
    pack_batch_mod(&d, &m, &sb);
    int rc = desc_batch_decode(sb.data, sb.size, 0, &out, err, sizeof err);
    msgpack_sbuffer_destroy(&sb);
    ck_assert_msg(rc == -1, "accepted a descriptor that should fail with '%s'", want);
    ck_assert_msg(strstr(err, want), "error '%s' does not contain '%s'", err, want);
}

START_TEST(malformed_rejected) {
    /* the hand packer makes valid descriptors when unmodified */
    struct desc_batch d = sample_batch(100, 4), out;
    char err[256];
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_batch_mod(&d, &(struct mod){.kind = "batch", .version = DESC_BATCH_VERSION}, &sb);
    ck_assert_msg(desc_batch_decode(sb.data, sb.size, 0, &out, err, sizeof err) == 0, "%s", err);
    ck_assert(batch_eq(&d, &out));
    /* truncated bytes */
    ck_assert_int_eq(desc_batch_decode(sb.data, sb.size - 3, 0, &out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a complete msgpack object"), "%s", err);
    msgpack_sbuffer_destroy(&sb);

    expect_reject((struct mod){.kind = "features"}, "expected 'batch', found 'features'");
    expect_reject((struct mod){.kind = "bogus"}, "expected batch, hidden or features, found 'bogus'");
    expect_reject((struct mod){.version = 5}, "batch descriptor version: expected 4, found 5 (written by a newer build)");
    expect_reject((struct mod){.version = 3}, "version: expected 4, found 3 (written by an older build");   /* before plan */
    expect_reject((struct mod){.version = 1}, "version: expected 4, found 1");   /* before the split field */
    expect_reject((struct mod){.drop = "n_docs"}, "expected 17 fields, found 16");
    expect_reject((struct mod){.drop = "plan"}, "expected 17 fields, found 16");
    expect_reject((struct mod){.drop_split = 1}, "expected 17 fields, found 16");
    expect_reject((struct mod){.extra = "color"}, "expected 17 fields, found 18");
    expect_reject((struct mod){.as_string = "plan"}, "field 'plan': expected an unsigned integer, found a string");
    expect_reject((struct mod){.split = "test"}, "split: expected 'train' or 'val', found 'test'");
    expect_reject((struct mod){.drop = "n_docs", .extra = "color"}, "unexpected field 'color'");
    expect_reject((struct mod){.drop = "epoch", .dup = "seq"}, "field 'seq' appears twice");
    expect_reject((struct mod){.as_string = "n_tokens"}, "field 'n_tokens': expected an unsigned integer, found a string");
    expect_reject((struct mod){.as_string = "version"}, "'version': expected an unsigned integer, found a string");
    expect_reject((struct mod){.trailing = 1}, "1 trailing bytes");
    expect_reject((struct mod){.override = "epoch", .override_value = 1ull << 33}, "does not fit in 32 bits");
    expect_reject((struct mod){.override = "n_docs", .override_value = 101}, "n_docs: expected 1..n_tokens (100), found 101");
    expect_reject((struct mod){.override = "n_tokens", .override_value = 0}, "n_tokens: expected 1..");
    expect_reject((struct mod){.override = "budget", .override_value = 99}, "budget: expected n_tokens (100)");
    expect_reject((struct mod){.override = "n_loss", .override_value = 0}, "n_loss");
    expect_reject((struct mod){.override = "off_input_ids", .override_value = 100}, "'input_ids': offset 100 is not a multiple");
    expect_reject((struct mod){.override = "off_cu_seqlens", .override_value = 1ull << 40}, "'cu_seqlens': bytes");
    expect_reject((struct mod){.override = "off_doc_ids", .override_value = 0}, "overlap");
    expect_reject((struct mod){.override = "payload_bytes", .override_value = 256}, "outside the payload of 256 bytes");

    /* not a map at all */
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 0);
    ck_assert_int_eq(desc_batch_decode(sb.data, sb.size, 0, &out, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "expected a msgpack map, found an array"), "%s", err);
    enum desc_kind k;
    ck_assert_int_eq(desc_peek_kind(sb.data, sb.size, &k, err, sizeof err), -1);
    msgpack_sbuffer_destroy(&sb);
    /* garbage bytes */
    const char junk[] = "\xc1\xc1\xc1";
    ck_assert_int_eq(desc_batch_decode(junk, 3, 0, &out, err, sizeof err), -1);
}
END_TEST

START_TEST(hidden_malformed_rejected) {
    char buf[DESC_MAX_BYTES], err[256];
    size_t len;
    struct desc_hidden h = {.batch = sample_batch(50, 2), .n_layers = 2, .layers = {3, 7}, .dtype = DESC_DTYPE_F32, .hidden_size = 8};
    desc_hidden_layout(&h);
    struct desc_hidden bad = h;
    bad.n_layers = 0;
    ck_assert_int_eq(desc_hidden_encode(&bad, buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "layers: expected 1..64"), "%s", err);
    bad = h;
    bad.layers[1] = -1;
    ck_assert_int_eq(desc_hidden_encode(&bad, buf, sizeof buf, &len, err, sizeof err), -1);
    bad = h;
    bad.dtype = (enum desc_dtype)9;
    ck_assert_int_eq(desc_hidden_encode(&bad, buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "dtype"), "%s", err);
    bad = h;
    bad.off_last = bad.off_states;   /* states and last overlap */
    ck_assert_int_eq(desc_hidden_encode(&bad, buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "overlap"), "%s", err);
    bad = h;
    bad.batch.payload_bytes -= 1;    /* last ends past the payload */
    ck_assert_int_eq(desc_hidden_encode(&bad, buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "'last'"), "%s", err);
    /* a features descriptor with a bad layout value */
    struct desc_features f = {.batch = h.batch, .layout = (enum desc_layout)0, .n_layers = 2, .layers = {3, 7},
                              .dtype = DESC_DTYPE_BF16, .hidden_size = 8};
    desc_features_layout(&f);
    ck_assert_int_eq(desc_features_encode(&f, buf, sizeof buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "layout"), "%s", err);
    /* a valid hidden descriptor decoded with a too-small slot */
    ck_assert_int_eq(desc_hidden_encode(&h, buf, sizeof buf, &len, err, sizeof err), 0);
    ck_assert_int_eq(desc_hidden_decode(buf, len, h.batch.payload_bytes - 1, &bad, err, sizeof err), -1);
    ck_assert_int_eq(desc_hidden_decode(buf, len, h.batch.payload_bytes, &bad, err, sizeof err), 0);
}
END_TEST

/* ---------------------------------------------------------------- payload contents */

/* Two documents of lengths 3 and 2. */
static void fill_good(struct desc_batch *d, void *payload) {
    *d = (struct desc_batch){.seq = 5, .n_tokens = 5, .budget = 8, .n_docs = 2, .n_loss = 3};
    desc_batch_layout(d);
    struct desc_batch_arrays a;
    desc_batch_arrays(d, payload, &a);
    int32_t ids[5] = {10, 11, 12, 20, 21}, pos[5] = {0, 1, 2, 0, 1}, doc[5] = {0, 0, 0, 1, 1};
    uint8_t lm[5] = {0, 1, 1, 0, 1};
    memcpy(a.input_ids, ids, sizeof ids);
    memcpy(a.position_ids, pos, sizeof pos);
    memcpy(a.doc_ids, doc, sizeof doc);
    memcpy(a.loss_mask, lm, sizeof lm);
    a.row_ids[0] = 7;
    a.row_ids[1] = 3;
    a.cu_seqlens[0] = 0;
    a.cu_seqlens[1] = 3;
    a.cu_seqlens[2] = 5;
}

START_TEST(payload_checked) {
    static _Alignas(64) char payload[4096];
    struct desc_batch d;
    struct desc_batch_arrays a;
    char err[256];
    fill_good(&d, payload);
    ck_assert_msg(desc_batch_check_payload(&d, payload, 0, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(desc_batch_check_payload(&d, payload, 22, err, sizeof err), 0);
    ck_assert_int_eq(desc_batch_check_payload(&d, payload, 21, err, sizeof err), -1);
    ck_assert_str_eq(err, "batch seq 5: input_ids[4] = 21 is outside [0, 21)");
    desc_batch_arrays(&d, payload, &a);
    a.position_ids[3] = 3;
    ck_assert_int_eq(desc_batch_check_payload(&d, payload, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "position_ids[3] = 3, expected 0"), "%s", err);
    fill_good(&d, payload);
    a.doc_ids[4] = -1;
    ck_assert_int_eq(desc_batch_check_payload(&d, payload, 0, err, sizeof err), -1);
    fill_good(&d, payload);
    a.cu_seqlens[1] = 5;
    ck_assert_int_eq(desc_batch_check_payload(&d, payload, 0, err, sizeof err), -1);
    fill_good(&d, payload);
    a.loss_mask[4] = 0;   /* document 1 has no supervised token, and n_loss is off */
    ck_assert_int_eq(desc_batch_check_payload(&d, payload, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "document 1 (row 3) has no loss_mask = 1 token"), "%s", err);
    fill_good(&d, payload);
    d.n_loss = 2;
    ck_assert_int_eq(desc_batch_check_payload(&d, payload, 0, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "n_loss 2"), "%s", err);
}
END_TEST

int main(void) {
    Suite *s = suite_create("desc");
    TCase *tc = tcase_create("desc");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, batch_round_trip);
    tcase_add_test(tc, hidden_features_round_trip);
    tcase_add_test(tc, split_round_trip);
    tcase_add_test(tc, plan_hash);
    tcase_add_test(tc, sizes_and_limits);
    tcase_add_test(tc, malformed_rejected);
    tcase_add_test(tc, hidden_malformed_rejected);
    tcase_add_test(tc, payload_checked);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
