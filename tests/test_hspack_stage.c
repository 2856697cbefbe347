/*
 * tests/test_hspack_stage.c — dflash-hspack as a process on real rings (host payloads).
 *
 * - three producers (target replicas) finishing out of order: features come out 0..N-1 in order,
 *   every value in the concat layout; --record writes a complete recording, and dflash-replay
 *   of it gives back exactly the same items (bit-exact, descriptors and payloads);
 * - spill off: with the trainer not reading, back-pressure stops the producer within the ring
 *   capacities; spill on: the producer finishes a burst while the trainer is idle, and the
 *   trainer still gets every item in order (split layout);
 * - SIGKILL of hspack mid-stream and the same command again: every seq exactly once after the
 *   trainer's duplicate drop, none lost;
 * - a descriptor that disagrees with its payload: exit 1 with a sentence naming the batch;
 * - started with a run plan, an item made under another plan: exit 1 with one line naming the ring and both
 *   plan hashes (the plan's own items and items without a plan pass);
 * - --print-ring-spec answers what rings.h defines;
 * - --set-next SEQ (the pipelines' rewind, the state file's one writer) writes the file the stage resumes from:
 *   hspack then drops every seq below SEQ and emits from SEQ on.
 */
#include "test_hspack_items.h"

#include "core/record.h"
#include "core/rings.h"
#include "plan/plan.h"

#include <sys/wait.h>

static pid_t spawn(const char *run, const char *bin, const char **extra) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s.out", run, bin);
    setenv("DFLASH_LOG", "debug", 1);
    const char *argv[40] = {test_bin(bin), "--run", run, "--device", "cpu", "--wait-ms", "10000", "--heartbeat-s", "0.2"};
    int n = 9;
    for (int i = 0; extra[i] && n < 39; i++) argv[n++] = extra[i];
    return test_spawn_log(path, argv);
}

/* A producer worker: seqs id, id + n_prod, ... < n, each after a delay; counts into progress.
 * With pub (shared, [n]), seq q waits until every seq below q - ahead is published: replicas run
 * ahead of each other by at most `ahead` items, as the hidden ring's slots must allow. */
struct prod {
    const char *run;
    int id, n_prod, n, delay_us;
    volatile int *progress;
    volatile int *pub;
    int ahead;
};

static int produce(void *arg) {
    struct prod *p = arg;
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *r = ring_attach(p->run, "hidden", RING_PRODUCER, 5000, err, sizeof err);
    if (!r) { fprintf(stderr, "producer: %s\n", err); return 1; }
    if (p->pub) {   /* the ordering cases: start once dflash-hspack reads, so a slow producer's delay reorders */
        struct ring_status st;
        int reading = 0;
        for (double t0 = tr_now(); !reading && tr_now() - t0 < 30; usleep(2000)) {
            ring_get_status(r, &st);
            for (int i = 0; i < st.n_attached; i++) reading |= st.attached[i].role == RING_CONSUMER && st.attached[i].alive;
        }
        if (!reading) { fprintf(stderr, "producer: no consumer of 'hidden' within 30 s\n"); return 1; }
    }
    for (int q = p->id; q < p->n; q += p->n_prod) {
        for (int lo = 0; p->pub && lo < q - p->ahead; lo++)
            while (!__atomic_load_n(&p->pub[lo], __ATOMIC_SEQ_CST)) usleep(200);
        usleep((useconds_t)p->delay_us);
        hi_publish(r, (uint64_t)q);
        if (p->pub) __atomic_store_n(&p->pub[q], 1, __ATOMIC_SEQ_CST);
        if (p->progress) __atomic_add_fetch(p->progress, 1, __ATOMIC_SEQ_CST);
    }
    ring_mark_drained(r);
    ring_close(r);
    return 0;
}

/* Consume `ring` until the end of the stream: checks every item (layout), strictly increasing
 * seqs unless dedup (then duplicates are dropped and counted). fnv[seq] gets the FNV of the
 * descriptor and payload. Returns the number of distinct items. */
static int consume(const char *run, const char *ring, enum desc_layout layout, int dedup, int n_max, uint64_t *fnv,
                   int *dups, int kill_after, pid_t *victim) {
    char err[512];
    struct ring *r = ring_attach(run, ring, RING_CONSUMER, 5000, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int got = 0, seen[1024] = {0};
    int64_t last = -1;
    double t0 = tr_now();
    for (;;) {
        struct ring_slot s;
        int rc = ring_acquire_read(r, 200, &s);
        ck_assert_msg(tr_now() - t0 < 40, "consumer: no end of stream within 40 s (%d items)", got);
        if (rc == RING_TIMEOUT) continue;
        if (rc == RING_END) break;
        ck_assert_int_eq(rc, 0);
        ck_assert_int_lt((int)s.seq, n_max);
        if (seen[s.seq]) {
            ck_assert_msg(dedup, "seq %llu delivered twice", (unsigned long long)s.seq);
            (*dups)++;
        } else {
            if (!dedup) ck_assert_msg((int64_t)s.seq > last, "seq %llu after %lld: out of order", (unsigned long long)s.seq, (long long)last);
            ck_assert_msg(hi_check_features(s.desc, s.desc_len, s.payload, s.seq, layout) == 0, "seq %llu: bad content",
                          (unsigned long long)s.seq);
            if (fnv) fnv[s.seq] = item_fnv(s.desc, s.desc_len) ^ (item_fnv(s.payload, s.payload_len) * 31);
            seen[s.seq] = 1;
            last = (int64_t)s.seq;
            got++;
            if (kill_after && got == kill_after && victim) { ck_assert_int_eq(kill(*victim, SIGKILL), 0); *victim = 0; }
        }
        ck_assert_int_eq(ring_release(r, &s), 0);
    }
    ring_close(r);
    return got;
}

static const char *start(const char *tag, int hidden_slots, int features_slots, pid_t *shm, int n_prod) {
    const char *run = tr_run(tag);
    char spec[400];
    snprintf(spec, sizeof spec, "hidden:slots=%d,bytes=%d,desc=4k,dev=host,producers=%d,features:slots=%d,bytes=%d,desc=4k,"
             "dev=host,features2:slots=4,bytes=%d,desc=4k,dev=host", hidden_slots, HI_CAP, n_prod, features_slots, HI_CAP,
             HI_CAP);
    *shm = tr_start_shm(run, spec, NULL, NULL);
    ring_set_log(tr_quiet, NULL);
    return run;
}

START_TEST(three_producers_out_of_order_record_replay) {
    enum { N = 24 };
    pid_t shm;
    const char *run = start("hspack-order", 12, 4, &shm, 3);
    char rec[800], path[900];
    snprintf(rec, sizeof rec, "%s/rec", run);
    const char *a[] = {"--layout", "concat", "--window", "8", "--record", rec, "--tokens", "64", NULL};
    pid_t hs = spawn(run, "dflash-hspack", a);
    struct prod p[3];
    pid_t w[3];
    volatile int *pub = tr_shared(N * sizeof(int));
    for (int i = 0; i < 3; i++) {
        p[i] = (struct prod){run, i, 3, N, i == 0 ? 150000 : 1000, NULL, pub, 6};   /* replica 0 is slower */
        w[i] = tr_fork(produce, &p[i]);
    }
    static uint64_t fnv[N], fnv2[N];
    int dups = 0;
    ck_assert_int_eq(consume(run, "features", DESC_LAYOUT_CONCAT, 0, N, fnv, &dups, 0, NULL), N);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(tr_wait(w[i]), 0);
    ck_assert_int_eq(tr_wait(hs), 0);
    snprintf(path, sizeof path, "%s/logs/dflash-hspack.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "end of stream: 24 items out"), "%s", log ? log : "(no log)");
    ck_assert_msg(!strstr(log, "max reorder depth 0,") && !strstr(log, "max reorder depth 1,"),
                  "the producers finished out of order, the window must have held several: %s", log);
    /* the recording is complete, and replaying it gives the same bytes */
    struct record_index ix;
    char err[1024];
    ck_assert_msg(record_index_read(rec, &ix, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ix.n_items, N);
    ck_assert_str_eq(ix.model, "kind=features k=3 H=8 dtype=f32 layout=concat layers=1,4,7");
    record_index_free(&ix);
    const char *b[] = {"--dir", rec, "--out", "features2", NULL};
    pid_t rp = spawn(run, "dflash-replay", b);
    ck_assert_int_eq(consume(run, "features2", DESC_LAYOUT_CONCAT, 0, N, fnv2, &dups, 0, NULL), N);
    ck_assert_int_eq(tr_wait(rp), 0);
    for (int q = 0; q < N; q++) ck_assert_msg(fnv[q] == fnv2[q], "seq %d: the replayed item differs from the live one", q);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

/* Spill off, then on: hidden 4 slots, features 2, the trainer idle for 1.5 s. */
static void spill_case(int spill) {
    enum { N = 12 };
    pid_t shm;
    const char *run = start(spill ? "hspack-spill" : "hspack-nospill", 4, 2, &shm, 1);
    char sp[16], rec[800];
    snprintf(sp, sizeof sp, "%d", spill);
    snprintf(rec, sizeof rec, "%s/rec", run);
    /* also: a smaller recording (one layer of three, bf16 from the f32 ring) */
    const char *a[] = {"--layout", "split", "--window", "2", "--spill", sp, "--record", rec, "--record-layers", "4",
                       "--record-dtype", "bf16", NULL};
    pid_t hs = spawn(run, "dflash-hspack", a);
    volatile int *progress = tr_shared(sizeof(int));
    struct prod p = {run, 0, 1, N, 0, progress, NULL, 0};
    pid_t w = tr_fork(produce, &p);
    usleep(1500000);
    int done = __atomic_load_n(progress, __ATOMIC_SEQ_CST);
    if (spill) ck_assert_msg(done == N, "with --spill %d the producer should finish a burst of %d (got %d)", spill, N, done);
    else ck_assert_msg(done <= 4 + 2 && done >= 2, "without spill, back-pressure must stop the producer (published %d)", done);
    int dups = 0;
    ck_assert_int_eq(consume(run, "features", DESC_LAYOUT_SPLIT, 0, N, NULL, &dups, 0, NULL), N);
    ck_assert_int_eq(tr_wait(w), 0);
    ck_assert_int_eq(tr_wait(hs), 0);
    char path[900];
    snprintf(path, sizeof path, "%s/logs/dflash-hspack.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, spill ? "spilled)" : " 0 spilled)"), "%s", log ? log : "(no log)");
    if (spill) ck_assert_msg(!strstr(log, " 0 spilled)"), "with the trainer idle, items must have been spilled: %s", log);
    struct record_index ix;
    char err[1024];
    ck_assert_msg(record_index_read(rec, &ix, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ix.n_items, N);
    ck_assert_str_eq(ix.model, "kind=features k=1 H=8 dtype=bf16 layout=split layers=4");
    /* layer 4 is captured slot 1 */
    struct record_item it;
    record_path(path, sizeof path, rec, 0);
    ck_assert_msg(record_read_file(path, &it, err, sizeof err) == 0, "%s", err);
    struct desc_features f;
    ck_assert_int_eq(desc_features_decode(it.desc, it.h.desc_len, 0, &f, err, sizeof err), 0);
    const uint16_t *b = (const uint16_t *)((const uint8_t *)it.payload + f.off_states);
    uint32_t u = (uint32_t)b[3 * HI_H + 0] << 16;   /* token 3, element 0: 103, exact in bf16 */
    float v;
    memcpy(&v, &u, 4);
    ck_assert_msg(v == hi_value(0, 1, 3, 0), "recorded layer 4 token 3 elem 0 = %g, want %g", v, hi_value(0, 1, 3, 0));
    ck_assert_uint_lt(ix.items[0].payload_bytes, 4000);   /* vs ~6.6 KB for the full f32 item */
    record_item_free(&it);
    record_index_free(&ix);
    tr_stop_shm(shm);
}

START_TEST(spill_off_back_pressure) { spill_case(0); }
END_TEST

START_TEST(spill_on_absorbs_burst) { spill_case(8); }
END_TEST

START_TEST(sigkill_and_restart) {
    enum { N = 30 };
    pid_t shm;
    const char *run = start("hspack-kill", 4, 2, &shm, 1);
    const char *a[] = {"--layout", "concat", "--window", "3", NULL};
    pid_t hs = spawn(run, "dflash-hspack", a);
    struct prod p = {run, 0, 1, N, 8000, NULL, NULL, 0};
    pid_t w = tr_fork(produce, &p);
    /* consume in a child so this process can restart hspack once it is killed */
    pid_t victim = hs;
    volatile int *res = tr_shared(2 * sizeof(int));
    pid_t c = fork();
    ck_assert_int_ge(c, 0);
    if (c == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int dups = 0;
        res[0] = consume(run, "features", DESC_LAYOUT_CONCAT, 1, N, NULL, &dups, 8, &victim);
        res[1] = dups;
        _exit(0);
    }
    /* the child kills hspack (its pid was inherited); wait for that, then start it again */
    int st;
    ck_assert_int_eq(waitpid(hs, &st, 0), hs);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "hspack should have been SIGKILLed");
    hs = spawn(run, "dflash-hspack", a);
    ck_assert_int_eq(tr_wait(c), 0);
    ck_assert_int_eq(tr_wait(w), 0);
    ck_assert_int_eq(tr_wait(hs), 0);
    ck_assert_msg(res[0] == N, "distinct items after the restart: %d of %d", res[0], N);
    ck_assert_msg(res[1] <= 1, "at most the one item published before the kill's state write repeats (%d)", res[1]);
    char path[900];
    snprintf(path, sizeof path, "%s/logs/dflash-hspack.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "resuming at seq"), "%s", log ? log : "(no log)");
    tr_stop_shm(shm);
}
END_TEST

START_TEST(bad_descriptor_names_the_batch) {
    pid_t shm;
    const char *run = start("hspack-bad", 4, 4, &shm, 1);
    char err[512];
    struct ring *r = ring_attach(run, "hidden", RING_PRODUCER, 5000, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    const char *a[] = {"--tokens", "64", NULL};
    pid_t hs = spawn(run, "dflash-hspack", a);
    hi_publish(r, 0);
    hi_publish(r, 1);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(r, 2000, &s), 0);
    struct desc_hidden d;
    size_t dl = hi_make(2, s.desc, s.desc_cap, s.payload, &d);
    ck_assert_int_eq(ring_publish(r, &s, 2, (uint32_t)dl, d.batch.payload_bytes - 64), 0);   /* short payload */
    ck_assert_int_eq(tr_wait(hs), 1);
    char path[900];
    snprintf(path, sizeof path, "%s/logs/dflash-hspack.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "batch seq 2 rejected") && strstr(log, "payload bytes"), "%s", log ? log : "(no log)");
    struct ring *f = ring_attach(run, "features", RING_OBSERVER, 1000, err, sizeof err);
    ck_assert_msg(f != NULL, "%s", err);
    struct ring_status st;
    ring_get_status(f, &st);
    ck_assert_uint_eq(st.published, 2);   /* 0 and 1 went out, the bad one did not */
    ring_close(f);
    ring_close(r);
    tr_shutdown_shm(run, shm);
}
END_TEST

/* The run plan's hash in every descriptor (issue 25): hspack started with RUN/plan.json passes items of its plan
 * and of no plan, and refuses an item of another plan with one line, not a silent misread. */
START_TEST(foreign_plan_refused) {
    pid_t shm;
    const char *run = start("hspack-plan", 4, 4, &shm, 1);
    /* a plan with this suite's geometry (written by hand: the module, not dflash-plan, so no model is needed) */
    struct plan pl;
    memset(&pl, 0, sizeof pl);
    snprintf(pl.model, sizeof pl.model, "/nonexistent/model");
    snprintf(pl.data, sizeof pl.data, "/nonexistent/data.jsonl");
    snprintf(pl.device, sizeof pl.device, "cpu");
    snprintf(pl.train_device, sizeof pl.train_device, "cpu");
    pl.tokens = 64;
    pl.target_layers = 8;
    pl.hidden_size = HI_H;
    pl.n_ids = HI_K;
    pl.ids[0] = 1; pl.ids[1] = 4; pl.ids[2] = 7;
    pl.dtype = DESC_DTYPE_F32;
    pl.draft_layers = 1;
    pl.block_size = 4;
    pl.seed = 1; pl.window = 16; pl.epochs = 1; pl.steps = 3; pl.grad_accum = 1; pl.batches = 3;
    pl.target_replicas = 1;
    char err[512], path[900];
    snprintf(path, sizeof path, "%s/plan.json", run);
    ck_assert_msg(plan_write(&pl, path, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_ne(pl.hash, 0);
    struct ring *r = ring_attach(run, "hidden", RING_PRODUCER, 5000, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    const char *a[] = {NULL};   /* --tokens, k, H, dtype and device from the plan */
    pid_t hs = spawn(run, "dflash-hspack", a);
    uint64_t plans[3] = {pl.hash, 0, pl.hash ^ 0x5a5a};   /* its plan, no plan, another plan */
    for (uint64_t q = 0; q < 3; q++) {
        struct ring_slot s;
        ck_assert_int_eq(ring_acquire_write(r, 2000, &s), 0);
        struct desc_hidden d;
        hi_make(q, s.desc, s.desc_cap, s.payload, &d);
        d.batch.plan = plans[q];
        size_t dl;
        ck_assert_msg(desc_hidden_encode(&d, s.desc, s.desc_cap, &dl, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(ring_publish(r, &s, q, (uint32_t)dl, d.batch.payload_bytes), 0);
    }
    ck_assert_int_eq(tr_wait(hs), 1);
    snprintf(path, sizeof path, "%s/logs/dflash-hspack.log", run);
    char *log = test_slurp_static(path), want[256];
    snprintf(want, sizeof want, "ring 'hidden' batch seq 2 rejected: seq 2 was made under run plan %016llx, this stage "
             "read plan %016llx", (unsigned long long)(pl.hash ^ 0x5a5a), (unsigned long long)pl.hash);
    ck_assert_msg(log && strstr(log, want), "no '%s' in: %s", want, log ? log : "(no log)");
    struct ring *f = ring_attach(run, "features", RING_OBSERVER, 1000, err, sizeof err);
    ck_assert_msg(f != NULL, "%s", err);
    struct ring_status st;
    ring_get_status(f, &st);
    ck_assert_uint_eq(st.published, 2);   /* its plan's item and the planless one went out, the foreign one did not */
    ring_close(f);
    ring_close(r);
    tr_shutdown_shm(run, shm);
}
END_TEST

START_TEST(set_next_rewinds) {
    pid_t shm;
    const char *run = start("hspack-setnext", 4, 4, &shm, 1);
    char path[900], log[900];
    snprintf(log, sizeof log, "%s/set-next.log", run);
    const char *sn[] = {test_bin("dflash-hspack"), "--run", run, "--set-next", "3", NULL};
    ck_assert_int_eq(tr_wait(test_spawn_log(log, sn)), 0);
    snprintf(path, sizeof path, "%s/state/hspack.features.next", run);
    char *text = test_slurp_static(path);
    ck_assert_msg(text && !strcmp(text, "00000000000000000003\n"), "%s", text ? text : "(no state file)");
    const char *no_run[] = {test_bin("dflash-hspack"), "--set-next", "3", NULL};
    ck_assert_int_eq(tr_wait(test_spawn_log(log, no_run)), 2);
    /* the stage reads what --set-next wrote: seqs 0..2 are dropped, 3..5 come out */
    const char *a[] = {NULL};
    pid_t hs = spawn(run, "dflash-hspack", a);
    struct prod p = {run, 0, 1, 6, 0, NULL, NULL, 0};
    pid_t w = tr_fork(produce, &p);
    int dups = 0;
    uint64_t fnv[8] = {0};
    ck_assert_int_eq(consume(run, "features", DESC_LAYOUT_CONCAT, 0, 6, fnv, &dups, 0, NULL), 3);
    for (int q = 0; q < 3; q++) ck_assert_msg(fnv[q] == 0, "seq %d below --set-next 3 came out", q);
    for (int q = 3; q < 6; q++) ck_assert_msg(fnv[q] != 0, "seq %d missing", q);
    ck_assert_int_eq(tr_wait(w), 0);
    ck_assert_int_eq(tr_wait(hs), 0);
    snprintf(path, sizeof path, "%s/logs/dflash-hspack.log", run);
    char *hlog = test_slurp_static(path);
    ck_assert_msg(hlog && strstr(hlog, "resuming at seq 3 (state file"), "%s", hlog ? hlog : "(no log)");
    tr_stop_shm(shm);
}
END_TEST

START_TEST(print_ring_spec) {
    const char *run = tr_run("hspack-spec");
    char out[800];
    snprintf(out, sizeof out, "%s/spec.txt", run);
    const char *argv[] = {test_bin("dflash-hspack"), "--print-ring-spec", "--tokens", "8192", "--n-layers", "5",
                          "--hidden-size", "4096", "--device", "cpu", "--dtype", "f32", NULL};
    ck_assert_int_eq(tr_wait(test_spawn_log(out, argv)), 0);
    char want[256], err[256];
    struct rings_geometry g = {8192, 5, 4096, DESC_DTYPE_F32};
    ck_assert_int_eq(rings_format_spec(want, sizeof want, "features", 4, DESC_KIND_FEATURES, &g, -1, err, sizeof err), 0);
    char *got = test_slurp_static(out);
    ck_assert_msg(got && !strncmp(got, want, strlen(want)), "got '%s', want '%s'", got ? got : "", want);
}
END_TEST

int main(void) {
    Suite *s = suite_create("hspack_stage");
    TCase *t = tcase_create("stage");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, three_producers_out_of_order_record_replay);
    tcase_add_test(t, spill_off_back_pressure);
    tcase_add_test(t, spill_on_absorbs_burst);
    tcase_add_test(t, sigkill_and_restart);
    tcase_add_test(t, bad_descriptor_names_the_batch);
    tcase_add_test(t, foreign_plan_refused);
    tcase_add_test(t, set_next_rewinds);
    tcase_add_test(t, print_ring_spec);
    suite_add_tcase(s, t);
    return test_run_suite(s);
}
