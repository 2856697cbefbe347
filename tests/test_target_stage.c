/*
 * tests/test_target_stage.c — dflash-target as a real process between real rings, on the CPU:
 * dflash-mkmodel writes a tiny model and dataset, dflash-shm creates host rings `batches` and
 * `hidden`, dflash-pack fills `batches`, dflash-target --device cpu turns them into hidden
 * items, and this test reads `hidden`, checking every item against the target forward run in
 * this process on the same model (same code, same CPU: bit-identical) and that every batch seq
 * and every dataset row arrives exactly once.
 *
 * Crash test: the reader stops reading until `hidden` is full and dflash-target is blocked
 * holding a batch it has read (READING) but cannot publish; dflash-target is SIGKILLed there,
 * restarted with the same command, and the stream must still be complete, without duplicates,
 * with the held batch delivered again (the batches ring counts a redelivery). A second test runs
 * two replicas on the same rings and checks their metrics summaries (received by a sink of our
 * own). The model is f32 in 2 shards with an index in the first test, one f16 file in the second.
 */
#include "core/bus.h"
#include "core/desc.h"
#include "model/target.h"
#include "shm/ring.h"
#include "test_ring_util.h"

#include <fcntl.h>
#include <pthread.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>

#define TOKENS 256
#define SAMPLES 60
#define H 64

struct env {
    const char *run;
    char model[600], data[600];
    pid_t shm;
};

/* Fork/exec a stage binary with its output appended to <run>/<logname>.out; returns the pid. */
static pid_t spawn(const struct env *e, const char *logname, const char **argv) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s.out", e->run, logname);
    return test_spawn_log(path, argv);
}

/* dtype and shards vary per test so loading covers f32 shards + index and a single f16 file. */
static void env_start(struct env *e, const char *tag, int hidden_producers, const char *dtype, const char *shards) {
    e->run = tr_run(tag);
    snprintf(e->model, sizeof e->model, "%s/../model", e->run);
    snprintf(e->data, sizeof e->data, "%s/../data.jsonl", e->run);
    const char *mk[] = {test_bin("dflash-mkmodel"), "--out", e->model, "--preset", "tiny", "--dtype", dtype, "--shards", shards,
                        "--seed", "3", "--dataset", e->data, "--samples", "60", "--median-len", "40",
                        "--min-len", "8", "--max-len", "120", "--threads", "1", NULL};
    ck_assert_int_eq(tr_wait(spawn(e, "mkmodel", mk)), 0);
    char s1[200], s2[200];
    snprintf(s1, sizeof s1, "batches:slots=4,bytes=%llu,desc=4k,dev=host",
             (unsigned long long)desc_batch_max_payload_bytes(TOKENS));
    snprintf(s2, sizeof s2, "hidden:slots=3,bytes=%llu,desc=4k,dev=host,producers=%d",
             (unsigned long long)desc_hidden_max_payload_bytes(TOKENS, 2, H, DESC_DTYPE_F32), hidden_producers);
    e->shm = tr_start_shm(e->run, s1, s2, NULL);
}

static pid_t start_pack_epochs(const struct env *e, const char *epochs) {
    const char *argv[] = {test_bin("dflash-pack"), "--data", e->data, "--run", e->run, "--tokens", "256",
                          "--epochs", epochs, "--vocab-size", "512", "--seed", "1", NULL};
    return spawn(e, "pack", argv);
}

static pid_t start_pack(const struct env *e) { return start_pack_epochs(e, "1"); }

static pid_t start_target(const struct env *e, const char *logname) {
    const char *argv[] = {test_bin("dflash-target"), "--model", e->model, "--run", e->run, "--device", "cpu",
                          "--layers", "1,3", "--tokens", "256", "--heartbeat-s", "0.2", NULL};
    return spawn(e, logname, argv);
}

struct seen { int n_items; int seq_count[256]; int row_count[SAMPLES]; uint64_t tokens; };

/* Check one hidden item against the in-process forward and count its seq and rows. */
static void check_item(struct target *t, const struct ring_slot *s, struct seen *sn) {
    char err[512];
    struct desc_hidden hd;
    ck_assert_msg(desc_hidden_decode(s->desc, s->desc_len, s->payload_cap, &hd, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(hd.batch.seq, s->seq);
    ck_assert_int_eq(hd.dtype, DESC_DTYPE_F32);
    ck_assert_int_eq(hd.n_layers, 2);
    ck_assert_int_eq(hd.layers[0], 1);
    ck_assert_int_eq(hd.layers[1], 3);
    ck_assert_int_eq(hd.hidden_size, H);
    ck_assert_msg(desc_batch_check_payload(&hd.batch, s->payload, 512, err, sizeof err) == 0, "%s", err);
    struct desc_batch_arrays a;
    desc_batch_arrays(&hd.batch, s->payload, &a);
    int T = (int)hd.batch.n_tokens;
    size_t plane = (size_t)T * H;
    float *st = malloc(2 * plane * sizeof(float)), *last = malloc(plane * sizeof(float));
    struct target_batch b = {s->seq, T, (int)hd.batch.n_docs, a.input_ids, a.position_ids, a.cu_seqlens};
    ck_assert_msg(target_forward(t, &b, st, last, err, sizeof err) == 0, "%s", err);
    const char *pay = s->payload;
    ck_assert_msg(memcmp(pay + hd.off_states, st, 2 * plane * sizeof(float)) == 0,
                  "seq %llu: captured states differ from the in-process forward", (unsigned long long)s->seq);
    ck_assert_msg(memcmp(pay + hd.off_last, last, plane * sizeof(float)) == 0,
                  "seq %llu: last state differs from the in-process forward", (unsigned long long)s->seq);
    free(st);
    free(last);
    ck_assert_uint_lt(s->seq, 256);
    sn->seq_count[s->seq]++;
    for (uint32_t d = 0; d < hd.batch.n_docs; d++) {
        ck_assert(a.row_ids[d] >= 0 && a.row_ids[d] < SAMPLES);
        sn->row_count[a.row_ids[d]]++;
    }
    sn->tokens += (uint64_t)T;
    sn->n_items++;
}

/* Read one item (waiting up to 30 s); returns 0, or RING_END. */
static int read_one(struct ring *r, struct target *t, struct seen *sn) {
    struct ring_slot s;
    double t0 = tr_now();
    for (;;) {
        int rc = ring_acquire_read(r, 200, &s);
        if (rc == RING_END) return RING_END;
        if (rc == 0) break;
        ck_assert_msg(rc == RING_TIMEOUT, "ring_acquire_read: %s", ring_error());
        ck_assert_msg(tr_now() - t0 < 30, "no hidden item within 30 s");
    }
    check_item(t, &s, sn);
    ck_assert_int_eq(ring_release(r, &s), 0);
    return 0;
}

static void check_complete(const struct seen *sn) {
    ck_assert_int_gt(sn->n_items, 3);
    for (int i = 0; i < sn->n_items; i++)
        ck_assert_msg(sn->seq_count[i] == 1, "batch seq %d arrived %d times", i, sn->seq_count[i]);
    for (int i = sn->n_items; i < 256; i++) ck_assert_int_eq(sn->seq_count[i], 0);
    for (int i = 0; i < SAMPLES; i++)
        ck_assert_msg(sn->row_count[i] == 1, "dataset row %d arrived %d times", i, sn->row_count[i]);
}

static struct target *load_local(const struct env *e) {
    struct target_options o;
    target_options_defaults(&o);
    o.max_tokens = TOKENS;
    o.n_capture = 2;
    o.capture[0] = 1;
    o.capture[1] = 3;
    char err[512];
    struct target *t = target_load(e->model, &o, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    return t;
}

START_TEST(pipeline_survives_sigkill_of_target) {
    struct env e;
    env_start(&e, "tstage-kill", 1, "f32", "2");
    struct target *t = load_local(&e);
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *hidden = ring_attach(e.run, "hidden", RING_CONSUMER, 10000, err, sizeof err);
    ck_assert_msg(hidden != NULL, "%s", err);
    struct ring *batches = ring_attach(e.run, "batches", RING_OBSERVER, 10000, err, sizeof err);
    ck_assert_msg(batches != NULL, "%s", err);
    pid_t pack = start_pack(&e), tgt = start_target(&e, "target");
    struct seen sn;
    memset(&sn, 0, sizeof sn);
    ck_assert_int_eq(read_one(hidden, t, &sn), 0);
    ck_assert_int_eq(read_one(hidden, t, &sn), 0);

    /* Stop reading: wait until `hidden` is full and dflash-target holds a batch it cannot publish. */
    double t0 = tr_now();
    struct ring_status sh, sb;
    for (;;) {
        ring_get_status(hidden, &sh);
        ring_get_status(batches, &sb);
        if (sh.n_ready == sh.n_slots && sb.n_reading == 1) break;
        ck_assert_msg(tr_now() - t0 < 30, "dflash-target never blocked on a full hidden ring (ready %u/%u, "
                      "batches reading %u)", sh.n_ready, sh.n_slots, sb.n_reading);
        usleep(5000);
    }
    ck_assert_int_eq(kill(tgt, SIGKILL), 0);
    ck_assert_int_eq(tr_wait(tgt), 128 + SIGKILL);
    tgt = start_target(&e, "target");   /* the same command again */

    while (read_one(hidden, t, &sn) == 0) {}
    check_complete(&sn);
    ring_get_status(batches, &sb);
    ck_assert_msg(sb.redelivered >= 1, "the batch held by the killed target was not delivered again");
    ck_assert_int_eq(tr_wait(tgt), 0);
    ck_assert_int_eq(tr_wait(pack), 0);
    ring_close(hidden);
    ring_close(batches);
    tr_stop_shm(e.shm);
    ck_assert_int_eq(tr_count_segments(e.run), 0);
    target_free(t);
}
END_TEST

struct sink {
    int sock;
    volatile int stop;
    int heartbeats, summaries, batch_metrics, bad;
    double items, tokens;
    char err[512];
};

/* Receive metrics records until stop; check dflash-target's fields; sum its summaries. */
static void *sink_main(void *arg) {
    struct sink *k = arg;
    struct bus_record *rec = malloc(sizeof *rec);
    while (!k->stop) {
        void *msg = NULL;
        int n = nn_recv(k->sock, &msg, NN_MSG, 0);
        if (n < 0) continue;   /* timeout: look at stop again */
        int rc = bus_decode(msg, (size_t)n, rec, k->err, sizeof k->err);
        nn_freemsg(msg);
        if (rc != 0) { k->bad++; continue; }
        if (strcmp(rec->stage, "dflash-target")) continue;
        if (rec->kind == BUS_KIND_METRIC) {   /* one per batch: step = seq, its tokens and rate */
            if (!rec->has_step || bus_record_get(rec, "tokens", 0) <= 0 || bus_record_get(rec, BUS_K_TOKENS_PER_S, 0) <= 0) {
                snprintf(k->err, sizeof k->err, "dflash-target per-batch metric without step/tokens/tokens_per_s");
                k->bad++;
            }
            k->batch_metrics++;
            continue;
        }
        if (bus_record_get(rec, BUS_K_TOKENS_PER_S, -1) < 0 || bus_record_get(rec, BUS_K_BUSY_S, -1) < 0 ||
            bus_record_get(rec, BUS_K_WAIT_S, -1) < 0 || bus_record_get(rec, "host_mem_bytes", 0) <= 0) {
            snprintf(k->err, sizeof k->err, "dflash-target record without tokens_per_s/busy_s/wait_s/host_mem_bytes");
            k->bad++;
        }
        if (rec->kind == BUS_KIND_HEARTBEAT) k->heartbeats++;
        if (rec->kind == BUS_KIND_SUMMARY) {
            k->summaries++;
            k->items += bus_record_get(rec, BUS_K_ITEMS_OUT, 0);
            k->tokens += bus_record_get(rec, "tokens", 0);
        }
    }
    free(rec);
    return NULL;
}

START_TEST(two_replicas_share_the_rings) {
    struct env e;
    env_start(&e, "tstage-two", 2, "f16", "1");
    struct target *t = load_local(&e);
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *hidden = ring_attach(e.run, "hidden", RING_CONSUMER, 10000, err, sizeof err);
    ck_assert_msg(hidden != NULL, "%s", err);
    /* a metrics sink of our own, read by a thread while the stages run (nanomsg drops records
     * still queued at the sink when the sender closes, so they must be received promptly) */
    char addr[700];
    ck_assert_msg(bus_address(e.run, addr, sizeof addr, err, sizeof err) == 0, "%s", err);
    int sink = nn_socket(AF_SP, NN_PULL);
    ck_assert_int_ge(sink, 0);
    int to = 100;
    ck_assert_int_eq(nn_setsockopt(sink, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to), 0);
    ck_assert_msg(nn_bind(sink, addr) >= 0, "nn_bind(%s): %s", addr, nn_strerror(nn_errno()));
    struct sink sk;
    memset(&sk, 0, sizeof sk);
    sk.sock = sink;
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, sink_main, &sk), 0);
    pid_t a = start_target(&e, "target-a"), b = start_target(&e, "target-b"), pack = start_pack(&e);
    struct seen sn;
    memset(&sn, 0, sizeof sn);
    while (read_one(hidden, t, &sn) == 0) {}
    check_complete(&sn);
    ck_assert_int_eq(tr_wait(a), 0);
    ck_assert_int_eq(tr_wait(b), 0);
    ck_assert_int_eq(tr_wait(pack), 0);

    /* Each replica sent one summary; the summaries add up to what we read. */
    sk.stop = 1;
    pthread_join(th, NULL);
    nn_close(sink);
    ck_assert_msg(sk.bad == 0, "bad metrics record: %s", sk.err);
    /* Heartbeats are best effort (the first goes out before nanomsg's lazy connect, and this run
     * is shorter than a few periods); the summaries are the contract. */
    fprintf(stderr, "metrics: %d heartbeats, %d summaries, %d batch metrics from dflash-target\n", sk.heartbeats,
            sk.summaries, sk.batch_metrics);
    ck_assert_int_gt(sk.batch_metrics, 0);   /* best effort too, but most get through */
    ck_assert_int_le(sk.batch_metrics, sn.n_items);
    ck_assert_int_eq(sk.summaries, 2);
    ck_assert_int_eq((int)sk.items, sn.n_items);
    ck_assert_int_eq((int)sk.tokens, (int)sn.tokens);
    ring_close(hidden);
    tr_stop_shm(e.shm);
    target_free(t);
}
END_TEST

/* SIGKILL dflash-target at random moments (while it computes, publishes or waits) several times
 * while the stream flows. Nothing may be lost. A kill exactly between publishing a hidden item
 * and releasing its batch delivers that batch again (see dflash-target.c): such a duplicate must
 * be bit-identical (check_item verified both copies against the in-process forward) and is
 * counted, not failed. */
START_TEST(random_sigkills_lose_nothing) {
    struct env e;
    env_start(&e, "tstage-rand", 1, "f32", "1");
    struct target *t = load_local(&e);
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *hidden = ring_attach(e.run, "hidden", RING_CONSUMER, 10000, err, sizeof err);
    ck_assert_msg(hidden != NULL, "%s", err);
    pid_t pack = start_pack_epochs(&e, "3"), tgt = start_target(&e, "target");
    struct seen sn;
    memset(&sn, 0, sizeof sn);
    uint64_t rng = 0x5eed;
    int kills = 0, next_kill = 2;
    for (;;) {
        /* Kill after a random number of items, a random 0-4 ms after the last read: the target is
         * then computing, publishing, or waiting for the next batch. */
        if (kills < 5 && sn.n_items >= next_kill) {
            usleep((useconds_t)(test_rng_next(&rng) % 4000));
            ck_assert_int_eq(kill(tgt, SIGKILL), 0);
            tr_wait(tgt);
            tgt = start_target(&e, "target");
            kills++;
            next_kill = sn.n_items + 2 + (int)(test_rng_next(&rng) % 4);
        }
        struct ring_slot s;
        int rc = ring_acquire_read(hidden, 20, &s);
        if (rc == RING_END) break;
        if (rc == RING_TIMEOUT) continue;
        ck_assert_msg(rc == 0, "ring_acquire_read: %s", ring_error());
        check_item(t, &s, &sn);
        ck_assert_int_eq(ring_release(hidden, &s), 0);
    }
    int n_seq = 0, dups = 0;
    while (n_seq < 256 && sn.seq_count[n_seq] > 0) { dups += sn.seq_count[n_seq] - 1; n_seq++; }
    for (int i = n_seq; i < 256; i++) ck_assert_msg(sn.seq_count[i] == 0, "batch seq %d missing", n_seq);
    ck_assert_int_eq(kills, 5);
    ck_assert_int_gt(n_seq, 3);
    for (int i = 0; i < SAMPLES; i++) ck_assert_msg(sn.row_count[i] >= 3, "dataset row %d lost (3 epochs)", i);
    fprintf(stderr, "random kills: %d kills, %d batches, %d duplicated by a kill between publish and release\n",
            kills, n_seq, dups);
    ck_assert_int_eq(tr_wait(tgt), 0);
    ck_assert_int_eq(tr_wait(pack), 0);
    ring_close(hidden);
    tr_stop_shm(e.shm);
    target_free(t);
}
END_TEST

START_TEST(bad_flags_and_missing_model) {
    struct env e;
    e.run = tr_run("tstage-bad");
    const char *a1[] = {test_bin("dflash-target"), "--run", e.run, "--device", "cpu", NULL};
    ck_assert_int_eq(tr_wait(spawn(&e, "t1", a1)), 2);
    char model[700];
    snprintf(model, sizeof model, "%s/nope", e.run);
    const char *a2[] = {test_bin("dflash-target"), "--run", e.run, "--device", "cpu", "--model", model,
                        "--layers", "1", NULL};
    ck_assert_int_ne(tr_wait(spawn(&e, "t2", a2)), 0);
    const char *a3[] = {test_bin("dflash-target"), "--help", NULL};
    ck_assert_int_eq(tr_wait(spawn(&e, "t3", a3)), 0);
    char path[800], buf[8192];
    snprintf(path, sizeof path, "%s/t2.out", e.run);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    ck_assert_msg(strstr(buf, "nope") != NULL, "the error should name the missing model: %s", buf);
}
END_TEST

/* The whole text of <run>/<logname>.out (static buffer). */
static const char *out_text(const struct env *e, const char *logname) {
    static char buf[65536];
    char path[800];
    snprintf(path, sizeof path, "%s/%s.out", e->run, logname);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* --print-ring-spec sizes the hidden ring for the flags; a batch over the planned --tokens is
 * refused with what was planned and found; SIGTERM before end of stream exits 3 and leaves the
 * hidden ring undrained. */
START_TEST(ring_spec_budget_and_stop) {
    struct env e;
    env_start(&e, "tstage-spec", 1, "f32", "1");
    const char *ps[] = {test_bin("dflash-target"), "--model", e.model, "--device", "cpu", "--layers", "1,3",
                        "--tokens", "256", "--ring-slots", "3", "--print-ring-spec", NULL};
    ck_assert_int_eq(tr_wait(spawn(&e, "spec", ps)), 0);
    char want[256];
    snprintf(want, sizeof want, "hidden:slots=3,bytes=%llu,desc=%u,dev=host\n",
             (unsigned long long)desc_hidden_max_payload_bytes(TOKENS, 2, H, DESC_DTYPE_F32), DESC_MAX_BYTES);
    ck_assert_str_eq(out_text(&e, "spec"), want);
    const char *bad[] = {test_bin("dflash-target"), "--model", e.model, "--device", "cpu", "--heartbeat-s", "-1", NULL};
    ck_assert_int_eq(tr_wait(spawn(&e, "badhb", bad)), 2);
    ck_assert_ptr_nonnull(strstr(out_text(&e, "badhb"), "--heartbeat-s: -1 is out of range [0, 86400]"));
    const char *badl[] = {test_bin("dflash-target"), "--model", e.model, "--device", "cpu", "--layers", "1,x", NULL};
    ck_assert_int_eq(tr_wait(spawn(&e, "badl", badl)), 2);
    ck_assert_ptr_nonnull(strstr(out_text(&e, "badl"), "--layers: item 2 'x' is not an integer"));

    /* stopped before end of stream */
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *hidden = ring_attach(e.run, "hidden", RING_OBSERVER, 10000, err, sizeof err);
    ck_assert_msg(hidden != NULL, "%s", err);
    pid_t tgt = start_target(&e, "stopped");
    usleep(300 * 1000);
    ck_assert_int_eq(kill(tgt, SIGTERM), 0);
    ck_assert_int_eq(tr_wait(tgt), 3);
    ck_assert_ptr_nonnull(strstr(out_text(&e, "stopped"), "stopped by SIGTERM before end of stream"));
    ck_assert_int_eq(ring_is_drained(hidden), 0);

    /* a target planned for 128 tokens gets 256-token batches */
    const char *small[] = {test_bin("dflash-target"), "--model", e.model, "--run", e.run, "--device", "cpu",
                           "--layers", "1,3", "--tokens", "128", NULL};
    pid_t t2 = spawn(&e, "small", small), pack = start_pack(&e);
    ck_assert_int_eq(tr_wait(t2), 1);
    ck_assert_ptr_nonnull(strstr(out_text(&e, "small"), "batch seq 0: 256 tokens, this stage planned memory for --tokens 128"));
    kill(pack, SIGTERM);
    tr_wait(pack);
    ring_close(hidden);
    tr_shutdown_shm(e.run, e.shm);
}
END_TEST

int main(void) {
    Suite *s = suite_create("target_stage");
    TCase *tc = tcase_create("stage");
    tcase_set_timeout(tc, 90);
    tcase_add_test(tc, pipeline_survives_sigkill_of_target);
    tcase_add_test(tc, two_replicas_share_the_rings);
    tcase_add_test(tc, random_sigkills_lose_nothing);
    tcase_add_test(tc, bad_flags_and_missing_model);
    tcase_add_test(tc, ring_spec_budget_and_stop);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
