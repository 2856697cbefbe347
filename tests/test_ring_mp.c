/*
 * tests/test_ring_mp.c — rings across real processes: a real dflash-shm owns the segments,
 * forked producers and consumers move items, and the test kills them with SIGKILL.
 *
 * - strict_transfer: 3 producers, 2 rank-filtered strict consumers, 100 000 items; every seq
 *   arrives exactly once, in order per consumer, checksum intact.
 * - lowest_first_transfer: 2 producers, 3 consumers taking the lowest READY seq; no loss or
 *   duplicate. lowest_first_in_order: 1 producer, 1 consumer, every seq in order.
 * - consumer_killed: the item a SIGKILLed consumer held is delivered again to its restart.
 *   consumer_killed_lower_seq_first: a live consumer's next claim is the dead one's item, not a later seq.
 * - producer_killed: a producer SIGKILLed mid-write leaves nothing visible; its restart takes
 *   over its attach entry and the stream ends normally.
 * - stress: 2 producers + 2 consumers on both cores while the test SIGKILLs and restarts a random
 *   one every 0.3-0.7 s; then a clean end without deadlock, nothing lost, nothing left in a slot.
 *   The issue asks for one minute; CI runs DFLASH_STRESS_S=20 by default to keep `make test`
 *   short; run with DFLASH_STRESS_S=60 for the full minute.
 * - shm_killed_and_restarted: dflash-shm SIGKILLed; attached stages keep moving host items; a
 *   restart with the same spec adopts the segment; one with another spec re-creates it and a
 *   stage still on the old segment gets -1 with a sentence telling it to restart.
 * Every test ends by stopping dflash-shm and checking that no segment of its run is left.
 */
#include "test_ring_util.h"

#include <stdatomic.h>

#define N_ITEMS 100000

struct shared {
    _Atomic uint64_t next_seq;   /* producers take seqs here after a slot is theirs */
    _Atomic int stop;
    _Atomic uint64_t bad;        /* items that failed item_check */
    _Atomic uint64_t order_errors;
    uint64_t cap;                /* seqs >= cap are not produced */
    _Atomic uint8_t *seen;       /* [cap] deliveries released per seq */
    _Atomic uint8_t *published;  /* [cap] 1 once ring_publish returned 0 */
};

static const char *g_run;
static struct shared *g_sh;
static int g_n_consumers;
static int g_rank;
static int g_strict;
static int g_check_order;   /* non-strict, one producer and one consumer: seqs must come in order */
static int g_hold;   /* stress: sometimes sleep while holding a slot, so kills land mid-item */

static struct shared *shared_new(uint64_t cap) {
    struct shared *s = tr_shared(sizeof *s);
    s->cap = cap;
    s->seen = tr_shared(cap);
    s->published = tr_shared(cap);
    return s;
}

static struct ring *child_attach(const char *name, int role) {
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *r = ring_attach(g_run, name, role, 5000, err, sizeof err);
    if (!r) fprintf(stderr, "child attach: %s\n", err);
    return r;
}

/* ---------------------------------------------------------------- workers */

static int producer_main(void *arg) {
    (void)arg;
    struct ring *r = child_attach("items", RING_PRODUCER);
    if (!r) return 10;
    for (;;) {
        if (atomic_load(&g_sh->stop)) break;
        struct ring_slot s;
        int rc = ring_acquire_write(r, 200, &s);
        if (rc == RING_TIMEOUT) continue;
        if (rc != 0) { fprintf(stderr, "producer: acquire %d %s\n", rc, ring_error()); return 11; }
        uint64_t seq = atomic_fetch_add(&g_sh->next_seq, 1);
        if (seq >= g_sh->cap) { ring_abandon(r, &s); break; }
        item_write(&s, seq);
        if (g_hold && seq % 16 == 0) usleep(100);
        if (ring_publish(r, &s, seq, sizeof(struct item_desc), item_len(seq)) != 0) {
            fprintf(stderr, "producer: %s\n", ring_error());
            return 12;
        }
        atomic_store(&g_sh->published[seq], 1);
    }
    if (ring_mark_drained(r) != 0) return 13;
    ring_close(r);
    return 0;
}

static int consumer_main(void *arg) {
    (void)arg;
    struct ring *r = child_attach("items", RING_CONSUMER);
    if (!r) return 20;
    if (g_strict && ring_set_rank(r, (uint32_t)g_rank, (uint32_t)g_n_consumers) != 0) return 21;
    uint64_t next = (uint64_t)g_rank;
    double t0 = tr_now();
    for (;;) {
        struct ring_slot s;
        int rc = g_strict ? ring_acquire_read_seq(r, next, 1000, &s) : ring_acquire_read(r, 1000, &s);
        if (rc == RING_END) break;
        if (rc == RING_TIMEOUT) {
            if (tr_now() - t0 > 120) { fprintf(stderr, "consumer %d: stuck waiting for seq %llu\n", g_rank, (unsigned long long)next); return 22; }
            continue;
        }
        if (rc != 0) { fprintf(stderr, "consumer: %s\n", ring_error()); return 23; }
        if (!item_check(&s) || s.seq >= g_sh->cap) atomic_fetch_add(&g_sh->bad, 1);
        else atomic_fetch_add(&g_sh->seen[s.seq], 1);
        if ((g_strict || g_check_order) && s.seq != next) atomic_fetch_add(&g_sh->order_errors, 1);
        if (g_hold && s.seq % 16 == 1) usleep(100);
        next = s.seq + (uint64_t)g_n_consumers;
        if (ring_release(r, &s) != 0) { fprintf(stderr, "consumer: %s\n", ring_error()); return 24; }
    }
    if (g_strict && next < g_sh->cap) { fprintf(stderr, "consumer %d: END before seq %llu\n", g_rank, (unsigned long long)next); return 25; }
    ring_close(r);
    return 0;
}

static struct ring_status *status_of(const char *run, const char *name) {
    static struct ring_status st;
    char err[512];
    struct ring *o = ring_attach(run, name, RING_OBSERVER, 1000, err, sizeof err);
    ck_assert_msg(o != NULL, "observer: %s", err);
    ring_get_status(o, &st);
    ring_close(o);
    return &st;
}

/* ---------------------------------------------------------------- transfers */

static void transfer(const char *tag, int n_prod, int n_cons, int strict, const char *spec) {
    g_run = tr_run(tag);
    g_sh = shared_new(N_ITEMS);
    g_n_consumers = n_cons;
    g_strict = strict;
    pid_t shm = tr_start_shm(g_run, spec, NULL, NULL);
    pid_t pids[16];
    double t0 = tr_now();
    for (int i = 0; i < n_cons; i++) { g_rank = i; pids[i] = tr_fork(consumer_main, NULL); }
    for (int i = 0; i < n_prod; i++) pids[n_cons + i] = tr_fork(producer_main, NULL);
    for (int i = 0; i < n_cons + n_prod; i++) ck_assert_int_eq(tr_wait(pids[i]), 0);
    double dt = tr_now() - t0;
    ck_assert_uint_eq(atomic_load(&g_sh->bad), 0);
    ck_assert_uint_eq(atomic_load(&g_sh->order_errors), 0);
    uint64_t lost = 0, dup = 0;
    for (uint64_t i = 0; i < N_ITEMS; i++) {
        uint8_t v = atomic_load(&g_sh->seen[i]);
        lost += v == 0;
        dup += v > 1;
    }
    ck_assert_msg(lost == 0 && dup == 0, "%llu lost, %llu duplicated of %d", (unsigned long long)lost, (unsigned long long)dup, N_ITEMS);
    struct ring_status *st = status_of(g_run, "items");
    ck_assert_uint_eq(st->published, N_ITEMS);
    ck_assert_uint_eq(st->consumed, N_ITEMS);
    ck_assert_uint_eq(st->redelivered, 0);
    ck_assert_uint_eq(st->n_free, st->n_slots);
    ck_assert(st->drained);
    fprintf(stderr, "%s: %d items, %d producers, %d consumers: %.2f s (%.0f items/s)\n", tag, N_ITEMS, n_prod, n_cons, dt, N_ITEMS / dt);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}

START_TEST(strict_transfer) { transfer("ringstrict", 3, 2, 1, "items:slots=16,bytes=256,desc=64,producers=3"); }
END_TEST

START_TEST(lowest_first_transfer) { transfer("ringlowest", 2, 3, 0, "items:slots=16,bytes=256,desc=64,producers=2"); }
END_TEST

/* Lowest-first with one producer publishing in order: the consumer sees every seq in order
 * (a single scan could miss an earlier-published lower seq; ring.c scans twice). */
START_TEST(lowest_first_in_order) {
    g_check_order = 1;
    transfer("ringinorder", 1, 1, 0, "items:slots=8,bytes=256,desc=64,producers=1");
}
END_TEST

/* ---------------------------------------------------------------- kills */

static int g_pipe[2];

/* Takes one item, reports its seq through the pipe, then hangs until killed. */
static int consumer_hold_main(void *arg) {
    (void)arg;
    struct ring *r = child_attach("items", RING_CONSUMER);
    if (!r) return 30;
    struct ring_slot s;
    if (ring_acquire_read(r, 5000, &s) != 0) return 31;
    uint64_t seq = s.seq;
    if (write(g_pipe[1], &seq, sizeof seq) != sizeof seq) return 32;
    for (;;) pause();
}

/* Reads everything in order into the shared log (seq, deliveries), then returns. */
static int consumer_log_main(void *arg) {
    uint64_t *log = arg;   /* log[0] = count, then pairs (seq, deliveries) */
    struct ring *r = child_attach("items", RING_CONSUMER);
    if (!r) return 40;
    for (;;) {
        struct ring_slot s;
        int rc = ring_acquire_read(r, 5000, &s);
        if (rc == RING_END) break;
        if (rc != 0) return 41;
        if (!item_check(&s)) return 42;
        uint64_t n = log[0]++;
        log[1 + 2 * n] = s.seq;
        log[2 + 2 * n] = s.deliveries;
        if (ring_release(r, &s) != 0) return 43;
    }
    ring_close(r);
    return 0;
}

START_TEST(consumer_killed) {
    g_run = tr_run("ringkillc");
    pid_t shm = tr_start_shm(g_run, "items:slots=8,bytes=256,desc=64,producers=1", NULL, NULL);
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *p = ring_attach(g_run, "items", RING_PRODUCER, 1000, err, sizeof err);
    ck_assert_msg(p != NULL, "%s", err);
    for (uint64_t q = 0; q < 5; q++) {
        struct ring_slot s;
        ck_assert_int_eq(ring_acquire_write(p, 1000, &s), 0);
        item_write(&s, q);
        ck_assert_int_eq(ring_publish(p, &s, q, sizeof(struct item_desc), item_len(q)), 0);
    }
    ck_assert_int_eq(ring_mark_drained(p), 0);
    ck_assert_int_eq(pipe(g_pipe), 0);
    pid_t a = tr_fork(consumer_hold_main, NULL);
    uint64_t held = 99;
    ck_assert_int_eq(read(g_pipe[0], &held, sizeof held), sizeof held);
    ck_assert_uint_eq(held, 0);
    ck_assert_uint_eq(status_of(g_run, "items")->n_reading, 1);
    kill(a, SIGKILL);
    ck_assert_int_eq(tr_wait(a), 128 + SIGKILL);
    uint64_t *log = tr_shared(4096);
    pid_t b = tr_fork(consumer_log_main, log);   /* the restart */
    ck_assert_int_eq(tr_wait(b), 0);
    ck_assert_uint_eq(log[0], 5);
    for (uint64_t i = 0; i < 5; i++) {
        ck_assert_uint_eq(log[1 + 2 * i], i);                 /* in order, seq 0 first again */
        ck_assert_uint_eq(log[2 + 2 * i], i == 0 ? 2 : 1);   /* seq 0 is a second delivery */
    }
    struct ring_status *st = status_of(g_run, "items");
    ck_assert_uint_eq(st->redelivered, 1);
    ck_assert_uint_eq(st->consumed, 5);
    ring_close(p);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

/* Two consumers taking the lowest READY seq (target replicas): one dies holding seq 0. The live one's very next
 * claim, with no wait (so no periodic recovery ran), must be seq 0 again and not seq 1: running past a dead
 * consumer's item fills the next ring with later seqs while that item waits (test_scale's replica kill hung so). */
START_TEST(consumer_killed_lower_seq_first) {
    g_run = tr_run("ringkilll");
    pid_t shm = tr_start_shm(g_run, "items:slots=8,bytes=256,desc=64,producers=1", NULL, NULL);
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *p = ring_attach(g_run, "items", RING_PRODUCER, 1000, err, sizeof err);
    ck_assert_msg(p != NULL, "%s", err);
    for (uint64_t q = 0; q < 5; q++) {
        struct ring_slot s;
        ck_assert_int_eq(ring_acquire_write(p, 1000, &s), 0);
        item_write(&s, q);
        ck_assert_int_eq(ring_publish(p, &s, q, sizeof(struct item_desc), item_len(q)), 0);
    }
    ck_assert_int_eq(ring_mark_drained(p), 0);
    struct ring *c = ring_attach(g_run, "items", RING_CONSUMER, 1000, err, sizeof err);
    ck_assert_msg(c != NULL, "%s", err);
    ck_assert_int_eq(pipe(g_pipe), 0);
    pid_t a = tr_fork(consumer_hold_main, NULL);
    uint64_t held = 99;
    ck_assert_int_eq(read(g_pipe[0], &held, sizeof held), sizeof held);
    ck_assert_uint_eq(held, 0);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_read(c, 0, &s), 0);   /* the holder lives: the next seq is ours */
    ck_assert_uint_eq(s.seq, 1);
    ck_assert_int_eq(ring_release(c, &s), 0);
    kill(a, SIGKILL);
    ck_assert_int_eq(tr_wait(a), 128 + SIGKILL);
    ck_assert_int_eq(ring_acquire_read(c, 0, &s), 0);
    ck_assert_msg(s.seq == 0, "a live consumer claimed seq %llu past seq 0 held by a dead one", (unsigned long long)s.seq);
    ck_assert_uint_eq(s.deliveries, 2);
    ck_assert_int_eq(ring_release(c, &s), 0);
    for (uint64_t q = 2; q < 5; q++) {
        ck_assert_int_eq(ring_acquire_read(c, 1000, &s), 0);
        ck_assert_uint_eq(s.seq, q);
        ck_assert_int_eq(ring_release(c, &s), 0);
    }
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), RING_END);
    ck_assert_uint_eq(status_of(g_run, "items")->redelivered, 1);
    ring_close(c);
    ring_close(p);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

/* Claims a slot, writes half an item, reports, and hangs until killed. */
static int producer_half_main(void *arg) {
    (void)arg;
    struct ring *r = child_attach("items", RING_PRODUCER);
    if (!r) return 50;
    struct ring_slot s;
    if (ring_acquire_write(r, 5000, &s) != 0) return 51;
    item_fill(s.payload, 0, item_len(0) / 2);
    struct item_desc d = {0, item_len(0), 12345};
    memcpy(s.desc, &d, sizeof d);
    char c = 1;
    if (write(g_pipe[1], &c, 1) != 1) return 52;
    for (;;) pause();
}

static int producer_three_main(void *arg) {
    (void)arg;
    struct ring *r = child_attach("items", RING_PRODUCER);
    if (!r) return 60;
    for (uint64_t q = 0; q < 3; q++) {
        struct ring_slot s;
        if (ring_acquire_write(r, 5000, &s) != 0) return 61;
        item_write(&s, q);
        if (ring_publish(r, &s, q, sizeof(struct item_desc), item_len(q)) != 0) return 62;
    }
    if (ring_mark_drained(r) != 0) return 63;
    ring_close(r);
    return 0;
}

START_TEST(producer_killed) {
    g_run = tr_run("ringkillp");
    pid_t shm = tr_start_shm(g_run, "items:slots=4,bytes=256,desc=64,producers=1", NULL, NULL);
    char err[512];
    ring_set_log(tr_quiet, NULL);
    ck_assert_int_eq(pipe(g_pipe), 0);
    pid_t a = tr_fork(producer_half_main, NULL);
    char c;
    ck_assert_int_eq(read(g_pipe[0], &c, 1), 1);
    ck_assert_uint_eq(status_of(g_run, "items")->n_writing, 1);
    kill(a, SIGKILL);
    ck_assert_int_eq(tr_wait(a), 128 + SIGKILL);
    struct ring *cons = ring_attach(g_run, "items", RING_CONSUMER, 1000, err, sizeof err);
    ck_assert_msg(cons != NULL, "%s", err);
    struct ring_slot s;
    /* Nothing half-written is visible, and the dead producer (never drained) keeps the stream open. */
    ck_assert_int_eq(ring_acquire_read(cons, 300, &s), RING_TIMEOUT);
    struct ring_status *st = status_of(g_run, "items");
    ck_assert_uint_eq(st->recovered_writes, 1);
    ck_assert_uint_eq(st->n_free, 4);
    ck_assert(!st->drained);
    pid_t b = tr_fork(producer_three_main, NULL);   /* the restart */
    ck_assert_int_eq(tr_wait(b), 0);
    for (uint64_t q = 0; q < 3; q++) {
        ck_assert_int_eq(ring_acquire_read(cons, 1000, &s), 0);
        ck_assert_uint_eq(s.seq, q);
        ck_assert_msg(item_check(&s), "seq %llu corrupt", (unsigned long long)q);
        ck_assert_int_eq(ring_release(cons, &s), 0);
    }
    ck_assert_int_eq(ring_acquire_read(cons, 1000, &s), RING_END);
    st = status_of(g_run, "items");
    ck_assert_int_eq(st->n_attached, 2);   /* the restart took over the dead producer's entry */
    ring_close(cons);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

/* ---------------------------------------------------------------- dflash-shm dies */

START_TEST(shm_killed_and_restarted) {
    g_run = tr_run("ringshmkill");
    const char *spec = "items:slots=4,bytes=256,desc=64,producers=1";
    pid_t shm = tr_start_shm(g_run, spec, NULL, NULL);
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *p = ring_attach(g_run, "items", RING_PRODUCER, 1000, err, sizeof err);
    struct ring *c = ring_attach(g_run, "items", RING_CONSUMER, 1000, err, sizeof err);
    ck_assert_msg(p && c, "%s", err);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(p, 100, &s), 0);
    item_write(&s, 0);
    ck_assert_int_eq(ring_publish(p, &s, 0, sizeof(struct item_desc), item_len(0)), 0);
    /* dflash-shm dies: host rings keep working for the stages already attached. */
    kill(shm, SIGKILL);
    ck_assert_int_eq(tr_wait(shm), 128 + SIGKILL);
    ck_assert_int_eq(ring_acquire_write(p, 100, &s), 0);
    item_write(&s, 1);
    ck_assert_int_eq(ring_publish(p, &s, 1, sizeof(struct item_desc), item_len(1)), 0);
    /* Restarted with the same spec, it adopts the segment: same items, same handles. */
    unlink(strcat(strcpy(err, g_run), "/shm.json"));
    shm = tr_start_shm(g_run, spec, NULL, NULL);
    for (uint64_t q = 0; q < 2; q++) {
        ck_assert_int_eq(ring_acquire_read(c, 1000, &s), 0);
        ck_assert_uint_eq(s.seq, q);
        ck_assert(item_check(&s));
        ck_assert_int_eq(ring_release(c, &s), 0);
    }
    struct ring_status *st = status_of(g_run, "items");
    ck_assert_int_eq(st->owner_pid, shm);
    ck_assert(st->owner_alive);
    ck_assert_uint_eq(st->published, 2);
    /* Killed again and restarted with another spec: the ring is re-created, and a stage still
     * holding the old segment is told to restart instead of waiting forever on a dead ring. */
    kill(shm, SIGKILL);
    ck_assert_int_eq(tr_wait(shm), 128 + SIGKILL);
    unlink(strcat(strcpy(err, g_run), "/shm.json"));
    shm = tr_start_shm(g_run, "items:slots=8,bytes=256,desc=64,producers=1", NULL, NULL);
    double t0 = tr_now();
    ck_assert_int_eq(ring_acquire_read(c, 10000, &s), -1);
    ck_assert_msg(tr_now() - t0 < 5, "replacement noticed after %.1f s", tr_now() - t0);
    ck_assert_msg(strstr(ring_error(), "was re-created by a new dflash-shm") != NULL, "unexpected: %s", ring_error());
    ring_close(c);
    ring_close(p);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

/* ---------------------------------------------------------------- stress */

START_TEST(stress_with_kills) {
    const char *env = getenv("DFLASH_STRESS_S");
    double secs = env && atof(env) > 0 ? atof(env) : 20.0;
    g_run = tr_run("ringstress");
    g_sh = shared_new(64ull << 20);
    g_strict = 0;
    g_hold = 1;
    g_n_consumers = 2;
    pid_t shm = tr_start_shm(g_run, "items:slots=8,bytes=256,desc=64,producers=2", NULL, NULL);
    pid_t pids[4];
    int roles[4] = {0, 0, 1, 1};   /* 0 producer, 1 consumer */
    for (int i = 0; i < 4; i++) { g_rank = i & 1; pids[i] = tr_fork(roles[i] ? consumer_main : producer_main, NULL); }
    uint64_t rng = 12345;
    int kills = 0;
    double t0 = tr_now();
    while (tr_now() - t0 < secs) {
        usleep(300000 + (useconds_t)(test_rng_next(&rng) % 400000));
        int v = (int)(test_rng_next(&rng) % 4);
        kill(pids[v], SIGKILL);
        int rc = tr_wait(pids[v]);
        ck_assert_msg(rc == 128 + SIGKILL, "worker %d exited with %d before it was killed", v, rc);
        kills++;
        pids[v] = tr_fork(roles[v] ? consumer_main : producer_main, NULL);
    }
    atomic_store(&g_sh->stop, 1);
    /* A clean end within 20 s: producers drain, consumers empty the ring and get RING_END. */
    double t1 = tr_now();
    for (int i = 0; i < 4; i++) {
        int st = 0;
        pid_t w;
        while ((w = waitpid(pids[i], &st, WNOHANG)) == 0 && tr_now() - t1 < 20) usleep(10000);
        ck_assert_msg(w == pids[i], "worker %d still running 20 s after stop: deadlock?", i);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker %d ended with status %d", i, st);
    }
    uint64_t n = atomic_load(&g_sh->next_seq), lost = 0, redo = 0, pubs = 0;
    if (n > g_sh->cap) n = g_sh->cap;
    for (uint64_t i = 0; i < n; i++) {
        uint8_t seen = atomic_load(&g_sh->seen[i]);
        if (atomic_load(&g_sh->published[i])) { pubs++; lost += seen == 0; }
        redo += seen > 1;
    }
    ck_assert_uint_eq(atomic_load(&g_sh->bad), 0);
    ck_assert_msg(lost == 0, "%llu published items never consumed", (unsigned long long)lost);
    struct ring_status *st = status_of(g_run, "items");
    ck_assert_msg(st->n_free == st->n_slots, "slots left: %u writing, %u ready, %u reading", st->n_writing, st->n_ready, st->n_reading);
    ck_assert(st->drained);
    fprintf(stderr, "stress: %.0f s, %d kills, %llu items published, %llu delivered twice, %llu redelivered, %llu writes recovered\n",
            secs, kills, (unsigned long long)pubs, (unsigned long long)redo, (unsigned long long)st->redelivered,
            (unsigned long long)st->recovered_writes);
    ck_assert_uint_gt(pubs, 1000);
    /* Workers spend most of their time holding a slot, so some of >= 20 kills must hit one. */
    if (kills >= 20) ck_assert_uint_gt(st->redelivered + st->recovered_writes, 0);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ring_mp");
    TCase *tc = tcase_create("transfer");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, strict_transfer);
    tcase_add_test(tc, lowest_first_transfer);
    tcase_add_test(tc, lowest_first_in_order);
    tcase_add_test(tc, consumer_killed);
    tcase_add_test(tc, consumer_killed_lower_seq_first);
    tcase_add_test(tc, producer_killed);
    tcase_add_test(tc, shm_killed_and_restarted);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("stress");
    const char *env = getenv("DFLASH_STRESS_S");
    tcase_set_timeout(ts, (env && atof(env) > 0 ? atof(env) : 20.0) + 60);
    tcase_add_test(ts, stress_with_kills);
    suite_add_tcase(s, ts);
    return test_run_suite(s);
}
