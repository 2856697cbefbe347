/*
 * tests/test_check.c — stages/core/check.h and log.h: a failed check prints stage, pid, file:line,
 * the call's text, the library's error string and the hint, mirrors it into the log file, and
 * exits 1; log lines carry a timestamp, level and stage. sentence_first (issue 24): the error line starts
 * with the sentence, the call's text (none for LIB_CHECK) and file:line follow it.
 */
#include "core/check.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "testutil.h"

#include <fcntl.h>
#include <sys/wait.h>

/* Run fn in a child with stderr captured; returns the exit status and the output in buf. */
static int run_captured(void (*fn)(const char *), const char *arg, char *buf, size_t cap) {
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fds[0], buf + n, cap - n - 1)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(fds[0]);
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void fail_open(const char *logpath) {
    char err[256];
    log_init("dflash-testing");
    if (log_open_file(logpath, err, sizeof err)) _exit(99);
    check_hint("is the dataset path right?");
    SYS_CHECK(open("/nonexistent/dflash/file", O_RDONLY));
}

static void fail_die(const char *arg) {
    (void)arg;
    log_init("dflash-testing");
    DIE("batch %d has %d tokens, budget is %d", 7, 9000, 8192);
}

START_TEST(sys_check_reports_everything) {
    const char *dir = test_tmpdir("check");
    char logpath[600], out[4096];
    snprintf(logpath, sizeof logpath, "%s/stage.log", dir);
    int rc = run_captured(fail_open, logpath, out, sizeof out);
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(out, "dflash-testing["));
    ck_assert_ptr_nonnull(strstr(out, "tests/test_check.c:"));
    ck_assert_ptr_nonnull(strstr(out, "open(\"/nonexistent/dflash/file\", O_RDONLY)"));
    ck_assert_ptr_nonnull(strstr(out, "No such file or directory"));
    ck_assert_ptr_nonnull(strstr(out, "hint: is the dataset path right?"));
    char *logged; size_t len; char err[256];
    ck_assert_int_eq(fs_read_file(logpath, &logged, &len, err, sizeof err), 0);
    ck_assert_ptr_nonnull(strstr(logged, "No such file or directory"));
    ck_assert_ptr_nonnull(strstr(logged, " E dflash-testing["));
    free(logged);
}
END_TEST

START_TEST(die_formats_reason) {
    char out[4096];
    int rc = run_captured(fail_die, NULL, out, sizeof out);
    ck_assert_int_eq(rc, 1);
    ck_assert_ptr_nonnull(strstr(out, "batch 7 has 9000 tokens, budget is 8192"));
}
END_TEST

static int lib_call(char *err, int err_len) {
    snprintf(err, (size_t)err_len, "model/config.json: not valid JSON (line 1)");
    return -1;
}

static void fail_lib(const char *arg) {
    (void)arg;
    log_init("dflash-testing");
    char err[128];
    LIB_CHECK(lib_call(err, sizeof err), err);
}

/* Issue 24: the user reads a sentence, not a C expression: the error line's text starts with the library's
 * sentence (file:line may follow), and a LIB_CHECK does not print its call's text. */
START_TEST(sentence_first) {
    char out[4096];
    ck_assert_int_eq(run_captured(fail_lib, NULL, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "] model/config.json: not valid JSON (line 1) (at tests/test_check.c:"), "%s", out);
    ck_assert_msg(!strstr(out, "lib_call(") && !strstr(out, "FATAL"), "%s", out);
    ck_assert_int_eq(run_captured(fail_die, NULL, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "] batch 7 has 9000 tokens, budget is 8192 (at tests/test_check.c:"), "%s", out);
}
END_TEST

static void log_levels(const char *arg) {
    (void)arg;
    log_init("dflash-lv");
    log_set_level(LOG_WARN);
    log_info("hidden line");
    log_warn("shown %s", "warning");
}

START_TEST(log_filters_levels) {
    char out[4096];
    ck_assert_int_eq(run_captured(log_levels, NULL, out, sizeof out), 0);
    ck_assert_ptr_null(strstr(out, "hidden line"));
    ck_assert_ptr_nonnull(strstr(out, " W dflash-lv["));
    ck_assert_ptr_nonnull(strstr(out, "shown warning\n"));
    /* ISO-8601 UTC timestamp at the start of the line */
    ck_assert(out[4] == '-' && out[10] == 'T' && strchr(out, 'Z') != NULL);
}
END_TEST

int main(void) {
    Suite *s = suite_create("check");
    TCase *tc = tcase_create("check");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, sys_check_reports_everything);
    tcase_add_test(tc, die_formats_reason);
    tcase_add_test(tc, sentence_first);
    tcase_add_test(tc, log_filters_levels);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
