/*
 * tests/test_bus.c — stages/core/bus: encode/decode round trips for every kind, real sends over
 * nanomsg to a PULL socket (seq, dropped carried in later records), the decoder against malformed
 * input (random bytes, every truncation, wrong types, missing fields, wrong version, unknown kind,
 * hostile container sizes), and drop counting when no sink is bound (sends never block).
 */
#include "core/bus.h"
#include "core/fsutil.h"
#include "testutil.h"

#include <msgpack.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- helpers */

/* A hand-made field for crafting records the encoder would refuse to build. */
struct field {
    const char *key;
    char type;          /* s string, u uint, i negative int, d double, f float32, n nil, b bool, a array, m map, x bin */
    const char *s;
    double d;
    uint64_t u;
};

static size_t craft(char *out, size_t cap, const struct field *f, int n) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_str_with_body(&pk, f[i].key, strlen(f[i].key));
        switch (f[i].type) {
        case 's': msgpack_pack_str_with_body(&pk, f[i].s, strlen(f[i].s)); break;
        case 'u': msgpack_pack_uint64(&pk, f[i].u); break;
        case 'i': msgpack_pack_int64(&pk, -(int64_t)f[i].u); break;
        case 'd': msgpack_pack_double(&pk, f[i].d); break;
        case 'f': msgpack_pack_float(&pk, (float)f[i].d); break;
        case 'n': msgpack_pack_nil(&pk); break;
        case 'b': msgpack_pack_true(&pk); break;
        case 'a': msgpack_pack_array(&pk, 1); msgpack_pack_uint64(&pk, 1); break;
        case 'm': msgpack_pack_map(&pk, 0); break;
        case 'x': msgpack_pack_bin_with_body(&pk, "ab", 2); break;
        default: ck_abort_msg("bad field type %c", f[i].type);
        }
    }
    ck_assert_uint_le(sb.size, cap);
    memcpy(out, sb.data, sb.size);
    size_t len = sb.size;
    msgpack_sbuffer_destroy(&sb);
    return len;
}

/* A valid metric record as fields; tests copy it and break one thing. */
static const struct field base_metric[] = {
    {"v", 'u', NULL, 0, 1},
    {"kind", 's', "metric", 0, 0},
    {"stage", 's', "dflash-train", 0, 0},
    {"pid", 'u', NULL, 0, 4242},
    {"t", 'd', NULL, 1.7e9 + 0.25, 0},
    {"step", 'u', NULL, 0, 17},
    {"loss", 'd', NULL, 2.5, 0},
    {"n_items", 'u', NULL, 0, 3},
    {"delta", 'i', NULL, 0, 5},
};
#define N_BASE ((int)(sizeof base_metric / sizeof base_metric[0]))

static int decode_fields(const struct field *f, int n, struct bus_record *r, char *err) {
    char buf[4096];
    size_t len = craft(buf, sizeof buf, f, n);
    return bus_decode(buf, len, r, err, 256);
}

static struct bus_record make_record(enum bus_kind kind) {
    struct bus_record r;
    memset(&r, 0, sizeof r);
    r.version = BUS_VERSION;
    r.kind = kind;
    snprintf(r.stage, sizeof r.stage, "dflash-%s", bus_kind_name(kind));
    r.pid = 31337;
    r.t = 1796000000.123456;
    r.has_seq = 1;
    r.seq = 99;
    r.dropped = 7;
    if (kind == BUS_KIND_METRIC) { r.has_step = 1; r.step = 123456789012ull; }
    if (kind == BUS_KIND_EVENT) {
        snprintf(r.name, sizeof r.name, "checkpoint");
        snprintf(r.text, sizeof r.text, "wrote step-100 (\"quoted\", ünïcode)");
    }
    if (kind == BUS_KIND_HEARTBEAT) { r.has_wait_on = 1; snprintf(r.wait_on, sizeof r.wait_on, "ring batches empty"); }
    if (kind != BUS_KIND_EVENT) {
        r.n_kv = 4;
        snprintf(r.kv[0].name, BUS_NAME_MAX, "loss"); r.kv[0].value = 1.25;
        snprintf(r.kv[1].name, BUS_NAME_MAX, "items_in"); r.kv[1].value = 1e12;
        snprintf(r.kv[2].name, BUS_NAME_MAX, "neg"); r.kv[2].value = -3.5e-7;
        snprintf(r.kv[3].name, BUS_NAME_MAX, "nan"); r.kv[3].value = NAN;
    }
    return r;
}

static void assert_same(const struct bus_record *a, const struct bus_record *b) {
    ck_assert_int_eq(a->version, b->version);
    ck_assert_int_eq(a->kind, b->kind);
    ck_assert_str_eq(a->stage, b->stage);
    ck_assert_int_eq(a->pid, b->pid);
    ck_assert(a->t == b->t);
    ck_assert_int_eq(a->has_step, b->has_step);
    ck_assert_int_eq(a->has_seq, b->has_seq);
    ck_assert_uint_eq(a->step, b->step);
    ck_assert_uint_eq(a->seq, b->seq);
    ck_assert_uint_eq(a->dropped, b->dropped);
    ck_assert_str_eq(a->name, b->name);
    ck_assert_str_eq(a->text, b->text);
    ck_assert_int_eq(a->has_wait_on, b->has_wait_on);
    ck_assert_str_eq(a->wait_on, b->wait_on);
    ck_assert_int_eq(a->n_kv, b->n_kv);
    for (int i = 0; i < a->n_kv; i++) {
        ck_assert_str_eq(a->kv[i].name, b->kv[i].name);
        ck_assert(a->kv[i].value == b->kv[i].value || (isnan(a->kv[i].value) && isnan(b->kv[i].value)));
    }
}

/* ---------------------------------------------------------------- round trips */

START_TEST(roundtrip_every_kind) {
    for (int k = BUS_KIND_METRIC; k <= BUS_KIND_SUMMARY; k++) {
        struct bus_record in = make_record((enum bus_kind)k), out;
        void *buf;
        size_t len;
        char err[256];
        ck_assert_msg(bus_encode(&in, &buf, &len, err, sizeof err) == 0, "encode %s: %s", bus_kind_name(k), err);
        ck_assert_msg(bus_decode(buf, len, &out, err, sizeof err) == 0, "decode %s: %s", bus_kind_name(k), err);
        assert_same(&in, &out);
        ck_assert_double_eq(bus_record_get(&out, "loss", -1), k == BUS_KIND_EVENT ? -1 : 1.25);
        free(buf);
    }
}
END_TEST

START_TEST(roundtrip_limits) {
    /* Full BUS_MAX_KV named numbers, maximum-length names and text. */
    struct bus_record in = make_record(BUS_KIND_EVENT), out;
    memset(in.stage, 's', BUS_NAME_MAX - 1); in.stage[BUS_NAME_MAX - 1] = 0;
    memset(in.name, 'n', BUS_NAME_MAX - 1); in.name[BUS_NAME_MAX - 1] = 0;
    memset(in.text, 'x', BUS_TEXT_MAX - 1); in.text[BUS_TEXT_MAX - 1] = 0;
    in.n_kv = BUS_MAX_KV;
    for (int i = 0; i < BUS_MAX_KV; i++) {
        snprintf(in.kv[i].name, BUS_NAME_MAX, "m%02d_%.*s", i, 50, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
        in.kv[i].value = i * 0.5 - 3;
    }
    void *buf;
    size_t len;
    char err[256];
    ck_assert_msg(bus_encode(&in, &buf, &len, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_le(len, BUS_MSG_MAX);
    ck_assert_msg(bus_decode(buf, len, &out, err, sizeof err) == 0, "%s", err);
    assert_same(&in, &out);
    free(buf);
}
END_TEST

START_TEST(encode_rejects_bad_names) {
    char err[256];
    void *buf;
    size_t len;
    struct bus_record r = make_record(BUS_KIND_METRIC);
    snprintf(r.kv[1].name, BUS_NAME_MAX, "step");
    ck_assert_int_eq(bus_encode(&r, &buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "reserved") != NULL, "%s", err);
    r = make_record(BUS_KIND_METRIC);
    snprintf(r.kv[1].name, BUS_NAME_MAX, "loss");
    ck_assert_int_eq(bus_encode(&r, &buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "twice") != NULL, "%s", err);
    r = make_record(BUS_KIND_METRIC);
    r.stage[0] = 0;
    ck_assert_int_eq(bus_encode(&r, &buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "stage name") != NULL, "%s", err);
    r = make_record(BUS_KIND_METRIC);
    r.n_kv = BUS_MAX_KV + 1;
    ck_assert_int_eq(bus_encode(&r, &buf, &len, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "named numbers") != NULL, "%s", err);
}
END_TEST

/* ---------------------------------------------------------------- malformed input */

START_TEST(decode_base_is_valid) {
    struct bus_record r;
    char err[256] = "";
    ck_assert_msg(decode_fields(base_metric, N_BASE, &r, err) == 0, "%s", err);
    ck_assert_int_eq(r.kind, BUS_KIND_METRIC);
    ck_assert_uint_eq(r.step, 17);
    ck_assert_int_eq(r.n_kv, 3);
    ck_assert_double_eq(bus_record_get(&r, "n_items", 0), 3);
    ck_assert_double_eq(bus_record_get(&r, "delta", 0), -5);
}
END_TEST

START_TEST(decode_random_bytes) {
    uint64_t s = 12345;
    unsigned char buf[512];
    struct bus_record r;
    char err[256];
    for (int trial = 0; trial < 20000; trial++) {
        size_t len = 1 + test_rng_next(&s) % sizeof buf;
        for (size_t i = 0; i < len; i++) buf[i] = (unsigned char)test_rng_next(&s);
        /* Half the trials start with a map header so the walk goes deeper than the first byte. */
        if (trial & 1) buf[0] = (unsigned char)(0x80 | (test_rng_next(&s) & 0x0f));
        err[0] = 0;
        int rc = bus_decode(buf, len, &r, err, sizeof err);
        ck_assert_msg(rc < 0, "random bytes (trial %d) decoded as a valid record", trial);
        ck_assert_msg(strlen(err) > 10, "trial %d: no sentence for rc %d", trial, rc);
    }
}
END_TEST

START_TEST(decode_every_truncation) {
    for (int k = BUS_KIND_METRIC; k <= BUS_KIND_SUMMARY; k++) {
        struct bus_record in = make_record((enum bus_kind)k), out;
        void *buf;
        size_t len;
        char err[256];
        ck_assert(bus_encode(&in, &buf, &len, err, sizeof err) == 0);
        for (size_t cut = 0; cut < len; cut++) {
            err[0] = 0;
            ck_assert_int_eq(bus_decode(buf, cut, &out, err, sizeof err), BUS_EMALFORMED);
            ck_assert_msg(cut == 0 ? strstr(err, "empty") != NULL : strstr(err, "truncated") != NULL,
                          "cut %zu of %zu: %s", cut, len, err);
        }
        /* and one trailing byte too many */
        char *longer = malloc(len + 1);
        memcpy(longer, buf, len);
        longer[len] = 0;
        ck_assert_int_eq(bus_decode(longer, len + 1, &out, err, sizeof err), BUS_EMALFORMED);
        ck_assert_msg(strstr(err, "trailing") != NULL, "%s", err);
        free(longer);
        free(buf);
    }
}
END_TEST

START_TEST(decode_hostile_sizes) {
    struct bus_record r;
    char err[256];
    const unsigned char arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    const unsigned char map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v', 0x01};
    const unsigned char str32[] = {0x81, 0xa1, 'v', 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'};
    const unsigned char ext32[] = {0x81, 0xa1, 'v', 0xc9, 0x7f, 0xff, 0xff, 0xff, 0x01};
    const unsigned char c1[] = {0x81, 0xa1, 'v', 0xc1};
    unsigned char deep[64];
    for (int i = 0; i < 64; i++) deep[i] = 0x91;   /* 64 nested one-element arrays */
    ck_assert_int_eq(bus_decode(arr32, sizeof arr32, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "claims") != NULL, "%s", err);
    ck_assert_int_eq(bus_decode(map32, sizeof map32, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "claims") != NULL, "%s", err);
    ck_assert_int_eq(bus_decode(str32, sizeof str32, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "truncated") != NULL, "%s", err);
    ck_assert_int_eq(bus_decode(ext32, sizeof ext32, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_int_eq(bus_decode(c1, sizeof c1, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "0xc1") != NULL, "%s", err);
    ck_assert_int_eq(bus_decode(deep, sizeof deep, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "nesting") != NULL, "%s", err);
    char big[BUS_MSG_MAX + 1] = {0};
    ck_assert_int_eq(bus_decode(big, sizeof big, &r, err, sizeof err), BUS_EMALFORMED);
}
END_TEST

/* Valid records with a few random bytes changed: never a crash; either a valid record whose
 * fields respect the limits, or a rejection with a sentence. */
START_TEST(decode_mutated_records) {
    uint64_t st = 777;
    int rejected = 0, accepted = 0;
    for (int k = BUS_KIND_METRIC; k <= BUS_KIND_SUMMARY; k++) {
        struct bus_record in = make_record((enum bus_kind)k), out;
        void *enc;
        size_t len;
        char err[256];
        ck_assert(bus_encode(&in, &enc, &len, err, sizeof err) == 0);
        unsigned char buf[2048];
        for (int trial = 0; trial < 5000; trial++) {
            memcpy(buf, enc, len);
            int flips = 1 + (int)(test_rng_next(&st) % 3);
            for (int f = 0; f < flips; f++) buf[test_rng_next(&st) % len] = (unsigned char)test_rng_next(&st);
            err[0] = 0;
            int rc = bus_decode(buf, len, &out, err, sizeof err);
            if (rc < 0) {
                ck_assert_msg(strlen(err) > 10, "rc %d without a sentence", rc);
                rejected++;
            } else {
                ck_assert(strlen(out.stage) > 0 && strlen(out.stage) < BUS_NAME_MAX);
                ck_assert(out.n_kv >= 0 && out.n_kv <= BUS_MAX_KV);
                ck_assert(out.version == BUS_VERSION && out.kind <= BUS_KIND_SUMMARY);
                accepted++;
            }
        }
        free(enc);
    }
    ck_assert_int_gt(rejected, 1000);   /* most mutations break something the decoder checks */
    ck_assert_int_gt(accepted, 10);     /* and some only change a value */
}
END_TEST

/* Replace field `key` of the base record by `f` (or drop it when f.key is NULL), decode, expect rc
 * and a sentence containing `want`. */
static void expect_variant(const char *key, struct field f, int rc_want, const char *want) {
    struct field v[N_BASE + 1];
    int n = 0, found = 0;
    for (int i = 0; i < N_BASE; i++) {
        if (!strcmp(base_metric[i].key, key)) {
            found = 1;
            if (f.key) v[n++] = f;
        } else {
            v[n++] = base_metric[i];
        }
    }
    if (!found) v[n++] = f;   /* an added field */
    struct bus_record r;
    char err[256] = "";
    int rc = decode_fields(v, n, &r, err);
    ck_assert_msg(rc == rc_want, "variant %s: rc %d, want %d (%s)", key, rc, rc_want, err);
    ck_assert_msg(strstr(err, want) != NULL, "variant %s: '%s' does not mention '%s'", key, err, want);
}

START_TEST(decode_wrong_types) {
    expect_variant("t", (struct field){"t", 's', "now", 0, 0}, BUS_EMALFORMED, "field 't' must be a float");
    expect_variant("t", (struct field){"t", 'u', NULL, 0, 5}, BUS_EMALFORMED, "field 't' must be a float");
    expect_variant("pid", (struct field){"pid", 's', "12", 0, 0}, BUS_EMALFORMED, "field 'pid' must be a non-negative integer, found a string");
    expect_variant("pid", (struct field){"pid", 'u', NULL, 0, 0}, BUS_EMALFORMED, "field 'pid' must be 1..");
    expect_variant("step", (struct field){"step", 'i', NULL, 0, 3}, BUS_EMALFORMED, "field 'step' must be a non-negative integer, found a negative integer");
    expect_variant("step", (struct field){"step", 'd', NULL, 3.0, 0}, BUS_EMALFORMED, "found a float");
    expect_variant("stage", (struct field){"stage", 'u', NULL, 0, 1}, BUS_EMALFORMED, "field 'stage' must be a string");
    expect_variant("stage", (struct field){"stage", 's', "", 0, 0}, BUS_EMALFORMED, "field 'stage' must be 1..63 bytes");
    expect_variant("kind", (struct field){"kind", 'u', NULL, 0, 0}, BUS_EMALFORMED, "field 'kind' must be a string");
    expect_variant("v", (struct field){"v", 's', "1", 0, 0}, BUS_EMALFORMED, "field 'v' must be a non-negative integer");
    expect_variant("loss", (struct field){"loss", 's', "2.5", 0, 0}, BUS_EMALFORMED, "field 'loss' must be a number, found a string");
    expect_variant("loss", (struct field){"loss", 'n', NULL, 0, 0}, BUS_EMALFORMED, "found nil");
    expect_variant("loss", (struct field){"loss", 'b', NULL, 0, 0}, BUS_EMALFORMED, "found a boolean");
    expect_variant("loss", (struct field){"loss", 'a', NULL, 0, 0}, BUS_EMALFORMED, "found an array");
    expect_variant("loss", (struct field){"loss", 'm', NULL, 0, 0}, BUS_EMALFORMED, "found a map");
    expect_variant("loss", (struct field){"loss", 'x', NULL, 0, 0}, BUS_EMALFORMED, "found binary data");
    expect_variant("loss", (struct field){"loss", 'f', NULL, 2.5, 0}, 0, "");   /* float32 is a number */
    expect_variant("text", (struct field){"text", 's', "hi", 0, 0}, BUS_EMALFORMED, "only allowed in event records");
    expect_variant("wait_on", (struct field){"wait_on", 's', "x", 0, 0}, BUS_EMALFORMED, "only allowed in heartbeat records");
    expect_variant("dropped", (struct field){"dropped", 'd', NULL, 1.0, 0}, BUS_EMALFORMED, "field 'dropped' must be a non-negative integer");
}
END_TEST

START_TEST(decode_missing_fields) {
    const char *required[] = {"v", "kind", "stage", "pid", "t", "step"};
    const char *said[] = {"no schema version", "no 'kind'", "no 'stage'", "no 'pid'", "no 't'", "no 'step'"};
    for (int i = 0; i < 6; i++)
        expect_variant(required[i], (struct field){NULL, 0, NULL, 0, 0}, BUS_EMALFORMED, said[i]);
    /* an event without text; a heartbeat without seq */
    struct field ev[] = {{"v", 'u', NULL, 0, 1}, {"kind", 's', "event", 0, 0}, {"stage", 's', "x", 0, 0},
                         {"pid", 'u', NULL, 0, 1}, {"t", 'd', NULL, 1, 0}, {"seq", 'u', NULL, 0, 0},
                         {"name", 's', "boom", 0, 0}};
    struct bus_record r;
    char err[256];
    ck_assert_int_eq(decode_fields(ev, 7, &r, err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "'name' and 'text'") != NULL, "%s", err);
    struct field hb[] = {{"v", 'u', NULL, 0, 1}, {"kind", 's', "heartbeat", 0, 0}, {"stage", 's', "x", 0, 0},
                         {"pid", 'u', NULL, 0, 1}, {"t", 'd', NULL, 1, 0}};
    ck_assert_int_eq(decode_fields(hb, 5, &r, err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "no 'seq'") != NULL, "%s", err);
}
END_TEST

START_TEST(decode_version_kind_keys) {
    expect_variant("v", (struct field){"v", 'u', NULL, 0, 2}, BUS_EVERSION, "schema version 2 is not supported (expected 1)");
    expect_variant("kind", (struct field){"kind", 's', "gossip", 0, 0}, BUS_EKIND, "unknown record kind 'gossip'");
    /* a record of another version may carry fields v1 rejects: the version is what is reported */
    struct field v2[] = {{"v", 'u', NULL, 0, 9}, {"kind", 's', "metric", 0, 0}, {"t", 's', "later", 0, 0}};
    struct bus_record r;
    char err[256];
    ck_assert_int_eq(decode_fields(v2, 3, &r, err), BUS_EVERSION);
    /* duplicate keys, non-string keys, a non-map root */
    expect_variant("zzz", (struct field){"loss", 'd', NULL, 1, 0}, BUS_EMALFORMED, "field 'loss' appears twice");
    const unsigned char intkey[] = {0x81, 0x01, 0x01};
    ck_assert_int_eq(bus_decode(intkey, sizeof intkey, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "key #0 must be a string") != NULL, "%s", err);
    const unsigned char arr[] = {0x91, 0x01};
    ck_assert_int_eq(bus_decode(arr, sizeof arr, &r, err, sizeof err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "must be a msgpack map, found an array") != NULL, "%s", err);
    /* too many named numbers */
    struct field many[BUS_MAX_KV + 8];
    char names[BUS_MAX_KV + 8][16];
    int n = 0;
    for (int i = 0; i < 6; i++) many[n++] = base_metric[i];
    for (int i = 0; i < BUS_MAX_KV + 1; i++) {
        snprintf(names[i], sizeof names[i], "m%d", i);
        many[n++] = (struct field){names[i], 'u', NULL, 0, (uint64_t)i};
    }
    ck_assert_int_eq(decode_fields(many, n, &r, err), BUS_EMALFORMED);
    ck_assert_msg(strstr(err, "more than 64 named numbers") != NULL, "%s", err);
}
END_TEST

/* ---------------------------------------------------------------- sockets */

static int bind_pull(const char *run) {
    char addr[1024], err[256];
    ck_assert_msg(bus_address(run, addr, sizeof addr, err, sizeof err) == 0, "%s", err);
    int s = nn_socket(AF_SP, NN_PULL);
    ck_assert_int_ge(s, 0);
    int to = 2000;
    ck_assert_int_eq(nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to), 0);
    ck_assert_msg(nn_bind(s, addr) >= 0, "nn_bind(%s): %s", addr, nn_strerror(nn_errno()));
    return s;
}

static void recv_record(int s, struct bus_record *r) {
    void *msg = NULL;
    int n = nn_recv(s, &msg, NN_MSG, 0);
    ck_assert_msg(n > 0, "nn_recv: %s", nn_strerror(nn_errno()));
    char err[256];
    ck_assert_msg(bus_decode(msg, (size_t)n, r, err, sizeof err) == 0, "%s", err);
    nn_freemsg(msg);
}

START_TEST(send_to_real_sink) {
    const char *run = test_tmpdir("bus");
    char err[256];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    int s = bind_pull(run);
    struct bus *b = bus_open(run, "dflash-pack", err, sizeof err);
    ck_assert_msg(b != NULL, "%s", err);
    /* The connect is asynchronous: the first heartbeats may be dropped until it completes. */
    struct bus_kv hb[] = {{BUS_K_ITEMS_IN, 1}, {BUS_K_ITEMS_OUT, 2}};
    int accepted = 0;
    double t0 = time_mono_s();
    while (!accepted && time_mono_s() - t0 < 3) {
        accepted = bus_heartbeat(b, hb, 2, err, sizeof err);
        ck_assert_int_ge(accepted, 0);
        if (!accepted) usleep(5000);
    }
    ck_assert_msg(accepted, "no connection to the PULL socket within 3 s");
    uint64_t drops = bus_dropped(b);
    ck_assert_uint_eq(bus_sent(b), drops + 1);
    struct bus_record r;
    recv_record(s, &r);
    ck_assert_int_eq(r.kind, BUS_KIND_HEARTBEAT);
    ck_assert_uint_eq(r.seq, drops);
    ck_assert_uint_eq(r.dropped, drops);
    ck_assert_int_eq(r.pid, getpid());
    ck_assert_str_eq(r.stage, "dflash-pack");
    ck_assert_int_eq(r.has_wait_on, 1);
    ck_assert_str_eq(r.wait_on, "");

    bus_set_waiting(b, "ring batches full");
    ck_assert_int_eq(bus_heartbeat(b, hb, 2, err, sizeof err), 1);
    struct bus_kv m[] = {{"loss", 3.25}, {"eal", 1.5}};
    ck_assert_int_eq(bus_metric(b, 41, m, 2, err, sizeof err), 1);
    ck_assert_int_eq(bus_event(b, "resume", "from step 40", err, sizeof err), 1);
    ck_assert_int_eq(bus_summary(b, hb, 2, err, sizeof err), 1);
    recv_record(s, &r);
    ck_assert_str_eq(r.wait_on, "ring batches full");
    ck_assert_uint_eq(r.seq, drops + 1);
    recv_record(s, &r);
    ck_assert_int_eq(r.kind, BUS_KIND_METRIC);
    ck_assert_uint_eq(r.step, 41);
    ck_assert_double_eq(bus_record_get(&r, "eal", 0), 1.5);
    ck_assert_uint_eq(r.dropped, drops);
    recv_record(s, &r);
    ck_assert_int_eq(r.kind, BUS_KIND_EVENT);
    ck_assert_str_eq(r.name, "resume");
    ck_assert_str_eq(r.text, "from step 40");
    recv_record(s, &r);
    ck_assert_int_eq(r.kind, BUS_KIND_SUMMARY);
    ck_assert_uint_eq(r.seq, drops + 4);

    /* caller errors are -1 with a reason, not drops */
    struct bus_kv bad[] = {{"pid", 1}};
    ck_assert_int_eq(bus_metric(b, 1, bad, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "reserved") != NULL, "%s", err);
    ck_assert_int_eq(bus_metric(b, -1, m, 1, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "negative") != NULL, "%s", err);
    ck_assert_int_eq(bus_event(b, "", "x", NULL, 0), -1);   /* a NULL buffer is fine (err.h) */
    ck_assert_int_eq(bus_heartbeat(NULL, hb, 2, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "NULL") != NULL, "%s", err);
    ck_assert_uint_eq(bus_dropped(b), drops);
    bus_close(b);
    nn_close(s);
}
END_TEST

START_TEST(no_sink_drops_never_block) {
    const char *run = test_tmpdir("bus-nosink");
    char err[256];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    struct bus *b = bus_open(run, "dflash-target", err, sizeof err);
    ck_assert_msg(b != NULL, "%s", err);
    struct bus_kv m[] = {{"loss", 1}, {"tokens_per_s", 2}, {"x", 3}};
    double t0 = time_mono_s();
    for (int i = 0; i < 10000; i++) ck_assert_int_eq(bus_metric(b, i, m, 3, err, sizeof err), 0);
    double dt = time_mono_s() - t0;
    ck_assert_msg(dt < 2.0, "10000 sends with no sink took %.3f s", dt);
    ck_assert_uint_eq(bus_dropped(b), 10000);
    ck_assert_uint_eq(bus_sent(b), 10000);
    bus_close(b);
}
END_TEST

START_TEST(open_errors) {
    char err[256];
    ck_assert_ptr_null(bus_open("/tmp", "", err, sizeof err));
    ck_assert_msg(strstr(err, "stage name") != NULL, "%s", err);
    char longdir[300];
    memset(longdir, 'd', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = 0;
    ck_assert_ptr_null(bus_open(longdir, "x", err, sizeof err));
    ck_assert_msg(strstr(err, "AF_UNIX") != NULL, "%s", err);
    char addr[512];
    ck_assert_int_eq(bus_address("rel/run", addr, sizeof addr, err, sizeof err), 0);
    ck_assert_msg(addr[6] == '/' && strstr(addr, "/rel/run/bus/metrics.sock") != NULL, "%s", addr);
    ck_assert_ptr_null(bus_open(NULL, "x", err, sizeof err));
}
END_TEST

int main(void) {
    Suite *s = suite_create("bus");
    TCase *codec = tcase_create("codec");
    tcase_set_timeout(codec, 30);
    tcase_add_test(codec, roundtrip_every_kind);
    tcase_add_test(codec, roundtrip_limits);
    tcase_add_test(codec, encode_rejects_bad_names);
    tcase_add_test(codec, decode_base_is_valid);
    tcase_add_test(codec, decode_random_bytes);
    tcase_add_test(codec, decode_every_truncation);
    tcase_add_test(codec, decode_hostile_sizes);
    tcase_add_test(codec, decode_mutated_records);
    tcase_add_test(codec, decode_wrong_types);
    tcase_add_test(codec, decode_missing_fields);
    tcase_add_test(codec, decode_version_kind_keys);
    suite_add_tcase(s, codec);
    TCase *sock = tcase_create("socket");
    tcase_set_timeout(sock, 20);
    tcase_add_test(sock, send_to_real_sink);
    tcase_add_test(sock, no_sink_drops_never_block);
    tcase_add_test(sock, open_errors);
    suite_add_tcase(s, sock);
    return test_run_suite(s);
}
