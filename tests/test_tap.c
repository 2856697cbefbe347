/*
 * tests/test_tap.c — dflash-tap as a process on real rings (host payloads).
 *
 * - inserted mid-run: a producer feeds ring A, dflash-record consumes A; after some items the
 *   recorder is stopped (SIGTERM), a tap A -> A2 (--record) starts and the recorder starts again
 *   on A2 with the same --out: the recording ends complete (every seq once, no gap), each item
 *   file byte-identical to a direct recording of the same item, and the tap's own recording
 *   holds exactly the items it forwarded;
 * - removed mid-run: the tap stopped (SIGTERM), A2 emptied by the recorder, the recorder moved back
 *   to A: the recording ends complete;
 * - SIGKILL of the tap mid-stream and the same command again: the downstream recorder still ends
 *   complete (a repeated seq, if any, dropped and counted).
 */
#include "test_hspack_items.h"

#include "core/record.h"

#include <dirent.h>
#include <sys/wait.h>

enum { N = 30 };

static pid_t spawn(const char *run, const char *bin, const char **extra) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s.out", run, bin);
    const char *argv[40] = {test_bin(bin), "--run", run, "--device", "cpu", "--wait-ms", "10000", "--heartbeat-s", "0.2"};
    int n = 9;
    for (int i = 0; extra[i] && n < 39; i++) argv[n++] = extra[i];
    return test_spawn_log(path, argv);
}

struct prod { const char *run; int n, delay_us; };

static int produce(void *arg) {
    struct prod *p = arg;
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *r = ring_attach(p->run, "A", RING_PRODUCER, 5000, err, sizeof err);
    if (!r) { fprintf(stderr, "producer: %s\n", err); return 1; }
    for (int q = 0; q < p->n; q++) {
        usleep((useconds_t)p->delay_us);
        hi_publish(r, (uint64_t)q);
    }
    ring_mark_drained(r);
    ring_close(r);
    return 0;
}

static int count_items(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        n += !strncmp(e->d_name, "item-", 5) && l > 12 && !strcmp(e->d_name + l - 12, ".safetensors");
    }
    closedir(d);
    return n;
}

static void wait_items(const char *dir, int n) {
    double t0 = tr_now();
    while (count_items(dir) < n) {
        ck_assert_msg(tr_now() - t0 < 20, "%s: fewer than %d items after 20 s", dir, n);
        usleep(5000);
    }
}

static size_t file_bytes(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s missing", path);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

/* Every seq in [lo, hi] of dir is byte-identical to a direct recording of item seq (scratch). */
static void check_items(const char *dir, int lo, int hi, const char *scratch) {
    static uint8_t desc[DESC_MAX_BYTES], pay[HI_CAP] __attribute__((aligned(256)));
    static uint8_t a[HI_CAP + 8192], b[HI_CAP + 8192];
    char err[1024], pa[900], pb[900];
    for (int q = lo; q <= hi; q++) {
        size_t dl = hi_make((uint64_t)q, desc, sizeof desc, pay, NULL);
        ck_assert_msg(record_write_file(scratch, (uint64_t)q, DESC_KIND_HIDDEN, desc, (uint32_t)dl, pay, HI_CAP, 0, err,
                                        sizeof err) == 0, "%s", err);
        record_path(pa, sizeof pa, dir, (uint64_t)q);
        record_path(pb, sizeof pb, scratch, (uint64_t)q);
        size_t na = file_bytes(pa, a, sizeof a), nb = file_bytes(pb, b, sizeof b);
        ck_assert_msg(na == nb && !memcmp(a, b, na), "seq %d: %s differs from a direct recording", q, pa);
    }
}

static const char *start(const char *tag, pid_t *shm) {
    const char *run = tr_run(tag);
    char spec[300];
    snprintf(spec, sizeof spec, "A:slots=4,bytes=%d,desc=4k,dev=host,A2:slots=4,bytes=%d,desc=4k,dev=host", HI_CAP, HI_CAP);
    *shm = tr_start_shm(run, spec, NULL, NULL);
    ring_set_log(tr_quiet, NULL);
    return run;
}

START_TEST(tap_inserted_mid_run) {
    pid_t shm;
    const char *run = start("tap-insert", &shm);
    char out[800], trec[800], scratch[800], path[900];
    snprintf(out, sizeof out, "%s/rec", run);
    snprintf(trec, sizeof trec, "%s/taprec", run);
    snprintf(scratch, sizeof scratch, "%s/scratch", run);
    ck_assert_int_eq(mkdir(scratch, 0755), 0);
    const char *r1[] = {"--ring", "A", "--out", out, "--kind", "hidden", NULL};
    pid_t rec = spawn(run, "dflash-record", r1);
    struct prod p = {run, N, 10000};
    pid_t w = tr_fork(produce, &p);
    wait_items(out, 8);
    /* insert: stop the consumer (its held item goes back READY), tap A -> A2, consumer on A2 */
    ck_assert_int_eq(kill(rec, SIGTERM), 0);
    int rc = tr_wait(rec);
    ck_assert_msg(rc == 0 || rc == 3, "the stopped recorder exits 0 or 3, got %d", rc);
    int before = count_items(out);
    const char *ta[] = {"--in", "A", "--out", "A2", "--record", trec, NULL};
    pid_t tap = spawn(run, "dflash-tap", ta);
    const char *r2[] = {"--ring", "A2", "--out", out, "--kind", "hidden", NULL};
    rec = spawn(run, "dflash-record", r2);
    ck_assert_int_eq(tr_wait(w), 0);
    ck_assert_int_eq(tr_wait(tap), 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    /* the downstream recording is complete and exact */
    struct record_index ix;
    char err[1024];
    ck_assert_msg(record_index_read(out, &ix, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ix.n_items, N);
    ck_assert_uint_eq(ix.items[0].seq, 0);
    record_index_free(&ix);
    check_items(out, 0, N - 1, scratch);
    snprintf(path, sizeof path, "%s/logs/dflash-record.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, " 0 duplicates dropped") && strstr(log, " 0 gaps"), "%s", log ? log : "");
    /* the tap recorded exactly what it forwarded: the seqs after the stop */
    ck_assert_msg(record_index_read(trec, &ix, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ix.items[0].seq, (uint64_t)before);
    ck_assert_uint_eq(ix.items[ix.n_items - 1].seq, N - 1);
    record_index_free(&ix);
    check_items(trec, before, N - 1, scratch);
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

/* Removal: producer -> A -> tap -> A2 -> recorder; SIGTERM the tap, let the recorder empty A2,
 * SIGTERM the recorder and start it again on A. */
START_TEST(tap_removed_mid_run) {
    pid_t shm;
    const char *run = start("tap-remove", &shm);
    char out[800], scratch[800], err[1024];
    snprintf(out, sizeof out, "%s/rec", run);
    snprintf(scratch, sizeof scratch, "%s/scratch", run);
    ck_assert_int_eq(mkdir(scratch, 0755), 0);
    const char *ta[] = {"--in", "A", "--out", "A2", NULL};
    pid_t tap = spawn(run, "dflash-tap", ta);
    const char *r1[] = {"--ring", "A2", "--out", out, NULL};
    pid_t rec = spawn(run, "dflash-record", r1);
    struct prod p = {run, N, 10000};
    pid_t w = tr_fork(produce, &p);
    wait_items(out, 8);
    ck_assert_int_eq(kill(tap, SIGTERM), 0);
    ck_assert_int_eq(tr_wait(tap), 3);   /* stopped before the end of the stream */
    struct ring *a2 = ring_attach(run, "A2", RING_OBSERVER, 1000, err, sizeof err);
    ck_assert_msg(a2 != NULL, "%s", err);
    double t0 = tr_now();
    for (;;) {   /* what the tap forwarded is consumed downstream before the consumer moves */
        struct ring_status st;
        ring_get_status(a2, &st);
        if (st.n_ready == 0 && st.n_reading == 0) break;
        ck_assert_msg(tr_now() - t0 < 10, "A2 not empty after 10 s");
        usleep(5000);
    }
    ring_close(a2);
    ck_assert_int_eq(kill(rec, SIGTERM), 0);
    int rc = tr_wait(rec);
    ck_assert_msg(rc == 0 || rc == 3, "the stopped recorder exits 0 or 3, got %d", rc);
    const char *r2[] = {"--ring", "A", "--out", out, NULL};
    rec = spawn(run, "dflash-record", r2);
    ck_assert_int_eq(tr_wait(w), 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    struct record_index ix;
    ck_assert_msg(record_index_read(out, &ix, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ix.n_items, N);
    record_index_free(&ix);
    check_items(out, 0, N - 1, scratch);
    tr_shutdown_shm(run, shm);
}
END_TEST

START_TEST(tap_sigkill_and_restart) {
    pid_t shm;
    const char *run = start("tap-kill", &shm);
    char out[800], scratch[800], path[900];
    snprintf(out, sizeof out, "%s/rec", run);
    snprintf(scratch, sizeof scratch, "%s/scratch", run);
    ck_assert_int_eq(mkdir(scratch, 0755), 0);
    const char *ta[] = {"--in", "A", "--out", "A2", NULL};
    pid_t tap = spawn(run, "dflash-tap", ta);
    const char *r[] = {"--ring", "A2", "--out", out, NULL};
    pid_t rec = spawn(run, "dflash-record", r);
    struct prod p = {run, N, 8000};
    pid_t w = tr_fork(produce, &p);
    wait_items(out, 8);
    ck_assert_int_eq(kill(tap, SIGKILL), 0);
    ck_assert_int_eq(tr_wait(tap), 128 + SIGKILL);
    tap = spawn(run, "dflash-tap", ta);
    ck_assert_int_eq(tr_wait(w), 0);
    ck_assert_int_eq(tr_wait(tap), 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    struct record_index ix;
    char err[1024];
    ck_assert_msg(record_index_read(out, &ix, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(ix.n_items, N);
    record_index_free(&ix);
    check_items(out, 0, N - 1, scratch);
    snprintf(path, sizeof path, "%s/logs/dflash-record.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, " 0 gaps") && (strstr(log, " 0 duplicates dropped") || strstr(log, " 1 duplicates dropped")),
                  "%s", log ? log : "");
    tr_stop_shm(shm);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tap");
    TCase *t = tcase_create("stage");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, tap_inserted_mid_run);
    tcase_add_test(t, tap_removed_mid_run);
    tcase_add_test(t, tap_sigkill_and_restart);
    suite_add_tcase(s, t);
    return test_run_suite(s);
}
