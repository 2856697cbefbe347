/*
 * tests/testutil.h — helpers shared by the Check suites (header-only; tests only).
 *
 * - test_bin("dflash-pack"): path of a stage binary (DFLASH_BIN, set by make test, else build/bin).
 * - test_tmpdir(): a fresh directory under $TMPDIR for one test (not removed: a failing test's
 *   files stay for inspection; make clean or the OS removes them).
 * - test_rng_*: kernels/common.h's seeded splitmix64 (kernels_rng_next), so every suite draws the
 *   same inputs.
 * - test_spawn_log(log, argv): fork/exec a binary with stdout+stderr appended to log; the child
 *   dies with the test (PR_SET_PDEATHSIG), exit status 127 if the exec fails.
 * - test_allclose(): element-wise |got - ref| <= atol + rtol*|ref|; on failure prints max abs and
 *   rel error, the worst index and the first few mismatching pairs, as style.md asks.
 */
#ifndef TESTS_TESTUTIL_H
#define TESTS_TESTUTIL_H

#include "kernels/common.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

static inline const char *test_bin(const char *name) {
    static char path[4][1024];
    static int which;
    const char *dir = getenv("DFLASH_BIN");
    char *out = path[which++ & 3];
    snprintf(out, sizeof path[0], "%s/%s", dir && *dir ? dir : "build/bin", name);
    return out;
}

static inline pid_t test_spawn_log(const char *log, const char *const argv[]) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "execv(%s) failed: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

static inline const char *test_tmpdir(const char *tag) {
    static char path[4][512];
    static int which;
    const char *base = getenv("TMPDIR");
    char *out = path[which++ & 3];
    snprintf(out, sizeof path[0], "%s/dflash-test-%s-XXXXXX", base && *base ? base : "/tmp", tag);
    ck_assert_msg(mkdtemp(out) != NULL, "mkdtemp(%s) failed", out);
    return out;
}

/* The project's one generator (kernels/common.h), so suites and references draw alike. */
static inline uint64_t test_rng_next(uint64_t *s) { return kernels_rng_next(s); }
/* Uniform in [lo, hi). */
static inline float test_rng_uniform(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((test_rng_next(s) >> 40) * (1.0 / 16777216.0));
}
static inline void test_rng_fill(uint64_t *s, float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = test_rng_uniform(s, lo, hi);
}

/* Returns 1 if all close; else prints a report (prefixed by what) and returns 0. */
static inline int test_allclose(const char *what, const float *got, const float *ref, size_t n,
                                double atol, double rtol) {
    double max_abs = 0, max_rel = 0;
    size_t worst = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        double r = d / (fabs((double)ref[i]) + 1e-30);
        if (!(d <= atol + rtol * fabs((double)ref[i]))) {   /* NaN counts as bad */
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: got %.8g ref %.8g (abs %.3g)\n", what, i, got[i], ref[i], d);
            bad++;
        }
        if (d > max_abs || isnan(d)) { max_abs = d; worst = i; }
        if (r > max_rel) max_rel = r;
    }
    if (bad) {
        fprintf(stderr, "%s: %zu/%zu mismatches (atol %.3g rtol %.3g): max abs err %.4g at [%zu], max rel err %.4g\n",
                what, bad, n, atol, rtol, max_abs, worst, max_rel);
        return 0;
    }
    return 1;
}

/* Run a suite with the default fork mode and return the exit status for main(). */
static inline int test_run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

/* The whole file at path, NUL-terminated, in a malloc'd buffer (the caller frees it; *len gets the size when len is
 * not NULL), or NULL when it cannot be opened. */
static inline char *test_slurp(const char *path, size_t *len) {
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    ck_assert_ptr_nonnull(b);
    for (size_t got; (got = fread(b + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            b = realloc(b, cap);
            ck_assert_ptr_nonnull(b);
        }
    }
    fclose(f);
    b[n] = 0;
    if (len) *len = n;
    return b;
}

/* The first MiB of the file at path, NUL-terminated, in a buffer of this translation unit that the next call
 * overwrites (for checks of log files that keep no copy), or NULL when it cannot be opened. */
static inline char *test_slurp_static(const char *path) {
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

#endif /* TESTS_TESTUTIL_H */
