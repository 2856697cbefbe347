/*
 * tests/test_export_util.h — what test_export and test_eval share: a per-test directory under TMPDIR removed by the
 * fixture, running a binary with its output captured in out_text, and the tiny target model. One translation unit
 * includes it once (static definitions).
 */
#ifndef TESTS_TEST_EXPORT_UTIL_H
#define TESTS_TEST_EXPORT_UTIL_H

#include <check.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

static char err[4096];
static char base_dir[512];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st; (void)flag; (void)ftw;
    return remove(p);
}
/* Every test's files under one directory (TMPDIR for test_tmpdir), removed by the fixture. */
static void setup(void) {
    const char *b = getenv("TMPDIR");
    snprintf(base_dir, sizeof base_dir, "%s/dflash-test-export-XXXXXX", b && *b ? b : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(base_dir));
    setenv("TMPDIR", base_dir, 1);
}
static void teardown(void) {
    if (base_dir[0]) nftw(base_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
static char out_text[16384];

static int run_argv(const char *const *argv) {
    char logf[] = "/tmp/dflash-test-export-XXXXXX";
    int fd = mkstemp(logf);
    ck_assert_int_ge(fd, 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ssize_t r = pread(fd, out_text, sizeof out_text - 1, 0);
    out_text[r > 0 ? r : 0] = '\0';
    close(fd);
    unlink(logf);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 127, "could not run %s", argv[0]);
    return WEXITSTATUS(st);
}

static const char *tiny_target(void) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("export-target"));
    const char *argv[] = {test_bin("dflash-mkmodel"), "--preset", "tiny", "--out", dir, NULL};
    ck_assert_msg(run_argv(argv) == 0, "dflash-mkmodel: %s", out_text);
    return dir;
}

#endif /* TESTS_TEST_EXPORT_UTIL_H */
