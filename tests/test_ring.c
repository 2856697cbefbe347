/*
 * tests/test_ring.c — shm/ring in one process plus dflash-shm's command line: spec parsing,
 * publish/read order, strict and rank-filtered reads, timeouts, closed and drained, the
 * sentences for bad segments (magic, version, sizes, missing ring), and dflash-shm's status,
 * shutdown, SIGTERM and stale-segment modes. Multi-process behaviour is in test_ring_mp.c.
 */
#include "core/fsutil.h"
#include "test_ring_util.h"

#include <fcntl.h>

/* ---------------------------------------------------------------- names and specs */

START_TEST(run_id_matches_fsutil) {
    const char *dir = test_tmpdir("ringid");
    char run[600], a[128], b[128], err[256];
    snprintf(run, sizeof run, "%s/my run.x", dir);
    ck_assert_int_eq(mkdir(run, 0755), 0);
    ck_assert_int_eq(ring_run_id(run, a, sizeof a, err, sizeof err), 0);
    ck_assert_int_eq(run_id(run, b, sizeof b, err, sizeof err), 0);
    ck_assert_str_eq(a, b);
    char seg[200];
    ck_assert_int_eq(ring_segment_name(run, "batches", seg, sizeof seg, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(seg, "/dflash.my_run_x-"));
    ck_assert_ptr_nonnull(strstr(seg, ".batches"));
    ck_assert_int_eq(ring_segment_name(run, "bad name", seg, sizeof seg, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "may contain only"));
}
END_TEST

START_TEST(spec_parse) {
    struct ring_spec s[8];
    int n = 0;
    char err[256];
    ck_assert_int_eq(ring_parse_specs("batches:slots=8,bytes=1M,desc=4k,dev=host", s, 8, &n, err, sizeof err), 0);
    ck_assert_int_eq(ring_parse_specs("hidden:slots=4,bytes=64M,dev=cuda:1,producers=2,features:bytes=3k", s, 8, &n, err, sizeof err), 0);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(s[0].name, "batches");
    ck_assert_uint_eq(s[0].n_slots, 8);
    ck_assert_uint_eq(s[0].payload_bytes, 1u << 20);
    ck_assert_uint_eq(s[0].desc_bytes, 4096);
    ck_assert_int_eq(s[0].device, -1);
    ck_assert_str_eq(s[1].name, "hidden");
    ck_assert_uint_eq(s[1].payload_bytes, 64ull << 20);
    ck_assert_int_eq(s[1].device, 1);
    ck_assert_uint_eq(s[1].n_producers, 2);
    ck_assert_str_eq(s[2].name, "features");
    ck_assert_uint_eq(s[2].payload_bytes, 3072);
    ck_assert_uint_eq(s[2].n_slots, 8);   /* default */
    ck_assert_uint_eq(s[2].plan, 0);      /* default: made without a run plan */
    ck_assert_int_eq(ring_parse_specs("plans:slots=2,plan=00ab12cd34ef5678", s, 8, &n, err, sizeof err), 0);
    ck_assert_uint_eq(s[3].plan, 0x00ab12cd34ef5678ull);
    struct { const char *text, *needle; } bad[] = {
        {"slots=8", "must start with NAME:"},
        {"x:slots=0", "not a count"},
        {"x:bytes=12Q", "not a size"},
        {"x:dev=gpu", "expected host, cpu or cuda:N"},
        {"x:color=red", "unknown key 'color'"},
        {"x:slots", "expected key=value"},
        {"batches:slots=2", "given twice"},
        {"x:plan=xyz", "not a plan hash"},
        {"x:plan=123456789abcdef01", "not a plan hash"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int m = 1;
        struct ring_spec t[2];
        snprintf(t[0].name, sizeof t[0].name, "batches");
        ck_assert_msg(ring_parse_specs(bad[i].text, t, 2, &m, err, sizeof err) == -1, "'%s' accepted", bad[i].text);
        ck_assert_msg(strstr(err, bad[i].needle) != NULL, "'%s': error '%s' lacks '%s'", bad[i].text, err, bad[i].needle);
    }
    char b[32];
    ck_assert_str_eq(ring_format_bytes(1536, b, sizeof b), "1.5k");
    ck_assert_str_eq(ring_format_bytes(64ull << 20, b, sizeof b), "64M");
}
END_TEST

/* ---------------------------------------------------------------- one process */

static struct ring *mk(const char *run, const char *name, uint32_t slots, uint32_t producers) {
    struct ring_spec sp = {0};
    snprintf(sp.name, sizeof sp.name, "%s", name);
    sp.n_slots = slots;
    sp.payload_bytes = 256;
    sp.desc_bytes = 64;
    sp.device = -1;
    sp.n_producers = producers;
    char err[512];
    struct ring *r = ring_create(run, &sp, err, sizeof err);
    ck_assert_msg(r != NULL, "ring_create: %s", err);
    return r;
}

static struct ring *att(const char *run, const char *name, int role) {
    char err[512];
    struct ring *r = ring_attach(run, name, role, 1000, err, sizeof err);
    ck_assert_msg(r != NULL, "ring_attach: %s", err);
    return r;
}

static void put(struct ring *p, uint64_t seq) {
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(p, 1000, &s), 0);
    item_write(&s, seq);
    ck_assert_int_eq(ring_publish(p, &s, seq, sizeof(struct item_desc), item_len(seq)), 0);
}

START_TEST(order_strict_rank_and_end) {
    const char *run = tr_run("ringorder");
    ring_set_log(tr_quiet, NULL);
    struct ring *own = mk(run, "items", 8, 1);
    struct ring *p = att(run, "items", RING_PRODUCER), *c = att(run, "items", RING_CONSUMER);
    struct ring_slot s;
    /* Empty: a zero timeout returns at once, a short one after about its length. */
    ck_assert_int_eq(ring_acquire_read(c, 0, &s), RING_TIMEOUT);
    double t0 = tr_now();
    ck_assert_int_eq(ring_acquire_read(c, 150, &s), RING_TIMEOUT);
    double dt = tr_now() - t0;
    ck_assert_msg(dt >= 0.14 && dt < 1.0, "150 ms timeout took %.3f s", dt);
    /* Published out of order: delivered lowest seq first. */
    uint64_t order[] = {5, 2, 7, 3};
    for (int i = 0; i < 4; i++) put(p, order[i]);
    uint64_t want[] = {2, 3};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(ring_acquire_read(c, 100, &s), 0);
        ck_assert_uint_eq(s.seq, want[i]);
        ck_assert(item_check(&s));
        ck_assert_uint_eq(s.deliveries, 1);
        ck_assert_int_eq(ring_release(c, &s), 0);
    }
    /* Strict: seq 6 is not there yet (times out), 7 is. */
    ck_assert_int_eq(ring_acquire_read_seq(c, 6, 50, &s), RING_TIMEOUT);
    ck_assert_int_eq(ring_acquire_read_seq(c, 7, 50, &s), 0);
    ck_assert_uint_eq(s.seq, 7);
    /* unread puts it back; it comes again with deliveries 2. */
    ck_assert_int_eq(ring_unread(c, &s), 0);
    ck_assert_int_eq(ring_acquire_read_seq(c, 7, 50, &s), 0);
    ck_assert_uint_eq(s.deliveries, 2);
    ck_assert_int_eq(ring_release(c, &s), 0);
    ck_assert_int_eq(ring_release(c, &s), -1);   /* double release is refused */
    ck_assert_ptr_nonnull(strstr(ring_error(), "ring_release"));
    /* Rank filter: rank 0 of 2 never sees the odd seq 5. */
    put(p, 4);
    ck_assert_int_eq(ring_set_rank(c, 0, 2), 0);
    ck_assert_int_eq(ring_acquire_read(c, 50, &s), 0);
    ck_assert_uint_eq(s.seq, 4);
    ck_assert_int_eq(ring_release(c, &s), 0);
    ck_assert_int_eq(ring_acquire_read(c, 50, &s), RING_TIMEOUT);
    ck_assert_int_eq(ring_set_rank(c, 2, 2), -1);
    /* Abandon leaves nothing visible. */
    ck_assert_int_eq(ring_acquire_write(p, 100, &s), 0);
    ck_assert_int_eq(ring_abandon(p, &s), 0);
    /* Drained: rank 0 ends (only odd seq 5 is left, not ours); rank 1 still gets 5, then ends. */
    ck_assert(!ring_is_drained(c));
    ck_assert_int_eq(ring_mark_drained(p), 0);
    ck_assert(ring_is_drained(c));
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), RING_END);
    ck_assert_int_eq(ring_set_rank(c, 1, 2), 0);
    ck_assert_int_eq(ring_acquire_read(c, 100, &s), 0);
    ck_assert_uint_eq(s.seq, 5);
    ck_assert_int_eq(ring_release(c, &s), 0);
    ck_assert_int_eq(ring_acquire_read(c, 1000, &s), RING_END);
    ck_assert_int_eq(ring_acquire_read_seq(c, 9, 1000, &s), RING_END);
    struct ring_status st;
    ring_get_status(own, &st);
    ck_assert_uint_eq(st.published, 5);
    ck_assert_uint_eq(st.consumed, 5);
    ck_assert_uint_eq(st.n_free, 8);
    ck_assert_int_eq(st.n_attached, 2);
    ck_assert(st.drained && !st.closed && st.owner_alive);
    ring_close(c);
    ring_get_status(own, &st);
    ck_assert_int_eq(st.n_attached, 1);   /* the consumer's entry went, the producer's stays */
    ring_close(p);
    ring_close(own);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

START_TEST(drain_waits_for_every_producer) {
    const char *run = tr_run("ringdrain");
    struct ring *own = mk(run, "d", 4, 2);
    struct ring *p1 = att(run, "d", RING_PRODUCER), *c = att(run, "d", RING_CONSUMER);
    struct ring_slot s;
    ck_assert_int_eq(ring_mark_drained(p1), 0);
    /* producers=2: one drained producer does not end the stream. */
    ck_assert(!ring_is_drained(c));
    ck_assert_int_eq(ring_acquire_read(c, 50, &s), RING_TIMEOUT);
    struct ring *p2 = att(run, "d", RING_PRODUCER);
    put(p2, 0);
    ck_assert_int_eq(ring_mark_drained(p2), 0);
    ck_assert_int_eq(ring_acquire_read(c, 50, &s), 0);
    ck_assert_int_eq(ring_release(c, &s), 0);
    ck_assert_int_eq(ring_acquire_read(c, 50, &s), RING_END);
    ring_close(p1);
    ring_close(p2);
    ring_close(c);
    ring_close(own);
}
END_TEST

START_TEST(closed_wakes_waiters) {
    const char *run = tr_run("ringclosed");
    struct ring *own = mk(run, "c", 1, 0);
    struct ring *p = att(run, "c", RING_PRODUCER);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(p, 100, &s), 0);
    ck_assert_int_eq(ring_acquire_write(p, 0, &s), RING_TIMEOUT);   /* the only slot is ours */
    pid_t pid = fork();
    if (pid == 0) { usleep(100000); ring_set_closed(own); _exit(0); }
    double t0 = tr_now();
    ck_assert_int_eq(ring_acquire_write(p, 5000, &s), RING_END);
    ck_assert_msg(tr_now() - t0 < 2.0, "closed did not wake the waiter quickly");
    ck_assert_int_eq(tr_wait(pid), 0);
    ring_close(p);
    ring_close(own);
}
END_TEST

START_TEST(capacity_checks) {
    const char *run = tr_run("ringcap");
    struct ring *own = mk(run, "k", 2, 0);
    struct ring *p = att(run, "k", RING_PRODUCER);
    char err[512];
    ck_assert_int_eq(ring_expect(p, 256, 64, -1, err, sizeof err), 0);
    ck_assert_int_eq(ring_expect(p, 1 << 20, 64, -1, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "has 256 payload bytes per slot, expected at least 1048576"));
    ck_assert_int_eq(ring_expect(p, 0, 0, 0, err, sizeof err), -1);
    ck_assert_ptr_nonnull(strstr(err, "expected cuda:0"));
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(p, 100, &s), 0);
    ck_assert_int_eq(ring_publish(p, &s, 0, 65, 0), -1);
    ck_assert_ptr_nonnull(strstr(ring_error(), "exceed the capacities"));
    ck_assert_int_eq(ring_publish(p, &s, 0, 64, 256), 0);
    struct ring_slot r;
    ck_assert_int_eq(ring_acquire_read(p, 0, &r), -1);   /* a producer cannot read */
    ck_assert_ptr_nonnull(strstr(ring_error(), "not attached as a consumer"));
    /* Closing a handle gives back what it holds: the WRITING slot is FREE again. */
    ck_assert_int_eq(ring_acquire_write(p, 100, &s), 0);
    struct ring_status st;
    ring_get_status(own, &st);
    ck_assert_uint_eq(st.n_writing, 1);
    ring_close(p);
    ring_get_status(own, &st);
    ck_assert_uint_eq(st.n_writing, 0);
    ck_assert_uint_eq(st.n_ready, 1);
    ring_close(own);
}
END_TEST

/* ---------------------------------------------------------------- bad segments */

/* Map a ring's segment writable, bypassing the API, to corrupt it. */
static uint8_t *map_segment(const char *run, const char *name, size_t *len) {
    char seg[256], err[256];
    ck_assert_int_eq(ring_segment_name(run, name, seg, sizeof seg, err, sizeof err), 0);
    int fd = shm_open(seg, O_RDWR, 0);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    *len = (size_t)sb.st_size;
    uint8_t *p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert(p != MAP_FAILED);
    close(fd);
    return p;
}

START_TEST(bad_segments_give_sentences) {
    const char *run = tr_run("ringbad");
    char err[512];
    ring_set_log(tr_quiet, NULL);
    /* Missing ring: waits, then says which segment it waited for. */
    double t0 = tr_now();
    ck_assert_ptr_null(ring_attach(run, "nothere", RING_CONSUMER, 300, err, sizeof err));
    ck_assert_msg(tr_now() - t0 >= 0.29, "gave up before wait_ms");
    ck_assert_msg(strstr(err, "ring 'nothere'") && strstr(err, "does not exist after waiting") && strstr(err, "is dflash-shm running"),
                  "unexpected: %s", err);
    struct ring *own = mk(run, "bad", 2, 0);
    size_t len;
    uint8_t *seg = map_segment(run, "bad", &len);
    uint64_t magic;
    memcpy(&magic, seg, 8);
    /* wrong magic */
    uint64_t junk = 0x1122334455667788ull;
    memcpy(seg, &junk, 8);
    ck_assert_ptr_null(ring_attach(run, "bad", RING_CONSUMER, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "is not a dflash ring: magic is 0x1122334455667788, expected 0x"), "unexpected: %s", err);
    memcpy(seg, &magic, 8);
    /* wrong version */
    uint32_t v = 99, v0;
    memcpy(&v0, seg + 8, 4);
    memcpy(seg + 8, &v, 4);
    ck_assert_ptr_null(ring_attach(run, "bad", RING_CONSUMER, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "has layout version 99, this binary expects version 2"), "unexpected: %s", err);
    memcpy(seg + 8, &v0, 4);
    ck_assert_int_eq(munmap(seg, len), 0);
    /* wrong size: the file is shorter than the header says */
    char name[256];
    ck_assert_int_eq(ring_segment_name(run, "bad", name, sizeof name, err, sizeof err), 0);
    int fd = shm_open(name, O_RDWR, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, (off_t)len - 4096), 0);
    ck_assert_ptr_null(ring_attach(run, "bad", RING_CONSUMER, 0, err, sizeof err));
    ck_assert_msg(strstr(err, "need a") && strstr(err, "found"), "unexpected: %s", err);
    ck_assert_int_eq(ftruncate(fd, (off_t)len), 0);
    close(fd);
    struct ring *ok = ring_attach(run, "bad", RING_CONSUMER, 0, err, sizeof err);
    ck_assert_msg(ok != NULL, "restored segment not accepted: %s", err);
    ring_close(ok);
    /* A segment too small to hold a header, still empty after the wait: "is being created". */
    ck_assert_int_eq(ring_segment_name(run, "empty", name, sizeof name, err, sizeof err), 0);
    fd = shm_open(name, O_RDWR | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_ptr_null(ring_attach(run, "empty", RING_PRODUCER, 100, err, sizeof err));
    ck_assert_msg(strstr(err, "is being created"), "unexpected: %s", err);
    ck_assert_int_eq(ring_unlink(run, "empty", err, sizeof err), 0);
    ring_close(own);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

/* Child: create the ring, publish seq 0 through its own producer handle, die without unlinking. */
static int create_publish_and_die(const char *run, const struct ring_spec *sp) {
    char err[512];
    ring_set_log(tr_quiet, NULL);
    if (!ring_create(run, sp, err, sizeof err)) return 1;
    struct ring *p = ring_attach(run, sp->name, RING_PRODUCER, 0, err, sizeof err);
    struct ring_slot s;
    if (!p || ring_acquire_write(p, 100, &s) != 0) return 2;
    item_write(&s, 0);
    return ring_publish(p, &s, 0, sizeof(struct item_desc), item_len(0)) ? 3 : 0;
}

START_TEST(create_refuses_live_adopts_or_replaces_stale) {
    const char *run = tr_run("ringdup");
    char err[512];
    struct ring_spec sp = {.name = "dup", .n_slots = 2, .payload_bytes = 256, .desc_bytes = 64, .device = -1};
    struct ring *a = ring_create(run, &sp, err, sizeof err);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_null(ring_create(run, &sp, err, sizeof err));
    ck_assert_msg(strstr(err, "already exists and its creator pid") != NULL, "unexpected: %s", err);
    ring_close(a);
    ring_set_log(tr_quiet, NULL);
    /* A creator that dies leaves its segment; a new create with the same spec adopts it, items included. */
    pid_t pid = fork();
    if (pid == 0) _exit(create_publish_and_die(run, &sp));
    ck_assert_int_eq(tr_wait(pid), 0);
    ck_assert_int_eq(tr_count_segments(run), 1);
    a = ring_create(run, &sp, err, sizeof err);
    ck_assert_msg(a != NULL, "stale segment not adopted: %s", err);
    struct ring *c = att(run, "dup", RING_CONSUMER);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_read(c, 100, &s), 0);
    ck_assert_uint_eq(s.seq, 0);
    ck_assert(item_check(&s));
    ck_assert_int_eq(ring_release(c, &s), 0);
    struct ring_status st;
    ring_get_status(a, &st);
    ck_assert(st.owner_alive);
    ck_assert_int_eq(st.owner_pid, getpid());
    ring_close(c);
    ring_close(a);
    ck_assert_int_eq(tr_count_segments(run), 0);
    /* With another spec it is replaced: fresh and empty. */
    pid = fork();
    if (pid == 0) _exit(create_publish_and_die(run, &sp));
    ck_assert_int_eq(tr_wait(pid), 0);
    sp.n_slots = 3;
    a = ring_create(run, &sp, err, sizeof err);
    ck_assert_msg(a != NULL, "stale segment not replaced: %s", err);
    ring_get_status(a, &st);
    ck_assert_uint_eq(st.n_slots, 3);
    ck_assert_uint_eq(st.n_ready, 0);
    ck_assert_uint_eq(st.published, 0);
    ring_close(a);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

/* ---------------------------------------------------------------- dflash-shm */

/* Run a command, capture stdout (up to cap) and return its exit code. */
static int run_capture(char *const argv[], char *out, size_t cap) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t k;
    while (n + 1 < cap && (k = read(fds[0], out + n, cap - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fds[0]);
    return tr_wait(pid);
}

START_TEST(shm_status_shutdown_sigterm) {
    const char *run = tr_run("shmcli");
    pid_t shm = tr_start_shm(run, "batches:slots=4,bytes=4k,desc=1k,dev=host", "hidden:slots=2,bytes=1M,dev=cuda:0", "--host-only");
    ck_assert_int_eq(tr_count_segments(run), 2);
    struct ring *p = att(run, "batches", RING_PRODUCER);
    put(p, 0);
    put(p, 1);
    char out[8192];
    char *st_argv[] = {(char *)test_bin("dflash-shm"), "--status", "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(st_argv, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "batches") && strstr(out, "hidden") && strstr(out, "(status from dflash-shm)"), "status: %s", out);
    ck_assert_msg(strstr(out, "producer alive"), "status lacks the attached producer: %s", out);
    char *js_argv[] = {(char *)test_bin("dflash-shm"), "--status", "--json", "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(js_argv, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "\"ready\": 2") && strstr(out, "\"published\": 2"), "json status: %s", out);
    /* shutdown over the control socket: rings closed (acquire says END), segments unlinked */
    char *sd_argv[] = {(char *)test_bin("dflash-shm"), "--shutdown", "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(sd_argv, out, sizeof out), 0);
    ck_assert_int_eq(tr_wait(shm), 0);
    struct ring_slot s;
    ck_assert_int_eq(ring_acquire_write(p, 100, &s), RING_END);
    ring_close(p);
    ck_assert_int_eq(tr_count_segments(run), 0);
    char path[700], *json;
    size_t len;
    snprintf(path, sizeof path, "%s/shm.json", run);
    ck_assert_int_eq(fs_read_file(path, &json, &len, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(json, "\"stopped\""));
    free(json);
    /* SIGTERM ends it the same way; --status of a stopped run falls back to the segments */
    shm = tr_start_shm(run, "x:slots=2,bytes=1k", NULL, NULL);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(run), 0);
    char *st2[] = {(char *)test_bin("dflash-shm"), "--status", "--timeout-ms", "200", "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(st2, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "(status from segments)"));
}
END_TEST

START_TEST(shm_bad_flags_and_gpu_without_gpu) {
    const char *run = tr_run("shmflags");
    char out[4096];
    char *a1[] = {(char *)test_bin("dflash-shm"), "--run", (char *)run, "--ring", "x:slots=zero", NULL};
    ck_assert_int_eq(run_capture(a1, out, sizeof out), 2);
    char *a2[] = {(char *)test_bin("dflash-shm"), "--run", (char *)run, NULL};
    ck_assert_int_eq(run_capture(a2, out, sizeof out), 2);
    /* No GPU on CI: a cuda ring fails with a reason and leaves nothing behind. */
    if (access("/dev/nvidia0", F_OK) == 0) return;   /* a GPU machine would create the ring and stay up */
    char *a3[] = {(char *)test_bin("dflash-shm"), "--run", (char *)run, "--ring", "a:slots=2", "--ring", "g:dev=cuda:0", NULL};
    int rc = run_capture(a3, out, sizeof out);
    ck_assert_int_ne(rc, 0);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

static void find_seg(void *ctx, const struct ring_segment_info *in) {
    char **want = ctx;
    if (!strcmp(in->segment, want[0] + 1)) want[1] = in->owner_alive ? "alive" : "dead";
}

START_TEST(stale_segments_listed_and_removed) {
    const char *run = tr_run("shmstale");
    char err[512], seg[256];
    ck_assert_int_eq(ring_segment_name(run, "left", seg, sizeof seg, err, sizeof err), 0);
    struct ring_spec sp = {.name = "left", .n_slots = 1, .payload_bytes = 64, .desc_bytes = 64, .device = -1};
    pid_t pid = fork();
    if (pid == 0) { ring_create(run, &sp, err, sizeof err) ? _exit(0) : _exit(1); }   /* dies without unlinking */
    ck_assert_int_eq(tr_wait(pid), 0);
    char *want[2] = {seg, NULL};
    ck_assert_int_ge(ring_scan_segments(NULL, find_seg, want, err, sizeof err), 1);
    ck_assert_str_eq(want[1], "dead");
    char out[16384];
    char *ls[] = {(char *)test_bin("dflash-shm"), "--list-stale", NULL};
    ck_assert_int_eq(run_capture(ls, out, sizeof out), 0);
    ck_assert_msg(strstr(out, seg + 1) != NULL, "--list-stale does not list %s: %s", seg, out);
    ck_assert_int_eq(tr_count_segments(run), 1);   /* listing removes nothing */
    char *rm[] = {(char *)test_bin("dflash-shm"), "--remove-stale", NULL};
    ck_assert_int_eq(run_capture(rm, out, sizeof out), 0);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ring");
    TCase *tc = tcase_create("ring");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, run_id_matches_fsutil);
    tcase_add_test(tc, spec_parse);
    tcase_add_test(tc, order_strict_rank_and_end);
    tcase_add_test(tc, drain_waits_for_every_producer);
    tcase_add_test(tc, closed_wakes_waiters);
    tcase_add_test(tc, capacity_checks);
    tcase_add_test(tc, bad_segments_give_sentences);
    tcase_add_test(tc, create_refuses_live_adopts_or_replaces_stale);
    tcase_add_test(tc, shm_status_shutdown_sigterm);
    tcase_add_test(tc, shm_bad_flags_and_gpu_without_gpu);
    tcase_add_test(tc, stale_segments_listed_and_removed);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
