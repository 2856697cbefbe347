/*
 * tests/test_record.c — dflash-record and its module stages/core/record.h.
 *
 * Module: good batch/hidden items pass record_check and report their shape; corrupt descriptors
 * (garbage, truncated, wrong kind, seq disagreeing with the slot, short payload, bad arrays,
 * NaN / inf states in f32 and bf16) are rejected with a sentence naming the seq and the problem;
 * a restart's scan fills the relay's seen set in seq order; item files round-trip byte for byte, and a
 * corrupt, truncated or foreign file is refused; a temporary left by a killed writer is never
 * taken for an item.
 *
 * Stage (real processes on a real ring): this test publishes hidden items (with a duplicated seq
 * and out of order) into a host ring owned by a real dflash-shm and runs dflash-record on it:
 * every item is written once and reads back identical, the duplicate is dropped and counted, the
 * DONE summary says so; a corrupt descriptor stops the stage with exit 1 and a sentence (or is
 * skipped and counted with --on-bad skip); --expect stops early and a second recorder on the
 * same directory records only the rest.
 */
#include "core/desc.h"
#include "core/record.h"
#include "core/relay.h"
#include "shm/ring.h"
#include "core/safetensors.h"
#include "test_ring_util.h"

#include <fcntl.h>
#include <math.h>

#define T_TOK 40
#define N_DOC 3
#define K_LAY 2
#define H_DIM 8
#define CAP (64 * 1024)

/* Build hidden item `seq` (f32 states) into desc/payload; returns the descriptor length. The
 * states are a function of (seq, index), so a reader can check every value. */
static size_t make_hidden(uint64_t seq, void *desc, size_t desc_cap, uint8_t *payload, struct desc_hidden *out) {
    struct desc_hidden d;
    memset(&d, 0, sizeof d);
    d.batch.seq = seq;
    d.batch.epoch = 0;
    d.batch.n_tokens = T_TOK;
    d.batch.budget = 64;
    d.batch.n_docs = N_DOC;
    d.n_layers = K_LAY;
    d.layers[0] = 1;
    d.layers[1] = 3;
    d.dtype = DESC_DTYPE_F32;
    d.hidden_size = H_DIM;
    desc_hidden_layout(&d);
    ck_assert_uint_le(d.batch.payload_bytes, CAP);
    memset(payload, 0, d.batch.payload_bytes);
    struct desc_batch_arrays a;
    desc_batch_arrays(&d.batch, payload, &a);
    int cu[N_DOC + 1] = {0, 10, 25, T_TOK};
    uint32_t n_loss = 0;
    for (int doc = 0; doc < N_DOC; doc++) {
        a.row_ids[doc] = (int64_t)(seq * N_DOC + (uint64_t)doc);
        a.cu_seqlens[doc] = cu[doc];
        for (int t = cu[doc]; t < cu[doc + 1]; t++) {
            a.input_ids[t] = (int32_t)((seq * 31 + (uint64_t)t * 7) % 512);
            a.position_ids[t] = t - cu[doc];
            a.doc_ids[t] = doc;
            a.loss_mask[t] = t - cu[doc] >= 3;
            n_loss += a.loss_mask[t];
        }
    }
    a.cu_seqlens[N_DOC] = T_TOK;
    d.batch.n_loss = n_loss;
    float *st = (float *)(payload + d.off_states), *last = (float *)(payload + d.off_last);
    for (int i = 0; i < K_LAY * T_TOK * H_DIM; i++) st[i] = (float)seq + 0.001f * (float)i;
    for (int i = 0; i < T_TOK * H_DIM; i++) last[i] = -(float)seq - 0.002f * (float)i;
    size_t len = 0;
    char err[512];
    ck_assert_msg(desc_hidden_encode(&d, desc, desc_cap, &len, err, sizeof err) == 0, "%s", err);
    if (out) *out = d;
    return len;
}

static uint8_t g_payload[CAP] __attribute__((aligned(256)));
static uint8_t g_desc[DESC_MAX_BYTES];

/* record_check must fail and its sentence must contain every given fragment. */
static void expect_reject(const void *desc, size_t dlen, uint64_t seq, const void *payload, uint64_t plen,
                          enum desc_kind want, const char *frag1, const char *frag2) {
    struct record_info info;
    char err[1024] = "";
    int rc = record_check(desc, dlen, seq, payload, plen, CAP, want, 512, &info, err, sizeof err);
    ck_assert_msg(rc == -1, "expected a rejection containing '%s'", frag1);
    ck_assert_msg(strstr(err, frag1) != NULL, "'%s' not in: %s", frag1, err);
    if (frag2) ck_assert_msg(strstr(err, frag2) != NULL, "'%s' not in: %s", frag2, err);
    fprintf(stderr, "rejected as expected: %s\n", err);
}

START_TEST(good_items_pass) {
    struct desc_hidden d;
    size_t dlen = make_hidden(7, g_desc, sizeof g_desc, g_payload, &d);
    struct record_info info;
    char err[1024];
    ck_assert_msg(record_check(g_desc, dlen, 7, g_payload, d.batch.payload_bytes, CAP, DESC_KIND_HIDDEN, 512, &info, err,
                               sizeof err) == 0, "%s", err);
    ck_assert_int_eq(info.kind, DESC_KIND_HIDDEN);
    ck_assert_uint_eq(info.seq, 7);
    ck_assert_uint_eq(info.n_tokens, T_TOK);
    ck_assert_uint_eq(info.n_docs, N_DOC);
    ck_assert_uint_eq(info.payload_bytes, d.batch.payload_bytes);
    ck_assert_uint_eq(info.n_checked, (uint64_t)(K_LAY + 1) * T_TOK * H_DIM);
    /* any kind accepted; descriptor-only check (no payload) too */
    ck_assert_msg(record_check(g_desc, dlen, 7, NULL, d.batch.payload_bytes, CAP, 0, 0, &info, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(info.n_checked, 0);

    /* a plain batch item */
    struct desc_batch b = d.batch;
    desc_batch_layout(&b);
    uint8_t *bp = aligned_alloc(256, CAP);
    memset(bp, 0, CAP);
    struct desc_batch_arrays src, dst;
    desc_batch_arrays(&d.batch, g_payload, &src);
    desc_batch_arrays(&b, bp, &dst);
    memcpy(dst.row_ids, src.row_ids, N_DOC * 8);
    memcpy(dst.input_ids, src.input_ids, T_TOK * 4);
    memcpy(dst.loss_mask, src.loss_mask, T_TOK);
    memcpy(dst.position_ids, src.position_ids, T_TOK * 4);
    memcpy(dst.doc_ids, src.doc_ids, T_TOK * 4);
    memcpy(dst.cu_seqlens, src.cu_seqlens, (N_DOC + 1) * 4);
    uint8_t bdesc[DESC_MAX_BYTES];
    size_t blen;
    ck_assert_msg(desc_batch_encode(&b, bdesc, sizeof bdesc, &blen, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(record_check(bdesc, blen, 7, bp, b.payload_bytes, CAP, DESC_KIND_BATCH, 512, &info, err, sizeof err) == 0,
                  "%s", err);
    ck_assert_int_eq(info.kind, DESC_KIND_BATCH);
    /* ...but not where hidden items are required */
    expect_reject(bdesc, blen, 7, bp, b.payload_bytes, DESC_KIND_HIDDEN, "seq 7", "expected 'hidden', found 'batch'");
    free(bp);
}
END_TEST

START_TEST(corrupt_items_rejected_with_a_sentence) {
    struct desc_hidden d;
    size_t dlen = make_hidden(5, g_desc, sizeof g_desc, g_payload, &d);
    uint64_t pb = d.batch.payload_bytes;
    /* garbage and truncated descriptors */
    uint8_t junk[64];
    memset(junk, 0xc1, sizeof junk);
    expect_reject(junk, sizeof junk, 5, g_payload, pb, 0, "seq 5", "descriptor rejected");
    expect_reject(g_desc, dlen / 2, 5, g_payload, pb, 0, "seq 5", "rejected");
    expect_reject(g_desc, dlen + 3, 5, g_payload, pb, 0, "seq 5", "rejected");   /* trailing bytes */
    /* slot seq and descriptor seq disagree */
    expect_reject(g_desc, dlen, 6, g_payload, pb, 0, "seq 6", "descriptor says seq 5");
    /* the producer published fewer bytes than described */
    expect_reject(g_desc, dlen, 5, g_payload, pb - 1, 0, "seq 5", "describes");
    /* an offset beyond the slot: re-encode with states pushed past the capacity */
    struct desc_hidden bad = d;
    bad.off_last = CAP;
    bad.batch.payload_bytes = CAP + T_TOK * H_DIM * 4;
    uint8_t bd[DESC_MAX_BYTES];
    size_t bl;
    char err[512];
    ck_assert_msg(desc_hidden_encode(&bad, bd, sizeof bd, &bl, err, sizeof err) == 0, "%s", err);
    expect_reject(bd, bl, 5, g_payload, bad.batch.payload_bytes, 0, "seq 5", "capacity");
    /* bad batch arrays: a position id that does not restart at a document boundary */
    struct desc_batch_arrays a;
    desc_batch_arrays(&d.batch, g_payload, &a);
    a.position_ids[10] = 10;
    expect_reject(g_desc, dlen, 5, g_payload, pb, 0, "seq 5", "position_ids[10]");
    a.position_ids[10] = 0;
    /* non-finite states: NaN in the captured layers, inf in last */
    float *st = (float *)(g_payload + d.off_states), *last = (float *)(g_payload + d.off_last);
    st[H_DIM * 12 + 1] = NAN;
    expect_reject(g_desc, dlen, 5, g_payload, pb, 0, "seq 5", "(layer slot 0, token 12) is not finite");
    st[H_DIM * 12 + 1] = 0;
    last[H_DIM * 39] = INFINITY;
    expect_reject(g_desc, dlen, 5, g_payload, pb, 0, "seq 5", "last-layer state value 312 (token 39) is not finite");
    last[H_DIM * 39] = 0;
    struct record_info info;
    ck_assert_msg(record_check(g_desc, dlen, 5, g_payload, pb, CAP, 0, 512, &info, err, sizeof err) == 0, "%s", err);

    /* bf16 states: an exponent of all ones is inf/nan */
    struct desc_hidden h2 = d;
    h2.dtype = DESC_DTYPE_BF16;
    desc_hidden_layout(&h2);
    ck_assert_msg(desc_hidden_encode(&h2, bd, sizeof bd, &bl, err, sizeof err) == 0, "%s", err);
    uint16_t *b16 = (uint16_t *)(g_payload + h2.off_states);
    for (int i = 0; i < K_LAY * T_TOK * H_DIM; i++) b16[i] = 0x3f80;   /* 1.0 */
    uint16_t *l16 = (uint16_t *)(g_payload + h2.off_last);
    for (int i = 0; i < T_TOK * H_DIM; i++) l16[i] = 0xbf80;           /* -1.0 */
    ck_assert_msg(record_check(bd, bl, 5, g_payload, h2.batch.payload_bytes, CAP, 0, 512, &info, err, sizeof err) == 0, "%s", err);
    b16[T_TOK * H_DIM + 3] = 0x7fc0;   /* NaN in layer slot 1, token 0 */
    expect_reject(bd, bl, 5, g_payload, h2.batch.payload_bytes, 0, "seq 5", "(layer slot 1, token 0) is not finite");
    b16[T_TOK * H_DIM + 3] = 0x3f80;
    l16[0] = 0xff80;                    /* -inf */
    expect_reject(bd, bl, 5, g_payload, h2.batch.payload_bytes, 0, "seq 5", "last-layer state value 0");
}
END_TEST

/* A restart's scan fills the relay's seen set (one seen-set type for every consumer): files
 * found in any directory order are added in seq order, so none counts as out of order or as a
 * duplicate, next stops at the first missing seq, and a seq beyond the set's window is refused
 * with a sentence. */
START_TEST(scan_fills_the_seen_set_in_seq_order) {
    const char *dir = test_tmpdir("record-scan");
    char err[1024];
    struct desc_hidden d;
    uint64_t order[] = {4, 0, 2, 1};
    for (size_t i = 0; i < 4; i++) {
        size_t dlen = make_hidden(order[i], g_desc, sizeof g_desc, g_payload, &d);
        ck_assert_msg(record_write_file(dir, order[i], DESC_KIND_HIDDEN, g_desc, (uint32_t)dlen, g_payload,
                                        d.batch.payload_bytes, 0, err, sizeof err) == 0, "%s", err);
    }
    struct relay_seen s;
    ck_assert_int_eq(relay_seen_init(&s, 64, err, sizeof err), 0);
    uint64_t min = 77, n_bad = 0;
    ck_assert_int_eq(record_scan_dir(dir, &s, &min, &n_bad, err, sizeof err), 4);
    ck_assert_uint_eq(n_bad, 0);
    ck_assert_uint_eq(min, 0);
    ck_assert_uint_eq(s.n_distinct, 4);
    ck_assert_uint_eq(s.n_dups, 0);
    ck_assert_uint_eq(s.n_out_of_order, 0);
    ck_assert_uint_eq(s.next, 3);   /* the first seq a strict recorder waits for */
    ck_assert_uint_eq(s.max, 4);
    ck_assert(relay_seen_has(&s, 4) && !relay_seen_has(&s, 3));
    relay_seen_free(&s);
    /* a window of 64 seqs cannot hold seq 200 while seq 3 is missing */
    size_t dlen = make_hidden(200, g_desc, sizeof g_desc, g_payload, &d);
    ck_assert_msg(record_write_file(dir, 200, DESC_KIND_HIDDEN, g_desc, (uint32_t)dlen, g_payload, d.batch.payload_bytes,
                                    0, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(relay_seen_init(&s, 64, err, sizeof err), 0);
    ck_assert_int_eq(record_scan_dir(dir, &s, &min, &n_bad, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "seq 200") && strstr(err, "ahead"), "%s", err);
    relay_seen_free(&s);
}
END_TEST

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static size_t read_bytes(const char *path, void *p, size_t cap) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(p, 1, cap, f);
    fclose(f);
    return n;
}

START_TEST(files_roundtrip_and_corruption_refused) {
    const char *dir = test_tmpdir("record-files");
    char err[1024], path[700];
    struct desc_hidden d;
    size_t dlen = make_hidden(12, g_desc, sizeof g_desc, g_payload, &d);
    uint64_t pb = d.batch.payload_bytes;
    ck_assert_msg(record_write_file(dir, 12, DESC_KIND_HIDDEN, g_desc, (uint32_t)dlen, g_payload, pb, 0, err, sizeof err) == 0, "%s", err);
    make_hidden(13, g_desc, sizeof g_desc, g_payload, &d);
    ck_assert_msg(record_write_file(dir, 13, DESC_KIND_HIDDEN, g_desc, (uint32_t)dlen, g_payload, pb, 1, err, sizeof err) == 0, "%s", err);
    make_hidden(12, g_desc, sizeof g_desc, g_payload, &d);
    ck_assert_int_eq(record_path(path, sizeof path, dir, 12), 0);
    ck_assert_msg(strstr(path, "/item-000000000012.safetensors") != NULL, "%s", path);
    struct record_item it;
    ck_assert_msg(record_read_file(path, &it, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(it.h.seq, 12);
    ck_assert_uint_eq(it.h.kind, DESC_KIND_HIDDEN);
    ck_assert_uint_eq(it.h.desc_len, dlen);
    ck_assert_uint_eq(it.h.payload_len, pb);
    ck_assert_str_eq(it.h.model, "kind=hidden k=2 H=8 dtype=f32 layers=1,3");
    ck_assert_int_eq(memcmp(it.desc, g_desc, dlen), 0);
    ck_assert_int_eq(memcmp(it.payload, g_payload, pb), 0);
    ck_assert_uint_eq((uintptr_t)it.payload % 256, 0);
    /* the read-back item is a valid item again (what a replayer would publish) */
    struct record_info info;
    ck_assert_msg(record_check(it.desc, it.h.desc_len, it.h.seq, it.payload, it.h.payload_len, CAP, DESC_KIND_HIDDEN, 512,
                               &info, err, sizeof err) == 0, "%s", err);
    record_item_free(&it);
    /* a plain safetensors file: the generic reader sees the tensors by name */
    struct st_file f;
    ck_assert_msg(st_open(&f, path, err, sizeof err) == 0, "%s", err);
    const struct st_tensor *t = st_find(&f, "states");
    ck_assert(t && t->ndim == 3 && t->shape[0] == K_LAY && t->shape[1] == T_TOK && t->shape[2] == H_DIM);
    st_close(&f);

    /* no temporary is left behind; only the two items are in the directory */
    DIR *dd = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(dd)) != NULL) n += e->d_name[0] != '.';
    closedir(dd);
    ck_assert_int_eq(n, 2);
    /* the index: complete for 12..13, refused once 15 leaves a gap */
    ck_assert_int_eq(record_index_write(dir, err, sizeof err), 2);
    struct record_index ix;
    ck_assert_msg(record_index_read(dir, &ix, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ix.n_items, 2);
    ck_assert_uint_eq(ix.items[0].seq, 12);
    ck_assert_uint_eq(ix.items[1].payload_bytes, pb);
    ck_assert_str_eq(ix.model, "kind=hidden k=2 H=8 dtype=f32 layers=1,3");
    record_index_free(&ix);

    /* corruption: one data byte flipped, a truncated file, a foreign file, another model */
    static uint8_t buf[CAP + 8192];
    size_t len = read_bytes(path, buf, sizeof buf);
    char bad[800];
    snprintf(bad, sizeof bad, "%s/flipped.safetensors", dir);
    buf[len - 5] ^= 1;
    write_bytes(bad, buf, len);
    ck_assert_int_eq(record_read_file(bad, &it, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "data checksum mismatch") && strstr(err, "batch seq 12"), "%s", err);
    buf[len - 5] ^= 1;
    write_bytes(bad, buf, len - 100);
    ck_assert_int_eq(record_read_file(bad, &it, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "flipped.safetensors") && strstr(err, "truncated"), "%s", err);
    write_bytes(bad, "hello, world, this is not a record file at all; sixty-four bytes or more of it", 70);
    ck_assert_int_eq(record_read_file(bad, &it, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "flipped.safetensors"), "%s", err);
    static uint8_t pay[CAP] __attribute__((aligned(256)));
    uint8_t desc[DESC_MAX_BYTES];
    struct record_header h;
    ck_assert_int_eq(record_read_into(path, desc, sizeof desc, pay, sizeof pay, "kind=hidden k=2 H=16 dtype=f32 layers=1,3", &h,
                                      err, sizeof err), -1);
    ck_assert_msg(strstr(err, "belongs to another model") && strstr(err, "H=16") && strstr(err, "batch seq 12"), "%s", err);
    ck_assert_int_eq(record_read_into(path, desc, sizeof desc, pay, 100, NULL, &h, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "does not fit"), "%s", err);
    unlink(bad);

    char missing[800];
    snprintf(missing, sizeof missing, "%s/nope", dir);
    struct relay_seen s;
    uint64_t n_bad, min = 0;
    ck_assert_int_eq(relay_seen_init(&s, 0, err, sizeof err), 0);
    ck_assert_int_eq(record_scan_dir(missing, &s, &min, &n_bad, err, sizeof err), 0);
    relay_seen_free(&s);
    ck_assert_int_eq(record_index_read(missing, &ix, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "not a complete recording"), "%s", err);
}
END_TEST

/* Issue 14 item 4: resume must validate what it counts. A truncated and a garbage item file are
 * not counted as done (they are renamed *.bad and recorded again); before the fix the scan
 * trusted file names and counted both. */
START_TEST(resume_validates_item_files) {
    const char *dir = test_tmpdir("record-resume");
    char err[1024], path[700];
    struct desc_hidden d;
    for (uint64_t q = 0; q < 3; q++) {
        size_t dlen = make_hidden(q, g_desc, sizeof g_desc, g_payload, &d);
        ck_assert_msg(record_write_file(dir, q, DESC_KIND_HIDDEN, g_desc, (uint32_t)dlen, g_payload, d.batch.payload_bytes, 0,
                                        err, sizeof err) == 0, "%s", err);
    }
    static uint8_t buf[CAP + 8192];
    record_path(path, sizeof path, dir, 1);
    size_t len = read_bytes(path, buf, sizeof buf);
    write_bytes(path, buf, len / 2);                              /* truncated */
    record_path(path, sizeof path, dir, 2);
    write_bytes(path, "garbage garbage garbage garbage", 31);     /* garbage under a good name */
    char tmp[800];
    snprintf(tmp, sizeof tmp, "%s/item-000000000003.safetensors.tmp.%d", dir, 999999999);
    write_bytes(tmp, buf, 100);                                   /* a dead writer's temporary */
    struct relay_seen s;
    uint64_t n_bad = 0, min = 9;
    ck_assert_int_eq(relay_seen_init(&s, 0, err, sizeof err), 0);
    ck_assert_int_eq(record_scan_dir(dir, &s, &min, &n_bad, err, sizeof err), 1);
    ck_assert_uint_eq(n_bad, 2);
    ck_assert_uint_eq(min, 0);
    ck_assert(relay_seen_has(&s, 0) && !relay_seen_has(&s, 1) && !relay_seen_has(&s, 2) && !relay_seen_has(&s, 3));
    ck_assert_uint_eq(s.n_dups, 0);
    ck_assert_int_ne(access(tmp, F_OK), 0);
    snprintf(tmp, sizeof tmp, "%s.bad", path);
    ck_assert_int_eq(access(tmp, F_OK), 0);
    relay_seen_free(&s);
}
END_TEST

/* Issue 14 item 11: record files are reproducible. The slot's alignment padding carries bytes of
 * its previous item; the old format wrote them. Two items equal in their arrays but different
 * in the padding must give byte-identical files. */
START_TEST(files_are_reproducible) {
    const char *d1 = test_tmpdir("record-repro1"), *d2 = test_tmpdir("record-repro2");
    char err[1024], p1[700], p2[700];
    struct desc_hidden d;
    size_t dlen = make_hidden(4, g_desc, sizeof g_desc, g_payload, &d);
    ck_assert_msg(record_write_file(d1, 4, DESC_KIND_HIDDEN, g_desc, (uint32_t)dlen, g_payload, d.batch.payload_bytes, 0,
                                    err, sizeof err) == 0, "%s", err);
    /* garbage in every gap between arrays (row_ids of 3 docs end at 24, input_ids start at 256) */
    ck_assert_uint_gt(d.batch.off_input_ids, N_DOC * 8);
    memset(g_payload + N_DOC * 8, 0xAB, d.batch.off_input_ids - N_DOC * 8);
    memset(g_payload + d.off_last + T_TOK * H_DIM * 4, 0xCD, CAP - d.off_last - T_TOK * H_DIM * 4);
    ck_assert_msg(record_write_file(d2, 4, DESC_KIND_HIDDEN, g_desc, (uint32_t)dlen, g_payload, CAP, 0,
                                    err, sizeof err) == 0, "%s", err);
    record_path(p1, sizeof p1, d1, 4);
    record_path(p2, sizeof p2, d2, 4);
    static uint8_t b1[CAP + 8192], b2[CAP + 8192];
    size_t n1 = read_bytes(p1, b1, sizeof b1), n2 = read_bytes(p2, b2, sizeof b2);
    ck_assert_uint_eq(n1, n2);
    ck_assert_msg(memcmp(b1, b2, n1) == 0, "two recordings of the same item differ");
}
END_TEST

/* ---------------------------------------------------------------- the stage */

/* Fork/exec dflash-record with output appended to <run>/record.out; returns the pid. */
static pid_t spawn_record(const char *run, const char **extra) {
    char path[800];
    snprintf(path, sizeof path, "%s/record.out", run);
    const char *argv[32] = {test_bin("dflash-record"), "--run", run, "--device", "cpu", "--wait-ms", "10000"};
    int n = 7;
    for (int i = 0; extra[i] && n < 31; i++) argv[n++] = extra[i];
    return test_spawn_log(path, argv);
}

/* Publish hidden item seq into the ring (desc_override: publish these bytes instead). */
static void publish(struct ring *r, uint64_t seq, const void *desc_override, size_t override_len) {
    struct ring_slot s;
    double t0 = tr_now();
    int rc;
    while ((rc = ring_acquire_write(r, 200, &s)) == RING_TIMEOUT) ck_assert_msg(tr_now() - t0 < 20, "ring full for 20 s");
    ck_assert_int_eq(rc, 0);
    struct desc_hidden d;
    size_t dlen = make_hidden(seq, s.desc, s.desc_cap, s.payload, &d);
    if (desc_override) { memcpy(s.desc, desc_override, override_len); dlen = override_len; }
    ck_assert_int_eq(ring_publish(r, &s, seq, (uint32_t)dlen, d.batch.payload_bytes), 0);
}

/* Every file in out for seqs [0, n) reads back as make_hidden(seq) exactly. */
static void check_out(const char *out, int n) {
    char path[800], err[1024];
    static uint8_t ref[CAP] __attribute__((aligned(256)));
    uint8_t rdesc[DESC_MAX_BYTES];
    for (int q = 0; q < n; q++) {
        ck_assert_int_eq(record_path(path, sizeof path, out, (uint64_t)q), 0);
        struct record_item it;
        ck_assert_msg(record_read_file(path, &it, err, sizeof err) == 0, "%s", err);
        struct desc_hidden d;
        size_t dl = make_hidden((uint64_t)q, rdesc, sizeof rdesc, ref, &d);
        ck_assert_uint_eq(it.h.seq, (uint64_t)q);
        ck_assert_uint_eq(it.h.desc_len, dl);
        ck_assert_int_eq(memcmp(it.desc, rdesc, dl), 0);
        ck_assert_uint_eq(it.h.payload_len, d.batch.payload_bytes);
        ck_assert_msg(memcmp(it.payload, ref, d.batch.payload_bytes) == 0, "seq %d: payload differs", q);
        record_item_free(&it);
    }
    ck_assert_int_ne(record_path(path, sizeof path, out, (uint64_t)n) == 0 && access(path, F_OK) == 0, 1);
}

/* A stage test's world: a dflash-shm serving one host ring "hidden", this test as its producer,
 * and the recording directory <run>/rec. */
struct world {
    pid_t shm;
    const char *run;
    struct ring *r;
    char out[800];
};

static void world_start(struct world *w) {
    w->run = tr_run("record-stage");
    char spec[200], err[512];
    snprintf(spec, sizeof spec, "hidden:slots=4,bytes=%d,desc=4k,dev=host", CAP);
    w->shm = tr_start_shm(w->run, spec, NULL, NULL);
    ring_set_log(tr_quiet, NULL);
    snprintf(w->out, sizeof w->out, "%s/rec", w->run);
    w->r = ring_attach(w->run, "hidden", RING_PRODUCER, 5000, err, sizeof err);
    ck_assert_msg(w->r != NULL, "%s", err);
}

static void world_stop(struct world *w) {
    ring_close(w->r);
    tr_stop_shm(w->shm);
}

START_TEST(stage_records_every_item_once) {
    struct world w;
    world_start(&w);
    const char *run = w.run, *out = w.out;
    struct ring *r = w.r;
    const char *args[] = {"--out", out, "--kind", "hidden", "--vocab-size", "512", "--heartbeat-s", "0.1", NULL};
    pid_t rec = spawn_record(run, args);
    /* 0..9 with seq 3 published twice (a producer killed between publish and release) and 6/5 swapped */
    uint64_t order[] = {0, 1, 2, 3, 3, 4, 6, 5, 7, 8, 9};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) publish(r, order[i], NULL, 0);
    ck_assert_int_eq(ring_mark_drained(r), 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    check_out(out, 10);
    char path[900];
    snprintf(path, sizeof path, "%s/DONE", out);
    char *done = test_slurp_static(path);
    ck_assert_msg(done != NULL, "no DONE file in %s", out);
    ck_assert_msg(strstr(done, "\"complete\": true") && strstr(done, "\"recorded\": 10,") &&
                  strstr(done, "\"duplicates\": 1,") && strstr(done, "\"gaps\": 0,") &&
                  strstr(done, "\"min_seq\": 0,") && strstr(done, "\"max_seq\": 9,"), "DONE: %s", done);
    snprintf(path, sizeof path, "%s/logs/dflash-record.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "seq 3: duplicate dropped"), "log: %s", log ? log : "(none)");

    world_stop(&w);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

START_TEST(stage_strict_order_gap_and_resume) {
    struct world w;
    world_start(&w);
    const char *run = w.run, *out = w.out;
    struct ring *r = w.r;
    char path[900];
    /* first recorder: strict, stops after 3 distinct seqs */
    const char *a1[] = {"--out", out, "--strict", "--expect", "3", NULL};
    pid_t rec = spawn_record(run, a1);
    publish(r, 1, NULL, 0);   /* out of order: strict waits for 0 */
    publish(r, 0, NULL, 0);
    publish(r, 2, NULL, 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    check_out(out, 3);
    /* second recorder on the same directory: already has 0..2; a redelivered 2 is dropped; the
     * stream then skips seq 4, which strict mode reports at the end of the stream */
    const char *a2[] = {"--out", out, "--strict", NULL};
    rec = spawn_record(run, a2);
    publish(r, 2, NULL, 0);
    publish(r, 3, NULL, 0);
    publish(r, 5, NULL, 0);
    ck_assert_int_eq(ring_mark_drained(r), 0);
    ck_assert_int_eq(tr_wait(rec), 1);
    snprintf(path, sizeof path, "%s/logs/dflash-record.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "3 already on disk") && strstr(log, "--strict: seq 4 never arrived"), "log: %s",
                  log ? log : "(none)");
    ck_assert_msg(strstr(log, "1 duplicates dropped"), "log: %s", log);
    check_out(out, 4);   /* 0..3 recorded, nothing lost; 5 recorded too but flagged */
    snprintf(path, sizeof path, "%s/DONE", out);
    ck_assert_msg(access(path, F_OK) != 0, "an incomplete stream must not write DONE");
    world_stop(&w);
}
END_TEST

/* Issue 14 item 3: a recorder must never mark a stream with gaps complete. In arrival order
 * (no --strict), seqs 0, 1, 3 then the end of the stream: before the fix DONE said complete. */
START_TEST(stage_gap_is_never_complete) {
    struct world w;
    world_start(&w);
    const char *run = w.run, *out = w.out;
    struct ring *r = w.r;
    char path[900];
    const char *a1[] = {"--out", out, NULL};
    pid_t rec = spawn_record(run, a1);
    publish(r, 0, NULL, 0);
    publish(r, 1, NULL, 0);
    publish(r, 3, NULL, 0);
    ck_assert_int_eq(ring_mark_drained(r), 0);
    ck_assert_int_eq(tr_wait(rec), 1);
    snprintf(path, sizeof path, "%s/DONE", out);
    ck_assert_msg(access(path, F_OK) != 0, "a stream with a gap must not write DONE");
    snprintf(path, sizeof path, "%s/index.txt", out);
    ck_assert_msg(access(path, F_OK) != 0, "a stream with a gap must not write the index");
    snprintf(path, sizeof path, "%s/logs/dflash-record.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "seq 2 never arrived"), "log: %s", log ? log : "(none)");
    world_stop(&w);
}
END_TEST

START_TEST(stage_rejects_corrupt_descriptor) {
    struct world w;
    world_start(&w);
    const char *run = w.run;
    struct ring *r = w.r;
    char path[900];
    /* seq 1 carries a batch-kind-looking but truncated descriptor */
    uint8_t d[DESC_MAX_BYTES];
    static uint8_t p[CAP] __attribute__((aligned(256)));
    size_t dl = make_hidden(1, d, sizeof d, p, NULL);
    const char *a1[] = {"--kind", "hidden", NULL};
    pid_t rec = spawn_record(run, a1);
    publish(r, 0, NULL, 0);
    publish(r, 1, d, dl - 7);
    ck_assert_int_eq(tr_wait(rec), 1);
    snprintf(path, sizeof path, "%s/logs/dflash-record.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "item rejected: seq 1: ") && strstr(log, "descriptor rejected"), "log: %s",
                  log ? log : "(none)");
    /* the bad item is left READY for inspection; a recorder that skips bad items takes it */
    ck_assert_int_eq(unlink(path), 0);   /* so the checks below read the second recorder's log only */
    const char *a2[] = {"--on-bad", "skip", NULL};
    rec = spawn_record(run, a2);
    publish(r, 2, NULL, 0);
    ck_assert_int_eq(ring_mark_drained(r), 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    log = test_slurp_static(path);
    ck_assert_msg(strstr(log, "item rejected and skipped: seq 1") && strstr(log, "1 rejected"), "log: %s", log);
    ck_assert_msg(strstr(log, "summary: 1 items recorded"), "the skipping recorder takes seq 2 only: %s", log);
    world_stop(&w);
}
END_TEST

/* The relay's sink contract as the recorder uses it: a SIGTERM before the stream is complete exits
 * 3 (STAGE_EXIT_STOPPED) and writes neither DONE nor index.txt; a restart whose --expect is
 * already on disk finishes at once (exit 0, DONE) without taking an item; --strict --start-seq S
 * records from S on and never a seq below S. */
START_TEST(stage_stop_expect_on_disk_and_start_seq) {
    struct world w;
    world_start(&w);
    char path[1000];
    const char *a1[] = {"--out", w.out, NULL};
    pid_t rec = spawn_record(w.run, a1);
    publish(w.r, 0, NULL, 0);
    publish(w.r, 1, NULL, 0);
    record_path(path, sizeof path, w.out, 1);
    double t0 = tr_now();
    while (access(path, F_OK) != 0) {
        ck_assert_msg(tr_now() - t0 < 20, "seq 1 not recorded within 20 s");
        usleep(10000);
    }
    ck_assert_int_eq(kill(rec, SIGTERM), 0);
    ck_assert_int_eq(tr_wait(rec), 3);
    snprintf(path, sizeof path, "%s/DONE", w.out);
    ck_assert_msg(access(path, F_OK) != 0, "a stopped recorder must not write DONE");
    snprintf(path, sizeof path, "%s/index.txt", w.out);
    ck_assert_msg(access(path, F_OK) != 0, "a stopped recorder must not write the index");
    /* 0 and 1 are on disk: --expect 2 is reached before anything is taken */
    const char *a2[] = {"--out", w.out, "--expect", "2", NULL};
    ck_assert_int_eq(tr_wait(spawn_record(w.run, a2)), 0);
    snprintf(path, sizeof path, "%s/DONE", w.out);
    ck_assert_msg(access(path, F_OK) == 0, "--expect reached from disk writes DONE");
    check_out(w.out, 2);
    /* a fresh directory, strict from seq 5: seqs 3 and 4 are never recorded, 5 and 6 are */
    char out2[900];
    snprintf(out2, sizeof out2, "%s/rec2", w.run);
    const char *a3[] = {"--out", out2, "--strict", "--start-seq", "5", "--expect", "2", NULL};
    rec = spawn_record(w.run, a3);
    for (uint64_t q = 3; q < 7; q++) publish(w.r, q, NULL, 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    for (uint64_t q = 3; q < 8; q++) {
        record_path(path, sizeof path, out2, q);
        ck_assert_msg((access(path, F_OK) == 0) == (q == 5 || q == 6), "seq %llu: %s", (unsigned long long)q,
                      access(path, F_OK) == 0 ? "recorded" : "not recorded");
    }
    snprintf(path, sizeof path, "%s/DONE", out2);
    char *done = test_slurp_static(path);
    ck_assert_msg(done && strstr(done, "\"complete\": true") && strstr(done, "\"min_seq\": 5,"), "DONE: %s",
                  done ? done : "(none)");
    ring_close(w.r);   /* 3 and 4 may still sit in the ring: end the run explicitly */
    tr_shutdown_shm(w.run, w.shm);
}
END_TEST

START_TEST(stage_bad_flags) {
    const char *run = tr_run("record-flags");
    const char *a1[] = {"--kind", "nonsense", NULL};
    ck_assert_int_eq(tr_wait(spawn_record(run, a1)), 2);
    const char *a2[] = {"--start-seq", "3", NULL};
    ck_assert_int_eq(tr_wait(spawn_record(run, a2)), 2);
    const char *a3[] = {"--ring", "absent", "--wait-ms", "0", NULL};
    ck_assert_int_eq(tr_wait(spawn_record(run, a3)), 1);
    const char *a4[] = {"--heartbeat-s", "-1", NULL};   /* issue 24: was accepted */
    ck_assert_int_eq(tr_wait(spawn_record(run, a4)), 2);
    char path[800];
    snprintf(path, sizeof path, "%s/record.out", run);
    char *o = test_slurp_static(path);
    ck_assert_msg(o && strstr(o, "--kind: expected any, batch, hidden or features, got 'nonsense'"), "%s", o ? o : "");
}
END_TEST

int main(void) {
    Suite *s = suite_create("record");
    TCase *m = tcase_create("module");
    tcase_set_timeout(m, 20);
    tcase_add_test(m, good_items_pass);
    tcase_add_test(m, corrupt_items_rejected_with_a_sentence);
    tcase_add_test(m, scan_fills_the_seen_set_in_seq_order);
    tcase_add_test(m, files_roundtrip_and_corruption_refused);
    tcase_add_test(m, resume_validates_item_files);
    tcase_add_test(m, files_are_reproducible);
    suite_add_tcase(s, m);
    TCase *st = tcase_create("stage");
    tcase_set_timeout(st, 60);
    tcase_add_test(st, stage_records_every_item_once);
    tcase_add_test(st, stage_strict_order_gap_and_resume);
    tcase_add_test(st, stage_gap_is_never_complete);
    tcase_add_test(st, stage_rejects_corrupt_descriptor);
    tcase_add_test(st, stage_stop_expect_on_disk_and_start_seq);
    tcase_add_test(st, stage_bad_flags);
    suite_add_tcase(s, st);
    return test_run_suite(s);
}
