/*
 * tests/test_supervise.c — pipelines/lib.sh with real processes (bash scripts that source it,
 * small shell stages, a real dflash-shm), for issue 14:
 *
 * - two_deaths_at_once (item 1): four rounds in which three stages are SIGKILLed by one kill(1);
 *   every one is restarted and supervise returns 0 (it used to lose track of the second death).
 * - stopped_is_not_finished (item 2): a stage exiting 3 (STAGE_EXIT_STOPPED) is restarted, not
 *   taken as finished; one that keeps exiting 3 fails the run after MAX_RESTARTS.
 * - run_lock (item 5): a second script on a locked run directory exits 1 naming the holder's
 *   pid, and starts once the first is gone.
 * - dead_shm_segments_removed (item 6): dflash-shm SIGKILLed, then stop_all: no segment of the
 *   run is left; wait_ring_drained reads --status --field.
 * Issue 24: private_whatever_umask and foreign_run_dir_refused (defect 6), metrics_sigterm_restarted
 * (defect 4), refusal_said_at_once (defect 7: a service's refusal said at once; defect 5: this attempt's error).
 */
#include "test_ring_util.h"

#include <limits.h>

static char g_lib[PATH_MAX];

static const char *lib_path(void) {
    if (access("pipelines/lib.sh", R_OK) == 0) return realpath("pipelines/lib.sh", g_lib) ? g_lib : "pipelines/lib.sh";
    const char *bin = getenv("DFLASH_BIN");
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/../../pipelines/lib.sh", bin ? bin : "build/bin");
    return realpath(p, g_lib) ? g_lib : "pipelines/lib.sh";
}

/* Write a script (prologue: strict mode, source lib.sh, RUN/LOGS, job control, stop_all on exit)
 * and run it with a time limit; returns its exit status, output in out. */
static int run_script(const char *dir, const char *body, double secs, char *out, size_t cap) {
    char path[700], run[700];
    snprintf(path, sizeof path, "%s/s%d.sh", dir, rand());
    snprintf(run, sizeof run, "%s/run", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "set -euo pipefail\n. '%s'\nRUN='%s'\nLOGS=$RUN/logs\nmkdir -p \"$LOGS\"\nset -m\n"
               "on_exit() { local rc=$?; trap - EXIT; stop_all; exit $rc; }\ntrap on_exit EXIT\n%s\n",
            lib_path(), run, body);
    fclose(f);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[0]);
        if (!getenv("DFLASH_BIN")) setenv("DFLASH_BIN", "build/bin", 1);
        execl("/bin/bash", "bash", path, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    size_t n = 0;
    double t0 = tr_now();
    int st = -1;
    for (;;) {
        ssize_t k = read(fds[0], out + n, cap - 1 - n);
        if (k > 0) { n += (size_t)k; if (n + 1 >= cap) n = 0; continue; }
        int ws;
        if (waitpid(pid, &ws, WNOHANG) == pid) { st = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws); break; }
        if (tr_now() - t0 > secs) {
            kill(pid, SIGKILL);
            tr_wait(pid);
            out[n] = 0;
            ck_abort_msg("script hung (> %.0f s); output:\n%s", secs, out);
        }
        usleep(20000);
    }
    ssize_t k;
    while ((k = read(fds[0], out + n, cap - 1 - n)) > 0) n += (size_t)k;
    out[n] = 0;
    close(fds[0]);
    return st;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++) n++;
    return n;
}

START_TEST(two_deaths_at_once) {
    const char *dir = test_tmpdir("sup2");
    static char out[65536];
    const char *body =
        "MAX_RESTARTS=1\n"
        "stage() { [ -e \"$RUN/$1.ran\" ] && exit 0; touch \"$RUN/$1.ran\"; exec sleep 30; }\n"
        "export -f stage; export RUN\n"
        "for round in 1 2 3 4; do\n"
        "  STAGE_ORDER=()\n"
        "  for s in a b c; do start_stage $s$round bash -c \"stage $s$round\"; done\n"
        "  for s in a b c; do while [ ! -e \"$RUN/$s$round.ran\" ]; do sleep 0.02; done; done\n"
        "  kill -9 $(cat \"$RUN/pids/a$round.pid\") $(cat \"$RUN/pids/b$round.pid\") $(cat \"$RUN/pids/c$round.pid\")\n"
        "  supervise a$round b$round c$round\n"
        "  echo ROUND-OK\n"
        "done\n";
    int rc = run_script(dir, body, 40, out, sizeof out);
    ck_assert_msg(rc == 0, "status %d:\n%s", rc, out);
    ck_assert_int_eq(count(out, "ROUND-OK"), 4);
    ck_assert_int_eq(count(out, "died of signal 9; starting it again"), 12);
}
END_TEST

START_TEST(stopped_is_not_finished) {
    const char *dir = test_tmpdir("sup3");
    static char out[65536];
    /* exit 3 = STAGE_EXIT_STOPPED (stages/core/stage.h) */
    const char *body =
        "MAX_RESTARTS=2\n"
        "start_stage once bash -c '[ -e \"$0/m\" ] && exit 0; touch \"$0/m\"; exit 3' \"$RUN\"\n"
        "supervise once\n"
        "echo ONCE-OK\n"
        "start_stage always bash -c 'exit 3'\n"
        "if supervise always; then echo WRONG; else echo ALWAYS-FAILED; fi\n";
    int rc = run_script(dir, body, 20, out, sizeof out);
    ck_assert_msg(rc == 0, "status %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "once stopped before the end of its stream (status 3); starting it again"), "%s", out);
    ck_assert_msg(strstr(out, "ONCE-OK") && strstr(out, "ALWAYS-FAILED") && !strstr(out, "WRONG"), "%s", out);
    ck_assert_msg(strstr(out, "giving up"), "%s", out);
}
END_TEST

START_TEST(run_lock) {
    const char *dir = test_tmpdir("suplock");
    static char out[65536], out2[65536];
    char run[700], flag[700];
    snprintf(run, sizeof run, "%s/run", dir);
    snprintf(flag, sizeof flag, "%s/run/locked", dir);
    pid_t holder = fork();
    if (holder == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        run_script(dir, "lock_run \"$RUN\"\ntouch \"$RUN/locked\"\nsleep 8\n", 30, out, sizeof out);   /* the second script must reach flock -w 2 before this ends, also on a loaded machine */
        _exit(0);
    }
    double t0 = tr_now();
    while (access(flag, F_OK) != 0) {
        ck_assert_msg(tr_now() - t0 < 10, "first script never took the lock");
        usleep(20000);
    }
    int rc = run_script(dir, "lock_run \"$RUN\"\necho GOT-LOCK\n", 10, out2, sizeof out2);
    ck_assert_msg(rc == 1, "second script status %d:\n%s", rc, out2);
    ck_assert_msg(strstr(out2, "is in use by another pipeline: pid ") && !strstr(out2, "GOT-LOCK"), "%s", out2);
    tr_wait(holder);
    rc = run_script(dir, "lock_run \"$RUN\"\necho GOT-LOCK\n", 10, out2, sizeof out2);
    ck_assert_msg(rc == 0 && strstr(out2, "GOT-LOCK"), "status %d:\n%s", rc, out2);
}
END_TEST

START_TEST(dead_shm_segments_removed) {
    const char *dir = test_tmpdir("supshm");
    static char out[65536];
    const char *body =
        "start_stage --service shm \"$DFLASH_BIN/dflash-shm\" --run \"$RUN\" --ring x:slots=2,bytes=1k,dev=host\n"
        "wait_for_file \"$RUN/shm.json\" 10 '\"running\"'\n"
        "( wait_ring_drained \"$RUN\" x 1 ) && echo WRONGLY-DRAINED\n"
        "kill -9 \"$(cat \"$RUN/pids/shm.pid\")\"\n"
        "sleep 0.2\n"
        "\"$DFLASH_BIN/dflash-shm\" --list-stale --run \"$RUN\" | grep -c '^stale' | sed 's/^/SEGMENTS-BEFORE /'\n";
    int rc = run_script(dir, body, 30, out, sizeof out);
    ck_assert_msg(rc == 0, "status %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "SEGMENTS-BEFORE 1") && !strstr(out, "WRONGLY-DRAINED"), "%s", out);
    ck_assert_msg(strstr(out, "1 leftover segment(s)"), "%s", out);
    char run[700];
    snprintf(run, sizeof run, "%s/run", dir);
    ck_assert_int_eq(tr_count_segments(run), 0);
}
END_TEST

/* ---------------------------------------------------------------- issue 24 */

/* Defect 6: whatever the caller's umask (000 here), what lib.sh and its stages create is private (0700
 * directories, 0600 files: run dir, lock, logs/NAME.out, state, data), and write_state never writes through a
 * planted temporary name (a symlink at STATE.tmp wrote into its target). */
START_TEST(private_whatever_umask) {
    const char *dir = test_tmpdir("suppriv");
    static char out[65536];
    const char *body =
        "RUN=$RUN/p\n"
        "prepare_run_dir t\n"
        "start_stage s1 bash -c 'echo hi'\n"
        "supervise s1\n"
        "write_state \"$RUN/state/x.next\" 7\n"
        "ln -s \"$RUN/../victim\" \"$RUN/state/y.next.tmp\"\n"
        "write_state \"$RUN/state/y.next\" 9\n"
        "rm \"$RUN/state/y.next.tmp\"\n"
        "echo data >\"$RUN/data.f\"\n"
        "find \"$RUN\" \\( -type d ! -perm 700 -o -type f ! -perm 600 \\) -printf 'WIDE %m %p\\n'\n"
        "[ ! -e \"$RUN/../victim\" ] || echo WROTE-THROUGH\n"
        "echo PRIVATE-DONE\n";
    mode_t old = umask(0);
    int rc = run_script(dir, body, 20, out, sizeof out);
    umask(old);
    ck_assert_msg(rc == 0 && strstr(out, "PRIVATE-DONE"), "status %d:\n%s", rc, out);
    ck_assert_msg(!strstr(out, "WIDE ") && !strstr(out, "WROTE-THROUGH"), "%s", out);
}
END_TEST

/* Defect 6: a run directory that another user owns, or that is open to group/other and not empty, is refused with
 * one line; an empty one of ours is closed (0700) and used; a log that is a symlink is not written through. */
START_TEST(foreign_run_dir_refused) {
    const char *dir = test_tmpdir("supforeign");
    static char out[65536];
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cd '%s' && mkdir -m 755 wide && touch wide/run.json && mkdir -m 700 theirs && "
             "chown 54321 theirs && mkdir -m 755 empty && mkdir -p -m 700 sym/logs && chmod 700 sym && ln -s ../../victim sym/logs/s.out",
             dir);
    ck_assert_int_eq(system(cmd), 0);
    char body[1000];
    snprintf(body, sizeof body, "RUN='%s/wide'\nprepare_run_dir t\necho WRONGLY-USED\n", dir);
    ck_assert_int_eq(run_script(dir, body, 20, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "has mode 755 (open to group/other); refusing it") && !strstr(out, "WRONGLY"), "%s", out);
    snprintf(body, sizeof body, "RUN='%s/theirs'\nprepare_run_dir t\necho WRONGLY-USED\n", dir);
    ck_assert_int_eq(run_script(dir, body, 20, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "belongs to uid 54321, not to this user") && !strstr(out, "WRONGLY"), "%s", out);
    snprintf(body, sizeof body, "RUN='%s/empty'\nprepare_run_dir t\nstat -c 'MODE %%a' \"$RUN\"\n", dir);
    ck_assert_int_eq(run_script(dir, body, 20, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "MODE 700"), "%s", out);
    snprintf(body, sizeof body, "RUN='%s/sym'\nprepare_run_dir t\nstart_stage s bash -c 'echo x'\necho WRONGLY-USED\n", dir);
    ck_assert_int_eq(run_script(dir, body, 20, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "s.out is a symbolic link; refusing") && !strstr(out, "WRONGLY"), "%s", out);
    snprintf(cmd, sizeof cmd, "%s/victim", dir);
    ck_assert_int_ne(access(cmd, F_OK), 0);
}
END_TEST

/* Defect 4: dflash-metrics SIGTERMed mid-run is restarted like any stage (it exited 0 and the run failed with
 * "dflash-metrics exited (status 0) while the pipeline still needs it"). */
START_TEST(metrics_sigterm_restarted) {
    const char *dir = test_tmpdir("supmetrics");
    static char out[65536];
    const char *body =
        "start_stage --service dflash-metrics \"$DFLASH_BIN/dflash-metrics\" --run \"$RUN\"\n"
        "wait_for_file \"$RUN/bus/metrics.sock\" 10\n"
        "start_stage w bash -c 'sleep 2'\n"
        "kill -TERM \"$(cat \"$RUN/pids/dflash-metrics.pid\")\"\n"
        "supervise w && echo SUPERVISE-OK\n"
        "_alive dflash-metrics && echo METRICS-ALIVE\n";
    int rc = run_script(dir, body, 30, out, sizeof out);
    ck_assert_msg(rc == 0, "status %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "dflash-metrics stopped before the end of its stream (status 3); starting it again"), "%s", out);
    ck_assert_msg(strstr(out, "SUPERVISE-OK") && strstr(out, "METRICS-ALIVE"), "%s", out);
}
END_TEST

/* Defect 7 / 5: a service that refuses to start is reported at once with its reason (it was "did not come up"
 * after 20 s), and a stage's error is this attempt's, not an earlier attempt's first error in the same log. */
START_TEST(refusal_said_at_once) {
    const char *dir = test_tmpdir("suprefuse");
    static char out[65536];
    const char *body =
        "t0=$SECONDS\n"
        "start_stage --service dflash-shm \"$DFLASH_BIN/dflash-shm\" --run \"$RUN\" --ring 'x:slots=0,bytes=1k,dev=host'\n"
        "wait_stage_file dflash-shm \"$RUN/shm.json\" 20 '\"running\"' || echo \"REFUSED after $((SECONDS - t0)) s\"\n"
        "printf '%s\\n' '2026-01-01T00:00:00Z E dflash-x[1] the old attempt' '2026-01-01T00:00:01Z E dflash-x[2] this attempt' >\"$LOGS/x.out\"\n"
        "echo \"FIRST: $(first_error \"$LOGS/x.out\" 1)\"\n";
    int rc = run_script(dir, body, 30, out, sizeof out);
    ck_assert_msg(rc == 0, "status %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "dflash-shm exited during start-up (status ") && strstr(out, "slots"), "%s", out);
    const char *r = strstr(out, "REFUSED after ");
    ck_assert_msg(r && atoi(r + 14) < 10, "%s", out);
    ck_assert_msg(strstr(out, "FIRST: this attempt"), "%s", out);
}
END_TEST

int main(void) {
    Suite *s = suite_create("supervise");
    TCase *tc = tcase_create("lib.sh");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, two_deaths_at_once);
    tcase_add_test(tc, stopped_is_not_finished);
    tcase_add_test(tc, run_lock);
    tcase_add_test(tc, dead_shm_segments_removed);
    tcase_add_test(tc, private_whatever_umask);
    tcase_add_test(tc, foreign_run_dir_refused);
    tcase_add_test(tc, metrics_sigterm_restarted);
    tcase_add_test(tc, refusal_said_at_once);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
