/*
 * tests/test_e2e_util.h — helpers of the pipeline-level suites (test_e2e, test_kill_campaign,
 * test_demo): run a pipelines/ script in the background with its output in <run>.out, wait for it
 * with a deadline, signal its stages by their pid files, compare files byte for byte, and check
 * that nothing of a run is left (no process naming the run directory, no /dev/shm segment); the tiny
 * model and dataset the train.sh suites (test_plan, test_scale, test_slurm) start from, and the pid of
 * a trainer rank.
 */
#ifndef TESTS_TEST_E2E_UTIL_H
#define TESTS_TEST_E2E_UTIL_H

#include "test_ring_util.h"
#include "testutil.h"

#include <dirent.h>
#include <limits.h>

/* the tiny demo's trainer flags that differ per test: checkpoints often, so kills land between them */
#define E2E_STEPS "40"

static inline const char *e2e_script(const char *name) {
    static char path[4][PATH_MAX];
    static int which;
    char *out = path[which++ & 3];
    snprintf(out, PATH_MAX, "pipelines/%s", name);
    if (access(out, X_OK) == 0) return out;
    const char *bin = getenv("DFLASH_BIN");
    snprintf(out, PATH_MAX, "%s/../../pipelines/%s", bin ? bin : "build/bin", name);
    return out;
}

/* Start `bash pipelines/SCRIPT ARGS...` (NULL-terminated argv after the script) with output appended
 * to OUT; env STEPS/DEMO_EVAL as given (NULL: unset). Returns the script's pid. */
static inline pid_t e2e_start(const char *out, const char *steps, const char *eval, const char *bin,
                              const char *const *argv) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* SIGTERM, not SIGKILL: the script's trap then stops its stages (own process groups) */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        unsetenv("RUN");
        unsetenv("DEVICE");
        if (steps) setenv("STEPS", steps, 1); else unsetenv("STEPS");
        if (eval) setenv("DEMO_EVAL", eval, 1); else unsetenv("DEMO_EVAL");
        if (bin) setenv("DFLASH_BIN", bin, 1);
        else if (!getenv("DFLASH_BIN")) setenv("DFLASH_BIN", "build/bin", 1);
        execv("/bin/bash", (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static inline void e2e_tail(const char *path, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    out[0] = 0;
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, n > (long)cap - 1 ? n - (long)cap + 1 : 0, SEEK_SET);
    size_t got = fread(out, 1, cap - 1, f);
    out[got] = 0;
    fclose(f);
}

/* Wait up to secs for the script; returns its exit status (128 + signal). A hang fails the test. */
static inline int e2e_wait(pid_t pid, double secs, const char *out, const char *what) {
    double t0 = tr_now();
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        ck_assert_int_ge(r, 0);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (tr_now() - t0 > secs) {
            char tail[2500];   /* Check refuses a failure message of about 4 KiB or more */
            kill(pid, SIGTERM);
            tr_wait(pid);
            e2e_tail(out, tail, sizeof tail);
            ck_abort_msg("%s: HUNG (> %.0f s); end of %s:\n%s", what, secs, out, tail);
        }
        usleep(20000);
    }
}

static inline int e2e_read_pid(const char *run, const char *stage) {
    char path[900], buf[32] = "";
    snprintf(path, sizeof path, "%s/pids/%s.pid", run, stage);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return atoi(buf);
}

static inline int e2e_exists(const char *fmt, const char *a, int b) {
    char path[1200];
    snprintf(path, sizeof path, fmt, a, b);
    return access(path, F_OK) == 0;
}

/* /proc/PID/FILE (cmdline or environ: NUL-separated strings) into buf, NUL-terminated; its length, <= 0 when
 * the process is gone or the file is empty */
static inline ssize_t e2e_proc_read(const char *pid, const char *file, char *buf, size_t cap) {
    char path[300];
    snprintf(path, sizeof path, "/proc/%s/%s", pid, file);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    ssize_t k = read(fd, buf, cap - 1);
    close(fd);
    buf[k > 0 ? k : 0] = 0;
    return k;
}

/* Processes whose command line names the run directory and a dflash binary (stages left behind). */
static inline int e2e_stray(const char *run) {
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char buf[4096];
        ssize_t k = e2e_proc_read(e->d_name, "cmdline", buf, sizeof buf);
        if (k <= 0) continue;
        for (ssize_t i = 0; i < k; i++) if (!buf[i]) buf[i] = ' ';
        if (strstr(buf, run) && strstr(buf, "dflash-")) n++;
    }
    closedir(d);
    return n;
}

/* Nothing of the run is left: no stage process, no segment. */
static inline void e2e_nothing_left(const char *run, const char *what) {
    for (int i = 0; i < 50 && e2e_stray(run); i++) usleep(100000);   /* a SIGKILLed group is reaped by init */
    ck_assert_msg(e2e_stray(run) == 0, "%s: %d stage process(es) of the run still running", what, e2e_stray(run));
    if (access(run, F_OK) != 0) return;   /* never made: no segment can be named after it */
    ck_assert_msg(tr_count_segments(run) == 0, "%s: %d segment(s) of the run left in /dev/shm", what,
                  tr_count_segments(run));
}

/* 1 when the two files have the same bytes. */
static inline int e2e_same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        char x[65536], y[65536];
        size_t na = fread(x, 1, sizeof x, fa), nb = fread(y, 1, sizeof y, fb);
        if (na != nb || memcmp(x, y, na) != 0) same = 0;
        if (na == 0 || na != nb) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Read a small file into buf (NUL-terminated; "" when missing). */
static inline void e2e_slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    buf[0] = 0;
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

/* The tiny target (dflash-mkmodel --preset tiny, f32) and a 40-sample dataset sampled from it, in a fresh
 * test_tmpdir(tag): base[512] gets the directory, model[600] and data[600] the two paths. */
static inline void e2e_tiny_inputs(const char *tag, char *base, char *model, char *data) {
    snprintf(base, 512, "%s", test_tmpdir(tag));
    snprintf(model, 600, "%s/model", base);
    snprintf(data, 600, "%s/data.jsonl", base);
    const char *mk[] = {test_bin("dflash-mkmodel"), "--preset", "tiny", "--dtype", "f32", "--threads", "1", "--out",
                        model, "--dataset", data, "--samples", "40", "--median-len", "60", "--min-len", "16",
                        "--max-len", "200", NULL};
    char log[700];
    snprintf(log, sizeof log, "%s/mkmodel.log", base);
    ck_assert_int_eq(tr_wait(test_spawn_log(log, mk)), 0);
}

/* The pid of trainer rank `rank` of RUN (a dflash-train, not its mpirun, whose command line names RUN and
 * whose environment says OMPI_COMM_WORLD_RANK=rank), or 0. */
static inline int e2e_rank_pid(const char *run, int rank) {
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int found = 0;
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char buf[16384];
        ssize_t k = e2e_proc_read(e->d_name, "cmdline", buf, sizeof buf);
        if (k <= 0 || !strstr(buf, "dflash-train")) continue;   /* argv[0] */
        for (ssize_t i = 0; i < k; i++) if (!buf[i]) buf[i] = ' ';
        if (!strstr(buf, run) || strstr(buf, "mpirun")) continue;
        if ((k = e2e_proc_read(e->d_name, "environ", buf, sizeof buf)) <= 0) continue;
        for (char *v = buf; v < buf + k; v += strlen(v) + 1)
            if (!strcmp(v, want)) { found = atoi(e->d_name); break; }
    }
    closedir(d);
    return found;
}

/* Wait up to secs for a pipeline script started by e2e_start with its output in RUN.out; it must exit 0 (else its
 * output's tail is the message). tail/cap (NULL: a local buffer) keeps that tail for the caller. */
static inline void e2e_finish(pid_t p, const char *run, const char *what, double secs, char *tail, size_t cap) {
    char out[800], own[4096];
    if (!tail) {
        tail = own;
        cap = sizeof own;
    }
    snprintf(out, sizeof out, "%s.out", run);
    int rc = e2e_wait(p, secs, out, what);
    e2e_tail(out, tail, cap);
    ck_assert_msg(rc == 0, "%s: exit %d:\n%s", what, rc, tail);
}

/* the final checkpoint (named in state/train.json) and the z-lab export of a and b have the same bytes */
static inline void e2e_assert_same_run(const char *a, const char *b, const char *what) {
    char sa[900], sb[900], ja[1024], jb[1024];
    snprintf(sa, sizeof sa, "%s/state/train.json", a);
    snprintf(sb, sizeof sb, "%s/state/train.json", b);
    e2e_slurp(sa, ja, sizeof ja);
    e2e_slurp(sb, jb, sizeof jb);
    const char *fa = strrchr(ja, '/'), *fb = strrchr(jb, '/');
    ck_assert_msg(strstr(ja, "\"checkpoint\"") && fa && fb && strcmp(fa, fb) == 0, "%s: final checkpoints %s vs %s",
                  what, ja, jb);
    char name[64], ca[1200], cb[1200];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(fa + 1, "\""), fa + 1);
    snprintf(ca, sizeof ca, "%s/checkpoints/%s", a, name);
    snprintf(cb, sizeof cb, "%s/checkpoints/%s", b, name);
    ck_assert_msg(access(ca, F_OK) == 0, "%s: no %s", what, ca);
    ck_assert_msg(e2e_same_file(ca, cb), "%s: %s and %s differ", what, ca, cb);
    snprintf(ca, sizeof ca, "%s/export/zlab/model.safetensors", a);
    snprintf(cb, sizeof cb, "%s/export/zlab/model.safetensors", b);
    ck_assert_msg(access(ca, F_OK) == 0, "%s: no %s", what, ca);
    ck_assert_msg(e2e_same_file(ca, cb), "%s: the z-lab exports differ", what);
}

/* wait until the trainer's log of RUN shows `step N:` (or the script ended) */
static inline void e2e_wait_step(const char *run, int n, pid_t p, const char *what) {
    char path[900], want[32];
    static char log[1 << 18];
    snprintf(path, sizeof path, "%s/logs/dflash-train.out", run);
    snprintf(want, sizeof want, "step %d:", n);
    for (int i = 0; i < 1800; i++) {
        e2e_slurp(path, log, sizeof log);
        if (strstr(log, want)) return;
        ck_assert_msg(waitpid(p, NULL, WNOHANG) == 0, "%s: the script ended before step %d", what, n);
        usleep(50000);
    }
    ck_abort_msg("%s: no step %d within 90 s", what, n);
}

#endif
