/*
 * tests/test_relay.c — stages/core/relay: the seen set, the slot copy helpers, and relay_run in
 * its three shapes (source, transform, sink) on real rings created in the test process: order of
 * publish and release, end of stream and drain marks, dedup and in-order delivery, resume below a
 * seq, stop by SIGTERM (slots given back, output not drained, exit code 3), compute errors, and a
 * ring closed before the end of the stream.
 */
#include "core/err.h"
#include "core/relay.h"
#include "core/stage.h"
#include "test_ring_util.h"
#include "testutil.h"

#include <signal.h>

/* ---------------------------------------------------------------- seen set */

START_TEST(seen_set_window_and_next) {
    struct relay_seen s;
    char err[256];
    ck_assert_int_eq(relay_seen_init(&s, 100, err, sizeof err), 0);
    ck_assert_uint_eq(s.window, 128);   /* rounded up to 64 */
    ck_assert_int_eq(relay_seen_add(&s, 1, err, sizeof err), 1);
    ck_assert_uint_eq(s.next, 0);
    ck_assert_int_eq(relay_seen_has(&s, 1), 1);
    ck_assert_int_eq(relay_seen_has(&s, 0), 0);
    ck_assert_int_eq(relay_seen_add(&s, 0, err, sizeof err), 1);
    ck_assert_uint_eq(s.next, 2);             /* 0 and 1 contiguous */
    ck_assert_uint_eq(s.n_out_of_order, 1);   /* 0 after 1 */
    ck_assert_int_eq(relay_seen_add(&s, 1, err, sizeof err), 0);
    ck_assert_uint_eq(s.n_dups, 1);
    /* the window: next + 127 fits, next + 128 does not, with a sentence */
    ck_assert_int_eq(relay_seen_add(&s, 2 + 127, err, sizeof err), 1);
    ck_assert_int_eq(relay_seen_add(&s, 2 + 128, err, sizeof err), -1);
    ck_assert_str_eq(err, "seq 130 is 128 or more ahead of the next expected seq 2 (the seen set holds a window of 128 seqs)");
    /* wrap-around: a bit of an old seq never shows as a new one */
    for (uint64_t q = 2; q < 129; q++) ck_assert_int_eq(relay_seen_add(&s, q, err, sizeof err), 1);
    ck_assert_uint_eq(s.next, 130);
    ck_assert_int_eq(relay_seen_has(&s, 130), 0);
    ck_assert_int_eq(relay_seen_has(&s, 130 + 128 - 1), 0);
    ck_assert_uint_eq(s.n_distinct, 130);
    ck_assert_uint_eq(s.max, 129);
    /* resume: everything below 200 is seen, bits above kept */
    ck_assert_int_eq(relay_seen_add(&s, 210, err, sizeof err), 1);
    relay_seen_set_next(&s, 200);
    ck_assert_uint_eq(s.next, 200);
    ck_assert_int_eq(relay_seen_has(&s, 150), 1);
    ck_assert_int_eq(relay_seen_has(&s, 210), 1);
    ck_assert_int_eq(relay_seen_has(&s, 205), 0);
    relay_seen_set_next(&s, 10);   /* never lowers next */
    ck_assert_uint_eq(s.next, 200);
    relay_seen_set_next(&s, 100000);   /* far jump: the window is cleared at once */
    ck_assert_uint_eq(s.next, 100000);
    ck_assert_int_eq(relay_seen_has(&s, 100000), 0);
    ck_assert_int_eq(relay_seen_add(&s, 100000, err, sizeof err), 1);
    ck_assert_uint_eq(s.next, 100001);
    relay_seen_free(&s);
    relay_seen_free(&s);   /* safe twice */
}
END_TEST

/* ---------------------------------------------------------------- slot copies */

START_TEST(slot_copies_host_and_errors) {
    uint8_t payload[64] = {0}, back[16];
    struct ring_slot s = {.index = 3, .seq = 9, .payload = payload, .payload_cap = sizeof payload, .device = -1};
    char err[256];
    ck_assert_int_eq(relay_slot_put(&s, 8, "abcdefgh", -1, 8, NULL, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(payload + 8, "abcdefgh", 8), 0);
    ck_assert_int_eq(relay_slot_put(&s, 60, "abcdefgh", -1, 8, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "slot 3: writing 8 bytes at offset 60 exceeds its payload capacity 64");
    ck_assert_int_eq(relay_slot_put(&s, 100, "a", -1, 1, NULL, err, sizeof err), -1);
    ck_assert_int_eq(relay_slot_put(&s, 100, "a", -1, 0, NULL, err, sizeof err), 0);   /* nothing to copy */
    s.payload_len = 16;
    ck_assert_int_eq(relay_slot_get(back, -1, &s, 8, 8, NULL, err, sizeof err), 0);
    ck_assert_int_eq(memcmp(back, "abcdefgh", 8), 0);
    ck_assert_int_eq(relay_slot_get(back, -1, &s, 12, 8, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "slot 3 (seq 9): reading 8 bytes at offset 12 exceeds its 16 payload bytes");
#ifndef DFLASH_CUDA
    s.on_device = 1;
    s.device = 0;
    ck_assert_int_eq(relay_slot_put(&s, 0, "a", -1, 1, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "copy of 1 bytes involves CUDA device 0 but this build has no CUDA support");
    s.on_device = 0;
    s.device = -1;
    ck_assert_int_eq(relay_slot_get(back, 1, &s, 0, 4, NULL, err, sizeof err), -1);
    ck_assert_str_eq(err, "copy of 4 bytes involves CUDA device 1 but this build has no CUDA support");
#endif
}
END_TEST

/* ---------------------------------------------------------------- rings for the loop */

struct env {
    const char *run;
    struct ring *c_in, *c_out;    /* creator handles */
    struct ring *feed, *drain;    /* the test's producer on `in`, consumer on `out` */
};

static void env_start(struct env *e, const char *tag, uint32_t slots) {
    char err[512];
    e->run = tr_run(tag);
    ring_set_log(tr_quiet, NULL);
    struct ring_spec in = {.name = "in", .n_slots = slots, .payload_bytes = 256, .desc_bytes = 64, .device = -1};
    struct ring_spec out = {.name = "out", .n_slots = slots, .payload_bytes = 256, .desc_bytes = 64, .device = -1};
    e->c_in = ring_create(e->run, &in, err, sizeof err);
    ck_assert_msg(e->c_in != NULL, "%s", err);
    e->c_out = ring_create(e->run, &out, err, sizeof err);
    ck_assert_msg(e->c_out != NULL, "%s", err);
    e->feed = ring_attach(e->run, "in", RING_PRODUCER, 1000, err, sizeof err);
    ck_assert_msg(e->feed != NULL, "%s", err);
    e->drain = ring_attach(e->run, "out", RING_CONSUMER, 1000, err, sizeof err);
    ck_assert_msg(e->drain != NULL, "%s", err);
}

static void env_stop(struct env *e) {
    ring_close(e->feed);
    ring_close(e->drain);
    ring_close(e->c_in);
    ring_close(e->c_out);
}

static void feed(struct env *e, uint64_t seq) {
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(e->feed, 1000, &s), 0);
    item_write(&s, seq);
    ck_assert_int_eq(ring_publish(e->feed, &s, seq, sizeof(struct item_desc), item_len(seq)), 0);
}

/* Read everything READY on `out`: seqs into got[], checking each item. Returns the count. */
static int drain_out(struct env *e, uint64_t *got, int max) {
    int n = 0;
    struct ring_slot s;
    while (ring_acquire_read(e->drain, 0, &s) == 0) {
        ck_assert_msg(item_check(&s), "seq %llu: bad item", (unsigned long long)s.seq);
        ck_assert_int_lt(n, max);
        got[n++] = s.seq;
        ck_assert_int_eq(ring_release(e->drain, &s), 0);
    }
    return n;
}

/* -1: never (stop_at/fail_at: call number; drop_seq: seq; end_at: source item index). */
#define CALLS_NONE {.stop_at = -1, .fail_at = -1, .drop_seq = -1, .end_at = -1}

struct calls {
    int n, stop_at, fail_at, drop_seq, end_at;
    uint64_t seqs[64];
    struct ring *in;              /* transform: the input ring, to check the order of publish and release */
};

/* Transform: copy the item; while computing, the input slot is still READING (not released). */
static int copy_compute(void *ctx, struct relay_item *it, char *err, int err_len) {
    struct calls *c = ctx;
    if (c->n == c->fail_at) return err_fail(err, err_len, "compute failed on purpose at call %d", c->n);
    c->seqs[c->n++] = it->seq;
    if (c->n == c->stop_at) raise(SIGTERM);
    if (it->in && it->seq == (uint64_t)c->drop_seq) return RELAY_DROP;
    if (it->in) {
        ck_assert(item_check(it->in));
        struct ring_status st;
        ring_get_status(c->in, &st);
        ck_assert_uint_ge(st.n_reading, 1);
    }
    if (it->out) {
        if (!it->in) {   /* source: make item n-1 */
            if (c->n - 1 == c->end_at) return RELAY_END;
            it->seq = (uint64_t)(c->n - 1);
        }
        item_write(it->out, it->seq);
        it->desc_len = sizeof(struct item_desc);
        it->payload_len = item_len(it->seq);
        it->n_tokens = 10;
    }
    return RELAY_DONE;
}

/* Open a relay over the env's rings with the test's callbacks; cfg supplies the rest (rings,
 * modes, windows, at_end). */
static struct relay *open_cfg(struct env *e, struct calls *c, struct relay_config cfg) {
    char err[512];
    cfg.run_dir = e->run;
    cfg.attach_wait_ms = 1000;
    cfg.wait_ms = 20;
    cfg.ctx = c;
    cfg.compute = copy_compute;
    struct relay *r = relay_open(&cfg, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    c->in = e->c_in;
    return r;
}

static struct relay *open_relay(struct env *e, struct calls *c, const char *in, const char *out, int dedup, int in_order) {
    return open_cfg(e, c, (struct relay_config){.in_ring = in, .out_ring = out, .dedup = dedup, .in_order = in_order});
}

/* relay_run must fail with exactly this sentence. */
static void run_fails_with(struct relay *r, const char *want) {
    char err[512] = "";
    ck_assert_int_eq(relay_run(r, err, sizeof err), -1);
    ck_assert_str_eq(err, want);
}

START_TEST(transform_end_of_stream) {
    struct env e;
    env_start(&e, "relay-tr", 8);
    for (uint64_t q = 0; q < 5; q++) feed(&e, q);
    ck_assert_int_eq(ring_mark_drained(e.feed), 0);
    struct calls c = CALLS_NONE;
    c.drop_seq = 3;
    struct relay *r = open_relay(&e, &c, "in", "out", 0, 0);
    char err[512];
    int rc = relay_run(r, err, sizeof err);
    ck_assert_msg(rc == RELAY_DONE, "%d %s", rc, err);
    ck_assert_int_eq(relay_exit_code(rc), 0);
    const struct relay_stats *st = relay_stats(r);
    ck_assert_uint_eq(st->items_in, 5);
    ck_assert_uint_eq(st->items_out, 4);   /* seq 3 dropped by compute */
    ck_assert_uint_eq(st->dropped, 1);
    ck_assert_uint_eq(st->tokens, 40);
    ck_assert_int_eq(ring_is_drained(e.c_out), 1);   /* end of stream passed on */
    uint64_t got[16];
    ck_assert_int_eq(drain_out(&e, got, 16), 4);
    ck_assert_uint_eq(got[0], 0);
    ck_assert_uint_eq(got[3], 4);
    struct ring_status is;
    ring_get_status(e.c_in, &is);
    ck_assert_uint_eq(is.n_free, 8);   /* every input released */
    relay_close(r);
    env_stop(&e);
}
END_TEST

START_TEST(sink_in_order_drops_duplicates_and_resumes) {
    struct env e;
    env_start(&e, "relay-sink", 8);
    uint64_t order[] = {3, 1, 2, 1, 4, 0, 5};   /* seq 0, 1 below the resume point; 1 twice */
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) feed(&e, order[i]);
    ck_assert_int_eq(ring_mark_drained(e.feed), 0);
    struct calls c = CALLS_NONE;
    struct relay *r = open_relay(&e, &c, "in", NULL, 0, 1);
    relay_set_next_seq(r, 2);
    char err[512];
    int rc = relay_run(r, err, sizeof err);
    ck_assert_msg(rc == RELAY_DONE, "%d %s", rc, err);
    ck_assert_int_eq(c.n, 4);   /* 2, 3, 4, 5 in seq order */
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(c.seqs[i], (uint64_t)(2 + i));
    ck_assert_uint_eq(relay_seen_set(r)->next, 6);
    ck_assert_uint_eq(relay_stats(r)->dropped, 3);   /* 0, 1 and 1 again */
    ck_assert_uint_eq(relay_stats(r)->items_out, 0);
    relay_close(r);
    env_stop(&e);
}
END_TEST

START_TEST(source_marks_drained_at_end) {
    struct env e;
    env_start(&e, "relay-src", 8);
    struct calls c = CALLS_NONE;
    c.end_at = 3;
    struct relay *r = open_relay(&e, &c, NULL, "out", 0, 0);
    char err[512];
    int rc = relay_run(r, err, sizeof err);
    ck_assert_msg(rc == RELAY_DONE, "%d %s", rc, err);
    ck_assert_uint_eq(relay_stats(r)->items_out, 3);
    ck_assert_int_eq(ring_is_drained(e.c_out), 1);
    uint64_t got[8];
    ck_assert_int_eq(drain_out(&e, got, 8), 3);
    struct ring_status os;
    ring_get_status(e.c_out, &os);
    ck_assert_uint_eq(os.n_writing, 0);   /* the slot claimed for the END call was abandoned */
    relay_close(r);
    env_stop(&e);
}
END_TEST

/* SIGTERM mid-stream: RELAY_STOPPED, exit code 3, the output NOT drained, held slots given back. */
START_TEST(stop_by_sigterm_is_not_end_of_stream) {
    struct stage_common sc;
    stage_common_defaults(&sc);
    sc.device = "cpu";
    stage_start(&sc, 0);   /* the SIGTERM handler sets the stop flag */
    struct env e;
    env_start(&e, "relay-stop", 8);
    for (uint64_t q = 0; q < 6; q++) feed(&e, q);   /* not drained: the stream goes on */
    struct calls c = CALLS_NONE;
    c.stop_at = 2;
    struct relay *r = open_relay(&e, &c, "in", "out", 0, 0);
    char err[512];
    int rc = relay_run(r, err, sizeof err);
    ck_assert_int_eq(rc, RELAY_STOPPED);
    ck_assert_int_eq(relay_exit_code(rc), STAGE_EXIT_STOPPED);
    ck_assert_int_eq(STAGE_EXIT_STOPPED, 3);
    ck_assert_uint_eq(relay_stats(r)->items_out, 2);   /* the item computing when the signal came is published */
    ck_assert_int_eq(ring_is_drained(e.c_out), 0);
    struct ring_status is, os;
    ring_get_status(e.c_in, &is);
    ring_get_status(e.c_out, &os);
    ck_assert_uint_eq(is.n_ready, 4);   /* seqs 2..5 still READY upstream */
    ck_assert_uint_eq(is.n_reading, 0);
    ck_assert_uint_eq(os.n_writing, 0);
    relay_close(r);
    env_stop(&e);
}
END_TEST

/* compute fails: -1 with its sentence; the input goes back READY (for inspection or another
 * consumer) and the output slot back FREE. */
START_TEST(compute_error_gives_slots_back) {
    struct env e;
    env_start(&e, "relay-err", 8);
    for (uint64_t q = 0; q < 3; q++) feed(&e, q);
    struct calls c = CALLS_NONE;
    c.fail_at = 1;
    struct relay *r = open_relay(&e, &c, "in", "out", 0, 0);
    run_fails_with(r, "compute failed on purpose at call 1");
    ck_assert_int_eq(relay_exit_code(-1), 1);
    struct ring_status is, os;
    ring_get_status(e.c_in, &is);
    ring_get_status(e.c_out, &os);
    ck_assert_uint_eq(is.n_ready, 2);
    ck_assert_uint_eq(is.lowest_ready_seq, 1);
    ck_assert_uint_eq(os.n_writing, 0);
    ck_assert_uint_eq(os.n_ready, 1);
    ck_assert_int_eq(ring_is_drained(e.c_out), 0);
    relay_close(r);
    env_stop(&e);
}
END_TEST

/* The input ring closed (dflash-shm shut down) before its producer drained it: an error, not an
 * end of stream; and bad configurations are refused with a sentence. */
START_TEST(closed_ring_and_bad_config) {
    struct env e;
    env_start(&e, "relay-closed", 4);
    feed(&e, 0);
    struct calls c = CALLS_NONE;
    struct relay *r = open_relay(&e, &c, "in", "out", 0, 0);
    ring_set_closed(e.c_in);
    run_fails_with(r, "ring 'in' was closed (dflash-shm shut down?) before the end of the stream");
    ck_assert_int_eq(ring_is_drained(e.c_out), 0);
    relay_close(r);
    char err[512];
    struct relay_config bad = {.run_dir = e.run, .compute = copy_compute};
    ck_assert_ptr_null(relay_open(&bad, err, sizeof err));
    ck_assert_str_eq(err, "relay: neither an input nor an output ring");
    bad.in_ring = "in";
    bad.compute = NULL;
    ck_assert_ptr_null(relay_open(&bad, err, sizeof err));
    ck_assert_str_eq(err, "relay: the compute callback is required");
    bad.compute = copy_compute;
    bad.in_ring = "nope";
    ck_assert_ptr_null(relay_open(&bad, err, sizeof err));
    ck_assert_msg(strstr(err, "input ring 'nope'") != NULL, "%s", err);
    relay_close(NULL);
    env_stop(&e);
}
END_TEST

/* A seq beyond the seen window is refused before compute runs, and stays READY upstream. */
START_TEST(seq_beyond_the_window_refused_before_compute) {
    struct env e;
    env_start(&e, "relay-win", 4);
    feed(&e, 100);
    struct calls c = CALLS_NONE;
    struct relay *r = open_cfg(&e, &c, (struct relay_config){.in_ring = "in", .dedup = 1, .seen_window = 64});
    run_fails_with(r, "ring 'in': seq 100 is 64 or more ahead of the next expected seq 0 (the seen set holds a window "
                      "of 64 seqs)");
    ck_assert_int_eq(c.n, 0);
    struct ring_status is;
    ring_get_status(e.c_in, &is);
    ck_assert_uint_eq(is.n_ready, 1);
    relay_close(r);
    env_stop(&e);
}
END_TEST

/* A sink that wants no more (dflash-record --expect N) ends the stream through at_end. */
static int enough(void *ctx, char *err, int err_len) {
    (void)err; (void)err_len;
    return ((struct calls *)ctx)->n >= 2;
}

START_TEST(sink_at_end_stops_early) {
    struct env e;
    env_start(&e, "relay-expect", 8);
    for (uint64_t q = 0; q < 5; q++) feed(&e, q);
    struct calls c = CALLS_NONE;
    char err[512];
    struct relay *r = open_cfg(&e, &c, (struct relay_config){.in_ring = "in", .at_end = enough});
    ck_assert_int_eq(relay_run(r, err, sizeof err), RELAY_DONE);
    ck_assert_int_eq(c.n, 2);
    struct ring_status is;
    ring_get_status(e.c_in, &is);
    ck_assert_uint_eq(is.n_ready, 3);   /* the rest is left for whoever comes next */
    ck_assert_uint_eq(is.n_reading, 0);
    relay_close(r);
    env_stop(&e);
}
END_TEST

int main(void) {
    Suite *s = suite_create("relay");
    TCase *tc = tcase_create("relay");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, seen_set_window_and_next);
    tcase_add_test(tc, slot_copies_host_and_errors);
    tcase_add_test(tc, transform_end_of_stream);
    tcase_add_test(tc, sink_in_order_drops_duplicates_and_resumes);
    tcase_add_test(tc, source_marks_drained_at_end);
    tcase_add_test(tc, stop_by_sigterm_is_not_end_of_stream);
    tcase_add_test(tc, compute_error_gives_slots_back);
    tcase_add_test(tc, closed_ring_and_bad_config);
    tcase_add_test(tc, seq_beyond_the_window_refused_before_compute);
    tcase_add_test(tc, sink_at_end_stops_early);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
