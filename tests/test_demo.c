/*
 * tests/test_demo.c — the main job end to end: runs pipelines/demo.sh (the script `make run`
 * runs) on the tiny model in a temporary run directory, with --device cpu, and checks what it
 * produced, not what it printed.
 *
 *   1. A run exits 0, writes DONE, metrics.jsonl holds records of dflash-pack, dflash-target and
 *      dflash-record, and every batch the packer made was recorded exactly once: the recorded
 *      seqs are exactly 0..N-1 with N the packer's batch count, every item passes record_check,
 *      and every dataset row appears exactly once. Running the same command again only reports.
 *   2. dflash-target is SIGKILLed mid-run (after a few items are on disk; the run has ~3 epochs so
 *      it is still busy): the script restarts it, the run completes, nothing is lost or doubled
 *      (every row exactly 3 times).
 *   3. The whole pipeline dies (script and every stage SIGKILLed, rings left behind) and the same
 *      command is run again: it resumes from what the recorder has on disk and completes with
 *      every row exactly 3 times.
 * Timing is controlled by the item count on disk, not sleeps: a kill happens once >= 5 items are
 * recorded, and each run has ~140 batches.
 */
#include "core/desc.h"
#include "core/record.h"
#include "test_ring_util.h"

#include <fcntl.h>
#include <limits.h>

#define SAMPLES 200   /* pipelines/demo.sh DATASET_FLAGS --samples */

static const char *demo_script(void) {
    static char path[PATH_MAX];
    if (access("pipelines/demo.sh", X_OK) == 0) return "pipelines/demo.sh";
    const char *bin = getenv("DFLASH_BIN");
    snprintf(path, sizeof path, "%s/../../pipelines/demo.sh", bin ? bin : "build/bin");
    return path;
}

/* Start the demo for run (epochs), output to <run>.out; returns the script's pid. */
static pid_t start_demo(const char *run, const char *epochs) {
    char out[700];
    snprintf(out, sizeof out, "%s.out", run);
    const char *script = demo_script();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* SIGTERM, not SIGKILL: the script's trap then stops its stages (own process groups) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        setenv("RUN", run, 1);
        setenv("EPOCHS", epochs, 1);
        setenv("DEVICE", "cpu", 1);
        if (!getenv("DFLASH_BIN")) setenv("DFLASH_BIN", "build/bin", 1);
        execl("/bin/bash", "bash", script, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int wait_demo(pid_t pid, double secs) {
    double t0 = tr_now();
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (tr_now() - t0 > secs) {
            kill(pid, SIGTERM);
            tr_wait(pid);
            ck_abort_msg("the demo did not finish within %.0f s", secs);
        }
        usleep(20000);
    }
}

static char *slurp(const char *path, size_t *len_out) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(b);
    size_t got = fread(b, 1, (size_t)n, f);
    fclose(f);
    b[got] = 0;
    if (len_out) *len_out = got;
    return b;
}

static int count_items(const char *run) {
    char dir[700];
    snprintf(dir, sizeof dir, "%s/record", run);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += !strncmp(e->d_name, "item-", 5);
    closedir(d);
    return n;
}

static int read_pid(const char *run, const char *stage) {
    char path[700];
    snprintf(path, sizeof path, "%s/pids/%s.pid", run, stage);
    char *s = slurp(path, NULL);
    if (!s) return 0;
    int pid = atoi(s);
    free(s);
    return pid;
}

/* Wait until >= n items are on disk (the pipeline is mid-stream). */
static void wait_items(const char *run, int n, pid_t demo) {
    double t0 = tr_now();
    while (count_items(run) < n) {
        int st;
        ck_assert_msg(waitpid(demo, &st, WNOHANG) == 0, "the demo ended before %d items were recorded", n);
        ck_assert_msg(tr_now() - t0 < 60, "fewer than %d items recorded after 60 s", n);
        usleep(5000);
    }
}

/* The packer's batch count, from its last "end of stream at seq N" log line. */
static int packer_batches(const char *run) {
    char path[700];
    snprintf(path, sizeof path, "%s/logs/dflash-pack.log", run);
    char *log = slurp(path, NULL);
    ck_assert_msg(log != NULL, "no %s", path);
    const char *p = log, *last = NULL;
    while ((p = strstr(p, "end of stream at seq ")) != NULL) last = p++;
    ck_assert_msg(last != NULL, "dflash-pack never reached the end of its stream: %s", log);
    int n = atoi(last + strlen("end of stream at seq "));
    free(log);
    return n;
}

/* Every recorded item: seqs exactly 0..N-1 (N = the packer's count), each a valid hidden item;
 * every dataset row exactly `epochs` times. */
static void check_recorded(const char *run, int epochs) {
    int n = packer_batches(run);
    ck_assert_int_gt(n, 3);
    ck_assert_int_eq(count_items(run), n);
    int rows[SAMPLES];
    memset(rows, 0, sizeof rows);
    char dir[700], path[800], err[1024];
    snprintf(dir, sizeof dir, "%s/record", run);
    for (int q = 0; q < n; q++) {
        ck_assert_int_eq(record_path(path, sizeof path, dir, (uint64_t)q), 0);
        struct record_item it;
        ck_assert_msg(record_read_file(path, &it, err, sizeof err) == 0, "seq %d: %s", q, err);
        struct record_info info;
        ck_assert_msg(record_check(it.desc, it.h.desc_len, it.h.seq, it.payload, it.h.payload_len, 0, DESC_KIND_HIDDEN,
                                   512, &info, err, sizeof err) == 0, "%s", err);
        struct desc_hidden hd;
        ck_assert_msg(desc_hidden_decode(it.desc, it.h.desc_len, 0, &hd, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(hd.batch.seq, (uint64_t)q);
        ck_assert_int_eq(hd.n_layers, 2);
        ck_assert_int_eq(hd.hidden_size, 64);
        struct desc_batch_arrays a;
        desc_batch_arrays(&hd.batch, it.payload, &a);
        for (uint32_t d = 0; d < hd.batch.n_docs; d++) {
            ck_assert(a.row_ids[d] >= 0 && a.row_ids[d] < SAMPLES);
            rows[a.row_ids[d]]++;
        }
        record_item_free(&it);
    }
    for (int r = 0; r < SAMPLES; r++)
        ck_assert_msg(rows[r] == epochs, "dataset row %d recorded %d times, expected %d", r, rows[r], epochs);
    snprintf(path, sizeof path, "%s/record/DONE", run);
    char *done = slurp(path, NULL);
    ck_assert_msg(done && strstr(done, "\"complete\": true") && strstr(done, "\"gaps\": 0,"), "record DONE: %s",
                  done ? done : "(missing)");
    free(done);
    snprintf(path, sizeof path, "%s/DONE", run);
    ck_assert_msg(access(path, F_OK) == 0, "no %s", path);
    ck_assert_int_eq(tr_count_segments(run), 0);
}

START_TEST(demo_completes_and_records_every_batch_once) {
    char run[700];
    snprintf(run, sizeof run, "%s/run", test_tmpdir("demo"));
    ck_assert_int_eq(wait_demo(start_demo(run, "1"), 50), 0);
    check_recorded(run, 1);
    char path[800];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    size_t len;
    char *m = slurp(path, &len);
    ck_assert_msg(m && len > 0, "metrics.jsonl is empty or missing");
    const char *stages[] = {"\"stage\": \"dflash-pack\"", "\"stage\": \"dflash-target\"", "\"stage\": \"dflash-record\""};
    for (int i = 0; i < 3; i++) {
        /* the sink renders maps with or without a space after ':'; accept both */
        char compact[64];
        snprintf(compact, sizeof compact, "%s", stages[i]);
        char *sp = strstr(compact, ": ");
        if (sp) memmove(sp + 1, sp + 2, strlen(sp + 2) + 1);
        ck_assert_msg(strstr(m, stages[i]) || strstr(m, compact), "metrics.jsonl has no record with %s", stages[i]);
    }
    free(m);
    snprintf(path, sizeof path, "%s/run.json", run);
    char *rj = slurp(path, NULL);
    ck_assert_msg(rj && strstr(rj, "\"dflash-record\"") && strstr(rj, "\"device\": \"cpu\""), "run.json: %s", rj ? rj : "");
    free(rj);
    /* the same command again: complete already, exits 0 without running anything */
    ck_assert_int_eq(wait_demo(start_demo(run, "1"), 20), 0);
    snprintf(path, sizeof path, "%s.out", run);
    char *o = slurp(path, NULL);
    ck_assert_msg(o && strstr(o, "is complete (DONE)"), "second run output: %s", o ? o : "");
    free(o);
}
END_TEST

START_TEST(demo_survives_sigkill_of_target) {
    char run[700];
    snprintf(run, sizeof run, "%s/run", test_tmpdir("demo-kill"));
    pid_t demo = start_demo(run, "3");
    wait_items(run, 5, demo);
    int tgt = read_pid(run, "dflash-target");
    ck_assert_int_gt(tgt, 0);
    ck_assert_msg(kill(tgt, SIGKILL) == 0, "dflash-target (pid %d) is not running any more", tgt);
    ck_assert_int_eq(wait_demo(demo, 50), 0);
    check_recorded(run, 3);
    char path[800];
    snprintf(path, sizeof path, "%s.out", run);
    char *o = slurp(path, NULL);
    ck_assert_msg(o && strstr(o, "dflash-target died of signal 9; starting it again"), "demo output: %s", o ? o : "");
    free(o);
}
END_TEST

START_TEST(demo_resumes_after_the_whole_pipeline_died) {
    char run[700];
    snprintf(run, sizeof run, "%s/run", test_tmpdir("demo-crash"));
    pid_t demo = start_demo(run, "3");
    wait_items(run, 5, demo);
    /* a machine-crash stand-in: the script and every stage die at once, nothing cleans up */
    ck_assert_int_eq(kill(demo, SIGKILL), 0);
    tr_wait(demo);
    const char *stages[] = {"dflash-pack", "dflash-target", "dflash-record", "dflash-metrics", "dflash-shm"};
    for (int i = 0; i < 5; i++) {
        int pid = read_pid(run, stages[i]);
        if (pid > 0) kill(-pid, SIGKILL);   /* each stage leads its own process group */
    }
    usleep(100000);
    int before = count_items(run);
    ck_assert_int_gt(before, 4);
    ck_assert_int_eq(wait_demo(start_demo(run, "3"), 50), 0);
    check_recorded(run, 3);
    char path[800];
    snprintf(path, sizeof path, "%s.out", run);
    char *o = slurp(path, NULL);
    ck_assert_msg(o && strstr(o, "resuming: "), "second run did not resume: %s", o ? o : "");
    free(o);
}
END_TEST

int main(void) {
    Suite *s = suite_create("demo");
    TCase *tc = tcase_create("demo");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, demo_completes_and_records_every_batch_once);
    tcase_add_test(tc, demo_survives_sigkill_of_target);
    tcase_add_test(tc, demo_resumes_after_the_whole_pipeline_died);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
