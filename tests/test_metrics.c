/*
 * tests/test_metrics.c — dflash-metrics: the sink module driven directly (JSON lines, the CSV
 * header across new names and restarts, bad input counted, done/gone, stall reports, plots) and
 * the multi-process test of issue 2: three sender processes push to a real dflash-metrics, one
 * sender is SIGKILLed, the sink is SIGKILLed and restarted, and metrics.jsonl must hold exactly
 * the records the senders' nn_send accepted, with the drop counts reported for the rest.
 */
#include "core/bus.h"
#include "core/fsutil.h"
#include "metrics/metrics_sink.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ---------------------------------------------------------------- helpers */

static char *slurp(const char *run, const char *rel) {
    char path[1024], err[256];
    char *text = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", run, rel);
    if (fs_read_file(path, &text, &len, err, sizeof err)) return NULL;
    return text;
}

static int count_lines(const char *text) {
    int n = 0;
    for (const char *p = text; p && *p; p++) n += *p == '\n';
    return n;
}

static size_t rec(void *out, enum bus_kind kind, const char *stage, int64_t pid, uint64_t step,
                  const char *k1, double v1, const char *k2, double v2) {
    struct bus_record r;
    memset(&r, 0, sizeof r);
    r.version = BUS_VERSION;
    r.kind = kind;
    snprintf(r.stage, sizeof r.stage, "%s", stage);
    r.pid = pid;
    r.t = 1796000000.5 + (double)step;
    r.has_seq = 1;
    r.seq = step;
    r.has_step = kind == BUS_KIND_METRIC;
    r.step = step;
    if (kind == BUS_KIND_EVENT) { snprintf(r.name, sizeof r.name, "note"); snprintf(r.text, sizeof r.text, "hello"); }
    if (kind == BUS_KIND_HEARTBEAT) { r.has_wait_on = 1; snprintf(r.wait_on, sizeof r.wait_on, "ring batches empty"); }
    if (k1) { snprintf(r.kv[r.n_kv].name, BUS_NAME_MAX, "%s", k1); r.kv[r.n_kv++].value = v1; }
    if (k2) { snprintf(r.kv[r.n_kv].name, BUS_NAME_MAX, "%s", k2); r.kv[r.n_kv++].value = v2; }
    void *buf;
    size_t len;
    char err[256];
    ck_assert_msg(bus_encode(&r, &buf, &len, err, sizeof err) == 0, "%s", err);
    memcpy(out, buf, len);
    free(buf);
    return len;
}

static struct msink *open_sink(const char *run, const char *gnuplot) {
    struct msink_opts o = {.run_dir = run, .csv_stage = "dflash-train", .stall_s = 30, .progress_s = 0,
                           .plot_every_s = 0, .plot_timeout_s = 10, .gnuplot = gnuplot, .tty = 0};
    char err[256];
    struct msink *s = msink_open(&o, err, sizeof err);
    ck_assert_msg(s != NULL, "%s", err);
    return s;
}

static void feed(struct msink *s, const void *buf, size_t len, double now, int want) {
    char err[256];
    ck_assert_int_eq(msink_handle(s, buf, len, now, err, sizeof err), want);
}

static pid_t dead_pid(void) {
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

static int have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

/* ---------------------------------------------------------------- the sink module */

START_TEST(jsonl_and_csv_across_restart) {
    const char *run = test_tmpdir("msink");
    char err[256], buf[4096];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    /* a line torn by an earlier SIGKILL must not swallow our first record */
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "w");
    fputs("{\"torn\":", f);
    fclose(f);

    struct msink *s = open_sink(run, "gnuplot");
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", 7, 1, "loss", 2.5, NULL, 0), 0, 0);
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", 7, 2, "loss", 2.25, "eal", 1.5), 0, 0);
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", 7, 3, "loss", NAN, NULL, 0), 0, 0);
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-pack", 8, 3, "other", 1, NULL, 0), 0, 0);   /* not the CSV stage */
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "dflash-pack", 8, 0, "items_in", 4, NULL, 0), 0, 0);
    feed(s, buf, rec(buf, BUS_KIND_EVENT, "dflash-pack", 8, 5, NULL, 0, NULL, 0), 0, 0);
    ck_assert_int_eq(msink_flush(s, err, sizeof err), 0);
    ck_assert_uint_eq(msink_records(s), 6);
    ck_assert_int_eq(msink_n_instances(s), 2);
    msink_close(s);

    char *j = slurp(run, "metrics.jsonl");
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(count_lines(j), 7);
    ck_assert_msg(!strncmp(j, "{\"torn\":\n{\"v\":1,\"kind\":\"metric\",\"stage\":\"dflash-train\",\"pid\":7,", 60), "%.120s", j);
    ck_assert_msg(strstr(j, "\"loss\":null") != NULL, "NaN must render as null: %s", j);
    ck_assert_msg(strstr(j, "\"wait_on\":\"ring batches empty\"") != NULL, "%s", j);
    ck_assert_msg(strstr(j, "\"name\":\"note\",\"text\":\"hello\"") != NULL, "%s", j);
    /* every line after the torn one is valid JSON */
    int lines_ok = 0;
    for (char *line = strchr(j, '\n') + 1; *line;) {
        char *e = strchr(line, '\n');
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)(e - line), 0, &je);
        ck_assert_msg(o != NULL, "bad JSON line: %.*s (%s)", (int)(e - line), line, je.text);
        json_decref(o);
        lines_ok++;
        line = e + 1;
    }
    ck_assert_int_eq(lines_ok, 6);
    free(j);

    char *c = slurp(run, "metrics.csv");
    ck_assert_ptr_nonnull(c);
    ck_assert_msg(!strcmp(c, "step,t,loss,eal\n"
                             "1,1796000001.500000,2.5,\n"
                             "2,1796000002.500000,2.25,1.5\n"
                             "3,1796000003.500000,,\n"), "%s", c);
    free(c);

    /* restart: the header is read back, a new name widens it once, the old rows are padded */
    s = open_sink(run, "gnuplot");
    ck_assert_int_eq(msink_csv_ncols(s), 2);
    ck_assert_str_eq(msink_csv_col(s, 1), "eal");
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", 9, 4, "eal", 2, "loss", 1), 0, 0);
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", 9, 5, "lr", 1e-4, NULL, 0), 0, 0);
    ck_assert_int_eq(msink_csv_ncols(s), 3);
    msink_close(s);
    c = slurp(run, "metrics.csv");
    ck_assert_msg(!strcmp(c, "step,t,loss,eal,lr\n"
                             "1,1796000001.500000,2.5,,\n"
                             "2,1796000002.500000,2.25,1.5,\n"
                             "3,1796000003.500000,,,\n"
                             "4,1796000004.500000,1,2,\n"
                             "5,1796000005.500000,,,0.0001\n"), "%s", c);
    free(c);
    j = slurp(run, "metrics.jsonl");
    ck_assert_int_eq(count_lines(j), 9);
    free(j);

    /* a metrics.csv that is not ours is refused, not overwritten */
    const char *run2 = test_tmpdir("msink-badcsv");
    ck_assert(run_dir_init(run2, err, sizeof err) == 0);
    snprintf(path, sizeof path, "%s/metrics.csv", run2);
    f = fopen(path, "w");
    fputs("a,b\n1,2\n", f);
    fclose(f);
    struct msink_opts o = {.run_dir = run2};
    ck_assert_ptr_null(msink_open(&o, err, sizeof err));
    ck_assert_msg(strstr(err, "step,t") != NULL, "%s", err);
}
END_TEST

START_TEST(bad_input_counted_not_written) {
    const char *run = test_tmpdir("msink-bad");
    char err[256], buf[4096];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    struct msink *s = open_sink(run, "gnuplot");
    uint64_t st = 99;
    for (int i = 0; i < 50; i++) {
        for (int k = 0; k < 64; k++) buf[k] = (char)test_rng_next(&st);
        feed(s, buf, 64, 0, BUS_EMALFORMED);
    }
    /* version 2 */
    struct bus_record r;
    memset(&r, 0, sizeof r);
    size_t n = rec(buf, BUS_KIND_SUMMARY, "x", 1, 0, NULL, 0, NULL, 0);
    ck_assert_int_eq(bus_decode(buf, n, &r, err, sizeof err), 0);
    r.version = 2;
    void *enc;
    size_t len;
    ck_assert(bus_encode(&r, &enc, &len, err, sizeof err) == 0);
    feed(s, enc, len, 0, BUS_EVERSION);
    free(enc);
    /* unknown kinds: "summary" -> "summarx" keeps the length, so patch the bytes */
    n = rec(buf, BUS_KIND_SUMMARY, "x", 1, 0, NULL, 0, NULL, 0);
    char *k = memmem(buf, n, "summary", 7);
    ck_assert_ptr_nonnull(k);
    k[6] = 'x';
    feed(s, buf, n, 0, BUS_EKIND);
    k[6] = 'z';
    feed(s, buf, n, 0, BUS_EKIND);
    feed(s, buf, n, 0, BUS_EKIND);
    ck_assert_uint_eq(msink_bad_count(s, MSINK_BAD_MALFORMED), 50);
    ck_assert_uint_eq(msink_bad_count(s, MSINK_BAD_VERSION), 1);
    ck_assert_uint_eq(msink_bad_count(s, MSINK_BAD_KIND), 3);
    ck_assert_uint_eq(msink_records(s), 0);
    ck_assert_int_eq(msink_n_instances(s), 0);
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "ok", 1, 0, NULL, 0, NULL, 0), 0, 0);
    msink_close(s);
    char *j = slurp(run, "metrics.jsonl");
    ck_assert_int_eq(count_lines(j), 1);
    free(j);
}
END_TEST

/* tokens/s on the progress line: the slowest live stage's heartbeat rate until a trainer reports. */
START_TEST(progress_rate_fallback) {
    const char *run = test_tmpdir("msink-progress");
    char err[256], buf[4096], line[512];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    struct msink *s = open_sink(run, "gnuplot");
    pid_t me = getpid();
    msink_progress(s, 100, line, sizeof line);
    ck_assert_msg(strstr(line, "| - tok/s |"), "%s", line);
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "dflash-pack", me, 0, "items_out", 3, "tokens_per_s", 2.5e6), 100, 0);
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "dflash-target", me, 0, "items_in", 3, "tokens_per_s", 41000), 100, 0);
    /* metric records of a stage other than the main one (--csv-stage) do not drive the line */
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-target", me, 3, "tokens_per_s", 99, NULL, 0), 100, 0);
    msink_progress(s, 101, line, sizeof line);
    ck_assert_msg(strstr(line, "| 41.0k tok/s |") && strstr(line, "step - |"), "%s", line);
    /* an ended stage no longer counts */
    feed(s, buf, rec(buf, BUS_KIND_SUMMARY, "dflash-target", me, 1, "items_in", 3, "tokens_per_s", 41000), 102, 0);
    msink_progress(s, 103, line, sizeof line);
    ck_assert_msg(strstr(line, "| 2.50M tok/s |"), "%s", line);
    /* the trainer's own metric wins */
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", me, 7, "tokens_per_s", 22000, "loss", 2), 104, 0);
    msink_progress(s, 105, line, sizeof line);
    ck_assert_msg(strstr(line, "| 22.0k tok/s |") && strstr(line, "step 7 |"), "%s", line);
    msink_close(s);
}
END_TEST

START_TEST(done_gone_and_stalls) {
    const char *run = test_tmpdir("msink-done");
    char err[256], buf[4096], report[1024];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    struct msink *s = open_sink(run, "gnuplot");
    pid_t me = getpid(), dead = dead_pid();
    ck_assert_int_eq(msink_done(s), 0);   /* nothing seen yet: not done */
    /* a stage with only metric records does not hold the exit */
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", me, 1, "loss", 1, NULL, 0), 100, 0);
    ck_assert_int_eq(msink_done(s), 0);
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "dflash-pack", me, 0, "items_in", 1, "items_out", 1), 100, 0);
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "dflash-target", dead, 0, "items_in", 5, NULL, 0), 100, 0);
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "dflash-pack", me, 1, "items_in", 1, "items_out", 1), 110, 0);
    ck_assert_int_eq(msink_stalled(s, 129, report, sizeof report), 0);
    ck_assert_int_eq(msink_stalled(s, 131, report, sizeof report), 1);
    ck_assert_msg(strstr(report, "dflash-pack[") && strstr(report, "dflash-target[") &&
                  strstr(report, "ring batches empty"), "%s", report);
    feed(s, buf, rec(buf, BUS_KIND_HEARTBEAT, "dflash-pack", me, 2, "items_in", 2, "items_out", 1), 132, 0);
    ck_assert_int_eq(msink_stalled(s, 140, report, sizeof report), 0);
    ck_assert_int_eq(msink_stalled(s, 163, report, sizeof report), 1);
    /* dflash-pack ends; dflash-target's process is gone but only a tick finds that out */
    feed(s, buf, rec(buf, BUS_KIND_SUMMARY, "dflash-pack", me, 3, "items_in", 2, "items_out", 2), 164, 0);
    ck_assert_int_eq(msink_done(s), 0);
    msink_tick(s, time_mono_s() + 5);
    ck_assert_int_eq(msink_done(s), 1);
    ck_assert_int_eq(msink_stalled(s, 1e9, report, sizeof report), 0);   /* nothing live: no stall */
    msink_close(s);
}
END_TEST

START_TEST(plots_drawn_or_warned) {
    const char *run = test_tmpdir("msink-plot");
    char err[256], buf[4096], path[1024];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    struct msink *s = open_sink(run, "/nonexistent/gnuplot");
    for (int i = 1; i <= 20; i++)
        feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", 7, (uint64_t)i, "loss", 3.0 / i, "tokens_per_s", 1000 + i), 0, 0);
    msink_finish(s, time_mono_s(), "test");   /* a missing gnuplot is a warning, not a failure */
    msink_close(s);
    snprintf(path, sizeof path, "%s/plots/loss.png", run);
    ck_assert_int_eq(fs_exists(path), 0);
    if (!have_gnuplot()) return;
    s = open_sink(run, "gnuplot");
    feed(s, buf, rec(buf, BUS_KIND_METRIC, "dflash-train", 7, 21, "loss", 0.1, NULL, 0), 0, 0);
    msink_finish(s, time_mono_s(), "test");
    msink_close(s);
    ck_assert_msg(fs_exists(path), "%s missing", path);
    snprintf(path, sizeof path, "%s/plots/tokens_per_s.png", run);
    ck_assert_msg(fs_exists(path), "%s missing", path);
    snprintf(path, sizeof path, "%s/plots/eal.png", run);
    ck_assert_int_eq(fs_exists(path), 0);   /* no eal column: no plot */
    struct stat st;
    snprintf(path, sizeof path, "%s/plots/loss.png", run);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_gt(st.st_size, 1000);
}
END_TEST

/* ---------------------------------------------------------------- the binary's flags */

static int run_cmd(const char *const *argv) {
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        dup2(nul, 2);
        execv(argv[0], (char *const *)argv);
        _exit(126);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(binary_flags) {
    const char *bin = test_bin("dflash-metrics");
    const char *run = test_tmpdir("mflags");
    const char *a1[] = {bin, "--help", NULL};
    ck_assert_int_eq(run_cmd(a1), 0);
    const char *a2[] = {bin, NULL};
    ck_assert_int_eq(run_cmd(a2), 2);
    const char *a3[] = {bin, "--run", run, "--bogus", NULL};
    ck_assert_int_eq(run_cmd(a3), 2);
    const char *a4[] = {bin, "--run", run, "--stall-s", "-1", NULL};
    ck_assert_int_eq(run_cmd(a4), 2);
    /* no senders at all: --idle-exit-s ends it, cleanly */
    const char *a5[] = {bin, "--run", run, "--idle-exit-s", "0.3", NULL};
    ck_assert_int_eq(run_cmd(a5), 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/bus/metrics.sock", run);
    ck_assert_int_eq(fs_exists(path), 0);   /* an orderly exit removes its socket file */
}
END_TEST

/* Issue 24: SIGTERM mid-run is "stopped" (exit 3, STAGE_EXIT_STOPPED), so lib.sh starts the sink again; it exited
 * 0, which the supervisor read as a service that left, failing the run. */
START_TEST(sigterm_exits_stopped) {
    const char *bin = test_bin("dflash-metrics");
    const char *run = test_tmpdir("msigterm");
    char path[1024];
    snprintf(path, sizeof path, "%s/bus/metrics.sock", run);
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        dup2(nul, 2);
        execl(bin, bin, "--run", run, "--idle-exit-s", "60", (char *)NULL);
        _exit(126);
    }
    for (int i = 0; i < 2000 && !fs_exists(path); i++) usleep(5000);
    ck_assert_msg(fs_exists(path), "dflash-metrics did not bind %s within 10 s", path);
    kill(p, SIGTERM);
    int st;
    ck_assert_int_eq(waitpid(p, &st, 0), p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 3, "dflash-metrics after SIGTERM: status %d, want exit 3", st);
    ck_assert_int_eq(fs_exists(path), 0);
}
END_TEST

/* ---------------------------------------------------------------- multi-process */

/*
 * What "sent while the sink was up" means here, and why the test is built this way:
 * - Each sender logs, in shared memory, every seq it attempts: ATTEMPT before bus_*, then ACCEPTED
 *   (nn_send took it) or DROPPED (EAGAIN: no sink connected). The sink must write exactly the
 *   ACCEPTED ones, none of the DROPPED ones, and each record's `dropped` field must equal the
 *   number of DROPPED seqs before it.
 * - A record stuck at ATTEMPT belongs to the sender we SIGKILL: it may have been accepted just
 *   before the kill, so it may appear at most once. nn_send hands a record to nanomsg's worker
 *   thread, which writes it to the connection a few microseconds later; a process killed in
 *   between takes it along (measured: a sender that nn_close()s right after nn_send loses 20-50%
 *   of its last records; with bus_close's 50 ms linger, none in 1000). So the killed sender's last
 *   TAIL_LOSS_MAX accepted records may be missing; no other accepted record may be.
 * - SIGKILL of the sink destroys whatever sits unread in the kernel socket buffers and in the
 *   sink's nanomsg queue; no sink design can save those bytes, and nanomsg does not resend them
 *   (PUSH has no acknowledgements). So before killing the sink the test pauses the senders and
 *   waits until metrics.jsonl holds every accepted record: "the sink was up" for every one of
 *   them. Then the kill loses nothing that was accepted.
 * - After the kill the test waits a little before resuming the senders, so their nanomsg has
 *   seen the connection close (500 ms): from then on sends fail with EAGAIN (nanomsg's PUSH keeps no queue
 *   without a connected peer, so nothing sent while the sink is down is delivered later) until
 *   the restarted sink is bound and each sender has reconnected (100 ms reconnect interval).
 *   A send accepted in that short window before nanomsg noticed the closed connection would be
 *   lost without being counted; the test asserts that does not happen with the wait it uses.
 */
#define NSEND 3
#define TAIL_LOSS_MAX 2
#define MAXSEQ 16384
enum { ST_NONE = 0, ST_ATTEMPT = 1, ST_ACCEPTED = 2, ST_DROPPED = 3 };

struct sender_log {
    int n;                          /* seqs attempted */
    unsigned char st[MAXSEQ];
    unsigned char metric[MAXSEQ];   /* 1 if that seq was a metric record */
};
struct shared {
    int pause, stop;
    int paused[NSEND];
    struct sender_log s[NSEND];
};

static void sender_main(struct shared *sh, int id, const char *run) {
    char name[32], err[256], berr[256];
    snprintf(name, sizeof name, "sender-%d", id);
    struct bus *b = bus_open(run, name, err, sizeof err);
    if (!b) { fprintf(stderr, "%s: %s\n", name, err); _exit(3); }
    struct sender_log *lg = &sh->s[id];
    uint64_t step = 0;
    for (int k = 0;; k++) {
        if (__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) break;
        if (__atomic_load_n(&sh->pause, __ATOMIC_ACQUIRE)) {
            __atomic_store_n(&sh->paused[id], 1, __ATOMIC_RELEASE);
            usleep(1000);
            continue;
        }
        uint64_t seq = bus_sent(b);
        if (seq >= MAXSEQ - 1) break;
        int metric = id == 0 && (k & 1);
        lg->metric[seq] = (unsigned char)metric;
        __atomic_store_n(&lg->st[seq], ST_ATTEMPT, __ATOMIC_RELEASE);
        int rc;
        if (metric) {
            struct bus_kv kv[] = {{"loss", 5.0 / (double)(step + 1)}, {"eal", 1 + 0.001 * (double)step}, {"tokens_per_s", 1e4}};
            rc = bus_metric(b, (int64_t)step++, kv, 3, berr, sizeof berr);
        } else {
            struct bus_kv kv[] = {{BUS_K_ITEMS_IN, k}, {BUS_K_ITEMS_OUT, k}, {BUS_K_BUSY_S, 0.001 * k}, {BUS_K_WAIT_S, 0.001 * k}};
            rc = bus_heartbeat(b, kv, 4, berr, sizeof berr);
        }
        if (rc < 0) { fprintf(stderr, "%s: %s\n", name, berr); _exit(4); }
        __atomic_store_n(&lg->st[seq], rc ? ST_ACCEPTED : ST_DROPPED, __ATOMIC_RELEASE);
        __atomic_store_n(&lg->n, (int)seq + 1, __ATOMIC_RELEASE);
        usleep(2000);
    }
    uint64_t seq = bus_sent(b);
    __atomic_store_n(&lg->st[seq], ST_ATTEMPT, __ATOMIC_RELEASE);
    struct bus_kv kv[] = {{BUS_K_ITEMS_IN, 1}, {BUS_K_ITEMS_OUT, 1}};
    int rc = bus_summary(b, kv, 2, berr, sizeof berr);
    __atomic_store_n(&lg->st[seq], rc == 1 ? ST_ACCEPTED : ST_DROPPED, __ATOMIC_RELEASE);
    __atomic_store_n(&lg->n, (int)seq + 1, __ATOMIC_RELEASE);
    bus_close(b);
    _exit(0);
}

static pid_t start_sink(const char *run, int incarnation) {
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) {
        char out[1024];
        snprintf(out, sizeof out, "%s/sink-%d.out", run, incarnation);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); }
        const char *bin = test_bin("dflash-metrics");
        execl(bin, bin, "--run", run, "--exit-when-done", "--idle-exit-s", "20", "--progress-s", "0.3",
              "--plot-every-s", "0.5", "--stall-s", "60", "--csv-stage", "sender-0", (char *)NULL);
        _exit(126);
    }
    return p;
}

static int jsonl_lines(const char *run) {
    char *j = slurp(run, "metrics.jsonl");
    int n = count_lines(j);
    free(j);
    return n;
}

static int accepted_total(struct shared *sh) {
    int n = 0;
    for (int i = 0; i < NSEND; i++) {
        int m = __atomic_load_n(&sh->s[i].n, __ATOMIC_ACQUIRE);
        for (int q = 0; q < m; q++) n += sh->s[i].st[q] == ST_ACCEPTED;
    }
    return n;
}

/* Wait until cond() or the deadline; returns cond's last value. */
#define WAIT_UNTIL(cond, seconds) ({ double t0_ = time_mono_s(); int ok_; \
        while (!(ok_ = (cond)) && time_mono_s() - t0_ < (seconds)) { usleep(5000); } \
        ok_; })

START_TEST(senders_kill_and_restart) {
    const char *run = test_tmpdir("mproc");
    char err[256];
    ck_assert(run_dir_init(run, err, sizeof err) == 0);
    struct shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_ptr_ne(sh, MAP_FAILED);
    memset(sh, 0, sizeof *sh);

    pid_t sink = start_sink(run, 1);
    char sock[1024];
    snprintf(sock, sizeof sock, "%s/bus/metrics.sock", run);
    ck_assert_msg(WAIT_UNTIL(fs_exists(sock), 5), "dflash-metrics did not bind within 5 s");
    struct stat sst;   /* the socket's mode is set after bind, not left to the umask */
    ck_assert_msg(WAIT_UNTIL(stat(sock, &sst) == 0 && (sst.st_mode & 0777) == 0600, 5), "socket mode %o, want 0600",
                  (unsigned)(sst.st_mode & 0777));
    pid_t snd[NSEND];
    for (int i = 0; i < NSEND; i++) {
        snd[i] = fork();
        ck_assert_int_ge(snd[i], 0);
        if (snd[i] == 0) sender_main(sh, i, run);
    }
    /* phase 1: sink up; SIGKILL sender 2 mid-way */
    usleep(300000);
    kill(snd[2], SIGKILL);
    ck_assert_int_eq(waitpid(snd[2], NULL, 0), snd[2]);   /* reaped: the sink sees it gone */
    usleep(300000);

    /* quiesce, let the sink write everything accepted so far, then SIGKILL it */
    __atomic_store_n(&sh->pause, 1, __ATOMIC_RELEASE);
    ck_assert(WAIT_UNTIL(__atomic_load_n(&sh->paused[0], __ATOMIC_ACQUIRE) && __atomic_load_n(&sh->paused[1], __ATOMIC_ACQUIRE), 5));
    int acc1 = accepted_total(sh);
    /* (the killed sender's last records may be missing: see TAIL_LOSS_MAX; the per-seq check below
     * says exactly which) */
    if (!WAIT_UNTIL(jsonl_lines(run) >= acc1, 2))
        ck_assert_msg(jsonl_lines(run) >= acc1 - TAIL_LOSS_MAX, "sink wrote %d lines of %d accepted records", jsonl_lines(run), acc1);
    int lines1 = jsonl_lines(run);
    int n_at_kill[NSEND];   /* the senders are paused: these seqs were all sent before the sink died */
    for (int i = 0; i < NSEND; i++) n_at_kill[i] = __atomic_load_n(&sh->s[i].n, __ATOMIC_ACQUIRE);
    ck_assert_int_le(lines1, acc1 + 1);   /* +1: sender 2's record in flight when it was killed */
    kill(sink, SIGKILL);
    ck_assert_int_eq(waitpid(sink, NULL, 0), sink);
    usleep(500000);   /* generous: the senders' nanomsg must see the hang-up before they resume */

    /* phase 2: sink down, senders run and drop: until each made 100 attempts (a fixed sleep gave too few on a
     * loaded machine) */
    __atomic_store_n(&sh->pause, 0, __ATOMIC_RELEASE);
    usleep(300000);
    ck_assert(WAIT_UNTIL(__atomic_load_n(&sh->s[0].n, __ATOMIC_ACQUIRE) >= n_at_kill[0] + 100 &&
                         __atomic_load_n(&sh->s[1].n, __ATOMIC_ACQUIRE) >= n_at_kill[1] + 100, 20));

    /* phase 3: the same command again; it removes the stale socket and keeps appending */
    sink = start_sink(run, 2);
    ck_assert_msg(WAIT_UNTIL(jsonl_lines(run) > lines1 + 20, 5), "no records after the sink restart");
    usleep(300000);
    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++) {
        int st;
        ck_assert_int_eq(waitpid(snd[i], &st, 0), snd[i]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "sender %d failed (status %d)", i, st);
    }
    /* --exit-when-done: both survivors sent summaries, sender 2 was gone before the restart */
    int st = 0;
    ck_assert_msg(WAIT_UNTIL(waitpid(sink, &st, WNOHANG) == sink, 10), "dflash-metrics did not exit when done");
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "dflash-metrics exit status %d", st);

    /* the senders' logs stay beside the run for whoever debugs a failure: one char per seq */
    for (int i = 0; i < NSEND; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/sender-%d.states", run, i);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        for (int q = 0; q < MAXSEQ && sh->s[i].st[q]; q++) fputc(".?AD"[sh->s[i].st[q]], f);
        fputc('\n', f);
        fclose(f);
    }

    /* every line: a sender record, counted per (sender, seq); `dropped` as the sender logged it */
    static int seen[NSEND][MAXSEQ];
    memset(seen, 0, sizeof seen);
    char *j = slurp(run, "metrics.jsonl");
    ck_assert_ptr_nonnull(j);
    for (char *line = j; *line;) {
        char *e = strchr(line, '\n');
        ck_assert_ptr_nonnull(e);
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)(e - line), 0, &je);
        ck_assert_msg(o != NULL, "bad JSON line: %s", je.text);
        int id = -1;
        const char *stage = json_string_value(json_object_get(o, "stage"));
        ck_assert_msg(stage && sscanf(stage, "sender-%d", &id) == 1 && id >= 0 && id < NSEND, "unexpected stage %s", stage);
        json_int_t seq = json_integer_value(json_object_get(o, "seq"));
        json_int_t dropped = json_integer_value(json_object_get(o, "dropped"));
        ck_assert(seq >= 0 && seq < MAXSEQ);
        ck_assert_msg(sh->s[id].st[seq] == ST_ACCEPTED || sh->s[id].st[seq] == ST_ATTEMPT,
                      "sender-%d seq %lld is in the jsonl but the sender logged state %d", id, (long long)seq, sh->s[id].st[seq]);
        int drops_before = 0;
        for (json_int_t q = 0; q < seq; q++) drops_before += sh->s[id].st[q] == ST_DROPPED;
        ck_assert_msg(dropped == drops_before, "sender-%d seq %lld carries dropped=%lld, sender logged %d",
                      id, (long long)seq, (long long)dropped, drops_before);
        seen[id][seq]++;
        json_decref(o);
        line = e + 1;
    }
    free(j);
    int drops[NSEND] = {0}, accepted[NSEND] = {0}, attempt[NSEND] = {0}, metric_rows = 0;
    int accepted_before[NSEND] = {0}, accepted_after[NSEND] = {0}, drops_after[NSEND] = {0}, tail_lost = 0;
    for (int i = 0; i < NSEND; i++) {
        for (int q = 0; q < MAXSEQ; q++) {
            int s = sh->s[i].st[q];
            if (s == ST_ACCEPTED && i == 2 && seen[i][q] == 0) {
                /* only the tail of the killed sender: nothing of it may be present after this one */
                int later = 0;
                for (int r = q + 1; r < MAXSEQ; r++) later += seen[i][r];
                ck_assert_msg(later == 0, "sender-2 seq %d is missing but later records are present", q);
                ck_assert_msg(++tail_lost <= TAIL_LOSS_MAX, "sender-2 lost more than %d records at its kill", TAIL_LOSS_MAX);
                accepted[i]++;
            } else if (s == ST_ACCEPTED) {
                ck_assert_msg(seen[i][q] == 1, "sender-%d seq %d was accepted but is in the jsonl %d times", i, q, seen[i][q]);
                accepted[i]++;
                if (q < n_at_kill[i]) accepted_before[i]++;
                else accepted_after[i]++;
                if (i == 0 && sh->s[i].metric[q]) metric_rows++;
            } else if (s == ST_DROPPED) {
                ck_assert_msg(seen[i][q] == 0, "sender-%d seq %d was dropped but is in the jsonl", i, q);
                drops[i]++;
                if (q >= n_at_kill[i]) drops_after[i]++;
            } else if (s == ST_ATTEMPT) {
                ck_assert_msg(i == 2, "sender-%d seq %d never finished its send", i, q);
                ck_assert_int_le(seen[i][q], 1);
                attempt[i]++;
            } else {
                ck_assert_int_eq(seen[i][q], 0);
            }
        }
    }
    ck_assert_int_le(attempt[2], 1);
    for (int i = 0; i < 2; i++) {
        /* the test exercised what it claims: records before the kill, drops while down, records after */
        ck_assert_msg(drops_after[i] >= 50, "sender-%d dropped only %d records while the sink was down", i, drops_after[i]);
        ck_assert_msg(accepted_after[i] >= 50, "sender-%d: only %d records accepted after the restart", i, accepted_after[i]);
        ck_assert_msg(accepted_before[i] >= 50, "sender-%d: only %d records before the sink was killed", i, accepted_before[i]);
    }
    ck_assert_int_ge(accepted[2], 30);

    /* the restarted sink's summary reports each survivor's drops and no unexplained loss */
    char *log = slurp(run, "logs/dflash-metrics.log");
    ck_assert_ptr_nonnull(log);
    for (int i = 0; i < 2; i++) {
        char key[64];
        snprintf(key, sizeof key, "summary: sender-%d ", i);
        char *p = strstr(log, key);
        ck_assert_msg(p != NULL, "no summary line for sender-%d", i);
        ck_assert_msg(strstr(p + 1, key) == NULL, "two summary lines for sender-%d", i);
        long long pid, records, dropped, lost;
        double in, out, busy, wait;
        char state[32];
        ck_assert_int_eq(sscanf(p + strlen(key), "%lld %lld %lf %lf %lf %lf %lld %lld %31s", &pid, &records, &in, &out,
                                &busy, &wait, &dropped, &lost, state), 9);
        ck_assert_int_eq(pid, snd[i]);
        ck_assert_int_eq(dropped, drops[i]);
        ck_assert_int_eq(lost, 0);
        ck_assert_str_eq(state, "ended");
    }
    free(log);

    /* metrics.csv: one header across the restart, one row per accepted metric record */
    char *csv = slurp(run, "metrics.csv");
    ck_assert_ptr_nonnull(csv);
    ck_assert_msg(!strncmp(csv, "step,t,loss,eal,tokens_per_s\n", 29), "%.80s", csv);
    ck_assert_ptr_null(strstr(csv + 1, "step,t"));
    ck_assert_int_eq(count_lines(csv), 1 + metric_rows);
    free(csv);
    if (have_gnuplot()) {
        char png[1024];
        snprintf(png, sizeof png, "%s/plots/loss.png", run);
        ck_assert_msg(fs_exists(png), "%s missing", png);
    }
    munmap(sh, sizeof *sh);
}
END_TEST

int main(void) {
    Suite *s = suite_create("metrics");
    TCase *unit = tcase_create("sink");
    tcase_set_timeout(unit, 30);
    tcase_add_test(unit, jsonl_and_csv_across_restart);
    tcase_add_test(unit, bad_input_counted_not_written);
    tcase_add_test(unit, done_gone_and_stalls);
    tcase_add_test(unit, progress_rate_fallback);
    tcase_add_test(unit, plots_drawn_or_warned);
    tcase_add_test(unit, binary_flags);
    tcase_add_test(unit, sigterm_exits_stopped);
    suite_add_tcase(s, unit);
    TCase *mp = tcase_create("multiprocess");
    tcase_set_timeout(mp, 60);
    tcase_add_test(mp, senders_kill_and_restart);
    suite_add_tcase(s, mp);
    return test_run_suite(s);
}
